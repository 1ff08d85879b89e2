"""Training: build the mesh, the model and its objective, jit one pure ``train_step(state, batch)`` with
the state donated, loop, log, checkpoint; and the two things a finished run is used for afterwards:
``evaluate`` (metrics of a checkpoint on held-out data) and ``export_hf`` (a Hugging Face folder).

The train state is a dict: params, opt_state, step, skipped (non-finite steps dropped) and the PRNG key.
Batches are a pure function of (seed, step), so the step in the checkpoint is the data position too.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm import tqdm

import jaxformer as jf
from jaxformer import flops, kernels, sharding
from jaxformer.sharding import shardings_of
from jaxformer.train import data
from jaxformer.train.objectives import Objective, make_objective, ratio
from jaxformer.train.run_config import RunConfig, dump, load

# What a run folder holds besides checkpoints/, metrics.jsonl, tensorboard/ and loss.png: the run config,
# the config of the model as trained, and the tokenizer.json the data used (if not bytes), so that eval
# and convert need nothing from outside the folder.
CONFIG_FILE, MODEL_FILE, TOKENIZER_FILE = "config.yaml", "model.json", "tokenizer.json"


# --------------------------------------------------------------------------------------------------
# Model, optimizer, mesh


def decay_mask(params: nnx.State) -> nnx.State:
    """Weight decay on matrices and embeddings only: not on norms and biases (vectors per layer)."""
    return jax.tree.map(lambda v: v.replace(len([a for a in v.get_metadata()["axes"] if a != "layers"]) >= 2),
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


def make_optimizer(cfg: RunConfig, params: nnx.State) -> tuple[optax.GradientTransformation, optax.Schedule]:
    o = cfg.optim
    schedule = make_schedule(cfg)
    chain = [optax.clip_by_global_norm(o.clip_norm)] if o.clip_norm else []
    chain.append(optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay, mask=decay_mask(params)))
    return optax.chain(*chain), schedule


def _load_pretrained(source: str):
    kind, _, path = source.partition(":")
    if kind == "hf":
        return jf.from_pretrained(path)
    from jaxformer.checkpoint import load_model

    return load_model(path)


def build_model(cfg: RunConfig, objective: Objective, mesh):
    """The model ``objective`` trains, laid out on ``mesh`` by the sharding rules: a preset with
    overrides (created already sharded), or ``model.init_from``'s weights with the objective's head (a
    head the checkpoint lacks is freshly initialised, and said so)."""
    if not cfg.model.init_from:
        model_cfg = jf.config(cfg.model.preset)
        if cfg.model.overrides:
            model_cfg = model_cfg.replace(**cfg.model.overrides)
        model_cfg = objective.adapt(model_cfg.replace(dtype=cfg.train.compute_dtype), fresh=True)
        check_lengths(cfg, objective, model_cfg)
        return sharding.sharded_build(lambda: jf.build(model_cfg, seed=cfg.run.seed), mesh), []
    loaded = _load_pretrained(cfg.model.init_from)
    wanted = loaded.config.replace(dtype=cfg.train.compute_dtype, **cfg.model.overrides)
    wanted = objective.adapt(wanted, fresh=False)
    check_lengths(cfg, objective, wanted)
    model, fresh = (loaded, []) if wanted == loaded.config else transplant(loaded, wanted, cfg.run.seed)
    return sharding.shard_model(model, mesh), fresh


def transplant(loaded, wanted_cfg, seed: int):
    """A model of ``wanted_cfg`` holding every parameter of ``loaded`` that it has (all of the backbone);
    the rest (a new head) keeps its fresh initialisation. A shared parameter whose shape differs is an
    error, never a silent re-initialisation."""
    model = jf.build(wanted_cfg, seed=seed)
    source = dict(nnx.to_flat_state(nnx.state(loaded, nnx.Param)))
    target = nnx.state(model, nnx.Param)
    fresh, mismatched = [], []
    for path, variable in nnx.to_flat_state(target):
        if path not in source:
            fresh.append(".".join(map(str, path)))
        elif source[path].shape != variable.shape:
            mismatched.append(f"{'.'.join(map(str, path))}: checkpoint {source[path].shape}, model {variable.shape}")
        else:
            variable.value = source[path].value.astype(variable.dtype)
    if mismatched:
        raise ValueError("model.init_from does not fit this model (a changed size in model.overrides?): "
                         + "; ".join(mismatched))
    nnx.update(model, target)
    if hasattr(loaded, "hf_config"):
        model.hf_config = None  # the head changed: export writes the config of this model, not the loaded one
    return model, fresh


def check_lengths(cfg: RunConfig, objective: Objective, model_cfg) -> None:
    """Sequence lengths beyond a learned or sinusoidal position table fail before anything compiles."""
    if model_cfg.position not in ("learned", "sinusoidal"):
        return
    for key, length in (("train.seq_len", cfg.train.seq_len), ("the target length", objective.target_len)):
        if length > model_cfg.max_positions:
            raise ValueError(f"{key}={length} exceeds the model's position table (max_positions="
                             f"{model_cfg.max_positions})")


def make_mesh(cfg: RunConfig) -> jax.sharding.Mesh:
    """The device mesh of ``mesh.*``; every micro-batch must split over data x fsdp."""
    mesh = sharding.make_mesh({axis: getattr(cfg.mesh, axis) for axis in sharding.MESH_AXES})
    micro = cfg.train.batch_size // cfg.train.grad_accum
    sharding.check_batch(micro, mesh, f"train.batch_size={cfg.train.batch_size} / train.grad_accum="
                                      f"{cfg.train.grad_accum}: a micro-batch")
    return mesh


def batch_sharding(mesh) -> NamedSharding:
    return NamedSharding(mesh, P(sharding.BATCH_AXES))


# --------------------------------------------------------------------------------------------------
# The steps


def init_state(cfg: RunConfig, model, optimizer) -> dict:
    """The train state of a (sharded) model: the optimizer state takes its parameters' shardings."""
    params = nnx.state(model, nnx.Param)
    replicated = NamedSharding(jax.tree.leaves(params)[0].sharding.mesh, P())
    progress = {"step": jnp.int32(0), "skipped": jnp.int32(0), "key": jax.random.PRNGKey(cfg.run.seed)}
    return {"params": params, "opt_state": sharding.sharded_optimizer_state(optimizer, params),
            **jax.device_put(progress, replicated)}


