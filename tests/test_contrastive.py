"""CLIP and SigLIP as dual encoders: what the shared parity, round-trip and key tests (tiny checkpoints in
hf_factory.py) do not show. CLIP's pooling at a real EOS id (the shared tests use the legacy largest-id rule),
``get_text_features`` / ``get_image_features`` as transformers answers them, zero-shot classification of a drawn
image through our image processor and tokenizer, the config carrying a nested image tower through every form
(nested, flat, JSON, the native format), and what bad input gets."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from flax import nnx  # noqa: E402
from jaxformer.compare import compare, format_table, reference_model  # noqa: E402
from jaxformer.interop.tokenizer import load_tokenizer  # noqa: E402
from jaxformer.vision import ImageProcessor  # noqa: E402

from family_files import shapes_picture, word_tokenizer  # noqa: E402
from hf_factory import CHECKPOINTS, save_checkpoint  # noqa: E402

TOLERANCE = 1e-5
IMAGE = (3, 30, 30)  # the tiny towers' images (hf_factory._IMAGE_TOWER)


def _images(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, *IMAGE)).astype(np.float32)


@pytest.fixture(scope="module")
def clip_eos(tmp_path_factory):
    """A tiny CLIP whose text config says a real EOS id (5): pooled at each row's first 5, not its largest id."""
    folder = tmp_path_factory.mktemp("clip_eos")
    text = {**CHECKPOINTS["clip"][2]["text_config"], "eos_token_id": 5}
    return save_checkpoint("clip", folder, changes={"text_config": text})


def _eos_rows() -> tuple[np.ndarray, np.ndarray]:
    """Rows whose first EOS (5) is not their largest id and not their last token; the second row holds two."""
    ids = np.array([[9, 40, 5, 80, 7, 3, 3], [11, 5, 60, 5, 90, 1, 1]])
    mask = np.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]])
    return ids, mask


