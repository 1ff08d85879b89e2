"""ELECTRA (``electra``): config and tensor rules, both directions.

BERT's post-norm encoder with factorised embeddings: the tables and the embedding LayerNorm are
``embedding_size`` wide, and ``embeddings_project`` takes them to the hidden size when the two differ (the
discriminators of the published base and large models have none). Its heads:
- ``ElectraForPreTraining``, the discriminator: dense, ``hidden_act``, one logit per token (``head='discriminator'``);
- ``ElectraForMaskedLM``, the generator: dense to the embedding width, exact gelu (whatever ``hidden_act``),
  LayerNorm, the tied output projection with its own bias (BERT's MLM head at the embedding width);
- ``ElectraForSequenceClassification``: dense, exact gelu, out_proj on the first token (a pooler with
  ``pooler_activation='gelu'``; the extra training-time dropout before its dense layer is not modelled).
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.bert import embedding_rules, layer_rules, mlm_head_rules
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, dense, labels_from_hf,
                                     labels_to_hf, refuse)

_HEADS = {"Model": "none", "ForPreTraining": "discriminator", "ForMaskedLM": "mlm",
          "ForSequenceClassification": "sequence_classification", "ForTokenClassification": "token_classification",
          "ForQuestionAnswering": "question_answering"}
CLASSES = {"electra": tuple(f"Electra{suffix}" for suffix in _HEADS)}
# ElectraConfig's defaults, for the keys a file may leave out
DEFAULTS = {"electra": dict(vocab_size=30522, embedding_size=128, hidden_size=256, num_hidden_layers=12,
                            num_attention_heads=4, intermediate_size=1024, hidden_act="gelu", hidden_dropout_prob=0.1,
                            attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
                            layer_norm_eps=1e-12, pad_token_id=0, tie_word_embeddings=True)}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(hf.get("is_decoder", False) or hf.get("add_cross_attention", False),
           "electra: decoder/cross-attention variants are not supported")
    refuse(hf.get("position_embedding_type", "absolute") != "absolute",
           f"electra: position_embedding_type={hf.get('position_embedding_type')!r} is not supported")
    head = _HEADS[arch.removeprefix("Electra")]
    act = activation(hf["hidden_act"], False, model_type)
    # the generator's head and the classifier apply exact gelu whatever hidden_act says; the one activation
    # jaxformer's MLM head takes is the config's, so a generator with another hidden_act is refused
    refuse(head == "mlm" and act != "gelu",
           f"electra: a generator (ElectraForMaskedLM) with hidden_act={hf['hidden_act']!r} is not supported: its "
           "head applies gelu, its layers hidden_act")
    num_labels, label_names = labels_from_hf(hf)
    width = hf["embedding_size"]
    return dict(family="encoder", d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                norm_position="post", norm_eps=hf["layer_norm_eps"], embedding_norm=True, final_norm=False,
                activation=act, position="learned", max_positions=hf["max_position_embeddings"],
                type_vocab_size=hf["type_vocab_size"], attention="bidirectional", head=head,
                embedding_size=None if width == hf["hidden_size"] else width,
                pooler=head == "sequence_classification", pooler_activation="gelu", num_labels=num_labels,
                label_names=label_names, dropout_rate=hf["hidden_dropout_prob"],
                attention_dropout_rate=hf["attention_probs_dropout_prob"],
                tie_embeddings=hf["tie_word_embeddings"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, embedding_size=cfg.embeddings.width or cfg.d_model,
               num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.encoder_layers,
               layer_norm_eps=cfg.norms.eps, hidden_act=INVERSE_ACTIVATIONS[cfg.activation],
               max_position_embeddings=cfg.max_positions, type_vocab_size=cfg.embeddings.types,
               hidden_dropout_prob=cfg.dropout_rate, attention_probs_dropout_prob=cfg.attention_dropout_rate,
               tie_word_embeddings=cfg.embeddings.tie)
    labels_to_hf(cfg, out)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    out = embedding_rules(cfg, p) + layer_rules(cfg, f"{p}encoder.layer.{{i}}")
    if cfg.embeddings.width is not None:
        out += dense(("embeddings", "project"), f"{p}embeddings_project")
    aliases = {}
    if cfg.head == "discriminator":
        out += [*dense(("discriminator", "dense"), "discriminator_predictions.dense"),
                *dense(("discriminator", "prediction"), "discriminator_predictions.dense_prediction")]
    if cfg.head == "mlm":
        head_rules, aliases = mlm_head_rules(cfg, "generator_predictions.dense", "generator_predictions.LayerNorm",
                                             "generator_lm_head.bias", "generator_lm_head.weight",
                                             f"{p}embeddings.word_embeddings.weight")
        out += head_rules
    if cfg.head == "sequence_classification":
        out += [*dense(("pooler",), "classifier.dense"), *dense(("classifier",), "classifier.out_proj")]
    if cfg.head == "token_classification":
        out += dense(("classifier",), "classifier")
    if cfg.head == "question_answering":
        out += dense(("classifier",), "qa_outputs")
    return out, aliases


ARCHITECTURE = Architecture(CLASSES, {"electra": "electra."}, ("ElectraModel",), config_from_hf, config_to_hf,
                            rules, defaults=DEFAULTS, harmless={
                                **dict.fromkeys(("summary_type", "summary_use_proj", "summary_activation",
                                                 "summary_last_dropout"),
                                                "ElectraForMultipleChoice's sequence summary, a class jaxformer does "
                                                "not load"),
                                "generator_size": "the pretraining run's generator width (a fraction of this "
                                                  "model's), which transformers' ELECTRA never reads",
                                "classifier_dropout": "the heads' training-time dropout, not modelled (no effect in "
                                                      "evaluation)"})
