"""CLIP (``clip``: CLIPModel; ``clip_text_model``: CLIPTextModel, CLIPTextModelWithProjection): config and tensor
rules, both directions.

CLIP's text model is a pre-norm encoder whose attention is causal (each token sees itself and the left, the
padding mask beside it), with learned positions, quick_gelu MLPs and a final LayerNorm; its pooled output is the
final-normed state at each row's first EOS token, or at its largest token id when the file says eos_token_id 2
(the rule transformers keeps for the files written before the EOS id was fixed; the real EOS is the largest id
of CLIP's vocabulary). Its hidden states end with the last layer's output before that norm, as transformers
reports them. CLIPModel joins it to the vision model (``interop/vision_towers.py``): both pooled outputs
projected without bias to ``projection_dim``, their cosine similarities scaled by exp(``logit_scale``).

A file's ``text_config_dict`` / ``vision_config_dict`` (written by transformers before 4.27 beside the full
``text_config``) replace the full configs, as CLIPConfig reads them: each sub-config is its class's defaults under
the dict's keys (so the Stable Diffusion safety checker's text model pools at the class's EOS, 49407, whatever its
full text_config says).
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig, Vision
from jaxformer.interop.reference_keys import facts
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, ConfigReader, Rule, activation, copy, linear,
                                     norm, refuse, sub_config, with_defaults)
from jaxformer.interop.vision_towers import (CLIP_VISION_DEFAULTS, clip_vision_from_hf, clip_vision_rules,
                                             clip_vision_to_hf, encoder_layer_rules, last_state_tied, legacy_harmless,
                                             write_last_state_tied)

# CLIPTextConfig's defaults for the keys a file may leave out
TEXT_DEFAULTS = dict(vocab_size=49408, hidden_size=512, intermediate_size=2048, projection_dim=512,
                     num_hidden_layers=12, num_attention_heads=8, max_position_embeddings=77, hidden_act="quick_gelu",
                     layer_norm_eps=1e-5, attention_dropout=0.0, pad_token_id=1, bos_token_id=49406,
                     eos_token_id=49407)
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def merged_sub_config(hf: dict, key: str, sub_type: str, defaults: dict) -> dict:
    """The sub-config ``key`` ('text_config', 'vision_config', of transformers' type ``sub_type``) over its class's
    ``defaults``, as CLIPConfig reads it. A file of transformers before 4.27 holds the older
    ``{key}_dict`` beside it, and then the sub-config is rebuilt from that dict alone: the class's defaults, the
    dict's keys over them; of the full sub-config only the keys its class does not hold survive (those it holds
    count as read: their values are never used). Call ``note_overrides`` once the merged config is read."""
    sub = sub_config(hf, key) if hf.get(key) is not None else ConfigReader({}, getattr(hf, "read", None), f"{key}.")
    if hf.get(f"{key}_dict") is None:
        return with_defaults(sub, defaults)
    override, fields = sub_config(hf, f"{key}_dict"), facts()["types"][sub_type]["defaults"]
    replaced = [name for name in dict.keys(sub) if name in fields]
    for name in replaced:
        _ = name in sub  # (rebuilt from the class's defaults: its value is never used)
    kept = {name: value for name, value in dict(sub).items() if name not in fields}
    merged = {**defaults, **{name: fields[name] for name in replaced}, **kept, **dict(override)}
    return ConfigReader(merged, sub.read, sub.prefix) if isinstance(sub, ConfigReader) else merged


def note_overrides(hf: dict, key: str) -> None:
    """Each key of ``{key}_dict`` whose merged value the architecture read counts as read; the others stay unread,
    to be refused or let go as every unread key is."""
    if isinstance(hf, ConfigReader) and hf.get(f"{key}_dict") is not None:
        override = next(sub for sub in hf.subs if sub.prefix == f"{key}_dict.")
        for name in [name for name in dict.keys(override) if f"{key}.{name}" in hf.read]:
            _ = name in override


def text_fields(hf: dict, model_type: str) -> dict[str, Any]:
    """The ModelConfig fields of a CLIP text config (a CLIPTextModel's file, or a CLIP file's text_config); a bos or
    pad id outside the vocabulary (the class's defaults in a tiny file) is left out, as nothing reads it."""
    vocab = hf["vocab_size"]
    ids = {key: hf[key] for key in TOKEN_IDS if isinstance(hf[key], int) and 0 <= hf[key] < vocab}
    refuse("eos_token_id" not in ids, f"{model_type}: eos_token_id={hf['eos_token_id']!r} is not one id of the "
           f"vocabulary [0, {vocab}); the text model pools at that token")
    return dict(family="encoder", vocab_size=vocab, d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                norm_position="pre", norm_eps=float(hf["layer_norm_eps"]),
                final_norm_in_hidden_states=last_state_tied(hf, model_type),
                activation=activation(hf["hidden_act"], False, model_type), position="learned",
                max_positions=hf["max_position_embeddings"], type_vocab_size=0, attention="causal", head="none",
                pooled_token="eos", dropout_rate=0.0, attention_dropout_rate=float(hf["attention_dropout"]), **ids)


def text_to_hf(cfg: ModelConfig, out: dict) -> None:
    """A CLIP text config for the text tower ``cfg``."""
    options = cfg.head_options
    refuse(options.pooled_token != "eos" or cfg.attention != "causal" or cfg.norms.position != "pre"
           or (options.pooled_projection and options.pooled_projection_bias),
           "clip: a text model pooled at its EOS token under causal pre-norm attention, projected without bias")
    if options.pooled_projection:  # (CLIPTextModelWithProjection's)
        out["projection_dim"] = options.pooled_projection
    out.update(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads,
               intermediate_size=cfg.d_ff, num_hidden_layers=cfg.encoder_layers, layer_norm_eps=cfg.norms.eps,
               hidden_act=INVERSE_ACTIVATIONS[cfg.activation], max_position_embeddings=cfg.max_positions,
               attention_dropout=cfg.attention_dropout_rate,
               **{key: value for key, value in zip(TOKEN_IDS, (cfg.tokens.pad, cfg.tokens.bos, cfg.tokens.eos))})
    write_last_state_tied(cfg, out)


def text_rules(cfg: ModelConfig, prefix: str, at: tuple[str, ...] = ()) -> list[Rule]:
    """A CLIP (or SigLIP) text model's tensors under ``prefix``, read into the Encoder at ``at``."""
    p = prefix
    return [copy(at + ("embed", "table"), f"{p}embeddings.token_embedding.weight"),
            copy(at + ("embeddings", "positions", "table"), f"{p}embeddings.position_embedding.weight"),
            *norm(at + ("encoder", "final_norm"), f"{p}final_layer_norm", True),
            *encoder_layer_rules(cfg, p, at)]


# CLIPConfig's defaults for the keys a file may leave out (its text and vision configs': TEXT_DEFAULTS and
# vision_towers.CLIP_VISION_DEFAULTS)
DEFAULTS = {"clip": dict(projection_dim=512, logit_scale_init_value=2.6592), "clip_text_model": TEXT_DEFAULTS}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    if arch == "CLIPTextModelWithProjection":  # its pooled output projected without bias: text_embeds
        return {**text_fields(hf, model_type), "pooled_projection": hf["projection_dim"],
                "pooled_projection_bias": False}
    if model_type == "clip_text_model":
        return text_fields(hf, model_type)
    text = text_fields(merged_sub_config(hf, "text_config", "clip_text_model", TEXT_DEFAULTS), model_type)
    tower = clip_vision_from_hf(merged_sub_config(hf, "vision_config", "clip_vision_model", CLIP_VISION_DEFAULTS),
                                model_type)
    note_overrides(hf, "text_config")
    note_overrides(hf, "vision_config")
    vision = Vision(ModelConfig.from_dict(tower), projection=hf["projection_dim"],
                    logit_scale_init=float(hf["logit_scale_init_value"]))
    return {**text, "family": "dual_encoder", "head": "contrastive", "vision": vision}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    if model_type == "clip_text_model":
        refuse(cfg.family != "encoder" or cfg.head != "none", "clip_text_model: a text encoder without a head")
        text_to_hf(cfg, out)
        return
    vision = cfg.vision
    refuse(vision is None or not vision.projection or vision.projection_bias or vision.logit_bias,
           "clip: a dual encoder projecting both towers without bias, with no logit bias")
    text, image = {"model_type": "clip_text_model"}, {"model_type": "clip_vision_model"}
    text_to_hf(cfg, text)
    clip_vision_to_hf(vision.tower, image)
    for key in ("vocab_size", *TOKEN_IDS):  # the text model's, in its config alone
        out.pop(key, None)
    out.update(text_config=text, vision_config=image, projection_dim=vision.projection,
               logit_scale_init_value=vision.logit_scale_init)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    if model_type == "clip_text_model":
        projection = [linear(("pooled_projection", "kernel"), "text_projection.weight")]
        return text_rules(cfg, prefix) + (projection if cfg.head_options.pooled_projection else []), {}
    return [*text_rules(cfg, "text_model.", ("text",)),
            *clip_vision_rules(cfg.vision.tower, "vision_model.", ("vision",)),
            linear(("text_projection", "kernel"), "text_projection.weight"),
            linear(("visual_projection", "kernel"), "visual_projection.weight"),
            copy(("logit_scale",), "logit_scale")], {}


_UNREAD = "read by CLIPTextModelWithProjection alone"
# transformers 4's CLIPTextModel nests its tensors under text_model.; transformers 5 writes them bare
ARCHITECTURE = Architecture(
    {"clip": ("CLIPModel",), "clip_text_model": ("CLIPTextModel", "CLIPTextModelWithProjection")},
    {"clip": "", "clip_text_model": "text_model."},
    ("CLIPModel", "CLIPTextModel"), config_from_hf, config_to_hf, rules,
    harmless={**legacy_harmless("", None), **legacy_harmless("text_config.", "vision_config."),
              "projection_dim": f"{_UNREAD} (CLIPTextModel has no projection)",
              "text_config.projection_dim": f"{_UNREAD}; CLIPModel projects both towers to its own projection_dim",
              "vision_config.projection_dim": "read by CLIPVisionModelWithProjection alone; CLIPModel projects both "
                                              "towers to its own projection_dim"},
    defaults=DEFAULTS)
