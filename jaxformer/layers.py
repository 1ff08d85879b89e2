"""Shared math of the three families: parameters with logical axes, norms, feed-forwards, mixture of
experts, positions, masks, attention, the transformer block and the layer-stack runner.

Modules here hold parameters only. Randomness (dropout) arrives as explicit PRNG keys, and caches
arrive and leave as values, so every forward pass is a pure function of (params, inputs).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax.ad_checkpoint import checkpoint_name

from jaxformer import kernels
from jaxformer.config import ModelConfig
from jaxformer.sharding import constrain_activations

Array = jax.Array

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_of(name: str):
    return DTYPES[name]


# --------------------------------------------------------------------------------------------------
# Parameters


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], cfg: ModelConfig,
          init: str = "normal") -> nnx.Param:
    """A parameter carrying its logical axis names (one per dimension) in the ``axes`` metadata."""
    if len(axes) != len(shape):
        raise ValueError(f"parameter of shape {shape} needs {len(shape)} axis names, got {axes}")
    dtype = dtype_of(cfg.param_dtype)
    if init == "normal":
        value = cfg.init_std * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "zeros":
        value = jnp.zeros(shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        raise ValueError(f"unknown init {init!r}")
    return nnx.Param(value.astype(dtype), axes=axes)


class Buffer(nnx.Variable):
    """A fixed array that is part of a checkpoint but not trained (BART's final_logits_bias)."""


def logical_axes(module: nnx.Module) -> dict[str, tuple[str, ...]]:
    """Map '/'-joined parameter path -> logical axis names, for every nnx.Param in ``module``."""
    return {"/".join(map(str, path)): var.get_metadata()["axes"]
            for path, var in nnx.iter_graph(module) if isinstance(var, nnx.Param)}


class Dense(nnx.Module):
    """y = x W (+ b) over the last axis, for heads and poolers; W carries the given logical axes."""

    def __init__(self, cfg: ModelConfig, d_in: int, d_out: int, axes: tuple[str, str], *, rngs: nnx.Rngs,
                 bias: bool = True):
        self.dtype = dtype_of(cfg.dtype)
        self.kernel = param(rngs, (d_in, d_out), axes, cfg)
        self.bias = param(rngs, (d_out,), axes[1:], cfg, init="zeros") if bias else None

    def __call__(self, x: Array) -> Array:
        y = jnp.einsum("...D,DF->...F", x, self.kernel[...].astype(self.dtype))
        return y if self.bias is None else y + self.bias[...].astype(self.dtype)


def dropout(x: Array, rate: float, key: Array | None) -> Array:
    """Inverted dropout; the identity when ``key`` is None (evaluation) or the rate is 0."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def split_key(key: Array | None, n: int) -> list[Array | None]:
    return [None] * n if key is None else list(jax.random.split(key, n))


# --------------------------------------------------------------------------------------------------
# Norms and activations


def _normalize(x: Array, scale: Array, bias: Array | None, kind: str, eps: float) -> tuple[Array, Array, Array]:
    if kind == "layernorm":
        x = x - jnp.mean(x, axis=-1, keepdims=True)
    inv = jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)
    normed = x * inv
    y = normed * scale
    return (y if bias is None else y + bias), normed, inv


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def normalize(x: Array, scale: Array, bias: Array | None, kind: str, eps: float) -> Array:
    """LayerNorm / RMSNorm over the last axis. The hand-written JVP refers only to the normalized
    input and 1/std, so a backward pass keeps just those (autodiff of the forward kept four [.., D]
    intermediates per norm and spread the backward over a dozen small reductions)."""
    return _normalize(x, scale, bias, kind, eps)[0]


@normalize.defjvp
def _normalize_jvp(kind, eps, primals, tangents):
    (x, scale, bias), (dx, dscale, dbias) = primals, tangents
    y, normed, inv = _normalize(x, scale, bias, kind, eps)
    if kind == "layernorm":
        dx = dx - jnp.mean(dx, axis=-1, keepdims=True)
    dnormed = inv * (dx - normed * jnp.mean(normed * dx, axis=-1, keepdims=True))
    dy = dnormed * scale + normed * dscale
    return y, (dy if bias is None else dy + dbias)


class Norm(nnx.Module):
    """LayerNorm or RMSNorm over the last axis, computed in float32 whatever the compute dtype."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.kind, self.eps, self.dtype = cfg.norm, cfg.norm_eps, dtype_of(cfg.dtype)
        self.scale = param(rngs, (cfg.d_model,), ("embed",), cfg, init="ones")
        self.bias = (param(rngs, (cfg.d_model,), ("embed",), cfg, init="zeros")
                     if cfg.norm == "layernorm" and cfg.norm_bias else None)

    def __call__(self, x: Array) -> Array:
        bias = None if self.bias is None else self.bias[...].astype(jnp.float32)
        y = normalize(x.astype(jnp.float32), self.scale[...].astype(jnp.float32), bias, self.kind, self.eps)
        return y.astype(self.dtype)


def _with_derivative(f: Callable[[Array], Array], df: Callable[[Array], Array]) -> Callable[[Array], Array]:
    """``f`` whose JVP is ``df(x) * t``: autodiff saves one [.., F] residual (the derivative) instead
    of every intermediate of f's formula (tanh, cube, erf, ...)."""
    g = jax.custom_jvp(f)
    g.defjvp(lambda primals, tangents: (f(primals[0]), df(primals[0]) * tangents[0]))
    return g


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh_derivative(x: Array) -> Array:
    t = jnp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)


