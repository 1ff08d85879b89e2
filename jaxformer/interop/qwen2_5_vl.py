"""Qwen2.5-VL (``qwen2_5_vl``: Qwen2_5_VLForConditionalGeneration): its vision tower (interop/qwen2_5_vl_vision.py:
window attention, 2-D rotary, the patch merger) and a Qwen2 text decoder whose rotary angles turn by M-RoPE's three
position streams (temporal, height, width: ``rope_sections``, the file's ``mrope_section``). Config and tensor rules,
both directions.

The model is a Decoder whose config's top level is the text model and whose ``vision`` holds the tower, whose merged
features replace the ``image_token_id`` placeholders of input_ids; the prompt's image tokens sit at the positions of
their (frame, row, column) in the merged grid (``layers.positions.mrope_positions``, transformers' get_rope_index).

A config.json says the text model one of two ways, both read: under ``text_config`` (transformers 5), or at the top
level beside ``vision_config`` (the published files of transformers 4, which Qwen2_5_VLConfig moves into its text
config); it is written the first way. Tensors: as published and as transformers 5 still saves them (``model.*`` the
text model, ``visual.*`` the tower), or under its modules' names (``model.language_model.*``, ``model.visual.*``,
which transformers' checkpoint conversion maps the first onto); the head ``lm_head.weight`` in both; written the first
way. Videos (``video_token_id``, ``tokens_per_second``) are not read: the model takes
images only.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig, Vision
from jaxformer.interop import qwen, qwen2_5_vl_vision
from jaxformer.interop.rules import (Architecture, ConfigReader, Rule, ids_into_text_config, refuse, rope_to_hf,
                                     sub_config, text_token_ids, with_defaults)

CLASSES = {"qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration",)}
# The layouts' text prefixes, the written one first (the registry reads a file with the longest its names start with)
PUBLISHED, MODULES = "model.", "model.language_model."
TOWER = {PUBLISHED: "visual.", MODULES: "model.visual."}
# Qwen2_5_VLConfig's defaults for the keys read at its top level
DEFAULTS = {"qwen2_5_vl": dict(image_token_id=151655, tie_word_embeddings=False)}
# Qwen2_5_VLTextConfig's defaults for the keys read of the text model
TEXT_DEFAULTS = dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
                     num_attention_heads=64, num_key_value_heads=8, hidden_act="silu", max_position_embeddings=32768,
                     rms_norm_eps=1e-5, use_sliding_window=False, sliding_window=4096, max_window_layers=80,
                     attention_dropout=0.0, rope_theta=1e6, bos_token_id=151643, eos_token_id=151645,
                     pad_token_id=None, tie_word_embeddings=False)
DEFAULT_SECTIONS = [16, 24, 24]  # Qwen2_5_VLRotaryEmbedding's mrope_section when the file gives none


def _text_config(hf: dict) -> dict:
    """The text model's keys: ``text_config``, or the file's top level (published files)."""
    text = sub_config(hf, "text_config") if hf.get("text_config") is not None else hf
    return with_defaults(text, TEXT_DEFAULTS)


def _plain_rope(text: dict) -> tuple[dict, tuple[int, ...]]:
    """The text config with M-RoPE's section list taken out of its rotary dict (read here) and the legacy type
    'mrope' read as transformers reads it ('default'), and the sections."""
    key = "rope_scaling" if text.get("rope_scaling") else "rope_parameters"
    rope = dict(text.get(key) or {})
    sections = rope.pop("mrope_section", DEFAULT_SECTIONS)
    if rope.get("rope_type", rope.get("type")) == "mrope":
        rope = {k: v for k, v in rope.items() if k not in ("type", "rope_type")}
    plain = {**dict(text.items()), key: rope}
    return (ConfigReader(plain, text.read, text.prefix) if isinstance(text, ConfigReader) else plain), tuple(sections)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    text, sections = _plain_rope(_text_config(hf))
    fields = qwen.config_from_hf(text, "qwen2", "Qwen2ForCausalLM", tensor_names)
    given = sub_config(hf, "vision_config") if hf.get("vision_config") is not None else {}  # (absent: the defaults)
    vision = with_defaults(given, qwen2_5_vl_vision.QWEN2_5_VL_VISION_DEFAULTS)
    tower = ModelConfig.from_dict(qwen2_5_vl_vision.qwen2_5_vl_vision_from_hf(vision))
    ids = text_token_ids(text)
    # Qwen2_5_VLConfig ties the head when its own key or its text config's says so
    tied = bool(hf["tie_word_embeddings"]) or bool(text["tie_word_embeddings"])
    return {**fields, "vocab_size": text["vocab_size"], **ids, "tie_embeddings": tied, "rope_sections": sections,
            "vision": Vision(tower, image_token_id=hf["image_token_id"])}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    vision, rotary = cfg.vision, cfg.rotary
    refuse(vision is None or not vision.merged or rotary is None or rotary.sections is None,
           "qwen2_5_vl: a decoder with M-RoPE (rope_sections) reading a tower with its own merger")
    refuse(cfg.head_dim_ * cfg.num_heads != cfg.d_model,
           f"qwen2_5_vl: head_dim={cfg.head_dim_} with d_model={cfg.d_model} and num_heads={cfg.num_heads} "
           "(Qwen2_5_VLTextConfig has no head_dim: its attention's is hidden_size / num_attention_heads)")
    text = {"model_type": "qwen2_5_vl_text", "vocab_size": cfg.vocab_size}
    qwen.config_to_hf(cfg.replace(vision=None), "qwen2", text)
    text.pop("head_dim")  # (Qwen2_5_VLTextConfig has none: hidden_size / heads)
    text["rope_parameters"] = {**rope_to_hf(cfg), "mrope_section": list(rotary.sections)}
    ids_into_text_config(out, text)
    image: dict[str, Any] = {"model_type": "qwen2_5_vl_vision"}
    qwen2_5_vl_vision.qwen2_5_vl_vision_to_hf(vision.tower, image)
    out.update(text_config=text, vision_config=image, image_token_id=vision.image_token_id,
               tie_word_embeddings=cfg.embeddings.tie)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    """The tower's and the text model's rules in the layout ``prefix`` (the text model's) names."""
    text, aliases = qwen.rules(cfg.replace(vision=None), "qwen2", "Qwen2ForCausalLM", prefix)
    tower = qwen2_5_vl_vision.qwen2_5_vl_vision_rules(cfg.vision.tower, TOWER[prefix], at=("vision",))
    return [*tower, *text], aliases


HARMLESS = {
    **{f"text_config.{key}": why for key, why in qwen.ARCHITECTURE.harmless.items()},
    **{f"vision_config.{key}": why for key, why in qwen2_5_vl_vision.VISION_HARMLESS.items()},
    "text_config.model_type": "names the text config's class",
    "vision_config.model_type": "names the vision config's class",
    "video_token_id": "the placeholder of videos, which jaxformer does not take (pixel_values_videos is refused)",
    "vision_start_token_id": "marks where an image starts in the prompt; the model reads the image tokens themselves",
    "vision_end_token_id": "marks where an image ends in the prompt; the model reads the image tokens themselves",
}

ARCHITECTURE = Architecture(CLASSES, {"qwen2_5_vl": (PUBLISHED, MODULES)}, (), config_from_hf, config_to_hf, rules,
                            defaults=DEFAULTS, harmless=HARMLESS)
