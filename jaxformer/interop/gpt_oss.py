"""gpt-oss (``gpt_oss``): OpenAI's open-weight mixture of experts; config and tensor rules, both directions.

A LLaMA-shaped pre-norm RMSNorm block with three ideas of its own, each a ModelConfig field: attention
sinks (a learned logit per head that joins the softmax, ``attention_sinks``), experts with biases on every
projection and on the router (``expert_bias``, ``router_logit_bias``) and the clamped SwiGLU
(``swiglu_limit``, ``swiglu_alpha``). Layers alternate between a 128-token window and full attention
(``layer_types``); positions are yarn-extended rotary ones (``truncate`` false). Routing takes the top k
logits and a softmax over them, which is the top k of a softmax renormalised (Mixtral's routing).

Experts are stored fused: ``gate_up_proj`` [E, D, 2F] with the gate and up columns interleaved (gate at
even columns), ``down_proj`` [E, F, D], as ``x @ W``. The published weights hold them in MXFP4
(``*_blocks`` and ``*_scales``, ``quantization_config.quant_method`` 'mxfp4'); those load decoded
(``interop/mxfp4.py``), exactly as transformers' dequantizing loader decodes them, and save back as the
float tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.layer_plan import local_layers
from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (Architecture, Rule, activation, attention, copy, linear, lm_head, refuse,
                                     rope_from_hf, rope_to_hf)

CLASSES = {"gpt_oss": ("GptOssModel", "GptOssForCausalLM")}
# GptOssConfig's defaults for the keys a file may leave out; without any rope dict its class builds this yarn
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
DEFAULTS = {"gpt_oss": dict(num_hidden_layers=36, num_local_experts=128, vocab_size=201088, hidden_size=2880,
                            intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8,
                            sliding_window=128, tie_word_embeddings=False, hidden_act="silu",
                            max_position_embeddings=131072, rms_norm_eps=1e-5, attention_dropout=0.0,
                            num_experts_per_tok=4, swiglu_alpha=1.702, swiglu_limit=7.0, router_aux_loss_coef=0.001,
                            layer_types=None, attention_bias=True, bos_token_id=None, eos_token_id=None,
                            pad_token_id=None)}
DEFAULT_THETA = 150000.0
KINDS = {"sliding_attention": "sliding", "full_attention": "full"}


def _rope(hf: dict) -> tuple[float, Any]:
    if hf.get("rope_scaling") is None and hf.get("rope_parameters") is None:
        return rope_from_hf({**hf, "rope_parameters": DEFAULT_ROPE}, DEFAULT_THETA)
    return rope_from_hf(hf, DEFAULT_THETA)


def layer_kinds(hf: dict) -> list[str]:
    """'sliding' or 'full' per layer: ``layer_types``, or the class's default (even layers sliding)."""
    types = hf["layer_types"] or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                  for i in range(hf["num_hidden_layers"])]
    refuse(any(t not in KINDS for t in types), f"gpt_oss: layer_types {sorted(set(types) - set(KINDS))} are not "
           f"supported; expected {sorted(KINDS)}")
    return [KINDS[t] for t in types]


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    quantization = hf.get("quantization_config")
    if quantization is not None:  # decoded on load by interop/mxfp4.py; nothing else is read
        method = quantization.get("quant_method")
        refuse(method != "mxfp4", f"gpt_oss: quantization_config.quant_method={method!r} is not supported; "
               "supported: 'mxfp4' (decoded on load)")
    kinds = layer_kinds(hf)
    pattern = "causal" if set(kinds) == {"full"} else "sliding" if set(kinds) == {"sliding"} else "alternating"
    window = hf["sliding_window"]
    refuse(pattern != "causal" and window is None, "gpt_oss: sliding layers need a sliding_window")
    theta, scaling = _rope(hf)
    heads = hf["num_attention_heads"]
    bias = bool(hf["attention_bias"])
    return dict(family="decoder", d_model=hf["hidden_size"], num_heads=heads,
                num_kv_heads=hf["num_key_value_heads"] or heads, head_dim=hf["head_dim"],
                d_ff=hf["intermediate_size"], decoder_layers=hf["num_hidden_layers"], norm="rmsnorm",
                norm_eps=hf["rms_norm_eps"], norm_bias=False, activation=activation(hf["hidden_act"], True, model_type),
                swiglu_limit=float(hf["swiglu_limit"]), swiglu_alpha=float(hf["swiglu_alpha"]), position="rope",
                rope_theta=theta, rope_scaling=scaling, max_positions=hf["max_position_embeddings"], attention=pattern,
                window_size=int(window) if pattern != "causal" else None,
                layer_types=tuple(kinds) if pattern == "alternating" else None, qkv_bias=bias, out_bias=bias,
                mlp_bias=False, attention_sinks=True, tie_embeddings=hf["tie_word_embeddings"],
                head="none" if arch.endswith("Model") else "lm", attention_dropout_rate=float(hf["attention_dropout"]),
                num_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
                normalize_router_weights=True, router_logit_bias=True, expert_bias=True,
                router_aux_loss_coef=hf["router_aux_loss_coef"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    kinds = ["sliding_attention" if cfg.attention == "sliding" or (cfg.attention == "alternating" and sliding)
             else "full_attention" for sliding in local_layers(cfg)[:cfg.decoder_layers]]
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
               head_dim=cfg.head_dim_, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.decoder_layers,
               rms_norm_eps=cfg.norms.eps, hidden_act="silu", max_position_embeddings=cfg.max_positions,
               rope_parameters=rope_to_hf(cfg), tie_word_embeddings=cfg.embeddings.tie,
               attention_dropout=cfg.attention_dropout_rate, attention_bias=cfg.biases.qkv, layer_types=kinds,
               sliding_window=cfg.window_size, num_local_experts=cfg.experts.count,
               num_experts_per_tok=cfg.experts.per_token, router_aux_loss_coef=cfg.experts.aux_loss_coef,
               swiglu_limit=cfg.swiglu_clamp.limit, swiglu_alpha=cfg.swiglu_clamp.alpha)
    for key in ("rope_theta", "rope_scaling", "quantization_config"):  # written as float tensors, never MXFP4
        out.pop(key, None)


def _interleaved(gate_path, up_path, name) -> Rule:
    """gpt-oss's fused gate/up tensor [E, ..., 2F] (gate at even, up at odd columns) <-> two [E, ..., F]."""
    def save(ps):
        gate, up = ps
        fused = np.empty(gate.shape[:-1] + (2 * gate.shape[-1],), gate.dtype)
        fused[..., 0::2], fused[..., 1::2] = gate, up
        return [fused]

    return Rule((gate_path, up_path), (name,), lambda t: [t[0][..., 0::2], t[0][..., 1::2]], save)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("decoder", "blocks")
    layer = f"{p}layers.{{i}}"
    a, m = f"{layer}.self_attn", f"{layer}.mlp"
    mlp = L + ("mlp",)
    out = [copy(("embed", "table"), f"{p}embed_tokens.weight"),
           copy(("decoder", "final_norm", "scale"), f"{p}norm.weight"),
           *attention(cfg, L + ("attn",), f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight",
                      f"{a}.o_proj.weight", f"{a}.q_proj.bias", f"{a}.k_proj.bias", f"{a}.v_proj.bias",
                      f"{a}.o_proj.bias"),
           copy(L + ("attn", "sinks"), f"{a}.sinks"),
           copy(L + ("attn_norm", "scale"), f"{layer}.input_layernorm.weight"),
           copy(L + ("mlp_norm", "scale"), f"{layer}.post_attention_layernorm.weight"),
           linear(mlp + ("router",), f"{m}.router.weight"),
           copy(mlp + ("router_logit_bias",), f"{m}.router.bias"),
           _interleaved(mlp + ("wi_gate",), mlp + ("wi",), f"{m}.experts.gate_up_proj"),
           _interleaved(mlp + ("bi_gate",), mlp + ("bi",), f"{m}.experts.gate_up_proj_bias"),
           copy(mlp + ("wo",), f"{m}.experts.down_proj"),
           copy(mlp + ("bo",), f"{m}.experts.down_proj_bias")]
    head, aliases = lm_head(cfg, f"{p}embed_tokens.weight")
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, {"gpt_oss": "model."}, ("GptOssModel",), config_from_hf, config_to_hf,
                            rules, defaults=DEFAULTS, harmless={
                                "experts_per_token": "the original release's name of num_experts_per_tok, which "
                                                     "transformers reads instead",
                                "initial_context_length": "the original release's name of the pretraining length, "
                                                          "which transformers reads from the rope dict"})