def _gelu_derivative(x: Array) -> Array:
    return 0.5 * (1 + jax.lax.erf(x * (1 / math.sqrt(2)))) + x * jnp.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))


def _silu_derivative(x: Array) -> Array:
    s = jax.nn.sigmoid(x)
    return s * (1 + x * (1 - s))


_ACTIVATIONS = {
    "relu": jax.nn.relu,
    # erf form, as PyTorch computes it: jax.nn.gelu's exact form goes through erfc (about 2.5x the work)
    "gelu": _with_derivative(lambda x: 0.5 * x * (1 + jax.lax.erf(x * (1 / math.sqrt(2)))), _gelu_derivative),
    # T5 v1.1's gated GELU uses the tanh form ("gelu_new")
    "gelu_tanh": _with_derivative(lambda x: jax.nn.gelu(x, approximate=True), _gelu_tanh_derivative),
    "silu": _with_derivative(jax.nn.silu, _silu_derivative),
}
_ACTIVATIONS.update(geglu=_ACTIVATIONS["gelu_tanh"], swiglu=_ACTIVATIONS["silu"])


def activate(name: str, x: Array) -> Array:
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}")
    return _ACTIVATIONS[name](x)


# --------------------------------------------------------------------------------------------------
# Feed-forward: dense and mixture of experts


