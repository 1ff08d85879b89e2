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
    with pytest.raises(Exception):  # safe_load refuses to construct Python objects
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
    again = train(cfg, progress=False)
    assert [r["loss"] for r in again["history"]] == losses  # same seed, same batches, same losses
    text = sample(first["model"], "The ", 10)
    assert text.startswith("The ") and len(text.encode()) >= 4


def test_command_line_entry(tmp_path, capsys):
    assert main(TINY + [f"run.dir={tmp_path}", "train.sample_tokens=8"]) == 0
    out = capsys.readouterr().out
    assert "held-out loss" in out and "sample: The " in out
    with pytest.raises(ValueError, match="encoder"):
        main(TINY + [f"run.dir={tmp_path}", "model.preset=tiny-bert"])
