"""OLMoE (``olmoe``): AI2's fully open mixture-of-experts decoder; config and tensor rules, both directions.

LLaMA's pre-norm layers (RMSNorm, rotary positions, grouped-query attention) with OLMo-2's query and key norms
over the whole projection, all heads at once, before rotary positions (``qk_norm_span='projection'``), and
every MLP a mixture of SwiGLU experts: a softmax over ``num_experts``, the top ``num_experts_per_tok`` kept,
renormalised only with ``norm_topk_prob`` (false as published), each expert ``intermediate_size`` wide, no
shared expert and no dense layer. ``clip_qkv`` (q, k and v clamped to +-clip before attention) is refused: the
published files leave it null.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.llama import attention_rules, decoder_config, decoder_rules, decoder_to_hf, norm_rules
from jaxformer.interop.llama import architecture
from jaxformer.interop.qwen import expert_rules
from jaxformer.interop.rules import Rule, bias_heads, refuse, rope_from_hf

STEMS = {"olmoe": "Olmoe"}
# OlmoeConfig's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"olmoe": dict(num_key_value_heads=None, hidden_act="silu", max_position_embeddings=4096,
                          rms_norm_eps=1e-5, pad_token_id=1, bos_token_id=None, eos_token_id=50279,
                          tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0, clip_qkv=None,
                          num_experts_per_tok=8, num_experts=64, router_aux_loss_coef=0.01, norm_topk_prob=False)}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(hf["clip_qkv"] is not None, f"olmoe: clip_qkv={hf['clip_qkv']!r} (q, k and v clamped before attention) "
           "is not supported; the published OLMoE files leave it null")
    refuse(not hf["num_experts"], f"olmoe: num_experts={hf['num_experts']!r}; an OLMoE model needs experts")
    fields = decoder_config(hf, model_type, arch, rope_from_hf(hf))
    return {**fields, "qk_norm": True, "qk_norm_span": "projection", "num_experts": hf["num_experts"],
            "experts_per_token": hf["num_experts_per_tok"], "normalize_router_weights": bool(hf["norm_topk_prob"]),
            "router_aux_loss_coef": hf["router_aux_loss_coef"]}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    decoder_to_hf(cfg, out)
    out.update(attention_bias=cfg.biases.qkv, clip_qkv=None, num_experts=cfg.experts.count,
               num_experts_per_tok=cfg.experts.per_token, norm_topk_prob=cfg.experts.normalize_weights,
               router_aux_loss_coef=cfg.experts.aux_loss_coef)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        a = f"{layer}.self_attn"
        # one scale over the whole projection [heads * head_dim], held per head [heads, head_dim]
        return [*attention_rules(cfg, S, a), *norm_rules(S, layer),
                bias_heads(S + ("attn", "q_norm", "scale"), f"{a}.q_norm.weight", cfg.num_heads, cfg.head_dim_),
                bias_heads(S + ("attn", "k_norm", "scale"), f"{a}.k_norm.weight", cfg.kv_heads, cfg.head_dim_),
                *expert_rules(cfg, S + ("mlp",), f"{layer}.mlp")]

    return decoder_rules(cfg, prefix, block)


ARCHITECTURE = architecture(STEMS, config_from_hf, config_to_hf, rules, defaults=DEFAULTS)
