"""A run's life at its edges: the run folder checked before anything is built, one run at a time in
it (a lock naming its owner), and interrupts (Ctrl-C, a scheduler's SIGTERM) that end the run at a step
boundary with its work saved."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

LOCK_FILE = "run.lock"


def check_run_dir(path: str | os.PathLike) -> Path:
    """run.dir as a folder that exists and can be written, or a ValueError saying why not."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"run.dir={str(path)!r} is a file; it must be a folder (new or a run's)")
    for parent in folder.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"run.dir={str(path)!r} lies under {parent}, which is a file")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"run.dir={str(path)!r} cannot be created: {err.strerror}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"run.dir={str(path)!r} is not writable by this user")
    return folder


class RunDirLock:
    """One run at a time per run folder: ``run.lock`` holds the owner's pid, host and start time, created
    exclusively. A lock left by a process that no longer exists on this host is stale and taken over; a
    live owner (or one on another host, which cannot be checked) is named in the error."""

    def __init__(self, folder: Path):
        self.path = folder / LOCK_FILE
        self.owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.note = None

    def __enter__(self) -> RunDirLock:
        for _ in range(2):
            try:
                descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None or not self._stale(holder):
                    who = "another run" if holder is None else f"process {holder['pid']} on {holder['host']} " \
                                                               f"(since {holder['since']})"
                    raise ValueError(f"run.dir={str(self.path.parent)!r} is in use by {who}; wait for it to end or "
                                     f"choose another run.dir (if that process is gone, delete {self.path})") from None
                self.note = f"took over the lock of process {holder['pid']}, which no longer runs"
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(descriptor, "w", encoding="utf-8") as f:
                json.dump(self.owner, f)
            return self
        raise ValueError(f"could not take {self.path}: another run took it at the same moment")

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        if self._holder() == self.owner:
            self.path.unlink(missing_ok=True)

    def _holder(self) -> dict | None:
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # being written right now, or unreadable: treat as held
        return holder if isinstance(holder, dict) and {"pid", "host", "since"} <= set(holder) else None

    @staticmethod
    def _stale(holder: dict) -> bool:
        if holder["host"] != socket.gethostname():
            return False
        try:
            os.kill(int(holder["pid"]), 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False


class Interrupted(Exception):
    """The run stopped at a step boundary after an interrupt, with a checkpoint of that step."""

    def __init__(self, step: int, signum: int, saved: bool):
        self.step, self.signum, self.saved = step, signum, saved
        self.exit_code = 128 + signum  # 130 for SIGINT, 143 for SIGTERM, as shells report them
        how = "saved; rerun the same command to resume" if saved else "not saved (checkpoint.every=0)"
        super().__init__(f"interrupted at step {step}; {how}")


class InterruptRequests:
    """While entered (in the main thread): the first SIGINT or SIGTERM is recorded in ``signum`` and the
    training loop stops after its current step, saving it. A second one ends the process, but never cuts
    off a checkpoint whose write began before it: it waits for that write to be finalized, then exits (a
    third exits at once). Either way it says which step the next start resumes from, and releases the run
    folder's lock (``before_exit``).

    The training loop tells it what is on disk: ``writing()`` is the step of a checkpoint being written
    (None when no write is in flight) and ``finalized()`` the newest finished one (None if there is none).

    Python runs signal handlers in the main thread only between bytecodes, so while it sits in a long
    compile two Ctrl-C would reach the handler as one. Every signal also writes its number to a wakeup
    pipe; a watcher thread counts them there and ends the process on the second, wherever the main
    thread is."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self.writing: Callable[[], int | None] = lambda: None
        self.finalized: Callable[[], int | None] = lambda: None
        self.before_exit: list[Callable[[], None]] = []
        self._previous: dict = {}
        self._pipe: tuple[int, int] | None = None
        self._previous_wakeup = -1

    def _first(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
            print(f"\n{signal.Signals(signum).name}: finishing this step and saving (interrupt again to exit now)",
                  file=sys.stderr)

    def _handle(self, signum, frame) -> None:  # the main thread's view; the watcher counts
        self._first(signum)

    def _watch(self, read_end: int) -> None:
        seen = 0
        while True:
            try:
                data = os.read(read_end, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in self.SIGNALS:
                    continue
                seen += 1
                if seen == 1:
                    self._first(signum)
                    continue
                name = signal.Signals(signum).name
                step = self.writing() if seen == 2 else None
                if step is None:
                    self._exit(signum, f"interrupted again ({name}): exiting now without saving")
                print(f"\ninterrupted again ({name}): the checkpoint of step {step} is being written; exiting once "
                      "it is finalized (interrupt again to exit now and lose it)", file=sys.stderr)
                threading.Thread(target=self._exit_after_write, args=(signum,), daemon=True).start()

    def _exit_after_write(self, signum: int) -> None:
        while self.writing() is not None:
            time.sleep(0.05)
        self._exit(signum, "the checkpoint was finalized; exiting now")

    def _exit(self, signum: int, what: str) -> None:
        step = self.finalized()
        kept = (f"the newest finalized checkpoint is step {step}; rerun the same command to resume there"
                if step is not None else "no checkpoint was finalized; a rerun starts at step 0")
        print(f"{what}; {kept}", file=sys.stderr, flush=True)
        for release in self.before_exit:
            release()
        os._exit(128 + signum)

    def __enter__(self) -> InterruptRequests:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
            read_end, write_end = os.pipe()
            os.set_blocking(write_end, False)
            self._pipe = (read_end, write_end)
            self._previous_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            threading.Thread(target=self._watch, args=(read_end,), daemon=True, name="interrupts").start()
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            os.close(self._pipe[1])  # the watcher reads end-of-file and stops
            self._pipe = None


def finalized_steps(run_dir: Path) -> list[int]:
    """The steps of the finished checkpoints in ``run_dir`` (Orbax renames a checkpoint's folder to its
    step only once every byte of it is written)."""
    folder = Path(run_dir) / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def discard_partial_checkpoints(run_dir: Path) -> list[str]:
    """Remove the checkpoint folders whose writing was cut off (a crash, a second interrupt): Orbax never
    restores them, and a person looking at the folder should not take one for a checkpoint. Returns what
    was removed, for the run to say."""
    folder = Path(run_dir) / "checkpoints"
    partial = sorted(folder.glob("*.orbax-checkpoint-tmp*")) if folder.is_dir() else []
    for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    return [path.name for path in partial]


def disk_full(err: BaseException) -> bool:
    """Whether ``err``, or anything that caused it, is a full disk (an OSError, or TensorStore's report of
    one inside Orbax's error)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(seen) or "OS error 28" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def full_disk_error(run_dir: Path, err: BaseException) -> ValueError:
    """One line for a full disk: the folder, the bytes a checkpoint needs (when the save found it out) or
    what is free, and what is kept (a failed save never touches a finalized checkpoint)."""
    finalized = finalized_steps(run_dir)
    needs = (err.strerror if isinstance(err, OSError) and err.errno == errno.ENOSPC and err.strerror
             else f"{shutil.disk_usage(run_dir).free:,} bytes are free")
    kept = f"checkpoints of steps {finalized} are kept" if finalized else "no checkpoint was kept"
    return ValueError(f"no space left on the device holding {run_dir}: {needs}; {kept}. Free some space and "
                      "rerun the same command to resume")
