"""Llama 3.2 Vision's image tower (``mllama_vision_model``, ``interop/mllama_vision.py``): images of two aspect ratios
and a missing image, through jaxformer's processor and tower, equal transformers' processor and MllamaVisionModel on
every local and global layer's output (read by hooks: the model returns none) and on its output; the round trip is
byte-exact and transformers reloads it; the config's null defaults and spellings read as transformers reads them;
bad inputs and settings are refused by name. The tiny checkpoint is hf_factory's TILED_TOWERS entry (2 local layers,
1 global, intermediate layers [0, 1], 28-pixel tiles of 14-pixel patches, at most 2 tiles; every gate drawn)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.interop.registry import hf_target  # noqa: E402
from jaxformer.vision import ImageProcessor  # noqa: E402

from hf_factory import save_checkpoint, tiled_images  # noqa: E402

TOLERANCE = 1e-5
# meta-llama/Llama-3.2-11B-Vision-Instruct's preprocessor_config.json, sized for the tiny tower
PROCESSOR = {"do_convert_rgb": True, "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True,
             "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
             "image_processor_type": "MllamaImageProcessor", "max_image_tiles": 2, "processor_class": "MllamaProcessor",
             "resample": 2, "rescale_factor": 0.00392156862745098, "size": {"height": 28, "width": 28}}


def _image(height: int, width: int, seed: int) -> Image.Image:
    """A gradient under noise (the tiles of one image then differ)."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([255 * x / (width - 1), 255 * y / (height - 1), 128 + 100 * np.sin(x / 3 + y / 5)], -1)
    rgb = rgb + np.random.default_rng(seed).normal(0, 20, rgb.shape)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def pair(checkpoints):
    path = checkpoints("mllama_vision_model")
    return path, jf.from_pretrained(path), transformers.MllamaVisionModel.from_pretrained(path).eval()


def _reference(reference, inputs: dict) -> tuple[np.ndarray, list[np.ndarray]]:
    """transformers' output and every layer's output (local layers, then global), caught by forward hooks."""
    caught = []
    layers = [*reference.transformer.layers, *reference.global_transformer.layers]
    hooks = [layer.register_forward_hook(lambda module, args, out: caught.append(out.numpy())) for layer in layers]
    try:
        with torch.no_grad():
            out = reference(**{key: torch.as_tensor(value) for key, value in inputs.items()})
    finally:
        for hook in hooks:
            hook.remove()
    return out.last_hidden_state.numpy(), caught


def _gaps(model, reference, inputs: dict) -> dict[str, float]:
    expected, layers = _reference(reference, inputs)
    out = model(**inputs, output_hidden_states=True)
    assert len(out.hidden_states) == 1 + len(layers)  # the stack's input, then each local and global layer
    gaps = {f"layer {i}": np.abs(np.asarray(ours) - theirs).max()
            for i, (ours, theirs) in enumerate(zip(out.hidden_states[1:], layers))}
    assert out.last_hidden_state.shape == expected.shape
    gaps["output"] = np.abs(np.asarray(out.last_hidden_state) - expected).max()
    return gaps


