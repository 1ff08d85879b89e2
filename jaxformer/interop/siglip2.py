"""SigLIP2 with NaFlex (``siglip2``: Siglip2Model; ``siglip2_text_model``; ``siglip2_vision_model``): config and
tensor rules, both directions.

Its text model is SigLIP's (``interop/siglip.py``: bidirectional, pooled at the last token through its head) and
its vision model SigLIP's layer for layer (``interop/vision_towers.py``) but for the front end: images of any
aspect ratio arrive already cut into patches [B, max_num_patches, p * p * C] (``Siglip2ImageProcessor``), projected
by a Linear; the learned positions, a square grid of ``num_patches``, are resized to each image's grid
(``spatial_shapes``) and the padding patches are left out of the attention and of the pooling head
(``pixel_attention_mask``). That front end is ``ModelConfig.flexible_patches`` (``layers/patches.py``);
``image_size`` is the position grid's side in pixels (sqrt(num_patches) * patch_size), a size no image needs.

SigLIP2's fixed-resolution files (google/siglip2-base-patch16-224, ...) are ``siglip`` files (SiglipModel with
a 256000-token vocabulary): ``interop/siglip.py`` reads them.
"""

from __future__ import annotations

import math
from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import INVERSE_ACTIVATIONS, Architecture, Rule, activation, refuse
from jaxformer.interop.siglip import (TEXT_DEFAULTS, joined, joined_to_hf, over_defaults, text_fields,
                                      text_to_hf)
from jaxformer.interop.siglip import rules as siglip_rules
from jaxformer.interop.vision_towers import (last_state_tied, legacy_harmless, siglip_vision_rules, square,
                                             write_last_state_tied)

# Siglip2VisionConfig's defaults for the keys a file may leave out
VISION_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                       num_channels=3, patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                       attention_dropout=0.0, vision_use_head=True, num_patches=256)
DEFAULTS = {"siglip2": {}, "siglip2_text_model": TEXT_DEFAULTS, "siglip2_vision_model": VISION_DEFAULTS}


def vision_fields(hf: dict, model_type: str) -> dict[str, Any]:
    """The ModelConfig fields of a Siglip2VisionConfig (a siglip2_vision_model file, or a siglip2 file's
    vision_config): SigLIP's tower over NaFlex patches, its ``num_patches`` positions a square grid."""
    patch, count = square(hf, "patch_size", model_type), hf["num_patches"]
    side = math.isqrt(count) if isinstance(count, int) and count > 0 else 0
    refuse(side * side != count, f"{model_type}: num_patches={count!r} must be a square number (its positions are "
           "a square grid, resized to each image's)")
    return dict(family="encoder", vocab_size=0, d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                norm_position="pre", norm_eps=float(hf["layer_norm_eps"]), position="learned", max_positions=count,
                attention="bidirectional", head="none", image_size=side * patch, patch_size=patch,
                image_channels=hf["num_channels"], class_token=False, flexible_patches=True,
                final_norm_in_hidden_states=last_state_tied(hf, model_type),
                activation=activation(hf["hidden_act"], False, model_type),
                final_norm=True, image_pooler="attention" if hf["vision_use_head"] else None,
                attention_dropout_rate=float(hf["attention_dropout"]))


def vision_to_hf(cfg: ModelConfig, out: dict) -> None:
    """A Siglip2VisionConfig of the NaFlex tower ``cfg`` into ``out``, every setting written."""
    patches, pooler = cfg.patches, cfg.head_options.image_pooler
    refuse(patches is None or not patches.flexible or patches.class_token or not cfg.norms.final
           or pooler not in (None, "attention"), "siglip2_vision_model: a NaFlex image tower (flexible_patches) "
           "without a class token, final-normed, pooled by its attention head or not at all")
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
               num_hidden_layers=cfg.encoder_layers, layer_norm_eps=cfg.norms.eps, patch_size=patches.patch_size,
               num_channels=patches.channels, num_patches=patches.count,
               hidden_act="gelu_pytorch_tanh" if cfg.activation == "gelu_tanh" else INVERSE_ACTIVATIONS[cfg.activation],
               attention_dropout=cfg.attention_dropout_rate, vision_use_head=pooler == "attention")
    write_last_state_tied(cfg, out)
    out.pop("vocab_size", None)  # (an image tower has no vocabulary; its config class no such key)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    if model_type == "siglip2_text_model":
        return text_fields(hf, model_type)
    if model_type == "siglip2_vision_model":
        return vision_fields(hf, model_type)
    text = text_fields(over_defaults(hf, "text_config", TEXT_DEFAULTS), model_type)
    return joined(text, vision_fields(over_defaults(hf, "vision_config", VISION_DEFAULTS), model_type), model_type)


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    if model_type == "siglip2_vision_model":
        refuse(cfg.head != "none", f"siglip2_vision_model has no head; head={cfg.head!r}")
        vision_to_hf(cfg, out)
        return
    if model_type == "siglip2_text_model":
        refuse(cfg.family != "encoder" or cfg.head != "none", "siglip2_text_model: a text encoder without a head")
        text_to_hf(cfg, out)
        return
    joined_to_hf(cfg, model_type, vision_to_hf, out)  # (a projector on a dual encoder: refused by Vision itself)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    """SigLIP's tensors under the same names (the NaFlex patch projection a Linear: ``siglip_vision_rules``)."""
    if model_type == "siglip2_vision_model":
        return siglip_vision_rules(cfg, prefix), {}
    return siglip_rules(cfg, model_type.replace("siglip2", "siglip"), arch, prefix)


# transformers 4's Siglip2TextModel and Siglip2VisionModel nest their tensors under text_model. and vision_model.;
# transformers 5 writes them bare
ARCHITECTURE = Architecture(
    {"siglip2": ("Siglip2Model",), "siglip2_text_model": ("Siglip2TextModel",),
     "siglip2_vision_model": ("Siglip2VisionModel",)},
    {"siglip2": "", "siglip2_text_model": "text_model.", "siglip2_vision_model": "vision_model."},
    ("Siglip2Model", "Siglip2TextModel", "Siglip2VisionModel"), config_from_hf, config_to_hf, rules,
    defaults=DEFAULTS, harmless={**legacy_harmless("", None), **legacy_harmless("text_config.", "vision_config.")})
