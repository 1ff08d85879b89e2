"""The transformer block and the stack of blocks every family runs: one code path for a full pass
(training, evaluation), a prefill and each cached decode step.

A stack call takes the hidden states, one ``Tokens`` (where this call's tokens sit and which are real),
and optionally a ``KVCache`` of earlier tokens (or Transformer-XL's segment ``Memory``) and a
cross-attention source. It builds the masks, the rotary angles, T5's relative bias, Transformer-XL's
distance encodings or DeBERTa's relative-position table and index once, then runs its blocks (scanned by
default).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import kernels
from jaxformer.cache import (CompressedCache, EncoderKV, HybridCache, ImageCache, ImageKV, KVCache, LatentCache,
                             Memory, MemoryKV, PagedLayers, SplitKVCache, WrittenPool, written_after)
from jaxformer.layer_plan import COMPRESSED_GROUPS, LayerPlan, LayerSpec, Segment, layer_config, layer_plan
from jaxformer.model_config import ModelConfig
from jaxformer.layers.attention import (Attention, DisentangledAttention, DisentangledInputs, LatentAttention,
                                        RelativeAttention, memory_visibility_mask, visibility_mask)
from jaxformer.layers.attention import BlockSparseAttention, BlockSparseInputs, GlobalAttention, GlobalInputs
from jaxformer.layers.convolution import SequenceConvolution
from jaxformer.layers.core import Buffer, Dense, Norm, activate, dropout, dtype_of, param, split_key
from jaxformer.layers.feedforward import MLP, MoE, pooled_router_statistics
from jaxformer.layers.compressed_attention import CompressedAttentionLayer
from jaxformer.layers.hyper_connections import HyperConnection, HyperHead
from jaxformer.layers.linear_attention import GatedDeltaNet
from jaxformer.layers.positions import (RelativeBias, RelativeEmbeddings, disentangled_index, distance_buckets,
                                        rope_tables, xl_distances, xl_encodings)
from jaxformer.layers.pipeline import check_schedule, run_pipeline
from jaxformer.sharding import axis_size, constrain_activations

Array = jax.Array


# --------------------------------------------------------------------------------------------------
# What a stack call is told about its tokens and what it attends to


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["positions", "valid", "prefix_lengths", "segments", "global_tokens", "ids",
                                "rotary_positions", "image_blocks", "windows"],
                   meta_fields=["indexed", "outer_padding_mask"])
@dataclasses.dataclass(frozen=True)
class Tokens:
    """This call's tokens as attention sees them: positions [B, T], which are real [B, T] (None: all),
    prefix-LM prefix sizes [B] (None unless the pattern is 'prefix'), and the document each token belongs
    to [B, T] when documents are packed into one row (None: one document a row; a token sees only its own
    document's). ``indexed`` says the positions are 0..T-1 in every row, or restart at 0 where each
    document starts (no position_ids, no cache), so a fused kernel's index-based causal and sliding masks,
    restricted to each document, equal the position-based ones, and T5's bias is one [1, N, T, S] array."""

    positions: Array
    valid: Array | None = None
    prefix_lengths: Array | None = None
    indexed: bool = False
    segments: Array | None = None
    global_tokens: Array | None = None  # Longformer: which tokens attend globally [B, T] (None: none)
    ids: Array | None = None  # the token ids [B, T] (DeepSeek-V4's hash-routed expert layers read them)
    # M-RoPE (Qwen2.5-VL): the rotary angles' three position streams [B, T, 3]; masks and caches keep ``positions``
    rotary_positions: Array | None = None
    # Gemma 3: each token's image [B, T] (-1: text); an image's tokens see each other both ways (None: no images)
    image_blocks: Array | None = None
    # Qwen2.5-VL's image tower: each token's window [B, T], all its 'window' layers let it see (rotary_positions: a
    # patch's row and column)
    windows: Array | None = None
    # Llama 3.2 Vision's tiles: a padded key is hidden from padded queries only, real queries see it (transformers'
    # mask: the outer product of the padding)
    outer_padding_mask: bool = False


def packed_validity(valid: Array | None, segments: Array | None) -> Array | None:
    """Which tokens are real when documents are packed: segment id 0 marks padding (as t5x and MaxText
    number them), whatever ``valid`` says; without segments, ``valid`` as it is."""
    if segments is None:
        return valid
    real = segments > 0
    return real if valid is None else real & valid.astype(bool)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EncoderOutput:
    """Cross-attention's source in a full pass: the encoder output [B, S, D], projected by each
    layer, its validity [B, S] (None: no padding) and, for packed rows, its documents [B, S] (a decoder
    token reads only its own document's source, as t5x packs inputs and targets). Cached steps read
    ``cache.EncoderKV`` instead."""

    hidden: Array
    valid: Array | None = None
    segments: Array | None = None


class StackOutput(NamedTuple):
    hidden: Array  # [B, T, D], after the final norm
    hidden_states: tuple[Array, ...] | None  # the input, then every layer's output (when collected)
    cache: KVCache | SplitKVCache | HybridCache | LatentCache | None  # the cache with this call's writes
    router_stats: dict[str, Array] | None  # MoE layers' ``router_statistics``, each [L_moe, ...]
    memory: Memory | MemoryKV | None = None  # Transformer-XL: the segment memory rolled forward by this call
    attentions: tuple[Array, ...] | None = None  # per layer [B, N, T, S] self-attention probabilities (when collected)
    cross_attentions: tuple[Array, ...] | None = None  # per layer [B, N, T, S_source] (when collected)


@dataclasses.dataclass(frozen=True)
class XLInputs:
    """What Transformer-XL's attention reads besides its layer's input and memory: the encodings [P, D]
    of the call's key-query distances, the stack's shared (u, v) biases (None: each layer has its own),
    and which (query, key) pairs lie in different segments [B, T, S] (XLNet's token types; None: no types)."""

    encodings: Array
    biases: tuple[nnx.Param, nnx.Param] | None
    other_segment: Array | None


@dataclasses.dataclass(frozen=True)
class CrossInputs:
    """Cross-attention's mask and source: the encoder output [B, S, D], or this layer's precomputed keys and
    values (a cached step's). ``rows`` [B, T, 1]: Llama 3.2 Vision's tokens that see some image (its cross layers'
    feed-forward counts only there)."""

    mask: Any
    source: Array | None = None
    kv: tuple[Array, Array] | None = None
    rows: Array | None = None


@dataclasses.dataclass(frozen=True)
class LayerInputs:
    """What one block's sublayers read besides x: self-attention's mask (a [B, 1, T, S] array, a
    (cache, own) pair, or a ``kernels.FusedMask``), bias and rotary angles, this layer's cache slice;
    cross-attention's inputs; which tokens are real, for MoE load statistics; the relative-position inputs
    of the layer's attention (Transformer-XL's with its memory, DeBERTa's table and index)."""

    mask: Any
    bias: Any = None
    rope: tuple[Array, Array] | None = None
    cache: dict | None = None
    cross: CrossInputs | None = None
    token_mask: Array | None = None
    relative: XLInputs | DisentangledInputs | None = None
    memory: dict | None = None  # Transformer-XL: this layer's memory, {"hidden"} or {"k", "v"}
    output_attentions: bool = False  # return each sublayer's attention probabilities
    # this layer's extra factor on its self-attention scores: GPT-2's 1 / (i + 1), Llama 4's temperature [1, T, 1, 1]
    query_scale: Array | None = None
    # Llama 4: is this a layer without rotary positions (no query/key norm then): a Python bool where the plan
    # knows the layer, an array in a scanned body whose layers differ; None in a stack without such layers
    nope: Array | bool | None = None
    valid: Array | None = None  # which of this call's tokens are real [B, T] (a linear layer zeroes the others)
    segments: Array | None = None  # the packed documents of a full pass [B, T] (a linear layer restarts at each)
    per_layer_input: Array | None = None  # Gemma 4: this layer's slice [B, T, P] of the per-layer inputs
    # Gemma 4's kv-shared layers: the keys and values they read (``Attention``'s ``shared_kv``); and whether a layer
    # returns its keys and values in a full pass too (a stack with such layers: the runner hands them on)
    shared_kv: tuple | None = None
    return_kv: bool = False
    global_tokens: GlobalInputs | None = None  # Longformer's global tokens (a 'global' mixer reads them)
    block_sparse: BlockSparseInputs | None = None  # BigBird's blocks (None: the 'block_sparse' mixer attends densely)
    positions: Array | None = None  # this call's token positions [B, T] (DeepSeek-V4's compressed attention)
    token_ids: Array | None = None  # this call's token ids [B, T] (DeepSeek-V4's hash-routed expert layers)


# --------------------------------------------------------------------------------------------------
# The block


class BlockKeys(NamedTuple):
    """Dropout keys of one block: inside each sublayer and on each residual branch."""

    attn: Array | None
    attn_out: Array | None
    cross: Array | None
    cross_out: Array | None
    mlp: Array | None
    mlp_out: Array | None


class Block(nnx.Module):
    """One transformer layer, built as its ``LayerSpec`` says: self-attention (or latent, Transformer-XL's
    relative or DeBERTa's disentangled attention), optional cross-attention, feed-forward (or MoE; DeepSeek's
    first layers keep a dense one). With ``sandwich_norm`` (Gemma 2/3) each sublayer's output is normed too
    before it joins the residual."""

    _MIXERS = {"xl": RelativeAttention, "disentangled": DisentangledAttention,
               "global": GlobalAttention, "linear": GatedDeltaNet, "block_sparse": BlockSparseAttention}

    def __init__(self, cfg: ModelConfig, spec: LayerSpec, *, rngs: nnx.Rngs):
        cross_attention = spec.cross_attention
        self.pre_norm = cfg.norms.position == "pre"
        # OLMo-2: x = x + norm(f(x)), the sublayers read x unnormed (the output norms are the sandwich's)
        self.output_norm = cfg.norms.position == "output"
        self.dropout_rate, self.residual_multiplier = cfg.dropout_rate, cfg.residual_multiplier
        self.clamp_float16 = cfg.clamp_float16
        # ModernBERT's first layer: the attention reads x as it comes (after the embedding norm)
        unnormed = spec.special == "unnormed attention" or self.output_norm
        self.attn_norm = None if unnormed else Norm(cfg, rngs=rngs)
        if spec.mixer == "compressed":  # DeepSeek-V4: its kind's compressor and indexer, or the window alone
            self.attn = CompressedAttentionLayer(cfg, spec.compressed, rngs=rngs)
        elif spec.mixer == "latent":  # (Mistral Large 4's NoPE layers: no rotary part in their latent and keys)
            self.attn = LatentAttention(cfg, rngs=rngs, rotary=spec.group != "nope_blocks")
        elif spec.mixer in self._MIXERS:
            self.attn = self._MIXERS[spec.mixer](cfg, rngs=rngs)
        elif spec.mixer == "cross":  # Llama 3.2 Vision: attention to the images alone (q/k norms: ``layer_config``)
            self.attn = Attention(cfg, rngs=rngs, role="cross_attn")
        else:  # (Gemma 4: a kv-shared layer has no key or value weights, a full layer's values may be its keys)
            self.attn = Attention(cfg, rngs=rngs, own_keys=spec.kv_source is None,
                                  keys_as_values=cfg.scores.full_keys_as_values and not spec.local)
        # UMT5: this layer's own relative-bias table, read at the buckets its stack computed (the direction is
        # the stack's, so ``bidirectional`` is unused here)
        per_layer = cfg.relative_bias is not None and cfg.relative_bias.per_layer
        self.relative_bias = RelativeBias(cfg, bidirectional=False, rngs=rngs) if per_layer else None
        if cross_attention:
            self.cross_norm = Norm(cfg, rngs=rngs)
            self.cross_attn = Attention(cfg, rngs=rngs, role="cross_attn")
        else:
            self.cross_norm = self.cross_attn = None
        self.parallel = cfg.parallel is not None
        # GPT-J: attn_norm serves both
        shared_norm = cfg.parallel is not None and cfg.parallel.shared_norm
        self.mlp_norm = None if shared_norm or self.output_norm else Norm(cfg, rngs=rngs)
        self.mlp = (MLP(cfg, rngs=rngs) if spec.feed_forward in ("dense", "dense+experts") else
                    MoE(cfg, rngs=rngs, hashed=spec.feed_forward.startswith("hashed")))
        # DeepSeek-V4: each sublayer reads and joins the residual's copies through its hyper-connection
        hyper = cfg.norms.hyper_connections is not None
        self.attn_hc, self.mlp_hc = ((HyperConnection(cfg, rngs=rngs), HyperConnection(cfg, rngs=rngs)) if hyper
                                     else (None, None))
        # Gemma 4: the experts beside the dense MLP, with their own input norm and a norm on each branch's output
        beside = spec.feed_forward == "dense+experts"
        self.experts = MoE(cfg, rngs=rngs) if beside else None
        self.dense_post_norm, self.experts_norm, self.experts_post_norm = (
            (Norm(cfg, rngs=rngs), Norm(cfg, rngs=rngs), Norm(cfg, rngs=rngs)) if beside else (None, None, None))
        outputs_normed = cfg.norms.sandwich or self.output_norm
        sandwich = lambda present=True: Norm(cfg, rngs=rngs) if outputs_normed and present else None  # noqa: E731
        self.attn_post_norm, self.cross_post_norm, self.mlp_post_norm = sandwich(), sandwich(cross_attention), sandwich()
        # Gemma 4's per-layer inputs: the layer's own slice gates a projection of its output, normed, added back
        width, self.activation = cfg.embeddings.per_layer_width, cfg.activation
        self.per_layer_gate = (Dense(cfg, cfg.d_model, width, ("embed", "embedding"), rngs=rngs, bias=False)
                               if width else None)
        self.per_layer_projection = (Dense(cfg, width, cfg.d_model, ("embedding", "embed"), rngs=rngs, bias=False)
                                     if width else None)
        self.per_layer_norm = Norm(cfg, rngs=rngs) if width else None
        # Gemma 4's layer_scalar: the layer's output times a stored number of its own (a buffer, as transformers
        # keeps it: part of the checkpoint, never trained)
        self.output_scale = (Buffer(jnp.ones((1,), dtype_of(cfg.param_dtype)), axes=("scalar",))
                             if cfg.layer_output_scale else None)
        # Llama 3.2 Vision's gated layers: each sublayer's output times tanh(gate). The gates start at pi / 4, the value
        # MllamaVisionEncoderLayer is built with (transformers' _init_weights then redraws them normal(std): a fresh
        # model's start, which no checkpoint keeps)
        gate = lambda: nnx.Param(jnp.full((1,), math.pi / 4, dtype_of(cfg.param_dtype)), axes=("scalar",))  # noqa: E731
        # its text model's cross layers, gated the same way (their gates zero at first, as transformers makes them)
        self.reads_images = spec.mixer == "cross"
        if self.reads_images:
            gate = lambda: param(rngs, (1,), ("scalar",), cfg, init="zeros")  # noqa: E731
        self.attn_gate, self.mlp_gate = (gate(), gate()) if spec.gated or self.reads_images else (None, None)

    def __call__(self, x: Array, inputs: LayerInputs, key: Array | None = None
                 ) -> tuple[Array, dict | None, dict | None, dict]:
        """Returns x, this call's new keys and values (for the caller's cache), MoE router stats, and the
        attention probabilities {"self", "cross"} (None unless ``inputs.output_attentions``)."""
        keys = BlockKeys(*split_key(key, 6))
        drop = lambda h, key: self.scaled(dropout(h, self.dropout_rate, key))  # noqa: E731
        weights = {"self": None, "cross": None}
        if self.reads_images:
            return self.image_layer(x, inputs, keys, drop)
        if self.attn_hc is not None:  # DeepSeek-V4: x is the residual's copies [B, T, n, D]
            collapsed, mixing = self.attn_hc.collapse(x)
            h, new_kv, weights["self"] = self.self_attention(self.attn_norm(collapsed), inputs, keys.attn)
            x = HyperConnection.expand(x, drop(h, keys.attn_out), mixing)
            collapsed, mixing = self.mlp_hc.collapse(x)
            h, stats = self.feed_forward(self.mlp_norm(collapsed), inputs, keys.mlp)
            x = HyperConnection.expand(x, drop(h, keys.mlp_out), mixing)
        elif self.parallel:  # GPT-NeoX: x = x + attn(norm(x)) + mlp(norm'(x)); GPT-J: one norm for both
            normed = self.attn_norm(x)
            h, new_kv, weights["self"] = self.self_attention(normed, inputs, keys.attn)
            m, stats = self.feed_forward(normed if self.mlp_norm is None else self.mlp_norm(x), inputs, keys.mlp)
            x = self.in_range(x + drop(h, keys.attn_out) + drop(m, keys.mlp_out))
        elif self.pre_norm or self.output_norm:
            # GPT-2, LLaMA, T5: x = x + f(norm(x)); Gemma: x = x + norm_out(f(norm(x))); OLMo-2: x = x + norm_out(f(x))
            normed = x if self.attn_norm is None else self.attn_norm(x)
            h, new_kv, weights["self"] = self.self_attention(normed, inputs, keys.attn)
            x = self.in_range(x + drop(self.gated(self.sandwiched(h, self.attn_post_norm), self.attn_gate),
                                       keys.attn_out))
            if self.cross_attn is not None:
                h, _, weights["cross"] = self.cross_attention(self.cross_norm(x), inputs, keys.cross)
                x = self.in_range(x + drop(self.sandwiched(h, self.cross_post_norm), keys.cross_out))
            if self.experts is not None:
                h, stats = self.dense_and_experts(x, inputs, keys.mlp)
            else:
                h, stats = self.feed_forward(self.sandwiched(x, self.mlp_norm), inputs, keys.mlp)
            x = self.in_range(x + drop(self.gated(self.sandwiched(h, self.mlp_post_norm), self.mlp_gate),
                                       keys.mlp_out))
            if self.per_layer_gate is not None:
                x = x + self.per_layer_mix(x, inputs.per_layer_input)
        else:  # the 2017 Transformer, BERT, BART: x = norm(x + f(x))
            h, new_kv, weights["self"] = self.self_attention(x, inputs, keys.attn)
            x = self.attn_norm(x + drop(h, keys.attn_out))
            if self.cross_attn is not None:
                h, _, weights["cross"] = self.cross_attention(x, inputs, keys.cross)
                x = self.cross_norm(x + drop(h, keys.cross_out))
            h, stats = self.feed_forward(x, inputs, keys.mlp)
            x = self.mlp_norm(x + drop(h, keys.mlp_out))
        if self.output_scale is not None:
            x = x * self.output_scale[...].astype(x.dtype)
        return x, new_kv, stats, weights

    def image_layer(self, x: Array, inputs: LayerInputs, keys: BlockKeys, drop: Callable
                    ) -> tuple[Array, None, None, dict]:
        """Llama 3.2 Vision's cross layer: x = x + tanh(g_a) * attention(norm(x), images), then
        x = x + tanh(g_m) * (MLP(norm'(x)) where the token sees some image). Without images (text alone) it passes
        x on, as transformers skips it. Its keys and values: the images' states projected here in a full pass, the
        prefill's in a cached step (its cache slice)."""
        cross = inputs.cross
        if cross is None:
            return x, None, None, {"self": None, "cross": None}
        kv = (inputs.cache["k"], inputs.cache["v"]) if inputs.cache else None
        h, _, probs = self.attn(self.attn_norm(x), cross.source, mask=cross.mask, kv=kv, key=keys.cross,
                                output_attentions=inputs.output_attentions)
        x = x + drop(self.gated(h, self.attn_gate), keys.cross_out)
        h = self.mlp(self.mlp_norm(x), keys.mlp) * cross.rows.astype(x.dtype)
        x = x + drop(self.gated(h, self.mlp_gate), keys.mlp_out)
        return x, None, None, {"self": None, "cross": probs}

    def per_layer_mix(self, x: Array, per_layer_input: Array) -> Array:
        """Gemma 4: norm(projection(act(gate(x)) * this layer's per-layer input)), what joins the stream."""
        gated = activate(self.activation, self.per_layer_gate(x)) * per_layer_input.astype(x.dtype)
        return self.per_layer_norm(self.per_layer_projection(gated))

    def scaled(self, h: Array) -> Array:
        """A sublayer's output as it joins the residual: times ``residual_multiplier`` (Granite)."""
        return h if self.residual_multiplier == 1.0 else h * jnp.asarray(self.residual_multiplier, h.dtype)

    @staticmethod
    def sandwiched(h: Array, post_norm: Norm | None) -> Array:
        return h if post_norm is None else post_norm(h)

    @staticmethod
    def gated(h: Array, gate: nnx.Param | None) -> Array:
        return h if gate is None else jnp.tanh(gate[...]).astype(h.dtype) * h

    def in_range(self, x: Array) -> Array:
        """T5 in float16 (``clamp_float16``), as transformers keeps it finite: each sublayer's output is
        clamped to the float16 range, 1000 inside it when any element has already overflowed."""
        if not (self.clamp_float16 and x.dtype == jnp.float16):
            return x
        top = jnp.finfo(jnp.float16).max
        limit = jnp.where(jnp.isinf(x).any(), top - 1000, top).astype(jnp.float16)
        return jnp.clip(x, -limit, limit)

    def self_attention(self, h: Array, inputs: LayerInputs, key: Array | None) -> tuple[Array, dict | None, Array | None]:
        weights = inputs.output_attentions
        if isinstance(self.attn, CompressedAttentionLayer):  # (the window's mask as an array: no fused kernel)
            mask = inputs.mask.dense if isinstance(inputs.mask, kernels.FusedMask) else inputs.mask
            # (a cached step: the layer's slice of the ``CompressedCache`` in, its next state out)
            out, new_state, probs = self.attn(h, inputs.positions, mask, inputs.cache, output_attentions=weights)
            if probs is not None and inputs.cache is None:  # (padded to the widest kind's keys, so the layers'
                # stack; the stack trims them)
                part, length = self.attn.part, h.shape[1]
                widest = length + length // min(part.sparse_rate, part.heavy_rate)
                probs = jnp.pad(probs, ((0, 0),) * 3 + ((0, widest - probs.shape[-1]),))
            return out, new_state, probs
        if isinstance(self.attn, GatedDeltaNet):  # no attention probabilities to return
            return self.attn(h, valid=inputs.valid, cache=inputs.cache, segments=inputs.segments, key=key)
        if isinstance(self.attn, RelativeAttention):
            memory = inputs.memory
            if memory is not None and "hidden" in memory and self.pre_norm:  # layer inputs: normed like this call's
                memory = {"hidden": self.attn_norm(memory["hidden"])}
            return self.attn(h, mask=inputs.mask, relative=inputs.relative, memory=memory, key=key,
                             output_attentions=weights)
        if isinstance(self.attn, DisentangledAttention):
            return self.attn(h, mask=inputs.mask, relative=inputs.relative, key=key, output_attentions=weights)
        if isinstance(self.attn, BlockSparseAttention):
            return self.attn(h, mask=inputs.mask, sparse=inputs.block_sparse, key=key, output_attentions=weights)
        if isinstance(self.attn, GlobalAttention):
            return self.attn(h, mask=inputs.mask, global_tokens=inputs.global_tokens, key=key,
                             output_attentions=weights)
        # GPT-2's per-layer factor, Llama 4's NoPE layers (on standard attention only), Mistral 4's position factor
        scaled = {} if inputs.query_scale is None else {"query_scale": inputs.query_scale}
        if inputs.nope is not None:
            scaled["nope"] = inputs.nope
        bias = inputs.bias  # (UMT5: the buckets, each (cache, own) part looked up in this layer's table)
        if self.relative_bias is not None:
            bias = jax.tree.map(self.relative_bias.lookup, bias)
        if inputs.shared_kv is not None:  # (Gemma 4: standard attention alone reads or hands on keys and values)
            scaled["shared_kv"] = inputs.shared_kv
        if inputs.return_kv:
            scaled["return_kv"] = True
        if isinstance(self.attn, LatentAttention) and self.attn.log_position_scale is not None:
            scaled["positions"] = inputs.positions  # (Mistral Large 4: queries scaled by ln(p + 1))
        return self.attn(h, mask=inputs.mask, bias=bias, rope=inputs.rope, cache=inputs.cache, key=key,
                         output_attentions=weights, **scaled)

    def cross_attention(self, h: Array, inputs: LayerInputs, key: Array | None) -> tuple[Array, None, Array | None]:
        cross = inputs.cross
        return self.cross_attn(h, cross.source, mask=cross.mask, kv=cross.kv, key=key,
                               output_attentions=inputs.output_attentions)

    def dense_and_experts(self, x: Array, inputs: LayerInputs, key: Array | None) -> tuple[Array, dict]:
        """Gemma 4's feed-forward: norm(MLP(mlp_norm(x))) + norm'(experts(experts_norm(x))), the experts routed by x
        itself; the sum is what the sandwich's output norm then norms."""
        dense = self.dense_post_norm(self.mlp(self.mlp_norm(x), key))
        routed, stats = self.experts(self.experts_norm(x), inputs.token_mask, router_input=x)
        return dense + self.experts_post_norm(routed), stats

    def feed_forward(self, h: Array, inputs: LayerInputs, key: Array | None) -> tuple[Array, dict | None]:
        if isinstance(self.mlp, MoE):
            return self.mlp(h, inputs.token_mask, token_ids=inputs.token_ids)
        return self.mlp(h, key), None


def stacked_blocks(cfg: ModelConfig, num_layers: int, spec: LayerSpec, *, rngs: nnx.Rngs,
                   axis: str = "layers") -> Block:
    """``num_layers`` Blocks built as ``spec`` says, as one Block whose parameters have a leading ``axis``
    ('layers'; the few layers that run apart from a stack's main run: 'unstaged_layers', which pipeline
    stages leave whole).

    The parameter layout is the same whether the forward pass scans or unrolls, so checkpoints do
    not depend on ``scan_layers``.
    """

    cfg = layer_config(cfg, spec)  # (Gemma 4's full and kv-shared layers: their own head and MLP sizes)

    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: axis, "axes": axis})
    def make(rngs: nnx.Rngs) -> Block:
        return Block(cfg, spec, rngs=rngs)

    return make(rngs)


