"""Run configuration: YAML (read with ``safe_load``) plus dotted ``key=value`` overrides, into frozen,
validated dataclasses. An unknown key fails with the closest valid key suggested."""

from __future__ import annotations

import dataclasses
import difflib
import typing
import warnings
from pathlib import Path
from typing import Any

import yaml

from jaxformer.train.corpus import parse_mixture
from jaxformer.train.data import PACKINGS, UL2_DENOISERS, parse_denoisers


@dataclasses.dataclass(frozen=True)
class RunSection:
    dir: str = "runs/default"
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class ModelSection:
    preset: str = "tiny-gpt"
    overrides: dict = dataclasses.field(default_factory=dict)  # ModelConfig fields to replace
    init_from: str = ""  # "hf:PATH" (a Hugging Face folder) or "jaxformer:PATH" (a checkpoint or run folder)
    # "" | encoder_decoder | prefix_lm: jf.adapt the init_from decoder into that family (T5Gemma-style); with
    # no init_from, the preset's adapted architecture freshly initialised (the from-scratch control)
    adapt: str = ""


@dataclasses.dataclass(frozen=True)
class DataSection:
    # python-docs (English text shipped with Python), a .txt or .jsonl file, or (causal_lm, span_corruption,
    # prefix_lm, ul2) a folder of token shards from `jaxformer tokenize`; those objectives tokenize a file into
    # run.dir/data-cache once and memory-map it (.jsonl.gz, .jsonl.zst and .parquet too); contrastive: shapes:N, N
    # pictures of drawn shapes with their captions (jaxformer/train/shapes.py); transcription: spoken:N, N utterances
    # spoken by espeak-ng with their transcripts (jaxformer/train/spoken.py)
    train: str = "python-docs"
    eval: str = ""  # held-out text (as data.train); empty: the last eval_fraction of the training documents or records
    # causal_lm, span_corruption, prefix_lm, ul2: training sources [{path, weight}] (folders or files, as data.train),
    # each row drawn from one in proportion to its weight; held out: data.eval, else each one's last eval_fraction
    mixture: list = dataclasses.field(default_factory=list)
    on_error: str = "stop"  # a bad record in a file tokenized into the cache: stop (named) | skip (counted, noted)
    loader_threads: int = 2  # threads that build the next batches while a step runs (Grain)
    prefetch: int = 4  # batches built ahead
    eval_fraction: float = 0.1
    tokenizer: str = "auto"  # bytes | a tokenizer.json (or its folder) | auto: init_from's tokenizer, else bytes
    target_len: int = 0  # seq2seq target length; 0: train.seq_len
    nsp: bool = True  # mlm: next-sentence prediction as in BERT (false: MLM alone, as RoBERTa)
    mask_probability: float = 0.15  # mlm, sop, rtd: fraction of tokens predicted (ELECTRA-large used 0.25)
    noise_density: float = 0.15  # span_corruption: fraction of tokens hidden
    mean_span_length: float = 3.0  # span_corruption
    target_fraction: float = 0.5  # prefix_lm: mean target share of a window (0.5: split point uniform), <= 0.5
    # ul2: the mixture of denoisers, each {mode: R | X | S, rate, mean_span (R, X), weight (default 1)}
    denoisers: list = dataclasses.field(default_factory=lambda: [dict(d) for d in UL2_DENOISERS])
    # question_answering: tokens two windows of one context share (0: a quarter of train.seq_len), the
    # longest question kept (0: none cut; a question that leaves no room for context is refused) and the
    # longest answer decoded, in tokens
    doc_stride: int = 0
    max_question_len: int = 0
    max_answer_len: int = 30
    # causal_lm, span_corruption, mlm without a pair task: documents (each packed row carries segment ids,
    # attention stays inside a document, positions restart at each) | concatenate (windows read across
    # documents, as before packing was document-aware). Unset: documents for a new run; a run folder's
    # existing run keeps what it had (concatenate when its config.yaml predates the key), so a resume
    # computes what the run computed.
    packing: str = ""


