"""Hugging Face checkpoints <-> jaxformer, without torch.

Two tables per architecture: how the HF ``config.json`` maps to a ModelConfig, and how each HF tensor
maps to a jaxformer parameter (``Rule``). Loading reads every tensor a rule needs, transforms it,
stacks layers, and checks every shape against the abstract model before anything is built: missing,
unexpected and mis-shaped tensors are reported together, and nothing partial is ever loaded.
Saving runs the same rules backwards, so HF -> jaxformer -> HF returns the same bytes per tensor.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.config import ModelConfig, RopeScaling
from jaxformer.interop.files import TensorFiles, _read_json, iter_json, write_safetensors

SUPPORTED = {
    "bert": ("BertModel", "BertForMaskedLM", "BertForPreTraining", "BertForSequenceClassification",
             "BertForTokenClassification", "BertForQuestionAnswering"),
    "roberta": ("RobertaModel", "RobertaForMaskedLM"),
    "gpt2": ("GPT2Model", "GPT2LMHeadModel"),
    "llama": ("LlamaModel", "LlamaForCausalLM"),
    "mistral": ("MistralModel", "MistralForCausalLM"),
    "qwen2": ("Qwen2Model", "Qwen2ForCausalLM"),
    "mixtral": ("MixtralModel", "MixtralForCausalLM"),
    "t5": ("T5Model", "T5ForConditionalGeneration", "T5EncoderModel"),
    "bart": ("BartModel", "BartForConditionalGeneration"),
}

_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_fast": "gelu_tanh", "silu": "silu", "swish": "silu"}
_GATED = {"silu": "swiglu", "swish": "swiglu", "gelu_new": "geglu", "gelu_pytorch_tanh": "geglu"}


def _refuse(condition: bool, message: str) -> None:
    if condition:
        raise ValueError(message)


def _activation(name: str, gated: bool, model_type: str) -> str:
    table = _GATED if gated else _ACTIVATIONS
    if name not in table:
        raise ValueError(f"{model_type}: activation {name!r}{' (gated)' if gated else ''} is not supported; "
                         f"supported: {sorted(table)}")
    return table[name]


# --------------------------------------------------------------------------------------------------
# config.json -> ModelConfig


def architecture_of(hf: dict) -> tuple[str, str]:
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: {sorted(SUPPORTED)}")
    archs = hf.get("architectures") or [SUPPORTED[model_type][0]]
    arch = archs[0]
    if arch not in SUPPORTED[model_type]:
        raise ValueError(f"architecture {arch!r} is not supported for model_type {model_type!r}; "
                         f"supported: {list(SUPPORTED[model_type])}")
    return model_type, arch


def _rope(hf: dict) -> tuple[float, RopeScaling | None]:
    params = hf.get("rope_parameters") or {}
    legacy = hf.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type") or legacy.get("rope_type") or legacy.get("type") or "default"
    spec = {**legacy, **params}
    if kind == "default":
        return theta, None
    if kind == "linear":
        return theta, RopeScaling("linear", float(spec["factor"]))
    if kind == "llama3":
        return theta, RopeScaling("llama3", float(spec["factor"]), float(spec["low_freq_factor"]),
                                  float(spec["high_freq_factor"]), int(spec["original_max_position_embeddings"]))
    raise ValueError(f"rope type {kind!r} is not supported; supported: 'default', 'linear', 'llama3'")


def _special_ids(hf: dict, extra: list[dict], vocab: int) -> dict:
    """Token ids for generation from config.json, then generation_config.json; out-of-vocabulary ids
    (common in tiny test configs) are dropped with a warning, since they could never be emitted."""
    out = {}
    for field in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = hf.get(field)
        for source in extra:
            if value is None:
                value = source.get(field)
        if isinstance(value, list):
            value = tuple(value)
        ids = value if isinstance(value, tuple) else (value,)
        if value is not None and any(not 0 <= i < vocab for i in ids):
            warnings.warn(f"{field}={value} lies outside the vocabulary [0, {vocab}); ignored", stacklevel=3)
            value = None
        out[field] = value
    return out


def config_from_hf(hf: dict, tensor_names: set[str] | None = None, extra: list[dict] | None = None,
                   dtype: str | None = None) -> ModelConfig:
    """Map a transformers config (as a dict) to a ModelConfig, refusing options jaxformer cannot honour."""
    model_type, arch = architecture_of(hf)
    tensor_names = tensor_names or set()
    file_dtype = str(hf.get("dtype") or hf.get("torch_dtype") or "float32")
    dtype = dtype or (file_dtype if file_dtype in ("float32", "bfloat16", "float16") else "float32")
    common: dict[str, Any] = dict(name=hf.get("_name_or_path") or model_type, vocab_size=hf["vocab_size"],
                                  dtype=dtype, param_dtype=dtype, init_std=float(hf.get("initializer_range", 0.02)))
    if model_type in ("bert", "roberta"):
        _refuse(hf.get("is_decoder", False) or hf.get("add_cross_attention", False),
                f"{model_type}: decoder/cross-attention variants are not supported")
        _refuse(hf.get("position_embedding_type", "absolute") != "absolute",
                f"{model_type}: position_embedding_type={hf.get('position_embedding_type')!r} is not supported")
        offset = hf["pad_token_id"] + 1 if model_type == "roberta" else 0
        head = {"Model": "none", "ForMaskedLM": "mlm", "ForPreTraining": "pretraining",
                "ForSequenceClassification": "sequence_classification",
                "ForTokenClassification": "token_classification",
                "ForQuestionAnswering": "question_answering"}[arch.removeprefix("Bert").removeprefix("Roberta")]
        # A base model has a pooler when its file does (add_pooling_layer is not in config.json).
        pooler = head in ("pretraining", "sequence_classification") or (
            head == "none" and (not tensor_names or any(n.endswith("pooler.dense.weight") for n in tensor_names)))
        num_labels = len(hf["id2label"]) if hf.get("id2label") else int(hf.get("num_labels", 2))
        cfg = dict(family="encoder", d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                   d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                   norm_position="post", norm_eps=hf.get("layer_norm_eps", 1e-12), embedding_norm=True,
                   final_norm=False, activation=_activation(hf.get("hidden_act", "gelu"), False, model_type),
                   position="learned", max_positions=hf["max_position_embeddings"] - offset,
                   position_offset=offset, pad_aware_positions=model_type == "roberta",
                   type_vocab_size=hf.get("type_vocab_size", 2), attention="bidirectional", head=head,
                   pooler=pooler, num_labels=num_labels, dropout_rate=hf.get("hidden_dropout_prob", 0.1),
                   attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
                   tie_embeddings=hf.get("tie_word_embeddings", True))
    elif model_type == "gpt2":
        _refuse(hf.get("scale_attn_by_inverse_layer_idx", False),
                "gpt2: scale_attn_by_inverse_layer_idx=True is not supported")
        _refuse(hf.get("add_cross_attention", False), "gpt2: add_cross_attention=True is not supported")
        # reorder_and_upcast_attn only changes where float32 is used; jaxformer's scores are float32 anyway.
        cfg = dict(family="decoder", d_model=hf["n_embd"], num_heads=hf["n_head"],
                   d_ff=hf.get("n_inner") or 4 * hf["n_embd"], decoder_layers=hf["n_layer"],
                   norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                   activation=_activation(hf.get("activation_function", "gelu_new"), False, model_type),
                   position="learned", max_positions=hf["n_positions"], attention="causal",
                   attention_scale=None if hf.get("scale_attn_weights", True) else 1.0,
                   head="none" if arch == "GPT2Model" else "lm", tie_embeddings=hf.get("tie_word_embeddings", True),
                   dropout_rate=hf.get("resid_pdrop", 0.1), attention_dropout_rate=hf.get("attn_pdrop", 0.1))
    elif model_type in ("llama", "mistral", "qwen2", "mixtral"):
        theta, scaling = _rope(hf)
        heads = hf["num_attention_heads"]
        attention, window = "causal", None
        if model_type in ("mistral", "mixtral") and hf.get("sliding_window") is not None:
            attention, window = "sliding", int(hf["sliding_window"])
        if model_type == "qwen2":
            kinds = set(hf.get("layer_types") or ["full_attention"])
            if hf.get("use_sliding_window", False) and hf.get("sliding_window") is not None:
                kinds = set(hf.get("layer_types") or ["sliding_attention"])
            _refuse(len(kinds) > 1, "qwen2: a mix of sliding and full attention layers is not supported")
            if kinds == {"sliding_attention"}:
                attention, window = "sliding", int(hf["sliding_window"])
        _refuse(model_type == "mixtral" and hf.get("router_jitter_noise", 0.0) > 0,
                "mixtral: router_jitter_noise > 0 is not supported")
        bias = bool(hf.get("attention_bias", False))
        cfg = dict(family="decoder", d_model=hf["hidden_size"], num_heads=heads,
                   num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=hf.get("head_dim"),
                   d_ff=hf["intermediate_size"], decoder_layers=hf["num_hidden_layers"], norm="rmsnorm",
                   norm_eps=hf.get("rms_norm_eps", 1e-6), norm_bias=False,
                   activation=_activation(hf.get("hidden_act", "silu"), True, model_type), position="rope",
                   rope_theta=theta, rope_scaling=scaling, max_positions=hf.get("max_position_embeddings", 2048),
                   attention=attention, window_size=window, qkv_bias=True if model_type == "qwen2" else bias,
                   out_bias=False if model_type == "qwen2" else bias, mlp_bias=bool(hf.get("mlp_bias", False)),
                   tie_embeddings=hf.get("tie_word_embeddings", False),
                   head="none" if arch.endswith("Model") else "lm",
                   attention_dropout_rate=hf.get("attention_dropout", 0.0))
        if model_type == "mixtral":
            cfg.update(num_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
                       router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.0))
    elif model_type == "t5":
        proj = hf.get("feed_forward_proj", "relu")
        gated = proj.startswith("gated-")
        act = proj.removeprefix("gated-")
        act = "gelu_new" if proj == "gated-gelu" else act
        _refuse(gated and act not in _GATED, f"t5: feed_forward_proj={proj!r} is not supported")
        # transformers 5 always ties in the config and records the v1.0 output scaling separately;
        # an lm_head tensor in the file means the head is untied (v1.1).
        scale = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
        tied = "lm_head.weight" not in tensor_names if tensor_names else hf.get("tie_word_embeddings", True)
        encoder_only = arch == "T5EncoderModel"
        cfg = dict(family="encoder" if encoder_only else "encoder_decoder", d_model=hf["d_model"],
                   num_heads=hf["num_heads"], head_dim=hf["d_kv"], d_ff=hf["d_ff"], encoder_layers=hf["num_layers"],
                   decoder_layers=0 if encoder_only else (hf.get("num_decoder_layers") or hf["num_layers"]),
                   norm="rmsnorm", norm_eps=hf.get("layer_norm_epsilon", 1e-6), norm_bias=False,
                   activation=_activation(act, gated, "t5"), position="relative",
                   max_positions=hf.get("n_positions", 512),
                   relative_buckets=hf.get("relative_attention_num_buckets", 32),
                   relative_max_distance=hf.get("relative_attention_max_distance", 128), attention_scale=1.0,
                   attention="bidirectional" if encoder_only else "causal", qkv_bias=False, out_bias=False,
                   mlp_bias=False, tie_embeddings=tied, scale_tied_logits=bool(scale and tied and not encoder_only),
                   head="none" if arch != "T5ForConditionalGeneration" else "lm",
                   dropout_rate=hf.get("dropout_rate", 0.1))
    elif model_type == "bart":
        _refuse(hf["encoder_attention_heads"] != hf["decoder_attention_heads"] or
                hf["encoder_ffn_dim"] != hf["decoder_ffn_dim"],
                "bart: different encoder and decoder widths or head counts are not supported")
        _refuse(hf.get("encoder_layerdrop", 0.0) > 0 or hf.get("decoder_layerdrop", 0.0) > 0,
                "bart: layerdrop > 0 is not supported")
        _refuse(hf.get("normalize_before", False) or hf.get("add_final_layer_norm", False),
                "bart: pre-norm variants (normalize_before / add_final_layer_norm) are not supported")
        lm = arch == "BartForConditionalGeneration"
        cfg = dict(family="encoder_decoder", d_model=hf["d_model"], num_heads=hf["encoder_attention_heads"],
                   d_ff=hf["encoder_ffn_dim"], encoder_layers=hf["encoder_layers"], decoder_layers=hf["decoder_layers"],
                   norm_position="post", norm_eps=1e-5, embedding_norm=True, final_norm=False,
                   activation=_activation(hf.get("activation_function", "gelu"), False, "bart"), position="learned",
                   max_positions=hf["max_position_embeddings"], position_offset=2,
                   scale_embeddings=bool(hf.get("scale_embedding", False)), tie_embeddings=hf.get("tie_word_embeddings", True),
                   head="lm" if lm else "none", logits_bias=lm, dropout_rate=hf.get("dropout", 0.1),
                   attention_dropout_rate=hf.get("attention_dropout", 0.0))
    else:  # pragma: no cover - architecture_of already refused it
        raise AssertionError(model_type)
    return ModelConfig(**common, **cfg, **_special_ids(hf, extra or [], hf["vocab_size"]))


# --------------------------------------------------------------------------------------------------
# Tensor rules


@dataclasses.dataclass(frozen=True)
class Rule:
    """jaxformer parameters ``paths`` <-> HF tensors ``names``.

    Names may hold ``{i}`` (the layer); such a rule is applied per layer and its jaxformer arrays are
    stacked on a leading layers axis. ``load`` maps the HF arrays to the jaxformer arrays (one per
    path), ``save`` is its exact inverse.
    """

    paths: tuple[tuple[str, ...], ...]
    names: tuple[str, ...]
    load: Callable[[list[np.ndarray]], list[np.ndarray]]
    save: Callable[[list[np.ndarray]], list[np.ndarray]]

    @property
    def per_layer(self) -> bool:
        return any("{i}" in n for n in self.names)


def _copy(path, name) -> Rule:
    return Rule((path,), (name,), lambda t: [t[0]], lambda p: [p[0]])


def _linear(path, name) -> Rule:
    """torch Linear weight [out, in] <-> kernel [in, out]."""
    return Rule((path,), (name,), lambda t: [t[0].T], lambda p: [p[0].T])


def _heads_in(path, name, heads, head_dim) -> Rule:
    """q/k/v projection [N*H, D] <-> [D, N, H]."""
    return Rule((path,), (name,), lambda t: [t[0].T.reshape(-1, heads, head_dim)],
                lambda p: [p[0].reshape(p[0].shape[0], -1).T])


def _heads_out(path, name, heads, head_dim) -> Rule:
    """output projection [D, N*H] <-> [N, H, D]."""
    return Rule((path,), (name,), lambda t: [t[0].T.reshape(heads, head_dim, -1)],
                lambda p: [p[0].reshape(-1, p[0].shape[-1]).T])


def _bias_heads(path, name, heads, head_dim) -> Rule:
    return Rule((path,), (name,), lambda t: [t[0].reshape(heads, head_dim)], lambda p: [p[0].reshape(-1)])


def _norm(path, name, bias: bool, weight="weight", bias_name="bias") -> list[Rule]:
    rules = [_copy(path + ("scale",), f"{name}.{weight}")]
    if bias:
        rules.append(_copy(path + ("bias",), f"{name}.{bias_name}"))
    return rules


def _dense(path, name, bias=True) -> list[Rule]:
    rules = [_linear(path + ("kernel",), f"{name}.weight")]
    if bias:
        rules.append(_copy(path + ("bias",), f"{name}.bias"))
    return rules


def _attention(cfg: ModelConfig, path, q, k, v, o, q_bias=None, k_bias=None, v_bias=None, o_bias=None) -> list[Rule]:
    N, K, H = cfg.num_heads, cfg.kv_heads, cfg.head_dim_
    rules = [_heads_in(path + ("q",), q, N, H), _heads_in(path + ("k",), k, K, H),
             _heads_in(path + ("v",), v, K, H), _heads_out(path + ("o",), o, N, H)]
    if cfg.qkv_bias:
        rules += [_bias_heads(path + ("q_bias",), q_bias, N, H), _bias_heads(path + ("k_bias",), k_bias, K, H),
                  _bias_heads(path + ("v_bias",), v_bias, K, H)]
    if cfg.out_bias:
        rules.append(_copy(path + ("o_bias",), o_bias))
    return rules


def _lm_head(cfg: ModelConfig, embedding: str) -> tuple[list[Rule], dict[str, str]]:
    """The LM head: an alias of the token embedding when tied (older files may still carry a
    copy, which must then equal it), else its own [V, D] tensor."""
    if cfg.head != "lm":
        return [], {}
    if cfg.tie_embeddings:
        return [], {"lm_head.weight": embedding}
    return [_linear(("lm_head", "kernel"), "lm_head.weight")], {}


def _bert_rules(cfg: ModelConfig, model_type: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("encoder", "blocks")
    ln = cfg.norm == "layernorm" and cfg.norm_bias
    rules = [_copy(("embed", "table"), f"{p}embeddings.word_embeddings.weight"),
             _copy(("embeddings", "positions", "table"), f"{p}embeddings.position_embeddings.weight"),
             *_norm(("embeddings", "norm"), f"{p}embeddings.LayerNorm", ln)]
    if cfg.type_vocab_size:
        rules.append(_copy(("embeddings", "token_types", "table"), f"{p}embeddings.token_type_embeddings.weight"))
    layer = f"{p}encoder.layer.{{i}}"
    rules += _attention(cfg, L + ("attn",), *(f"{layer}.attention.self.{n}.weight" for n in ("query", "key", "value")),
                        f"{layer}.attention.output.dense.weight",
                        *(f"{layer}.attention.self.{n}.bias" for n in ("query", "key", "value")),
                        f"{layer}.attention.output.dense.bias")
    rules += _norm(L + ("attn_norm",), f"{layer}.attention.output.LayerNorm", ln)
    rules += [_linear(L + ("mlp", "wi"), f"{layer}.intermediate.dense.weight"),
              _copy(L + ("mlp", "bi"), f"{layer}.intermediate.dense.bias"),
              _linear(L + ("mlp", "wo"), f"{layer}.output.dense.weight"),
              _copy(L + ("mlp", "bo"), f"{layer}.output.dense.bias"),
              *_norm(L + ("mlp_norm",), f"{layer}.output.LayerNorm", ln)]
    if cfg.pooler:
        rules += _dense(("pooler",), f"{p}pooler.dense")
    aliases = {}
    if cfg.head in ("mlm", "pretraining"):
        head = "cls.predictions" if model_type == "bert" else "lm_head"
        transform = f"{head}.transform.dense" if model_type == "bert" else f"{head}.dense"
        norm = f"{head}.transform.LayerNorm" if model_type == "bert" else f"{head}.layer_norm"
        rules += [*_dense(("mlm", "transform"), transform), *_norm(("mlm", "norm"), norm, ln),
                  _copy(("mlm", "bias"), f"{head}.bias")]
        if cfg.tie_embeddings:
            aliases[f"{head}.decoder.weight"] = f"{p}embeddings.word_embeddings.weight"
        else:
            rules.append(_linear(("mlm", "decoder", "kernel"), f"{head}.decoder.weight"))
        aliases[f"{head}.decoder.bias"] = f"{head}.bias"
    if cfg.head == "pretraining":
        rules += _dense(("nsp",), "cls.seq_relationship")
    if cfg.head in ("sequence_classification", "token_classification"):
        rules += _dense(("classifier",), "classifier")
    if cfg.head == "question_answering":
        rules += _dense(("classifier",), "qa_outputs")
    return rules, aliases


def _gpt2_rules(cfg: ModelConfig, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("decoder", "blocks")
    N, H, D = cfg.num_heads, cfg.head_dim_, cfg.d_model
    layer = f"{p}h.{{i}}"

    def split_qkv(t):  # Conv1D [D, 3D] (input-major) -> three [D, N, H]
        return [w.reshape(D, N, H) for w in np.split(t[0], 3, axis=1)]

    def join_qkv(ps):
        return [np.concatenate([w.reshape(D, N * H) for w in ps], axis=1)]

    rules = [
        _copy(("embed", "table"), f"{p}wte.weight"),
        _copy(("embeddings", "positions", "table"), f"{p}wpe.weight"),
        Rule(tuple(L + ("attn", n) for n in "qkv"), (f"{layer}.attn.c_attn.weight",), split_qkv, join_qkv),
        Rule(tuple(L + ("attn", f"{n}_bias") for n in "qkv"), (f"{layer}.attn.c_attn.bias",),
             lambda t: [b.reshape(N, H) for b in np.split(t[0], 3)],
             lambda ps: [np.concatenate([b.reshape(-1) for b in ps])]),
        Rule((L + ("attn", "o"),), (f"{layer}.attn.c_proj.weight",), lambda t: [t[0].reshape(N, H, D)],
             lambda ps: [ps[0].reshape(N * H, D)]),
        _copy(L + ("attn", "o_bias"), f"{layer}.attn.c_proj.bias"),
        *_norm(L + ("attn_norm",), f"{layer}.ln_1", True),
        *_norm(L + ("mlp_norm",), f"{layer}.ln_2", True),
        _copy(L + ("mlp", "wi"), f"{layer}.mlp.c_fc.weight"),  # Conv1D is already [in, out]
        _copy(L + ("mlp", "bi"), f"{layer}.mlp.c_fc.bias"),
        _copy(L + ("mlp", "wo"), f"{layer}.mlp.c_proj.weight"),
        _copy(L + ("mlp", "bo"), f"{layer}.mlp.c_proj.bias"),
        *_norm(("decoder", "final_norm"), f"{p}ln_f", True),
    ]
    head, aliases = _lm_head(cfg, f"{p}wte.weight")
    return rules + head, aliases


def _llama_rules(cfg: ModelConfig, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("decoder", "blocks")
    layer = f"{p}layers.{{i}}"
    a = f"{layer}.self_attn"
    rules = [_copy(("embed", "table"), f"{p}embed_tokens.weight"),
             *_attention(cfg, L + ("attn",), f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight",
                         f"{a}.o_proj.weight", f"{a}.q_proj.bias", f"{a}.k_proj.bias", f"{a}.v_proj.bias",
                         f"{a}.o_proj.bias"),
             _copy(L + ("attn_norm", "scale"), f"{layer}.input_layernorm.weight"),
             _copy(L + ("mlp_norm", "scale"), f"{layer}.post_attention_layernorm.weight"),
             _copy(("decoder", "final_norm", "scale"), f"{p}norm.weight")]
    if cfg.num_experts:
        E = cfg.num_experts
        moe = f"{layer}.block_sparse_moe"

        def experts(w: str, path: tuple[str, ...]) -> Rule:
            return Rule((L + ("mlp", path),), tuple(f"{moe}.experts.{e}.{w}.weight" for e in range(E)),
                        lambda ts: [np.stack([t.T for t in ts])], lambda ps: [w_.T for w_ in ps[0]])

        rules += [_linear(L + ("mlp", "router"), f"{moe}.gate.weight"),
                  experts("w1", "wi_gate"), experts("w3", "wi"), experts("w2", "wo")]
    else:
        rules += [_linear(L + ("mlp", "wi_gate"), f"{layer}.mlp.gate_proj.weight"),
                  _linear(L + ("mlp", "wi"), f"{layer}.mlp.up_proj.weight"),
                  _linear(L + ("mlp", "wo"), f"{layer}.mlp.down_proj.weight")]
        if cfg.mlp_bias:
            # jaxformer's gated MLP has one input bias (on the up projection); HF has one on each.
            raise ValueError("llama: mlp_bias=True is not supported")
    head, aliases = _lm_head(cfg, f"{p}embed_tokens.weight")
    return rules + head, aliases


def _t5_rules(cfg: ModelConfig) -> tuple[list[Rule], dict[str, str]]:
    rules = [_copy(("embed", "table"), "shared.weight")]
    aliases = {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}
    ff = "wi_1" if cfg.gated else "wi"

    def stack(side: str, cross: bool) -> list[Rule]:
        L, block = (side, "blocks"), f"{side}.block.{{i}}.layer"
        att = f"{block}.0.SelfAttention"
        out = [*_attention(cfg, L + ("attn",), f"{att}.q.weight", f"{att}.k.weight", f"{att}.v.weight", f"{att}.o.weight"),
               _copy(L + ("attn_norm", "scale"), f"{block}.0.layer_norm.weight"),
               _copy((side, "relative_bias", "table"), f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
               _copy((side, "final_norm", "scale"), f"{side}.final_layer_norm.weight")]
        f = 2 if cross else 1
        if cross:
            x = f"{block}.1.EncDecAttention"
            out += [*_attention(cfg, L + ("cross_attn",), f"{x}.q.weight", f"{x}.k.weight", f"{x}.v.weight", f"{x}.o.weight"),
                    _copy(L + ("cross_norm", "scale"), f"{block}.1.layer_norm.weight")]
        out += [_linear(L + ("mlp", "wi"), f"{block}.{f}.DenseReluDense.{ff}.weight"),
                _linear(L + ("mlp", "wo"), f"{block}.{f}.DenseReluDense.wo.weight"),
                _copy(L + ("mlp_norm", "scale"), f"{block}.{f}.layer_norm.weight")]
        if cfg.gated:
            out.append(_linear(L + ("mlp", "wi_gate"), f"{block}.{f}.DenseReluDense.wi_0.weight"))
        return out

    rules += stack("encoder", False)
    if cfg.family == "encoder_decoder":
        rules += stack("decoder", True)
        head, head_aliases = _lm_head(cfg, "shared.weight")
        rules += head
        aliases.update(head_aliases)
    else:
        aliases.pop("decoder.embed_tokens.weight")
    return rules, aliases


def _bart_rules(cfg: ModelConfig, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    rules = [_copy(("embed", "table"), f"{p}shared.weight")]
    aliases = {f"{p}encoder.embed_tokens.weight": f"{p}shared.weight",
               f"{p}decoder.embed_tokens.weight": f"{p}shared.weight"}

    def attention(path, name):
        return _attention(cfg, path, *(f"{name}.{n}_proj.weight" for n in "qkv"), f"{name}.out_proj.weight",
                          *(f"{name}.{n}_proj.bias" for n in "qkv"), f"{name}.out_proj.bias")

    for side in ("encoder", "decoder"):
        L, layer = (side, "blocks"), f"{p}{side}.layers.{{i}}"
        rules += [_copy((f"{side}_embeddings", "positions", "table"), f"{p}{side}.embed_positions.weight"),
                  *_norm((f"{side}_embeddings", "norm"), f"{p}{side}.layernorm_embedding", True),
                  *attention(L + ("attn",), f"{layer}.self_attn"),
                  *_norm(L + ("attn_norm",), f"{layer}.self_attn_layer_norm", True),
                  _linear(L + ("mlp", "wi"), f"{layer}.fc1.weight"), _copy(L + ("mlp", "bi"), f"{layer}.fc1.bias"),
                  _linear(L + ("mlp", "wo"), f"{layer}.fc2.weight"), _copy(L + ("mlp", "bo"), f"{layer}.fc2.bias"),
                  *_norm(L + ("mlp_norm",), f"{layer}.final_layer_norm", True)]
        if side == "decoder":
            rules += [*attention(L + ("cross_attn",), f"{layer}.encoder_attn"),
                      *_norm(L + ("cross_norm",), f"{layer}.encoder_attn_layer_norm", True)]
    head, head_aliases = _lm_head(cfg, f"{p}shared.weight")
    rules += head
    aliases.update(head_aliases)
    if cfg.logits_bias:
        rules.append(Rule((("logits_bias",),), ("final_logits_bias",), lambda t: [t[0].reshape(-1)],
                          lambda ps: [ps[0].reshape(1, -1)]))
    return rules, aliases


_BASE_PREFIX = {"bert": "bert.", "roberta": "roberta.", "gpt2": "transformer.", "llama": "model.",
                "mistral": "model.", "qwen2": "model.", "mixtral": "model.", "bart": "model.", "t5": ""}
_BASE_MODELS = {"BertModel", "RobertaModel", "GPT2Model", "LlamaModel", "MistralModel", "Qwen2Model", "MixtralModel",
                "BartModel", "T5Model", "T5EncoderModel"}
# Non-parameter tensors older checkpoints carry; they hold nothing a model needs.
_IGNORABLE = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq", "embeddings.position_ids")


def _prefix(model_type: str, arch: str, names: set[str] | None) -> str:
    """Head models nest the base model under a prefix; base models saved alone do not."""
    prefix = _BASE_PREFIX[model_type]
    if names is None:  # saving: base models are written unprefixed, head models nest them
        return "" if arch in _BASE_MODELS else prefix
    return prefix if any(n.startswith(prefix) for n in names) else ""


def rules_for(cfg: ModelConfig, model_type: str, arch: str, names: set[str] | None = None
              ) -> tuple[list[Rule], dict[str, str]]:
    prefix = _prefix(model_type, arch, names)
    if model_type in ("bert", "roberta"):
        return _bert_rules(cfg, model_type, prefix)
    if model_type == "gpt2":
        return _gpt2_rules(cfg, prefix)
    if model_type in ("llama", "mistral", "qwen2", "mixtral"):
        return _llama_rules(cfg, prefix)
    if model_type == "t5":
        return _t5_rules(cfg)
    return _bart_rules(cfg, prefix)


# --------------------------------------------------------------------------------------------------
# Loading


@functools.lru_cache(maxsize=8)
def _abstract_split(cfg: ModelConfig):
    """(graphdef, abstract state) of a config; tracing the constructor is the slow part, so keep a few."""
    from jaxformer import _FAMILY_CLASSES  # the public builder's table; imported late to avoid a cycle
    return nnx.split(nnx.eval_shape(lambda: _FAMILY_CLASSES[cfg.family](cfg, rngs=nnx.Rngs(0))))


def build_from_tensors(cfg: ModelConfig, rules: list[Rule], aliases: dict[str, str], names: set[str],
                       get: Callable[[str], np.ndarray], source: str):
    """Build the model of ``cfg`` from named tensors through ``rules``, or raise one ValueError that
    lists every missing, unexpected and mis-shaped tensor. Nothing is built until all of them check."""
    graphdef, state = _abstract_split(cfg)
    expected = {tuple(map(str, p)): v for p, v in nnx.to_flat_state(state)}
    num_layers = {"encoder": cfg.encoder_layers, "decoder": cfg.decoder_layers}

    param_dtype = np.dtype(jnp.dtype(cfg.param_dtype))
    missing, mismatched, loaded, used = [], [], {}, set()
    copies: list[tuple[np.ndarray, Any, np.ndarray]] = []  # (destination, index, source view)
    for rule in rules:
        layers = num_layers[rule.paths[0][0]] if rule.per_layer else 1
        groups = [[n.format(i=i) for n in rule.names] for i in range(layers)]
        absent = [n for group in groups for n in group if n not in names]
        if absent:
            missing += absent
            continue
        used.update(n for group in groups for n in group)
        buffers = None
        for i, group in enumerate(groups):
            parts = rule.load([get(n) for n in group])  # views into the mapped file where possible
            shapes = [((layers,) if rule.per_layer else ()) + tuple(part.shape) for part in parts]
            bad = [f"{'/'.join(p)} from {group[0]}: file gives {shape}, config needs {tuple(expected[p].shape)}"
                   for p, shape in zip(rule.paths, shapes) if shape != tuple(expected[p].shape)]
            if bad:
                mismatched += bad
                buffers = None
                break
            if buffers is None:
                buffers = [_aligned_empty(shape, param_dtype) for shape in shapes]
            copies += [(buffer, i if rule.per_layer else ..., part) for buffer, part in zip(buffers, parts)]
        if buffers is not None:
            loaded.update(zip(rule.paths, buffers))
    for alias, target in aliases.items():
        if alias in names:
            used.add(alias)
            if target in names and not np.array_equal(get(alias), get(target)):
                mismatched.append(f"{alias} should be tied to {target} but differs")
    unexpected = sorted(n for n in names - used if not n.endswith(_IGNORABLE))
    not_covered = sorted("/".join(p) for p in expected if p not in loaded)
    if missing or unexpected or mismatched or not_covered:
        parts = []
        if missing:
            parts.append(f"missing tensors ({len(missing)}): {missing[:20]}")
        if unexpected:
            parts.append(f"unexpected tensors ({len(unexpected)}): {unexpected[:20]}")
        if mismatched:
            parts.append(f"mis-shaped tensors ({len(mismatched)}): {mismatched[:20]}")
        if not_covered and not missing:
            parts.append(f"parameters with no source: {not_covered[:20]}")
        raise ValueError(f"{source}; nothing was loaded.\n  " + "\n  ".join(parts))

    def copy(task):  # the one copy (and cast) per byte; numpy releases the GIL, so threads overlap
        destination, index, source_view = task
        destination[index] = source_view

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(copy, copies))
    flat = [(p, var.replace(_to_device(loaded[tuple(map(str, p))]))) for p, var in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype, alignment: int = 64) -> np.ndarray:
    """An uninitialised host array whose data is 64-byte aligned, so XLA's CPU backend can adopt it."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _to_device(array: np.ndarray) -> jax.Array:
    """Hand an assembled host array to JAX; on CPU, DLPack adopts the aligned buffer without a copy."""
    if jax.default_backend() == "cpu":
        try:
            return jax.dlpack.from_dlpack(array)
        except Exception:  # a layout the backend will not adopt (e.g. bfloat16 on old jaxlib): copy
            pass
    return jnp.asarray(array)