REMAT_POLICIES: dict[str, Any] = {
    # recompute the whole layer in the backward pass: the least memory, about a third more FLOPs
    "full": jax.checkpoint_policies.nothing_saveable,
    # keep the weight matmuls' outputs (no batch dims: not the attention scores), recompute the rest
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # keep the named q/k/v projections and the MLP's hidden activation, recompute the rest
    "qkv_mlp": jax.checkpoint_policies.save_only_these_names("qkv", "mlp"),
    # the same names, moved to host memory during the forward pass and back for the backward
    "offload": jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["qkv", "mlp"],
        offload_src="device", offload_dst="pinned_host"),
}


class LayerOutput(NamedTuple):
    """What the runner gathers from each layer, stacked [L, ...] in layer order (the router statistics: the
    expert layers' alone, [L_moe, ...])."""

    hidden: Array | None  # the layer's output (when the call collects hidden states)
    router_stats: dict | None  # an MoE layer's load statistics (``feedforward.router_statistics``)
    new_kv: dict | None  # this call's keys and values, for the caller's cache or Transformer-XL's memory
    layer_input: Array | None  # the layer's input (Transformer-XL's hidden-state memory)
    weights: dict  # attention probabilities {"self", "cross"} (each None unless collected)


# The per-layer flags a scanned body reads as arrays when its layers differ in them (and as Python values when
# the plan knows the layer: unrolled layers, a scanned period's positions, a run of layers alike in them)
_KIND_FLAGS = ("local", "nope")


