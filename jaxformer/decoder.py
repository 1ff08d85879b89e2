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
from flax import nnx

from jaxformer import kernels
from jaxformer.cache import DecodeState, KVCache, LatentCache, Memory, MemoryKV, empty_cache
from jaxformer import generate as generation  # the decode loop: model code, it calls .step
from jaxformer.checks import check_inputs, check_memory, check_prefix_lengths, check_segments, public_call
from jaxformer.edges import EdgeMethods
from jaxformer.encoder import Encoder
from jaxformer.model_config import ModelConfig
from jaxformer.layers.weights import output_major
from jaxformer.layers.positions import PerLayerInputs
from jaxformer.layers.patches import check_pixel_values
from jaxformer.layers.projector import Projector, check_image_tokens, image_states, place_images
from jaxformer.layers import (Buffer, Dense, Embed, Embeddings, Stack, StackOutput, Tokens, dtype_of,
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


def step_logits(model: nnx.Module, h: Array, every_position: bool = False) -> Array:
    """A cached step's output: float32 logits [B, V] of the last position only, or [B, T, V] of each of the
    step's T positions (verifying T - 1 drafted tokens at once)."""
    if every_position:
        return lm_logits(model, h).astype(jnp.float32)
    return lm_logits(model, h[:, -1:])[:, 0].astype(jnp.float32)


def unstacked_decoder(model: nnx.Module) -> nnx.Module:
    """``model`` for a loop of many cached steps: on CPU a copy whose decoder layers are sliced out of
    the stack once (``Stack.unstacked``), elsewhere (or when they already are: ``decoding_copy``) the model
    itself."""
    unstacked = any(isinstance(blocks, tuple) for blocks in model.decoder.block_groups().values())
    if not kernels.unstack_decode_loops() or unstacked:
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
        self.embed = Embed(cfg.vocab_size, cfg, rngs=rngs)
        self.embeddings = Embeddings(cfg, rngs=rngs)
        self.decoder = Stack(cfg, cfg.decoder_layers, pattern=cfg.attention, rngs=rngs)
        self.lm_head, self.logits_bias = make_lm_head(cfg, rngs)
        # Gemma 4: a second table and a projection of the embeddings, a slice of which each layer reads
        self.per_layer_inputs = (PerLayerInputs(cfg, cfg.decoder_layers, rngs=rngs)
                                 if cfg.embeddings.per_layer_width else None)
        # LLaVA: an image tower whose projected states take the places of the image placeholders of input_ids
        self.vision = Encoder(cfg.vision.tower, rngs=rngs) if cfg.vision is not None else None
        self.projector = Projector(cfg, rngs=rngs) if cfg.vision is not None else None

    def validate(self, input_ids=None, attention_mask=None, position_ids=None, *, prefix_lengths=None,
                 inputs_embeds=None, token_type_ids=None, memory=None, segment_ids=None, pixel_values=None,
                 **others) -> None:
        two_stream = sorted({"perm_mask", "target_mapping"} & set(others))
        if two_stream:  # what an XLNet user may pass from transformers' signature
            raise ValueError(f"{', '.join(two_stream)}: XLNet's two-stream permutation pretraining is not supported; "
                             "jaxformer runs its content stream (Transformer-XL: causal or bidirectional attention "
                             "over a segment memory)")
        shape = check_inputs(self.config, input_ids, inputs_embeds, attention_mask, position_ids, token_type_ids)
        check_prefix_lengths(prefix_lengths, self.config, *shape)
        check_memory(memory, self.config, shape[0])
        check_segments(segment_ids, shape, self.config)
        if pixel_values is not None:
            self._check_images(input_ids, pixel_values)

    def _check_images(self, input_ids, pixel_values) -> None:
        """Images go with input_ids holding one placeholder per image feature, to a model that reads images."""
        vision = self.config.vision
        if vision is None:
            raise ValueError(f"pixel_values given to {self.config.name!r}, which reads no images (it has no vision "
                             "tower: ModelConfig.vision is None)")
        if input_ids is None:
            raise ValueError("pixel_values go with input_ids, whose image_token_id placeholders the images replace; "
                             "inputs_embeds cannot say where they go")
        check_pixel_values(vision.tower.patches, pixel_values)
        check_image_tokens(input_ids, pixel_values, self.config)

    def embed_images(self, input_ids: Array, pixel_values: Array) -> Array:
        """The token embeddings of ``input_ids`` [B, T] with each image placeholder replaced by an image feature:
        the image tower's chosen states of ``pixel_values`` [N, C, H, W], projected (LLaVA's get_image_features,
        then masked_scatter)."""
        tower = self.vision(pixel_values=pixel_values, output_hidden_states=True)
        features = self.projector(image_states(tower.hidden_states, self.config))
        return place_images(self.embed(input_ids), input_ids == self.config.vision.image_token_id, features)

    def forward(self, input_ids: Array | None, *, inputs_embeds: Array | None = None, valid: Array | None = None,
                positions: Array | None = None, prefix_lengths: Array | None = None,
                cache: KVCache | LatentCache | None = None, memory: Memory | None = None,
                token_types: Array | None = None, collect_hidden: bool = False, collect_attentions: bool = False,
                key: Array | None = None, segments: Array | None = None, pixel_values: Array | None = None
                ) -> StackOutput:
        """The one forward pass: embeddings, then the causal stack over ``cache`` or ``memory`` (if any).
        ``segments``: packed documents, each at its own positions unless ``positions`` are given. ``pixel_values``:
        images whose features enter as the embeddings of the image placeholders (a prefill; decode steps are text)."""
        keys = split_key(key, 2)
        if pixel_values is not None:
            inputs_embeds = self.embed_images(input_ids, pixel_values)
        if positions is None and valid is not None and segments is None and self.config.embeddings.positions_from_mask:
            positions = left_padded_positions(valid)  # OPT: each row counts its real tokens from 0
        indexed = positions is None and cache is None and not self.config.embeddings.pad_aware_positions
        if segments is not None and positions is None:
            positions = self.embeddings.document_positions(segments)
        x, at = self.embeddings(self.embed, input_ids, inputs_embeds=inputs_embeds, positions=positions, key=keys[0])
        tokens = Tokens(at, packed_validity(valid, segments), prefix_lengths, indexed, segments, ids=input_ids)
        per_layer = None
        if self.per_layer_inputs is not None:
            if input_ids is None:
                raise ValueError("per-layer inputs (Gemma 4) look up input_ids in their own table: pass input_ids, "
                                 "not inputs_embeds")
            per_layer = self.per_layer_inputs(input_ids, x)
        return self.decoder(x, tokens, cache=cache, memory=memory,
                            token_types=token_types, collect_hidden=collect_hidden,
                            collect_attentions=collect_attentions, key=keys[1], per_layer_inputs=per_layer)

    def generate(self, input_ids, attention_mask=None, **kwargs):
        """Hugging Face's ``generate`` (greedy, sampling, beams, drafting): ``jaxformer.generate.generate``."""
        return generation.generate(self, input_ids, attention_mask, **kwargs)

    @public_call
    def __call__(self, input_ids: Array | None = None, attention_mask: Array | None = None,
                 position_ids: Array | None = None, *, prefix_lengths: Array | None = None,
                 inputs_embeds: Array | None = None, token_type_ids: Array | None = None,
                 memory: Memory | None = None, output_hidden_states: bool = False, output_attentions: bool = False,
                 dropout_key: Array | None = None, segment_ids: Array | None = None,
                 pixel_values: Array | None = None) -> ModelOutput:
        """Logits of every position. Transformer-XL models (``position='xl'``) also take the ``memory`` of the
        previous segment (None: start fresh) and return the next one as ``out.memory``; XLNet's
        ``token_type_ids`` are its relative segments. ``segment_ids`` [B, T]: documents packed into one row
        (1, 2, ... per document, 0 on padding); a token attends only within its document, whose positions
        start at 0. ``pixel_values`` [N, C, H, W] (LLaVA): images whose projected features replace the
        ``vision.image_token_id`` placeholders of input_ids, in order."""
        cfg = self.config
        out = self.forward(input_ids, inputs_embeds=inputs_embeds, valid=attention_mask, positions=position_ids,
                           prefix_lengths=prefix_lengths, memory=memory, token_types=token_type_ids,
                           collect_hidden=output_hidden_states, collect_attentions=output_attentions, key=dropout_key,
                           segments=segment_ids, pixel_values=pixel_values)
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
        return DecodeState(cache, prefix_lengths=prefix_lengths)

    def step(self, ids: Array, positions: Array, valid: Array, state: DecodeState, every_position: bool = False,
             pixel_values: Array | None = None) -> tuple[Array, DecodeState]:
        """Run ``ids`` [B, T] at ``positions`` (real where ``valid``) over the cache (or memory): float32
        logits of the last position [B, V] (of every position [B, T, V] with ``every_position``) and the state
        with these tokens written. ``pixel_values``: a prefill's images (LLaVA), in place of their placeholders."""
        state.kv.check_room(ids.shape[1])
        if isinstance(state.kv, MemoryKV):
            out = self.forward(ids, valid=valid, positions=positions, memory=state.kv)
            return step_logits(self, out.hidden, every_position), dataclasses.replace(state, kv=out.memory)
        out = self.forward(ids, valid=valid, positions=positions, prefix_lengths=state.prefix_lengths, cache=state.kv,
                           pixel_values=pixel_values)
        return step_logits(self, out.hidden, every_position), dataclasses.replace(state, kv=out.cache)

    def for_decode_loop(self) -> Decoder:
        return unstacked_decoder(self)

    def decoding_copy(self) -> Decoder:
        """This model laid out once for many generations on CPU (``decoder.decoding_copy``)."""
        return decoding_copy(self)

