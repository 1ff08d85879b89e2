"""Image placeholders expanded as transformers' multimodal processors expand them: our image processor's outputs
and ``ImagePlaceholders.expand``, tokenized by the same tiny byte-level tokenizer, give the transformers
processor's ``input_ids`` (and its token type ids, and Llama 3.2 Vision's cross-attention mask) on PIL-drawn
images of odd sizes, for LLaVA, LLaVA-NeXT, Qwen2.5-VL, Gemma 3 and Llama 3.2 Vision."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxformer.vision import ImagePlaceholders, ImageProcessor
from jaxformer.vision.placeholders import PROCESSOR_IMAGE_KWARGS

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from test_image_processing import QWEN25_VL_7B, _drawing  # noqa: E402

SPECIALS = ["<pad>", "<bos>", "<image>", "<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>",
            "<start_of_image>", "<image_soft_token>", "<end_of_image>", "<|image|>", "<|begin_of_text|>",
            "<|python_tag|>"]


def _tokenizer(**extra_special_tokens):
    """A byte-level tokenizer without merges (one token a byte, so equal ids mean equal text) whose special
    tokens are every model's image tokens; ``extra_special_tokens`` name the ones the model's tokenizer names."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIALS + pre_tokenizers.ByteLevel.alphabet())}
    raw = Tokenizer(models.BPE(vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>",
                                                bos_token=extra_special_tokens.pop("bos_token", "<bos>"),
                                                extra_special_tokens=extra_special_tokens)
    return raw, fast


@pytest.fixture(scope="module")
def images():
    return [_drawing(333, 217), _drawing(200, 301, "RGBA", seed=1), _drawing(97, 161, "L", seed=2),
            _drawing(19, 33, seed=3), _drawing(640, 120, seed=4)]


def _ids(raw, texts: list[str]) -> list[list[int]]:
    return [encoding.ids for encoding in raw.encode_batch(texts)]


def _same_arrays(ours: dict, theirs, keys) -> None:
    for key in keys:
        want = theirs[key]
        want = np.stack(want) if isinstance(want, list) and len({np.shape(w) for w in want}) == 1 else want
        assert np.array_equal(np.asarray(ours[key]), np.asarray(want)), key


LLAVA_15 = {"processor_class": "LlavaProcessor", "image_token": "<image>", "patch_size": 14,
            "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}
LLAVA_15_IMAGES = {"crop_size": {"height": 336, "width": 336}, "do_center_crop": True, "do_convert_rgb": True,
                   "do_normalize": True, "do_rescale": True, "do_resize": True,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "CLIPImageProcessor",
                   "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3,
                   "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}}
LLAVA_16_IMAGES = {**LLAVA_15_IMAGES, "image_processor_type": "LlavaNextImageProcessor",
                   "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]}
TINY_NEXT_IMAGES = {**LLAVA_16_IMAGES, "size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32},
                    "image_grid_pinpoints": [[32, 64], [64, 32], [64, 64], [96, 32], [32, 96]]}

LLAVA_CASES = {
    "llava-1.5 (default, +1 CLS)": (LLAVA_15, LLAVA_15_IMAGES, "CLIPImageProcessorPil", "LlavaProcessor"),
    "llava full, patch 16, no extra": ({**LLAVA_15, "vision_feature_select_strategy": "full", "patch_size": 16,
                                        "num_additional_image_tokens": 0},
                                       {**LLAVA_15_IMAGES, "size": 100, "crop_size": {"height": 96, "width": 80}},
                                       "CLIPImageProcessorPil", "LlavaProcessor"),
    "llava pad to square": (LLAVA_15, {**LLAVA_15_IMAGES, "image_processor_type": "LlavaImageProcessor",
                                       "do_pad": True, "size": 64, "crop_size": 56},
                            "LlavaImageProcessorPil", "LlavaProcessor"),
    "llava-v1.6 anyres": ({**LLAVA_15, "processor_class": "LlavaNextProcessor"}, LLAVA_16_IMAGES,
                          "LlavaNextImageProcessorPil", "LlavaNextProcessor"),
    "llava-next tiny pinpoints, patch 8": ({**LLAVA_15, "processor_class": "LlavaNextProcessor", "patch_size": 8},
                                           TINY_NEXT_IMAGES, "LlavaNextImageProcessorPil", "LlavaNextProcessor"),
}


@pytest.mark.parametrize("name", list(LLAVA_CASES))
def test_llava_placeholders_give_the_processors_input_ids(name, images):
    config, image_config, image_class, processor_class = LLAVA_CASES[name]
    raw, fast = _tokenizer(image_token="<image>")
    kwargs = {k: v for k, v in config.items() if k != "processor_class"}
    reference = getattr(transformers, processor_class)(
        image_processor=getattr(transformers, image_class).from_dict(dict(image_config)), tokenizer=fast, **kwargs)
    texts = ["USER: <image>\nWhat is this? <image> and this? ASSISTANT:", "<image>A<image>", "<image>"]
    batch = images[:4] + images[4:5]
    expected = reference(images=batch, text=texts)
    processor = ImageProcessor.from_dict(image_config)
    placeholders = ImagePlaceholders.from_dict(config, processor.with_settings(do_pad=True) if "Next" in
                                               processor_class else processor)
    ours = placeholders.image_processor(batch)
    assert _ids(raw, placeholders.expand(texts, ours)) == expected["input_ids"]
    _same_arrays(ours, expected, ["pixel_values"] + (["image_sizes"] if "Next" in processor_class else []))


class _QwenWithoutVideo(transformers.Qwen2_5_VLProcessor):
    """Qwen2.5-VL's processor with no video processor: without torchvision transformers has no class to check
    one against (images take the same path either way)."""

    def check_argument_for_proper_class(self, name, argument):
        return None if name == "video_processor" else super().check_argument_for_proper_class(name, argument)


def test_qwen_placeholders_and_token_types(images):
    raw, fast = _tokenizer()
    config = {**QWEN25_VL_7B, "max_pixels": 28 * 28 * 40}
    reference = _QwenWithoutVideo(
        image_processor=transformers.Qwen2VLImageProcessorPil.from_dict(dict(config)), tokenizer=fast,
        video_processor=None)
    texts = ["<|vision_start|><|image_pad|><|vision_end|>Describe. <|vision_start|><|image_pad|><|vision_end|>",
             "x<|vision_start|><|image_pad|><|vision_end|>"]
    expected = reference(images=images[:3], text=texts)
    processor = ImageProcessor.from_dict(config)
    placeholders = ImagePlaceholders.from_dict({"processor_class": "Qwen2_5_VLProcessor"}, processor)
    ours = processor(images[:3])
    ids = _ids(raw, placeholders.expand(texts, ours))
    assert ids == expected["input_ids"]
    assert placeholders.token_type_ids(ids, fast.convert_tokens_to_ids("<|image_pad|>")) == expected[
        "mm_token_type_ids"]
    _same_arrays(ours, expected, ["pixel_values", "image_grid_thw"])


GEMMA3_IMAGES = {"do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True,
                 "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
                 "image_seq_length": 256, "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None,
                 "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None,
                 "processor_class": "Gemma3Processor", "resample": 2, "rescale_factor": 0.00392156862745098,
                 "size": {"height": 64, "width": 64}}  # google/gemma-3-4b-it's, size 896 made 64
GEMMA3_TOKENS = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}


@pytest.mark.parametrize("pan_and_scan", [False, True])
def test_gemma3_placeholders_and_token_types(pan_and_scan, images):
    raw, fast = _tokenizer(**GEMMA3_TOKENS)
    reference = transformers.Gemma3Processor(
        image_processor=transformers.Gemma3ImageProcessorPil.from_dict(dict(GEMMA3_IMAGES)), tokenizer=fast,
        image_seq_length=5)
    scan = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 32, "pan_and_scan_max_num_crops": 3,
            "pan_and_scan_min_ratio_to_activate": 1.2} if pan_and_scan else {}
    texts = ["<bos>Look: <start_of_image> then <start_of_image>", "<start_of_image>?"]
    batch = [images[0], images[4], images[1]]
    expected = reference(images=[batch[:2], batch[2:]], text=texts, **scan)
    processor = ImageProcessor.from_dict(GEMMA3_IMAGES).with_settings(**PROCESSOR_IMAGE_KWARGS["gemma3"] | scan)
    placeholders = ImagePlaceholders.from_dict({"image_seq_length": 5}, processor, model_type="gemma3",
                                               tokens=GEMMA3_TOKENS)
    ours = processor(batch)
    assert ours["num_crops"].tolist() == ([2, 3, 2] if pan_and_scan else [0, 0, 0])
    ids = _ids(raw, placeholders.expand(texts, ours))
    assert ids == expected["input_ids"]
    assert placeholders.token_type_ids(ids, fast.image_token_id) == expected["token_type_ids"]
    _same_arrays(ours, expected, ["pixel_values"])


MLLAMA_IMAGES = {"do_convert_rgb": True, "do_normalize": True, "do_pad": True, "do_rescale": True,
                 "do_resize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                 "image_processor_type": "MllamaImageProcessor", "image_std": [0.26862954, 0.26130258, 0.27577711],
                 "max_image_tiles": 4, "resample": 2, "rescale_factor": 0.00392156862745098,
                 "size": {"height": 56, "width": 56}}  # Llama-3.2-11B-Vision's, tile 560 made 56


def test_mllama_bos_and_cross_attention_mask(images):
    raw, fast = _tokenizer(bos_token="<|begin_of_text|>", image_token="<|image|>")
    reference = transformers.MllamaProcessor(
        image_processor=transformers.MllamaImageProcessorPil.from_dict(dict(MLLAMA_IMAGES)), tokenizer=fast)
    texts = ["<|image|><|image|>Compare them", "<|image|>One <|image|>two <|image|>three", "no bos <|image|>"]
    nested = [images[:2], images[2:4] + images[4:5], [images[0]]]
    expected = reference(images=nested, text=texts)
    processor = ImageProcessor.from_dict(MLLAMA_IMAGES)
    placeholders = ImagePlaceholders.from_dict({}, processor, model_type="mllama",
                                               tokens={"bos_token": "<|begin_of_text|>"})
    ours = processor(nested)
    ids = _ids(raw, placeholders.expand(texts, ours))
    assert ids == expected["input_ids"]
    mask = placeholders.cross_attention_mask(ids, ours["num_tiles"], fast.convert_tokens_to_ids("<|image|>"))
    assert mask.dtype == np.int64 and np.array_equal(mask, expected["cross_attention_mask"])
    _same_arrays(ours, expected, ["pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"])


def test_from_pretrained_reads_the_processor_and_tokenizer_files(tmp_path, images):
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_seq_length": 7,
                                                                "processor_class": "Gemma3Processor"}))
    scan = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 32, "pan_and_scan_max_num_crops": 3,
            "pan_and_scan_min_ratio_to_activate": 1.2}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**GEMMA3_IMAGES, **scan}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"extra_special_tokens": GEMMA3_TOKENS}))
    placeholders = ImagePlaceholders.from_pretrained(tmp_path)
    # the transformers processor passes do_pan_and_scan=False to its image processor on every call
    assert placeholders.image_processor.settings["do_pan_and_scan"] is False
    [text] = placeholders.expand("<start_of_image>", placeholders.image_processor(images[4]))
    assert text == "\n\n<start_of_image>" + "<image_soft_token>" * 7 + "<end_of_image>\n\n"


