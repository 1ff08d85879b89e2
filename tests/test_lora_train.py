"""LoRA and QLoRA fine-tunes in train.py: only the adapters (and a listed head) train, the optimizer holds
only their state, the frozen base stays bit-identical, checkpoints refer to the base instead of copying
it, a sharded run equals one device, and a finished run converts to a merged Hugging Face model."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer.layers.weights import LoraParam, Quantized
from jaxformer.train import run_config
from jaxformer.train.objectives import ratio
from jaxformer.train.run import Run, train
from conftest import simulated_devices

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.preset=tiny-gpt", "train.steps=4", "train.batch_size=8", "train.seq_len=32", "train.log_every=2",
        "eval.every=4", "eval.batches=1", "optim.warmup_steps=1", "train.sample_tokens=0", "checkpoint.every=0",
        "optim.lr=1e-2", "finetune.lora.rank=4", "finetune.lora.targets=q,v,wi"]


def _steps(cfg, mesh=None, run=None):
    """A run's state and jitted train step, built as run_training builds them (``run``: an existing one)."""
    from jaxformer.sharding import shardings_of
    from jaxformer.train.steps import init_state, make_optimizer, make_steps, split_model

    run = run or Run.build(cfg, mesh=mesh)
    graphdef, params, rest = split_model(run.model)
    optimizer, _ = make_optimizer(cfg, params)
    state = init_state(cfg, run.model, optimizer)
    train_step, _ = make_steps(graphdef, rest, optimizer, run.objective, cfg, run.mesh, shardings_of(state))
    return run, state, train_step


def test_lora_settings_are_checked_by_name():
    with pytest.raises(ValueError, match="finetune.lora.rank"):
        run_config.load(None, ["finetune.lora.rank=-2"])
    with pytest.raises(ValueError, match="finetune.lora.targets entry 'query'"):
        run_config.load(None, ["finetune.lora.rank=4", "finetune.lora.targets=query"])
    with pytest.raises(ValueError, match="finetune.lora.base_dtype='int4'"):
        run_config.load(None, ["finetune.lora.rank=4", "finetune.lora.base_dtype=int4"])
    with pytest.raises(ValueError, match="finetune.lora.base_dtype='int8' needs finetune.lora.rank"):
        run_config.load(None, ["finetune.lora.base_dtype=int8"])
    with pytest.raises(ValueError, match="did you mean 'finetune.lora.rank'"):
        run_config.load(None, ["finetune.lora.rnak=4"])
    cfg = run_config.load(None, TINY + ["finetune.lora.dropout=0.1"])
    assert run_config.load(None, ["finetune.lora.rank=4"]).finetune.lora.targets == ["q", "v"]  # the default
    assert cfg.finetune.lora.targets == ["q", "v", "wi"] and cfg.finetune.lora.dropout == 0.1


def test_the_note_names_a_fresh_parameter_outside_every_listed_path_as_frozen():
    """A listed path holds itself and what is under it, nothing that merely starts with its letters (the one
    reading ``jaxformer.lora.under`` gives lora_trainable, finetune.train_only and this note)."""
    from types import SimpleNamespace

    from jaxformer.train.run import lora_notes

    lora = jf.with_lora(jf.build("tiny-gpt"), targets=("q",), trainable=("embed",))
    run = SimpleNamespace(model=lora, base={"source": "preset:tiny-gpt", "fingerprint": "0" * 64},
                          fresh_params=["embed.table rows 250..259", "embeddings.positions"])
    assert lora_notes(run)[1].startswith("freshly initialised but frozen under LoRA: embeddings.positions;")


