"""LLaVA (``llava``): a CLIP or SigLIP vision tower, the multimodal projector and a LLaMA-like decoder, fed images.

Tiny checkpoints saved by transformers (hf_factory's ``llava``: a CLIP tower read at its second-to-last layer
without the class token, a LLaMA decoder; and a variant with a SigLIP tower read at two layers in 'full', a Qwen2
decoder, no projector biases) match transformers' vision tower hidden states, decoder hidden states and logits on
inputs holding the image placeholders, left padded; greedy and beam generation with one image per row are
token-identical. The published LLaVA-1.5 config.json reads as the ``llava-1.5-7b`` preset, and the three tensor
layouts (published, as transformers 5 writes, its modules' names) load. Bad images, placeholder counts and settings
are refused by name. (The shared tests run the same checkpoint on text alone: test_hf_parity.py's layers and round
trip, test_config_keys.py's keys fed an image.)
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.interop.files import TensorFiles, write_safetensors  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.interop.registry import same_model  # noqa: E402

from hf_factory import CHECKPOINTS, save_checkpoint  # noqa: E402

TOLERANCE = 1e-5
IMAGE_TOKEN, PER_IMAGE = 96, 9  # hf_factory's llava: 3x3 patches of a 30x30 image, the class token dropped
_LLAVA = CHECKPOINTS["llava"][2]
# a SigLIP tower (no class token: all 9 patches) read at two layers, concatenated, in 'full'; a Qwen2 decoder
SIGLIP_QWEN2 = dict(vision_config={**_LLAVA["vision_config"], "model_type": "siglip_vision_model"},
                    text_config={**_LLAVA["text_config"], "model_type": "qwen2"}, vision_feature_layer=[-1, 1],
                    vision_feature_select_strategy="full", multimodal_projector_bias=False,
                    projector_hidden_act="gelu_pytorch_tanh")
# llava-hf/llava-1.5-7b-hf's config.json as published (transformers 4.36), every key kept
PUBLISHED = {
    "architectures": ["LlavaForConditionalGeneration"], "ignore_index": -100, "image_token_index": 32000,
    "model_type": "llava", "pad_token_id": 32001, "projector_hidden_act": "gelu",
    "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"],
                    "max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05,
                    "torch_dtype": "float16", "vocab_size": 32064},
    "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.36.0.dev0",
    "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                      "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
                      "patch_size": 14, "projection_dim": 768, "vocab_size": 32000},
    "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "vocab_size": 32064}


@pytest.fixture(scope="module")
def siglip_qwen2(tmp_path_factory):
    return save_checkpoint("llava", tmp_path_factory.mktemp("llava-siglip"), changes=SIGLIP_QWEN2)


def image_batch(seed: int, per_image: int = PER_IMAGE, length: int = 16):
    """Two rows, the first left padded by two, each holding one image's placeholders; two images."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, IMAGE_TOKEN, size=(2, length))
    ids[0, 3:3 + per_image] = ids[1, 5:5 + per_image] = IMAGE_TOKEN
    mask = np.ones_like(ids)
    mask[0, :2], ids[0, :2] = 0, 0
    return ids, mask, rng.standard_normal((2, 3, 30, 30)).astype(np.float32)


def _reference(folder):
    return transformers.LlavaForConditionalGeneration.from_pretrained(folder).eval()


