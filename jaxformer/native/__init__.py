"""Kernels in C++ that XLA:CPU runs through its FFI, built on first use with the machine's C++ compiler.

XLA:CPU has no fused paged attention, and its own paged read (a gather, then matmuls) copies every row's keys and
values before it reads them: on a 2-core AVX-512 Xeon, a gpt2-124M 32-row one-token step's attention took 66 of
its 140 ms that way. ``paged_attention.cc`` reads each slot once, straight from the pool (``kernels.paged_attention``,
the kernel 'ffi-cpu'). The source ships with the package and is compiled against the FFI headers jaxlib ships
(``jax.ffi.include_dir``) with ``$CXX`` (default ``g++``) for this machine's CPU (``-march=native``), into
``$JAXFORMER_CACHE`` (default ``~/.cache/jaxformer``)/native, keyed by the source, compiler, flags, jaxlib and CPU,
so a later process loads it in milliseconds (where that cannot be written, into a temporary folder, once a
process). Where no compiler is found or the build fails, ``paged_attention`` says why and the engine reads on XLA
(docs/serving.md)."""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import jax
import jaxlib

SOURCE = Path(__file__).with_name("paged_attention.cc")
TARGET = "jaxformer_paged_attention"  # the FFI target name ffi_call names
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC")


def _cpu() -> str:
    """What -march=native compiles for: the CPU's model and instruction set flags (a cached build compiled on
    another CPU would be refused or crash)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))


def _cache_dir() -> Path:
    return Path(os.environ.get("JAXFORMER_CACHE", Path.home() / ".cache" / "jaxformer")) / "native"


def _compile(compiler: list[str], library: Path) -> None:
    """Compiles the source into ``library``: into a temporary file renamed into place, so concurrent processes never
    load a half-written library."""
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        built = Path(scratch) / library.name
        result = subprocess.run([*compiler, *FLAGS, "-I", jax.ffi.include_dir(), str(SOURCE), "-o", str(built)],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            errors = [line for line in result.stderr.splitlines() if "error" in line] or result.stderr.splitlines()
            raise RuntimeError(f"{' '.join(compiler)} failed on {SOURCE.name}: {(errors or ['no output'])[0]}")
        os.replace(built, library)


def _build(compiler: list[str]) -> Path:
    """The shared library for this machine: the cached one, else compiled into the cache (or, where the cache cannot
    be written, into this process's temporary folder)."""
    version = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), *compiler, version, " ".join(FLAGS), jaxlib.__version__,
                                     _cpu()]).encode()).hexdigest()[:16]
    library = _cache_dir() / f"paged_attention-{key}.so"
    if library.exists():
        return library
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
        _compile(compiler, library)
    except OSError:  # (a cache folder it cannot make or write: built for this process alone)
        folder = tempfile.mkdtemp(prefix="jaxformer-native-")
        atexit.register(shutil.rmtree, folder, True)  # (a loaded library outlives its file)
        library = Path(folder) / library.name
        _compile(compiler, library)
    return library


def paged_attention() -> str | None:
    """Registers the CPU paged attention kernel with XLA, building it where needed (once a process, with the
    compiler ``$CXX`` names, default g++). Returns why it cannot (no compiler, a failed build, a library that does
    not load), None once registered."""
    if _REGISTERED:
        return None
    return _register(os.environ.get("CXX", "g++"))


@functools.cache
def _register(cxx: str) -> str | None:
    compiler = shlex.split(cxx)  # (a launcher too: "ccache g++")
    if not compiler or shutil.which(compiler[0]) is None:
        return f"no C++ compiler {cxx!r} on PATH to build it (set $CXX)"
    try:
        library = ctypes.cdll.LoadLibrary(str(_build(compiler)))
        with _LOCK:
            if not _REGISTERED:  # (one target name a process)
                jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.JaxformerPagedAttention),
                                            platform="cpu")
                _REGISTERED.append(cxx)
    except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as error:
        return f"building it failed: {error}"
    return None


_REGISTERED: list[str] = []
_LOCK = threading.Lock()
