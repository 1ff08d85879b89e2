"""Position-wise feed-forward layers: the dense MLP (plain or gated) and the mixture of experts."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxformer.config import ModelConfig
from jaxformer.layers.core import activate, dropout, dtype_of, param

Array = jax.Array


class MLP(nnx.Module):
    """Position-wise feed-forward: wo(act(wi x)), or wo(act(wi_gate x) * wi x) when gated. ``width`` and
    ``bias`` default to the config's d_ff and mlp_bias (DeepSeek's shared experts are one wider MLP)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, width: int | None = None, bias: bool | None = None):
        D, F = cfg.d_model, width or cfg.d_ff
        bias = cfg.mlp_bias if bias is None else bias
        self.activation, self.dtype = cfg.activation, dtype_of(cfg.dtype)
        self.dropout_rate = cfg.dropout_rate
        self.wi = param(rngs, (D, F), ("embed", "mlp"), cfg)
        self.wi_gate = param(rngs, (D, F), ("embed", "mlp"), cfg) if cfg.gated else None
        self.wo = param(rngs, (F, D), ("mlp", "embed"), cfg)
        self.bi = param(rngs, (F,), ("mlp",), cfg, init="zeros") if bias else None
        self.bo = param(rngs, (D,), ("embed",), cfg, init="zeros") if bias else None

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


# --------------------------------------------------------------------------------------------------
# Mixture of experts


class RouterBias(nnx.Param):
    """DeepSeek-V3's per-expert selection bias. A parameter (it lives, shards and checkpoints with the
    others) of its own kind: gradients never reach it, the optimizer leaves it alone, and the training
    step moves it by the balancing rule instead; Hugging Face counts it as a buffer, so
    ``jaxformer.param_count`` does too."""


class Routing(NamedTuple):
    """A router's decision for tokens [B, T]: the k experts each token goes to [B, T, k], their
    weights [B, T, k] (float32), and the scores [B, T, E] the balancing losses read (float32)."""

    experts: Array
    weights: Array
    scores: Array


def route(cfg: ModelConfig, logits: Array, bias: Array | None) -> Routing:
    """Choose each token's experts from router logits [B, T, E], in float32, as the reference models do.

    Scores are a softmax over experts (Mixtral, DeepSeek-V2) or a sigmoid per expert (DeepSeek-V3).
    Selection may add a per-expert ``bias`` (V3's balancing; the weights still come from the scores)
    and may first keep the best ``router_topk_groups`` of ``router_groups`` groups (a group's score is
    its best expert under softmax, V2; the sum of its best two under sigmoid, V3). The k chosen
    scores are optionally divided by their sum, then scaled by ``routed_scaling``.
    """
    E, k = cfg.num_experts, cfg.experts_per_token
    logits = logits.astype(jnp.float32)
    scores = jax.nn.softmax(logits, axis=-1) if cfg.router_score == "softmax" else jax.nn.sigmoid(logits)
    choice = scores if bias is None else scores + bias.astype(jnp.float32)
    if cfg.router_groups > 1:
        grouped = choice.reshape(*choice.shape[:-1], cfg.router_groups, E // cfg.router_groups)
        if cfg.router_score == "softmax":
            group_score = jnp.max(grouped, axis=-1)
        else:
            group_score = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)
        _, best_groups = jax.lax.top_k(group_score, cfg.router_topk_groups)
        keep = jnp.sum(jax.nn.one_hot(best_groups, cfg.router_groups, dtype=bool), axis=-2, dtype=bool)
        choice = jnp.where(keep[..., None], grouped, -jnp.inf).reshape(choice.shape)
    _, experts = jax.lax.top_k(choice, k)
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    if cfg.normalize_router_weights:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return Routing(experts, weights * cfg.routed_scaling, scores)