class MLP(nnx.Module):
    """Position-wise feed-forward: wo(act(wi x)), or wo(act(wi_gate x) * wi x) when gated."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, F = cfg.d_model, cfg.d_ff
        self.activation, self.dtype = cfg.activation, dtype_of(cfg.dtype)
        self.dropout_rate = cfg.dropout_rate
        self.wi = param(rngs, (D, F), ("embed", "mlp"), cfg)
        self.wi_gate = param(rngs, (D, F), ("embed", "mlp"), cfg) if cfg.gated else None
        self.wo = param(rngs, (F, D), ("mlp", "embed"), cfg)
        self.bi = param(rngs, (F,), ("mlp",), cfg, init="zeros") if cfg.mlp_bias else None
        self.bo = param(rngs, (D,), ("embed",), cfg, init="zeros") if cfg.mlp_bias else None

    def __call__(self, x: Array, key: Array | None = None) -> Array:
        dt = self.dtype
        h = jnp.einsum("BTD,DF->BTF", x, self.wi[...].astype(dt))
        if self.bi is not None:
            h = h + self.bi[...].astype(dt)
        if self.wi_gate is not None:
            h = activate(self.activation, jnp.einsum("BTD,DF->BTF", x, self.wi_gate[...].astype(dt))) * h
        else:
            h = activate(self.activation, h)
        h = checkpoint_name(dropout(h, self.dropout_rate, key), "mlp")
        y = jnp.einsum("BTF,FD->BTD", h, self.wo[...].astype(dt))
        if self.bo is not None:
            y = y + self.bo[...].astype(dt)
        return y


class MoE(nnx.Module):
    """Top-k mixture of gated experts with softmax-then-top-k routing (Mixtral).

    Every expert runs on every token and the top-k weights (zero elsewhere) combine the results.
    That is exact and shards over the ``experts`` axis, at E/k times the FLOPs of a sparse dispatch.
    Returns the output and the per-expert (token fraction, mean router probability) used by the
    Switch/Mixtral load-balancing loss.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        E, D, F = cfg.num_experts, cfg.d_model, cfg.d_ff
        self.k, self.activation, self.dtype = cfg.experts_per_token, cfg.activation, dtype_of(cfg.dtype)
        self.router = param(rngs, (D, E), ("embed", "experts"), cfg)
        self.wi = param(rngs, (E, D, F), ("experts", "embed", "mlp"), cfg)
        self.wi_gate = param(rngs, (E, D, F), ("experts", "embed", "mlp"), cfg) if cfg.gated else None
        self.wo = param(rngs, (E, F, D), ("experts", "mlp", "embed"), cfg)

    def __call__(self, x: Array, token_mask: Array | None = None) -> tuple[Array, Array]:
        dt = self.dtype
        E = self.router.shape[-1]
        logits = jnp.einsum("BTD,DE->BTE", x, self.router[...].astype(dt))
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        top_p, top_i = jax.lax.top_k(probs, self.k)
        top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
        chosen = jax.nn.one_hot(top_i, E, dtype=jnp.float32)  # BTkE
        combine = jnp.einsum("BTk,BTkE->BTE", top_p, chosen).astype(dt)

        h = jnp.einsum("BTD,EDF->BTEF", x, self.wi[...].astype(dt))
        if self.wi_gate is not None:
            h = activate(self.activation, jnp.einsum("BTD,EDF->BTEF", x, self.wi_gate[...].astype(dt))) * h
        else:
            h = activate(self.activation, h)
        y = jnp.einsum("BTEF,EFD,BTE->BTD", checkpoint_name(h, "mlp"), self.wo[...].astype(dt), combine)

        w = jnp.ones(x.shape[:2], jnp.float32) if token_mask is None else token_mask.astype(jnp.float32)
        denom = jnp.maximum(jnp.sum(w), 1.0)
        token_fraction = jnp.einsum("BT,BTkE->E", w, chosen) / denom
        router_prob = jnp.einsum("BT,BTE->E", w, probs) / denom
        return y, jnp.stack([token_fraction, router_prob])


def load_balancing_loss(stats: Array, num_experts: int) -> Array:
    """Mixtral's auxiliary loss from per-layer stats [L, 2, E]: E * sum_e f_e * p_e over all layers."""
    token_fraction = jnp.mean(stats[:, 0], axis=0)
    router_prob = jnp.mean(stats[:, 1], axis=0)
    return num_experts * jnp.sum(token_fraction * router_prob)


# --------------------------------------------------------------------------------------------------
# Embeddings and positions


class Embed(nnx.Module):
    """Token embedding table [V, D]; ``attend`` reuses it as the tied output projection."""

    def __init__(self, num: int, cfg: ModelConfig, *, rngs: nnx.Rngs, axes=("vocab", "embed")):
        self.table = param(rngs, (num, cfg.d_model), axes, cfg)
        self.dtype = dtype_of(cfg.dtype)

    def __call__(self, ids: Array) -> Array:
        return jnp.take(self.table[...], ids, axis=0).astype(self.dtype)

    def attend(self, x: Array) -> Array:
        return jnp.einsum("BTD,VD->BTV", x, self.table[...].astype(self.dtype))


def sinusoids(positions: Array, d_model: int) -> Array:
    """The 2017 encoding [B, T, D]: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same)."""
    inv_freq = np.power(10000.0, -np.arange(0, d_model, 2, dtype=np.float64) / d_model).astype(np.float32)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, -1)
    return pe[..., :d_model]


class Positions(nnx.Module):
    """Absolute positions added to the token embeddings: a learned table, sinusoids, or nothing
    (rotary and relative schemes act inside attention instead)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.kind, self.offset, self.dtype = cfg.position, cfg.position_offset, dtype_of(cfg.dtype)
        self.d_model = cfg.d_model
        self.table = (param(rngs, (cfg.max_positions + cfg.position_offset, cfg.d_model), ("positions", "embed"), cfg)
                      if cfg.position == "learned" else None)

    def __call__(self, positions: Array) -> Array | None:
        if self.kind == "learned":
            return jnp.take(self.table[...], positions + self.offset, axis=0).astype(self.dtype)
        if self.kind == "sinusoidal":
            return sinusoids(positions, self.d_model).astype(self.dtype)
        return None


def rope_frequencies(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies [H/2] in float32, as Hugging Face computes them (with rope scaling)."""
    H = cfg.head_dim_
    inv_freq = (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, H, 2, dtype=np.float32) / np.float32(H))))
    inv_freq = inv_freq.astype(np.float32)
    s = cfg.rope_scaling
    if s is None:
        return inv_freq
    if s.kind == "linear":
        return (inv_freq / np.float32(s.factor)).astype(np.float32)
    # llama3: keep high frequencies, divide low ones by factor, blend the band in between.
    low_wavelen = s.original_max_positions / s.low_freq_factor
    high_wavelen = s.original_max_positions / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, blended, scaled).astype(np.float32)


