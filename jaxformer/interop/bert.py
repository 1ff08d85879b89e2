"""BERT, RoBERTa and XLM-RoBERTa (``bert``, ``roberta``, ``xlm-roberta``): config and tensor rules, both
directions. XLM-R is RoBERTa's architecture under its own model_type (a 250K-token vocabulary); a model loaded
from one is written back as the same. RoBERTa's sequence-classification head (dense, tanh, out_proj on <s>)
is BERT's pooler and classifier under other names."""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, attention, copy, dense,
                                     labels_from_hf, labels_to_hf, linear, norm, refuse)

_HEADS = {"Model": "none", "ForMaskedLM": "mlm", "ForPreTraining": "pretraining",
          "ForSequenceClassification": "sequence_classification", "ForTokenClassification": "token_classification",
          "ForQuestionAnswering": "question_answering"}
STEMS = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta"}
ROBERTA = ("roberta", "xlm-roberta")  # positions counted from the pad id, no NSP head
CLASSES = {model_type: tuple(f"{stem}{suffix}" for suffix in _HEADS
                             if not (model_type in ROBERTA and suffix == "ForPreTraining"))
           for model_type, stem in STEMS.items()}
# What a file that leaves these out means: the config classes' defaults.
_ROBERTA_DEFAULTS = dict(max_position_embeddings=512, pad_token_id=1, bos_token_id=0, eos_token_id=2)
DEFAULTS = {"bert": dict(max_position_embeddings=512, pad_token_id=0), "roberta": _ROBERTA_DEFAULTS,
            "xlm-roberta": _ROBERTA_DEFAULTS}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(hf.get("is_decoder", False) or hf.get("add_cross_attention", False),
           f"{model_type}: decoder/cross-attention variants are not supported")
    refuse(hf.get("position_embedding_type", "absolute") != "absolute",
           f"{model_type}: position_embedding_type={hf.get('position_embedding_type')!r} is not supported")
    roberta = model_type in ROBERTA
    offset = hf["pad_token_id"] + 1 if roberta else 0
    head = _HEADS[arch.removeprefix(STEMS[model_type])]
    # A base model has a pooler when its file does (add_pooling_layer is not in config.json).
    pooler = head in ("pretraining", "sequence_classification") or (
        head == "none" and (not tensor_names or any(n.endswith("pooler.dense.weight") for n in tensor_names)))
    num_labels, label_names = labels_from_hf(hf)
    return dict(family="encoder", d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                norm_position="post", norm_eps=hf.get("layer_norm_eps", 1e-12), embedding_norm=True,
                final_norm=False, activation=activation(hf.get("hidden_act", "gelu"), False, model_type),
                position="learned", max_positions=hf["max_position_embeddings"] - offset,
                position_offset=offset, pad_aware_positions=roberta,
                type_vocab_size=hf.get("type_vocab_size", 2), attention="bidirectional", head=head,
                pooler=pooler, num_labels=num_labels, label_names=label_names,
                dropout_rate=hf.get("hidden_dropout_prob", 0.1),
                attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
                tie_embeddings=hf.get("tie_word_embeddings", True))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
               num_hidden_layers=cfg.encoder_layers, layer_norm_eps=cfg.norms.eps,
               hidden_act=INVERSE_ACTIVATIONS[cfg.activation],
               max_position_embeddings=cfg.max_positions + cfg.embeddings.position_offset,
               type_vocab_size=cfg.embeddings.types, hidden_dropout_prob=cfg.dropout_rate,
               attention_probs_dropout_prob=cfg.attention_dropout_rate, tie_word_embeddings=cfg.embeddings.tie)
    labels_to_hf(cfg, out)


def _norm_bias(cfg: ModelConfig) -> bool:
    return cfg.norms.kind == "layernorm" and cfg.norms.bias


def embedding_rules(cfg: ModelConfig, prefix: str) -> list[Rule]:
    """BERT's embedding tensors (ALBERT's and ELECTRA's too, at their embedding width)."""
    p = prefix
    out = [copy(("embed", "table"), f"{p}embeddings.word_embeddings.weight"),
           copy(("embeddings", "positions", "table"), f"{p}embeddings.position_embeddings.weight"),
           *norm(("embeddings", "norm"), f"{p}embeddings.LayerNorm", _norm_bias(cfg))]
    if cfg.embeddings.types:
        out.append(copy(("embeddings", "token_types", "table"), f"{p}embeddings.token_type_embeddings.weight"))
    return out