def test_clip_pools_at_the_first_eos_token_as_transformers_does(clip_eos):
    ids, mask = _eos_rows()
    rows = compare(clip_eos, ids, mask, pixel_values=_images(3))
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
    model = jf.from_pretrained(clip_eos)
    assert model.config.tokens.eos == 5 and model.config.head_options.pooled_token == "eos"
    out = model.text(ids, mask)
    pooled, last = np.asarray(out.pooler_output), np.asarray(out.last_hidden_state)
    np.testing.assert_allclose(pooled, last[[0, 1], [2, 1]], atol=1e-6, rtol=0)  # the first 5s
    assert np.abs(pooled - last[[0, 1], [3, 4]]).max() > 0.1  # not the largest ids (80, 90)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_text_and_image_features_are_transformers(name, checkpoints):
    path = checkpoints(name)
    model, reference = jf.from_pretrained(path), reference_model(path)
    ids = np.random.default_rng(1).integers(3, 97, (3, 8))
    mask = np.ones_like(ids)
    mask[2, 5:] = 0
    pixels = _images(2, seed=2)
    with torch.no_grad():
        text = reference.get_text_features(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
        image = reference.get_image_features(pixel_values=torch.as_tensor(pixels))
    ours_text, ours_image = model.get_text_features(ids, mask), model.get_image_features(pixels)
    np.testing.assert_allclose(ours_text.pooler_output, text.pooler_output.numpy(), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(ours_image.pooler_output, image.pooler_output.numpy(), atol=TOLERANCE, rtol=0)
    out = model(ids, pixels, mask)
    with torch.no_grad():
        want = reference(input_ids=torch.as_tensor(ids), pixel_values=torch.as_tensor(pixels),
                         attention_mask=torch.as_tensor(mask))
    assert out.logits_per_image.shape == (2, 3)
    for field in ("logits_per_image", "logits_per_text"):
        np.testing.assert_allclose(getattr(out, field), getattr(want, field).numpy(), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_images_of_another_size_with_interpolated_positions_are_transformers(name, checkpoints):
    path = checkpoints(name)
    model, reference = jf.from_pretrained(path), reference_model(path)
    ids, pixels = np.random.default_rng(3).integers(3, 97, (2, 8)), _images(2, seed=3)
    pixels = np.concatenate([pixels, pixels[..., :10]], axis=-1)  # 30x40: another size than the tower's 30x30
    ours = model(ids, pixels, interpolate_pos_encoding=True)
    with torch.no_grad():
        want = reference(input_ids=torch.as_tensor(ids), pixel_values=torch.as_tensor(pixels),
                         interpolate_pos_encoding=True)
        image = reference.get_image_features(pixel_values=torch.as_tensor(pixels), interpolate_pos_encoding=True)
    np.testing.assert_allclose(ours.logits_per_image, want.logits_per_image.numpy(), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(model.get_image_features(pixels, interpolate_pos_encoding=True).pooler_output,
                               image.pooler_output.numpy(), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", ["siglip", "siglip2"])
def test_siglip_reads_its_sub_configs_without_clips_dict_rule(name, checkpoints):
    """CLIPConfig rebuilds a sub-config from a ``text_config_dict`` beside it; SiglipConfig has no such rule: the
    full text_config is read, the dict left unread (and let go, as transformers never reads it)."""
    from jaxformer.interop.hf import config_from_hf

    hf = json.loads((checkpoints(name) / "config.json").read_text())
    hf["text_config_dict"] = {"num_hidden_layers": hf["text_config"]["num_hidden_layers"] + 1}
    want = getattr(transformers, f"{'Siglip2' if name == 'siglip2' else 'Siglip'}Config").from_dict(hf).text_config
    assert config_from_hf(hf).encoder_layers == want.num_hidden_layers == hf["text_config"]["num_hidden_layers"]


def test_zero_shot_classification_of_a_drawn_image_is_transformers(checkpoints, tmp_path):
    """CLIP's image processor (resize the short side, center crop, normalise) and the tokenizer, ours against
    transformers', then each picture's label probabilities (softmax over logits_per_image)."""
    import shutil

    folder = tmp_path / "clip"
    shutil.copytree(checkpoints("clip"), folder)
    transformers.CLIPImageProcessor(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30}).save_pretrained(
        folder)
    word_tokenizer(folder)
    pictures = [shapes_picture((220, 30, 30), "circle"), shapes_picture((30, 30, 220), "square")]
    captions = [f"a photo of a {colour} {shape}" for colour in ("red", "blue") for shape in ("circle", "square")]

    pixels = ImageProcessor.from_pretrained(folder)(pictures)["pixel_values"]
    batch = load_tokenizer(folder)(captions)
    logits = jf.from_pretrained(folder)(batch["input_ids"], pixels, batch["attention_mask"]).logits_per_image
    ours = np.asarray(jax.nn.softmax(logits, axis=1))

    processor = transformers.CLIPProcessor(image_processor=transformers.AutoImageProcessor.from_pretrained(folder),
                                           tokenizer=transformers.AutoTokenizer.from_pretrained(folder))
    inputs = processor(text=captions, images=pictures, return_tensors="pt", padding=True)
    np.testing.assert_allclose(pixels, inputs["pixel_values"].numpy(), atol=TOLERANCE, rtol=0)
    np.testing.assert_array_equal(batch["input_ids"], inputs["input_ids"].numpy())
    with torch.no_grad():
        theirs = reference_model(folder)(**inputs).logits_per_image.softmax(dim=1).numpy()
    np.testing.assert_allclose(ours, theirs, atol=TOLERANCE, rtol=0)
    assert ours.shape == (2, 4) and np.allclose(ours.sum(axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("name", ["clip-vit-base-patch32", "siglip-base-patch16-224"])
def test_a_dual_encoders_config_reads_alike_in_every_form(name):
    cfg = jf.config(name)
    assert jf.ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert jf.ModelConfig.from_dict(cfg.to_flat()) == cfg
    half = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
    assert (half.vision.tower.dtype, half.vision.tower.param_dtype) == ("bfloat16", "bfloat16")  # the tower follows
    assert half.vision.tower.replace(dtype="float32", param_dtype="float32") == cfg.vision.tower


def test_a_tiny_dual_encoder_builds_splits_and_saves_natively(tmp_path):
    """A stand-in CLIP shape built from a preset's config (smaller): built, counted, split and merged, saved in
    the native format and loaded back with the same outputs."""
    from jaxformer.checkpoint import load_model, save_model

    cfg = jf.config("clip-vit-base-patch32")
    tower = cfg.vision.tower.replace(d_model=32, num_heads=4, d_ff=48, encoder_layers=2, image_size=30,
                                     patch_size=10, max_positions=10)
    cfg = cfg.replace(vocab_size=97, d_model=32, num_heads=4, d_ff=48, encoder_layers=2, max_positions=16,
                      vision=dataclasses.replace(cfg.vision, tower=tower, projection=24))
    model = jf.build(cfg, seed=0)
    graphdef, state = jf.split(model)
    assert jf.param_count(cfg) == sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    model = jf.merge(graphdef, state)
    ids, pixels = np.array([[3, 4, 5, 2], [6, 7, 2, 1]]), _images(2)
    before = model(ids, pixels, np.array([[1, 1, 1, 1], [1, 1, 1, 0]]))
    save_model(model, tmp_path / "native")
    after = load_model(tmp_path / "native")(ids, pixels, np.array([[1, 1, 1, 1], [1, 1, 1, 0]]))
    np.testing.assert_array_equal(before.logits_per_image, after.logits_per_image)


def test_bad_input_is_refused_by_name(checkpoints):
    model = jf.from_pretrained(checkpoints("clip"))
    ids = np.array([[3, 4, 2]])
    with pytest.raises(ValueError, match="pixel_values"):
        model(ids, np.zeros((1, 3, 20, 20), np.float32))
    with pytest.raises(ValueError, match="input_ids"):
        model(np.array([[3, 400, 2]]), _images(1))
    with pytest.raises(ValueError, match="no language model head"):
        model.generate(ids)
    with pytest.raises(ValueError, match="dual encoder"):
        jf.config("clip-vit-base-patch32").replace(family="encoder")
    with pytest.raises(ValueError, match="pooled_token"):
        jf.config("clip-vit-base-patch32").replace(pooled_token="middle")
    vision = jf.config("clip-vit-base-patch32").vision
    with pytest.raises(ValueError, match=r"drop_first_token=True belong to a decoder reading images"):
        dataclasses.replace(vision, drop_first_token=True)
    with pytest.raises(ValueError, match=r"projection=512, logit_bias=True belong to a dual encoder"):
        dataclasses.replace(jf.config("llava-1.5-7b").vision, projection=512, logit_bias=True)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_the_contrastive_loss_is_transformers_and_trains(name, checkpoints):
    """CLIP's softmax and SigLIP's sigmoid loss over matching pairs equal transformers' return_loss, and a few
    gradient steps through both towers lower it (the objective row 4's training will read)."""
    import optax

    from jaxformer.train.objectives import contrastive_loss, ratio

    path = checkpoints(name)
    model, reference = jf.from_pretrained(path), reference_model(path)
    ids, pixels = np.random.default_rng(3).integers(3, 97, (3, 6)), _images(3, seed=3)
    sigmoid = model.config.vision.logit_bias
    with torch.no_grad():
        theirs = reference(input_ids=torch.as_tensor(ids), pixel_values=torch.as_tensor(pixels), return_loss=True).loss
    sums = contrastive_loss(model(ids, pixels).logits_per_text, sigmoid)
    np.testing.assert_allclose(ratio(sums["loss"]), theirs.item(), atol=TOLERANCE, rtol=0)

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)

    def loss_fn(params):
        out = nnx.merge(graphdef, params, rest)(ids, pixels)
        return ratio(contrastive_loss(out.logits_per_text, sigmoid)["loss"])

    losses, step = [], jax.jit(jax.value_and_grad(loss_fn))
    for _ in range(4):
        loss, grads = step(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params, losses = optax.apply_updates(params, updates), losses + [float(loss)]
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_the_embedder_gives_transformers_features_of_texts_and_images(name, checkpoints, tmp_path):
    """jf.Embedder on a CLIP or SigLIP folder: texts tokenized as the model's processor does (SigLIP's to its full
    length, no mask), images through the folder's image processor, features equal to transformers'."""
    import shutil

    folder = tmp_path / name
    shutil.copytree(checkpoints(name), folder)
    processor_class = transformers.CLIPImageProcessor if name == "clip" else transformers.SiglipImageProcessor
    processor_class(**({"size": {"shortest_edge": 30}, "crop_size": {"height": 30, "width": 30}} if name == "clip"
                       else {"size": {"height": 30, "width": 30}})).save_pretrained(folder)
    word_tokenizer(folder)
    captions = ["a photo of a red circle", "a blue square"]
    pictures = [shapes_picture((220, 30, 30), "circle"), shapes_picture((30, 30, 220), "square")]
    embedder = jf.Embedder.from_pretrained(folder)
    assert isinstance(embedder, jf.ImageTextEmbedder)

    tokenizer, reference = transformers.AutoTokenizer.from_pretrained(folder), reference_model(folder)
    siglip = name == "siglip"
    length = reference.config.text_config.max_position_embeddings
    texts = tokenizer(captions, return_tensors="pt", padding=True) if not siglip else tokenizer(
        captions, return_tensors="pt", padding="max_length", max_length=length)
    if siglip:  # SigLIP's tokenizer gives no attention mask: its pads are read
        texts.pop("attention_mask")
    images = transformers.AutoImageProcessor.from_pretrained(folder)(pictures, return_tensors="pt")
    with torch.no_grad():
        text = reference.get_text_features(**texts).pooler_output.numpy()
        image = reference.get_image_features(**images).pooler_output.numpy()
    np.testing.assert_allclose(embedder.encode(captions), text, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(embedder.encode(captions[0]), text[0], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(embedder.encode_images(pictures), image, atol=TOLERANCE, rtol=0)
    probabilities = embedder.classify(pictures, captions)
    assert probabilities.shape == (2, 2) and (probabilities >= 0).all() and (probabilities <= 1).all()
    if not siglip:
        np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-6)


# transformers 4's PretrainedConfig keys every sub-config of a published CLIP file spells out (openai's and the
# Stable Diffusion safety checker's clip-vit-large-patch14 files), at the values those files hold
_LEGACY_KEYS = dict(add_cross_attention=False, architectures=None, attention_dropout=0.0, bad_words_ids=None,
                    chunk_size_feed_forward=0, cross_attention_hidden_size=None, decoder_start_token_id=None,
                    diversity_penalty=0.0, do_sample=False, dropout=0.0, early_stopping=False,
                    encoder_no_repeat_ngram_size=0, exponential_decay_length_penalty=None, finetuning_task=None,
                    forced_bos_token_id=None, forced_eos_token_id=None, hidden_act="quick_gelu",
                    id2label={"0": "LABEL_0", "1": "LABEL_1"}, initializer_factor=1.0, initializer_range=0.02,
                    is_decoder=False, is_encoder_decoder=False, label2id={"LABEL_0": 0, "LABEL_1": 1},
                    layer_norm_eps=1e-05, length_penalty=1.0, max_length=20, min_length=0, no_repeat_ngram_size=0,
                    num_beam_groups=1, num_beams=1, num_return_sequences=1, output_attentions=False,
                    output_hidden_states=False, output_scores=False, prefix=None, problem_type=None, pruned_heads={},
                    remove_invalid_values=False, repetition_penalty=1.0, return_dict=True,
                    return_dict_in_generate=False,
                    sep_token_id=None, task_specific_params=None, temperature=1.0, tf_legacy_loss=False,
                    tie_encoder_decoder=False, tie_word_embeddings=True, tokenizer_class=None, top_k=50, top_p=1.0,
                    torch_dtype=None, torchscript=False, typical_p=1.0, use_bfloat16=False)
# the published form, sizes made tiny: the full sub-configs keep the large model's sizes, and the older
# *_config_dict beside them holds the tiny checkpoint's (its sizes, and its vocabulary, positions and token ids,
# which the published dicts leave to the class defaults); CLIPConfig rebuilds each sub-config from the dict alone
PUBLISHED_CLIP = {
    "initializer_factor": 1.0, "logit_scale_init_value": 2.6592, "model_type": "clip", "projection_dim": 24,
    "architectures": ["CLIPModel"], "torch_dtype": "float32", "transformers_version": None,
    "text_config": {**_LEGACY_KEYS, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1, "hidden_size": 768,
                    "intermediate_size": 3072, "max_position_embeddings": 40, "model_type": "clip_text_model",
                    "num_attention_heads": 12, "num_hidden_layers": 12, "vocab_size": 97},
    "text_config_dict": {"hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4, "num_hidden_layers": 2,
                         "vocab_size": 97, "max_position_embeddings": 40, "bos_token_id": 0, "eos_token_id": 2,
                         "pad_token_id": 1},
    "vision_config": {**_LEGACY_KEYS, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
                      "hidden_size": 1024, "image_size": 30, "intermediate_size": 4096,
                      "model_type": "clip_vision_model",
                      "num_attention_heads": 16, "num_channels": 3, "num_hidden_layers": 24, "patch_size": 14},
    "vision_config_dict": {"hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4, "num_hidden_layers": 2,
                           "patch_size": 10, "image_size": 30},
}


def test_a_published_clip_file_reads_as_transformers_reads_it(checkpoints, tmp_path):
    """The published form (legacy keys, *_config_dict overrides) loads, reads as the file transformers 5 writes
    after loading it, and the model matches transformers' on it, layer by layer."""
    import shutil
    import warnings

    from jaxformer.interop.hf import config_from_hf

    folder = tmp_path / "published"
    shutil.copytree(checkpoints("clip"), folder)
    (folder / "config.json").write_text(json.dumps(PUBLISHED_CLIP))
    modern = json.loads(transformers.CLIPConfig.from_dict(json.loads(json.dumps(PUBLISHED_CLIP))).to_json_string(
        use_diff=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        published = config_from_hf(json.loads(json.dumps(PUBLISHED_CLIP)))
        assert config_from_hf(modern).replace(name=published.name) == published
        assert (published.d_model, published.vision.tower.d_model, published.vision.tower.patches.patch_size) == (
            32, 32, 10)
        # the full text_config's eos_token_id 2 is not used: the dict without one means the class's 49407
        legacy = {**PUBLISHED_CLIP, "text_config_dict": {"vocab_size": 49408, "hidden_size": 32,
                                                         "num_attention_heads": 4}}
        assert config_from_hf(legacy).tokens.eos == transformers.CLIPConfig.from_dict(legacy).text_config.eos_token_id
    ids, mask = _eos_rows()
    ids = np.where(ids == 5, 96, ids)  # (the legacy rule: the largest id)
    rows = compare(folder, ids, mask, pixel_values=_images(2))
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
