"""Model FLOPs of a training step, and the peak FLOP/s of the devices it runs on: the two halves of MFU.

Model FLOPs count the matmuls the model needs, not what an implementation does (remat's recomputation
is not counted): 6 x (parameters a token passes through) per token, the forward's 2 plus the
backward's 4, and attention's two T x S products, 12 x heads x head_dim x (keys a query sees) per
token and layer. A causal query sees (T + 1) / 2 keys on average, a sliding one at most its window;
encoder and decoder tokens are counted separately (cross-attention sees every source token); a MoE
layer counts only the experts a token is routed to. Embedding lookups, the pooler and classifier
heads (one row per sequence) are left out.
"""

from __future__ import annotations

import functools
import math
import time

import jax
import jax.numpy as jnp

from jaxformer.config import ModelConfig

# Dense bf16 peaks per chip (vendor datasheets). float32 matmuls on these chips run at about half of it:
# TF32 tensor cores on NVIDIA (JAX's default precision), bf16 passes on TPU.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "TPU v6": 918e12,
                   "TPU v5p": 459e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v4": 275e12}


def _stack_params(cfg: ModelConfig, stack: str) -> float:
    """Parameters one token passes through in a stack of blocks (MoE: the routed experts only)."""
    import jaxformer as jf

    from flax import nnx

    total = 0.0
    for path, leaf in nnx.to_flat_state(jf.abstract_params(cfg)):
        if path[0] != stack:
            continue
        size = math.prod(leaf.shape)
        axes = leaf.get_metadata().get("axes", ())
        if "experts" in axes:
            size *= cfg.experts_per_token / cfg.num_experts
        total += size
    return total


def _head_params(cfg: ModelConfig) -> float:
    if cfg.family == "encoder":
        return cfg.d_model * cfg.d_model + cfg.d_model * cfg.vocab_size if cfg.head in ("mlm", "pretraining") else 0
    return cfg.d_model * cfg.vocab_size if cfg.head == "lm" else 0


def _keys_seen(pattern: str, queries: int, keys: int, window: int | None) -> float:
    if pattern == "bidirectional":
        return keys
    reach = window or queries
    return sum(min(t + 1, reach) for t in range(queries)) / queries


def train_flops_per_step(cfg: ModelConfig, batch_size: int, length: int, target_length: int | None = None) -> float:
    """Model FLOPs of one forward + backward pass over a batch (``length`` tokens per row, or source
    and ``target_length`` tokens for an encoder-decoder)."""
    width = cfg.num_heads * cfg.head_dim_
    if cfg.family == "encoder_decoder":
        target = target_length or length
        encoder = 6 * _stack_params(cfg, "encoder") + 12 * cfg.encoder_layers * width * length
        self_keys = _keys_seen(cfg.attention, target, target, cfg.window_size)
        decoder = (6 * (_stack_params(cfg, "decoder") + _head_params(cfg))
                   + 12 * cfg.decoder_layers * width * (self_keys + length))
        return batch_size * (length * encoder + target * decoder)
    stack = "encoder" if cfg.family == "encoder" else "decoder"
    pattern = "bidirectional" if cfg.family == "encoder" else cfg.attention
    per_token = (6 * (_stack_params(cfg, stack) + _head_params(cfg))
                 + 12 * cfg.num_layers * width * _keys_seen(pattern, length, length, cfg.window_size))
    return batch_size * length * per_token


@functools.cache
def peak_flops(dtype: str = "float32") -> tuple[float, str]:
    """Peak FLOP/s of all local devices together, and how it was obtained.

    Accelerators: the datasheet table above times the device count. CPUs: measured, the best of a few
    jitted 1024^3 matmuls in ``dtype`` (simulated CPU devices share one machine's cores, so they count once).
    """
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        for name, bf16 in PEAK_BF16_FLOPS.items():
            if name.lower() in device.device_kind.lower():
                per_chip = bf16 if dtype != "float32" else bf16 / 2
                return per_chip * jax.local_device_count(), f"{device.device_kind} datasheet x {jax.local_device_count()}"
        return float("nan"), f"unknown peak for {device.device_kind}"
    n = 1024
    a = jnp.ones((n, n), dtype)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best, f"measured {dtype} {n}^3 matmul on this CPU"
