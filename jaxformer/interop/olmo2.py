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
from jaxformer.interop.rules import (Architecture, Rule, activation, attention, bias_heads, copy, linear, lm_head,
                                     rope_from_hf, rope_to_hf)

CLASSES = {"olmo2": ("Olmo2Model", "Olmo2ForCausalLM")}
# Olmo2Config's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"olmo2": dict(num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                          rms_norm_eps=1e-5, attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False,
                          pad_token_id=1, bos_token_id=None, eos_token_id=50279)}
GATED_NAMES = {"swiglu": "silu", "geglu": "gelu_pytorch_tanh"}


def _head_dim(hf: dict, heads: int) -> int | None:
    """The file's head_dim (its attention and rotary read one when present) or None: hidden_size / heads."""
    head_dim = hf.get("head_dim")
    return None if head_dim in (None, hf["hidden_size"] // heads) else int(head_dim)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    heads = hf["num_attention_heads"]
    theta, scaling = rope_from_hf(hf)
    bias = bool(hf["attention_bias"])
    return dict(family="decoder", d_model=hf["hidden_size"], num_heads=heads,
                num_kv_heads=hf["num_key_value_heads"] or heads, head_dim=_head_dim(hf, heads),
                d_ff=hf["intermediate_size"], decoder_layers=hf["num_hidden_layers"], norm="rmsnorm",
                norm_position="output", norm_eps=hf["rms_norm_eps"], norm_bias=False,
                activation=activation(hf["hidden_act"], True, model_type), position="rope", rope_theta=theta,
                rope_scaling=scaling, max_positions=hf["max_position_embeddings"], attention="causal",
                qk_norm=True, qk_norm_span="projection", qkv_bias=bias, out_bias=bias, mlp_bias=False,
                tie_embeddings=hf["tie_word_embeddings"], head="none" if arch.endswith("Model") else "lm",
                attention_dropout_rate=float(hf["attention_dropout"]))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
               intermediate_size=cfg.d_ff, num_hidden_layers=cfg.decoder_layers, rms_norm_eps=cfg.norms.eps,
               hidden_act=GATED_NAMES.get(cfg.activation, cfg.activation), max_position_embeddings=cfg.max_positions,
               rope_parameters=rope_to_hf(cfg), attention_bias=cfg.biases.qkv, tie_word_embeddings=cfg.embeddings.tie,
               attention_dropout=cfg.attention_dropout_rate)
    if cfg.head_dim_ != cfg.d_model // cfg.num_heads:
        out["head_dim"] = cfg.head_dim_
    out.pop("rope_theta", None)
    out.pop("rope_scaling", None)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("decoder", "blocks")
    layer = f"{p}layers.{{i}}"
    a, m = f"{layer}.self_attn", f"{layer}.mlp"
    out = [copy(("embed", "table"), f"{p}embed_tokens.weight"),
           *attention(cfg, L + ("attn",), f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight",
                      f"{a}.o_proj.weight", f"{a}.q_proj.bias", f"{a}.k_proj.bias", f"{a}.v_proj.bias",
                      f"{a}.o_proj.bias"),
           # one scale over the whole projection [heads * head_dim], held per head [heads, head_dim]
           bias_heads(L + ("attn", "q_norm", "scale"), f"{a}.q_norm.weight", cfg.num_heads, cfg.head_dim_),
           bias_heads(L + ("attn", "k_norm", "scale"), f"{a}.k_norm.weight", cfg.kv_heads, cfg.head_dim_),
           copy(L + ("attn_post_norm", "scale"), f"{layer}.post_attention_layernorm.weight"),
           copy(L + ("mlp_post_norm", "scale"), f"{layer}.post_feedforward_layernorm.weight"),
           linear(L + ("mlp", "wi_gate"), f"{m}.gate_proj.weight"),
           linear(L + ("mlp", "wi"), f"{m}.up_proj.weight"),
           linear(L + ("mlp", "wo"), f"{m}.down_proj.weight"),
           copy(("decoder", "final_norm", "scale"), f"{p}norm.weight")]
    head, aliases = lm_head(cfg, f"{p}embed_tokens.weight")
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, {"olmo2": "model."}, ("Olmo2Model",), config_from_hf, config_to_hf, rules,
                            defaults=DEFAULTS)