def from_pretrained(path: str | os.PathLike, dtype: str | None = None, allow_pickle: bool = False):
    """Load a Hugging Face checkpoint folder (config.json + safetensors) as a jaxformer model."""
    folder = Path(path)
    if not (folder / "config.json").exists():
        raise ValueError(f"{folder} has no config.json; expected a Hugging Face checkpoint folder")
    hf = _read_json(folder / "config.json")
    model_type, arch = architecture_of(hf)  # refuse unsupported types before touching any tensor file
    files = TensorFiles(folder, allow_pickle=allow_pickle)
    names = set(files.names)
    cfg = config_from_hf(hf, names, list(iter_json(folder, "generation_config.json")), dtype)
    rules, aliases = rules_for(cfg, model_type, arch, names)
    model = build_from_tensors(cfg, rules, aliases, names, files.get, f"{folder} does not match {arch} ({model_type})")
    model.hf_config = json.dumps(hf, sort_keys=True)  # kept so save_pretrained writes the fields we do not model
    return model


# --------------------------------------------------------------------------------------------------
# Saving


def _hf_target(cfg: ModelConfig) -> tuple[str, str]:
    """The transformers model_type and architecture that hold exactly this configuration."""
    if cfg.family == "encoder":
        if cfg.position == "relative":
            return "t5", "T5EncoderModel"
        model_type = "roberta" if cfg.pad_aware_positions else "bert"
        stem = "Roberta" if model_type == "roberta" else "Bert"
        head = {"none": "Model", "mlm": "ForMaskedLM", "pretraining": "ForPreTraining",
                "sequence_classification": "ForSequenceClassification",
                "token_classification": "ForTokenClassification", "question_answering": "ForQuestionAnswering"}[cfg.head]
        arch = stem + head
        _refuse(arch not in SUPPORTED[model_type], f"{arch} is not a supported export target")
        return model_type, arch
    if cfg.family == "decoder":
        lm = cfg.head == "lm"
        if cfg.position == "learned":
            return "gpt2", "GPT2LMHeadModel" if lm else "GPT2Model"
        if cfg.num_experts:
            model_type = "mixtral"
        elif cfg.qkv_bias and not cfg.out_bias:
            model_type = "qwen2"
        elif cfg.attention == "sliding":
            model_type = "mistral"
        else:
            model_type = "llama"
        stem = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "mixtral": "Mixtral"}[model_type]
        return model_type, stem + ("ForCausalLM" if lm else "Model")
    if cfg.position == "relative":
        return "t5", "T5ForConditionalGeneration" if cfg.head == "lm" else "T5Model"
    if cfg.position == "learned":
        return "bart", "BartForConditionalGeneration" if cfg.head == "lm" else "BartModel"
    raise ValueError(f"{cfg.name!r} ({cfg.family}, {cfg.position} positions) has no Hugging Face architecture; "
                     "the 2017 Transformer maps to torch.nn.Transformer (jaxformer.interop.nn_transformer)")