@dataclasses.dataclass(frozen=True)
class MeshSection:
    """Device mesh axis sizes; -1 takes the devices left over. The batch is split over data x fsdp x expert,
    each stack's layers over stage."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1
    sequence: int = 1  # context parallelism: each sequence split over this many devices (ring attention)
    stage: int = 1  # pipeline parallelism: each stack's layers split into this many stages (train.microbatches)
    # Multi-process runs (jax.distributed): "host:port" of process 0, or "auto" (Cloud TPU, SLURM);
    # empty: the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID environment, else one process.
    coordinator: str = ""
    num_processes: int = 0
    process_id: int = -1


@dataclasses.dataclass(frozen=True)
class TrainSection:
    # causal_lm | mlm | sop | rtd | span_corruption | seq2seq | classification | prefix_lm | ul2 | ...
    objective: str = "causal_lm"
    steps: int = 300
    batch_size: int = 16
    seq_len: int = 128
    log_every: int = 10
    sample_tokens: int = 120
    on_nan: str = "stop"  # stop: end the run with an error; skip: drop that update and go on
    max_skipped_steps: int = 10  # on_nan=skip: more dropped steps than this stop the run, as stop does
    resume: str = "auto"  # auto: resume a run.dir's run only with the settings it had; force: resume anyway
    grad_accum: int = 1  # micro-batches per step: batch_size / grad_accum rows each, gradients averaged
    # mesh.stage > 1: the pipeline's microbatches per micro-batch (0: one per stage; more shrink the bubble,
    # (stages - 1) / (microbatches x pipeline_repeats + stages - 1) of each step), and the chunks of layers each
    # stage holds (1: GPipe; 2 or more: the circular schedule, microbatches a multiple of mesh.stage)
    microbatches: int = 0
    pipeline_repeats: int = 1
    compute_dtype: str = "float32"  # float32 | bfloat16 (parameters and optimizer state stay float32)
    label_smoothing: float = 0.0  # the 2017 Transformer used 0.1
    # rtd: the discriminator's loss weight against the generator's MLM loss (ELECTRA's lambda, 50)
    rtd_weight: float = 50.0
    # rtd with a model that has no generator yet (model.generator_width 0): its width over the discriminator's
    # (ELECTRA's base and large: 1/4), rounded to whole heads
    generator_fraction: float = 0.25
    # MoE models with a selection bias (DeepSeek-V3, model router_bias=true): after each step every MoE
    # layer's bias moves by this much towards balance (up for underloaded experts, down for overloaded);
    # 0 freezes it. DeepSeek-V3 used 0.001. No effect on other models.
    router_bias_rate: float = 0.001


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    every: int = 100  # steps between checkpoints; 0 turns checkpointing off
    keep: int = 3  # the newest N finalized checkpoints are kept


@dataclasses.dataclass(frozen=True)
class EvalSection:
    every: int = 100
    batches: int = 4
    # Models with segment memory (Transformer-XL): memory slots to evaluate with; 0: the memory_len the
    # model trained with. Longer than in training is how Dai et al. evaluate (the memory is just state).
    memory_len: int = 0
    # seq2seq: also translate every held-out source (greedy, or beam search with num_beams) and score the outputs
    # against the targets: eval_bleu (sacrebleu's corpus BLEU, 0-100) and eval_exact_match. ``jaxformer eval``
    # turns it on for seq2seq runs.
    bleu: bool = False
    num_beams: int = 1
    # each translation starts with its reference's first token, forced: the target language's token of
    # M2M-100-style data ("__de__ ..."), so one batch is scored in several target languages
    force_first_target_token: bool = False


@dataclasses.dataclass(frozen=True)
class OptimSection:
    lr: float = 3e-3
    warmup_steps: int = 30
    schedule: str = "cosine"  # cosine | linear | constant | inverse_sqrt (the 2017 Transformer's)
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    b1: float = 0.9
    b2: float = 0.95


LORA_BASE_DTYPES = ("float", "int8")


@dataclasses.dataclass(frozen=True)
class LoraSection:
    """finetune.lora.*: train LoRA adapters (Hu et al. 2021) on a frozen base instead of every parameter."""

    rank: int = 0  # 0: a full fine-tune (no adapters)
    alpha: float = 16.0  # the update is scaled by alpha / rank (alpha / sqrt(rank) with rslora)
    targets: Any = ("q", "v")  # projection names (ModelConfig.lora_targets): a list, or "q,v"
    dropout: float = 0.0  # on the adapters' input, in training only
    rslora: bool = False
    # Parameter paths ('/'-joined prefixes) trained in full beside the adapters (PEFT's modules_to_save);
    # "auto": the objective's head where it is created fresh (sequence classification's), else nothing.
    trainable: Any = "auto"
    base_dtype: str = "float"  # float | int8: the frozen base's projection kernels stored int8 (QLoRA)

    def __post_init__(self):
        for field in ("targets", "trainable"):  # "q,v" on a command line means ["q", "v"]
            value = getattr(self, field)
            if isinstance(value, str) and not (field == "trainable" and value == "auto"):
                object.__setattr__(self, field, [v.strip() for v in value.split(",") if v.strip()])
            elif isinstance(value, tuple):
                object.__setattr__(self, field, list(value))
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 0:
            raise ValueError(f"finetune.lora.rank={self.rank!r} must be an integer >= 0 (0: no adapters)")
        if not 0 < self.alpha < float("inf"):
            raise ValueError(f"finetune.lora.alpha={self.alpha!r} must be a finite number > 0")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"finetune.lora.dropout={self.dropout!r} must lie in [0, 1)")
        if not isinstance(self.rslora, bool):
            raise ValueError(f"finetune.lora.rslora={self.rslora!r} must be true or false")
        if self.base_dtype not in LORA_BASE_DTYPES:
            raise ValueError(f"finetune.lora.base_dtype={self.base_dtype!r}; valid: 'float', 'int8' (QLoRA)")
        for field in ("targets", "trainable"):
            value = getattr(self, field)
            if not (field == "trainable" and value == "auto") and not (
                    isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
                raise ValueError(f"finetune.lora.{field}={value!r} must be a list of names"
                                 + (" or 'auto'" if field == "trainable" else ""))
        if self.rank:
            from jaxformer.model_config import check_lora_targets

            if not self.targets:
                raise ValueError("finetune.lora.targets is empty; name the projections to adapt, e.g. [q, v]")
            check_lora_targets(self.targets, "finetune.lora.targets")
        elif self.base_dtype != "float":
            raise ValueError(f"finetune.lora.base_dtype={self.base_dtype!r} needs finetune.lora.rank > 0 (an int8 base "
                             "is frozen, so only adapters could train)")


@dataclasses.dataclass(frozen=True)
class FinetuneSection:
    lora: LoraSection = LoraSection()
    # Parameter paths ('/'-joined prefixes, e.g. [projector]) that alone train: every other parameter is frozen (no
    # gradient, update, weight decay or optimizer state; still checkpointed whole). Empty: every parameter trains.
    # LLaVA's first stage trains its projector alone (configs/llava_shapes.yaml).
    train_only: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if not all(isinstance(p, str) and p for p in self.train_only):
            raise ValueError(f"finetune.train_only={self.train_only!r} must be a list of parameter paths")
        if self.train_only and self.lora.rank:
            raise ValueError(f"finetune.train_only={self.train_only!r} with finetune.lora.rank={self.lora.rank}: a "
                             "LoRA fine-tune trains its adapters; list what trains beside them in "
                             "finetune.lora.trainable")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    run: RunSection = RunSection()
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    optim: OptimSection = OptimSection()
    checkpoint: CheckpointSection = CheckpointSection()
    mesh: MeshSection = MeshSection()
    finetune: FinetuneSection = FinetuneSection()

    def __post_init__(self):
        from jaxformer.train.tasks import OBJECTIVES

        if self.train.objective not in OBJECTIVES:
            raise ValueError(f"train.objective={self.train.objective!r}; valid: {', '.join(map(repr, OBJECTIVES))}")
        if self.train.grad_accum < 1 or self.train.batch_size % self.train.grad_accum:
            raise ValueError(f"train.grad_accum={self.train.grad_accum} must be >= 1 and divide train.batch_size="
                             f"{self.train.batch_size}")
        if self.train.microbatches < 0 or self.train.pipeline_repeats < 1:
            raise ValueError(f"train.microbatches={self.train.microbatches} must be >= 0 (0: one per stage) and "
                             f"train.pipeline_repeats={self.train.pipeline_repeats} >= 1 (1: GPipe)")
        if (self.train.microbatches > 1 or self.train.pipeline_repeats > 1) and self.mesh.stage == 1:
            raise ValueError(f"train.microbatches={self.train.microbatches} and train.pipeline_repeats="
                             f"{self.train.pipeline_repeats} schedule a pipeline; set mesh.stage > 1 to have one")
        if self.train.compute_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"train.compute_dtype={self.train.compute_dtype!r}; valid: 'float32', 'bfloat16'")
        if not 0 <= self.train.router_bias_rate < float("inf"):  # NaN fails too
            raise ValueError(f"train.router_bias_rate={self.train.router_bias_rate} must be a finite number >= 0")
        if not 0 <= self.train.label_smoothing < 1:
            raise ValueError(f"train.label_smoothing={self.train.label_smoothing} must lie in [0, 1)")
        if not self.train.rtd_weight > 0 or not 0 < self.train.generator_fraction <= 1:
            raise ValueError(f"train.rtd_weight={self.train.rtd_weight} must be > 0 and train.generator_fraction="
                             f"{self.train.generator_fraction} must lie in (0, 1]")
        if not 0 < self.data.mask_probability < 1 or not 0 < self.data.noise_density < 1:
            raise ValueError("data.mask_probability and data.noise_density must lie in (0, 1)")
        if self.data.mean_span_length < 1 or self.data.target_len < 0:
            raise ValueError("data.mean_span_length must be >= 1 and data.target_len >= 0")
        if self.model.init_from and not self.model.init_from.startswith(("hf:", "jaxformer:")):
            raise ValueError(f"model.init_from={self.model.init_from!r} must be hf:PATH or jaxformer:PATH")
        if self.model.adapt not in ("", "encoder_decoder", "prefix_lm"):
            raise ValueError(f"model.adapt={self.model.adapt!r}; valid: '' (none), 'encoder_decoder', 'prefix_lm'")
        if not 0 < self.data.target_fraction <= 0.5:
            raise ValueError(f"data.target_fraction={self.data.target_fraction} must lie in (0, 0.5] (the mean share "
                             "of a window that is target; 0.5 splits it at a uniformly random point)")
        parse_denoisers(self.data.denoisers)
        if not self.data.packing:
            object.__setattr__(self, "data", dataclasses.replace(self.data, packing=_run_packing(self.run.dir)))
        if self.data.on_error not in ("stop", "skip"):
            raise ValueError(f"data.on_error={self.data.on_error!r}; valid: 'stop', 'skip'")
        for key in ("loader_threads", "prefetch"):
            value = getattr(self.data, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"data.{key}={value!r} must be a positive integer")
        if self.data.mixture:
            parse_mixture(self.data.mixture)
        if self.data.packing not in PACKINGS:
            raise ValueError(f"data.packing={self.data.packing!r}; valid: {', '.join(map(repr, PACKINGS))}")
        if self.data.doc_stride < 0 or self.data.max_question_len < 0 or self.data.max_answer_len < 1:
            raise ValueError(f"data.doc_stride={self.data.doc_stride} and data.max_question_len="
                             f"{self.data.max_question_len} must be >= 0 (0: the default), data.max_answer_len="
                             f"{self.data.max_answer_len} >= 1")
        for axis in ("stage", "data", "fsdp", "tensor", "expert", "sequence"):
            size = getattr(self.mesh, axis)
            if size == 0 or size < -1:
                raise ValueError(f"mesh.{axis}={size} must be a positive size or -1 (the devices left over)")
        if self.mesh.sequence > 1 and self.train.seq_len % (2 * self.mesh.sequence):
            raise ValueError(f"train.seq_len={self.train.seq_len} must be a multiple of 2 x mesh.sequence = "
                             f"{2 * self.mesh.sequence}: ring attention gives each device two halves of whole tokens")
        if self.mesh.num_processes < 0:
            raise ValueError(f"mesh.num_processes={self.mesh.num_processes} must be >= 0")
        for field in ("steps", "batch_size", "seq_len", "log_every"):
            if getattr(self.train, field) < 1:
                raise ValueError(f"train.{field}={getattr(self.train, field)} must be >= 1")
        if self.train.sample_tokens < 0:
            raise ValueError(f"train.sample_tokens={self.train.sample_tokens} must be >= 0")
        if self.train.on_nan not in ("stop", "skip"):
            raise ValueError(f"train.on_nan={self.train.on_nan!r}; valid: 'stop', 'skip'")
        if self.train.resume not in ("auto", "force"):
            raise ValueError(f"train.resume={self.train.resume!r}; valid: 'auto', 'force'")
        if self.train.max_skipped_steps < 0:
            raise ValueError(f"train.max_skipped_steps={self.train.max_skipped_steps} must be >= 0")
        if self.checkpoint.every < 0 or self.checkpoint.keep < 1:
            raise ValueError("checkpoint.every must be >= 0 and checkpoint.keep >= 1")
        if self.eval.every < 1 or self.eval.batches < 1:
            raise ValueError("eval.every and eval.batches must be >= 1")
        memory_len = self.eval.memory_len
        if not isinstance(memory_len, int) or isinstance(memory_len, bool) or memory_len < 0:
            raise ValueError(f"eval.memory_len={memory_len!r} must be an integer >= 0 (memory slots to evaluate "
                             "with; 0: the model's own memory_len)")
        if not isinstance(self.eval.bleu, bool):
            raise ValueError(f"eval.bleu={self.eval.bleu!r} must be true or false")
        if self.eval.bleu and self.train.objective != "seq2seq":
            raise ValueError(f"eval.bleu=true scores translations of held-out sources; train.objective="
                             f"{self.train.objective!r} has none (use seq2seq)")
        if not isinstance(self.eval.force_first_target_token, bool):
            raise ValueError(f"eval.force_first_target_token={self.eval.force_first_target_token!r} must be true or false")
        if self.eval.force_first_target_token and not self.eval.bleu:
            raise ValueError("eval.force_first_target_token=true forces the first token of held-out translations; "
                             "they are made only with eval.bleu=true")
        if not isinstance(self.eval.num_beams, int) or isinstance(self.eval.num_beams, bool) or self.eval.num_beams < 1:
            raise ValueError(f"eval.num_beams={self.eval.num_beams!r} must be an integer >= 1")
        if not 0 < self.data.eval_fraction < 1:
            raise ValueError(f"data.eval_fraction={self.data.eval_fraction} must lie in (0, 1)")
        if self.optim.schedule not in ("cosine", "linear", "constant", "inverse_sqrt"):
            raise ValueError(f"optim.schedule={self.optim.schedule!r}; valid: 'cosine', 'linear', 'constant', "
                             "'inverse_sqrt'")
        if not 0 < self.optim.lr < float("inf"):
            raise ValueError(f"optim.lr={self.optim.lr} must be a finite number > 0")
        if self.optim.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps={self.optim.warmup_steps} must be >= 0")
        if self.optim.warmup_steps >= self.train.steps:  # a short run under a config's default warmup
            warmup = self.train.steps // 10
            warnings.warn(f"optim.warmup_steps={self.optim.warmup_steps} is not below train.steps={self.train.steps}; "
                          f"warming up over {warmup} steps (a tenth of the run) instead", stacklevel=3)
            object.__setattr__(self, "optim", dataclasses.replace(self.optim, warmup_steps=warmup))
        if self.optim.clip_norm < 0 or self.optim.weight_decay < 0:
            raise ValueError("optim.clip_norm and optim.weight_decay must be >= 0")


SECTIONS = {"run": RunSection, "model": ModelSection, "data": DataSection, "train": TrainSection,
            "eval": EvalSection, "optim": OptimSection, "checkpoint": CheckpointSection, "mesh": MeshSection,
            "finetune": FinetuneSection}
NESTED = {"finetune.lora": LoraSection}  # sections inside a section: finetune.lora.rank


def _run_packing(run_dir: str) -> str:
    """data.packing when none is given: what the run in ``run_dir`` was trained with (its config.yaml from
    before the key existed: concatenate), or documents for a new run."""
    stored = Path(run_dir) / "config.yaml"  # (run.CONFIG_FILE: run.py reads this module, not the other way)
    if not stored.is_file():
        return "documents"
    try:
        saved = yaml.safe_load(stored.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return "documents"  # not a run's config: resuming refuses it by its own checks
    section = saved.get("data") if isinstance(saved, dict) else None
    packing = section.get("packing") if isinstance(section, dict) else None
    return packing or "concatenate"


def _valid_keys() -> list[str]:
    keys = []
    for name, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            inner = NESTED.get(f"{name}.{f.name}")
            keys += [f"{name}.{f.name}.{g.name}" for g in dataclasses.fields(inner)] if inner else [f"{name}.{f.name}"]
    return keys


def _parse_value(text: str) -> Any:
    """``key=value`` values are YAML scalars (200 -> int, true -> bool, text -> str); numbers in
    scientific notation such as 1e12 are floats (YAML 1.1 would read them as strings)."""
    if not text:
        return ""  # key= : the empty string (YAML would read it as null)
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def _coerce(section: str, field: str, value: Any, kind: Any) -> Any:
    """Values take their field's type; an int where a float is wanted is fine, anything else is not."""
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise ValueError(f"{section}.{field}={value!r} must be {kind.__name__}")


