"""Llama 3.2 Vision's image tower (``mllama_vision_model``: transformers' MllamaVisionModel), alone or inside a
joined file: an encoder of ours whose front end reads tiled images (``ModelConfig.patches`` with ``max_tiles``).

How the joined model (``interop/mllama.py``) uses it:

    fields = mllama_vision_from_hf(with_defaults(sub_config(hf, "vision_config"), MLLAMA_VISION_DEFAULTS))
    tower = ModelConfig.from_dict(fields)
    mllama_vision_to_hf(tower, out["vision_config"])                          # every setting written back
    rules = mllama_vision_rules(tower, "model.vision_model.", at=("vision",))  # its tensors, under those names

The tower (``Encoder._tiled``) reads pixel_values [B, images, max_tiles, C, H, W], aspect_ratio_ids [B, images] and
aspect_ratio_mask [B, images, max_tiles], as MllamaImageProcessor returns them: the patch convolution (no bias),
the class token per tile, the tanh-gated tile embeddings of each image's aspect ratio (``layers/patches.py``:
``TileEmbeddings``), layernorm_pre (the embedding norm), each image's tiles joined with every tile's tokens padded to
a multiple of 8, the local layers (``transformer``) with layernorm_post as the stack's final norm, the post-tile
embeddings, the gated global layers (``global_transformer``: a stack of gated layers, ``LayerSpec.gated``). A
padded token (a padded position or a tile the image does not use) is hidden from padded queries only, as
transformers' mask (the outer product of the padding) hides it. last_hidden_state is transformers' output: the
last state beside the outputs of ``intermediate_layers_indices`` [B, images, tiles, tokens, vision_output_dim].

``vision_output_dim`` is read by MllamaForConditionalGeneration's projector alone (the tower's output width is
hidden_size * (1 + len(intermediate_layers_indices))); the joined model checks it. layernorm_pre and layernorm_post
use torch's default eps 1e-5 whatever ``norm_eps`` says, so a file whose norm_eps differs is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, attention, copy, linear,
                                     norm, refuse)
from jaxformer.interop.vision_towers import legacy_harmless, patch_rule, square

MLLAMA_VISION_DEFAULTS = dict(hidden_size=1280, hidden_act="gelu", num_hidden_layers=32, num_global_layers=8,
                              attention_heads=16, num_channels=3, intermediate_size=5120, vision_output_dim=7680,
                              image_size=448, patch_size=14, norm_eps=1e-5, max_num_tiles=4,
                              intermediate_layers_indices=None, supported_aspect_ratios=None)
# what MllamaVisionConfig puts where a file says null (or nothing)
DEFAULT_INTERMEDIATE_LAYERS = [3, 7, 15, 23, 30]
DEFAULT_ASPECT_RATIOS = [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]
# transformers 4's PretrainedConfig keys a vision_config of 4.45 spells out (Llama 3.2 Vision's published file)
LEGACY_HARMLESS = {**legacy_harmless("", ""), **dict.fromkeys(
    ("dropout", "attention_dropout"), "never read: MllamaVisionModel's attention passes dropout=0.0")}


def mllama_vision_from_hf(hf: dict, model_type: str = "mllama_vision_model") -> dict[str, Any]:
    """ModelConfig fields of a MllamaVisionConfig (a mllama_vision_model file, or a mllama file's vision_config,
    over ``MLLAMA_VISION_DEFAULTS``)."""
    image, patch = square(hf, "image_size", model_type), square(hf, "patch_size", model_type)
    refuse(image % patch != 0, f"{model_type}: patch_size={patch} does not divide image_size={image}")
    refuse(hf["norm_eps"] != 1e-5, f"{model_type}: norm_eps={hf['norm_eps']!r}: layernorm_pre and layernorm_post "
           "keep torch's 1e-5 beside the layers' norm_eps, which jaxformer's one eps per tower cannot express")
    ratios = hf["supported_aspect_ratios"] or DEFAULT_ASPECT_RATIOS
    refuse(ratios == DEFAULT_ASPECT_RATIOS and hf["max_num_tiles"] != 4, f"{model_type}: max_num_tiles="
           f"{hf['max_num_tiles']} with the default supported_aspect_ratios (transformers requires 4)")
    heads = hf["num_attention_heads"] if "num_attention_heads" in hf else hf["attention_heads"]
    intermediate = hf["intermediate_layers_indices"]
    return dict(family="encoder", vocab_size=0, d_model=hf["hidden_size"], num_heads=heads,
                d_ff=hf["intermediate_size"], encoder_layers=hf["num_hidden_layers"], decoder_layers=0,
                norm_position="pre", norm_eps=1e-5, position="learned", max_positions=(image // patch) ** 2 + 1,
                attention="bidirectional", head="none", activation=activation(hf["hidden_act"], False, model_type),
                image_size=image, patch_size=patch, image_channels=hf["num_channels"], class_token=True,
                patch_bias=False, embedding_norm=True, final_norm=True, final_norm_in_hidden_states=False,
                qkv_bias=False, out_bias=False, mlp_bias=True, max_tiles=hf["max_num_tiles"],
                aspect_ratios=tuple(map(tuple, ratios)), global_layers=hf["num_global_layers"],
                intermediate_layers=tuple(DEFAULT_INTERMEDIATE_LAYERS if intermediate is None else intermediate))


def mllama_vision_to_hf(cfg: ModelConfig, out: dict) -> None:
    """A MllamaVisionConfig of the tower ``cfg`` into ``out``, every setting written."""
    patches = cfg.patches
    refuse(patches is None or not patches.tiles, f"{cfg.name!r} is no tiled image tower (max_tiles unset)")
    refuse(cfg.activation not in INVERSE_ACTIVATIONS, f"mllama_vision_model: activation {cfg.activation!r}")
    out.update(hidden_size=cfg.d_model, hidden_act=INVERSE_ACTIVATIONS[cfg.activation],
               num_hidden_layers=cfg.encoder_layers, num_global_layers=patches.global_layers,
               attention_heads=cfg.num_heads, num_channels=patches.channels, intermediate_size=cfg.d_ff,
               vision_output_dim=patches.output_width(cfg.d_model), image_size=patches.image_size,
               patch_size=patches.patch_size, norm_eps=cfg.norms.eps, max_num_tiles=patches.tiles,
               intermediate_layers_indices=list(patches.intermediate_layers),
               supported_aspect_ratios=[list(pair) for pair in patches.aspect_ratios])
    out.pop("vocab_size", None)  # (an image tower has no vocabulary; its config class no such key)


def _layer_rules(cfg: ModelConfig, stack: str, name: str, count: int, gated: bool) -> list[Rule]:
    """The layers of one of the tower's two stacks (``stack``: our Encoder attribute; ``name``: the file's)."""
    layer, blocks = f"{name}.layers.{{i}}", (stack, "blocks")
    a, mlp = f"{layer}.self_attn.", blocks + ("mlp",)
    rules = [*attention(cfg, blocks + ("attn",), *(f"{a}{n}_proj.weight" for n in "qkvo")),
             *norm(blocks + ("attn_norm",), f"{layer}.input_layernorm", True),
             *norm(blocks + ("mlp_norm",), f"{layer}.post_attention_layernorm", True),
             linear(mlp + ("wi",), f"{layer}.mlp.fc1.weight"), copy(mlp + ("bi",), f"{layer}.mlp.fc1.bias"),
             linear(mlp + ("wo",), f"{layer}.mlp.fc2.weight"), copy(mlp + ("bo",), f"{layer}.mlp.fc2.bias")]
    if gated:
        rules += [copy(blocks + ("attn_gate",), f"{layer}.gate_attn"),
                  copy(blocks + ("mlp_gate",), f"{layer}.gate_ffn")]
    return [rule.in_layers(0, count) for rule in rules]


def mllama_vision_rules(cfg: ModelConfig, prefix: str, at: tuple[str, ...] = ()) -> list[Rule]:
    """The tower's tensors under ``prefix`` ('' or 'vision_model.' alone; 'vision_model.' or 'model.vision_model.'
    in a mllama file), read into the Encoder at ``at``."""
    p, tiles = prefix, ("tiles",)
    rules = [copy(("patches", "class_token"), f"{p}class_embedding"),
             patch_rule(("patches", "projection", "kernel"), f"{p}patch_embedding.weight", cfg),
             copy(("embeddings", "positions", "table"), f"{p}gated_positional_embedding.embedding"),
             copy(tiles + ("position_gate",), f"{p}gated_positional_embedding.gate"),
             copy(tiles + ("positions",), f"{p}gated_positional_embedding.tile_embedding.weight"),
             copy(tiles + ("pre",), f"{p}pre_tile_positional_embedding.embedding.weight"),
             copy(tiles + ("pre_gate",), f"{p}pre_tile_positional_embedding.gate"),
             copy(tiles + ("post",), f"{p}post_tile_positional_embedding.embedding.weight"),
             copy(tiles + ("post_gate",), f"{p}post_tile_positional_embedding.gate"),
             *norm(("embeddings", "norm"), f"{p}layernorm_pre", True),
             *norm(("encoder", "final_norm"), f"{p}layernorm_post", True),
             *_layer_rules(cfg, "encoder", f"{p}transformer", cfg.encoder_layers, gated=False)]
    if cfg.patches.global_layers:
        rules += _layer_rules(cfg, "global_encoder", f"{p}global_transformer", cfg.patches.global_layers, gated=True)
    return [dataclasses.replace(rule, paths=tuple(at + path for path in rule.paths)) for rule in rules]


def _config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    return mllama_vision_from_hf(hf, model_type)


def _config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    mllama_vision_to_hf(cfg, out)


def _rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    return mllama_vision_rules(cfg, prefix), {}


# transformers 5 writes the tower bare; a file of transformers 4's layout nests it under vision_model.
ARCHITECTURE = Architecture(
    {"mllama_vision_model": ("MllamaVisionModel",)}, {"mllama_vision_model": "vision_model."}, ("MllamaVisionModel",),
    _config_from_hf, _config_to_hf, _rules,
    harmless={**LEGACY_HARMLESS,
              "vision_output_dim": "read by MllamaForConditionalGeneration's projector alone, not by the tower"},
    defaults={"mllama_vision_model": MLLAMA_VISION_DEFAULTS})
