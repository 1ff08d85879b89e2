"""Position-wise feed-forward layers: the dense MLP (plain or gated) and the mixture of experts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxformer.config import ModelConfig
from jaxformer.layers.core import activate, dropout, dtype_of, param

Array = jax.Array


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
