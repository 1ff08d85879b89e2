"""CLIP's and SigLIP's vision towers (``clip_vision_model``, ``siglip_vision_model``): an encoder of ours with an
image front end (``ModelConfig.patches``), read and written both ways, alone and inside a joined file.

How another architecture uses a tower (``clip``, ``siglip``: the vision half of a dual encoder):

    fields = clip_vision_from_hf(sub_config(hf, "vision_config"), model_type)   # the tower's ModelConfig fields
    tower = ModelConfig.from_dict(fields)
    clip_vision_to_hf(tower, out["vision_config"])                             # every setting written back
    rules = clip_vision_rules(tower, "vision_model.", at=("vision",))          # its tensors, under those names

and the same with ``siglip_vision_*``. ``at`` is where the tower's Encoder sits in the model (its attribute path);
``prefix`` the tensor names' prefix in the file. Each per-layer rule names its layers, so the rules hold wherever
the tower sits. The tower's head is 'none'; its pooler_output is CLIP's post_layernorm of the first token
(``image_pooler='norm'``, last_hidden_state unnormed) or SigLIP's post_layernorm of every state followed by its
attention-pooling head (``image_pooler='attention'``; None without ``vision_use_head``). hidden_states are
transformers': the pre-normed embeddings (CLIP) or the embeddings (SigLIP), then each layer's output, the last
before the final norm. ``interpolate_pos_encoding`` is a call argument here as in transformers (the position table
resampled bicubically for an image of another size: ``layers/patches.py``).

Not read: CLIPVisionModelWithProjection (its projection without bias and its ``image_embeds`` output): the
projection is the dual encoder's (``interop/clip.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, attention, copy, dense,
                                     linear, norm, refuse)

CLIP_VISION_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                            num_channels=3, image_size=224, patch_size=32, hidden_act="quick_gelu",
                            layer_norm_eps=1e-5, attention_dropout=0.0)
SIGLIP_VISION_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                              num_channels=3, image_size=224, patch_size=16, hidden_act="gelu_pytorch_tanh",
                              layer_norm_eps=1e-6, attention_dropout=0.0, vision_use_head=True)


def square(hf: dict, key: str, model_type: str) -> int:
    """An image or patch size as transformers' vision configs take it: an int, or [height, width] when equal."""
    value = hf[key]
    if isinstance(value, (list, tuple)):
        refuse(len(value) != 2 or value[0] != value[1],
               f"{model_type}: {key}={value!r} is not square; jaxformer's image towers take square images and patches")
        value = value[0]
    refuse(isinstance(value, bool) or not isinstance(value, int),
           f"{model_type}: {key}={value!r} must be an int (or [height, width])")
    return value


def last_state_tied(hf: dict, model_type: str) -> bool:
    """``tie_last_hidden_states`` (read by transformers' output capturing, not by the model's own code): True makes
    hidden_states[-1] the final-normed last_hidden_state; unset (None) keeps these towers' own default, False."""
    value = hf.get("tie_last_hidden_states")
    refuse(value is not None and not isinstance(value, bool),
           f"{model_type}: tie_last_hidden_states={value!r} must be true, false or null")
    return bool(value)


def write_last_state_tied(cfg: ModelConfig, out: dict) -> None:
    """``tie_last_hidden_states`` of the tower or text model ``cfg``, written where it is not the default."""
    if cfg.norms.final_in_hidden_states:
        out["tie_last_hidden_states"] = True


