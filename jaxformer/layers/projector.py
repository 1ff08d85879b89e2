"""What joins an image tower to a text decoder that reads images as tokens (LLaVA): the tower's chosen hidden
states projected to the text model's width, and their placement at the image placeholders of input_ids.

``ModelConfig.vision`` says which states (``feature_layers``, ``drop_first_token``) and how the projector is built
(Linear, ``projector_activation``, Linear; biases where ``projector_bias``), as transformers' LlavaMultiModalProjector;
Gemma 3's (``pooled_tokens``) pools the tower's last state instead (``PooledProjector``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.layers.core import Dense, Norm, activate
from jaxformer.model_config import ModelConfig

Array = jax.Array


def image_states(hidden_states: tuple[Array, ...] | Array, cfg: ModelConfig) -> Array:
    """The tower's states the projector reads [B, T, D * len(feature_layers)]: each feature layer's, without the
    first token where ``drop_first_token``, concatenated along the width."""
    vision = cfg.vision
    chosen = [hidden_states[i] for i in vision.feature_layers]
    if vision.drop_first_token:
        chosen = [h[:, 1:] for h in chosen]
    return jnp.concatenate(chosen, axis=-1)


def features_per_image(cfg: ModelConfig) -> int:
    """How many placeholders one image fills: the tower's tokens, less the first where dropped (Gemma 3: the
    pooled tokens)."""
    if cfg.vision.pooled_tokens:
        return pooled_grid(cfg)[1] ** 2
    return cfg.vision.tower.patches.tokens - int(cfg.vision.drop_first_token)


def pooled_grid(cfg: ModelConfig) -> tuple[int, int]:
    """Gemma 3's pooling of the tower's patch grid: (the window's side, the pooled grid's side). As transformers'
    AvgPool2d: a window of grid // sqrt(pooled_tokens), as many whole windows as fit (grid // window a side,
    which is sqrt(pooled_tokens) where it divides the grid), the patches past them unread."""
    patches = cfg.vision.tower.patches
    grid = patches.image_size // patches.patch_size
    window = grid // math.isqrt(cfg.vision.pooled_tokens)
    return window, grid // window


def check_image_tokens(input_ids, pixel_values, cfg: ModelConfig) -> None:
    """Host-side check: input_ids hold exactly one image placeholder per image feature (the tower's tokens, less
    the first where dropped, per image), as transformers' get_placeholder_mask requires. Traced ids are not
    counted (their values are unknown until run)."""
    if isinstance(input_ids, jax.core.Tracer):
        return
    vision = cfg.vision
    per_image = features_per_image(cfg)
    found = int(np.sum(np.asarray(input_ids) == vision.image_token_id))
    images = np.shape(pixel_values)[0]
    if found != images * per_image:
        raise ValueError(f"input_ids hold {found} image tokens (id {vision.image_token_id}) but the {images} image(s) "
                         f"give {images * per_image} features ({per_image} each): expand each image's placeholder "
                         "to that many tokens (the processor does), one image per placeholder run")


def place_images(embeds: Array, placeholders: Array, features: Array) -> Array:
    """``embeds`` [B, T, D] with its ``placeholders`` [B, T] (bool) replaced by ``features`` [N, S, D] in order,
    row by row: transformers' masked_scatter (the k-th placeholder of the batch takes the k-th feature vector, so an
    image may span rows). The count is checked on the host (``check_image_tokens``) for concrete ids alone: under
    jit (traced ids) a count that disagrees is not caught, and surplus placeholders take the last feature vector
    (the index clamped) where transformers raises."""
    flat = features.reshape(-1, features.shape[-1]).astype(embeds.dtype)
    order = jnp.cumsum(placeholders.reshape(-1)) - 1  # each placeholder's index among the batch's placeholders
    taken = flat[jnp.clip(order, 0, flat.shape[0] - 1)].reshape(embeds.shape)
    return jnp.where(placeholders[..., None], taken, embeds)


class Projector(nnx.Module):
    """LLaVA's multimodal projector: image states [B, S, D_tower * layers] -> [B, S, D]."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        vision = cfg.vision
        width = vision.tower.d_model * len(vision.feature_layers)
        self.activation = vision.projector_activation
        self.linear_1 = Dense(cfg, width, cfg.d_model, ("embed", "embed_out"), rngs=rngs, bias=vision.projector_bias)
        self.linear_2 = Dense(cfg, cfg.d_model, cfg.d_model, ("embed", "embed_out"), rngs=rngs,
                              bias=vision.projector_bias)

    def __call__(self, states: Array) -> Array:
        return self.linear_2(activate(self.activation, self.linear_1(states)))


