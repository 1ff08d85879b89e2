"""After a run: the held-out metrics of a checkpoint (``jaxformer eval``) and its export as a Hugging
Face folder (``jaxformer convert``), on whatever devices are present, with the tokenizer the run read its data
with (a bytes run's as a byte-level tokenizer.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from flax import nnx

from jaxformer.model_config import ModelConfig
from jaxformer.interop.tokenizer import Tokenizer, byte_level_tokenizer, load_tokenizer, write_byte_level_tokenizer
from jaxformer.sharding import shardings_of
from jaxformer.train.checkpoints import checkpoint_manager, restore
from jaxformer.train.data import ByteTokenizer
from jaxformer.train.run import CONFIG_FILE, MODEL_FILE, TOKENIZER_FILE, Run, held_out_memory
from jaxformer.train.run_config import load
from jaxformer.train.steps import (batch_sharding, frozen_filter, make_eval_step, run_eval, split_model,
                                   trained_filter)


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
    here = ["mesh.data=-1", "mesh.fsdp=1", "mesh.tensor=1", "mesh.expert=1", "mesh.sequence=1", "mesh.coordinator="]
    cfg = load(run_dir / CONFIG_FILE, own_tokenizer + here + list(overrides) + [f"run.dir={run_dir}"])
    trained = ModelConfig.from_dict(json.loads((run_dir / MODEL_FILE).read_text(encoding="utf-8")))
    run = Run.build(cfg, trained)  # the model as trained, even if model.init_from's folder is gone by now
    manager = checkpoint_manager(run_dir, cfg.checkpoint.keep, read_only=True)
    if manager.latest_step() is None:
        raise ValueError(f"{run_dir / 'checkpoints'} holds no finished checkpoint")
    params = nnx.state(run.model, trained_filter(run.model.config))  # a LoRA run: adapters (and head) only
    restored, step = restore(manager, {"params": params}, step, params_only=True, base=run.base)
    manager.close()
    nnx.update(run.model, restored)
    return run, step


def evaluate(run_dir: str | Path, step: int | None = None, overrides: tuple[str, ...] = ()) -> dict[str, float]:
    """The objective's held-out metrics of a checkpoint, computed exactly as the training run logs them. A
    model with segment memory adds ``memory_len`` (the memory evaluated with: eval.memory_len, else its
    own) and the ``eval_*_no_memory`` metrics of the same windows without earlier context. A seq2seq run
    translates its held-out sources too (``eval.bleu``, on unless an override says ``eval.bleu=false``):
    ``eval_bleu`` and ``eval_exact_match``."""
    if _objective_of(run_dir) == "seq2seq":
        overrides = ("eval.bleu=true", *overrides)
    run, step = restore_run(run_dir, step, overrides)
    graphdef, params, rest = split_model(run.model)
    if run.model.config.lora is not None:  # the frozen base is read by the step, not baked into it
        params = (params, nnx.state(run.model, frozen_filter(run.model.config)))
    memory = held_out_memory(run)
    eval_step = make_eval_step(graphdef, rest, run.objective, run.mesh, shardings_of(params),
                               None if memory is None else shardings_of(memory))
    batches = run.objective.eval_batches(run.cfg.eval.batches, run.cfg.train.batch_size)
    metrics = run_eval(eval_step, run.objective, params, batches, batch_sharding(run.mesh), memory)
    return {"step": step, **({} if memory is None else {"memory_len": memory.length}), **metrics}


def _objective_of(run_dir: str | Path) -> str | None:
    """The train.objective a run folder's saved config names (None: no such folder; restore_run says so)."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        return None
    saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return (saved.get("train") or {}).get("objective")


def export_hf(run_dir: str | Path, output: str | Path, step: int | None = None, merge: bool = False) -> int:
    """Write a checkpoint of a run as a Hugging Face folder (config.json + model.safetensors), with the
    run's tokenizer.json when it used one, its preprocessor_config.json when it read pictures or audio, and what
    its objective adds (``Objective.export_files``). A LoRA run needs ``merge``: its adapters merged into the base
    (dequantized, for an int8 one) as a plain model (``merge_adapter``)."""
    run, step = restore_run(run_dir, step)
    model = run.model
    if model.config.lora is not None and not merge:
        raise ValueError(f"{run_dir} is a LoRA fine-tune: write it merged into its base with --to-hf OUT --merge, or "
                         "its adapters alone with --to-peft OUT")
    if merge and model.config.lora is None:
        raise ValueError(f"{run_dir} has no LoRA adapters to merge; leave out --merge")
    (model.merge_adapter() if merge else model).save_pretrained(output)
    if getattr(run.objective, "processor", None) is not None:  # the image processor its pictures were read with
        run.objective.processor.save_pretrained(output)
    if run.tokenizer_file is not None:
        shutil.copy(run.tokenizer_file, Path(output) / TOKENIZER_FILE)
    else:  # bytes: written as a tokenizer.json that encodes and decodes them as ByteTokenizer does
        write_byte_level_tokenizer(output, byte_special_tokens(model.config.vocab_size), BYTE_TOKEN_ROLES)
    run.objective.export_files(output, model.config)
    return step


# The text of ByteTokenizer's specials in a tokenizer.json: spellings data.HFTokenizer finds them by again
BYTE_SPECIAL_SPELLINGS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "mask": "[MASK]"}
BYTE_TOKEN_ROLES = {f"{role}_token": text for role, text in BYTE_SPECIAL_SPELLINGS.items()}  # transformers' names


def byte_special_tokens(vocab_size: int) -> dict[int, str]:
    """ByteTokenizer's special ids and sentinels ({id: text}) that a model of ``vocab_size`` embeds (a plain
    causal-LM run embeds the 256 bytes alone)."""
    tokens = {ByteTokenizer.SPECIALS[role]: text for role, text in BYTE_SPECIAL_SPELLINGS.items()}
    top = ByteTokenizer.vocab_size - 1  # <extra_id_i> counts down from the top, as in T5
    tokens.update({top - i: f"<extra_id_{i}>" for i in range(ByteTokenizer.SENTINELS)})
    return {i: tokens[i] for i in sorted(tokens) if i < vocab_size}


def run_tokenizer(run_dir: str | Path, vocab_size: int) -> Tokenizer:
    """The tokenizer a run's data was read with: its own tokenizer.json, else the bytes (as ``export_hf``
    writes them for a model of ``vocab_size``)."""
    own = Path(run_dir) / TOKENIZER_FILE
    if own.exists():
        return load_tokenizer(own)
    specials = byte_special_tokens(vocab_size)
    pad = ByteTokenizer.SPECIALS["pad"]
    return Tokenizer(byte_level_tokenizer(specials), pad if pad in specials else None)
