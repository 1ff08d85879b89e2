"""A training run, top to bottom: build the mesh, the model (created sharded) and its objective, jit
one pure ``train_step(state, batch)`` with explicit shardings and the state donated, then loop: step,
log, evaluate, checkpoint. ``python train.py`` and ``jaxformer train`` run ``main``.

Batches are a pure function of (seed, step), so the step in the checkpoint is the data position too. A
model with segment memory (Transformer-XL) reads ordered rows instead of seeded windows, still a function
of the step, and its train state carries the rows' memory, which the checkpoint holds with the step.

``finetune.lora.rank > 0`` makes it a LoRA fine-tune: the model (preset or ``model.init_from``) gets fresh
adapters (``jaxformer.lora.with_lora``; with ``base_dtype=int8`` its projection kernels become int8,
``jaxformer.lora.quantized``), only the adapters and the listed head train, and the checkpoints refer to
the base by source and fingerprint instead of holding it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from pathlib import Path

import jax
from flax import nnx

from jaxformer import sharding
from jaxformer.adapt import adapt, adapted_config
from jaxformer.model_config import ModelConfig
from jaxformer.interop.hf import from_pretrained
from jaxformer.interop.tokenizer import sentencepiece_layout, sentencepiece_model
from jaxformer.layers.stack import check_pipeline_stacks
from jaxformer.lora import quantized, trainable, under, with_lora
from jaxformer.models import build
from jaxformer.presets import config as preset_config
from jaxformer.sharding import shardings_of
from jaxformer.train import data, loader
from jaxformer.train.checkpoints import checkpoint_manager, fingerprint, restore, save_checkpoint
from jaxformer.train.lifecycle import (InterruptRequests, Interrupted, RunDirLock, check_run_dir,
                                       discard_partial_checkpoints, disk_full, finalized_steps, full_disk_error)
from jaxformer.train.objectives import Objective, carries_memory
from jaxformer.train.tasks import make_objective
from jaxformer.train.report import Report, attention_note, expert_note, pipeline_note, sample
from jaxformer.train.run_config import RunConfig, dump, load
from jaxformer.train.steps import (batch_sharding, empty_memory, eval_weights, frozen_paths, init_state, make_optimizer,
                                   make_steps, run_eval, split_model)

# What a run folder holds besides checkpoints/, metrics.jsonl, tensorboard/ and loss.png: the run config,
# the config of the model as trained, and the tokenizer.json the data used (if not bytes), so that eval
# and convert need nothing from outside the folder.
CONFIG_FILE, MODEL_FILE, TOKENIZER_FILE = "config.yaml", "model.json", "tokenizer.json"


# --------------------------------------------------------------------------------------------------
# What a run is built from


def _load_pretrained(source: str):
    """The model of ``hf:PATH`` (a Hugging Face folder) or ``jaxformer:PATH`` (a native checkpoint, or a
    training run's folder: its newest checkpoint)."""
    kind, _, path = source.partition(":")
    if kind == "hf":
        return from_pretrained(path)
    if (Path(path) / MODEL_FILE).exists() and (Path(path) / CONFIG_FILE).exists():
        return load_run_model(Path(path))
    from jaxformer.checkpoint import load_model

    return load_model(path)


def load_run_model(run_dir: Path, step: int | None = None):
    """The model a training run folder trained (model.json) with checkpoint ``step``'s parameters (default: the
    newest), restored into abstract shapes: building the model first would initialise every weight only to
    overwrite it (16 s of a 17 s load of tiny-bert on CPU)."""
    trained = ModelConfig.from_dict(json.loads((run_dir / MODEL_FILE).read_text(encoding="utf-8")))
    if trained.lora is not None:
        raise ValueError(f"{run_dir} is a LoRA fine-tune (its checkpoints hold adapters, not a model); write it "
                         f"out merged with `jaxformer convert {run_dir} --to-hf OUT --merge`, then init_from=hf:OUT")
    if not (run_dir / "checkpoints").is_dir():
        raise ValueError(f"{run_dir / 'checkpoints'} holds no finished checkpoint to start from")
    graphdef, params, rest = nnx.split(nnx.eval_shape(lambda: build(trained)), nnx.Param, ...)
    if jax.tree.leaves(rest):  # variables a checkpoint does not hold: made as build makes them
        graphdef, _, rest = nnx.split(build(trained), nnx.Param, ...)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), params)
    manager = checkpoint_manager(run_dir, 1, read_only=True)
    restored = restore(manager, {"params": target}, step, params_only=True)
    manager.close()
    if restored is None:
        raise ValueError(f"{run_dir / 'checkpoints'} holds no finished checkpoint to start from")
    return nnx.merge(graphdef, restored[0], rest)