def layer_rules(cfg: ModelConfig, layer: str, stack: tuple[str, ...] = ("encoder", "blocks"),
                projections: tuple[str, str, str] = ("query", "key", "value")) -> list[Rule]:
    """One BERT layer's tensors under ``layer`` (holding ``{i}``) read into ``stack``, ELECTRA's and DeBERTa
    v2's too (whose ``attention.self`` names its projections query_proj, key_proj, value_proj)."""
    names = lambda kind: (f"{layer}.attention.self.{n}.{kind}" for n in projections)  # noqa: E731
    return [*attention(cfg, stack + ("attn",), *names("weight"), f"{layer}.attention.output.dense.weight",
                       *names("bias"), f"{layer}.attention.output.dense.bias"),
            *layer_tail_rules(cfg, layer, stack)]


def layer_tail_rules(cfg: ModelConfig, layer: str, stack: tuple[str, ...] = ("encoder", "blocks")) -> list[Rule]:
    """A BERT layer's tensors after its self-attention: the attention's output norm, the MLP, its norm."""
    ln = _norm_bias(cfg)
    return [*norm(stack + ("attn_norm",), f"{layer}.attention.output.LayerNorm", ln),
            linear(stack + ("mlp", "wi"), f"{layer}.intermediate.dense.weight"),
            copy(stack + ("mlp", "bi"), f"{layer}.intermediate.dense.bias"),
            linear(stack + ("mlp", "wo"), f"{layer}.output.dense.weight"),
            copy(stack + ("mlp", "bo"), f"{layer}.output.dense.bias"),
            *norm(stack + ("mlp_norm",), f"{layer}.output.LayerNorm", ln)]


def mlm_head_rules(cfg: ModelConfig, transform: str, layer_norm: str, bias: str | None, decoder: str,
                   table: str) -> tuple[list[Rule], dict[str, str]]:
    """A BERT-style MLM head's tensors (ALBERT's, DistilBERT's, ELECTRA's generator's, ModernBERT's): the
    transform's dense layer and norm, the output bias (None: none), the output weights ``decoder``, tied to the
    token table ``table`` (an alias) or its own."""
    out = [*dense(("mlm", "transform"), transform, cfg.head_options.dense_bias),
           *norm(("mlm", "norm"), layer_norm, _norm_bias(cfg))]
    if bias is not None:
        out.append(copy(("mlm", "bias"), bias))
    if cfg.embeddings.tie:
        return out, {decoder: table}
    return out + [linear(("mlm", "decoder", "kernel"), decoder)], {}


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p = prefix
    out = embedding_rules(cfg, p) + layer_rules(cfg, f"{p}encoder.layer.{{i}}")
    roberta_classifier = model_type in ROBERTA and cfg.head == "sequence_classification"
    # RoBERTa's classification head holds the pooler's dense layer (tanh after it, as BERT's)
    if cfg.head_options.pooler:
        out += dense(("pooler",), "classifier.dense" if roberta_classifier else f"{p}pooler.dense")
    aliases = {}
    if cfg.head in ("mlm", "pretraining"):
        bert = model_type == "bert"
        head = "cls.predictions" if bert else "lm_head"
        transform = f"{head}.transform.dense" if bert else f"{head}.dense"
        head_norm = f"{head}.transform.LayerNorm" if bert else f"{head}.layer_norm"
        head_rules, aliases = mlm_head_rules(cfg, transform, head_norm, f"{head}.bias", f"{head}.decoder.weight",
                                             f"{p}embeddings.word_embeddings.weight")
        out += head_rules
        aliases[f"{head}.decoder.bias"] = f"{head}.bias"
    if cfg.head == "pretraining":
        out += dense(("nsp",), "cls.seq_relationship")
    if cfg.head in ("sequence_classification", "token_classification"):
        out += dense(("classifier",), "classifier.out_proj" if roberta_classifier else "classifier")
    if cfg.head == "question_answering":
        out += dense(("classifier",), "qa_outputs")
    return out, aliases


ARCHITECTURE = Architecture(CLASSES, {"bert": "bert.", "roberta": "roberta.", "xlm-roberta": "roberta."},
                            ("BertModel", "RobertaModel", "XLMRobertaModel"), config_from_hf, config_to_hf,
                            rules, only_as_loaded=("xlm-roberta",), harmless=dict.fromkeys(
                                ("directionality", "pooler_fc_size", "pooler_num_attention_heads",
                                 "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type"),
                                "the original TensorFlow release's settings, which transformers' BERT never reads"),
                            defaults=DEFAULTS)
