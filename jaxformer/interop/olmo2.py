"""OLMo-2 (``olmo2``): AI2's fully open decoders; config and tensor rules, both directions.

LLaMA's parts (RMSNorm, SwiGLU, rotary positions, grouped-query attention, an untied head) in another order:
each sublayer reads the residual stream unnormed and its output is normed before it joins,
x + norm(f(x)) (``norm_position='output'``: the file's post_attention_layernorm and
post_feedforward_layernorm), and the queries and keys are normed over the whole projection, all heads at once,
before rotary positions (``qk_norm_span='projection'``: q_norm [heads * head_dim], k_norm [kv_heads *
head_dim]). ``attention_bias`` puts biases on q, k, v and o alike.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.llama import attention_rules, decoder_config, decoder_rules, decoder_to_hf, gated_mlp_rules
from jaxformer.interop.rules import Architecture, Rule, bias_heads, copy, rope_from_hf

CLASSES = {"olmo2": ("Olmo2Model", "Olmo2ForCausalLM")}
# Olmo2Config's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"olmo2": dict(num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                          rms_norm_eps=1e-5, attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False,
                          pad_token_id=1, bos_token_id=None, eos_token_id=50279)}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    fields = decoder_config(hf, model_type, arch, rope_from_hf(hf))
    return {**fields, "norm_position": "output", "qk_norm": True, "qk_norm_span": "projection"}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    decoder_to_hf(cfg, out)
    out["attention_bias"] = cfg.biases.qkv


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        a = f"{layer}.self_attn"
        # one scale over the whole projection [heads * head_dim], held per head [heads, head_dim]
        return [*attention_rules(cfg, S, a),
                bias_heads(S + ("attn", "q_norm", "scale"), f"{a}.q_norm.weight", cfg.num_heads, cfg.head_dim_),
                bias_heads(S + ("attn", "k_norm", "scale"), f"{a}.k_norm.weight", cfg.kv_heads, cfg.head_dim_),
                copy(S + ("attn_post_norm", "scale"), f"{layer}.post_attention_layernorm.weight"),
                copy(S + ("mlp_post_norm", "scale"), f"{layer}.post_feedforward_layernorm.weight"),
                *gated_mlp_rules(cfg, S, f"{layer}.mlp")]

    return decoder_rules(cfg, prefix, block)


ARCHITECTURE = Architecture(CLASSES, {"olmo2": "model."}, ("Olmo2Model",), config_from_hf, config_to_hf, rules,
                            defaults=DEFAULTS)
