"""EleutherAI's rotary GPTs: GPT-NeoX / Pythia (``gpt_neox``) and GPT-J (``gptj``); config and tensor rules,
both directions.

Both rotate only part of each query and key head (``rotary_dim``: NeoX's rotary_pct of the head, GPT-J's
rotary_dim) and add attention and MLP to the residual side by side (``parallel_residual``), GPT-J through
one shared norm (``parallel_shared_norm``) and with its rotary pairs adjacent (``rope_interleave``).
NeoX keeps q, k and v in one tensor, head by head ([N, 3, H] rows), split on load and joined on save.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, attention, copy, heads_out,
                                     linear, norm, rope_spec, rope_to_hf, rotary_width)

CLASSES = {"gpt_neox": ("GPTNeoXModel", "GPTNeoXForCausalLM"), "gptj": ("GPTJModel", "GPTJForCausalLM")}
# The config classes' defaults, for files that leave them out
DEFAULTS = {
    "gpt_neox": dict(hidden_act="gelu", max_position_embeddings=2048, layer_norm_eps=1e-5, use_parallel_residual=True,
                     attention_bias=True, tie_word_embeddings=False, attention_dropout=0.0, hidden_dropout=0.0,
                     bos_token_id=0, eos_token_id=2),
    "gptj": dict(n_positions=2048, rotary_dim=64, n_inner=None, activation_function="gelu_new", resid_pdrop=0.0,
                 attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=False, bos_token_id=50256,
                 eos_token_id=50256),
}


def _neox_rotary(hf: dict, head_dim: int) -> tuple[float, Any, int | None]:
    """(theta, scaling, rotary_dim) as GPTNeoXConfig reads them: the rope dict (rope_scaling replacing
    rope_parameters), its base and partial_rotary_factor else the older rotary_emb_base and rotary_pct
    (default 0.25)."""
    params = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    base, legacy_theta, legacy_pct = hf.get("rotary_emb_base"), hf.get("rope_theta"), hf.get("rotary_pct")
    params.setdefault("rope_theta", base if base is not None else legacy_theta if legacy_theta is not None else 1e4)
    fraction = float(params.pop("partial_rotary_factor", legacy_pct if legacy_pct is not None else 0.25))
    theta, scaling = rope_spec(params, hf["max_position_embeddings"])
    return theta, scaling, rotary_width(head_dim, fraction, "gpt_neox")


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    head = "none" if arch.endswith("Model") else "lm"
    if model_type == "gptj":
        d_model, heads = hf["n_embd"], hf["n_head"]
        rotary = hf["rotary_dim"]
        return dict(family="decoder", d_model=d_model, num_heads=heads, d_ff=hf["n_inner"] or 4 * d_model,
                    decoder_layers=hf["n_layer"], norm_eps=hf["layer_norm_epsilon"],
                    activation=activation(hf["activation_function"], False, model_type), position="rope",
                    rope_theta=10000.0, rotary_dim=None if rotary in (None, d_model // heads) else rotary,
                    rope_interleave=True, max_positions=hf["n_positions"], attention="causal",
                    parallel_residual=True, parallel_shared_norm=True, qkv_bias=False, out_bias=False,
                    mlp_bias=True, lm_head_bias=head == "lm", tie_embeddings=hf["tie_word_embeddings"], head=head,
                    dropout_rate=float(hf["resid_pdrop"]), attention_dropout_rate=float(hf["attn_pdrop"]))
    d_model, heads = hf["hidden_size"], hf["num_attention_heads"]
    theta, scaling, rotary = _neox_rotary(hf, d_model // heads)
    bias = bool(hf["attention_bias"])
    return dict(family="decoder", d_model=d_model, num_heads=heads, d_ff=hf["intermediate_size"],
                decoder_layers=hf["num_hidden_layers"], norm_eps=hf["layer_norm_eps"],
                activation=activation(hf["hidden_act"], False, model_type), position="rope", rope_theta=theta,
                rope_scaling=scaling, rotary_dim=rotary, max_positions=hf["max_position_embeddings"],
                attention="causal", parallel_residual=bool(hf["use_parallel_residual"]), qkv_bias=bias,
                out_bias=bias, mlp_bias=True, tie_embeddings=hf["tie_word_embeddings"], head=head,
                dropout_rate=float(hf["hidden_dropout"]), attention_dropout_rate=float(hf["attention_dropout"]))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    if model_type == "gptj":
        out.update(n_embd=cfg.d_model, n_head=cfg.num_heads, n_layer=cfg.decoder_layers, n_inner=cfg.d_ff,
                   n_positions=cfg.max_positions, rotary_dim=cfg.rope_dim, layer_norm_epsilon=cfg.norms.eps,
                   activation_function=INVERSE_ACTIVATIONS[cfg.activation], tie_word_embeddings=cfg.embeddings.tie,
                   resid_pdrop=cfg.dropout_rate, embd_pdrop=cfg.dropout_rate, attn_pdrop=cfg.attention_dropout_rate)
        return
    rope = rope_to_hf(cfg)
    rope["partial_rotary_factor"] = cfg.rope_dim / cfg.head_dim_
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_hidden_layers=cfg.decoder_layers,
               intermediate_size=cfg.d_ff, hidden_act=INVERSE_ACTIVATIONS[cfg.activation],
               max_position_embeddings=cfg.max_positions, layer_norm_eps=cfg.norms.eps, rope_parameters=rope,
               use_parallel_residual=cfg.parallel is not None, attention_bias=cfg.biases.qkv,
               tie_word_embeddings=cfg.embeddings.tie, hidden_dropout=cfg.dropout_rate,
               attention_dropout=cfg.attention_dropout_rate)
    for legacy in ("rope_scaling", "rope_theta", "rotary_pct", "rotary_emb_base"):
        out.pop(legacy, None)


def _fused_heads(N: int, H: int, D: int):
    """NeoX's query_key_value [N * 3 * H, D], head by head (q, k, v within each) <-> q, k, v [D, N, H];
    its bias [N * 3 * H] <-> three [N, H]."""
    def load(t):
        w = t[0].reshape(N, 3, H, D)
        return [np.transpose(w[:, j], (2, 0, 1)) for j in range(3)]

    def save(ps):
        return [np.stack([np.transpose(p, (1, 2, 0)) for p in ps], axis=1).reshape(N * 3 * H, D)]

    def load_bias(t):
        b = t[0].reshape(N, 3, H)
        return [b[:, j] for j in range(3)]

    def save_bias(ps):
        return [np.stack(ps, axis=1).reshape(-1)]

    return load, save, load_bias, save_bias


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("decoder", "blocks")
    N, H, D = cfg.num_heads, cfg.head_dim_, cfg.d_model
    if model_type == "gptj":
        layer = f"{p}h.{{i}}"
        a = f"{layer}.attn"
        out = [copy(("embed", "table"), f"{p}wte.weight"),
               *attention(cfg, L + ("attn",), f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight",
                          f"{a}.out_proj.weight"),
               *norm(L + ("attn_norm",), f"{layer}.ln_1", True),
               linear(L + ("mlp", "wi"), f"{layer}.mlp.fc_in.weight"), copy(L + ("mlp", "bi"), f"{layer}.mlp.fc_in.bias"),
               linear(L + ("mlp", "wo"), f"{layer}.mlp.fc_out.weight"),
               copy(L + ("mlp", "bo"), f"{layer}.mlp.fc_out.bias"),
               *norm(("decoder", "final_norm"), f"{p}ln_f", True)]
        if cfg.head == "lm":
            out += [linear(("lm_head", "kernel"), "lm_head.weight"), copy(("logits_bias",), "lm_head.bias")]
        return out, {}
    layer = f"{p}layers.{{i}}"
    a = f"{layer}.attention"
    load, save, load_bias, save_bias = _fused_heads(N, H, D)
    out = [copy(("embed", "table"), f"{p}embed_in.weight"),
           Rule(tuple(L + ("attn", n) for n in "qkv"), (f"{a}.query_key_value.weight",), load, save),
           heads_out(L + ("attn", "o"), f"{a}.dense.weight", N, H),
           *norm(L + ("attn_norm",), f"{layer}.input_layernorm", True),
           *norm(L + ("mlp_norm",), f"{layer}.post_attention_layernorm", True),
           linear(L + ("mlp", "wi"), f"{layer}.mlp.dense_h_to_4h.weight"),
           copy(L + ("mlp", "bi"), f"{layer}.mlp.dense_h_to_4h.bias"),
           linear(L + ("mlp", "wo"), f"{layer}.mlp.dense_4h_to_h.weight"),
           copy(L + ("mlp", "bo"), f"{layer}.mlp.dense_4h_to_h.bias"),
           *norm(("decoder", "final_norm"), f"{p}final_layer_norm", True)]
    if cfg.biases.qkv:
        out += [Rule(tuple(L + ("attn", f"{n}_bias") for n in "qkv"), (f"{a}.query_key_value.bias",), load_bias,
                     save_bias), copy(L + ("attn", "o_bias"), f"{a}.dense.bias")]
    aliases = {}
    if cfg.head == "lm":
        if cfg.embeddings.tie:
            aliases["embed_out.weight"] = f"{p}embed_in.weight"
        else:
            out.append(linear(("lm_head", "kernel"), "embed_out.weight"))
    return out, aliases


ARCHITECTURE = Architecture(CLASSES, {"gpt_neox": "gpt_neox.", "gptj": "transformer."},
                            ("GPTNeoXModel", "GPTJModel"), config_from_hf, config_to_hf, rules, harmless={
                                "embd_pdrop": "training-time dropout on the embeddings, not modelled",
                                "is_decoder": "bookkeeping (GPT-NeoX is a decoder whatever it says)",
                                **dict.fromkeys(("rotary", "scale_attn_weights", "summary_type", "summary_use_proj",
                                                 "summary_activation", "summary_proj_to_labels"),
                                                "older GPT-J files' settings, which transformers' GPT-J never reads")},
                            defaults=DEFAULTS)
