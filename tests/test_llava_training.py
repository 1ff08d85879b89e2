"""LLaVA's two training stages on questions about drawn pictures (configs/llava_shapes.yaml, then
configs/llava_shapes_lora.yaml, shortened): the rows put the image tokens, prompt and answer where LLaVA's processor
and the loss want them; stage 1 trains the projector alone (tower and decoder bit for bit as initialised), stage 2
LoRA adapters on the decoder beside the projector (none on the tower); each lowers the held-out loss well below
where it started, and stage 2's decoder says answers where the untrained one and stage 1's say none; the exports
load in transformers' LlavaForConditionalGeneration with our logits, and its greedy generation gives the answers our
held-out metric counts. A LLaVA train step sharded over data x fsdp x tensor equals one device's, the tower's
parameters laid out by the text model's rules. (Beating answer_chance takes reading the pictures, hundreds of steps
on these random towers: docs/vision.md's measured full runs, not a test's few seconds.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jaxformer.train import shapes, visual_qa
from jaxformer.train.data import IGNORE, HFTokenizer
from jaxformer.train.run_config import load

from conftest import simulated_devices

ROOT = Path(__file__).resolve().parents[1]
CONFIG, LORA_CONFIG = "configs/llava_shapes.yaml", "configs/llava_shapes_lora.yaml"
TOKENIZER = "configs/data/llava_shapes_tokenizer.json"
TOLERANCE = 1e-5
SHORT = ["train.batch_size=32", "train.log_every=10", "eval.batches=2", "optim.warmup_steps=4",
         "data.train=shapes:2000"]


def _objective(overrides=()):
    from jaxformer.train.run import preset_model_config
    from jaxformer.train.tasks import make_objective

    cfg = load(CONFIG, list(overrides))
    objective = make_objective(cfg, HFTokenizer(TOKENIZER))
    return objective, objective.adapt(preset_model_config(cfg), fresh=True)


def test_the_tokenizer_file_is_the_one_the_module_builds():
    with open(TOKENIZER, encoding="utf-8") as f:
        assert json.load(f) == json.loads(visual_qa.build_tokenizer().to_str())


def test_rows_hold_the_expanded_image_the_question_and_the_answer_alone_as_labels():
    objective, model_cfg = _objective()
    tokenizer = objective.tokenizer
    image, eos = model_cfg.vision.image_token_id, model_cfg.tokens.eos
    assert image == tokenizer.tokenizer.token_to_id("<image>")
    batch = objective.eval_batches(1, 16)[0]
    end = objective.seq_len - objective.answer_len  # every prompt ends here
    assert objective.answer_len == 2 and batch["pixel_values"].shape == (16, 3, 48, 48)
    for row in range(16):
        ids, mask, labels = batch["input_ids"][row], batch["attention_mask"][row], batch["labels"][row]
        start = int(np.argmax(mask))
        assert mask[start:].all() and not mask[:start].any()  # left padded, nothing after the EOS
        assert (ids == image).sum() == 36  # 6 x 6 patches, the class token dropped ('default')
        scene = shapes.scene(objective.seed, row, 48, stream=1)
        kind = list(visual_qa.QUESTIONS)[batch["kinds"][row]]
        prompt = visual_qa.PROMPT.format(question=visual_qa.QUESTIONS[kind]).replace("<image>", "<image> " * 36)
        assert tokenizer.tokenizer.decode(ids[start:end].tolist(), skip_special_tokens=False).split() == \
            ["<s>", *prompt.split()]
        assert labels[end - 1:end + 1].tolist() == [tokenizer.tokenizer.token_to_id(visual_qa.answer(scene, kind)), eos]
        assert (labels[:end - 1] == IGNORE).all() and labels[-1] == IGNORE and ids[-1] == eos
    assert 0.2 < objective.chance < 0.6


@pytest.mark.parametrize("overrides, message", [
    (["model.overrides.vision=null"], "reads images through a projector"),
    (["train.seq_len=40"], r"train.seq_len=40 cannot hold .* set train.seq_len=46"),
    (["data.train=python-docs"], "data.train='python-docs'"),
])
def test_the_objective_refuses_what_it_cannot_train_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        _objective(overrides)


def test_train_only_says_what_trains_and_refuses_paths_it_cannot_honour():
    from jaxformer.train.run import Run, train_only_notes
    from jaxformer.train.steps import make_optimizer, split_model

    run = Run.build(load(CONFIG, ["run.dir=unused"]))
    assert train_only_notes(run) == ["training projector alone: 8,320 of 210,624 numbers (3.95%), the rest frozen "
                                     "(finetune.train_only)"]  # 2 x (64 x 64 + 64)
    with pytest.raises(ValueError, match=r"\['projecter'\] match no parameter path .*projector"):
        make_optimizer(load(CONFIG, ["finetune.train_only=[projecter]"]), split_model(run.model)[1])
    with pytest.raises(ValueError, match=r"finetune.train_only=\['projector'\] with finetune.lora.rank=4"):
        load(CONFIG, ["finetune.lora.rank=4"])


def _held_out(run) -> dict:
    """The held-out metrics of ``run``'s model as it is (the run's own eval step)."""
    from jaxformer.sharding import shardings_of
    from jaxformer.train.steps import batch_sharding, make_eval_step, run_eval, split_model

    graphdef, params, rest = split_model(run.model)
    step = make_eval_step(graphdef, rest, run.objective, run.mesh, shardings_of(params))
    batches = run.objective.eval_batches(run.cfg.eval.batches, run.cfg.train.batch_size)
    return run_eval(step, run.objective, params, batches, batch_sharding(run.mesh))


def _params(model) -> dict[str, np.ndarray]:
    return {"/".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """Stage 1 (10 steps of 32 questions) then stage 2 over it (30 steps), and the untrained model's held-out
    metrics: the run's own model before its first step (the same seed builds the same weights)."""
    from jaxformer.train.run import Run, train

    first_dir, second_dir = tmp_path_factory.mktemp("llava_stage1"), tmp_path_factory.mktemp("llava_stage2")
    first_cfg = load(CONFIG, [f"run.dir={first_dir}", "train.steps=10", "eval.every=10", "checkpoint.every=10", *SHORT])
    untrained = Run.build(first_cfg)
    before = _held_out(untrained)
    first = train(first_cfg, progress=False)
    second = train(load(LORA_CONFIG, [f"run.dir={second_dir}", f"model.init_from=jaxformer:{first_dir}",
                                      "train.steps=30", "eval.every=30", "checkpoint.every=30", *SHORT]),
                   progress=False)
    return {"untrained": (_params(untrained.model), before), "first": (first_dir, first),
            "second": (second_dir, second)}


