"""Each process reads only its rows (issue 47): two JAX processes on loopback build disjoint rows of every
step's batch whose union is the one-process batch, and each slices from the memory-mapped shards exactly its
own rows' windows (counted where the shards are sliced: rows x window x itemsize bytes), none of the other's.

The processes run ``data_processes_check.py`` (causal_lm, span_corruption with its per-row random draws, and
ul2's per-row denoiser draws, all from a token-shard folder under data.packing=documents)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import simulated_devices
from data_processes_check import BATCH, STEPS, write_shards
from jaxformer.train import shards

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(Path(__file__).resolve().parent / "data_processes_check.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(folder: Path) -> tuple[list[dict], dict]:
    """The reports of processes 0 and 1 of a two-process run, and of a one-process run, launched together."""
    port = free_port()
    commands = [[SCRIPT, str(folder), f"127.0.0.1:{port}", "2", str(pid)] for pid in range(2)] + [[SCRIPT, str(folder)]]
    launched = [subprocess.Popen([sys.executable, *command], cwd=ROOT, env=simulated_devices(1),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for command in commands]
    reports = []
    for process in launched:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert [(r["process"], r["processes"]) for r in reports] == [(0, 2), (1, 2), (0, 1)]
    return reports[:2], reports[2]


def per_row(ranges: list, length: int) -> list[list]:
    """One step's (shard, first, last) reads grouped by row: each row reads ``length`` tokens, in row order."""
    rows, row, held = [], [], 0
    for piece, first, last in ranges:
        row.append((piece, first, last))
        held += last - first
        assert held <= length, f"a read runs past a window of {length} tokens: {row}"
        if held == length:
            rows.append(row)
            row, held = [], 0
    assert not row, f"reads left over that make no whole window: {row}"
    return rows


def windows(report: dict) -> list[tuple[int, int]]:
    """Each row's window [start, end) in stream tokens, over every step (a row's reads are contiguous, also
    where it crosses from one shard into the next)."""
    starts, found = report["piece_starts"], []
    for step in report["ranges"]:
        for row in per_row(step, report["length"]):
            spans = [(starts[piece] + first, starts[piece] + last) for piece, first, last in row]
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
            found.append((spans[0][0], spans[-1][1]))
    return found


def test_two_processes_on_loopback_read_disjoint_rows_and_only_their_own_bytes(tmp_path):
    folder = write_shards(tmp_path / "shards")
    tokens = shards.open_shards(folder).tokens
    (first, second), single = run_processes(folder)
    halves = [range(0, BATCH // 2), range(BATCH // 2, BATCH)]
    for name, whole in single["cases"].items():
        parts = [first["cases"][name], second["cases"][name]]
        length, itemsize = whole["length"], whole["itemsize"]
        assert STEPS * BATCH <= whole["windows"]  # no epoch wraps: every row of the run is a window of its own
        for step in range(STEPS):
            # rows: each process builds its half, and the halves are the one-process batch
            assert [part["rows"][step] for part in parts] == [[h.start, h.stop] for h in halves]
            reference = {key: np.asarray(value) for key, value in whole["batches"][step].items()}
            for part, half in zip(parts, halves):
                built = {key: np.asarray(value) for key, value in part["batches"][step].items()}
                assert built.keys() == reference.keys(), name
                for key, value in built.items():
                    np.testing.assert_array_equal(value, reference[key][half.start:half.stop], err_msg=f"{name} {key}")
            # reads: each process slices its rows' windows exactly as the one process does, no more
            rows = per_row([tuple(r) for r in whole["ranges"][step]], length)
            for part, half in zip(parts, halves):
                mine = per_row([tuple(r) for r in part["ranges"][step]], length)
                assert mine == rows[half.start:half.stop], f"{name} step {step}"
            if name == "causal_lm":  # the reads are the rows' tokens: inputs, then the last label
                for row, ids in zip(rows, reference["input_ids"]):
                    read = np.concatenate([tokens[piece][first:last] for piece, first, last in row])
                    np.testing.assert_array_equal(read[:-1], ids)
        # bytes: each process's count is exactly its rows' windows, and the two counts make the one-process one
        for part, half in zip(parts, halves):
            assert part["bytes_read"] == STEPS * len(half) * length * itemsize, name
            assert part["stream_bytes_read"] == part["bytes_read"], name  # the stream's own counter agrees
        assert sum(part["bytes_read"] for part in parts) == whole["bytes_read"] == STEPS * BATCH * length * itemsize
        # disjoint: no window read by both; two windows share at most the tokens the stride makes them share
        # (causal_lm's next window starts on this one's last token, its last label; the others' windows abut)
        shared = length - whole["stride"]
        assert shared == (1 if name == "causal_lm" else 0), name
        ours, theirs = windows(parts[0]), windows(parts[1])
        overlaps = [min(a[1], b[1]) - max(a[0], b[0]) for a in ours for b in theirs]
        assert max(overlaps) <= shared, f"{name}: the processes read {max(overlaps)} tokens in common"
    # the folder's shards are small, so the reads cross from one shard into the next somewhere
    assert any(len(row) > 1 for step in single["cases"]["causal_lm"]["ranges"]
               for row in per_row([tuple(r) for r in step], single["cases"]["causal_lm"]["length"]))
