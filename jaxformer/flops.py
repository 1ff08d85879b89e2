"""Model FLOPs of a training step and the peak FLOP/s of the devices it runs on (the two halves of MFU);
the bytes a decode step must read and the memory bandwidth (the two halves of decoding's bound).

Model FLOPs count the matmuls the model needs, not what an implementation does (remat's recomputation
is not counted): 6 x (parameters a token passes through) per token, the forward's 2 plus the
backward's 4, and attention's two T x S products, 12 x heads x head_dim x (keys a query sees) per
token and layer. A causal query sees (T + 1) / 2 keys on average, a sliding one at most its window;
encoder and decoder tokens are counted separately (cross-attention sees every source token); a MoE
layer counts only the experts a token is routed to. Transformer-XL's queries also see the segment memory
(``memory_len`` keys, whose key and value projections run forward and into the weight gradient) and score
every distance against its projected encoding: one more query-key product over M + T + 1 (causal) or
M + 2T (bidirectional) columns. DeBERTa's disentangled terms each add a product of every query (c2p) or key
(p2c) with the 2 x span rows of the relative-position table, whose projections run once per call (not per
token). An image tower's tokens are its patches (each through the patch projection, a matmul) and its class token;
a dual encoder (CLIP, SigLIP) counts both towers, each over its own tokens; a decoder reading images (LLaVA) its
tower over one image a row and the projector over that image's features. An encoder reading audio (Whisper) counts
its two convolutions over the frames beside its source positions. Embedding lookups, the pooler and
classifier heads, a dual encoder's projections and its [B, B] similarities (one row per sequence) are left out.
"""

from __future__ import annotations

import functools
import math
import os
import re
import time

import jax
import jax.numpy as jnp

from flax import nnx

from jaxformer.cache import cache_numbers, cache_numbers_per_token, linear_state_bytes
from jaxformer.model_config import ModelConfig, generator_config
from jaxformer.layers import RouterBias
from jaxformer.layers.projector import features_per_image
from jaxformer.layer_plan import encoder_pattern
from jaxformer.models import abstract_params

# Per-chip datasheet figures, keyed by what ``device.device_kind`` reports (matched by ``chip_value``).
# Dense bf16 peaks; float32 matmuls on these chips run at about half of it: TF32 tensor cores on NVIDIA
# (JAX's default precision), bf16 passes on TPU. v5e reports "TPU v5 lite", v5p "TPU v5" (or "TPU v5p"),
# v6e "TPU v6 lite" (or "TPU v6e").
PEAK_BF16_FLOPS = {"H100": 989e12, "H100 PCIe": 756e12, "H200": 989e12, "A100": 312e12, "L4": 121e12,
                   "TPU v4": 275e12, "TPU v5": 459e12, "TPU v5p": 459e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12,
                   "TPU v6 lite": 918e12, "TPU v6e": 918e12}
# HBM bandwidth per chip, bytes/s. The A100 kinds name their memory: 40 GB parts 1.555e12, 80 GB SXM 2.039e12.
HBM_BYTES_PER_S = {"H100": 3.35e12, "H100 PCIe": 2.0e12, "H200": 4.8e12, "A100": 1.555e12,
                   "A100-SXM4-80GB": 2.039e12, "A100 80GB PCIe": 1.935e12, "L4": 300e9, "TPU v4": 1.2e12,
                   "TPU v5": 2.765e12, "TPU v5p": 2.765e12, "TPU v5 lite": 819e9, "TPU v5e": 819e9,
                   "TPU v6 lite": 1.64e12, "TPU v6e": 1.64e12}


def chip_value(table: dict[str, float], device_kind: str) -> float | None:
    """The entry of ``table`` for a ``device_kind`` string, or None when no key names it.

    A key matches when it occurs in the kind as whole words (case-insensitive), so "L4" does not match
    an "L40S"; of several matches the longest key wins, so "TPU v5 lite" beats "TPU v5" and
    "A100-SXM4-80GB" beats "A100".
    """
    kind = device_kind.lower()
    found = [key for key in table if re.search(rf"(?<![a-z0-9]){re.escape(key.lower())}(?![a-z0-9])", kind)]
    return table[max(found, key=len)] if found else None


