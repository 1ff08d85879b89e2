"""LLaVA (``llava``: LlavaForConditionalGeneration): a CLIP (or SigLIP) vision tower, the multimodal projector and a
LLaMA, Mistral or Qwen2 text decoder. Config and tensor rules, both directions.

The model is a Decoder whose config's top level is the text model (its ``text_config``) and whose ``vision`` holds
the tower (its ``vision_config``, read by interop/vision_towers.py) and what joins them: the tower's hidden states
``vision_feature_layer`` (an int, or a list whose states are concatenated), without their first token under the
'default' ``vision_feature_select_strategy`` ('full' keeps it), through the projector (linear_1,
``projector_hidden_act``, linear_2; biases where ``multimodal_projector_bias``) replace the embeddings of the
``image_token_index`` placeholders. ``image_seq_length`` is the processor's (how many placeholders an image
expands to); the model counts them in input_ids, and it is written as the tower gives them.

A file lays its tensors out one of three ways, all read: as published (transformers 4: ``vision_tower.vision_model.*``,
``multi_modal_projector.*``, ``language_model.model.*``, the head ``language_model.lm_head.weight``), as transformers 5
writes them (the same, the tower bare: ``vision_tower.*``), or as its modules name them (``model.vision_tower.*``,
``model.multi_modal_projector.*``, ``model.language_model.*``, ``lm_head.weight``). Written as transformers 5 writes.
transformers ties the head when the file's or its text_config's tie_word_embeddings says so (LlavaConfig takes
the text config's true).
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig, Vision
from jaxformer.interop import llama, qwen, vision_towers
from jaxformer.interop.reference_keys import class_default
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, dense, ids_into_text_config,
                                     refuse, sub_config, text_token_ids, with_defaults)

CLASSES = {"llava": ("LlavaForConditionalGeneration",)}
# The layouts' prefixes (the registry reads a file with the longest its names start with, and writes the first;
# "" is the modules' layout)
PUBLISHED, WRITTEN = "vision_tower.vision_model.", "vision_tower."
# text model_type -> (its interop module, the class its text model is read as: a decoder with an LM head)
TEXT_TYPES = {"llama": (llama, "LlamaForCausalLM"), "mistral": (llama, "MistralForCausalLM"),
              "qwen2": (qwen, "Qwen2ForCausalLM")}
# vision model_type -> (its config class's defaults, reader, writer, tensor rules)
VISION_TYPES = {
    "clip_vision_model": (vision_towers.CLIP_VISION_DEFAULTS, vision_towers.clip_vision_from_hf,
                          vision_towers.clip_vision_to_hf, vision_towers.clip_vision_rules),
    "siglip_vision_model": (vision_towers.SIGLIP_VISION_DEFAULTS, vision_towers.siglip_vision_from_hf,
                            vision_towers.siglip_vision_to_hf, vision_towers.siglip_vision_rules)}
DEFAULTS = {"llava": dict(image_token_index=32000, projector_hidden_act="gelu",
                          vision_feature_select_strategy="default", vision_feature_layer=-2,
                          multimodal_projector_bias=True, tie_word_embeddings=False)}
# LlavaConfig's tower for a file without a vision_config: LLaVA-1.5's CLIP ViT-L/14 at 336 pixels
LLAVA_TOWER = dict(intermediate_size=4096, hidden_size=1024, patch_size=14, image_size=336, num_hidden_layers=24,
                   num_attention_heads=16)
# The sizes a text config may leave out, which its class's defaults fill in (LLaVA-1.5's text_config says only
# what differs from LlamaConfig's)
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
STRATEGIES = {"default": True, "full": False}  # vision_feature_select_strategy -> whether the first token is dropped


def _text_config(hf: dict) -> tuple[dict, str]:
    text = sub_config(hf, "text_config") if hf.get("text_config") is not None else {}
    kind = text.get("model_type", "llama")  # LlavaConfig's default text type
    refuse(kind not in TEXT_TYPES, f"llava: text_config model_type {kind!r} is not read; jaxformer reads "
           f"{sorted(TEXT_TYPES)}")
    sizes = {key: class_default(kind, key) for key in SIZES}
    return with_defaults(text, {**sizes, **TEXT_TYPES[kind][0].DEFAULTS[kind]}), kind


def _vision_config(hf: dict) -> tuple[dict, str]:
    if hf.get("vision_config") is None:
        return {**vision_towers.CLIP_VISION_DEFAULTS, **LLAVA_TOWER}, "clip_vision_model"
    vision = sub_config(hf, "vision_config")
    kind = vision.get("model_type", "clip_vision_model")
    refuse(kind not in VISION_TYPES, f"llava: vision_config model_type {kind!r} is not read; jaxformer reads "
           f"{sorted(VISION_TYPES)}")
    return with_defaults(vision, VISION_TYPES[kind][0]), kind


def _feature_layers(value) -> tuple[int, ...]:
    layers = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    refuse(not isinstance(layers, list) or not layers or any(isinstance(i, bool) or not isinstance(i, int)
                                                             for i in layers),
           f"llava: vision_feature_layer={value!r} must be an int or a non-empty list of ints")
    return tuple(layers)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    text, kind = _text_config(hf)
    module, text_class = TEXT_TYPES[kind]
    fields = module.config_from_hf(text, kind, text_class, tensor_names)
    vision, vision_kind = _vision_config(hf)
    tower = ModelConfig.from_dict(VISION_TYPES[vision_kind][1](vision, vision_kind))
    strategy = hf["vision_feature_select_strategy"]
    refuse(strategy not in STRATEGIES, f"llava: vision_feature_select_strategy={strategy!r} is not one of "
           f"{sorted(STRATEGIES)}")
    image_token = hf["image_token_id"] if "image_token_id" in hf else hf["image_token_index"]
    joined = Vision(tower, feature_layers=_feature_layers(hf["vision_feature_layer"]),
                    drop_first_token=STRATEGIES[strategy],
                    projector_activation=activation(hf["projector_hidden_act"], False, model_type),
                    projector_bias=bool(hf["multimodal_projector_bias"]), image_token_id=image_token)
    vocab = text["vocab_size"]
    refuse("vocab_size" in hf and hf["vocab_size"] != vocab, f"llava: vocab_size={hf.get('vocab_size')} differs from "
           f"its text_config's {vocab}")
    ids = text_token_ids(text)
    tied = bool(hf["tie_word_embeddings"]) or bool(text["tie_word_embeddings"])
    return {**fields, "vocab_size": vocab, **ids, "tie_embeddings": tied, "vision": joined}


def _text_type(cfg: ModelConfig) -> str:
    """The text model's type as written: Qwen2's biased q/k/v, Mistral's window, else LLaMA's."""
    return "qwen2" if cfg.biases.qkv and not cfg.biases.out else "mistral" if cfg.window_size else "llama"


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    vision = cfg.vision
    refuse(vision is None or vision.projector_activation is None, "llava: a decoder that reads images (vision with "
           "its projector)")
    kind = _text_type(cfg)
    text = {"model_type": kind, "vocab_size": cfg.vocab_size}
    TEXT_TYPES[kind][0].config_to_hf(cfg.replace(vision=None), kind, text)
    ids_into_text_config(out, text)
    tower = vision.tower
    vision_kind = "clip_vision_model" if tower.patches.class_token else "siglip_vision_model"
    image = {"model_type": vision_kind}
    VISION_TYPES[vision_kind][2](tower, image)
    layers = vision.feature_layers
    per_image = tower.patches.tokens - int(vision.drop_first_token)
    out.update(text_config=text, vision_config=image, image_token_index=vision.image_token_id,
               image_seq_length=per_image, vision_feature_layer=layers[0] if len(layers) == 1 else list(layers),
               vision_feature_select_strategy="default" if vision.drop_first_token else "full",
               projector_hidden_act=INVERSE_ACTIVATIONS[vision.projector_activation],
               multimodal_projector_bias=vision.projector_bias, tie_word_embeddings=cfg.embeddings.tie)


def joined_layout(prefix: str) -> tuple[str, str, str, str]:
    """The (tower, projector, text model, LM head) names of a LLaVA-style file (LLaVA's, Gemma 3's) in the layout
    ``prefix`` names: the tower's prefix as published or as transformers 5 writes it, or "" for its modules' names."""
    if prefix == "":
        return "model.vision_tower.", "model.multi_modal_projector.", "model.language_model.", "lm_head.weight"
    return prefix, "multi_modal_projector.", "language_model.model.", "language_model.lm_head.weight"


def text_rules_under(text: list[Rule], aliases: dict[str, str], head: str) -> tuple[list[Rule], dict[str, str]]:
    """A text model's rules and aliases with its LM head read and written under ``head``."""
    renamed = lambda name: head if name == "lm_head.weight" else name  # noqa: E731
    return ([Rule(r.paths, tuple(map(renamed, r.names)), r.load, r.save, r.layers, r.optional) for r in text],
            {renamed(alias): target for alias, target in aliases.items()})


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    """The tower's, the projector's and the text model's rules in the layout ``prefix`` names."""
    tower_prefix, projector, text_prefix, head = joined_layout(prefix)
    kind = _text_type(cfg)
    module, text_class = TEXT_TYPES[kind]
    text, aliases = text_rules_under(*module.rules(cfg, kind, text_class, text_prefix), head)
    tower = cfg.vision.tower
    vision_kind = "clip_vision_model" if tower.patches.class_token else "siglip_vision_model"
    bias = cfg.vision.projector_bias
    return [*VISION_TYPES[vision_kind][3](tower, tower_prefix, ("vision",)),
            *dense(("projector", "linear_1"), f"{projector}linear_1", bias),
            *dense(("projector", "linear_2"), f"{projector}linear_2", bias),
            *text], aliases


_TEXT_HARMLESS = {**llama.ARCHITECTURE.harmless, **qwen.ARCHITECTURE.harmless}
HARMLESS = {**{f"text_config.{key}": why for key, why in _TEXT_HARMLESS.items()},
            **{f"vision_config.{key}": why for key, why in vision_towers.ARCHITECTURE.harmless.items()},
            # (LLaVA-1.5's files carry it: the value LlavaConfig once passed its tower)
            "vision_config.vocab_size": "an image tower has no vocabulary; CLIPVisionModel builds no token table"}

ARCHITECTURE = Architecture(CLASSES, {"llava": (WRITTEN, PUBLISHED)}, (), config_from_hf, config_to_hf, rules,
                            defaults=DEFAULTS, harmless=HARMLESS)
