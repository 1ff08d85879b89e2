"""Llama 3.2 Vision (``mllama``: MllamaForConditionalGeneration; its text model ``mllama_text_model``:
MllamaForCausalLM, MllamaTextModel). Config and tensor rules, both directions.

The text model is LLaMA's decoder with cross layers at ``cross_attention_layers``: such a layer has no
self-attention, it attends to the images' states (per-head RMSNorms on its queries and keys, no rotary positions)
and adds its attention and its MLP through tanh gates (``cross_attn_attn_gate``, ``cross_attn_mlp_gate``), the
MLP only on tokens that see some image. Its token table has 8 rows past ``vocab_size`` (the image token is
``vocab_size`` itself); the head has ``vocab_size``. jaxformer: ``scores.cross_attention_layers`` (the layer plan's
'cross' mixer, block group ``cross_blocks``) and ``embeddings.extra_rows``.

The joined model is a Decoder whose ``vision`` holds the tiled image tower (interop/mllama_vision.py) and the
projector (``multi_modal_projector``: one Linear with bias from the tower's ``vision_output_dim`` to the text width);
the projected tower output, every image's tiles and patches in a row, is what the cross layers attend to.

A joined file lays its tensors out as published (and as transformers 5 writes them: ``vision_model.*``,
``multi_modal_projector.*``, ``language_model.model.*``, the head ``language_model.lm_head.weight``) or as its
modules name them (``model.vision_model.*``, ``model.multi_modal_projector.*``, ``model.language_model.*``,
``lm_head.weight``); both are read, the first written.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig, Vision
from jaxformer.interop import llama
from jaxformer.interop.mllama_vision import (LEGACY_HARMLESS, MLLAMA_VISION_DEFAULTS, mllama_vision_from_hf,
                                             mllama_vision_rules, mllama_vision_to_hf)
from jaxformer.interop.rules import Architecture, Rule, copy, dense, ids_into_text_config, lm_head, refuse, \
    rope_from_hf, sub_config, text_token_ids, with_defaults

TEXT, JOINED = "mllama_text_model", "mllama"
CLASSES = {JOINED: ("MllamaForConditionalGeneration",), TEXT: ("MllamaForCausalLM", "MllamaTextModel")}
# the joined file's layouts (the registry reads a file with the longest prefix its names start with, writes the
# first): as published and as transformers 5 writes, and as the modules name the tensors
PUBLISHED, MODULES = "language_model.", "model."
EXTRA_ROWS = 8  # MllamaTextModel's embed_tokens: vocab_size + 8 rows
DEFAULT_THETA = 500000.0
# MllamaTextConfig's defaults for the keys read below
TEXT_DEFAULTS = dict(vocab_size=128256, hidden_size=4096, hidden_act="silu", num_hidden_layers=40,
                     num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, rms_norm_eps=1e-5,
                     max_position_embeddings=131072, tie_word_embeddings=False,
                     cross_attention_layers=None, dropout=0.0, bos_token_id=128000, eos_token_id=128001,
                     pad_token_id=128004)
DEFAULT_CROSS_LAYERS = [3, 8, 13, 18, 23, 28, 33, 38]  # what MllamaTextConfig puts where a file says null (or nothing)
DEFAULTS = {TEXT: TEXT_DEFAULTS, JOINED: dict(image_token_index=128256)}


def text_from_hf(hf: dict, model_type: str, arch: str) -> dict[str, Any]:
    """The text model's ModelConfig fields (LLaMA's, its cross layers and the table's extra rows)."""
    refuse(bool(hf["tie_word_embeddings"]), f"{model_type}: tie_word_embeddings=True would tie a head of vocab_size "
           f"rows to a table of vocab_size + {EXTRA_ROWS}; transformers' MllamaForCausalLM has no such model")
    fields = llama.decoder_config(hf, model_type, arch, rope_from_hf(hf, DEFAULT_THETA))
    cross = DEFAULT_CROSS_LAYERS if hf["cross_attention_layers"] is None else hf["cross_attention_layers"]
    refuse(not isinstance(cross, list), f"{model_type}: cross_attention_layers={cross!r} must be a list of layers")
    return {**fields, "cross_attention_layers": tuple(cross), "embedding_extra_rows": EXTRA_ROWS,
            "attention_dropout_rate": hf["dropout"], "vocab_size": hf["vocab_size"]}


def text_to_hf(cfg: ModelConfig, out: dict) -> None:
    llama.decoder_to_hf(cfg, out)
    for key in ("head_dim", "attention_dropout"):  # (MllamaTextConfig has neither: its heads are hidden / heads)
        out.pop(key)
    out.update(cross_attention_layers=list(cfg.scores.cross_attention_layers), dropout=cfg.attention_dropout_rate)


def _part(hf: dict, key: str, defaults: dict) -> dict:
    """A joined file's text_config or vision_config over its class's defaults (MllamaConfig's for none)."""
    return with_defaults(sub_config(hf, key), defaults) if hf.get(key) is not None else dict(defaults)