def grouped_experts(x: Array, routing: Routing, wi: Array, wi_gate: Array | None, wo: Array,
                    activation: str) -> Array:
    """Dropless dispatch: only the chosen experts run. The B*T*k token-expert pairs are sorted by
    expert, so each expert's rows are contiguous; one ragged matmul per weight runs every expert over
    its own rows; the rows are unsorted and each token sums its k results with its weights."""
    B, T, D = x.shape
    k, E = routing.experts.shape[-1], wi.shape[0]
    flat_experts = routing.experts.reshape(-1)
    order = jnp.argsort(flat_experts, stable=True)  # pair j of the sorted list is pair order[j]
    group_sizes = jnp.bincount(flat_experts, length=E).astype(jnp.int32)
    rows = x.reshape(B * T, D)[order // k]
    h = jax.lax.ragged_dot(rows, wi, group_sizes)
    if wi_gate is not None:
        h = activate(activation, jax.lax.ragged_dot(rows, wi_gate, group_sizes)) * h
    else:
        h = activate(activation, h)
    y = jax.lax.ragged_dot(checkpoint_name(h, "mlp"), wo, group_sizes)
    unsorted = y[jnp.argsort(order)].reshape(B, T, k, D)
    return jnp.einsum("BTkD,BTk->BTD", unsorted, routing.weights.astype(y.dtype))


def dense_experts(x: Array, routing: Routing, wi: Array, wi_gate: Array | None, wo: Array, activation: str) -> Array:
    """Every expert on every token, combined with the routing weights (zero for experts not chosen):
    E/k times the FLOPs of the grouped dispatch, without its sort and gathers."""
    E = wi.shape[0]
    combine = jnp.einsum("BTk,BTkE->BTE", routing.weights, jax.nn.one_hot(routing.experts, E, dtype=jnp.float32))
    h = jnp.einsum("BTD,EDF->BTEF", x, wi)
    if wi_gate is not None:
        h = activate(activation, jnp.einsum("BTD,EDF->BTEF", x, wi_gate)) * h
    else:
        h = activate(activation, h)
    return jnp.einsum("BTEF,EFD,BTE->BTD", checkpoint_name(h, "mlp"), wo, combine.astype(x.dtype))


def use_grouped_dispatch(cfg: ModelConfig) -> bool:
    """``moe_dispatch`` 'auto': the grouped dispatch unless every expert is chosen anyway."""
    if cfg.moe_dispatch != "auto":
        return cfg.moe_dispatch == "grouped"
    return cfg.experts_per_token < cfg.num_experts


class MoE(nnx.Module):
    """A top-k mixture of gated experts (Mixtral), with DeepSeekMoE's options: always-on shared
    experts, grouped and biased routing (``route``). Only the chosen experts run (``grouped_experts``)
    unless the config asks for the dense all-experts form.

    Returns the output and the router statistics of this layer (``router_statistics``), from which the
    balancing losses and the per-expert load logs are computed.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        E, D, F = cfg.num_experts, cfg.d_model, cfg.expert_width
        self.config, self.dtype = cfg, dtype_of(cfg.dtype)
        self.router = param(rngs, (D, E), ("embed", "experts"), cfg)
        # Moved between steps by the balancing rule (train.router_bias_rate), never by gradients.
        self.router_bias = (RouterBias(jnp.zeros((E,), dtype_of(cfg.param_dtype)), axes=("experts",))
                            if cfg.router_bias else None)
        self.wi = param(rngs, (E, D, F), ("experts", "embed", "mlp"), cfg)
        self.wi_gate = param(rngs, (E, D, F), ("experts", "embed", "mlp"), cfg) if cfg.gated else None
        self.wo = param(rngs, (E, F, D), ("experts", "mlp", "embed"), cfg)
        self.shared = (MLP(cfg, rngs=rngs, width=cfg.shared_experts * F, bias=False)
                       if cfg.shared_experts else None)

    def __call__(self, x: Array, token_mask: Array | None = None) -> tuple[Array, dict[str, Array]]:
        cfg, dt = self.config, self.dtype
        # The router runs in float32, weights and activations alike (transformers keeps it there).
        logits = jnp.einsum("BTD,DE->BTE", x.astype(jnp.float32), self.router[...].astype(jnp.float32))
        bias = None if self.router_bias is None else jax.lax.stop_gradient(self.router_bias[...])
        routing = route(cfg, logits, bias)
        weights = (self.wi[...].astype(dt), None if self.wi_gate is None else self.wi_gate[...].astype(dt),
                   self.wo[...].astype(dt))
        experts = grouped_experts if use_grouped_dispatch(cfg) else dense_experts
        y = experts(x, routing, *weights, cfg.activation)
        if self.shared is not None:
            y = y + self.shared(x)
        return y, router_statistics(cfg, routing, token_mask)


def router_statistics(cfg: ModelConfig, routing: Routing, token_mask: Array | None) -> dict[str, Array]:
    """One layer's load figures over the real tokens (``token_mask`` [B, T]; None: all):
    ``load`` [E], the share of the token-expert assignments each expert received (sums to 1);
    ``prob`` [E], the mean routing probability (sigmoid scores normalized per token);
    ``sequence_loss`` [], DeepSeek-V3's sequence-wise balance term, averaged over rows."""
    E, k = cfg.num_experts, cfg.experts_per_token
    B, T = routing.experts.shape[:2]
    w = jnp.ones((B, T), jnp.float32) if token_mask is None else token_mask.astype(jnp.float32)
    chosen = jnp.sum(jax.nn.one_hot(routing.experts, E, dtype=jnp.float32), axis=-2)  # [B, T, E]
    probs = routing.scores
    if cfg.router_score == "sigmoid":
        probs = probs / (jnp.sum(probs, axis=-1, keepdims=True) + 1e-20)
    per_row = jnp.maximum(jnp.sum(w, axis=1), 1.0)  # [B]
    row_load = jnp.einsum("BT,BTE->BE", w, chosen) / (k * per_row[:, None])
    row_prob = jnp.einsum("BT,BTE->BE", w, probs) / per_row[:, None]
    rows = jnp.maximum(jnp.sum(jnp.sum(w, axis=1) > 0), 1)
    sequence_loss = jnp.sum(E * jnp.sum(row_load * row_prob, axis=-1) * (jnp.sum(w, axis=1) > 0)) / rows
    total = jnp.maximum(jnp.sum(w), 1.0)
    return {"load": jnp.einsum("BT,BTE->E", w, chosen) / (k * total),
            "prob": jnp.einsum("BT,BTE->E", w, probs) / total,
            "sequence_loss": sequence_loss}


def load_balancing_loss(stats: dict[str, Array], cfg: ModelConfig) -> Array:
    """The balancing loss of per-layer stats ([L, ...] each), not yet times ``router_aux_loss_coef``.
    batch: Switch/Mixtral's E * sum_e f_e * p_e, f_e the fraction of tokens routed to e (summing to k)
    and p_e its mean probability, each averaged over layers; sequence: DeepSeek-V3's per-row term,
    summed over layers."""
    if cfg.router_aux_loss == "sequence":
        return jnp.sum(stats["sequence_loss"])
    token_fraction = cfg.experts_per_token * jnp.mean(stats["load"], axis=0)
    router_prob = jnp.mean(stats["prob"], axis=0)
    return cfg.num_experts * jnp.sum(token_fraction * router_prob)