def _loss_fn(graphdef, rest, objective: Objective):
    def loss_fn(params, batch, key):
        model = nnx.merge(graphdef, params, rest)
        dropout = model.config.dropout_rate or model.config.attention_dropout_rate
        return objective.loss(model, batch, key if dropout else None)

    return loss_fn


def attention_note(model_cfg: jf.ModelConfig, seq_len: int) -> str:
    """Which attention kernel the training step's self-attention runs on (an explicit backend this
    machine cannot serve fails here, before compiling)."""
    pattern = "bidirectional" if model_cfg.family == "encoder" else model_cfg.attention
    backend = kernels.fused_backend(model_cfg, pattern, seq_len, seq_len, has_bias=model_cfg.position == "relative")
    note = f"self-attention runs on {backend} (attention_backend={model_cfg.attention_backend!r}, {kernels.platform()})"
    if backend != "xla" and model_cfg.attention_dropout_rate > 0:
        note += "; attention dropout is on, so training steps use xla (model.overrides.attention_dropout_rate=0 fuses)"
    return note


def make_eval_step(graphdef, rest, objective: Objective, mesh, params_shardings):
    """The jitted eval step: the objective's metric sums of one batch, without dropout."""
    loss_fn = _loss_fn(graphdef, rest, objective)
    return jax.jit(sharding.under_mesh(lambda params, batch: loss_fn(params, batch, None)[1], mesh),
                   in_shardings=(params_shardings, batch_sharding(mesh)), out_shardings=NamedSharding(mesh, P()))