def config_to_hf(cfg: ModelConfig, base: dict | None = None) -> dict:
    """A transformers config dict for ``cfg``; fields jaxformer does not model are kept from ``base``."""
    model_type, arch = _hf_target(cfg)
    out = dict(base or {})
    out.update(model_type=model_type, architectures=[arch], vocab_size=cfg.vocab_size, dtype=cfg.param_dtype,
               initializer_range=cfg.init_std)
    ids = {k: getattr(cfg, k) for k in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")}
    out.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in ids.items() if v is not None})
    inverse_act = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new", "silu": "silu"}
    if model_type in ("bert", "roberta"):
        out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
                   num_hidden_layers=cfg.encoder_layers, layer_norm_eps=cfg.norm_eps,
                   hidden_act=inverse_act[cfg.activation], max_position_embeddings=cfg.max_positions + cfg.position_offset,
                   type_vocab_size=cfg.type_vocab_size, hidden_dropout_prob=cfg.dropout_rate,
                   attention_probs_dropout_prob=cfg.attention_dropout_rate, tie_word_embeddings=cfg.tie_embeddings)
        if cfg.head in ("sequence_classification", "token_classification"):
            out.setdefault("id2label", {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)})
            out.setdefault("label2id", {f"LABEL_{i}": i for i in range(cfg.num_labels)})
    elif model_type == "gpt2":
        out.update(n_embd=cfg.d_model, n_head=cfg.num_heads, n_inner=cfg.d_ff, n_layer=cfg.decoder_layers,
                   n_positions=cfg.max_positions, layer_norm_epsilon=cfg.norm_eps,
                   activation_function=inverse_act[cfg.activation], scale_attn_weights=cfg.attention_scale is None,
                   tie_word_embeddings=cfg.tie_embeddings, resid_pdrop=cfg.dropout_rate, embd_pdrop=cfg.dropout_rate,
                   attn_pdrop=cfg.attention_dropout_rate)
    elif model_type in ("llama", "mistral", "qwen2", "mixtral"):
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
        if cfg.rope_scaling is not None:
            s = cfg.rope_scaling
            rope.update(rope_type=s.kind, factor=s.factor)
            if s.kind == "llama3":
                rope.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor,
                            original_max_position_embeddings=s.original_max_positions)
        out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
                   head_dim=cfg.head_dim_, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.decoder_layers,
                   rms_norm_eps=cfg.norm_eps, hidden_act="silu" if cfg.activation == "swiglu" else "gelu_pytorch_tanh",
                   max_position_embeddings=cfg.max_positions, rope_parameters=rope,
                   tie_word_embeddings=cfg.tie_embeddings, attention_dropout=cfg.attention_dropout_rate)
        out.pop("rope_theta", None)
        out.pop("rope_scaling", None)
        if model_type == "llama":
            out.update(attention_bias=cfg.qkv_bias, mlp_bias=False)
        if model_type in ("mistral", "mixtral", "qwen2"):
            out["sliding_window"] = cfg.window_size
        if model_type == "qwen2":
            sliding = cfg.attention == "sliding"
            out.update(use_sliding_window=sliding,
                       layer_types=["sliding_attention" if sliding else "full_attention"] * cfg.decoder_layers)
            if sliding:
                out["max_window_layers"] = 0
        if model_type == "mixtral":
            out.update(num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
                       router_aux_loss_coef=cfg.router_aux_loss_coef, router_jitter_noise=0.0)
    elif model_type == "t5":
        act = {"relu": "relu", "gelu": "gelu", "geglu": "gated-gelu", "swiglu": "gated-silu"}[cfg.activation]
        out.update(d_model=cfg.d_model, num_heads=cfg.num_heads, d_kv=cfg.head_dim_, d_ff=cfg.d_ff,
                   num_layers=cfg.encoder_layers, num_decoder_layers=cfg.decoder_layers or cfg.encoder_layers,
                   layer_norm_epsilon=cfg.norm_eps, feed_forward_proj=act, relative_attention_num_buckets=cfg.relative_buckets,
                   relative_attention_max_distance=cfg.relative_max_distance, dropout_rate=cfg.dropout_rate,
                   tie_word_embeddings=cfg.tie_embeddings, scale_decoder_outputs=cfg.scale_tied_logits,
                   is_encoder_decoder=cfg.family == "encoder_decoder")
    else:
        out.update(d_model=cfg.d_model, encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers,
                   encoder_attention_heads=cfg.num_heads, decoder_attention_heads=cfg.num_heads,
                   encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function=inverse_act[cfg.activation],
                   max_position_embeddings=cfg.max_positions, scale_embedding=cfg.scale_embeddings,
                   dropout=cfg.dropout_rate, attention_dropout=cfg.attention_dropout_rate,
                   tie_word_embeddings=cfg.tie_embeddings, is_encoder_decoder=True)
    return out