def adapted(source, kind: str, seed: int):
    """model.adapt: a loaded decoder model made into ``kind``'s family by ``jf.adapt`` (T5Gemma-style: every
    tensor copied), or, given a preset's config, that family's config (its model freshly initialised)."""
    try:
        if isinstance(source, ModelConfig):
            return adapted_config(source, kind)
        return adapt(source, kind, seed=seed)
    except ValueError as err:
        raise ValueError(f"model.adapt={kind!r}: {err}") from None


def build_model(cfg: RunConfig, objective: Objective, mesh):
    """The model ``objective`` trains, laid out on ``mesh`` by the sharding rules: a preset with
    overrides (created already sharded), or ``model.init_from``'s weights with the objective's head (a
    head the checkpoint lacks is freshly initialised, and said so). ``model.adapt`` turns the decoder
    loaded (or the preset) into an encoder-decoder or a prefix-LM first; overrides apply to a preset
    before that, to a loaded model after it (model.overrides.vocab_size may grow a loaded vocabulary).
    Returns ``(model, fresh, head)``: head the '/'-joined paths of the parameters the objective adds (a
    classification head), what a LoRA fine-tune trains beside its adapters by default."""
    if not cfg.model.init_from:
        model_cfg = preset_model_config(cfg)
        before = executed(model_cfg, cfg)
        model_cfg = objective.adapt(executed(model_cfg, cfg), fresh=True)
        check_lengths(cfg, objective, model_cfg)
        check_memory_settings(cfg, model_cfg)
        check_pipeline(cfg, model_cfg, mesh)
        head = added_params(before, model_cfg) if cfg.finetune.lora.rank else []
        return sharding.sharded_build(lambda: build(model_cfg, seed=cfg.run.seed), mesh), [], head
    loaded = _load_pretrained(cfg.model.init_from)
    if cfg.model.adapt:
        loaded = adapted(loaded, cfg.model.adapt, cfg.run.seed)
    before = executed(loaded.config, cfg).replace(**cfg.model.overrides)
    wanted = objective.adapt(before, fresh=False)
    check_lengths(cfg, objective, wanted)
    check_memory_settings(cfg, wanted)
    check_pipeline(cfg, wanted, mesh)
    head = added_params(loaded.config, wanted) if cfg.finetune.lora.rank else []
    if wanted == loaded.config:
        return sharding.shard_model(loaded, mesh), [], head
    model, fresh = transplant(loaded, wanted, cfg.run.seed, cfg.model.overrides)
    return sharding.shard_model(model, mesh), fresh, head


def preset_model_config(cfg: RunConfig) -> ModelConfig:
    """The config of the model a run without ``model.init_from`` builds: the preset with the run's overrides,
    adapted into ``model.adapt``'s family."""
    model_cfg = preset_config(cfg.model.preset)
    if cfg.model.overrides:
        model_cfg = model_cfg.replace(**cfg.model.overrides)
    if cfg.model.adapt:
        model_cfg = adapted(model_cfg, cfg.model.adapt, cfg.run.seed)
    return model_cfg


def added_params(before: ModelConfig, after: ModelConfig) -> list[str]:
    """'/'-joined paths of the parameters a model of ``after`` has and one of ``before`` lacks (from
    abstract shapes: nothing is built)."""
    def paths(model_cfg):
        abstract = nnx.eval_shape(lambda: build(model_cfg))
        return {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(abstract, nnx.Param))}

    return sorted(paths(after) - paths(before))


def with_adapters(cfg: RunConfig, model, head: list[str], mesh):
    """finetune.lora: ``model`` with fresh LoRA adapters (and, for base_dtype=int8, int8 projection kernels)
    on ``mesh``, and the reference to its frozen base that the checkpoints hold: the source and a
    fingerprint of the float base tensors (before int8 rounding, so it does not depend on the backend)."""
    lo = cfg.finetune.lora
    train_also = head if lo.trainable == "auto" else lo.trainable
    try:
        model = with_lora(model, lo.rank, lo.alpha, tuple(lo.targets), lo.dropout, lo.rslora, tuple(train_also),
                          seed=cfg.run.seed)
    except ValueError as err:  # the model's own words, under the keys that were set
        raise ValueError(f"finetune.lora (rank={lo.rank}, targets={lo.targets}, trainable={lo.trainable!r}): "
                         f"{err}") from None
    base = nnx.state(model, nnx.All(nnx.Param, nnx.Not(trainable(model.config))))
    reference = {"source": cfg.model.init_from or f"preset:{cfg.model.preset}", "fingerprint": fingerprint(base),
                 "tensors": len(nnx.to_flat_state(base))}
    if lo.base_dtype == "int8":
        model = quantized(model, "int8")
    return sharding.shard_model(model, mesh), reference


