"""jaxformer.vision's image processors against transformers' (their PIL backend: torchvision is not installed,
and AutoImageProcessor falls back to the same classes): pixel_values and every other output (image_grid_thw,
image_sizes, aspect ratio ids and masks, num_tiles, num_crops, attention masks, spatial shapes) on PIL-drawn
images of odd sizes and modes, under the published preprocessor configs and variants of them; the file written
back byte for byte; bad settings and images refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image, ImageDraw

from jaxformer.vision import ImageProcessor

transformers = pytest.importorskip("transformers")

# The published preprocessor_config.json files (as on the Hub, key for key).
CLIP_B32 = {  # openai/clip-vit-base-patch32
    "crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
    "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "size": 224}
SIGLIP_B16_224 = {  # google/siglip-base-patch16-224
    "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "SiglipImageProcessor", "image_std": [0.5, 0.5, 0.5],
    "processor_class": "SiglipProcessor", "resample": 3, "rescale_factor": 0.00392156862745098,
    "size": {"height": 224, "width": 224}}
VIT_B16_224 = {  # google/vit-base-patch16-224
    "do_normalize": True, "do_resize": True, "feature_extractor_type": "ViTFeatureExtractor",
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 2, "size": 224}
QWEN25_VL_7B = {  # Qwen/Qwen2.5-VL-7B-Instruct
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}
QWEN_SAVED_BY_TRANSFORMERS_4 = {  # a Qwen2.5-VL fine-tune's file: min/max_pixels beside the size dict
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "Qwen2VLImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711], "max_pixels": 50176, "merge_size": 2, "min_pixels": 3136,
    "patch_size": 14, "processor_class": "Qwen2_5_VLProcessor", "resample": 3,
    "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 12845056, "shortest_edge": 3136},
    "temporal_patch_size": 2}
_CLIP_NORM = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
LLAVA_16_MISTRAL = {  # llava-hf/llava-v1.6-mistral-7b-hf (aspect_ratio_setting: a key transformers never reads)
    "aspect_ratio_setting": "anyres", "crop_size": {"height": 336, "width": 336}, "do_center_crop": True,
    "do_convert_rgb": True, "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True,
    "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]], **_CLIP_NORM,
    "image_processor_type": "LlavaNextImageProcessor", "processor_class": "LlavaNextProcessor", "resample": 3,
    "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}}
LLAMA32_11B_VISION = {  # meta-llama/Llama-3.2-11B-Vision-Instruct
    "do_convert_rgb": True, "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True,
    **_CLIP_NORM, "image_processor_type": "MllamaImageProcessor", "max_image_tiles": 4,
    "processor_class": "MllamaProcessor", "resample": 2, "rescale_factor": 0.00392156862745098,
    "size": {"height": 560, "width": 560}}
GEMMA3_4B = {  # google/gemma-3-4b-it
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None, "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None, "processor_class": "Gemma3Processor", "resample": 2,
    "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896}}
SIGLIP2_NAFLEX = {  # google/siglip2-base-patch16-naflex
    "do_convert_rgb": None, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Siglip2ImageProcessor", "image_std": [0.5, 0.5, 0.5],
    "max_num_patches": 256, "patch_size": 16, "processor_class": "Siglip2Processor", "resample": 2,
    "rescale_factor": 0.00392156862745098}
PUBLISHED = {"clip": CLIP_B32, "siglip": SIGLIP_B16_224, "vit": VIT_B16_224, "qwen2_5_vl": QWEN25_VL_7B,
             "llava_next": LLAVA_16_MISTRAL, "mllama": LLAMA32_11B_VISION, "gemma3": GEMMA3_4B,
             "siglip2": SIGLIP2_NAFLEX}


def _reference(config: dict):
    """transformers' processor for ``config``: the PIL-backend class its image_processor_type names."""
    ours = ImageProcessor.from_dict(config)
    return getattr(transformers, ours.kind + "Pil").from_dict(dict(config)), ours


