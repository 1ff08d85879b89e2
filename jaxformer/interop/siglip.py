"""SigLIP (``siglip``: SiglipModel; ``siglip_text_model``: SiglipTextModel): config and tensor rules, both
directions.

SigLIP's text model is CLIP's layer for layer (``interop/clip.py``) but bidirectional (the padding mask alone),
with tanh-form GELU MLPs; its pooled output is the final-normed state at the last position (padding or not: the
tokenizer pads to the length the model was trained at) through its own ``head`` Linear to ``projection_size``.
SiglipModel joins it to SigLIP's vision model (``interop/vision_towers.py``, pooled by its attention head) with no
projection: the cosine similarities times exp(``logit_scale``) plus ``logit_bias``, both learned scalars stored
as one-element tensors.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig, Vision
from jaxformer.interop.clip import text_rules
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, dense, refuse, sub_config,
                                     with_defaults)
from jaxformer.interop.vision_towers import (SIGLIP_VISION_DEFAULTS, last_state_tied, legacy_harmless,
                                             siglip_vision_from_hf, siglip_vision_rules, siglip_vision_to_hf,
                                             write_last_state_tied)

# SiglipTextConfig's defaults for the keys a file may leave out (its default bos and eos ids lie outside its
# default vocabulary: SigLIP reads neither)
TEXT_DEFAULTS = dict(vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                     num_attention_heads=12, max_position_embeddings=64, hidden_act="gelu_pytorch_tanh",
                     layer_norm_eps=1e-6, attention_dropout=0.0, pad_token_id=1, bos_token_id=49406,
                     eos_token_id=49407, projection_size=None)
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")
DEFAULTS = {"siglip": {}, "siglip_text_model": TEXT_DEFAULTS}


def over_defaults(hf: dict, key: str, defaults: dict) -> dict:
    """The sub-config ``key`` over its class's ``defaults`` (an absent or null one is the defaults), as SiglipConfig
    reads it: unlike CLIPConfig it has no ``{key}_dict`` rule, so such a key is left unread, as every key is that
    transformers does not read."""
    return with_defaults(sub_config(hf, key) if hf.get(key) is not None else {}, defaults)


def text_fields(hf: dict, model_type: str) -> dict[str, Any]:
    """The ModelConfig fields of a SigLIP text config (a SiglipTextModel's file, or a SigLIP file's text_config);
    token ids outside the vocabulary (the class's defaults) are left out, as nothing reads them."""
    vocab = hf["vocab_size"]
    ids = {key: hf[key] for key in TOKEN_IDS if isinstance(hf[key], int) and 0 <= hf[key] < vocab}
    return dict(family="encoder", vocab_size=vocab, d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                norm_position="pre", norm_eps=float(hf["layer_norm_eps"]),
                final_norm_in_hidden_states=last_state_tied(hf, model_type),
                activation=activation(hf["hidden_act"], False, model_type), position="learned",
                max_positions=hf["max_position_embeddings"], type_vocab_size=0, attention="bidirectional",
                head="none", pooled_token="last", pooled_projection=hf["projection_size"] or hf["hidden_size"],
                dropout_rate=0.0, attention_dropout_rate=float(hf["attention_dropout"]), **ids)


def text_to_hf(cfg: ModelConfig, out: dict) -> None:
    """A SigLIP text config for the text tower ``cfg``."""
    options = cfg.head_options
    refuse(options.pooled_token != "last" or not options.pooled_projection or not options.pooled_projection_bias
           or cfg.attention != "bidirectional" or cfg.norms.position != "pre",
           "siglip: a bidirectional pre-norm text model pooled at its last token through its head")
    act = "gelu_pytorch_tanh" if cfg.activation == "gelu_tanh" else INVERSE_ACTIVATIONS[cfg.activation]
    out.update(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads,
               intermediate_size=cfg.d_ff, num_hidden_layers=cfg.encoder_layers, layer_norm_eps=cfg.norms.eps,
               hidden_act=act, max_position_embeddings=cfg.max_positions, attention_dropout=cfg.attention_dropout_rate,
               projection_size=cfg.head_options.pooled_projection,
               **{key: value for key, value in zip(TOKEN_IDS, (cfg.tokens.pad, cfg.tokens.bos, cfg.tokens.eos))})
    write_last_state_tied(cfg, out)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    if model_type == "siglip_text_model":
        return text_fields(hf, model_type)
    text = text_fields(over_defaults(hf, "text_config", TEXT_DEFAULTS), model_type)
    tower = siglip_vision_from_hf(over_defaults(hf, "vision_config", SIGLIP_VISION_DEFAULTS), model_type)
    return joined(text, tower, model_type)


def joined(text: dict[str, Any], tower: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The dual encoder of SigLIP's (or SigLIP2's) text fields and image tower fields: the tower's pooling head
    and the text head's width are what the two embeddings are compared by."""
    refuse(tower["image_pooler"] is None, f"{model_type}: vision_config.vision_use_head=False leaves the model no "
           "image embedding (its vision model's pooler_output is None)")
    refuse(text["pooled_projection"] != tower["d_model"], f"{model_type}: the text head's projection_size="
           f"{text['pooled_projection']} differs from the vision width {tower['d_model']}; the two embeddings are "
           "compared")
    # the learned logit scale and bias start at zero (SiglipModel's initialisation); the file holds their values
    vision = Vision(ModelConfig.from_dict(tower), logit_scale_init=0.0, logit_bias=True)
    return {**text, "family": "dual_encoder", "head": "contrastive", "vision": vision}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    if model_type == "siglip_text_model":
        refuse(cfg.family != "encoder" or cfg.head != "none", "siglip_text_model: a text encoder without a head")
        text_to_hf(cfg, out)
        return
    joined_to_hf(cfg, model_type, siglip_vision_to_hf, out)


def joined_to_hf(cfg: ModelConfig, model_type: str, tower_to_hf, out: dict) -> None:
    """A SigLIP (or SigLIP2) dual encoder's file: its text and vision configs (the tower written by
    ``tower_to_hf``), the text model's vocabulary and token ids in its config alone."""
    vision = cfg.vision
    refuse(vision is None or vision.projection or not vision.logit_bias or vision.logit_scale_init != 0.0,
           f"{model_type}: a dual encoder without projections, with a logit bias")
    text, image = {"model_type": f"{model_type}_text_model"}, {"model_type": f"{model_type}_vision_model"}
    text_to_hf(cfg, text)
    tower_to_hf(vision.tower, image)
    for key in ("vocab_size", *TOKEN_IDS):
        out.pop(key, None)
    out.update(text_config=text, vision_config=image)


def _scalar(path: tuple[str, ...], name: str) -> Rule:
    """A learned scalar stored as a one-element tensor."""
    return Rule((path,), (name,), lambda t: [t[0].reshape(())], lambda p: [p[0].reshape(1)])


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    if model_type == "siglip_text_model":
        return [*text_rules(cfg, prefix), *dense(("pooled_projection",), f"{prefix}head")], {}
    return [*text_rules(cfg, "text_model.", ("text",)), *dense(("text", "pooled_projection"), "text_model.head"),
            *siglip_vision_rules(cfg.vision.tower, "vision_model.", ("vision",)),
            _scalar(("logit_scale",), "logit_scale"), _scalar(("logit_bias",), "logit_bias")], {}


# transformers 4's SiglipTextModel nests its tensors under text_model.; transformers 5 writes them bare
ARCHITECTURE = Architecture(
    {"siglip": ("SiglipModel",), "siglip_text_model": ("SiglipTextModel",)},
    {"siglip": "", "siglip_text_model": "text_model."}, ("SiglipModel", "SiglipTextModel"), config_from_hf,
    config_to_hf, rules, defaults=DEFAULTS,
    harmless={**legacy_harmless("", None), **legacy_harmless("text_config.", "vision_config.")})
