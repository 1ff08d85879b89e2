"""Decoder-only family (GPT-2, GPT-3, LLaMA, Mistral, Qwen2, Mixtral, DeepSeek, Transformer-XL):
embeddings, causal blocks, LM head.

One forward pass (``forward``) serves training and evaluation (``__call__``, whole sequences) and
generation (``step``, over a ``DecodeState``; a prefill is a step over an empty cache). Transformer-XL's
segment memory is carried the same way: ``model(ids, memory=mem)`` returns ``out.memory`` for the next
segment, and a decoding step carries the memory in place of a KV cache.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import kernels
from jaxformer.cache import DecodeState, KVCache, LatentCache, Memory, MemoryKV, empty_cache
from jaxformer import generate as generation  # the decode loop: model code, it calls .step
from jaxformer.checks import (check_inputs, check_memory, check_position_streams, check_prefix_lengths, check_segments,
                              public_call, refuse_videos)
from jaxformer.edges import EdgeMethods
from jaxformer.encoder import Encoder
from jaxformer.model_config import ModelConfig
from jaxformer.layers.weights import output_major
from jaxformer.layers.positions import PerLayerInputs, mrope_positions
from jaxformer.layers.patches import check_pixel_values
from jaxformer.layers.projector import (PooledProjector, Projector, check_grid_images, check_image_tokens, image_blocks,
                                        image_states, place_images)
from jaxformer.layers import (Buffer, Dense, Embed, Embeddings, EncoderOutput, Stack, StackOutput, Tokens, dtype_of,
                              left_padded_positions, load_balancing_loss, packed_validity, split_key)
from jaxformer.outputs import ModelOutput

Array = jax.Array


def make_lm_head(cfg: ModelConfig, rngs: nnx.Rngs) -> tuple[Dense | None, Buffer | nnx.Param | None]:
    """The LM head's own parameters: a [D, V] projection unless tied, and a logits bias: BART's fixed
    one or XLNet's trained one."""
    lm_head = (Dense(cfg, cfg.d_model, cfg.vocab_size, ("embed", "vocab"), rngs=rngs, bias=False)
               if cfg.head == "lm" and not cfg.embeddings.tie else None)
    zeros = jnp.zeros((cfg.vocab_size,), dtype_of(cfg.param_dtype))
    bias = (Buffer(zeros, axes=("vocab",)) if cfg.logits.fixed_bias else
            nnx.Param(zeros, axes=("vocab",)) if cfg.logits.trained_bias else None)
    return lm_head, bias


def lm_logits(model: nnx.Module, x: Array) -> Array:
    """Next-token logits from the tied embedding or a separate [D, V] projection (+ a bias, scaled, soft-capped)."""
    cfg: ModelConfig = model.config
    if model.lm_head is not None:
        logits = model.lm_head(x)
    else:
        if cfg.logits.scale_tied:  # T5 v1.0 rescales before reusing the input embedding
            x = x * jnp.asarray(cfg.d_model ** -0.5, x.dtype)
        logits = model.embed.attend(x)
    if model.logits_bias is not None:
        logits = logits + model.logits_bias[...].astype(logits.dtype)
    if cfg.logits.multiplier != 1.0:  # Cohere's logit_scale, as torch scales by a Python float: in float32
        logits = (logits.astype(jnp.float32) * jnp.float32(cfg.logits.multiplier)).astype(logits.dtype)
    if cfg.logits.divisor != 1.0:  # Granite's logits_scaling
        logits = logits / jnp.asarray(cfg.logits.divisor, logits.dtype)
    if cfg.logits.softcap is not None:  # Gemma 2: logits bounded to (-cap, cap)
        logits = jnp.tanh(logits / cfg.logits.softcap) * cfg.logits.softcap
    return logits


def step_logits(model: nnx.Module, h: Array, every_position: bool = False, head: bool = True) -> Array:
    """A cached step's output: float32 logits [B, V] of the last position only, or [B, T, V] of each of the
    step's T positions (verifying T - 1 drafted tokens at once). ``head`` False: the last position's hidden state
    [B, D] instead (a packed serving call, whose logits only some rows need: ``serving.engine.head_program``)."""
    if not head:
        return h[:, -1]
    if every_position:
        return lm_logits(model, h).astype(jnp.float32)
    return lm_logits(model, h[:, -1:])[:, 0].astype(jnp.float32)


