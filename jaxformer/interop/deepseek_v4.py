"""DeepSeek-V4 (``deepseek_v4``): config and tensor rules, both directions.

Each layer attends through one shared key-value head over a sliding window, plus (by ``layer_types``) compressed
entries of earlier blocks of tokens: compressed sparse attention (CSA, blocks of ``compress_rates``' 4, overlapping,
narrowed per query by a lightning indexer to ``index_topk``) or heavily compressed attention (HCA, blocks of 128,
all passed ones visible); ``scores.compressed``, jaxformer/layers/compressed_attention.py. Queries come through a
low rank, keys are values (rotated on each head's trailing ``qk_rope_head_dim`` numbers in adjacent pairs, rotated
back on the output), each head has a sink, and the output projection is grouped (``o_groups`` x ``o_lora_rank``).
The residual is ``hc_mult`` copies mixed by manifold-constrained hyper-connections (``norms.hyper_connections``,
jaxformer/layers/hyper_connections.py), collapsed by a last hyper-head before the final norm. Every layer holds
experts scored by sqrt(softplus) with one shared expert, SwiGLU clamped to ``swiglu_limit`` (no +1 on the up
projection); the first layers (``mlp_layer_types``' hash_moe) take each token's experts from a fixed table of its
id (``tid2eid``, an integer tensor of the file).

Files may spell the schedule the older way the config class folds in: ``compress_ratios`` (0 / 4 / 128 per layer),
``compress_rate_csa`` / ``compress_rate_hca``, ``num_hash_layers``, ``qk_rope_head_dim``, and a flat yarn
``rope_parameters`` (or ``rope_scaling``) that only the compressed layers apply (with attention_factor 1 unless
given); transformers 5 writes the nested ``rope_parameters`` {"main", "compress"}. DeepSeek's published files name
the tensors as ``rules`` does with no prefix (``embed.weight``, ``layers.N.attn.wq_a.weight``, ``hc_head_fn``,
``head.weight``), store the Linear weights in FP8 blocks with ``W.scale`` beside ``W.weight`` and the experts packed
as FP4 (top-level ``expert_dtype`` 'fp4'): jaxformer/interop/fp8.py decodes both, as transformers' dequantizing
loader does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (Architecture, Rule, activation, copy, heads_in, linear, refuse, rope_spec,
                                     rope_to_hf, rotary_width, stacked_experts)

CLASSES = {"deepseek_v4": ("DeepseekV4Model", "DeepseekV4ForCausalLM")}
# its config class's defaults for the keys a file may leave out
DEFAULTS = {"deepseek_v4": dict(
    vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048, num_hidden_layers=43, num_attention_heads=64,
    num_key_value_heads=1, head_dim=512, q_lora_rank=1024, num_experts_per_tok=6, n_routed_experts=256,
    n_shared_experts=1, scoring_func="sqrtsoftplus", norm_topk_prob=True, routed_scaling_factor=1.5,
    max_position_embeddings=1048576, rope_theta=10000.0, layer_types=None, compress_rates=None,
    compress_rope_theta=160000.0, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, mlp_layer_types=None,
    swiglu_limit=10.0, sliding_window=128, o_groups=8, o_lora_rank=1024, index_n_heads=64, index_head_dim=128,
    index_topk=512, num_nextn_predict_layers=1, router_aux_loss_coef=0.001, hidden_act="silu", rms_norm_eps=1e-6,
    pad_token_id=None, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, rope_parameters=None,
    partial_rotary_factor=None, attention_bias=False, mlp_bias=False, attention_dropout=0.0)}
DEFAULT_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
KINDS = {"sliding_attention": "sliding", "compressed_sparse_attention": "sparse",
         "heavily_compressed_attention": "heavy"}
RATIO_KINDS = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
SCORES = {"sqrtsoftplus": "sqrtsoftplus", "sigmoid": "sigmoid"}  # what transformers' ACT2FN gives the router


def _layer_types(hf: dict) -> list[str]:
    """``layer_types``, else the older ``compress_ratios``, else the class's schedule (two HCA layers, then CSA and
    HCA in turn), as its ``__post_init__`` folds them."""
    layers = hf["num_hidden_layers"]
    types, ratios = hf["layer_types"], hf.get("compress_ratios")
    if types is None and ratios is not None:
        refuse(any(r not in RATIO_KINDS for r in ratios), f"deepseek_v4: compress_ratios {ratios} must each be one "
               f"of {sorted(RATIO_KINDS)}")
        types = [RATIO_KINDS[r] for r in ratios]
    if types is None:
        types = (["heavily_compressed_attention"] * min(layers, 2)
                 + [("compressed_sparse_attention" if i % 2 else "heavily_compressed_attention")
                    for i in range(max(layers - 2, 0))])
    types = list(types)[:layers]
    refuse(len(types) != layers or any(t not in KINDS for t in types), f"deepseek_v4: layer_types {types} must give "
           f"each of the {layers} layers one of {sorted(KINDS)}")
    return types


def _hash_layers(hf: dict) -> int:
    """How many leading layers route by token id (``mlp_layer_types``' hash_moe, else ``num_hash_layers``, else 3),
    refusing a hash layer after a top-k one."""
    layers = hf["num_hidden_layers"]
    kinds = hf["mlp_layer_types"]
    if kinds is None:
        count = hf.get("num_hash_layers")
        count = 3 if count is None else count
        kinds = ["hash_moe"] * min(layers, count) + ["moe"] * max(0, layers - count)
    kinds = list(kinds)[:layers]
    hashed = kinds.count("hash_moe")
    refuse(len(kinds) != layers or set(kinds) - {"hash_moe", "moe"} or kinds[:hashed] != ["hash_moe"] * hashed,
           f"deepseek_v4: mlp_layer_types {kinds} are supported as hash_moe layers first, then moe ones")
    return hashed


def _rates(hf: dict) -> dict[str, int]:
    rates = dict(hf["compress_rates"] or DEFAULT_RATES)
    for key, kind in (("compress_rate_csa", "compressed_sparse_attention"),
                      ("compress_rate_hca", "heavily_compressed_attention")):
        if hf.get(key) is not None:
            rates[kind] = hf[key]
    refuse(set(rates) - set(DEFAULT_RATES), f"deepseek_v4: compress_rates keys {sorted(rates)} must be among "
           f"{sorted(DEFAULT_RATES)}")
    return {**DEFAULT_RATES, **rates}


def _rotary(hf: dict) -> tuple[dict, dict]:
    """The window layers' ('main') and compressed layers' ('compress') rotary dicts, as the config class builds them
    (a flat file's rotating fraction of a head written into both; nested dicts are taken as they are)."""
    fraction = hf["partial_rotary_factor"]
    legacy = hf.get("qk_rope_head_dim")  # (transformers writes it beside partial_rotary_factor, which wins)
    if fraction is None:
        fraction = legacy / hf["head_dim"] if legacy is not None else 64 / 512
    given = hf["rope_parameters"] or hf.get("rope_scaling") or {}
    if isinstance(given.get("main"), dict) and isinstance(given.get("compress"), dict):
        hf.get("rope_theta"), hf.get("compress_rope_theta")  # read and left: the nested dicts carry their bases
        return dict(given["main"]), dict(given["compress"])
    yarn = {k: v for k, v in given.items() if k not in ("main", "compress")}
    main = {"rope_type": "default", "rope_theta": hf["rope_theta"], "partial_rotary_factor": fraction}
    compress = {**yarn, "rope_theta": hf["compress_rope_theta"], "partial_rotary_factor": fraction}
    compress.setdefault("rope_type", compress.pop("type", "default"))
    if compress["rope_type"] == "yarn":
        compress.setdefault("attention_factor", 1.0)
    return main, compress


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    head_dim, layers = hf["head_dim"], hf["num_hidden_layers"]
    main, compress = _rotary(hf)
    widths = {}
    for name, rope in (("main", main), ("compress", compress)):
        # (a nested dict without a factor rotates the whole head: the modeling's default, whatever the top level says)
        share = float(rope.pop("partial_rotary_factor", 1.0))
        widths[name] = rotary_width(head_dim, share, model_type) or head_dim
    refuse(widths["main"] != widths["compress"], f"deepseek_v4: the rotary widths of rope_parameters' main "
           f"({widths['main']}) and compress ({widths['compress']}) differ; jaxformer rotates one width")
    theta, scaling = rope_spec(main, hf["max_position_embeddings"])
    compress_theta, compress_scaling = rope_spec(compress, hf["max_position_embeddings"])
    refuse(bool(hf["mlp_bias"]), "deepseek_v4: mlp_bias=true is not supported")
    for alias, name in (("intermediate_size", "moe_intermediate_size"), ("num_local_experts", "n_routed_experts")):
        # (the config class's attribute_map: the alias sets the other key, whichever the file spells)
        refuse(hf.get(alias) not in (None, hf[name]), f"deepseek_v4: {alias}={hf.get(alias)!r} and {name}={hf[name]!r} "
               f"differ; its config class reads {alias} as {name}, so the file is ambiguous")
    # (V4's files give the experts' FP8 / FP4 storage here, folded into quantization_config by the config class; the
    # tensors' stored dtypes say it to the decoder, interop/fp8.py)
    refuse(hf.get("expert_dtype") not in (None, "fp8", "fp4"), f"deepseek_v4: expert_dtype={hf.get('expert_dtype')!r} "
           "is not supported; supported: 'fp8', 'fp4'")
    score = hf["scoring_func"]
    refuse(score not in SCORES, f"deepseek_v4: scoring_func={score!r} is not supported; supported: {sorted(SCORES)}")
    rates = _rates(hf)
    kinds = [KINDS[t] for t in _layer_types(hf)]
    return dict(
        family="decoder", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        num_heads=hf["num_attention_heads"], num_kv_heads=1, head_dim=head_dim, d_ff=hf["moe_intermediate_size"],
        decoder_layers=layers, norm="rmsnorm", norm_eps=hf["rms_norm_eps"], norm_bias=False,
        activation=activation(hf["hidden_act"], True, model_type), swiglu_limit=float(hf["swiglu_limit"]),
        swiglu_offset=0.0, position="rope", rope_theta=theta, rope_scaling=scaling, rotary_dim=widths["main"],
        rope_interleave=True, max_positions=hf["max_position_embeddings"], attention="sliding",
        window_size=hf["sliding_window"], attention_sinks=True, qkv_bias=False, out_bias=False, mlp_bias=False,
        tie_embeddings=hf["tie_word_embeddings"], head="none" if arch.endswith("Model") else "lm",
        attention_dropout_rate=hf["attention_dropout"],
        num_experts=hf["n_routed_experts"], experts_per_token=hf["num_experts_per_tok"],
        expert_d_ff=hf["moe_intermediate_size"], shared_experts=1, router_score=SCORES[score],
        router_bias=_hash_layers(hf) < layers, hash_layers=_hash_layers(hf), normalize_router_weights=True,
        routed_scaling=float(hf["routed_scaling_factor"]), router_aux_loss_coef=hf["router_aux_loss_coef"],
        hc_streams=hf["hc_mult"], hc_sinkhorn_iters=hf["hc_sinkhorn_iters"], hc_eps=hf["hc_eps"],
        compressed_layers=kinds, compressed_q_rank=hf["q_lora_rank"],
        compressed_sparse_rate=rates["compressed_sparse_attention"],
        compressed_heavy_rate=rates["heavily_compressed_attention"], compressed_rope_theta=compress_theta,
        compressed_rope_scaling=compress_scaling, compressed_index_heads=hf["index_n_heads"],
        compressed_index_head_dim=hf["index_head_dim"], compressed_index_topk=hf["index_topk"],
        compressed_out_groups=hf["o_groups"], compressed_out_rank=hf["o_lora_rank"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    part, experts, hyper = cfg.scores.compressed, cfg.experts, cfg.norms.hyper_connections
    fraction = cfg.rotary.dim / cfg.head_dim_
    main = {**rope_to_hf(cfg), "partial_rotary_factor": fraction}
    compress = {**rope_to_hf(cfg.replace(rope_theta=part.rope_theta, rope_scaling=part.rope_scaling)),
                "partial_rotary_factor": fraction}
    names = {kind: name for name, kind in KINDS.items()}
    L = cfg.decoder_layers
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=1,
               head_dim=cfg.head_dim_, q_lora_rank=part.q_rank, moe_intermediate_size=cfg.expert_width,
               num_hidden_layers=L, rms_norm_eps=cfg.norms.eps, hidden_act="silu",
               max_position_embeddings=cfg.max_positions, rope_theta=cfg.rotary.theta,
               rope_parameters={"main": main, "compress": compress}, partial_rotary_factor=fraction,
               compress_rope_theta=part.rope_theta, tie_word_embeddings=cfg.embeddings.tie,
               attention_dropout=cfg.attention_dropout_rate, attention_bias=False, mlp_bias=False,
               n_routed_experts=experts.count, num_experts_per_tok=experts.per_token, n_shared_experts=1,
               scoring_func=experts.router_score, norm_topk_prob=True, routed_scaling_factor=experts.routed_scaling,
               router_aux_loss_coef=experts.aux_loss_coef, swiglu_limit=cfg.swiglu_clamp.limit,
               layer_types=[names[kind] for kind in part.layers],
               mlp_layer_types=["hash_moe"] * experts.hash_layers + ["moe"] * (L - experts.hash_layers),
               compress_rates={"compressed_sparse_attention": part.sparse_rate,
                               "heavily_compressed_attention": part.heavy_rate},
               hc_mult=hyper.streams, hc_sinkhorn_iters=hyper.sinkhorn_iters, hc_eps=hyper.eps,
               sliding_window=cfg.window_size, o_groups=part.out_groups, o_lora_rank=part.out_rank,
               index_n_heads=part.index_heads, index_head_dim=part.index_head_dim, index_topk=part.index_topk,
               num_nextn_predict_layers=0)
    out.pop("rope_scaling", None)


def _grouped_out(groups: int, rank: int) -> tuple:
    """o_a_proj [G * R, I] (one [R, I] block per group) <-> o_group [G, I, R]."""
    def load(ts):
        return [ts[0].reshape(groups, rank, -1).transpose(0, 2, 1)]

    def save(ps):
        return [ps[0].transpose(0, 2, 1).reshape(groups * rank, -1)]

    return load, save


def _compressor_rules(path: tuple[str, ...], name: str) -> list[Rule]:
    return [linear(path + ("kv",), f"{name}.wkv.weight"), linear(path + ("gate",), f"{name}.wgate.weight"),
            copy(path + ("position_bias",), f"{name}.ape"), copy(path + ("norm_scale",), f"{name}.norm.weight")]


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    """The tensors as transformers saves them: DeepSeek's own names (its conversion mapping run backwards), the
    embedding and the hyper-head under the model's prefix in a head class's file and DeepSeek's names alone in a base
    model's."""
    p, part, experts = prefix, cfg.scores.compressed, cfg.experts
    layer = f"{p}layers.{{i}}"
    a, m = f"{layer}.attn", f"{layer}.ffn"
    N, H = cfg.num_heads, cfg.head_dim_

    def block_rules(S: tuple[str, ...], kind: str, hashed: bool) -> list[Rule]:
        A, mlp = S + ("attn",), S + ("mlp",)
        out = [copy(S + ("attn_norm", "scale"), f"{layer}.attn_norm.weight"),
               copy(S + ("mlp_norm", "scale"), f"{layer}.ffn_norm.weight"),
               linear(A + ("q_down",), f"{a}.wq_a.weight"), copy(A + ("q_norm_scale",), f"{a}.q_norm.weight"),
               heads_in(A + ("q_up",), f"{a}.wq_b.weight", N, H), linear(A + ("kv",), f"{a}.wkv.weight"),
               copy(A + ("kv_norm_scale",), f"{a}.norm.weight"),
               Rule((A + ("o_group",),), (f"{a}.wo_a.weight",), *_grouped_out(part.out_groups, part.out_rank)),
               linear(A + ("o",), f"{a}.wo_b.weight"), copy(A + ("sinks",), f"{a}.attn_sink")]
        for hc, name in (("attn_hc", "hc_attn"), ("mlp_hc", "hc_ffn")):
            out += [linear(S + (hc, "fn"), f"{layer}.{name}_fn"), copy(S + (hc, "base"), f"{layer}.{name}_base"),
                    copy(S + (hc, "scale"), f"{layer}.{name}_scale")]
        if kind != "sliding":
            out += _compressor_rules(A + ("compressor",), f"{a}.compressor")
        if kind == "sparse":
            I = A + ("indexer",)
            out += _compressor_rules(I + ("compressor",), f"{a}.indexer.compressor") + [
                heads_in(I + ("wq",), f"{a}.indexer.wq_b.weight", part.index_heads, part.index_head_dim),
                linear(I + ("wproj",), f"{a}.indexer.weights_proj.weight")]
        each = range(experts.count)
        out += [linear(mlp + ("router",), f"{m}.gate.weight"),
                stacked_experts(mlp + ("wi_gate",), [f"{m}.experts.{e}.w1.weight" for e in each]),
                stacked_experts(mlp + ("wi",), [f"{m}.experts.{e}.w3.weight" for e in each]),
                stacked_experts(mlp + ("wo",), [f"{m}.experts.{e}.w2.weight" for e in each]),
                linear(mlp + ("shared", "wi_gate"), f"{m}.shared_experts.w1.weight"),
                linear(mlp + ("shared", "wi"), f"{m}.shared_experts.w3.weight"),
                linear(mlp + ("shared", "wo"), f"{m}.shared_experts.w2.weight")]
        if hashed:  # the file's table is int64, as transformers keeps it
            out.append(Rule((mlp + ("hash_table",),), (f"{m}.gate.tid2eid",), lambda t: [t[0].astype(np.int32)],
                            lambda ps: [ps[0].astype(np.int64)]))
        else:
            out.append(copy(mlp + ("router_bias",), f"{m}.gate.bias"))
        return out

    # (transformers' anchored renames reach these names only in a base model's file, where nothing precedes them)
    embed, hc_head = (f"{p}embed_tokens.weight", f"{p}hc_head.hc_") if p else ("embed.weight", "hc_head_")
    out = [copy(("embed", "table"), embed), copy(("decoder", "final_norm", "scale"), f"{p}norm.weight"),
           linear(("decoder", "hc_head", "fn"), f"{hc_head}fn"), copy(("decoder", "hc_head", "base"), f"{hc_head}base"),
           copy(("decoder", "hc_head", "scale"), f"{hc_head}scale")]
    hashed = experts.hash_layers
    for kind in ("sliding", "sparse", "heavy"):
        for is_hashed in (True, False):
            at = [i for i, k in enumerate(part.layers) if k == kind and (i < hashed) == is_hashed]
            if at:
                group = f"{'hash_' if is_hashed else ''}{kind}_blocks"
                out += [rule.at_layers(at) for rule in block_rules(("decoder", group), kind, is_hashed)]
    if cfg.head != "lm":
        return out, {}
    if cfg.embeddings.tie:
        return out, {"head.weight": embed}
    return out + [linear(("lm_head", "kernel"), "head.weight")], {}


def ignored(hf: dict, names: set[str]) -> tuple[set[str], str]:
    """The multi-token-prediction modules (``mtp.*``) that files carry and next-token prediction never reads, as
    transformers skips them."""
    extra = {n for n in names if n.startswith("mtp.") or ".mtp." in n}
    return extra, (f"{len(extra)} tensors of multi-token-prediction modules (mtp.*) are not used by jaxformer and "
                   "were skipped") if extra else ""


# config.json keys that change no number of transformers' DeepSeek-V4, with the reason (see rules.Architecture).
HARMLESS = {
    "num_key_value_heads": "its attention has one key-value head whatever the file says (the class never reads it)",
    "n_shared_experts": "its MoE always has one shared expert of moe_intermediate_size (the modeling never reads it)",
    "norm_topk_prob": "its routers always divide the chosen weights by their sum (the modeling never reads it)",
    "attention_bias": "its attention projections have no bias whatever the file says (the modeling never reads it)",
    "num_nextn_predict_layers": "the multi-token-prediction modules, skipped with a note",
    "router_jitter_noise": "transformers' DeepSeek-V4 never reads it",
    "output_router_logits": "only what a call returns, not its numbers",
}

ARCHITECTURE = Architecture(CLASSES, {"deepseek_v4": "model."}, ("DeepseekV4Model",), config_from_hf, config_to_hf,
                            rules, ignored=ignored, harmless=HARMLESS, defaults=DEFAULTS)
