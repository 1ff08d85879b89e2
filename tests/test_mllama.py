"""Llama 3.2 Vision (``mllama``): LLaMA's decoder with gated cross layers attending to a tiled image tower's states.

Tiny checkpoints saved by transformers (hf_factory's ``mllama_text_model`` and ``mllama``, their cross layers'
gates drawn at random) match transformers: the text model given the images' states and a per-token, per-tile
cross_attention_mask (a padded row, a row seeing no image), and the joined model given pixels from jaxformer's
MllamaImageProcessor with ImagePlaceholders' cross_attention_mask: every hidden state and the logits within 1e-5.
Greedy and beam generation with images (the cross layers' keys and values computed once by the prefill, kept in the
``ImageCache``) and without them are token-identical; both files round-trip byte for byte. The published
config.json reads as the ``llama-3.2-11b-vision`` preset. (The shared tests run both checkpoints on text alone.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.vision import ImagePlaceholders, ImageProcessor  # noqa: E402


TOLERANCE = 1e-5
IMAGE_TOKEN = 97  # hf_factory's mllama: the vocabulary's size, a row of the token table past it
# MllamaImageProcessor's settings (Llama-3.2-11B-Vision's, tiles of 28 and at most 2 of them, as the tiny tower reads)
IMAGES = {"do_convert_rgb": True, "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True,
          "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "MllamaImageProcessor",
          "image_std": [0.26862954, 0.26130258, 0.27577711], "max_image_tiles": 2, "resample": 2,
          "rescale_factor": 0.00392156862745098, "size": {"height": 28, "width": 28}}
# meta-llama/Llama-3.2-11B-Vision's config.json (transformers 4.45), its keys at their values (written from memory,
# not hub-verified; the legacy keys transformers 4 wrote into each sub-config abridged)
PUBLISHED = {
    "architectures": ["MllamaForConditionalGeneration"], "image_token_index": 128256, "model_type": "mllama",
    "text_config": {
        "add_cross_attention": False, "architectures": None, "bos_token_id": 128000, "chunk_size_feed_forward": 0,
        "cross_attention_hidden_size": None, "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38],
        "dropout": 0, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
        "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "initializer_range": 0.02, "intermediate_size": 14336,
        "is_decoder": False, "label2id": {"LABEL_0": 0, "LABEL_1": 1}, "max_position_embeddings": 131072,
        "model_type": "mllama_text_model", "num_attention_heads": 32, "num_hidden_layers": 40,
        "num_key_value_heads": 8, "pad_token_id": 128004, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 128256},
    "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
    "vision_config": {
        "attention_heads": 16, "hidden_act": "gelu", "hidden_size": 1280, "image_size": 560,
        "initializer_range": 0.02, "intermediate_layers_indices": [3, 7, 15, 23, 30], "intermediate_size": 5120,
        "max_num_tiles": 4, "model_type": "mllama_vision_model", "norm_eps": 1e-05, "num_channels": 3,
        "num_global_layers": 8, "num_hidden_layers": 32, "patch_size": 14,
        "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]],
        "torch_dtype": "bfloat16", "vision_output_dim": 7680}}


@pytest.fixture(scope="module")
def folders(checkpoints):
    """The session's tiny checkpoints (test_hf_parity.py and test_cli_images.py read the same): not written to."""
    return {name: checkpoints(name) for name in ("mllama", "mllama_text_model")}


@pytest.fixture(scope="module")
def joined(folders):
    return (transformers.MllamaForConditionalGeneration.from_pretrained(folders["mllama"]).eval(),
            jf.from_pretrained(folders["mllama"]))


def prompts():
    """Two rows, the second left padded by two: two images before the text, one image inside it."""
    ids = np.array([[1, IMAGE_TOKEN, IMAGE_TOKEN, 5, 6, 7, 8, 9, 10], [0, 0, 1, 7, IMAGE_TOKEN, 9, 10, 11, 12]])
    return ids, (np.arange(ids.shape[1])[None] >= np.array([[0], [2]])).astype(np.int64)


def image_inputs(ids: np.ndarray) -> dict:
    """Three images (a wide, a tall and a square one) through our MllamaImageProcessor, two for the first prompt, and
    ImagePlaceholders' cross_attention_mask of ``ids``."""
    from PIL import Image

    rng = np.random.default_rng(0)
    sizes = ((30, 50), (40, 20), (25, 25))
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    processor = ImageProcessor.from_dict(IMAGES)
    out = processor([images[:2], images[2:]])
    placeholders = ImagePlaceholders.from_dict({}, processor, model_type="mllama")
    mask = placeholders.cross_attention_mask(ids.tolist(), out["num_tiles"], IMAGE_TOKEN)
    return dict(pixel_values=out["pixel_values"], aspect_ratio_ids=out["aspect_ratio_ids"],
                aspect_ratio_mask=out["aspect_ratio_mask"], cross_attention_mask=mask)


def _torch(inputs: dict) -> dict:
    return {key: torch.as_tensor(np.asarray(value)) for key, value in inputs.items()}


def _assert_close(ours, theirs, real: np.ndarray) -> None:
    assert len(ours.hidden_states) == len(theirs.hidden_states)
    for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states)):
        assert np.abs(np.asarray(a) - b.numpy())[real].max() < TOLERANCE, f"hidden state {i}"
    assert np.abs(np.asarray(ours.logits) - theirs.logits.numpy())[real].max() < TOLERANCE