# DeBERTa's position projections: applied to the relative-position table once per call, not to each token
_PER_CALL = ("pos_k", "pos_q", "pos_k_bias", "pos_q_bias")


def _stack_params(cfg: ModelConfig, stack: str) -> float:
    """Parameters one token passes through in a stack of blocks (MoE: the routed experts only)."""
    total = 0.0
    for path, leaf in nnx.to_flat_state(abstract_params(cfg)):
        if path[0] != stack or isinstance(leaf, RouterBias):  # the selection bias is added, not multiplied
            continue
        if "relative_embeddings" in path or path[-1] in _PER_CALL:  # DeBERTa's table: not per token
            continue
        size = math.prod(leaf.shape)
        axes = leaf.get_metadata().get("axes", ())
        if "experts" in axes:
            size *= cfg.experts.per_token / cfg.experts.count
        total += size
    # ALBERT: the one stored layer is applied at every layer
    return total * cfg.encoder_layers if cfg.shared_layers and stack == "encoder" else total


def _head_params(cfg: ModelConfig) -> float:
    if cfg.family == "encoder":
        width = cfg.embeddings.width or cfg.d_model  # factorised embeddings: in front of the stack, behind the MLM head
        project = 0 if cfg.embeddings.width is None else width * cfg.d_model
        if cfg.head in ("mlm", "pretraining"):
            return project + cfg.d_model * width + width * cfg.vocab_size
        return project + (cfg.d_model * cfg.d_model + cfg.d_model if cfg.head == "discriminator" else 0)
    return cfg.d_model * cfg.vocab_size if cfg.head == "lm" else 0


def _keys_seen(pattern: str, queries: int, keys: int, window: int | None) -> float:
    if pattern == "bidirectional":
        return keys
    reach = window or queries
    return sum(min(t + 1, reach) for t in range(queries)) / queries


def train_flops_per_step(cfg: ModelConfig, batch_size: int, length: int, target_length: int | None = None) -> float:
    """Model FLOPs of one forward + backward pass over a batch (``length`` tokens per row, or source
    and ``target_length`` tokens for an encoder-decoder)."""
    # The two attention products per key: scores over the query/key head size, the weighted sum over the
    # value head size (they differ under multi-head latent attention); 12 x width counts both.
    rotary = cfg.latent.rope_head_dim if cfg.latent is not None else 0
    width = cfg.num_heads * (cfg.head_dim_ + rotary + cfg.value_dim) / 2
    if cfg.family == "encoder_decoder":
        target = target_length or length
        encoder = 6 * _stack_params(cfg, "encoder") + 12 * cfg.encoder_layers * width * length
        self_keys = _keys_seen(cfg.attention, target, target, cfg.window_size)
        decoder = (6 * (_stack_params(cfg, "decoder") + _head_params(cfg))
                   + 12 * cfg.decoder_layers * width * (self_keys + length))
        front = 0.0
        if cfg.audio is not None:  # Whisper: two width-3 convolutions over the frames (the second of stride 2)
            front = 6 * 3 * cfg.d_model * (cfg.audio.frames * cfg.audio.mel_bins + length * cfg.d_model)
        return batch_size * (length * encoder + front + target * decoder)
    if cfg.family == "dual_encoder":
        vision = cfg.vision
        return (train_flops_per_step(vision.text_tower(cfg), batch_size, length)
                + train_flops_per_step(vision.tower, batch_size, vision.tower.patches.tokens))
    if cfg.family == "decoder" and cfg.vision is not None:  # LLaVA: one image a row through tower and projector
        vision = cfg.vision
        return (train_flops_per_step(cfg.replace(vision=None), batch_size, length)
                + train_flops_per_step(vision.tower, batch_size, vision.tower.patches.tokens)
                + 6 * batch_size * features_per_image(cfg) * _stack_params(cfg, "projector"))
    stack = "encoder" if cfg.family == "encoder" else "decoder"
    pattern = encoder_pattern(cfg) if cfg.family == "encoder" else cfg.attention
    keys = _keys_seen(pattern, length, length, cfg.window_size)
    per_token = 6 * (_stack_params(cfg, stack) + _head_params(cfg)) + 12 * cfg.num_layers * width * keys
    if cfg.position == "xl":
        M, heads = cfg.segment_memory, cfg.num_heads * cfg.head_dim_
        distances = M + length + (length - 1 if pattern == "bidirectional" else 1)
        per_token += cfg.num_layers * (12 * width * M + 6 * heads * distances
                                       + 4 * (M / length) * 2 * cfg.d_model * heads)
    per_call = 0.0
    if cfg.patches is not None:  # the patch projection: a matmul over each patch's pixels
        patches = cfg.patches
        per_call = 6 * batch_size * patches.count * patches.channels * patches.patch_size ** 2 * cfg.d_model
    if cfg.position == "disentangled":  # DeBERTa: each term scores a query (c2p) or key (p2c) against every row
        rows, heads = 2 * cfg.disentangled.span(cfg.max_positions), cfg.num_heads * cfg.head_dim_
        terms = len(cfg.disentangled.terms)
        per_token += cfg.num_layers * 6 * heads * rows * terms
        per_call += cfg.num_layers * 6 * rows * terms * cfg.d_model * heads  # the table's projections
    if cfg.generator_width:  # ELECTRA: the generator trains beside the discriminator on the same rows
        return (batch_size * length * per_token + per_call
                + train_flops_per_step(generator_config(cfg), batch_size, length))
    return batch_size * length * per_token + per_call