def _run_steps(run, cfg, steps: int = 3) -> dict:
    """``steps`` steps of ``run``: the losses, the adapters after, and what the steps did to the state
    (used inside the subprocess below, where the multi-device runs are)."""
    _, state, train_step = _steps(cfg, run=run)
    frozen, adapters = jax.tree.map(np.array, state["frozen"]), jax.tree.map(np.array, state["params"])
    variables = lambda tree: jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, nnx.Variable))  # noqa: E731
    facts = {"only_adapters_train": all(isinstance(v, LoraParam) for v in variables(state["params"])),
             "int8_kernels": sum(isinstance(v, Quantized) and v.dtype == np.int8 for v in variables(state["frozen"])),
             "adapter_size": sum(x.size for x in jax.tree.leaves(state["params"])),
             "base_size": sum(x.size for x in jax.tree.leaves(state["frozen"])),
             "adam_moments": sum(x.size for x in jax.tree.leaves(state["opt_state"]) if x.ndim),  # not the count
             "q_spec": str(state["frozen"]["decoder"]["blocks"]["attn"]["q"].sharding.spec)}
    losses = []
    for step in range(steps):
        state, metrics = train_step(state, run.objective.batch(step, 8))
        losses.append(float(ratio(metrics["sums"]["loss"])))
    facts["base_bit_identical"] = all(
        old.dtype == new.dtype and np.array_equal(np.asarray(new), old)
        for old, new in zip(jax.tree.leaves(frozen), jax.tree.leaves(state["frozen"])))
    facts["every_adapter_moved"] = all(not np.array_equal(np.asarray(new), old)
                                       for old, new in zip(jax.tree.leaves(adapters), jax.tree.leaves(state["params"])))
    return {"losses": losses, "adapters": [np.asarray(x).ravel().tolist() for x in jax.tree.leaves(state["params"])],
            **facts}


