"""DeBERTa (``deberta``: v1) and DeBERTa-v2 (``deberta-v2``: v2 and v3): config and tensor rules, both directions.

BERT's post-norm encoder whose attention adds disentangled relative-position terms (``position='disentangled'``,
``layers.attention.DisentangledAttention``): a table of relative-position embeddings (``encoder.rel_embeddings``)
projected per layer, scored against the query's content (c2p) and the key's (p2c) as ``pos_att_type`` lists.
The two model types differ in how they write it:
- v1: one fused ``in_proj`` [3 x heads x head_dim, D] without bias, its rows per head (query, key, value of head
  0, then of head 1, ...), separate ``q_bias`` and ``v_bias`` (the key has none, nor has the c2p projection
  ``pos_proj``; the p2c one, ``pos_q_proj``, has one); exact distances up to ``max_relative_positions``.
- v2/v3: ``query_proj``, ``key_proj``, ``value_proj`` with biases; log-bucketed distances (``position_buckets``),
  the positions projected by the layer's own query and key (``share_att_key``) or by ``pos_key_proj`` and
  ``pos_query_proj``, a LayerNorm over the table (``norm_rel_ebd``), and a convolution beside the first layer
  (``conv_kernel_size``: v2 xlarge and xxlarge; ``layers.convolution``).
Heads: the MLM head under ``cls.predictions`` (transformers' ``legacy=True``, BERT's names) or
``lm_predictions.lm_head`` (``legacy=False``: the head of DeBERTa's enhanced mask decoder, the same numbers; a
file is written back under the names it came with: ``mlm_head_legacy``); sequence classification (the
``pooler`` dense layer and ``pooler_hidden_act`` on the first token, then ``classifier``); token classification;
question answering. transformers runs no enhanced-mask-decoder steps (its ``z_steps`` is always 0), so neither
does jaxformer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.bert import layer_rules, layer_tail_rules, mlm_head_rules
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, bias_heads, copy, dense,
                                     heads_in, heads_out, labels_from_hf, labels_to_hf, norm, refuse)

_HEADS = {"Model": "none", "ForMaskedLM": "mlm", "ForSequenceClassification": "sequence_classification",
          "ForTokenClassification": "token_classification", "ForQuestionAnswering": "question_answering"}
STEMS = {"deberta": "Deberta", "deberta-v2": "DebertaV2"}
CLASSES = {model_type: tuple(f"{stem}{suffix}" for suffix in _HEADS) for model_type, stem in STEMS.items()}
# DebertaConfig's and DebertaV2Config's defaults, for the keys a file may leave out
_COMMON = dict(hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
               max_position_embeddings=512, type_vocab_size=0, layer_norm_eps=1e-7, relative_attention=False,
               max_relative_positions=-1, pad_token_id=0, position_biased_input=True, pos_att_type=None,
               pooler_hidden_act="gelu", legacy=True, tie_word_embeddings=True)
DEFAULTS = {"deberta": dict(_COMMON, vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072),
            "deberta-v2": dict(_COMMON, vocab_size=128100, hidden_size=1536, num_hidden_layers=24,
                               num_attention_heads=24, intermediate_size=6144)}
# transformers' names of the convolution's and the pooler's activations (ACT2FN) -> jaxformer's
_ACTIVATIONS = {"tanh": "tanh", "relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "silu": "silu", "swish": "silu"}
_INVERSE = {"tanh": "tanh", "relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu"}


def _listed(value, separator: str = "|") -> list[str]:
    """``pos_att_type`` or ``norm_rel_ebd``: a list, or one string of '|'-separated names, as transformers reads it."""
    if value is None:
        return []
    return [x.strip() for x in value.lower().split(separator)] if isinstance(value, str) else list(value)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    v2 = model_type == "deberta-v2"
    D, N = hf["hidden_size"], hf["num_attention_heads"]
    refuse(not hf["relative_attention"], f"{model_type}: relative_attention=False (no disentangled attention) is not "
           "supported: every published DeBERTa has it, and without it the model is BERT with another scale")
    terms = tuple(_listed(hf["pos_att_type"]))
    refuse(not terms or len(set(terms)) != len(terms) or not set(terms) <= {"c2p", "p2c"},
           f"{model_type}: pos_att_type={hf['pos_att_type']!r}: supported are 'c2p', 'p2c' or both")
    refuse(hf.get("embedding_size", D) != D,
           f"{model_type}: embedding_size={hf.get('embedding_size')} != hidden_size={D} (a projected embedding, "
           "normed after the projection) is not supported")
    refuse(hf.get("pooler_hidden_size", D) != D,
           f"{model_type}: pooler_hidden_size={hf.get('pooler_hidden_size')} != hidden_size={D} is not supported")
    refuse(not hf["tie_word_embeddings"], f"{model_type}: tie_word_embeddings=False is not supported (the enhanced "
           "mask decoder's head always reads the token table)")
    pooler_act = hf["pooler_hidden_act"]
    refuse(_ACTIVATIONS.get(pooler_act) not in ("tanh", "relu", "gelu"),
           f"{model_type}: pooler_hidden_act={pooler_act!r} is not supported; supported: tanh, relu, gelu")
    max_relative = hf["max_relative_positions"]
    fields: dict[str, Any] = {}
    if v2:
        refuse(hf.get("attention_head_size", D // N) * N != D,
               f"{model_type}: attention_head_size={hf.get('attention_head_size')} x {N} heads != hidden_size={D} "
               "(transformers' output projection is hidden_size wide)")
        rel_norm = _listed(hf.get("norm_rel_ebd", "none"))
        refuse(not set(rel_norm) <= {"none", "layer_norm"}, f"{model_type}: norm_rel_ebd={hf.get('norm_rel_ebd')!r} is "
               "not supported; supported: 'none', 'layer_norm'")
        conv_act = hf.get("conv_act", "tanh")
        refuse(conv_act not in _ACTIVATIONS, f"{model_type}: conv_act={conv_act!r} is not supported; supported: "
               f"{sorted(_ACTIVATIONS)}")
        fields.update(position_buckets=max(hf.get("position_buckets", -1), 0),
                      share_attention_key=hf.get("share_att_key", False),
                      relative_embedding_norm="layer_norm" in rel_norm, conv_kernel_size=hf.get("conv_kernel_size", 0),
                      conv_groups=hf.get("conv_groups", 1), conv_activation=_ACTIVATIONS[conv_act])
    else:
        refuse(hf.get("talking_head", False), f"{model_type}: talking_head=True (heads mixed before and after the "
               "softmax) is not supported")
    head = _HEADS[arch.removeprefix(STEMS[model_type])]
    num_labels, label_names = labels_from_hf(hf)
    return dict(family="encoder", d_model=D, num_heads=N, d_ff=hf["intermediate_size"],
                encoder_layers=hf["num_hidden_layers"], decoder_layers=0, norm_position="post",
                norm_eps=hf["layer_norm_eps"], embedding_norm=True, final_norm=False,
                activation=activation(hf["hidden_act"], False, model_type), position="disentangled",
                disentangled_terms=terms, max_relative_positions=max(max_relative, 0),
                position_biased_input=hf["position_biased_input"], key_bias=v2,
                max_positions=hf["max_position_embeddings"], type_vocab_size=hf["type_vocab_size"],
                attention="bidirectional", head=head, pooler=head == "sequence_classification",
                pooler_activation=_ACTIVATIONS[pooler_act], mlm_head_legacy=hf["legacy"], num_labels=num_labels,
                label_names=label_names, dropout_rate=hf["hidden_dropout_prob"],
                attention_dropout_rate=hf["attention_probs_dropout_prob"], tie_embeddings=True, **fields)


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
               num_hidden_layers=cfg.encoder_layers, hidden_act=INVERSE_ACTIVATIONS[cfg.activation],
               layer_norm_eps=cfg.norms.eps, max_position_embeddings=cfg.max_positions,
               type_vocab_size=cfg.embeddings.types, relative_attention=True,
               max_relative_positions=cfg.disentangled.max_relative_positions or -1,
               position_biased_input=cfg.disentangled.absolute_input,
               pos_att_type=list(cfg.disentangled.terms), pooler_hidden_size=cfg.d_model,
               pooler_hidden_act=_INVERSE[cfg.head_options.pooler_activation], legacy=cfg.head_options.mlm_legacy,
               hidden_dropout_prob=cfg.dropout_rate, attention_probs_dropout_prob=cfg.attention_dropout_rate,
               tie_word_embeddings=True)
    if model_type == "deberta-v2":
        flat = cfg.to_flat()  # no convolution: the file's kernel size 0, its groups and activation the defaults
        out.update(position_buckets=cfg.disentangled.buckets or -1, share_att_key=cfg.disentangled.share_key,
                   norm_rel_ebd="layer_norm" if cfg.disentangled.norm_table else "none",
                   conv_kernel_size=flat["conv_kernel_size"], conv_groups=flat["conv_groups"],
                   conv_act=_INVERSE[flat["conv_activation"]])
    labels_to_hf(cfg, out)


def _fused_qkv(stack: tuple[str, ...], name: str, heads: int, head_dim: int) -> Rule:
    """v1's ``in_proj`` [heads x 3 x head_dim, D] (each head's query, key and value rows together) <-> the
    q, k, v kernels [D, N, H]."""
    def load(t):
        w = t[0].reshape(heads, 3, head_dim, -1)
        return [w[:, j].transpose(2, 0, 1) for j in range(3)]

    def save(p):
        return [np.stack([k.transpose(1, 2, 0) for k in p], axis=1).reshape(-1, p[0].shape[0])]

    return Rule(tuple(stack + ("attn", n) for n in ("q", "k", "v")), (name,), load, save)


def _layer_rules(cfg: ModelConfig, model_type: str, layer: str, stack: tuple[str, ...]) -> list[Rule]:
    """One layer's tensors: v2's BERT-like projections or v1's fused one, and the position projections."""
    N, H, A = cfg.num_heads, cfg.head_dim_, stack + ("attn",)
    own = f"{layer}.attention.self"
    if model_type == "deberta-v2":
        out = layer_rules(cfg, layer, stack, ("query_proj", "key_proj", "value_proj"))
        position = {"c2p": ("pos_k", "pos_key_proj"), "p2c": ("pos_q", "pos_query_proj")}
    else:
        out = [_fused_qkv(stack, f"{own}.in_proj.weight", N, H),
               bias_heads(A + ("q_bias",), f"{own}.q_bias", N, H), bias_heads(A + ("v_bias",), f"{own}.v_bias", N, H),
               heads_out(A + ("o",), f"{layer}.attention.output.dense.weight", N, H),
               copy(A + ("o_bias",), f"{layer}.attention.output.dense.bias"), *layer_tail_rules(cfg, layer, stack)]
        position = {"c2p": ("pos_k", "pos_proj"), "p2c": ("pos_q", "pos_q_proj")}
    if not cfg.disentangled.share_key:
        for term in cfg.disentangled.terms:
            path, name = position[term]
            out.append(heads_in(A + (path,), f"{own}.{name}.weight", N, H))
            if term == "p2c" or cfg.biases.key:  # v1's c2p projection has no bias
                out.append(bias_heads(A + (f"{path}_bias",), f"{own}.{name}.bias", N, H))
    return out


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    out = [copy(("embed", "table"), f"{p}embeddings.word_embeddings.weight"),
           *norm(("embeddings", "norm"), f"{p}embeddings.LayerNorm", True),
           copy(("encoder", "relative_embeddings", "table"), f"{p}encoder.rel_embeddings.weight")]
    if cfg.disentangled.absolute_input:
        out.append(copy(("embeddings", "positions", "table"), f"{p}embeddings.position_embeddings.weight"))
    if cfg.embeddings.types:
        out.append(copy(("embeddings", "token_types", "table"), f"{p}embeddings.token_type_embeddings.weight"))
    if cfg.disentangled.norm_table:
        out += norm(("encoder", "relative_embeddings", "norm"), f"{p}encoder.LayerNorm", True)
    layer = f"{p}encoder.layer.{{i}}"
    if cfg.conv is not None:  # the first layer is a stack of its own, the convolution after it
        out += [rule.at_layers((0,)) for rule in _layer_rules(cfg, model_type, layer, ("encoder", "first_block"))]
        out += [rule.at_layers(range(1, cfg.encoder_layers))
                for rule in _layer_rules(cfg, model_type, layer, ("encoder", "blocks"))]
        out += [Rule((("encoder", "conv", "kernel"),), (f"{p}encoder.conv.conv.weight",),
                     lambda t: [t[0].transpose(2, 1, 0)], lambda k: [k[0].transpose(2, 1, 0)]),
                copy(("encoder", "conv", "bias"), f"{p}encoder.conv.conv.bias"),
                *norm(("encoder", "conv", "norm"), f"{p}encoder.conv.LayerNorm", True)]
    else:
        out += _layer_rules(cfg, model_type, layer, ("encoder", "blocks"))
    aliases: dict[str, str] = {}
    if cfg.head == "mlm" and cfg.head_options.mlm_legacy:  # BERT's names, the decoder tied to the token table
        head_rules, aliases = mlm_head_rules(cfg, "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                                             "cls.predictions.bias", "cls.predictions.decoder.weight",
                                             f"{p}embeddings.word_embeddings.weight")
        out += head_rules
        aliases["cls.predictions.decoder.bias"] = "cls.predictions.bias"
    elif cfg.head == "mlm":  # the enhanced mask decoder's head reads the token table itself: no decoder tensor
        out += [*dense(("mlm", "transform"), "lm_predictions.lm_head.dense"),
                *norm(("mlm", "norm"), "lm_predictions.lm_head.LayerNorm", True),
                copy(("mlm", "bias"), "lm_predictions.lm_head.bias")]
    if cfg.head == "sequence_classification":
        out += [*dense(("pooler",), "pooler.dense"), *dense(("classifier",), "classifier")]
    if cfg.head == "token_classification":
        out += dense(("classifier",), "classifier")
    if cfg.head == "question_answering":
        out += dense(("classifier",), "qa_outputs")
    return out, aliases


