"""DistilBERT (``distilbert``): config and tensor rules, both directions.

BERT's post-norm block distilled to six layers: no token types, every LayerNorm at eps 1e-12 whatever the
file, its own tensor names (``q_lin``, ``sa_layer_norm``, ``ffn.lin1``, ...), an MLM head of BERT's shape
(``vocab_transform``, ``vocab_layer_norm``, ``vocab_projector``) and a sequence classifier that reads the
first token through ``pre_classifier`` and a ReLU (``pooler_activation='relu'``) instead of BERT's tanh
pooler. ``sinusoidal_pos_embds`` files hold their sinusoid table as the position weights, so it loads as it
is (transformers keeps it frozen in training, which jaxformer does not model).
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.bert import mlm_head_rules
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, attention, copy, dense,
                                     labels_from_hf, labels_to_hf, linear, norm)

_HEADS = {"Model": "none", "ForMaskedLM": "mlm", "ForSequenceClassification": "sequence_classification",
          "ForTokenClassification": "token_classification", "ForQuestionAnswering": "question_answering"}
CLASSES = {"distilbert": tuple(f"DistilBert{suffix}" for suffix in _HEADS)}
DEFAULTS = {"distilbert": dict(vocab_size=30522, max_position_embeddings=512, sinusoidal_pos_embds=False, n_layers=6,
                               n_heads=12, dim=768, hidden_dim=3072, dropout=0.1, attention_dropout=0.1,
                               activation="gelu", qa_dropout=0.1, seq_classif_dropout=0.2, pad_token_id=0,
                               tie_word_embeddings=True)}
EPS = 1e-12  # every DistilBERT LayerNorm's, fixed in its modeling code


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    head = _HEADS[arch.removeprefix("DistilBert")]
    hf.get("sinusoidal_pos_embds")  # read: the table is in the file either way (see the module docstring)
    num_labels, label_names = labels_from_hf(hf)
    return dict(family="encoder", d_model=hf["dim"], num_heads=hf["n_heads"], d_ff=hf["hidden_dim"],
                encoder_layers=hf["n_layers"], decoder_layers=0, norm_position="post", norm_eps=EPS,
                embedding_norm=True, final_norm=False, activation=activation(hf["activation"], False, model_type),
                position="learned", max_positions=hf["max_position_embeddings"], type_vocab_size=0,
                attention="bidirectional", head=head, pooler=head == "sequence_classification",
                pooler_activation="relu", num_labels=num_labels, label_names=label_names,
                dropout_rate=float(hf["dropout"]), attention_dropout_rate=float(hf["attention_dropout"]),
                tie_embeddings=hf["tie_word_embeddings"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(dim=cfg.d_model, n_heads=cfg.num_heads, hidden_dim=cfg.d_ff, n_layers=cfg.encoder_layers,
               activation=INVERSE_ACTIVATIONS[cfg.activation], max_position_embeddings=cfg.max_positions,
               dropout=cfg.dropout_rate, attention_dropout=cfg.attention_dropout_rate,
               tie_word_embeddings=cfg.embeddings.tie, sinusoidal_pos_embds=False)
    labels_to_hf(cfg, out)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("encoder", "blocks")
    layer = f"{p}transformer.layer.{{i}}"
    a = f"{layer}.attention"
    out = [copy(("embed", "table"), f"{p}embeddings.word_embeddings.weight"),
           copy(("embeddings", "positions", "table"), f"{p}embeddings.position_embeddings.weight"),
           *norm(("embeddings", "norm"), f"{p}embeddings.LayerNorm", True),
           *attention(cfg, L + ("attn",), *(f"{a}.{n}_lin.weight" for n in ("q", "k", "v", "out")),
                      *(f"{a}.{n}_lin.bias" for n in ("q", "k", "v", "out"))),
           *norm(L + ("attn_norm",), f"{layer}.sa_layer_norm", True),
           linear(L + ("mlp", "wi"), f"{layer}.ffn.lin1.weight"), copy(L + ("mlp", "bi"), f"{layer}.ffn.lin1.bias"),
           linear(L + ("mlp", "wo"), f"{layer}.ffn.lin2.weight"), copy(L + ("mlp", "bo"), f"{layer}.ffn.lin2.bias"),
           *norm(L + ("mlp_norm",), f"{layer}.output_layer_norm", True)]
    aliases = {}
    if cfg.head == "mlm":
        head_rules, aliases = mlm_head_rules(cfg, "vocab_transform", "vocab_layer_norm", "vocab_projector.bias",
                                             "vocab_projector.weight", f"{p}embeddings.word_embeddings.weight")
        out += head_rules
    if cfg.head == "sequence_classification":
        out += [*dense(("pooler",), "pre_classifier"), *dense(("classifier",), "classifier")]
    if cfg.head == "token_classification":
        out += dense(("classifier",), "classifier")
    if cfg.head == "question_answering":
        out += dense(("classifier",), "qa_outputs")
    return out, aliases


ARCHITECTURE = Architecture(CLASSES, {"distilbert": "distilbert."}, ("DistilBertModel",), config_from_hf,
                            config_to_hf, rules, defaults=DEFAULTS, harmless={
                                **dict.fromkeys(("qa_dropout", "seq_classif_dropout"),
                                                "the heads' training-time dropout, not modelled (no effect in "
                                                "evaluation)"),
                                "tie_weights_": "an older transformers' spelling; the tensors say whether the head "
                                                "is tied"})
