"""What the serving tests share: a ``jaxformer serve`` subprocess."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path


@contextlib.contextmanager
def served(folder, *flags: str):
    """``jaxformer serve FOLDER --port 0 FLAGS`` running: yields the process and its address, which it prints (a free
    port) once it listens, in the line it prints then (kept as ``process.ready_line``). Its log goes to
    FOLDER/server.log, as a pipe nobody reads would fill and stop it; it is killed on leaving unless it ended (a test
    may stop it itself)."""
    log = Path(folder) / "server.log"
    with open(log, "w") as errors:
        process = subprocess.Popen([sys.executable, "-m", "jaxformer.cli", "serve", str(folder), "--port", "0", *flags],
                                   stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        line = process.stdout.readline()
        assert "on http://" in line, line + log.read_text()
        process.ready_line = line  # (what it says it serves with)
        yield process, line.split(" on ")[1].split()[0]
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        process.stdout.close()
