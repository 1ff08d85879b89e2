"""DeepSeek-V2, V3 and V3.2 (``deepseek_v2``, ``deepseek_v3``, ``deepseek_v32``): multi-head latent attention,
DeepSeekMoE (routed plus shared experts, dense first layers, grouped routing); config and tensor rules, both
directions.

V2 scores experts with a softmax (greedy or group-limited top-k) and does not renormalise the chosen
weights; V3 scores with a sigmoid, selects with a per-expert correction bias, scores groups by their best
two experts and may renormalise. V2 always rotates interleaved pairs; V3 when ``rope_interleave``. V3.2 is
V3 (always interleaved, always a low-rank query) plus the lightning indexer of DeepSeek sparse attention
(``index_heads``, ``index_head_dim``, ``index_topk``; ``layers.attention.Indexer``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (Architecture, Rule, activation, copy, heads_in, heads_out, linear, lm_head,
                                     prediction_layers, refuse, rope_from_hf, rope_to_hf, stacked_experts)

CLASSES = {"deepseek_v2": ("DeepseekV2Model", "DeepseekV2ForCausalLM"),
           "deepseek_v3": ("DeepseekV3Model", "DeepseekV3ForCausalLM"),
           "deepseek_v32": ("DeepseekV32Model", "DeepseekV32ForCausalLM")}
SIGMOID_ROUTED = ("deepseek_v3", "deepseek_v32")
V2_TOPK_METHODS = ("greedy", "group_limited_greedy")
# The config classes' defaults, for files that leave keys out (V2's remote-code files often do).
_SHARED = dict(q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
               rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
               routed_scaling_factor=1.0, attention_dropout=0.0)
DEFAULTS = {
    "deepseek_v2": dict(_SHARED, n_shared_experts=2, first_k_dense_replace=0, topk_method="greedy", n_group=None,
                        topk_group=None, max_position_embeddings=2048, num_key_value_heads=None,
                        moe_intermediate_size=1407, n_routed_experts=64, num_experts_per_tok=None, mlp_bias=False,
                        bos_token_id=1, eos_token_id=2),
    "deepseek_v3": dict(_SHARED, n_shared_experts=1, first_k_dense_replace=3, n_group=8, topk_group=4,
                        routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=4096,
                        num_key_value_heads=128, moe_intermediate_size=2048, n_routed_experts=256,
                        num_experts_per_tok=8, rope_interleave=True, bos_token_id=0, eos_token_id=1),
}
DEFAULTS["deepseek_v32"] = {**{k: v for k, v in DEFAULTS["deepseek_v3"].items() if k != "rope_interleave"},
                            "max_position_embeddings": 163840, "index_n_heads": 64, "index_head_dim": 128,
                            "index_topk": 2048, "mlp_layer_types": None, "layer_types": None}


def indexed_dense_layers(hf: dict, model_type: str) -> int:
    """The dense layers of DeepSeek sparse attention's files (V3.2, GLM-5: their mlp_layer_types, or the first
    first_k_dense_replace), refusing dense layers after expert ones and any attention but the indexed kind."""
    layers, first = hf["num_hidden_layers"], hf["first_k_dense_replace"] or 0
    kinds = hf["mlp_layer_types"] or ["dense"] * min(first, layers) + ["sparse"] * (layers - min(first, layers))
    dense = [i for i, kind in enumerate(kinds) if kind == "dense"]
    refuse(set(kinds) - {"dense", "sparse"} or dense != list(range(len(dense))), f"{model_type}: mlp_layer_types "
           f"{kinds} are supported as dense layers first, then sparse ones")
    attention = set(hf["layer_types"] or ["indexed_attention"])
    refuse(attention != {"indexed_attention"}, f"{model_type}: layer_types {sorted(attention)} are not supported; "
           "expected 'indexed_attention'")
    return len(dense)


def latent_decoder(hf: dict, model_type: str, arch: str, experts: int, rope: tuple) -> dict[str, Any]:
    """The fields DeepSeek-style files (V2, V3, V3.2, GLM-5, Mistral Small 4 and Large 4) set alike: latent
    attention's shapes, the pre-norm RMSNorm decoder, the experts' sizes; the caller adds its rotary layout, dense
    layers and router.
    ``rope``: (rope_theta, rope_scaling) as the file gives them."""
    heads = hf["num_attention_heads"]
    # Latent attention expands keys and values for every head; transformers' attention still repeats them
    # num_attention_heads // num_key_value_heads times, which only a count equal to the heads leaves alone.
    kv_heads = hf["num_key_value_heads"]
    refuse(kv_heads not in (None, heads), f"{model_type}: num_key_value_heads={kv_heads} differs from "
           f"num_attention_heads={heads}; latent attention has one key per query head")
    refuse(bool(hf["attention_bias"]), f"{model_type}: attention_bias=true is not supported")
    refuse(not experts, f"{model_type}: n_routed_experts={experts!r}; this model needs routed experts")
    theta, scaling = rope
    return dict(
        family="decoder", d_model=hf["hidden_size"], num_heads=heads, head_dim=hf["qk_nope_head_dim"],
        rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"], kv_lora_rank=hf["kv_lora_rank"],
        q_lora_rank=hf.get("q_lora_rank"), d_ff=hf["intermediate_size"], decoder_layers=hf["num_hidden_layers"],
        norm="rmsnorm", norm_eps=hf["rms_norm_eps"], norm_bias=False,
        activation=activation(hf["hidden_act"], True, model_type), position="rope", rope_theta=theta,
        rope_scaling=scaling, max_positions=hf["max_position_embeddings"], attention="causal", qkv_bias=False,
        out_bias=False, mlp_bias=False, tie_embeddings=hf["tie_word_embeddings"],
        head="none" if arch.endswith("Model") else "lm", attention_dropout_rate=hf["attention_dropout"],
        num_experts=experts, experts_per_token=hf["num_experts_per_tok"], expert_d_ff=hf["moe_intermediate_size"],
        shared_experts=hf["n_shared_experts"] or 0, routed_scaling=float(hf["routed_scaling_factor"]))


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    v3, v32 = model_type in SIGMOID_ROUTED, model_type == "deepseek_v32"
    refuse(bool(hf.get("mlp_bias", False)), f"{model_type}: mlp_bias=true is not supported")
    fields = latent_decoder(hf, model_type, arch, hf["n_routed_experts"], rope_from_hf(hf))
    groups, topk_groups = hf["n_group"] or 1, hf["topk_group"] or 1
    method = hf.get("topk_method", "greedy")  # V3's ('noaux_tc') is the remote code's; transformers' V3 ignores it
    if not v3:
        refuse(method not in V2_TOPK_METHODS,
               f"deepseek_v2: topk_method={method!r} is not supported; supported: {list(V2_TOPK_METHODS)}")
        if method == "greedy":
            groups = topk_groups = 1
    indexer = {}
    if v32:  # always interleaved (a rope_interleave key is not read by its class), always a low-rank query
        refuse(hf["q_lora_rank"] is None, "deepseek_v32: q_lora_rank must be set (its indexer reads the compressed "
               "query)")
        refuse(not hf["index_n_heads"], f"deepseek_v32: index_n_heads={hf['index_n_heads']!r}; its sparse attention "
               "needs the indexer's heads")
        indexer = dict(index_heads=hf["index_n_heads"], index_head_dim=hf["index_head_dim"],
                       index_topk=hf["index_topk"])
        hf.get("rope_interleave")  # read, and left: V3.2's class never reads it (its latent attention interleaves)
    dense = indexed_dense_layers(hf, "deepseek_v32") if v32 else hf["first_k_dense_replace"] or 0
    return dict(
        **fields, **indexer, rope_interleave=bool(hf["rope_interleave"]) if v3 and not v32 else True,
        dense_layers=dense, router_score="sigmoid" if v3 else "softmax", router_groups=groups,
        router_topk_groups=topk_groups, router_bias=v3,
        normalize_router_weights=bool(hf["norm_topk_prob"]) if v3 else False)


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
               qk_nope_head_dim=cfg.head_dim_, qk_rope_head_dim=cfg.latent.rope_head_dim, v_head_dim=cfg.value_dim,
               kv_lora_rank=cfg.latent.kv_rank, q_lora_rank=cfg.latent.q_rank, intermediate_size=cfg.d_ff,
               moe_intermediate_size=cfg.expert_width, num_hidden_layers=cfg.decoder_layers,
               rms_norm_eps=cfg.norms.eps, hidden_act="silu", max_position_embeddings=cfg.max_positions,
               rope_parameters=rope_to_hf(cfg), tie_word_embeddings=cfg.embeddings.tie,
               attention_dropout=cfg.attention_dropout_rate, attention_bias=False, n_routed_experts=cfg.experts.count,
               num_experts_per_tok=cfg.experts.per_token, n_shared_experts=cfg.experts.shared,
               first_k_dense_replace=cfg.experts.dense_layers, n_group=cfg.experts.router_groups,
               topk_group=cfg.experts.router_topk_groups,
               routed_scaling_factor=cfg.experts.routed_scaling)
    out.pop("rope_theta", None)
    out.pop("rope_scaling", None)
    if model_type == "deepseek_v3":
        out.update(norm_topk_prob=cfg.experts.normalize_weights, rope_interleave=cfg.rotary.interleave)
        out["num_nextn_predict_layers"] = 0  # no multi-token-prediction layers are written
    elif model_type == "deepseek_v32":
        k, L = cfg.experts.dense_layers, cfg.decoder_layers
        out.update(norm_topk_prob=cfg.experts.normalize_weights, index_n_heads=cfg.indexer.heads,
                   index_head_dim=cfg.indexer.head_dim, index_topk=cfg.indexer.topk,
                   mlp_layer_types=["dense"] * k + ["sparse"] * (L - k), layer_types=["indexed_attention"] * L)
        for key in ("rope_interleave", "num_nextn_predict_layers"):  # not its class's keys: none is written
            out.pop(key, None)
    else:
        out.update(topk_method="group_limited_greedy" if cfg.experts.router_groups > 1 else "greedy", mlp_bias=False)


def latent_up(C: int, N: int, Hn: int, Hv: int) -> tuple:
    """kv_b_proj [N * (Hn + Hv), C] <-> k_up [C, N, Hn] and v_up [C, N, Hv]."""
    def load(ts):
        both = ts[0].T.reshape(C, N, Hn + Hv)
        return [both[..., :Hn], both[..., Hn:]]

    def save(ps):
        return [np.concatenate([ps[0], ps[1]], axis=-1).reshape(C, N * (Hn + Hv)).T]

    return load, save


def latent_rules(cfg: ModelConfig, A: tuple[str, ...], a: str) -> list[Rule]:
    """Latent attention's tensors (the parameters under ``A``, the file's module ``a``): the shared key-value
    down projection and its norm, the per-head up projections, the output, and the query's full or low-rank
    projection (also Kimi Linear's full-attention layers)."""
    N, Hq, Hv = cfg.num_heads, cfg.head_dim_ + cfg.latent.rope_head_dim, cfg.value_dim
    out = [linear(A + ("kv_down",), f"{a}.kv_a_proj_with_mqa.weight"),
           copy(A + ("kv_norm",), f"{a}.kv_a_layernorm.weight"),
           Rule((A + ("k_up",), A + ("v_up",)), (f"{a}.kv_b_proj.weight",),
                *latent_up(cfg.latent.kv_rank, N, cfg.head_dim_, Hv)),
           heads_out(A + ("o",), f"{a}.o_proj.weight", N, Hv)]
    if cfg.latent.q_rank is None:
        return out + [heads_in(A + ("q",), f"{a}.q_proj.weight", N, Hq)]
    return out + [linear(A + ("q_down",), f"{a}.q_a_proj.weight"), copy(A + ("q_norm",), f"{a}.q_a_layernorm.weight"),
                  heads_in(A + ("q_up",), f"{a}.q_b_proj.weight", N, Hq)]


def indexer_rules(cfg: ModelConfig, I: tuple[str, ...], i: str) -> list[Rule]:
    """DeepSeek-V3.2's lightning indexer's tensors (GLM-5's, Mistral Large 4's): its query and key projections,
    the keys' LayerNorm and the heads' weights, under ``i`` (its module's name) at ``I`` (its path)."""
    return [heads_in(I + ("wq",), f"{i}.wq_b.weight", cfg.indexer.heads, cfg.indexer.head_dim),
            linear(I + ("wk",), f"{i}.wk.weight"),
            copy(I + ("k_norm_scale",), f"{i}.k_norm.weight"), copy(I + ("k_norm_bias",), f"{i}.k_norm.bias"),
            linear(I + ("wproj",), f"{i}.weights_proj.weight")]


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    layer = f"{p}layers.{{i}}"
    a, m = f"{layer}.self_attn", f"{layer}.mlp"

    def block_rules(S: tuple[str, ...], moe: bool) -> list[Rule]:
        A = S + ("attn",)
        out = [copy(S + ("attn_norm", "scale"), f"{layer}.input_layernorm.weight"),
               copy(S + ("mlp_norm", "scale"), f"{layer}.post_attention_layernorm.weight"), *latent_rules(cfg, A, a)]
        if cfg.indexer is not None:
            out += indexer_rules(cfg, A + ("indexer",), f"{a}.indexer")
        mlp = S + ("mlp",)
        if not moe:
            return out + [linear(mlp + ("wi_gate",), f"{m}.gate_proj.weight"), linear(mlp + ("wi",), f"{m}.up_proj.weight"),
                          linear(mlp + ("wo",), f"{m}.down_proj.weight")]
        experts = range(cfg.experts.count)
        out += [linear(mlp + ("router",), f"{m}.gate.weight"),
                stacked_experts(mlp + ("wi_gate",), [f"{m}.experts.{e}.gate_proj.weight" for e in experts]),
                stacked_experts(mlp + ("wi",), [f"{m}.experts.{e}.up_proj.weight" for e in experts]),
                stacked_experts(mlp + ("wo",), [f"{m}.experts.{e}.down_proj.weight" for e in experts])]
        if cfg.experts.router_bias:
            out.append(copy(mlp + ("router_bias",), f"{m}.gate.e_score_correction_bias"))
        if cfg.experts.shared:
            shared = mlp + ("shared",)
            out += [linear(shared + ("wi_gate",), f"{m}.shared_experts.gate_proj.weight"),
                    linear(shared + ("wi",), f"{m}.shared_experts.up_proj.weight"),
                    linear(shared + ("wo",), f"{m}.shared_experts.down_proj.weight")]
        return out

    k, L = cfg.experts.dense_layers, cfg.decoder_layers
    out = [copy(("embed", "table"), f"{p}embed_tokens.weight"), copy(("decoder", "final_norm", "scale"), f"{p}norm.weight")]
    if k:
        out += [rule.in_layers(0, k) for rule in block_rules(("decoder", "dense_blocks"), moe=False)]
    out += [rule.in_layers(k, L) for rule in block_rules(("decoder", "blocks"), moe=True)]
    head, aliases = lm_head(cfg, f"{p}embed_tokens.weight")
    return out + head, aliases


def ignored(hf: dict, names: set[str]) -> tuple[set[str], str]:
    """DeepSeek-V3 files carry their multi-token-prediction modules as layers past num_hidden_layers;
    ordinary next-token prediction never reads them."""
    mtp = (hf.get("num_nextn_predict_layers") or 0) if hf.get("model_type") in SIGMOID_ROUTED else 0
    return prediction_layers(hf, names, mtp)


# config.json keys that change no number of transformers' DeepSeek, with the reason (see rules.Architecture).
HARMLESS = {
    **dict.fromkeys(("head_dim", "qk_head_dim"),
                    "derived from qk_rope_head_dim and qk_nope_head_dim by the config class, whatever the file says"),
    "pretraining_tp": "transformers 5 never reads it",
    "norm_topk_prob": "V2's MoE ignores it (jaxformer reads it for V3, as transformers does)",
    "num_nextn_predict_layers": "V3's multi-token-prediction layers, skipped with a note",
    **dict.fromkeys(("aux_loss_alpha", "ep_size", "moe_layer_freq", "scoring_func", "seq_aux"),
                    "the released remote code's settings, which transformers' DeepSeek never reads"),
}

ARCHITECTURE = Architecture(CLASSES, {model_type: "model." for model_type in CLASSES},
                            ("DeepseekV2Model", "DeepseekV3Model", "DeepseekV32Model"), config_from_hf,
                            config_to_hf, rules,
                            ignored=ignored, harmless=HARMLESS, defaults=DEFAULTS)
