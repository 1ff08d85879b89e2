"""Compressed attention (DeepSeek-V4 section 2.3): single-head shared keys-and-values attention over a sliding
window of this call's tokens plus compressed entries, each summarizing a block of ``rate`` earlier tokens.

- A compressor turns each closed block of ``rate`` tokens into one entry: a softmax-gated sum (per channel, over
  the block's tokens, with a learned bias per position in the block) of projected tokens, RMS-normed, then rotated
  at the block's first index. With ``overlap`` (compressed sparse attention, CSA) every token projects twice and
  entry w sums block w-1's first half with block w's second half (width 2 rate, stride rate); without (heavily
  compressed attention, HCA) entry w is block w alone.
- HCA: query t sees the entries of the blocks it has passed, w < (position + 1) // rate.
- CSA: a lightning indexer (the queries' own heads, its own compressor of index_head_dim) scores those entries,
  sum_h w_th relu(q_th . k_s) / sqrt(index_head_dim), and the query sees only its top ``index_topk``.
- Keys are values: both are the normed projection kv, rotated on their trailing rope dims (adjacent pairs), so each
  head's output is rotated back at the query's position (-angle) before the grouped output projection: ``groups``
  groups of heads, each projected to ``out_rank``, then one projection of all groups to d_model.
- Each head has a learned sink logit in its softmax (as gpt-oss); queries come through a normed low-rank
  projection (q_rank) and an RMS norm without scale per head.
- One code path serves a full pass, a prefill and each decode step: a cached call reads its layer's slice of
  ``cache.CompressedCache`` (the window's last keys, each compressor's last blocks of projected tokens and gates,
  the entries of the blocks closed so far) and returns what replaces it. Blocks are numbered by index (pads count,
  as transformers', whose compressors read every token); visibility of the entries goes by position (its
  position_ids). Transformers' cached one-token HCA step skips that mask (it reads every closed block): on a
  left-padded row this departs from its own full forward, which is what is followed here.

Everything here follows transformers' DeepseekV4 modules operation for operation (norms, softmaxes, gates and rotary
in float32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.layers.attention import dot_product_attention, index_scores, top_k_visible
from jaxformer.layers.core import dtype_of, param
from jaxformer.layers.positions import rope_frequencies
from jaxformer.layers.weights import project, projection
from jaxformer.model_config import ModelConfig

Array = jax.Array

def rotary_angles(cfg: ModelConfig, kind: str, positions: Array) -> tuple[Array, Array]:
    """cos and sin [B, T, rotary_dim / 2] (one angle per adjacent pair) at ``positions`` [B, T]: the model's rotary
    for a window-only layer, the compressed layers' own base and scaling otherwise."""
    part = cfg.scores.compressed
    if kind == "sliding":
        table = cfg
    else:
        table = cfg.replace(rope_theta=part.rope_theta, rope_scaling=part.rope_scaling)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope_frequencies(table))
    scaling = table.rotary.scaling  # (the reader sets yarn's attention_factor to 1 unless the file gives one)
    factor = jnp.float32(1.0 if scaling is None else scaling.cos_sin_factor)
    return jnp.cos(angles) * factor, jnp.sin(angles) * factor


def rotate_trailing(x: Array, cos: Array, sin: Array) -> Array:
    """x [B, T, N, H] with its trailing 2 * cos.shape[-1] numbers rotated in adjacent pairs by the angles
    [B, T, pairs], in float32."""
    R = 2 * cos.shape[-1]
    rest, rotary = x[..., :-R], x[..., -R:].astype(jnp.float32)
    even, odd = rotary[..., 0::2], rotary[..., 1::2]
    cos, sin = cos[:, :, None], sin[:, :, None]
    rotated = jnp.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1).reshape(rotary.shape)
    return jnp.concatenate([rest, rotated.astype(x.dtype)], axis=-1)


