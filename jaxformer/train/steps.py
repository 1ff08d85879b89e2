"""The optimizer and the pure steps of a run: ``train_step(state, batch) -> (state, metrics)`` and the
eval step, jitted with explicit shardings (the train state donated), and the metric arithmetic.

The train state is a dict: params, opt_state, step, skipped (non-finite steps dropped) and the PRNG key;
a model with Transformer-XL's segment memory adds ``memory``, the ``cache.Memory`` of the batch rows (each
row a contiguous stream, see ``objectives.CausalLM``), carried from step to step, split along the batch
like the activations, and saved in the checkpoints with the rest.

MoE models with DeepSeek-V3's selection bias (``RouterBias``, ``router_bias=True``) balance their experts
without an auxiliary loss: the optimizer leaves the bias alone, and after each step every MoE layer's
bias moves by ``train.router_bias_rate * sign(mean load - load_e)`` (``balance_router_bias``).

A LoRA fine-tune (``finetune.lora.rank > 0``, a model with ``lora_rank``) trains only what
``jaxformer.lora.trainable`` selects (the adapters and any ``lora_trainable`` head): those are ``params``,
differentiated and seen by the optimizer; the frozen base (its float or int8 kernels, norms, embeddings)
rides along in the state as ``frozen``, an argument of the step that is never differentiated, updated or
checkpointed (the checkpoint holds a reference to it instead, see ``checkpoints``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxformer import sharding
from jaxformer.layers import IndexerParam, RouterBias
from jaxformer.layers.weights import Quantized
from jaxformer.lora import trainable, under, unmatched
from jaxformer.train.objectives import MEMORY, ROUTER_LOAD, Objective, carries_memory, ratio
from jaxformer.train.run_config import RunConfig


def decay_mask(params: nnx.State) -> nnx.State:
    """Weight decay on matrices and embeddings only: not on norms and biases (vectors per layer)."""
    return jax.tree.map(lambda v: v.replace(len([a for a in v.get_metadata()["axes"]
                                                 if a not in sharding.LAYER_AXES]) >= 2),
                        params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def make_schedule(cfg: RunConfig) -> optax.Schedule:
    o, steps = cfg.optim, cfg.train.steps
    warmup = optax.linear_schedule(0.0, o.lr, max(o.warmup_steps, 1))
    if o.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, o.lr, o.warmup_steps, steps, end_value=o.lr * 0.1)
    if o.schedule == "linear":
        return optax.join_schedules([warmup, optax.linear_schedule(o.lr, 0.0, steps - o.warmup_steps)],
                                    [o.warmup_steps])
    if o.schedule == "inverse_sqrt":  # Vaswani et al.: linear warmup to lr, then lr * sqrt(warmup / step)
        peak_at = max(o.warmup_steps, 1)
        return optax.join_schedules([warmup, lambda s: o.lr * jnp.sqrt(peak_at / jnp.maximum(s + peak_at, 1))],
                                    [o.warmup_steps])
    return optax.join_schedules([warmup, optax.constant_schedule(o.lr)], [o.warmup_steps])


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def has_router_bias(params: nnx.State) -> bool:
    return any(isinstance(v, RouterBias) for v in jax.tree.leaves(params, is_leaf=_is_variable))


# Parameters the optimizer leaves alone: DeepSeek-V3's selection bias (the balancing rule moves it) and
# DeepSeek-V3.2's indexer (no gradient of the loss reaches it; weight decay would only shrink it).
NOT_OPTIMIZED = (RouterBias, IndexerParam)


def _joined(key_path) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in key_path)


def frozen_paths(cfg: RunConfig, params: nnx.State) -> set[str]:
    """The '/'-joined paths of the parameters ``finetune.train_only`` leaves frozen (none when it is empty). A
    listed path that matches no parameter fails, naming the model's top-level modules."""
    only = cfg.finetune.train_only
    if not only:
        return set()
    paths = [_joined(kp) for kp, _ in jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_variable)]
    unknown = unmatched(only, paths)
    if unknown:
        raise ValueError(f"finetune.train_only={only}: {unknown} match no parameter path of the model (its modules: "
                         f"{', '.join(sorted({path.split('/')[0] for path in paths}))})")
    return {path for path in paths if not under(path, only)}


