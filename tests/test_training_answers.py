"""What train.py, the training API and sharding/experiments.py answer when a run cannot go as asked: one
clear line, before anything compiles, or the right answer where the refusal was wrong (issue 46)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxformer import sharding
from jaxformer.models import build
from jaxformer.train import run_config
from jaxformer.train.run import (CONFIG_FILE, MODEL_FILE, Run, accept_resume, command_line_config, executed,
                                 preset_model_config)

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["train.batch_size=4", "train.seq_len=16", "eval.batches=1", "train.sample_tokens=0"]


def _experiments():
    spec = importlib.util.spec_from_file_location("experiments", ROOT / "sharding" / "experiments.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_experiments_refuses_a_strategy_it_cannot_run_before_running_any(capsys):
    # On one device no pipeline has two stages: the old runner ran `single` first, then died in a traceback.
    code = _experiments().main(["--strategies", "single,dp,pp", "--steps", "0", "--batch-size", "2",
                                "--seq-len", "8"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("experiments.py: error: strategy 'pp': ")


def test_experiments_answers_an_unknown_model_in_one_line(capsys):
    code = _experiments().main(["--model", "nope", "--steps", "0"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("experiments.py: error: unknown preset 'nope'; valid presets: ")


def test_experiments_prints_the_rows_that_finished_when_a_later_strategy_fails(capsys, monkeypatch):
    from jaxformer.train import steps

    made, make_steps = [], steps.make_steps

    def make_steps_failing_second(*args, **kwargs):  # a failure only running shows (out of memory, say)
        made.append(1)
        if len(made) == 2:
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")
        return make_steps(*args, **kwargs)

    monkeypatch.setattr(steps, "make_steps", make_steps_failing_second)
    code = _experiments().main(["--strategies", "single,fsdp", "--steps", "0", "--batch-size", "2", "--seq-len", "8",
                                "--json"])
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert code == 1 and [r["strategy"] for r in rows] == ["single"]
    assert err.splitlines()[-1].startswith("experiments.py: strategy 'fsdp' failed (RuntimeError: RESOURCE_EXHAUSTED")


def test_experiments_longest_stops_at_the_position_table_and_says_so(capsys):
    # tiny-gpt's learned table holds 128 positions: doubling past it was a traceback, not an answer
    code = _experiments().main(["--longest", "--seq-len", "128", "--batch-size", "2", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0 and [r["longest_seq_len"] for r in rows] == [128, 128]
    assert all("256 tokens refused: train.seq_len=256 exceeds the model's position table" in r["limit"] for r in rows)


def _stored_run(run_dir: Path, overrides: list[str]) -> None:
    """A run folder as a pipelined run leaves it (config.yaml, model.json), written without its devices."""
    stored = run_config.load(None, overrides)
    (run_dir / CONFIG_FILE).write_text(run_config.dump(stored), encoding="utf-8")
    model_cfg = executed(preset_model_config(stored), stored)
    (run_dir / MODEL_FILE).write_text(json.dumps(model_cfg.to_dict(), indent=1) + "\n", encoding="utf-8")


def _abstract_mesh(**sizes: int):
    names = sharding.MESH_AXES
    return jax.sharding.AbstractMesh(tuple(sizes.get(a, 1) for a in names), names,
                                     axis_types=(jax.sharding.AxisType.Auto,) * len(names))


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_pipeline_schedule_is_layout_on_resume_unless_dropout_draws_by_it(tmp_path, dropout):
    common = SMALL + [f"run.dir={tmp_path}", f"model.overrides.dropout_rate={dropout}"]
    _stored_run(tmp_path, common + ["mesh.stage=2", "mesh.data=1", "train.microbatches=4",
                                    "train.pipeline_repeats=2"])
    run = Run.build(run_config.load(None, common))  # one device: no stage axis, no microbatches
    if not dropout:
        assert accept_resume(run) == []
        return
    with pytest.raises(ValueError, match=r"dropout masks would differ \(drawn per pipeline microbatch, 4 -> "
                                         r"for the whole batch\); resume with mesh.stage > 1 and "
                                         r"train.microbatches=4"):
        accept_resume(run)
    # the same 4 microbatches on 4 stages of one chunk each: the masks are the same draws
    on_four = run_config.load(None, common + ["mesh.stage=4", "mesh.data=1", "train.microbatches=4"])
    assert accept_resume(dataclasses.replace(run, cfg=on_four, mesh=_abstract_mesh(stage=4))) == []


def test_a_direct_call_under_a_mesh_names_the_batch_that_does_not_divide():
    model = build(preset_model_config(run_config.load(None, ["model.preset=tiny-llama"])), seed=0)
    graphdef, state = nnx.split(model)
    forward = lambda state, ids: nnx.merge(graphdef, state)(ids).logits  # noqa: E731
    with jax.sharding.use_abstract_mesh(_abstract_mesh(data=2, sequence=2)):  # ring attention
        assert jax.eval_shape(forward, state, jnp.ones((4, 16), jnp.int32)).shape[0] == 4
        with pytest.raises(ValueError, match=r"the batch of 3 rows does not divide over the data-parallel size "
                                             r"mesh.data x mesh.fsdp x mesh.expert = 2 x 1 x 1 = 2: ring attention"):
            jax.eval_shape(forward, state, jnp.ones((3, 16), jnp.int32))


def test_a_missing_config_file_names_the_configs_there(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match=r"config file configs/nope.yaml does not exist; the configs in configs/: "
                                         r".*default.yaml"):
        command_line_config(["configs/nope.yaml"])


def test_seq_len_beyond_the_position_table_is_named_before_the_data_sizes():
    # 100,000 tokens is also more than the held-out text holds: the position table is the first answer
    with pytest.raises(ValueError, match=r"train.seq_len=100000 exceeds the model's position table "
                                         r"\(max_positions=256\)"):
        Run.build(run_config.load(None, ["train.seq_len=100000", "model.overrides.max_positions=256"]))


def test_train_py_prints_jaxformers_notes_in_one_line_and_others_as_python_does():
    spec = importlib.util.spec_from_file_location("train_script", ROOT / "train.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # defines the formatter; main runs only as __main__
    note = UserWarning("optim.warmup_steps=50 is not below train.steps=20")
    assert (script.one_line_notes(note, UserWarning, str(ROOT / "jaxformer" / "train" / "run_config.py"), 297)
            == "train.py: warning: optim.warmup_steps=50 is not below train.steps=20\n")
    elsewhere = script.one_line_notes(note, UserWarning, "/elsewhere/lib.py", 3)
    assert elsewhere.startswith("/elsewhere/lib.py:3: UserWarning")