@functools.cache
def _decode_weight_bytes(cfg: ModelConfig, batch_size: int) -> float:
    """Bytes of the weights one decode step reads: the decoder stack and the LM head, in their dtype.
    Embedding tables are read one row per token (left out) unless tied, when the head reads all of it;
    cross-attention key/value projections run once, on the encoder output, before decoding. A MoE
    layer reads the experts its tokens are routed to, at most all of them."""
    read = {"decoder", "lm_head"} | ({"embed"} if cfg.embeddings.tie and cfg.head == "lm" else set())
    experts = cfg.experts
    experts_read = min(experts.count, batch_size * experts.per_token) / experts.count if experts is not None else 0.0
    total = 0.0
    for path, leaf in nnx.to_flat_state(abstract_params(cfg)):
        once = "cross_attn" in path and path[-1] in ("k", "v", "k_bias", "v_bias")
        if path[0] in read and not once:
            size = math.prod(leaf.shape) * leaf.dtype.itemsize
            total += size * (experts_read if "experts" in leaf.get_metadata().get("axes", ()) else 1)
    return total


def decode_bytes_per_step(cfg: ModelConfig, batch_size: int, cache_length: int, source_length: int = 0) -> float:
    """Bytes one cached decode step must read from memory: every weight it uses once (in
    ``cfg.param_dtype``) and the keys and values of ``cache_length`` tokens per row in every layer (in
    ``cfg.dtype``; a windowed layer reads its rolling cache, at most its window; a linear layer its state), plus
    an encoder-decoder's cross-attention keys and values of ``source_length`` tokens. Dividing by the memory
    bandwidth gives the step's lower bound on time, which small batches come close to."""
    if cfg.family == "encoder":
        raise ValueError(f"decode_bytes_per_step needs a decoder; {cfg.name!r} is an encoder")
    itemsize = jnp.dtype(cfg.dtype).itemsize
    kv_bytes = (cache_numbers(cfg, cache_length) + cache_numbers_per_token(cfg) * source_length) * itemsize
    kv_bytes += linear_state_bytes(cfg)  # the linear layers' states, read and written whole
    return _decode_weight_bytes(cfg, batch_size) + batch_size * kv_bytes


def _best_time(fn, repeats: int = 5) -> float:
    fn()  # compile and warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


# Square matmul sizes of the CPU peak probe: small ones fit the caches, large ones amortise the threading;
# which is fastest depends on the machine, so the probe takes the best of all of them.
PROBE_SIZES = (512, 1024, 2048)
_peaks: dict[str, tuple[float, str]] = {}  # per process: the probe runs once per dtype
_reprobed: set[str] = set()  # dtypes whose probe ``utilization`` already ran a second time
RAISED = ", raised by a faster step"  # how a peak's source says a step's own rate replaced the probe
# A CPU's float32 peak measured before, in FLOP/s, taken instead of probing again: the test-suite probes once and
# hands it to its workers and training subprocesses, which would each spend seconds of matmuls on the same figure.
CPU_PEAK_VARIABLE = "JAXFORMER_CPU_FLOAT32_PEAK_FLOPS"