@pytest.mark.parametrize("variant", ["clip-llama", "siglip-qwen2"])
def test_tower_decoder_and_logits_match_transformers_on_images(variant, checkpoints, siglip_qwen2):
    folder = checkpoints("llava") if variant == "clip-llama" else siglip_qwen2
    # transformers in float64: our float32 against the exact numbers, not against torch's float32 rounding too. On
    # these inputs (one image a row) ours is within 5.5e-6 of float64 at seeds 0-5 (torch float32 within 7.5e-6
    # of ours); a batch whose rounding one token amplifies (3 images over 2 rows of 24, seed 0) came to 2.2e-5
    # against torch float32 while 9e-6 from float64, torch float32 itself 1.4e-5 from it
    model, reference = jf.from_pretrained(folder), _reference(folder).double()
    ids, mask, pixels = image_batch(0)  # (both towers give 9 features an image)
    with torch.no_grad():
        image = torch.tensor(pixels, dtype=torch.float64)
        want = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), pixel_values=image,
                         output_hidden_states=True)
        want_tower = reference.model.vision_tower(image, output_hidden_states=True)
    got = model(ids, mask, pixel_values=pixels, output_hidden_states=True)
    got_tower = model.vision(pixel_values=pixels, output_hidden_states=True)
    assert jf.param_count(model.config) == sum(p.numel() for p in reference.parameters())  # every tensor held
    assert len(got_tower.hidden_states) == len(want_tower.hidden_states) == 4
    for a, b in zip(got_tower.hidden_states, want_tower.hidden_states):
        assert np.abs(np.asarray(a) - b.numpy()).max() <= TOLERANCE
    real = mask[..., None].astype(bool)  # (padding's states are nobody's numbers)
    assert len(got.hidden_states) == len(want.hidden_states) == 3
    for a, b in [*zip(got.hidden_states, want.hidden_states), (got.logits, want.logits)]:
        assert np.abs(np.where(real, np.asarray(a) - b.numpy(), 0)).max() <= TOLERANCE


@pytest.mark.parametrize("beams", [1, 3])
def test_generation_with_an_image_per_row_is_token_identical(beams, checkpoints):
    folder = checkpoints("llava")
    model, reference = jf.from_pretrained(folder), _reference(folder)
    ids, mask, pixels = image_batch(1)
    settings = dict(max_new_tokens=8, do_sample=False, num_beams=beams, pad_token_id=0, eos_token_id=2)
    with torch.no_grad():
        want = reference.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                  pixel_values=torch.tensor(pixels), **settings).numpy()
    got = model.generate(ids, mask, pixel_values=pixels, **settings)
    assert np.asarray(got).tolist() == want.tolist()


def test_beams_repeat_each_row_with_its_own_images(checkpoints):
    """Two images a row: each beam of a row reads that row's two images, as transformers expands its inputs."""
    folder = checkpoints("llava")
    model, reference = jf.from_pretrained(folder), _reference(folder)
    rng = np.random.default_rng(4)
    ids = rng.integers(3, IMAGE_TOKEN, size=(2, 32))
    ids[:, 2:2 + 2 * PER_IMAGE] = IMAGE_TOKEN
    pixels = rng.standard_normal((4, 3, 30, 30)).astype(np.float32)
    settings = dict(max_new_tokens=5, do_sample=False, num_beams=2, pad_token_id=0, eos_token_id=2)
    with torch.no_grad():
        want = reference.generate(input_ids=torch.tensor(ids), pixel_values=torch.tensor(pixels), **settings).numpy()
    assert np.asarray(model.generate(ids, pixel_values=pixels, **settings)).tolist() == want.tolist()
    ids[1, 2:2 + PER_IMAGE] = 5  # rows of one and of three images: no row-wise repeat exists
    ids[0, 2 + 2 * PER_IMAGE:2 + 3 * PER_IMAGE] = IMAGE_TOKEN
    with pytest.raises(ValueError, match=r"every row must hold as many image placeholders, .* got \[9, 27\]"):
        model.generate(ids, pixel_values=pixels, **settings)
    ids = rng.integers(3, IMAGE_TOKEN, size=(3, 20))
    ids[:, 3:15] = IMAGE_TOKEN  # 12 a row, 36 in all: 4 images' features, but no whole image a row
    with pytest.raises(ValueError, match=r"whole images of 9 each, got \[12\]"):
        model.generate(ids, pixel_values=pixels, **settings)


def test_published_config_is_the_preset_and_its_transformers_5_form_too():
    preset = jf.config("llava-1.5-7b")
    assert same_model(preset, config_from_hf(PUBLISHED))
    written = transformers.LlavaConfig(**{k: v for k, v in PUBLISHED.items() if k != "architectures"}).to_dict()
    assert same_model(preset, config_from_hf({**written, "architectures": PUBLISHED["architectures"]}))
    vision = preset.vision
    assert (vision.feature_layers, vision.drop_first_token, vision.image_token_id) == ((-2,), True, 32000)
    assert vision.tower.patches.tokens - 1 == 576  # the placeholders an image expands to


