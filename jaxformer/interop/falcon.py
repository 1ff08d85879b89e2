"""TII's Falcon (``falcon``: Falcon-7B, -40B, -180B and Falcon2-11B): config and tensor rules, both directions.

LayerNorm blocks with rotary positions on whole heads, a plain MLP (``activation``, exact GELU by default,
``ffn_hidden_size`` wide, 4x by default), one ``bias`` switch for every Linear of a layer, and a head tied to
the embeddings unless ``tie_word_embeddings`` says otherwise. The block comes in three forms:
- ``parallel_attn`` (the published files): attention and MLP side by side through one input norm
  (``parallel_residual``, ``parallel_shared_norm``); otherwise one after the other, each with its norm;
- ``new_decoder_architecture`` (40B, 180B, 11B): always side by side, through two norms (``ln_attn``,
  ``ln_mlp``) unless ``num_ln_in_parallel_attn`` is 1 (11B: one shared norm);
- the kv heads: one (``multi_query``, 7B), every head (``multi_query`` false), or ``num_kv_heads`` under the
  new architecture. q, k and v sit in one tensor, ``query_key_value``, grouped by kv head: each group's
  queries, then its key, then its value ([K, N / K + 2, H] rows). The three layouts transformers names are
  this one grouping: multi-query is one group ([N + 2, H]), plain multi-head one group per head ([N, 3, H]).
``alibi`` (Falcon-RW's linear position biases) is refused: jaxformer has no ALiBi.
``hidden_dropout`` and ``attention_dropout`` are training-time dropouts (``dropout_rate``,
``attention_dropout_rate``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, copy, heads_out, linear,
                                     lm_head, norm, refuse, rope_from_hf, rope_to_hf)

CLASSES = {"falcon": ("FalconModel", "FalconForCausalLM")}
# FalconConfig's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"falcon": dict(num_ln_in_parallel_attn=None, layer_norm_epsilon=1e-5, hidden_dropout=0.0,
                           attention_dropout=0.0, num_kv_heads=None, alibi=False, new_decoder_architecture=False,
                           multi_query=True, parallel_attn=True, bias=False, max_position_embeddings=2048,
                           bos_token_id=11, eos_token_id=11, pad_token_id=None, ffn_hidden_size=None,
                           activation="gelu", tie_word_embeddings=True)}
DEFAULT_THETA = 10000.0
# The config.json keys that choose the block's layout (kv heads, parallel or not, one norm or two)
LAYOUT_KEYS = ("new_decoder_architecture", "multi_query", "parallel_attn", "num_ln_in_parallel_attn", "num_kv_heads")


def layout(hf: dict, heads: int) -> tuple[int, bool, bool]:
    """(kv heads, attention and MLP side by side, through one shared norm) of a file as transformers' Falcon
    layers run it, refusing what they cannot run."""
    new, multi_query, parallel = (bool(hf[key]) for key in ("new_decoder_architecture", "multi_query", "parallel_attn"))
    norms, kv = hf["num_ln_in_parallel_attn"], hf["num_kv_heads"]
    kv = heads if kv is None else kv
    if new:
        # FalconDecoderLayer builds the norms parallel_attn names but runs the new architecture's: parallel always
        refuse(not parallel, "falcon: new_decoder_architecture=True with parallel_attn=False is not supported: "
               "transformers' Falcon layer builds the sequential norms and then runs the parallel block, and fails")
        norms = 2 if norms is None else norms
        refuse(norms not in (1, 2), f"falcon: num_ln_in_parallel_attn={norms} is not supported: the new decoder "
               "architecture runs one shared norm (1) or ln_attn and ln_mlp (2)")
        return kv, True, norms == 1
    if parallel:
        refuse(norms == 2, "falcon: num_ln_in_parallel_attn=2 needs new_decoder_architecture=True: without it "
               "transformers' Falcon layer builds ln_attn and ln_mlp and then runs input_layernorm, and fails")
    if multi_query:
        return 1, parallel, parallel
    refuse(kv != heads, f"falcon: num_kv_heads={kv} with multi_query=False and new_decoder_architecture=False is "
           f"not supported: that layout holds a key and a value for every one of the {heads} heads")
    return heads, parallel, parallel


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(bool(hf["alibi"]), "falcon: alibi=True (Falcon-RW's linear position biases in place of rotary "
           "positions) is not supported: jaxformer has no ALiBi")
    embed = hf.get("n_embed")  # FalconConfig's older name of hidden_size, which wins when given
    d_model, heads = hf["hidden_size"] if embed is None else embed, hf["num_attention_heads"]
    refuse(d_model % heads != 0, f"falcon: hidden_size={d_model} is not a multiple of num_attention_heads={heads}")
    kv, parallel, shared = layout(hf, heads)
    bias = bool(hf["bias"])
    theta, scaling = rope_from_hf(hf, DEFAULT_THETA)
    return dict(family="decoder", d_model=d_model, num_heads=heads, num_kv_heads=kv,
                d_ff=hf["ffn_hidden_size"] or 4 * d_model, decoder_layers=hf["num_hidden_layers"], norm="layernorm",
                norm_eps=hf["layer_norm_epsilon"], norm_bias=True,
                activation=activation(hf["activation"], False, model_type), position="rope", rope_theta=theta,
                rope_scaling=scaling, max_positions=hf["max_position_embeddings"], attention="causal",
                parallel_residual=parallel, parallel_shared_norm=shared, qkv_bias=bias, out_bias=bias,
                mlp_bias=bias, tie_embeddings=hf["tie_word_embeddings"],
                head="none" if arch.endswith("Model") else "lm", dropout_rate=float(hf["hidden_dropout"]),
                attention_dropout_rate=float(hf["attention_dropout"]))


def _layout_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The layout keys of ``cfg`` as the published files say them: one kv head in the old architecture (7B),
    two norms or a few kv heads in the new one (40B, 11B), every head in the old one with multi_query off."""
    kv, heads = cfg.kv_heads, cfg.num_heads
    out = dict(new_decoder_architecture=False, multi_query=kv == 1, parallel_attn=cfg.parallel is not None,
               num_ln_in_parallel_attn=None, num_kv_heads=kv)
    if cfg.parallel is not None and (not cfg.parallel.shared_norm or kv not in (1, heads)):
        out.update(new_decoder_architecture=True, multi_query=True,
                   num_ln_in_parallel_attn=1 if cfg.parallel.shared_norm else 2)
    return out


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    wanted = (cfg.kv_heads, cfg.parallel is not None, cfg.parallel is not None and cfg.parallel.shared_norm)
    said = {**DEFAULTS[model_type], **{k: out[k] for k in LAYOUT_KEYS if k in out}}
    try:  # the layout the file a model was loaded from says, where it is this model's, every key written
        kept = any(k in out for k in LAYOUT_KEYS) and layout(said, cfg.num_heads) == wanted
    except ValueError:
        kept = False
    out.update({k: said[k] for k in LAYOUT_KEYS} if kept else _layout_to_hf(cfg))
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_hidden_layers=cfg.decoder_layers,
               ffn_hidden_size=cfg.d_ff, activation=INVERSE_ACTIVATIONS[cfg.activation],
               layer_norm_epsilon=cfg.norms.eps, max_position_embeddings=cfg.max_positions,
               rope_parameters=rope_to_hf(cfg), bias=cfg.biases.qkv, alibi=False, num_key_value_heads=cfg.kv_heads,
               tie_word_embeddings=cfg.embeddings.tie, hidden_dropout=cfg.dropout_rate,
               attention_dropout=cfg.attention_dropout_rate)
    for legacy in ("rope_scaling", "rope_theta", "n_embed"):
        out.pop(legacy, None)