def probe_matmul_flops(dtype: str = "float32", repeats: int = 5) -> float:
    """FLOP/s of the fastest jitted square matmul in ``dtype`` over ``PROBE_SIZES``, each the best of
    ``repeats`` runs: an upper bound on what a step's matmuls reach on this device."""
    best = 0.0
    for n in PROBE_SIZES:
        a = jnp.ones((n, n), dtype)
        matmul = jax.jit(lambda x: x @ x)
        best = max(best, 2 * n**3 / _best_time(lambda: matmul(a).block_until_ready(), repeats))
    return best


def peak_flops(dtype: str = "float32") -> tuple[float, str]:
    """Peak FLOP/s of all local devices together, and how it was obtained.

    Accelerators: the datasheet table above times the device count (NaN for a chip it lacks). CPUs:
    measured once per process and dtype by ``probe_matmul_flops`` (simulated CPU devices share one
    machine's cores, so they count once) unless ``CPU_PEAK_VARIABLE`` gives the float32 figure, and raised by
    ``utilization`` when a step runs faster.
    """
    if dtype in _peaks:
        return _peaks[dtype]
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        bf16 = chip_value(PEAK_BF16_FLOPS, device.device_kind)
        if bf16 is None:
            return float("nan"), f"no datasheet peak for {device.device_kind!r}"
        count = jax.local_device_count()
        _peaks[dtype] = ((bf16 if dtype != "float32" else bf16 / 2) * count,
                         f"{device.device_kind} datasheet {dtype} x {count}")
    elif dtype == "float32" and os.environ.get(CPU_PEAK_VARIABLE):
        _peaks[dtype] = float(os.environ[CPU_PEAK_VARIABLE]), f"given by {CPU_PEAK_VARIABLE}"
    else:
        sizes = "/".join(map(str, PROBE_SIZES))
        _peaks[dtype] = probe_matmul_flops(dtype), f"measured: best {dtype} {sizes}-square matmul on this CPU"
    return _peaks[dtype]


def utilization(flops_per_s: float, dtype: str = "float32") -> float:
    """Model FLOPs utilization of a step running ``flops_per_s`` model FLOP/s, at most 1 on a CPU.

    A CPU step faster than the probed peak means the probe read low (the cores were shared while it
    ran), so the probe runs again with more repetitions (once per process: a training loop logging
    fast steps does not stall on it twice) and the peak becomes the largest of the probes and the
    step's own rate: the step is evidence of what the machine can do.
    """
    peak, source = peak_flops(dtype)
    if flops_per_s > peak and jax.local_devices()[0].platform == "cpu":
        if dtype not in _reprobed:
            _reprobed.add(dtype)
            peak = max(peak, probe_matmul_flops(dtype, repeats=10))
        if flops_per_s > peak:
            peak, source = flops_per_s, source.removesuffix(RAISED) + RAISED
        _peaks[dtype] = peak, source
    return flops_per_s / peak


def forget_peaks() -> None:
    """Drop the cached peaks and bandwidth (the next call measures or looks them up again)."""
    _peaks.clear()
    _reprobed.clear()
    peak_bandwidth.cache_clear()


def measure_bandwidth(megabytes: int = 256) -> float:
    """Bytes per second for reading a float32 array once with a jitted reduction (best of 5). 256 MiB
    is well past a CPU's last-level cache and takes a fraction of a second."""
    x = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
    total = jax.jit(lambda a: jnp.sum(a, dtype=jnp.float32))
    return megabytes * 2**20 / _best_time(lambda: total(x).block_until_ready())


@functools.cache
def peak_bandwidth() -> tuple[float, str]:
    """Memory bandwidth of one device in bytes/s, and how it was obtained: the HBM datasheet table on
    accelerators (NaN for a chip it lacks), measured on CPU. One device's, because a decode step
    reads the weights from the memory of the device it runs on."""
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        per_chip = chip_value(HBM_BYTES_PER_S, device.device_kind)
        if per_chip is None:
            return float("nan"), f"no datasheet bandwidth for {device.device_kind!r}"
        return per_chip, f"{device.device_kind} datasheet, one device"
    return measure_bandwidth(), "measured: jitted reduction over 256 MiB on this CPU"
