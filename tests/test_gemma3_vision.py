"""Gemma 3 reading images (``gemma3``: Gemma3ForConditionalGeneration): a SigLIP tower, the pooled projector and the
Gemma 3 text decoder, whose image tokens attend to each other both ways.

A tiny checkpoint saved by transformers (every weight drawn at random: transformers starts the projector and the
norms at zero), with sliding layers of window 3 beside a full one and images of 4 tokens each, so an image's block
reaches past the window. Prompts are expanded by ``ImagePlaceholders`` from images prepared by jaxformer's Gemma 3
processor (the folder's own files), their token types from ``ImagePlaceholders.token_type_ids``: the tower's states,
every decoder hidden state and the logits match transformers', with and without token types; greedy and beam
generation with left padding are token-identical; the export is byte-exact in each of the three tensor layouts read.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from PIL import Image, ImageDraw  # noqa: E402

import jaxformer as jf  # noqa: E402
from jaxformer.interop.files import TensorFiles, write_safetensors  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.vision import ImagePlaceholders  # noqa: E402

TOLERANCE = 1e-5
# Gemma's norms after each sublayer hand the residual about one unit of RMS each, so unit scales leave the decoder's
# states near |h| = 9 after four layers, where float32's rounding alone (ours against transformers in float64)
# reached 5.5e-6 (8.6e-6 at another seed); the text layers' post-norm scales near 1 - 0.5 keep them O(1) (under 4.6e-6
# at seeds 0-7) and the 1e-5 standard about the arithmetic
HALVED = 0.5
SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
PAD, BOI, EOI, IMAGE = 0, 3, 4, 5
TEXT = dict(model_type="gemma3_text", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=3, query_pre_attn_scalar=32,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            max_position_embeddings=256, pad_token_id=PAD, eos_token_id=1, bos_token_id=2)
VISION = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=2, image_size=32, patch_size=8, vision_use_head=False)  # 4 x 4 patches
GEMMA3 = dict(text_config=TEXT, vision_config=VISION, mm_tokens_per_image=4, image_token_index=IMAGE,
              boi_token_index=BOI, eoi_token_index=EOI)
# google/gemma-3-4b-it's preprocessor_config.json, its size made the tower's
IMAGES = {"do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
          "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 4,
          "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None, "pan_and_scan_min_crop_size": None,
          "pan_and_scan_min_ratio_to_activate": None, "processor_class": "Gemma3Processor", "resample": 2,
          "rescale_factor": 0.00392156862745098, "size": {"height": 32, "width": 32}}
# google/gemma-3-4b-it's config.json as published (transformers 4.50), every key kept (written from memory)
PUBLISHED = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The tiny checkpoint with its processor files (pixels, placeholders, the tokenizer's image tokens)."""
    path = tmp_path_factory.mktemp("gemma3-vision")
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(**GEMMA3)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0, 0.05 if parameter.ndim > 1 else 0.1)
            if name.startswith("model.language_model.") and ".post_" in name:  # outputs times ~(1 - 0.5): HALVED
                parameter.sub_(HALVED)
    model.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps(IMAGES))
    (path / "processor_config.json").write_text(json.dumps({"image_seq_length": 4,
                                                            "processor_class": "Gemma3Processor"}))
    tokens = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}
    (path / "tokenizer_config.json").write_text(json.dumps({"extra_special_tokens": tokens}))
    return path


@pytest.fixture(scope="module")
def models(folder):
    return jf.from_pretrained(folder), transformers.Gemma3ForConditionalGeneration.from_pretrained(folder).eval()