@pytest.mark.parametrize("config, message", [
    ({**LLAVA_15, "patch_size": None}, "patch_size=None"),
    ({**LLAVA_15, "vision_feature_select_strategy": "cls"}, "vision_feature_select_strategy='cls'"),
    ({**LLAVA_15, "num_additional_image_tokens": -1}, "num_additional_image_tokens=-1"),
    ({"processor_class": "Gemma3Processor", "image_seq_length": 0}, "image_seq_length=0"),
    ({"processor_class": "PaliGemmaProcessor"}, "processor_class='PaliGemmaProcessor'"),
    ({"processor_class": "Qwen2VLProcessor"}, "Qwen2VLImageProcessor"),
])
def test_bad_processor_settings_are_refused_by_name(config, message):
    kind = "Gemma3ImageProcessor" if "Gemma3" in str(config) else "CLIPImageProcessor"
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ImagePlaceholders.from_dict(config, ImageProcessor.from_dict({"image_processor_type": kind}))


def test_a_count_mismatch_is_refused(images):
    placeholders = ImagePlaceholders.from_dict(LLAVA_15, ImageProcessor.from_dict(LLAVA_15_IMAGES))
    with pytest.raises(ValueError, match="2 <image> placeholders for 1 images"):
        placeholders.expand("<image><image>", placeholders.image_processor(images[0]))