def _drawing(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """A photograph-like test card: a colour gradient with noise, shapes, a line of text."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([255 * x / max(width - 1, 1), 255 * y / max(height - 1, 1), 128 + 100 * np.sin(x / 7 + y / 11)],
                   -1)
    rgb = np.clip(rgb + rng.normal(0, 12, rgb.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(rgb)
    draw = ImageDraw.Draw(image)
    draw.ellipse((width * 0.1, height * 0.2, width * 0.5, height * 0.7), fill=(220, 40, 40), outline=(0, 0, 0))
    draw.rectangle((width * 0.55, height * 0.1, width * 0.9, height * 0.45), fill=(30, 160, 60))
    draw.text((4, height - 14), "jaxformer 1e-5", fill=(255, 255, 255))
    if mode == "RGBA":
        alpha = np.clip(255 * (0.2 + 0.8 * x / max(width - 1, 1)) * (y % 17 > 3), 0, 255).astype(np.uint8)
        image.putalpha(Image.fromarray(alpha))
    return image.convert(mode) if mode != "RGBA" else image


@pytest.fixture(scope="module")
def images() -> dict[str, object]:
    palette = _drawing(61, 45, "P", seed=4)
    palette.info["transparency"] = 0  # a GIF-style transparent palette entry: composited onto white
    return {
        "rgb 333x217": _drawing(333, 217),
        "rgba 200x301": _drawing(200, 301, "RGBA", seed=1),
        "gray 97x161": _drawing(97, 161, "L", seed=2),
        "tiny 19x33": _drawing(19, 33, seed=3),
        "palette 61x45": palette,
        "uint8 HWC 120x250": np.array(_drawing(250, 120, seed=5)),
        "float CHW 64x48": np.moveaxis(np.array(_drawing(48, 64, seed=6)), -1, 0).astype(np.float32) / 255,
        "gray HW1 50x70": np.array(_drawing(70, 50, "L", seed=7))[..., None],
        "rgba HWC 40x90": np.array(_drawing(90, 40, "RGBA", seed=8)),
    }


RGB_ONLY = ("rgb 333x217", "tiny 19x33", "uint8 HWC 120x250", "float CHW 64x48")


def _check(config: dict, batch: list) -> None:
    reference, ours = _reference(config)
    expected, got = reference(batch), ours(batch)  # transformers: lists of arrays (sizes may differ); ours stacks
    assert set(got) == set(expected)
    for key in expected:
        if key == "num_tiles":  # Llama 3.2 Vision's tiles per image, per prompt: nested lists of ints
            assert got[key] == expected[key]
            continue
        pairs = zip(expected[key], got[key], strict=True) if isinstance(expected[key], list) else [
            (expected[key], got[key])]
        for want, have in pairs:
            want = np.asarray(want)
            assert have.shape == want.shape and have.dtype == want.dtype, (key, have.shape, want.shape)
            assert np.abs(have.astype(np.float64) - want).max(initial=0) == 0, key  # equal bit for bit


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_configs_give_transformers_pixel_values(name, images):
    # ViT's processor does not convert to RGB, nor do the published SigLIP2 and Gemma 3 files (do_convert_rgb
    # null; their multimodal processors pass true): transformers fails on gray and RGBA images, as we do.
    # Llama 3.2 Vision's 560-pixel tiles: RGB only to keep it quick (its variant takes every mode).
    names = RGB_ONLY if name in ("vit", "siglip2", "gemma3", "mllama") else list(images)
    _check(PUBLISHED[name], [images[n] for n in names])
    if name == "qwen2_5_vl":  # one image at a time too: each grid, and the patch rows it owns
        for n in ("rgb 333x217", "tiny 19x33"):
            _check(PUBLISHED[name], images[n])


VARIANTS = {
    "clip no resize, crop pads": {**CLIP_B32, "do_resize": False, "crop_size": {"height": 40, "width": 24}},
    "clip shortest+longest edge, lanczos": {**CLIP_B32, "size": {"shortest_edge": 64, "longest_edge": 80},
                                            "resample": 1, "do_center_crop": False},
    "siglip max h/w, box, padded": {**SIGLIP_B16_224, "size": {"max_height": 50, "max_width": 60}, "resample": 4,
                                    "do_pad": True, "pad_size": {"height": 64, "width": 64}},
    "siglip [h, w], hamming, no rescale": {**SIGLIP_B16_224, "size": [30, 41], "resample": 5, "do_rescale": False},
    "vit nearest, scalar mean, no rgb": {**VIT_B16_224, "resample": 0, "image_mean": 0.25, "image_std": 0.5,
                                         "size": 32},
    "qwen small max_pixels, merge 1, t 1": {**QWEN25_VL_7B, "max_pixels": 28 * 28 * 6, "merge_size": 1,
                                            "temporal_patch_size": 1, "patch_size": 7, "resample": 2},
    "qwen saved by transformers 4": QWEN_SAVED_BY_TRANSFORMERS_4,
    "qwen size dict, no normalize": {"image_processor_type": "Qwen2VLImageProcessor", "do_normalize": False,
                                     "size": {"shortest_edge": 28 * 28 * 10, "longest_edge": 28 * 28 * 20}},
    "llava pad to square": {**CLIP_B32, "image_processor_type": "LlavaImageProcessor", "do_pad": True, "size": 64,
                            "crop_size": 56},
    "llava-next tiny pinpoints, ragged tiles, no batch pad": {
        **LLAVA_16_MISTRAL, "size": {"height": 30, "width": 30}, "crop_size": {"height": 28, "width": 28},
        "image_grid_pinpoints": [[60, 90], [90, 60], [30, 30], [56, 28]], "do_pad": False},
    "mllama 6 tiles of 40, bicubic": {**LLAMA32_11B_VISION, "size": {"height": 40, "width": 40},
                                      "max_image_tiles": 6, "resample": 3},
    "gemma3 pan and scan": {**GEMMA3_4B, "size": {"height": 64, "width": 64}, "do_convert_rgb": True,
                            "do_pan_and_scan": True, "pan_and_scan_min_crop_size": 24,
                            "pan_and_scan_max_num_crops": 3, "pan_and_scan_min_ratio_to_activate": 1.2},
    "siglip2 patch 8, 50 patches, rgb, bicubic": {**SIGLIP2_NAFLEX, "patch_size": 8, "max_num_patches": 50,
                                                  "do_convert_rgb": True, "resample": 3},
}
# LLaVA's square padding fills with int(mean * 255): transformers cannot resize a float image so filled.
NO_FLOAT = ("llava pad to square",)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_config_variants_give_transformers_pixel_values(name, images):
    picks = ("rgb 333x217", "tiny 19x33", "float CHW 64x48") if "vit" in name else (
        "rgba 200x301", "gray 97x161", "tiny 19x33", "float CHW 64x48")
    _check(VARIANTS[name], [images[n] for n in picks if not (name in NO_FLOAT and n.startswith("float"))])


def test_mllama_takes_one_list_of_images_per_prompt(images):
    reference, ours = _reference(VARIANTS["mllama 6 tiles of 40, bicubic"])
    nested = [[images["rgb 333x217"]], [images["tiny 19x33"], images["rgba 200x301"], images["gray 97x161"]]]
    expected, got = reference(nested), ours(nested)
    assert got["num_tiles"] == expected["num_tiles"]
    for key in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"):
        assert np.array_equal(got[key], expected[key]) and got[key].dtype == expected[key].dtype, key


def test_qwen_patches_keep_merge_blocks_contiguous():
    """Rows 0..3 are the first 2x2 merge block (patch rows 0-1, columns 0-1), read row-major; each row is
    (C, T, 14, 14) with both temporal slots the same image."""
    proc = ImageProcessor.from_dict({**QWEN25_VL_7B, "do_normalize": False, "do_rescale": False})
    image = np.arange(56 * 84 * 3, dtype=np.uint8).reshape(56, 84, 3)  # 56x84: a multiple of 28, kept as is
    out = proc(Image.fromarray(image))
    assert out["image_grid_thw"].tolist() == [[1, 4, 6]]
    rows = out["pixel_values"].reshape(-1, 3, 2, 14, 14)
    assert np.array_equal(rows[:, :, 0], rows[:, :, 1])
    chw = np.moveaxis(image, -1, 0).astype(np.float32)
    for row, (ph, pw) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3)]):
        assert np.array_equal(rows[row, :, 0], chw[:, ph * 14:(ph + 1) * 14, pw * 14:(pw + 1) * 14]), row
    assert proc.image_grid(56, 84) == (1, 4, 6)


@pytest.mark.parametrize("name", list(PUBLISHED) + ["qwen saved by transformers 4", "siglip max h/w, box, padded",
                                                    "llava pad to square", "gemma3 pan and scan"])
def test_preprocessor_config_round_trip(name, tmp_path):
    config = {**PUBLISHED, **VARIANTS}[name]
    reference, ours = _reference(config)
    reference.save_pretrained(tmp_path / "theirs")
    written = ours.save_pretrained(tmp_path / "ours")
    assert written.read_bytes() == (tmp_path / "theirs" / "preprocessor_config.json").read_bytes()
    again = ImageProcessor.from_pretrained(tmp_path / "ours")
    assert again.to_json_string() == ours.to_json_string()


def test_keys_transformers_never_reads_load_and_are_written_back(tmp_path, images):
    config = {**CLIP_B32, "device": "cpu", "data_format": "channels_last", "return_tensors": "np",
              "image_seq_length": 50, "crop_pct": 0.9, "disable_grouping": True}
    reference, ours = _reference(config)
    assert json.loads(ours.to_json_string()) == json.loads(reference.to_json_string())
    _check(config, [images["rgb 333x217"]])
    qwen = {**QWEN25_VL_7B, "do_center_crop": True, "crop_size": 8, "do_pad": True}  # Qwen2-VL reads neither
    _check(qwen, [images["rgb 333x217"]])


def test_folders_are_read_as_transformers_reads_them(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": 224, "resample": 3}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "siglip"}))
    proc = ImageProcessor.from_pretrained(tmp_path)  # no class named: config.json's model_type names it
    assert proc.kind == "SiglipImageProcessor" and proc.settings["size"] == {"shortest_edge": 224}
    # a transformers-5 processor folder: processor_config.json's nested image_processor comes first
    nested = {"image_processor": {**SIGLIP_B16_224, "size": {"height": 64, "width": 48}}, "processor_class": "X"}
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    theirs = transformers.AutoImageProcessor.from_pretrained(str(tmp_path), backend="pil")
    assert ImageProcessor.from_pretrained(tmp_path).to_dict() == json.loads(theirs.to_json_string())


@pytest.mark.parametrize("config, message", [
    ({**CLIP_B32, "resample": 7}, "resample=7"),
    ({**CLIP_B32, "resample": "bicubic"}, "resample='bicubic'"),
    ({**SIGLIP_B16_224, "size": {"height": -224, "width": 224}}, "size="),
    ({**CLIP_B32, "crop_size": {"height": 224}}, "crop_size="),
    ({**SIGLIP_B16_224, "image_std": [0.5, 0.0, 0.5]}, "image_std="),
    ({**CLIP_B32, "use_square_size": True}, "use_square_size"),
    ({**CLIP_B32, "image_processor_type": "ConvNextImageProcessor"}, "image_processor_type='ConvNextImageProcessor'"),
    ({**QWEN25_VL_7B, "min_pixels": 10 ** 9}, "exceed max pixels"),
    ({**QWEN25_VL_7B, "merge_size": 0}, "merge_size=0"),
    ({**QWEN25_VL_7B, "min_pixels": None, "max_pixels": None, "size": {"min_pixels": 1, "max_pixels": 9}},
     "size="),
    ({**CLIP_B32, "input_data_format": "HWC"}, "input_data_format="),
    ({**LLAVA_16_MISTRAL, "image_grid_pinpoints": [[336]]}, "image_grid_pinpoints="),
    ({**LLAVA_16_MISTRAL, "size": {"longest_edge": 336}}, "size="),
    ({**LLAMA32_11B_VISION, "size": {"height": 560, "width": 280}}, "size="),
    ({**LLAMA32_11B_VISION, "do_pad": False}, "do_pad=False"),
    ({**LLAMA32_11B_VISION, "max_image_tiles": 0}, "max_image_tiles=0"),
    ({**GEMMA3_4B, "do_pan_and_scan": True}, "do_pan_and_scan needs"),
    ({**SIGLIP2_NAFLEX, "max_num_patches": 0}, "max_num_patches=0"),
    ({**CLIP_B32, "image_processor_type": "LlavaImageProcessor", "do_pad": True, "image_mean": 0.5}, "do_pad"),
])
def test_bad_settings_are_refused_by_name(config, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        ImageProcessor.from_dict(config)


@pytest.mark.parametrize("image, message", [
    (np.zeros((32, 32, 2), np.uint8), "1 \\(gray\\), 3 \\(RGB\\) or 4 \\(RGBA\\)"),
    (np.zeros((2, 5, 32, 32, 3), np.uint8), "shape"),
    (np.full((16, 16, 3), 300, np.int32), "\\[0, 255\\]"),
    (np.full((16, 16, 3), 1.5, np.float32), "\\[0, 1\\]"),
    ("photo.jpg", "PIL image or a numpy array"),
])
def test_bad_images_are_refused_by_name(image, message):
    with pytest.raises(ValueError, match=message):
        ImageProcessor.from_dict(CLIP_B32)(image)


def test_a_gray_image_under_vit_fails_as_in_transformers(images):
    reference, ours = _reference(VIT_B16_224)
    with pytest.raises(ValueError):
        reference(images["gray 97x161"])
    with pytest.raises(ValueError, match="do_convert_rgb"):
        ours(images["gray 97x161"])


def test_a_grayscale_array_may_drop_its_channel_axis(images):
    """(H, W) arrays, which transformers refuses, read as (H, W, 1)."""
    gray = images["gray HW1 50x70"]
    proc = ImageProcessor.from_dict(SIGLIP_B16_224)
    assert np.array_equal(proc(gray[..., 0])["pixel_values"], proc(gray)["pixel_values"])


def test_tiling_size_arithmetic_equals_transformers_on_many_sizes():
    """The sizes behind every tiling pipeline, over 200 random image sizes (no pixels): LLaVA-NeXT's best
    pinpoint, resized size and placeholder count, Llama 3.2 Vision's canvas and fitted size, SigLIP2's NaFlex
    size, Gemma 3's pan-and-scan crop count."""
    from transformers.image_processing_utils import select_best_resolution
    from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor
    from transformers.models.mllama import image_processing_pil_mllama as mllama
    from transformers.models.siglip2.image_processing_pil_siglip2 import get_image_size_for_max_num_patches

    from jaxformer.vision import tiling

    pinpoints = LLAVA_16_MISTRAL["image_grid_pinpoints"]
    counter = LlavaNextProcessor.__new__(LlavaNextProcessor)  # _get_number_of_features reads only these two
    counter.image_processor, counter.patch_size = transformers.LlavaNextImageProcessorPil(), 14
    counter.num_additional_image_tokens = 0
    gemma = transformers.Gemma3ImageProcessorPil()
    rng = np.random.default_rng(0)
    for height, width in rng.integers(1, 2000, size=(200, 2)).tolist():
        best = select_best_resolution((height, width), pinpoints)
        assert tiling.best_resolution(height, width, pinpoints) == tuple(best)
        assert tiling.anyres_features(height, width, 336, 336, 14, pinpoints) == counter._get_number_of_features(
            height, width, 336, 336)
        rows, cols = tiling.tiled_canvas(height, width, 4, 56)
        canvas = mllama.get_optimal_tiled_canvas(height, width, 4, 56)
        assert (rows * 56, cols * 56) == tuple(int(v) for v in canvas)
        assert tiling.fit_to_canvas(height, width, *canvas, 56) == tuple(
            int(v) for v in mllama.get_image_size_fit_to_canvas(height, width, *canvas, 56))
        assert tiling.naflex_size(height, width, 16, 256) == get_image_size_for_max_num_patches(height, width, 16, 256)
        pixels = np.empty((1, height, width), dtype=np.uint8)  # crops are views: same start and shape, same crop
        crops = [pixels[:, top:top + h, left:left + w]
                 for top, left, h, w in tiling.pan_and_scan_boxes(height, width, 32, 4, 1.2)]
        assert [(c.shape, c.__array_interface__["data"][0]) for c in crops] == [
            (c.shape, c.__array_interface__["data"][0]) for c in gemma.pan_and_scan(pixels, 32, 4, 1.2)]


def test_the_vision_package_imports_nothing_else_of_jaxformer():
    """jaxformer.vision stands alone on numpy and PIL: a data pipeline may use it without the model code."""
    import ast
    from pathlib import Path

    import jaxformer.vision

    for file in Path(jaxformer.vision.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert all(n == "jaxformer.vision" or n.startswith("jaxformer.vision.") or not n.startswith("jaxformer")
                       for n in names), (file.name, names)
