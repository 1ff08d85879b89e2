"""The command line on images (issue 51): ``generate --image`` and ``compare --image`` on a LLaVA folder, ``embed
--image`` on CLIP and SigLIP folders, ``viz attention --image`` on image towers and LLaVA, each against transformers
on tiny checkpoints it saved (with the processor files and a tokenizer): the LLaVA prompt's ids and pixels equal the
transformers processor's and the generated text is transformers' generate's; image embeddings are
get_image_features'; the attention values the pictures are drawn from are transformers' output_attentions at the
layer and head drawn. Towers whose inputs the commands do not prepare (tiles, image grids) are refused by name."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

import jaxformer as jf
from jaxformer.cli import _image_batch, main
from jaxformer.interop.tokenizer import load_tokenizer
from jaxformer.viz import image_panel_size, load_image_model, patch_attention

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
PIL = pytest.importorskip("PIL")

from family_files import shapes_picture, word_tokenizer  # noqa: E402

TOLERANCE = 1e-5
# hf_factory's towers read 30x30 images in 10x10 patches; its LLaVA's placeholder is id 96, nine to an image
TOWER_IMAGES = dict(size={"height": 30, "width": 30}, do_center_crop=False)
LLAVA_WORDS = ["<pad>", "<s>", "</s>", "<unk>", "USER:", "ASSISTANT:"] + [f"w{i}" for i in range(6, 96)] + ["<image>"]


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """Two drawn PNG files (44x36, so the processors resize and crop) and the images."""
    folder = tmp_path_factory.mktemp("pictures")
    images = [shapes_picture((220, 30, 30), "circle"), shapes_picture((30, 30, 220), "square")]
    paths = [folder / f"{i}.png" for i in range(len(images))]
    for image, path in zip(images, paths):
        image.save(path)
    return [str(p) for p in paths], images


def _llava_tokenizer():
    """A word-level tokenizer of the tiny LLaVA's 97 ids (BOS first, as LLaMA's), ``<image>`` its special id 96."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(LLAVA_WORDS)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<pad>", "<s>", "</s>",
                                                                                     "<image>")])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>",
                                                extra_special_tokens={"image_token": "<image>"})


@pytest.fixture(scope="module")
def llava_dir(checkpoints, tmp_path_factory):
    """hf_factory's LLaVA with the files transformers' LlavaProcessor saves: its settings, CLIP's image processor,
    the tokenizer."""
    folder = tmp_path_factory.mktemp("llava") / "llava"
    shutil.copytree(checkpoints("llava"), folder)
    images = transformers.CLIPImageProcessorPil(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30})
    transformers.LlavaProcessor(image_processor=images, tokenizer=_llava_tokenizer(), patch_size=10,
                                vision_feature_select_strategy="default",
                                num_additional_image_tokens=1).save_pretrained(folder)
    return folder


def _dual_encoder(checkpoints, tmp_path_factory, name: str):
    folder = tmp_path_factory.mktemp(name) / name
    shutil.copytree(checkpoints(name), folder)
    transformers.CLIPImageProcessor(**TOWER_IMAGES).save_pretrained(folder)
    word_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def clip_dir(checkpoints, tmp_path_factory):
    return _dual_encoder(checkpoints, tmp_path_factory, "clip")


@pytest.fixture(scope="module")
def siglip_tower_dir(checkpoints, tmp_path_factory):
    """SigLIP's vision tower alone: no class token, no tokenizer."""
    folder = tmp_path_factory.mktemp("siglip_vision_model") / "siglip_vision_model"
    shutil.copytree(checkpoints("siglip_vision_model"), folder)
    transformers.SiglipImageProcessor(**TOWER_IMAGES).save_pretrained(folder)
    return folder


def _run(argv, capsys) -> str:
    code = main([str(a) for a in argv])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    return printed.out


def _refused(argv, capsys) -> str:
    assert main([str(a) for a in argv]) == 2
    return capsys.readouterr().err


