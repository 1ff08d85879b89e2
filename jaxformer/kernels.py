"""Fused attention kernels behind one switch, ``ModelConfig.attention_backend``:

- ``xla``: jaxformer's own einsum attention (``layers.dot_product_attention``), the reference. It takes
  every mask, KV caches, attention dropout and additive biases, on every platform.
- ``cudnn``: cuDNN's flash attention through ``jax.nn.dot_product_attention(implementation="cudnn")`` on
  NVIDIA GPUs. Causal and sliding masks are passed as flags, so the kernel skips masked tiles; T5's
  relative position bias and key padding go in as an additive bias.
- ``splash``: the Pallas splash-attention kernel on TPU. Causal and sliding masks are static block
  masks, so masked tiles are skipped; padding and packed documents become segment ids. It cannot take an
  additive bias, so T5's biased self-attention stays on XLA (its cross-attention, which has no bias, runs
  fused).
  On other platforms the kernel runs in Pallas's interpreter, for tests only.
- ``auto`` (the default): cudnn on NVIDIA GPUs and splash on TPUs wherever a call qualifies, xla
  otherwise (see ``fused_backend``).

Under a mesh whose ``sequence`` axis splits the tokens (context parallelism), ``auto`` and ``xla`` calls
run ``ring_attention`` instead: each device keeps its queries and passes keys and values around the ring.
Packed documents ride the ring too: each key block travels with its segment ids.

A fused kernel serves full-sequence calls: training, evaluation, a forward pass. Calls with a KV cache
(generation), attention dropout, prefix-LM masks, GPT-3's alternating layers and user-given
``position_ids`` (where visibility follows positions, not token order) run on XLA. ``FusedMask``
carries the structure a kernel needs next to the dense mask, so any call can still fall back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.layer_plan import layer_plan
from jaxformer.model_config import ModelConfig

Array = jax.Array

FUSED_PATTERNS = ("bidirectional", "causal", "sliding")


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["dense", "key_valid", "query_valid", "query_segments", "key_segments"],
                   meta_fields=["backend", "pattern", "window"])
@dataclasses.dataclass(frozen=True)
class FusedMask:
    """Who may attend to whom, in the structured form fused kernels take, and the dense [B, 1, T, S]
    boolean mask XLA takes (for a fallback; unused arrays are pruned by the compiler)."""

    dense: Array
    key_valid: Array | None  # [B, S] real keys, or None for no padding
    query_valid: Array | None  # [B, T] real queries (self-attention), or None
    backend: str  # cudnn | splash | ring
    pattern: str  # bidirectional | causal | sliding, by token index
    window: int | None = None  # sliding: keys in (t - window, t]
    # packed documents: each query's [B, T] and key's [B, S] document (None: one a row); 0 on padding
    query_segments: Array | None = None
    key_segments: Array | None = None


def platform() -> str:
    """'gpu' for NVIDIA GPUs (CUDA), 'tpu', 'cpu', or the name of another backend."""
    return jax.default_backend()


def fused_backend(cfg: ModelConfig, pattern: str, T: int, S: int, *, has_bias: bool = False) -> str:
    """The fused kernel a full-sequence attention call of ``cfg`` (T queries, S keys) uses, or 'xla'.

    An explicit ``attention_backend`` that cannot serve the model at all (a kernel for another
    platform, a dtype or head size it refuses) is a ValueError naming both; a call outside a kernel's
    reach (a mask pattern, bias or length it cannot take) runs on XLA, as the module doc says.
    """
    requested = cfg.execution.attention_backend
    if requested in ("auto", "xla") and ring_fits(pattern, T, S, has_bias):
        return "ring"
    if requested == "xla" or pattern not in FUSED_PATTERNS or cfg.scores.softcap is not None or cfg.scores.sinks:
        return "xla"  # (Gemma 2's soft-capped scores, gpt-oss's sinks: neither kernel is wired for them)
    here = platform()
    # cuDNN's biased backward kernel needs even lengths; splash tiles need lengths it can block.
    cudnn_fits = not (has_bias and (T % 2 or S % 2))
    splash_fits = not has_bias and splash_refuses(T, S) is None
    if requested == "auto":
        if here == "gpu" and not cudnn_refuses(cfg) and cudnn_fits:
            return "cudnn"
        if here == "tpu" and splash_fits:
            return "splash"
        return "xla"
    if requested == "cudnn":
        if here != "gpu":
            raise ValueError(f"ModelConfig.attention_backend='cudnn' needs an NVIDIA GPU; this process runs on "
                             f"{here!r}. Use 'auto' or 'xla'.")
        reason = cudnn_refuses(cfg)
        if reason:
            raise ValueError(f"ModelConfig.attention_backend='cudnn' cannot serve {cfg.name!r}: {reason}. "
                             "Use 'auto' (falls back to XLA) or 'xla'.")
        return "cudnn" if cudnn_fits else "xla"
    # splash: on a TPU, or interpreted elsewhere (slow; for tests).
    return "splash" if splash_fits else "xla"


def cudnn_refuses(cfg: ModelConfig) -> str | None:
    """Why cuDNN's flash attention cannot take this model's attention, or None. These are the limits
    ``jax.nn.dot_product_attention`` documents and checks: float16/bfloat16 operands, a head size that is
    a multiple of 8 and at most 128 (256 from Hopper on)."""
    if cfg.dtype not in ("bfloat16", "float16"):
        return f"cuDNN attention needs dtype bfloat16 or float16, not {cfg.dtype!r}"
    head_limit = 128
    device = jax.devices()[0]
    if getattr(device, "compute_capability", None) and float(device.compute_capability) >= 9.0:
        head_limit = 256
    if cfg.head_dim_ % 8 or cfg.head_dim_ > head_limit:
        return f"head_dim={cfg.head_dim_} must be a multiple of 8 and at most {head_limit}"
    return None


def fused_mask(cfg: ModelConfig, dense: Array, pattern: str, *, key_valid: Array | None = None,
               query_valid: Array | None = None, has_bias: bool = False,
               segments: tuple[Array, Array] | None = None) -> Array | FusedMask:
    """``dense`` as a FusedMask when ``cfg``'s backend would run this call fused, else ``dense`` itself.
    ``segments``: the queries' and keys' documents when documents are packed (``dense`` already holds them)."""
    backend = fused_backend(cfg, pattern, dense.shape[-2], dense.shape[-1], has_bias=has_bias)
    if backend == "xla":
        return dense
    window = cfg.window_size if pattern == "sliding" else None
    query_segments, key_segments = (None, None) if segments is None else segments
    return FusedMask(dense, key_valid, query_valid, backend, pattern, window, query_segments, key_segments)


# The implementation ``jax.nn.dot_product_attention`` is asked for on the cudnn path. Tests set it to
# "xla", which runs the same call (flags, padding, bias, GQA) through jax's reference implementation.
CUDNN_IMPLEMENTATION = "cudnn"


def attend(q: Array, k: Array, v: Array, mask: FusedMask, bias: Array | None, scale: float,
           softcap: float | None = None, sinks: Array | None = None) -> Array:
    """Attention [B, T, N, H] of q [B, T, N, H] over k, v [B, S, K, H] by ``mask.backend`` (soft caps and sinks:
    the ring only; ``fused_backend`` gives the other kernels no call that has them)."""
    if mask.backend == "ring":
        return ring_attention(q, k, v, mask, scale, softcap, sinks)
    if mask.backend == "cudnn":
        return _cudnn(q, k, v, mask, bias, scale, CUDNN_IMPLEMENTATION)
    return _splash(q, k, v, mask, scale, interpret=platform() != "tpu")


def _cudnn(q, k, v, mask: FusedMask, bias, scale, implementation):
    # cuDNN's own padding mask assumes right padding; a [B, 1, T, S] mask is exact for any layout (jax
    # turns it into an additive bias). The packed batches of the LM objectives have no padding; their
    # documents (segment ids) go in the same way, the dense mask holding who shares a document.
    dense = None if mask.key_valid is None and mask.key_segments is None else mask.dense
    window = (mask.window - 1, 0) if mask.pattern == "sliding" else None
    if bias is not None:
        bias = bias.astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, bias, dense, scale=scale, is_causal=mask.pattern != "bidirectional",
                                        local_window_size=window, implementation=implementation)


@functools.lru_cache(maxsize=64)
def _splash_kernel(pattern: str, window: int | None, T: int, S: int, heads: int, interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    if pattern == "bidirectional":
        one = masks.FullMask((T, S))
    elif pattern == "causal":
        one = masks.CausalMask((T, S))
    else:
        one = masks.LocalMask((T, S), window_size=(window - 1, 0), offset=0)
    block_q = block_kv = 128
    blocks = splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
                               block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
                               block_q_dq=block_q, block_kv_dq=block_kv)
    # One kernel per kv head over its group of query heads (the MQA form), vmapped over kv heads. Its
    # block tables are made concrete even when first asked for inside a trace, so the cache holds no tracers.
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mqa_single_device(masks.MultiHeadMask([one] * heads), block_sizes=blocks,
                                                    interpret=interpret)


def splash_refuses(T: int, S: int) -> str | None:
    """Splash tiles queries and keys in blocks of 128 (its backward pass needs whole blocks of both)."""
    for name, n in (("query", T), ("key", S)):
        if n % 128:
            return f"{name} length {n} is not a multiple of 128"
    return None


def _splash(q, k, v, mask: FusedMask, scale, interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash

    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    kernel = _splash_kernel(mask.pattern, mask.window, T, S, G, interpret)
    # The kernel takes no scale: fold it into q (in float32, then back to the compute dtype).
    q = (q.astype(jnp.float32) * scale).astype(q.dtype)
    q = q.reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4)  # B K G T H
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # B K S H
    if mask.key_valid is None and mask.key_segments is None:
        run = jax.vmap(jax.vmap(lambda q, k, v: kernel(q, k, v)))
        out = _sharded(run, q, k, v)
    else:
        q_segment, kv_segment = _splash_segments(mask, B, T)

        def one_row(q, k, v, q_segment, kv_segment):
            segments = splash.SegmentIds(q=q_segment, kv=kv_segment)
            return jax.vmap(lambda q, k, v: kernel(q, k, v, segment_ids=segments))(q, k, v)

        out = _sharded(jax.vmap(one_row), q, k, v, q_segment, kv_segment)
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H).astype(v.dtype)


def _splash_segments(mask: FusedMask, B: int, T: int) -> tuple[Array, Array]:
    """Padding and packed documents as splash's segment ids (a query sees only keys of its own segment).
    Without documents: real tokens are segment 0, pads segment 1, so real queries see exactly the real
    keys, whatever the padding layout. With documents: each real token is its document's id (> 0), every
    pad is 0."""
    if mask.key_segments is None:
        kv_segment = 1 - mask.key_valid.astype(jnp.int32)
        q_segment = (jnp.zeros((B, T), jnp.int32) if mask.query_valid is None
                     else 1 - mask.query_valid.astype(jnp.int32))
        return q_segment, kv_segment

    def documents(segments, valid):
        segments = segments.astype(jnp.int32)
        return segments if valid is None else jnp.where(valid.astype(bool), segments, 0)

    return documents(mask.query_segments, mask.query_valid), documents(mask.key_segments, mask.key_valid)


def _sharded(run, q, k, v, *segments):
    """Pallas kernels are opaque to the SPMD partitioner: under a mesh, run each device's rows and heads
    with shard_map (batch over data x fsdp, kv heads over tensor), as the kernels expect."""
    from jaxformer.sharding import BATCH_AXES

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
        return run(q, k, v, *segments)
    _check_rows(q.shape[0], mesh, "a fused attention kernel")
    P = jax.sharding.PartitionSpec
    tensor = dict(mesh.shape).get("tensor", 1)
    heads = "tensor" if tensor > 1 and q.shape[1] % tensor == 0 else None
    qkv = P(BATCH_AXES, heads)
    return jax.shard_map(run, mesh=mesh, in_specs=(qkv, qkv, qkv, *([P(BATCH_AXES)] * len(segments))),
                         out_specs=qkv, check_vma=False)(q, k, v, *segments)


def _check_rows(rows: int, mesh, runner: str) -> None:
    """shard_map splits the rows over data x fsdp x expert whole: a batch they do not divide fails here with
    train.py's words (``sharding.check_batch``), not inside shard_map's tracing."""
    from jaxformer.sharding import check_batch, data_parallel_size

    try:
        check_batch(rows, mesh)
    except ValueError as err:
        raise ValueError(f"{err}: {runner} splits the rows over those axes; give a multiple of "
                         f"{data_parallel_size(mesh)} rows") from None


# --------------------------------------------------------------------------------------------------
# Context parallelism: ring attention over the mesh's ``sequence`` axis


def ring_fits(pattern: str, T: int, S: int, has_bias: bool) -> bool:
    """Whether a full-sequence self-attention call runs as ring attention: the mesh in context splits the
    tokens (``sequence`` > 1) into halves of whole tokens, and the call has no additive bias (T5's, DeBERTa's:
    those run on XLA, whose partitioner gathers the keys instead). Not under a ``stage`` axis: traced inside
    the pipeline's vmap over stages, the ring's shard_map gave wrong outputs (max 0.6 off on tiny-llama), so
    attention there runs on XLA, partitioned along ``sequence``."""
    from jaxformer.sharding import axis_size, sequence_parallel_size

    n = sequence_parallel_size()
    return (n > 1 and axis_size("stage") == 1 and pattern in FUSED_PATTERNS and not has_bias and T == S
            and T % (2 * n) == 0)


def _zigzag(x: Array, n: int, inverse: bool = False) -> Array:
    """Inside shard_map: this device's tokens [B, L, ...] (a contiguous 1/n of the sequence, two chunks of L/2)
    exchanged so that device d holds chunks d and 2n-1-d (``inverse``: back). A causal mask then leaves every
    device the same work: a late chunk beside an early one."""
    def contiguous(c):
        return c // 2, c % 2

    def zigzag(c):
        return (c, 0) if c < n else (2 * n - 1 - c, 1)

    source, target = (zigzag, contiguous) if inverse else (contiguous, zigzag)
    halves = jnp.split(x, 2, axis=1)
    out = [jnp.zeros_like(halves[0]), jnp.zeros_like(halves[0])]
    for h in (0, 1):  # each (from half, to half) pair is one partial permutation; a device receives one chunk a half
        for g in (0, 1):
            pairs = [(source(c)[0], target(c)[0]) for c in range(2 * n) if source(c)[1] == h and target(c)[1] == g]
            if pairs:
                out[g] = out[g] + jax.lax.ppermute(halves[h], "sequence", pairs)
    return jnp.concatenate(out, axis=1)


def _ring_fold(state, qh, q_start, q_ids, kh, vh, valid_h, k_ids, k_start, *, mask: FusedMask, scale: float,
               softcap: float | None, packed: bool, groups: int):
    """Ring attention's one (query half, key half) block folded into the running softmax (maximum, sum, weighted
    values; float32): queries [b, K, G*half, H] with rows g*half + t, keys and values [b, K, half, H]."""
    m, l, acc = state
    half = kh.shape[2]
    s = jnp.einsum("BKMH,BKSH->BKMS", qh, kh, preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        s = jnp.tanh(s / softcap) * softcap
    qi = q_start + jnp.arange(half)
    ki = k_start + jnp.arange(half)
    allowed = jnp.ones((half, half), bool)
    if mask.pattern != "bidirectional":
        allowed = ki[None, :] <= qi[:, None]
    if mask.pattern == "sliding":
        allowed &= ki[None, :] > qi[:, None] - mask.window
    allowed = jnp.tile(allowed, (groups, 1))[None, None] & valid_h[:, None, None, :]
    if packed:
        allowed &= (q_ids[:, :, None] == k_ids[:, None, :])[:, None]
    s = jnp.where(allowed, s, jnp.finfo(jnp.float32).min)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.exp(s - m_new[..., None])
    correction = jnp.exp(m - m_new)
    l = l * correction + jnp.sum(p, axis=-1)
    acc = acc * correction[..., None] + jnp.einsum("BKMS,BKSH->BKMH", p.astype(vh.dtype), vh,
                                                   preferred_element_type=jnp.float32)
    return m_new, l, acc


def _ring_output(state, sinks: Array | None, groups: int) -> Array:
    """A query half's attention output [b, half, K*G, Hv] from its running softmax [b, K, G*half, ...]."""
    m, l, acc = state
    b, k_local, rows = m.shape
    half = rows // groups
    if sinks is not None:  # gpt-oss: each head's sink logit joins the denominator
        sink = jnp.broadcast_to(sinks.astype(jnp.float32).reshape(1, k_local, groups, 1),
                                (b, k_local, groups, half)).reshape(b, k_local, rows)
        m_new = jnp.maximum(m, sink)
        correction = jnp.exp(m - m_new)
        l, acc = l * correction + jnp.exp(sink - m_new), acc * correction[..., None]
    out = acc / l[..., None]
    return out.reshape(b, k_local, groups, half, -1).transpose(0, 3, 1, 2, 4).reshape(b, half, k_local * groups, -1)


