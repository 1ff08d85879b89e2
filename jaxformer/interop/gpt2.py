"""GPT-2 (``gpt2``) and GPT-1 (``openai-gpt``): config and tensor rules, both directions. Their Conv1D
weights are stored input-major ([in, out]), and q, k, v share one fused ``c_attn`` tensor. GPT-1 is the
post-norm original: each sublayer's sum normed after it, no final norm, and its "gelu" is the tanh form."""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, copy, lm_head, norm, refuse)

CLASSES = {"gpt2": ("GPT2Model", "GPT2LMHeadModel"), "openai-gpt": ("OpenAIGPTModel", "OpenAIGPTLMHeadModel")}
# The config classes' defaults, for files that leave them out
DEFAULTS = {"gpt2": dict(n_positions=1024, bos_token_id=50256, eos_token_id=50256),
            "openai-gpt": dict(n_positions=512, afn="gelu", layer_norm_epsilon=1e-5, resid_pdrop=0.1, attn_pdrop=0.1,
                               tie_word_embeddings=True)}
# transformers' OpenAI GPT has its own table: its "gelu" is the tanh approximation
GPT1_ACTIVATIONS = {"gelu": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    if model_type == "openai-gpt":
        refuse(hf["afn"] not in GPT1_ACTIVATIONS, f"openai-gpt: afn={hf['afn']!r} is not supported; supported: "
               f"{sorted(GPT1_ACTIVATIONS)}")
        return dict(family="decoder", d_model=hf["n_embd"], num_heads=hf["n_head"], d_ff=4 * hf["n_embd"],
                    decoder_layers=hf["n_layer"], norm_eps=hf["layer_norm_epsilon"], norm_position="post",
                    final_norm=False, activation=GPT1_ACTIVATIONS[hf["afn"]], position="learned",
                    max_positions=hf["n_positions"], attention="causal",
                    head="none" if arch == "OpenAIGPTModel" else "lm", tie_embeddings=hf["tie_word_embeddings"],
                    dropout_rate=float(hf["resid_pdrop"]), attention_dropout_rate=float(hf["attn_pdrop"]))
    refuse(hf.get("add_cross_attention", False), "gpt2: add_cross_attention=True is not supported")
    return dict(family="decoder", d_model=hf["n_embd"], num_heads=hf["n_head"],
                d_ff=hf.get("n_inner") or 4 * hf["n_embd"], decoder_layers=hf["n_layer"],
                norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                activation=activation(hf.get("activation_function", "gelu_new"), False, model_type),
                position="learned", max_positions=hf["n_positions"], attention="causal",
                attention_scale=None if hf.get("scale_attn_weights", True) else 1.0,
                inverse_layer_scale=bool(hf.get("scale_attn_by_inverse_layer_idx", False)),
                head="none" if arch == "GPT2Model" else "lm", tie_embeddings=hf.get("tie_word_embeddings", True),
                dropout_rate=hf.get("resid_pdrop", 0.1), attention_dropout_rate=hf.get("attn_pdrop", 0.1))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    if model_type == "openai-gpt":
        out.update(n_embd=cfg.d_model, n_head=cfg.num_heads, n_layer=cfg.decoder_layers,
                   n_positions=cfg.max_positions, layer_norm_epsilon=cfg.norms.eps,
                   afn={"gelu_tanh": "gelu", "relu": "relu", "silu": "silu"}[cfg.activation],
                   tie_word_embeddings=cfg.embeddings.tie, resid_pdrop=cfg.dropout_rate, embd_pdrop=cfg.dropout_rate,
                   attn_pdrop=cfg.attention_dropout_rate)
        return
    out.update(n_embd=cfg.d_model, n_head=cfg.num_heads, n_inner=cfg.d_ff, n_layer=cfg.decoder_layers,
               n_positions=cfg.max_positions, layer_norm_epsilon=cfg.norms.eps,
               activation_function=INVERSE_ACTIVATIONS[cfg.activation], scale_attn_weights=cfg.scores.scale is None,
               tie_word_embeddings=cfg.embeddings.tie, resid_pdrop=cfg.dropout_rate, embd_pdrop=cfg.dropout_rate,
               attn_pdrop=cfg.attention_dropout_rate, scale_attn_by_inverse_layer_idx=cfg.scores.inverse_layer_scale)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("decoder", "blocks")
    N, H, D = cfg.num_heads, cfg.head_dim_, cfg.d_model
    layer = f"{p}h.{{i}}"
    gpt1 = model_type == "openai-gpt"
    tokens, positions = (f"{p}tokens_embed.weight", f"{p}positions_embed.weight") if gpt1 else (f"{p}wte.weight",
                                                                                              f"{p}wpe.weight")

    def split_qkv(t):  # Conv1D [D, 3D] (input-major) -> three [D, N, H]
        return [w.reshape(D, N, H) for w in np.split(t[0], 3, axis=1)]

    def join_qkv(ps):
        return [np.concatenate([w.reshape(D, N * H) for w in ps], axis=1)]

    out = [
        copy(("embed", "table"), tokens),
        copy(("embeddings", "positions", "table"), positions),
        Rule(tuple(L + ("attn", n) for n in "qkv"), (f"{layer}.attn.c_attn.weight",), split_qkv, join_qkv),
        Rule(tuple(L + ("attn", f"{n}_bias") for n in "qkv"), (f"{layer}.attn.c_attn.bias",),
             lambda t: [b.reshape(N, H) for b in np.split(t[0], 3)],
             lambda ps: [np.concatenate([b.reshape(-1) for b in ps])]),
        Rule((L + ("attn", "o"),), (f"{layer}.attn.c_proj.weight",), lambda t: [t[0].reshape(N, H, D)],
             lambda ps: [ps[0].reshape(N * H, D)]),
        copy(L + ("attn", "o_bias"), f"{layer}.attn.c_proj.bias"),
        *norm(L + ("attn_norm",), f"{layer}.ln_1", True),
        *norm(L + ("mlp_norm",), f"{layer}.ln_2", True),
        copy(L + ("mlp", "wi"), f"{layer}.mlp.c_fc.weight"),  # Conv1D is already [in, out]
        copy(L + ("mlp", "bi"), f"{layer}.mlp.c_fc.bias"),
        copy(L + ("mlp", "wo"), f"{layer}.mlp.c_proj.weight"),
        copy(L + ("mlp", "bo"), f"{layer}.mlp.c_proj.bias"),
        *([] if gpt1 else norm(("decoder", "final_norm"), f"{p}ln_f", True)),
    ]
    head, aliases = lm_head(cfg, tokens)
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, dict.fromkeys(CLASSES, "transformer."), ("GPT2Model", "OpenAIGPTModel"),
                            config_from_hf, config_to_hf, rules, harmless={
                                **dict.fromkeys(("summary_type", "summary_use_proj", "summary_activation",
                                                 "summary_proj_to_labels", "predict_special_tokens"),
                                                "the double-heads models' multiple-choice head only"),
                                "reorder_and_upcast_attn": "scores and softmax in float32, which jaxformer computes "
                                                           "whatever the dtype",
                                "n_ctx": "transformers' GPT-2 never reads it; n_positions sizes the table"},
                            defaults=DEFAULTS)
