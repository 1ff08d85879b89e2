"""LLaMA and its relatives (``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``mixtral``, ``phi3``): RMSNorm,
rotary positions, gated MLPs (Mixtral: experts), GQA, Qwen3's RMSNorm over each query and key head, Phi-3's
fused qkv and gate/up tensors; config and tensor rules, both directions."""

from __future__ import annotations

from typing import Any

from jaxformer.config import ModelConfig
from jaxformer.interop.rules import (Architecture, Rule, activation, attention, copy, fused_heads_in, fused_linear,
                                     heads_out, linear, lm_head, refuse, rope_from_hf, rope_to_hf, stacked_experts)

STEMS = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "mixtral": "Mixtral",
         "phi3": "Phi3"}
QWEN = ("qwen2", "qwen3")  # the window only under use_sliding_window, sliding from max_window_layers on
CLASSES = {model_type: (f"{stem}Model", f"{stem}ForCausalLM") for model_type, stem in STEMS.items()}


# What a file that leaves a key out means: transformers' config-class defaults for the keys read below
# (checked against the classes' own fields by tests/test_config_reading.py); the rotary base too.
_COMMON = dict(hidden_act="silu", tie_word_embeddings=False, attention_dropout=0.0, bos_token_id=1, eos_token_id=2)
DEFAULTS = {
    "llama": dict(_COMMON, num_key_value_heads=None, max_position_embeddings=2048, rms_norm_eps=1e-6,
                  attention_bias=False, mlp_bias=False),
    "mistral": dict(_COMMON, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-6,
                    sliding_window=4096),
    "mixtral": dict(_COMMON, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
                    sliding_window=None, num_local_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.001,
                    router_jitter_noise=0.0),
    "qwen2": dict(_COMMON, bos_token_id=None, eos_token_id=None, num_key_value_heads=32,
                  max_position_embeddings=32768, rms_norm_eps=1e-6,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=28),
    "phi3": dict(_COMMON, eos_token_id=32000, pad_token_id=32000, num_key_value_heads=None,
                 max_position_embeddings=4096, original_max_position_embeddings=4096, rms_norm_eps=1e-5,
                 sliding_window=None, resid_pdrop=0.0),
    "qwen3": dict(_COMMON, bos_token_id=None, eos_token_id=None, num_key_value_heads=32, head_dim=128,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, attention_bias=False,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=28),
}
DEFAULT_THETA = {"mixtral": 1e6}


def _qwen2_layer_types(hf: dict) -> tuple[list[str], int | None]:
    """Qwen2's layer types and window as its config class derives them: the window exists only under
    use_sliding_window (default 4096), and without layer_types the layers from max_window_layers (default
    28) on are the sliding ones."""
    window, first_sliding = hf["sliding_window"], hf["max_window_layers"]
    window = window if hf["use_sliding_window"] else None
    kinds = hf.get("layer_types") or ["sliding_attention" if window is not None and i >= first_sliding
                                      else "full_attention" for i in range(hf["num_hidden_layers"])]
    return kinds, window