def ring_attention(q: Array, k: Array, v: Array, mask: FusedMask, scale: float, softcap: float | None = None,
                   sinks: Array | None = None) -> Array:
    """Self-attention with the tokens split over the mesh's ``sequence`` axis (context parallelism): each
    device keeps its queries and passes its keys, values and their validity around the ring with ``ppermute``
    (n - 1 hops), folding each block into a running softmax (maximum, sum, weighted values; float32). No
    [T, S] mask or score array exists anywhere: a block's scores live while it is folded, and the backward
    pass runs the ring again and recomputes them (a layer keeps only q, k, v and validity; O(T)).

    Causal and sliding masks are balanced: the tokens are first exchanged so that device d holds chunks d and
    2n-1-d of 2n (``_zigzag``), and a (query half, key half) block that its pattern masks whole is skipped
    (``lax.cond``), so every device computes two of its four blocks per hop, the diagonal aside. Visibility
    follows token indices, as the fused kernels' does; padding masks keys; packed documents travel with their
    keys (each block's segment ids), a query folding in only its own document's. Rows of the batch over data x
    fsdp and kv heads over tensor, as the other kernels split them. Gradients flow through the ring (the
    transpose of a ppermute is the reverse hop). Equal to XLA's attention, except for a query that may see
    no key at all (a pad before a left-padded row's first token), whose output no real token ever reads."""
    from jaxformer.sharding import BATCH_AXES

    mesh = jax.sharding.get_abstract_mesh()
    n = dict(mesh.shape)["sequence"]
    tensor = dict(mesh.shape).get("tensor", 1)
    B, T, N, H = q.shape
    _check_rows(B, mesh, f"ring attention (mesh.sequence={n})")
    K = k.shape[2]
    heads = "tensor" if tensor > 1 and K % tensor == 0 else None
    balanced = mask.pattern != "bidirectional"
    window = mask.window
    P = jax.sharding.PartitionSpec
    tokens = P(BATCH_AXES, "sequence", heads)
    key_valid = jnp.ones((B, T), bool) if mask.key_valid is None else mask.key_valid.astype(bool)
    packed = mask.key_segments is not None
    # (without documents every token is document 0 and the comparison below is left out when tracing)
    key_ids, query_ids = ((mask.key_segments.astype(jnp.int32), mask.query_segments.astype(jnp.int32)) if packed
                          else (jnp.zeros((B, T), jnp.int32),) * 2)

    def local(q, k, v, key_valid, key_ids, query_ids, sinks):
        d = jax.lax.axis_index("sequence")
        L = q.shape[1]
        half = L // 2
        b, _, n_local, _ = q.shape
        k_local = k.shape[2]
        G = n_local // k_local
        if balanced:
            q, k, v = (_zigzag(a, n) for a in (q, k, v))
            key_valid = _zigzag(key_valid.astype(jnp.int32), n) > 0
            key_ids, query_ids = _zigzag(key_ids, n), _zigzag(query_ids, n)
        # each query half's documents [b, G*half], its rows laid out as the queries' below (g*half + t)
        q_segments = [jnp.tile(ids, (1, G)) for ids in jnp.split(query_ids, 2, axis=1)]

        def chunk_starts(device):  # the first token index of each of a device's two chunks
            if balanced:
                return device * half, (2 * n - 1 - device) * half
            return device * L, device * L + half

        # [b, K, G*half, H] per query half: row g*half + t is query t of head k*G + g
        q_halves = [a.reshape(b, half, k_local, G, H).transpose(0, 2, 3, 1, 4).reshape(b, k_local, G * half, H)
                    for a in jnp.split(q, 2, axis=1)]
        q_starts = chunk_starts(d)
        carry = [(jnp.full((b, k_local, G * half), jnp.finfo(jnp.float32).min, jnp.float32),
                  jnp.zeros((b, k_local, G * half), jnp.float32),
                  jnp.zeros((b, k_local, G * half, v.shape[-1]), jnp.float32)) for _ in range(2)]

        def visible_somewhere(q_start, k_start):
            """Does any (query, key) pair of these two chunks pass the pattern (padding aside)?"""
            if mask.pattern == "bidirectional":
                return jnp.bool_(True)
            seen = k_start <= q_start + half - 1
            if mask.pattern == "sliding":
                seen &= k_start + half - 1 > q_start - window
            return seen

        block = dict(mask=mask, scale=scale, softcap=softcap, packed=packed, groups=G)

        def fold_hop(states, kv, hop):
            """Every (query half, key half) block of this hop folded in; a block its pattern masks whole is skipped."""
            k_now, v_now, valid_now, ids_now = kv
            k_starts = chunk_starts((d - hop) % n)  # this hop's keys are device d - hop's
            k_halves = [a.transpose(0, 2, 1, 3) for a in jnp.split(k_now, 2, axis=1)]  # [b, K, half, H]
            v_halves = [a.transpose(0, 2, 1, 3) for a in jnp.split(v_now, 2, axis=1)]
            valid_halves, id_halves = jnp.split(valid_now, 2, axis=1), jnp.split(ids_now, 2, axis=1)
            states = list(states)
            for i in (0, 1):
                for j in (0, 1):
                    args = (q_halves[i], q_starts[i], q_segments[i], k_halves[j], v_halves[j], valid_halves[j],
                            id_halves[j], k_starts[j])
                    states[i] = jax.lax.cond(visible_somewhere(q_starts[i], k_starts[j]),
                                             lambda state, *a: _ring_fold(state, *a, **block), lambda state, *a: state,
                                             states[i], *args)
            return tuple(states)

        # The backward pass recomputes each hop's scores from its queries and keys instead of keeping them: a
        # device then holds O(T) numbers for attention (the keys and running sums of every hop), never a
        # [T / n, T] score array.
        @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable)
        def hop_then_pass(state, hop):  # a scan over hops: one hop's buffers live at a time
            states, kv = state
            states = fold_hop(states, kv, hop)
            return (states, jax.lax.ppermute(kv, "sequence", [(e, (e + 1) % n) for e in range(n)])), None

        (states, kv), _ = jax.lax.scan(hop_then_pass, (tuple(carry), (k, v, key_valid, key_ids)), jnp.arange(n - 1))
        last_hop = jax.checkpoint(fold_hop, policy=jax.checkpoint_policies.nothing_saveable, static_argnums=(2,))
        carry = last_hop(states, kv, n - 1)  # the last hop passes nothing on
        outs = [_ring_output(state, sinks, G) for state in carry]
        out = jnp.concatenate(outs, axis=1).astype(v.dtype)
        return _zigzag(out, n, inverse=True) if balanced else out

    sink_spec = P(heads) if sinks is not None else P()
    sinks_in = sinks if sinks is not None else jnp.zeros(())

    def ring(q, k, v, valid, key_ids, query_ids, s):
        return local(q, k, v, valid, key_ids, query_ids, s if sinks is not None else None)

    # Rematerialised whole: the layer scan's backward keeps only q, k, v, validity and documents (checkpointing
    # the hops alone left one score block per hop saved across the layer scan, measured: 2x shorter longest
    # sequences).
    run = jax.checkpoint(ring, policy=jax.checkpoint_policies.nothing_saveable)
    rows = P(BATCH_AXES, "sequence")
    return jax.shard_map(run, mesh=mesh, in_specs=(tokens, tokens, tokens, rows, rows, rows, sink_spec),
                         out_specs=tokens, check_vma=False)(q, k, v, key_valid, key_ids, query_ids, sinks_in)