def test_stage_one_trains_the_projector_alone(stages):
    initial, before = stages["untrained"]
    _, result = stages["first"]
    trained = _params(result["model"])
    assert initial.keys() == trained.keys()
    changed = sorted(name for name in initial if not np.array_equal(initial[name], trained[name]))
    assert changed and all(name.startswith("projector/") for name in changed)
    assert {name.split("/")[1] for name in changed} == {"linear_1", "linear_2"}
    assert result["history"][-1]["eval_loss"] < before["eval_loss"] - 1  # 3.8 untrained, 2.4 after 10 steps


def test_stage_two_adapts_the_decoder_and_the_projector_over_stage_one(stages):
    _, first = stages["first"]
    _, second = stages["second"]
    model = second["model"]
    adapters = [name for name in _params(model) if name.endswith(("/a", "/b"))]
    assert adapters and all(name.startswith("decoder/") for name in adapters)  # none on the tower
    assert model.config.lora.trainable == ("projector",)
    stage_one, stage_two = _params(first["model"]), _params(model.merge_adapter())
    tower = [name for name in stage_one if name.startswith("vision/")]
    assert tower and all(np.array_equal(stage_one[name], stage_two[name]) for name in tower)
    assert not np.array_equal(stage_one["projector/linear_1/kernel"], stage_two["projector/linear_1/kernel"])
    held_out, before = second["history"][-1], first["history"][-1]
    assert held_out["eval_loss"] < before["eval_loss"] - 0.5  # 2.4 after stage 1, 1.45 after 30 steps of stage 2
    # stage 1's decoder, still as initialised, says no answer word yet (0 of 64); stage 2's gets 14 of 64 right
    assert held_out["eval_answer_accuracy"] > before["eval_answer_accuracy"] + 0.1


