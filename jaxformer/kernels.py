"""Fused attention kernels behind one switch, ``ModelConfig.attention_backend``:

- ``xla``: jaxformer's own einsum attention (``layers.dot_product_attention``), the reference. It takes
  every mask, KV caches, attention dropout and additive biases, on every platform.
- ``cudnn``: cuDNN's flash attention through ``jax.nn.dot_product_attention(implementation="cudnn")`` on
  NVIDIA GPUs. Causal and sliding masks are passed as flags, so the kernel skips masked tiles; T5's
  relative position bias and key padding go in as an additive bias.
- ``splash``: the Pallas splash-attention kernel on TPU. Causal and sliding masks are static block
  masks, so masked tiles are skipped; padding becomes segment ids. It cannot take an additive bias,
  so T5's biased self-attention stays on XLA (its cross-attention, which has no bias, runs fused).
  On other platforms the kernel runs in Pallas's interpreter, for tests only.
- ``auto`` (the default): cudnn on NVIDIA GPUs and splash on TPUs wherever a call qualifies, xla
  otherwise (see ``fused_backend``).

A fused kernel serves full-sequence calls: training, evaluation, a forward pass. Calls with a KV cache
(generation), attention dropout, prefix-LM masks, GPT-3's alternating layers and user-given
``position_ids`` (where visibility follows positions, not token order) run on XLA. ``FusedMask``
carries the structure a kernel needs next to the dense mask, so any call can still fall back.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxformer.config import ModelConfig

Array = jax.Array

FUSED_PATTERNS = ("bidirectional", "causal", "sliding")


@functools.partial(jax.tree_util.register_dataclass, data_fields=["dense", "key_valid", "query_valid"],
                   meta_fields=["backend", "pattern", "window"])
@dataclasses.dataclass(frozen=True)
class FusedMask:
    """Who may attend to whom, in the structured form fused kernels take, and the dense [B, 1, T, S]
    boolean mask XLA takes (for a fallback; unused arrays are pruned by the compiler)."""

    dense: Array
    key_valid: Array | None  # [B, S] real keys, or None for no padding
    query_valid: Array | None  # [B, T] real queries (self-attention), or None
    backend: str  # cudnn | splash
    pattern: str  # bidirectional | causal | sliding, by token index
    window: int | None = None  # sliding: keys in (t - window, t]


def platform() -> str:
    """'gpu' for NVIDIA GPUs (CUDA), 'tpu', 'cpu', or the name of another backend."""
    return jax.default_backend()


def fused_backend(cfg: ModelConfig, pattern: str, T: int, S: int, *, has_bias: bool = False) -> str:
    """The fused kernel a full-sequence attention call of ``cfg`` (T queries, S keys) uses, or 'xla'.

    An explicit ``attention_backend`` that cannot serve the model at all (a kernel for another
    platform, a dtype or head size it refuses) is a ValueError naming both; a call outside a kernel's
    reach (a mask pattern, bias or length it cannot take) runs on XLA, as the module doc says.
    """
    requested = cfg.attention_backend
    if requested == "xla" or pattern not in FUSED_PATTERNS or cfg.attention_softcap is not None or cfg.attention_sinks:
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
               query_valid: Array | None = None, has_bias: bool = False) -> Array | FusedMask:
    """``dense`` as a FusedMask when ``cfg``'s backend would run this call fused, else ``dense`` itself."""
    backend = fused_backend(cfg, pattern, dense.shape[-2], dense.shape[-1], has_bias=has_bias)
    if backend == "xla":
        return dense
    window = cfg.window_size if pattern == "sliding" else None
    return FusedMask(dense, key_valid, query_valid, backend, pattern, window)


# The implementation ``jax.nn.dot_product_attention`` is asked for on the cudnn path. Tests set it to
# "xla", which runs the same call (flags, padding, bias, GQA) through jax's reference implementation.
CUDNN_IMPLEMENTATION = "cudnn"


def attend(q: Array, k: Array, v: Array, mask: FusedMask, bias: Array | None, scale: float) -> Array:
    """Attention [B, T, N, H] of q [B, T, N, H] over k, v [B, S, K, H] by ``mask.backend``."""
    if mask.backend == "cudnn":
        return _cudnn(q, k, v, mask, bias, scale, CUDNN_IMPLEMENTATION)
    return _splash(q, k, v, mask, scale, interpret=platform() != "tpu")


def _cudnn(q, k, v, mask: FusedMask, bias, scale, implementation):
    # cuDNN's own padding mask assumes right padding; a [B, 1, T, S] mask is exact for any layout (jax
    # turns it into an additive bias). The packed batches of the LM objectives have no padding.
    dense = None if mask.key_valid is None else mask.dense
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
    if mask.key_valid is None:
        run = jax.vmap(jax.vmap(lambda q, k, v: kernel(q, k, v)))
        out = _sharded(run, q, k, v)
    else:
        # Padding as segment ids: real tokens are segment 0, pads segment 1, and a query sees only its
        # own segment, so real queries see exactly the real keys, whatever the padding layout.
        kv_segment = 1 - mask.key_valid.astype(jnp.int32)
        q_segment = (jnp.zeros((B, T), jnp.int32) if mask.query_valid is None
                     else 1 - mask.query_valid.astype(jnp.int32))

        def one_row(q, k, v, q_segment, kv_segment):
            segments = splash.SegmentIds(q=q_segment, kv=kv_segment)
            return jax.vmap(lambda q, k, v: kernel(q, k, v, segment_ids=segments))(q, k, v)

        out = _sharded(jax.vmap(one_row), q, k, v, q_segment, kv_segment)
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H).astype(v.dtype)


def _sharded(run, q, k, v, *segments):
    """Pallas kernels are opaque to the SPMD partitioner: under a mesh, run each device's rows and heads
    with shard_map (batch over data x fsdp, kv heads over tensor), as the kernels expect."""
    from jaxformer.sharding import BATCH_AXES

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
        return run(q, k, v, *segments)
    P = jax.sharding.PartitionSpec
    tensor = dict(mesh.shape).get("tensor", 1)
    heads = "tensor" if tensor > 1 and q.shape[1] % tensor == 0 else None
    qkv = P(BATCH_AXES, heads)
    return jax.shard_map(run, mesh=mesh, in_specs=(qkv, qkv, qkv, *([P(BATCH_AXES)] * len(segments))),
                         out_specs=qkv, check_vma=False)(q, k, v, *segments)


def unstack_decode_loops() -> bool:
    """Whether a decode loop should run on layers sliced out of the stack once (``Stack.unstacked``):
    on CPU, where XLA copies a layer's weights out of the stacked array at every slice. GPU and TPU
    backends fuse the slice into the matmul, and the scanned stack compiles faster."""
    return platform() == "cpu"
