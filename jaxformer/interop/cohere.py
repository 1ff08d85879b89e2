"""Cohere's Command R family: ``cohere`` (Command R, Command R+, Aya 23 and Aya Expanse) and ``cohere2``
(Command R7B, Command A). Config and tensor rules, both directions.

A parallel block, x + attn(norm(x)) + mlp(norm(x)), through one LayerNorm without a bias (``layer_norm_eps``;
the final norm likewise): jaxformer's ``parallel_residual`` with ``parallel_shared_norm`` and ``norm_bias=False``.
Rotary positions turn adjacent pairs over the whole head (``rope_interleave``), grouped-query attention, a SwiGLU
MLP without biases, and a head tied to the embeddings by default whose logits are multiplied by ``logit_scale``
(``logits_multiplier``). ``attention_bias`` puts biases on q, k, v and o; ``use_qk_norm`` (Command R+) norms
each query and key head with its own LayerNorm scale and no bias before the rotation (``qk_norm_span='each_head'``).
Command R7B's layers are ``layer_types``: 'sliding_attention' layers see ``sliding_window`` keys and rotate,
'full_attention' layers see every key and do not rotate (NoPE); a file without ``layer_types`` has every
``sliding_window_pattern``-th layer full (default 4).
"""

from __future__ import annotations

from typing import Any

from jaxformer.layer_plan import local_layers
from jaxformer.model_config import ModelConfig
from jaxformer.interop.llama import architecture, attention_rules, decoder_rules, gated_mlp_rules, head_dim
from jaxformer.interop.rules import Rule, activation, copy, refuse, rope_from_hf, rope_to_hf

STEMS = {"cohere": "Cohere", "cohere2": "Cohere2"}
_COMMON = dict(num_key_value_heads=None, hidden_act="silu", max_position_embeddings=8192, layer_norm_eps=1e-5,
               logit_scale=0.0625, tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0,
               pad_token_id=0, bos_token_id=5, eos_token_id=255001)
# CohereConfig's and Cohere2Config's defaults for the keys a file may leave out (checked by test_config_reading.py)
DEFAULTS = {"cohere": dict(_COMMON, use_qk_norm=False),
            "cohere2": dict(_COMMON, sliding_window=4096, layer_types=None)}
# the rotary base of a file that names none: CohereConfig's own, Cohere2Config's the library's
DEFAULT_THETAS = {"cohere": 500000.0, "cohere2": 10000.0}
DEFAULT_WINDOW_PATTERN = 4  # Cohere2Config: every 4th layer full when a file has no layer_types
KINDS = {"sliding_attention": "sliding", "full_attention": "full"}


def _layers(hf: dict) -> list[str]:
    """Each layer's 'sliding' or 'full' as Cohere2Config derives them: ``layer_types``, else from the older
    files' ``sliding_window_pattern`` (read either way: transformers ignores it beside ``layer_types``)."""
    layers, types = hf["num_hidden_layers"], hf["layer_types"]
    pattern = hf.get("sliding_window_pattern", DEFAULT_WINDOW_PATTERN)
    if types is None:
        refuse(isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1,
               f"cohere2: sliding_window_pattern={pattern!r} must be a whole number >= 1 (every n-th layer full)")
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    refuse(len(types) != layers or any(t not in KINDS for t in types), f"cohere2: layer_types {types} must give "
           f"each of the {layers} layers one of {sorted(KINDS)}")
    kinds = [KINDS[t] for t in types]
    # Cohere2Attention rotates exactly the layers with a window: with a null window no layer would rotate
    refuse("sliding" in kinds and hf["sliding_window"] is None, "cohere2: layer_types has sliding_attention "
           "layers but sliding_window is null")
    return kinds


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    heads, scale = hf["num_attention_heads"], hf["logit_scale"]
    refuse(isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0,
           f"{model_type}: logit_scale={scale!r} is not supported: the logits are multiplied by it, a number > 0")
    theta, scaling = rope_from_hf(hf, DEFAULT_THETAS[model_type])
    bias, act = bool(hf["attention_bias"]), activation(hf["hidden_act"], True, model_type)
    fields = dict(family="decoder", d_model=hf["hidden_size"], num_heads=heads,
                  num_kv_heads=hf["num_key_value_heads"] or heads, head_dim=head_dim(hf, heads),
                  d_ff=hf["intermediate_size"], decoder_layers=hf["num_hidden_layers"], norm="layernorm",
                  norm_eps=hf["layer_norm_eps"], norm_bias=False, activation=act, position="rope", rope_theta=theta,
                  rope_scaling=scaling, rope_interleave=True, max_positions=hf["max_position_embeddings"],
                  attention="causal", qkv_bias=bias, out_bias=bias, mlp_bias=False, parallel_residual=True,
                  parallel_shared_norm=True,
                  tie_embeddings=hf["tie_word_embeddings"], head="none" if arch.endswith("Model") else "lm",
                  attention_dropout_rate=float(hf["attention_dropout"]), logits_multiplier=float(scale))
    if model_type == "cohere":
        return {**fields, **(dict(qk_norm=True, qk_norm_span="each_head") if hf["use_qk_norm"] else {})}
    kinds = _layers(hf)
    full = tuple(i for i, kind in enumerate(kinds) if kind == "full")
    if "sliding" in kinds:
        fields.update(attention="sliding" if not full else "alternating", window_size=int(hf["sliding_window"]),
                      layer_types=tuple(kinds) if full else None)
    return {**fields, "nope_layers": full} if full else fields


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
               head_dim=cfg.head_dim_, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.decoder_layers,
               layer_norm_eps=cfg.norms.eps, hidden_act="silu" if cfg.activation == "swiglu" else "gelu_pytorch_tanh",
               max_position_embeddings=cfg.max_positions, rope_parameters=rope_to_hf(cfg),
               attention_bias=cfg.biases.qkv, attention_dropout=cfg.attention_dropout_rate,
               tie_word_embeddings=cfg.embeddings.tie, logit_scale=cfg.logits.multiplier)
    for legacy in ("rope_scaling", "rope_theta", "sliding_window_pattern"):
        out.pop(legacy, None)
    if model_type == "cohere":
        out["use_qk_norm"] = cfg.query_key_norm is not None
        return
    L = cfg.decoder_layers
    sliding = local_layers(cfg) if cfg.attention == "alternating" else (cfg.attention == "sliding",) * L
    out.update(sliding_window=cfg.window_size,
               layer_types=["sliding_attention" if s else "full_attention" for s in sliding])


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        a = f"{layer}.self_attn"
        out = [*attention_rules(cfg, S, a), copy(S + ("attn_norm", "scale"), f"{layer}.input_layernorm.weight"),
               *gated_mlp_rules(cfg, S, f"{layer}.mlp")]
        if cfg.query_key_norm is not None:  # one [heads, head_dim] LayerNorm weight each, a scale per head
            out += [copy(S + ("attn", "q_norm", "scale"), f"{a}.q_norm.weight"),
                    copy(S + ("attn", "k_norm", "scale"), f"{a}.k_norm.weight")]
        return out

    return decoder_rules(cfg, prefix, block)


ARCHITECTURE = architecture(STEMS, config_from_hf, config_to_hf, rules, defaults=DEFAULTS)
