"""UMT5 (``umt5``: UMT5Model, UMT5ForConditionalGeneration, UMT5EncoderModel, UMT5ForSequenceClassification,
UMT5ForQuestionAnswering: T5's classes and heads, prefixed): mT5 whose every self-attention
layer, in both stacks, holds its own relative position bias table (T5 computes one in each stack's first layer
and shares it). Everything else is T5 v1.1's, read by t5.py's rules: gated-gelu feed-forward, RMSNorm, unscaled
attention, shared embeddings. As in T5Config, the decoder output is scaled before the head unless the file says
``tie_word_embeddings: false`` (the published ones do), and the head is the file's own ``lm_head`` tensor when it
has one (UMT5Config ties whatever it is told). Published files may lack ``model_type`` (google/umt5-small);
the registry then reads it from ``architectures``. ``scalable_attention`` (the T5X export's flag) loads because
UMT5Config never reads it (``reference_keys``)."""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop import t5
from jaxformer.interop.rules import Architecture, Rule, copy, refuse

CLASSES = {"umt5": tuple(f"UM{name}" for name in t5.HEADS)}  # (T5's classes, prefixed)
# UMT5Config's, for a file that leaves them out
DEFAULTS = {"umt5": dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, feed_forward_proj="gated-gelu")}


def _t5_class(arch: str) -> str:
    return arch.removeprefix("UM")  # UMT5ForConditionalGeneration -> T5ForConditionalGeneration


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    # T5's reading (model_type t5: the output scaling follows tie_word_embeddings, as UMT5Config's does)
    fields = t5.config_from_hf(hf, "t5", _t5_class(arch), tensor_names)
    if not tensor_names and fields["head"] == "lm":  # read without its tensors: its own head, as every published one
        fields.update(tie_embeddings=False, scale_tied_logits=False)
    scaled = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
    refuse(fields["head"] == "lm" and scaled and not fields["tie_embeddings"],
           f"umt5: {arch} scales the decoder output by d_model**-0.5 (scale_decoder_outputs={scaled}, or "
           "tie_word_embeddings not false) before its own lm_head, which jaxformer does only before a tied head")
    return {**fields, "relative_bias_per_layer": True}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    t5.config_to_hf(cfg, "t5", out)  # scale_decoder_outputs written: transformers 5 reads it back


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    """T5's tensors, the one shared bias table of each stack (in its first layer) replaced by every layer's own."""
    out, aliases = t5.rules(cfg, "t5", _t5_class(arch), prefix)
    shared = [rule for rule in out if "relative_bias" in rule.paths[0]]
    per_layer = [copy((rule.paths[0][0], "blocks", "relative_bias", "table"),
                      rule.names[0].replace(".block.0.", ".block.{i}.")) for rule in shared]
    return [rule for rule in out if rule not in shared] + per_layer, aliases


ARCHITECTURE = Architecture(CLASSES, {"umt5": ""}, CLASSES["umt5"], config_from_hf, config_to_hf, rules,
                            harmless={key: why for key, why in t5.ARCHITECTURE.harmless.items()
                                      if key != "tie_word_embeddings"}, defaults=DEFAULTS)