def test_generate_with_images_is_transformers_generate(llava_dir, pictures, capsys):
    """Two prompts, left padded, an image each: our prompt ids and pixels are the transformers processor's, and the
    printed rows are transformers' generate's (greedy, then beams), decoded as the text command prints them."""
    paths, images = pictures
    prompts = ["USER: <image> w7 w8 w9 ASSISTANT:", "<image> w10"]
    model, tokenizer = jf.from_pretrained(llava_dir), load_tokenizer(llava_dir)
    batch, ours = _image_batch(str(llava_dir), model, tokenizer, prompts, paths)
    processor = transformers.AutoProcessor.from_pretrained(llava_dir)
    inputs = processor(text=prompts, images=images, return_tensors="pt", padding=True, padding_side="left")
    assert batch["input_ids"].tolist() == inputs["input_ids"].tolist()
    assert batch["attention_mask"].tolist() == inputs["attention_mask"].tolist()
    assert np.array_equal(ours["pixel_values"], inputs["pixel_values"].numpy())
    reference = transformers.LlavaForConditionalGeneration.from_pretrained(llava_dir).eval()
    for beams in (1, 2):
        with torch.no_grad():
            rows = reference.generate(**inputs, max_new_tokens=6, do_sample=False, num_beams=beams).numpy()
        expected = "".join(prompt + tokenizer.continuation(row[:inputs["input_ids"].shape[1]][mask.bool().numpy()],
                                                           row[len(mask) - int(mask.sum()):]) + "\n"
                           for prompt, row, mask in zip(prompts, rows, inputs["attention_mask"]))
        argv = ["generate", llava_dir, "--max-new-tokens", 6, "--num-beams", beams]
        assert _run(argv + [a for p in prompts for a in ("--prompt", p)] + [a for p in paths for a in ("--image", p)],
                    capsys) == expected


