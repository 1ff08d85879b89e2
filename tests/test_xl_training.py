"""Training and evaluating Transformer-XL: ordered stream batches, the segment memory in the train state
and the checkpoint, a bit-exact resume after SIGKILL, held-out loss with and without memory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import jaxformer as jf
from jaxformer.cache import Memory
from jaxformer.sharding import BATCH_AXES, shardings_of
from jaxformer.train import run_config
from jaxformer.train.checkpoints import checkpoint_manager, restore
from jaxformer.train.data import ByteTokenizer
from jaxformer.train.objectives import ratio
from jaxformer.train.tasks import make_objective
from jaxformer.train.run import train
from jaxformer.train.steps import batch_sharding, empty_memory, init_state, make_optimizer, make_steps, run_eval
from conftest import simulated_devices

ROOT = Path(__file__).resolve().parents[1]
PRESET = "tiny-transformer-xl"
ROWS, SEQ, MEMORY = 4, 16, 16
TINY = [f"model.preset={PRESET}", f"model.overrides.memory_len={MEMORY}", f"train.batch_size={ROWS}",
        f"train.seq_len={SEQ}", "train.log_every=5", "eval.batches=4", "optim.warmup_steps=5", "train.sample_tokens=0"]


def _config_file(tmp_path: Path, steps: int) -> str:
    path = tmp_path / "xl.yaml"
    path.write_text(f"model: {{preset: {PRESET}, overrides: {{memory_len: {MEMORY}}}}}\n"
                    f"train: {{steps: {steps}, batch_size: {ROWS}, seq_len: {SEQ}, log_every: 5, sample_tokens: 0}}\n"
                    "eval: {every: 1000, batches: 4}\n"
                    "optim: {warmup_steps: 5}\n"
                    "checkpoint: {every: 10, keep: 2}\n")
    return str(path)


STEPS = 100


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> tuple[str, Path, dict]:
    """An uninterrupted run (in this process) of the config the SIGKILL test interrupts, and what it
    returned (its trained model, created sharded, serves as the template the checkpoints restore into)."""
    folder = tmp_path_factory.mktemp("xl")
    config = _config_file(folder, STEPS)
    result = train(run_config.load(config, [f"run.dir={folder / 'clean'}"]), progress=False)
    return config, folder / "clean", result


@pytest.fixture(scope="module")
def built(clean_run):
    """That run's config, trained model, objective, mesh and optimizer (building a model compiles: once)."""
    config, run_dir, result = clean_run
    cfg, model = run_config.load(config, [f"run.dir={run_dir}"]), result["model"]
    params = nnx.state(model, nnx.Param)
    return cfg, model, result["objective"], jax.tree.leaves(params)[0].sharding.mesh, make_optimizer(cfg, params)[0]


def test_ordered_batches_continue_each_row_where_the_last_step_ended():
    cfg = run_config.load(None, TINY)
    objective = make_objective(cfg, ByteTokenizer())
    objective.adapt(jf.config(PRESET).replace(memory_len=MEMORY), fresh=True)
    tokens = objective.train.stream.read(0, len(objective.train.stream))
    row_len = len(tokens) // ROWS
    per_row = (row_len - 1) // SEQ
    first = objective.batch(0, ROWS)
    for r in range(ROWS):  # row r is the r-th contiguous piece of the training stream
        np.testing.assert_array_equal(first["input_ids"][r], tokens[r * row_len:r * row_len + SEQ])
    for step in (0, 1, 5, per_row - 2):
        now, after = objective.batch(step, ROWS), objective.batch(step + 1, ROWS)
        np.testing.assert_array_equal(after["input_ids"][:, 0], now["labels"][:, -1])  # no gap, no overlap
        np.testing.assert_array_equal(np.concatenate([now["input_ids"], after["input_ids"]], axis=1),
                                      np.stack([tokens[r * row_len + step * SEQ:][:2 * SEQ] for r in range(ROWS)]))
        assert not after["fresh"].any()
    assert first["fresh"].all() and first["fresh"].shape == (ROWS,)
    wrapped = objective.batch(per_row, ROWS)  # the next pass starts every row over: its memory is emptied
    assert wrapped["fresh"].all()
    np.testing.assert_array_equal(wrapped["input_ids"], first["input_ids"])
    held_out = objective.eval_batches(3, ROWS)
    assert held_out[0]["fresh"].all() and not held_out[2]["fresh"].any()
    np.testing.assert_array_equal(held_out[2]["input_ids"][:, 0], held_out[1]["labels"][:, -1])
    # Without memory the same preset trains on seeded random windows, as every other model does.
    objective.adapt(jf.config(PRESET).replace(memory_len=0), fresh=True)
    assert "fresh" not in objective.batch(0, ROWS)
    assert not np.array_equal(objective.batch(1, ROWS)["input_ids"][:, 0], objective.batch(0, ROWS)["labels"][:, -1])


