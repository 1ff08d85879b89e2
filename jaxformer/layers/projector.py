"""What joins an image tower to a text decoder that reads images as tokens (LLaVA): the tower's chosen hidden
states projected to the text model's width, and their placement at the image placeholders of input_ids.

``ModelConfig.vision`` says which states (``feature_layers``, ``drop_first_token``) and how the projector is built
(Linear, ``projector_activation``, Linear; biases where ``projector_bias``), as transformers' LlavaMultiModalProjector.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.layers.core import Dense, activate
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
    """How many placeholders one image fills: the tower's tokens, less the first where dropped."""
    return cfg.vision.tower.patches.tokens - int(cfg.vision.drop_first_token)


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