def test_images_a_model_cannot_read_or_place_are_refused(llava_dir, checkpoints, pictures, tmp_path, capsys):
    paths, _ = pictures
    text_only = tmp_path / "llama"
    shutil.copytree(checkpoints("llama"), text_only)
    shutil.copy(llava_dir / "tokenizer.json", text_only)
    error = _refused(["generate", text_only, "--prompt", "w7", "--image", paths[0]], capsys)
    assert "generate --image needs a decoder with an image tower (LLaVA, " in error and "reads no images" in error
    error = _refused(["generate", llava_dir, "--prompt", "w7 w8", "--image", paths[0]], capsys)
    assert "the prompts hold 0 <image> placeholders for 1 --image files" in error
    assert "no such file" in _refused(["generate", llava_dir, "--prompt", "<image> w7", "--image", tmp_path / "x.png"],
                                      capsys)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_embed_images_and_texts_of_a_dual_encoder_are_transformers_features(name, checkpoints, tmp_path_factory,
                                                                            pictures, capsys):
    """embed --image prints get_image_features (CLIP's projected, SigLIP's pooled), unnormalised as the text command
    prints its sentence embeddings; --text on the same folder gives get_text_features."""
    folder = _dual_encoder(checkpoints, tmp_path_factory, name)
    paths, images = pictures
    got = np.array(json.loads(_run(["embed", folder, *[a for p in paths for a in ("--image", p)], "--json"],
                                   capsys))["embeddings"])
    reference = transformers.AutoModel.from_pretrained(folder).eval()
    pixels = transformers.AutoImageProcessor.from_pretrained(folder)(images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        want = reference.get_image_features(pixel_values=pixels).pooler_output.numpy()
    assert got.shape == want.shape and np.abs(got - want).max() <= TOLERANCE
    printed = _run(["embed", folder, "--image", paths[0]], capsys)
    assert printed.startswith(repr(paths[0]) + ": [") and printed.rstrip().endswith(f"({want.shape[1]} dims)")
    got = np.array(json.loads(_run(["embed", folder, "--text", "a red circle", "--json"], capsys))["embeddings"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    if name == "siglip":  # as SigLIP was trained: padded to its full length, read without a mask
        tokens = {"input_ids": tokenizer(["a red circle"], return_tensors="pt", padding="max_length",
                                         max_length=40)["input_ids"]}
    else:
        tokens = tokenizer(["a red circle"], return_tensors="pt")
    with torch.no_grad():
        want = reference.get_text_features(**tokens).pooler_output.numpy()
    assert np.abs(got - want).max() <= TOLERANCE


def test_embed_images_of_a_text_embedder_are_refused(llava_dir, pictures, capsys):
    error = _refused(["embed", llava_dir, "--image", pictures[0][0]], capsys)
    assert "ImageTextEmbedder reads dual encoders (CLIP, SigLIP)" in error
    assert "--image takes neither" in _refused(["embed", llava_dir, "--image", pictures[0][0], "--prompt-name",
                                                "query"], capsys)


def test_embed_batches_are_a_sentence_transformers_setting(clip_dir, capsys):
    """A dual encoder runs its texts as one batch: an explicit --batch-size is refused, not silently dropped."""
    assert "--batch-size are a sentence-transformers folder's" in _refused(
        ["embed", clip_dir, "--text", "a red circle", "--batch-size", 1], capsys)


def test_compare_with_an_image_on_llava_runs_both_models_on_the_expanded_prompt(llava_dir, pictures, capsys):
    """compare --image on LLaVA: the prompt's placeholder expanded as transformers' processor expands it, the pixels
    beside the ids; every row (each layer, the logits) within the tolerance, so the command exits 0."""
    printed = _run(["compare", llava_dir, "--image", pictures[0][0], "--text", "USER: <image> w7 ASSISTANT:"], capsys)
    assert "logits" in printed and "layer 2" in printed
    assert "needs --text, the prompt holding the image's placeholder" in _refused(
        ["compare", llava_dir, "--image", pictures[0][0], "--input-ids", "1,96,7"], capsys)


# Qwen2.5-VL and Gemma 3 as their tests build them (one tower and two text layers each); their word-level tokenizers
# hold the processors' special tokens, Gemma 3's "\n\n" (written around each image) one of them
QWEN_TEXT = dict(model_type="qwen2_5_vl_text", vocab_size=128, hidden_size=64, intermediate_size=96,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
QWEN_VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=14,
                   spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
QWEN_SPECIALS = {"<|endoftext|>": 0, "<s>": 1, "</s>": 2, "<|image_pad|>": 120, "<|vision_start|>": 121,
                 "<|vision_end|>": 122, "<|video_pad|>": 123}
GEMMA_TEXT = dict(model_type="gemma3_text", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=3,
                  query_pre_attn_scalar=32, layer_types=["sliding_attention", "full_attention"],
                  max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=2)
GEMMA_VISION = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=2, image_size=32, patch_size=8, vision_use_head=False)  # 4 x 4 patches
GEMMA_SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_image>": 3, "<end_of_image>": 4,
                  "<image_soft_token>": 5, "\n\n": 127}
MLLAMA_SPECIALS = {"<pad>": 0, "<|begin_of_text|>": 1, "<|eot_id|>": 2, "<|image|>": 97}  # hf_factory's mllama
PROMPTS = {"qwen2_5_vl": ["w5 <|vision_start|><|image_pad|><|vision_end|> w7",
                          "<|vision_start|><|image_pad|><|vision_end|> w9 w10 w11"],
           "gemma3": ["<bos> w7 <start_of_image> w8", "<bos> <start_of_image> w9 w10 w11"],
           "mllama": ["<|image|> w7 w8", "w5 <|image|> w9 w10 w11"]}  # (its bos put after the leading image)


def _word_tokenizer(specials: dict[str, int], **named):
    """Words w<i> are id i, the special tokens their own ids (the first word the unknown one)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {**{f"w{i}": i for i in range(128) if i not in specials.values()}, **specials}
    unknown = min(vocab, key=lambda w: vocab[w] if w.startswith("w") else 999)
    raw = Tokenizer(models.WordLevel(vocab, unk_token=unknown))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token=unknown, **named)


class _QwenWithoutVideo(transformers.Qwen2_5_VLProcessor):
    """Qwen2.5-VL's processor with no video processor: without torchvision transformers has none to check (nor to
    save: the folder's processor files are written by its parts, processor_config.json naming the class)."""

    def check_argument_for_proper_class(self, name, argument):
        return None if name == "video_processor" else super().check_argument_for_proper_class(name, argument)


@pytest.fixture(scope="module")
def joined(checkpoints, tmp_path_factory):
    """name -> (folder, transformers' processor, transformers' model) of a tiny Qwen2.5-VL, Gemma 3 and Llama 3.2
    Vision (hf_factory's), their processor files saved by transformers."""
    torch.manual_seed(0)
    out = {}
    folder = tmp_path_factory.mktemp("qwen2_5_vl")
    config = transformers.Qwen2_5_VLConfig(text_config=QWEN_TEXT, vision_config=QWEN_VISION, image_token_id=120,
                                           vision_start_token_id=121, vision_end_token_id=122, video_token_id=123)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    tokenizer = _word_tokenizer(QWEN_SPECIALS, eos_token="</s>", pad_token="<|endoftext|>")
    images = transformers.Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=28 * 28 * 12)
    images.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2_5_VLProcessor"}))
    out["qwen2_5_vl"] = folder, _QwenWithoutVideo(image_processor=images, tokenizer=tokenizer), model
    folder = tmp_path_factory.mktemp("gemma3")
    config = transformers.Gemma3Config(text_config=GEMMA_TEXT, vision_config=GEMMA_VISION, mm_tokens_per_image=4,
                                       image_token_index=5, boi_token_index=3, eoi_token_index=4)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # (transformers starts the projector and the norms at zero)
        for parameter in model.parameters():
            parameter.normal_(0, 0.05 if parameter.ndim > 1 else 0.1)
    model.save_pretrained(folder)
    tokenizer = _word_tokenizer(GEMMA_SPECIALS, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>",
                                extra_special_tokens={"image_token": "<image_soft_token>",
                                                      "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"})
    images = transformers.Gemma3ImageProcessorPil(size={"height": 32, "width": 32}, image_mean=[0.5] * 3,
                                                  image_std=[0.5] * 3)
    transformers.Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=4).save_pretrained(
        folder)
    out["gemma3"] = folder, transformers.AutoProcessor.from_pretrained(folder), model
    folder = tmp_path_factory.mktemp("mllama") / "mllama"
    shutil.copytree(checkpoints("mllama"), folder)
    tokenizer = _word_tokenizer(MLLAMA_SPECIALS, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                pad_token="<pad>")
    images = transformers.MllamaImageProcessorPil(max_image_tiles=2, size={"height": 28, "width": 28})
    transformers.MllamaProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(folder)
    out["mllama"] = (folder, transformers.AutoProcessor.from_pretrained(folder),
                     transformers.MllamaForConditionalGeneration.from_pretrained(folder).eval())
    return out


