"""Who sees whom (visibility masks built from positions) and attention itself: grouped-query
dot-product attention over a KV cache or a fused kernel, the multi-head attention layer, DeepSeek's
latent attention, Transformer-XL's relative attention over a segment memory and DeBERTa's disentangled
attention."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxformer import kernels
from jaxformer.cache import PagedRows, WrittenPool, cache_written_after, cached_slots
from jaxformer.layer_plan import stack_patterns
from jaxformer.model_config import ModelConfig
from jaxformer.layers.core import Norm, dropout, dtype_of, normalize, param
from jaxformer.layers.positions import apply_rope, relative_shift
from jaxformer.layers.weights import kernel, project, projection

Array = jax.Array


def visibility_mask(pattern: str, q_positions: Array, k_positions: Array, k_valid: Array | None = None,
                   *, window: int | None = None, prefix_lengths: Array | None = None, chunk: int | None = None,
                   segments: tuple[Array, Array] | None = None, blocks: tuple[Array, Array] | None = None) -> Array:
    """Boolean [B, 1, T, S]: may query t attend to key s?

    Built from positions rather than indices so the same function serves full sequences, KV caches
    and left padding. ``k_valid`` [B, S] removes padded keys. Patterns: bidirectional; causal
    (s <= t); sliding (t - window < s <= t); prefix (causal, plus every key inside the prefix);
    bidirectional_sliding (|t - s| <= window: the sliding layers of T5Gemma's encoder, bounds inclusive as
    there); chunked (causal within chunks of ``chunk`` positions, s // chunk == t // chunk: Llama 4's local
    layers). Alternating layers call this with 'causal' and 'sliding' or 'chunked' (encoders: 'bidirectional'
    or 'bidirectional_sliding'). ``segments`` (query ids [B, T], key ids [B, S]): documents packed into one
    row, where a query sees only keys of its own document. ``blocks`` (query ids [B, T], key ids [B, S], -1 outside
    any): Gemma 3's images, whose tokens see each other both ways, also in a sliding layer's window (as transformers
    orders it: (causal or same block) and within the window).
    """
    q = q_positions[:, :, None]
    k = k_positions[:, None, :]
    earlier = k <= q
    if blocks is not None:
        earlier = earlier | ((blocks[0][:, :, None] == blocks[1][:, None, :]) & (blocks[0][:, :, None] >= 0))
    if pattern == "bidirectional":
        allowed = jnp.ones(jnp.broadcast_shapes(q.shape, k.shape), bool)
    elif pattern == "causal":
        allowed = earlier
    elif pattern == "sliding":
        allowed = earlier & (k > q - window)
    elif pattern == "chunked":
        allowed = (k <= q) & (k // chunk == q // chunk)
    elif pattern == "bidirectional_sliding":
        allowed = jnp.abs(k - q) <= window
    elif pattern == "prefix":
        allowed = (k <= q) | (k < prefix_lengths[:, None, None])
    else:
        raise ValueError(f"unknown attention pattern {pattern!r}")
    if k_valid is not None:
        allowed = allowed & k_valid[:, None, :].astype(bool)
    if segments is not None:
        allowed = allowed & (segments[0][:, :, None] == segments[1][:, None, :])
    return allowed[:, None, :, :]


# (the pattern of a stack's full layers, that of its local layers or None): the layer plan decides it
layer_patterns = stack_patterns


def memory_visibility_mask(pattern: str, positions: Array, valid: Array | None, memory_valid: Array) -> Array:
    """Transformer-XL's self-attention mask [B, 1, T, M + T]: every real memory slot (``memory_valid``
    [B, M]) is visible to every query, as it holds earlier tokens; this call's own tokens follow ``pattern``."""
    own = visibility_mask(pattern, positions, positions, valid)
    B, _, T, _ = own.shape
    memory = jnp.broadcast_to(memory_valid[:, None, None, :], (B, 1, T, memory_valid.shape[1]))
    return jnp.concatenate([memory, own], axis=-1)


def left_padded_positions(valid: Array) -> Array:
    """Positions of a left-padded batch [B, T]: each row counts its real tokens only, so its first real
    token sits at 0 whatever the padding (as transformers' generation numbers them); pads sit at 0."""
    return jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)


# --------------------------------------------------------------------------------------------------
# Attention


def _lora_keys(key: Array | None) -> list[Array | None]:
    """Keys for LoRA dropout on the q, k, v, o adapters' inputs, derived from the attention's own key
    (attention-probability dropout keeps using ``key`` itself)."""
    return [None] * 4 if key is None else [jax.random.fold_in(key, 1000 + i) for i in range(4)]


@jax.custom_jvp
def softmax(x: Array) -> Array:
    """Softmax over the last axis whose JVP uses the output alone: autodiff saves one [.., S] array,
    not the unnormalized exponentials and the squared sums as well (jax.nn.softmax's default rule)."""
    unnormalized = jnp.exp(x - jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True)))
    return unnormalized / jnp.sum(unnormalized, axis=-1, keepdims=True)


@softmax.defjvp
def _softmax_jvp(primals, tangents):
    y = softmax(primals[0])
    return y, y * (tangents[0] - jnp.sum(y * tangents[0], axis=-1, keepdims=True))


def dot_product_attention(q: Array, k, v, mask, bias, scale: float, dropout_rate: float = 0.0,
                          key: Array | None = None, softcap: float | None = None,
                          with_weights: bool = False, head_major: bool = False,
                          sinks: Array | None = None) -> Array | tuple[Array, Array]:
    """Grouped-query attention. q [B,T,N,H], k [B,S,K,H], v [B,S,K,Hv], mask [B|1,1,T,S], bias [B|1,N,T,S]
    or None; returns [B,T,N,Hv], and with ``with_weights`` also the attention probabilities [B,N,T,S]
    (float32, after dropout: what transformers returns as attentions).

    k, v, mask and bias may also be tuples of segments along S (a KV cache and this call's new
    keys): the softmax runs over all segments together, so the cache is read where it lies instead
    of being copied to append the new keys. ``head_major``: k and v (every segment) are laid out
    [B, K, S, H], as a ``KVCache`` holds them. Scores, bias and softmax are float32. A row with every key
    masked (a padded query) gets a uniform distribution instead of NaN, like the additive-minimum
    masks of PyTorch references. ``softcap`` (Gemma 2) bounds each score as cap * tanh(score / cap),
    after the scale and bias and before the mask, as the reference does.
    ``sinks`` [N] (gpt-oss): each head's learned logit joins its rows' softmax as one more key without a
    value, so the probabilities over the real keys sum to less than one (a padded query then gives
    everything to the sink).
    """
    ks, vs, masks = (k, v, mask) if isinstance(k, tuple) else ((k,), (v,), (mask,))
    biases = bias if isinstance(bias, tuple) else (bias,) * len(ks)
    paged = None  # a paged cache's segment (the first), read chunk by chunk (``_paged_part``)
    if isinstance(ks[0], PagedRows):
        chunk = PAGED_CHUNK_SLOTS.get(jax.default_backend())
        if with_weights or (dropout_rate > 0.0 and key is not None) or chunk is None:
            ks, vs = (ks[0].slots(q), *ks[1:]), (vs[0].slots(q), *vs[1:])  # gathered whole
        else:
            paged, (ks, vs, masks, biases) = (ks[0], vs[0], masks[0], biases[0]), (ks[1:], vs[1:], masks[1:],
                                                                                    biases[1:])
    B, T, N, H = q.shape
    K = paged[0].kv_heads if paged is not None else ks[0].shape[1 if head_major else 2]
    G = N // K
    # Head-major operands (explicit transposes of the [.., H]-sized inputs), with a kv head's G query
    # heads stacked along the rows (M = G*T), make each attention matmul one plain batched GEMM. Left
    # to itself XLA CPU picked layouts that transposed the [.., T, S] scores and probabilities
    # instead, forward and backward.
    # Scale q [.., H] rather than the scores [.., S] (float32 only: a bfloat16 q would round the scale in).
    fold_scale = scale != 1.0 and q.dtype == jnp.float32
    if fold_scale:
        q = q * jnp.asarray(scale, q.dtype)
    q = q.reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, H)
    if not head_major:
        ks, vs = tuple(k.transpose(0, 2, 1, 3) for k in ks), tuple(v.transpose(0, 2, 1, 3) for v in vs)
    # Scores, mask and bias all stay 4-D [B, K, G*T, S] (the mask and bias repeated over the G rows of a
    # group): a [B,K,G,T,S] view made XLA CPU copy the scores, and under autodiff the softmax output and
    # the probabilities the PV product saves became two arrays, both kept for the backward pass.
    scores = [_scores(q, k_seg, m_seg, b_seg, None if fold_scale else scale, softcap, G, T)
              for k_seg, m_seg, b_seg in zip(ks, masks, biases)]
    if sinks is not None:  # query row g*T + t of kv head k belongs to head k*G + g
        sink = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(1, K, G, 1, 1), (B, K, G, T, 1))
        scores.append(sink.reshape(B, K, G * T, 1))
    if paged is not None:
        out = _paged_part(q, *paged, None if fold_scale else scale, softcap, G, T, scores, vs)
        Hv = out.shape[-1]
        return out.reshape(B, K, G, T, Hv).transpose(0, 3, 1, 2, 4).reshape(B, T, N, Hv)
    probs = softmax(jnp.concatenate(scores, axis=-1) if len(scores) > 1 else scores[0])
    probs = dropout(probs if sinks is None else probs[..., :-1], dropout_rate, key)
    out, start = 0.0, 0
    for v_seg in vs:
        p_seg = probs if len(vs) == 1 else jax.lax.slice_in_dim(probs, start, start + v_seg.shape[2], axis=-1)
        out = out + jnp.einsum("BKMS,BKSH->BKMH", p_seg.astype(v_seg.dtype), v_seg)
        start += v_seg.shape[2]
    Hv = vs[0].shape[-1]
    out = out.reshape(B, K, G, T, Hv).transpose(0, 3, 1, 2, 4).reshape(B, T, N, Hv)
    # query head n is kv head n // G's (n % G)-th: the [B, K, G*T, S] probabilities read as [B, N, T, S]
    return (out, probs.reshape(B, N, T, probs.shape[-1])) if with_weights else out