def test_text_model_matches_transformers_given_the_images_states(folders):
    """MllamaForCausalLM takes the mask as transformers prepares it (additive, rows seeing no image zeroed) and its
    full_text_row_masked_out_mask; ours takes the processor's [B, T, images, tiles]."""
    from transformers.models.mllama.modeling_mllama import _prepare_cross_attention_mask

    reference = transformers.MllamaForCausalLM.from_pretrained(folders["mllama_text_model"]).eval()
    model = jf.from_pretrained(folders["mllama_text_model"])
    assert model.embed.table.shape[0] == model.config.vocab_size + 8  # (the image token's row, and 7 more)
    ids, mask = prompts()
    ids = np.where(ids == IMAGE_TOKEN, 3, ids)  # (the text model alone: the image token is the joined model's)
    rng = np.random.default_rng(1)
    images, tiles, per_tile = 2, 2, 5
    states = rng.standard_normal((2, images * tiles * per_tile, 32)).astype(np.float32)
    tile_mask = rng.integers(0, 2, (2, ids.shape[1], images, tiles))
    tile_mask[0, :3] = 0  # (tokens that see no image: uniform attention, no MLP)
    prepared, rows = _prepare_cross_attention_mask(torch.as_tensor(tile_mask), per_tile, torch.float32)
    with torch.no_grad():
        theirs = reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                           cross_attention_states=torch.as_tensor(states), cross_attention_mask=prepared,
                           full_text_row_masked_out_mask=rows, output_hidden_states=True)
    ours = model(ids, mask, cross_attention_states=states, cross_attention_mask=tile_mask, output_hidden_states=True)
    _assert_close(ours, theirs, mask.astype(bool))


def test_joined_model_matches_transformers_on_processed_images(joined):
    reference, model = joined
    ids, mask = prompts()
    inputs = image_inputs(ids)
    with torch.no_grad():
        theirs = reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                           output_hidden_states=True, **_torch(inputs))
    ours = model(ids, mask, output_hidden_states=True, **inputs)
    _assert_close(ours, theirs, mask.astype(bool))


@pytest.mark.parametrize("beams", [1, 3])
def test_generation_with_and_without_images_is_token_identical(joined, beams):
    reference, model = joined
    ids, mask = prompts()
    for inputs in (image_inputs(ids), {}):
        expected = reference.generate(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                                      max_new_tokens=6, do_sample=False, num_beams=beams, **_torch(inputs)).numpy()
        np.testing.assert_array_equal(model.generate(ids, mask, max_new_tokens=6, num_beams=beams, **inputs),
                                      expected)


def test_both_files_round_trip_byte_for_byte(folders, tmp_path):
    from safetensors.numpy import load_file

    for name, folder in folders.items():
        jf.from_pretrained(folder).save_pretrained(tmp_path / name)
        before, after = load_file(folder / "model.safetensors"), load_file(tmp_path / name / "model.safetensors")
        assert before.keys() == after.keys()
        assert all(before[key].dtype == after[key].dtype and before[key].tobytes() == after[key].tobytes()
                   for key in before)
        written = json.loads((tmp_path / name / "config.json").read_text())
        assert written["architectures"] == json.loads((folder / "config.json").read_text())["architectures"]


def test_the_modules_layout_loads_too(joined, folders, tmp_path):
    """A file whose tensors carry the modules' names (model.language_model.*, lm_head.weight) is the same model."""
    from safetensors.numpy import load_file, save_file

    renamed = {("lm_head.weight" if key == "language_model.lm_head.weight" else
                "model." + key.replace("language_model.model.", "language_model.")): value
               for key, value in load_file(folders["mllama"] / "model.safetensors").items()}
    save_file(renamed, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folders["mllama"] / "config.json").read_text())
    ids, mask = prompts()
    np.testing.assert_array_equal(np.asarray(jf.from_pretrained(tmp_path)(ids, mask).logits),
                                  np.asarray(joined[1](ids, mask).logits))


def test_the_published_config_reads_as_the_preset():
    read = config_from_hf(PUBLISHED)
    preset = jf.config("llama-3.2-11b-vision")
    assert read.replace(name=preset.name, dtype=preset.dtype, param_dtype=preset.param_dtype) == preset


@pytest.mark.parametrize("change, message", [
    (lambda hf: hf["text_config"].update(tie_word_embeddings=True), "tie_word_embeddings=True"),
    (lambda hf: hf["vision_config"].update(vision_output_dim=7000), "vision_output_dim=7000"),
])
def test_files_it_cannot_honour_are_refused_by_name(change, message):
    hf = json.loads(json.dumps(PUBLISHED))
    change(hf)
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf)


def test_bad_image_inputs_are_refused_by_name(joined, folders):
    _, model = joined
    ids, mask = prompts()
    inputs = image_inputs(ids)
    with pytest.raises(ValueError, match="cross_attention_mask has shape"):
        model(ids, mask, **{**inputs, "cross_attention_mask": inputs["cross_attention_mask"][:, :4]})
    with pytest.raises(ValueError, match="aspect_ratio_ids"):
        model(ids, mask, pixel_values=inputs["pixel_values"])
    with pytest.raises(ValueError, match="go with pixel_values"):
        model.generate(ids, mask, aspect_ratio_ids=inputs["aspect_ratio_ids"])
    text = jf.from_pretrained(folders["mllama_text_model"])
    with pytest.raises(ValueError, match="cross_attention_states"):
        text(np.where(ids == IMAGE_TOKEN, 3, ids), mask, pixel_values=inputs["pixel_values"],
             aspect_ratio_ids=inputs["aspect_ratio_ids"])