# --------------------------------------------------------------------------------------------------
# Paged attention (the serving engine's steps)

# The fused paged attention each backend has (``paged_kernel``), each over a layer's pool [K, N, block, H]: on NVIDIA
# GPUs ``jax.experimental.pallas.ops.gpu.paged_attention`` (Triton), on TPUs ``ops.tpu.paged_attention`` (Mosaic; it
# reads keys and values in bfloat16), both one query a row; on CPUs ours in C++ through XLA's FFI
# (``jaxformer.native``, float32), any number of queries a row, so prompt chunks and drafts read by it too. XLA's
# own paged read (``attention._paged_part``) serves the rest. TPU's ragged paged attention (prompt chunks and
# one-token rows in one call) is not wired: docs/serving.md says why.
PAGED_KERNELS = {"gpu": "pallas-gpu", "tpu": "pallas-tpu", "cpu": "ffi-cpu"}
PAGED_CHOICES = ("auto", "xla", *PAGED_KERNELS.values())
MANY_QUERY_KERNELS = frozenset({"ffi-cpu"})  # kernels that read several queries a row (prompt chunks, drafts)


def paged_kernel(choice: str, cfg: ModelConfig) -> str | None:
    """The fused paged kernel a serving engine's steps read by for ``cfg`` (None: XLA's paged read).
    'auto': this backend's kernel where it serves the model (``paged_kernel_refuses``), else XLA; 'xla': XLA;
    a kernel's name: that kernel (a Pallas one off its platform in Pallas's interpreter: for tests), a ValueError
    where it cannot serve the model."""
    if choice not in PAGED_CHOICES:
        raise ValueError(f"paged attention {choice!r}: want one of {', '.join(PAGED_CHOICES)}")
    if choice == "xla":
        return None
    if choice == "auto":
        kernel = PAGED_KERNELS.get(platform())
        return None if kernel is None or paged_kernel_refuses(cfg, kernel) is not None else kernel
    problem = paged_kernel_refuses(cfg, choice)
    if problem is not None:
        raise ValueError(f"paged attention {choice!r} cannot serve this model: {problem}")
    return choice