def _saved_processors():
    """transformers processors as their save_pretrained writes them (processor_config.json with the image
    processor nested, tokenizer files), with prompts for them."""
    gemma_raw, gemma = _tokenizer(**GEMMA3_TOKENS)
    llava_raw, llava = _tokenizer(image_token="<image>")
    mllama_raw, mllama = _tokenizer(bos_token="<|begin_of_text|>", image_token="<|image|>")
    return {
        "llava-1.5": (llava_raw, transformers.LlavaProcessor(
            image_processor=transformers.CLIPImageProcessorPil.from_dict(dict(LLAVA_15_IMAGES)), tokenizer=llava,
            **{k: v for k, v in LLAVA_15.items() if k != "processor_class"}), ["USER: <image>\nWhat? <image>"]),
        "llava-next": (llava_raw, transformers.LlavaNextProcessor(
            image_processor=transformers.LlavaNextImageProcessorPil.from_dict({**TINY_NEXT_IMAGES, "do_pad": False}),
            tokenizer=llava, **{k: v for k, v in LLAVA_15.items() if k != "processor_class"}), ["<image>A<image>"]),
        "gemma3": (gemma_raw, transformers.Gemma3Processor(
            image_processor=transformers.Gemma3ImageProcessorPil.from_dict(dict(GEMMA3_IMAGES)), tokenizer=gemma,
            image_seq_length=5), ["<start_of_image><start_of_image> two"]),
        "mllama": (mllama_raw, transformers.MllamaProcessor(
            image_processor=transformers.MllamaImageProcessorPil.from_dict(dict(MLLAMA_IMAGES)), tokenizer=mllama),
            ["<|image|>x <|image|>"]),
    }


@pytest.mark.parametrize("name", ["llava-1.5", "llava-next", "gemma3", "mllama"])
def test_a_folder_saved_by_transformers_reads_as_its_processor(name, tmp_path, images):
    raw, processor, texts = _saved_processors()[name]
    processor.save_pretrained(tmp_path)
    reference = transformers.AutoProcessor.from_pretrained(tmp_path)
    expected = reference(images=[images[0], images[4]], text=texts)
    placeholders = ImagePlaceholders.from_pretrained(tmp_path)
    ours = placeholders.image_processor([images[0], images[4]])
    assert _ids(raw, placeholders.expand(texts, ours)) == expected["input_ids"]
    _same_arrays(ours, expected, ["pixel_values"])
