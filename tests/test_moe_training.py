"""Training DeepSeek-style MoE models: the auxiliary-loss-free balancing (each MoE layer's RouterBias moved
between steps by train.router_bias_rate * sign(mean load - load)), the sequence-wise auxiliary loss in
causal_lm, and the router load in metrics.jsonl. One tiny-deepseek model (3 layers: 1 dense, 2 MoE with
8 experts, top-2) and two compiled train steps serve every test."""

from __future__ import annotations

import json

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

import jaxformer as jf
from jaxformer import sharding
from jaxformer.train import run_config
from jaxformer.train.data import ByteTokenizer
from jaxformer.train.objectives import ratio
from jaxformer.train.tasks import make_objective
from jaxformer.train.report import Report
from jaxformer.train.run import make_mesh
from jaxformer.train.steps import balance_router_bias, frozen_paths, init_state, make_optimizer, make_steps

BASE = ["model.preset=tiny-deepseek", "train.batch_size=8", "train.seq_len=32", "train.steps=10",
        "optim.warmup_steps=1", "train.sample_tokens=0"]
E, MOE_LAYERS = 8, 2


@pytest.fixture(scope="module")
def deepseek():
    """tiny-deepseek created sharded on one device (one jitted init: cheaper than an eager build)."""
    return sharding.sharded_build(lambda: jf.build("tiny-deepseek"), make_mesh(run_config.load(None, BASE)))


def _variant(model, **changes):
    """``model``'s parameters under a config that differs only in how the loss is computed."""
    cfg = model.config.replace(**changes)
    return nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: jf.build(cfg))), nnx.state(model))


def _setup(overrides: list[str], model):
    """The config, objective, initial train state (a copy of ``model``'s parameters: the step donates its
    state) and jitted train step of a run of ``model``."""
    cfg = run_config.load(None, BASE + overrides)
    objective = make_objective(cfg, ByteTokenizer())
    graphdef, everything = nnx.split(model)
    model = nnx.merge(graphdef, jax.tree.map(jnp.copy, everything))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer, schedule = make_optimizer(cfg, params)
    state = init_state(cfg, model, optimizer)
    mesh = jax.tree.leaves(params)[0].sharding.mesh
    train_step, _ = make_steps(graphdef, rest, optimizer, objective, cfg, mesh, sharding.shardings_of(state))
    return cfg, objective, schedule, state, train_step


def _bias(state) -> np.ndarray:
    return np.array(state["params"]["decoder"]["blocks"]["mlp"]["router_bias"][...])


def test_the_router_bias_moves_by_rate_times_the_sign_of_the_load_gap_and_the_optimizer_leaves_it(tmp_path,
                                                                                                 deepseek):
    rate = 0.01
    cfg, objective, schedule, state, train_step = _setup([f"train.router_bias_rate={rate}", f"run.dir={tmp_path}"],
                                                         deepseek)
    # No Adam moment (or any optimizer state) exists for the bias; the router weights have theirs.
    opt_paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(state["opt_state"])[0]]
    assert not [p for p in opt_paths if "router_bias" in p]
    assert [p for p in opt_paths if "'router'" in p]

    report = Report(cfg, objective, deepseek.config, schedule, 0, 0, progress=False)
    for step in range(3):
        before = _bias(state)
        state, metrics = train_step(state, objective.batch(step, 8))
        load = np.asarray(metrics["router_load"])  # [MoE layer, expert]: the dense first layer has none
        assert load.shape == (MOE_LAYERS, E)
        np.testing.assert_allclose(load.sum(-1), 1.0, atol=1e-6)
        move = np.float32(rate) * np.sign(load.mean(-1, keepdims=True) - load).astype(np.float32)
        assert np.any(move)
        np.testing.assert_array_equal(_bias(state), before + move)  # exactly: the optimizer adds nothing
        report.log(step + 1, metrics, 0)
    report.close()

    # The records of metrics.jsonl (and TensorBoard) hold the step's router load.
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert len(record["expert_load"]) == E and sum(record["expert_load"]) == pytest.approx(1.0, abs=1e-4)
        assert 1.0 <= record["max_load"] <= E / 2  # top-2: an expert gets at most half the assignments
    np.testing.assert_allclose(records[-1]["expert_load"], load.mean(0), atol=1e-6)
    assert records[-1]["max_load"] == pytest.approx(float((load.max(-1) * E).max()), abs=1e-4)  # the worst layer
    events = next((tmp_path / "tensorboard").glob("events.out.tfevents.*")).read_bytes()
    assert b"expert_load/7" in events and b"max_load" in events

    # A non-finite step is dropped whole: the bias keeps its value although the load was finite.
    kernel = state["params"]["lm_head"]["kernel"]
    kernel[...] = kernel[...].at[0, 0].set(np.nan)
    before = _bias(state)
    state, metrics = train_step(state, objective.batch(3, 8))
    assert int(state["skipped"]) == 1 and np.isfinite(np.asarray(metrics["router_load"])).all()
    np.testing.assert_array_equal(_bias(state), before)