def paged_kernel_refuses(cfg: ModelConfig, kernel: str) -> str | None:
    """Why ``kernel`` cannot serve ``cfg``'s steps (None: it can). The kernel attends each row's queries to its slots
    up to their positions: causal attention (the CPU kernel: sliding windows and sinks too), no mask of its own, no
    additive bias."""
    if cfg.family != "decoder":
        return f"it reads a decoder's own keys; a {cfg.family} attends to its source on XLA"
    if cfg.mla:
        return "multi-head latent attention caches latents, not per-head keys and values"
    if cfg.linear_attention is not None:
        return "its linear-attention layers' states ride beside the stacked pool, which the kernel form splits"
    kinds = {spec.attention for spec in layer_plan(cfg, cfg.attention, cfg.decoder_layers).layers}
    served = {"causal", "sliding"} if kernel == "ffi-cpu" else {"causal"}
    if not kinds <= served:
        return f"its layers attend {', '.join(sorted(kinds - served))}, not plainly causal over every slot"
    if cfg.position == "relative" or cfg.relative_bias is not None:
        return "its attention adds a relative position bias, which the kernel takes none of"
    if cfg.scores.sinks and kernel != "ffi-cpu":
        return "its attention sinks join each softmax, which the kernel has no place for"
    if cfg.value_dim != cfg.head_dim_:
        return f"its value heads ({cfg.value_dim}) are not as wide as its key heads ({cfg.head_dim_})"
    if kernel == "pallas-tpu" and cfg.dtype != "bfloat16":
        return f"the kernel reads keys and values in bfloat16, which would round a {cfg.dtype} model's"
    if kernel == "ffi-cpu":
        if platform() != "cpu":
            return f"it is a CPU kernel (XLA's FFI on the host), and this backend is {platform()}"
        if cfg.dtype != "float32":
            return f"it reads float32 keys and values, not a {cfg.dtype} model's"
        from jaxformer import native

        return native.paged_attention()  # (None once built and registered, else why not)
    tile = {"pallas-gpu": ("gpu", 16), "pallas-tpu": ("tpu", 128)}[kernel]
    if platform() == tile[0] and cfg.head_dim_ % tile[1]:
        return f"its head size {cfg.head_dim_} is not a multiple of {tile[1]} (the kernel's tiles)"
    return None