def _with_kind(extra: dict, spec: LayerSpec, nope_layers: bool) -> dict:
    """``extra`` with the layer's kind flags as the plan states them (Python bools; ``nope`` None in a stack
    without NoPE layers)."""
    return dict(extra, local=spec.local, nope=spec.nope if nope_layers else None)


def _by_field(parts: list[dict | None], join: Callable) -> dict | None:
    """Each field of the layers' outputs joined over the layers that return it (not None), in layer order:
    attention layers return new states {"k", "v"} and linear ones {"conv", "state"}, each kind's cache taking
    its own fields; a linear layer has no attention probabilities to return."""
    names = dict.fromkeys(name for part in parts if part is not None for name in part)
    joined = {name: [part[name] for part in parts if part is not None and part.get(name) is not None]
              for name in names}
    return {name: join(*values) if values else None for name, values in joined.items()} or None


def _stack_states(*states):
    """The layers' new states of one field stacked [L, ...]; layers' own written pools (``WrittenPool``) kept apart,
    a tuple of the layers' arrays (stacking them would copy every layer's pool)."""
    return states if isinstance(states[0], WrittenPool) else jnp.stack(states)


def _join_states(*states):
    """Consecutive runs' stacked states of one field, concatenated (layers' own pools: their tuples joined)."""
    return sum(states, ()) if isinstance(states[0], tuple) else jnp.concatenate(states)


