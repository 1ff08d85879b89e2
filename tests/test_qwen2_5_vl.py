"""Qwen2.5-VL (``qwen2_5_vl``): its merging vision tower's features in a Qwen2 decoder whose rotary angles turn by
M-RoPE's three position streams (temporal, height, width).

A tiny checkpoint saved by transformers, fed two images of different sizes prepared by jaxformer.vision's Qwen2-VL
processor (their prompts expanded by ImagePlaceholders), left padded: every decoder hidden state and the logits
match transformers'; text-only prompts too, and three position streams given as position_ids; greedy and beam
generation are token-identical, with images and without; the file round-trips byte for byte and reads in the
published (flat) config form and under the modules' tensor names as well. Bad images and videos are refused by name.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.interop import qwen2_5_vl  # noqa: E402
from jaxformer.interop.files import TensorFiles, write_safetensors  # noqa: E402
from jaxformer.interop.hf import config_from_hf, config_to_hf  # noqa: E402
from jaxformer.interop.registry import same_model  # noqa: E402
from jaxformer.layers.positions import mrope_positions  # noqa: E402
from jaxformer.vision import ImagePlaceholders, ImageProcessor  # noqa: E402

TOLERANCE = 1e-5
IMAGE_TOKEN, VOCAB = 120, 128
TEXT = dict(model_type="qwen2_5_vl_text", vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
            bos_token_id=1, eos_token_id=2, pad_token_id=0,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=14,
              spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
PIXELS = {"min_pixels": 3136, "max_pixels": 28 * 28 * 12, "patch_size": 14, "temporal_patch_size": 2,
          "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
          "image_std": [0.26862954, 0.26130258, 0.27577711], "image_processor_type": "Qwen2VLImageProcessor"}
PROMPTS = ["ab<|vision_start|><|image_pad|><|vision_end|>cd<|vision_start|><|image_pad|><|vision_end|>e?",
           "<|vision_start|><|image_pad|><|vision_end|>xyz"]


# Qwen/Qwen2.5-VL-7B-Instruct's config.json as published (transformers 4.41; written from memory, not hub-verified):
# the text model's keys at the top level, M-RoPE's sections in rope_scaling
PUBLISHED = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
    "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 128000,
    "max_window_layers": 28, "model_type": "qwen2_5_vl", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": True,
    "use_sliding_window": False,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064}


def _encode(text: str) -> list[int]:
    """A toy tokenizer: the image placeholder is IMAGE_TOKEN, every other character one id in [3, 100)."""
    ids = []
    for i, part in enumerate(text.split("<|image_pad|>")):
        ids += ([IMAGE_TOKEN] if i else []) + [3 + ord(c) % 97 for c in part]
    return ids


def _left_padded(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    T = max(map(len, rows))
    ids, mask = np.zeros((len(rows), T), np.int64), np.zeros((len(rows), T), np.int64)
    for b, row in enumerate(rows):
        ids[b, T - len(row):], mask[b, T - len(row):] = row, 1
    return ids, mask


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.Qwen2_5_VLConfig(text_config=TEXT, vision_config=VISION, image_token_id=IMAGE_TOKEN)
    path = tmp_path_factory.mktemp("qwen2_5_vl")
    transformers.Qwen2_5_VLForConditionalGeneration(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models(folder):
    return jf.from_pretrained(folder), transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def prompt():
    """Three images of different sizes (two in the first row, one in the second), prompts expanded, left padded."""
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, size=shape, dtype=np.uint8) for shape in ((60, 90, 3), (120, 50, 3), (56, 56, 3))]
    processor = ImageProcessor.from_dict(PIXELS)
    pixels = processor(images)
    placeholders = ImagePlaceholders.from_dict({"processor_class": "Qwen2_5_VLProcessor"}, processor)
    ids, mask = _left_padded([_encode(text) for text in placeholders.expand(PROMPTS, pixels)])
    return ids, mask, pixels["pixel_values"], np.asarray(pixels["image_grid_thw"])


def _torch(ids, mask, pixels=None, grid=None):
    out = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    if pixels is not None:
        out.update(pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(grid),
                   mm_token_type_ids=torch.tensor((ids == IMAGE_TOKEN).astype(np.int64)))
    return out


def _worst(expected, got) -> float:
    return max(float(np.abs(e.numpy() - np.asarray(g)).max()) for e, g in zip(expected, got))


def test_images_of_different_sizes_match_transformers(models, prompt):
    ours, reference = models
    ids, mask, pixels, grid = prompt
    assert len(set(map(tuple, grid[:, 1:]))) == 3  # three sizes
    with torch.no_grad():
        expected = reference(**_torch(ids, mask, pixels, grid), output_hidden_states=True)
    got = ours(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid, output_hidden_states=True)
    assert len(got.hidden_states) == len(expected.hidden_states)
    real = mask.astype(bool)  # (pads are masked out of every row: their states are whatever each side computes)
    assert _worst([h[real] for h in expected.hidden_states], [np.asarray(h)[real] for h in got.hidden_states]) \
        < TOLERANCE
    assert _worst([expected.logits[real]], [np.asarray(got.logits)[real]]) < TOLERANCE


def test_rope_index_matches_transformers(models, prompt):
    _, reference = models
    ids, mask, _, grid = prompt
    expected, _ = reference.model.get_rope_index(torch.tensor(ids), torch.tensor((ids == IMAGE_TOKEN).astype(int)),
                                                 image_grid_thw=torch.tensor(grid), attention_mask=torch.tensor(mask))
    np.testing.assert_array_equal(np.moveaxis(np.asarray(mrope_positions(ids, mask, grid, IMAGE_TOKEN, 2)), -1, 0),
                                  expected.numpy())


def test_text_and_position_streams_match_transformers(models):
    ours, reference = models
    rng = np.random.default_rng(1)
    ids, mask = _left_padded([list(rng.integers(3, 100, 9)), list(rng.integers(3, 100, 6))])
    streams = np.stack([np.arange(9) // 2, np.arange(9) % 4, np.arange(9)])[:, None].repeat(2, axis=1)
    with torch.no_grad():
        text = reference(**_torch(ids, mask), output_hidden_states=True)
        given = reference(input_ids=torch.tensor(ids), position_ids=torch.tensor(streams), output_hidden_states=True)
    real = mask.astype(bool)
    got = ours(ids, attention_mask=mask, output_hidden_states=True)
    assert _worst([h[real] for h in text.hidden_states], [np.asarray(h)[real] for h in got.hidden_states]) < TOLERANCE
    got = ours(ids, position_ids=streams, output_hidden_states=True)
    assert _worst(given.hidden_states + (given.logits,), got.hidden_states + (got.logits,)) < TOLERANCE


@pytest.mark.parametrize("beams", [1, 3])
def test_generation_is_token_identical(models, prompt, beams):
    ours, reference = models
    ids, mask, pixels, grid = prompt
    settings = dict(max_new_tokens=6, num_beams=beams, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        expected = reference.generate(**_torch(ids, mask, pixels, grid), **settings)
        text = reference.generate(**_torch(ids[:, -5:], mask[:, -5:]), **settings)
    np.testing.assert_array_equal(ours.generate(ids, mask, pixel_values=pixels, image_grid_thw=grid, **settings),
                                  expected.numpy())
    np.testing.assert_array_equal(ours.generate(ids[:, -5:], mask[:, -5:], **settings), text.numpy())


@pytest.mark.parametrize("beams", [1, 2])
def test_a_prompt_ending_in_its_image_generates_as_transformers(models, beams):
    """No text after the image: the first new token's three streams continue from the image's own last positions
    (each stream its own delta), which a trailing text token would hide."""
    ours, reference = models
    rng = np.random.default_rng(2)
    processor = ImageProcessor.from_dict(PIXELS)
    pixels = processor([rng.integers(0, 256, size=shape, dtype=np.uint8) for shape in ((60, 90, 3), (56, 56, 3))])
    placeholders = ImagePlaceholders.from_dict({"processor_class": "Qwen2_5_VLProcessor"}, processor)
    ids, mask = _left_padded([_encode(text) for text in placeholders.expand(["ab<|image_pad|>", "xyzw<|image_pad|>"],
                                                                            pixels)])
    assert (ids[:, -1] == IMAGE_TOKEN).all()
    grid = np.asarray(pixels["image_grid_thw"])
    settings = dict(max_new_tokens=6, num_beams=beams, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        expected = reference.generate(**_torch(ids, mask, pixels["pixel_values"], grid), **settings)
    np.testing.assert_array_equal(ours.generate(ids, mask, pixel_values=pixels["pixel_values"], image_grid_thw=grid,
                                                **settings), expected.numpy())


def test_given_position_ids_win_over_the_images_streams(models, prompt):
    """transformers spreads a caller's [B, T] position_ids over the three streams, images or not; its packed
    [4, B, T] form is refused by name."""
    ours, reference = models
    ids, mask, pixels, grid = prompt
    positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    with torch.no_grad():
        expected = reference(**_torch(ids, mask, pixels, grid), position_ids=torch.tensor(positions)).logits
    got = ours(ids, attention_mask=mask, position_ids=positions, pixel_values=pixels, image_grid_thw=grid).logits
    real = mask.astype(bool)
    assert _worst([expected[real]], [np.asarray(got)[real]]) < TOLERANCE
    with pytest.raises(ValueError, match=r"packed form \[4, B, T\]"):
        ours(ids, attention_mask=mask, position_ids=np.stack([positions] * 4))


def test_a_head_dim_transformers_would_not_use_is_refused_on_export():
    # (config_to_hf finds no architecture that holds it; the architecture's own writer says why)
    changed = jf.config("qwen2.5-vl-7b").replace(num_heads=32, head_dim=128)
    with pytest.raises(ValueError, match="no Hugging Face architecture"):
        config_to_hf(changed)
    with pytest.raises(ValueError, match="head_dim=128 with d_model=3584 and num_heads=32"):
        qwen2_5_vl.config_to_hf(changed, "qwen2_5_vl", {})


def test_round_trip_is_byte_exact_and_transformers_reloads(models, folder, tmp_path):
    ours, reference = models
    ours.save_pretrained(tmp_path)
    written, original = TensorFiles(tmp_path), TensorFiles(folder)
    assert set(written.names) == set(original.names)
    for name in original.names:
        assert np.asarray(written.get(name)).tobytes() == np.asarray(original.get(name)).tobytes(), name
    back = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path)
    assert back.config.text_config.rope_parameters["mrope_section"] == [2, 3, 3]
    assert jf.from_pretrained(tmp_path).config == ours.config


def test_published_form_and_modules_layout_load(models, folder, tmp_path):
    """transformers 4's config.json: the text model's keys at the top level ("type": "mrope" in rope_scaling); the
    tensors under the modules' names (``model.language_model.*``, ``model.visual.*``; transformers saves the
    published ``model.*`` and ``visual.*``)."""
    ours, _ = models
    hf = json.loads((folder / "config.json").read_text())
    text = {k: v for k, v in hf.pop("text_config").items() if k not in ("model_type", "rope_parameters", "dtype")}
    flat = {**hf, **text, "rope_theta": 10000.0, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
    (tmp_path / "config.json").write_text(json.dumps(flat))
    tensors = TensorFiles(folder)
    renamed = {name.replace("model.", "model.language_model.").replace("visual.", "model.visual."):
               np.asarray(tensors.get(name)) for name in tensors.names}
    write_safetensors(renamed, tmp_path / "model.safetensors")
    published = jf.from_pretrained(tmp_path)
    assert published.config == ours.config
    ids = np.array([[5, 6, 7, 8]])
    np.testing.assert_array_equal(np.asarray(published(ids).logits), np.asarray(ours(ids).logits))


def test_published_config_is_the_preset_and_its_transformers_5_form_too():
    preset = jf.config("qwen2.5-vl-7b")
    assert same_model(preset, config_from_hf(PUBLISHED))
    written = transformers.Qwen2_5_VLConfig(**{k: v for k, v in PUBLISHED.items() if k != "architectures"}).to_dict()
    assert same_model(preset, config_from_hf({**written, "architectures": PUBLISHED["architectures"]}))
    assert preset.rotary.sections == (16, 24, 24) and preset.vision.image_token_id == 151655


def test_bad_images_and_videos_are_refused(models, prompt):
    ours, _ = models
    ids, mask, pixels, grid = prompt
    with pytest.raises(ValueError, match="image_grid_thw go together"):
        ours(ids, attention_mask=mask, pixel_values=pixels)
    fewer = np.where(np.cumsum(ids == IMAGE_TOKEN, axis=1) == 1, 5, ids)  # each row's first placeholder made text
    with pytest.raises(ValueError, match="image tokens"):
        ours(fewer, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid)
    with pytest.raises(ValueError, match="pixel_values has shape"):
        ours(ids, attention_mask=mask, pixel_values=pixels[:-1], image_grid_thw=grid)
    with pytest.raises(ValueError, match="pixel_values_videos"):
        ours(ids, attention_mask=mask, pixel_values_videos=pixels)
    with pytest.raises(ValueError, match="video_grid_thw"):
        ours.generate(ids, mask, video_grid_thw=grid)