def transplant(loaded, wanted_cfg, seed: int, overrides: dict | None = None):
    """A model of ``wanted_cfg`` holding every parameter of ``loaded`` that it has (all of the backbone);
    the rest (a new head) keeps its fresh initialisation. A larger vocabulary keeps the loaded rows and
    initialises the new ones (the ids of sentinels or mode tokens a byte-level model never saw, say).
    Any other shared parameter whose shape differs is an error, never a silent re-initialisation; it names
    the ``overrides`` (the run's model.overrides) that changed the shape."""
    model = build(wanted_cfg, seed=seed)
    source = dict(nnx.to_flat_state(nnx.state(loaded, nnx.Param)))
    target = nnx.state(model, nnx.Param)
    fresh, mismatched = [], []
    for path, variable in nnx.to_flat_state(target):
        name, old = ".".join(map(str, path)), source.get(path)
        if old is None:
            fresh.append(name)
        elif old.shape == variable.shape:
            variable[...] = old[...].astype(variable.dtype)
        elif (axis := _grown_vocab_axis(old, variable)) is not None:
            variable[(slice(None),) * axis + (slice(0, old.shape[axis]),)] = old[...].astype(variable.dtype)
            fresh.append(f"{name} rows {old.shape[axis]}..{variable.shape[axis] - 1}")
        else:
            mismatched.append(f"{name}: checkpoint {old.shape}, model {variable.shape}")
    if mismatched:
        raise ValueError(f"model.init_from does not fit the model of this run (model.overrides = {overrides or {}}: a "
                         "changed size? only vocab_size may grow): " + "; ".join(mismatched))
    nnx.update(model, target)
    if hasattr(loaded, "hf_config"):
        model.hf_config = None  # the head changed: export writes the config of this model, not the loaded one
    return model, fresh


def _grown_vocab_axis(old, new) -> int | None:
    """The vocabulary axis along which ``new`` holds more rows than ``old`` and which alone differs, if any."""
    axes = tuple(new.get_metadata().get("axes") or ())
    if "vocab" not in axes or len(old.shape) != len(new.shape):
        return None
    axis = axes.index("vocab")
    same_elsewhere = all(a == b for i, (a, b) in enumerate(zip(old.shape, new.shape)) if i != axis)
    return axis if same_elsewhere and old.shape[axis] < new.shape[axis] else None


def executed(model_cfg: ModelConfig, cfg: RunConfig) -> ModelConfig:
    """The model config with the run's settings of how it computes: the compute dtype, the pipeline's
    microbatches and repeats (inert without a ``stage`` mesh axis)."""
    return model_cfg.replace(dtype=cfg.train.compute_dtype, pipeline_microbatches=cfg.train.microbatches,
                             pipeline_repeats=cfg.train.pipeline_repeats)


def check_pipeline(cfg: RunConfig, model_cfg: ModelConfig, mesh) -> None:
    """Under ``mesh.stage`` > 1, a model whose stacks cannot run as a pipeline, or a schedule that does not
    split its layers or a micro-batch's rows, fails before anything is built or compiled."""
    stages = mesh.shape["stage"]
    if stages == 1:
        return
    rows = cfg.train.batch_size // cfg.train.grad_accum
    check_pipeline_stacks(nnx.eval_shape(lambda: build(model_cfg, seed=0)), stages, rows)
    microbatches = cfg.train.microbatches or stages
    sharding.check_batch(rows // microbatches, mesh, f"a pipeline microbatch (train.batch_size={cfg.train.batch_size} "
                                                     f"/ train.grad_accum={cfg.train.grad_accum} / {microbatches} "
                                                     "microbatches)")


def check_lengths(cfg: RunConfig, objective: Objective | None, model_cfg) -> None:
    """Sequence lengths beyond a learned or sinusoidal position table fail before anything compiles (without
    an ``objective``, train.seq_len alone: checked before the data is read, whose sizes it would fail first)."""
    if model_cfg.position not in ("learned", "sinusoidal"):
        return
    lengths = [("train.seq_len", cfg.train.seq_len)]
    if objective is not None:
        lengths.append(("the target length", objective.target_len))
    for key, length in lengths:
        if length > model_cfg.max_positions:
            raise ValueError(f"{key}={length} exceeds the model's position table (max_positions="
                             f"{model_cfg.max_positions})")