def _stacked_outputs(outs: list[LayerOutput]) -> LayerOutput:
    """Per-layer outputs stacked on a new axis 0; the router statistics and new states of the layers that
    have them."""
    stack = lambda *xs: jnp.stack(xs)  # noqa: E731
    stats = [out.router_stats for out in outs if out.router_stats is not None]
    fields = jax.tree.map(stack, *[out._replace(router_stats=None, new_kv=None, weights=None) for out in outs])
    return fields._replace(router_stats=jax.tree.map(stack, *stats) if stats else None,
                           new_kv=_by_field([out.new_kv for out in outs], _stack_states),
                           weights=_by_field([out.weights for out in outs], stack))


def _joined(parts: list[LayerOutput]) -> LayerOutput:
    """Consecutive runs' outputs, concatenated in layer order."""
    if len(parts) == 1:
        return parts[0]
    join = lambda *xs: jnp.concatenate(xs)  # noqa: E731
    stats = [part.router_stats for part in parts if part.router_stats is not None]
    fields = jax.tree.map(join, *[part._replace(router_stats=None, new_kv=None, weights=None) for part in parts])
    joined = (stats[0] if len(stats) == 1 else jax.tree.map(join, *stats)) if stats else None
    return fields._replace(router_stats=joined, new_kv=_by_field([part.new_kv for part in parts], _join_states),
                           weights=_by_field([part.weights for part in parts], join))


def _layer_of(blocks: Block | tuple[Block, ...], index: int) -> tuple[Any, Any]:
    """(graphdef, parameters) of one layer of a block group: a slice of stacked parameters, or a separate block."""
    if isinstance(blocks, tuple):
        return nnx.split(blocks[index])
    graphdef, params = nnx.split(blocks)
    return graphdef, jax.tree.map(lambda a: a[index], params)


def run_layers(plan: LayerPlan, groups: dict[str, Block | tuple[Block, ...]], x: Array, layer_fn: Callable,
               per_layer: dict, cfg: ModelConfig, *, caches: dict[str, dict] | None = None,
               segments: list[Segment] | None = None, after_first: Callable | None = None) -> tuple[Array, LayerOutput]:
    """The one layer runner: x through the layers of ``plan``, each ``x, out = layer_fn(block, x, extra)`` with
    its block from ``groups`` (the stack's block groups by name: stacked, or separate blocks from
    ``Stack.unstacked``) and its slice ``extra`` of ``per_layer`` (leaves [L, ...]).

    Each of the plan's segments (``plan.segments``; or those given) runs as one ``jax.lax.scan`` over its
    period when ``cfg.scan_layers`` and its blocks are stacked: a period of one layer scans the stacked
    parameters directly; a longer one (Llama 4 Maverick's dense and expert layers, the kinds of a split
    cache) has one compiled body of one period, each position a known layer, and the layers past its last
    whole period unrolled. Separate blocks and ``scan_layers=False`` unroll every layer. ``caches`` (a
    ``SplitKVCache``'s or ``HybridCache``'s layer arrays by kind) hands each layer its slice of its own kind's
    cache as ``extra["cache"]``. ``after_first`` maps the output of a segment that ends at layer 1 (DeBERTa's
    convolution). ``cfg.remat`` wraps each scanned body (unrolled: each layer) in ``jax.checkpoint``."""
    parts = []
    for segment in plan.segments(caches is not None) if segments is None else segments:
        stacked = all(not isinstance(groups[spec.group], tuple) for spec in plan.layers[segment.start:segment.end])
        if cfg.execution.scan_layers and stacked and segment.period == 1:
            x, out = _scan_layers(plan, segment, groups, x, layer_fn, per_layer, cfg, caches)
        else:
            x, out = _scan_periods(plan, segment, groups, x, layer_fn, per_layer, cfg, caches,
                                   scan=cfg.execution.scan_layers and stacked)
        if after_first is not None and segment.end == 1:
            x = after_first(x)
            out = out._replace(hidden=None if out.hidden is None else x[None])
        parts.append(out)
    return x, _joined(parts) if parts else LayerOutput(None, None, None, None, {"self": None, "cross": None})


def _remat(fn: Callable, cfg: ModelConfig, prevent_cse: bool, **kwargs) -> Callable:
    remat = cfg.execution.remat
    return fn if remat == "none" else jax.checkpoint(fn, policy=REMAT_POLICIES[remat], prevent_cse=prevent_cse, **kwargs)


def _cache_ranks(plan: LayerPlan) -> list[int]:
    """Each layer's index in its own kind's cache (a split cache keeps the windowed layers' apart, a hybrid one
    the linear layers' states)."""
    kinds = [spec.cache for spec in plan.layers]
    return [kinds[:i].count(kinds[i]) for i in range(len(kinds))]


def _cache_at(cache, index):
    """One layer's slice of its kind's cache: a paged cache's pools indexed at the layer (``PagedLayers``: each layer
    reads its rows from the whole pool), a cache's arrays indexed (``index`` a Python int or traced)."""
    if isinstance(cache, PagedLayers):
        return cache[index]
    return jax.tree.map(lambda a: a[index], cache)  # (a decode loop's ``LayerArrays`` give their layer's own array)


def _apart_by_layer(per_layer: dict) -> tuple[dict, dict]:
    """``per_layer`` less the fields a scanned body indexes at its own layer (``PagedLayers``: a paged cache's pools,
    or a paged source's, from which each layer gathers its rows; scanning over them would slice out every layer's
    pool), and those."""
    by_layer = {name: value for name, value in per_layer.items() if isinstance(value, PagedLayers)}
    if any(value.apart for value in by_layer.values()):
        raise ValueError("a paged cache with each layer's own pool (a fused paged kernel's form) runs on layers apart "
                         "(Stack.unstacked), not in a scan, which would slice every layer's pool")
    return {name: value for name, value in per_layer.items() if name not in by_layer}, by_layer


def _scan_layers(plan, segment, groups, x, layer_fn, per_layer, cfg, caches):
    """A segment of layers of one group, one parameter slot each (or ALBERT's one shared slot): a scan over the
    stacked parameters and the per-layer inputs. Flags alike in every layer reach the body as Python values."""
    start, end, _ = segment
    specs = plan.layers[start:end]
    graphdef, params = nnx.split(groups[specs[0].group])
    per_layer, by_layer = _apart_by_layer(per_layer)
    extra = jax.tree.map(lambda a: a[start:end], per_layer)
    paged = None  # (a split cache's paged kind: each layer indexes its pools in the body, at its rank)
    if caches is not None:
        rank = _cache_ranks(plan)[start]
        if isinstance(caches[specs[0].cache], PagedLayers):
            paged = caches[specs[0].cache]
        else:
            extra["cache"] = jax.tree.map(lambda a: a[rank:rank + end - start], caches[specs[0].cache])
    extra["layer"] = jnp.arange(start, end) if by_layer or paged is not None else None
    known = plan.known and len({(spec.local, spec.nope) for spec in specs}) == 1
    nope_layers = per_layer.get("nope") is not None
    if known:
        extra = {name: value for name, value in extra.items() if name not in _KIND_FLAGS}
    first, size = specs[0].index, jax.tree.leaves(params)[0].shape[0]
    shared = len(specs) > 1 and all(spec.index == first for spec in specs)  # ALBERT

    def body(carry, inputs):
        layer_params, layer_extra = inputs
        layer_extra = {**layer_extra, **{name: value[layer_extra["layer"]] for name, value in by_layer.items()}}
        if paged is not None:
            layer_extra["cache"] = paged[rank + layer_extra["layer"] - start]
        if known:
            layer_extra = _with_kind(layer_extra, specs[0], nope_layers)
        return layer_fn(nnx.merge(graphdef, layer_params), constrain_activations(carry), layer_extra)

    body = _remat(body, cfg, prevent_cse=False)
    if shared:
        one = jax.tree.map(lambda a: a[first], params)
        return jax.lax.scan(lambda carry, layer_extra: body(carry, (one, layer_extra)), x, extra, length=len(specs))
    if (first, len(specs)) != (0, size):
        params = jax.tree.map(lambda a: a[first:first + len(specs)], params)
    return jax.lax.scan(body, x, (params, extra), length=len(specs))


def _scan_whole_periods(plan, segment, periods, groups, x, layer_fn, per_layer, cfg, caches):
    """``periods`` whole periods of a segment as one scan whose body runs one period, each position a known
    layer. Without a split cache the parameters and per-layer inputs are scanned over, [periods, ...] (their
    gradients then stack); a split cache's layers read their parameters, inputs and cache slice at their index
    inside the body, not sliced out first, which would copy them on every decode step."""
    start, _, period = segment
    specs, ranks = plan.layers, _cache_ranks(plan)
    per_layer, by_layer = _apart_by_layer(per_layer)
    window = specs[start:start + period]
    split = {name: nnx.split(groups[name]) for name in dict.fromkeys(spec.group for spec in window)}
    first = {name: min(spec.index for spec in window if spec.group == name) for name in split}
    per_period = {name: sum(spec.group == name for spec in window) for name in split}
    kinds = {kind: sum(spec.cache == kind for spec in window) for kind in {spec.cache for spec in window}}
    nope_layers = per_layer.get("nope") is not None
    # a position whose layers differ in their flags across periods (Maverick's dense/expert period of 2 over its
    # chunked/full period of 4) reads them as arrays
    alike = [plan.known and len({(specs[i].local, specs[i].nope)
                                 for i in range(start + j, start + periods * period, period)}) == 1
             for j in range(period)]
    at = lambda tree, i: jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), tree)  # noqa: E731

    def by_period(a: Array, lo: int, n: int) -> Array:
        """[layers, ...] -> [periods, n, ...] from slot ``lo`` ([periods, ...] when n is 1)."""
        a = a if (lo, periods * n) == (0, a.shape[0]) else a[lo:lo + periods * n]
        return a if n == 1 else a.reshape(periods, n, *a.shape[1:])

    def body(h, inputs):
        p, params, extras = inputs
        outs = []
        for j, spec in enumerate(window):
            graphdef, stacked = split[spec.group]
            if caches is None:  # this period's slice, scanned over
                slot = spec.index - first[spec.group]
                layer_params = (params[spec.group] if per_period[spec.group] == 1 else
                                jax.tree.map(lambda a: a[slot], params[spec.group]))
                extra = jax.tree.map(lambda a: a[j], extras)
            else:
                layer_params = at(stacked, spec.index + p * per_period[spec.group])
                extra = at(per_layer, start + p * period + j)
                extra["cache"] = _cache_at(caches[spec.cache], ranks[start + j] + p * kinds[spec.cache])
            extra.update({name: value[start + p * period + j] for name, value in by_layer.items()})
            if alike[j]:
                extra = _with_kind(extra, spec, nope_layers)
            h, out = layer_fn(nnx.merge(graphdef, layer_params), constrain_activations(h), extra)
            outs.append(out)
        return h, _stacked_outputs(outs)

    xs = (jnp.arange(periods), None, None)
    if caches is None:
        params = {name: jax.tree.map(lambda a: by_period(a, first[name], per_period[name]), stacked)
                  for name, (_, stacked) in split.items()}
        xs = (xs[0], params, jax.tree.map(lambda a: by_period(a, start, period), per_layer))
    x, scanned = jax.lax.scan(_remat(body, cfg, prevent_cse=False), x, xs)
    return x, jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), scanned)