def test_rate_zero_leaves_the_bias_and_causal_lm_adds_the_sequence_wise_aux_loss(deepseek):
    overrides = ["train.router_bias_rate=0", "train.grad_accum=2", "model.overrides.router_aux_loss=sequence",
                 "model.overrides.router_aux_loss_coef=0.01"]
    cfg = run_config.load(None, BASE + overrides)
    assert jf.config(cfg.model.preset).replace(**cfg.model.overrides).experts.aux_loss == "sequence"  # as run.py builds
    sequence_kind = _variant(deepseek, **cfg.model.overrides)
    batch_kind = _variant(deepseek, router_aux_loss_coef=0.01)
    _, objective, _, state, train_step = _setup(overrides, sequence_kind)
    batch = objective.batch(0, 8)

    @jax.jit
    def losses(batch):
        halves = [jax.tree.map(lambda x, j=j: x[j::2], batch) for j in range(2)]  # grad_accum=2's micro-batches
        return ([objective.loss(m, batch, None) for m in (sequence_kind, batch_kind)],
                [objective.loss(sequence_kind, half, None)[1]["router_load"][0] for half in halves])

    ((seq_loss, seq_sums), (batch_loss, batch_sums)), half_loads = losses(batch)
    seq_aux, batch_aux = float(seq_sums["aux_loss"][0]), float(batch_sums["aux_loss"][0])
    assert seq_aux > 0 and abs(seq_aux - batch_aux) > 1e-4  # the other kind of loss, on the same routing
    assert float(seq_loss) == pytest.approx(float(ratio(seq_sums["loss"])) + seq_aux, abs=1e-6)
    assert float(batch_loss) == pytest.approx(float(ratio(batch_sums["loss"])) + batch_aux, abs=1e-6)

    before = _bias(state)
    state, metrics = train_step(state, batch)
    # grad_accum=2: the step's load is the mean of its micro-batches' loads.
    np.testing.assert_allclose(np.asarray(metrics["router_load"]), np.mean(half_loads, axis=0), atol=1e-6)
    state, metrics = train_step(state, objective.batch(1, 8))
    assert float(ratio(metrics["sums"]["aux_loss"])) > 0
    np.testing.assert_array_equal(_bias(state), before)


def test_a_router_bias_that_finetune_train_only_freezes_stays_as_it_is(deepseek):
    params = nnx.state(deepseek, nnx.Param)
    frozen = frozen_paths(run_config.load(None, BASE + ["finetune.train_only=[lm_head]"]), params)
    assert "decoder/blocks/mlp/router_bias" in frozen
    load = jnp.asarray(np.random.default_rng(0).dirichlet(np.ones(E), MOE_LAYERS), jnp.float32)
    before = _bias({"params": params})
    assert np.array_equal(_bias({"params": balance_router_bias(params, load, 0.01, frozen)}), before)
    assert not np.array_equal(_bias({"params": balance_router_bias(params, load, 0.01)}), before)


@pytest.mark.parametrize("value", ["-0.001", "nan", "inf"])
def test_a_bad_router_bias_rate_is_an_error_naming_the_field(value):
    with pytest.raises(ValueError, match=r"train.router_bias_rate=.* must be a finite number >= 0"):
        run_config.load(None, [f"train.router_bias_rate={value}"])


def test_the_deepseek_config_file_is_valid():
    cfg = run_config.load("configs/deepseek_moe.yaml")
    assert cfg.model.preset == "tiny-deepseek" and cfg.train.router_bias_rate == 1e-2
    assert cfg.model.overrides == {"router_aux_loss": "sequence", "router_aux_loss_coef": 1e-4}
