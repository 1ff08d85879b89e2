"""Position-wise feed-forward layers: the dense MLP (plain or gated) and the mixture of experts."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from jaxformer.model_config import ClampedSwiGLU, ModelConfig
from jaxformer.layers.core import Buffer, activate, dropout, dtype_of, linear, normalize, param
from jaxformer.layers.weights import kernel, project, projection
from jaxformer.sharding import BATCH_AXES, axis_size

Array = jax.Array


class Unit(NamedTuple):
    """What an MLP or expert computes between its projections, from the gate projection's output g and the
    up projection's h (h alone when not gated): act(g) * h, or gpt-oss's clamped SwiGLU (``limit``):
    min(g, limit) * sigmoid(alpha min(g, limit)) * (clip(h, -limit, limit) + offset), offset 1 (DeepSeek-V4's: 0,
    alpha 1). Hashable, so the expert
    dispatch takes it as a static argument."""

    activation: str
    gated: bool
    alpha: float = 1.0  # the gate's sigmoid gain, g * sigmoid(alpha g): 1 is SiLU
    limit: float | None = None
    offset: float = 1.0

    @classmethod
    def of(cls, cfg: ModelConfig) -> Unit:
        clamp = cfg.swiglu_clamp or ClampedSwiGLU()
        return cls(cfg.activation, cfg.gated, clamp.alpha, clamp.limit, clamp.offset)

    def __call__(self, g: Array, h: Array) -> Array:
        if not self.gated:
            return activate(self.activation, h)
        if self.limit is None and self.alpha == 1.0:
            return activate(self.activation, g) * h
        if self.limit is not None:
            g, h = jnp.minimum(g, self.limit), jnp.clip(h, -self.limit, self.limit) + self.offset
        return g * jax.nn.sigmoid(self.alpha * g) * h


class MLP(nnx.Module):
    """Position-wise feed-forward: wo(act(wi x)), or wo(act(wi_gate x) * wi x) when gated. ``width`` and
    ``bias`` default to the config's d_ff and mlp_bias (DeepSeek's shared experts are one wider MLP)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, width: int | None = None, bias: bool | None = None,
                 role: str = "mlp"):
        D, F = cfg.d_model, width or cfg.d_ff
        bias = cfg.biases.mlp if bias is None else bias
        self.unit, self.dtype = Unit.of(cfg), dtype_of(cfg.dtype)
        self.dropout_rate = cfg.dropout_rate
        projection(self, "wi", cfg, rngs, (D, F), ("embed", "mlp"), role=role)
        if cfg.gated:
            projection(self, "wi_gate", cfg, rngs, (D, F), ("embed", "mlp"), role=role)
        else:
            self.wi_gate = None
        projection(self, "wo", cfg, rngs, (F, D), ("mlp", "embed"), role=role)
        self.bi = param(rngs, (F,), ("mlp",), cfg, init="zeros") if bias else None
        self.bo = param(rngs, (D,), ("embed",), cfg, init="zeros") if bias else None
        # a gated MLP's biases are on all three matrices (Qwen2.5-VL's image tower)
        self.bi_gate = param(rngs, (F,), ("mlp",), cfg, init="zeros") if bias and cfg.gated else None

    def __call__(self, x: Array, key: Array | None = None) -> Array:
        dt = self.dtype
        # LoRA dropout keys of wi, wi_gate, wo: derived, so the hidden dropout keeps using ``key`` itself
        lora_keys = [None] * 3 if key is None else [jax.random.fold_in(key, 1000 + i) for i in range(3)]
        # linear: "BTD,DF->BTF" with a faster weight gradient on CPU
        h = project(self, "wi", x, "BTD,DF->BTF", dt, key=lora_keys[0], dense=linear)
        if self.bi is not None:
            h = h + self.bi[...].astype(dt)
        g = None if self.wi_gate is None else project(self, "wi_gate", x, "BTD,DF->BTF", dt, key=lora_keys[1],
                                                      dense=linear)
        if self.bi_gate is not None:
            g = g + self.bi_gate[...].astype(dt)
        h = self.unit(g, h)
        h = checkpoint_name(dropout(h, self.dropout_rate, key), "mlp")
        y = project(self, "wo", h, "BTF,FD->BTD", dt, key=lora_keys[2], dense=linear)
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