def _head_dim(hf: dict, heads: int) -> int | None:
    """An explicit head_dim, or None where it is the derived hidden_size / heads (transformers 5 writes that
    one out; a published file leaves it out or null): both files are one model."""
    head_dim = hf.get("head_dim")
    return None if head_dim == hf["hidden_size"] // heads else head_dim


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    theta, scaling = rope_from_hf(hf, DEFAULT_THETA.get(model_type, 1e4))
    heads = hf["num_attention_heads"]
    pattern, window = "causal", None
    if model_type in ("mistral", "mixtral", "phi3") and hf.get("sliding_window") is not None:
        pattern, window = "sliding", int(hf["sliding_window"])
    if model_type in QWEN:
        kinds, qwen_window = _qwen2_layer_types(hf)
        refuse(len(set(kinds)) > 1, f"{model_type}: a mix of sliding and full attention layers is not supported "
               f"(layer_types {kinds})")
        refuse(kinds[0] == "sliding_attention" and qwen_window is None, f"{model_type}: sliding layers need "
               "use_sliding_window=true and a sliding_window")
        if kinds[0] == "sliding_attention":
            pattern, window = "sliding", int(qwen_window)
    refuse(model_type == "mixtral" and hf["router_jitter_noise"] > 0, "mixtral: router_jitter_noise > 0 is not supported")
    bias = bool(hf.get("attention_bias", False)) and model_type != "phi3"  # Phi-3's attention has no biases
    cfg = dict(family="decoder", d_model=hf["hidden_size"], num_heads=heads,
               num_kv_heads=hf["num_key_value_heads"] or heads, head_dim=_head_dim(hf, heads),
               d_ff=hf["intermediate_size"], decoder_layers=hf["num_hidden_layers"], norm="rmsnorm",
               norm_eps=hf["rms_norm_eps"], norm_bias=False,
               activation=activation(hf["hidden_act"], True, model_type), position="rope",
               rope_theta=theta, rope_scaling=scaling, max_positions=hf["max_position_embeddings"],
               attention=pattern, window_size=window, qkv_bias=True if model_type == "qwen2" else bias,
               out_bias=False if model_type == "qwen2" else bias, mlp_bias=bool(hf.get("mlp_bias", False)),
               tie_embeddings=hf["tie_word_embeddings"], head="none" if arch.endswith("Model") else "lm",
               attention_dropout_rate=hf["attention_dropout"], qk_norm=model_type == "qwen3")
    if model_type == "mixtral":
        cfg.update(num_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
                   router_aux_loss_coef=hf["router_aux_loss_coef"])
    if model_type == "phi3":
        cfg["dropout_rate"] = float(hf["resid_pdrop"])  # embd_pdrop: training-time, not modelled (HARMLESS)
    return cfg


def mixtral_shaped(cfg: ModelConfig) -> bool:
    """A mixture of experts Mixtral's files can hold: softmax top-k with renormalised weights, experts
    as wide as d_ff, nothing of DeepSeekMoE's."""
    return (cfg.router_score == "softmax" and cfg.router_groups == 1 and not cfg.router_bias
            and cfg.normalize_router_weights and cfg.routed_scaling == 1.0 and not cfg.shared_experts
            and not cfg.dense_layers and cfg.expert_width == cfg.d_ff and cfg.router_aux_loss == "batch")


def target(cfg: ModelConfig) -> tuple[str, str] | None:
    if cfg.family != "decoder" or cfg.position != "rope" or cfg.mla:
        return None
    gemma_parts = (cfg.sandwich_norm, cfg.norm_scale_offset, cfg.scale_embeddings, cfg.attention_softcap,
                   cfg.logits_softcap, cfg.attention == "alternating", cfg.attention_scale is not None)
    if any(gemma_parts):  # nothing LLaMA's files can say
        return None
    if cfg.num_experts and (cfg.qk_norm or not mixtral_shaped(cfg)):
        return None
    if cfg.qk_norm:  # Qwen3: one attention_bias for all four projections
        if cfg.qkv_bias != cfg.out_bias:
            return None
        model_type = "qwen3"
    elif cfg.num_experts:
        model_type = "mixtral"
    elif cfg.qkv_bias and not cfg.out_bias:
        model_type = "qwen2"
    elif cfg.attention == "sliding":
        model_type = "mistral"
    else:
        model_type = "llama"
    return model_type, STEMS[model_type] + ("ForCausalLM" if cfg.head == "lm" else "Model")