def test_the_memory_is_train_state_split_along_the_batch_and_emptied_for_fresh_rows(clean_run, built):
    cfg, model, objective, mesh, optimizer = built
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    state = jax.tree.map(jnp.copy, init_state(cfg, model, optimizer))  # the step donates it; the model keeps its own
    memory, model_cfg = state["memory"], model.config
    assert isinstance(memory, Memory) and not memory.valid.any()
    assert memory.hidden.shape == (model_cfg.decoder_layers, ROWS, MEMORY, model_cfg.d_model)
    assert memory.hidden.sharding.spec == P(None, BATCH_AXES) and memory.valid.sharding.spec == P(BATCH_AXES)
    train_step, eval_step = make_steps(graphdef, rest, optimizer, objective, cfg, mesh, shardings_of(state))
    # The trained parameters, evaluated as the run's last logged evaluation was: the same numbers.
    held_out = run_eval(eval_step, objective, state["params"], objective.eval_batches(4, ROWS), batch_sharding(mesh),
                        empty_memory(model, ROWS, None, mesh))
    logged = json.loads((clean_run[1] / "metrics.jsonl").read_text().splitlines()[-1])
    assert held_out == {k: v for k, v in logged.items() if k.startswith("eval_")}
    first, second = objective.batch(0, ROWS), objective.batch(1, ROWS)
    state, _ = train_step(state, first)
    state, _ = train_step(state, second)
    full = state["memory"]
    assert full.valid.all() and int(state["step"]) == 2 and np.abs(np.asarray(full.hidden)).max() > 0
    # A fresh row ignores whatever its memory holds: the same loss as from an empty memory, bit for bit;
    # a row that goes on uses it.
    empty = empty_memory(model, ROWS, None, mesh)
    from_empty = float(ratio(eval_step(state["params"], first, empty)[0]["loss"]))
    assert float(ratio(eval_step(state["params"], first, full)[0]["loss"])) == from_empty
    going_on = dict(first, fresh=np.zeros(ROWS, bool))
    assert float(ratio(eval_step(state["params"], going_on, full)[0]["loss"])) != from_empty


def _saved(run_dir: Path) -> list[int]:
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []


def _final_state(built, run_dir: Path) -> dict:
    cfg, model, _, _, optimizer = built
    manager = checkpoint_manager(run_dir, 2, read_only=True)
    state, step, _ = restore(manager, init_state(cfg, model, optimizer))
    manager.close()
    assert step == STEPS
    return state


