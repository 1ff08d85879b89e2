"""Training a tiny CLIP from scratch on the drawn shapes (configs/clip_shapes.yaml, shortened): the set is
deterministic and each caption says what its picture shows; a short run lowers the contrastive loss and reports
held-out zero-shot accuracy against chance; its export loads in transformers' CLIPModel with our logits."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from jaxformer.train import shapes
from jaxformer.train.data import HFTokenizer

CONFIG = "configs/clip_shapes.yaml"
TOKENIZER = "configs/data/shapes_tokenizer.json"
TOLERANCE = 1e-5
BATCH = 32


def test_the_shapes_are_deterministic_and_their_captions_say_what_is_drawn():
    first, again = shapes.scene(7, 3, 48), shapes.scene(7, 3, 48)
    np.testing.assert_array_equal(first.image, again.image)
    assert first.caption == again.caption
    assert not np.array_equal(first.image, shapes.scene(7, 3, 48, stream=1).image)  # held out: another stream
    assert not np.array_equal(first.image, shapes.scene(8, 3, 48).image)
    numbers = {1: {"a", "an", "one"}, 2: {"two"}, 3: {"three"}}
    for index in range(300):
        scene = shapes.scene(0, index, 48)
        assert scene.image.shape == (48, 48, 3) and scene.image.dtype == np.uint8
        assert len(scene.centres) == scene.count
        for x, y in scene.centres:  # each shape's centre is painted in the caption's colour
            assert tuple(scene.image[y, x]) == shapes.COLOURS[scene.colour], (scene.caption, (x, y))
        caption = scene.caption.split()
        assert scene.colour in caption
        assert (scene.shape if scene.count == 1 else shapes.SHAPES[scene.shape]) in caption
        assert set(caption) & numbers[scene.count]
        assert [place for place in shapes.PLACES if place in scene.caption] in ([], [scene.place])
        assert shapes.class_prompts()[scene.label].endswith(f"{scene.colour} {scene.shape}")


def test_the_tokenizer_file_is_the_one_the_module_builds_and_knows_every_word():
    with open(TOKENIZER, encoding="utf-8") as f:
        assert json.load(f) == json.loads(shapes.build_tokenizer().to_str())
    tokenizer = HFTokenizer(TOKENIZER)
    assert (tokenizer.special("pad"), tokenizer.special("bos"), tokenizer.special("eos")) == (0, 1, 3)
    texts = [shapes.scene(0, i, 16).caption for i in range(200)] + shapes.class_prompts()
    for text, ids in zip(texts, tokenizer.encode_many(texts)):
        assert 2 not in ids and len(ids) == len(text.split()), text  # no <unk>


def test_the_objective_refuses_other_data_by_name():
    from jaxformer.train.run_config import load
    from jaxformer.train.tasks import make_objective

    for spec in ("python-docs", "shapes:0", "shapes:x"):
        with pytest.raises(ValueError, match="data.train"):
            make_objective(load(CONFIG, [f"data.train={spec}"]), HFTokenizer(TOKENIZER))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """configs/clip_shapes.yaml cut to 40 steps of 32 pairs, evaluated at steps 20 and 40 on one held-out batch."""
    from jaxformer.train.run import train
    from jaxformer.train.run_config import load

    run_dir = tmp_path_factory.mktemp("clip_shapes")
    cfg = load(CONFIG, [f"run.dir={run_dir}", "train.steps=40", f"train.batch_size={BATCH}", "train.log_every=10",
                        "eval.every=20", "eval.batches=1", "checkpoint.every=40", "optim.warmup_steps=4",
                        "data.train=shapes:2000"])
    return run_dir, train(cfg, progress=False)


def test_a_short_run_lowers_the_loss_and_reports_zero_shot_accuracy(trained):
    run_dir, result = trained
    history = result["history"]
    held_out = [r for r in history if "eval_loss" in r]
    assert [r["step"] for r in held_out] == [20, 40]
    assert history[-1]["loss"] < history[0]["loss"] and held_out[-1]["eval_loss"] < held_out[0]["eval_loss"]
    assert held_out[-1]["eval_loss"] < 0.9 * math.log(BATCH)  # below a uniform guess over the batch's pictures
    last = held_out[-1]
    assert 0 <= last["eval_zero_shot_accuracy"] <= 1
    assert last["eval_zero_shot_chance"] == pytest.approx(1 / len(shapes.COLOURS) / len(shapes.SHAPES))
    assert last["mfu"] > 0  # both towers' FLOPs counted
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["eval_zero_shot_accuracy"] == last["eval_zero_shot_accuracy"]


def test_the_export_loads_in_transformers_with_our_logits(trained, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from jaxformer.train.evaluate import export_hf

    run_dir, result = trained
    export_hf(run_dir, tmp_path)
    model, objective = result["model"], result["objective"]
    batch = objective.eval_batches(1, 8)[0]
    theirs_pixels = transformers.CLIPImageProcessor.from_pretrained(tmp_path)(
        [shapes.scene(objective.seed, i, 48, stream=1).image for i in range(8)], return_tensors="np")["pixel_values"]
    np.testing.assert_allclose(theirs_pixels, batch["pixel_values"], atol=TOLERANCE, rtol=0)

    ours = model(batch["input_ids"], batch["pixel_values"], batch["attention_mask"])
    reference = transformers.CLIPModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        out = reference(input_ids=torch.as_tensor(batch["input_ids"], dtype=torch.long),
                        pixel_values=torch.as_tensor(batch["pixel_values"]),
                        attention_mask=torch.as_tensor(batch["attention_mask"]))
    np.testing.assert_allclose(np.asarray(ours.logits_per_text), out.logits_per_text.numpy(), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(np.asarray(ours.image_embeds), out.image_embeds.numpy(), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(np.asarray(ours.text_embeds), out.text_embeds.numpy(), atol=TOLERANCE, rtol=0)


def test_a_dual_encoders_step_flops_count_both_towers():
    """CLIP ViT-B/32 at batch 1: 6 x the matmul parameters each token passes through (text: 77 tokens, causal; image:
    49 patches and the class token, plus the patch projection), and the attention products, by hand."""
    import jaxformer as jf
    from jaxformer import flops

    text = 6 * 12 * (4 * 512**2 + 2 * 512 * 2048) * 77 + 12 * 12 * 512 * 77 * (77 + 1) / 2
    image = 6 * 12 * (4 * 768**2 + 2 * 768 * 3072) * 50 + 12 * 12 * 768 * 50 * 50 + 6 * 49 * 3 * 32**2 * 768
    counted = flops.train_flops_per_step(jf.config("clip-vit-base-patch32"), 1, 77)
    assert counted == pytest.approx(text + image, rel=1e-2)  # (biases and norms left out by hand: < 1%)