def ignored(hf: dict, names: set[str]) -> tuple[set[str], str]:
    """Tensors transformers' DeBERTa classes never read: an absolute position table the model does not add
    (``position_biased_input`` false; the published checkpoints carry one, which transformers skips), DeBERTa-v3's
    replaced-token-detection head (``mask_predictions``: no transformers class holds it), and an MLM head in a
    file read as another class (the pretraining head of a checkpoint fine-tuning starts from)."""
    skipped = {n for n in names if n.startswith("mask_predictions.")}
    if not hf.get("position_biased_input", True):
        skipped |= {n for n in names if n.endswith("embeddings.position_embeddings.weight")}
    arch = (hf.get("architectures") or [""])[0]
    if not arch.endswith("ForMaskedLM"):
        skipped |= {n for n in names if n.startswith(("lm_predictions.", "cls.predictions."))}
    note = (f"{len(skipped)} tensors transformers' DeBERTa does not read are skipped (absolute positions it does not "
            f"add, the pretraining heads of another class): {sorted(skipped)[:8]}")
    return skipped, note


ARCHITECTURE = Architecture(CLASSES, {"deberta": "deberta.", "deberta-v2": "deberta."},
                            ("DebertaModel", "DebertaV2Model"), config_from_hf, config_to_hf, rules,
                            ignored=ignored, defaults=DEFAULTS, harmless={
                                **dict.fromkeys(("pooler_dropout", "cls_dropout"),
                                                "the heads' training-time dropout, not modelled (no effect in "
                                                "evaluation)"),
                                "z_steps": "the enhanced mask decoder's extra steps, which transformers' DeBERTa "
                                           "never runs (its z_steps is always 0)",
                                # (DeBERTa-v2 reads it, and refuses a size other than hidden_size / heads)
                                "attention_head_size": "v1 computes the head size from hidden_size and the heads "
                                                       "alone"})
