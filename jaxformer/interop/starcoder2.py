"""StarCoder2 (``starcoder2``): BigCode's code models; config and tensor rules, both directions.

A pre-norm block of LayerNorms (with biases, ``norm_epsilon``), grouped-query attention with rotary positions
over the whole head, a plain two-matrix GELU MLP (``c_fc``, ``c_proj``; the tanh form) and one ``use_bias``
for every projection. Every layer sees a window of ``sliding_window`` keys (null: causal). Its dropouts are
training-time: ``residual_dropout`` on each branch is jaxformer's ``dropout_rate``; ``embedding_dropout``
falls on the embeddings alone, which jaxformer's one rate also covers.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.llama import head_dim
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, attention, copy, linear,
                                     lm_head, norm, rope_from_hf, rope_to_hf)

CLASSES = {"starcoder2": ("Starcoder2Model", "Starcoder2ForCausalLM")}
# Starcoder2Config's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"starcoder2": dict(num_key_value_heads=2, hidden_act="gelu_pytorch_tanh", max_position_embeddings=4096,
                               norm_epsilon=1e-5, sliding_window=None, attention_dropout=0.0, residual_dropout=0.0,
                               embedding_dropout=0.0, use_bias=True, tie_word_embeddings=True, bos_token_id=50256,
                               eos_token_id=50256, pad_token_id=None, initializer_range=0.018042)}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    heads = hf["num_attention_heads"]
    theta, scaling = rope_from_hf(hf)
    window, bias = hf["sliding_window"], bool(hf["use_bias"])
    return dict(family="decoder", d_model=hf["hidden_size"], num_heads=heads,
                num_kv_heads=hf["num_key_value_heads"] or heads, head_dim=head_dim(hf, heads),
                d_ff=hf["intermediate_size"], decoder_layers=hf["num_hidden_layers"], norm="layernorm",
                norm_eps=hf["norm_epsilon"], norm_bias=True, activation=activation(hf["hidden_act"], False, model_type),
                position="rope", rope_theta=theta, rope_scaling=scaling, max_positions=hf["max_position_embeddings"],
                attention="causal" if window is None else "sliding",
                window_size=None if window is None else int(window), qkv_bias=bias, out_bias=bias, mlp_bias=bias,
                tie_embeddings=hf["tie_word_embeddings"], head="none" if arch.endswith("Model") else "lm",
                dropout_rate=float(hf["residual_dropout"]), attention_dropout_rate=float(hf["attention_dropout"]))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    # one use_bias for all: a model whose biases differ reads back otherwise, so it is not written as StarCoder2
    act = "gelu_pytorch_tanh" if cfg.activation == "gelu_tanh" else INVERSE_ACTIVATIONS[cfg.activation]
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
               intermediate_size=cfg.d_ff, num_hidden_layers=cfg.decoder_layers, norm_epsilon=cfg.norms.eps,
               hidden_act=act, max_position_embeddings=cfg.max_positions, rope_parameters=rope_to_hf(cfg),
               sliding_window=cfg.window_size, use_bias=cfg.biases.qkv, tie_word_embeddings=cfg.embeddings.tie,
               attention_dropout=cfg.attention_dropout_rate, residual_dropout=cfg.dropout_rate,
               embedding_dropout=cfg.dropout_rate)
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
           *norm(L + ("attn_norm",), f"{layer}.input_layernorm", True),
           *norm(L + ("mlp_norm",), f"{layer}.post_attention_layernorm", True),
           linear(L + ("mlp", "wi"), f"{m}.c_fc.weight"),
           linear(L + ("mlp", "wo"), f"{m}.c_proj.weight"),
           *norm(("decoder", "final_norm"), f"{p}norm", True)]
    if cfg.biases.mlp:
        out += [copy(L + ("mlp", "bi"), f"{m}.c_fc.bias"), copy(L + ("mlp", "bo"), f"{m}.c_proj.bias")]
    head, aliases = lm_head(cfg, f"{p}embed_tokens.weight")
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, {"starcoder2": "model."}, ("Starcoder2Model",), config_from_hf, config_to_hf,
                            rules, defaults=DEFAULTS, harmless={
                                "embedding_dropout": "training-time dropout on the embeddings, which jaxformer's "
                                                     "dropout_rate (the file's residual_dropout) covers too",
                                "rms_norm_eps": "in StarCoder2-15B's file beside norm_epsilon; its norms are "
                                                "LayerNorms of norm_epsilon (transformers reads rms_norm_eps only "
                                                "in multi-token-prediction layers, which StarCoder2 has none of)"})