@pytest.mark.parametrize("name", ["qwen2_5_vl", "gemma3", "mllama"])
def test_generate_and_compare_with_images_of_joined_models_are_transformers(name, joined, pictures, capsys):
    """Two prompts, left padded, an image each: our ids and image inputs (Qwen2.5-VL's image_grid_thw and
    mm_token_type_ids, Gemma 3's token_type_ids, Llama 3.2 Vision's tiles' aspect ratios and cross_attention_mask)
    are the transformers processor's, the printed rows transformers' generate's (greedy, then beams); compare
    --image runs both models on one of them within the tolerance."""
    folder, processor, reference = joined[name]
    paths, images = pictures
    prompts = PROMPTS[name]
    model, tokenizer = jf.from_pretrained(folder), load_tokenizer(folder)
    batch, ours = _image_batch(str(folder), model, tokenizer, prompts, paths)
    inputs = processor(text=prompts, images=images if name == "qwen2_5_vl" else [[image] for image in images],
                       return_tensors="pt", padding=True, padding_side="left")
    assert sorted(ours) == sorted(set(inputs) - {"input_ids", "attention_mask"})
    for key, value in {**batch, **ours}.items():
        assert np.array_equal(np.asarray(value), inputs[key].numpy()), key
    for beams in (1, 2):
        with torch.no_grad():
            rows = reference.generate(**inputs, max_new_tokens=4, do_sample=False, num_beams=beams).numpy()
        expected = "".join(prompt + tokenizer.continuation(row[:inputs["input_ids"].shape[1]][mask.bool().numpy()],
                                                           row[len(mask) - int(mask.sum()):]) + "\n"
                           for prompt, row, mask in zip(prompts, rows, inputs["attention_mask"]))
        argv = ["generate", folder, "--max-new-tokens", 4, "--num-beams", beams]
        assert _run(argv + [a for p in prompts for a in ("--prompt", p)] + [a for p in paths for a in ("--image", p)],
                    capsys) == expected
    printed = _run(["compare", folder, "--image", paths[1], "--text", prompts[1]], capsys)
    assert "logits" in printed and "layer 2" in printed


