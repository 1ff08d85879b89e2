"""Parameters with logical axes, dense projections, dropout, norms and activations."""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.model_config import ModelConfig
from jaxformer.sharding import sequence_parallel_size

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


@jax.custom_jvp
def linear(x: Array, w: Array) -> Array:
    """x [..., D] @ w [D, F]. When D <= F its weight gradient is computed from an explicitly transposed copy
    of x ([D, M], made in the forward pass) rather than of the output gradient [M, F].

    Left to autodiff, XLA's CPU backend computed the up-projections' dW = x^T dy by transposing dy [M, F]
    inside the elementwise fusion that produces it (the SwiGLU backward), a strided loop that took a third
    of a LLaMA-shaped train step (d_model 256, d_ff 1024: 0.82 s a step before, 0.52 s after). The rule is
    a JVP, so forward mode works too; its transpose is the weight gradient above. The optimization barrier
    keeps XLA from folding the transpose back into the matmul."""
    return jnp.einsum("...D,DF->...F", x, w)


@linear.defjvp
def _linear_jvp(primals, tangents):
    (x, w), (dx, dw) = primals, tangents
    y = linear(x, w)
    dy = jnp.einsum("...D,DF->...F", dx, w)
    if x.shape[-1] <= w.shape[-1] and sequence_parallel_size() > 1:
        # tokens split over `sequence` (rows maybe not): merging [B, T] into M would leave no shardable dimension
        x_t = jax.lax.optimization_barrier(jnp.moveaxis(x, -1, 0))  # [D, B, T]
        dy = dy + jnp.einsum("D...,DF->...F", x_t, dw)
    elif x.shape[-1] <= w.shape[-1]:
        x_t = jax.lax.optimization_barrier(x.reshape(-1, x.shape[-1]).T)  # [D, M]
        dy = dy + jnp.einsum("DM,DF->MF", x_t, dw).reshape(dy.shape)
    else:
        dy = dy + jnp.einsum("...D,DF->...F", x, dw)
    return y, dy


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
    """LayerNorm or RMSNorm over the last axis, computed in float32 whatever the compute dtype. The
    scale multiplies as (norm_scale_offset + scale): Gemma stores scale - 1, so its scales start at 0.
    ``axis`` names a width other than d_model (query/key norms over a head: 'head_dim'); ``scaled=False``
    builds a norm without a learned scale (Llama 4's query/key norm)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, width: int | None = None, axis: str = "embed",
                 scaled: bool = True):
        self.kind, self.eps, self.dtype = cfg.norms.kind, cfg.norms.eps, dtype_of(cfg.dtype)
        self.offset = cfg.norms.scale_offset
        width = width or cfg.d_model
        self.width = width
        self.scale = param(rngs, (width,), (axis,), cfg, init="zeros" if self.offset else "ones") if scaled else None
        self.bias = (param(rngs, (width,), (axis,), cfg, init="zeros")
                     if cfg.norms.kind == "layernorm" and cfg.norms.bias else None)

    def __call__(self, x: Array) -> Array:
        bias = None if self.bias is None else self.bias[...].astype(jnp.float32)
        scale = jnp.ones((self.width,), jnp.float32) if self.scale is None else self.scale[...].astype(jnp.float32)
        if self.offset:
            scale = scale + self.offset
        y = normalize(x.astype(jnp.float32), scale, bias, self.kind, self.eps)
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
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),  # CLIP's approximation, as transformers computes it
}
_ACTIVATIONS.update(geglu=_ACTIVATIONS["gelu_tanh"], geglu_erf=_ACTIVATIONS["gelu"], swiglu=_ACTIVATIONS["silu"],
                    tanh=jnp.tanh)


def activate(name: str, x: Array) -> Array:
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}")
    return _ACTIVATIONS[name](x)
