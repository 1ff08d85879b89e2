"""Sharding: every strategy of the experiments runner equals the single-device step on 8 simulated
devices, parameters are laid out as the rules say, FSDP divides the bytes, two processes on loopback
train like one, checkpoints restore onto another mesh, and bad meshes fail clearly.

Runs needing several devices go to subprocesses (XLA's device count is fixed when JAX starts).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxformer import sharding
from conftest import simulated_devices
from data_processes_check import write_shards

ROOT = Path(__file__).resolve().parents[1]


def _json_report(*command: str):
    """What a script run in a subprocess prints as JSON on its last line."""
    out = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _experiments(model: str, strategies: str) -> list[dict]:
    return _json_report("sharding/experiments.py", "--model", model, "--strategies", strategies, "--devices", "8",
                        "--steps", "0", "--json")


@pytest.mark.parametrize("model, strategies", [
    ("tiny-gpt", "single,pmap,shard_map,dp,fsdp,tp,fsdp_tp,cp"),
    # The data-parallel mechanisms (pmap, shard_map, dp) and tp alone are family-independent and run on
    # tiny-gpt; the other families run the layouts their own parameters get: fsdp, and tp inside fsdp_tp.
    ("tiny-bert", "single,fsdp,fsdp_tp"),
    # tiny-t5 also trains its two stacks pipelined in turn (pp: stage=2 x data=4, GPipe, 4 microbatches)
    ("tiny-t5", "single,fsdp,fsdp_tp,pp"),
    # The mixture of experts (grouped dispatch, experts split over `expert`: tokens exchanged by an all-to-all,
    # and GSPMD's partitioning of the same dispatch), with latent attention, shared experts and a dense first
    # layer besides; Mixtral's MoE is the same code. Its attention and dense layers run fsdp and tp together
    # (fsdp_tp); each alone is the same rules, shown on tiny-gpt.
    ("tiny-deepseek", "single,fsdp_tp,ep,ep_gspmd"),
])
def test_every_strategy_equals_the_single_device_step(model, strategies):
    rows = {r["strategy"]: r for r in _experiments(model, strategies)}
    assert list(rows) == strategies.split(",")
    # Different reduction orders only: float32 rounding of a one-step update. tiny-deepseek sums more
    # pieces per output in a different order when sharded (latent up-projections, expert blocks): 2e-5.
    tolerance = 2e-5 if model == "tiny-deepseek" else 1e-5
    for name, r in rows.items():
        assert max(r["loss_diff"], r["param_diff"], r["grad_norm_rel_diff"]) < tolerance, (name, r)
    single = rows["single"]["specs"]
    assert set(single.values()) == {"P()"}
    if model == "tiny-gpt":
        q, up, down, norm = ("decoder.blocks.attn.q", "decoder.blocks.mlp.wi", "decoder.blocks.mlp.wo",
                             "decoder.blocks.attn_norm.scale")
        assert rows["fsdp"]["specs"][q] == "P(None, 'fsdp', None, None)"
        assert rows["tp"]["specs"][q] == "P(None, None, 'tensor', None)"
        assert rows["tp"]["specs"][up] == "P(None, None, 'tensor')"
        assert rows["tp"]["specs"][down] == "P(None, 'tensor', None)"
        assert rows["fsdp_tp"]["specs"][down] == "P(None, 'tensor', 'fsdp')"
        assert rows["fsdp"]["specs"][norm] == "P()"  # vectors stay replicated
        assert set(rows["dp"]["specs"].values()) == {"P()"}
    if "cp" in rows:  # context parallelism splits tokens, not parameters, and the step's activations with them
        assert rows["cp"]["mesh"] == {"data": 1, "sequence": 8} and set(rows["cp"]["specs"].values()) == {"P()"}
        assert rows["cp"]["temp_bytes"] < rows["single"]["temp_bytes"] / 2
    if "pp" in rows:  # each stack's layers split over `stage`; the stages pass activations on
        assert rows["pp"]["mesh"] == {"data": 4, "stage": 2}
        assert rows["pp"]["specs"]["encoder.blocks.attn.q"] == "P('stage', None, None, None)"
        assert rows["pp"]["communicated"]["collective-permute"] > 0
        assert rows["pp"]["bubble"]["ideal"] == pytest.approx(1 / 5)  # (S - 1) / (M + S - 1), M = 4, S = 2
    if model == "tiny-deepseek":  # experts split over `expert`; latent up-projections by latent and head
        experts = ["decoder.blocks.mlp.wi", "decoder.blocks.mlp.wi_gate", "decoder.blocks.mlp.wo"]
        assert all(rows["ep"]["specs"][k].startswith("P(None, 'expert'") for k in experts)
        # the all-to-all sends each token to its experts' device; GSPMD gathers the experts' weights instead
        assert rows["ep"]["communicated"]["all-to-all"] > 0 and "all-to-all" not in rows["ep_gspmd"]["communicated"]
        assert sum(rows["ep"]["communicated"].values()) < sum(rows["ep_gspmd"]["communicated"].values()) / 4
        assert rows["fsdp_tp"]["specs"]["decoder.blocks.attn.k_up"] == "P(None, 'fsdp', 'tensor', None)"
        assert rows["fsdp_tp"]["specs"]["decoder.blocks.attn.kv_down"] == "P(None, 'fsdp', None)"
    if "fsdp" in rows:
        # FSDP over 8 devices: an eighth of the parameters and optimizer state, plus what stays replicated:
        # norms and biases only (nothing with an `embed` axis, the one FSDP splits).
        replicated = _replicated_bytes(model, rows["fsdp"]["specs"])
        total = rows["single"]["bytes_per_device"]
        assert rows["fsdp"]["bytes_per_device"] <= (total - 3 * replicated) / 8 + 3 * replicated + 64  # + Adam's
        assert replicated < 0.05 * total / 3


def _replicated_bytes(model: str, specs: dict[str, str]) -> int:
    """Bytes of the parameters left whole under FSDP, checking that each is a norm or a bias."""
    import math

    from flax import nnx

    import jaxformer as jf

    cfg = jf.config(model)  # as the runner trains it: byte vocabulary with specials, BERT's pretraining head
    if cfg.family != "decoder":
        cfg = cfg.replace(vocab_size=360)
    if cfg.family == "encoder":
        cfg = cfg.replace(head="pretraining", pooler=True)
    params = nnx.to_flat_state(jf.abstract_params(cfg))
    assert {".".join(map(str, path)) for path, _ in params} == set(specs)
    total = 0
    for path, variable in params:
        if specs[".".join(map(str, path))] == "P()":
            axes = [a for a in variable.get_metadata()["axes"] if a != "layers"]
            assert len(axes) <= 1 or "embed" not in axes, path
            total += 4 * math.prod(variable.shape)
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TRAIN = ["train.steps=8", "train.batch_size=8", "train.seq_len=32", "train.log_every=2", "eval.every=8",
         "eval.batches=1", "optim.warmup_steps=2", "train.sample_tokens=0", "checkpoint.every=4"]


def test_two_processes_on_loopback_train_like_one_process_with_four_devices(tmp_path):
    """From a token-shard folder (memory-mapped, about 85 shards): each process reads and feeds its own rows."""
    corpus = write_shards(tmp_path / "shards")

    def launch(extra, devices, env_extra=None):
        env = simulated_devices(devices, **(env_extra or {}))
        return subprocess.Popen([sys.executable, "train.py", *TRAIN, f"data.train={corpus}", *extra], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    port = _free_port()
    workers = [launch([f"run.dir={tmp_path / 'two'}", "mesh.data=4", f"mesh.coordinator=127.0.0.1:{port}",
                       "mesh.num_processes=2", f"mesh.process_id={pid}"], 2) for pid in range(2)]
    single = launch([f"run.dir={tmp_path / 'one'}", "mesh.data=4"], 4)
    outputs = []
    for process in [*workers, single]:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        outputs.append(out)
    assert "trained 8 steps" in outputs[0] and "trained" not in outputs[1]  # process 0 alone reports
    assert f"shards of {corpus}, memory-mapped" in outputs[0]
    two = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    one = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    # Same mesh and program; the cross-process all-reduce (gloo) sums in another order than the
    # in-process one, so float32 rounding (about 1e-7 relative) is the only difference.
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=1e-6)
    np.testing.assert_allclose(two[-1]["eval_loss"], one[-1]["eval_loss"], rtol=1e-6)
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir() if p.name.isdigit()) == ["4", "8"]


def test_a_checkpoint_restores_onto_another_mesh(tmp_path):
    """Saved under fsdp=4, restored under data=2 x tensor=2, data=2 x stage=2 and fsdp=4: identical values."""
    script = f"""
