"""Gemma 3 with its image tower (``gemma3``: Gemma3ForConditionalGeneration): a SigLIP vision tower, Gemma 3's
multimodal projector and the Gemma 3 text decoder. Config and tensor rules, both directions.

The model is a Decoder whose config's top level is the text model (its ``text_config``, read by interop/gemma.py as
``gemma3_text``) and whose ``vision`` holds the tower (its ``vision_config``, a SigLIP vision model, read by
interop/vision_towers.py) and what joins them: the tower's last_hidden_state (post_layernorm applied) average-pooled
to ``mm_tokens_per_image`` tokens an image, RMS-normed (1 + w), times ``mm_input_projection_weight``
(``vision.pooled_tokens``), replacing the embeddings of the ``image_token_index`` placeholders (the text tokens'
embeddings scaled by sqrt(hidden_size), the image features not). token_type_ids (1 on image tokens) make each
image's tokens attend to each other both ways in a full pass or a prefill (``vision.bidirectional_images``).
``boi_token_index`` and ``eoi_token_index`` are the processor's (the model never reads them): kept from the file
read, else left to the class defaults.

A file lays its tensors out one of three ways, all read (LLaVA's, interop/llava.py): as published (transformers 4:
``vision_tower.vision_model.*``, ``multi_modal_projector.*``, ``language_model.model.*``), as transformers 5 writes
them (the tower bare: ``vision_tower.*``), or as its modules name them (``model.vision_tower.*``,
``model.multi_modal_projector.*``, ``model.language_model.*``). Written as transformers 5 writes. The head is tied
to the token embedding unless both tie_word_embeddings say otherwise (``lm_head.weight`` at the top, or
``language_model.lm_head.weight``).
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig, Vision
from jaxformer.interop import gemma, llava, vision_towers
from jaxformer.interop.reference_keys import class_default
from jaxformer.interop.rules import (Architecture, ConfigReader, Rule, copy, ids_into_text_config, refuse, sub_config,
                                     text_model_from_hf, with_defaults)

CLASSES = {"gemma3": ("Gemma3ForConditionalGeneration",)}
PUBLISHED, WRITTEN = "vision_tower.vision_model.", "vision_tower."
DEFAULTS = {"gemma3": dict(mm_tokens_per_image=256, image_token_index=262144, tie_word_embeddings=True)}
# The sizes a text config may leave out (google/gemma-3-4b-it's says only what differs from Gemma3TextConfig's)
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "query_pre_attn_scalar", "sliding_window", "max_position_embeddings")
TEXT_CLASS = "Gemma3ForCausalLM"


def _text_defaults() -> dict:
    return {**{key: class_default("gemma3_text", key) for key in SIZES}, **gemma.ARCHITECTURE.defaults["gemma3_text"]}


def _either(hf: dict, name: str, alias: str):
    """A key transformers' attribute_map also spells ``alias`` (image_token_id for image_token_index)."""
    return hf[alias] if alias in hf else hf[name]


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    if hf.get("text_config") is None:  # Gemma3Config builds a default Gemma3TextConfig (the caller's dict untouched)
        if isinstance(hf, ConfigReader):
            reader = ConfigReader({**hf, "text_config": {}}, hf.read, hf.prefix)
            reader.subs = hf.subs  # (the caller's reader still lists what its sub-configs leave unread)
            hf = reader
        else:
            hf = {**hf, "text_config": {}}
    refuse(sub_config(hf, "text_config").get("model_type", "gemma3_text") != "gemma3_text",
           f"gemma3: text_config model_type {hf['text_config'].get('model_type')!r} is not read; expected gemma3_text")
    fields = text_model_from_hf(hf, model_type, _text_defaults(), lambda text: gemma.config_from_hf(
        text, "gemma3_text", TEXT_CLASS, tensor_names))
    if hf.get("vision_config") is None:
        vision = dict(vision_towers.SIGLIP_VISION_DEFAULTS)
    else:
        vision = with_defaults(sub_config(hf, "vision_config"), vision_towers.SIGLIP_VISION_DEFAULTS)
        kind = vision.get("model_type", "siglip_vision_model")
        refuse(kind != "siglip_vision_model", f"gemma3: vision_config model_type {kind!r} is not read; expected "
               "siglip_vision_model")
    tower = ModelConfig.from_dict(vision_towers.siglip_vision_from_hf(vision))
    tokens = hf["mm_tokens_per_image"]
    refuse(isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0,
           f"gemma3: mm_tokens_per_image={tokens!r} must be a positive int")
    joined = Vision(tower, pooled_tokens=tokens, bidirectional_images=True,
                    image_token_id=_either(hf, "image_token_index", "image_token_id"))
    return {**fields, "logits_softcap": None, "vision": joined}  # (SOFTCAP)


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    vision = cfg.vision
    refuse(vision is None or not vision.pooled_tokens, "gemma3: a decoder that reads images through Gemma 3's "
           "pooled projector (vision.pooled_tokens)")
    text = {"model_type": "gemma3_text", "vocab_size": cfg.vocab_size}
    gemma.config_to_hf(cfg.replace(vision=None), "gemma3_text", text)
    ids_into_text_config(out, text)
    image = {"model_type": "siglip_vision_model"}
    vision_towers.siglip_vision_to_hf(vision.tower, image)
    out.pop("image_token_id", None)  # (written under its own name below)
    out.update(text_config=text, vision_config=image, mm_tokens_per_image=vision.pooled_tokens,
               image_token_index=vision.image_token_id, tie_word_embeddings=cfg.embeddings.tie)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    """The tower's, the projector's and the text model's rules in the layout ``prefix`` names."""
    tower_prefix, projector, text_prefix, head = llava.joined_layout(prefix)
    text, aliases = llava.text_rules_under(*gemma.rules(cfg, "gemma3_text", TEXT_CLASS, text_prefix), head)
    return [*vision_towers.siglip_vision_rules(cfg.vision.tower, tower_prefix, ("vision",)),
            copy(("projector", "projection", "kernel"), f"{projector}mm_input_projection_weight"),
            copy(("projector", "norm", "scale"), f"{projector}mm_soft_emb_norm.weight"),
            *text], aliases


# Gemma3ForConditionalGeneration's head soft-caps nothing: only Gemma3ForCausalLM reads final_logit_softcapping
SOFTCAP = {"text_config.final_logit_softcapping": "read by Gemma3ForCausalLM alone; the image model's head has no cap"}
HARMLESS = {**SOFTCAP, **{f"text_config.{key}": why for key, why in gemma.ARCHITECTURE.harmless.items()},
            **{f"vision_config.{key}": why for key, why in vision_towers.ARCHITECTURE.harmless.items()},
            **dict.fromkeys(("boi_token_index", "boi_token_id", "eoi_token_index", "eoi_token_id"),
                            "the processor's begin- and end-of-image tokens, which the model never reads")}

ARCHITECTURE = Architecture(CLASSES, {"gemma3": (WRITTEN, PUBLISHED)}, (), config_from_hf, config_to_hf, rules,
                            defaults=DEFAULTS, harmless=HARMLESS)