def make_steps(graphdef, rest, optimizer, objective: Objective, cfg: RunConfig, mesh, state_shardings: dict):
    """The pure train and eval steps, jitted with explicit in/out shardings (those of ``state_shardings``
    for the state, rows over data x fsdp for the batch); the train state is donated."""
    accumulate = cfg.train.grad_accum
    grad_fn = jax.value_and_grad(_loss_fn(graphdef, rest, objective), has_aux=True)

    def grads_and_sums(params, batch, key):
        if accumulate == 1:
            (loss, sums), grads = grad_fn(params, batch, key)
            return loss, sums, grads
        # Micro-batch j takes rows j, j + k, j + 2k, ...: each device's rows split evenly over micro-batches.
        micro = jax.tree.map(lambda x: x.reshape(x.shape[0] // accumulate, accumulate, *x.shape[1:]).swapaxes(0, 1),
                             batch)
        first = jax.tree.map(lambda x: x[0], micro)
        zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, params, first, key))

        def add(total, i_batch):
            i, one = i_batch
            return jax.tree.map(jnp.add, total, grad_fn(params, one, jax.random.fold_in(key, i))), None

        ((loss, sums), grads), _ = jax.lax.scan(add, zeros, (jnp.arange(accumulate), micro))
        return loss / accumulate, sums, jax.tree.map(lambda g: g / accumulate, grads)

    def train_step(state, batch):
        params, opt_state = state["params"], state["opt_state"]
        loss, sums, grads = grads_and_sums(params, batch, jax.random.fold_in(state["key"], state["step"]))
        grad_norm = optax.tree.norm(grads)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        # A non-finite loss or gradient never reaches the parameters or the optimizer state: the step
        # is dropped and counted, and the loop acts on the count (stop or skip) at its next sync.
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        state = {"params": keep(new_params, params), "opt_state": keep(new_opt_state, opt_state),
                 "step": state["step"] + 1, "skipped": state["skipped"] + (~finite).astype(jnp.int32),
                 "key": state["key"]}
        return state, {"sums": sums, "grad_norm": grad_norm}

    train = jax.jit(sharding.under_mesh(train_step, mesh), donate_argnums=0,
                    in_shardings=(state_shardings, batch_sharding(mesh)),
                    out_shardings=(state_shardings, NamedSharding(mesh, P())))
    return train, make_eval_step(graphdef, rest, objective, mesh, state_shardings["params"])


def finish_metrics(objective: Objective, sums: dict) -> dict[str, float]:
    """Metric values from (numerator, denominator) sums that may have been added over batches."""
    values = objective.finish({name: float(ratio(pair)) for name, pair in sums.items()})
    return dict(sorted(values.items(), key=lambda item: item[0] != "loss"))  # the loss first, for people


def run_eval(eval_step, objective: Objective, params, batches: list[dict], rows) -> dict[str, float]:
    total = None
    for batch in batches:
        sums = jax.device_get(eval_step(params, sharding.to_device(batch, rows)))
        total = sums if total is None else jax.tree.map(lambda a, b: np.float64(a) + b, total, sums)
    return {f"eval_{name}": value for name, value in finish_metrics(objective, total).items()}


# --------------------------------------------------------------------------------------------------
# Checkpoints: params, optimizer state, progress (step, skipped, key) and the data position


def checkpoint_manager(run_dir: Path, keep: int, read_only: bool = False):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=not read_only,
                                           read_only=read_only, create=not read_only)
    return ocp.CheckpointManager(run_dir.absolute() / "checkpoints", options=options)