def route(cfg: ModelConfig, logits: Array, bias: Array | None, hashed: Array | None = None) -> Routing:
    """Choose each token's experts from router logits [B, T, E], in float32, as the reference models do.

    Scores are a softmax over experts (Mixtral, DeepSeek-V2) or a sigmoid per expert (DeepSeek-V3).
    Selection may add a per-expert ``bias`` (V3's balancing; the weights still come from the scores)
    and may first keep the best ``router_topk_groups`` of ``router_groups`` groups (a group's score is
    its best expert, V2; or the sum of its best two, V3 and Mistral 4: ``Experts.group_score``). The k chosen
    scores are optionally divided by their sum, then scaled by ``routed_scaling``. DeepSeek-V4 scores by
    sqrt(softplus(logit)), and its hash layers take the experts ``hashed`` [B, T, k] (by token id) as given.
    """
    E, k = cfg.experts.count, cfg.experts.per_token
    logits = logits.astype(jnp.float32)
    if cfg.experts.router_score == "sparsemixer":  # (its balancing loss reads the plain softmax, as PhiMoE's does)
        experts, weights = sparsemixer(logits, cfg.experts.jitter_eps)
        return Routing(experts, weights * cfg.experts.routed_scaling, jax.nn.softmax(logits, axis=-1))
    score = cfg.experts.router_score
    scores = (jax.nn.softmax(logits, axis=-1) if score == "softmax" else
              jnp.sqrt(jax.nn.softplus(logits)) if score == "sqrtsoftplus" else jax.nn.sigmoid(logits))
    if hashed is not None:  # DeepSeek-V4's hash layers: the experts come from the token's row of a fixed table
        return _weighted(cfg, scores, hashed)
    choice = scores if bias is None else scores + bias.astype(jnp.float32)
    if cfg.experts.router_groups > 1:
        grouped = choice.reshape(*choice.shape[:-1], cfg.experts.router_groups, E // cfg.experts.router_groups)
        if cfg.experts.group_score == "best":
            group_score = jnp.max(grouped, axis=-1)
        else:
            group_score = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)
        _, best_groups = jax.lax.top_k(group_score, cfg.experts.router_topk_groups)
        keep = jnp.sum(jax.nn.one_hot(best_groups, cfg.experts.router_groups, dtype=bool), axis=-2, dtype=bool)
        choice = jnp.where(keep[..., None], grouped, -jnp.inf).reshape(choice.shape)
    _, experts = jax.lax.top_k(choice, k)
    return _weighted(cfg, scores, experts)


def _weighted(cfg: ModelConfig, scores: Array, experts: Array) -> Routing:
    """The routing of tokens to ``experts`` [B, T, k], weighted by their scores (over their sum, when normalized)."""
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    if cfg.experts.normalize_weights:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return Routing(experts, weights * cfg.experts.routed_scaling, scores)


def sparsemixer(logits: Array, eps: float) -> tuple[Array, Array]:
    """PhiMoE's two experts per token from router logits [..., E] (SparseMixer, Liu et al. 2024) as transformers
    evaluates them: the best expert, weighted by its share of a softmax over the experts whose logits lie near the
    best, (best - logit) / max(|logit|, best) <= 2 ``eps``; then the best of the others the same way, the first
    left out. Returns the experts [..., 2] and their weights [..., 2]. (Training samples each pick instead, with
    Gumbel noise, and rescales its gradient by Heun's third-order rule: not modelled, so a fine-tune routes as
    evaluation does, with the plain gradient of these weights.)"""

    def pick(scores: Array) -> tuple[Array, Array]:
        best = jnp.max(scores, axis=-1, keepdims=True)
        chosen = jnp.argmax(scores, axis=-1)[..., None]
        # measured against the unmasked logits in both picks, as transformers does
        far = jax.lax.stop_gradient((best - logits) / jnp.maximum(jnp.abs(logits), best) > 2 * eps)
        gates = jax.nn.softmax(jnp.where(far, -jnp.inf, scores), axis=-1)
        return chosen, jnp.take_along_axis(gates, chosen, axis=-1)

    first, first_weight = pick(logits)
    taken = jax.nn.one_hot(first[..., 0], logits.shape[-1], dtype=bool)
    second, second_weight = pick(jnp.where(taken, -jnp.inf, logits))
    return jnp.concatenate([first, second], axis=-1), jnp.concatenate([first_weight, second_weight], axis=-1)


# Rows per block of the grouped dispatch: large enough that each block's matmuls run near peak, small
# enough that padding every expert's rows to a whole block (at most E x (rows - 1)) stays cheap.
MAX_BLOCK_ROWS = 128


