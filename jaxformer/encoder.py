"""Encoder-only family (BERT and its relatives): embeddings, bidirectional blocks, task heads."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import generate as generation  # the decode loop: model code, it calls .step
from jaxformer.checks import check_inputs, check_segments, public_call
from jaxformer.edges import EdgeMethods
from jaxformer.layer_plan import encoder_pattern
from jaxformer.model_config import ModelConfig, generator_config
from jaxformer.layers import (Dense, Embed, Embeddings, Norm, Stack, Tokens, activate, dropout, embedding_width,
                              packed_validity, param, split_key)
from jaxformer.layers.patches import (AttentionPooler, PatchEmbedding, PatchMerger, TileEmbeddings,
                                      check_flexible_patches, check_merged_patches, check_pixel_values,
                                      check_tiled_pixels, merged_layout, resized_grid_positions)
from jaxformer.outputs import ModelOutput

Array = jax.Array


class PredictionHead(nnx.Module):
    """dense -> activation -> norm: the transform in front of BERT's MLM output, and ModernBERT's in front of
    every head. ``width``: its output (factorised embeddings' width under an MLM head). The activation is the
    config's, its gate's for a gated one (ModernBERT's exact gelu)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, width: int | None = None, axis: str = "embed_out"):
        self.activation = cfg.activation
        width = width or cfg.d_model
        self.transform = Dense(cfg, cfg.d_model, width, ("embed", axis), rngs=rngs, bias=cfg.head_options.dense_bias)
        self.norm = Norm(cfg, rngs=rngs, width=width, axis="embed" if axis == "embed_out" else axis)

    def __call__(self, x: Array) -> Array:
        return self.norm(activate(self.activation, self.transform(x)))


class MaskedLMHead(PredictionHead):
    """BERT/RoBERTa: the prediction head's transform -> vocabulary projection (tied) + bias. With factorised
    embeddings (ALBERT, ELECTRA's generator) the transform narrows to ``embedding_size``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        width, axis = embedding_width(cfg)
        super().__init__(cfg, rngs=rngs, width=width, axis="embed_out" if axis == "embed" else axis)
        self.decoder = (None if cfg.embeddings.tie else
                        Dense(cfg, width, cfg.vocab_size, (axis, "vocab"), rngs=rngs, bias=False))
        self.bias = param(rngs, (cfg.vocab_size,), ("vocab",), cfg, init="zeros") if cfg.head_options.mlm_bias else None

    def __call__(self, x: Array, embed: Embed) -> Array:
        h = super().__call__(x)
        logits = embed.attend(h) if self.decoder is None else self.decoder(h)
        return logits if self.bias is None else logits + self.bias[...].astype(logits.dtype)


class DiscriminatorHead(nnx.Module):
    """ELECTRA's replaced-token detection: dense -> activation -> one logit per token [B, T] (> 0: replaced)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.activation = cfg.activation
        self.dense = Dense(cfg, cfg.d_model, cfg.d_model, ("embed", "embed_out"), rngs=rngs)
        self.prediction = Dense(cfg, cfg.d_model, 1, ("embed", "labels"), rngs=rngs)

    def __call__(self, x: Array) -> Array:
        return self.prediction(activate(self.activation, self.dense(x)))[..., 0]


class SpanFeedForward(nnx.Module):
    """BigBird's span head's own sublayer in front of its classifier: LayerNorm(h + W2 act(W1 h)), a BERT
    feed-forward sublayer (``span_feed_forward``)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.activation, self.dropout_rate = cfg.activation, cfg.dropout_rate
        self.wi = Dense(cfg, cfg.d_model, cfg.d_ff, ("embed", "mlp"), rngs=rngs)
        self.wo = Dense(cfg, cfg.d_ff, cfg.d_model, ("mlp", "embed"), rngs=rngs)
        self.norm = Norm(cfg, rngs=rngs)

    def __call__(self, h: Array, key: Array | None = None) -> Array:
        keys = split_key(key, 2)
        inner = activate(self.activation, self.wi(dropout(h, self.dropout_rate, keys[0])))
        return self.norm(h + dropout(self.wo(inner), self.dropout_rate, keys[1]))


class Encoder(EdgeMethods, nnx.Module):
    """The encoder-only model: embeddings, a bidirectional stack, and the head named by ``config.head``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        width, axis = embedding_width(cfg)
        # an image tower (ViT, CLIP's and SigLIP's vision models) reads pixels through its patches, no token table
        self.embed = (Embed(cfg.vocab_size, cfg, rngs=rngs, axes=("vocab", axis), width=width)
                      if cfg.patches is None else None)
        self.patches = PatchEmbedding(cfg, rngs=rngs) if cfg.patches else None
        # Llama 3.2 Vision: tiled images, and gated layers over the joined tiles after the stack (no final norm there)
        tiled = cfg.patches is not None and cfg.patches.tiles > 0
        self.tiles = TileEmbeddings(cfg, rngs=rngs) if tiled else None
        self.global_encoder = (Stack(cfg.replace(final_norm=False), cfg.patches.global_layers, pattern="bidirectional",
                                     gated=True, rngs=rngs) if tiled and cfg.patches.global_layers else None)
        self.embeddings = Embeddings(cfg, rngs=rngs, token_types=True)
        self.encoder = Stack(cfg, cfg.encoder_layers, pattern=encoder_pattern(cfg), rngs=rngs)
        # Qwen2-VL: each merge x merge block of the output merged into one vector of the text model's width
        self.merger = PatchMerger(cfg, rngs=rngs) if cfg.patches is not None and cfg.patches.merge else None
        self.pooler = (Dense(cfg, cfg.d_model, cfg.d_model, ("embed", "embed_out"), rngs=rngs)
                       if cfg.head_options.pooler else None)
        width = cfg.head_options.pooled_projection  # SigLIP's text head, CLIPTextModelWithProjection's projection
        self.pooled_projection = (Dense(cfg, cfg.d_model, width, ("embed", "embed_out"), rngs=rngs,
                                        bias=cfg.head_options.pooled_projection_bias) if width else None)
        image_pooler = cfg.head_options.image_pooler  # CLIP's norm of the first token, SigLIP's attention pooling
        self.pooler_norm = Norm(cfg, rngs=rngs) if image_pooler == "norm" else None
        self.attention_pooler = AttentionPooler(cfg, rngs=rngs) if image_pooler == "attention" else None
        self.mlm = MaskedLMHead(cfg, rngs=rngs) if cfg.head in ("mlm", "pretraining") else None
        self.nsp = Dense(cfg, cfg.d_model, 2, ("embed", "labels"), rngs=rngs) if cfg.head == "pretraining" else None
        self.discriminator = DiscriminatorHead(cfg, rngs=rngs) if cfg.head == "discriminator" else None
        labels = cfg.head_options.num_labels
        label_count = {"sequence_classification": labels, "token_classification": labels,
                       "question_answering": 2}.get(cfg.head)
        self.classifier = (Dense(cfg, cfg.d_model, label_count, ("embed", "labels"), rngs=rngs)
                           if label_count else None)
        options = cfg.head_options  # BigBird's: the classifier's own dense layer, the span head's sublayer
        self.classifier_transform = (Dense(cfg, cfg.d_model, cfg.d_model, ("embed", "embed_out"), rngs=rngs)
                                     if options.classifier_transform else None)
        self.span_feed_forward = SpanFeedForward(cfg, rngs=rngs) if options.span_feed_forward else None
        self.generator = self._generator(cfg, rngs) if cfg.generator_width else None
        # ModernBERT: the classifiers read the prediction head's transform of their input
        self.prediction = (PredictionHead(cfg, rngs=rngs) if cfg.head_options.prediction_head and label_count else None)

    def _generator(self, cfg: ModelConfig, rngs: nnx.Rngs) -> Encoder:
        """ELECTRA's generator: an MLM encoder reading this model's token, position and type embeddings and
        their norm (the same variables, so both losses train them), with its own projection to its width."""
        generator = Encoder(generator_config(cfg), rngs=rngs)
        generator.embed = self.embed
        shared = generator.embeddings
        shared.positions, shared.token_types, shared.norm = (self.embeddings.positions, self.embeddings.token_types,
                                                             self.embeddings.norm)
        return generator

    def validate(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, *,
                 inputs_embeds=None, segment_ids=None, global_attention_mask=None, pixel_values=None,
                 interpolate_pos_encoding=False, pixel_attention_mask=None, spatial_shapes=None,
                 aspect_ratio_ids=None, aspect_ratio_mask=None, image_grid_thw=None, **_) -> None:
        patches = self.config.patches
        tokens = dict(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                      position_ids=position_ids, token_type_ids=token_type_ids, segment_ids=segment_ids,
                      global_attention_mask=global_attention_mask)
        naflex = dict(pixel_attention_mask=pixel_attention_mask, spatial_shapes=spatial_shapes)
        tiles = dict(aspect_ratio_ids=aspect_ratio_ids, aspect_ratio_mask=aspect_ratio_mask)
        any_size = dict(interpolate_pos_encoding=interpolate_pos_encoding or None)
        if patches is not None and patches.merge:  # Qwen2-VL: the processor's two arrays, nothing else
            self._refuse_inputs("reads images of any size", "pixel_values and image_grid_thw", **tokens, **naflex,
                                **tiles, **any_size)
            check_merged_patches(patches, pixel_values, image_grid_thw)
            return
        if image_grid_thw is not None:
            raise ValueError(f"image_grid_thw describes Qwen2-VL's images of any size; {self.config.name!r} reads "
                             "none (ModelConfig.patch_merge_size is 0)")
        images = pixel_values is not None or interpolate_pos_encoding or any(x is not None for x in naflex.values())
        if patches is not None and patches.tiles:  # Llama 3.2 Vision: the processor's three arrays, nothing else
            self._refuse_inputs("is a tiled image tower", "pixel_values, aspect_ratio_ids and aspect_ratio_mask",
                                **tokens, **naflex, **any_size)
            check_tiled_pixels(patches, pixel_values, *tiles.values())
            return
        if any(x is not None for x in tiles.values()):
            raise ValueError(f"aspect_ratio_ids and aspect_ratio_mask describe tiled images (Llama 3.2 Vision); "
                             f"{self.config.name!r} reads no tiles (ModelConfig.max_tiles is 0)")
        if patches is not None or images:
            self._check_pixels(pixel_values, interpolate_pos_encoding, tuple(naflex.values()), tokens)
            return
        shape = check_inputs(self.config, input_ids, inputs_embeds, attention_mask, position_ids, token_type_ids)
        check_segments(segment_ids, shape, self.config)
        self._check_global_tokens(global_attention_mask, input_ids, shape)
        if self.config.head_options.pooled_token == "eos" and input_ids is None:
            raise ValueError("this text tower pools at its EOS token, found in input_ids: pass input_ids, not "
                             "inputs_embeds")

    def _refuse_inputs(self, kind: str, alone: str, **inputs) -> None:
        """Every one of ``inputs`` given (not None) refused by name: the model (``kind``) reads ``alone``."""
        given = [name for name, value in inputs.items() if value is not None]
        if given:
            raise ValueError(f"{self.config.name!r} {kind}: give {alone} alone, not {' or '.join(given)}")

    def _check_pixels(self, pixel_values, any_size: bool, naflex: tuple, tokens: dict) -> None:
        """An image tower reads ``pixel_values`` alone (of any size when its positions are resampled; NaFlex's
        patches with their mask and grids, ``naflex``); a text model none."""
        patches = self.config.patches
        if patches is None:
            given = ("pixel_values" if pixel_values is not None else "interpolate_pos_encoding" if any_size else
                     "pixel_attention_mask" if naflex[0] is not None else "spatial_shapes")
            raise ValueError(f"{given} given to {self.config.name!r}, which reads token ids (it has no image "
                             "front end: ModelConfig.patch_size is unset)")
        self._refuse_inputs("is an image tower (it has no token table)", "pixel_values", **tokens)
        if patches.flexible:
            if any_size:
                raise ValueError(f"{self.config.name!r} (NaFlex) resizes its positions to every image: "
                                 "interpolate_pos_encoding does not apply")
            check_flexible_patches(patches, pixel_values, *naflex)
            return
        if any(value is not None for value in naflex):
            raise ValueError(f"pixel_attention_mask and spatial_shapes are NaFlex inputs (SigLIP2); "
                             f"{self.config.name!r} reads whole images [batch, {patches.channels}, height, width]")
        if pixel_values is None:
            raise ValueError(f"{self.config.name!r} is an image tower: pixel_values [batch, {patches.channels}, "
                             f"{patches.image_size}, {patches.image_size}] is required")
        check_pixel_values(patches, pixel_values, bool(any_size))

    def _check_global_tokens(self, global_attention_mask, input_ids, shape: tuple[int, int]) -> None:
        """Longformer's global tokens: a mask of the input's shape holding 0 and 1, on a model that has them; the
        span head's default (the question, before the first separator) needs the three separators of a question
        and its context in every row, as transformers asserts."""
        cfg = self.config
        if global_attention_mask is not None:
            if not cfg.scores.global_tokens:
                raise ValueError("global_attention_mask names Longformer's global tokens; this model has none "
                                 "(ModelConfig.global_tokens=False)")
            if tuple(global_attention_mask.shape) != tuple(shape):
                raise ValueError(f"global_attention_mask has shape {tuple(global_attention_mask.shape)} but the input "
                                 f"has shape {tuple(shape)}; they must match")
            if not isinstance(global_attention_mask, jax.core.Tracer) and not np.isin(
                    np.asarray(global_attention_mask), (0, 1)).all():
                raise ValueError("global_attention_mask must hold only 0 (local attention) and 1 (global attention)")
        elif (cfg.scores.global_tokens and cfg.head == "question_answering" and input_ids is not None
              and not isinstance(input_ids, jax.core.Tracer)):
            counts = (np.asarray(input_ids) == cfg.tokens.sep).sum(axis=1)
            if cfg.tokens.sep is None or (counts != 3).any():
                raise ValueError(f"without global_attention_mask the question's tokens (those before the first "
                                 f"sep_token_id={cfg.tokens.sep}) attend globally, which needs exactly three "
                                 f"separators in every row (question, context); rows hold {counts.tolist()}. Pass "
                                 "global_attention_mask to choose the global tokens")

    def global_token_mask(self, input_ids: Array | None, global_attention_mask: Array | None = None,
                          valid: Array | None = None, shape: tuple[int, int] | None = None) -> Array | None:
        """Which tokens attend globally [B, T] (Longformer; None: none), as transformers' heads choose them when the
        call names none: the classifier's first token, the span head's question (the tokens before the first
        separator); none for the other heads. Padding (``valid`` 0) is never global."""
        cfg = self.config
        shape = tuple(input_ids.shape) if shape is None else shape
        if not cfg.scores.global_tokens:
            return None
        if global_attention_mask is not None:
            chosen = global_attention_mask.astype(bool)
        elif cfg.head == "sequence_classification":
            chosen = jnp.zeros(shape, bool).at[:, 0].set(True)
        elif cfg.head == "question_answering" and input_ids is not None:
            question_end = jnp.argmax(input_ids == cfg.tokens.sep, axis=1)
            chosen = jnp.arange(shape[1])[None, :] < question_end[:, None]
        else:
            return None
        return chosen if valid is None else chosen & valid.astype(bool)

    def generate(self, input_ids, attention_mask=None, **kwargs):
        """Refused with a ValueError: an encoder has no LM head to generate from (``jaxformer.generate``)."""
        return generation.generate(self, input_ids, attention_mask, **kwargs)

    @public_call
    def __call__(self, input_ids: Array | None = None, attention_mask: Array | None = None,
                 token_type_ids: Array | None = None, position_ids: Array | None = None, *,
                 inputs_embeds: Array | None = None, output_hidden_states: bool = False,
                 output_attentions: bool = False, dropout_key: Array | None = None,
                 segment_ids: Array | None = None, global_attention_mask: Array | None = None,
                 pixel_values: Array | None = None, interpolate_pos_encoding: bool = False,
                 pixel_attention_mask: Array | None = None, spatial_shapes: Array | None = None,
                 aspect_ratio_ids: Array | None = None, aspect_ratio_mask: Array | None = None,
                 image_grid_thw: Array | None = None) -> ModelOutput:
        """``segment_ids`` [B, T]: documents packed into one row (1, 2, ... per document, 0 on padding); a
        token attends only within its document, whose positions start at 0. ``global_attention_mask`` [B, T]
        (Longformer): 1 where a token attends to every token and every token to it. ``pixel_values``
        [B, C, H, W]: an image tower's input, in place of token ids; with ``interpolate_pos_encoding`` of any size,
        the position table resampled to its grid of patches as transformers' option of that name does. NaFlex
        (``flexible_patches``): ``pixel_values`` [B, N, p * p * C] already patched, ``pixel_attention_mask`` [B, N]
        the real patches, ``spatial_shapes`` [B, 2] each image's grid, to which the position grid is resized.
        Qwen2-VL's towers (``patch_merge_size``): ``pixel_values`` [P, C * T * p * p] with ``image_grid_thw`` [N, 3]
        (``_merged``). Llama 3.2 Vision's (``max_tiles``): ``pixel_values`` [B, images, tiles, C, H, W] with
        ``aspect_ratio_ids`` [B, images] and ``aspect_ratio_mask`` [B, images, tiles] (``_tiled``)."""
        cfg = self.config
        if self.merger is not None:
            return self._merged(pixel_values, image_grid_thw, output_hidden_states, output_attentions, dropout_key)
        if self.tiles is not None:
            return self._tiled(pixel_values, aspect_ratio_ids, aspect_ratio_mask, output_hidden_states,
                               output_attentions, dropout_key)
        absolute = None
        if pixel_values is not None:
            inputs_embeds = self.patches(pixel_values)
            if cfg.patches.flexible:
                absolute = resized_grid_positions(self.embeddings.positions.table[...], spatial_shapes,
                                                  pixel_values.shape[1])
                attention_mask = pixel_attention_mask
            elif interpolate_pos_encoding:
                absolute = self.patches.resampled_positions(self.embeddings.positions.table[...],
                                                            *pixel_values.shape[2:])
        keys = split_key(dropout_key, 3)
        indexed = position_ids is None and not cfg.embeddings.pad_aware_positions
        question = None
        if cfg.head_options.question_out_of_span and input_ids is not None:
            # BigBird: the question ends at the first separator (the first token when a row holds none)
            question_end = jnp.argmax(input_ids == cfg.tokens.sep, axis=1)
            question = jnp.arange(input_ids.shape[1])[None, :] <= question_end[:, None]
            if token_type_ids is None:
                token_type_ids = (~question).astype(jnp.int32)
        if segment_ids is not None and position_ids is None:
            position_ids = self.embeddings.document_positions(segment_ids)
        x, positions = self.embeddings(self.embed, input_ids, inputs_embeds=inputs_embeds, positions=position_ids,
                                       token_type_ids=token_type_ids, key=keys[0], absolute=absolute)
        valid = packed_validity(attention_mask, segment_ids)
        tokens = Tokens(positions, valid, indexed=indexed, segments=segment_ids,
                        global_tokens=self.global_token_mask(input_ids, global_attention_mask, valid, x.shape[:2]))
        encoded = self.encoder(x, tokens,
                               collect_hidden=output_hidden_states, collect_attentions=output_attentions, key=keys[1])
        h, hidden = encoded.hidden, encoded.hidden_states
        pooled = None
        if cfg.head_options.pooled_token is not None:  # a text tower's (CLIP, SigLIP)
            pooled = self._pooled_token(h, input_ids)
        if self.pooler is not None:  # BERT's tanh, DistilBERT's relu (its pre_classifier), ELECTRA's gelu
            pooled = self.pooler(h[:, 0])
            act = cfg.head_options.pooler_activation
            pooled = jnp.tanh(pooled) if act == "tanh" else activate(act, pooled)
        if self.pooler_norm is not None:  # CLIP's image tower: its first token normed, its states not
            pooled = self.pooler_norm(h[:, 0])
        if self.attention_pooler is not None:  # SigLIP's image tower
            pooled = self.attention_pooler(h, valid)
        features = h  # what the token and span classifiers read
        if self.prediction is not None:  # ModernBERT
            if cfg.head == "sequence_classification":
                pooled = self.prediction(self._summary(h, attention_mask))
            else:
                features = self.prediction(h)
        out = dict(last_hidden_state=h, hidden_states=hidden, attentions=encoded.attentions,
                   pooler_output=pooled if self.pooler is not None or cfg.head_options.pooled_token
                   or cfg.head_options.image_pooler else None)
        if self.mlm is not None:
            out["logits"] = self.mlm(h, self.embed)
        if self.nsp is not None:  # next-sentence (BERT) or sentence-order (ALBERT) prediction
            out["nsp_logits"] = self.nsp(pooled)
        if self.discriminator is not None:
            out["logits"] = self.discriminator(h)
        if self.classifier_transform is not None:  # BigBird: dense -> activation of the first token, beside the pooler
            drop = split_key(keys[2], 2)
            summary = activate(cfg.activation, self.classifier_transform(dropout(h[:, 0], cfg.dropout_rate, drop[0])))
            out["logits"] = self.classifier(dropout(summary, cfg.dropout_rate, drop[1]))
        elif cfg.head == "sequence_classification" and cfg.patches is not None:  # ViT's: the class token, no dropout
            out["logits"] = self.classifier(h[:, 0])
        elif cfg.head == "sequence_classification":
            out["logits"] = self.classifier(dropout(pooled, cfg.dropout_rate, keys[2]))
        elif cfg.head == "token_classification":
            out["logits"] = self.classifier(dropout(features, cfg.dropout_rate, keys[2]))
        elif cfg.head == "question_answering":
            if self.span_feed_forward is not None:
                features = self.span_feed_forward(features, keys[2])
            span = self.classifier(features)
            if question is not None:  # BigBird: the question (but the first token) is no answer
                outside = question & (jnp.arange(question.shape[1]) > 0)[None, :]
                span = span - outside[..., None].astype(span.dtype) * 1e6
            out["start_logits"], out["end_logits"] = span[..., 0], span[..., 1]
        return ModelOutput(**out)

    def _merged(self, pixel_values: Array, grid_thw: Array, collect_hidden: bool, collect_attentions: bool,
                key: Array | None) -> ModelOutput:
        """Qwen2-VL's and Qwen2.5-VL's tower over the patches of images of any size [P, C * T * p * p] with
        image_grid_thw [N, 3]: the patches projected and laid out as the stack runs them (``merged_layout``) in one
        row whose frames never see each other (nor, in the 'window' layers, its windows), with 2-D rotary
        positions; the merger's output, back in the processor's order, is pooler_output [P / merge², merged_width]
        (what replaces the image tokens). last_hidden_state and hidden_states [1, P, D] keep the stack's order, as
        transformers returns them."""
        m = self.config.patches.merge
        order, rotary, frames, windows = merged_layout(self.config.patches, grid_thw, pixel_values.shape[0])
        keys = split_key(key, 2)
        x, positions = self.embeddings(None, inputs_embeds=self.patches(pixel_values)[order][None], key=keys[0])
        tokens = Tokens(positions, segments=frames[None], rotary_positions=rotary[None], windows=windows[None])
        out = self.encoder(x, tokens, collect_hidden=collect_hidden, collect_attentions=collect_attentions,
                           key=keys[1])
        restore = jnp.argsort(order[::m * m] // (m * m))  # (each block's patches stay together)
        return ModelOutput(last_hidden_state=out.hidden, hidden_states=out.hidden_states, attentions=out.attentions,
                           pooler_output=self.merger(out.hidden[0])[restore])

    def _tiled(self, pixel_values: Array, ratio_ids: Array, ratio_mask: Array, collect_hidden: bool,
               collect_attentions: bool, key: Array | None) -> ModelOutput:
        """Llama 3.2 Vision's tower over [B, images, tiles, C, H, W]: each tile's patches, the tile embeddings of
        its image's aspect ratio, the embedding norm; each image's tiles joined (every tile's tokens padded to a
        multiple of 8), the stack (its final norm), the post-tile embeddings, the gated global layers; the last
        state beside the intermediate layers' outputs [B, images, tiles, T, D * (1 + intermediates)]. hidden_states:
        the stack's input, each layer's output, then each global layer's, on the joined padded tiles."""
        cfg, patches, tiles = self.config, self.config.patches, self.tiles
        B, images, count = pixel_values.shape[:3]
        N, T, D = B * images, patches.tokens, cfg.d_model
        padded = -(-T // 8) * 8  # (transformers pads each tile's tokens to a multiple of 8)
        ids = ratio_ids.reshape(N)
        x = self.patches(pixel_values.reshape(N * count, *pixel_values.shape[3:])).reshape(N, count, T, D)
        # the pre-tile vectors join the patches before the class token does
        x = jnp.concatenate([x[:, :, :1], tiles.per_tile(x[:, :, 1:], tiles.pre, tiles.pre_gate, ids)], axis=2)
        x, per_tile = tiles.gated_positions(x, self.embeddings.positions.table[...], ids)
        keys = split_key(key, 3)
        x, _ = self.embeddings(None, inputs_embeds=x.reshape(N * count, T, D), absolute=per_tile.reshape(-1, T, D),
                               key=keys[0])
        x = jnp.pad(x.reshape(N, count, T, D), ((0, 0), (0, 0), (0, padded - T), (0, 0))).reshape(N, -1, D)
        valid = (ratio_mask.reshape(N, count, 1).astype(bool) & (jnp.arange(padded) < T)).reshape(N, -1)
        tokens = Tokens(jnp.broadcast_to(jnp.arange(count * padded), valid.shape), valid, indexed=True,
                        outer_padding_mask=True)
        local = self.encoder(x, tokens, collect_hidden=collect_hidden or bool(patches.intermediate_layers),
                             collect_attentions=collect_attentions, key=keys[1])
        h = tiles.per_tile(local.hidden.reshape(N, count, padded, D), tiles.post, tiles.post_gate, ids)
        hidden, attentions = local.hidden_states, local.attentions
        if self.global_encoder is not None:
            out = self.global_encoder(h.reshape(N, -1, D), tokens, collect_hidden=collect_hidden,
                                      collect_attentions=collect_attentions, key=keys[2])
            h = out.hidden.reshape(h.shape)
            hidden = None if not collect_hidden else (*hidden, *out.hidden_states[1:])
            attentions = None if not collect_attentions else (*attentions, *out.attentions)
        # each intermediate output's numbers interleaved along the width, as transformers stacks them last
        picked = [local.hidden_states[i % cfg.encoder_layers + 1] for i in patches.intermediate_layers]  # (0: embedded)
        states = [h] + ([jnp.stack(picked, -1).reshape(N, count, padded, -1)] if picked else [])
        last = jnp.concatenate([s[:, :, :T] for s in states], -1).reshape(B, images, count, T, -1)
        return ModelOutput(last_hidden_state=last, hidden_states=hidden if collect_hidden else None,
                           attentions=attentions)

    def _pooled_token(self, h: Array, input_ids: Array) -> Array:
        """A text tower's pooled output [B, D'] (``pooled_token``): the final-normed state at each row's first EOS
        (CLIP; at its largest id where eos_token_id is 2, the rule transformers keeps for CLIP's early files) or at
        its last token (SigLIP, padding or not), then SigLIP's head."""
        cfg = self.config
        if cfg.head_options.pooled_token == "last":
            pooled = h[:, -1]
        else:
            at = jnp.argmax(input_ids, axis=1) if cfg.tokens.eos == 2 else jnp.argmax(input_ids == cfg.tokens.eos, 1)
            pooled = jnp.take_along_axis(h, at[:, None, None], axis=1)[:, 0]
        return pooled if self.pooled_projection is None else self.pooled_projection(pooled)

    def _summary(self, h: Array, attention_mask: Array | None) -> Array:
        """The sequence classifier's input [B, D]: the first token, or the mean over the real tokens."""
        if self.config.head_options.classifier_pooling == "cls":
            return h[:, 0]
        if attention_mask is None:
            return h.mean(axis=1)
        real = attention_mask.astype(h.dtype)[..., None]
        return (h * real).sum(axis=1) / real.sum(axis=1)