def _drawing(width: int, height: int, seed: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert(mode)
    red = (200, 30, 60, 255)[:len(mode)]
    ImageDraw.Draw(image).ellipse((width // 4, height // 4, width // 2, height // 2), fill=red)
    return image


def _tokenize(text: str) -> list[int]:
    """One id a special token or a character (newline, printable ASCII): equal ids mean equal text."""
    ids, i = [], 0
    while i < len(text):
        special = next((s for s in SPECIALS if text.startswith(s, i)), None)
        if special is not None:
            ids.append(SPECIALS.index(special))
            i += len(special)
        else:
            ids.append(len(SPECIALS) + (0 if text[i] == "\n" else ord(text[i]) - 31))
            i += 1
    return ids


def prompts(folder, texts: list[str], images: list[Image.Image]):
    """input_ids (left padded), attention_mask, pixel_values and token_type_ids of ``texts`` with ``images``."""
    placeholders = ImagePlaceholders.from_pretrained(folder)
    pixels = placeholders.image_processor(images)
    rows = [_tokenize(text) for text in placeholders.expand(texts, pixels)]
    length = max(map(len, rows))
    ids = np.array([[PAD] * (length - len(row)) + row for row in rows])
    mask = np.array([[0] * (length - len(row)) + [1] * len(row) for row in rows])
    types = np.array(placeholders.token_type_ids(ids.tolist(), IMAGE))
    return ids, mask, np.asarray(pixels["pixel_values"]), types


def _torch(*arrays):
    return [torch.tensor(np.asarray(a)) for a in arrays]


def _worst(ours, theirs, where=None) -> float:
    ours, theirs = np.asarray(ours), theirs.detach().numpy()
    return float(np.abs(ours[where] - theirs[where]).max() if where is not None else np.abs(ours - theirs).max())


def test_tower_decoder_and_logits_match_transformers(folder, models):
    ours, reference = models
    # two images in the first row, one in the second (left padded): three image blocks
    ids, mask, pixels, types = prompts(folder, ["<bos>Two: <start_of_image> and <start_of_image>?",
                                                "<bos>One <start_of_image>"],
                                       [_drawing(50, 40, 0), _drawing(30, 70, 1, "RGBA"), _drawing(64, 64, 2)])
    assert pixels.shape == (3, 3, 32, 32) and types.sum() == 12
    tower = ours.vision(pixel_values=pixels, output_hidden_states=True)
    with torch.no_grad():
        expected_tower = reference.model.vision_tower(pixel_values=torch.tensor(pixels), output_hidden_states=True)
    assert len(tower.hidden_states) == len(expected_tower.hidden_states) == 3
    for state, expected in zip(tower.hidden_states, expected_tower.hidden_states):
        assert _worst(state, expected) < TOLERANCE
    assert _worst(tower.last_hidden_state, expected_tower.last_hidden_state) < TOLERANCE  # post_layernorm applied
    valid = mask.astype(bool)
    logits = {}
    for with_types in (True, False):
        extra = dict(token_type_ids=types) if with_types else {}
        out = ours(ids, attention_mask=mask, pixel_values=pixels, output_hidden_states=True, **extra)
        t_ids, t_mask, t_pixels, t_types = _torch(ids, mask, pixels, types)
        with torch.no_grad():
            expected = reference(input_ids=t_ids, attention_mask=t_mask, pixel_values=t_pixels,
                                 output_hidden_states=True, **({"token_type_ids": t_types} if with_types else {}))
        assert len(out.hidden_states) == len(expected.hidden_states) == 5
        for state, want in zip(out.hidden_states, expected.hidden_states):
            assert _worst(state, want, valid) < TOLERANCE
        assert _worst(out.logits, expected.logits, valid) < TOLERANCE
        logits[with_types] = np.asarray(out.logits)[valid]
    assert np.abs(logits[True] - logits[False]).max() > 1e-2  # the images' own attention changes the numbers


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_with_images_is_token_identical(folder, models, num_beams):
    ours, reference = models
    ids, mask, pixels, types = prompts(folder, ["<bos>Say <start_of_image>", "<bos>What is in <start_of_image> here?"],
                                       [_drawing(40, 40, 3), _drawing(90, 20, 4)])
    assert not mask[0].all()  # left padded
    settings = dict(max_new_tokens=8, do_sample=False, num_beams=num_beams)
    t_ids, t_mask, t_pixels, t_types = _torch(ids, mask, pixels, types)
    with torch.no_grad():
        expected = reference.generate(input_ids=t_ids, attention_mask=t_mask, pixel_values=t_pixels,
                                      token_type_ids=t_types, **settings).numpy()
    got = ours.generate(ids, attention_mask=mask, pixel_values=pixels, token_type_ids=types, **settings)
    assert np.array_equal(got, expected)


def test_a_grid_its_windows_do_not_tile_is_pooled_as_transformers_pools_it(tmp_path):
    """A 5 x 5 patch grid pooled to 4 tokens: windows of 2, the last row and column of patches unread (AvgPool2d)."""
    torch.manual_seed(1)
    config = transformers.Gemma3Config(**{**GEMMA3, "vision_config": {**VISION, "image_size": 40}})
    reference = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in reference.model.multi_modal_projector.parameters():
            parameter.normal_(0, 0.1)
    reference.save_pretrained(tmp_path)
    model = jf.from_pretrained(tmp_path)
    pixels = np.random.default_rng(0).uniform(-1, 1, (2, 3, 40, 40)).astype(np.float32)
    with torch.no_grad():
        expected = reference.model.get_image_features(torch.tensor(pixels)).pooler_output
    ours = model.projector(model.vision(pixel_values=pixels).last_hidden_state)
    assert ours.shape == expected.shape == (2, 4, 64) and _worst(ours, expected) < TOLERANCE


def test_the_text_configs_softcap_caps_nothing_in_the_image_model(tmp_path):
    """final_logit_softcapping in text_config is Gemma3ForCausalLM's: the image model's logits are not capped."""
    torch.manual_seed(2)
    config = transformers.Gemma3Config(**{**GEMMA3, "text_config": {**TEXT, "final_logit_softcapping": 0.5}})
    reference = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.normal_(0, 0.05)
    reference.save_pretrained(tmp_path)
    model = jf.from_pretrained(tmp_path)
    ids = np.array([[2, 10, BOI, IMAGE, IMAGE, IMAGE, IMAGE, EOI, 11, 12]])
    types = (ids == IMAGE).astype(np.int64)
    pixels = np.random.default_rng(0).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        expected = reference(*_torch(ids), pixel_values=torch.tensor(pixels), token_type_ids=torch.tensor(types)).logits
    got = model(ids, pixel_values=pixels, token_type_ids=types).logits
    assert np.abs(expected.numpy()).max() > 0.5 and _worst(got, expected) < TOLERANCE  # (capped, none would pass 0.5)


def _layout(name: str, layout: str) -> str:
    """A tensor's name in the published layout (the tower under vision_model.) or its modules' names."""
    if layout == "published":
        return name.replace("vision_tower.", "vision_tower.vision_model.", 1)
    for old, new in (("vision_tower.", "model.vision_tower."), ("language_model.model.", "model.language_model."),
                     ("multi_modal_projector.", "model.multi_modal_projector.")):
        if name.startswith(old):
            return new + name[len(old):]
    return name


@pytest.mark.parametrize("layout", ["written", "published", "modules"])
def test_each_layout_loads_and_exports_byte_exact(folder, models, tmp_path, layout):
    source = TensorFiles(folder)
    tensors = {name: source.get(name) for name in source.names}
    copy = tmp_path / "in"
    copy.mkdir()
    (copy / "config.json").write_text((folder / "config.json").read_text())
    if layout != "written":
        write_safetensors({_layout(name, layout): array for name, array in tensors.items()},
                          copy / "model.safetensors")
    else:
        write_safetensors(tensors, copy / "model.safetensors")
    model = jf.from_pretrained(copy)
    model.save_pretrained(tmp_path / "out")
    written = TensorFiles(tmp_path / "out")
    assert set(written.names) == set(tensors)  # transformers 5's layout
    assert all(written.get(name).tobytes() == tensors[name].tobytes() for name in tensors)
    reloaded = transformers.Gemma3ForConditionalGeneration.from_pretrained(tmp_path / "out")
    assert reloaded.config.mm_tokens_per_image == 4 and reloaded.config.boi_token_index == BOI


def test_the_published_config_reads_as_the_preset():
    read = config_from_hf(json.loads(json.dumps(PUBLISHED))).replace(dtype="float32", param_dtype="float32")
    assert read.tokens.eos == (1, 106)  # the file's own list (the preset keeps the text model's default)
    assert read.replace(name="gemma-3-4b-vision", eos_token_id=1) == jf.config("gemma-3-4b-vision")


@pytest.mark.parametrize("change, message", [
    (dict(mm_tokens_per_image=3), "pooled_tokens=3"),
    (dict(mm_tokens_per_image=0), "mm_tokens_per_image=0"),
    (dict(text_config={**TEXT, "model_type": "llama"}), "text_config model_type 'llama'"),
    (dict(vision_config={**VISION, "model_type": "clip_vision_model"}), "vision_config model_type"),
])
def test_bad_configs_are_refused_by_name(change, message):
    hf = {**transformers.Gemma3Config(**GEMMA3).to_dict(), **change,
          "architectures": ["Gemma3ForConditionalGeneration"]}
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf)


def test_bad_image_inputs_are_refused_by_name(folder, models):
    ours, _ = models
    ids, mask, pixels, types = prompts(folder, ["<bos><start_of_image>"], [_drawing(32, 32, 5)])
    with pytest.raises(ValueError, match="token_type_ids mark image tokens"):
        ours(ids, attention_mask=mask, pixel_values=pixels, token_type_ids=types * 2)
    with pytest.raises(ValueError, match="token_type_ids has shape"):
        ours(ids, attention_mask=mask, pixel_values=pixels, token_type_ids=types[:, 1:])
    with pytest.raises(ValueError, match="image tokens"):
        ours(ids[:, :-4], pixel_values=pixels)  # a placeholder cut off
    text_only = jf.build("tiny-gpt")
    with pytest.raises(ValueError, match="token_type_ids given to generate"):
        text_only.generate(np.array([[1, 2]]), token_type_ids=np.array([[0, 0]]), max_new_tokens=1)