def test_step_flops_count_the_tower_and_the_projector():
    """llava-1.5-7b at batch 2: its text decoder's FLOPs, plus one image a row through the CLIP tower (577 tokens)
    and 576 features through the projector (1024 -> 4096 -> 4096), 6 x its parameters each."""
    from jaxformer import flops

    cfg = jf.config("llava-1.5-7b")
    text = flops.train_flops_per_step(cfg.replace(vision=None), 2, 1000)
    tower = flops.train_flops_per_step(cfg.vision.tower, 2, 577)
    projector = 6 * 2 * 576 * (1024 * 4096 + 4096 * 4096 + 2 * 4096)
    assert flops.train_flops_per_step(cfg, 2, 1000) == pytest.approx(text + tower + projector, rel=1e-12)


@pytest.mark.parametrize("layout", ["published", "modules"])
def test_every_tensor_layout_loads_to_the_same_model(layout, checkpoints, tmp_path):
    """transformers 4's names (the tower under vision_model.) and transformers 5's modules' names."""
    folder = checkpoints("llava")
    files = TensorFiles(folder)
    if layout == "published":
        tensors = {name.replace("vision_tower.", "vision_tower.vision_model."): files.get(name) for name in files.names}
    else:
        modules = {"vision_tower.": "model.vision_tower.", "multi_modal_projector.": "model.multi_modal_projector.",
                   "language_model.model.": "model.language_model.", "language_model.lm_head.": "lm_head."}
        tensors = {next((new + name[len(old):] for old, new in modules.items() if name.startswith(old)), name):
                   files.get(name) for name in files.names}
    write_safetensors(tensors, tmp_path / "model.safetensors")
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    ids, mask, pixels = image_batch(2)
    want = jf.from_pretrained(folder)(ids, mask, pixel_values=pixels).logits
    assert np.array_equal(np.asarray(jf.from_pretrained(tmp_path)(ids, mask, pixel_values=pixels).logits),
                          np.asarray(want))


def test_bad_images_and_placeholder_counts_are_refused(checkpoints):
    model = jf.from_pretrained(checkpoints("llava"))
    ids, mask, pixels = image_batch(3)
    with pytest.raises(ValueError, match="input_ids hold 18 image tokens .* the 1 image"):
        model(ids, mask, pixel_values=pixels[:1])
    short = ids.copy()
    short[1, 5] = 7  # one placeholder too few
    with pytest.raises(ValueError, match="input_ids hold 17 image tokens"):
        model(short, mask, pixel_values=pixels)
    with pytest.raises(ValueError, match="pixel_values has shape"):
        model(ids, mask, pixel_values=pixels[:, :, :20])
    with pytest.raises(ValueError, match="pixel_values go with input_ids"):
        model(inputs_embeds=np.zeros((2, 16, 32), np.float32), pixel_values=pixels)
    with pytest.raises(ValueError, match="input_ids hold 18 image tokens"):
        model.generate(ids, mask, pixel_values=pixels[:1], max_new_tokens=2)
    with pytest.raises(ValueError, match="drafting .* does not take images"):
        model.generate(ids, mask, pixel_values=pixels, max_new_tokens=2, prompt_lookup_num_tokens=2)
    text_model = jf.build("tiny-llama")
    with pytest.raises(ValueError, match="reads no images"):
        text_model(np.ones((1, 4), np.int32), pixel_values=pixels[:1])


@pytest.mark.parametrize("key, value, message", [
    ("vision_feature_select_strategy", "cls", "vision_feature_select_strategy='cls'"),
    ("vision_feature_layer", 4, r"feature_layers=\(4,\) must index the tower's 4 hidden states"),
    ("vision_feature_layer", [], "vision_feature_layer=.* must be an int or a non-empty list"),
    ("projector_hidden_act", "mish", "activation 'mish'"),
    ("text_config", {"model_type": "gemma"}, "text_config model_type 'gemma' is not read"),
    ("vision_config", {"model_type": "pixtral"}, "vision_config model_type 'pixtral' is not read"),
    ("image_token_index", 97, "image_token_id=97 must be a token id of the vocabulary"),
])
def test_settings_jaxformer_cannot_honour_are_refused_by_name(key, value, message, checkpoints):
    hf = json.loads((checkpoints("llava") / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        config_from_hf({**hf, key: value})