def _scores(q: Array, k: Array, mask: Array, bias: Array | None, scale: float | None, softcap: float | None,
            G: int, T: int) -> Array:
    """Masked float32 scores [B, K, G*T, S] of head-major queries [B, K, G*T, H] (scaled already where ``scale``
    is None) against keys [B, K, S, H] (``dot_product_attention``)."""
    mask, bias = _group_rows(mask, bias, k.shape[1], G, T)
    s = jnp.einsum("BKMH,BKSH->BKMS", q, k, preferred_element_type=jnp.float32)
    s = s if scale is None else s * scale
    if bias is not None:
        s = s + bias
    if softcap is not None:
        s = jnp.tanh(s / softcap) * softcap
    return jnp.where(mask, s, jnp.finfo(jnp.float32).min)


def _group_rows(mask: Array, bias: Array | None, K: int, G: int, T: int) -> tuple[Array, Array | None]:
    """A mask [B|1, 1, T, S] and bias [B|1, N, T, S] laid out as the head-major scores' rows: [.., G*T, S], query row
    g*T + t of kv head k being query t of head k*G + g (as they are where G is 1)."""
    if G == 1:
        return mask, bias
    mask = jnp.broadcast_to(mask[:, :, None], (mask.shape[0], 1, G, T, mask.shape[-1]))
    mask = mask.reshape(mask.shape[0], 1, G * T, -1)
    return mask, None if bias is None else bias.reshape(bias.shape[0], K, G * T, bias.shape[-1])


# Slots of a paged cache attended at a time (``_paged_part``), by backend: on XLA:CPU a 32-row gpt2 step's chunk of
# keys stays in cache, where gathering every row's whole table first wrote and read back 25 MB a layer. Elsewhere
# (no entry) each layer gathers its rows' whole tables at once.
PAGED_CHUNK_SLOTS = {"cpu": 64}
# Rows read together: each group of this many rows reads up to its own last seen slot, so a batch mixing short rows
# with long ones (the serving engine orders its one-token rows longest first) reads the short ones' slots alone,
# not the longest row's (gpt2-124M, 32 rows of 17 to 380 tokens: the step as fast as 32 rows of their mean length).
PAGED_ROW_GROUP = 8


def _paged_part(q: Array, k: PagedRows, v: PagedRows, mask: Array, bias: Array | None, scale: float | None,
                softcap: float | None, G: int, T: int, scores: list[Array], vs: tuple[Array, ...]) -> Array:
    """Attention [B, K, G*T, Hv] over a paged cache's rows ``k``, ``v`` (``mask`` [B|1, 1, T, S], ``bias``: their
    segment's) and the other segments' ``scores`` (and sink) and values ``vs``, as one softmax over all of them.
    The paged rows are read a few blocks at a time (``PAGED_CHUNK_SLOTS``), each group of ``PAGED_ROW_GROUP`` rows
    up to the last slot any of them may see, with a running maximum and sum (online softmax): the same
    probabilities in another rounding order. A query that sees no key (a padded row's) gets a mixture of the slots
    read, never NaN."""
    (B, M), size = k.tables.shape, k.block_size
    chunk = max(1, PAGED_CHUNK_SLOTS[jax.default_backend()] // size)  # blocks a step
    pad = -M % chunk
    tables = jnp.pad(k.tables, ((0, 0), (0, pad)))  # (block 0, the null block: its slots masked)
    mask = jnp.broadcast_to(mask, (B, *mask.shape[1:]))
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 0), (0, pad * size)))
    if bias is not None:
        bias = jnp.pad(bias, ((0, 0), (0, 0), (0, 0), (0, pad * size)))
    parts = []
    for start in range(0, B, PAGED_ROW_GROUP):
        group = slice(start, min(start + PAGED_ROW_GROUP, B))
        parts.append(_paged_rows(q[group], k, v, tables[group], mask[group],
                                 None if bias is None else bias[group] if bias.shape[0] == B else bias,
                                 scale, softcap, G, T, chunk))
    top, total, acc = (jnp.concatenate(part, axis=0) if len(parts) > 1 else part[0] for part in zip(*parts))
    rest = jnp.concatenate(scores, axis=-1) if len(scores) > 1 else scores[0] if scores else None
    if rest is not None:
        top_all = jnp.maximum(top, jnp.max(rest, axis=-1, keepdims=True))
        kept, e = jnp.exp(top - top_all), jnp.exp(rest - top_all)
        acc, total = acc * kept, total * kept + jnp.sum(e, axis=-1, keepdims=True)
        start = 0
        for v_seg in vs:
            acc = acc + jnp.einsum("BKMS,BKSH->BKMH", e[..., start:start + v_seg.shape[2]].astype(v_seg.dtype), v_seg,
                                   preferred_element_type=jnp.float32)
            start += v_seg.shape[2]
    return (acc / jnp.where(total > 0, total, 1.0)).astype(v.dtype)  # (0: nothing read, nothing else)


