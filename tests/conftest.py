"""Shared helpers for the jaxformer test-suite (import them: `from conftest import tiny_model`).

Everything here runs on one CPU device in float32 (unless a test asks for bfloat16). Models are
built from the tiny-* presets; ``tiny_model`` caches one instance per (preset, overrides) for the
whole session, so tests must not mutate the models it returns (edit a copy of ``nnx.state(model)``
instead, or build a new one with ``jf.build``). Forward passes go through ``jitted``: eager calls of
a whole model cost far more than one compilation of it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import time
from pathlib import Path

# One OpenMP thread for torch in each xdist worker (set before torch is imported; the worker's subprocesses inherit
# it): two workers share two cores with XLA's own threads, and torch's intra-op threads, spinning between its ops,
# took the cores from them (test_config_keys.py under -n 2: 50 s and 101 CPU-seconds with torch's default threads,
# 24 s and 47 with one).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# One persistent compilation cache for the whole run, set before jax is imported so that the xdist workers
# and every subprocess a test starts (train.py runs, kill-and-resume, simulated meshes) inherit it: a program
# compiled once (the same tiny model's train step, rerun after a kill) is read back, not compiled again.
# Keyed by the program, jax and the flags, so a hit is the same executable. A fresh clone starts empty; a local
# one keeps it between runs under .pytest_cache/. No size bound: with one, jax lists and stats every entry of the
# folder under a file lock on each write to find what to evict (65 ms a write at the suite's 2,500 entries, writes
# quadratic over a fresh clone's run). Without the lock an entry read while the other worker still writes it fails
# to decompress, and jax warns and compiles the program instead: the same executable, later.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax-compilation"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
# The suite compiles far more than it computes (tiny models, many shapes): LLVM's optimisation of the loops
# XLA:CPU emits (what this flag turns off) costs these tiny programs more compile time than it saves
# (test_generate.py measured 344 s at the default -O3, 228 s at 0). It moves float32 rounding in the last
# bits, inside every tolerance. Subprocesses keep it (``simulated_devices``).
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()


def _xla_accepts(flag: str) -> bool:
    """Whether this jaxlib's XLA knows ``flag`` (an unknown one in XLA_FLAGS aborts the process). Probed once in
    a subprocess and remembered per jaxlib version; the xdist workers and the suite's subprocesses inherit the
    answer with XLA_FLAGS."""
    import importlib.metadata
    import subprocess

    memo = Path(__file__).resolve().parent.parent / ".pytest_cache" / "xla-flags" / (
        f"{importlib.metadata.version('jaxlib')}-{flag.strip('-').split('=')[0]}")
    if not memo.exists():
        try:
            accepted = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True,
                                      env={**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flag}"},
                                      timeout=300).returncode == 0
        except subprocess.TimeoutExpired:  # no answer (a stalled machine): not remembered, asked again next run
            return False
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(str(accepted))
    return memo.read_text() == "True"


# XLA:CPU's MLIR fusion emitters take about twice as long to compile these tiny programs as its classic loop
# emitters (a LLaMA train step: 3.7 s of CPU against 1.7; the suite is mostly compilation). The classic ones
# move float32 rounding in the last bit, inside every tolerance, and every comparison of two runs compares
# programs compiled alike. Where a jaxlib no longer has the choice, the suite runs with its emitters.
FUSION_EMITTERS_OFF = "--xla_cpu_use_fusion_emitters=false"
if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", "") and _xla_accepts(FUSION_EMITTERS_OFF):
    os.environ["XLA_FLAGS"] = f"{os.environ['XLA_FLAGS']} {FUSION_EMITTERS_OFF}"
# XLA:CPU splits a program's LLVM module to compile the parts on threads of its own; beside the other xdist worker
# on two cores that costs more than it saves: one part (the same code, so the same numbers) compiled
# tests/test_generate.py 1.27x faster from an empty compilation cache (74 s against 94, two workers).
ONE_CODEGEN_PART = "--xla_cpu_parallel_codegen_split_count=1"
if "xla_cpu_parallel_codegen_split_count" not in os.environ["XLA_FLAGS"] and _xla_accepts(ONE_CODEGEN_PART):
    os.environ["XLA_FLAGS"] = f"{os.environ['XLA_FLAGS']} {ONE_CODEGEN_PART}"

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import pytest

import jaxformer as jf
from jaxformer import flops

# A training run's MFU divides by the CPU's float32 matmul peak, which each process would probe for itself (about
# 2 s of matmuls on two cores, in every train.py subprocess). Probed once here, where pytest starts; the xdist
# workers and every subprocess inherit the figure.
if flops.CPU_PEAK_VARIABLE not in os.environ and jax.default_backend() == "cpu":
    os.environ[flops.CPU_PEAK_VARIABLE] = repr(flops.peak_flops("float32")[0])

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # so tests can `import hf_reference`
    sys.path.insert(0, str(TESTS_DIR))

TINY = [name for name in jf.presets() if name.startswith("tiny-")]


@contextlib.contextmanager
def no_compilation():
    """Fails the test if JAX traces, lowers or compiles anything inside the block."""
    events: list[str] = []

    def listener(name, duration, **kwargs):
        if name.startswith("/jax/core/compile"):
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert not events, f"JAX compiled before rejecting the input: {sorted(set(events))}"


def simulated_devices(count: int, **extra: str) -> dict[str, str]:
    """The environment for a subprocess with ``count`` simulated CPU devices (the suite's XLA flags kept)."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}".strip()
    return {**os.environ, "XLA_FLAGS": flags, **extra}


def tiny_config(name: str, **changes) -> jf.ModelConfig:
    cfg = jf.config(name)
    return cfg.replace(**changes) if changes else cfg


@functools.lru_cache(maxsize=None)
def _cached_model(name: str, changes: tuple, seed: int):
    return jf.build(tiny_config(name, **dict(changes)), seed=seed)


def tiny_model(name: str, seed: int = 0, **changes):
    """A (cached, shared: do not mutate) model of preset ``name`` with config overrides."""
    return _cached_model(name, tuple(sorted(changes.items())), seed)


def token_ids(batch: int, length: int, vocab: int = 256, seed: int = 0, low: int = 0) -> jax.Array:
    """Deterministic int32 token ids in [low, vocab)."""
    rng = np.random.RandomState(seed)
    return jnp.asarray(rng.randint(low, vocab, size=(batch, length)), jnp.int32)


def embeds(batch: int, length: int, d_model: int, seed: int = 0) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (batch, length, d_model), jnp.float32)


