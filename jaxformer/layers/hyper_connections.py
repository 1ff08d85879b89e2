"""Manifold-constrained hyper-connections (mHC; Xie et al. 2026, DeepSeek-V4 section 2.2): the residual stream is
``streams`` parallel copies [B, T, n, D]. Before each sublayer the copies are collapsed into its input by per-token
weights ``pre``; its output is spread back by weights ``post`` and added to the copies mixed by a per-token
n x n matrix ``comb``, projected by Sinkhorn-Knopp toward the doubly stochastic matrices (rows and columns summing
to 1) so the mixing cannot grow the stream's norm however deep the stack. All three come from one small linear map
of the copies, RMS-normed without a scale, and all of it runs in float32, as the reference keeps these modules.
The stack's end collapses the copies once more (``HyperHead``: ``pre`` alone).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.layers.core import param
from jaxformer.model_config import ModelConfig

Array = jax.Array


def _unscaled_rms(x: Array, eps: float) -> Array:
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


def sinkhorn(comb: Array, iters: int, eps: float) -> Array:
    """[..., n, n] positive matrices toward doubly stochastic: columns normalized, then ``iters - 1`` rounds of
    rows then columns (the reference's order; the matrix is not symmetric, so the order matters)."""
    comb = comb / (jnp.sum(comb, axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (jnp.sum(comb, axis=-1, keepdims=True) + eps)
        comb = comb / (jnp.sum(comb, axis=-2, keepdims=True) + eps)
    return comb


class HyperConnection(nnx.Module):
    """One sublayer's hyper-connection: ``collapse`` gives the sublayer's input [B, T, D] from the copies
    [B, T, n, D] and the (post, comb) weights that ``expand`` then uses to join its output back into them."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        part = cfg.norms.hyper_connections
        n, D = part.streams, cfg.d_model
        self.part, self.norm_eps = part, cfg.norms.eps
        # one map of the flattened copies to the pre (n), post (n) and comb (n * n) logits, each with a bias,
        # and one learned scale per kind
        self.fn = param(rngs, (n * D, (2 + n) * n), ("hc_in", "hc_mix"), cfg)
        self.base = param(rngs, ((2 + n) * n,), ("hc_mix",), cfg, init="zeros")
        self.scale = param(rngs, (3,), ("hc_scales",), cfg, init="ones")

    def collapse(self, streams: Array) -> tuple[Array, tuple[Array, Array]]:
        n, eps = self.part.streams, self.part.eps
        B, T = streams.shape[:2]
        flat = _unscaled_rms(streams.reshape(B, T, -1).astype(jnp.float32), self.norm_eps)
        mixes = flat @ self.fn[...].astype(jnp.float32)
        base, scale = self.base[...].astype(jnp.float32), self.scale[...].astype(jnp.float32)
        pre = jax.nn.sigmoid(mixes[..., :n] * scale[0] + base[:n]) + eps
        post = 2 * jax.nn.sigmoid(mixes[..., n:2 * n] * scale[1] + base[n:2 * n])
        comb_logits = mixes[..., 2 * n:] * scale[2] + base[2 * n:]
        comb = jax.nn.softmax(comb_logits.reshape(B, T, n, n), axis=-1) + eps
        comb = sinkhorn(comb, self.part.sinkhorn_iters, eps)
        collapsed = jnp.sum(pre[..., None] * streams, axis=2).astype(streams.dtype)
        return collapsed, (post, comb)

    @staticmethod
    def expand(streams: Array, output: Array, weights: tuple[Array, Array]) -> Array:
        """The copies after the sublayer: copy k = post_k * output + sum_j comb[j, k] * copy j."""
        post, comb = (w.astype(streams.dtype) for w in weights)
        return post[..., None] * output[..., None, :] + jnp.einsum("BTjk,BTjD->BTkD", comb, streams)


class HyperHead(nnx.Module):
    """The stack's last collapse of the copies into one hidden state [B, T, D], before the final norm."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        part = cfg.norms.hyper_connections
        n, D = part.streams, cfg.d_model
        self.eps, self.norm_eps = part.eps, cfg.norms.eps
        self.fn = param(rngs, (n * D, n), ("hc_in", "hc_streams"), cfg)
        self.base = param(rngs, (n,), ("hc_streams",), cfg, init="zeros")
        self.scale = param(rngs, (1,), ("scalar",), cfg, init="ones")

    def __call__(self, streams: Array) -> Array:
        B, T = streams.shape[:2]
        flat = _unscaled_rms(streams.reshape(B, T, -1).astype(jnp.float32), self.norm_eps)
        mixes = flat @ self.fn[...].astype(jnp.float32)
        pre = jax.nn.sigmoid(mixes * self.scale[...].astype(jnp.float32) + self.base[...].astype(jnp.float32))
        return jnp.sum((pre + self.eps)[..., None] * streams, axis=2).astype(streams.dtype)