def rms(x: Array, scale: Array | None, eps: float) -> Array:
    """RMS norm in float32 (by ``scale`` when given), back in x's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (normed if scale is None else normed * scale.astype(jnp.float32)).astype(x.dtype)


class Compressor(nnx.Module):
    """One compressed entry [width] per closed block of ``rate`` tokens (see the module's docstring); with
    ``overlap`` each token projects to two halves and entry w also reads block w-1's first halves."""

    def __init__(self, cfg: ModelConfig, width: int, rate: int, overlap: bool, *, rngs: nnx.Rngs):
        copies = 2 if overlap else 1
        self.width, self.rate, self.overlap, self.copies = width, rate, overlap, copies
        self.dtype, self.eps = dtype_of(cfg.dtype), cfg.norms.eps
        wide = ("embed", "compressed_width")
        projection(self, "kv", cfg, rngs, (cfg.d_model, copies * width), wide, role="compressor")
        projection(self, "gate", cfg, rngs, (cfg.d_model, copies * width), wide, role="compressor")
        self.position_bias = param(rngs, (rate, copies * width), ("block_positions", "compressed_width"), cfg,
                                   init="zeros")
        self.norm_scale = param(rngs, (width,), ("compressed_width",), cfg, init="ones")

    @property
    def tail_length(self) -> int:
        """The tokens a cached call keeps for the next: the unfinished block (CSA: and the block before it, whose
        first halves the next entry reads), at most ``copies * rate - 1``; kept as the last ``copies * rate``."""
        return self.copies * self.rate

    def empty_tail(self, batch: int, dtype) -> tuple[Array, Array]:
        """(projections, gates) [B, tail_length, copies * width] before any token: gates -inf, so slots before
        the first token weigh nothing (block -1's halves in entry 0, as transformers leaves them)."""
        shape = (batch, self.tail_length, self.copies * self.width)
        return jnp.zeros(shape, dtype), jnp.full(shape, -jnp.inf, dtype)

    def __call__(self, cfg: ModelConfig, x: Array, tail: tuple[Array, Array] | None = None,
                 start: Array | int = 0) -> tuple[Array, Array, tuple[Array, Array]]:
        """The entries [B, K, width] of the K = T // rate + 1 blocks that may close among x's T tokens [B, T, D]
        written at index ``start`` (blocks start // rate + k, rotated at their first index), whether each closed
        [K], and the ``tail`` (the last ``tail_length`` tokens' projections and gates, ``empty_tail`` before any)
        for the next call. A call's tokens past its last closed block make no entry; a call shorter than a block
        makes none or one. Every block is cut from the tail and x at a known offset, so one code serves a full
        pass (no tail, start 0), a prefill and each decode step."""
        B, T, _ = x.shape
        rate, width, copies, P = self.rate, self.width, self.copies, self.tail_length
        kv = project(self, "kv", x, "BTD,DK->BTK", self.dtype)
        gate = project(self, "gate", x, "BTD,DK->BTK", self.dtype)
        tail_kv, tail_gate = self.empty_tail(B, kv.dtype) if tail is None else tail
        K = T // rate + 1
        # the tail's P tokens (indices start - P ...), this call's T, then a block of zeros so the K-th block (which
        # may not close) can be cut: its gates 0, not -inf, so no softmax is all -inf
        pad = jnp.zeros((B, rate, copies * width), kv.dtype)
        every_kv = jnp.concatenate([tail_kv.astype(kv.dtype), kv, pad], axis=1)
        every_gate = jnp.concatenate([tail_gate.astype(gate.dtype), gate, pad.astype(gate.dtype)], axis=1)
        first = P - start % rate - (copies - 1) * rate  # where block start // rate (CSA: the block before) begins
        size = (K + copies - 1) * rate
        blocks_kv = jax.lax.dynamic_slice_in_dim(every_kv, first, size, axis=1).reshape(B, K + copies - 1, rate, -1)
        blocks_gate = jax.lax.dynamic_slice_in_dim(every_gate, first, size, axis=1).reshape(B, K + copies - 1, rate, -1)
        blocks_gate = blocks_gate.astype(jnp.float32) + self.position_bias[...].astype(jnp.float32)
        if self.overlap:  # slots: block w-1's first halves (before block 0: the -inf gates of the empty tail), then
            # block w's second halves
            blocks_kv = jnp.concatenate([blocks_kv[:, :-1, :, :width], blocks_kv[:, 1:, :, width:]], axis=2)
            blocks_gate = jnp.concatenate([blocks_gate[:, :-1, :, :width], blocks_gate[:, 1:, :, width:]], axis=2)
        weights = jax.nn.softmax(blocks_gate, axis=2).astype(blocks_kv.dtype)
        entries = rms(jnp.sum(blocks_kv * weights, axis=2), self.norm_scale[...], self.eps)
        numbers = start // rate + jnp.arange(K, dtype=jnp.int32)
        closed = (numbers + 1) * rate <= start + T
        cos, sin = rotary_angles(cfg, "sparse", jnp.broadcast_to(numbers * rate, (B, K)))
        entries = rotate_trailing(entries[:, :, None], cos, sin)[:, :, 0]
        new_tail = (every_kv[:, T:T + P], every_gate[:, T:T + P])
        return entries, closed, new_tail


def passed_blocks(positions: Array, numbers: Array, rate: int) -> Array:
    """[B, T, W]: which entries (block ``numbers`` [W]) a query at ``positions`` [B, T] may read, those of the blocks
    it has passed, as transformers' full forward decides it (by position_ids, which left padding shifts)."""
    return numbers[None, None, :] < ((positions + 1) // rate)[..., None]


class CompressedIndexer(nnx.Module):
    """CSA's lightning indexer: each query's top ``index_topk`` compressed entries by V3.2's scores
    (``attention.index_scores``: sum_h w_th relu(q_th . k_s) / sqrt(index_head_dim), w = x wproj / sqrt(index_heads),
    in float32); keys from its own compressor over the same blocks. Its choice is discrete: no gradient flows through
    it (as the reference trains it apart)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        part = cfg.scores.compressed
        H, Dh = part.index_heads, part.index_head_dim
        self.part, self.dtype = part, dtype_of(cfg.dtype)
        self.compressor = Compressor(cfg, Dh, part.sparse_rate, True, rngs=rngs)
        self.wq = param(rngs, (part.q_rank, H, Dh), ("latent", "index_heads", "index_head_dim"), cfg)
        self.wproj = param(rngs, (cfg.d_model, H), ("embed", "index_heads"), cfg)

    def __call__(self, cfg: ModelConfig, x: Array, q_residual: Array, positions: Array, keys: Array,
                 readable: Array) -> Array:
        """[B, T, S]: the entries each query reads, among the ``readable`` [B, T, S] of its compressed ``keys``
        [B, S, index_head_dim]."""
        cos, sin = rotary_angles(cfg, "sparse", positions)
        q = rotate_trailing(jnp.einsum("BTC,CHK->BTHK", q_residual, self.wq[...].astype(self.dtype)), cos, sin)
        weights = jnp.einsum("BTD,DH->BTH", x, self.wproj[...].astype(self.dtype))
        return top_k_visible(index_scores(q, weights, keys), readable, self.part.index_topk)


class CompressedAttentionLayer(nnx.Module):
    """One layer of DeepSeek-V4's attention, of kind 'sliding' (the window alone), 'sparse' (CSA) or 'heavy'
    (HCA). ``cfg.num_heads`` query heads of ``cfg.head_dim``; one shared key-value head."""

    def __init__(self, cfg: ModelConfig, kind: str, *, rngs: nnx.Rngs):
        part = cfg.scores.compressed
        D, N, H, C = cfg.d_model, cfg.num_heads, cfg.head_dim_, part.q_rank
        self.config, self.kind, self.part, self.dtype, self.eps = cfg, kind, part, dtype_of(cfg.dtype), cfg.norms.eps
        self.num_heads, self.head_dim = N, H
        projection(self, "q_down", cfg, rngs, (D, C), ("embed", "latent"), role="attn")
        self.q_norm_scale = param(rngs, (C,), ("latent",), cfg, init="ones")
        projection(self, "q_up", cfg, rngs, (C, N, H), ("latent", "heads", "head_dim"), role="attn")
        projection(self, "kv", cfg, rngs, (D, H), ("embed", "head_dim"), role="attn")
        self.kv_norm_scale = param(rngs, (H,), ("head_dim",), cfg, init="ones")
        G = part.out_groups
        projection(self, "o_group", cfg, rngs, (G, N * H // G, part.out_rank), ("out_groups", "group_in", "out_rank"),
                   batch=1, role="attn")
        projection(self, "o", cfg, rngs, (G * part.out_rank, D), ("grouped_out", "embed"), role="attn")
        self.sinks = param(rngs, (N,), ("heads",), cfg, init="zeros")
        self.compressor = (None if kind == "sliding" else
                           Compressor(cfg, H, part.rate(kind), kind == "sparse", rngs=rngs))
        self.indexer = CompressedIndexer(cfg, rngs=rngs) if kind == "sparse" else None

    def __call__(self, x: Array, positions: Array, mask: Array | tuple[Array, Array], state: dict | None = None,
                 output_attentions: bool = False) -> tuple[Array, dict | None, Array | None]:
        """x [B, T, D] at ``positions`` [B, T], ``mask`` [B, 1, T, T] (the window's visibility; with a ``state``, a
        (window's kept keys, this call's) pair): the output [B, T, D], the layer's next state (with a ``state``: this
        layer's slice of ``cache.CompressedCache``, its fields named ``{kind}_{field}``) and, when asked, the
        probabilities [B, N, T, S] over the keys (a full pass: the T window keys and the T // rate entries)."""
        cfg, dt, eps, part = self.config, self.dtype, self.eps, self.part
        B, T, _ = x.shape
        cos, sin = rotary_angles(cfg, self.kind, positions)
        q_residual = rms(project(self, "q_down", x, "BTD,DC->BTC", dt), self.q_norm_scale[...], eps)
        q = rms(project(self, "q_up", q_residual, "BTC,CNH->BTNH", dt), None, eps)
        q = rotate_trailing(q, cos, sin)
        kv = rms(project(self, "kv", x, "BTD,DH->BTH", dt), self.kv_norm_scale[...], eps)
        kv = rotate_trailing(kv[:, :, None], cos, sin)  # [B, T, 1, H]
        start = 0 if state is None else state["start"]
        # transformers orders this call's tokens by index, not position: a left pad (at position 0) sees no later
        # token, so the pads' states, which the compressors read, stay as there
        earlier, own = (None, mask) if state is None else mask
        own = own & jnp.tril(jnp.ones((T, T), bool))
        new = None
        if state is None:
            keys, masks = (kv,), (own,)
        else:  # the window's kept keys (which are its values too) before this call's
            keys, masks = (state["keys"][:, :, None].astype(kv.dtype), kv), (earlier, own)
            kept = state["keys"].shape[1]
            new = {"keys": jnp.concatenate([state["keys"], kv[:, :, 0].astype(state["keys"].dtype)], axis=1)[:, T:]
                   if kept else state["keys"]}
        if self.compressor is not None:
            rate = self.compressor.rate
            tail = None if state is None else (state["kv_tail"], state["gate_tail"])
            entries, closed, tail = self.compressor(cfg, x, tail, start)
            numbers = start // rate + jnp.arange(entries.shape[1], dtype=jnp.int32)
            readable = passed_blocks(positions, numbers, rate) & closed[None, None]  # [B, T, K]
            entry_keys, entry_masks = (entries,), (readable,)
            if state is not None:  # the entries of the blocks closed before this call, then this call's
                written = jnp.arange(state["entries"].shape[1], dtype=jnp.int32)
                earlier = passed_blocks(positions, written, rate) & (written < start // rate)[None, None]
                entry_keys, entry_masks = (state["entries"].astype(entries.dtype), entries), (earlier, readable)
                new.update(kv_tail=tail[0], gate_tail=tail[1], entries=entries)
            if self.indexer is not None:
                index_tail = None if state is None else (state["index_kv_tail"], state["index_gate_tail"])
                index_entries, _, index_tail = self.indexer.compressor(cfg, x, index_tail, start)
                index_keys = (index_entries if state is None else
                              jnp.concatenate([state["index_entries"].astype(index_entries.dtype), index_entries], 1))
                chosen = self.indexer(cfg, x, q_residual, positions, index_keys,
                                      jnp.concatenate(entry_masks, axis=-1))
                cut = entry_masks[0].shape[-1]
                entry_masks = (chosen,) if state is None else (chosen[..., :cut], chosen[..., cut:])
                if state is not None:
                    new.update(index_kv_tail=index_tail[0], index_gate_tail=index_tail[1], index_entries=index_entries)
            keys = (*keys, *(e[:, :, None] for e in entry_keys))
            masks = (*masks, *(m[:, None] for m in entry_masks))
        result = dot_product_attention(q, keys, keys, masks, None, self.head_dim ** -0.5,
                                       with_weights=output_attentions, sinks=self.sinks[...])
        out, weights = result if output_attentions else (result, None)
        if weights is not None and state is None and self.compressor is not None:  # the entries of closed blocks
            weights = weights[..., :T + T // self.compressor.rate]
        out = rotate_trailing(out, cos, -sin)  # the values' rotation undone at the query's position
        G = part.out_groups
        grouped = project(self, "o_group", out.reshape(B, T, G, -1), "BTGI,GIR->BTGR", dt)
        new = None if new is None else {f"{self.kind}_{name}": value for name, value in new.items()}
        return project(self, "o", grouped.reshape(B, T, -1), "BTC,CD->BTD", dt), new, weights
