"""A training run, top to bottom: build the mesh, the model (created sharded) and its objective, jit
one pure ``train_step(state, batch)`` with explicit shardings and the state donated, then loop: step,
log, evaluate, checkpoint. ``python train.py`` and ``jaxformer train`` run ``main``.

Batches are a pure function of (seed, step), so the step in the checkpoint is the data position too.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import jax
from flax import nnx

from jaxformer import sharding
from jaxformer.config import ModelConfig
from jaxformer.interop.hf import from_pretrained
from jaxformer.models import build
from jaxformer.presets import config as preset_config
from jaxformer.sharding import shardings_of
from jaxformer.train import data
from jaxformer.train.checkpoints import checkpoint_manager, restore, save_checkpoint
from jaxformer.train.objectives import Objective, make_objective
from jaxformer.train.report import Report, attention_note, sample
from jaxformer.train.run_config import RunConfig, dump, load
from jaxformer.train.steps import batch_sharding, init_state, make_optimizer, make_steps, run_eval

# What a run folder holds besides checkpoints/, metrics.jsonl, tensorboard/ and loss.png: the run config,
# the config of the model as trained, and the tokenizer.json the data used (if not bytes), so that eval
# and convert need nothing from outside the folder.
CONFIG_FILE, MODEL_FILE, TOKENIZER_FILE = "config.yaml", "model.json", "tokenizer.json"


# --------------------------------------------------------------------------------------------------
# What a run is built from


def _load_pretrained(source: str):
    kind, _, path = source.partition(":")
    if kind == "hf":
        return from_pretrained(path)
    from jaxformer.checkpoint import load_model

    return load_model(path)


def build_model(cfg: RunConfig, objective: Objective, mesh):
    """The model ``objective`` trains, laid out on ``mesh`` by the sharding rules: a preset with
    overrides (created already sharded), or ``model.init_from``'s weights with the objective's head (a
    head the checkpoint lacks is freshly initialised, and said so)."""
    if not cfg.model.init_from:
        model_cfg = preset_config(cfg.model.preset)
        if cfg.model.overrides:
            model_cfg = model_cfg.replace(**cfg.model.overrides)
        model_cfg = objective.adapt(model_cfg.replace(dtype=cfg.train.compute_dtype), fresh=True)
        check_lengths(cfg, objective, model_cfg)
        return sharding.sharded_build(lambda: build(model_cfg, seed=cfg.run.seed), mesh), []
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
    model = build(wanted_cfg, seed=seed)
    source = dict(nnx.to_flat_state(nnx.state(loaded, nnx.Param)))
    target = nnx.state(model, nnx.Param)
    fresh, mismatched = [], []
    for path, variable in nnx.to_flat_state(target):
        if path not in source:
            fresh.append(".".join(map(str, path)))
        elif source[path].shape != variable.shape:
            mismatched.append(f"{'.'.join(map(str, path))}: checkpoint {source[path].shape}, model {variable.shape}")
        else:
            variable[...] = source[path][...].astype(variable.dtype)
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
    def build(cls, cfg: RunConfig, trained: ModelConfig | None = None, mesh=None) -> Run:
        """The run of ``cfg``; with ``trained`` (a finished run's model config) the model is built from it
        (to restore a checkpoint into) rather than from the preset or ``model.init_from``. ``mesh``
        replaces the mesh of ``mesh.*`` (the experiments runner compares meshes of other devices)."""
        mesh = mesh or make_mesh(cfg)  # mesh and batch errors first: they need no data and no model
        tokenizer_file = _tokenizer_file(cfg)
        objective = make_objective(cfg, data.make_tokenizer(str(tokenizer_file) if tokenizer_file else "bytes"))
        if trained is not None:
            trained = objective.adapt(trained, fresh=False)
            model, fresh = sharding.sharded_build(lambda: build(trained, seed=cfg.run.seed), mesh), []
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


# --------------------------------------------------------------------------------------------------
# The run


def write_run_folder(run: Run) -> None:
    """config.yaml, model.json and the tokenizer: everything eval and convert need later (process 0)."""
    run_dir = Path(run.cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(dump(run.cfg), encoding="utf-8")
    (run_dir / MODEL_FILE).write_text(json.dumps(run.model.config.to_dict(), indent=1) + "\n", encoding="utf-8")
    if run.tokenizer_file is not None and run.tokenizer_file.resolve() != (run_dir / TOKENIZER_FILE).resolve():
        shutil.copy(run.tokenizer_file, run_dir / TOKENIZER_FILE)
    fresh = [f"freshly initialised: {', '.join(run.fresh_params)}"] if run.fresh_params else []
    for note in run.objective.notes + fresh + [attention_note(run.model.config, run.cfg.train.seq_len)]:
        print(f"note: {note}")


def train(cfg: RunConfig, progress: bool = True) -> dict:
    """Train (resuming from run.dir's newest checkpoint), evaluate on the held-out split, append to
    metrics.jsonl, and return the history, the trained model and the wall time."""
    sharding.initialize_distributed(cfg.mesh.coordinator, cfg.mesh.num_processes, cfg.mesh.process_id)
    run = Run.build(cfg)  # the mesh, the objective and its data, the model created sharded
    if jax.process_index() == 0:
        write_run_folder(run)
    graphdef, params, rest = nnx.split(run.model, nnx.Param, ...)
    optimizer, schedule = make_optimizer(cfg, params)
    state = init_state(cfg, run.model, optimizer)
    train_step, eval_step = make_steps(graphdef, rest, optimizer, run.objective, cfg, run.mesh, shardings_of(state))
    rows = batch_sharding(run.mesh)
    manager = checkpoint_manager(Path(cfg.run.dir), cfg.checkpoint.keep) if cfg.checkpoint.every else None
    restored = restore(manager, state) if manager is not None else None
    state, start_step = restored if restored is not None else (state, 0)
    eval_batches = run.objective.eval_batches(cfg.eval.batches, cfg.train.batch_size)
    report = Report(cfg, run.objective, run.model.config, schedule, start_step, int(state["skipped"]), progress)
    started = time.perf_counter()
    try:
        for step in range(start_step, cfg.train.steps):
            state, metrics = train_step(state, sharding.to_device(run.objective.batch(step, cfg.train.batch_size), rows))
            done = step + 1
            evaluate = done % cfg.eval.every == 0 or done == cfg.train.steps
            log = evaluate or done % cfg.train.log_every == 0
            save = manager is not None and (done % cfg.checkpoint.every == 0 or done == cfg.train.steps)
            if not (log or save):
                continue
            jax.block_until_ready(state)  # the only host sync in the loop: at logging and saving steps
            report.check_finite(int(state["skipped"]), done)
            if save:
                save_checkpoint(manager, state, {"step": done, "seed": cfg.run.seed, "objective": run.objective.name,
                                                 "batch_size": cfg.train.batch_size})
            if log:
                held_out = lambda: run_eval(eval_step, run.objective, state["params"], eval_batches, rows)  # noqa: E731
                report.log(done, metrics, int(state["skipped"]), held_out if evaluate else None)
    finally:  # a stop (or any error) still waits for checkpoints in flight
        report.close()
        if manager is not None:
            manager.wait_until_finished()
            manager.close()
    nnx.update(run.model, state["params"])
    report.plot()
    return {"history": report.history, "model": run.model, "objective": run.objective,
            "seconds": time.perf_counter() - started, "start_step": start_step}


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