def joined_from_hf(hf: dict) -> dict[str, Any]:
    """The joined model's fields: the text model's (its vocabulary and token ids too), the tower and the join."""
    text = _part(hf, "text_config", TEXT_DEFAULTS)
    fields = text_from_hf(text, JOINED, "MllamaForCausalLM")
    vision = _part(hf, "vision_config", MLLAMA_VISION_DEFAULTS)
    tower = ModelConfig.from_dict(mllama_vision_from_hf(vision, JOINED))
    width = tower.patches.output_width(tower.d_model)
    refuse(vision["vision_output_dim"] != width, f"{JOINED}: vision_config.vision_output_dim="
           f"{vision['vision_output_dim']} differs from the tower's output width {width} (hidden_size * (1 + "
           "len(intermediate_layers_indices))), which the projector reads")
    image_token = hf["image_token_id"] if "image_token_id" in hf else hf["image_token_index"]
    refuse("vocab_size" in hf and hf["vocab_size"] != text["vocab_size"], f"{JOINED}: vocab_size="
           f"{hf.get('vocab_size')} differs from its text_config's {text['vocab_size']}")
    ids = text_token_ids(text)
    joined = Vision(tower, cross_attention=True, image_token_id=image_token)
    return {**fields, **ids, "vision": joined}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    return joined_from_hf(hf) if model_type == JOINED else text_from_hf(hf, model_type, arch)


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    refuse(not cfg.scores.cross_attention_layers or cfg.embeddings.extra_rows != EXTRA_ROWS or cfg.biases.qkv
           or cfg.window_size is not None or cfg.head_dim_ != cfg.d_model // cfg.num_heads,
           f"{model_type}: a LLaMA decoder with cross_attention_layers, {EXTRA_ROWS} extra token rows, heads of "
           "hidden / heads, no biases and no window")
    refuse((model_type == JOINED) != (cfg.vision is not None), f"{model_type}: the joined model has its tower "
           f"({JOINED}), the text model none ({TEXT})")
    if model_type == TEXT:
        text_to_hf(cfg, out)
        return
    refuse(not cfg.vision.projector_bias, f"{JOINED}: multi_modal_projector has a bias")
    text = {"model_type": TEXT, "vocab_size": cfg.vocab_size}
    text_to_hf(cfg.replace(vision=None), text)
    ids_into_text_config(out, text)
    image = {"model_type": "mllama_vision_model"}
    mllama_vision_to_hf(cfg.vision.tower, image)
    out.update(text_config=text, vision_config=image, image_token_index=cfg.vision.image_token_id)


def text_rules(cfg: ModelConfig, prefix: str, head: str) -> tuple[list[Rule], dict[str, str]]:
    """The text model's rules under ``prefix`` (its layers, embeddings and final norm), the LM head ``head``."""
    layer = f"{prefix}layers.{{i}}"
    cross = cfg.scores.cross_attention_layers
    own = [i for i in range(cfg.decoder_layers) if i not in cross]
    S, C = ("decoder", "blocks"), ("decoder", "cross_blocks")
    self_layers = [*llama.attention_rules(cfg, S, f"{layer}.self_attn"), *llama.norm_rules(S, layer),
                   *llama.gated_mlp_rules(cfg, S, f"{layer}.mlp")]
    a = f"{layer}.cross_attn"
    cross_layers = [*llama.attention_rules(cfg, C, a), *llama.norm_rules(C, layer),
                    *llama.gated_mlp_rules(cfg, C, f"{layer}.mlp"),
                    copy(C + ("attn", "q_norm", "scale"), f"{a}.q_norm.weight"),
                    copy(C + ("attn", "k_norm", "scale"), f"{a}.k_norm.weight"),
                    copy(C + ("attn_gate",), f"{layer}.cross_attn_attn_gate"),
                    copy(C + ("mlp_gate",), f"{layer}.cross_attn_mlp_gate")]
    head_rules, aliases = lm_head(cfg, f"{prefix}embed_tokens.weight")
    head_rules = [Rule(r.paths, tuple(head if n == "lm_head.weight" else n for n in r.names), r.load, r.save,
                       r.layers, r.optional) for r in head_rules]
    return [copy(("embed", "table"), f"{prefix}embed_tokens.weight"),
            copy(("decoder", "final_norm", "scale"), f"{prefix}norm.weight"),
            *[rule.at_layers(own) for rule in self_layers], *[rule.at_layers(cross) for rule in cross_layers],
            *head_rules], aliases


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    if model_type == TEXT:
        return text_rules(cfg, prefix, "lm_head.weight")
    modules = prefix == MODULES
    text, aliases = text_rules(cfg, "model.language_model." if modules else "language_model.model.",
                               "lm_head.weight" if modules else "language_model.lm_head.weight")
    outer = "model." if modules else ""
    return [*mllama_vision_rules(cfg.vision.tower, f"{outer}vision_model.", at=("vision",)),
            *dense(("projector",), f"{outer}multi_modal_projector", True), *text], aliases


# transformers 4's PretrainedConfig keys that 4.45 wrote into both sub-configs, which no class of the model reads
HARMLESS = {**{f"vision_config.{key}": why for key, why in LEGACY_HARMLESS.items()},
            "text_config.decoder_start_token_id": "a decoder-only model's generate starts from the prompt"}

ARCHITECTURE = Architecture(CLASSES, {JOINED: (PUBLISHED, MODULES), TEXT: "model."}, ("MllamaTextModel",),
                            config_from_hf, config_to_hf, rules, defaults=DEFAULTS, harmless=HARMLESS)