def _scan_periods(plan, segment, groups, x, layer_fn, per_layer, cfg, caches, *, scan: bool):
    """A segment scanned period by period (``scan`` and two or more whole periods: ``_scan_whole_periods``),
    the layers past the last whole period unrolled; every layer unrolled without ``scan``."""
    start, end, period = segment
    specs, ranks = plan.layers, _cache_ranks(plan)
    nope_layers = per_layer.get("nope") is not None
    periods = (end - start) // period if scan else 0
    periods = periods if periods > 1 else 0
    parts = []
    if periods:
        x, out = _scan_whole_periods(plan, segment, periods, groups, x, layer_fn, per_layer, cfg, caches)
        parts.append(out)

    def one_layer(graphdef, params, h, extra):
        return layer_fn(nnx.merge(graphdef, params), constrain_activations(h), extra)

    one_layer = _remat(one_layer, cfg, prevent_cse=True, static_argnums=(0,))
    outs = []
    for i in range(start + periods * period, end):
        spec = specs[i]
        extra = jax.tree.map(lambda a: a[i], per_layer)
        if plan.known:
            extra = _with_kind(extra, spec, nope_layers)
        if caches is not None:
            extra["cache"] = _cache_at(caches[spec.cache], ranks[i])
        x, out = one_layer(*_layer_of(groups[spec.group], spec.index), x, extra)
        outs.append(out)
    if outs:
        parts.append(_stacked_outputs(outs))
    return x, _joined(parts)


def _pick(flag: bool | Array, when_set: Any, otherwise: Any) -> Any:
    """``when_set`` where a layer's kind flag is set: chosen while tracing when the flag is known (a Python
    bool), else per element (a traced flag of a scanned body whose layers differ in it)."""
    if isinstance(flag, bool):
        return when_set if flag else otherwise
    return jnp.where(flag, when_set, otherwise)


# --------------------------------------------------------------------------------------------------
# The stack