def _grouped(N: int, K: int, H: int, D: int):
    """query_key_value [K * (N / K + 2) * H, D], grouped by kv head (its queries, its key, its value) <-> q
    [D, N, H], k and v [D, K, H]; its bias [K * (N / K + 2) * H] <-> [N, H], [K, H], [K, H]."""
    g = N // K

    def load(t):
        w = t[0].reshape(K, g + 2, H, D)
        return [np.transpose(w[:, :g].reshape(N, H, D), (2, 0, 1)), np.transpose(w[:, g], (2, 0, 1)),
                np.transpose(w[:, g + 1], (2, 0, 1))]

    def save(ps):
        q, k, v = (np.transpose(p, (1, 2, 0)) for p in ps)
        return [np.concatenate([q.reshape(K, g, H, D), k[:, None], v[:, None]], axis=1).reshape(-1, D)]

    def load_bias(t):
        b = t[0].reshape(K, g + 2, H)
        return [b[:, :g].reshape(N, H), b[:, g], b[:, g + 1]]

    def save_bias(ps):
        q, k, v = ps
        return [np.concatenate([q.reshape(K, g, H), k[:, None], v[:, None]], axis=1).reshape(-1)]

    return load, save, load_bias, save_bias


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("decoder", "blocks")
    layer = f"{p}h.{{i}}"
    a, m = f"{layer}.self_attention", f"{layer}.mlp"
    load, save, load_bias, save_bias = _grouped(cfg.num_heads, cfg.kv_heads, cfg.head_dim_, cfg.d_model)
    out = [copy(("embed", "table"), f"{p}word_embeddings.weight"),
           Rule(tuple(L + ("attn", n) for n in "qkv"), (f"{a}.query_key_value.weight",), load, save),
           heads_out(L + ("attn", "o"), f"{a}.dense.weight", cfg.num_heads, cfg.head_dim_),
           linear(L + ("mlp", "wi"), f"{m}.dense_h_to_4h.weight"),
           linear(L + ("mlp", "wo"), f"{m}.dense_4h_to_h.weight"),
           *norm(("decoder", "final_norm"), f"{p}ln_f", True)]
    if cfg.parallel is not None and not cfg.parallel.shared_norm:  # the new architecture's two norms
        out += [*norm(L + ("attn_norm",), f"{layer}.ln_attn", True), *norm(L + ("mlp_norm",), f"{layer}.ln_mlp", True)]
    else:
        out += norm(L + ("attn_norm",), f"{layer}.input_layernorm", True)
        if cfg.parallel is None:
            out += norm(L + ("mlp_norm",), f"{layer}.post_attention_layernorm", True)
    if cfg.biases.qkv:
        out.append(Rule(tuple(L + ("attn", f"{n}_bias") for n in "qkv"), (f"{a}.query_key_value.bias",), load_bias,
                        save_bias))
    if cfg.biases.out:
        out.append(copy(L + ("attn", "o_bias"), f"{a}.dense.bias"))
    if cfg.biases.mlp:
        out += [copy(L + ("mlp", "bi"), f"{m}.dense_h_to_4h.bias"), copy(L + ("mlp", "bo"), f"{m}.dense_4h_to_h.bias")]
    head, aliases = lm_head(cfg, f"{p}word_embeddings.weight")
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, {"falcon": "transformer."}, ("FalconModel",), config_from_hf, config_to_hf, rules,
                            harmless={"num_key_value_heads": "FalconConfig's count of the kv heads its cache holds; "
                                                             "the attention layers take theirs from multi_query, "
                                                             "new_decoder_architecture and num_kv_heads"},
                            defaults=DEFAULTS)
