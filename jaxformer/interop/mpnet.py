"""MPNet (``mpnet``: MPNetModel, MPNetForMaskedLM, ...ForSequenceClassification, ...ForTokenClassification,
...ForQuestionAnswering): RoBERTa's post-norm encoder (learned positions counted from the pad id, no token
types, RoBERTa's MLM and classification heads) plus one T5-style relative position bias, 32 bidirectional
buckets up to distance 128, computed once between token indices and added in every layer. Config and tensor
rules, both directions.

Two constants of transformers' modeling are checked rather than read: MPNet's positions count from pad id 1
whatever ``pad_token_id`` says, and the bias always buckets into 32 (``relative_attention_num_buckets`` only
sizes its table); a file that differs is refused. sentence-transformers' all-mpnet-base-v2 names
MPNetForMaskedLM but holds MPNetModel's tensors (no head): it is read as the base model it holds."""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, attention, copy, dense,
                                     labels_from_hf, labels_to_hf, linear, norm, refuse)

_HEADS = {"MPNetModel": "none", "MPNetForMaskedLM": "mlm", "MPNetForSequenceClassification": "sequence_classification",
          "MPNetForTokenClassification": "token_classification", "MPNetForQuestionAnswering": "question_answering"}
CLASSES = {"mpnet": tuple(_HEADS)}
DEFAULTS = {"mpnet": dict(max_position_embeddings=512, pad_token_id=1, bos_token_id=0, eos_token_id=2)}
PADDING_IDX = 1  # MPNetEmbeddings' padding_idx, fixed in its code
BUCKETS, MAX_DISTANCE = 32, 128  # MPNetEncoder.compute_position_bias' defaults, the only ones it is called with


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(hf["pad_token_id"] != PADDING_IDX, f"mpnet: pad_token_id={hf['pad_token_id']} is not supported: MPNet's "
           f"modeling counts positions from id {PADDING_IDX} whatever the config says")
    table = hf.get("relative_attention_num_buckets", 32)
    refuse(table != BUCKETS, f"mpnet: relative_attention_num_buckets={table} is not supported: MPNet's modeling "
           f"buckets distances into {BUCKETS} whatever the table holds")
    head = _HEADS[arch]
    if head == "mlm" and tensor_names and not any(n.startswith("lm_head.") for n in tensor_names):
        head = "none"  # (all-mpnet-base-v2: MPNetModel's tensors under a MaskedLM config)
    act = hf.get("hidden_act", "gelu")
    refuse(head == "mlm" and act != "gelu", f"mpnet: hidden_act={act!r} with an MLM head is not supported: "
           "MPNet's head applies exact gelu whatever the layers use")
    # A base model has a pooler when its file does (add_pooling_layer is not in config.json).
    pooler = head == "sequence_classification" or (
        head == "none" and (not tensor_names or any(n.endswith("pooler.dense.weight") for n in tensor_names)))
    num_labels, label_names = labels_from_hf(hf)
    offset = PADDING_IDX + 1
    return dict(family="encoder", d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                norm_position="post", norm_eps=hf.get("layer_norm_eps", 1e-12), embedding_norm=True, final_norm=False,
                activation=activation(act, False, model_type), position="learned",
                max_positions=hf["max_position_embeddings"] - offset, position_offset=offset,
                pad_aware_positions=True, type_vocab_size=0, index_relative_bias=True, relative_buckets=BUCKETS,
                relative_max_distance=MAX_DISTANCE, attention="bidirectional", head=head, pooler=pooler,
                num_labels=num_labels, label_names=label_names, dropout_rate=hf.get("hidden_dropout_prob", 0.1),
                attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
                tie_embeddings=hf.get("tie_word_embeddings", True))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
               num_hidden_layers=cfg.encoder_layers, layer_norm_eps=cfg.norms.eps,
               hidden_act=INVERSE_ACTIVATIONS[cfg.activation],
               max_position_embeddings=cfg.max_positions + cfg.embeddings.position_offset,
               relative_attention_num_buckets=cfg.relative_bias.buckets, hidden_dropout_prob=cfg.dropout_rate,
               attention_probs_dropout_prob=cfg.attention_dropout_rate, tie_word_embeddings=cfg.embeddings.tie)
    labels_to_hf(cfg, out)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, stack = prefix, ("encoder", "blocks")
    layer = f"{p}encoder.layer.{{i}}"
    att = f"{layer}.attention.attn"
    out = [copy(("embed", "table"), f"{p}embeddings.word_embeddings.weight"),
           copy(("embeddings", "positions", "table"), f"{p}embeddings.position_embeddings.weight"),
           *norm(("embeddings", "norm"), f"{p}embeddings.LayerNorm", True),
           copy(("encoder", "relative_bias", "table"), f"{p}encoder.relative_attention_bias.weight"),
           *attention(cfg, stack + ("attn",), *(f"{att}.{n}.weight" for n in "qkvo"),
                      *(f"{att}.{n}.bias" for n in "qkvo")),
           *norm(stack + ("attn_norm",), f"{layer}.attention.LayerNorm", True),
           linear(stack + ("mlp", "wi"), f"{layer}.intermediate.dense.weight"),
           copy(stack + ("mlp", "bi"), f"{layer}.intermediate.dense.bias"),
           linear(stack + ("mlp", "wo"), f"{layer}.output.dense.weight"),
           copy(stack + ("mlp", "bo"), f"{layer}.output.dense.bias"),
           *norm(stack + ("mlp_norm",), f"{layer}.output.LayerNorm", True)]
    classifier = cfg.head == "sequence_classification"  # RoBERTa's: dense, tanh, out_proj on <s>
    if cfg.head_options.pooler:
        out += dense(("pooler",), "classifier.dense" if classifier else f"{p}pooler.dense")
    aliases = {}
    if cfg.head == "mlm":
        out += [*dense(("mlm", "transform"), "lm_head.dense"), *norm(("mlm", "norm"), "lm_head.layer_norm", True),
                copy(("mlm", "bias"), "lm_head.bias")]
        if cfg.embeddings.tie:
            aliases["lm_head.decoder.weight"] = f"{p}embeddings.word_embeddings.weight"
        else:
            out.append(linear(("mlm", "decoder", "kernel"), "lm_head.decoder.weight"))
        aliases["lm_head.decoder.bias"] = "lm_head.bias"
    if cfg.head in ("sequence_classification", "token_classification"):
        out += dense(("classifier",), "classifier.out_proj" if classifier else "classifier")
    if cfg.head == "question_answering":
        out += dense(("classifier",), "qa_outputs")
    return out, aliases


ARCHITECTURE = Architecture(CLASSES, {"mpnet": "mpnet."}, ("MPNetModel",), config_from_hf, config_to_hf,
                            rules, defaults=DEFAULTS)