MESH_SCRIPT = """
import dataclasses, json, sys, numpy as np, jax
from flax import nnx
from jaxformer import sharding
from jaxformer.train import run_config
from jaxformer.train.run import Run
sys.path.insert(0, "tests")
from test_lora_train import TINY, _run_steps
out = {}
for base, name, sizes in [("float", "fsdp", {"fsdp": 8}), ("int8", "tp", {"data": 2, "tensor": 4})]:
    cfg = run_config.load(None, TINY + [f"finetune.lora.base_dtype={base}", "finetune.lora.dropout=0.1"])
    single = Run.build(cfg, mesh=sharding.make_mesh({"data": 1}, jax.devices()[:1]))
    mesh = sharding.make_mesh(sizes)
    graphdef, tensors = nnx.split(single.model)  # a host copy: the single-device steps donate their buffers
    copy = nnx.merge(graphdef, jax.tree.map(np.array, tensors))
    other = dataclasses.replace(single, model=sharding.shard_model(copy, mesh), mesh=mesh)
    out[base + "_single"] = _run_steps(single, cfg)
    out[base + "_" + name] = _run_steps(other, cfg)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def mesh_runs():
    """One subprocess with 8 simulated devices: three LoRA steps on one device and on fsdp=8, three QLoRA
    steps on one device and on data=2 x tensor=4, LoRA dropout on. Each base is built once, on one
    device, and copied onto the other mesh (the same tensors)."""
    env = simulated_devices(8)
    done = subprocess.run([sys.executable, "-c", MESH_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_only_the_adapters_train_the_base_stays_bit_identical_and_adam_holds_only_their_state(mesh_runs):
    """LoRA and QLoRA: the adapters alone are differentiated and all move; every base tensor (float, or
    int8 kernels with their scales, embeddings, norms) is bit-identical after the steps, on every mesh;
    Adam's two moments are exactly the adapters' size."""
    for label, facts in mesh_runs.items():
        assert facts["only_adapters_train"] and facts["every_adapter_moved"] and facts["base_bit_identical"], label
        assert facts["adam_moments"] == 2 * facts["adapter_size"], label
        assert facts["adapter_size"] < 0.2 * facts["base_size"] and np.isfinite(facts["losses"]).all()
        assert facts["int8_kernels"] == (6 if label.startswith("int8") else 0), label  # q k v o wi wo (stacked)


def test_lora_under_fsdp_and_qlora_under_tensor_parallel_equal_one_device(mesh_runs):
    assert "tensor" in mesh_runs["int8_tp"]["q_spec"]  # the int8 kernels shard by their logical axes
    assert "fsdp" in mesh_runs["float_fsdp"]["q_spec"]
    for name, reference in [("float_fsdp", "float_single"), ("int8_tp", "int8_single")]:
        np.testing.assert_allclose(mesh_runs[name]["losses"], mesh_runs[reference]["losses"], rtol=1e-5)
        for a, b in zip(mesh_runs[name]["adapters"], mesh_runs[reference]["adapters"]):
            np.testing.assert_allclose(a, b, atol=1e-5)


def _save_tiny_gpt(folder: Path, seed: int) -> None:
    """A tiny GPT-2 Hugging Face folder (initialised under jit: eager initialisation is slower)."""
    from jaxformer.sharding import make_mesh, sharded_build

    sharded_build(lambda: jf.build("tiny-gpt", seed=seed), make_mesh({"data": 1}, jax.devices()[:1])).save_pretrained(
        folder)


def test_a_lora_checkpoint_refers_to_its_base_resumes_and_converts(tmp_path):
    """A LoRA run from hf:PATH leaves the base bit-identical and checkpoints adapters, their optimizer state
    and a base reference (no base tensors); deleting the last checkpoint and running again resumes to the
    same adapters; the run converts to a merged Hugging Face model that computes what the adapters did;
    a changed base is refused."""
    from jaxformer.cli import main as cli

    run_dir, base = tmp_path / "run", tmp_path / "base"
    _save_tiny_gpt(base, seed=3)
    cfg = run_config.load(None, TINY + [f"run.dir={run_dir}", f"model.init_from=hf:{base}", "checkpoint.every=2",
                                        "finetune.lora.dropout=0.1"])
    first = train(cfg, progress=False)
    loaded = dict(nnx.to_flat_state(nnx.state(jf.from_pretrained(base), nnx.Param)))
    trained = nnx.to_flat_state(nnx.state(first["model"], nnx.All(nnx.Param, nnx.Not(LoraParam))))
    assert len(trained) == len(loaded)
    for path, variable in trained:  # the float base, bit for bit
        np.testing.assert_array_equal(np.asarray(variable[...]), np.asarray(loaded[path][...]))
    adapters = {"/".join(map(str, p)): np.array(v[...])
                for p, v in nnx.to_flat_state(nnx.state(first["model"], LoraParam))}
    saved = run_dir / "checkpoints" / "4"
    reference = json.loads((saved / "base" / "metadata").read_text())  # Orbax's JSON item
    assert reference["source"] == f"hf:{base}" and len(reference["fingerprint"]) == 64
    stored = sum(f.stat().st_size for f in (saved / "params").rglob("*") if f.is_file())
    base_bytes = (base / "model.safetensors").stat().st_size
    assert stored < base_bytes / 3  # adapters only: no second copy of the base

    shutil.rmtree(saved)  # as if the run had stopped after step 2
    second = train(cfg, progress=False)
    assert second["start_step"] == 2
    for path, variable in nnx.to_flat_state(nnx.state(second["model"], LoraParam)):
        np.testing.assert_allclose(np.asarray(variable[...]), adapters["/".join(map(str, path))], atol=1e-6)

    out = tmp_path / "merged"
    assert cli(["convert", str(run_dir), "--to-hf", str(out), "--merge"]) == 0
    merged = jf.from_pretrained(out)
    assert merged.config.lora is None
    ids = np.arange(16, dtype=np.int32).reshape(2, 8) % 200
    lora_logits = nnx.jit(lambda m, x: m(x).logits)(second["model"], ids)
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, x: m(x).logits)(merged, ids)), np.asarray(lora_logits),
                               atol=1e-5)
    assert cli(["convert", str(run_dir), "--to-hf", str(tmp_path / "plain")]) == 2  # a LoRA run needs --merge
    assert cli(["convert", str(run_dir), "--to-peft", str(tmp_path / "peft")]) == 0
    with_adapter = jf.from_pretrained(base, adapter=tmp_path / "peft")
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, x: m(x).logits)(with_adapter, ids)),
                               np.asarray(lora_logits), atol=1e-5)

    shutil.rmtree(base)  # another model where the base was
    _save_tiny_gpt(base, seed=4)
    with pytest.raises(ValueError, match="fingerprint"):
        train(cfg, progress=False)
