"""Moonshot's Kimi K2.5 (``kimi_k25``, Kimi_K25ForConditionalGeneration as published): its text model, read.

A multimodal file: a DeepSeek-V3 text model (``text_config``, its model_type ``kimi_k2`` as published or
``deepseek_v3`` as transformers 5 writes it; its tensors under ``language_model.model.``, its head
``language_model.lm_head``) beside a vision tower (MoonViT) and its projector. The text model loads through
DeepSeek's rules (interop/deepseek.py) and is written back as ``deepseek_v3``; the vision tower's and projector's
tensors are skipped with a note, as Llama 4's multimodal files are (interop/llama4.py), until the vision issue
(51) reads them. The wrapper's own ``tie_word_embeddings`` (true by default) ties the head, as transformers'
class does whatever the text model's says. Text only: transformers embeds an image or video placeholder id
(``image_token_id``, ``video_token_id``) as id 0 when no pixels come with it; jaxformer embeds the id itself.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop import deepseek
from jaxformer.interop.rules import Architecture, Rule, refuse, sub_config, with_defaults

# transformers' class, then the remote code's name the published files carry
CLASSES = {"kimi_k25": ("Kimi_K25ForConditionalGeneration", "KimiK25ForConditionalGeneration")}
MULTIMODAL_PREFIX = "language_model."  # where the file keeps its DeepseekV3ForCausalLM
TEXT_TYPES = ("kimi_k2", "deepseek_v3")  # Kimi_K25Config reads a kimi_k2 text model as deepseek_v3
DEFAULTS = {"kimi_k25": dict(tie_word_embeddings=True)}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    text = with_defaults(sub_config(hf, "text_config"), deepseek.DEFAULTS["deepseek_v3"])
    kind = text.get("model_type", "deepseek_v3")
    refuse(kind not in TEXT_TYPES, f"kimi_k25: text_config model_type {kind!r} is not supported; expected one of "
           f"{TEXT_TYPES}")
    fields = deepseek.config_from_hf(text, "deepseek_v3", "DeepseekV3ForCausalLM", tensor_names)
    ids = {k: text.get(k) for k in ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id")}
    return {**fields, "tie_embeddings": bool(hf["tie_word_embeddings"]),
            **{k: v for k, v in ids.items() if v is not None}}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    """The text model's keys (never a whole wrapper: reading one back needs its text_config, so a model exports
    as deepseek_v3)."""
    deepseek.config_to_hf(cfg, "deepseek_v3", out)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    out, aliases = deepseek.rules(cfg, "deepseek_v3", "DeepseekV3ForCausalLM", prefix)
    head = "lm_head.weight"  # beside the text model, inside language_model
    out = [Rule(r.paths, tuple(MULTIMODAL_PREFIX + n if n == head else n for n in r.names), r.load, r.save, r.layers,
                r.optional) for r in out]
    return out, {MULTIMODAL_PREFIX + alias: target for alias, target in aliases.items()}


def ignored(hf: dict, names: set[str]) -> tuple[set[str], str]:
    """The vision tower and its projector (the text model never reads them), and any multi-token-prediction
    layers of the text model."""
    if hf.get("model_type") != "kimi_k25":
        return set(), ""
    vision = {n for n in names if not n.startswith(MULTIMODAL_PREFIX)}
    text = {**hf.get("text_config", {}), "model_type": "deepseek_v3"}
    mtp, mtp_note = deepseek.ignored(text, names - vision)
    notes = [mtp_note] if mtp else []
    if vision:
        modules = sorted({".".join(n.split(".")[:2 if n.startswith("model.") else 1]) for n in vision})
        notes.insert(0, f"{len(vision)} tensors of the vision tower and its projector ({', '.join(modules)}) are not "
                        "used by jaxformer (it reads the text model) and were skipped; the vision issue (51) will "
                        "read them")
    return vision | mtp, "; ".join(notes)


_TEXT_HARMLESS = {**deepseek.HARMLESS, "tie_word_embeddings": "the wrapper's own key ties the head, not the text "
                                                               "model's (as transformers' class does)"}
HARMLESS = {**{f"text_config.{key}": why for key, why in _TEXT_HARMLESS.items()},
            "vision_config": "the vision tower's, which jaxformer does not run yet (text only; issue 51)",
            **dict.fromkeys(("projection_hidden_size", "projection_layer_norm_eps"), "the vision projector's"),
            **dict.fromkeys(("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
                             "media_placeholder_token_id"),
                            "image and video placeholder tokens, which the vision path reads (see the docstring)")}

ARCHITECTURE = Architecture(CLASSES, {"kimi_k25": MULTIMODAL_PREFIX + "model."}, (), config_from_hf, config_to_hf,
                            rules, ignored=ignored, defaults=DEFAULTS, harmless=HARMLESS, wrappers=("kimi_k25",))
