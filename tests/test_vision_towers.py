"""Image towers (ViT, CLIP's and SigLIP's vision models): what the shared parity, round-trip, key and export tests do
not cover. A PIL-drawn image through jaxformer's processor and model equals transformers' processor and model; ViT's
classifier keeps its label names; ViT's base model loads with and without its pooler; a published file's prefixed
tensor names load; bad pixels and mixed inputs are refused before anything runs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image, ImageDraw

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table, reference_model  # noqa: E402
from jaxformer.vision import ImageProcessor  # noqa: E402

from hf_factory import IMAGE_SIZES, save_checkpoint  # noqa: E402

TOLERANCE = 1e-5
HALF = [0.5, 0.5, 0.5]
# the published processors' settings (google/vit-base-patch16-224, openai/clip-vit-base-patch32,
# google/siglip-base-patch16-224), sized for the tiny towers' 30x30 images
PROCESSORS = {
    "vit-imgcls": {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": 30, "width": 30},
                   "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                   "image_mean": HALF, "image_std": HALF},
    "clip_vision_model": {"image_processor_type": "CLIPImageProcessor", "do_resize": True,
                          "size": {"shortest_edge": 30}, "do_center_crop": True,
                          "crop_size": {"height": 30, "width": 30},
                          "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                          "do_convert_rgb": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                          "image_std": [0.26862954, 0.26130258, 0.27577711]},
    "siglip_vision_model": {"image_processor_type": "SiglipImageProcessor", "do_resize": True,
                            "size": {"height": 30, "width": 30}, "resample": 3, "do_rescale": True,
                            "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": HALF, "image_std": HALF},
}


def _drawing(width: int, height: int) -> Image.Image:
    """A gradient with noise, a red disc and a green square (odd sizes, so resizing and cropping both act)."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([255 * x / (width - 1), 255 * y / (height - 1), 128 + 100 * np.sin(x / 5 + y / 9)], -1)
    rgb = np.clip(rgb + np.random.default_rng(0).normal(0, 10, rgb.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(rgb)
    draw = ImageDraw.Draw(image)
    draw.ellipse((width * 0.1, height * 0.2, width * 0.5, height * 0.7), fill=(220, 40, 40))
    draw.rectangle((width * 0.55, height * 0.1, width * 0.9, height * 0.45), fill=(30, 160, 60))
    return image


@pytest.fixture(scope="module")
def drawings() -> list[Image.Image]:
    return [_drawing(47, 61), _drawing(64, 40)]


def _pixels(name: str, seed: int = 0) -> np.ndarray:
    """Two images in [-1, 1], the range a processor's normalization gives (test_hf_parity.model_inputs says why)."""
    return np.random.default_rng(seed).uniform(-1, 1, (2, *IMAGE_SIZES[name])).astype(np.float32)


@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_a_drawn_image_through_our_processor_and_model_equals_transformers(name, checkpoints, drawings):
    path = checkpoints(name)
    config = PROCESSORS[name]
    ours = ImageProcessor.from_dict(config)
    theirs = getattr(transformers, ours.kind + "Pil").from_dict(dict(config))
    pixels = ours(drawings)["pixel_values"]
    reference_pixels = theirs(drawings, return_tensors="pt")["pixel_values"]
    np.testing.assert_allclose(pixels, reference_pixels.numpy(), atol=TOLERANCE, rtol=0)
    model, reference = jf.from_pretrained(path), reference_model(path)
    out = model(pixel_values=pixels)
    with torch.no_grad():
        ref = reference(pixel_values=reference_pixels)
    for field in ("logits", "pooler_output", "last_hidden_state"):
        if getattr(ref, field, None) is not None:
            np.testing.assert_allclose(np.asarray(getattr(out, field)), getattr(ref, field).numpy(), atol=TOLERANCE,
                                       rtol=0, err_msg=field)


def test_the_classifier_keeps_its_label_names_both_ways(checkpoints, tmp_path):
    path = checkpoints("vit-imgcls")
    model = jf.from_pretrained(path)
    assert model.config.head == "sequence_classification"
    assert model.config.head_options.label_names == ("circle", "square", "triangle")
    logits = np.asarray(model(pixel_values=_pixels("vit-imgcls")).logits)
    assert logits.shape == (2, 3)
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["id2label"] == {"0": "circle", "1": "square", "2": "triangle"}
    assert written["architectures"] == ["ViTForImageClassification"] and "vocab_size" not in written
    again = transformers.ViTForImageClassification.from_pretrained(tmp_path)
    assert again.config.id2label[int(logits[0].argmax())] == model.config.head_options.label_names[logits[0].argmax()]


def test_vit_without_its_pooler_loads_and_writes_none(tmp_path):
    """add_pooling_layer=False is a constructor argument, not a config key: the file's tensors say it."""
    torch.manual_seed(0)
    reference = transformers.ViTModel(transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                             intermediate_size=48, image_size=30, patch_size=10),
                                      add_pooling_layer=False).eval()
    reference.save_pretrained(tmp_path / "source")
    model = jf.from_pretrained(tmp_path / "source")
    assert not model.config.head_options.pooler and model.pooler is None
    # (transformers' from_pretrained builds a pooler unless told not to, and fills it with random numbers)
    again = transformers.ViTModel.from_pretrained(tmp_path / "source", add_pooling_layer=False,
                                                  attn_implementation="eager").eval()
    rows = compare(tmp_path / "source", None, pixel_values=_pixels("vit"), model=model, reference=again)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
    assert "pooler" not in {r.name for r in rows}
    model.save_pretrained(tmp_path / "out")
    from jaxformer.interop.files import TensorFiles

    assert not any("pooler" in n for n in TensorFiles(tmp_path / "out").names)


def test_siglip_without_its_head(tmp_path):
    path = save_checkpoint("siglip_vision_model", tmp_path, changes={"vision_use_head": False})
    model = jf.from_pretrained(path)
    assert model.config.head_options.image_pooler is None
    rows = compare(path, None, pixel_values=_pixels("siglip_vision_model"), model=model)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
    assert model(pixel_values=_pixels("siglip_vision_model")).pooler_output is None


def test_tie_last_hidden_states_makes_the_last_hidden_state_the_normed_one(tmp_path):
    """tie_last_hidden_states (read by transformers' output capturing) set to its non-default True: SigLIP's last
    hidden state is then post_layernorm's, as transformers reports it; written back as read."""
    path = save_checkpoint("siglip_vision_model", tmp_path, changes={"tie_last_hidden_states": True})
    model = jf.from_pretrained(path)
    assert model.config.norms.final_in_hidden_states
    pixels = _pixels("siglip_vision_model")
    out = model(pixel_values=pixels, output_hidden_states=True)
    with torch.no_grad():
        ref = reference_model(path)(pixel_values=torch.as_tensor(pixels), output_hidden_states=True)
    assert np.array_equal(ref.hidden_states[-1].numpy(), ref.last_hidden_state.numpy())  # (the setting took)
    for ours, theirs in zip(out.hidden_states, ref.hidden_states, strict=True):
        np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), atol=TOLERANCE, rtol=0)
    model.save_pretrained(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_last_hidden_states"] is True


@pytest.mark.parametrize("name", ["clip_vision_model", "siglip_vision_model"])
def test_a_published_file_under_vision_model_loads(name, checkpoints, tmp_path):
    """transformers 4 wrote CLIPVisionModel's and SiglipVisionModel's tensors under vision_model. (transformers 5 reads
    them so and writes them bare): such a file loads, equal to transformers, and is written back bare."""
    from safetensors.numpy import load_file, save_file

    source = checkpoints(name)
    shutil.copy(source / "config.json", tmp_path / "config.json")
    tensors = load_file(source / "model.safetensors")
    save_file({f"vision_model.{k}": v for k, v in tensors.items()}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    model = jf.from_pretrained(tmp_path)
    rows = compare(tmp_path, None, pixel_values=_pixels(name), model=model)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
    model.save_pretrained(tmp_path / "out")
    assert set(load_file(tmp_path / "out" / "model.safetensors")) == set(tensors)


def test_bad_pixels_and_mixed_inputs_are_refused_before_anything_runs(checkpoints):
    model = jf.from_pretrained(checkpoints("clip_vision_model"))
    pixels = _pixels("clip_vision_model")
    with pytest.raises(ValueError, match=r"pixel_values has shape \(2, 1, 30, 30\)"):
        model(pixel_values=pixels[:, :1])
    with pytest.raises(ValueError, match=r"pixel_values has shape \(2, 3, 30, 24\)"):
        model(pixel_values=pixels[..., :24])
    with pytest.raises(ValueError, match=r"pixel_values has shape \(3, 30, 30\)"):
        model(pixel_values=pixels[0])
    with pytest.raises(ValueError, match="give pixel_values alone, not input_ids"):
        model(np.ones((2, 4), np.int32), pixel_values=pixels)
    with pytest.raises(ValueError, match="give pixel_values alone, not input_ids"):
        model(np.ones((2, 4), np.int32))
    with pytest.raises(ValueError, match=r"pixel_values \[batch, 3, 30, 30\] is required"):
        model()
    with pytest.raises(ValueError, match="floating-point"):
        model(pixel_values=np.zeros((2, 3, 30, 30), np.int32))
    text = jf.build("tiny-bert")
    with pytest.raises(ValueError, match="pixel_values given to 'tiny-bert', which reads token ids"):
        text(np.ones((1, 4), np.int32), pixel_values=pixels)


def test_a_tower_config_that_cannot_be_is_refused_by_name():
    base = jf.config("vit-base-patch16-224")
    with pytest.raises(ValueError, match="max_positions=197 .not 50."):
        base.replace(max_positions=50)
    with pytest.raises(ValueError, match="patch_size=15 must divide image_size=224"):
        base.replace(patch_size=15)
    with pytest.raises(ValueError, match="image_pooler='norm' .* needs final_norm=False"):
        base.replace(image_pooler="norm")
    with pytest.raises(ValueError, match="image_pooler='attention' pools an image tower"):
        jf.config("tiny-bert").replace(image_pooler="attention")
    from jaxformer.interop.hf import config_from_hf

    with pytest.raises(ValueError, match=r"image_size=\[224, 192\] is not square"):
        config_from_hf({"model_type": "clip_vision_model", "architectures": ["CLIPVisionModel"],
                        "image_size": [224, 192]})


def test_published_vit_config_reads_as_the_preset():
    """google/vit-base-patch16-224's config.json (transformers 4.13: no pooler_act, pooler_output_size or
    encoder_stride, which transformers 5 adds at their defaults) reads as the preset."""
    from jaxformer.interop.hf import config_from_hf

    published = {"architectures": ["ViTForImageClassification"], "attention_probs_dropout_prob": 0.0,
                 "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "hidden_size": 768, "image_size": 224,
                 "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12, "model_type": "vit",
                 "num_attention_heads": 12, "num_channels": 3, "num_hidden_layers": 12, "patch_size": 16,
                 "qkv_bias": True, "transformers_version": "4.13.0.dev0",
                 "id2label": {str(i): f"class {i}" for i in range(1000)},
                 "label2id": {f"class {i}": i for i in range(1000)}}
    cfg = config_from_hf(published)
    assert cfg.replace(name="vit-base-patch16-224", label_names=()) == jf.config("vit-base-patch16-224")
    assert cfg.head_options.label_names[7] == "class 7"


def test_jaxformer_compare_reads_an_image_with_the_folders_processor(checkpoints, drawings, tmp_path, capsys):
    from jaxformer.cli import main

    folder = tmp_path / "clip"
    shutil.copytree(checkpoints("clip_vision_model"), folder)
    drawings[0].save(tmp_path / "card.png")
    assert main(["compare", str(folder), "--image", str(tmp_path / "card.png")]) == 2  # no processor config yet
    assert "preprocessor config" in capsys.readouterr().err
    ImageProcessor.from_dict(PROCESSORS["clip_vision_model"]).save_pretrained(folder)
    assert main(["compare", str(folder), "--image", str(tmp_path / "card.png")]) == 0
    table = capsys.readouterr().out
    assert "pooler" in table and "layer 2" in table
    (tmp_path / "not.png").write_text("text")
    assert main(["compare", str(folder), "--image", str(tmp_path / "not.png")]) == 2
    assert "not a readable image" in capsys.readouterr().err


def test_a_vit_built_here_exports_to_transformers_and_the_native_format(tmp_path):
    """No file to copy from: the config alone says ViT (the export target found by round trip), transformers' model
    of the written folder gives the same numbers, and the native Orbax format keeps the tower as it is."""
    from jaxformer.checkpoint import load_model, save_model

    cfg = jf.config("vit-base-patch16-224").replace(d_model=32, num_heads=4, d_ff=48, encoder_layers=2, image_size=30,
                                                   patch_size=10, max_positions=10, num_labels=4, init_std=0.2)
    model = jf.build(cfg, seed=5)
    model.save_pretrained(tmp_path / "hf")
    rows = compare(tmp_path / "hf", None, pixel_values=_pixels("vit"), model=model)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
    assert "logits" in {r.name for r in rows}
    save_model(model, tmp_path / "native")
    again = load_model(tmp_path / "native")
    assert again.config == cfg
    np.testing.assert_array_equal(np.asarray(again(pixel_values=_pixels("vit")).logits),
                                  np.asarray(model(pixel_values=_pixels("vit")).logits))


@pytest.mark.parametrize("name", ["vit-imgcls", "clip_vision_model", "siglip_vision_model"])
def test_interpolate_pos_encoding_resamples_the_positions_as_transformers_does(name, checkpoints):
    """Images of other sizes (larger, smaller, not square, not a whole number of patches): the class row kept, the
    patch grid's table resampled bicubically as torch does, every hidden state and the outputs within 1e-5."""
    path = checkpoints(name)
    model, reference = jf.from_pretrained(path), reference_model(path)
    for shape in [(2, 3, 50, 40), (1, 3, 47, 23), (1, 3, 10, 10)]:
        pixels = np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)
        out = model(pixel_values=pixels, interpolate_pos_encoding=True, output_hidden_states=True)
        with torch.no_grad():
            ref = reference(pixel_values=torch.as_tensor(pixels), interpolate_pos_encoding=True,
                            output_hidden_states=True)
        pairs = list(zip(out.hidden_states, ref.hidden_states))
        pairs += [(getattr(out, f), getattr(ref, f)) for f in ("last_hidden_state", "pooler_output", "logits")
                  if getattr(ref, f, None) is not None]
        assert len(pairs) >= 4
        for ours, theirs in pairs:
            np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), atol=TOLERANCE, rtol=0, err_msg=str(shape))
    with pytest.raises(ValueError, match=r"pixel_values has shape \(1, 3, 9, 30\).*at least patch_size=10"):
        model(pixel_values=np.zeros((1, 3, 9, 30), np.float32), interpolate_pos_encoding=True)
    with pytest.raises(ValueError, match="interpolate_pos_encoding given to 'tiny-bert'"):
        jf.build("tiny-bert")(np.ones((1, 4), np.int32), interpolate_pos_encoding=True)
