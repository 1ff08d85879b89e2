"""Microsoft's Phi-3.5-MoE (``phimoe``): config and tensor rules, both directions.

Mixtral's layout (every MLP a mixture of ``num_local_experts`` SwiGLU experts under ``block_sparse_moe``, each
expert's w1 (gate), w3 (up) and w2 (down) its own tensor; a window of ``sliding_window`` keys on every layer) with
ideas of its own:
- LayerNorms with biases, the final one too (``rms_norm_eps`` is their epsilon, whatever its name says);
- biases on q, k, v and o (``attention_bias``) and on the LM head (``lm_head_bias``);
- the sparse mixer (``router_score='sparsemixer'``): two experts per token, each weighted by its share of a softmax
  over the experts whose logits lie within 2 ``router_jitter_noise`` (relative) of the best (``router_jitter_eps``),
  the second chosen the same way among the others; whatever ``num_experts_per_tok`` says, transformers routes two;
- rotary positions as transformers' PhimoeRotaryEmbedding computes them: with longrope, the ``short_factor``
  frequencies at every length (the class recomputes them without the call's length, so ``long_factor`` is never
  used: it loads at any value and is written as the short one), and cos and sin times ``short_mscale``, or past
  ``original_max_position_embeddings`` ``long_mscale``; the two equal (as published) are longrope's attention
  factor, two that differ are refused. Other scalings are refused (the class would scale them by the mscales).
``input_jitter_noise`` and the sparse mixer's sampled routing are training-time noise, not modelled.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop import llama
from jaxformer.interop.rules import Rule, copy, linear, norm, refuse, rope_from_hf, stacked_experts, with_defaults

STEMS = {"phimoe": "Phimoe"}
# PhimoeConfig's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"phimoe": dict(num_key_value_heads=8, hidden_act="silu", max_position_embeddings=131072,
                           rms_norm_eps=1e-5, pad_token_id=None, bos_token_id=1, eos_token_id=2,
                           tie_word_embeddings=False, sliding_window=None, attention_dropout=0.0,
                           num_experts_per_tok=2, num_local_experts=16, router_aux_loss_coef=0.001,
                           router_jitter_noise=0.01, input_jitter_noise=0.0, attention_bias=False,
                           lm_head_bias=False)}
DEFAULT_THETA = 1e6  # PhimoeConfig.default_theta
ROPE_KINDS = ("default", "longrope")


def _rope(hf: dict):
    """(theta, scaling) as PhimoeRotaryEmbedding computes them (see the module's docstring)."""
    view = with_defaults(hf, {})  # records reads into hf's record; its rope dict may be replaced
    key = "rope_scaling" if view.get("rope_scaling") else "rope_parameters"  # the first replaces the other
    params = dict(view.get(key) or {})
    kind = params.get("rope_type", params.get("type", "default"))
    mscales = params.pop("short_mscale", None), params.pop("long_mscale", None)
    view[key] = params or None
    refuse(kind not in ROPE_KINDS, f"phimoe: rope type {kind!r} is not supported (PhimoeRotaryEmbedding scales its "
           f"cos and sin by short_mscale or long_mscale, not that type's own factor); supported: {ROPE_KINDS}")
    theta, scaling = rope_from_hf(view, DEFAULT_THETA)
    if kind == "default":
        return theta, scaling
    short, long = mscales
    refuse(not all(isinstance(m, (int, float)) and not isinstance(m, bool) for m in mscales),
           f"phimoe: longrope needs numbers short_mscale and long_mscale, not {short!r} and {long!r}")
    refuse(short != long, f"phimoe: short_mscale={short} and long_mscale={long} differ; jaxformer's longrope scales "
           "cos and sin by one factor at every length")
    return theta, dataclasses.replace(scaling, long_factor=scaling.short_factor, attention_factor=float(short))


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    experts, per_token = hf["num_local_experts"], hf["num_experts_per_tok"]
    refuse(not experts, f"phimoe: num_local_experts={experts!r}; a Phi-3.5-MoE model needs experts")
    refuse(per_token != 2, f"phimoe: num_experts_per_tok={per_token!r} is not supported: PhiMoE's sparse mixer routes "
           "two experts per token whatever it says (its balancing loss would count top-k)")
    cfg = llama.decoder_config(hf, model_type, arch, _rope(hf), llama.every_layer_window(hf))
    head_bias = bool(hf["lm_head_bias"])  # (read whatever the class: PhimoeModel has no head to bias)
    cfg.update(norm="layernorm", norm_bias=True, mlp_bias=False,  # (PhimoeConfig has no mlp_bias)
               lm_head_bias=cfg["head"] == "lm" and head_bias, num_experts=experts,
               experts_per_token=2, router_score="sparsemixer", normalize_router_weights=False,
               router_jitter_eps=float(hf["router_jitter_noise"]), router_aux_loss_coef=hf["router_aux_loss_coef"])
    return cfg


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    llama.decoder_to_hf(cfg, out)
    out.update(sliding_window=cfg.window_size, attention_bias=cfg.biases.qkv, lm_head_bias=cfg.logits.trained_bias,
               num_local_experts=cfg.experts.count, num_experts_per_tok=cfg.experts.per_token,
               router_jitter_noise=cfg.experts.jitter_eps, input_jitter_noise=0.0,
               router_aux_loss_coef=cfg.experts.aux_loss_coef)
    scaling, rope = cfg.rotary.scaling, out["rope_parameters"]
    if scaling is not None and scaling.kind == "longrope":  # its attention factor is the class's mscale
        mscale = rope.pop("attention_factor", scaling.cos_sin_factor)
        rope.update(short_mscale=mscale, long_mscale=mscale)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        moe, mlp = f"{layer}.block_sparse_moe", S + ("mlp",)
        return [*llama.attention_rules(cfg, S, f"{layer}.self_attn"),
                *norm(S + ("attn_norm",), f"{layer}.input_layernorm", True),
                *norm(S + ("mlp_norm",), f"{layer}.post_attention_layernorm", True),
                linear(mlp + ("router",), f"{moe}.gate.weight"),
                *[stacked_experts(mlp + (path,), [f"{moe}.experts.{e}.{w}.weight" for e in range(cfg.experts.count)])
                  for w, path in (("w1", "wi_gate"), ("w3", "wi"), ("w2", "wo"))]]

    out, aliases = llama.decoder_rules(cfg, prefix, block)
    out += norm(("decoder", "final_norm"), f"{prefix}norm", True)[1:]  # (decoder_rules wrote its scale)
    if cfg.logits.trained_bias:
        out.append(copy(("logits_bias",), "lm_head.bias"))
    return out, aliases


ARCHITECTURE = dataclasses.replace(
    llama.architecture(STEMS, config_from_hf, config_to_hf, rules, defaults=DEFAULTS,
                       harmless={"input_jitter_noise": "training-time noise on the experts' inputs, not modelled",
                                 "hidden_dropout": "the remote code's; PhimoeConfig and its model never read it"}),
    # the published files name the remote code's class; loaded as PhimoeForCausalLM, never written
    classes={"phimoe": ("PhimoeModel", "PhimoeForCausalLM", "PhiMoEForCausalLM")})
