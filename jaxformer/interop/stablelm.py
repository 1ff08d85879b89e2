"""Stability AI's StableLM (``stablelm``: StableLM-3B-4E1T, StableLM 2 1.6B and 12B, their Zephyr and code
models): config and tensor rules, both directions.

LLaMA's SwiGLU MLP (no biases) and grouped-query attention under LayerNorms with biases (``layer_norm_eps``),
rotary positions on part of each head (``partial_rotary_factor``, top level in published files and inside
``rope_parameters`` in transformers 5's, default 0.25: ``rotary_dim``), biases on q, k and v alone
(``use_qkv_bias``; o has none) and an untied head by default. Two options of StableLM 2 12B:
``qk_layernorm`` norms each query and key head with its own LayerNorm before the rotation, a scale per head
and no bias (``qk_norm_span='each_head'``), and ``use_parallel_residual`` adds attention and MLP to the
residual side by side through the one input norm (``parallel_residual``, ``parallel_shared_norm``).
``hidden_dropout`` is the MLP output's training-time dropout (jaxformer's ``dropout_rate``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.llama import architecture, attention_rules, decoder_rules, gated_mlp_rules, head_dim
from jaxformer.interop.rules import Rule, activation, norm, partial_rope_from_hf, refuse, rope_to_hf, rotary_width

STEMS = {"stablelm": "StableLm"}
# StableLmConfig's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"stablelm": dict(num_key_value_heads=32, hidden_act="silu", max_position_embeddings=4096,
                             layer_norm_eps=1e-5, tie_word_embeddings=False, use_qkv_bias=False, qk_layernorm=False,
                             use_parallel_residual=False, hidden_dropout=0.0, attention_dropout=0.0,
                             bos_token_id=0, eos_token_id=0, pad_token_id=None)}
DEFAULT_PARTIAL_ROTARY = 0.25


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    heads = hf["num_attention_heads"]
    refuse(head_dim(hf, heads) is not None, f"stablelm: head_dim={hf.get('head_dim')} is not supported: StableLM's "
           f"heads are hidden_size / num_attention_heads = {hf['hidden_size'] // heads} wide")
    theta, scaling, fraction = partial_rope_from_hf(hf, DEFAULT_PARTIAL_ROTARY)
    rotary = rotary_width(hf["hidden_size"] // heads, fraction, model_type)
    parallel, qkv_bias = bool(hf["use_parallel_residual"]), bool(hf["use_qkv_bias"])
    return dict(family="decoder", d_model=hf["hidden_size"], num_heads=heads,
                num_kv_heads=hf["num_key_value_heads"] or heads, d_ff=hf["intermediate_size"],
                decoder_layers=hf["num_hidden_layers"], norm="layernorm", norm_eps=hf["layer_norm_eps"],
                norm_bias=True, activation=activation(hf["hidden_act"], True, model_type), position="rope",
                rope_theta=theta, rope_scaling=scaling, rotary_dim=rotary,
                max_positions=hf["max_position_embeddings"], attention="causal", qkv_bias=qkv_bias, out_bias=False,
                mlp_bias=False, **(dict(qk_norm=True, qk_norm_span="each_head") if hf["qk_layernorm"] else {}),
                parallel_residual=parallel, parallel_shared_norm=parallel, tie_embeddings=hf["tie_word_embeddings"],
                head="none" if arch.endswith("Model") else "lm", dropout_rate=float(hf["hidden_dropout"]),
                attention_dropout_rate=float(hf["attention_dropout"]))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    rope = rope_to_hf(cfg)
    rope["partial_rotary_factor"] = cfg.rope_dim / cfg.head_dim_
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
               intermediate_size=cfg.d_ff, num_hidden_layers=cfg.decoder_layers, layer_norm_eps=cfg.norms.eps,
               hidden_act="silu" if cfg.activation == "swiglu" else "gelu_pytorch_tanh",
               max_position_embeddings=cfg.max_positions, rope_parameters=rope, use_qkv_bias=cfg.biases.qkv,
               qk_layernorm=cfg.query_key_norm is not None, use_parallel_residual=cfg.parallel is not None,
               tie_word_embeddings=cfg.embeddings.tie, hidden_dropout=cfg.dropout_rate,
               attention_dropout=cfg.attention_dropout_rate)
    for legacy in ("rope_scaling", "rope_theta", "partial_rotary_factor"):
        out.pop(legacy, None)


def _each_head(path: tuple[str, ...], module: str, heads: int) -> Rule:
    """One LayerNorm weight [H] per head (``{module}.norms.{h}.weight``) <-> the norm's scale [N, H]."""
    names = tuple(f"{module}.norms.{h}.weight" for h in range(heads))
    return Rule((path,), names, lambda t: [np.stack(t)], lambda p: list(p[0]))


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        a = f"{layer}.self_attn"
        out = [*attention_rules(cfg, S, a), *norm(S + ("attn_norm",), f"{layer}.input_layernorm", True),
               *gated_mlp_rules(cfg, S, f"{layer}.mlp")]
        if cfg.parallel is None:
            out += norm(S + ("mlp_norm",), f"{layer}.post_attention_layernorm", True)
        if cfg.query_key_norm is not None:
            out += [_each_head(S + ("attn", "q_norm", "scale"), f"{a}.q_layernorm", cfg.num_heads),
                    _each_head(S + ("attn", "k_norm", "scale"), f"{a}.k_layernorm", cfg.kv_heads)]
        return out

    out, aliases = decoder_rules(cfg, prefix, block)
    # LayerNorms: the final norm has a bias too (decoder_rules wrote its scale, as for LLaMA's RMSNorm)
    return out + norm(("decoder", "final_norm"), f"{prefix}norm", True)[1:], aliases


ARCHITECTURE = architecture(STEMS, config_from_hf, config_to_hf, rules, defaults=DEFAULTS)