class Stack(nnx.Module):
    """A stack of blocks with one attention pattern, its final norm, and the position machinery
    that acts inside attention (rotary angles, T5 relative bias), computed once per stack call."""

    def __init__(self, cfg: ModelConfig, num_layers: int, *, pattern: str, cross_attention: bool = False,
                 gated: bool = False, rngs: nnx.Rngs):
        self.config, self.pattern, self.num_layers = cfg, pattern, num_layers
        # what each layer is, decided once: its masks, rotary table, cache, feed-forward and block group
        self.plan = layer_plan(cfg, pattern, num_layers, cross_attention=cross_attention, gated=gated)
        # the block groups the plan places layers in. DeepSeek's first layers keep a dense MLP (Llama 4
        # Maverick's dense layers lie between its expert layers): a group of their own.
        group = lambda name, axis="unstaged_layers": (  # noqa: E731
            stacked_blocks(cfg, self.plan.count(name), self.plan.first_of(name), rngs=rngs, axis=axis)
            if self.plan.count(name) else None)
        self.dense_blocks = group("dense_blocks")
        # Qwen3-Next's linear layers (the gated delta rule) between its attention layers: a group of their own
        self.linear_blocks = group("linear_blocks")
        # Gemma 4: full layers with attention of their own shape; the kv-shared layers of each kind (no key or value
        # weights), run after the layers whose keys and values they read
        self.full_blocks = group("full_blocks")
        self.shared_blocks = group("shared_blocks")
        self.shared_full_blocks = group("shared_full_blocks")
        # Mistral Large 4: latent layers without rotary positions, whose latent and keys have widths of their own
        self.nope_blocks = group("nope_blocks")
        # Llama 3.2 Vision's cross layers (attention to the images, gated): a group of their own
        self.cross_blocks = group("cross_blocks")
        # ModernBERT's first layer has no attention norm, DeBERTa's has a convolution beside it: a group of its own
        self.first_block = group("first_block")
        # DeepSeek-V4: a group per compressed-attention kind (hash-routed expert layers apart); the copies of the
        # residual collapsed once more at the end
        for name in COMPRESSED_GROUPS:
            setattr(self, name, group(name))
        self.hc_head = HyperHead(cfg, rngs=rngs) if cfg.norms.hyper_connections is not None else None
        self.conv = SequenceConvolution(cfg, rngs=rngs) if cfg.conv is not None else None
        # ALBERT's shared layers: one stacked layer, which the plan places at every layer
        # (the main group is built even when the plan places no layer in it: a one-layer stack whose first layer
        # runs apart keeps an empty 'blocks', as checkpoints hold it)
        if cfg.scores.compressed is not None:  # (DeepSeek-V4: every layer is in a group of its kind; none empty)
            self.blocks = None
        else:
            self.blocks = group("blocks", "layers") or stacked_blocks(
                cfg, 0, layer_plan(cfg, pattern, 1, cross_attention=cross_attention, gated=gated)[0], rngs=rngs)
        self.final_norm = Norm(cfg, rngs=rngs) if cfg.norms.final else None
        # T5's one table per stack, MPNet's beside absolute positions (UMT5's tables are in the blocks)
        shared_table = cfg.relative_bias is not None and not cfg.relative_bias.per_layer
        self.relative_bias = (RelativeBias(cfg, bidirectional=pattern == "bidirectional", rngs=rngs)
                              if shared_table else None)
        # Transformer-XL's global content (u) and position (v) biases, when all layers share one pair
        shared = cfg.position == "xl" and cfg.xl.shared_biases
        xl_bias = lambda: param(rngs, (cfg.num_heads, cfg.head_dim_), ("heads", "head_dim"), cfg)  # noqa: E731
        self.content_bias, self.position_bias = (xl_bias(), xl_bias()) if shared else (None, None)
        self.relative_embeddings = RelativeEmbeddings(cfg, rngs=rngs) if cfg.position == "disentangled" else None
        # LeRoPE (Mistral Large 4): the stack's rotary frequencies each times exp(a learned number), zero at init
        learned = cfg.rotary is not None and cfg.rotary.learned_frequencies
        self.rope_log_scale = (param(rngs, (cfg.rope_dim // 2,), ("rotary_frequencies",), cfg, init="zeros")
                               if learned else None)

    def block_groups(self) -> dict[str, Block | tuple[Block, ...]]:
        """The block groups by the names the plan gives them (and the parameter paths keep)."""
        groups = {"first_block": self.first_block, "dense_blocks": self.dense_blocks,
                  "linear_blocks": self.linear_blocks, "blocks": self.blocks, "full_blocks": self.full_blocks,
                  "shared_blocks": self.shared_blocks, "shared_full_blocks": self.shared_full_blocks,
                  "nope_blocks": self.nope_blocks, "cross_blocks": self.cross_blocks,
                  **{name: getattr(self, name) for name in COMPRESSED_GROUPS}}
        return {name: blocks for name, blocks in groups.items() if blocks is not None}

    def cross_key_values(self, encoder: EncoderOutput) -> EncoderKV:
        """Every layer's cross-attention keys and values [L, B, S, K, H] of a fixed encoder output:
        computed once per generation instead of once per decoded token."""
        if isinstance(self.blocks, tuple):  # separate layers (``unstacked``)
            k, v = (jnp.stack(parts) for parts in zip(*[b.cross_attn.key_values(encoder.hidden) for b in self.blocks]))
            return EncoderKV(k, v, encoder.valid)
        graphdef, params = nnx.split(self.blocks)
        k, v = jax.vmap(lambda p: nnx.merge(graphdef, p).cross_attn.key_values(encoder.hidden))(params)
        return EncoderKV(k, v, encoder.valid)

    def unstacked(self) -> Stack:
        """This stack with its layers sliced out of the stacked parameters once, as separate blocks.

        XLA's CPU backend copies a layer's weights out of a stacked array at every slice (it does not
        fuse slices into dots, unlike the GPU and TPU backends), so a decode loop of thousands of steps
        runs an unstacked copy, made once before the loop (``kernels.unstack_decode_loops``).
        """
        def separate(blocks: Block) -> tuple[Block, ...]:
            graphdef, params = nnx.split(blocks)
            count = jax.tree.leaves(params)[0].shape[0]
            return tuple(nnx.merge(graphdef, jax.tree.map(lambda a: a[i], params)) for i in range(count))

        copy = nnx.merge(*nnx.split(self))
        copy.blocks = None if self.blocks is None else separate(self.blocks)
        if self.dense_blocks is not None:
            copy.dense_blocks = separate(self.dense_blocks)
        if self.linear_blocks is not None:
            copy.linear_blocks = separate(self.linear_blocks)
        for name in ("full_blocks", "shared_blocks", "shared_full_blocks", "nope_blocks", "cross_blocks",
                     *COMPRESSED_GROUPS):
            if getattr(self, name) is not None:
                setattr(copy, name, separate(getattr(self, name)))
        if self.first_block is not None:
            copy.first_block = separate(self.first_block)
        return copy

    def __call__(self, x: Array, tokens: Tokens, *,
                 cache: KVCache | SplitKVCache | HybridCache | LatentCache | None = None,
                 cross: EncoderOutput | EncoderKV | None = None, memory: Memory | MemoryKV | None = None,
                 token_types: Array | None = None, collect_hidden: bool = False, collect_attentions: bool = False,
                 key: Array | None = None, per_layer_inputs: Array | None = None,
                 image_mask: Array | None = None) -> StackOutput:
        """Run the blocks over x [B, T, D] at ``tokens``. With a ``cache``, its slots are keys too,
        attended where they lie next to this call's own, and this call's keys and values are written
        into it once, after the layer loop. Transformer-XL's layers attend over their ``memory`` the same
        way, and each layer's input (or, for a ``MemoryKV``, its keys and values) is rolled into it after
        the loop (a model with ``memory_len`` starts an empty ``Memory`` when given none). Hidden states
        follow Hugging Face: the input, then every layer's output, the last one after the final norm;
        ``collect_attentions`` returns each layer's attention probabilities too (never through a fused kernel).
        ``per_layer_inputs`` [B, T, L, P]: Gemma 4's, each layer reading its own slice. ``image_mask`` [B, T, S]:
        which image states (``cross``, or an ``ImageCache``'s) each token sees (Llama 3.2 Vision; None: all, or in
        a decode step those the prompt's last token saw)."""
        cfg = self.config
        split = isinstance(cache, (SplitKVCache, HybridCache, CompressedCache, ImageCache))  # (slices by kind)
        remember, keeps_kv = self._remembers(memory), isinstance(memory, MemoryKV)
        setup = functools.partial(self._layer_function, x.shape[1], cache=cache, memory=memory,
                                  collect_hidden=collect_hidden, collect_attentions=collect_attentions,
                                  per_layer_inputs=per_layer_inputs, image_mask=image_mask)
        pipelined = self._pipelined(cache, memory, collect_hidden, collect_attentions)
        layer, per_layer, conv_key = setup(tokens, cross, token_types, key=key)
        segments = self.plan.segments(split)
        # Gemma 4's kv-shared layers run after the layers whose keys and values they read
        first_shared = next((i for i, spec in enumerate(self.plan.layers) if spec.kv_source is not None), None)
        main = segments if first_shared is None else [seg for seg in segments if seg.start < first_shared]
        # DeBERTa v2: the convolution joins the first layer's output
        after_first = None if self.conv is None else (lambda out: self.conv(x, out, tokens.valid, conv_key))
        caches = {kind: slots.layers() for kind, slots in cache.kinds().items()} if split else None
        if self.hc_head is not None:  # DeepSeek-V4: the residual as copies [B, T, n, D] of the embeddings
            x = jnp.broadcast_to(x[:, :, None], (*x.shape[:2], cfg.norms.hyper_connections.streams, x.shape[-1]))
        out, outputs = run_layers(self.plan, self.block_groups(), x, layer, per_layer, cfg, after_first=after_first,
                                  caches=caches, segments=main[:-1] if pipelined else main)
        if first_shared is not None:
            read = self._shared_key_values(outputs.new_kv, cache, caches)
            # (each reads its kind's keys and values: its kind is known while tracing)
            reading = lambda block, h, extra: layer(block, h, extra, read[extra["local"]])  # noqa: E731
            out, shared = run_layers(self.plan, self.block_groups(), out, reading, {**per_layer, "cache": None}, cfg,
                                     segments=[seg for seg in segments if seg.start >= first_shared])
            outputs = _joined([outputs, shared])
        if pipelined:  # the main run, after any layers that run apart; nothing per layer to hand back
            out, stats = self._run_pipeline(out, tokens, cross, token_types, key, setup, segments[-1].start)
            hidden = new_kv = layer_inputs = None
            weights = {"self": None, "cross": None}
        else:
            hidden, stats, new_kv = outputs.hidden, outputs.router_stats, outputs.new_kv
            layer_inputs, weights = outputs.layer_input, outputs.weights
        valid = jnp.ones(x.shape[:2], bool) if tokens.valid is None else tokens.valid
        if cache is not None:
            if isinstance(cross, EncoderKV) and cross.tables is not None:  # (a paged source: the last layer's read
                new_kv = written_after(cross.tables, new_kv, out)  # of the pool comes before its in-place write)
            cache = cache.write(new_kv, tokens.positions, valid)
        if remember:
            if memory is None:
                memory = Memory.empty(self.num_layers, x.shape[0], cfg.segment_memory, cfg.d_model, x.dtype)
            memory = memory.extend(new_kv if keeps_kv else {"hidden": layer_inputs}, valid)
        if self.hc_head is not None:
            out = self.hc_head(out)
        last_layer = out
        if self.final_norm is not None:
            out = self.final_norm(out)
        hidden_states = None
        if collect_hidden:  # the last entry after the final norm, but where the file's model reports it before
            last = out if cfg.norms.final_in_hidden_states else last_layer
            # (Llama 3.2 Vision without images: its cross layers pass x on and, as transformers skips them, report none)
            images = cross is not None or (isinstance(cache, ImageCache) and cache.images is not None)
            kept = [i for i, spec in enumerate(self.plan.layers) if spec.mixer != "cross" or images]
            hidden_states = (x, *[hidden[i] for i in kept[:-1]], last)
        per_layer_weights = lambda stacked: None if stacked is None else tuple(stacked)  # noqa: E731
        compressed = cfg.scores.compressed
        if compressed is not None and weights["self"] is not None:  # each layer's own keys: window and entries
            length = x.shape[1]
            keys = [length + (0 if kind == "sliding" else length // compressed.rate(kind))
                    for kind in compressed.layers]
            weights = dict(weights, self=[w[..., :k] for w, k in zip(weights["self"], keys)])
        return StackOutput(out, hidden_states, cache, stats, memory if remember else None,
                           per_layer_weights(weights["self"]), per_layer_weights(weights["cross"]))

    def _shared_key_values(self, new_kv: dict, cache, caches: dict | None) -> dict[bool, tuple]:
        """The keys and values Gemma 4's kv-shared layers read, by kind (local or not): those of the layer each kind
        reads, as that layer attended over them: this call's [B, T, K, H] in a full pass; in a cached step its
        cache slice and this call's, head-major, as (cache, own) pairs."""
        layers, own_full = self.plan.layers, self.full_blocks is not None
        read = {}
        for j in sorted({spec.kv_source for spec in layers if spec.kv_source is not None}):
            spec = layers[j]
            field = "full_" if own_full and not spec.local else ""  # (a full layer of its own shape: fields apart)
            rank = sum(other.kv_source is None and (not own_full or other.local == spec.local) for other in layers[:j])
            k, v = new_kv[field + "k"][rank], new_kv[field + "v"][rank]
            if cache is not None:
                slots, at = ((caches[spec.cache], _cache_ranks(self.plan)[j]) if caches is not None
                             else (cache.layers(), j))
                k, v = (slots["k"][at], k), (slots["v"][at], v)
            read[spec.local] = (k, v)
        return read

    def _remembers(self, memory: Memory | MemoryKV | None) -> bool:
        """Whether this call rolls Transformer-XL's segment memory forward."""
        return self.config.position == "xl" and (memory is not None or self.config.segment_memory > 0)

    def staged_layers(self) -> int:
        """The layers of the stack's main run (``self.blocks``), which a pipeline splits into stages; layers
        that run apart before it (DeepSeek's dense ones, ModernBERT's and DeBERTa's first) every stage keeps."""
        return self.num_layers - self.plan.apart()

    def pipeline_problem(self) -> str | None:
        """Why this stack cannot run as a pipeline over a ``stage`` mesh axis (None: it can)."""
        cfg = self.config
        if cfg.scores.compressed is not None:
            return "DeepSeek-V4's compressed-attention layers are groups of their kinds, interleaved"
        others = sorted({spec.group for spec in self.plan.layers[self.plan.apart():]} - {"blocks"})
        if others:  # (Qwen3-Next's linear_blocks, Maverick's dense_blocks, Mistral Large 4's nope_blocks, ...)
            return (f"its layers of block group {others[0]!r} interleave with the main group's ('blocks'), so a stage "
                    "would not hold a whole number of each")
        if cfg.shared_layers:
            return "ALBERT shares one layer's parameters across the stack: there is nothing to split into stages"
        if self._remembers(None):
            return "Transformer-XL's segment memory keeps every layer's input, per row, across calls"
        if cfg.embeddings.per_layer_width:
            return "Gemma 4's per-layer inputs are computed for the whole batch, not per microbatch"
        if cfg.scores.kv_shared_layers:
            return "Gemma 4's kv-shared layers read keys and values that earlier layers hand on"
        return None

    def _pipelined(self, cache, memory, collect_hidden: bool, collect_attentions: bool) -> bool:
        """Whether this call runs its layers as a pipeline: a full pass (training, evaluation) under a
        ``stage`` mesh axis. Cached calls (prefill, decoding) and calls that collect every layer's states
        run the layers in turn, the layer axis split over stages as it is stored."""
        if axis_size("stage") == 1 or cache is not None or collect_hidden or collect_attentions:
            return False
        problem = self.pipeline_problem() or ("it was given a segment memory" if memory is not None else None)
        if problem:
            raise ValueError(f"mesh.stage={axis_size('stage')}: this stack cannot run as a pipeline: {problem}")
        return True

    def _run_pipeline(self, x: Array, tokens: Tokens, cross: EncoderOutput | None, token_types: Array | None,
                      key: Array | None, setup: Callable, first: int) -> tuple[Array, dict[str, Array] | None]:
        """The main run of layers (``self.blocks``, from layer ``first``) as a pipeline over the ``stage`` mesh
        axis (``pipeline.run_pipeline``): each stage runs its chunk of layers with ``run_layers``, on masks
        built for the microbatch it holds. Returns the output and the MoE layers' router statistics of the
        whole batch, pooled from each microbatch's. Dropout draws a microbatch's masks from the call's key
        folded with its index."""
        cfg = self.config
        stages, repeats = axis_size("stage"), cfg.execution.pipeline_repeats
        per_chunk = self.staged_layers() // (stages * repeats)
        graphdef, params = nnx.split(self.blocks)

        def stage(chunk: Any, h: Array, rows: tuple, microbatch: Array,
                  virtual_stage: Array) -> tuple[Array, dict[str, Array] | None]:
            microbatch_key = None if key is None else jax.random.fold_in(key, microbatch)
            layer, per_layer, _ = setup(*rows, key=microbatch_key)
            extra = jax.tree.map(
                lambda a: jax.lax.dynamic_slice_in_dim(a, first + virtual_stage * per_chunk, per_chunk), per_layer)
            h, outputs = run_layers(self.plan.chunk(per_chunk), {"blocks": nnx.merge(graphdef, chunk)}, h, layer,
                                    extra, cfg)
            return h, outputs.router_stats

        microbatches = cfg.execution.pipeline_microbatches or stages
        out, stats = run_pipeline(params, x, (tokens, cross, token_types), stage, repeats=repeats,
                                  microbatches=microbatches)
        if stats is None:
            return out, None
        valid = jnp.ones(x.shape[:2], bool) if tokens.valid is None else tokens.valid
        return out, pooled_router_statistics(stats, valid.reshape(microbatches, -1, valid.shape[1]))

    def _layer_function(self, length: int, tokens: Tokens, cross: EncoderOutput | EncoderKV | None,
                        token_types: Array | None, *, cache, memory, key: Array | None, collect_hidden: bool,
                        collect_attentions: bool, per_layer_inputs: Array | None = None,
                        image_mask: Array | None = None) -> tuple[Callable, dict, Array | None]:
        """What the layer loop runs for these ``length`` tokens: ``layer(block, h, extra)`` with the masks,
        rotary angles and relative inputs of ``tokens`` built once, the per-layer inputs ``extra`` [L, ...]
        (which layers are local, dropout keys, cache and memory slices) and DeBERTa's convolution's dropout
        key. A pipeline builds one per microbatch."""
        cfg = self.config
        relative = None
        if cfg.position == "xl":
            key, encodings_key = split_key(key, 2)
            mask, relative = self._xl_inputs(tokens, memory, token_types, encodings_key)
            local_mask = bias = None
        else:
            mask, local_mask, bias = self._self_attention_masks(tokens, cache)
        disentangled = None
        if self.relative_embeddings is not None:  # DeBERTa: distances by index, as transformers counts them
            disentangled = DisentangledInputs(self.relative_embeddings(), disentangled_index(
                length, cfg.disentangled.span(cfg.max_positions), cfg.disentangled.buckets,
                cfg.disentangled.max_distance(cfg.max_positions)))
        conv_key = None
        if self.conv is not None:
            key, conv_key = split_key(key, 2)
        remember = self._remembers(memory)
        keeps_kv = isinstance(memory, MemoryKV)  # generation's memory rolls keys and values, not layer inputs
        # (Gemma 4: the full layers' heads may have a width of their own, their table as wide)
        full_width = cfg.scores.full_head_dim
        log_scale = None if self.rope_log_scale is None else self.rope_log_scale[...]
        rotary_at = tokens.positions if tokens.rotary_positions is None else tokens.rotary_positions
        rope = (rope_tables(cfg.replace(head_dim=full_width) if full_width else cfg, rotary_at, log_scale)
                if cfg.position == "rope" else None)
        local_rope = None
        if cfg.rotary is not None and cfg.rotary.local_theta is not None:
            # Gemma 3: the sliding layers rotate by their own, unscaled base
            local_cfg = cfg.replace(rope_theta=cfg.rotary.local_theta, rope_scaling=None, rope_proportion=None)
            local_rope = rope_tables(local_cfg, tokens.positions)
        elif rope is not None and full_width:
            local_rope = rope_tables(cfg, tokens.positions)
        # Gemma 4: a stack with kv-shared layers hands its layers' keys and values on (a full layer of its own shape
        # under fields of its own, as the split cache keeps them)
        hands_on = any(spec.kv_source is not None for spec in self.plan.layers)
        own_full = self.full_blocks is not None
        images = self._image_inputs(tokens, cache, cross, image_mask) if self.cross_blocks is not None else None
        cross_mask, cross_source, cross_kv = self._cross_attention_inputs(tokens, cache, None if images else cross)
        split = isinstance(cache, (SplitKVCache, HybridCache, CompressedCache, ImageCache))  # (slices by kind)
        per_layer = {
            # the plan's kind flags, for a scanned body whose layers differ in them (the runner hands a layer it
            # knows its flags as Python bools): which layers read the local mask (Gemma's sliding layers)
            "local": jnp.asarray(self.plan.local),
            "key": None if key is None else jax.random.split(key, self.num_layers),
            "cross_kv": cross_kv,
            # a split (or hybrid) cache's layers hold slices of two shapes: handed out by ``run_layers``
            "cache": None if cache is None or split else self._cache_layers(cache, tokens),
            "memory": None if memory is None else memory.layers(),
            "query_scale": (jnp.asarray(1.0 / np.arange(1, self.num_layers + 1), jnp.float32)
                            if cfg.scores.inverse_layer_scale else None),
            # Llama 4: the layers without rotary positions
            "nope": jnp.asarray(self.plan.nope) if any(self.plan.nope) else None,
            # Gemma 4: each layer's per-layer input [L, B, T, P]
            "per_layer_input": None if per_layer_inputs is None else jnp.moveaxis(per_layer_inputs, 2, 0),
        }
        temperature = self._temperature(tokens, cache)
        position_scale = self._position_scale(tokens)
        global_tokens = None
        if tokens.global_tokens is not None:  # Longformer: what a global token sees is every real key (of its document)
            segments = None if tokens.segments is None else (tokens.segments, tokens.segments)
            global_tokens = GlobalInputs(tokens.global_tokens, visibility_mask(
                "bidirectional", tokens.positions, tokens.positions, tokens.valid, segments=segments))
        block_sparse, threshold = None, cfg.scores.sparse_threshold()
        if threshold is not None and self.pattern == "bidirectional" and length > threshold:  # BigBird's blocks
            block_sparse = BlockSparseInputs.of(length, cfg.scores.sparse_block_size, cfg.scores.sparse_random_blocks,
                                                tokens.valid)

        def layer(block: Block, h: Array, extra: dict, shared_kv: tuple | None = None) -> tuple[Array, LayerOutput]:
            local, nope = extra["local"], extra["nope"]
            layer_mask = mask if local_mask is None else jax.tree.map(functools.partial(_pick, local), local_mask, mask)
            layer_rope = rope if local_rope is None else jax.tree.map(functools.partial(_pick, local), local_rope, rope)
            query_scale = extra["query_scale"]
            if nope is not None and nope is not False:
                # a NoPE layer rotates by zero angles (cos 1, sin 0: exactly the identity)
                unrotated = (jnp.ones_like(layer_rope[0]), jnp.zeros_like(layer_rope[1]))
                layer_rope = jax.tree.map(functools.partial(_pick, nope), unrotated, layer_rope)
            if temperature is not None and nope is not False:  # (a layer known to be rotated keeps its scale)
                tuned = _pick(nope, temperature, 1.0)
                query_scale = tuned if query_scale is None else query_scale * tuned
            if position_scale is not None:  # (every layer's)
                query_scale = position_scale if query_scale is None else query_scale * position_scale
            inputs = LayerInputs(layer_mask, bias, layer_rope, extra["cache"],
                                 cross=images or (None if cross is None else CrossInputs(cross_mask, cross_source,
                                                                                         extra["cross_kv"])),
                                 # MoE load statistics count real tokens only
                                 token_mask=tokens.valid if cache is None else None,
                                 relative=relative if relative is not None else disentangled, memory=extra["memory"],
                                 output_attentions=collect_attentions, query_scale=query_scale, nope=nope,
                                 per_layer_input=extra["per_layer_input"], shared_kv=shared_kv,
                                 return_kv=hands_on and shared_kv is None,
                                 global_tokens=global_tokens, valid=tokens.valid, segments=tokens.segments,
                                 block_sparse=block_sparse, positions=tokens.positions, token_ids=tokens.ids)
            h_in = h
            h, new_kv, stats, weights = block(h, inputs, extra["key"])
            if own_full and new_kv is not None and local is False:
                new_kv = {f"full_{name}": value for name, value in new_kv.items()}
            if relative is not None and not keeps_kv:
                new_kv = None  # a hidden-state memory keeps the layer's input instead
            return h, LayerOutput(hidden=h if collect_hidden else None, router_stats=stats, new_kv=new_kv,
                                  layer_input=h_in if remember and not keeps_kv else None, weights=weights)

        return layer, per_layer, conv_key

    def _cache_layers(self, cache, tokens: Tokens):
        """The cache's layer fields for the layers (``layers()``); a paged cache in a fused kernel's form told where
        this step's tokens go, as its layers write them themselves (``PagedLayers.writing``)."""
        layers = cache.layers()
        if not isinstance(layers, PagedLayers) or layers.kernel is None:
            return layers
        problem = kernels.paged_kernel_refuses(self.config, layers.kernel)
        if problem is not None:
            raise ValueError(f"the paged kernel {layers.kernel!r} cannot serve this model: {problem}")
        valid = jnp.ones(tokens.positions.shape, bool) if tokens.valid is None else tokens.valid
        windows = tuple(spec.window if spec.attention == "sliding" else None for spec in self.plan.layers)
        return layers.writing(tokens.positions, valid, windows)

    def _temperature(self, tokens: Tokens, cache: KVCache | None) -> Array | None:
        """Llama 4's attention temperature of the NoPE layers' queries [1, T, 1, 1] (None without it):
        1 + scale * log1p(floor((i + 1) / floor_scale)) at each token's index i in the sequence. The index
        counts every slot, pads included, as transformers counts it (the cache's write index, not
        ``tokens.positions``)."""
        cfg = self.config
        if cfg.nope is None or cfg.nope.temperature_floor_scale is None:
            return None
        start = 0 if cache is None else cache.index
        index = (start + jnp.arange(tokens.positions.shape[1])).astype(jnp.float32)
        nope = cfg.nope
        tuned = jnp.log1p(jnp.floor((index + 1.0) / nope.temperature_floor_scale)) * nope.temperature_scale + 1.0
        return tuned[None, :, None, None]

    def _position_scale(self, tokens: Tokens) -> Array | None:
        """The position-dependent factor on every layer's queries [B, T, 1, 1] (None without it):
        1 + query_position_scale * ln(1 + floor(p / query_position_span)) at each token's position p, the
        positions its rotary angles use (transformers' position_ids)."""
        scores = self.config.scores
        if scores.position_scale is None:
            return None
        spans = jnp.floor(tokens.positions.astype(jnp.float32) / scores.position_span)
        return (1.0 + scores.position_scale * jnp.log1p(spans))[:, :, None, None]

    def _xl_inputs(self, tokens: Tokens, memory: Memory | MemoryKV | None, token_types: Array | None,
                   key: Array | None) -> tuple[Array, XLInputs]:
        """Transformer-XL's self-attention mask [B, 1, T, M + T] (every real memory slot is visible, as it
        holds earlier tokens; this call's own tokens by the pattern) and its ``XLInputs``."""
        cfg = self.config
        q = tokens.positions
        B, T = q.shape
        M = 0 if memory is None else memory.length
        mask = (visibility_mask(self.pattern, q, q, tokens.valid) if memory is None
                else memory_visibility_mask(self.pattern, q, tokens.valid, memory.valid))
        distances = xl_distances(T, M + T, self.pattern == "bidirectional", cfg.xl.clamp_len)
        encodings = dropout(xl_encodings(distances, cfg.d_model), cfg.dropout_rate, key)
        other_segment = None
        if token_types is not None:  # XLNet: memory tokens count as type 0
            key_types = token_types if memory is None else jnp.concatenate(
                [jnp.zeros((B, M), token_types.dtype), token_types], axis=1)
            other_segment = token_types[:, :, None] != key_types[:, None, :]
        biases = None if self.content_bias is None else (self.content_bias, self.position_bias)
        return mask, XLInputs(encodings, biases, other_segment)

    def _self_attention_masks(self, tokens: Tokens, cache: KVCache | None):
        """(mask, mask of the local layers or None, relative bias or None) for self-attention. With a
        cache each is a (cache slots, this call's tokens) pair; a full pass that a fused kernel can take
        gets a ``kernels.FusedMask``."""
        cfg = self.config
        base_pattern, local_pattern = self.plan.patterns
        q = tokens.positions
        shape = dict(window=cfg.window_size, prefix_lengths=tokens.prefix_lengths, chunk=cfg.attention_chunk_size)

        segments = None if tokens.segments is None else (tokens.segments, tokens.segments)
        if segments is not None and cache is not None:
            raise ValueError("segment_ids pack documents for a full pass; a cached step (generation) takes none")

        blocks = None if tokens.image_blocks is None else (tokens.image_blocks, tokens.image_blocks)

        tiled = tokens.outer_padding_mask and tokens.valid is not None

        def masks(pattern, slots):
            if pattern is None:
                return None
            if pattern == "window":  # (an image tower's: no cache)
                return visibility_mask("bidirectional", q, q, tokens.valid, segments=(tokens.windows, tokens.windows))
            own = visibility_mask(pattern, q, q, None if tiled else tokens.valid, segments=segments, blocks=blocks,
                                  **shape)
            if tiled:
                own = own & (tokens.valid[:, None, :, None] | tokens.valid[:, None, None, :])
            if slots is None:
                return own
            return visibility_mask(pattern, q, slots.positions, slots.valid, **shape), own

        # a split cache's windowed layers attend over their ring, the others over the full slots
        full_slots, local_slots = ((cache.full, cache.window) if isinstance(cache, SplitKVCache) else
                                   (cache.full, cache.full) if isinstance(cache, (HybridCache, ImageCache))
                                   else (cache, cache))
        mask, local_mask = masks(base_pattern, full_slots), masks(local_pattern, local_slots)
        bias = None
        if cfg.position == "relative" or (cfg.relative_bias is not None and cfg.position != "relative"):
            # Index positions are the same in every row: one [1, N, T, S] bias, broadcast over the batch
            # (MPNet's distances are between indices whatever the positions).
            rows = q[:1] if tokens.indexed and cache is None else q
            beside_absolute = cfg.relative_bias is not None and cfg.position != "relative"  # MPNet
            if beside_absolute or (tokens.indexed and segments is not None):
                # (packed documents: inside one, distances between positions are distances between indices)
                rows = jnp.arange(q.shape[1], dtype=jnp.int32)[None]
            buckets = lambda at, keys: distance_buckets(cfg, at, keys, self.pattern == "bidirectional")  # noqa: E731
            bias = buckets(rows, rows)
            if cache is not None:
                bias = (buckets(q, full_slots.positions), bias)
            if self.relative_bias is not None:  # one table for the stack: looked up once; UMT5's layers each look up
                bias = jax.tree.map(self.relative_bias.lookup, bias)
        fusable = tokens.indexed and blocks is None  # (a fused kernel knows no image blocks)
        if cache is None and local_mask is None and not tiled and (fusable or self.pattern == "bidirectional"):
            mask = kernels.fused_mask(cfg, mask, self.pattern, key_valid=tokens.valid, query_valid=tokens.valid,
                                      has_bias=bias is not None or cfg.position == "disentangled", segments=segments)
        return mask, local_mask, bias

    @staticmethod
    def _image_inputs(tokens: Tokens, cache, cross: EncoderOutput | None, image_mask: Array | None
                      ) -> CrossInputs | None:
        """Llama 3.2 Vision's cross layers' inputs: the images' states (a full pass; a cached step reads their keys
        and values from its ``ImageCache``), which image states each token sees, and which tokens see any (None: no
        images). A token that sees none attends to all and its cross layers' MLP adds nothing, as transformers'
        additive mask, zeroed on such rows by full_text_row_masked_out_mask, does."""
        images = cache.images if isinstance(cache, ImageCache) else None
        if cross is None and images is None:
            return None
        batch, length = tokens.positions.shape
        if image_mask is None:
            visible = images.visible[:, None] if cross is None else jnp.ones((batch, 1, cross.hidden.shape[1]), bool)
            image_mask = jnp.broadcast_to(visible, (batch, length, visible.shape[-1]))
        image_mask = image_mask.astype(bool)
        rows = jnp.any(image_mask, axis=-1, keepdims=True)
        return CrossInputs((image_mask | ~rows)[:, None], None if cross is None else cross.hidden, rows=rows)

    def image_key_values(self, states: Array, visible: Array) -> ImageKV:
        """The cross layers' keys and values [L_cross, B, S, K, H] of the images' states [B, S, D], computed once
        by a prefill; ``visible`` [B, S]: the states the prompt's last token sees (``ImageKV``)."""
        blocks = self.cross_blocks
        if isinstance(blocks, tuple):  # separate layers (``unstacked``)
            k, v = (jnp.stack(parts) for parts in zip(*[block.attn.key_values(states) for block in blocks]))
        else:
            graphdef, params = nnx.split(blocks)
            k, v = jax.vmap(lambda p: nnx.merge(graphdef, p).attn.key_values(states))(params)
        return ImageKV(k, v, visible.astype(bool))

    def _cross_attention_inputs(self, tokens: Tokens, cache: KVCache | None,
                                cross: EncoderOutput | EncoderKV | None):
        """(mask, encoder output or None, per-layer keys and values or None) for cross-attention."""
        if cross is None:
            return None, None, None
        source_length = cross.hidden.shape[1] if isinstance(cross, EncoderOutput) else cross.length
        batch = tokens.positions.shape[0]
        source_positions = jnp.broadcast_to(jnp.arange(source_length), (batch, source_length))
        segments = None
        if isinstance(cross, EncoderOutput) and (tokens.segments is None) != (cross.segments is None):
            raise ValueError("packed documents need segment ids on both sides of cross-attention (the source's "
                             "and the decoder's), or on neither")
        if tokens.segments is not None:
            segments = (tokens.segments, cross.segments)
        mask = visibility_mask("bidirectional", tokens.positions, source_positions, cross.valid, segments=segments)
        if cache is None:
            mask = kernels.fused_mask(self.config, mask, "bidirectional", key_valid=cross.valid, segments=segments)
        if isinstance(cross, EncoderKV):
            return mask, None, cross.layers()
        return mask, cross.hidden, None


def check_pipeline_stacks(model: nnx.Module, stages: int, rows: int) -> None:
    """A ValueError, before anything compiles, when one of ``model``'s stacks cannot run as a pipeline of
    ``stages`` stages over ``rows`` rows with its config's repeats and microbatches (an abstract model from
    ``nnx.eval_shape`` will do)."""
    for path, module in nnx.iter_graph(model):
        if isinstance(module, Stack):
            what = "/".join(map(str, path)) or "the stack"
            apart = module.num_layers - module.staged_layers()
            problem = module.pipeline_problem()
            if problem:
                raise ValueError(f"mesh.stage={stages}: {what} cannot run as a pipeline: {problem}")
            cfg = module.config
            execution = cfg.execution
            check_schedule(module.staged_layers(), rows, stages, execution.pipeline_repeats,
                           execution.pipeline_microbatches or stages,
                           what + (f" (past {apart} run apart)" if apart else ""))