def _paged_rows(q: Array, k: PagedRows, v: PagedRows, tables: Array, mask: Array, bias: Array | None,
                scale: float | None, softcap: float | None, G: int, T: int, chunk: int) -> tuple[Array, Array, Array]:
    """The running (maximum, sum, weighted values) [B, K, G*T, 1|1|Hv] of queries ``q`` over the paged slots of
    their ``tables`` (padded to whole chunks of ``chunk`` blocks, as ``mask`` and ``bias`` are), read a chunk at a
    time up to the last slot any of these rows sees (``_paged_part``)."""
    B, K, rows, Hv = q.shape[0], q.shape[1], q.shape[2], v.pool.shape[-1]
    width = chunk * k.block_size
    seen = jnp.any(mask, axis=(0, 1, 2))
    steps = (jnp.max(jnp.where(seen, jnp.arange(seen.shape[0]), -1)) + width) // width  # up to the last seen slot
    # Heads first [K, B, ...] inside the loop: the chunk's gathered keys and values are then the plain batched
    # operands of their matmuls (a 32-row gpt2-124M one-token step on XLA:CPU: its attention 58 -> 53 ms). The mask
    # and bias come in with the G query heads of a group already stacked (``_scores`` then has G = 1).
    q = q.swapaxes(0, 1)
    mask, bias = _group_rows(mask, bias, K, G, T)
    mask, bias = mask.swapaxes(0, 1), None if bias is None else bias.swapaxes(0, 1)

    def read(c, carry):
        top, total, acc = carry
        blocks = jax.lax.dynamic_slice_in_dim(tables, c * chunk, chunk, axis=1)
        keys = k.blocks(blocks, heads_first=True)
        s = _scores(q, keys, jax.lax.dynamic_slice_in_dim(mask, c * width, width, axis=3),
                    None if bias is None else jax.lax.dynamic_slice_in_dim(bias, c * width, width, axis=3),
                    scale, softcap, 1, G * T)
        values = keys if v is k else v.blocks(blocks, heads_first=True)  # (latent attention's keys are its values)
        new_top = jnp.maximum(top, jnp.max(s, axis=-1, keepdims=True))
        e, kept = jnp.exp(s - new_top), jnp.exp(top - new_top)
        acc = acc * kept + jnp.einsum("KBMS,KBSH->KBMH", e.astype(values.dtype), values,
                                      preferred_element_type=jnp.float32)
        return new_top, total * kept + jnp.sum(e, axis=-1, keepdims=True), acc

    carry = jax.lax.fori_loop(0, steps, read, (jnp.full((K, B, rows, 1), -jnp.inf), jnp.zeros((K, B, rows, 1)),
                                               jnp.zeros((K, B, rows, Hv), jnp.float32)))
    return tuple(part.swapaxes(0, 1) for part in carry)


def _attend(q, k, v, mask, bias, scale, dropout_rate, key, softcap, with_weights: bool,
            head_major: bool = False, sinks: Array | None = None) -> tuple[Array, Array | None]:
    """``dot_product_attention`` as an (output, probabilities or None) pair, whichever was asked."""
    result = dot_product_attention(q, k, v, mask, bias, scale, dropout_rate, key, softcap, with_weights, head_major,
                                   sinks)
    return result if with_weights else (result, None)


class ProjectionNorm(nnx.Module):
    """A norm over a whole projection [B, T, N, H] (all N heads' numbers at once, OLMo-2's q_norm and k_norm),
    in float32 like ``Norm``. Its scale (and LayerNorm bias) is stored [N, H] with the projection's head
    axes, so it shards as the heads do; the statistics then reduce over the split heads."""

    def __init__(self, cfg: ModelConfig, heads: int, heads_axis: str, *, rngs: nnx.Rngs):
        norms = cfg.norms
        self.kind, self.eps, self.dtype, self.offset = norms.kind, norms.eps, dtype_of(cfg.dtype), norms.scale_offset
        shape, axes = (heads, cfg.head_dim_), (heads_axis, "head_dim")
        self.scale = (param(rngs, shape, axes, cfg, init="zeros" if self.offset else "ones") if cfg.query_key_norm.scale
                      else None)
        self.bias = param(rngs, shape, axes, cfg, init="zeros") if norms.kind == "layernorm" and norms.bias else None

    def __call__(self, x: Array) -> Array:
        flat = x.reshape(*x.shape[:-2], -1).astype(jnp.float32)
        width = flat.shape[-1]
        scale = (jnp.ones((width,), jnp.float32) if self.scale is None
                 else self.scale[...].reshape(width).astype(jnp.float32))
        if self.offset:
            scale = scale + self.offset
        bias = None if self.bias is None else self.bias[...].reshape(width).astype(jnp.float32)
        return normalize(flat, scale, bias, self.kind, self.eps).reshape(x.shape).astype(self.dtype)


class EachHeadNorm(nnx.Module):
    """A norm over each head [.., N, H] alone, with each head's own scale [N, H] and no bias (StableLM's
    qk_layernorm: one LayerNorm per head), in float32 like ``Norm``."""

    def __init__(self, cfg: ModelConfig, heads: int, heads_axis: str, *, rngs: nnx.Rngs):
        self.kind, self.eps, self.dtype = cfg.norms.kind, cfg.norms.eps, dtype_of(cfg.dtype)
        self.scale = param(rngs, (heads, cfg.head_dim_), (heads_axis, "head_dim"), cfg, init="ones")

    def __call__(self, x: Array) -> Array:
        y = normalize(x.astype(jnp.float32), self.scale[...].astype(jnp.float32), None, self.kind, self.eps)
        return y.astype(self.dtype)


