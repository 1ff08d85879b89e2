"""BigBird (``big_bird``: BigBirdModel and its MLM, pre-training, sequence, token and span heads): config and tensor
rules, both directions.

BERT's encoder (absolute positions, post-norm layers, BERT's pooler, MLM and NSP heads under ``bert.``) whose
self-attention is block-sparse on long inputs (jaxformer's 'block_sparse' mixer, ``sparse_block_size`` and
``sparse_random_blocks``): the input is cut into blocks, the first and last block attend to every token and every
token to them, each other block sees its neighbours and ``num_random_blocks`` random blocks. transformers draws
those only in training; in evaluation every random block is block 0, so block 0's keys count 1 + r times in those
softmaxes, and jaxformer writes that as one dense masked softmax with log(1 + r) on those keys. jaxformer trains with
that same pattern (transformers' training draws other blocks, seeded by the layer's index): training numbers are
not transformers'. Inputs of at most (5 + 2 r) blocks attend densely, as transformers switches to 'original_full'
there; transformers pads a longer input to a multiple of the block with masked tokens, which jaxformer needs not
(the padding is never seen: its keys are masked and its rows dropped), only the blocks are counted the same way.

The heads differ from BERT's: the sequence classifier is dense -> the model's activation -> out_proj on the first
token, beside the pooler (``classifier_transform``); the span head runs a post-norm feed-forward sublayer before
qa_outputs (``span_feed_forward``) and keeps the question out of the answer (``question_out_of_span``).
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop import bert
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, dense, labels_from_hf,
                                     labels_to_hf, norm, refuse)

_HEADS = {"Model": "none", "ForMaskedLM": "mlm", "ForPreTraining": "pretraining",
          "ForSequenceClassification": "sequence_classification", "ForTokenClassification": "token_classification",
          "ForQuestionAnswering": "question_answering"}
CLASSES = {"big_bird": tuple(f"BigBird{suffix}" for suffix in _HEADS)}
# BigBirdConfig's defaults, for the keys a file may leave out
DEFAULTS = {"big_bird": dict(vocab_size=50358, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                             intermediate_size=3072, hidden_act="gelu_new", hidden_dropout_prob=0.1,
                             attention_probs_dropout_prob=0.1, max_position_embeddings=4096, type_vocab_size=2,
                             layer_norm_eps=1e-12, pad_token_id=0, bos_token_id=1, eos_token_id=2, sep_token_id=66,
                             attention_type="block_sparse", use_bias=True, rescale_embeddings=False, block_size=64,
                             num_random_blocks=3, is_decoder=False, add_cross_attention=False,
                             tie_word_embeddings=True)}
# the base model of each head class holds a pooler (BigBirdModel's add_pooling_layer), except the span head's
_POOLED = ("none", "mlm", "pretraining", "sequence_classification", "token_classification")


def sparse_from_hf(hf: dict, model_type: str) -> dict[str, Any]:
    """``attention_type``, ``block_size`` and ``num_random_blocks`` as jaxformer's block-sparse settings (BigBird's and
    BigBird-Pegasus' encoder); 'original_full' attends densely whatever the blocks say."""
    kind, block, random_blocks = hf["attention_type"], hf["block_size"], hf["num_random_blocks"]
    refuse(kind not in ("block_sparse", "original_full"),
           f"{model_type}: attention_type={kind!r} must be 'block_sparse' or 'original_full'")
    refuse(isinstance(block, bool) or not isinstance(block, int) or block <= 0,
           f"{model_type}: block_size={block!r} must be a positive int")
    refuse(isinstance(random_blocks, bool) or not isinstance(random_blocks, int) or random_blocks < 0,
           f"{model_type}: num_random_blocks={random_blocks!r} must be an int >= 0")
    if kind == "original_full":
        return dict(sparse_block_size=None, sparse_random_blocks=0)
    return dict(sparse_block_size=block, sparse_random_blocks=random_blocks)