import json, numpy as np, jax
from flax import nnx
from jaxformer.train import run_config
from jaxformer.train.run import train
from jaxformer.train.evaluate import restore_run
cfg = run_config.load(None, {TRAIN!r} + ["run.dir={tmp_path / 'run'}", "mesh.data=1", "mesh.fsdp=4"])
trained = train(cfg, progress=False)["model"]
reference = [np.asarray(x) for x in jax.tree.leaves(nnx.state(trained, nnx.Param))]
for mesh in (["mesh.data=2", "mesh.tensor=2"], ["mesh.data=2", "mesh.stage=2"], ["mesh.data=1", "mesh.fsdp=4"]):
    run, step = restore_run("{tmp_path / 'run'}", overrides=tuple(mesh))
    leaves = jax.tree.leaves(nnx.state(run.model, nnx.Param))
    assert step == 8
    assert all(np.array_equal(np.asarray(a), b) for a, b in zip(leaves, reference))
    print(json.dumps(sorted({{str(x.sharding.spec) for x in leaves}})))
"""
    env = simulated_devices(4)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    tensor_specs, stage_specs, fsdp_specs = (json.loads(line) for line in out.stdout.strip().splitlines()[-3:])
    assert any("tensor" in s for s in tensor_specs) and any("fsdp" in s for s in fsdp_specs)
    assert any("stage" in s for s in stage_specs)  # each stage restores only its own layers


def test_generation_on_a_sharded_model_is_token_identical():
    """Greedy and beam search over parameters split by fsdp=2 x tensor=4 (the compiled loop follows the
    parameters' shardings) give the single-device tokens. The same weights on both sides (``shard_model``):
    a build jitted under the mesh draws its random floats through other fused code, equal only to the last
    bit, which is not what this compares."""
    script = """
import numpy as np, jaxformer as jf
from jaxformer import sharding
mesh = sharding.make_mesh({"fsdp": 2, "tensor": 4})
ids = np.array([[5, 6, 7, 8], [9, 10, 11, 12]])
for name, kwargs in (("tiny-gpt", {}), ("tiny-t5", {"num_beams": 2, "decoder_start_token_id": 0})):
    split, whole = sharding.shard_model(jf.build(name), mesh), jf.build(name)
    assert np.array_equal(split.generate(ids, max_new_tokens=6, **kwargs), whole.generate(ids, max_new_tokens=6, **kwargs))
print("ok")
"""
    env = simulated_devices(8)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_context_parallelism_equals_one_device():
    """The `sequence` axis (ring attention) beside data, fsdp and tensor: loss, logits and every gradient of a
    causal, a sliding-window, a sinks-and-soft-caps and a bidirectional model, and a prefill through the
    cached step, equal one device's; T5's biased self-attention stays on XLA, its cross-attention rides the
    ring. Each case again on rows of packed documents whose boundaries fall inside every device's chunk: the
    key blocks carry their segment ids around the ring (ignoring them gives 0.04 to 0.66). One subprocess of
    8 simulated devices (tests/context_parallel_check.py)."""
    report = _json_report("tests/context_parallel_check.py")
    assert len(report) == 10 and sum(name.startswith("packed: ") for name in report) == 5
    for name, row in report.items():
        # float32: a running softmax over blocks, and sums split over devices, against one softmax
        assert max(row["loss"], row["logits"], row["grads"], row.get("prefill", 0.0)) < 1e-5, (name, row)
        assert row["ring_calls"] >= 1, (name, row)  # traced once: the layers are scanned
    assert "prefill" in report["causal (LLaMA, GQA)"] and "prefill" in report["sliding (Mistral, window 5)"]


def test_expert_parallelism_with_an_all_to_all_equals_one_device():
    """The `expert` axis exchanges tokens with an all-to-all: Mixtral and DeepSeek on 4 and 8 devices, beside
    data, fsdp, tensor and sequence, gpt-oss's expert biases and Llama 4's weighted inputs: loss, logits,
    every gradient equal one device's, and a prefill through the cached step for both models on 8 devices
    and Mixtral on 4 (tests/expert_parallel_check.py, one subprocess of 8 simulated devices)."""
    report = _json_report("tests/expert_parallel_check.py")
    assert len(report) == 6
    for name, row in report.items():
        # float32: the experts' blocks and the gradients' sums split over devices, in another order
        assert max(row["loss"], row["logits"], row["grads"], row.get("prefill", 0.0)) < 1e-5, (name, row)
        assert row["exchanges"] == 1 + ("prefill" in row), (name, row)  # traced once a program: layers scanned
    assert sum("prefill" in row for row in report.values()) == 3


def test_pipeline_parallelism_equals_one_device():
    """The `stage` axis: a decoder (LLaMA), Gemma 3's alternating sliding and full layers, a MoE decoder (Mixtral, its balancing loss pooled over
    microbatches), DeepSeek (its dense first layer run apart, latent attention and experts pipelined), an
    encoder (BERT) and an encoder-decoder (T5, both stacks pipelined), each under GPipe and
    the circular schedule (2 chunks a stage), on 4 and 8 devices beside data, fsdp, tensor, expert and
    sequence: loss,
    outputs and every gradient equal one device's, and greedy decoding under stage=4
    (the cached steps run the layers in turn) gives one device's tokens (tests/pipeline_parallel_check.py,
    one subprocess of 8 simulated devices)."""
    report = _json_report("tests/pipeline_parallel_check.py")
    assert report.pop("greedy tokens under stage 4 equal one device's") is True
    assert len(report) == 12
    assert {tuple(sorted(row["mesh"])) for row in report.values()} >= {("stage",), ("data", "stage"),
                                                                        ("fsdp", "stage")}
    for name, row in report.items():
        # float32: the same per-row arithmetic; sums over rows split into microbatches and devices
        assert max(row["loss"], row["logits"], row["grads"]) < 1e-5, (name, row)
        assert row["permuted_bytes"] > 0, (name, row)  # the stages hand activations on: a collective permute


def test_a_pipeline_refuses_what_it_cannot_split_before_anything_compiles():
    from flax import nnx

    import jaxformer as jf
    from jaxformer.layers.pipeline import check_schedule, schedule
    from jaxformer.layers.stack import check_pipeline_stacks
    from jaxformer.train import run_config

    assert schedule(4, 1, 8) == (11, 3 / 11) and schedule(4, 2, 8) == (19, 3 / 19)
    with pytest.raises(ValueError, match=r"6 layers, which do not split into mesh.stage=4 stages x 1 repeats"):
        check_schedule(6, 8, 4, 1, 4)
    with pytest.raises(ValueError, match=r"8 rows do not split into 3 microbatches"):
        check_schedule(8, 8, 2, 1, 3)
    with pytest.raises(ValueError, match=r"groups of mesh.stage=4: train.microbatches=6 must be a multiple"):
        check_schedule(8, 12, 4, 2, 6)
    maverick = jf.config("tiny-mixtral").replace(decoder_layers=4, moe_layer_step=2)
    for cfg, reason in ((maverick, "block group 'dense_blocks' interleave"), (jf.config("tiny-transformer-xl"),
                                                                           "segment memory")):
        with pytest.raises(ValueError, match=f"mesh.stage=2: decoder cannot run as a pipeline: .*{reason}"):
            check_pipeline_stacks(nnx.eval_shape(lambda cfg=cfg: jf.build(cfg)), 2, 8)
    deepseek = nnx.eval_shape(lambda: jf.build("tiny-deepseek"))  # a dense first layer, then 2 MoE layers
    check_pipeline_stacks(deepseek, 2, 8)  # the dense layer runs apart, whole on every stage
    with pytest.raises(ValueError, match=r"decoder \(past 1 run apart\) has 2 layers, which do not split into "
                                         r"mesh.stage=4"):
        check_pipeline_stacks(deepseek, 4, 8)
    check_pipeline_stacks(nnx.eval_shape(lambda: jf.build("tiny-t5")), 2, 8)  # both stacks: 2 layers, 2 stages
    with pytest.raises(ValueError, match=r"train.microbatches=4 and train.pipeline_repeats=1 schedule a pipeline; "
                                         r"set mesh.stage > 1"):
        run_config.load(None, ["train.microbatches=4"])


def test_router_statistics_pooled_over_microbatches_equal_the_whole_batchs():
    """A pipeline's MoE layers see one microbatch at a time; their load, mean probability and DeepSeek-V3's
    per-row term, pooled, equal the whole batch's, with a microbatch of no real tokens and rows of none."""
    import jax
    import jax.numpy as jnp

    import jaxformer as jf
    from jaxformer.layers.feedforward import Routing, pooled_router_statistics, router_statistics

    cfg = jf.config("tiny-deepseek")  # sigmoid scores, k = 2 of 8 experts
    B, T, E, k, M = 8, 5, cfg.experts.count, cfg.experts.per_token, 4
    keys = jax.random.split(jax.random.key(0), 3)
    experts = jax.random.randint(keys[0], (B, T, k), 0, E)
    routing = Routing(experts, jnp.ones((B, T, k)), jax.nn.sigmoid(jax.random.normal(keys[1], (B, T, E))))
    mask = jax.random.bernoulli(keys[2], 0.7, (B, T)).at[2:4].set(False).at[5].set(False)  # microbatch 1: none
    whole = router_statistics(cfg, routing, mask)
    parts = [router_statistics(cfg, Routing(*(a[2 * m:2 * m + 2] for a in routing)), mask[2 * m:2 * m + 2])
             for m in range(M)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *parts)
    pooled = pooled_router_statistics(stacked, mask.reshape(M, B // M, T))
    for name in ("load", "prob", "sequence_loss"):
        np.testing.assert_allclose(pooled[name], whole[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_communicated_bytes_reads_collectives_and_counts_loops_per_iteration():
    hlo = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  ROOT %s = f32[] add(%a, %b)
}

%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %all-to-all.1 = f32[8,16]{1,0} all-to-all(%x), channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}
  ROOT %t = (s32[], f32[8,16]) tuple(%i, %all-to-all.1)
}

%cond (p: (s32[], f32[8,16])) -> pred[] {
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[8,16]) -> f32[64,16] {
  %w = (s32[], f32[8,16]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %all-reduce = f32[8,16]{1,0} all-reduce(%x), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %all-reduce.2 = f32[8,16]{1,0} all-reduce(%x), channel_id=4, replica_groups=mesh['a'=4,'b'=2] {'a'}, to_apply=%add
  ROOT %all-gather = f32[64,16]{1,0} all-gather(%x), channel_id=3, replica_groups=[1,8]<=[8], dimensions={0}
}
"""
    size = 8 * 16 * 4
    assert sharding.communicated_bytes(hlo) == {"all-to-all": 3 * size * 3 // 4,
                                                "all-reduce": 2 * size * 7 // 8 + 2 * size * 3 // 4,
                                                "all-gather": 8 * size * 7 // 8}


def test_bad_meshes_and_batches_name_the_axes_and_sizes():
    with pytest.raises(ValueError, match=r"holds 6 devices; there are 8"):
        sharding.mesh_sizes({"data": 3, "tensor": 2}, 8)
    with pytest.raises(ValueError, match="leave no whole size for mesh.data on 8 devices"):
        sharding.mesh_sizes({"data": -1, "tensor": 3}, 8)
    assert sharding.mesh_sizes({"data": -1, "tensor": 2}, 8) == {"stage": 1, "data": 4, "fsdp": 1, "tensor": 2,
                                                                 "expert": 1, "sequence": 1}
    from jaxformer.train import run_config
    with pytest.raises(ValueError, match=r"train.seq_len=30 must be a multiple of 2 x mesh.sequence = 4"):
        run_config.load(None, ["mesh.sequence=2", "train.seq_len=30"])
    mesh = SimpleNamespace(shape={"stage": 1, "data": 2, "fsdp": 2, "tensor": 4, "expert": 1})
    with pytest.raises(ValueError, match="logical axis 'heads' of size 6 does not divide over mesh axis 'tensor' "
                                         "of size 4"):
        sharding.spec_for(("layers", "embed", "heads", "head_dim"), (2, 64, 6, 16), mesh, "attn.q")
    assert sharding.spec_for(("layers", "embed", "heads", "head_dim"), (2, 64, 8, 16), mesh) == \
        P(None, "fsdp", "tensor", None)
    with pytest.raises(ValueError, match=r"6 rows does not divide over the data-parallel size mesh.data x "
                                         r"mesh.fsdp x mesh.expert = 2 x 2 x 1 = 4"):
        sharding.check_batch(6, mesh)
    np.testing.assert_equal(sharding.check_batch(8, mesh), None)