def check_memory_settings(cfg: RunConfig, model_cfg) -> None:
    """Settings that need, or do not fit, a segment memory fail before anything compiles."""
    if carries_memory(model_cfg) and cfg.train.grad_accum > 1:
        # Micro-batches would split the rows whose memories follow their own streams from step to step.
        raise ValueError(f"train.grad_accum={cfg.train.grad_accum} does not work with a segment memory (model "
                         f"memory_len={model_cfg.segment_memory}): each batch row carries its memory to the next "
                         "step; use train.grad_accum=1, or model.overrides.memory_len=0 to train without memory")
    if cfg.eval.memory_len and not carries_memory(model_cfg):
        raise ValueError(f"eval.memory_len={cfg.eval.memory_len} needs a model with segment memory (position='xl' "
                         f"and memory_len > 0); model {model_cfg.name!r} has position={model_cfg.position!r} and "
                         f"memory_len={model_cfg.segment_memory}. Leave eval.memory_len=0")


def held_out_memory(run: Run):
    """The empty memory held-out evaluation starts from: eval.memory_len slots (0: the model's memory_len)
    per row; None for a model without memory."""
    if not carries_memory(run.model.config):
        return None
    return empty_memory(run.model, run.cfg.train.batch_size, run.cfg.eval.memory_len or None, run.mesh)


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
    base: dict | None = None  # a LoRA fine-tune's reference to its frozen base: source and fingerprint

    @classmethod
    def build(cls, cfg: RunConfig, trained: ModelConfig | None = None, mesh=None) -> Run:
        """The run of ``cfg``; with ``trained`` (a finished run's model config) the model is built from it
        (to restore a checkpoint into) rather than from the preset or ``model.init_from``, except for a
        LoRA fine-tune, whose frozen base is loaded from its source again (its checkpoints hold only the
        adapters). ``mesh`` replaces the mesh of ``mesh.*`` (the experiments runner compares meshes of
        other devices)."""
        mesh = mesh or make_mesh(cfg)  # mesh and batch errors first: they need no data and no model
        if trained is not None or not cfg.model.init_from:  # the position table before the data's sizes
            check_lengths(cfg, None, trained or preset_model_config(cfg))
        tokenizer_file = _tokenizer_file(cfg)
        objective = make_objective(cfg, data.make_tokenizer(str(tokenizer_file) if tokenizer_file else "bytes"))
        base = None
        if trained is not None and not cfg.finetune.lora.rank:
            trained = objective.adapt(executed(trained, cfg), fresh=False)
            check_memory_settings(cfg, trained)
            check_pipeline(cfg, trained, mesh)
            model, fresh = sharding.sharded_build(lambda: build(trained, seed=cfg.run.seed), mesh), []
        else:
            model, fresh, head = build_model(cfg, objective, mesh)
            if cfg.finetune.lora.rank:
                model, base = with_adapters(cfg, model, head, mesh)
        return cls(cfg, objective, model, mesh, fresh, tokenizer_file, base)


def _tokenizer_file(cfg: RunConfig) -> Path | None:
    spec = cfg.data.tokenizer
    if spec == "auto":
        folder = Path(cfg.model.init_from.partition(":")[2])
        own = bool(cfg.model.init_from) and (folder / TOKENIZER_FILE).exists()
        if cfg.model.init_from and not own and sentencepiece_layout(folder) is not None:
            raise ValueError(f"data.tokenizer=auto: {folder} holds its tokenizer as SentencePiece files (Marian's, "
                             "M2M100's), which training does not read: give data.tokenizer a tokenizer.json of the "
                             "same vocabulary, or data.tokenizer=bytes to train on bytes knowingly")
        if cfg.model.init_from and not own and (model := sentencepiece_model(folder)) is not None:
            raise ValueError(f"data.tokenizer=auto: {folder} holds its tokenizer as a SentencePiece model "
                             f"({model.name}) and no tokenizer.json, which training reads: write one with transformers "
                             "(AutoTokenizer.from_pretrained(folder).save_pretrained(folder)), or give "
                             "data.tokenizer=bytes to train on bytes knowingly")
        return folder / TOKENIZER_FILE if own else None
    if spec == "bytes":
        return None
    path = Path(spec)
    return path / TOKENIZER_FILE if path.is_dir() else path


# --------------------------------------------------------------------------------------------------
# The run