def _nested(name: str, fields: dict):
    cls = NESTED[name]
    kinds = typing.get_type_hints(cls)
    return cls(**{k: v if kinds[k] is Any else _coerce(name, k, v, kinds[k]) for k, v in fields.items()})


def _set(tree: dict, dotted: str, value: Any) -> None:
    valid = _valid_keys()
    section, _, field = dotted.partition(".")
    if f"{section}.{field}" not in valid and not (section == "model" and field.startswith("overrides.")):
        close = difflib.get_close_matches(dotted, valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(valid)}"
        raise ValueError(f"unknown config key {dotted!r}{hint}")
    if field.startswith("overrides."):
        tree.setdefault(section, {}).setdefault("overrides", {})[field.removeprefix("overrides.")] = value
    elif "." in field:  # a nested section's key (finetune.lora.rank)
        inner, _, key = field.partition(".")
        tree.setdefault(section, {}).setdefault(inner, {})[key] = value
    else:
        tree.setdefault(section, {})[field] = value


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read ``path`` (YAML, optional) and apply ``key=value`` overrides; validate everything."""
    tree: dict = {}
    file_model: dict = {}
    if path is not None:
        _check_exists(Path(path))
        with open(path, encoding="utf-8") as f:
            try:  # safe_load: plain data only, never a Python object (no configuration executes code)
                data = yaml.safe_load(f) or {}
            except UnicodeDecodeError as err:
                raise ValueError(f"{path} is not UTF-8 text (byte {err.start}); config files must be UTF-8") from None
            except yaml.YAMLError as err:
                raise ValueError(f"{path} is not plain YAML data: {err}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a mapping of sections ({', '.join(SECTIONS)})")
        file_model = dict(data.get("model") or {})
        for section, fields in data.items():
            if not isinstance(fields, dict):
                raise ValueError(f"{path}: section {section!r} must be a mapping")
            for field, value in fields.items():
                if section == "model" and field == "overrides":
                    for key, inner in (value or {}).items():
                        _set(tree, f"model.overrides.{key}", inner)
                elif f"{section}.{field}" in NESTED:
                    if not isinstance(value, dict):
                        raise ValueError(f"{path}: section {section}.{field} must be a mapping")
                    for key, inner in value.items():
                        _set(tree, f"{section}.{field}.{key}", inner)
                else:
                    _set(tree, f"{section}.{field}", value)
    from_file = dict(tree.get("model", {}).get("overrides", {}))
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like section.key=value (a config file comes first and "
                             "ends in .yaml or .yml)")
        key, _, text = item.partition("=")
        _set(tree, key.strip(), _parse_value(text))
    given = {item.partition("=")[0].strip().removeprefix("model.overrides.") for item in overrides}
    # The file's overrides were written for its own preset: another preset, or a checkpoint to start from
    # given on the command line, replaces the model they were written for (a file that names its own
    # init_from wrote them for that checkpoint).
    preset, init_from = (tree.get("model", {}).get(key, getattr(ModelSection, key)) for key in ("preset", "init_from"))
    file_preset = file_model.get("preset", ModelSection.preset)
    replaced = (f"model.preset={preset!r} replaces {path}'s {file_preset!r}" if preset != file_preset else
                f"model.init_from={init_from!r} replaces {path}'s preset {file_preset!r}"
                if init_from and not file_model.get("init_from") else None)
    dropped = [k for k in from_file if k not in given]
    if replaced and dropped:
        for key in dropped:
            del tree["model"]["overrides"][key]
        warnings.warn(f"{replaced}, so that file's model.overrides for it ({', '.join(dropped)}) are not applied; "
                      "give them as model.overrides.* to keep them", stacklevel=2)
    built = {}
    for name, fields in tree.items():
        kinds = typing.get_type_hints(SECTIONS[name])
        built[name] = SECTIONS[name](**{k: _nested(f"{name}.{k}", v) if f"{name}.{k}" in NESTED else
                                        _coerce(name, k, v, kinds[k]) for k, v in fields.items()})
    return RunConfig(**built)


def _check_exists(path: Path) -> None:
    """A config file that is not there fails naming it and the configs beside it (or in configs/)."""
    if path.is_file():
        return
    folder = path.parent if path.parent.is_dir() and path.parent != Path(".") else Path("configs")
    found = sorted(p.name for p in folder.glob("*.y*ml")) if folder.is_dir() else []
    there = f"; the configs in {folder}/: {', '.join(found)}" if found else ""
    raise ValueError(f"config file {path} {'is not a file' if path.exists() else 'does not exist'}{there}")


def dump(cfg: RunConfig) -> str:
    """The config as YAML that ``load`` reads back to an equal config."""
    return yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)
