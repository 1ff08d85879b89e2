"""The accelerator benchmark: its report from a ``--small`` run, and the chip tables behind MFU and the
decoding bound (matched against the ``device_kind`` strings real chips report); the data benchmark's
``--loader`` mode at a toy size."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import pytest

import jaxformer as jf
from jaxformer import flops

ROOT = Path(__file__).resolve().parents[1]
TRAIN_ROWS = ("gpt2-medium", "llama-1b", "bert-large", "t5-large")


@pytest.mark.parametrize("kind, peak, bandwidth", [
    ("NVIDIA H100 80GB HBM3", 989e12, 3.35e12),
    ("NVIDIA H100 PCIe", 756e12, 2.0e12),
    ("NVIDIA H200", 989e12, 4.8e12),
    ("NVIDIA A100-SXM4-80GB", 312e12, 2.039e12),
    ("NVIDIA A100-SXM4-40GB", 312e12, 1.555e12),
    ("NVIDIA L4", 121e12, 300e9),
    ("TPU v4", 275e12, 1.2e12),
    ("TPU v5 lite", 197e12, 819e9),  # v5e
    ("TPU v5e", 197e12, 819e9),
    ("TPU v5", 459e12, 2.765e12),  # v5p
    ("TPU v5p", 459e12, 2.765e12),
    ("TPU v6 lite", 918e12, 1.64e12),  # v6e
    ("TPU v6e", 918e12, 1.64e12),
])
def test_chip_tables_take_the_most_specific_key(kind, peak, bandwidth):
    assert flops.chip_value(flops.PEAK_BF16_FLOPS, kind) == peak
    assert flops.chip_value(flops.HBM_BYTES_PER_S, kind) == bandwidth


@pytest.mark.parametrize("kind", ["NVIDIA L40S", "TPU v3", "TPU7x", "cpu"])
def test_chips_missing_from_the_tables_get_no_figure(kind):
    assert flops.chip_value(flops.PEAK_BF16_FLOPS, kind) is None
    assert flops.chip_value(flops.HBM_BYTES_PER_S, kind) is None


def _forget_peaks():
    flops.forget_peaks()


def test_accelerator_peaks_come_from_the_datasheet_per_chip(monkeypatch):
    chip = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")
    monkeypatch.setattr(jax, "local_devices", lambda: [chip] * 4)
    monkeypatch.setattr(jax, "local_device_count", lambda: 4)
    _forget_peaks()
    try:
        assert flops.peak_flops("bfloat16")[0] == 4 * 197e12
        assert flops.peak_flops("float32")[0] == 4 * 197e12 / 2
        assert flops.peak_bandwidth()[0] == 819e9  # one chip's: decoding reads its own memory
        chip.device_kind = "TPU7x"
        _forget_peaks()
        assert math.isnan(flops.peak_flops("bfloat16")[0]) and math.isnan(flops.peak_bandwidth()[0])
    finally:
        _forget_peaks()  # the real device's figures, for whoever asks next


def test_decode_bytes_count_weights_once_and_the_visible_cache():
    cfg = jf.config("tiny-llama")  # untied: the input embedding is read one row per token, the head whole
    params = dict(jax.tree_util.tree_flatten_with_path(jf.abstract_params(cfg))[0])
    weights = sum(leaf.size * leaf.dtype.itemsize for path, leaf in params.items()
                  if str(path[0].key) in ("decoder", "lm_head"))
    kv_per_token = 2 * cfg.decoder_layers * cfg.kv_heads * cfg.head_dim_ * 4  # float32 keys and values
    assert flops.decode_bytes_per_step(cfg, 3, 10) == weights + 3 * 10 * kv_per_token
    sliding = cfg.replace(attention="sliding", window_size=4)
    assert flops.decode_bytes_per_step(sliding, 1, 10) == weights + 4 * kv_per_token
    alternating = cfg.replace(attention="alternating", window_size=4)  # the odd layers' rolling caches hold 4
    local = cfg.decoder_layers // 2
    per_layer = kv_per_token // cfg.decoder_layers
    assert flops.decode_bytes_per_step(alternating, 1, 10) == weights + per_layer * (
        10 * (cfg.decoder_layers - local) + 4 * local)
    t5 = jf.config("tiny-t5")  # cross-attention reads the encoder's keys and values at every step
    source_kv = flops.decode_bytes_per_step(t5, 1, 10, source_length=20) - flops.decode_bytes_per_step(t5, 1, 10)
    assert source_kv == 20 * 2 * t5.decoder_layers * t5.kv_heads * t5.head_dim_ * 4


def test_accelerator_benchmark_small_run_reports_every_row():
    # The suite's XLA flags (conftest: unoptimised code, the classic emitters) compile in about half the time; this
    # checks the report, not the speed.
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "benchmarks/accelerator.py", "--small", "--json"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    machine = report["machine"]
    assert machine["platform"] == "cpu" and machine["peak_dtype"] == "float32"
    assert machine["peak_flops"] > 0 and machine["bandwidth_bytes_per_s"] > 0
    assert set(report["train"]) == set(TRAIN_ROWS)
    for name, row in report["train"].items():
        assert "error" not in row, (name, row)
        assert math.isfinite(row["tokens_per_s"]) and row["tokens_per_s"] > 0, (name, row)
        assert 0 < row["mfu"] < 1, (name, row)
        assert row["compile_s"] > 0 and math.isfinite(row["loss"]), (name, row)
    assert report["train"]["t5-large"]["target_length"] > 0
    assert [row["batch"] for row in report["decode"]] == [1, 64]
    for row in report["decode"]:
        assert "error" not in row, row
        assert row["tokens_per_s"] > 0 and row["compile_s"] > 0, row
        assert 0 < row["bandwidth_fraction"] <= 1.5, row


def test_data_benchmark_loader_mode_reports_both_sides_and_their_ratio():
    """benchmarks/data.py --loader at a toy size: a shard folder made and read, both sides timed, the ratio theirs."""
    out = subprocess.run([sys.executable, "benchmarks/data.py", "--loader", "--mb", "0.3", "--loader-batches", "4",
                          "--steps", "2", "--repeats", "1", "--json"],
                         cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert (report["batch_size"], report["seq_len"]) == (16, 128)  # configs/default.yaml's run
    assert report["loader_tokens_per_s"] > 0 and report["step_tokens_per_s"] > 0
    assert len(report["loader_all"]) == len(report["step_all"]) == 1
    assert report["ratio"] == pytest.approx(report["loader_tokens_per_s"] / report["step_tokens_per_s"], rel=1e-2,
                                           abs=0.01)


def test_held_out_benchmark_one_row_loads_with_parity_in_both_formats(capsys):
    """benchmarks/held_out.py on one file (GPT-2's, set 1): its row says it loads in both config formats within
    1e-5, and the footer counts it and no wrong load. Run in this process: torch and transformers are loaded."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import held_out
    finally:  # benchmarks/ holds train.py, data.py, ...: it must not shadow other imports
        sys.path.remove(str(ROOT / "benchmarks"))
    assert held_out.main(["--set", "1", "gpt2"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| 1 | gpt2 |"))
    assert row.endswith("| yes |") and row.count("yes, ") == 2, row
    assert "set 1: loads with parity 1 of 1 (both formats), 0 more within float32 rounding; loads with wrong " \
        "numbers: 0" in out


def test_sampling_benchmark_small_run_times_both_filters_on_each_shape(capsys):
    """benchmarks/sampling.py at a toy size, in this process: each shape's nucleus as named (tens of tokens, past
    the first candidates, most of the row), both filters timed and keeping the same tokens (it asserts that)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import sampling
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    report = sampling.main(["--rows", "3", "--vocab", "8000", "--repeats", "1", "--json"])
    assert json.loads(capsys.readouterr().out) == report
    sizes = {shape: row["nucleus_tokens"] for shape, row in report.items()}
    assert sizes["peaked"][2] < 256 < sizes["wide"][0] and sizes["wide"][2] < 4096 < sizes["flat"][0], sizes
    assert all(row["candidates"] > 0 and row["sort"] > 0 and row["most_differing_in_a_row"] <= 1
               for row in report.values())


def test_cpu_utilization_never_passes_one(monkeypatch):
    """A step measured faster than the CPU probe raises the peak (after a second probe) instead of
    reporting more than 100%; the raised peak is what later calls see."""
    monkeypatch.delenv(flops.CPU_PEAK_VARIABLE, raising=False)  # conftest's figure: probed here instead
    _forget_peaks()
    try:
        peak, source = flops.peak_flops("float32")
        assert peak > 0 and "square matmul" in source
        probes = []
        monkeypatch.setattr(flops, "probe_matmul_flops",  # the re-probe reads low too
                            lambda dtype, repeats=5: probes.append(repeats) or peak)
        assert flops.utilization(peak / 2) == pytest.approx(0.5) and probes == []
        assert flops.utilization(3 * peak) == 1.0 and probes == [10]
        assert flops.peak_flops("float32")[0] == 3 * peak and "raised" in flops.peak_flops("float32")[1]
        assert flops.utilization(1.5 * peak) == pytest.approx(0.5)
        assert flops.utilization(4 * peak) == 1.0 and probes == [10]  # re-probed once per process, not per step
        assert flops.peak_flops("float32")[1].count("raised") == 1
    finally:
        _forget_peaks()