def without_frozen(grads: nnx.State, frozen: set[str]) -> nnx.State:
    """``grads`` with those of the ``frozen`` paths zero: constants, so XLA never computes them."""
    return jax.tree_util.tree_map_with_path(
        lambda kp, g: g.replace(jnp.zeros_like(g.get_value())) if _joined(kp) in frozen else g, grads,
        is_leaf=_is_variable)


def make_optimizer(cfg: RunConfig, params: nnx.State) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW (after global-norm clipping) on every parameter but those ``NOT_OPTIMIZED`` and those
    ``finetune.train_only`` freezes, which get no Adam moments, no weight decay and a zero update (models
    without them keep the plain AdamW state, so their checkpoints are unchanged)."""
    o = cfg.optim
    schedule = make_schedule(cfg)
    chain = [optax.clip_by_global_norm(o.clip_norm)] if o.clip_norm else []
    adamw = optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay, mask=decay_mask(params))
    frozen = frozen_paths(cfg, params)
    if frozen or any(isinstance(v, NOT_OPTIMIZED) for v in jax.tree.leaves(params, is_leaf=_is_variable)):
        # ("balanced": the label DeepSeek-V3 checkpoints written before the indexer carry in their state)
        labels = jax.tree_util.tree_map_with_path(
            lambda kp, v: v.replace("balanced" if isinstance(v, NOT_OPTIMIZED) else
                                    "frozen" if _joined(kp) in frozen else "adamw"), params, is_leaf=_is_variable)
        others = {"frozen": optax.set_to_zero()} if frozen else {}
        adamw = optax.multi_transform({"adamw": adamw, "balanced": optax.set_to_zero(), **others}, labels)
    chain.append(adamw)
    return optax.chain(*chain), schedule


def balance_router_bias(params: nnx.State, load: jax.Array, rate: float,
                        frozen: set[str] | frozenset[str] = frozenset()) -> nnx.State:
    """DeepSeek-V3's auxiliary-loss-free balancing (Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing
    Strategy for Mixture-of-Experts"): each MoE layer's selection bias rises by ``rate`` for an expert
    that got less than the mean load and falls by ``rate`` for one that got more. ``load`` [L_moe, E] is
    the step's share of routed tokens per expert; its rows follow the ``RouterBias`` leaves' layers in order.
    A bias at one of the ``frozen`` paths (``frozen_paths``) stays as it is."""
    step = rate * jnp.sign(jnp.mean(load, axis=-1, keepdims=True) - load)
    start = 0

    def move(key_path, v):
        nonlocal start
        if not isinstance(v, RouterBias):
            return v
        rows = v.shape[0]
        delta, start = step[start:start + rows], start + rows
        if _joined(key_path) in frozen:
            return v
        return v.replace(v.get_value() + delta.reshape(v.shape).astype(v.dtype))

    moved = jax.tree_util.tree_map_with_path(move, params, is_leaf=_is_variable)
    if start != load.shape[0]:
        raise ValueError(f"the router load has {load.shape[0]} MoE layers but the RouterBias parameters hold {start}")
    return moved


def router_load_metrics(load) -> dict:
    """The logged load figures of a router load [L_moe, E] (shares of the routed tokens, each row summing
    to 1): ``expert_load``, each expert's share averaged over the MoE layers (E numbers summing to 1), and
    ``max_load``, the busiest expert's load over the mean load in the worst layer (1 = perfectly balanced,
    E/k = every token chooses the same expert): the worst layer, since the busiest expert anywhere sets
    the pace and an average over layers would hide it."""
    load = np.asarray(load, np.float64)
    return {"expert_load": [round(float(x), 6) for x in load.mean(axis=0)],
            "max_load": round(float(np.max(load.max(axis=-1) / np.maximum(load.mean(axis=-1), 1e-12))), 4)}


def batch_sharding(mesh) -> NamedSharding:
    return NamedSharding(mesh, P(sharding.BATCH_AXES))


def memory_sharding(memory, mesh):
    """Where a segment memory's arrays live: split along the batch like activations (hidden [L, B, M, D]
    on axis 1, valid [B, M] on axis 0), so each device holds the memory of its own rows."""
    return dataclasses.replace(memory, hidden=NamedSharding(mesh, P(None, sharding.BATCH_AXES)),
                               valid=NamedSharding(mesh, P(sharding.BATCH_AXES)))


def empty_memory(model, batch: int, length: int | None, mesh):
    """An empty segment memory of ``length`` slots (None: the model's memory_len) for ``batch`` rows, created
    sharded (each process makes only its own shards)."""
    make = lambda: model.init_memory(batch, length)  # noqa: E731
    return jax.jit(make, out_shardings=memory_sharding(jax.eval_shape(make), mesh))()


def trained_filter(model_cfg):
    """What a run differentiates and optimizes: every parameter, or with LoRA adapters only what
    ``jaxformer.lora.trainable`` selects."""
    return trainable(model_cfg) if model_cfg.lora is not None else nnx.Param


def frozen_filter(model_cfg):
    """The frozen weights of a LoRA fine-tune: every parameter and int8 kernel that does not train."""
    return nnx.All(nnx.Any(nnx.Param, Quantized), nnx.Not(trainable(model_cfg)))


def split_model(model):
    """``(graphdef, params, rest)`` for the steps: the parameters that train, and the rest of the model's
    variables (buffers, RNG state) closed over; a LoRA model's frozen base is in neither (``init_state``
    puts it in the train state, so it is an argument of the step rather than a constant baked into it)."""
    if model.config.lora is None:
        return nnx.split(model, nnx.Param, ...)
    graphdef, params, _, rest = nnx.split(model, trained_filter(model.config), frozen_filter(model.config), ...)
    return graphdef, params, rest


def init_state(cfg: RunConfig, model, optimizer) -> dict:
    """The train state of a (sharded) model: the optimizer state takes its parameters' shardings; a model
    with segment memory starts with an empty one for every batch row; a LoRA model's frozen base is
    ``frozen`` (the optimizer never sees it)."""
    params = nnx.state(model, trained_filter(model.config))
    mesh = jax.tree.leaves(params)[0].sharding.mesh
    progress = {"step": jnp.int32(0), "skipped": jnp.int32(0), "key": jax.random.PRNGKey(cfg.run.seed)}
    state = {"params": params, "opt_state": sharding.sharded_optimizer_state(optimizer, params),
             **jax.device_put(progress, NamedSharding(mesh, P()))}
    if model.config.lora is not None:
        state["frozen"] = nnx.state(model, frozen_filter(model.config))
    if carries_memory(model.config):
        state["memory"] = empty_memory(model, cfg.train.batch_size, None, mesh)
    return state


def _merge(graphdef, rest, params, frozen=None):
    return nnx.merge(graphdef, params, rest) if frozen is None else nnx.merge(graphdef, params, frozen, rest)


def _loss_fn(graphdef, rest, objective: Objective):
    """``loss_fn(params, batch, key, memory=None, frozen=None) -> (loss, (sums, memory))``: the objective's
    loss, with the rolled-forward segment memory taken out of its sums (None for models without one).
    ``frozen`` is a LoRA model's base: read, never differentiated (the gradient is taken of ``params``)."""
    def loss_fn(params, batch, key, memory=None, frozen=None):
        model = _merge(graphdef, rest, params, frozen)
        c = model.config
        key = key if c.dropout_rate or c.attention_dropout_rate or (c.lora is not None and c.lora.dropout) else None
        if memory is None:
            loss, sums = objective.loss(model, batch, key)
            return loss, (sums, None)
        loss, sums = objective.loss(model, batch, key, memory)
        sums = dict(sums)
        return loss, (sums, sums.pop(MEMORY))

    return loss_fn