class Attention(nnx.Module):
    """Multi-head attention with separate kv heads (MHA, GQA, MQA), self or cross.

    Projections are einsum kernels with explicit head axes: q [D,N,H], k/v [D,K,H], o [N,H,D].
    Calls return (output, this call's keys and values or None, attention probabilities [B, N, T, S] when
    ``output_attentions``, else None). Two hooks serve generation:
    - ``cache`` {"k", "v": [B, K, S, H]}: keys/values of earlier tokens (head-major, a ``KVCache``
      layer's slice, or a paged cache's ``PagedRows``, gathered here: ``cache.cached_slots``), attended
      in place next to this call's own (``mask`` and ``bias`` are then (cache part, new part) pairs); the
      new keys and values [B, K, T, H] are returned so the caller writes them into its cache.
    - ``kv`` (k, v) [B, S, K, H]: precomputed keys/values (cross-attention to a fixed encoder output); a paged
      source's ``PagedRows`` (the serving engine's), gathered here head-major [B, K, S, H] once the queries are.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, role: str = "attn", own_keys: bool = True,
                 keys_as_values: bool = False):
        """``own_keys`` False: a Gemma 4 kv-shared layer, reading an earlier layer's keys and values (no k or v
        weights); ``keys_as_values``: the values are the keys as projected (Gemma 4's full layers: no v weights)."""
        D, N, K, H = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim_
        self.dtype, self.scale, self.softcap = dtype_of(cfg.dtype), cfg.scale, cfg.scores.softcap
        self.dropout_rate = cfg.attention_dropout_rate
        self.own_keys, self.keys_as_values = own_keys, keys_as_values and own_keys
        projection(self, "q", cfg, rngs, (D, N, H), ("embed", "heads", "head_dim"), role=role)
        if own_keys:
            projection(self, "k", cfg, rngs, (D, K, H), ("embed", "kv_heads", "head_dim"), role=role)
        if own_keys and not keys_as_values:
            projection(self, "v", cfg, rngs, (D, K, H), ("embed", "kv_heads", "head_dim"), role=role)
        projection(self, "o", cfg, rngs, (N, H, D), ("heads", "head_dim", "embed"), inputs=2, role=role)
        # Qwen3-Next: each head's output times sigmoid(x . w_gate), a gate the query projection computes beside it
        if cfg.scores.output_gate and role == "attn":
            projection(self, "gate", cfg, rngs, (D, N, H), ("embed", "heads", "head_dim"), role=role)
        else:
            self.gate = None
        if cfg.biases.qkv:
            self.q_bias = param(rngs, (N, H), ("heads", "head_dim"), cfg, init="zeros")
            self.k_bias = (param(rngs, (K, H), ("kv_heads", "head_dim"), cfg, init="zeros")
                           if cfg.biases.key and own_keys else None)
            self.v_bias = (param(rngs, (K, H), ("kv_heads", "head_dim"), cfg, init="zeros")
                           if own_keys and not keys_as_values else None)
        else:
            self.q_bias = self.k_bias = self.v_bias = None
        self.o_bias = param(rngs, (D,), ("embed",), cfg, init="zeros") if cfg.biases.out else None
        self.rotary_dim, self.rope_interleave = (cfg.rotary.dim, cfg.rotary.interleave) if cfg.rotary else (None, False)
        # Gemma 3, Qwen3: each query and key head is normalised before its rotary positions (Llama 4: without a
        # learned scale, and on the rotated layers only)
        # OLMo-2 (qk_norm_span='projection'): one norm over the whole q projection, another over the whole k
        # StableLM (qk_norm_span='each_head'): each head normed alone, with its own scale
        span = cfg.query_key_norm.span if cfg.query_key_norm is not None else None
        if span in ("projection", "each_head"):
            headed = ProjectionNorm if span == "projection" else EachHeadNorm
            self.q_norm, self.k_norm = headed(cfg, N, "heads", rngs=rngs), headed(cfg, K, "kv_heads", rngs=rngs)
        else:
            qk_norm = lambda: Norm(cfg, rngs=rngs, width=H, axis="head_dim",  # noqa: E731
                                   scaled=cfg.query_key_norm.scale)
            self.q_norm, self.k_norm = (qk_norm(), qk_norm()) if cfg.query_key_norm is not None else (None, None)
            if not own_keys:
                self.k_norm = None
        # Gemma 4: each value head normed too, without a learned scale
        self.v_norm = (Norm(cfg, rngs=rngs, width=H, axis="head_dim", scaled=False)
                       if cfg.query_key_norm is not None and cfg.query_key_norm.values and own_keys else None)
        self.sinks = param(rngs, (N,), ("heads",), cfg) if cfg.scores.sinks else None

    def _project(self, x: Array, name: str, bias: nnx.Param | None, key: Array | None = None) -> Array:
        # N here is the kernel's head count: query heads for q, kv heads (K) for k and v
        y = project(self, name, x, "BTD,DNH->BTNH", self.dtype, key=key)
        return y if bias is None else y + bias[...].astype(self.dtype)

    @staticmethod
    def _normed(norm: Norm | None, x: Array, nope: Array | None) -> Array:
        """``norm(x)``, except on a layer without rotary positions (Llama 4's ``nope``: a Python bool where the
        layer is known, a traced flag in a scanned body whose layers differ)."""
        if norm is None:
            return x
        if nope is None or isinstance(nope, bool):
            return x if nope else norm(x)
        return jnp.where(nope, x, norm(x))

    def key_values(self, source: Array, key: Array | None = None, nope: Array | None = None) -> tuple[Array, Array]:
        """Keys and values [B, S, K, H] of ``source`` (computed once per encoder output when cached).
        ``key`` drives LoRA dropout on the adapters' inputs."""
        keys = _lora_keys(key)
        k = checkpoint_name(self._project(source, "k", self.k_bias, keys[1]), "qkv")
        # Gemma 4's full layers: the values are the keys as projected, before the key norm and rotary
        v = k if self.keys_as_values else checkpoint_name(self._project(source, "v", self.v_bias, keys[2]), "qkv")
        return self._normed(self.k_norm, k, nope), v if self.v_norm is None else self.v_norm(v)

    def __call__(self, x: Array, kv_input: Array | None = None, *, mask: Array, bias: Array | None = None,
                 rope: tuple[Array, Array] | None = None, cache: dict | None = None,
                 kv: tuple[Array, Array] | None = None, key: Array | None = None,
                 output_attentions: bool = False, query_scale: Array | None = None, nope: Array | None = None,
                 shared_kv: tuple | None = None, return_kv: bool = False) -> tuple[Array, dict | None, Array | None]:
        """``shared_kv``: Gemma 4's kv-shared layers read an earlier layer's keys and values, normed and rotated:
        (k, v) [B, S, K, H] in a full pass, or head-major (cache slice, this call's) pairs in a cached step.
        ``return_kv``: return this call's keys and values [B, T, K, H] even without a cache (for such layers)."""
        q = checkpoint_name(self._project(x, "q", self.q_bias, _lora_keys(key)[0]), "qkv")
        q = self._normed(self.q_norm, q, nope)
        if query_scale is not None:  # a factor on the scores (per layer, or per token), on q alone: the cache keeps k
            q = q * query_scale.astype(q.dtype)
        if shared_kv is not None:
            q = q if rope is None else self._rotate(q, rope)
            (k, v), sinks = shared_kv, None if self.sinks is None else self.sinks[...]
            head_major = isinstance(k, tuple)
            if isinstance(mask, kernels.FusedMask):
                if (key is None or self.dropout_rate == 0.0) and not output_attentions and not head_major:
                    out = kernels.attend(q, k, v, mask, bias, self.scale, self.softcap, sinks)
                    return self._output(self._gated(out, x), key), None, None
                mask = mask.dense
            out, weights = _attend(q, k, v, mask, bias, self.scale, self.dropout_rate, key, self.softcap,
                                   output_attentions, head_major=head_major, sinks=sinks)
            return self._output(self._gated(out, x), key), None, weights
        k, v = kv if kv is not None else self.key_values(x if kv_input is None else kv_input, key, nope)
        paged_source = isinstance(k, PagedRows)  # (read in dot_product_attention, as a paged cache is)
        if paged_source and rope is not None:
            k, v = cached_slots(k, q), cached_slots(v, q)
        if rope is not None:
            q, k = self._rotate(q, rope), self._rotate(k, rope)
        new_kv = {"k": k, "v": v} if return_kv and cache is None else None
        if cache is not None:  # this call's keys and values head-major [B, K, T, H], as the cache holds them
            new_kv = {"k": k.astype(cache["k"].dtype).transpose(0, 2, 1, 3),
                      "v": v.astype(cache["v"].dtype).transpose(0, 2, 1, 3)}
            rows = cache["k"]
            if (isinstance(rows, PagedRows) and rows.kernel is not None and not output_attentions
                    and (q.shape[1] == 1 or rows.kernel in kernels.MANY_QUERY_KERNELS)
                    and (key is None or self.dropout_rate == 0.0)):
                # a fused paged kernel: this layer writes its tokens into its own pool, then attends over the pool
                k_rows, v_rows = rows.written(new_kv["k"]), cache["v"].written(new_kv["v"])
                out = kernels.paged_attention(q, k_rows, v_rows, self.scale, self.softcap,
                                              None if self.sinks is None else self.sinks[...])
                return (self._output(self._gated(out, x), key),
                        {"k": WrittenPool(k_rows.pool), "v": WrittenPool(v_rows.pool)}, None)
            k, v = (cache["k"], new_kv["k"]), (cache["v"], new_kv["v"])  # (a paged cache read where it attends)
        sinks = None if self.sinks is None else self.sinks[...]
        if isinstance(mask, kernels.FusedMask):  # full-sequence calls only: Stack gives none with a cache
            if (key is None or self.dropout_rate == 0.0) and not output_attentions:
                out = kernels.attend(q, k, v, mask, bias, self.scale, self.softcap, sinks)
                return self._output(self._gated(out, x), key), new_kv, None
            mask = mask.dense  # attention dropout and returned weights run on XLA
        out, weights = _attend(q, k, v, mask, bias, self.scale, self.dropout_rate, key, self.softcap, output_attentions,
                               head_major=cache is not None or paged_source, sinks=sinks)
        new_kv = new_kv if cache is None else cache_written_after(cache, new_kv, out)
        return self._output(self._gated(out, x), key), new_kv, weights

    def _gated(self, out: Array, x: Array) -> Array:
        """Each head's output [B, T, N, H] times its gate sigmoid(x . w_gate) (``attention_gate``), in the compute
        dtype as transformers gates it."""
        if self.gate is None:
            return out
        return out * jax.nn.sigmoid(project(self, "gate", x, "BTD,DNH->BTNH", self.dtype)).astype(out.dtype)

    def _rotate(self, x: Array, rope: tuple[Array, Array]) -> Array:
        """Rotary positions on [B, T, N, H]: on the first ``rotary_dim`` numbers of each head, the rest passing
        through (GPT-NeoX, GPT-J). Adjacent pairs (GPT-J's layout, ``rope_interleave``) are read as the even
        then the odd coordinates, turning them into the half-split rotation; queries and keys share the
        order, so scores do not change (see LatentAttention._rotate)."""
        d = x.shape[-1] if self.rotary_dim is None else self.rotary_dim
        rotated, passed = x[..., :d], x[..., d:]
        if self.rope_interleave:
            rotated = jnp.concatenate([rotated[..., 0::2], rotated[..., 1::2]], axis=-1)
        rotated = apply_rope(rotated, *rope)
        return rotated if d == x.shape[-1] else jnp.concatenate([rotated, passed], axis=-1)

    def _output(self, out: Array, key: Array | None = None) -> Array:
        y = project(self, "o", out, "BTNH,NHD->BTD", self.dtype, key=_lora_keys(key)[3])
        if self.o_bias is not None:
            y = y + self.o_bias[...].astype(self.dtype)
        return y


class RelativeAttention(Attention):
    """Transformer-XL's attention (Dai et al. 2019), as XLNet's content stream runs it: keys and values
    come from the layer's memory followed by its input, and a score is

        (q_t + u) . k_s  +  (q_t + v) . W_R R(t - s)  [+ (q_t + b_seg) . e(same segment?)]

    times the scale. R are sinusoids of the query-key distance (``xl_distances``), projected per layer
    (``r`` [D, N, H]) and matched to keys by ``relative_shift``; u and v are global content and position
    biases [N, H], this layer's own or the stack's shared pair. XLNet's segment term (``relative_segments``)
    compares token types: memory tokens count as type 0. The position and segment terms enter the shared
    ``dot_product_attention`` as an additive bias, and u as a shift of the query.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        D, N, H = cfg.d_model, cfg.num_heads, cfg.head_dim_
        self.r = param(rngs, (D, N, H), ("embed", "heads", "head_dim"), cfg)
        if cfg.xl.shared_biases:
            self.content_bias = self.position_bias = None
        else:
            self.content_bias = param(rngs, (N, H), ("heads", "head_dim"), cfg)
            self.position_bias = param(rngs, (N, H), ("heads", "head_dim"), cfg)
        if cfg.xl.segments:
            self.segment_bias = param(rngs, (N, H), ("heads", "head_dim"), cfg)
            self.segment_embed = param(rngs, (2, N, H), ("segments", "heads", "head_dim"), cfg)
        else:
            self.segment_bias = self.segment_embed = None

    def __call__(self, x: Array, *, mask: Array, relative, memory: dict | None = None,
                 key: Array | None = None, output_attentions: bool = False) -> tuple[Array, dict, Array | None]:
        """x [B, T, D] after this layer's ``memory`` (none, its hidden states {"hidden": [B, M, D]} or their
        keys and values {"k", "v": [B, M, K, H]}); ``mask`` [B, 1, T, M + T]; ``relative`` the stack's
        ``XLInputs``. Returns the output, this call's own keys and values (what a ``MemoryKV`` keeps) and the
        attention probabilities over [memory + own tokens] when ``output_attentions``."""
        q = checkpoint_name(self._project(x, "q", self.q_bias, _lora_keys(key)[0]), "qkv")
        own_k, own_v = self.key_values(x, key)
        if memory is None:
            k, v = own_k, own_v
        else:
            past_k, past_v = (self.key_values(memory["hidden"].astype(x.dtype), key) if "hidden" in memory
                              else (memory["k"].astype(own_k.dtype), memory["v"].astype(own_v.dtype)))
            k, v = jnp.concatenate([past_k, own_k], axis=1), jnp.concatenate([past_v, own_v], axis=1)
        u, pos_bias = relative.biases if self.content_bias is None else (self.content_bias, self.position_bias)
        as_q = lambda b: b[...].astype(q.dtype)  # noqa: E731
        r = jnp.einsum("PD,DNH->PNH", relative.encodings.astype(self.dtype), self.r[...].astype(self.dtype))
        scores = jnp.einsum("BTNH,PNH->BNTP", q + as_q(pos_bias), r, preferred_element_type=jnp.float32)
        bias = relative_shift(scores, k.shape[1])
        if relative.other_segment is not None:
            per_kind = jnp.einsum("BTNH,GNH->BNTG", q + as_q(self.segment_bias), self.segment_embed[...].astype(q.dtype),
                                  preferred_element_type=jnp.float32)
            bias = bias + jnp.where(relative.other_segment[:, None], per_kind[..., 1:], per_kind[..., :1])
        out, weights = _attend(q + as_q(u), k, v, mask, bias * self.scale, self.scale, self.dropout_rate, key, None,
                               output_attentions)
        return self._output(out, key), {"k": own_k, "v": own_v}, weights


@dataclasses.dataclass(frozen=True)
class DisentangledInputs:
    """What DeBERTa's attention reads besides its layer's input: the relative-position table [2 * span, D]
    (normed when the model norms it) and, per (query, key), the row it reads [T, T] (``disentangled_index``)."""

    embeddings: Array
    index: np.ndarray


class DisentangledAttention(Attention):
    """DeBERTa's disentangled attention (He et al. 2021): a score is

        q_t . k_s  +  q_t . Pk[d(t, s)]  (c2p)  +  k_s . Pq[d(t, s)]  (p2c),   times (H * (1 + terms)) ** -0.5

    where d(t, s) is the table row of the distance t - s (``DisentangledInputs.index``) and Pk, Pq the table
    projected by this layer's position key and query (``pos_k``, ``pos_q``), or by its own k and q when
    ``share_attention_key`` (v2/v3). Both terms enter the shared ``dot_product_attention`` as one additive bias:
    each is a [B, N, T, 2 * span] product gathered at the rows each (query, key) pair reads.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        D, N, H = cfg.d_model, cfg.num_heads, cfg.head_dim_
        self.terms, self.share = cfg.disentangled.terms, cfg.disentangled.share_key
        self.relative_dropout = cfg.dropout_rate
        own_k, own_q = not self.share and "c2p" in self.terms, not self.share and "p2c" in self.terms
        bias = lambda present: (param(rngs, (N, H), ("heads", "head_dim"), cfg, init="zeros")  # noqa: E731
                                if present else None)
        if own_k:
            projection(self, "pos_k", cfg, rngs, (D, N, H), ("embed", "heads", "head_dim"))
        if own_q:
            projection(self, "pos_q", cfg, rngs, (D, N, H), ("embed", "heads", "head_dim"))
        # v1's position key has no bias, as its key has none
        self.pos_k_bias = bias(own_k and cfg.biases.qkv and cfg.biases.key)
        self.pos_q_bias = bias(own_q and cfg.biases.qkv)

    def _positions(self, table: Array, name: str, key: Array | None) -> Array:
        """The table projected per head [P, N, H] by the position key or query ``name`` (or the shared k or q)."""
        if self.share:  # with the layer's own projection, LoRA adapters and bias included (as PEFT applies them)
            return self._project(table[None], name, getattr(self, f"{name}_bias"), key)[0]
        return self._project(table[None], f"pos_{name}", getattr(self, f"pos_{name}_bias"))[0]

    def __call__(self, x: Array, *, mask, relative: DisentangledInputs, key: Array | None = None,
                 output_attentions: bool = False) -> tuple[Array, None, Array | None]:
        keys = _lora_keys(key)
        q = checkpoint_name(self._project(x, "q", self.q_bias, keys[0]), "qkv")
        k, v = self.key_values(x, key)
        table = dropout(relative.embeddings.astype(self.dtype), self.relative_dropout,
                        None if key is None else jax.random.fold_in(key, 2000))
        index = jnp.asarray(relative.index)[None, None]  # [1, 1, T, S]
        bias = 0.0
        if "c2p" in self.terms:  # query t's content against the position of key s relative to it
            scores = jnp.einsum("BTNH,PNH->BNTP", q, self._positions(table, "k", keys[1]),
                                preferred_element_type=jnp.float32)
            bias = bias + jnp.take_along_axis(scores, index, axis=-1)
        if "p2c" in self.terms:  # key s's content against the same relative position, seen from the key
            scores = jnp.einsum("BSNH,PNH->BNSP", k, self._positions(table, "q", keys[0]),
                                preferred_element_type=jnp.float32)
            bias = bias + jnp.swapaxes(jnp.take_along_axis(scores, jnp.swapaxes(index, -1, -2), axis=-1), -1, -2)
        if isinstance(mask, kernels.FusedMask):  # the bias is per batch row and head: the XLA path takes it
            mask = mask.dense
        out, weights = _attend(q, k, v, mask, bias * self.scale, self.scale, self.dropout_rate, key, None,
                               output_attentions)
        return self._output(out, key), None, weights


