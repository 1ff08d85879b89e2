"""Gemma 2 and Gemma 3 text (``gemma2``, ``gemma3_text``): RMSNorm scaled by (1 + w), a norm before and
after each sublayer, GeGLU, embeddings times sqrt(d_model), query_pre_attn_scalar, soft-capped scores
and logits (Gemma 2), sliding and full layers from ``layer_types``, and Gemma 3's query/key norms and
local rotary base; config and tensor rules, both directions. T5Gemma (interop/t5gemma.py) reuses the
block's pieces below.

A Gemma 3 file with ``use_bidirectional_attention: true`` (EmbeddingGemma) is an encoder: full layers see every
key, sliding layers the keys within ``sliding_window // 2`` either side (Gemma3TextConfig turns the file's
window w into the exclusive bound w // 2 + 1 on |query - key|); nothing else changes (rotary, norms, scale)."""

from __future__ import annotations

from typing import Any

from jaxformer.layer_plan import local_layers
from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (Architecture, Rule, activation, attention, copy, linear, lm_head, refuse,
                                     rope_from_hf, rope_spec, rope_to_hf, with_defaults)

CLASSES = {"gemma2": ("Gemma2Model", "Gemma2ForCausalLM"), "gemma3_text": ("Gemma3TextModel", "Gemma3ForCausalLM")}
_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}

# What a file that leaves a key out means: transformers' config-class defaults (Gemma2Config,
# Gemma3TextConfig, T5GemmaModuleConfig for each half of a T5Gemma), checked against the classes' own
# fields by tests/test_config_reading.py.
_GEMMA2_DEFAULTS = dict(num_key_value_heads=4, head_dim=256, max_position_embeddings=8192, rms_norm_eps=1e-6,
                        query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                        final_logit_softcapping=30.0, attention_bias=False, attention_dropout=0.0,
                        tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh")
DEFAULTS = {"gemma2": _GEMMA2_DEFAULTS, "t5gemma": _GEMMA2_DEFAULTS,
            "gemma3_text": {**_GEMMA2_DEFAULTS, "max_position_embeddings": 131072, "attn_logit_softcapping": None,
                            "final_logit_softcapping": None}}


def layer_kinds(hf: dict, model_type: str) -> list[str]:
    """'full' or 'sliding' per layer: ``layer_types``, or for files without it (as published) what the
    config class derives: Gemma 3 every ``sliding_window_pattern``-th layer full (default 6), Gemma 2 and
    T5Gemma every second."""
    types, pattern = hf.get("layer_types"), hf.get("sliding_window_pattern", 6)  # read, like transformers, in any case
    if not types:
        period = pattern if model_type.startswith("gemma3") else 2
        types = ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(hf["num_hidden_layers"])]
    kinds = [_LAYER_TYPES.get(t, t) for t in types]
    refuse(any(t not in _LAYER_TYPES.values() for t in kinds), f"{model_type}: layer_types {sorted(set(kinds))} are not "
           f"supported; expected {sorted(_LAYER_TYPES)}")
    return kinds


def _rotary(hf: dict, model_type: str) -> tuple[tuple, tuple | None]:
    """((theta, scaling) of the full layers, (theta, scaling) of the sliding ones, None when they share
    it) as transformers reads them. Gemma 3 has one setting per layer type: ``rope_parameters`` nested by
    type, or in published files ``rope_theta`` (default 1e6) with ``rope_scaling`` for the full layers and
    ``rope_local_base_freq`` (default 1e4) for the sliding ones. Gemma 2 and T5Gemma have one setting."""
    rope = hf.get("rope_parameters") or {}
    if not (model_type.startswith("gemma3") or "full_attention" in rope or "sliding_attention" in rope):
        return rope_from_hf(hf), None
    refuse(bool(rope) and not {"full_attention", "sliding_attention"} & set(rope), f"{model_type}: rope_parameters "
           f"must be given per layer type (full_attention, sliding_attention); got {sorted(rope)}")
    full = dict(rope.get("full_attention") or {"rope_type": "default"})
    full.update(hf.get("rope_scaling") or {})
    full.setdefault("rope_theta", hf.get("rope_theta", 1e6))
    # transformers' yarn reads truncate from the outer, per-layer-type dict, where it never is: always on
    full.pop("truncate", None)
    local = dict(rope.get("sliding_attention") or {"rope_type": "default"})
    local.setdefault("rope_theta", hf.get("rope_local_base_freq", 1e4))
    length = hf.get("max_position_embeddings")
    return rope_spec(full, length), rope_spec(local, length)