def paged_attention(q: Array, k, v, scale: float, softcap: float | None, sinks: Array | None = None) -> Array:
    """Attention [B, T, N, H] of queries q [B, T, N, H] (T = 1 but for ``MANY_QUERY_KERNELS``) over the rows' paged
    keys and values ``k``, ``v`` (``cache.PagedRows`` of a layer's own pool, this step's tokens written: each
    query's slots up to its position, each row's up to its ``target.lengths``; a sliding layer's window of them, and
    each head's ``sinks`` [N] in its softmax, for the CPU kernel), by the kernel they name, a Pallas one off its
    platform in Pallas's interpreter. A padding row's (or query's) output is never read."""
    if k.kernel == "ffi-cpu":
        from jaxformer import native

        problem = native.paged_attention()  # (registers it: paged_kernel normally has)
        if problem is not None:
            raise ValueError(f"paged attention 'ffi-cpu': {problem}")
        out = jax.ffi.ffi_call(native.TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32))(
            q.astype(jnp.float32), k.pool, v.pool, k.tables, k.target.positions,
            jnp.zeros((0,), jnp.float32) if sinks is None else sinks.astype(jnp.float32), scale=np.float32(scale),
            softcap=np.float32(softcap or 0.0), window=np.int32(k.window or 0))
        return out.astype(q.dtype)
    if sinks is not None or k.window is not None:  # (paged_kernel_refuses such models for these kernels)
        raise ValueError(f"paged attention {k.kernel!r} reads no attention sinks and no sliding window")
    pages, lengths = k.tables.shape[1], k.target.lengths
    scaled = (q[:, 0].astype(jnp.float32) * scale).astype(q.dtype)  # neither kernel takes a scale
    if k.kernel == "pallas-gpu":
        from jax.experimental.pallas.ops.gpu import paged_attention as gpu

        # the table splits into partitions read in parallel, each a few pages at a time: both divide its width
        splits = next(n for n in (16, 8, 4, 2, 1) if pages % n == 0)
        per_block = next(n for n in (8, 4, 2, 1) if (pages // splits) % n == 0)
        out = gpu.paged_attention(scaled, k.pool, v.pool, k.tables, lengths, k_splits=splits,
                                  pages_per_compute_block=per_block, attn_logits_soft_cap=softcap,
                                  interpret=platform() != "gpu")
    else:
        from jax.experimental.pallas import tpu as pltpu
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as tpu

        per_block = next(n for n in (8, 4, 2, 1) if pages % n == 0)
        interpreted = pltpu.force_tpu_interpret_mode() if platform() != "tpu" else contextlib.nullcontext()
        with interpreted:  # (a padding row, length 0, would divide 0 by 0: it reads its null block's first slot)
            out = tpu(scaled, k.pool, v.pool, jnp.maximum(lengths, 1), k.tables, pages_per_compute_block=per_block,
                      attn_logits_soft_cap=softcap)
    return out[:, None].astype(q.dtype)


def unstack_decode_loops() -> bool:
    """Whether a decode loop should run on layers sliced out of the stack once (``Stack.unstacked``):
    on CPU, where XLA copies a layer's weights out of the stacked array at every slice. GPU and TPU
    backends fuse the slice into the matmul, and the scanned stack compiles faster."""
    return platform() == "cpu"