def cross_projector(cfg: ModelConfig, rngs: nnx.Rngs) -> Dense:
    """Llama 3.2 Vision's multi_modal_projector: one Linear from the tiled tower's output to the text width."""
    tower = cfg.vision.tower
    return Dense(cfg, tower.patches.output_width(tower.d_model), cfg.d_model, ("embed", "embed_out"), rngs=rngs,
                 bias=cfg.vision.projector_bias)


def unstacked_decoder(model: nnx.Module, always: bool = False) -> nnx.Module:
    """``model`` for a loop of many cached steps: on CPU (or ``always``) a copy whose decoder layers are sliced out
    of the stack once (``Stack.unstacked``), elsewhere (or when they already are: ``decoding_copy``) the model
    itself."""
    unstacked = any(isinstance(blocks, tuple) for blocks in model.decoder.block_groups().values())
    if not (always or kernels.unstack_decode_loops()) or unstacked:
        return model
    copy = nnx.merge(*nnx.split(model))
    copy.decoder = model.decoder.unstacked()
    return copy


def decoding_copy(model: nnx.Module) -> nnx.Module:
    """A copy of ``model`` laid out once for decoding on CPU (elsewhere the model itself): its decoder layers
    sliced out of the stack and its projection kernels stored outputs first (``weights.output_major``), made
    here, eagerly, so that every generation on it skips both. The turn is for CPUs: XLA's matrix-vector
    product there streams an [outputs, inputs] kernel 1.37x faster than an [inputs, outputs] one (a loop of
    gpt2's MLP kernels, batch 1), but a transpose inside the generation program costs more than a short
    generation gains (200 ms a call for gpt2) and XLA moved it into the loop unless its layout was pinned.
    The copy runs the same family code to the same numbers (float32 rounding apart) and the same tokens; it
    is not for training, and saving, exporting and merging it are refused (``weights.refuse_decoding_copy``)."""
    if not kernels.unstack_decode_loops():
        return model
    copy = unstacked_decoder(model)
    copy = nnx.merge(*nnx.split(copy)) if copy is model else copy
    output_major(copy)
    return copy