def eval_weights(state: dict):
    """What the eval step reads of a train state: its params, or a LoRA run's (params, frozen)."""
    return (state["params"], state["frozen"]) if "frozen" in state else state["params"]


def has_host_outputs(objective: Objective) -> bool:
    """Whether an objective's held-out metrics need per-row outputs on the host (span decoding, entity
    matching: metrics that are not sums). Such an objective defines two methods besides ``loss``:

    - ``eval_outputs(model, batch) -> (loss, sums, outputs)``, traced in the eval step (no dropout):
      ``loss`` and ``sums`` as ``loss`` gives them, and ``outputs`` a dict of arrays whose first axis is
      the batch's rows (e.g. argmax tags [B, T], start and end logits [B, T]);
    - ``finish_outputs(outputs) -> dict[str, float]``, on the host: ``outputs`` holds every held-out
      batch's arrays (numpy) concatenated along the rows in ``eval_batches`` order, the padding rows of
      a last short batch included; it returns more metrics (named without ``eval_``).
    """
    return callable(getattr(objective, "eval_outputs", None))


def make_eval_step(graphdef, rest, objective: Objective, mesh, params_shardings, memory_shardings=None):
    """The jitted eval step: the objective's metric sums of one batch, without dropout. Its weights are
    ``eval_weights(state)`` (``params_shardings`` theirs: a LoRA run's a (params, frozen) pair). With
    ``memory_shardings`` (a model with segment memory) it takes the rows' memory too and returns
    ``(sums, memory)``, the memory rolled forward over the batch. An objective with host outputs
    (``has_host_outputs``) gets ``(sums, outputs)``, the outputs whole on every process."""
    loss_fn = _loss_fn(graphdef, rest, objective)
    replicated = NamedSharding(mesh, P())

    if has_host_outputs(objective):
        if memory_shardings is not None:
            raise ValueError(f"train.objective={objective.name!r} has host outputs, which a segment memory "
                             "does not carry; use a model without memory_len")

        def eval_outputs(weights, batch):
            params, frozen = weights if isinstance(weights, tuple) else (weights, None)
            _, sums, outputs = objective.eval_outputs(_merge(graphdef, rest, params, frozen), batch)
            return {k: v for k, v in sums.items() if k != ROUTER_LOAD}, outputs

        return jax.jit(sharding.under_mesh(eval_outputs, mesh),
                       in_shardings=(params_shardings, batch_sharding(mesh)), out_shardings=replicated)

    def eval_sums(weights, batch, memory=None):
        params, frozen = weights if isinstance(weights, tuple) else (weights, None)
        sums, memory = loss_fn(params, batch, None, memory, frozen)[1]
        sums.pop(ROUTER_LOAD, None)  # held-out metrics are the scalar ones
        return sums if memory is None else (sums, memory)

    if memory_shardings is None:
        return jax.jit(sharding.under_mesh(eval_sums, mesh), in_shardings=(params_shardings, batch_sharding(mesh)),
                       out_shardings=replicated)
    return jax.jit(sharding.under_mesh(eval_sums, mesh),
                   in_shardings=(params_shardings, batch_sharding(mesh), memory_shardings),
                   out_shardings=(replicated, memory_shardings))


