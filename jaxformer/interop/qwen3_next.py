"""Qwen3-Next and Qwen3.5 (``qwen3_next``, ``qwen3_5_text``, ``qwen3_5_moe_text``, and the text model of the
multimodal ``qwen3_5`` / ``qwen3_5_moe`` files): config and tensor rules, both directions.

Three of every four layers (``layer_types``, by default every ``full_attention_interval``-th is full) mix tokens
by the gated delta rule (``linear_layers``: Gated DeltaNet, jaxformer/layers/linear_attention.py): a short
causal convolution over q, k and v, L2-normed queries and keys, per-head decay and write strength, a state matrix
per value head read by the queries, each head's output RMS-normed and gated by silu(z). The other layers are
Qwen3's attention with an output gate (``attention_gate``: the query projection computes each head's gate beside
its query, q_proj's rows interleaved per head) and rotary positions on the first quarter of each head. RMSNorms
scale by (1 + w) (``norm_scale_offset=1``; the gated norm inside the linear layers by w). Qwen3-Next and
Qwen3.5-MoE put experts in every layer, softmax top-k with a sigmoid-gated shared expert (Qwen3.5-MoE always
renormalises the chosen weights); Qwen3.5 has a dense MLP.

Qwen3-Next stores each linear layer's projections fused per key head (``in_proj_qkvz``: for each key head its q,
k, then its group of value heads' v and z; ``in_proj_ba`` likewise), Qwen3.5 side by side (``in_proj_qkv``,
``in_proj_z``, ``in_proj_b``, ``in_proj_a``). Qwen3.5's multimodal files nest the text model under ``model.language_model``
with its config under ``text_config``: the text model loads (the vision tower is skipped with a note) and is
written back as ``qwen3_5_text`` / ``qwen3_5_moe_text``. Their rotary dict carries M-RoPE's sections, which
change nothing for text: its three position axes are then the same position. The files' multi-token-prediction
weights (``mtp.*``), which next-token prediction never reads, are skipped with a note, as transformers skips them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.llama import decoder_config, decoder_to_hf, gated_mlp_rules, norm_rules
from jaxformer.interop.qwen import expert_rules
from jaxformer.interop.rules import (Architecture, ConfigReader, Rule, copy, heads_in, heads_out, linear, lm_head,
                                     partial_rope_from_hf, refuse, rope_to_hf, rotary_width,
                                     text_model_from_hf)

CLASSES = {"qwen3_next": ("Qwen3NextModel", "Qwen3NextForCausalLM"),
           "qwen3_5_text": ("Qwen3_5TextModel", "Qwen3_5ForCausalLM"),
           "qwen3_5_moe_text": ("Qwen3_5MoeTextModel", "Qwen3_5MoeForCausalLM"),
           "qwen3_5": ("Qwen3_5ForConditionalGeneration",), "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration",)}
WRAPPED = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}  # a multimodal file -> its text model
MOE = ("qwen3_next", "qwen3_5_moe_text")
MULTIMODAL_PREFIX = "model.language_model."
_LINEAR = dict(linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
               linear_num_value_heads=32)
_COMMON = dict(_LINEAR, num_attention_heads=16, head_dim=256, hidden_act="silu", max_position_embeddings=32768,
               rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
               layer_types=None, pad_token_id=None, bos_token_id=None, eos_token_id=None)
# Their config classes' defaults for the keys read below (checked by tests/test_config_reading.py)
DEFAULTS = {
    "qwen3_next": dict(_COMMON, vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48,
                       num_key_value_heads=2, decoder_sparse_step=1, moe_intermediate_size=512,
                       shared_expert_intermediate_size=512, num_experts_per_tok=10, num_experts=512,
                       norm_topk_prob=True, router_aux_loss_coef=0.001, mlp_only_layers=None),
    "qwen3_5_text": dict(_COMMON, vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                         num_key_value_heads=4),
    "qwen3_5_moe_text": dict(_COMMON, vocab_size=248320, hidden_size=2048, num_hidden_layers=40,
                             num_key_value_heads=2, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                             num_experts_per_tok=8, num_experts=256, router_aux_loss_coef=0.001),
    "qwen3_5": dict(tie_word_embeddings=False), "qwen3_5_moe": dict(tie_word_embeddings=False),
}
DEFAULT_PARTIAL_ROTARY = 0.25  # the config classes' when no key says
KINDS = ("linear_attention", "full_attention")
MROPE_KEYS = {"mrope_section", "mrope_interleaved"}


def linear_layers(hf: dict, model_type: str) -> list[int]:
    """The linear layers, from ``layer_types`` or (absent) every layer but each ``full_attention_interval``-th."""
    layers = hf["num_hidden_layers"]
    interval = hf.get("full_attention_interval", 4)
    kinds = hf["layer_types"] or ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    refuse(len(kinds) != layers or any(k not in KINDS for k in kinds), f"{model_type}: layer_types {kinds} must give "
           f"each of the {layers} layers one of {KINDS}")
    return [i for i, kind in enumerate(kinds) if kind == "linear_attention"]


def _experts(hf: dict, model_type: str) -> dict[str, Any]:
    layers, width, shared = hf["num_hidden_layers"], hf["moe_intermediate_size"], hf["shared_expert_intermediate_size"]
    if model_type == "qwen3_next":  # Qwen3.5-MoE reads neither: every layer holds experts
        step, only = hf["decoder_sparse_step"], set(hf["mlp_only_layers"] or ())
        dense = [i for i in range(layers) if i in only or (i + 1) % step]
        refuse(bool(dense), f"qwen3_next: dense layers {dense} (mlp_only_layers={hf['mlp_only_layers']}, "
               f"decoder_sparse_step={step}) beside linear-attention layers are not supported")
    refuse(not hf["num_experts"], f"{model_type}: num_experts={hf['num_experts']!r}; a {model_type} model needs "
           "experts")
    refuse(shared % width != 0, f"{model_type}: shared_expert_intermediate_size={shared} is not a multiple of "
           f"moe_intermediate_size={width}; jaxformer's shared experts are whole experts wide")
    normalize = bool(hf["norm_topk_prob"]) if model_type == "qwen3_next" else True
    return dict(num_experts=hf["num_experts"], experts_per_token=hf["num_experts_per_tok"], expert_d_ff=width,
                normalize_router_weights=normalize, router_aux_loss_coef=hf["router_aux_loss_coef"],
                shared_experts=shared // width, shared_expert_gate=True)


def _without_mrope(hf: dict) -> dict:
    """Qwen3.5's file with M-RoPE's keys left out of its rotary dict (read all the same): the sections split the
    rotary pairs among three position axes (time, height, width), which for text tokens are one position, so for
    text they change no angle."""
    rope = hf.get("rope_parameters")
    if not isinstance(rope, dict) or not set(rope) & MROPE_KEYS:
        return hf
    stripped = {**dict(hf.items()), "rope_parameters": {k: v for k, v in rope.items() if k not in MROPE_KEYS}}
    return ConfigReader(stripped, hf.read, hf.prefix) if isinstance(hf, ConfigReader) else stripped


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    if model_type in WRAPPED:  # the text model of a multimodal file, with its vocabulary and token ids
        text_type = WRAPPED[model_type]
        return text_model_from_hf(hf, model_type, DEFAULTS[text_type], lambda text: config_from_hf(
            text, text_type, CLASSES[text_type][1], tensor_names))
    refuse(bool(hf["attention_bias"]), f"{model_type}: attention_bias=true is not supported (the query projection's "
           "bias would have to be split between queries and gates, which jaxformer's gate does not carry)")
    moe = model_type in MOE
    if model_type == "qwen3_5_moe_text":  # its layers hold experts only: no dense width (the class reads none)
        width = {**dict(hf.items()), "intermediate_size": hf["moe_intermediate_size"]}
        hf = ConfigReader(width, hf.read, hf.prefix) if isinstance(hf, ConfigReader) else width
    fields = decoder_config(hf, model_type, arch, (10000.0, None))
    theta, scaling, fraction = partial_rope_from_hf(_without_mrope(hf) if model_type != "qwen3_next" else hf,
                                                    DEFAULT_PARTIAL_ROTARY)
    width = fields["head_dim"] or hf["hidden_size"] // hf["num_attention_heads"]
    fields.update(rope_theta=theta, rope_scaling=scaling, rotary_dim=rotary_width(width, fraction, model_type),
                  qk_norm=True, norm_scale_offset=1.0, attention_gate=True, out_bias=fields["qkv_bias"],
                  mlp_bias=False, linear_layers=tuple(linear_layers(hf, model_type)),
                  linear_key_heads=hf["linear_num_key_heads"], linear_value_heads=hf["linear_num_value_heads"],
                  linear_key_head_dim=hf["linear_key_head_dim"], linear_value_head_dim=hf["linear_value_head_dim"],
                  linear_conv_kernel=hf["linear_conv_kernel_dim"])
    if moe:
        fields.update(_experts(hf, model_type))
    return fields


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    decoder_to_hf(cfg, out)
    linear = cfg.linear_attention
    rope = rope_to_hf(cfg)
    rope["partial_rotary_factor"] = cfg.rope_dim / cfg.head_dim_
    out.update(rope_parameters=rope, attention_bias=cfg.biases.qkv,
               layer_types=["linear_attention" if i in linear.layers else "full_attention"
                            for i in range(cfg.decoder_layers)],
               linear_num_key_heads=linear.key_heads, linear_num_value_heads=linear.value_heads,
               linear_key_head_dim=linear.key_head_dim, linear_value_head_dim=linear.value_head_dim,
               linear_conv_kernel_dim=linear.conv_kernel)
    if model_type in MOE:
        out.update(num_experts=cfg.experts.count, num_experts_per_tok=cfg.experts.per_token,
                   moe_intermediate_size=cfg.expert_width, router_aux_loss_coef=cfg.experts.aux_loss_coef,
                   shared_expert_intermediate_size=cfg.experts.shared * cfg.expert_width)
        out.pop("intermediate_size")
    if model_type == "qwen3_next":
        out.update(norm_topk_prob=cfg.experts.normalize_weights, decoder_sparse_step=1, mlp_only_layers=[],
                   intermediate_size=cfg.d_ff)


def _gated_query(S: tuple[str, ...], name: str, heads: int, width: int) -> Rule:
    """q_proj [N * 2H, D], each head's query rows then its gate rows <-> the query kernel and the gate kernel
    [D, N, H]."""
    def load(t):
        w = t[0].reshape(heads, 2, width, -1)
        return [w[:, 0].transpose(2, 0, 1), w[:, 1].transpose(2, 0, 1)]

    def save(p):
        return [np.stack([a.transpose(1, 2, 0) for a in p], axis=1).reshape(heads * 2 * width, -1)]

    return Rule((S + ("attn", "q"), S + ("attn", "gate")), (name,), load, save)


def _attention_rules(cfg: ModelConfig, S: tuple[str, ...], a: str) -> list[Rule]:
    N, K, H = cfg.num_heads, cfg.kv_heads, cfg.head_dim_
    out = [_gated_query(S, f"{a}.q_proj.weight", N, H), heads_in(S + ("attn", "k"), f"{a}.k_proj.weight", K, H),
           heads_in(S + ("attn", "v"), f"{a}.v_proj.weight", K, H),
           heads_out(S + ("attn", "o"), f"{a}.o_proj.weight", N, H),
           copy(S + ("attn", "q_norm", "scale"), f"{a}.q_norm.weight"),
           copy(S + ("attn", "k_norm", "scale"), f"{a}.k_norm.weight")]
    return out


def _grouped_projections(cfg: ModelConfig, S: tuple[str, ...], l: str) -> list[Rule]:
    """Qwen3-Next's fused in_proj_qkvz [Hk * (2 Dk + 2 r Dv), D] and in_proj_ba [Hk * 2r, D]: for each key head, its
    query and key, then its group of r value heads' values and gates (and b, a likewise) <-> q, k [D, Hk, Dk],
    v, z [D, Hv, Dv], b, a [D, Hv]."""
    la = cfg.linear_attention
    Hk, Hv, Dk, Dv = la.key_heads, la.value_heads, la.key_head_dim, la.value_head_dim
    r, P = Hv // Hk, S + ("attn",)
    qkvz = [Dk, Dk, r * Dv, r * Dv]

    def load_qkvz(t):
        parts = np.split(t[0].reshape(Hk, sum(qkvz), -1), np.cumsum(qkvz)[:-1], axis=1)  # each [Hk, n, D]
        q, k = (p.transpose(2, 0, 1) for p in parts[:2])
        v, z = (p.reshape(Hv, Dv, -1).transpose(2, 0, 1) for p in parts[2:])
        return [q, k, v, z]

    def save_qkvz(p):
        q, k = (a.transpose(1, 2, 0) for a in p[:2])
        v, z = (a.transpose(1, 2, 0).reshape(Hk, r * Dv, -1) for a in p[2:])
        return [np.concatenate([q, k, v, z], axis=1).reshape(Hk * sum(qkvz), -1)]

    def load_ba(t):
        b, a = np.split(t[0].reshape(Hk, 2 * r, -1), 2, axis=1)
        return [b.reshape(Hv, -1).T, a.reshape(Hv, -1).T]

    def save_ba(p):
        b, a = (x.T.reshape(Hk, r, -1) for x in p)
        return [np.concatenate([b, a], axis=1).reshape(Hk * 2 * r, -1)]

    return [Rule(tuple(P + (n,) for n in "qkvz"), (f"{l}.in_proj_qkvz.weight",), load_qkvz, save_qkvz),
            Rule((P + ("b",), P + ("a",)), (f"{l}.in_proj_ba.weight",), load_ba, save_ba)]


def _side_by_side_projections(cfg: ModelConfig, S: tuple[str, ...], l: str) -> list[Rule]:
    """Qwen3.5's in_proj_qkv [2 Hk Dk + Hv Dv, D] (all queries, all keys, all values), in_proj_z [Hv Dv, D],
    in_proj_b and in_proj_a [Hv, D]."""
    la = cfg.linear_attention
    Hk, Hv, Dk, Dv = la.key_heads, la.value_heads, la.key_head_dim, la.value_head_dim
    P, widths = S + ("attn",), [Hk * Dk, Hk * Dk, Hv * Dv]

    def load(t):
        q, k, v = np.split(t[0], np.cumsum(widths)[:-1], axis=0)
        return [q.T.reshape(-1, Hk, Dk), k.T.reshape(-1, Hk, Dk), v.T.reshape(-1, Hv, Dv)]

    def save(p):
        return [np.concatenate([a.reshape(a.shape[0], -1).T for a in p], axis=0)]

    return [Rule((P + ("q",), P + ("k",), P + ("v",)), (f"{l}.in_proj_qkv.weight",), load, save),
            heads_in(P + ("z",), f"{l}.in_proj_z.weight", Hv, Dv),
            linear(P + ("b",), f"{l}.in_proj_b.weight"), linear(P + ("a",), f"{l}.in_proj_a.weight")]


def _linear_layer_rules(cfg: ModelConfig, model_type: str, S: tuple[str, ...], l: str) -> list[Rule]:
    la, P = cfg.linear_attention, S + ("attn",)
    projections = (_grouped_projections if model_type == "qwen3_next" else _side_by_side_projections)(cfg, S, l)
    return [*projections,
            Rule((P + ("conv",),), (f"{l}.conv1d.weight",), lambda t: [t[0][:, 0].T], lambda p: [p[0].T[:, None]]),
            copy(P + ("dt_bias",), f"{l}.dt_bias"), copy(P + ("A_log",), f"{l}.A_log"),
            copy(P + ("norm_scale",), f"{l}.norm.weight"),
            heads_out(P + ("o",), f"{l}.out_proj.weight", la.value_heads, la.value_head_dim)]


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    text_type = WRAPPED.get(model_type, model_type)
    experts = cfg.experts is not None

    def block(S: tuple[str, ...], linear_layer: bool) -> list[Rule]:
        layer = f"{prefix}layers.{{i}}"
        mixer = (_linear_layer_rules(cfg, text_type, S, f"{layer}.linear_attn") if linear_layer else
                 _attention_rules(cfg, S, f"{layer}.self_attn"))
        mlp = expert_rules(cfg, S + ("mlp",), f"{layer}.mlp") if experts else gated_mlp_rules(cfg, S, f"{layer}.mlp")
        return [*mixer, *norm_rules(S, layer), *mlp]

    linear_at = cfg.linear_attention.layers
    full_at = [i for i in range(cfg.decoder_layers) if i not in linear_at]
    out = [copy(("embed", "table"), f"{prefix}embed_tokens.weight"),
           copy(("decoder", "final_norm", "scale"), f"{prefix}norm.weight"),
           *[rule.at_layers(linear_at) for rule in block(("decoder", "linear_blocks"), True)],
           *[rule.at_layers(full_at) for rule in block(("decoder", "blocks"), False)]]
    head, aliases = lm_head(cfg, f"{prefix}embed_tokens.weight")
    return out + head, aliases


def ignored(hf: dict, names: set[str]) -> tuple[set[str], str]:
    """The multi-token-prediction weights (``mtp.*``) every published file carries, and a multimodal file's
    vision tower: next-token prediction on text never reads them."""
    mtp = {n for n in names if n.startswith("mtp.")}
    vision = {n for n in names if hf.get("model_type") in WRAPPED and not n.startswith(MULTIMODAL_PREFIX)
              and n != "lm_head.weight" and n not in mtp}
    notes = [f"{len(mtp)} tensors of the multi-token-prediction module (mtp.*) are not used for next-token "
             "prediction and were skipped"] if mtp else []
    if vision:
        notes.append(f"{len(vision)} tensors of the vision tower are not used by jaxformer (it reads the text model; "
                     "issue 51 brings images) and were skipped")
    return mtp | vision, "; ".join(notes)


_TEXT_HARMLESS = {"full_attention_interval": "read only where layer_types is absent (then it places the layers)",
                  "mtp_num_hidden_layers": "the multi-token-prediction module's, skipped with a note",
                  "mtp_use_dedicated_embeddings": "the multi-token-prediction module's, skipped with a note"}
HARMLESS = {**_TEXT_HARMLESS, **{f"text_config.{key}": why for key, why in _TEXT_HARMLESS.items()},
            "vision_config": "the vision tower's, which jaxformer does not run (text only)",
            **dict.fromkeys(("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"),
                            "image and video placeholder tokens, which only the vision path reads")}

ARCHITECTURE = Architecture(
    CLASSES, {"qwen3_next": "model.", "qwen3_5_text": "model.", "qwen3_5_moe_text": "model.",
              "qwen3_5": MULTIMODAL_PREFIX, "qwen3_5_moe": MULTIMODAL_PREFIX},
    ("Qwen3NextModel", "Qwen3_5TextModel", "Qwen3_5MoeTextModel"), config_from_hf, config_to_hf, rules,
    ignored=ignored, defaults=DEFAULTS, harmless=HARMLESS, wrappers=("qwen3_5", "qwen3_5_moe"))