class Decoder(EdgeMethods, nnx.Module):
    """The decoder-only model: token (+ position) embeddings, a causal stack, an LM head."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embed = Embed(cfg.token_rows, cfg, rngs=rngs)
        self.embeddings = Embeddings(cfg, rngs=rngs)
        self.decoder = Stack(cfg, cfg.decoder_layers, pattern=cfg.attention, rngs=rngs)
        self.lm_head, self.logits_bias = make_lm_head(cfg, rngs)
        # Gemma 4: a second table and a projection of the embeddings, a slice of which each layer reads
        self.per_layer_inputs = (PerLayerInputs(cfg, cfg.decoder_layers, rngs=rngs)
                                 if cfg.embeddings.per_layer_width else None)
        # LLaVA: an image tower whose projected states take the places of the image placeholders of input_ids
        self.vision = Encoder(cfg.vision.tower, rngs=rngs) if cfg.vision is not None else None
        # (Qwen2.5-VL's tower ends in its own merger: no projector)
        self.projector = (None if cfg.vision is None or cfg.vision.merged else PooledProjector(cfg, rngs=rngs)
                          if cfg.vision.pooled_tokens else cross_projector(cfg, rngs) if cfg.vision.cross_attention
                          else Projector(cfg, rngs=rngs))

    def validate(self, input_ids=None, attention_mask=None, position_ids=None, *, prefix_lengths=None,
                 inputs_embeds=None, token_type_ids=None, memory=None, segment_ids=None, pixel_values=None,
                 image_grid_thw=None, aspect_ratio_ids=None, aspect_ratio_mask=None, cross_attention_states=None,
                 cross_attention_mask=None, mm_token_type_ids=None, **others) -> None:
        two_stream = sorted({"perm_mask", "target_mapping"} & set(others))
        if two_stream:  # what an XLNet user may pass from transformers' signature
            raise ValueError(f"{', '.join(two_stream)}: XLNet's two-stream permutation pretraining is not supported; "
                             "jaxformer runs its content stream (Transformer-XL: causal or bidirectional attention "
                             "over a segment memory)")
        refuse_videos(others)
        streams = check_position_streams(self.config, position_ids, input_ids, inputs_embeds)
        shape = check_inputs(self.config, input_ids, inputs_embeds, attention_mask, None if streams else position_ids,
                             token_type_ids)
        check_prefix_lengths(prefix_lengths, self.config, *shape)
        check_memory(memory, self.config, shape[0])
        check_segments(segment_ids, shape, self.config)
        cross = (aspect_ratio_ids, aspect_ratio_mask, cross_attention_states, cross_attention_mask)
        if self.config.scores.cross_attention_layers or any(value is not None for value in cross):
            self._check_cross_inputs(shape, pixel_values, *cross)
        elif pixel_values is not None or image_grid_thw is not None:
            self._check_images(input_ids, pixel_values, image_grid_thw)
        if mm_token_type_ids is not None:
            self._check_mm_token_types(input_ids, mm_token_type_ids)

    def _check_mm_token_types(self, input_ids, types) -> None:
        """Qwen2-VL's ``mm_token_type_ids`` (its processor's): transformers finds the image tokens of M-RoPE's
        position streams by them, we by image_token_id, so they must mark exactly those tokens (1; text 0)."""
        cfg = self.config
        if cfg.vision is None or cfg.rotary is None or cfg.rotary.sections is None:
            raise ValueError(f"mm_token_type_ids mark the image tokens of M-RoPE's position streams (Qwen2-VL, "
                             f"Qwen2.5-VL); {cfg.name!r} does not read them")
        if input_ids is None or np.shape(types) != np.shape(input_ids):
            raise ValueError(f"mm_token_type_ids has shape {np.shape(types)}; want input_ids' shape "
                             f"{None if input_ids is None else np.shape(input_ids)} (one type per token)")
        if isinstance(types, jax.core.Tracer) or isinstance(input_ids, jax.core.Tracer):
            return
        types, images = np.asarray(types), np.asarray(input_ids) == cfg.vision.image_token_id
        if (types == 2).any():
            raise ValueError("mm_token_type_ids marks video tokens (2): videos are not supported; jaxformer's "
                             "vision-language models read images")
        if not np.array_equal(types, images.astype(types.dtype)):
            raise ValueError(f"mm_token_type_ids must be 1 exactly on the image tokens (id {cfg.vision.image_token_id})"
                             " and 0 elsewhere, as the processor writes them: the image tokens are found by their id")

    def _check_cross_inputs(self, shape: tuple[int, int], pixel_values, aspect_ratio_ids, aspect_ratio_mask, states,
                            mask) -> None:
        """Llama 3.2 Vision's image inputs: the tower's (checked by it) or the states themselves [B, S, D], not both,
        and ``cross_attention_mask`` [B, T, images, tiles] over whole tiles of them."""
        cfg = self.config
        if not cfg.scores.cross_attention_layers:
            raise ValueError(f"aspect_ratio_ids, aspect_ratio_mask, cross_attention_states and cross_attention_mask "
                             f"are Llama 3.2 Vision's inputs; {cfg.name!r} has no cross_attention_layers")
        if pixel_values is not None and states is not None:
            raise ValueError("pass pixel_values or cross_attention_states, not both (transformers refuses both too)")
        if pixel_values is not None:
            if self.vision is None:
                raise ValueError(f"pixel_values given to {cfg.name!r}, a text model without its image tower: pass "
                                 "the images' states as cross_attention_states")
            if aspect_ratio_ids is None:
                raise ValueError("pixel_values go with aspect_ratio_ids (and aspect_ratio_mask): the processor's")
            self.vision.validate(pixel_values=pixel_values, aspect_ratio_ids=aspect_ratio_ids,
                                 aspect_ratio_mask=aspect_ratio_mask)
            tiled = np.shape(pixel_values)
            source = (tiled[0], tiled[1] * tiled[2] * cfg.vision.tower.patches.tokens) if len(tiled) == 6 else None
        else:
            source = None if states is None else tuple(np.shape(states)[:2])
            if states is not None and (np.ndim(states) != 3 or np.shape(states)[::2] != (shape[0], cfg.d_model)):
                raise ValueError(f"cross_attention_states has shape {np.shape(states)}; want [{shape[0]}, S, "
                                 f"{cfg.d_model}] (batch, image states, hidden size)")
        if mask is None:
            return
        mask_shape = tuple(np.shape(mask))
        if source is None or len(mask_shape) != 4 or mask_shape[:2] != shape or (
                source[1] % (mask_shape[2] * mask_shape[3])):
            raise ValueError(f"cross_attention_mask has shape {mask_shape}; want [{shape[0]}, {shape[1]}, images, "
                             "tiles] beside images (pixel_values or cross_attention_states) whose states split into "
                             "that many tiles")

    def _check_images(self, input_ids, pixel_values, image_grid_thw=None) -> None:
        """Images go with input_ids holding one placeholder per image feature, to a model that reads images."""
        vision = self.config.vision
        if vision is None:
            raise ValueError(f"pixel_values given to {self.config.name!r}, which reads no images (it has no vision "
                             "tower: ModelConfig.vision is None)")
        if input_ids is None:
            raise ValueError("pixel_values go with input_ids, whose image_token_id placeholders the images replace; "
                             "inputs_embeds cannot say where they go")
        if vision.merged or image_grid_thw is not None:  # Qwen2.5-VL: patches of images of any size, and their grids
            check_grid_images(input_ids, pixel_values, image_grid_thw, self.config)
            return
        check_pixel_values(vision.tower.patches, pixel_values)
        check_image_tokens(input_ids, pixel_values, self.config)

    def embed_images(self, input_ids: Array, pixel_values: Array, image_grid_thw=None) -> Array:
        """The token embeddings of ``input_ids`` [B, T] with each image placeholder replaced by an image feature:
        the image tower's chosen states of ``pixel_values`` [N, C, H, W], projected (LLaVA's get_image_features,
        then masked_scatter; Gemma 3's pooled projector reads the tower's last state). The token embeddings carry
        the model's embedding scale, the image features none (transformers scales inside embed_tokens). Qwen2.5-VL:
        ``pixel_values`` [patches, C * T * p * p] of the images ``image_grid_thw`` [N, 3], merged by the tower."""
        if self.config.vision.merged:
            features = self.vision(pixel_values=pixel_values, image_grid_thw=image_grid_thw).pooler_output
            return place_images(self.embed(input_ids), input_ids == self.config.vision.image_token_id, features)
        pooled = self.config.vision.pooled_tokens
        tower = self.vision(pixel_values=pixel_values, output_hidden_states=not pooled)
        features = self.projector(tower.last_hidden_state if pooled else image_states(tower.hidden_states, self.config))
        text = self.embeddings.scaled(self.embed(input_ids))
        return place_images(text, input_ids == self.config.vision.image_token_id, features)

    def forward(self, input_ids: Array | None, *, inputs_embeds: Array | None = None, valid: Array | None = None,
                positions: Array | None = None, prefix_lengths: Array | None = None,
                cache: KVCache | LatentCache | None = None, memory: Memory | None = None,
                token_types: Array | None = None, collect_hidden: bool = False, collect_attentions: bool = False,
                key: Array | None = None, segments: Array | None = None, pixel_values: Array | None = None,
                image_grid_thw=None, rotary_positions: Array | None = None, cross_states: Array | None = None,
                image_mask: Array | None = None) -> StackOutput:
        """The one forward pass: embeddings, then the causal stack over ``cache`` or ``memory`` (if any).
        ``segments``: packed documents, each at its own positions unless ``positions`` are given. ``pixel_values``:
        images whose features enter as the embeddings of the image placeholders (a prefill; decode steps are text).
        M-RoPE (``rope_sections``): ``rotary_positions`` [B, T, 3] turn the rotary angles (masks follow ``positions``);
        None: ``positions`` on all three streams when given (as transformers spreads a caller's 2-D position_ids,
        images or not), else those of the images ``image_grid_thw`` in input_ids.
        Llama 3.2 Vision: ``cross_states`` [B, S, D], the images' states its cross layers attend to (a cached step's
        are in its ``ImageCache``), ``image_mask`` [B, T, S] which of them each token sees (``Stack``)."""
        keys = split_key(key, 2)
        if pixel_values is not None:
            inputs_embeds = self.embed_images(input_ids, pixel_values, image_grid_thw)
        if rotary_positions is None and image_grid_thw is not None and positions is None:
            rotary_positions = self.image_positions(input_ids, valid, image_grid_thw)
        blocks = None
        if self.config.vision is not None and self.config.vision.bidirectional_images and token_types is not None:
            blocks, token_types = image_blocks(token_types), None  # (Gemma 3's token types mark images)
        if positions is None and valid is not None and segments is None and self.config.embeddings.positions_from_mask:
            positions = left_padded_positions(valid)  # OPT: each row counts its real tokens from 0
        indexed = positions is None and cache is None and not self.config.embeddings.pad_aware_positions
        if segments is not None and positions is None:
            positions = self.embeddings.document_positions(segments)
        x, at = self.embeddings(self.embed, input_ids, inputs_embeds=inputs_embeds, positions=positions, key=keys[0],
                                prescaled=pixel_values is not None)
        tokens = Tokens(at, packed_validity(valid, segments), prefix_lengths, indexed, segments, ids=input_ids,
                        image_blocks=blocks, rotary_positions=rotary_positions)
        per_layer = None
        if self.per_layer_inputs is not None:
            if input_ids is None:
                raise ValueError("per-layer inputs (Gemma 4) look up input_ids in their own table: pass input_ids, "
                                 "not inputs_embeds")
            per_layer = self.per_layer_inputs(input_ids, x)
        cross = None if cross_states is None else EncoderOutput(cross_states)
        return self.decoder(x, tokens, cache=cache, memory=memory, cross=cross, image_mask=image_mask,
                            token_types=token_types, collect_hidden=collect_hidden,
                            collect_attentions=collect_attentions, key=keys[1], per_layer_inputs=per_layer)

    def cross_inputs(self, pixel_values: Array | None, aspect_ratio_ids: Array | None, aspect_ratio_mask: Array | None,
                     states: Array | None, cross_attention_mask: Array | None) -> tuple[Array | None, Array | None]:
        """Llama 3.2 Vision: the images' states [B, S, D] its cross layers attend to (the tower's output of
        ``pixel_values``, projected; or ``states`` as given) and which of them each token sees [B, T, S]: each
        tile's flag of ``cross_attention_mask`` [B, T, images, tiles] over that tile's states (None: all)."""
        if pixel_values is not None:
            tower = self.vision(pixel_values=pixel_values, aspect_ratio_ids=aspect_ratio_ids,
                                aspect_ratio_mask=aspect_ratio_mask)
            states = self.projector(tower.last_hidden_state.reshape(pixel_values.shape[0], -1,
                                                                    tower.last_hidden_state.shape[-1]))
        if states is None or cross_attention_mask is None:
            return states, None
        batch, length, images, tiles = cross_attention_mask.shape
        per_tile = states.shape[1] // (images * tiles)
        flags = jnp.asarray(cross_attention_mask).reshape(batch, length, images * tiles)
        return states, jnp.repeat(flags, per_tile, axis=-1).astype(bool)

    def image_positions(self, input_ids: Array, valid: Array | None, image_grid_thw) -> Array:
        """M-RoPE's position streams [B, T, 3] of a prompt holding the images ``image_grid_thw`` [N, 3]."""
        vision = self.config.vision
        return mrope_positions(input_ids, valid, image_grid_thw, vision.image_token_id, vision.tower.patches.merge)

    def generate(self, input_ids, attention_mask=None, **kwargs):
        """Hugging Face's ``generate`` (greedy, sampling, beams, drafting): ``jaxformer.generate.generate``."""
        return generation.generate(self, input_ids, attention_mask, **kwargs)

    @public_call
    def __call__(self, input_ids: Array | None = None, attention_mask: Array | None = None,
                 position_ids: Array | None = None, *, prefix_lengths: Array | None = None,
                 inputs_embeds: Array | None = None, token_type_ids: Array | None = None,
                 memory: Memory | None = None, output_hidden_states: bool = False, output_attentions: bool = False,
                 dropout_key: Array | None = None, segment_ids: Array | None = None,
                 pixel_values: Array | None = None, image_grid_thw=None, aspect_ratio_ids: Array | None = None,
                 aspect_ratio_mask: Array | None = None, cross_attention_states: Array | None = None,
                 cross_attention_mask: Array | None = None, mm_token_type_ids: Array | None = None) -> ModelOutput:
        """Logits of every position. Transformer-XL models (``position='xl'``) also take the ``memory`` of the
        previous segment (None: start fresh) and return the next one as ``out.memory``; XLNet's
        ``token_type_ids`` are its relative segments (Gemma 3's mark image tokens, 1: each image's see each other).
        ``segment_ids`` [B, T]: documents packed into one row
        (1, 2, ... per document, 0 on padding); a token attends only within its document, whose positions
        start at 0. ``pixel_values`` [N, C, H, W] (LLaVA): images whose projected features replace the
        ``vision.image_token_id`` placeholders of input_ids, in order; Qwen2.5-VL's [patches, C * T * p * p] with
        ``image_grid_thw`` [N, 3] (concrete: the tower lays out its windows on the host). M-RoPE models take
        ``position_ids`` [3, B, T] (temporal, height, width) as transformers' do, or [B, T] for all three (either
        wins over the streams of image_grid_thw's images, as in transformers).
        Llama 3.2 Vision reads its images through cross layers: ``pixel_values`` [B, images, tiles, C, H, W] with
        ``aspect_ratio_ids`` [B, images] and ``aspect_ratio_mask`` [B, images, tiles], or their states
        ``cross_attention_states`` [B, S, D] given as they are, and ``cross_attention_mask`` [B, T, images, tiles]
        (1 where a token sees a tile; None: every token sees every tile). Qwen2-VL's ``mm_token_type_ids`` (1 on the
        image tokens) are checked to mark the image_token_id placeholders, which place the images here."""
        cfg = self.config
        cross_states = image_mask = None
        if cfg.scores.cross_attention_layers:
            cross_states, image_mask = self.cross_inputs(pixel_values, aspect_ratio_ids, aspect_ratio_mask,
                                                         cross_attention_states, cross_attention_mask)
            pixel_values = None
        streams = position_ids is not None and jnp.ndim(position_ids) == 3
        rotary = jnp.moveaxis(jnp.asarray(position_ids), 0, -1) if streams else None
        out = self.forward(input_ids, inputs_embeds=inputs_embeds, valid=attention_mask,
                           positions=None if streams else position_ids,
                           prefix_lengths=prefix_lengths, memory=memory, token_types=token_type_ids,
                           collect_hidden=output_hidden_states, collect_attentions=output_attentions, key=dropout_key,
                           segments=segment_ids, pixel_values=pixel_values, image_grid_thw=image_grid_thw,
                           rotary_positions=rotary, cross_states=cross_states, image_mask=image_mask)
        logits = lm_logits(self, out.hidden) if cfg.head == "lm" else None
        aux = load = None
        if out.router_stats is not None:
            aux = cfg.experts.aux_loss_coef * load_balancing_loss(out.router_stats, cfg)
            load = out.router_stats["load"]
        return ModelOutput(logits=logits, last_hidden_state=out.hidden, hidden_states=out.hidden_states,
                           attentions=out.attentions, aux_loss=aux, router_load=load, memory=out.memory)

    def init_memory(self, batch: int, length: int | None = None) -> Memory:
        """An empty Transformer-XL memory of ``length`` tokens per row (None: the config's memory_len); any
        length works, so evaluation may remember more than training did."""
        cfg = self.config
        length = cfg.segment_memory if length is None else length
        if cfg.position != "xl" or isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"init_memory needs a Transformer-XL model (position='xl', not {cfg.position!r}) and a "
                             f"memory length >= 0, got {length!r}")
        return Memory.empty(cfg.decoder_layers, batch, length, cfg.d_model, dtype_of(cfg.dtype))

    def init_cache(self, batch: int, length: int, prefix_lengths: Array | None = None, rewind: int = 0
                   ) -> DecodeState:
        """An empty state for ``length`` tokens per row (only the kv heads are cached, or MLA's latents);
        windowed layers keep a ring of window + ``rewind`` slots, ``rewind`` being the most a step writes and
        then rewinds (drafts; ``cache.empty_cache``). Transformer-XL carries its segment memory instead, as
        keys and values (``MemoryKV``): memory_len tokens, whatever ``length`` (all ``length`` when the model
        has no memory_len)."""
        cfg = self.config
        if cfg.position == "xl":
            window = cfg.segment_memory or length
            return DecodeState(MemoryKV.empty(cfg.decoder_layers, batch, window, cfg.kv_heads, cfg.head_dim_,
                                              dtype_of(cfg.dtype)))
        cache = empty_cache(cfg, cfg.decoder_layers, batch, length, dtype_of(cfg.dtype), rewind)
        sections = cfg.rotary is not None and cfg.rotary.sections is not None
        return DecodeState(cache, prefix_lengths=prefix_lengths,
                           rope_deltas=jnp.zeros((batch, 3), jnp.int32) if sections else None)

    def step(self, ids: Array, positions: Array, valid: Array, state: DecodeState, every_position: bool = False,
             head: bool = True, pixel_values: Array | None = None, token_type_ids: Array | None = None,
             image_grid_thw=None, aspect_ratio_ids: Array | None = None, aspect_ratio_mask: Array | None = None,
             cross_attention_mask: Array | None = None) -> tuple[Array, DecodeState]:
        """Run ``ids`` [B, T] at ``positions`` (real where ``valid``) over the cache (or memory): float32
        logits of the last position [B, V] (of every position [B, T, V] with ``every_position``; without the
        ``head``, its hidden state [B, D]: ``step_logits``) and the state with these tokens written.
        ``pixel_values``: a prefill's images (LLaVA), in place of their placeholders; ``token_type_ids``: a
        prefill's image tokens (Gemma 3: each image's see each other; later steps are causal, as transformers'
        decode steps pass none). M-RoPE: a prefill with images (``image_grid_thw``) turns by their position streams
        and keeps what each stream adds to the positions after it (``state.rope_deltas``), which every other step
        adds to its positions, as transformers' generation continues each stream by one a token.
        Llama 3.2 Vision: a prefill's images (``pixel_values``, ``aspect_ratio_ids``, ``aspect_ratio_mask``) give its
        cross layers' keys and values once, kept in the ``ImageCache`` with what the prompt's last token sees of them
        (``cross_attention_mask``), which every later token sees."""
        state.kv.check_room(ids.shape[1])
        image_mask = None
        if self.config.scores.cross_attention_layers and pixel_values is not None:
            states, image_mask = self.cross_inputs(pixel_values, aspect_ratio_ids, aspect_ratio_mask, None,
                                                   cross_attention_mask)
            visible = jnp.ones(states.shape[:2], bool) if image_mask is None else image_mask[:, -1]
            images = self.decoder.image_key_values(states, visible)
            state, pixel_values = dataclasses.replace(state, kv=dataclasses.replace(state.kv, images=images)), None
        rotary, deltas = None, state.rope_deltas
        if image_grid_thw is not None:
            rotary = self.image_positions(ids, valid, image_grid_thw)
            deltas = rotary[:, -1] - positions[:, -1:]  # (left padding: the last token is real)
        elif deltas is not None:
            rotary = positions[..., None] + deltas[:, None, :]
        if isinstance(state.kv, MemoryKV):
            out = self.forward(ids, valid=valid, positions=positions, memory=state.kv)
            return step_logits(self, out.hidden, every_position, head), dataclasses.replace(state, kv=out.memory)
        out = self.forward(ids, valid=valid, positions=positions, prefix_lengths=state.prefix_lengths, cache=state.kv,
                           pixel_values=pixel_values, token_types=token_type_ids, image_grid_thw=image_grid_thw,
                           rotary_positions=rotary, image_mask=image_mask)
        return (step_logits(self, out.hidden, every_position, head),
                dataclasses.replace(state, kv=out.cache, rope_deltas=deltas))

    def for_decode_loop(self) -> Decoder:
        return unstacked_decoder(self)

    def decoding_copy(self) -> Decoder:
        """This model laid out once for many generations on CPU (``decoder.decoding_copy``)."""
        return decoding_copy(self)

