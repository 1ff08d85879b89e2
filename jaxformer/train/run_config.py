"""Run configuration: YAML (read with ``safe_load``) plus dotted ``key=value`` overrides, into frozen,
validated dataclasses. An unknown key fails with the closest valid key suggested."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any

import yaml


@dataclasses.dataclass(frozen=True)
class RunSection:
    dir: str = "runs/default"
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class ModelSection:
    preset: str = "tiny-gpt"
    overrides: dict = dataclasses.field(default_factory=dict)  # ModelConfig fields to replace


@dataclasses.dataclass(frozen=True)
class DataSection:
    corpus: str = "python-docs"  # English text shipped with Python (pydoc topics), or a path to a .txt file
    eval_fraction: float = 0.1  # the held-out tail of the corpus


@dataclasses.dataclass(frozen=True)
class TrainSection:
    steps: int = 300
    batch_size: int = 16
    seq_len: int = 128
    log_every: int = 10
    sample_tokens: int = 120
    on_nan: str = "stop"  # stop: end the run with an error; skip: drop that update and go on


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    every: int = 100  # steps between checkpoints; 0 turns checkpointing off
    keep: int = 3  # the newest N finalized checkpoints are kept


@dataclasses.dataclass(frozen=True)
class EvalSection:
    every: int = 100
    batches: int = 4


@dataclasses.dataclass(frozen=True)
class OptimSection:
    lr: float = 3e-3
    warmup_steps: int = 30
    schedule: str = "cosine"  # cosine | linear | constant
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    b1: float = 0.9
    b2: float = 0.95


@dataclasses.dataclass(frozen=True)
class RunConfig:
    run: RunSection = RunSection()
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    optim: OptimSection = OptimSection()
    checkpoint: CheckpointSection = CheckpointSection()

    def __post_init__(self):
        for field in ("steps", "batch_size", "seq_len", "log_every"):
            if getattr(self.train, field) < 1:
                raise ValueError(f"train.{field}={getattr(self.train, field)} must be >= 1")
        if self.train.sample_tokens < 0:
            raise ValueError(f"train.sample_tokens={self.train.sample_tokens} must be >= 0")
        if self.train.on_nan not in ("stop", "skip"):
            raise ValueError(f"train.on_nan={self.train.on_nan!r}; valid: 'stop', 'skip'")
        if self.checkpoint.every < 0 or self.checkpoint.keep < 1:
            raise ValueError("checkpoint.every must be >= 0 and checkpoint.keep >= 1")
        if self.eval.every < 1 or self.eval.batches < 1:
            raise ValueError("eval.every and eval.batches must be >= 1")
        if not 0 < self.data.eval_fraction < 1:
            raise ValueError(f"data.eval_fraction={self.data.eval_fraction} must lie in (0, 1)")
        if self.optim.schedule not in ("cosine", "linear", "constant"):
            raise ValueError(f"optim.schedule={self.optim.schedule!r}; valid: 'cosine', 'linear', 'constant'")
        if not self.optim.lr > 0:
            raise ValueError(f"optim.lr={self.optim.lr} must be > 0")
        if not 0 <= self.optim.warmup_steps < self.train.steps:
            raise ValueError(f"optim.warmup_steps={self.optim.warmup_steps} must lie in [0, train.steps="
                             f"{self.train.steps})")
        if self.optim.clip_norm < 0 or self.optim.weight_decay < 0:
            raise ValueError("optim.clip_norm and optim.weight_decay must be >= 0")


SECTIONS = {"run": RunSection, "model": ModelSection, "data": DataSection, "train": TrainSection,
            "eval": EvalSection, "optim": OptimSection, "checkpoint": CheckpointSection}


def _valid_keys() -> list[str]:
    return [f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def _parse_value(text: str) -> Any:
    """``key=value`` values are YAML scalars (200 -> int, true -> bool, text -> str); numbers in
    scientific notation such as 1e12 are floats (YAML 1.1 would read them as strings)."""
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


def _set(tree: dict, dotted: str, value: Any) -> None:
    valid = _valid_keys()
    section, _, field = dotted.partition(".")
    if f"{section}.{field}" not in valid and not (section == "model" and field.startswith("overrides.")):
        close = difflib.get_close_matches(dotted, valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(valid)}"
        raise ValueError(f"unknown config key {dotted!r}{hint}")
    if field.startswith("overrides."):
        tree.setdefault(section, {}).setdefault("overrides", {})[field.removeprefix("overrides.")] = value
    else:
        tree.setdefault(section, {})[field] = value


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read ``path`` (YAML, optional) and apply ``key=value`` overrides; validate everything."""
    tree: dict = {}
    if path is not None:
        with open(path, encoding="utf-8") as f:
            try:  # safe_load: plain data only, never a Python object (no configuration executes code)
                data = yaml.safe_load(f) or {}
            except yaml.YAMLError as err:
                raise ValueError(f"{path} is not plain YAML data: {err}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a mapping of sections (run, model, data, train, eval, optim)")
        for section, fields in data.items():
            if not isinstance(fields, dict):
                raise ValueError(f"{path}: section {section!r} must be a mapping")
            for field, value in fields.items():
                if section == "model" and field == "overrides":
                    for key, inner in (value or {}).items():
                        _set(tree, f"model.overrides.{key}", inner)
                else:
                    _set(tree, f"{section}.{field}", value)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like section.key=value")
        key, _, text = item.partition("=")
        _set(tree, key.strip(), _parse_value(text))
    built = {}
    for name, fields in tree.items():
        kinds = typing.get_type_hints(SECTIONS[name])
        built[name] = SECTIONS[name](**{k: _coerce(name, k, v, kinds[k]) for k, v in fields.items()})
    return RunConfig(**built)