def export_with_rules(model, rules: list[Rule]) -> dict[str, np.ndarray]:
    """Run ``rules`` backwards: the model's parameters as named numpy arrays (layers unstacked)."""
    cfg: ModelConfig = model.config
    flat = {tuple(map(str, p)): v for p, v in nnx.to_flat_state(nnx.state(model))}
    num_layers = {"encoder": cfg.encoder_layers, "decoder": cfg.decoder_layers}
    tensors: dict[str, np.ndarray] = {}
    for rule in rules:
        arrays = [np.asarray(jax.device_get(flat[p][...])) for p in rule.paths]
        if rule.per_layer:
            for i in range(num_layers[rule.paths[0][0]]):
                for name, t in zip(rule.names, rule.save([a[i] for a in arrays])):
                    tensors[name.format(i=i)] = np.ascontiguousarray(t)
        else:
            tensors.update((name, np.ascontiguousarray(t)) for name, t in zip(rule.names, rule.save(arrays)))
    return tensors


def to_hf_tensors(model) -> tuple[dict[str, np.ndarray], dict]:
    """The model's parameters as HF-named numpy arrays, plus the HF config dict."""
    cfg: ModelConfig = model.config
    base = json.loads(getattr(model, "hf_config", None) or "{}")
    model_type, arch = _hf_target(cfg)
    if base and (base.get("model_type"), (base.get("architectures") or [arch])[0]) == (model_type, arch):
        hf = config_to_hf(cfg, base)
    else:
        hf = config_to_hf(cfg)
    rules, _ = rules_for(cfg, model_type, arch)
    tensors = export_with_rules(model, rules)
    return tensors, hf


def save_pretrained(model, path: str | os.PathLike) -> None:
    """Write config.json + model.safetensors that transformers' from_pretrained loads."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tensors, hf = to_hf_tensors(model)
    write_safetensors(tensors, folder / "model.safetensors")
    tmp = folder / "config.json.tmp"
    tmp.write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, folder / "config.json")