def test_sigkill_then_rerun_resumes_bit_exactly_memory_included(clean_run, built):
    config, clean, _ = clean_run
    crashed = clean.parent / "crashed"
    command = [sys.executable, "train.py", config, f"run.dir={crashed}"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 600  # only bounds a hung run: a loaded machine is slow
    while 20 not in _saved(crashed):
        assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()[-2000:]}"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    resumed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0 and "resumed at step" in resumed.stdout, resumed.stderr[-2000:]
    assert (crashed / "checkpoints" / str(STEPS) / "memory").is_dir()  # the memory is saved with the step
    reference, after_crash = _final_state(built, clean), _final_state(built, crashed)
    assert reference["memory"].valid.all() and np.abs(np.asarray(reference["memory"].hidden)).max() > 0
    for part in ("params", "memory", "opt_state"):
        for a, b in zip(jax.tree.leaves(reference[part]), jax.tree.leaves(after_crash[part]), strict=True):
            np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=part)
    losses = [{r["step"]: r["loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())}
              for d in (clean, crashed)]
    assert losses[0] == losses[1] and max(losses[0]) == STEPS


def test_eval_reports_the_loss_with_and_without_memory_and_takes_a_longer_memory(clean_run, capsys):
    from jaxformer.cli import main as cli_main

    _, run_dir, _ = clean_run
    logged = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert logged["step"] == STEPS
    assert {"eval_loss", "eval_loss_no_memory", "eval_accuracy", "eval_accuracy_no_memory"} <= set(logged)
    assert logged["eval_loss"] != logged["eval_loss_no_memory"]  # the same windows, with and without the earlier ones
    capsys.readouterr()
    assert cli_main(["eval", str(run_dir), f"eval.memory_len={3 * MEMORY}", "--json"]) == 0
    longer = json.loads(capsys.readouterr().out)
    assert longer["step"] == STEPS and longer["memory_len"] == 3 * MEMORY
    assert longer["eval_loss"] != logged["eval_loss"]  # windows 2-4 see up to 3 earlier segments, not one
    # Without memory the windows are scored alone whatever size the (empty) memory has.
    assert longer["eval_loss_no_memory"] == pytest.approx(logged["eval_loss_no_memory"], rel=1e-5)
    assert cli_main(["eval", str(run_dir), "eval.memory_len=-1"]) == 2
    assert "eval.memory_len=-1 must be an integer >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("overrides, message", [
    (["train.grad_accum=2"], r"train.grad_accum=2 does not work with a segment memory \(model memory_len=16\)"),
    (["model.preset=tiny-gpt", "model.overrides.memory_len=0", "eval.memory_len=64"],
     r"eval.memory_len=64 needs a model with segment memory .* model 'tiny-gpt' has position='learned'"),
    (["eval.memory_len=-5"], "eval.memory_len=-5 must be an integer >= 0"),
    (["eval.memory_len=many"], "eval.memory_len='many' must be int"),
])
def test_settings_that_do_not_fit_a_segment_memory_are_refused_before_anything_compiles(tmp_path, overrides,
                                                                                          message):
    with pytest.raises(ValueError, match=message):
        train(run_config.load(None, TINY + ["train.steps=10", f"run.dir={tmp_path}"] + overrides), progress=False)
    assert not (tmp_path / "checkpoints").exists()


def test_the_memory_split_over_four_devices_trains_like_one_device(tmp_path):
    """Six steps with the rows and their memories split over four simulated devices (mesh.data=4) log
    the losses of one device: the memory filled and carried from step to step follows its rows."""
    short = TINY + ["train.steps=6", "train.log_every=1", "eval.every=6", "eval.batches=2"]
    one = train(run_config.load(None, short + [f"run.dir={tmp_path / 'one'}"]), progress=False)["history"]
    env = simulated_devices(4)
    subprocess.run([sys.executable, "train.py", *short, f"run.dir={tmp_path / 'four'}", "mesh.data=4"], env=env,
                   cwd=ROOT, check=True, capture_output=True)
    four = [json.loads(line) for line in (tmp_path / "four" / "metrics.jsonl").read_text().splitlines()]
    for key in ("loss", "eval_loss", "eval_loss_no_memory"):  # float32 sums in another order only
        np.testing.assert_allclose([r[key] for r in four if key in r], [r[key] for r in one if key in r], rtol=1e-5)

