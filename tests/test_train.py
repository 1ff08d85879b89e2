"""The first training path: run configs, the byte-level data, and a causal-LM run whose loss falls."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxformer.train import run_config
from jaxformer.train.data import ByteWindows, load_corpus
from jaxformer.train.loop import causal_lm_loss, main, sample, train

TINY = ["train.steps=30", "train.batch_size=8", "train.seq_len=32", "train.log_every=5", "eval.every=15",
        "eval.batches=2", "optim.warmup_steps=5", "train.sample_tokens=0"]


def test_overrides_are_typed_and_unknown_keys_suggest_the_closest(tmp_path):
    cfg = run_config.load(None, ["optim.lr=3e-4", "train.steps=200", "model.preset=tiny-llama",
                                 "model.overrides.decoder_layers=3"])
    assert cfg.optim.lr == 3e-4 and cfg.train.steps == 200 and cfg.model.preset == "tiny-llama"
    assert cfg.model.overrides == {"decoder_layers": 3}
    with pytest.raises(ValueError, match="did you mean 'train.steps'"):
        run_config.load(None, ["train.step=5"])
    with pytest.raises(ValueError, match="optim.schedule"):
        run_config.load(None, ["optim.schedule=exponential"])
    with pytest.raises(ValueError, match="section.key=value"):
        run_config.load(None, ["train.steps"])
    yaml_file = tmp_path / "bad.yaml"
    yaml_file.write_text("train:\n  stpes: 3\n")
    with pytest.raises(ValueError, match="did you mean 'train.steps'"):
        run_config.load(yaml_file)
    yaml_file.write_text("!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ValueError, match="not plain YAML data"):  # safe_load builds no Python objects
        run_config.load(yaml_file)


def test_default_config_file_is_valid():
    cfg = run_config.load("configs/default.yaml")
    assert cfg.model.preset == "tiny-gpt" and cfg.train.steps > 0


def test_batches_are_a_function_of_the_step():
    windows = ByteWindows(load_corpus("python-docs"), 16, 0.1, seed=3)
    np.testing.assert_array_equal(windows.batch(7, 4), windows.batch(7, 4))
    assert not np.array_equal(windows.batch(7, 4), windows.batch(8, 4))
    assert windows.batch(0, 4).shape == (4, 17)
    held_out = windows.eval_batches(2, 4)
    assert len(held_out) == 2 and all(b.max() < 256 for b in held_out)


def test_masked_loss_ignores_masked_positions():
    logits = np.random.default_rng(0).normal(size=(2, 3, 5)).astype(np.float32)
    targets = np.array([[1, 2, 3], [4, 0, 1]])
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    full = causal_lm_loss(logits, targets, mask)
    changed = causal_lm_loss(logits, np.array([[1, 2, 0], [4, 3, 3]]), mask)
    assert float(full) == pytest.approx(float(changed))


def test_training_loss_falls_and_is_reproducible(tmp_path):
    cfg = run_config.load(None, TINY + [f"run.dir={tmp_path}"])
    first = train(cfg, progress=False)
    losses = [r["loss"] for r in first["history"]]
    assert losses[-1] < losses[0] - 0.5, losses
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s"} <= set(records[0])
    assert "eval_loss" in records[-1] and records[-1]["step"] == 30
    png = (tmp_path / "loss.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and b"eval_loss" in events[0].read_bytes()
    again = train(run_config.load(None, TINY + [f"run.dir={tmp_path / 'again'}"]), progress=False)
    assert [r["loss"] for r in again["history"]] == losses  # same seed, same batches, same losses
    text = sample(first["model"], "The ", 10)
    assert text.startswith("The ") and len(text.encode()) >= 4


def test_command_line_entry(tmp_path, capsys):
    assert main(TINY + [f"run.dir={tmp_path}", "train.sample_tokens=8"]) == 0
    out = capsys.readouterr().out
    assert "held-out loss" in out and "sample: The " in out
    with pytest.raises(ValueError, match="encoder"):
        main(TINY + [f"run.dir={tmp_path}", "model.preset=tiny-bert"])
    from jaxformer.cli import main as cli_main

    assert cli_main(["train", *TINY, f"run.dir={tmp_path / 'cli'}"]) == 0
    assert cli_main(["train", "train.stepz=3"]) == 2


def _tiny_yaml(tmp_path, steps: int) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "model: {preset: tiny-gpt}\n"
        f"train: {{steps: {steps}, batch_size: 8, seq_len: 32, log_every: 5, sample_tokens: 0}}\n"
        "eval: {every: 50, batches: 1}\n"
        "optim: {warmup_steps: 5}\n"
        "checkpoint: {every: 10, keep: 2}\n")
    return str(path)


def _losses(run_dir) -> dict[int, float]:
    """The last logged loss of every step (a resumed run may log a step twice)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records}


def test_kill_9_then_rerun_resumes_bit_exactly(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    config = _tiny_yaml(tmp_path, steps=300)
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    command = [sys.executable, "train.py", config]
    process = subprocess.Popen(command + [f"run.dir={crashed}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (crashed / "checkpoints" / "20").is_dir():
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    # A half-written checkpoint left by a crash must not break the next run.
    (crashed / "checkpoints" / "990.orbax-checkpoint-tmp-123").mkdir(exist_ok=True)
    resumed = subprocess.run(command + [f"run.dir={crashed}"], capture_output=True, text=True, check=True)
    assert "resumed at step" in resumed.stdout
    subprocess.run(command + [f"run.dir={clean}"], capture_output=True, text=True, check=True)
    reference, after_crash = _losses(clean), _losses(crashed)
    assert max(reference) == 300
    assert {step: after_crash[step] for step in reference} == reference  # bit for bit, every logged step


def test_restoring_into_a_different_model_fails_clearly(tmp_path):
    config = _tiny_yaml(tmp_path, steps=10)
    main([config, f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match="does not match this model"):
        main([config, f"run.dir={tmp_path / 'run'}", "train.steps=20", "model.overrides.d_model=32"])


def test_non_finite_loss_stops_or_skips(tmp_path):
    base = TINY + ["checkpoint.every=10"]
    # A learning rate this large blows the weights up within a few steps.
    with pytest.raises(FloatingPointError, match="non-finite"):
        main(base + [f"run.dir={tmp_path / 'stop'}", "optim.lr=1e12", "optim.clip_norm=0"])
    cfg = run_config.load(None, base + [f"run.dir={tmp_path / 'skip'}", "optim.lr=1e12", "optim.clip_norm=0",
                                        "train.on_nan=skip"])
    result = train(cfg, progress=False)
    assert any("skipped_steps" in r for r in result["history"])
    params = [np.asarray(x) for x in __import__("jax").tree.leaves(__import__("flax").nnx.state(result["model"]))]
    assert all(np.isfinite(p).all() for p in params)  # dropped updates never reached the weights


def test_values_take_their_field_types():
    assert run_config.load(None, ["optim.lr=1e12"]).optim.lr == 1e12
    with pytest.raises(ValueError, match="train.steps='many' must be int"):
        run_config.load(None, ["train.steps=many"])