def tower_from_hf(hf: dict, model_type: str, *, class_token: bool) -> dict[str, Any]:
    """The fields every pre-norm image tower of transformers (ViT, CLIP, SigLIP) spells alike."""
    image, patch = square(hf, "image_size", model_type), square(hf, "patch_size", model_type)
    refuse(image % patch != 0, f"{model_type}: patch_size={patch} does not divide image_size={image}")
    tokens = (image // patch) ** 2 + int(class_token)
    return dict(family="encoder", vocab_size=0, d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                norm_position="pre", norm_eps=hf["layer_norm_eps"], position="learned", max_positions=tokens,
                attention="bidirectional", head="none", image_size=image, patch_size=patch,
                image_channels=hf["num_channels"], class_token=class_token,
                final_norm_in_hidden_states=last_state_tied(hf, model_type))


def tower_to_hf(cfg: ModelConfig, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
               num_hidden_layers=cfg.encoder_layers, layer_norm_eps=cfg.norms.eps, image_size=cfg.patches.image_size,
               patch_size=cfg.patches.patch_size, num_channels=cfg.patches.channels)
    write_last_state_tied(cfg, out)
    out.pop("vocab_size", None)  # (an image tower has no vocabulary; its config class no such key)


def clip_vision_from_hf(hf: dict, model_type: str = "clip_vision_model") -> dict[str, Any]:
    """ModelConfig fields of a CLIPVisionConfig (a clip_vision_model file, or a clip file's vision_config over
    ``CLIP_VISION_DEFAULTS``): a class token, a patch projection without bias, a norm after the embeddings
    (pre_layrnorm), and the first token normed as pooler_output (post_layernorm), the states left unnormed."""
    return {**tower_from_hf(hf, model_type, class_token=True), "activation": activation(hf["hidden_act"], False,
                                                                                        model_type),
            "patch_bias": False, "embedding_norm": True, "final_norm": False, "image_pooler": "norm",
            "attention_dropout_rate": hf["attention_dropout"]}


def clip_vision_to_hf(cfg: ModelConfig, out: dict) -> None:
    """A CLIPVisionConfig of the tower ``cfg`` into ``out``, every setting written."""
    tower_to_hf(cfg, out)
    out.update(hidden_act=INVERSE_ACTIVATIONS[cfg.activation], attention_dropout=cfg.attention_dropout_rate)


def siglip_vision_from_hf(hf: dict, model_type: str = "siglip_vision_model") -> dict[str, Any]:
    """ModelConfig fields of a SiglipVisionConfig (a siglip_vision_model file, or a siglip file's vision_config
    over ``SIGLIP_VISION_DEFAULTS``): no class token, a final norm over every state (post_layernorm), then the
    attention-pooling head where ``vision_use_head``."""
    head = bool(hf["vision_use_head"])
    return {**tower_from_hf(hf, model_type, class_token=False), "activation": activation(hf["hidden_act"], False,
                                                                                         model_type),
            "final_norm": True, "image_pooler": "attention" if head else None,
            "attention_dropout_rate": hf["attention_dropout"]}


def siglip_vision_to_hf(cfg: ModelConfig, out: dict) -> None:
    """A SiglipVisionConfig of the tower ``cfg`` into ``out``, every setting written."""
    tower_to_hf(cfg, out)
    refuse(cfg.head_options.image_pooler not in (None, "attention"), "siglip_vision_model pools with its "
           f"attention head or not at all, not image_pooler={cfg.head_options.image_pooler!r}")
    out.update(hidden_act="gelu_pytorch_tanh" if cfg.activation == "gelu_tanh" else INVERSE_ACTIVATIONS[cfg.activation],
               attention_dropout=cfg.attention_dropout_rate,
               vision_use_head=cfg.head_options.image_pooler == "attention")


def _within(at: tuple[str, ...], rules: list[Rule]) -> list[Rule]:
    """``rules`` for a tower whose Encoder sits at ``at``: each path under it."""
    return [dataclasses.replace(rule, paths=tuple(at + path for path in rule.paths)) for rule in rules]


def _mlp(path: tuple[str, ...], name: str) -> list[Rule]:
    """CLIP's and SigLIP's MLP (fc1, fc2, both with biases) at ``path``."""
    return [linear(path + ("wi",), f"{name}fc1.weight"), copy(path + ("bi",), f"{name}fc1.bias"),
            linear(path + ("wo",), f"{name}fc2.weight"), copy(path + ("bo",), f"{name}fc2.bias")]


def encoder_layer_rules(cfg: ModelConfig, prefix: str, at: tuple[str, ...] = ()) -> list[Rule]:
    """One CLIP/SigLIP encoder layer's tensors (``{prefix}encoder.layers.{i}``), every layer of the tower."""
    layer = f"{prefix}encoder.layers.{{i}}"
    a, stack = f"{layer}.self_attn.", ("encoder", "blocks")
    rules = [*attention(cfg, stack + ("attn",), *(f"{a}{n}_proj.weight" for n in "qkv"), f"{a}out_proj.weight",
                        *(f"{a}{n}_proj.bias" for n in "qkv"), f"{a}out_proj.bias"),
             *norm(stack + ("attn_norm",), f"{layer}.layer_norm1", True),
             *norm(stack + ("mlp_norm",), f"{layer}.layer_norm2", True),
             *_mlp(stack + ("mlp",), f"{layer}.mlp.")]
    return _within(at, [rule.in_layers(0, cfg.encoder_layers) for rule in rules])


def patch_rule(path: tuple[str, ...], name: str, cfg: ModelConfig) -> Rule:
    """A patch convolution's weight [D, C, p, p] <-> the projection kernel [C * p * p, D]."""
    shape = (cfg.d_model, cfg.patches.channels, cfg.patches.patch_size, cfg.patches.patch_size)
    return Rule((path,), (name,), lambda t: [t[0].reshape(t[0].shape[0], -1).T], lambda p: [p[0].T.reshape(shape)])


def clip_vision_rules(cfg: ModelConfig, prefix: str, at: tuple[str, ...] = ()) -> list[Rule]:
    """The CLIP vision tower's tensors under ``prefix`` ('vision_model.' in CLIP files; '' or 'vision_model.' in a
    clip_vision_model file), read into the Encoder at ``at``."""
    p = prefix
    rules = [copy(("patches", "class_token"), f"{p}embeddings.class_embedding"),
             patch_rule(("patches", "projection", "kernel"), f"{p}embeddings.patch_embedding.weight", cfg),
             copy(("embeddings", "positions", "table"), f"{p}embeddings.position_embedding.weight"),
             *norm(("embeddings", "norm"), f"{p}pre_layrnorm", True),
             *norm(("pooler_norm",), f"{p}post_layernorm", True)]
    return _within(at, rules) + encoder_layer_rules(cfg, p, at)


def siglip_vision_rules(cfg: ModelConfig, prefix: str, at: tuple[str, ...] = ()) -> list[Rule]:
    """The SigLIP vision tower's tensors under ``prefix`` ('vision_model.' in SigLIP files), read into the Encoder
    at ``at``: torch's MultiheadAttention of the pooling head keeps q, k and v in one in_proj [3D, D]. SigLIP2's
    NaFlex tower (``flexible_patches``) projects its flattened patches with a Linear, not a convolution."""
    p = prefix
    kernel, weight = ("patches", "projection", "kernel"), f"{p}embeddings.patch_embedding.weight"
    rules = [linear(kernel, weight) if cfg.patches.flexible else patch_rule(kernel, weight, cfg),
             copy(("patches", "projection", "bias"), f"{p}embeddings.patch_embedding.bias"),
             copy(("embeddings", "positions", "table"), f"{p}embeddings.position_embedding.weight"),
             *norm(("encoder", "final_norm"), f"{p}post_layernorm", True)]
    if cfg.head_options.image_pooler == "attention":
        head, pool = f"{p}head.", ("attention_pooler",)
        split = lambda t: list(t[0].reshape(3, -1, *t[0].shape[1:]))  # noqa: E731  (q, k, v stacked)
        rules += [Rule(tuple(pool + (n, "kernel") for n in "qkv"), (f"{head}attention.in_proj_weight",),
                       lambda t: [w.T for w in split(t)], lambda ps: [np.concatenate([w.T for w in ps])]),
                  Rule(tuple(pool + (n, "bias") for n in "qkv"), (f"{head}attention.in_proj_bias",), split,
                       lambda ps: [np.concatenate(ps)]),
                  *dense(pool + ("o",), f"{head}attention.out_proj"),
                  Rule((pool + ("probe",),), (f"{head}probe",), lambda t: [t[0].reshape(-1)],
                       lambda ps: [ps[0].reshape(1, 1, -1)]),
                  *norm(pool + ("norm",), f"{head}layernorm", True),
                  *_mlp(pool + ("mlp",), f"{head}mlp.")]
    return _within(at, rules) + encoder_layer_rules(cfg, p, at)


_TOWER_HARMLESS = {"dropout": "never read by CLIP's or SigLIP's layers (their dropout is attention_dropout)",
                   "tie_word_embeddings": "a text or image tower has no output head onto a vocabulary to tie",
                   "decoder_start_token_id": "a generation setting; these models generate nothing"}
_IMAGE_IDS = dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id"), "an image tower reads no token ids")


def legacy_harmless(text: str, vision: str | None) -> dict[str, str]:
    """``_TOWER_HARMLESS`` under the text config's path prefix (``text``) and the vision config's (``vision``,
    with the token ids a vision config of transformers 4 still spelled out)."""
    harmless = {f"{text}{key}": reason for key, reason in _TOWER_HARMLESS.items()}
    if vision is not None:
        harmless.update({f"{vision}{key}": reason for key, reason in {**_TOWER_HARMLESS, **_IMAGE_IDS}.items()})
    return harmless


def _config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    return (clip_vision_from_hf if model_type == "clip_vision_model" else siglip_vision_from_hf)(hf, model_type)


def _config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    refuse(cfg.head != "none", f"{model_type} has no head; head={cfg.head!r}")
    (clip_vision_to_hf if model_type == "clip_vision_model" else siglip_vision_to_hf)(cfg, out)


def _rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    return (clip_vision_rules if model_type == "clip_vision_model" else siglip_vision_rules)(cfg, prefix), {}


# Published files nest the tower under vision_model. (transformers 4's classes); transformers 5 writes it bare.
ARCHITECTURE = Architecture(
    {"clip_vision_model": ("CLIPVisionModel",), "siglip_vision_model": ("SiglipVisionModel",)},
    {"clip_vision_model": "vision_model.", "siglip_vision_model": "vision_model."},
    ("CLIPVisionModel", "SiglipVisionModel"), _config_from_hf, _config_to_hf, _rules,
    harmless={**legacy_harmless("", ""),
              "projection_dim": "read by CLIPVisionModelWithProjection alone (CLIPVisionModel has no projection)"},
    defaults={"clip_vision_model": CLIP_VISION_DEFAULTS, "siglip_vision_model": SIGLIP_VISION_DEFAULTS})