def rope_angles(inv_freq: np.ndarray, positions: Array) -> tuple[Array, Array]:
    """cos and sin [B, T, H] for positions [B, T] (the half-split layout of Hugging Face)."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotate [B, T, N, H] by the angles [B, T, H]: x * cos + rotate_half(x) * sin."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


def relative_position_buckets(relative: Array, bidirectional: bool, num_buckets: int,
                              max_distance: int) -> Array:
    """T5's bucketing of key - query distances: exact for small distances, logarithmic beyond."""
    bucket = jnp.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative > 0).astype(relative.dtype) * num_buckets
        distance = jnp.abs(relative)
    else:
        distance = jnp.maximum(-relative, 0)
    max_exact = num_buckets // 2
    log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(relative.dtype)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(distance < max_exact, distance, large)


class RelativeBias(nnx.Module):
    """T5 relative position bias: one learned scalar per (bucket, head), shared by all layers."""

    def __init__(self, cfg: ModelConfig, *, bidirectional: bool, rngs: nnx.Rngs):
        self.bidirectional = bidirectional
        self.num_buckets, self.max_distance = cfg.relative_buckets, cfg.relative_max_distance
        self.table = param(rngs, (cfg.relative_buckets, cfg.num_heads), ("buckets", "heads"), cfg)

    def __call__(self, q_positions: Array, k_positions: Array) -> Array:
        """Bias [B, N, T, S] from query positions [B, T] and key positions [B, S]."""
        relative = k_positions[:, None, :] - q_positions[:, :, None]
        buckets = relative_position_buckets(relative, self.bidirectional, self.num_buckets, self.max_distance)
        bias = jnp.take(self.table[...].astype(jnp.float32), buckets, axis=0)  # BTSN
        return jnp.transpose(bias, (0, 3, 1, 2))


# --------------------------------------------------------------------------------------------------
# Masks


def visibility_mask(pattern: str, q_positions: Array, k_positions: Array, k_valid: Array | None = None,
                   *, window: int | None = None, prefix_lengths: Array | None = None) -> Array:
    """Boolean [B, 1, T, S]: may query t attend to key s?

    Built from positions rather than indices so the same function serves full sequences, KV caches
    and left padding. ``k_valid`` [B, S] removes padded keys. Patterns: bidirectional; causal
    (s <= t); sliding (t - window < s <= t); prefix (causal, plus every key inside the prefix).
    Alternating layers call this with 'causal' or 'sliding'.
    """
    q = q_positions[:, :, None]
    k = k_positions[:, None, :]
    if pattern == "bidirectional":
        allowed = jnp.ones(jnp.broadcast_shapes(q.shape, k.shape), bool)
    elif pattern == "causal":
        allowed = k <= q
    elif pattern == "sliding":
        allowed = (k <= q) & (k > q - window)
    elif pattern == "prefix":
        allowed = (k <= q) | (k < prefix_lengths[:, None, None])
    else:
        raise ValueError(f"unknown attention pattern {pattern!r}")
    if k_valid is not None:
        allowed = allowed & k_valid[:, None, :].astype(bool)
    return allowed[:, None, :, :]