def make_steps(graphdef, rest, optimizer, objective: Objective, cfg: RunConfig, mesh, state_shardings: dict):
    """The pure train and eval steps, jitted with explicit in/out shardings (those of ``state_shardings``
    for the state, rows over data x fsdp for the batch); the train state is donated. An MoE model's
    metrics carry ``router_load`` [L_moe, E], the step's mean router load over its micro-batches. A state
    with a segment memory passes it through the loss and keeps what comes out for the next step."""
    accumulate, bias_rate = cfg.train.grad_accum, cfg.train.router_bias_rate
    grad_fn = jax.value_and_grad(_loss_fn(graphdef, rest, objective), has_aux=True)
    if accumulate > 1 and "memory" in state_shardings:  # run.check_memory_settings says so first, by name
        raise ValueError(f"train.grad_accum={accumulate} with a segment memory: use train.grad_accum=1")

    def grads_and_sums(params, batch, key, memory, frozen):
        if accumulate == 1:
            (loss, (sums, memory)), grads = grad_fn(params, batch, key, memory, frozen)
            return loss, sums, memory, grads
        # Micro-batch j takes rows j, j + k, j + 2k, ...: each device's rows split evenly over micro-batches.
        micro = jax.tree.map(lambda x: x.reshape(x.shape[0] // accumulate, accumulate, *x.shape[1:]).swapaxes(0, 1),
                             batch)
        first = jax.tree.map(lambda x: x[0], micro)
        zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, params, first, key, None, frozen))

        def add(total, i_batch):
            i, one = i_batch
            return jax.tree.map(jnp.add, total, grad_fn(params, one, jax.random.fold_in(key, i), None, frozen)), None

        ((loss, (sums, _)), grads), _ = jax.lax.scan(add, zeros, (jnp.arange(accumulate), micro))
        return loss / accumulate, sums, None, jax.tree.map(lambda g: g / accumulate, grads)

    def train_step(state, batch):
        params, opt_state = state["params"], state["opt_state"]
        loss, sums, memory, grads = grads_and_sums(params, batch, jax.random.fold_in(state["key"], state["step"]),
                                                   state.get("memory"), state.get("frozen"))
        load = sums.pop(ROUTER_LOAD, None)
        load = None if load is None else ratio(load)  # summed over micro-batches: their mean
        frozen = frozen_paths(cfg, params)
        if frozen:  # no gradient, so none in the norm and the clipping either
            grads = without_frozen(grads, frozen)
        grad_norm = optax.tree.norm(grads)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        if load is not None and bias_rate and has_router_bias(params):
            new_params = balance_router_bias(new_params, load, bias_rate, frozen)
        # A non-finite loss or gradient never reaches the parameters or the optimizer state: the step
        # is dropped and counted, and the loop acts on the count (stop or skip) at its next sync.
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        new_state = {"params": keep(new_params, params), "opt_state": keep(new_opt_state, opt_state),
                     "step": state["step"] + 1, "skipped": state["skipped"] + (~finite).astype(jnp.int32),
                     "key": state["key"]}
        if "frozen" in state:
            new_state["frozen"] = state["frozen"]  # the base passes through untouched (donated, so not copied)
        if memory is not None:  # the rows read on either way; after a dropped step (its memory may not be
            # finite) they go on with an empty memory rather than carry the non-finite values forward
            new_state["memory"] = jax.tree.map(lambda m: jnp.where(finite, m, jnp.zeros_like(m)), memory)
        metrics = {"sums": sums, "grad_norm": grad_norm}
        if load is not None:
            metrics["router_load"] = load
        return new_state, metrics

    train = jax.jit(sharding.under_mesh(train_step, mesh), donate_argnums=0,
                    in_shardings=(state_shardings, batch_sharding(mesh)),
                    out_shardings=(state_shardings, NamedSharding(mesh, P())))
    return train, make_eval_step(graphdef, rest, objective, mesh, eval_weights(state_shardings),
                                 state_shardings.get("memory"))


