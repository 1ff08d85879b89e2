"""A run's life at its edges, with real processes and signals: one run per folder, interrupts that
save the step they reach, run folders checked before anything is built."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxformer.train import run_config
from jaxformer.train.run import train

ROOT = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, steps: int = 400) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text("model: {preset: tiny-gpt}\n"
                    f"train: {{steps: {steps}, batch_size: 8, seq_len: 32, log_every: 5, sample_tokens: 0}}\n"
                    "eval: {every: 1000, batches: 1}\n"
                    "optim: {warmup_steps: 5}\n"
                    "checkpoint: {every: 100, keep: 2}\n")
    return str(path)


def _start(config: str, run_dir: Path, compile_afresh: bool = False) -> subprocess.Popen:
    """``compile_afresh`` keeps the suite's compilation cache from the run, so that it really compiles."""
    env = dict(os.environ)
    if compile_afresh:
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return subprocess.Popen([sys.executable, "train.py", config, f"run.dir={run_dir}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_until(condition, process: subprocess.Popen, what: str, timeout: float = 600) -> None:
    # Generous: the bound only stops a hung run, and a loaded machine (two suites at once) is slow.
    deadline = time.time() + timeout
    while not condition():
        assert process.poll() is None, f"the run ended before {what}: {process.communicate()[1][-2000:]}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _saved(run_dir: Path) -> list[int]:
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []


def test_an_interrupt_saves_the_step_it_reached_and_a_rerun_resumes_there(tmp_path):
    """A SIGTERM mid-run saves the step reached, exits 143 and a rerun resumes there. SIGINT (Ctrl-C) takes the same
    handler (``InterruptRequests.SIGNALS``) and exits 130: ``test_two_ctrl_c_while_compiling_still_exit_at_once``
    runs it end to end, so a second subprocess pair for it here would prove nothing more (22 s)."""
    signum = signal.SIGTERM
    config, run_dir = _config(tmp_path), tmp_path / "run"
    process = _start(config, run_dir)
    _wait_until(lambda: len(_logged_steps(run_dir)) >= 2, process, "the first logged steps")
    process.send_signal(signum)
    _, err = process.communicate(timeout=600)
    assert process.returncode == 128 + signum  # 130 / 143, as shells report them
    found = re.search(r"interrupted at step (\d+); saved; rerun the same command to resume", err)
    assert found and "Traceback" not in err, err[-2000:]
    step = int(found.group(1))
    assert step in _saved(run_dir) and not (run_dir / "run.lock").exists()
    resumed = subprocess.run([sys.executable, "train.py", config, f"run.dir={run_dir}"], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0 and f"resumed at step {step}" in resumed.stdout, resumed.stderr[-2000:]
    steps = _logged_steps(run_dir)
    assert steps == sorted(set(steps)) and steps[-1] == 400  # replayed steps are not logged twice


def test_two_sigterms_keep_a_checkpoint_being_written_and_the_rerun_says_where_it_starts(tmp_path):
    """A scheduler that insists: two SIGTERMs 50 ms apart. The second exits (143) without cutting off a
    checkpoint whose write began before it, names the step that survives and leaves no lock; the rerun
    says what it found and resumes exactly there."""
    config, run_dir = _config(tmp_path, steps=3000), tmp_path / "run"
    process = _start(config, run_dir)
    _wait_until(lambda: 100 in _saved(run_dir), process, "the first checkpoint")
    process.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=600)
    assert process.returncode == 143 and "Traceback" not in err, err[-2000:]
    waited = "is being written; exiting once it is finalized" in err  # the second came during a save
    # Whoever ends the run names the survivor: the second signal's exit once the write it saw is finalized,
    # or (when the first signal's save of the step reached came first; the second then waits for that write
    # too) the ordinary interrupted-and-saved ending. Either order is correct; which one wins is timing.
    exited = re.search(r"the newest finalized checkpoint is step (\d+); rerun the same command to resume there", err)
    saved = re.search(r"interrupted at step (\d+); saved; rerun the same command to resume", err)
    survivor = exited or saved
    assert survivor and int(survivor.group(1)) == _saved(run_dir)[-1], err[-2000:]
    step = int(survivor.group(1))
    assert not (waited and exited) or "the checkpoint was finalized; exiting now" in err, err[-2000:]
    assert not (run_dir / "run.lock").exists()
    partial = sorted(p.name for p in (run_dir / "checkpoints").glob("*.orbax-checkpoint-tmp*"))
    rerun = subprocess.run([sys.executable, "train.py", config, f"run.dir={run_dir}", f"train.steps={step + 1}",
                            "train.resume=force"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0 and f"note: resuming at step {step} from checkpoints/{step}" in rerun.stdout, \
        rerun.stdout[-2000:] + rerun.stderr[-2000:]
    for name in partial:  # a write the exit cut off is named and removed
        assert f"note: discarded the partial checkpoint checkpoints/{name}" in rerun.stdout
    assert not list((run_dir / "checkpoints").glob("*.orbax-checkpoint-tmp*"))
    from jaxformer.train.evaluate import restore_run

    assert restore_run(run_dir)[1] == step + 1


_WRITING = """
import os, signal, sys, threading, time
from jaxformer.train.lifecycle import InterruptRequests
asked, finished = threading.Event(), threading.Event()  # a checkpoint of step 7 is being written until finished


def writing():
    asked.set()  # the second signal asks
    return None if finished.is_set() else 7


with InterruptRequests() as interrupts:
    interrupts.writing = writing
    interrupts.finalized = lambda: 7 if finished.is_set() else 5
    interrupts.before_exit.append(lambda: print("lock released", flush=True))
    os.kill(os.getpid(), signal.SIGTERM)  # a signal sent to oneself is delivered before kill returns
    os.kill(os.getpid(), signal.SIGTERM)
    asked.wait(600)
    if sys.argv[1] == "3":
        os.kill(os.getpid(), signal.SIGTERM)  # while the process waits for the write: exit now
    else:
        time.sleep(0.2)
        finished.set()
    time.sleep(600)
print("still running")
"""


@pytest.mark.parametrize("signals, survivor", [(2, 7), (3, 5)], ids=["second-waits", "third-exits-now"])
def test_a_second_interrupt_waits_for_the_checkpoint_being_written_and_a_third_does_not(signals, survivor):
    """The order of events is fixed by the script (the write ends only after the second signal asked
    about it), never by how fast a loaded machine runs it."""
    out = subprocess.run([sys.executable, "-c", _WRITING, str(signals)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 143 and out.stdout == "lock released\n", out.stderr[-2000:]
    assert "interrupted again (SIGTERM): the checkpoint of step 7 is being written" in out.stderr
    assert f"the newest finalized checkpoint is step {survivor}; rerun the same command to resume there" in out.stderr
    if signals == 2:  # the exit came after the write finished: the survivor is the step that was being written
        assert "the checkpoint was finalized; exiting now" in out.stderr
    else:
        assert "interrupted again (SIGTERM): exiting now without saving" in out.stderr


def test_a_second_run_in_the_same_folder_is_refused_naming_the_owner(tmp_path):
    config, run_dir = _config(tmp_path, steps=3000), tmp_path / "run"
    first = _start(config, run_dir)
    _wait_until(lambda: len(_logged_steps(run_dir)) >= 1, first, "the first run to start")
    second = subprocess.run([sys.executable, "train.py", config, f"run.dir={run_dir}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=600)
    assert second.returncode == 2
    assert f"is in use by process {first.pid} on {socket.gethostname()}" in second.stderr, second.stderr[-2000:]
    assert first.returncode == 143  # the first run was not disturbed by the second


def test_a_stale_lock_is_taken_over_and_a_live_one_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock = {"pid": int(gone.stdout), "host": socket.gethostname(), "since": "earlier"}
    (run_dir / "run.lock").write_text(json.dumps(lock))
    cfg = run_config.load(None, ["train.steps=2", "train.batch_size=8", "train.seq_len=32", "optim.warmup_steps=1",
                                 "train.sample_tokens=0", f"run.dir={run_dir}", "checkpoint.every=0"])
    train(cfg, progress=False)
    assert "took over the lock of process" in capsys.readouterr().out and not (run_dir / "run.lock").exists()
    (run_dir / "run.lock").write_text(json.dumps({**lock, "pid": os.getpid()}))  # alive: this very process
    with pytest.raises(ValueError, match=f"in use by process {os.getpid()}"):
        train(cfg, progress=False)


def test_a_run_dir_that_cannot_hold_a_run_fails_before_anything_is_built(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    base = ["train.steps=2", "model.preset=no-such-preset"]  # a model error would come later: these come first
    with pytest.raises(ValueError, match="is a file; it must be a folder"):
        train(run_config.load(None, base + [f"run.dir={blocker}"]))
    with pytest.raises(ValueError, match="lies under .*a_file, which is a file"):
        train(run_config.load(None, base + [f"run.dir={blocker / 'run'}"]))
    monkeypatch.setattr(os, "access", lambda *a, **k: False)  # as root every folder is writable
    with pytest.raises(ValueError, match="is not writable by this user"):
        train(run_config.load(None, base + [f"run.dir={tmp_path / 'locked'}"]))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_is_one_line_and_the_finalized_checkpoints_stay(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(small)], check=True)
    try:
        config, run_dir = _config(tmp_path, steps=300), small / "run"
        result = subprocess.run([sys.executable, "train.py", config, f"run.dir={run_dir}", "checkpoint.every=10",
                                 "checkpoint.keep=100"], cwd=ROOT, capture_output=True, text=True, timeout=600)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, result.stderr[-3000:]
        assert lines[-1].startswith(f"train.py: error: no space left on the device holding {run_dir}: a checkpoint "
                                    "of this run needs about"), lines[-1]
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        saved = _saved(run_dir)
        assert saved and f"checkpoints of steps {saved} are kept" in lines[-1]
        from jaxformer.train.evaluate import restore_run

        assert restore_run(run_dir)[1] == saved[-1]  # the newest finalized checkpoint is whole
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_two_ctrl_c_while_compiling_still_exit_at_once(tmp_path):
    """While the main thread sits in XLA's compiler Python runs no handler, and two SIGINTs would reach it
    as one; the wakeup-pipe watcher counts them as they arrive."""
    config, run_dir = _config(tmp_path, steps=3000), tmp_path / "run"
    process = _start(config, run_dir, compile_afresh=True)
    _wait_until(lambda: (run_dir / "run.lock").exists(), process, "the run to start")  # handlers are installed
    process.send_signal(signal.SIGINT)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=600)
    assert process.returncode == 130 and "interrupted again (SIGINT): exiting now without saving" in err, err[-2000:]