def block_rows(pairs: int, experts: int) -> int:
    """Rows per block for ``pairs`` token-expert pairs over ``experts``: the mean rows per expert, as a
    power of two in [8, MAX_BLOCK_ROWS] (a decode step with a few tokens gets small blocks)."""
    mean = max(pairs // experts, 1)
    return int(min(MAX_BLOCK_ROWS, max(8, 1 << (mean - 1).bit_length())))


class BlockLayout(NamedTuple):
    """The token-expert pairs sorted by expert into blocks of equal rows, each block one expert's: pair
    ``a`` sits at row ``slot[a]`` of the [blocks x rows] buffer, buffer row ``r`` holds token
    ``token[r]`` (``tokens``, one past the last, for padding), ``expert[i]`` owns block ``i``, and the
    first ``used`` blocks hold every pair (the rest are padding, skipped)."""

    slot: Array
    token: Array
    expert: Array
    used: Array


def block_layout(flat_experts: Array, k: int, num_experts: int, rows: int, empty_rows: bool = False) -> BlockLayout:
    """With ``empty_rows``, expert id ``num_experts`` marks a row that goes to no expert (the all-to-all's
    padding): such rows sort into blocks after the last expert's, past ``used``, and their output is zero."""
    pairs = flat_experts.shape[0]
    groups = num_experts + empty_rows
    blocks = -(-(pairs + groups * (rows - 1)) // rows)  # every expert's last block may be partly empty
    order = jnp.argsort(flat_experts, stable=True)
    sizes = jnp.bincount(flat_experts, length=groups)
    padded = (sizes + rows - 1) // rows * rows
    padded_end = jnp.cumsum(padded)
    sorted_experts = flat_experts[order]
    rank = jnp.arange(pairs) - (jnp.cumsum(sizes) - sizes)[sorted_experts]  # place within its expert's rows
    slot = jnp.zeros(pairs, jnp.int32).at[order].set((padded_end - padded)[sorted_experts] + rank, unique_indices=True)
    token = jnp.full(blocks * rows, pairs // k, jnp.int32).at[slot].set(jnp.arange(pairs) // k, unique_indices=True)
    expert = jnp.searchsorted(padded_end, jnp.arange(blocks) * rows, side="right")
    return BlockLayout(slot, token, jnp.minimum(expert, num_experts - 1).astype(jnp.int32),
                       padded_end[num_experts - 1] // rows)


class ExpertWeights(NamedTuple):
    """Every routed expert's weights, stacked: wi, wi_gate (None when not gated) [E, D, F], wo [E, F, D], and
    gpt-oss's biases (None where the experts have none): bi, bi_gate [E, F], bo [E, D]."""

    wi: Array
    wi_gate: Array | None
    wo: Array
    bi: Array | None = None
    bi_gate: Array | None = None
    bo: Array | None = None


def _expert_ffn(unit: Unit, x, wi, wg, wo, bi, bg):
    """One expert on rows x [R, D] (its output bias is added by the caller, once per token-expert pair):
    the output and its pre-activations (g, h) for the backward pass."""
    h = x @ wi if bi is None else x @ wi + bi
    g = (x @ wg if bg is None else x @ wg + bg) if unit.gated else h
    return unit(g, h) @ wo, g, h


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def expert_blocks(unit: Unit, xs: Array, expert: Array, used: Array, wi: Array, wg: Array, wo: Array,
                  bi: Array | None, bg: Array | None) -> Array:
    """Each block of rows xs [blocks, R, D] through its expert's FFN, one block per scan step with the
    expert's weights sliced in place; padding blocks past ``used`` are skipped. The hand-written
    backward adds each block's weight gradient into its expert's slice of a [E, ...] accumulator,
    where autodiff of the scan would add a whole [E, ...] array per block."""
    return _expert_blocks_forward(unit, xs, expert, used, wi, wg, wo, bi, bg)[0]


def _varying_like(value: Array | None, *refs: Array) -> Array | None:
    """``value`` marked as varying over every mesh axis that one of ``refs`` varies over. Inside shard_map
    (the all-to-all dispatch) a cond's two branches and a scan's carry must agree on that; outside it
    nothing varies and this returns ``value``."""
    if value is None:
        return None
    axes = set().union(*(_varying_axes(r) for r in refs)) - _varying_axes(value)
    return jax.lax.pcast(value, tuple(sorted(axes)), to="varying") if axes else value


def _summed_like(grad: Array | None, primal: Array | None) -> Array | None:
    """A weight's gradient summed over the mesh axes along which the weight is one value but its gradient
    is not (each device's rows gave a part), as autodiff's transpose of the implicit broadcast would."""
    if grad is None:
        return None
    axes = _varying_axes(grad) - _varying_axes(primal)
    return jax.lax.psum(grad, tuple(sorted(axes))) if axes else grad


def _varying_axes(x: Array) -> frozenset:
    aval = jax.typeof(x)
    if hasattr(aval, "manual_axis_type"):  # jax >= 0.9
        return frozenset(aval.manual_axis_type.varying)
    return frozenset(getattr(aval, "vma", ()))


def _at(bias: Array | None, e: Array) -> Array | None:
    return None if bias is None else bias[e]


def _expert_blocks_forward(unit, xs, expert, used, wi, wg, wo, bi, bg):
    def body(_, inputs):
        i, x, e = inputs

        def run(x):
            return _expert_ffn(unit, x, wi[e], wg[e], wo[e], _at(bi, e), _at(bg, e))

        def skip(x):
            zeros = _varying_like(jnp.zeros((x.shape[0], wi.shape[-1]), x.dtype), x, wi, wo)
            return _varying_like(jnp.zeros((x.shape[0], wo.shape[-1]), x.dtype), x, wi, wo), zeros, zeros

        return None, jax.lax.cond(i < used, run, skip, x)

    _, (ys, gs, hs) = jax.lax.scan(body, None, (jnp.arange(xs.shape[0]), xs, expert))
    return ys, (xs, gs, hs, expert, used, wi, wg, wo, bi, bg)


def _expert_blocks_backward(unit, residuals, dys):
    xs, gs, hs, expert, used, wi, wg, wo, bi, bg = residuals
    gated = unit.gated
    # (a padding row of a block has zero input but its biases' activation; its output is never read, so its
    # cotangent, and with it its share of every gradient, is zero)

    def body(grads, inputs):
        i, x, g, h, e, dy = inputs

        def run(grads):
            dwi, dwg, dwo, dbi, dbg = grads
            a, pointwise_vjp = jax.vjp(unit, g, h)
            dg, dh = pointwise_vjp(dy @ wo[e].T)
            dx = dh @ wi[e].T
            if gated:  # (ungated, g is h and the unit reads h only: dg is zero)
                dx = dx + dg @ wg[e].T
                dwg = dwg.at[e].add(x.T @ dg)
                if dbg is not None:
                    dbg = dbg.at[e].add(jnp.sum(dg, axis=0))
            if dbi is not None:
                dbi = dbi.at[e].add(jnp.sum(dh, axis=0))
            return (dwi.at[e].add(x.T @ dh), dwg, dwo.at[e].add(a.T @ dy), dbi, dbg), dx

        return jax.lax.cond(i < used, run, lambda grads: (grads, jnp.zeros_like(x)), grads)

    zeros = tuple(_varying_like(None if w is None else jnp.zeros_like(w), xs, dys, wi)
                  for w in (wi, wg, wo, bi, bg))
    (dwi, dwg, dwo, dbi, dbg), dxs = jax.lax.scan(body, zeros, (jnp.arange(xs.shape[0]), xs, gs, hs, expert, dys))
    return (dxs, None, None, _summed_like(dwi, wi), _summed_like(dwg, wg) if gated else jnp.zeros_like(wg),
            _summed_like(dwo, wo), _summed_like(dbi, bi), _summed_like(dbg, bg))


expert_blocks.defvjp(_expert_blocks_forward, _expert_blocks_backward)


def _combine(y: Array, routing: Routing, bo: Array | None, weights_on_input: bool) -> Array:
    """Each token's k expert outputs y [B, T, k, D], plus their output biases, summed with its routing weights
    (or plainly summed, when the weights scaled the experts' inputs instead)."""
    if bo is not None:
        y = y + bo[routing.experts].astype(y.dtype)
    if weights_on_input:
        return jnp.sum(y, axis=2)
    return jnp.einsum("BTkD,BTk->BTD", y, routing.weights.astype(y.dtype))


def grouped_experts(x: Array, routing: Routing, weights: ExpertWeights, unit: Unit,
                    weights_on_input: bool = False) -> Array:
    """Dropless dispatch: only the chosen experts run. The B*T*k token-expert pairs are sorted by
    expert into blocks of equal rows (``block_layout``; each expert's rows padded to whole blocks), the
    blocks run through their experts (``expert_blocks``), and each token sums its k results with its
    routing weights. FLOPs are the routed experts' plus the padding rows, at most E x (rows - 1).

    On GPU and TPU the sorted pairs go to ``jax.lax.ragged_dot`` instead (``ragged_experts``), which
    lowers to grouped matmul kernels there. XLA's CPU backend has no such kernel: it lowers ragged_dot to
    one dense matmul over all experts with the other experts' rows masked (E times the FLOPs; measured
    no faster than ``dense_experts``), so on CPU the grouping is done here, with plain matmuls.

    ``weights_on_input`` (Llama 4): each pair's routing weight multiplies the token's row before its expert
    runs, and the k outputs are summed.
    """
    if jax.default_backend() != "cpu":
        return ragged_experts(x, routing, weights, unit, weights_on_input)
    B, T, D = x.shape
    k, E = routing.experts.shape[-1], weights.wi.shape[0]
    y = _pairs_through_blocks(x.reshape(B * T, D), routing.experts.reshape(-1), k, block_rows(B * T * k, E),
                              weights, unit, routing.weights.reshape(-1) if weights_on_input else None)
    return _combine(y.reshape(B, T, k, D), routing, weights.bo, weights_on_input)


def _pairs_through_blocks(rows: Array, pair_experts: Array, k: int, block: int, w: ExpertWeights, unit: Unit,
                          pair_scale: Array | None = None, empty_rows: bool = False) -> Array:
    """Pair a, row ``rows[a // k]`` for expert ``pair_experts[a]``, through its expert: the pairs sorted into
    blocks of ``block`` rows (``block_layout``), the blocks run (``expert_blocks``), the outputs [pairs, D]
    back in pair order. ``pair_scale`` multiplies each pair's row first (Llama 4); ``empty_rows``: expert id
    E marks a row for no expert, whose output is zero."""
    D = rows.shape[-1]
    layout = block_layout(pair_experts, k, w.wi.shape[0], block, empty_rows)
    xs = jnp.take(rows, layout.token, axis=0, mode="fill", fill_value=0)
    if pair_scale is not None:  # row slot[a] holds pair a; padding rows keep weight 0 (and input 0)
        scale = jnp.zeros(xs.shape[0], jnp.float32).at[layout.slot].set(pair_scale)
        xs = xs * scale[:, None].astype(xs.dtype)
    ys = expert_blocks(unit, xs.reshape(-1, block, D), layout.expert, layout.used, w.wi,
                       w.wi_gate if unit.gated else w.wi, w.wo, w.bi, w.bi_gate if unit.gated else None)
    return ys.reshape(-1, D)[layout.slot]


def exchanged_experts(x: Array, routing: Routing, weights: ExpertWeights, unit: Unit,
                      weights_on_input: bool = False) -> Array:
    """Expert parallelism with an all-to-all: ``grouped_experts`` with the token-expert pairs sent to the
    devices that hold their experts and the results sent back, in ``shard_map`` over the mesh in context.

    Each device holds E/n experts (n the ``expert`` axis) and its own rows of the batch (split over
    data x fsdp x expert; tokens over ``sequence`` under context parallelism). It sorts its B*T*k pairs by
    the device owning their expert into one chunk per device, exchanges the chunks (``all_to_all``), runs
    what it received through its experts in blocks, and exchanges the results back, each to the row it came
    from; the pairs are then combined as on one device. Dropless: a chunk holds every pair a device could
    send to one other, B*T*min(k, E/n) rows (a token's k experts are distinct), so an all_to_all of fixed
    shapes moves that worst case; rows past the real pairs are marked as going to no expert and skipped by
    the blocks. The weights enter split only along ``expert`` (an FSDP or tensor split of them is gathered
    at the boundary), and their gradients are summed over the devices that shared them.
    """
    n, E, D = axis_size("expert"), weights.wi.shape[0], x.shape[-1]
    local_experts = E // n
    sequence = axis_size("sequence")
    tokens = P(BATCH_AXES, "sequence" if sequence > 1 and x.shape[1] % sequence == 0 else None)

    def exchange(x, experts, pair_weights, w):
        b, t, k = experts.shape
        pairs = b * t * k
        flat = experts.reshape(-1)
        owner, expert = flat // local_experts, flat % local_experts
        chunk = b * t * min(k, local_experts)
        # pair a goes to row rank[a] of chunk owner[a]: its place among the pairs bound for that device
        rank = jnp.take_along_axis(jnp.cumsum(jax.nn.one_hot(owner, n, dtype=jnp.int32), axis=0),
                                   owner[:, None], axis=1)[:, 0] - 1
        pair_at = jnp.full((n, chunk), pairs, jnp.int32).at[owner, rank].set(jnp.arange(pairs), unique_indices=True)
        rows = jnp.take(x.reshape(b * t, D), pair_at // k, axis=0, mode="fill", fill_value=0)
        if weights_on_input:  # padding rows take weight 0 (and are zero already)
            weight = jnp.take(pair_weights.reshape(-1), pair_at, mode="fill", fill_value=0)
            rows = rows * weight[..., None].astype(rows.dtype)
        row_expert = jnp.take(expert, pair_at, mode="fill", fill_value=local_experts)
        received = jax.lax.all_to_all(rows, "expert", 0, 0, tiled=True).reshape(n * chunk, D)
        received_expert = jax.lax.all_to_all(row_expert, "expert", 0, 0, tiled=True).reshape(-1)
        ys = _pairs_through_blocks(received, received_expert, 1, block_rows(pairs, local_experts), w, unit,
                                   empty_rows=True)
        if w.bo is not None:  # each pair's output bias, here where its expert's bias is
            real = received_expert < local_experts
            bias = w.bo[jnp.minimum(received_expert, local_experts - 1)]
            ys = ys + jnp.where(real[:, None], bias, 0).astype(ys.dtype)
        returned = jax.lax.all_to_all(ys.reshape(n, chunk, D), "expert", 0, 0, tiled=True)
        y = returned[owner, rank].reshape(b, t, k, D)
        return _combine(y, Routing(experts, pair_weights, None), None, weights_on_input)

    def split(array):  # a weight's spec: its expert axis over the devices, the rest whole
        return None if array is None else P("expert", *([None] * (array.ndim - 1)))

    return jax.shard_map(exchange, mesh=jax.sharding.get_abstract_mesh(),
                         in_specs=(P(*tokens, None), tokens, tokens, jax.tree.map(split, weights)),
                         out_specs=P(*tokens, None))(x, routing.experts, routing.weights, weights)


def ragged_experts(x: Array, routing: Routing, weights: ExpertWeights, unit: Unit,
                   weights_on_input: bool = False) -> Array:
    """``grouped_experts`` through ``jax.lax.ragged_dot`` (GPU and TPU): the pairs sorted by expert, one
    ragged matmul per weight over the contiguous groups, unsorted and weighted."""
    B, T, D = x.shape
    k, E = routing.experts.shape[-1], weights.wi.shape[0]
    flat_experts = routing.experts.reshape(-1)
    order = jnp.argsort(flat_experts, stable=True)  # sorted pair j is pair order[j]
    group_sizes = jnp.bincount(flat_experts, length=E).astype(jnp.int32)
    rows = x.reshape(B * T, D)[order // k]
    if weights_on_input:
        rows = rows * routing.weights.reshape(-1)[order][:, None].astype(rows.dtype)
    row_expert = flat_experts[order]

    def biased(y, bias):
        return y if bias is None else y + bias[row_expert].astype(y.dtype)

    h = biased(jax.lax.ragged_dot(rows, weights.wi, group_sizes), weights.bi)
    g = biased(jax.lax.ragged_dot(rows, weights.wi_gate, group_sizes), weights.bi_gate) if unit.gated else None
    y = jax.lax.ragged_dot(checkpoint_name(unit(g, h), "mlp"), weights.wo, group_sizes)
    return _combine(y[jnp.argsort(order)].reshape(B, T, k, D), routing, weights.bo, weights_on_input)


def dense_experts(x: Array, routing: Routing, weights: ExpertWeights, unit: Unit,
                  weights_on_input: bool = False) -> Array:
    """Every expert on every token, combined with the routing weights (zero for experts not chosen):
    E/k times the FLOPs of the grouped dispatch, without its sort and gathers."""
    w, E = weights, weights.wi.shape[0]
    chosen = jax.nn.one_hot(routing.experts, E, dtype=jnp.float32)
    weighted = jnp.einsum("BTk,BTkE->BTE", routing.weights, chosen)
    # the weights scale the outputs, or (Llama 4) the inputs, a chosen expert's output then counting as it is
    combine = jnp.sum(chosen, axis=-2) if weights_on_input else weighted

    def up(kernel, bias):
        if weights_on_input:  # each expert reads the token times its weight (zero where not chosen)
            y = jnp.einsum("BTD,BTE,EDF->BTEF", x, weighted.astype(x.dtype), kernel)
        else:
            y = jnp.einsum("BTD,EDF->BTEF", x, kernel)
        return y if bias is None else y + bias.astype(y.dtype)


    h = up(w.wi, w.bi)
    g = up(w.wi_gate, w.bi_gate) if unit.gated else None
    y = jnp.einsum("BTEF,EFD,BTE->BTD", checkpoint_name(unit(g, h), "mlp"), w.wo, combine.astype(x.dtype))
    return y if w.bo is None else y + jnp.einsum("BTE,ED->BTD", combine.astype(x.dtype), w.bo.astype(x.dtype))


def use_grouped_dispatch(cfg: ModelConfig) -> bool:
    """``moe_dispatch`` 'auto': the grouped dispatch unless every expert is chosen anyway."""
    if cfg.experts.dispatch != "auto":
        return cfg.experts.dispatch in ("grouped", "all_to_all")
    return cfg.experts.per_token < cfg.experts.count


def expert_dispatch(cfg: ModelConfig, batch: int):
    """The dispatch for a batch of ``batch`` rows: under a mesh with an ``expert`` axis the grouped dispatch
    exchanges tokens with an all-to-all (``exchanged_experts``; 'grouped' leaves the partitioning of
    ``grouped_experts`` to GSPMD instead, for comparison) when the rows split over the batch axes."""
    if not use_grouped_dispatch(cfg):
        return dense_experts
    rows_split = batch % math.prod(axis_size(axis) for axis in BATCH_AXES) == 0
    # (under a ``stage`` axis the MoE layers run inside the pipeline's vmap over stages, where the exchange's
    # shard_map does not yet trace: GSPMD partitions the grouped dispatch there)
    if cfg.experts.dispatch != "grouped" and axis_size("expert") > 1 and rows_split and axis_size("stage") == 1:
        return exchanged_experts
    return grouped_experts


class MoE(nnx.Module):
    """A top-k mixture of gated experts (Mixtral), with DeepSeekMoE's options (always-on shared experts,
    grouped and biased routing: ``route``), gpt-oss's biased experts and router, and Llama 4's routing
    weights on the experts' inputs. Only the chosen experts run (``grouped_experts``) unless the config
    asks for the dense all-experts form.

    Returns the output and the router statistics of this layer (``router_statistics``), from which the
    balancing losses and the per-expert load logs are computed.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, hashed: bool = False):
        E, D, F = cfg.experts.count, cfg.d_model, cfg.expert_width
        self.config, self.dtype = cfg, dtype_of(cfg.dtype)
        self.router = param(rngs, (D, E), ("embed", "experts"), cfg)
        # Moved between steps by the balancing rule (train.router_bias_rate), never by gradients.
        self.router_bias = (RouterBias(jnp.zeros((E,), dtype_of(cfg.param_dtype)), axes=("experts",))
                            if cfg.experts.router_bias and not hashed else None)
        # DeepSeek-V4's hash layers: each token id's k experts, a fixed table of the checkpoint (never trained)
        self.hash_table = (Buffer(jnp.zeros((cfg.vocab_size, cfg.experts.per_token), jnp.int32),
                                  axes=("vocab", "experts_per_token")) if hashed else None)
        # Expert kernels are read whole by the dispatch (dequantized, LoRA merged per expert: ``kernel``).
        projection(self, "wi", cfg, rngs, (E, D, F), ("experts", "embed", "mlp"), batch=1, role="experts")
        if cfg.gated:
            projection(self, "wi_gate", cfg, rngs, (E, D, F), ("experts", "embed", "mlp"), batch=1, role="experts")
        else:
            self.wi_gate = None
        projection(self, "wo", cfg, rngs, (E, F, D), ("experts", "mlp", "embed"), batch=1, role="experts")
        # gpt-oss: biases on every expert's projections and on the router's logits
        bias = lambda shape, axes, present=True: (  # noqa: E731
            param(rngs, shape, axes, cfg, init="zeros") if cfg.experts.bias and present else None)
        self.bi, self.bi_gate = bias((E, F), ("experts", "mlp")), bias((E, F), ("experts", "mlp"), cfg.gated)
        self.bo = bias((E, D), ("experts", "embed"))
        self.router_logit_bias = (param(rngs, (E,), ("experts",), cfg, init="zeros") if cfg.experts.router_logit_bias
                                  else None)
        self.unit = Unit.of(cfg)
        self.shared = (MLP(cfg, rngs=rngs, width=cfg.experts.shared * F, bias=False, role="shared_experts")
                       if cfg.experts.shared else None)
        # Qwen2-MoE: how much of the shared experts' output each token takes, sigmoid(x . w)
        self.shared_gate = param(rngs, (D,), ("embed",), cfg) if cfg.experts.shared_gate else None
        # Gemma 4: the router's input normed and scaled per channel (``router_norm``), the chosen weights per expert
        # (``expert_scale``); both start at one, as transformers starts them
        self.norm_eps = cfg.norms.eps
        self.router_scale = param(rngs, (D,), ("embed",), cfg, init="ones") if cfg.experts.router_norm else None
        self.expert_scale = param(rngs, (E,), ("experts",), cfg, init="ones") if cfg.experts.expert_scale else None

    def __call__(self, x: Array, token_mask: Array | None = None, router_input: Array | None = None,
                 token_ids: Array | None = None) -> tuple[Array, dict[str, Array]]:
        """The experts on ``x`` [B, T, D], routed by ``router_input`` (Gemma 4's: the layer's unnormed input; None:
        ``x``); a hash layer looks its experts up by ``token_ids`` [B, T]."""
        cfg, dt = self.config, self.dtype
        # The router runs in float32, weights and activations alike (transformers keeps it there).
        h = (x if router_input is None else router_input).astype(jnp.float32)
        if self.router_scale is not None:  # RMSNorm(h) * scale / sqrt(D), in transformers' order
            h = normalize(h, jnp.ones(h.shape[-1:], jnp.float32), None, "rmsnorm", self.norm_eps)
            h = h * self.router_scale[...].astype(jnp.float32) * h.shape[-1] ** -0.5
        logits = jnp.einsum("BTD,DE->BTE", h, self.router[...].astype(jnp.float32))
        if self.router_logit_bias is not None:
            logits = logits + self.router_logit_bias[...].astype(jnp.float32)
        bias = None if self.router_bias is None else jax.lax.stop_gradient(self.router_bias[...])
        hashed = None
        if self.hash_table is not None:
            if token_ids is None:
                raise ValueError("a hash-routed expert layer (hash_layers) picks experts by token id: it needs the "
                                 "input ids, not embeddings alone")
            hashed = jnp.take(self.hash_table[...], token_ids, axis=0)
        routing = route(cfg, logits, bias, hashed)
        if self.expert_scale is not None:
            scale = jnp.take(self.expert_scale[...].astype(jnp.float32), routing.experts)
            routing = routing._replace(weights=routing.weights * scale)
        value = lambda p: None if p is None else p[...].astype(dt)  # noqa: E731
        weights = ExpertWeights(kernel(self, "wi", dt, batch=1),
                                None if self.wi_gate is None else kernel(self, "wi_gate", dt, batch=1),
                                kernel(self, "wo", dt, batch=1), value(self.bi), value(self.bi_gate), value(self.bo))
        y = expert_dispatch(cfg, x.shape[0])(x, routing, weights, self.unit, cfg.experts.weights_on_input)
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:
                gate = jax.nn.sigmoid(jnp.einsum("BTD,D->BT", x, self.shared_gate[...].astype(x.dtype)))
                shared = shared * gate[..., None]
            y = y + shared
        return y, router_statistics(cfg, routing, token_mask)


def router_statistics(cfg: ModelConfig, routing: Routing, token_mask: Array | None) -> dict[str, Array]:
    """One layer's load figures over the real tokens (``token_mask`` [B, T]; None: all):
    ``load`` [E], the share of the token-expert assignments each expert received (sums to 1);
    ``prob`` [E], the mean routing probability (sigmoid scores normalized per token);
    ``sequence_loss`` [], DeepSeek-V3's sequence-wise balance term, averaged over rows."""
    E, k = cfg.experts.count, cfg.experts.per_token
    B, T = routing.experts.shape[:2]
    w = jnp.ones((B, T), jnp.float32) if token_mask is None else token_mask.astype(jnp.float32)
    chosen = jnp.sum(jax.nn.one_hot(routing.experts, E, dtype=jnp.float32), axis=-2)  # [B, T, E]
    probs = routing.scores
    if cfg.experts.router_score == "sigmoid":
        probs = probs / (jnp.sum(probs, axis=-1, keepdims=True) + 1e-20)
    row_tokens = jnp.sum(w, axis=1)  # [B]
    row_counts = jnp.einsum("BT,BTE->BE", w, chosen)  # pairs per row and expert
    row_probs = jnp.einsum("BT,BTE->BE", w, probs)
    per_row = jnp.maximum(row_tokens, 1.0)[:, None]
    has_tokens = row_tokens > 0
    row_terms = E * jnp.sum((row_counts / (k * per_row)) * (row_probs / per_row), axis=-1)
    sequence_loss = jnp.sum(jnp.where(has_tokens, row_terms, 0.0)) / jnp.maximum(jnp.sum(has_tokens), 1)
    total = jnp.maximum(jnp.sum(row_tokens), 1.0)
    return {"load": jnp.sum(row_counts, axis=0) / (k * total), "prob": jnp.sum(row_probs, axis=0) / total,
            "sequence_loss": sequence_loss}


def pooled_router_statistics(stats: dict[str, Array], token_mask: Array) -> dict[str, Array]:
    """``router_statistics`` of M microbatches (leaves [M, L, ...]; ``token_mask`` [M, rows, T]: which tokens
    were real) as those of the whole batch: ``load`` and ``prob`` weighted by each microbatch's real tokens,
    ``sequence_loss`` by its rows that hold any. Exact: each is a sum over tokens (or rows) divided by their
    count, and a microbatch without any contributes zero either way."""
    if set(stats) != {"load", "prob", "sequence_loss"}:
        raise ValueError(f"router statistics {sorted(stats)}: only load, prob and sequence_loss can be pooled")
    w = token_mask.astype(jnp.float32)
    tokens, rows = jnp.sum(w, axis=(1, 2)), jnp.sum(jnp.any(w > 0, axis=2), axis=1).astype(jnp.float32)

    def pooled(values: Array, weights: Array) -> Array:
        weights = weights.reshape(-1, *[1] * (values.ndim - 1))
        return jnp.sum(values * weights, axis=0) / jnp.maximum(jnp.sum(weights), 1.0)

    return {"load": pooled(stats["load"], tokens), "prob": pooled(stats["prob"], tokens),
            "sequence_loss": pooled(stats["sequence_loss"], rows)}


def load_balancing_loss(stats: dict[str, Array], cfg: ModelConfig) -> Array:
    """The balancing loss of per-layer stats ([L, ...] each), not yet times ``router_aux_loss_coef``.
    batch: Switch/Mixtral's E * sum_e f_e * p_e, f_e the fraction of tokens routed to e (summing to k)
    and p_e its mean probability, each averaged over layers; sequence: DeepSeek-V3's per-row term,
    summed over layers."""
    if cfg.experts.aux_loss == "sequence":
        return jnp.sum(stats["sequence_loss"])
    token_fraction = cfg.experts.per_token * jnp.mean(stats["load"], axis=0)
    router_prob = jnp.mean(stats["prob"], axis=0)
    return cfg.experts.count * jnp.sum(token_fraction * router_prob)