def _abstract(tree):
    """The restore target: shapes, dtypes and the shardings the arrays have now (so a checkpoint saved
    under one mesh restores onto another)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def save_checkpoint(manager, state: dict, data_position: dict) -> None:
    import orbax.checkpoint as ocp

    progress = {k: state[k] for k in ("step", "skipped", "key")}
    manager.save(int(data_position["step"]), args=ocp.args.Composite(
        params=ocp.args.StandardSave(state["params"]), opt_state=ocp.args.StandardSave(state["opt_state"]),
        progress=ocp.args.StandardSave(progress), data=ocp.args.JsonSave(data_position)))


def restore(manager, state: dict, step: int | None = None, params_only: bool = False):
    """The checkpoint at ``step`` (default: the newest finalized one; Orbax never lists a half-written
    one) restored with the shardings of ``state``; a tree that does not match the model is a ValueError."""
    import orbax.checkpoint as ocp

    step = manager.latest_step() if step is None else step
    if step is None:
        return None
    if step not in manager.all_steps():
        raise ValueError(f"no checkpoint of step {step} in {manager.directory}; there are {manager.all_steps()}")
    items = {"params": ocp.args.StandardRestore(_abstract(state["params"]))}
    if not params_only:
        progress = {k: state[k] for k in ("step", "skipped", "key")}
        items |= {"opt_state": ocp.args.StandardRestore(_abstract(state["opt_state"])),
                  "progress": ocp.args.StandardRestore(_abstract(progress)), "data": ocp.args.JsonRestore()}
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**items))
    except (ValueError, KeyError) as err:
        raise ValueError(f"the checkpoint at step {step} in {manager.directory} does not match this model and "
                         f"optimizer; start a new run.dir or restore the original config ({err})") from None
    if params_only:
        return restored["params"], step
    if restored["data"]["step"] != step or int(restored["progress"]["step"]) != step:
        raise ValueError(f"the checkpoint at step {step} in {manager.directory} is inconsistent: "
                         f"data position {restored['data']}, train step {int(restored['progress']['step'])}")
    return {"params": restored["params"], "opt_state": restored["opt_state"], **restored["progress"]}, step


# --------------------------------------------------------------------------------------------------
# The run


@dataclasses.dataclass
class Run:
    """Everything a run, an evaluation or an export builds from one config."""

    cfg: RunConfig
    objective: Objective
    model: nnx.Module
    mesh: jax.sharding.Mesh
    fresh_params: list[str]
    tokenizer_file: Path | None  # the tokenizer.json the data is read with; None for bytes

    @classmethod
    def build(cls, cfg: RunConfig, trained: jf.ModelConfig | None = None, mesh=None) -> Run:
        """The run of ``cfg``; with ``trained`` (a finished run's model config) the model is built from it
        (to restore a checkpoint into) rather than from the preset or ``model.init_from``. ``mesh``
        replaces the mesh of ``mesh.*`` (the experiments runner compares meshes of other devices)."""
        mesh = mesh or make_mesh(cfg)  # mesh and batch errors first: they need no data and no model
        tokenizer_file = _tokenizer_file(cfg)
        objective = make_objective(cfg, data.make_tokenizer(str(tokenizer_file) if tokenizer_file else "bytes"))
        if trained is not None:
            trained = objective.adapt(trained, fresh=False)
            model, fresh = sharding.sharded_build(lambda: jf.build(trained, seed=cfg.run.seed), mesh), []
        else:
            model, fresh = build_model(cfg, objective, mesh)
        return cls(cfg, objective, model, mesh, fresh, tokenizer_file)


def _tokenizer_file(cfg: RunConfig) -> Path | None:
    spec = cfg.data.tokenizer
    if spec == "auto":
        folder = Path(cfg.model.init_from.partition(":")[2])
        own = cfg.model.init_from.startswith("hf:") and (folder / TOKENIZER_FILE).exists()
        return folder / TOKENIZER_FILE if own else None
    if spec == "bytes":
        return None
    path = Path(spec)
    return path / TOKENIZER_FILE if path.is_dir() else path


def train(cfg: RunConfig, progress: bool = True) -> dict:
    """Train (resuming from run.dir's newest checkpoint), evaluate on the held-out split, append to
    metrics.jsonl, and return the history, the trained model and the wall time."""
    import shutil

    sharding.initialize_distributed(cfg.mesh.coordinator, cfg.mesh.num_processes, cfg.mesh.process_id)
    run = Run.build(cfg)
    objective, model, mesh = run.objective, run.model, run.mesh
    log_here = jax.process_index() == 0
    run_dir = Path(cfg.run.dir)
    if log_here:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / CONFIG_FILE).write_text(dump(cfg), encoding="utf-8")
        (run_dir / MODEL_FILE).write_text(json.dumps(model.config.to_dict(), indent=1) + "\n", encoding="utf-8")
        if run.tokenizer_file is not None and run.tokenizer_file.resolve() != (run_dir / TOKENIZER_FILE).resolve():
            shutil.copy(run.tokenizer_file, run_dir / TOKENIZER_FILE)
        for note in objective.notes + ([f"freshly initialised: {', '.join(run.fresh_params)}"]
                                       if run.fresh_params else []) + [attention_note(model.config, cfg.train.seq_len)]:
            print(f"note: {note}")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer, schedule = make_optimizer(cfg, params)
    state = init_state(cfg, model, optimizer)
    train_step, eval_step = make_steps(graphdef, rest, optimizer, objective, cfg, mesh, shardings_of(state))
    rows = batch_sharding(mesh)
    manager = checkpoint_manager(run_dir, cfg.checkpoint.keep) if cfg.checkpoint.every else None
    start_step = 0
    if manager is not None:
        restored = restore(manager, state)
        if restored is not None:
            state, start_step = restored
    eval_batches = objective.eval_batches(cfg.eval.batches, cfg.train.batch_size)
    tokens_per_step = cfg.train.batch_size * (cfg.train.seq_len + objective.target_len)
    step_flops = flops.train_flops_per_step(model.config, cfg.train.batch_size, cfg.train.seq_len, objective.target_len)
    peak, _ = flops.peak_flops(cfg.train.compute_dtype)
    history = []
    bar = tqdm(total=cfg.train.steps, initial=start_step, desc="train", disable=not (progress and log_here),
               dynamic_ncols=True)
    started = time.perf_counter()
    last_time, last_step, skipped = started, start_step, int(state["skipped"])
    events = None
    if log_here:
        from tensorboardX import SummaryWriter

        events = SummaryWriter(str(run_dir / "tensorboard"))
    log = open(run_dir / "metrics.jsonl", "a" if start_step else "w", encoding="utf-8") if log_here else None
    try:
        for step in range(start_step, cfg.train.steps):
            state, metrics = train_step(state, sharding.to_device(objective.batch(step, cfg.train.batch_size), rows))
            done = step + 1
            last = done == cfg.train.steps
            evaluate = done % cfg.eval.every == 0 or last
            log_now = done % cfg.train.log_every == 0 or evaluate
            save = manager is not None and (done % cfg.checkpoint.every == 0 or last)
            if not (log_now or save):
                continue
            jax.block_until_ready(state)  # the only host sync in the loop: at logging and saving steps
            bad = int(state["skipped"])
            if bad > skipped and cfg.train.on_nan == "stop":
                raise FloatingPointError(
                    f"a non-finite loss or gradient occurred between steps {last_step + 1} and {done}; the run "
                    f"stopped and nothing from those steps was saved (train.on_nan=skip drops such updates)")
            if save:
                save_checkpoint(manager, state, {"step": done, "seed": cfg.run.seed, "objective": objective.name,
                                                 "batch_size": cfg.train.batch_size})
            if not log_now:
                continue
            now = time.perf_counter()
            seconds_per_step = (now - last_time) / (done - last_step)
            record = {"step": done, **finish_metrics(objective, jax.device_get(metrics["sums"])),
                      "lr": float(schedule(step)), "grad_norm": float(metrics["grad_norm"]),
                      "tokens_per_s": round(tokens_per_step / seconds_per_step, 1),
                      "mfu": round(step_flops / seconds_per_step / peak, 4)}
            if bad > skipped:
                record["skipped_steps"] = bad
            skipped = bad
            if evaluate:
                record |= run_eval(eval_step, objective, state["params"], eval_batches, rows)
            history.append(record)
            if log_here:
                log.write(json.dumps(record) + "\n")
                log.flush()
                for name, value in record.items():
                    if name != "step":
                        events.add_scalar(name, value, done)
            bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}",
                            mfu=f"{100 * record['mfu']:.0f}%")
            bar.update(done - last_step)
            last_time, last_step = time.perf_counter(), done
    finally:  # a stop (or any error) still waits for checkpoints in flight
        bar.close()
        if log_here:
            events.close()
            log.close()
        if manager is not None:
            manager.wait_until_finished()
            manager.close()
    nnx.update(model, state["params"])
    if log_here and (run_dir / "metrics.jsonl").stat().st_size:
        logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
        plot_losses(logged, run_dir / "loss.png", objective.name)
    return {"history": history, "model": model, "objective": objective, "seconds": time.perf_counter() - started,
            "start_step": start_step}


# --------------------------------------------------------------------------------------------------
# After a run: evaluate a checkpoint, export it


def restore_run(run_dir: str | Path, step: int | None = None, overrides: tuple[str, ...] = ()) -> tuple[Run, int]:
    """The run's model with the parameters of checkpoint ``step`` (default: the newest), on the devices
    present now. ``overrides`` may change data.* (evaluate other data), never the model."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).exists():
        raise ValueError(f"{run_dir} is not a training run folder (no {CONFIG_FILE})")
    for item in overrides:
        if not item.startswith(("data.", "eval.", "mesh.")):
            raise ValueError(f"override {item!r}: only data.*, eval.* and mesh.* can change after training")
    own_tokenizer = [f"data.tokenizer={run_dir / TOKENIZER_FILE}"] if (run_dir / TOKENIZER_FILE).exists() else []
    # The devices present now, not the training run's mesh: data parallel over all of them unless
    # mesh.* overrides say otherwise. One process: a finished run is evaluated and exported alone.
    here = ["mesh.data=-1", "mesh.fsdp=1", "mesh.tensor=1", "mesh.expert=1", "mesh.coordinator="]
    cfg = load(run_dir / CONFIG_FILE, own_tokenizer + here + list(overrides) + [f"run.dir={run_dir}"])
    trained = jf.ModelConfig.from_dict(json.loads((run_dir / MODEL_FILE).read_text(encoding="utf-8")))
    run = Run.build(cfg, trained)  # the model as trained, even if model.init_from's folder is gone by now
    manager = checkpoint_manager(run_dir, cfg.checkpoint.keep, read_only=True)
    if manager.latest_step() is None:
        raise ValueError(f"{run_dir / 'checkpoints'} holds no finished checkpoint")
    params = nnx.state(run.model, nnx.Param)
    restored, step = restore(manager, {"params": params}, step, params_only=True)
    manager.close()
    nnx.update(run.model, restored)
    return run, step


def evaluate(run_dir: str | Path, step: int | None = None, overrides: tuple[str, ...] = ()) -> dict[str, float]:
    """The objective's held-out metrics of a checkpoint, computed exactly as the training run logs them."""
    run, step = restore_run(run_dir, step, overrides)
    graphdef, params, rest = nnx.split(run.model, nnx.Param, ...)
    eval_step = make_eval_step(graphdef, rest, run.objective, run.mesh, shardings_of(params))
    batches = run.objective.eval_batches(run.cfg.eval.batches, run.cfg.train.batch_size)
    return {"step": step, **run_eval(eval_step, run.objective, params, batches, batch_sharding(run.mesh))}


def export_hf(run_dir: str | Path, output: str | Path, step: int | None = None) -> int:
    """Write a checkpoint of a run as a Hugging Face folder (config.json + model.safetensors), with the
    run's tokenizer.json when it used one."""
    import shutil

    run, step = restore_run(run_dir, step)
    run.model.save_pretrained(output)
    if run.tokenizer_file is not None:
        shutil.copy(run.tokenizer_file, Path(output) / TOKENIZER_FILE)
    return step


# --------------------------------------------------------------------------------------------------
# What a person sees


def plot_losses(history: list[dict], path: Path, objective: str = "causal_lm") -> None:
    """run.dir/loss.png: training loss at every logged step and held-out loss where evaluated."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot([r["step"] for r in history], [r["loss"] for r in history], label="train")
    held_out = [r for r in history if "eval_loss" in r]
    axes.plot([r["step"] for r in held_out], [r["eval_loss"] for r in held_out], "o-", label="held-out")
    axes.set(xlabel="step", ylabel="loss (nats)", title=f"{objective} loss")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def sample(model, objective: Objective, max_new_tokens: int, seed: int = 0) -> str | None:
    """A short generation after training: text after "The " for causal LMs, the first held-out
    source's output for seq2seq; None for objectives that do not generate."""
    tokenizer = objective.tokenizer
    if objective.name == "causal_lm":
        ids = tokenizer.encode("The ")[None]
        limit = model.config.max_positions - ids.shape[1] if model.config.position == "learned" else max_new_tokens
        out = model.generate(ids, max_new_tokens=min(max_new_tokens, limit), do_sample=True, temperature=0.8,
                             top_k=40, seed=seed)
        return tokenizer.decode(out[0])
    if objective.name == "seq2seq":
        source = objective.held_out_examples[0][0][None]
        out = model.generate(source, max_new_tokens=min(max_new_tokens, objective.target_len))
        return f"{tokenizer.decode(source[0])!r} -> {tokenizer.decode(out[0])!r}"
    return None


def main(argv: list[str]) -> int:
    config_path = argv[0] if argv and "=" not in argv[0] and argv[0].endswith((".yaml", ".yml")) else None
    overrides = argv[1:] if config_path else argv
    if config_path is None and Path("configs/default.yaml").exists():
        config_path = "configs/default.yaml"
    cfg = load(config_path, overrides)
    result = train(cfg)
    if jax.process_index() != 0:
        return 0
    if not result["history"]:
        print(f"{cfg.run.dir} already holds a finished run of {cfg.train.steps} steps; nothing to do")
        return 0
    first, last = result["history"][0], result["history"][-1]
    resumed = f" (resumed at step {result['start_step']})" if result["start_step"] else ""
    held_out = ", ".join(f"{k.removeprefix('eval_')} {v:.3f}" for k, v in last.items() if k.startswith("eval_"))
    print(f"trained {cfg.train.steps} steps{resumed} in {result['seconds']:.0f} s: loss {first['loss']:.3f} -> "
          f"{last['loss']:.3f}; held-out {held_out}; metrics in {Path(cfg.run.dir) / 'metrics.jsonl'}")
    if cfg.train.sample_tokens:
        text = sample(result["model"], result["objective"], cfg.train.sample_tokens, cfg.run.seed)
        if text is not None:
            print("sample:", text)
    return 0