@pytest.mark.parametrize("stage", ["first", "second"])
def test_the_export_loads_in_transformers_with_our_logits_and_answers(stage, stages, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from jaxformer.layers import left_padded_positions
    from jaxformer.train.evaluate import export_hf

    run_dir, result = stages[stage]
    export_hf(run_dir, tmp_path, merge=stage == "second")
    model, objective = result["model"], result["objective"]
    batch = objective.eval_batches(1, 8)[0]
    # transformers in float64: ours against the exact numbers, not against torch's float32 rounding too (on the
    # full-length stage 2, torch float32 is 1.6e-5 from float64 where ours is 5.6e-6)
    reference = transformers.LlavaForConditionalGeneration.from_pretrained(tmp_path).eval().double()
    ids, mask = (torch.as_tensor(batch[k]).long() for k in ("input_ids", "attention_mask"))
    pixels = torch.as_tensor(batch["pixel_values"], dtype=torch.float64)
    with torch.no_grad():
        want = reference(input_ids=ids, attention_mask=mask, pixel_values=pixels,
                         position_ids=torch.as_tensor(np.array(left_padded_positions(batch["attention_mask"])))
                         ).logits.numpy()
    got = np.asarray(model(batch["input_ids"], batch["attention_mask"],
                           left_padded_positions(batch["attention_mask"]), pixel_values=batch["pixel_values"]).logits)
    real = batch["attention_mask"][..., None].astype(bool)  # (padding's logits are nobody's numbers)
    assert np.abs(np.where(real, got - want, 0)).max() <= TOLERANCE

    # greedy generation after each prompt, in transformers and here, answers what the held-out metric counts
    end, steps = objective.seq_len - objective.answer_len, objective.answer_len
    settings = dict(max_new_tokens=steps, do_sample=False, pad_token_id=0, eos_token_id=3)
    with torch.no_grad():
        theirs = reference.generate(input_ids=ids[:, :end], attention_mask=mask[:, :end],
                                    pixel_values=pixels, **settings).numpy()
    ours = np.asarray(model.generate(batch["input_ids"][:, :end], batch["attention_mask"][:, :end],
                                     pixel_values=batch["pixel_values"], **settings))
    assert ours.tolist() == theirs.tolist()
    exact = (ours[:, end:] == batch["labels"][:, end - 1:end - 1 + steps]).all(axis=1)
    counted = jax.jit(lambda b: objective.loss(model, b, None)[1]["answer_accuracy"])(batch)
    assert float(counted[0]) == exact.sum() and float(counted[1]) == 8


def test_a_sharded_llava_step_equals_one_device():
    """Loss and every gradient of a LLaVA train step (stage 1's model and objective, every parameter
    differentiated) on data 2 x fsdp 2 x tensor 2 equal one device's; the tower's and the projector's
    parameters are laid out by the text model's rules (one subprocess of 8 simulated devices)."""
    script = """
import json, jax, numpy as np
from flax import nnx
from jaxformer import sharding
from jaxformer.train.run import Run
from jaxformer.train.run_config import load
from jaxformer.train.steps import batch_sharding, split_model
cfg = load("configs/llava_shapes.yaml", ["train.batch_size=8", "run.dir=unused", "mesh.data=1"])
run = Run.build(cfg, mesh=sharding.make_mesh({"data": 1}, jax.devices()[:1]))
batch = run.objective.batch(0, 8)
def loss_and_grads(model, mesh):
    graphdef, params, rest = split_model(model)
    loss = lambda p, b: run.objective.loss(nnx.merge(graphdef, p, rest), b, None)[0]
    step = jax.jit(sharding.under_mesh(jax.value_and_grad(loss), mesh))
    return step(params, sharding.to_device(batch, batch_sharding(mesh))), params
(loss, grads), _ = loss_and_grads(run.model, run.mesh)
mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
(split_loss, split_grads), params = loss_and_grads(sharding.shard_model(run.model, mesh), mesh)
difference = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                 for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(split_grads)))
specs = {"/".join(map(str, p)): str(v.get_value().sharding.spec) for p, v in nnx.to_flat_state(params)}
print(json.dumps({"loss": abs(float(loss) - float(split_loss)), "grads": difference, "specs": specs,
                  "grad_max": max(float(np.abs(np.asarray(g)).max()) for g in jax.tree.leaves(grads))}))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=simulated_devices(8), capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    # float32: the same sums split over devices and added in another order
    assert report["loss"] < 1e-5 and report["grads"] < 1e-5 and report["grad_max"] > 1e-3, report
    specs = report["specs"]
    assert specs["vision/encoder/blocks/attn/q"] == "P(None, 'fsdp', 'tensor', None)"
    assert specs["vision/encoder/blocks/mlp/wi"] == "P(None, 'fsdp', 'tensor')"
    assert specs["vision/encoder/blocks/mlp/wo"] == "P(None, 'tensor', 'fsdp')"
    assert specs["decoder/blocks/attn/q"] == "P(None, 'fsdp', 'tensor', None)"
    assert "fsdp" in specs["projector/linear_1/kernel"]
