"""The dual-encoder family (CLIP, SigLIP): a text tower and an image tower, each an Encoder of ours, joined by
the similarity of their pooled outputs.

The config's top level is the text tower (its token table, its stack, its pooling: CLIP's at the EOS token,
SigLIP's at the last one through its head); ``config.vision`` holds the image tower's whole config and the small
piece that joins the two: CLIP's projections of both pooled outputs to one width and the learned logit scale,
SigLIP's logit bias. ``logits_per_text = exp(logit_scale) * cos(text, image) (+ logit_bias)``, as transformers'
CLIPModel and SiglipModel compute it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.edges import EdgeMethods
from jaxformer.encoder import Encoder
from jaxformer.layers import Dense, dtype_of, param
from jaxformer.model_config import ModelConfig
from jaxformer.outputs import ContrastiveOutput, ModelOutput

Array = jax.Array


def unit(x: Array) -> Array:
    """x / ||x|| over the last axis, in float32 (transformers divides by the norm, no epsilon)."""
    x = x.astype(jnp.float32)
    return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))


class DualEncoder(EdgeMethods, nnx.Module):
    """``text`` and ``vision`` (Encoders), their projections (CLIP) and the logit scale (and SigLIP's bias)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        vision = cfg.vision
        self.text = Encoder(vision.text_tower(cfg), rngs=rngs)
        self.vision = Encoder(vision.tower, rngs=rngs)
        width = vision.projection
        text_width = cfg.head_options.pooled_projection or cfg.d_model
        self.text_projection = (Dense(cfg, text_width, width, ("embed", "embed_out"), rngs=rngs,
                                      bias=vision.projection_bias) if width else None)
        self.visual_projection = (Dense(cfg, vision.tower.d_model, width, ("embed", "embed_out"), rngs=rngs,
                                        bias=vision.projection_bias) if width else None)
        self.logit_scale = nnx.Param(jnp.full((), vision.logit_scale_init, dtype_of(cfg.param_dtype)), axes=())
        self.logit_bias = param(rngs, (), (), cfg, init="zeros") if vision.logit_bias else None

    def get_text_features(self, input_ids: Array, attention_mask: Array | None = None,
                          position_ids: Array | None = None, *, output_hidden_states: bool = False,
                          output_attentions: bool = False) -> ModelOutput:
        """The text tower's output with its ``pooler_output`` projected (CLIP) or as its head gives it (SigLIP):
        what transformers' ``get_text_features`` returns (the text embedding before normalisation)."""
        out = self.text(input_ids, attention_mask, position_ids=position_ids,
                        output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        projected = out.pooler_output if self.text_projection is None else self.text_projection(out.pooler_output)
        return out.replace(pooler_output=projected)

    def get_image_features(self, pixel_values: Array, *, output_hidden_states: bool = False,
                           output_attentions: bool = False, interpolate_pos_encoding: bool = False,
                           pixel_attention_mask: Array | None = None, spatial_shapes: Array | None = None
                           ) -> ModelOutput:
        """The image tower's output with its ``pooler_output`` projected (CLIP) or as its pooler gives it
        (SigLIP): what transformers' ``get_image_features`` returns. ``interpolate_pos_encoding``: images of
        another size, the positions resampled (``layers/patches.py``)."""
        out = self.vision(pixel_values=pixel_values, output_hidden_states=output_hidden_states,
                          output_attentions=output_attentions, interpolate_pos_encoding=interpolate_pos_encoding,
                          pixel_attention_mask=pixel_attention_mask,
                          spatial_shapes=spatial_shapes)  # (the last two: NaFlex's, SigLIP2)
        projected = out.pooler_output if self.visual_projection is None else self.visual_projection(out.pooler_output)
        return out.replace(pooler_output=projected)

    def similarity(self, text_embeds: Array, image_embeds: Array) -> Array:
        """logits_per_text [B_text, B_image] of unit-length embeddings: scaled cosine similarities (+ bias)."""
        logits = jnp.einsum("TD,ID->TI", text_embeds, image_embeds) * jnp.exp(self.logit_scale[...].astype(jnp.float32))
        return logits if self.logit_bias is None else logits + self.logit_bias[...].astype(jnp.float32)

    def __call__(self, input_ids: Array, pixel_values: Array, attention_mask: Array | None = None,
                 position_ids: Array | None = None, *, output_hidden_states: bool = False,
                 output_attentions: bool = False, interpolate_pos_encoding: bool = False,
                 pixel_attention_mask: Array | None = None, spatial_shapes: Array | None = None) -> ContrastiveOutput:
        """Every image against every text: transformers' CLIPOutput (SigLIP's too), without its loss (the
        objectives compute it: ``jaxformer.train.objectives``)."""
        flags = dict(output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        text = self.get_text_features(input_ids, attention_mask, position_ids, **flags)
        image = self.get_image_features(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding,
                                        pixel_attention_mask=pixel_attention_mask, spatial_shapes=spatial_shapes,
                                        **flags)
        text_embeds, image_embeds = unit(text.pooler_output), unit(image.pooler_output)
        logits_per_text = self.similarity(text_embeds, image_embeds)
        return ContrastiveOutput(logits_per_image=logits_per_text.T, logits_per_text=logits_per_text,
                                 text_embeds=text_embeds, image_embeds=image_embeds, text_model_output=text,
                                 vision_model_output=image)

    def generate(self, *args, **kwargs):
        raise ValueError(f"{self.config.name!r} is a dual encoder (text and image embeddings): it has no language "
                         "model head to generate from")