def jitted(model):
    """``model`` as a jitted pure function (split once, merge inside jit), same call signature.

    Eager calls of a whole model re-trace the layer scan every time (~0.5-1 s each on CPU); under
    jit a tiny model compiles once per input shape and then runs in microseconds. One wrapper is
    kept per model object so repeated calls with the same shapes hit the compilation cache.
    """
    key = id(model)
    if key not in _JITTED or _JITTED[key][0] is not model:
        graphdef, state = nnx.split(model)

        @functools.partial(jax.jit, static_argnames=("flags",))
        def run(state, args, kwargs, flags=()):
            return nnx.merge(graphdef, state)(*args, **dict(flags), **kwargs)

        def forward(*args, output_hidden_states=False, output_attentions=False, **kwargs):
            flags = (("output_hidden_states", output_hidden_states), ("output_attentions", output_attentions))
            return run(state, args, kwargs, flags=flags)

        forward.config = model.config
        _JITTED[key] = (model, forward)
    return _JITTED[key][1]


_JITTED: dict[int, tuple] = {}


def call(model, ids, mask=None, dec_ids=None, dec_mask=None, *, jit: bool = True, **kwargs):
    """Call any family with one token stream (plus a decoder stream for encoder-decoders; the
    encoder ids are reused when ``dec_ids`` is None). Jitted unless ``jit=False``."""
    fn = jitted(model) if jit else model
    if model.config.family == "encoder_decoder":
        return fn(ids, mask, ids if dec_ids is None else dec_ids, dec_mask, **kwargs)
    return fn(ids, mask, **kwargs)


_DEPENDENCY: dict[tuple, tuple] = {}