# --------------------------------------------------------------------------------------------------
# Attention


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
                          key: Array | None = None) -> Array:
    """Grouped-query attention. q [B,T,N,H], k/v [B,S,K,H], mask [B|1,1,T,S], bias [B|1,N,T,S] or None.

    k, v, mask and bias may also be tuples of segments along S (a KV cache and this call's new
    keys): the softmax runs over all segments together, so the cache is read where it lies instead
    of being copied to append the new keys. Scores, bias and softmax are float32. A row with every key
    masked (a padded query) gets a uniform distribution instead of NaN, like the additive-minimum
    masks of PyTorch references.
    """
    ks, vs, masks = (k, v, mask) if isinstance(k, tuple) else ((k,), (v,), (mask,))
    biases = bias if isinstance(bias, tuple) else (bias,) * len(ks)
    B, T, N, H = q.shape
    K = ks[0].shape[2]
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
    # Without grouping (G == 1) the scores stay 4-D: the [B,K,1,T,S] view made XLA CPU copy the scores.
    scores = []
    for k_seg, m_seg, b_seg in zip(ks, masks, biases):
        s = jnp.einsum("BKMH,BKSH->BKMS", q, k_seg.transpose(0, 2, 1, 3), preferred_element_type=jnp.float32)
        s = s if G == 1 else s.reshape(B, K, G, T, -1)
        s = s if fold_scale else s * scale
        if b_seg is not None:
            s = s + (b_seg if G == 1 else b_seg.reshape(b_seg.shape[0], K, G, *b_seg.shape[2:]))
        scores.append(jnp.where(m_seg if G == 1 else m_seg[:, :, None], s, jnp.finfo(jnp.float32).min))
    probs = dropout(softmax(jnp.concatenate(scores, axis=-1) if len(scores) > 1 else scores[0]), dropout_rate, key)
    out, start = 0.0, 0
    for v_seg in vs:
        p_seg = probs if len(vs) == 1 else jax.lax.slice_in_dim(probs, start, start + v_seg.shape[1], axis=-1)
        p_seg = p_seg.astype(v_seg.dtype).reshape(B, K, G * T, -1)
        out = out + jnp.einsum("BKMS,BKSH->BKMH", p_seg, v_seg.transpose(0, 2, 1, 3))
        start += v_seg.shape[1]
    return out.reshape(B, K, G, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)