def bidirectional(hf: dict, model_type: str) -> bool:
    """Whether a file's Gemma blocks attend both ways (EmbeddingGemma); only Gemma 3 text files can say so."""
    value = hf.get("use_bidirectional_attention")  # read in any case, so the key is accounted for
    refuse(value not in (None, False, True), f"{model_type}: use_bidirectional_attention={value!r} is not supported; "
           "expected true or false")
    refuse(bool(value) and model_type != "gemma3_text", f"{model_type}: use_bidirectional_attention=true is "
           "supported for gemma3_text (EmbeddingGemma) only")
    return bool(value)


def block_config(hf: dict, model_type: str, causal: bool = True) -> dict[str, Any]:
    """The ModelConfig fields of a Gemma 2 (or 3) block, whatever model holds it (also T5Gemma's halves)."""
    hf = with_defaults(hf, DEFAULTS[model_type])
    heads = hf["num_attention_heads"]
    kinds = layer_kinds(hf, model_type)
    both_ways = bidirectional(hf, model_type)
    window = hf["sliding_window"]
    pattern, layer_types = "bidirectional" if both_ways else "causal", None
    if "sliding" in kinds:
        refuse(window is None, f"{model_type}: sliding layers need sliding_window")
        pattern = "sliding" if set(kinds) == {"sliding"} and not both_ways else "alternating"
        layer_types = tuple(kinds) if pattern == "alternating" else None
        if both_ways:  # an encoder's window counts the keys on either side: |t - s| <= w // 2
            window = int(window) // 2
            refuse(window < 1, f"{model_type}: sliding_window={hf['sliding_window']} leaves a bidirectional "
                   "sliding layer no key but its own; expected at least 2")
    (theta, scaling), local = _rotary(hf, model_type)
    local_theta = None
    if local is not None:
        refuse(local[1] is not None, f"{model_type}: scaled rotary sliding layers are not supported")
        if pattern == "sliding":  # every layer sliding: the local setting is the model's
            theta, scaling = local
        elif pattern == "alternating":
            local_theta = local[0]
    bias = bool(hf["attention_bias"])
    softcap = hf["attn_logit_softcapping"]
    if model_type.startswith("gemma3"):  # its attention never applies it (transformers' Gemma3Attention passes none)
        softcap = None
    act = hf["hidden_activation"] or "gelu_pytorch_tanh"
    return dict(d_model=hf["hidden_size"], num_heads=heads, num_kv_heads=hf["num_key_value_heads"] or heads,
                head_dim=hf["head_dim"], d_ff=hf["intermediate_size"], norm="rmsnorm",
                norm_eps=hf["rms_norm_eps"], norm_bias=False, norm_scale_offset=1.0, sandwich_norm=True,
                activation=activation(act, True, model_type), position="rope", rope_theta=theta,
                rope_scaling=scaling, local_rope_theta=local_theta,
                max_positions=hf["max_position_embeddings"], attention=pattern,
                window_size=int(window) if layer_types or pattern == "sliding" else None, layer_types=layer_types,
                attention_scale=float(hf["query_pre_attn_scalar"]) ** -0.5,
                attention_softcap=softcap,
                qk_norm=model_type.startswith("gemma3"),
                qkv_bias=bias, out_bias=bias, mlp_bias=False, scale_embeddings=True,
                attention_dropout_rate=float(hf["attention_dropout"] or 0.0))


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    full = with_defaults(hf, DEFAULTS[model_type])
    block = block_config(hf, model_type)
    if bidirectional(hf, model_type):
        # EmbeddingGemma: the base model as an encoder; a bidirectional LM head has no encoder head of ours
        refuse(not arch.endswith("Model"), f"{model_type}: {arch} with use_bidirectional_attention=true is not "
               f"supported; jaxformer reads bidirectional Gemma 3 files as encoders: {CLASSES[model_type][0]}")
        return dict(family="encoder", encoder_layers=hf["num_hidden_layers"], decoder_layers=0, **block,
                    type_vocab_size=0, pooler=False, logits_softcap=full["final_logit_softcapping"],
                    tie_embeddings=full["tie_word_embeddings"], head="none")
    return dict(family="decoder", decoder_layers=hf["num_hidden_layers"], **block,
                logits_softcap=full["final_logit_softcapping"], tie_embeddings=full["tie_word_embeddings"],
                head="none" if arch.endswith("Model") else "lm")