def target_as(cfg: ModelConfig, model_type: str) -> tuple[str, str] | None:
    """A model loaded from ``model_type`` is written back as it when that type holds it: Phi-3 holds what
    plain LLaMA (or Mistral, with a window) holds, in fused tensors."""
    found = target(cfg)
    suffix = "ForCausalLM" if cfg.head == "lm" else "Model"
    if model_type == "phi3" and found is not None and found[0] in ("llama", "mistral") and not cfg.qkv_bias:
        return "phi3", f"Phi3{suffix}"
    return found if found is not None and found[0] == model_type else None


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
               head_dim=cfg.head_dim_, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.decoder_layers,
               rms_norm_eps=cfg.norm_eps, hidden_act="silu" if cfg.activation == "swiglu" else "gelu_pytorch_tanh",
               max_position_embeddings=cfg.max_positions, rope_parameters=rope_to_hf(cfg),
               tie_word_embeddings=cfg.tie_embeddings, attention_dropout=cfg.attention_dropout_rate)
    out.pop("rope_theta", None)
    out.pop("rope_scaling", None)
    if model_type == "llama":
        out.update(attention_bias=cfg.qkv_bias, mlp_bias=False)
    if model_type in ("mistral", "mixtral", "phi3", *QWEN):
        out["sliding_window"] = cfg.window_size
    if model_type == "phi3":
        out.update(resid_pdrop=cfg.dropout_rate, embd_pdrop=cfg.dropout_rate)
        out.pop("attention_bias", None)
    if model_type == "qwen3":
        out["attention_bias"] = cfg.qkv_bias
    if model_type in QWEN:
        sliding = cfg.attention == "sliding"
        out.update(use_sliding_window=sliding,
                   layer_types=["sliding_attention" if sliding else "full_attention"] * cfg.decoder_layers)
        if sliding:
            out["max_window_layers"] = 0
    if model_type == "mixtral":
        out.update(num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
                   router_aux_loss_coef=cfg.router_aux_loss_coef, router_jitter_noise=0.0)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("decoder", "blocks")
    layer = f"{p}layers.{{i}}"
    a = f"{layer}.self_attn"
    if model_type == "phi3":  # queries, keys and values in one tensor
        projections = [fused_heads_in([L + ("attn", n) for n in "qkv"], f"{a}.qkv_proj.weight",
                                      (cfg.num_heads, cfg.kv_heads, cfg.kv_heads), cfg.head_dim_),
                       heads_out(L + ("attn", "o"), f"{a}.o_proj.weight", cfg.num_heads, cfg.head_dim_)]
    else:
        projections = attention(cfg, L + ("attn",), f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight",
                                f"{a}.o_proj.weight", f"{a}.q_proj.bias", f"{a}.k_proj.bias", f"{a}.v_proj.bias",
                                f"{a}.o_proj.bias")
    out = [copy(("embed", "table"), f"{p}embed_tokens.weight"), *projections,
           *([copy(L + ("attn", "q_norm", "scale"), f"{a}.q_norm.weight"),
              copy(L + ("attn", "k_norm", "scale"), f"{a}.k_norm.weight")] if cfg.qk_norm else []),
           copy(L + ("attn_norm", "scale"), f"{layer}.input_layernorm.weight"),
           copy(L + ("mlp_norm", "scale"), f"{layer}.post_attention_layernorm.weight"),
           copy(("decoder", "final_norm", "scale"), f"{p}norm.weight")]
    if cfg.num_experts:
        moe = f"{layer}.block_sparse_moe"

        def experts(w: str, path: str) -> Rule:
            return stacked_experts(L + ("mlp", path), [f"{moe}.experts.{e}.{w}.weight" for e in range(cfg.num_experts)])

        out += [linear(L + ("mlp", "router"), f"{moe}.gate.weight"),
                experts("w1", "wi_gate"), experts("w3", "wi"), experts("w2", "wo")]
    elif model_type == "phi3":  # the gate, then the up projection, in one tensor
        out += [fused_linear([L + ("mlp", "wi_gate"), L + ("mlp", "wi")], f"{layer}.mlp.gate_up_proj.weight"),
                linear(L + ("mlp", "wo"), f"{layer}.mlp.down_proj.weight")]
    else:
        out += [linear(L + ("mlp", "wi_gate"), f"{layer}.mlp.gate_proj.weight"),
                linear(L + ("mlp", "wi"), f"{layer}.mlp.up_proj.weight"),
                linear(L + ("mlp", "wo"), f"{layer}.mlp.down_proj.weight")]
        if cfg.mlp_bias:
            # jaxformer's gated MLP has one input bias (on the up projection); HF has one on each.
            raise ValueError("llama: mlp_bias=True is not supported")
    head, aliases = lm_head(cfg, f"{p}embed_tokens.weight")
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, {model_type: "model." for model_type in STEMS},
                            tuple(f"{stem}Model" for stem in STEMS.values()), config_from_hf, target, config_to_hf,
                            rules, harmless={"pretraining_tp": "transformers 5 never reads it"},
                            target_as=target_as, defaults=DEFAULTS)