def finish_metrics(objective: Objective, sums: dict, outputs: dict | None = None) -> dict[str, float]:
    """Metric values from (numerator, denominator) sums that may have been added over batches, and those
    of the per-row host ``outputs`` of all the batches (objectives with ``has_host_outputs``)."""
    values = objective.finish({name: float(ratio(pair)) for name, pair in sums.items()})
    if outputs is not None:
        values |= objective.finish_outputs(outputs)
    return dict(sorted(values.items(), key=lambda item: item[0] != "loss"))  # the loss first, for people


def _add(total, sums):
    return sums if total is None else jax.tree.map(lambda a, b: np.float64(a) + b, total, sums)


def run_eval(eval_step, objective: Objective, params, batches: list[dict], rows, memory=None) -> dict[str, float]:
    """The held-out metrics ``eval_*`` of ``batches``. With an empty segment ``memory`` (of the length to
    evaluate with) the batches are consecutive windows of contiguous rows: ``eval_*`` carries the memory
    from batch to batch in order, and ``eval_*_no_memory`` scores the same windows each with the empty
    memory, so the two differ by what the earlier segments are worth. An objective with host outputs
    (``has_host_outputs``) gets them from every batch, joined along the rows, for its ``finish_outputs``."""
    total = alone = None
    carried, outputs = memory, []
    for batch in batches:
        on_device = sharding.to_device(batch, rows)
        if memory is None:
            sums = jax.device_get(eval_step(params, on_device))
            if has_host_outputs(objective):
                sums, batch_outputs = sums
                outputs.append(batch_outputs)
            total = _add(total, sums)
            continue
        sums, carried = eval_step(params, on_device, carried)
        total = _add(total, jax.device_get(sums))
        alone = _add(alone, jax.device_get(eval_step(params, on_device, memory)[0]))
    joined = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]} if outputs else None
    metrics = {f"eval_{name}": value for name, value in finish_metrics(objective, total, joined).items()}
    if alone is not None:
        metrics |= {f"eval_{name}_no_memory": value for name, value in finish_metrics(objective, alone).items()}
    return metrics