def sparse_to_hf(cfg: ModelConfig, out: dict) -> None:
    sparse = cfg.scores.sparse_block_size is not None
    out.update(attention_type="block_sparse" if sparse else "original_full",
               block_size=cfg.scores.sparse_block_size if sparse else out.get("block_size", 64),
               num_random_blocks=cfg.scores.sparse_random_blocks if sparse else out.get("num_random_blocks", 3))


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(hf["is_decoder"] or hf["add_cross_attention"],
           "big_bird: the decoder and cross-attention variants (BigBirdForCausalLM) are not supported")
    head = _HEADS[arch.removeprefix("BigBird")]
    pooler = any(n.endswith("pooler.weight") for n in tensor_names) if tensor_names else head in _POOLED
    num_labels, label_names = labels_from_hf(hf)
    return dict(family="encoder", d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                norm_position="post", norm_eps=hf["layer_norm_eps"], embedding_norm=True, final_norm=False,
                activation=activation(hf["hidden_act"], False, model_type), position="learned",
                max_positions=hf["max_position_embeddings"], position_offset=0,
                scale_embeddings=bool(hf["rescale_embeddings"]), type_vocab_size=hf["type_vocab_size"],
                attention="bidirectional", qkv_bias=bool(hf["use_bias"]), **sparse_from_hf(hf, model_type),
                sep_token_id=hf["sep_token_id"], head=head, pooler=pooler,
                classifier_transform=head == "sequence_classification",
                span_feed_forward=head == "question_answering", question_out_of_span=head == "question_answering",
                num_labels=2 if head == "question_answering" else num_labels, label_names=label_names,
                dropout_rate=hf["hidden_dropout_prob"], attention_dropout_rate=hf["attention_probs_dropout_prob"],
                tie_embeddings=hf["tie_word_embeddings"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
               num_hidden_layers=cfg.encoder_layers, layer_norm_eps=cfg.norms.eps,
               hidden_act=INVERSE_ACTIVATIONS[cfg.activation], max_position_embeddings=cfg.max_positions,
               rescale_embeddings=cfg.embeddings.scale, type_vocab_size=cfg.embeddings.types,
               use_bias=cfg.biases.qkv, sep_token_id=cfg.tokens.sep, hidden_dropout_prob=cfg.dropout_rate,
               attention_probs_dropout_prob=cfg.attention_dropout_rate, tie_word_embeddings=cfg.embeddings.tie,
               is_decoder=False, add_cross_attention=False)
    sparse_to_hf(cfg, out)
    labels_to_hf(cfg, out)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    """BERT's tensors under ``bert.`` (the pooler wherever the file has one), and BigBird's own heads."""
    head, p = cfg.head, prefix
    out = bert.embedding_rules(cfg, p) + bert.layer_rules(cfg, f"{p}encoder.layer.{{i}}")
    aliases = {}
    if cfg.head_options.pooler:
        out += dense(("pooler",), f"{p}pooler")  # (a Linear itself, not BERT's pooler.dense)
    if head in ("mlm", "pretraining"):
        transform = "cls.predictions.transform"
        mlm, aliases = bert.mlm_head_rules(cfg, f"{transform}.dense", f"{transform}.LayerNorm", "cls.predictions.bias",
                                           "cls.predictions.decoder.weight", f"{p}embeddings.word_embeddings.weight")
        out += mlm
        aliases["cls.predictions.decoder.bias"] = "cls.predictions.bias"
    if head == "pretraining":
        out += dense(("nsp",), "cls.seq_relationship")
    if head == "token_classification":
        out += dense(("classifier",), "classifier")
    if head == "sequence_classification":
        out += dense(("classifier_transform",), "classifier.dense") + dense(("classifier",), "classifier.out_proj")
    if head == "question_answering":
        out += [*dense(("span_feed_forward", "wi"), "qa_classifier.intermediate.dense"),
                *dense(("span_feed_forward", "wo"), "qa_classifier.output.dense"),
                *norm(("span_feed_forward", "norm"), "qa_classifier.output.LayerNorm", True),
                *dense(("classifier",), "qa_classifier.qa_outputs")]
    return out, aliases


ARCHITECTURE = Architecture(CLASSES, {"big_bird": "bert."}, ("BigBirdModel",), config_from_hf, config_to_hf, rules,
                            defaults=DEFAULTS)