def test_processed_images_of_two_aspect_ratios_equal_transformers_on_every_layer(pair):
    _, model, reference = pair
    # a wide image (1 x 2 tiles), a square one (1 tile: its second masked); a tall one (2 x 1) beside no image
    prompts = [[_image(30, 61, 0), _image(25, 25, 1)], [_image(50, 20, 2)]]
    ours = ImageProcessor.from_dict(PROCESSOR)(prompts)
    theirs = transformers.MllamaImageProcessorPil.from_dict(dict(PROCESSOR))(prompts, return_tensors="np")
    for key in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"):
        np.testing.assert_array_equal(ours[key], theirs[key])
    assert ours["aspect_ratio_ids"].tolist() == [[2, 1], [3, 0]] and ours["aspect_ratio_mask"].min() == 0
    inputs = {key: ours[key] for key in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask")}
    gaps = _gaps(model, reference, inputs)
    assert max(gaps.values()) <= TOLERANCE, gaps


def test_round_trip_is_byte_exact_and_transformers_reloads_it(pair, tmp_path):
    path, model, reference = pair
    assert hf_target(model.config) == ("mllama_vision_model", "MllamaVisionModel")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads((path / "config.json").read_text())
    source, written = load_file(path / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert source.keys() == written.keys()
    for name, tensor in written.items():
        assert tensor.dtype == source[name].dtype and tensor.tobytes() == source[name].tobytes(), name
    reloaded = transformers.MllamaVisionModel.from_pretrained(tmp_path).eval()
    inputs = tiled_images(np.random.default_rng(1))
    gaps = _gaps(jf.from_pretrained(tmp_path), reloaded, inputs)
    assert max(gaps.values()) <= TOLERANCE, gaps


def test_the_config_reads_as_transformers_reads_it(pair):
    path = pair[0]
    hf = json.loads((path / "config.json").read_text())
    tower = config_from_hf(hf)
    assert (tower.patches.tiles, tower.patches.global_layers, tower.patches.intermediate_layers) == (2, 1, (0, 1))
    assert tower.patches.aspect_ratios == ((1, 1), (1, 2), (2, 1))
    assert tower.patches.output_width(tower.d_model) == hf["vision_output_dim"]
    # null (or absent) lists take MllamaVisionConfig's defaults; num_attention_heads is attention_heads' other name
    nulls = {**hf, "max_num_tiles": 4, "supported_aspect_ratios": None, "intermediate_layers_indices": None,
             "num_hidden_layers": 31}
    nulls["num_attention_heads"] = nulls.pop("attention_heads")
    read, config = config_from_hf(nulls), transformers.MllamaVisionConfig(**nulls)
    assert read.patches.aspect_ratios == tuple(map(tuple, config.supported_aspect_ratios))
    assert read.patches.intermediate_layers == tuple(config.intermediate_layers_indices)
    assert read.num_heads == config.attention_heads == hf["attention_heads"]
    # the tiles' arrangements are only counted: other pairs of the same number read as they are
    assert config_from_hf({**hf, "supported_aspect_ratios": [[1, 1], [2, 1], [1, 2]]}).patches.aspect_ratios == (
        (1, 1), (2, 1), (1, 2))
    # (a pair of more tiles than max_num_tiles, which no processor gives, is only counted too)
    assert config_from_hf({**hf, "supported_aspect_ratios": [[1, 1], [2, 2]]}).patches.aspect_ratios == ((1, 1), (2, 2))


def test_negative_intermediate_indices_and_a_fully_masked_slot_equal_transformers(tmp_path):
    """intermediate_layers_indices count from the last layer where negative, as transformers indexes its layer
    outputs (and are written back as the file has them); an image slot with every tile masked stays finite."""
    path = save_checkpoint("mllama_vision_model", tmp_path / "hf", changes={"intermediate_layers_indices": [-1, 0]})
    model = jf.from_pretrained(path)
    inputs = tiled_images(np.random.default_rng(2))
    inputs["aspect_ratio_mask"][1, 1] = 0  # (the second prompt's empty slot, its first tile masked too)
    gaps = _gaps(model, transformers.MllamaVisionModel.from_pretrained(path).eval(), inputs)
    assert np.isfinite(list(gaps.values())).all() and max(gaps.values()) <= TOLERANCE, gaps
    model.save_pretrained(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["intermediate_layers_indices"] == [-1, 0]


@pytest.mark.parametrize("change, message", [
    ({"norm_eps": 1e-6}, "norm_eps"),
    ({"supported_aspect_ratios": None}, "max_num_tiles"),  # (the default arrangements need 4 tiles)
    ({"intermediate_layers_indices": [0, 2]}, "intermediate_layers"),
    ({"intermediate_layers_indices": [-3]}, "intermediate_layers"),
    ({"supported_aspect_ratios": [[1, 1], [0, 2]]}, "aspect_ratios"),
])
def test_settings_it_cannot_honour_are_refused(pair, change, message):
    hf = json.loads((pair[0] / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        config_from_hf({**hf, **change})


def test_bad_inputs_are_refused_by_name(pair):
    model = pair[1]
    good = tiled_images(np.random.default_rng(0))
    bad = [({"pixel_values": good["pixel_values"][:, :, :1]}, "pixel_values has shape"),  # one tile of two
           ({"pixel_values": good["pixel_values"][:, 0]}, "pixel_values has shape"),
           ({"aspect_ratio_ids": good["aspect_ratio_ids"] + 2}, r"aspect_ratio_ids must be integers in \[0, 3\]"),
           ({"aspect_ratio_mask": None}, "aspect_ratio_mask is missing"),
           ({"input_ids": np.ones((2, 3), np.int32)}, "tiled image tower: give pixel_values")]
    for change, message in bad:
        with pytest.raises(ValueError, match=message):
            model(**{**good, **change})
    plain = jf.build(model.config.replace(max_tiles=0, aspect_ratios=(), global_layers=0, intermediate_layers=()))
    with pytest.raises(ValueError, match="reads no tiles"):
        plain(pixel_values=good["pixel_values"][0, 0], aspect_ratio_ids=good["aspect_ratio_ids"])
