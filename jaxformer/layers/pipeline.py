"""Pipeline parallelism: a stack's layers split into stages over the ``stage`` mesh axis, microbatches
flowing through them.

The whole schedule is one jitted program (GSPMD, as MaxText builds it): the stacked parameters [L, ...]
are viewed as [S, R, L / (S R), ...] chunks, stage s holding chunks (r, s) for every repeat r; a buffer
[S, rows, ...] holds each stage's current microbatch. One iteration runs every stage at once (``jax.vmap``
over the stage axis, which the mesh splits, so each device computes its own stage) and then shifts the
buffer one stage on (``jnp.roll`` of a stage-split array: a collective permute). The layer code is the
stack's own: a stage runs its chunk through ``run_layers`` (the runner every stack uses, over the plan of the
chunk's layers) with the masks of the microbatch it holds.

Schedules. GPipe (R = 1): microbatch m enters stage 0 at iteration m and leaves stage S - 1 at m + S - 1;
M + S - 1 iterations in all. Circular (R > 1, "interleaved"): each stage holds R chunks of L / (S R)
layers, chunk (r, s) the layers of virtual stage r S + s, and a microbatch circles the ring R times. The
microbatches go round in groups of S (a group's S microbatches fill the ring exactly; M must be a multiple
of S), so stage 0's k-th visit is repeat (k // S) % R of microbatch (k // (S R)) S + k % S; M R + S - 1
iterations, each a chunk R times smaller. The bubble, the share of a stage's iterations without work, is
(S - 1) / (M R + S - 1): more microbatches or more repeats shrink it.

Costs to know: every iteration computes every stage, the bubble's too (on inputs that are real rows, whose
results are dropped), as an SPMD program must; the circular schedule's chunks interleave layers across
stages while checkpoints keep layer order, so under R > 1 each step moves the (R - 1) / R of a stage's
parameters that lie elsewhere into place, and their gradients back (XLA sends them by collective permutes).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxformer.sharding import BATCH_AXES, axis_size

Array = jax.Array


def schedule(stages: int, repeats: int, microbatches: int) -> tuple[int, float]:
    """(iterations of the schedule, its ideal bubble fraction (S - 1) / (M R + S - 1))."""
    iterations = microbatches * repeats + stages - 1
    return iterations, (stages - 1) / iterations


def check_schedule(num_layers: int, rows: int, stages: int, repeats: int, microbatches: int,
                   what: str = "the stack") -> None:
    """A ValueError, before anything runs, for a schedule that cannot split these layers and rows."""
    if repeats < 1 or microbatches < 1:
        raise ValueError(f"a pipeline needs repeats >= 1 and microbatches >= 1; got {repeats} and {microbatches}")
    if num_layers % (stages * repeats):
        raise ValueError(f"{what} has {num_layers} layers, which do not split into mesh.stage={stages} stages x "
                         f"{repeats} repeats (train.pipeline_repeats) of whole chunks")
    if rows % microbatches:
        raise ValueError(f"{rows} rows do not split into {microbatches} microbatches (train.microbatches)")
    if repeats > 1 and microbatches % stages:
        raise ValueError(f"the circular schedule (pipeline_repeats={repeats}) sends microbatches round the ring in "
                         f"groups of mesh.stage={stages}: train.microbatches={microbatches} must be a multiple")


def run_pipeline(params: Any, x: Array, rows: Any, stage_fn: Callable, *, repeats: int,
                 microbatches: int) -> tuple[Array, Any]:
    """x [B, T, D] through the stacked layers ``params`` (leaves [L, ...]) in a pipeline over the ``stage``
    mesh axis of the mesh in context.

    ``rows``: a pytree of per-row inputs (leaves [B, ...]: positions, masks' sources, an encoder output),
    cut into microbatches like x. ``stage_fn(chunk, h, rows_mb, microbatch, virtual_stage)`` runs one chunk
    (``params`` leaves [L / (S R), ...]) over h [B / M, T, D] and returns (h, per-layer outputs, leaves
    [L / (S R), ...], or None): ``virtual_stage`` r S + s says which layers they are, ``microbatch`` which
    rows. Returns the stack's output [B, T, D], in the rows' order, and the per-layer outputs of each
    microbatch, leaves [M, L, ...] (MoE layers' router statistics)."""
    S, R, M = axis_size("stage"), repeats, microbatches
    L = jax.tree.leaves(params)[0].shape[0]
    per_chunk, visits = L // (S * R), M * R
    check_schedule(L, x.shape[0], S, R, M)

    def by_stage(a: Array) -> Array:  # [L, ...] -> [S, R, L / (S R), ...], the stage axis split over devices
        chunked = jnp.swapaxes(a.reshape(R, S, per_chunk, *a.shape[1:]), 0, 1)
        return jax.lax.with_sharding_constraint(chunked, P("stage", *[P.UNCONSTRAINED] * (chunked.ndim - 1)))

    def split_rows(a: Array) -> Array:
        return a.reshape(M, a.shape[0] // M, *a.shape[1:])

    def on_stages(a: Array) -> Array:  # [S, rows, ...]: a stage's rows on its devices, split over the batch axes
        return jax.lax.with_sharding_constraint(a, P("stage", BATCH_AXES, *[None] * (a.ndim - 2)))

    chunks = jax.tree.map(by_stage, params)
    inputs, rows = split_rows(x), jax.tree.map(split_rows, rows)
    stage_index = jnp.arange(S)

    def work(t: Array) -> tuple[Array, Array, Array]:
        """Per stage at iteration t: its microbatch, its repeat, and whether it has work (not the bubble)."""
        visit = t - stage_index
        busy = (visit >= 0) & (visit < visits)
        visit = jnp.clip(visit, 0, visits - 1)
        if R == 1:
            return visit, jnp.zeros_like(visit), busy
        return (visit // (S * R)) * S + visit % S, (visit // S) % R, busy

    def one_stage(stage_chunks, h, stage_rows, microbatch, repeat, stage):
        chunk = jax.tree.map(lambda a: a[repeat], stage_chunks)
        return stage_fn(chunk, h, stage_rows, microbatch, repeat * S + stage)

    stages = jax.vmap(one_stage, spmd_axis_name="stage")

    def iteration(carry, t):
        buffer, outputs, per_layer = carry
        microbatch, repeat, busy = work(t)
        # stage 0 takes a new microbatch on its first repeat; on later ones, what the last stage passed it
        buffer = buffer.at[0].set(jnp.where(repeat[0] == 0, inputs[microbatch[0]], buffer[0]))
        stage_rows = jax.tree.map(lambda a: on_stages(a[microbatch]), rows)
        out, layer_outs = stages(chunks, on_stages(buffer), stage_rows, microbatch, repeat, stage_index)
        out = on_stages(out)
        finished = busy[-1] & (repeat[-1] == R - 1)
        last = microbatch[-1]
        outputs = outputs.at[last].set(jnp.where(finished, out[-1], outputs[last]))
        # each busy stage's per-layer outputs land at (its microbatch, its virtual stage); the bubble's are dropped
        virtual = jnp.where(busy, repeat * S + stage_index, S * R)  # out of bounds: dropped
        per_layer = jax.tree.map(lambda kept, new: kept.at[microbatch, virtual].set(new, mode="drop"),
                                 per_layer, layer_outs)
        return (jnp.roll(out, 1, axis=0), outputs, per_layer), None

    # every stage starts on real rows (the first microbatch), so the bubble's dropped work is finite
    buffer = on_stages(jnp.broadcast_to(inputs[0], (S, *inputs.shape[1:])))
    first = jnp.zeros(S, jnp.int32)
    shapes = jax.eval_shape(stages, chunks, buffer, jax.tree.map(lambda a: a[first], rows), first,
                            first, stage_index)[1]
    per_layer = jax.tree.map(lambda a: jnp.zeros((M, S * R, *a.shape[1:]), a.dtype), shapes)
    iterations, _ = schedule(S, R, M)
    (_, outputs, per_layer), _ = jax.lax.scan(iteration, (buffer, jnp.zeros_like(inputs), per_layer),
                                              jnp.arange(iterations))
    # [M, S R, L / (S R), ...] -> [M, L, ...]: virtual stage v holds layers v L / (S R) onwards
    per_layer = jax.tree.map(lambda a: a.reshape(M, L, *a.shape[3:]), per_layer)
    return outputs.reshape(x.shape), per_layer