@dataclasses.dataclass(frozen=True)
class GlobalInputs:
    """Longformer's global tokens in one call: which tokens are global [B, T] (bool) and the keys a global token
    sees [B, 1, T, S] (every real key of its row, or of its document when rows are packed)."""

    tokens: Array
    visible: Array


class GlobalAttention(Attention):
    """Longformer's attention (Beltagy et al. 2020): a token attends to the keys its layer's pattern shows it (the
    window of w either side) and to every global token, by the layer's q, k and v; a global token attends to
    every key by its own projections (``q_global``, ``k_global``, ``v_global``) in a softmax of its own, and that
    output replaces its windowed one. Written densely: both attentions run over the whole sequence under masks
    and each query keeps its own. transformers' banded form scores the same keys with the same products, so the
    numbers agree (to float rounding) at O(T^2) instead of O(T w) memory. Without global tokens in a call, the
    layer is plain windowed attention."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        D, N, K, H = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim_
        projection(self, "q_global", cfg, rngs, (D, N, H), ("embed", "heads", "head_dim"), role="attn")
        projection(self, "k_global", cfg, rngs, (D, K, H), ("embed", "kv_heads", "head_dim"), role="attn")
        projection(self, "v_global", cfg, rngs, (D, K, H), ("embed", "kv_heads", "head_dim"), role="attn")
        bias = lambda heads, axis: (param(rngs, (heads, H), (axis, "head_dim"), cfg, init="zeros")  # noqa: E731
                                    if cfg.biases.qkv else None)
        self.q_global_bias, self.v_global_bias = bias(N, "heads"), bias(K, "kv_heads")
        self.k_global_bias = bias(K, "kv_heads") if cfg.biases.key else None

    def __call__(self, x: Array, *, mask, global_tokens: GlobalInputs | None, key: Array | None = None,
                 output_attentions: bool = False) -> tuple[Array, None, Array | None]:
        keys = _lora_keys(key)
        q = checkpoint_name(self._project(x, "q", self.q_bias, keys[0]), "qkv")
        k, v = self.key_values(x, key)
        if isinstance(mask, kernels.FusedMask):
            mask = mask.dense
        if global_tokens is None:
            out, weights = _attend(q, k, v, mask, None, self.scale, self.dropout_rate, key, None, output_attentions)
            return self._output(out, key), None, weights
        is_global = global_tokens.tokens.astype(bool)
        # every token also sees the global tokens (those it may see at all: real, of its document)
        local_mask = mask | (global_tokens.visible & is_global[:, None, None, :])
        out, weights = _attend(q, k, v, local_mask, None, self.scale, self.dropout_rate, key, None, output_attentions)
        global_key = None if key is None else jax.random.fold_in(key, 3000)
        qg = self._project(x, "q_global", self.q_global_bias)
        kg, vg = self._project(x, "k_global", self.k_global_bias), self._project(x, "v_global", self.v_global_bias)
        g_out, g_weights = _attend(qg, kg, vg, global_tokens.visible, None, self.scale, self.dropout_rate, global_key,
                                   None, output_attentions)
        out = jnp.where(is_global[:, :, None, None], g_out.astype(out.dtype), out)
        if weights is not None:
            weights = jnp.where(is_global[:, None, :, None], g_weights, weights)
        return self._output(out, key), None, weights


def block_sparse_copies(length: int, block: int, random_blocks: int) -> Array:
    """How many times key s counts in query t's softmax under BigBird's block-sparse attention [T, T] (0: unseen),
    for an input of ``length`` tokens cut into blocks of ``block`` (the last one filled up with padding, as
    transformers pads the input to a multiple of the block). The first and last blocks see every key; every other
    block sees its own block and its neighbours, the first and last blocks, and ``random_blocks`` blocks that
    transformers draws as block 0 every time outside training (``_bigbird_block_rand_mask_with_head`` returns
    zeros in eval), so block 0's keys count 1 + random_blocks times there. Computed in the program from iotas, not
    held as a [T, T] constant."""
    blocks = -(-length // block)
    of = jnp.arange(length) // block
    q, k = of[:, None], of[None, :]
    global_query = (q == 0) | (q == blocks - 1)
    seen = global_query | (k == 0) | (k == blocks - 1) | (jnp.abs(q - k) <= 1)
    return seen.astype(jnp.int32) + jnp.where(~global_query & (k == 0), random_blocks, 0)


@dataclasses.dataclass(frozen=True)
class BlockSparseInputs:
    """BigBird's block-sparse layout for one call: how many times each key counts in each query's softmax
    [1, 1, T, T] (``block_sparse_copies``; 0: unseen) and which queries are real [B, T] (None: all)."""

    copies: Array
    valid: Array | None

    @classmethod
    def of(cls, length: int, block: int, random_blocks: int, valid: Array | None) -> BlockSparseInputs:
        return cls(block_sparse_copies(length, block, random_blocks)[None, None], valid)


class BlockSparseAttention(Attention):
    """BigBird's block-sparse attention (Zaheer et al. 2020) as transformers evaluates it: global, window and random
    blocks (``block_sparse_copies``), written as one dense masked softmax where a key that transformers' blocked
    form gathers several times carries the log of its count as a bias (the same sum of exponentials). A padded
    query's output is zero, as transformers multiplies it by the query mask, and no probability is dropped (its
    block-sparse form has no attention dropout). Inputs no longer than the dense threshold (``sparse`` None)
    attend densely, as transformers' 'original_full' fallback does. Returned probabilities are one copy's, as
    transformers scatters them into its [B, N, T, T] map."""

    def __call__(self, x: Array, *, mask, sparse: BlockSparseInputs | None, key: Array | None = None,
                 output_attentions: bool = False) -> tuple[Array, None, Array | None]:
        if sparse is None:
            return super().__call__(x, mask=mask, key=key, output_attentions=output_attentions)
        q = checkpoint_name(self._project(x, "q", self.q_bias, _lora_keys(key)[0]), "qkv")
        k, v = self.key_values(x, key)
        if isinstance(mask, kernels.FusedMask):
            mask = mask.dense
        copies = sparse.copies.astype(jnp.float32)
        # log(count) on the scores: one copy's exponential times its count, as the blocked softmax sums them
        bias = jnp.broadcast_to(jnp.log(jnp.maximum(copies, 1.0)), (1, q.shape[2], *copies.shape[2:]))
        out, weights = _attend(q, k, v, mask & (sparse.copies > 0), bias, self.scale, 0.0, None, None,
                               output_attentions)
        if sparse.valid is not None:
            out = out * sparse.valid[:, :, None, None].astype(out.dtype)
        if weights is not None:
            weights = weights / jnp.maximum(copies, 1.0)
        return self._output(out, key), None, weights


class IndexerParam(nnx.Param):
    """A weight of DeepSeek-V3.2's lightning indexer. Its choice of keys is discrete, so no gradient of the
    language-model loss reaches it (DeepSeek trains it apart, as transformers' forward runs it under
    no_grad); the optimizer leaves it unchanged (no weight decay either)."""


def index_scores(q: Array, weights: Array, keys: Array) -> Array:
    """A lightning indexer's scores [B, T, S], sum_h w_th relu(q_th . k_s / sqrt(Dh)) with w = weights /
    sqrt(H), in float32, of queries q [B, T, H, Dh], per-head weights [B, T, H] and keys [B, S, Dh]."""
    H, Dh = q.shape[-2:]
    weights = weights.astype(jnp.float32) * H ** -0.5
    return jnp.einsum("BTH,BTHS->BTS", weights, jax.nn.relu(jnp.einsum(
        "BTHK,BSK->BTHS", q.astype(jnp.float32), keys.astype(jnp.float32)) * Dh ** -0.5))


def top_k_visible(scores: Array, visible: Array, k: int) -> Array:
    """[B, T, S]: the ``visible`` keys among each query's top ``k`` ``scores`` [B, T, S] (all of them when at most
    k are visible). A discrete choice: no gradient flows through it."""
    scores = jax.lax.stop_gradient(jnp.where(visible, scores, -jnp.inf))
    _, best = jax.lax.top_k(scores, min(k, scores.shape[-1]))
    chosen = jnp.zeros(scores.shape, bool).at[
        jnp.arange(scores.shape[0])[:, None, None], jnp.arange(scores.shape[1])[None, :, None], best].set(True)
    return visible & chosen


class Indexer(nnx.Module):
    """DeepSeek-V3.2's lightning indexer: a cheap scorer of every (query, key) pair whose top ``index_topk``
    keys per query are the only ones latent attention attends to (DeepSeek sparse attention).

    A key is one normalized vector per token, LayerNorm(x wk) [index_head_dim]; a query is index_heads such
    vectors from the compressed query (q_norm(x q_down) wq); both rotate their first rope_head_dim numbers
    (half-split pairs, by the model's rotary tables). The score of key s for query t is
    sum_h w_th relu(q_th . k_s / sqrt(index_head_dim)), with per-head weights w = x wproj / sqrt(index_heads),
    all in float32. Mistral Large 4's: queries from LayerNorm(x) wq (``query_from_input``), each head's times
    s_h ln(p + 1) + b_h (``query_log_position_scale``); in a NoPE layer (``rope`` None) nothing rotates.
    """

    KEY_NORM_EPS = 1e-6  # transformers' LayerNorm default, whatever the model's eps

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, Cq, H, Dh = cfg.d_model, cfg.latent.q_rank, cfg.indexer.heads, cfg.indexer.head_dim
        self.dtype, self.rotated, self.topk = dtype_of(cfg.dtype), cfg.latent.rope_head_dim, cfg.indexer.topk
        self.rope_interleave = cfg.indexer.rope_interleave
        weight = lambda shape, axes, init="normal": IndexerParam(  # noqa: E731
            param(rngs, shape, axes, cfg, init=init).get_value(), axes=axes)
        # queries from the compressed query, or (``query_from_input``) from the layer's input through its own
        # LayerNorm (transformers' default eps, as the key's)
        self.query_from_input = cfg.indexer.query_from_input
        source = ((D, "embed") if self.query_from_input else (Cq, "latent"))
        self.wq = weight((source[0], H, Dh), (source[1], "index_heads", "index_head_dim"))
        self.wk = weight((D, Dh), ("embed", "index_head_dim"))
        self.k_norm_scale = weight((Dh,), ("index_head_dim",), "ones")
        self.k_norm_bias = weight((Dh,), ("index_head_dim",), "zeros")
        self.wproj = weight((D, H), ("embed", "index_heads"))
        self.q_norm_scale = weight((D,), ("embed",), "ones") if self.query_from_input else None
        self.q_norm_bias = weight((D,), ("embed",), "zeros") if self.query_from_input else None
        logs = cfg.latent.query_log_position_scale
        self.log_position_scale = weight((H,), ("index_heads",), "zeros") if logs else None
        self.log_position_bias = weight((H,), ("index_heads",), "ones") if logs else None

    def _rotate(self, x: Array, rope: tuple[Array, Array] | None) -> Array:
        """GLM-5's adjacent pairs (``rope_interleave``) as LatentAttention turns them into halves: even
        coordinates first, then odd; queries and keys share the order, so the scores do not change."""
        if rope is None:
            return x
        R = self.rotated
        rotary = x[..., :R]
        if self.rope_interleave:
            rotary = jnp.concatenate([rotary[..., 0::2], rotary[..., 1::2]], axis=-1)
        return jnp.concatenate([apply_rope(rotary, *rope), x[..., R:]], axis=-1)

    def keys(self, x: Array, rope: tuple[Array, Array]) -> Array:
        """[B, T, index_head_dim]: what a cache keeps per token."""
        k = jnp.einsum("BTD,DK->BTK", x, self.wk[...].astype(self.dtype))
        k = normalize(k.astype(jnp.float32), self.k_norm_scale[...].astype(jnp.float32),
                      self.k_norm_bias[...].astype(jnp.float32), "layernorm", self.KEY_NORM_EPS).astype(self.dtype)
        return self._rotate(k[:, :, None], rope)[:, :, 0]

    def select(self, x: Array, compressed_query: Array | None, rope: tuple[Array, Array] | None,
               keys: tuple[Array, ...], mask: tuple[Array, ...], positions: Array | None = None) -> tuple[Array, ...]:
        """``mask`` (one [B, 1, T, S_i] per key segment) narrowed to each query's top-k keys by score; a query
        with at most k visible keys keeps them all."""
        source = compressed_query
        if self.query_from_input:
            source = normalize(x.astype(jnp.float32), self.q_norm_scale[...].astype(jnp.float32),
                               self.q_norm_bias[...].astype(jnp.float32), "layernorm",
                               self.KEY_NORM_EPS).astype(self.dtype)
        q = jnp.einsum("BTC,CHK->BTHK", source, self.wq[...].astype(self.dtype))
        if self.log_position_scale is not None:
            q = q * log_position_factor(self.log_position_scale, self.log_position_bias, positions, q.dtype)
        q = self._rotate(q, rope)
        weights = jnp.einsum("BTD,DH->BTH", x, self.wproj[...].astype(self.dtype))
        scores = jnp.concatenate([index_scores(q, weights, k) for k in keys], axis=-1)
        narrowed = top_k_visible(scores, jnp.concatenate(mask, axis=-1)[:, 0], self.topk)[:, None]
        bounds = np.cumsum([m.shape[-1] for m in mask])[:-1]
        return tuple(jnp.split(narrowed, bounds, axis=-1))


def log_position_factor(scale: nnx.Param, bias: nnx.Param, positions: Array, dtype) -> Array:
    """Each head's query factor s_h ln(p + 1) + b_h at positions p [B, T]: [B, T, N, 1] (Mistral Large 4)."""
    log_positions = jnp.log(positions.astype(jnp.float32) + 1.0).astype(dtype)
    factor = scale[...].astype(dtype) * log_positions[:, :, None] + bias[...].astype(dtype)
    return factor[..., None]


class LatentAttention(nnx.Module):
    """Multi-head latent attention (DeepSeek-V2): keys and values come from one compressed latent per
    token, so a cache holds that latent (and one rotary key shared by the heads), not per-head keys.

    Parameters: the query, plain (q [D, N, Hq]) or low-rank (q_down [D, Cq], its RMSNorm, q_up
    [Cq, N, Hq]) with Hq = head_dim + rope_head_dim; kv_down [D, C + R] giving the latent and the rotary
    key; the latent's RMSNorm; k_up [C, N, head_dim] and v_up [C, N, Hv]; o [N, Hv, D].

    Two forms of the same attention, chosen by shape (static): a full pass or a prefill expands each
    latent into per-head keys and values; a decode step (one new token per row, over a cache) absorbs
    k_up into the query and v_up into the output instead, so it attends over the cached latents
    directly, as multi-query attention with one key of width C + R, and never expands the cache.

    Without its ``rotary`` part (Mistral Large 4's NoPE layers): kv_down [D, C], k_up [C, N, head_dim + R], no
    rotary key; the cache keeps such a layer's latent R zeros wider, so every layer's slot has one width.
    """

    # transformers builds the two latent norms with its RMSNorm default, not the model's eps (but Mistral Large 4)
    LATENT_NORM_EPS = 1e-6

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, rotary: bool = True):
        D, N, Hn, R, Hv = cfg.d_model, cfg.num_heads, cfg.head_dim_, cfg.latent.rope_head_dim, cfg.value_dim
        C, Cq = cfg.latent.kv_rank, cfg.latent.q_rank
        self.dtype, self.scale, self.dropout_rate = dtype_of(cfg.dtype), cfg.scale, cfg.attention_dropout_rate
        interleave = cfg.rotary is not None and cfg.rotary.interleave  # (no rotary: position='none')
        # a NoPE layer: the query's and key's rotary numbers join the part without positions
        self.rotary, self.rope_width, self.cache_pad = rotary, R if rotary else 0, 0 if rotary else R
        Hn, R = (Hn, R) if rotary else (Hn + R, 0)
        self.rope_interleave, self.latent_width, self.nope_head_dim = interleave, C, Hn
        self.norm_eps = cfg.latent.norm_eps or self.LATENT_NORM_EPS
        if Cq is None:
            projection(self, "q", cfg, rngs, (D, N, Hn + R), ("embed", "heads", "head_dim"), role="attn")
            self.q_down = self.q_norm = self.q_up = None
        else:
            self.q = None
            projection(self, "q_down", cfg, rngs, (D, Cq), ("embed", "latent"), role="attn")
            self.q_norm = param(rngs, (Cq,), ("latent",), cfg, init="ones")
            projection(self, "q_up", cfg, rngs, (Cq, N, Hn + R), ("latent", "heads", "head_dim"), role="attn")
        projection(self, "kv_down", cfg, rngs, (D, C + R), ("embed", "latent"), role="attn")
        self.kv_norm = param(rngs, (C,), ("latent",), cfg, init="ones")
        # read whole (absorbed into the query and output of a decode step): int8 but never LoRA targets
        projection(self, "k_up", cfg, rngs, (C, N, Hn), ("latent", "heads", "head_dim"), read_whole=True)
        projection(self, "v_up", cfg, rngs, (C, N, Hv), ("latent", "heads", "head_dim"), read_whole=True)
        projection(self, "o", cfg, rngs, (N, Hv, D), ("heads", "head_dim", "embed"), inputs=2, role="attn")
        self.o_bias = param(rngs, (D,), ("embed",), cfg, init="zeros") if cfg.biases.out else None
        self.indexer = Indexer(cfg, rngs=rngs) if cfg.indexer is not None else None
        logs = cfg.latent.query_log_position_scale
        self.log_position_scale = param(rngs, (N,), ("heads",), cfg, init="zeros") if logs else None
        self.log_position_bias = param(rngs, (N,), ("heads",), cfg, init="ones") if logs else None

    def _rms(self, x: Array, scale: nnx.Param) -> Array:
        y = normalize(x.astype(jnp.float32), scale[...].astype(jnp.float32), None, "rmsnorm", self.norm_eps)
        return y.astype(self.dtype)

    def _rotate(self, x: Array, rope: tuple[Array, Array]) -> Array:
        """Rotary positions on [B, T, N, R]. DeepSeek rotates adjacent pairs; taking the even then the
        odd coordinates turns that into the half-split rotation, and attention scores do not depend on
        the order of coordinates as long as queries and keys share it. Without rotary positions (None: Kimi
        Linear's MLA) the part passes as it is."""
        if rope is None:
            return x
        if self.rope_interleave:
            x = jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
        return apply_rope(x, *rope)

    def queries(self, x: Array, rope: tuple[Array, Array]) -> tuple[Array, Array, Array | None]:
        """(the part without positions [B, T, N, head_dim], the rotated part [B, T, N, R], the normalized
        compressed query [B, T, Cq] or None without a low-rank query)."""
        dt = self.dtype
        if self.q is not None:
            c, q = None, project(self, "q", x, "BTD,DNH->BTNH", dt)
        else:
            c = self._rms(project(self, "q_down", x, "BTD,DC->BTC", dt), self.q_norm)
            q = project(self, "q_up", c, "BTC,CNH->BTNH", dt)
        q = checkpoint_name(q, "qkv")
        nope = self.nope_head_dim
        return q[..., :nope], self._rotate(q[..., nope:], rope), c

    def latents(self, x: Array, rope: tuple[Array, Array]) -> Array:
        """What the cache holds per token [B, T, C + R]: the normalized latent, then the rotated key (a NoPE
        layer's: R zeros)."""
        kv = checkpoint_name(project(self, "kv_down", x, "BTD,DC->BTC", self.dtype), "qkv")
        C = self.latent_width
        rope_key = self._rotate(kv[:, :, None, C:], rope)[:, :, 0]
        pad = jnp.zeros((*kv.shape[:2], self.cache_pad), self.dtype)
        return jnp.concatenate([self._rms(kv[..., :C], self.kv_norm), rope_key, pad], axis=-1)

    def expand(self, latents: Array) -> tuple[Array, Array]:
        """Per-head keys [B, S, N, head_dim + R] and values [B, S, N, Hv] of latents [B, S, C + R]."""
        dt, C = self.dtype, self.latent_width
        latent = latents[..., :C].astype(dt)
        k_nope = project(self, "k_up", latent, "BSC,CNH->BSNH", dt)
        v = project(self, "v_up", latent, "BSC,CNH->BSNH", dt)
        R = self.rope_width
        rope_key = jnp.broadcast_to(latents[:, :, None, C:C + R].astype(dt), (*k_nope.shape[:3], R))
        return jnp.concatenate([k_nope, rope_key], axis=-1), v

    def __call__(self, x: Array, kv_input: Array | None = None, *, mask, bias: Array | None = None,
                 rope: tuple[Array, Array] | None = None, cache: dict | None = None, kv=None,
                 key: Array | None = None, output_attentions: bool = False, query_scale: Array | None = None,
                 positions: Array | None = None, nope=None) -> tuple[Array, dict | None, Array | None]:
        """As ``Attention.__call__`` (self-attention only); ``cache`` is {"latent": [B, S, C + R]} and the
        new tokens' latents come back as {"latent": [B, T, C + R]}. ``query_scale`` multiplies the queries
        (both parts, after rotation), as a factor on the scores; so does each head's learned factor of the
        ``positions`` [B, T] (``log_position_scale``). (``nope``: the stack's NoPE flag; a layer without its
        rotary part is built so, and reads no rotary angles.)"""
        if kv_input is not None or kv is not None or bias is not None:
            raise ValueError("multi-head latent attention is self-attention without a position bias")
        if isinstance(mask, kernels.FusedMask):  # the fused kernels take one head size for q, k and v
            mask = mask.dense
        dt = self.dtype
        rope = rope if self.rotary else None
        q_nope, q_rope, compressed = self.queries(x, rope)
        if query_scale is not None:
            q_nope, q_rope = (q * query_scale.astype(q.dtype) for q in (q_nope, q_rope))
        if self.log_position_scale is not None:
            factor = log_position_factor(self.log_position_scale, self.log_position_bias, positions, q_nope.dtype)
            q_nope, q_rope = q_nope * factor, q_rope * factor.astype(q_rope.dtype)
        new = self.latents(x, rope)
        if cache is None:
            segments, written = (new,), None
        else:  # mask is then a (cache slots, new tokens) pair, as the segments
            written = {"latent": new.astype(cache["latent"].dtype)}
            segments = (cache["latent"], written["latent"])
        if self.indexer is not None:
            index_keys = self.indexer.keys(x, rope)
            if cache is not None:
                written["index_keys"] = index_keys.astype(cache["index_keys"].dtype)
            masks = (mask,) if cache is None else mask
            if sum(m.shape[-1] for m in masks) > self.indexer.topk:  # else every visible key is among the top k
                keys = (index_keys,) if cache is None else (cache["index_keys"], written["index_keys"])
                if isinstance(keys[0], PagedRows):  # (a paged pool's: every slot's key scored, gathered whole)
                    keys = (keys[0].slots(keys[1][:, :, None])[:, 0], keys[1])
                masks = self.indexer.select(x, compressed, rope, keys, masks, positions)
                mask = masks[0] if cache is None else masks
        # (a paged cache, the serving engine's, holds every row's latents in blocks: read as they lie, in the
        # absorbed form whatever the step's width)
        paged = cache is not None and isinstance(cache["latent"], PagedRows)
        if cache is not None and (x.shape[1] == 1 or paged):
            # Absorbed: q_nope k_up^T scores the latent directly, and v_up is applied after the weighted sum.
            q_latent = jnp.einsum("BTNH,CNH->BTNC", q_nope, kernel(self, "k_up", dt))
            query = jnp.concatenate([q_latent, q_rope.astype(dt)], axis=-1)
            width = self.latent_width + self.rope_width  # (a NoPE layer's cache slots: R zeros past it)
            if paged:  # the pool's slots whole (one kv head, C + R wide): a NoPE layer's query scores its zeros by 0
                query = jnp.pad(query, ((0, 0),) * 3 + ((0, self.cache_pad),))
                keys = (cache["latent"], written["latent"][:, :, None, :].astype(dt))
            else:
                keys = tuple(segment[:, :, None, :width].astype(dt) for segment in segments)  # one kv head: MQA
            mixed, weights = _attend(query, keys, keys, mask, None, self.scale, self.dropout_rate, key, None,
                                     output_attentions)
            out = jnp.einsum("BTNC,CNH->BTNH", mixed[..., :self.latent_width], kernel(self, "v_up", dt))
        else:
            expanded = [self.expand(segment) for segment in segments]
            keys, values = tuple(k for k, _ in expanded), tuple(v for _, v in expanded)
            if cache is None:
                keys, values = keys[0], values[0]
            query = jnp.concatenate([q_nope, q_rope.astype(dt)], axis=-1)
            out, weights = _attend(query, keys, values, mask, None, self.scale, self.dropout_rate, key, None,
                                   output_attentions)
        y = project(self, "o", out, "BTNH,NHD->BTD", dt)
        if self.o_bias is not None:
            y = y + self.o_bias[...].astype(dt)
        return y, written if cache is None else cache_written_after(cache, written, y), weights
