"""Mistral 3's multimodal files (``mistral3``, Mistral3ForConditionalGeneration: Mistral Small 3.1 and 3.2, and
Mistral Small 4 as published): their text model, read.

A Pixtral vision tower, a projector with its patch merger, and a text model under ``text_config``: a ``mistral``
model (Small 3.1 / 3.2) or a ``mistral4`` one (Small 4), read by interop/llama.py's and interop/mistral4.py's
rules and written back as that type (a wrapper is never written: reading one back needs its text_config). The
vision tower's and projector's tensors are skipped with a note. Mistral3Config takes any text type; the others
(``ministral3``, Ministral 3's) are refused by name.

The tensors sit where transformers 5 writes them by default and the published files have them
(``language_model.model.*``, the head ``language_model.lm_head.weight``), or where its modules keep them
(``model.language_model.*``, ``lm_head.weight``: ``save_pretrained(save_original_format=False)``); both read.
transformers ties the head by the wrapper's own ``tie_word_embeddings`` (true by default, and in every file its
class writes), never by the text_config's (its text model has no head); a file that holds its own head differing
from the embeddings (every published one) loads untied, as transformers does. So the text_config's key changes
nothing, and a wrapper saying false over a file without a head is refused by the missing tensor's name.
Text only: an image placeholder id (``image_token_index``) is embedded as any other token.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop import llama, mistral4
from jaxformer.interop.rules import Architecture, Rule, refuse, sub_config, with_defaults

CLASSES = {"mistral3": ("Mistral3ForConditionalGeneration",)}
# Where the file keeps the text model: as published and as transformers writes it (save_original_format, the
# default), else as its modules name it; the head beside the text model, or at the top
PUBLISHED_PREFIX, MODULE_PREFIX = "language_model.model.", "model.language_model."
PUBLISHED_HEAD, MODULE_HEAD = "language_model.lm_head.weight", "lm_head.weight"
# text model_type -> (its interop module, the class its text model is written as)
TEXT_TYPES = {"mistral": (llama, "MistralForCausalLM"), "mistral4": (mistral4, "Mistral4ForCausalLM")}
DEFAULTS = {"mistral3": dict(tie_word_embeddings=True)}
# Mistral3Config's text model for a file without a text_config: Mistral Small 3.1's (its sub-config defaults)
SMALL_3_1_TEXT = dict(attention_dropout=0.0, head_dim=128, hidden_act="silu", hidden_size=5120,
                      initializer_range=0.02, intermediate_size=32768, max_position_embeddings=131072,
                      model_type="mistral", num_attention_heads=32, num_hidden_layers=40, num_key_value_heads=8,
                      rms_norm_eps=1e-5, rope_theta=1e9, sliding_window=None, use_cache=True, vocab_size=131072)
VISION = ("vision_tower.", "multi_modal_projector.")  # (and under "model." as the modules name them)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    text = sub_config(hf, "text_config") if hf.get("text_config") is not None else dict(SMALL_3_1_TEXT)
    kind = text.get("model_type", "mistral")  # Mistral3Config's default text type
    refuse(kind not in TEXT_TYPES, f"mistral3: text_config model_type {kind!r} is not read; jaxformer reads "
           f"{sorted(TEXT_TYPES)}")
    module, text_class = TEXT_TYPES[kind]
    text = with_defaults(text, module.DEFAULTS[kind])
    fields = module.config_from_hf(text, kind, text_class, tensor_names)
    # the wrapper's key ties (the text_config's is read above and overridden); a head in the file is its own
    tied = bool(hf["tie_word_embeddings"]) and not tensor_names & {PUBLISHED_HEAD, MODULE_HEAD}
    ids = {k: text.get(k) for k in ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id")}
    return {**fields, "tie_embeddings": tied, **{k: v for k, v in ids.items() if v is not None}}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    raise ValueError("mistral3: a multimodal file is not written; its text model is written as its own type "
                     f"({sorted(TEXT_TYPES)})")


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    """The text model's rules under the file's prefix (the registry passes "" when the file's names do not start
    with the published one: then they are the modules' names), its head renamed to sit beside it."""
    kind = "mistral4" if cfg.latent is not None else "mistral"
    module, text_class = TEXT_TYPES[kind]
    text_prefix, head = (prefix, PUBLISHED_HEAD) if prefix else (MODULE_PREFIX, MODULE_HEAD)
    out, aliases = module.rules(cfg, kind, text_class, text_prefix)

    def renamed(name: str) -> str:
        return head if name == MODULE_HEAD else name

    out = [Rule(r.paths, tuple(map(renamed, r.names)), r.load, r.save, r.layers, r.optional) for r in out]
    return out, {renamed(alias): target for alias, target in aliases.items()}


def ignored(hf: dict, names: set[str]) -> tuple[set[str], str]:
    """The vision tower and the projector with its patch merger: the text model never reads them."""
    vision = {n for n in names if n.removeprefix("model.").startswith(VISION)}
    if not vision:
        return set(), ""
    return vision, (f"{len(vision)} tensors of the vision tower and its projector (vision_tower, "
                    "multi_modal_projector with its patch merger) are not used by jaxformer (it reads the text "
                    "model) and were skipped")


_TEXT_HARMLESS = {**llama.ARCHITECTURE.harmless, **mistral4.HARMLESS}
HARMLESS = {**{f"text_config.{key}": why for key, why in _TEXT_HARMLESS.items()},
            "vision_config": "the vision tower's, which jaxformer does not run (text only)",
            **dict.fromkeys(("projector_hidden_act", "multimodal_projector_bias", "spatial_merge_size",
                             "vision_feature_layer"), "the vision projector's, which jaxformer does not run"),
            **dict.fromkeys(("image_token_index", "image_token_id"),
                            "the image placeholder token, which only the vision path reads")}

ARCHITECTURE = Architecture(CLASSES, {"mistral3": PUBLISHED_PREFIX}, (), config_from_hf, config_to_hf, rules,
                            ignored=ignored, defaults=DEFAULTS, harmless=HARMLESS, wrappers=("mistral3",))
