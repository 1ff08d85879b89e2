"""GLM and GLM-4 (``glm``, ``glm4``): LLaMA's blocks (interop/llama.py) with rotary positions over half of
each head (``partial_rotary_factor``), rotating adjacent pairs, biases on q, k and v alone, the gate and up
projections in one tensor (``gate_up_proj``), and GLM-4's Gemma-style norm on each sublayer's output too
(``post_self_attn_layernorm``, ``post_mlp_layernorm``). Config and tensor rules, both directions."""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop import llama
from jaxformer.interop.rules import Rule, copy, partial_rope_from_hf, rotary_width

STEMS = {"glm": "Glm", "glm4": "Glm4"}
# Their config classes' defaults for the keys read below (checked by tests/test_config_reading.py)
DEFAULTS = dict.fromkeys(STEMS, dict(llama.COMMON_DEFAULTS, bos_token_id=None, eos_token_id=None, pad_token_id=151329,
                                     num_key_value_heads=2, head_dim=128, max_position_embeddings=131072,
                                     rms_norm_eps=1.5625e-07, attention_bias=True))
DEFAULT_THETA = 1e4


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    heads = hf["num_attention_heads"]
    theta, scaling, fraction = partial_rope_from_hf(hf, 0.5, DEFAULT_THETA)  # the class's default: half of each head
    rotary = rotary_width(hf["head_dim"] or hf["hidden_size"] // heads, fraction, model_type)
    cfg = llama.decoder_config(hf, model_type, arch, (theta, scaling))
    cfg.update(out_bias=False, rotary_dim=rotary, rope_interleave=True, sandwich_norm=model_type == "glm4")
    return cfg


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    llama.decoder_to_hf(cfg, out)
    out["rope_parameters"]["partial_rotary_factor"] = cfg.rope_dim / cfg.head_dim_
    out.update(attention_bias=cfg.biases.qkv)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        output_norms = [copy(S + ("attn_post_norm", "scale"), f"{layer}.post_self_attn_layernorm.weight"),
                        copy(S + ("mlp_post_norm", "scale"), f"{layer}.post_mlp_layernorm.weight")]
        return [*llama.attention_rules(cfg, S, f"{layer}.self_attn"), *llama.norm_rules(S, layer),
                *(output_norms if cfg.norms.sandwich else []), *llama.fused_gated_mlp_rules(S, f"{layer}.mlp")]

    return llama.decoder_rules(cfg, prefix, block)


ARCHITECTURE = llama.architecture(STEMS, config_from_hf, config_to_hf, rules, defaults=DEFAULTS)