def image_blocks(token_type_ids: Array) -> Array:
    """Each token's image [B, T]: runs of image tokens (``token_type_ids`` 1) numbered 0, 1, ... along each row,
    -1 on text (transformers' block_sequence_ids for Gemma 3's bidirectional image attention)."""
    image = token_type_ids == 1
    starts = image & ~jnp.pad(image, ((0, 0), (1, 0)))[:, :-1]
    return jnp.where(image, jnp.cumsum(starts, axis=1) - 1, -1)


class PooledProjector(nnx.Module):
    """Gemma 3's multimodal projector: the tower's last state [N, P * P, D_tower] (patches row by row) averaged over
    square windows (``pooled_grid``: ``vision.pooled_tokens`` tokens where the windows tile the grid), RMS-normed with
    (1 + w) at the tower's eps (mm_soft_emb_norm), then times a [D_tower, D] matrix without bias
    (mm_input_projection_weight)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        tower = cfg.vision.tower
        self.grid = tower.patches.image_size // tower.patches.patch_size
        self.window, self.side = pooled_grid(cfg)
        gemma_norm = tower.replace(norm="rmsnorm", norm_scale_offset=1.0, norm_bias=False, dtype=cfg.dtype,
                                   param_dtype=cfg.param_dtype)
        self.norm = Norm(gemma_norm, rngs=rngs)
        self.projection = Dense(cfg, tower.d_model, cfg.d_model, ("embed", "embed_out"), rngs=rngs, bias=False)

    def __call__(self, states: Array) -> Array:
        N, _, D = states.shape
        kept = self.side * self.window  # (the rows and columns of whole windows)
        grid = states.reshape(N, self.grid, self.grid, D)[:, :kept, :kept]
        pooled = jnp.mean(grid.reshape(N, self.side, self.window, self.side, self.window, D), axis=(2, 4))
        return self.projection(self.norm(pooled.reshape(N, self.side * self.side, D)))


def check_grid_images(input_ids, pixel_values, image_grid_thw, cfg: ModelConfig) -> None:
    """Host-side check of Qwen2.5-VL's images: ``pixel_values`` [patches, C * T * p * p] floats and
    ``image_grid_thw`` [N, 3] (each image's frames, rows and columns of patches, rows and columns multiples of the
    merge size) given together, as many patches as the grids hold, and input_ids holding one placeholder per merged
    patch (t * h * w / merge² an image), as transformers' get_placeholder_mask requires. Traced ids are not counted."""
    vision = cfg.vision
    patches = vision.tower.patches
    if not vision.merged:
        raise ValueError(f"image_grid_thw given to {cfg.name!r}, whose tower takes whole images (no patch merger)")
    if pixel_values is None or image_grid_thw is None:
        raise ValueError("pixel_values and image_grid_thw go together: the patches of the images and each image's grid "
                         "(Qwen2VLImageProcessor returns both)")
    grid = np.asarray(image_grid_thw)
    merge = patches.merge
    if grid.ndim != 2 or grid.shape[1] != 3 or not np.issubdtype(grid.dtype, np.integer) or (grid < 1).any() or (
            grid[:, 1:] % merge).any():
        raise ValueError(f"image_grid_thw {grid.tolist()} must be [images, 3] positive ints (frames, rows, columns "
                         f"of patches), rows and columns multiples of the merge size {merge}")
    width = patches.channels * patches.temporal * patches.patch_size ** 2
    want = (int(grid.prod(axis=1).sum()), width)
    if tuple(np.shape(pixel_values)) != want or not jnp.issubdtype(pixel_values.dtype, jnp.floating):
        raise ValueError(f"pixel_values has shape {tuple(np.shape(pixel_values))} ({np.asarray(pixel_values).dtype}); "
                         f"the images of image_grid_thw need floats of shape {want} (patches, channels * "
                         f"temporal_patch_size * patch_size²), as Qwen2VLImageProcessor returns them")
    if isinstance(input_ids, jax.core.Tracer):
        return
    found, features = int(np.sum(np.asarray(input_ids) == vision.image_token_id)), want[0] // merge ** 2
    if found != features:
        each = (grid.prod(axis=1) // merge ** 2).tolist()
        raise ValueError(f"input_ids hold {found} image tokens (id {vision.image_token_id}) but the images give "
                         f"{features} features (t * h * w / {merge}² each, {each}): expand each image's placeholder "
                         "to that many tokens (the processor does)")