def block_to_hf(cfg: ModelConfig, model_type: str, out: dict, layers: int) -> None:
    """config.json fields of a Gemma block (also each half of a T5Gemma)."""
    sliding = local_layers(cfg)[:layers] if cfg.attention == "alternating" else (cfg.attention == "sliding",) * layers
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
               head_dim=cfg.head_dim_, intermediate_size=cfg.d_ff, num_hidden_layers=layers, rms_norm_eps=cfg.norms.eps,
               hidden_activation="gelu_pytorch_tanh", max_position_embeddings=cfg.max_positions,
               query_pre_attn_scalar=round(cfg.scale ** -2), attn_logit_softcapping=cfg.scores.softcap,
               sliding_window=cfg.window_size or cfg.max_positions, attention_bias=cfg.biases.qkv,
               layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
               attention_dropout=cfg.attention_dropout_rate)
    out.pop("hidden_act", None)
    out.pop("rope_theta", None)
    out.pop("rope_scaling", None)
    if model_type.startswith("gemma3"):
        local = cfg.rotary.local_theta if cfg.rotary.local_theta is not None else cfg.rotary.theta
        out.update(rope_parameters={"full_attention": rope_to_hf(cfg),
                                    "sliding_attention": {"rope_type": "default", "rope_theta": local}},
                   use_bidirectional_attention=False)
    else:
        out["rope_parameters"] = rope_to_hf(cfg)


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    encoder = cfg.family == "encoder"
    block_to_hf(cfg, model_type, out, cfg.encoder_layers if encoder else cfg.decoder_layers)
    out.update(final_logit_softcapping=cfg.logits.softcap, tie_word_embeddings=cfg.embeddings.tie)
    if encoder:  # the file's window spans both sides: Gemma3TextConfig reads w back as |t - s| <= w // 2
        out.update(use_bidirectional_attention=True,
                   sliding_window=2 * cfg.window_size if cfg.window_size else out["sliding_window"])


def block_rules(cfg: ModelConfig, L: tuple[str, str], layer: str, norms: dict[str, str], cross: bool = False) -> list[Rule]:
    """One stack's per-layer rules: attention (+ Gemma 3's q/k norms), GeGLU MLP, and the norms named by
    ``norms`` (jaxformer norm -> the file's module name inside the layer)."""
    out = []
    for module, name in (("attn", "self_attn"), ("cross_attn", "cross_attn"))[:2 if cross else 1]:
        a = f"{layer}.{name}"
        out += attention(cfg, L + (module,), f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight",
                         f"{a}.o_proj.weight", f"{a}.q_proj.bias", f"{a}.k_proj.bias", f"{a}.v_proj.bias",
                         f"{a}.o_proj.bias")
        if cfg.query_key_norm is not None:
            out += [copy(L + (module, "q_norm", "scale"), f"{a}.q_norm.weight"),
                    copy(L + (module, "k_norm", "scale"), f"{a}.k_norm.weight")]
    out += [linear(L + ("mlp", "wi_gate"), f"{layer}.mlp.gate_proj.weight"),
            linear(L + ("mlp", "wi"), f"{layer}.mlp.up_proj.weight"),
            linear(L + ("mlp", "wo"), f"{layer}.mlp.down_proj.weight")]
    out += [copy(L + (ours, "scale"), f"{layer}.{theirs}.weight") for ours, theirs in norms.items()]
    return out


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    norms = {"attn_norm": "input_layernorm", "attn_post_norm": "post_attention_layernorm",
             "mlp_norm": "pre_feedforward_layernorm", "mlp_post_norm": "post_feedforward_layernorm"}
    stack = "encoder" if cfg.family == "encoder" else "decoder"
    out = [copy(("embed", "table"), f"{p}embed_tokens.weight"),
           *block_rules(cfg, (stack, "blocks"), f"{p}layers.{{i}}", norms),
           copy((stack, "final_norm", "scale"), f"{p}norm.weight")]
    head, aliases = lm_head(cfg, f"{p}embed_tokens.weight")
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, {model_type: "model." for model_type in CLASSES},
                            tuple(classes[0] for classes in CLASSES.values()), config_from_hf, config_to_hf,
                            rules, harmless={"_sliding_window_pattern": "a private copy; layer_types decides",
                                             "hidden_act": "Gemma's MLP reads hidden_activation",
                                             "sliding_window_size": "an older copy of sliding_window, which "
                                                                    "transformers never reads"},
                            defaults={model_type: {**DEFAULTS[model_type], "pad_token_id": 0, "bos_token_id": 2,
                                                   "eos_token_id": 1} for model_type in CLASSES})