class Attention(nnx.Module):
    """Multi-head attention with separate kv heads (MHA, GQA, MQA), self or cross.

    Projections are einsum kernels with explicit head axes: q [D,N,H], k/v [D,K,H], o [N,H,D].
    Two hooks serve generation:
    - ``cache`` {"k", "v": [B, S, K, H]}: keys/values of earlier tokens, attended in place next to
      this call's own (``mask`` and ``bias`` are then (cache part, new part) pairs); the new keys and
      values [B, T, K, H] are returned so the caller writes them into its cache.
    - ``kv`` (k, v) [B, S, K, H]: precomputed keys/values (cross-attention to a fixed encoder output).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, N, K, H = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim_
        self.dtype, self.scale = dtype_of(cfg.dtype), cfg.scale
        self.dropout_rate = cfg.attention_dropout_rate
        self.q = param(rngs, (D, N, H), ("embed", "heads", "head_dim"), cfg)
        self.k = param(rngs, (D, K, H), ("embed", "kv_heads", "head_dim"), cfg)
        self.v = param(rngs, (D, K, H), ("embed", "kv_heads", "head_dim"), cfg)
        self.o = param(rngs, (N, H, D), ("heads", "head_dim", "embed"), cfg)
        if cfg.qkv_bias:
            self.q_bias = param(rngs, (N, H), ("heads", "head_dim"), cfg, init="zeros")
            self.k_bias = param(rngs, (K, H), ("kv_heads", "head_dim"), cfg, init="zeros")
            self.v_bias = param(rngs, (K, H), ("kv_heads", "head_dim"), cfg, init="zeros")
        else:
            self.q_bias = self.k_bias = self.v_bias = None
        self.o_bias = param(rngs, (D,), ("embed",), cfg, init="zeros") if cfg.out_bias else None

    def _project(self, x: Array, kernel: nnx.Param, bias: nnx.Param | None) -> Array:
        y = jnp.einsum("BTD,DNH->BTNH", x, kernel[...].astype(self.dtype))
        return y if bias is None else y + bias[...].astype(self.dtype)

    def key_values(self, source: Array) -> tuple[Array, Array]:
        """Keys and values [B, S, K, H] of ``source`` (computed once per encoder output when cached)."""
        k = checkpoint_name(self._project(source, self.k, self.k_bias), "qkv")
        v = checkpoint_name(self._project(source, self.v, self.v_bias), "qkv")
        return k, v

    def __call__(self, x: Array, kv_input: Array | None = None, *, mask: Array, bias: Array | None = None,
                 rope: tuple[Array, Array] | None = None, cache: dict | None = None,
                 kv: tuple[Array, Array] | None = None, key: Array | None = None) -> tuple[Array, dict | None]:
        q = checkpoint_name(self._project(x, self.q, self.q_bias), "qkv")
        k, v = kv if kv is not None else self.key_values(x if kv_input is None else kv_input)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        new_kv = None
        if cache is not None:
            new_kv = {"k": k.astype(cache["k"].dtype), "v": v.astype(cache["v"].dtype)}
            k, v = (cache["k"], new_kv["k"]), (cache["v"], new_kv["v"])
        if isinstance(mask, kernels.FusedMask):  # full-sequence calls only: Stack gives none with a cache
            if key is None or self.dropout_rate == 0.0:
                return self._output(kernels.attend(q, k, v, mask, bias, self.scale)), new_kv
            mask = mask.dense  # attention dropout runs on XLA
        out = dot_product_attention(q, k, v, mask, bias, self.scale, self.dropout_rate, key)
        return self._output(out), new_kv

    def _output(self, out: Array) -> Array:
        y = jnp.einsum("BTNH,NHD->BTD", out, self.o[...].astype(self.dtype))
        if self.o_bias is not None:
            y = y + self.o_bias[...].astype(self.dtype)
        return y


# --------------------------------------------------------------------------------------------------
# The block


class Block(nnx.Module):
    """One transformer layer: self-attention, optional cross-attention, feed-forward (or MoE).

    Pre-norm:  x = x + f(norm(x))       (GPT-2, LLaMA, T5)
    Post-norm: x = norm(x + f(x))       (2017 Transformer, BERT, BART)
    """

    def __init__(self, cfg: ModelConfig, *, cross_attention: bool = False, rngs: nnx.Rngs):
        self.pre_norm = cfg.norm_position == "pre"
        self.dropout_rate = cfg.dropout_rate
        self.attn_norm = Norm(cfg, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        if cross_attention:
            self.cross_norm = Norm(cfg, rngs=rngs)
            self.cross_attn = Attention(cfg, rngs=rngs)
        else:
            self.cross_norm = self.cross_attn = None
        self.mlp_norm = Norm(cfg, rngs=rngs)
        self.mlp = MoE(cfg, rngs=rngs) if cfg.num_experts else MLP(cfg, rngs=rngs)

    def _residual(self, x: Array, norm: Norm, f: Callable[[Array], Array], key: Array | None) -> Array:
        if self.pre_norm:
            return x + dropout(f(norm(x)), self.dropout_rate, key)
        return norm(x + dropout(f(x), self.dropout_rate, key))

    def __call__(self, x: Array, *, mask: Array, bias: Array | None = None, rope=None,
                 encoder_out: Array | None = None, cross_mask: Array | None = None,
                 cross_kv: tuple[Array, Array] | None = None, token_mask: Array | None = None,
                 cache: dict | None = None, key: Array | None = None) -> tuple[Array, dict | None, Array | None]:
        keys = split_key(key, 6)
        new_kv = None

        def self_attention(h):
            nonlocal new_kv
            y, new_kv = self.attn(h, mask=mask, bias=bias, rope=rope, cache=cache, key=keys[0])
            return y

        x = self._residual(x, self.attn_norm, self_attention, keys[1])
        if self.cross_attn is not None:
            x = self._residual(x, self.cross_norm, lambda h: self.cross_attn(
                h, encoder_out, mask=cross_mask, kv=cross_kv, key=keys[2])[0], keys[3])
        router_stats = None
        if isinstance(self.mlp, MoE):
            def mlp(h):
                nonlocal router_stats
                y, router_stats = self.mlp(h, token_mask)
                return y
        else:
            def mlp(h):
                return self.mlp(h, keys[4])
        x = self._residual(x, self.mlp_norm, mlp, keys[5])
        return x, new_kv, router_stats


def stacked_blocks(cfg: ModelConfig, num_layers: int, *, rngs: nnx.Rngs, cross_attention: bool = False) -> Block:
    """``num_layers`` Blocks as one Block whose parameters have a leading 'layers' axis.

    The parameter layout is the same whether the forward pass scans or unrolls, so checkpoints do
    not depend on ``scan_layers``.
    """

    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers", "axes": "layers"})
    def make(rngs: nnx.Rngs) -> Block:
        return Block(cfg, cross_attention=cross_attention, rngs=rngs)

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


def split_layers(blocks: Block) -> tuple:
    """Per-layer parameter states of stacked blocks, sliced once.

    XLA's CPU backend copies a layer's weights out of the stacked array at every slice (it does not
    fuse slices into dots, unlike the GPU and TPU backends). A decode loop that runs thousands of
    steps therefore slices once, outside the loop, and passes these to ``run_stack``.
    """
    params = nnx.state(blocks)
    num_layers = jax.tree.leaves(params)[0].shape[0]
    return tuple(jax.tree.map(lambda a: a[i], params) for i in range(num_layers))


def run_stack(blocks: Block, x: Array, layer_fn: Callable, per_layer: Any, cfg: ModelConfig,
              layer_states: tuple | None = None) -> tuple[Array, Any]:
    """Apply stacked blocks in order: ``x, out = layer_fn(block, x, per_layer_slice)`` per layer.

    Scans (one compiled body for all layers) when ``cfg.scan_layers``, else unrolls a Python loop
    over the same stacked parameters; both return the per-layer outputs stacked on axis 0.
    ``layer_states`` (from ``split_layers``) unrolls over already-sliced parameters instead.
    ``cfg.remat`` wraps the body in ``jax.checkpoint`` with the named policy.
    """
    graphdef, params = nnx.split(blocks)

    def body(carry, inputs):
        layer_params, extra = inputs
        return layer_fn(nnx.merge(graphdef, layer_params), constrain_activations(carry), extra)

    if cfg.remat != "none":
        body = jax.checkpoint(body, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers and layer_states is None:
        return jax.lax.scan(body, x, (params, per_layer))
    num_layers = jax.tree.leaves(params)[0].shape[0]
    outputs = []
    for i in range(num_layers):
        layer_params = layer_states[i] if layer_states is not None else jax.tree.map(lambda a: a[i], params)
        x, out = body(x, (layer_params, jax.tree.map(lambda a: a[i], per_layer)))
        outputs.append(out)
    return x, jax.tree.map(lambda *xs: jnp.stack(xs), *outputs)


# --------------------------------------------------------------------------------------------------
# Embedding front end and layer stack, shared by the three families


class Embeddings(nnx.Module):
    """Token embeddings (looked up by the caller, who may share the table) -> optional sqrt(D)
    scale -> absolute positions -> token types -> optional norm -> dropout."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, token_types: bool = False):
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else None
        self.positions = Positions(cfg, rngs=rngs)
        self.token_types = (Embed(cfg.type_vocab_size, cfg, rngs=rngs, axes=("types", "embed"))
                            if token_types and cfg.type_vocab_size else None)
        self.norm = Norm(cfg, rngs=rngs) if cfg.embedding_norm else None
        self.dropout_rate = cfg.dropout_rate

    def __call__(self, tokens: Array, positions: Array, token_type_ids: Array | None = None,
                 key: Array | None = None) -> Array:
        x = tokens if self.scale is None else tokens * jnp.asarray(self.scale, tokens.dtype)
        absolute = self.positions(positions)
        if absolute is not None:
            x = x + absolute
        if self.token_types is not None:
            x = x + self.token_types(jnp.zeros_like(positions) if token_type_ids is None else token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        return dropout(x, self.dropout_rate, key)


class Stack(nnx.Module):
    """A stack of blocks with one attention pattern, its final norm, and the position machinery
    that acts inside attention (rotary angles, T5 relative bias), computed once per stack."""

    def __init__(self, cfg: ModelConfig, num_layers: int, *, pattern: str, cross_attention: bool = False,
                 rngs: nnx.Rngs):
        self.config, self.pattern, self.num_layers = cfg, pattern, num_layers
        self.blocks = stacked_blocks(cfg, num_layers, rngs=rngs, cross_attention=cross_attention)
        self.final_norm = Norm(cfg, rngs=rngs) if cfg.final_norm else None
        self.relative_bias = (RelativeBias(cfg, bidirectional=pattern == "bidirectional", rngs=rngs)
                              if cfg.position == "relative" else None)

    def cross_key_values(self, encoder_out: Array) -> tuple[Array, Array]:
        """Every layer's cross-attention keys and values [L, B, S, K, H] of a fixed encoder output:
        computed once per generation instead of once per decoded token."""
        graphdef, params = nnx.split(self.blocks)
        return jax.vmap(lambda p: nnx.merge(graphdef, p).cross_attn.key_values(encoder_out))(params)

    def __call__(self, x: Array, q_positions: Array, *, key_valid: Array | None = None,
                 k_positions: Array | None = None, prefix_lengths: Array | None = None,
                 encoder_out: Array | None = None, cross_mask: Array | None = None,
                 cross_kv: tuple[Array, Array] | None = None, cache: dict | None = None,
                 token_valid: Array | None = None, collect_hidden: bool = False, key: Array | None = None,
                 layer_states: tuple | None = None, index_positions: bool = False
                 ) -> tuple[Array, tuple[Array, ...] | None, dict | None, Array | None]:
        """Returns (output, hidden states or None, updated cache or None, MoE router stats or None).

        Hidden states follow Hugging Face: the input, then every layer's output, the last one
        after the final norm. Without a cache, ``key_valid`` [B, T] marks this call's real tokens.
        ``cache`` = {"k", "v": [L, B, S, K, H], "index"} holds earlier tokens, whose slots
        ``k_positions`` / ``key_valid`` [B, S] describe; this call's tokens (real where ``token_valid``
        [B, T]) are attended next to it and written at ``index`` once, after the layer loop.
        ``index_positions`` says the positions are the token indices (no ``position_ids`` given), so
        a fused kernel's index-based causal and sliding masks see what the position-based mask sees.
        """
        cfg = self.config
        window = cfg.window_size
        local_pattern = "sliding" if self.pattern == "alternating" else None
        base_pattern = "causal" if self.pattern == "alternating" else self.pattern

        # This call's own tokens are always keys (real where key_valid says, or token_valid when a cache
        # is given); with a cache, its slots (k_positions, key_valid) are keys too, attended in place.
        own_valid = key_valid if cache is None else token_valid

        def masks(pattern):
            if pattern is None:
                return None
            own = visibility_mask(pattern, q_positions, q_positions, own_valid, window=window,
                                  prefix_lengths=prefix_lengths)
            if cache is None:
                return own
            return visibility_mask(pattern, q_positions, k_positions, key_valid, window=window,
                                   prefix_lengths=prefix_lengths), own

        mask, local_mask = masks(base_pattern), masks(local_pattern)
        bias = None
        if self.relative_bias is not None:
            # Index positions are the same in every row: one [1, N, T, S] bias, broadcast over the batch.
            rows = q_positions[:1] if index_positions and cache is None else q_positions
            bias = self.relative_bias(rows, rows)
            if cache is not None:
                bias = (self.relative_bias(q_positions, k_positions), bias)
        if cache is None and local_mask is None and (index_positions or self.pattern == "bidirectional"):
            mask = kernels.fused_mask(cfg, mask, self.pattern, key_valid=key_valid, query_valid=key_valid,
                                      has_bias=bias is not None)
        rope = rope_angles(rope_frequencies(cfg), q_positions) if cfg.position == "rope" else None
        # MoE load statistics count real tokens only.
        token_mask = key_valid if key_valid is not None and cache is None else None

        per_layer = {
            # GPT-3 style: even layers dense, odd layers locally banded.
            "local": jnp.arange(self.num_layers) % 2 == 1,
            "key": None if key is None else jax.random.split(key, self.num_layers),
            "cross_kv": cross_kv,
            "cache": None if cache is None else {"k": cache["k"], "v": cache["v"]},
        }

        def layer(block: Block, h: Array, extra: dict):
            layer_mask = mask
            if local_mask is not None:
                layer_mask = jax.tree.map(lambda local, dense: jnp.where(extra["local"], local, dense), local_mask, mask)
            h, new_kv, stats = block(h, mask=layer_mask, bias=bias, rope=rope, encoder_out=encoder_out,
                                     cross_mask=cross_mask, cross_kv=extra["cross_kv"], token_mask=token_mask,
                                     cache=extra["cache"], key=extra["key"])
            return h, (h if collect_hidden else None, stats, new_kv)

        out, (hidden, stats, new_kv) = run_stack(self.blocks, x, layer, per_layer, cfg, layer_states)
        new_cache = None
        if cache is not None:  # one in-place write of every layer's new keys and values
            at = (0, 0, cache["index"], 0, 0)
            new_cache = {"k": jax.lax.dynamic_update_slice(cache["k"], new_kv["k"], at),
                         "v": jax.lax.dynamic_update_slice(cache["v"], new_kv["v"], at),
                         "index": cache["index"] + x.shape[1]}
        if self.final_norm is not None:
            out = self.final_norm(out)
        hidden_states = None
        if collect_hidden:
            hidden_states = (x, *[hidden[i] for i in range(self.num_layers - 1)], out)
        return out, hidden_states, new_cache, stats