def test_qwen_token_types_must_mark_the_image_tokens(joined, pictures):
    """transformers places M-RoPE's image positions by mm_token_type_ids, we by the image token id: types that
    disagree with the ids (or mark videos) are refused, as are types given to a model without M-RoPE."""
    folder = joined["qwen2_5_vl"][0]
    model = jf.from_pretrained(folder)
    batch, inputs = _image_batch(str(folder), model, load_tokenizer(folder), PROMPTS["qwen2_5_vl"], pictures[0])
    ids, types = batch["input_ids"], inputs["mm_token_type_ids"]
    moved = np.roll(types, 1, axis=1)
    for bad, message in ((moved, "must be 1 exactly on the image tokens (id 120)"),
                         (types * 2, "marks video tokens (2)"), (types[:, 1:], "has shape")):
        with pytest.raises(ValueError, match=re.escape(message)):
            model.generate(ids, batch["attention_mask"], max_new_tokens=1, **{**inputs, "mm_token_type_ids": bad})
    gemma = jf.from_pretrained(joined["gemma3"][0])
    with pytest.raises(ValueError, match="mm_token_type_ids mark the image tokens of M-RoPE"):
        gemma(np.array([[2, 7]]), mm_token_type_ids=np.array([[0, 0]]))


@pytest.mark.parametrize("name, inputs", [("mllama_vision_model", "aspect_ratio_ids"),
                                          ("qwen2_5_vl_vision", "image_grid_thw")])
def test_towers_reading_more_than_pixels_are_refused_by_name(name, inputs, checkpoints, pictures, tmp_path, capsys):
    """Llama 3.2 Vision's tiles and Qwen2-VL's patches of any size need inputs the commands do not prepare yet."""
    folder, path = checkpoints(name), pictures[0][0]
    for argv in (["compare", folder, "--image", path],
                 ["viz", "attention", folder, "--image", path, "--out", tmp_path / "a.png"]):
        error = _refused(argv, capsys)
        assert inputs in error and "not those inputs yet" in error, error


def _reference_patch_attention(folder, name: str, pixels, ids, layer: int) -> np.ndarray:
    """transformers' output_attentions at ``layer`` [heads, 3, 3]: CLIP's class token over the patches, SigLIP's
    mean over queries, LLaVA's last (text) token over the image tokens."""
    with torch.no_grad():
        if name == "llava":
            model = transformers.LlavaForConditionalGeneration.from_pretrained(folder, attn_implementation="eager")
            attention = model.eval()(input_ids=torch.tensor(ids), pixel_values=torch.tensor(pixels),
                                     output_attentions=True).attentions[layer][0].numpy()
            return attention[:, -1, ids[0] == 96].reshape(-1, 3, 3)
        model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
        tower = model.vision_model if name == "clip" else model
        attention = tower(pixel_values=torch.tensor(pixels), output_attentions=True).attentions[layer][0].numpy()
    return (attention[:, 0, 1:] if name == "clip" else attention.mean(axis=1)).reshape(-1, 3, 3)


