"""The package's shape: an import graph with no cycles, no upward and no private arrows, and one
forward path shared by training, prefill and every decode step."""

from __future__ import annotations

import ast
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer as jf
from jaxformer.layers import stack

PACKAGE = Path(jf.__file__).resolve().parent
ROOT = PACKAGE.parent
# Modules at the edge of the package: formats, files, the training program, the command line, generation.
EDGES = ("jaxformer.interop", "jaxformer.train", "jaxformer.cli", "jaxformer.checkpoint", "jaxformer.compare",
         "jaxformer.adapt", "jaxformer.lora", "jaxformer.embedder", "jaxformer.viz", "jaxformer.serving")
# Model code: the families and everything they are built from.
MODEL_CODE = ("jaxformer.model_config", "jaxformer.presets", "jaxformer.layers", "jaxformer.kernels",
              "jaxformer.native", "jaxformer.cache", "jaxformer.checks", "jaxformer.outputs", "jaxformer.models",
              "jaxformer.encoder", "jaxformer.decoder", "jaxformer.encoder_decoder", "jaxformer.sharding",
              "jaxformer.generate", "jaxformer.speech_generation", "jaxformer.edges")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in ``module``, function bodies too.
    ``from pkg import sub`` counts as importing the module ``pkg.sub`` when that module exists."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.append((child, None, node.lineno) if child in MODULES else (base, alias.name, node.lineno))
    return [item for item in found if item[0].split(".")[0] == "jaxformer"]


GRAPH = {module: sorted({target for target, _, _ in _imports(module) if target != module}) for module in MODULES}


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in GRAPH.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_import_graph_has_no_cycle():
    cycles = [f"{m} -> ... -> {m}" for m in GRAPH if m in _reachable(m)]
    assert not cycles, cycles


def test_nothing_below_the_face_imports_the_face():
    upward = [f"{m}:{line} imports jaxformer{'.' + name if name else ''}" for m in MODULES if m != "jaxformer"
              for target, name, line in _imports(m) if target == "jaxformer"]
    assert not upward, upward


@pytest.mark.parametrize("module", [m for m in MODULES if _within(m, MODEL_CODE)])
def test_model_code_reaches_no_edge(module):
    assert not [m for m in _reachable(module) if _within(m, EDGES)]


def test_no_private_name_crosses_a_module():
    crossing = []
    for module in MODULES:
        aliases = {}
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        for target, name, line in _imports(module):
            if name is not None and name.startswith("_"):
                crossing.append(f"{module}:{line} imports {target}.{name}")
        for node in ast.walk(tree):  # module aliases, then `alias._private` attribute reads
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    full = alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
                    if full in MODULES:
                        aliases[alias.asname or alias.name] = full
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                crossing.append(f"{module}:{node.lineno} reads {aliases[node.value.id]}.{node.attr}")
    assert not crossing, crossing


def test_generation_reaches_no_family_internals():
    """The decode loop uses the family's public step API only: no embeddings, stacks or heads."""
    source = (PACKAGE / "generate.py").read_text(encoding="utf-8")
    for internal in (".decoder.", ".embeddings", ".embed.", "lm_logits", ".blocks", "cross_key_values"):
        assert internal not in source, internal


# --------------------------------------------------------------------------------------------------
# One forward path


CASES = {
    "gpt": jf.config("tiny-gpt").replace(init_std=0.2),
    "llama-sliding": jf.config("tiny-llama").replace(init_std=0.2, attention="sliding", window_size=3),
    "t5": jf.config("tiny-t5").replace(init_std=0.1),
}


def _greedy_by_full_forward(model, prompt: np.ndarray, steps: int) -> np.ndarray:
    """Greedy tokens from repeated uncached forward passes over the whole sequence so far. The sequence is
    held at its final length (the tokens not chosen yet are 0), which causal attention cannot see from
    the position read: one compilation instead of one per length."""
    if model.config.family == "encoder_decoder":
        out = np.zeros((prompt.shape[0], steps + 1), np.int32)  # decoder_start_token_id=0, then the choices
        for i in range(steps):
            out[:, i + 1] = np.argmax(model(prompt, decoder_input_ids=out).logits[:, i], -1)
        return out
    out = np.concatenate([prompt, np.zeros((prompt.shape[0], steps), prompt.dtype)], axis=1)
    for i in range(prompt.shape[1], prompt.shape[1] + steps):
        out[:, i] = np.argmax(model(out).logits[:, i - 1], -1)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_generation_runs_the_forward_pass_it_is_given(case, monkeypatch):
    """Change the block's feed-forward: the full forward and generation change together. The cached
    generation then still equals greedy decoding by uncached forward passes of the changed model, so
    both run the one forward path, and a change to it cannot miss generation."""
    cfg = CASES[case].replace(decoder_start_token_id=0)
    # Same weights under two names: the changed model's graph differs from every model compiled before
    # (compiled functions are cached per graph, and the change is invisible to that cache).
    model = jf.build(cfg.replace(name=f"{case}-as-built"), seed=3)
    changed_model = jf.build(cfg.replace(name=f"{case}-changed"), seed=3)
    prompt = np.random.default_rng(0).integers(1, cfg.vocab_size, (2, 5)).astype(np.int32)
    before = model.generate(prompt, max_new_tokens=6)
    np.testing.assert_array_equal(before, _greedy_by_full_forward(model, prompt, 6))

    feed_forward = stack.Block.feed_forward

    def changed(self, h, inputs, key):
        y, stats = feed_forward(self, h, inputs, key)
        return -3.0 * y + jnp.tanh(h), stats

    monkeypatch.setattr(stack.Block, "feed_forward", changed)
    after = changed_model.generate(prompt, max_new_tokens=6)
    assert not np.array_equal(before, after), "generation ignored a change to the forward pass"
    np.testing.assert_array_equal(after, _greedy_by_full_forward(changed_model, prompt, 6))


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-bert", "tiny-t5"])
def test_a_public_call_checks_its_inputs_once(name, monkeypatch):
    """Concrete calls (checked on the host, then compiled) and calls inside a user's jit alike."""
    from jaxformer import checks, decoder, encoder, encoder_decoder

    calls = []
    for module in (decoder, encoder, encoder_decoder):
        monkeypatch.setattr(module, "check_inputs", lambda *a, _f=checks.check_inputs, **k: calls.append(1) or _f(*a, **k))
    model = jf.build(name)
    ids = np.ones((2, 4), np.int32)
    kwargs = {"decoder_input_ids": ids} if model.config.family == "encoder_decoder" else {}
    streams = 2 if kwargs else 1  # an encoder-decoder checks its two token streams, each once
    model(ids, **kwargs)
    assert len(calls) == streams
    calls.clear()
    jax.jit(lambda ids: model(ids, **kwargs).last_hidden_state)(ids)
    assert len(calls) == streams


def test_jaxformer_config_is_the_preset_function_and_no_module_hides_behind_it():
    """``jf.config(name)`` is the public function; ModelConfig's module has its own name, so importing
    ``jaxformer.config`` can never yield a function where a module was meant."""
    import importlib.util

    import jaxformer as jf
    from jaxformer import model_config

    assert importlib.util.find_spec("jaxformer.config") is None
    assert isinstance(jf.config("tiny-gpt"), jf.ModelConfig)
    assert model_config.ModelConfig is jf.ModelConfig