def run_notes(run: Run) -> list[str]:
    """What a person should know before the run starts (an attention backend this machine cannot serve
    fails here, before anything is compiled or written)."""
    fresh = [f"freshly initialised: {', '.join(run.fresh_params)}"] if run.fresh_params else []
    with jax.sharding.use_abstract_mesh(run.mesh.abstract_mesh):  # a `sequence` axis makes it the ring
        attention = attention_note(run.model.config, run.cfg.train.seq_len)
        experts = expert_note(run.model.config, run.cfg.train.batch_size // run.cfg.train.grad_accum)
        pipeline = pipeline_note(run.model.config, run.cfg.train.batch_size // run.cfg.train.grad_accum)
    return run.objective.notes + fresh + lora_notes(run) + train_only_notes(run) + [attention] + experts + pipeline


def train_only_notes(run: Run) -> list[str]:
    """What finetune.train_only trains (a path that matches no parameter fails here, before anything compiles)."""
    only = run.cfg.finetune.train_only
    if not only:
        return []
    params = nnx.state(run.model, nnx.Param)
    frozen = frozen_paths(run.cfg, params)
    sizes = {"/".join(map(str, path)): v.size for path, v in nnx.to_flat_state(params)}
    count, total = sum(n for path, n in sizes.items() if path not in frozen), sum(sizes.values())
    return [f"training {', '.join(only)} alone: {count:,} of {total:,} numbers ({100 * count / total:.2f}%), the rest "
            "frozen (finetune.train_only)"]


def lora_notes(run: Run) -> list[str]:
    """What a LoRA fine-tune trains, and a freshly initialised parameter that it leaves frozen."""
    model_cfg = run.model.config
    if model_cfg.lora is None:
        return []
    params = nnx.state(run.model, trainable(model_cfg))
    count = sum(x.size for x in jax.tree.leaves(params))
    total = count + sum(x.size for x in jax.tree.leaves(nnx.state(run.model, nnx.Not(trainable(model_cfg)))))
    also = f" and {', '.join(model_cfg.lora.trainable)}" if model_cfg.lora.trainable else ""
    int8 = ", base int8 (QLoRA)" if model_cfg.quantization is not None else ""
    notes = [f"LoRA r={model_cfg.lora.rank} on {', '.join(model_cfg.lora.targets)}{int8}: training the adapters{also}, "
             f"{count:,} of {total:,} numbers ({100 * count / total:.2f}%); base {run.base['source']} "
             f"(sha256 {run.base['fingerprint'][:12]})"]
    frozen_fresh = [name for name in run.fresh_params  # ("embed.embedding rows 100..103": the path, then its rows)
                    if not under(name.split()[0].replace(".", "/"), model_cfg.lora.trainable)]
    if frozen_fresh:
        notes.append(f"freshly initialised but frozen under LoRA: {', '.join(frozen_fresh)}; list them in "
                     "finetune.lora.trainable to train them")
    return notes


def write_run_folder(run: Run, notes: list[str]) -> None:
    """config.yaml, model.json and the tokenizer: everything eval and convert need later (process 0).
    Written only once the run is accepted (a fresh folder, or a resume that matched)."""
    run_dir = Path(run.cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(dump(run.cfg), encoding="utf-8")
    (run_dir / MODEL_FILE).write_text(json.dumps(run.model.config.to_dict(), indent=1) + "\n", encoding="utf-8")
    if run.tokenizer_file is not None and run.tokenizer_file.resolve() != (run_dir / TOKENIZER_FILE).resolve():
        shutil.copy(run.tokenizer_file, run_dir / TOKENIZER_FILE)
    for note in notes:
        print(f"note: {note}")


# What a resumed run may change: how it reports, evaluates, checkpoints and lays itself out on devices;
# never what a step computes (the model, the data and its order, the objective, batch, lengths, schedule,
# precision).
_RESUMABLE_CHANGES = {"run.dir", "model.init_from", "train.log_every", "train.sample_tokens", "train.on_nan",
                      "train.max_skipped_steps", "train.resume", "data.loader_threads", "data.prefetch",
                      "data.tokenizer"}  # compared by what it resolves to: _tokenizer_difference
_RESUMABLE_SECTIONS = ("eval", "checkpoint", "mesh")
_RESUMABLE_MODEL_FIELDS = {"name", "attention_backend"}  # the same function, another kernel
# The pipeline's schedule is layout too (compared apart: pipeline_difference), except for the dropout masks.
_PIPELINE_KEYS = {"train.microbatches", "train.pipeline_repeats"}
_PIPELINE_MODEL_FIELDS = {"pipeline_microbatches", "pipeline_repeats"}


def resume_differences(run: Run) -> list[str]:
    """Settings of ``run`` that differ from those of the run its run.dir holds, as "key: stored -> new"."""
    run_dir = Path(run.cfg.run.dir)
    if not (run_dir / CONFIG_FILE).exists() or not (run_dir / MODEL_FILE).exists():
        return []  # checkpoints without the settings they were made with: restore checks the shapes
    stored = load(run_dir / CONFIG_FILE, [f"run.dir={run_dir}"])
    differences = []
    for (key, old), (_, new) in zip(_flat(dataclasses.asdict(stored)), _flat(dataclasses.asdict(run.cfg))):
        if old != new and key not in _RESUMABLE_CHANGES | _PIPELINE_KEYS and not key.startswith(_RESUMABLE_SECTIONS):
            differences.append(f"{key}: {old!r} -> {new!r}")
    differences += _tokenizer_difference(run, stored.data.tokenizer) + pipeline_difference(stored, run)
    stored_model = json.loads((run_dir / MODEL_FILE).read_text(encoding="utf-8"))
    # compared in the flat spelling, which reads a model.json of either form (flat: written before the sub-configs)
    named = "label_names" in stored_model or "label_names" in stored_model.get("head_options", {})
    stored_flat = ModelConfig.from_dict(stored_model).to_flat()
    for key, new in run.model.config.to_flat().items():
        old = stored_flat[key]
        if key == "label_names" and not named:
            continue  # a model.json from before label names were kept: same labels, now named
        if key not in _RESUMABLE_MODEL_FIELDS | _PIPELINE_MODEL_FIELDS and old != new:
            differences.append(f"model {key}: {old!r} -> {new!r}")
    return differences


def pipeline_difference(stored: RunConfig, run: Run) -> list[str]:
    """A change of the pipeline's schedule (mesh.stage, train.microbatches, train.pipeline_repeats) is one of
    layout, which a resume may make, unless dropout is on: a pipeline draws each microbatch's dropout masks
    from the step's key folded with the microbatch's index, so whether the layers run as a pipeline and
    into how many microbatches the rows split decide the masks (the stages and repeats do not)."""
    flat = run.model.config.to_flat()
    rates = [f"{name}={flat[name]}" for name in ("dropout_rate", "attention_dropout_rate", "lora_dropout")
             if flat[name]]
    before = _dropout_draws(stored.mesh.stage, stored.train.microbatches)
    after = _dropout_draws(run.mesh.shape["stage"], run.cfg.train.microbatches)
    if not rates or before == after:
        return []

    def spelled(c: RunConfig) -> str:
        return (f"mesh.stage={c.mesh.stage}, train.microbatches={c.train.microbatches}, "
                f"train.pipeline_repeats={c.train.pipeline_repeats}")

    count = stored.train.microbatches or stored.mesh.stage
    keep = ("mesh.stage=1 (no pipeline)" if stored.mesh.stage == 1 else
            f"mesh.stage > 1 and train.microbatches={count}" if count > 0 else "mesh.stage=-1 and train.microbatches=0")
    return [f"pipeline schedule: {spelled(stored)} -> {spelled(run.cfg)}: with dropout on ({', '.join(rates)}) the "
            f"dropout masks would differ (drawn {before} -> {after}); resume with {keep} to keep them (the stages "
            "and pipeline_repeats may change), or train.resume=force"]


def _dropout_draws(stages: int, microbatches: int) -> str:
    """How a step draws its dropout masks under ``stages`` pipeline stages (-1: unknown, the devices left
    over) and train.microbatches: for the whole batch, or per pipeline microbatch."""
    if stages == 1:
        return "for the whole batch"
    count = microbatches or stages
    return f"per pipeline microbatch, {count if count > 0 else 'one per stage (mesh.stage=-1)'}"


def _tokenizer_difference(run: Run, stored_spec: str) -> list[str]:
    """data.tokenizer compared by what it resolves to, not by how it is spelled ('auto' that found no
    tokenizer.json means bytes; a path means its file's contents): the run folder keeps a copy of the
    tokenizer.json its run read with, and none for bytes."""
    kept = Path(run.cfg.run.dir) / TOKENIZER_FILE
    stored = kept.read_bytes() if kept.exists() else None
    new = run.tokenizer_file.read_bytes() if run.tokenizer_file is not None else None
    if stored == new:
        return []

    def resolved(contents: bytes | None) -> str:
        return "bytes" if contents is None else f"a tokenizer.json of {len(contents):,} bytes"

    other = ", another file" if stored is not None and new is not None else ""
    return [f"data.tokenizer: {stored_spec!r} ({resolved(stored)}) -> {run.cfg.data.tokenizer!r} "
            f"({resolved(new)}{other})"]


def _flat(tree: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for key, value in sorted(tree.items()):
        if isinstance(value, dict) and not (prefix == "model." and key == "overrides"):
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def accept_text(run: Run, position: dict) -> list[str]:
    """Refuse to resume onto training or held-out text other than the checkpoint's (a file edited since, sources
    appended to a shard folder: the same step would read other windows), unless train.resume=force; returns
    the difference forced through. Checkpoints from before the text was named pass."""
    stored, now = position.get("text"), run.objective.text_identity
    if stored is None or stored == now:
        return []
    difference = f"the training text: {stored} -> {now} (a hash of the tokens and the held-out split)"
    if run.cfg.train.resume != "force":
        raise ValueError(f"{run.cfg.run.dir} holds a run trained on other text than data.train, data.eval and "
                         f"data.mixture give now ({difference}): a source changed since. Restore it, use a new "
                         "run.dir, or train.resume=force to resume on the new text anyway")
    return [difference]


def accept_resume(run: Run) -> list[str]:
    """Refuse to resume a run.dir's run with settings that change what a step computes (the list of
    differences), unless train.resume=force; returns the differences forced through."""
    differences = resume_differences(run)
    if differences and run.cfg.train.resume != "force":
        raise ValueError(f"{run.cfg.run.dir} holds a run with other settings; resuming it with these would "
                         f"silently change what it computes:\n  " + "\n  ".join(differences) +
                         "\nUse its settings, a new run.dir, or train.resume=force to resume anyway.")
    return differences


def start_notes(run_dir: Path, manager) -> list[str]:
    """What a start found in its run folder and where it starts: checkpoints whose write was cut off (by a
    crash or a second interrupt) are removed and named; a run folder that has been used before says which
    step it resumes from, or that none was finished."""
    discarded = discard_partial_checkpoints(run_dir)
    notes = [f"discarded the partial checkpoint checkpoints/{name}: its write was cut off before it was "
             "finalized" for name in discarded]
    step = manager.latest_step() if manager is not None else None
    if step is not None:
        notes.append(f"resuming at step {step} from checkpoints/{step}")
    elif discarded or (run_dir / "metrics.jsonl").exists():
        notes.append("starting at step 0: no finished checkpoint in " + str(run_dir / "checkpoints"))
    return notes


def train(cfg: RunConfig, progress: bool = True) -> dict:
    """Train (resuming from run.dir's newest checkpoint), evaluate on the held-out split, append to
    metrics.jsonl, and return the history, the trained model and the wall time. The run folder is
    checked before anything is built and locked while the run lasts; an interrupt (SIGINT, SIGTERM)
    ends it at a step boundary with that step saved (``lifecycle.Interrupted``)."""
    run_dir = check_run_dir(cfg.run.dir)
    sharding.initialize_distributed(cfg.mesh.coordinator, cfg.mesh.num_processes, cfg.mesh.process_id)
    lock = RunDirLock(run_dir) if jax.process_index() == 0 else contextlib.nullcontext()
    with InterruptRequests() as interrupts, lock:  # handlers first: the lock's presence means they are in place
        interrupts.finalized = lambda: (finalized_steps(run_dir) or [None])[-1]
        if isinstance(lock, RunDirLock):
            interrupts.before_exit.append(lock.release)  # an exit on a second interrupt leaves no stale lock
        if getattr(lock, "note", None):
            print(f"note: {lock.note}")
        try:
            return run_training(cfg, interrupts, progress)
        except Exception as err:  # a full disk, from a save or a log line: one line, not every thread's traceback
            if disk_full(err):
                raise full_disk_error(run_dir, err) from None
            raise


def run_training(cfg: RunConfig, interrupts: InterruptRequests, progress: bool = True) -> dict:
    """The run itself: mesh, sharded state, jitted step, loop, log, evaluate, checkpoint."""
    run = Run.build(cfg)  # the mesh, the objective and its data, the model created sharded
    notes = run_notes(run)
    manager = checkpoint_manager(Path(cfg.run.dir), cfg.checkpoint.keep) if cfg.checkpoint.every else None
    resuming = manager is not None and manager.latest_step() is not None
    forced = accept_resume(run) if resuming else []  # nothing in run.dir is written before this
    if jax.process_index() == 0:
        notes += start_notes(Path(cfg.run.dir), manager)
    graphdef, params, rest = split_model(run.model)
    optimizer, schedule = make_optimizer(cfg, params)
    state = init_state(cfg, run.model, optimizer)
    train_step, eval_step = make_steps(graphdef, rest, optimizer, run.objective, cfg, run.mesh, shardings_of(state))
    rows = batch_sharding(run.mesh)
    state, start_step, position = restore(manager, state, base=run.base) if resuming else (state, 0, {})
    forced += accept_text(run, position)
    if jax.process_index() == 0:
        write_run_folder(run, notes)
    eval_batches = run.objective.eval_batches(cfg.eval.batches, cfg.train.batch_size)
    eval_memory = held_out_memory(run)
    report = Report(cfg, run.objective, run.model.config, schedule, start_step, int(state["skipped"]), progress,
                    forced_changes=forced)
    dataset = loader.batches(run.objective, cfg.train.batch_size, cfg.train.steps,
                             sharding.process_rows(cfg.train.batch_size), cfg.data.loader_threads, cfg.data.prefetch)
    batches = loader.start(dataset, start_step, position.get("loader"))
    started = time.perf_counter()
    try:
        for step in range(start_step, cfg.train.steps):
            state, metrics = train_step(state, sharding.from_process_rows(next(batches), rows))
            done = step + 1
            interrupted = interrupts.signum is not None
            evaluate = done % cfg.eval.every == 0 or done == cfg.train.steps
            log = evaluate or done % cfg.train.log_every == 0
            save = manager is not None and (done % cfg.checkpoint.every == 0 or done == cfg.train.steps or interrupted)
            if not (log or save or interrupted):
                continue
            jax.block_until_ready(state)  # the only host sync in the loop: at logging, saving and interrupts
            report.check_finite(int(state["skipped"]), done)
            if log:  # before the save: a crash after it must not leave a saved step without its record
                weights = eval_weights(state)
                held_out = lambda: run_eval(eval_step, run.objective, weights, eval_batches, rows,  # noqa: E731
                                            eval_memory)
                report.log(done, metrics, int(state["skipped"]), held_out if evaluate else None)
            if save:
                save_checkpoint(manager, state, {"step": done, "seed": cfg.run.seed, "objective": run.objective.name,
                                                 "batch_size": cfg.train.batch_size,
                                                 "loader": batches.get_state(),
                                                 "text": run.objective.text_identity}, run.base)
                interrupts.writing = lambda step=done: step if manager.is_saving_in_progress() else None
            if interrupted and done < cfg.train.steps:  # the checkpoint is finalized below, before this leaves
                raise Interrupted(done, interrupts.signum, saved=manager is not None)
    finally:  # a stop (or any error) still waits for checkpoints in flight
        report.close()
        if manager is not None:
            manager.wait_until_finished()
            interrupts.writing = lambda: None
            manager.close()
    nnx.update(run.model, state["params"], *([state["frozen"]] if "frozen" in state else []))
    report.plot()
    return {"history": report.history, "model": run.model, "objective": run.objective,
            "seconds": time.perf_counter() - started, "start_step": start_step, "skipped": int(state["skipped"])}


def command_line_config(argv: list[str]) -> RunConfig:
    """train.py's arguments, ``[CONFIG.yaml] [section.key=value ...]``, as a RunConfig; without a file,
    configs/default.yaml where it exists."""
    config_path = argv[0] if argv and "=" not in argv[0] and argv[0].endswith((".yaml", ".yml")) else None
    overrides = argv[1:] if config_path else argv
    if config_path is None and Path("configs/default.yaml").exists():
        config_path = "configs/default.yaml"
    return load(config_path, overrides)


def main(argv: list[str]) -> int:
    cfg = command_line_config(argv)
    result = train(cfg)
    if jax.process_index() != 0:
        return 0
    if not result["history"]:
        print(f"{cfg.run.dir} already holds a finished run of {cfg.train.steps} steps; nothing to do")
        return 0
    first, last = result["history"][0], result["history"][-1]
    resumed = f" (resumed at step {result['start_step']})" if result["start_step"] else ""
    held_out = ", ".join(f"{k.removeprefix('eval_')} {v:.3f}" for k, v in last.items() if k.startswith("eval_"))
    skipped = f"; {result['skipped']} steps skipped (non-finite)" if result["skipped"] else ""
    print(f"trained {cfg.train.steps} steps{resumed} in {result['seconds']:.0f} s: loss {first['loss']:.3f} -> "
          f"{last['loss']:.3f}; held-out {held_out}{skipped}; metrics in {Path(cfg.run.dir) / 'metrics.jsonl'}")
    if cfg.train.sample_tokens:
        text = sample(result["model"], result["objective"], cfg.train.sample_tokens, cfg.run.seed)
        if text is not None:
            print("sample:", text)
    return 0