def dependency(model, fn, inputs, *args, state=None):
    """Who-sees-whom by derivatives: max |d out[b, t] / d in[b, t']| as [B, T_out, T_in] matrices.

    ``fn(model, *inputs, *args)`` returns one array [B, T_out, D'] or a tuple of them; ``inputs`` is
    one float array [B, T_in, D] or a tuple of them (all are differentiated). The result is one
    matrix for one input and one output, else ``result[output][input]``. ``state`` (the model's
    nnx state, possibly edited) replaces the model's own parameters. Each (model, fn) pair is
    compiled once; later calls with the same shapes reuse it.

    Forward mode, one tangent per input position (b', t'), pointing along a fixed random feature
    direction (a non-zero Jacobian block maps it to zero with probability 0): B * T_in
    Jacobian-vector products, cheaper to compile than reverse mode. Masked attention gives exact
    zeros (masked scores are float32-min, whose softmax weight underflows to exactly 0), so "no
    dependency" is == 0. Rows of a batch must never see each other: the cross-row blocks are
    asserted to be exactly zero here.
    """
    single_in = not isinstance(inputs, tuple)
    inputs = (inputs,) if single_in else inputs
    key = (id(model), fn)
    if key not in _DEPENDENCY or _DEPENDENCY[key][0] is not model:
        graphdef = nnx.graphdef(model)

        def jacobians(state, xs, args):
            def outputs(*es):
                outs = fn(nnx.merge(graphdef, state), *es, *args)
                return tuple(o.astype(jnp.float32) for o in (outs if isinstance(outs, tuple) else (outs,)))

            per_input = []
            for j, x in enumerate(xs):
                B, T, D = x.shape
                u = jax.random.normal(jax.random.key(1234 + j), (D,), x.dtype)
                tangents = jnp.eye(B * T, dtype=x.dtype).reshape(B * T, B, T, 1) * u  # [B*T, B, T, D]

                def push(t, j=j):
                    zeros = [jnp.zeros_like(e) for e in xs]
                    zeros[j] = t
                    return jax.jvp(outputs, xs, tuple(zeros))[1]

                per_input.append(jax.vmap(push)(tangents))  # per output: [B_in*T_in, B, T_out, D']
            return per_input

        _DEPENDENCY[key] = (model, jax.jit(jacobians))
    per_input = _DEPENDENCY[key][1](nnx.state(model) if state is None else state, inputs, args)
    result = []
    for i in range(len(per_input[0])):
        row = []
        for j, x in enumerate(inputs):
            B, T_in = x.shape[:2]
            d = np.abs(np.asarray(per_input[j][i])).max(axis=-1)  # [B_in*T_in, B_out, T_out]
            d = d.reshape(B, T_in, B, d.shape[-1]).transpose(2, 3, 0, 1)  # [B_out, T_out, B_in, T_in]
            for b in range(B):
                for c in range(B):
                    if b != c:
                        assert not d[b, :, c].any(), f"batch row {b} depends on row {c}"
            row.append(np.stack([d[b, :, b] for b in range(B)]))
        result.append(row)
    return result[0][0] if single_in and len(result) == 1 else result


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """``checkpoints(name)``: the folder of the tiny reference checkpoint ``name`` (``hf_factory``), built and
    saved once for the whole session."""
    from hf_factory import save_checkpoint

    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = save_checkpoint(name, tmp_path_factory.mktemp(name))
        return cache[name]

    return get


MAPS_BEFORE_RELEASE = 30_000  # of the kernel's 65,530 memory maps per process (vm.max_map_count)
# Reading /proc/self/maps costs the kernel ~30 ms at 20,000 maps: after every test of the suite that came to a minute
# of CPU. Compiling adds ~170 maps a second, so a count every 10 s leaves 35,000 maps of room to spare.
MAPS_EVERY_SECONDS = 10.0
_maps_counted = [0.0]  # when the maps were last counted (time.monotonic)


def _memory_maps() -> int | None:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:  # not Linux
        return None


@pytest.fixture(autouse=True)
def release_compiled_programs():
    """Drop JAX's compiled programs once the process holds many memory maps. Each XLA:CPU executable keeps
    its own; a worker that keeps every program of the suite (measured: ~170 new maps a second while
    compiling, 50,000 after five minutes) passes the kernel's 65,530 and its next compilation dies in a
    segfault. Where /proc is missing, the programs are dropped at each module's end instead."""
    yield
    now = time.monotonic()
    if now - _maps_counted[0] < MAPS_EVERY_SECONDS:
        return
    _maps_counted[0] = now
    maps = _memory_maps()
    if maps is not None and maps > MAPS_BEFORE_RELEASE:
        jax.clear_caches()
        gc.collect()


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs_without_proc():
    yield
    if _memory_maps() is None:
        jax.clear_caches()
        gc.collect()