@pytest.mark.parametrize("name", ["clip", "siglip_vision_model", "llava"])
def test_viz_attention_over_an_image_draws_transformers_attention(name, clip_dir, siglip_tower_dir, llava_dir,
                                                                  pictures, tmp_path, capsys):
    """The PNG: the image (30x30 as the tower sees it) drawn 9x, one panel, or a 2x2 grid of every head; the values
    it is drawn from equal transformers' for that layer and head."""
    folder = {"clip": clip_dir, "siglip_vision_model": siglip_tower_dir, "llava": llava_dir}[name]
    path = pictures[0][0]
    text = ["--text", "USER: <image> w7 w8 ASSISTANT:"] if name == "llava" else []
    out = tmp_path / "one.png"
    assert "the image's patches, layer 1" in _run(["viz", "attention", folder, "--image", path, *text, "--layer", 1,
                                                   "--head", 2, "--out", out], capsys)
    from PIL import Image

    panel = image_panel_size(30, 30)
    assert panel == (270, 270) and Image.open(out).size == panel
    _run(["viz", "attention", folder, "--image", path, *text, "--out", tmp_path / "heads.png"], capsys)
    assert Image.open(tmp_path / "heads.png").size == (2 * panel[1], 2 * panel[0])  # four heads, the last layer
    model, _, inputs, ids = load_image_model(folder, path, text[1] if text else None)
    got, _ = patch_attention(model, inputs["pixel_values"], 1, ids)
    want = _reference_patch_attention(folder, name, inputs["pixel_values"], ids, 1)
    assert got.shape == want.shape == (4, 3, 3) and np.abs(got - want).max() <= TOLERANCE


def test_viz_attention_over_gemma3_image_tokens_draws_transformers_attention(joined, pictures, tmp_path, capsys):
    """Gemma 3's last text token over its image's pooled tokens (a 2 x 2 grid, each token a 2 x 2 window of 8-pixel
    patches), the image tokens seeing each other: transformers' output_attentions (eager) at the layer drawn."""
    folder = joined["gemma3"][0]
    path, text = pictures[0][0], "<bos> w7 <start_of_image> w8"
    out = tmp_path / "gemma3.png"
    assert "the last text token's attention over the image's patches, layer 1" in _run(
        ["viz", "attention", folder, "--image", path, "--text", text, "--layer", 1, "--out", out], capsys)
    from PIL import Image

    assert Image.open(out).size == (2 * image_panel_size(32, 32)[1], image_panel_size(32, 32)[0])  # two heads
    model, _, inputs, ids = load_image_model(folder, path, text)
    got, _ = patch_attention(model, inputs["pixel_values"], 1, ids)
    reference = transformers.Gemma3ForConditionalGeneration.from_pretrained(folder, attn_implementation="eager")
    with torch.no_grad():
        attention = reference.eval()(input_ids=torch.tensor(ids), pixel_values=torch.tensor(inputs["pixel_values"]),
                                     token_type_ids=torch.tensor((ids == 5).astype(np.int64)),
                                     output_attentions=True).attentions[1][0].numpy()
    want = attention[:, -1, ids[0] == 5].reshape(-1, 2, 2)
    assert got.shape == want.shape == (2, 2, 2) and np.abs(got - want).max() <= TOLERANCE


def test_viz_attention_refusals_name_what_to_give(llava_dir, clip_dir, joined, pictures, tmp_path, capsys):
    path, out = pictures[0][0], tmp_path / "a.png"
    assert "needs --text, a prompt holding one <image>" in _refused(
        ["viz", "attention", llava_dir, "--image", path, "--out", out], capsys)
    assert "text after its image placeholder" in _refused(
        ["viz", "attention", llava_dir, "--image", path, "--text", "w7 <image>", "--out", out], capsys)
    assert "--text is LLaVA's prompt" in _refused(
        ["viz", "attention", clip_dir, "--image", path, "--text", "a", "--out", out], capsys)
    assert "--layer=2; valid: 0 to 1" in _refused(
        ["viz", "attention", clip_dir, "--image", path, "--layer", 2, "--out", out], capsys)
    assert "reads --text" in _refused(["viz", "attention", clip_dir, "--out", out], capsys)
    for name, inputs in (("qwen2_5_vl", "image_grid_thw"), ("mllama", "aspect_ratio_ids")):  # their grids and tiles
        error = _refused(["viz", "attention", joined[name][0], "--image", path, "--text", PROMPTS[name][1], "--out",
                          out], capsys)
        assert inputs in error and "not those inputs yet" in error, error
    assert not out.exists()
