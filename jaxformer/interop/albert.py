"""ALBERT (``albert``): config and tensor rules, both directions.

BERT's post-norm encoder with two savings: factorised embeddings (the tables and their LayerNorm are
``embedding_size`` wide; ``embedding_hidden_mapping_in`` always projects them to the hidden size, even when the
widths are equal) and one layer's weights shared by every layer (``shared_layers``: the stack holds one layer and
applies it ``num_hidden_layers`` times). Its tensor names: ``albert_layer_groups.0.albert_layers.0``'s
``attention.{query,key,value,dense,LayerNorm}``, ``ffn``, ``ffn_output``, ``full_layer_layer_norm``. Heads: BERT's
tanh pooler (``albert.pooler``), the MLM head at the embedding width (``predictions``), sentence-order prediction
(``sop_classifier.classifier``, on the pooled output: jaxformer's ``pretraining`` head, trained by the ``sop``
objective). Files with more than one layer group or more than one layer per group (none published) are refused.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.bert import embedding_rules, mlm_head_rules
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, attention, copy, dense,
                                     labels_from_hf, labels_to_hf, linear, norm, refuse)

_HEADS = {"Model": "none", "ForPreTraining": "pretraining", "ForMaskedLM": "mlm",
          "ForSequenceClassification": "sequence_classification", "ForTokenClassification": "token_classification",
          "ForQuestionAnswering": "question_answering"}
CLASSES = {"albert": tuple(f"Albert{suffix}" for suffix in _HEADS)}
# AlbertConfig's defaults, for the keys a file may leave out
DEFAULTS = {"albert": dict(vocab_size=30000, embedding_size=128, hidden_size=4096, num_hidden_layers=12,
                           num_hidden_groups=1, num_attention_heads=64, intermediate_size=16384, inner_group_num=1,
                           hidden_act="gelu_new", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                           max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0,
                           bos_token_id=2, eos_token_id=3, tie_word_embeddings=True)}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(hf["num_hidden_groups"] != 1 or hf["inner_group_num"] != 1,
           f"albert: num_hidden_groups={hf['num_hidden_groups']} and inner_group_num={hf['inner_group_num']}: only "
           "one group of one shared layer (every published ALBERT) is supported")
    refuse(hf.get("position_embedding_type", "absolute") != "absolute",
           f"albert: position_embedding_type={hf.get('position_embedding_type')!r} is not supported")
    refuse(hf["embedding_size"] is None, "albert: embedding_size is null; ALBERT's embeddings always have a width, "
           "projected to hidden_size")
    head = _HEADS[arch.removeprefix("Albert")]
    # AlbertModel's pooler: always in the pretraining and sequence-classification classes, in a saved base model
    # when its file has one (add_pooling_layer is not in config.json)
    pooler = head in ("pretraining", "sequence_classification") or (
        head == "none" and (not tensor_names or any(n.endswith("pooler.weight") for n in tensor_names)))
    refuse(head == "pretraining" and hf.get("num_labels", 2) != 2,
           "albert: AlbertForPreTraining's sentence-order head has num_labels outputs; only 2 (in order, swapped) "
           "is supported")
    num_labels, label_names = labels_from_hf(hf)
    return dict(family="encoder", d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                norm_position="post", norm_eps=hf["layer_norm_eps"], embedding_norm=True, final_norm=False,
                activation=activation(hf["hidden_act"], False, model_type), position="learned",
                max_positions=hf["max_position_embeddings"], type_vocab_size=hf["type_vocab_size"],
                attention="bidirectional", head=head, embedding_size=hf["embedding_size"], shared_layers=True,
                pooler=pooler, num_labels=num_labels, label_names=label_names,
                dropout_rate=hf["hidden_dropout_prob"], attention_dropout_rate=hf["attention_probs_dropout_prob"],
                tie_embeddings=hf["tie_word_embeddings"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, embedding_size=cfg.embeddings.width, num_attention_heads=cfg.num_heads,
               intermediate_size=cfg.d_ff, num_hidden_layers=cfg.encoder_layers, num_hidden_groups=1,
               inner_group_num=1, layer_norm_eps=cfg.norms.eps, hidden_act=INVERSE_ACTIVATIONS[cfg.activation],
               max_position_embeddings=cfg.max_positions, type_vocab_size=cfg.embeddings.types,
               hidden_dropout_prob=cfg.dropout_rate, attention_probs_dropout_prob=cfg.attention_dropout_rate,
               tie_word_embeddings=cfg.embeddings.tie)
    labels_to_hf(cfg, out)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("encoder", "blocks")
    # the one shared layer: HF's group 0 read into a stack of one layer
    layer = f"{p}encoder.albert_layer_groups.{{i}}.albert_layers.0"
    a = f"{layer}.attention"
    shared = [*attention(cfg, L + ("attn",), *(f"{a}.{n}.weight" for n in ("query", "key", "value", "dense")),
                         *(f"{a}.{n}.bias" for n in ("query", "key", "value", "dense"))),
              *norm(L + ("attn_norm",), f"{a}.LayerNorm", True),
              linear(L + ("mlp", "wi"), f"{layer}.ffn.weight"), copy(L + ("mlp", "bi"), f"{layer}.ffn.bias"),
              linear(L + ("mlp", "wo"), f"{layer}.ffn_output.weight"),
              copy(L + ("mlp", "bo"), f"{layer}.ffn_output.bias"),
              *norm(L + ("mlp_norm",), f"{layer}.full_layer_layer_norm", True)]
    out = [*embedding_rules(cfg, p), *dense(("embeddings", "project"), f"{p}encoder.embedding_hidden_mapping_in"),
           *(rule.at_layers((0,)) for rule in shared)]
    if cfg.head_options.pooler:
        out += dense(("pooler",), f"{p}pooler")
    aliases = {}
    if cfg.head in ("mlm", "pretraining"):
        head_rules, aliases = mlm_head_rules(cfg, "predictions.dense", "predictions.LayerNorm", "predictions.bias",
                                             "predictions.decoder.weight", f"{p}embeddings.word_embeddings.weight")
        out += head_rules
        aliases["predictions.decoder.bias"] = "predictions.bias"
    if cfg.head == "pretraining":
        out += dense(("nsp",), "sop_classifier.classifier")
    if cfg.head in ("sequence_classification", "token_classification"):
        out += dense(("classifier",), "classifier")
    if cfg.head == "question_answering":
        out += dense(("classifier",), "qa_outputs")
    return out, aliases


ARCHITECTURE = Architecture(CLASSES, {"albert": "albert."}, ("AlbertModel",), config_from_hf, config_to_hf,
                            rules, defaults=DEFAULTS, harmless={
                                **dict.fromkeys(("down_scale_factor", "gap_size", "net_structure_type",
                                                 "num_memory_blocks"),
                                                "the original TensorFlow release's settings, which transformers' "
                                                "ALBERT never reads"),
                                "classifier_dropout_prob": "the heads' training-time dropout, not modelled (no effect "
                                                           "in evaluation)"})
