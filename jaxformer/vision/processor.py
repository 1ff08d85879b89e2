"""Image processors read from ``preprocessor_config.json``, equal to transformers' PIL-backend processors.

    proc = ImageProcessor.from_pretrained("path/to/clip-vit-base-patch32")   # or ImageProcessor.from_dict({...})
    batch = proc([pil_image, array])        # {"pixel_values": float32 [N, 3, 224, 224]}
    proc.save_pretrained("out_dir")         # the preprocessor_config.json transformers would write

The pipeline follows ``image_processor_type``:
  - classic (ViTImageProcessor, CLIPImageProcessor, SiglipImageProcessor, LlavaImageProcessor): convert to RGB,
    resize, center crop, rescale, normalize, pad (LLaVA's ``do_pad`` pads to a square in the mean colour before
    resizing instead); ``pixel_values`` [N, C, H, W];
  - dynamic resolution (Qwen2VLImageProcessor, which Qwen2-VL and Qwen2.5-VL files name): smart resize to a
    multiple of patch_size * merge_size within [min_pixels, max_pixels], rescale, normalize, then the flattened
    patches of every image concatenated, ``pixel_values`` [patches, C * temporal_patch_size * patch_size**2],
    and ``image_grid_thw`` [N, 3] (1, grid_h, grid_w) per image;
  - LLaVA-NeXT ``anyres`` (LlavaNextImageProcessor): the base image plus the tiles of the image resized into the
    best of ``image_grid_pinpoints`` and padded to it, ``pixel_values`` [N, tiles, C, H, W] and ``image_sizes``;
  - Llama 3.2 Vision (MllamaImageProcessor): each image resized into the best canvas of up to ``max_image_tiles``
    tiles, padded, split, ``pixel_values`` [samples, images, max_image_tiles, C, H, W], ``aspect_ratio_ids``,
    ``aspect_ratio_mask``, ``num_tiles``;
  - Gemma 3 (Gemma3ImageProcessor): the classic resize with optional pan-and-scan crops after each image,
    ``num_crops``;
  - SigLIP2 NaFlex (Siglip2ImageProcessor): resized to at most ``max_num_patches`` patches keeping the aspect
    ratio, ``pixel_values`` [N, max_num_patches, patch_size**2 * C], ``pixel_attention_mask``, ``spatial_shapes``.

Reading a file follows transformers' constructor: the class's defaults, overridden by the file's keys (legacy
forms included: an int ``size``, ``crop_size: 224``, Qwen's top-level ``min_pixels`` / ``max_pixels``,
``feature_extractor_type`` instead of ``image_processor_type``). A key the pipeline reads is honoured; a key
transformers keeps but never reads (``device``, ``data_format``, an unknown key, Qwen's ``do_center_crop``) loads
at any value and is written back; a value transformers would misread or fail on later is refused here, naming the
key. Writing gives transformers' own ``to_dict``: the resolved settings, sorted, two-space indented.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from jaxformer.vision import tiling, transforms

CONFIG_NAME = "preprocessor_config.json"
PROCESSOR_CONFIG_NAME = "processor_config.json"  # a whole processor's settings, the image processor's nested
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_STANDARD_MEAN = (0.5, 0.5, 0.5)
IMAGENET_STANDARD_STD = (0.5, 0.5, 0.5)
DEFAULT_RESAMPLE = 2  # bilinear: transformers' filter when resample is null

# Every image processor's settings (transformers' ImagesKwargs); Qwen2-VL adds DYNAMIC_KEYS.
COMMON_KEYS = ("do_convert_rgb", "do_resize", "size", "default_to_square", "crop_size", "resample", "do_rescale",
               "rescale_factor", "do_normalize", "image_mean", "image_std", "do_pad", "pad_size", "do_center_crop",
               "data_format", "input_data_format", "device", "return_tensors", "disable_grouping",
               "image_seq_length")
DYNAMIC_KEYS = ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size")
PAN_AND_SCAN_KEYS = ("pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops", "pan_and_scan_min_ratio_to_activate")
# The settings each class adds to COMMON_KEYS.
CLASS_KEYS = {"Qwen2VLImageProcessor": DYNAMIC_KEYS, "LlavaNextImageProcessor": ("image_grid_pinpoints",),
              "MllamaImageProcessor": ("max_image_tiles",), "Gemma3ImageProcessor": ("do_pan_and_scan",
                                                                                      *PAN_AND_SCAN_KEYS),
              "Siglip2ImageProcessor": ("patch_size", "max_num_patches")}
SIGLIP2 = "Siglip2ImageProcessor"
CENTER_CROPPING = ("ViTImageProcessor", "CLIPImageProcessor", "SiglipImageProcessor", "LlavaImageProcessor",
                   "LlavaNextImageProcessor")  # the classes whose pipeline reads do_center_crop
BATCH_PADDING = ("ViTImageProcessor", "CLIPImageProcessor", "SiglipImageProcessor")  # do_pad: pad to pad_size
# Keys transformers' constructor drops: they name the class, which `kind` already holds.
DROPPED_KEYS = ("feature_extractor_type", "processor_class", "image_processor_type", "_valid_processor_keys")

_BASE = {"do_resize": True, "do_rescale": True, "do_normalize": True, "rescale_factor": 1 / 255}
# Each class's defaults, as transformers' class attributes set them (an absent key defaults to None).
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "ViTImageProcessor": {**_BASE, "resample": 2, "size": {"height": 224, "width": 224},
                          "image_mean": IMAGENET_STANDARD_MEAN, "image_std": IMAGENET_STANDARD_STD},
    "CLIPImageProcessor": {**_BASE, "resample": 3, "size": {"shortest_edge": 224},
                           "crop_size": {"height": 224, "width": 224}, "do_center_crop": True,
                           "do_convert_rgb": True, "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD},
    "SiglipImageProcessor": {**_BASE, "resample": 3, "size": {"height": 224, "width": 224}, "do_convert_rgb": True,
                             "image_mean": IMAGENET_STANDARD_MEAN, "image_std": IMAGENET_STANDARD_STD},
    "Qwen2VLImageProcessor": {**_BASE, "resample": 3, "size": {"shortest_edge": 56 * 56,
                                                               "longest_edge": 28 * 28 * 1280},
                              "do_convert_rgb": True, "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD,
                              "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2},
    "LlavaImageProcessor": {**_BASE, "resample": 3, "size": {"shortest_edge": 224},
                            "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_pad": False,
                            "do_convert_rgb": True, "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD},
    "LlavaNextImageProcessor": {**_BASE, "resample": 3, "size": {"shortest_edge": 224},
                                "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_pad": True,
                                "do_convert_rgb": True, "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD,
                                "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336],
                                                         [336, 1008]]},
    "MllamaImageProcessor": {**_BASE, "resample": 2, "size": {"height": 224, "width": 224}, "do_convert_rgb": True,
                             "do_pad": True, "max_image_tiles": 4, "image_mean": IMAGENET_STANDARD_MEAN,
                             "image_std": IMAGENET_STANDARD_STD},
    "Gemma3ImageProcessor": {**_BASE, "resample": 2, "size": {"height": 224, "width": 224}, "do_convert_rgb": True,
                             "image_mean": IMAGENET_STANDARD_MEAN, "image_std": IMAGENET_STANDARD_STD},
    "Siglip2ImageProcessor": {**_BASE, "resample": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                              "patch_size": 16, "max_num_patches": 256},
}
# How an int `size` reads when the file does not say (transformers' class attribute default_to_square).
_SQUARE_BY_DEFAULT = {"ViTImageProcessor": True, "CLIPImageProcessor": False, "SiglipImageProcessor": False,
                      "Qwen2VLImageProcessor": False, "LlavaImageProcessor": False, "LlavaNextImageProcessor": False,
                      "MllamaImageProcessor": True, "Gemma3ImageProcessor": True, "Siglip2ImageProcessor": True}
# model_type (config.json) -> processor, for a preprocessor_config.json that names no class.
MODEL_TYPES = {"vit": "ViTImageProcessor", "clip": "CLIPImageProcessor", "siglip": "SiglipImageProcessor",
               "qwen2_vl": "Qwen2VLImageProcessor", "qwen2_5_vl": "Qwen2VLImageProcessor",
               "llava": "LlavaImageProcessor", "llava_next": "LlavaNextImageProcessor",
               "mllama": "MllamaImageProcessor", "gemma3": "Gemma3ImageProcessor", "siglip2": "Siglip2ImageProcessor"}
_SIZE_KEY_SETS = ({"height", "width"}, {"shortest_edge"}, {"shortest_edge", "longest_edge"}, {"longest_edge"},
                  {"max_height", "max_width"}, {"min_pixels", "max_pixels"})


def _size_dict(name: str, value, default_to_square: bool) -> dict[str, int] | None:
    """transformers' ``get_size_dict``: an int, a (height, width) pair or a dict, as a dict of positive ints."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a size")
    if isinstance(value, int):
        value = {"height": value, "width": value} if default_to_square else {"shortest_edge": value}
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        value = {"height": value[0], "width": value[1]}
    if not isinstance(value, dict) or set(value) not in _SIZE_KEY_SETS:
        raise ValueError(f"{name}={value!r} is not a size: an int, [height, width] or a dict with the keys "
                         f"{' | '.join(sorted('+'.join(sorted(s)) for s in _SIZE_KEY_SETS))}")
    bad = {k: v for k, v in value.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0}
    if bad:
        raise ValueError(f"{name}={value!r}: every side or pixel count must be a positive int, got {bad}")
    return dict(value)


def _channel_values(name: str, value) -> tuple[float, ...] | float | None:
    if value is None:
        return None
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise ValueError(f"{name}={value!r} must be a number or a list of numbers (one per channel)")
    if name == "image_std" and any(v == 0 for v in values):
        raise ValueError(f"image_std={value!r} holds a zero: normalizing would divide by it")
    return tuple(values) if isinstance(value, (list, tuple)) else value


def _positive_int(name: str, value) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name}={value!r} must be a positive int")
    return value


@dataclasses.dataclass(frozen=True)
class ImageProcessor:
    """One preprocessor_config.json, resolved: ``kind`` is the transformers class it reproduces; ``settings``
    every setting that class holds (the pipeline reads the ones it needs); ``extra`` the file's other keys,
    kept to be written back. Build it with ``from_dict`` / ``from_pretrained``, which validate."""
    kind: str
    settings: dict[str, Any]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def dynamic(self) -> bool:
        """Qwen2-VL's dynamic resolution (patches and grids) rather than a fixed-size pixel grid."""
        return self.kind == "Qwen2VLImageProcessor"

    # -------------------------------------------------------------------- reading and writing the file

    @classmethod
    def from_dict(cls, config: dict[str, Any], model_type: str | None = None) -> "ImageProcessor":
        """Resolve a preprocessor_config.json dict as transformers' class of that name would. ``model_type``
        (config.json's) names the class when the dict names none."""
        if not isinstance(config, dict):
            raise ValueError(f"a preprocessor config must be a JSON object, got {type(config).__name__}")
        kind = cls._kind(config, model_type)
        dynamic = kind == "Qwen2VLImageProcessor"
        valid = COMMON_KEYS + CLASS_KEYS.get(kind, ())
        given = {k: v for k, v in config.items() if k not in DROPPED_KEYS}
        if kind == "CLIPImageProcessor" and given.get("use_square_size"):
            raise ValueError("use_square_size=true (Kosmos-2's legacy CLIP setting) is not supported: it replaces "
                             "the file's size by the class's 224x224; write size as {height, width} instead")
        settings = {k: given.get(k, CLASS_DEFAULTS[kind].get(k)) for k in valid if k not in ("default_to_square",)}
        square = given.get("default_to_square")
        square = _SQUARE_BY_DEFAULT[kind] if square is None else square
        if not isinstance(square, bool):
            raise ValueError(f"default_to_square={square!r} must be true or false")
        if dynamic:  # Qwen2-VL's constructor: a null size is the class's; min/max_pixels override its two edges
            size = dict(CLASS_DEFAULTS[kind]["size"]) if given.get("size") is None else given["size"]
            if isinstance(size, dict) and (given.get("min_pixels") is not None or given.get("max_pixels") is not None):
                size = {k: v for k, v in size.items() if k not in ("min_pixels", "max_pixels")}
                for edge, key in (("shortest_edge", "min_pixels"), ("longest_edge", "max_pixels")):
                    if given.get(key) is not None:
                        size[edge] = given[key]
            settings["size"] = size
            settings["min_pixels"] = settings["max_pixels"] = None  # folded into size, and never written
        for name in ("size", "crop_size", "pad_size"):
            settings[name] = _size_dict(name, settings[name], square if name == "size" else True)
        for name in ("image_mean", "image_std"):
            settings[name] = _channel_values(name, settings[name])
        extra = {k: v for k, v in given.items() if k not in valid or k == "default_to_square"}
        processor = cls(kind, settings, extra)
        processor._validate()
        return processor

    @staticmethod
    def _kind(config: dict[str, Any], model_type: str | None) -> str:
        name = config.get("image_processor_type")
        if name is None and isinstance(config.get("feature_extractor_type"), str):
            name = config["feature_extractor_type"].replace("FeatureExtractor", "ImageProcessor")
        if name is None:
            if model_type not in MODEL_TYPES:
                raise ValueError(f"the preprocessor config names no image_processor_type and model_type="
                                 f"{model_type!r} is not one of {sorted(MODEL_TYPES)}")
            return MODEL_TYPES[model_type]
        base = name.removesuffix("Fast").removesuffix("Pil") if isinstance(name, str) else name
        if base not in CLASS_DEFAULTS:
            raise ValueError(f"image_processor_type={name!r} is not supported; supported: {sorted(CLASS_DEFAULTS)}")
        return base

    def _validate(self) -> None:
        """Refuse, by key, every value the pipeline would misread or fail on halfway through a batch."""
        s, kind = self.settings, self.kind
        resample = s["resample"]
        if (s["do_resize"] or kind == "LlavaNextImageProcessor") and resample is not None and (
                isinstance(resample, bool) or resample not in transforms.RESAMPLE):
            raise ValueError(f"resample={resample!r} is not a PIL filter number: "
                             f"{', '.join(f'{k} ({v})' for k, v in transforms.RESAMPLE.items())}")
        if kind in ("MllamaImageProcessor", "LlavaNextImageProcessor") or (s["do_resize"] and kind != SIGLIP2):
            self._validate_size()
        if kind in CENTER_CROPPING and s["do_center_crop"]:
            if s["crop_size"] is None or set(s["crop_size"]) != {"height", "width"}:
                raise ValueError(f"do_center_crop needs crop_size as {{height, width}}, got {s['crop_size']!r}")
        if kind in BATCH_PADDING and s["do_pad"] and s["pad_size"] is not None and set(s["pad_size"]) != {"height",
                                                                                                         "width"}:
            raise ValueError(f"pad_size={s['pad_size']!r} must be {{height, width}}")
        if s["do_rescale"] and (isinstance(s["rescale_factor"], bool)
                                or not isinstance(s["rescale_factor"], (int, float))):
            raise ValueError(f"rescale_factor={s['rescale_factor']!r} must be a number when do_rescale is true")
        if s["do_normalize"] and (s["image_mean"] is None or s["image_std"] is None):
            raise ValueError("do_normalize is true but image_mean or image_std is null")
        if s["input_data_format"] not in (None, "channels_first", "channels_last"):
            raise ValueError(f"input_data_format={s['input_data_format']!r} must be channels_first or channels_last")
        if kind == "LlavaImageProcessor" and s["do_pad"] and not isinstance(s["image_mean"], (tuple, type(None))):
            raise ValueError(f"do_pad (LLaVA's pad to a square in the mean colour) needs image_mean as one value per "
                             f"channel, got {s['image_mean']!r}")
        for name in {"Qwen2VLImageProcessor": ("patch_size", "temporal_patch_size", "merge_size"),
                     SIGLIP2: ("patch_size", "max_num_patches"), "MllamaImageProcessor": ("max_image_tiles",)
                     }.get(kind, ()):
            _positive_int(name, s[name])
            if s[name] is None:
                raise ValueError(f"{name} is null; {kind} needs a positive int")
        if kind == "LlavaNextImageProcessor":
            _pinpoints(s["image_grid_pinpoints"])
        if kind == "MllamaImageProcessor":
            for name in ("do_resize", "do_pad"):
                if not s[name]:
                    raise ValueError(f"{name}={s[name]!r}: Llama 3.2 Vision's processor always resizes and pads")
        if kind == "Gemma3ImageProcessor" and s["do_pan_and_scan"]:
            _positive_int("pan_and_scan_min_crop_size", s["pan_and_scan_min_crop_size"])
            _positive_int("pan_and_scan_max_num_crops", s["pan_and_scan_max_num_crops"])
            ratio = s["pan_and_scan_min_ratio_to_activate"]
            if any(s[k] is None for k in PAN_AND_SCAN_KEYS) or isinstance(ratio, bool) or not isinstance(
                    ratio, (int, float)):
                raise ValueError(f"do_pan_and_scan needs {', '.join(PAN_AND_SCAN_KEYS)} set (positive ints and a "
                                 f"number), got {[s[k] for k in PAN_AND_SCAN_KEYS]}")

    def _validate_size(self) -> None:
        size, kind = self.settings["size"], self.kind
        if size is None:
            raise ValueError(f"size is null; {kind} needs one")
        keys = set(size)
        if kind == "Qwen2VLImageProcessor":
            if keys != {"shortest_edge", "longest_edge"}:
                raise ValueError(f"size={size!r}: Qwen2-VL needs shortest_edge and longest_edge (min and max "
                                 "pixels), or top-level min_pixels and max_pixels")
            if size["shortest_edge"] > size["longest_edge"]:
                raise ValueError(f"size={size!r}: min pixels (shortest_edge) exceed max pixels (longest_edge)")
        elif kind == "MllamaImageProcessor" and (keys != {"height", "width"} or size["height"] != size["width"]):
            raise ValueError(f"size={size!r}: Llama 3.2 Vision's tile size must be {{height, width}}, both equal")
        elif kind == "LlavaNextImageProcessor" and "shortest_edge" not in keys and keys != {"height", "width"}:
            raise ValueError(f"size={size!r}: LLaVA-NeXT's base image size needs shortest_edge or height and width")
        elif keys in ({"longest_edge"}, {"min_pixels", "max_pixels"}):
            raise ValueError(f"size={size!r} is not a size {kind} can resize to")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "ImageProcessor":
        """Read a folder as transformers does: the ``image_processor`` object of processor_config.json (what a
        transformers-5 processor saves) first, else preprocessor_config.json; or a JSON file given itself. The
        folder's config.json names the class when the file does not."""
        path = Path(path)
        file, nested = path, False
        if path.is_dir():
            file = path / CONFIG_NAME
            if (path / PROCESSOR_CONFIG_NAME).exists():
                nested = "image_processor" in _read_json(path / PROCESSOR_CONFIG_NAME)
                file = path / PROCESSOR_CONFIG_NAME if nested else file
        config = _read_json(file)
        config = config["image_processor"] if nested else config
        model_type = None
        if (file.parent / "config.json").exists():
            try:
                model_type = json.loads((file.parent / "config.json").read_text(encoding="utf-8")).get("model_type")
            except (OSError, json.JSONDecodeError, AttributeError):
                model_type = None
        try:
            return cls.from_dict(config, model_type)
        except ValueError as err:
            raise ValueError(f"{file}: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        """What transformers' ``to_dict`` gives for this processor: every setting that is not null (null kept
        where the class's default is not), the file's other keys, and ``image_processor_type``."""
        defaults = CLASS_DEFAULTS[self.kind]
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.settings.items()
               if v is not None or defaults.get(k) is not None}
        out.update({k: v for k, v in self.extra.items() if v is not None})
        out["image_processor_type"] = self.kind
        return out

    def with_settings(self, **settings) -> "ImageProcessor":
        """This processor with some settings changed (validated again), as a processor call's images_kwargs
        change them for one call in transformers."""
        return ImageProcessor.from_dict({**self.to_dict(), **settings})

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """Write ``folder/preprocessor_config.json`` byte for byte as transformers' ``save_pretrained`` does."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_NAME).write_text(self.to_json_string(), encoding="utf-8")
        return folder / CONFIG_NAME

    # -------------------------------------------------------------------- the pipeline

    def __call__(self, images) -> dict[str, Any]:
        """Preprocess one image or a list of them (PIL images; numpy arrays (H, W), (H, W, C), (C, H, W); a 4-D
        array is a batch). Classic processors return ``{"pixel_values": [N, C, H, W]}`` (a list of arrays when
        the sizes differ, as with do_resize false); the others add what their models read (see the module's
        docstring). Llama 3.2 Vision takes a list of lists, one per prompt; a flat list is one prompt's images."""
        if self.kind == "MllamaImageProcessor":
            samples = images if isinstance(images, (list, tuple)) and images and all(
                isinstance(i, (list, tuple)) for i in images) else [_image_list(images)]
            return self._tiles([[self._read(image) for image in _image_list(sample)] for sample in samples])
        batch = [self._read(image) for image in _image_list(images)]
        pipeline = {"Qwen2VLImageProcessor": self._dynamic, "LlavaNextImageProcessor": self._anyres,
                    "Gemma3ImageProcessor": self._pan_and_scan, SIGLIP2: self._naflex}.get(self.kind, self._classic)
        return pipeline(batch)

    def _classic(self, batch: list[np.ndarray]) -> dict[str, Any]:
        s = self.settings
        out = []
        for image in batch:
            if s["do_pad"] and self.kind == "LlavaImageProcessor":
                image = self._pad_to_square(image)
            out.append(self._resize_crop_normalize(image, s["size"]))
        if s["do_pad"] and self.kind in BATCH_PADDING:
            height, width = ((s["pad_size"]["height"], s["pad_size"]["width"]) if s["pad_size"] else
                             (max(i.shape[1] for i in out), max(i.shape[2] for i in out)))
            out = [transforms.pad(image, height, width) for image in out]
        return {"pixel_values": _stacked(out)}

    def _resize_crop_normalize(self, image: np.ndarray, size: dict[str, int]) -> np.ndarray:
        s = self.settings
        if s["do_resize"]:
            image = transforms.resize(image, *self._target_size(image, size), self._resample())
        if s["do_center_crop"] and self.kind in CENTER_CROPPING:
            image = transforms.center_crop(image, s["crop_size"]["height"], s["crop_size"]["width"])
        return self._rescale_and_normalize(image)

    def _pad_to_square(self, image: np.ndarray) -> np.ndarray:
        """LLaVA: centred on a square of its longer side, filled with the mean colour (``int(mean * 255)``)."""
        channels, height, width = image.shape
        mean = self.settings["image_mean"]
        colour = [int(m * 255) for m in mean] if mean else [0]
        if len(colour) != channels and len(colour) != 1:
            raise ValueError(f"image_mean={mean!r} has {len(colour)} values for an image of {channels} channels "
                             "(do_pad fills the square with it)")
        if height == width:
            return image
        side = max(height, width)
        square = np.zeros((channels, side, side), dtype=image.dtype)
        for channel, value in enumerate(colour):
            square[channel] = value
        top, left = (side - height) // 2, (side - width) // 2
        square[:, top:top + height, left:left + width] = image
        return square

    def _anyres(self, batch: list[np.ndarray]) -> dict[str, Any]:
        """LLaVA-NeXT: per image, the image resized to the base size, then the tiles of the image resized into its
        best pinpoint (aspect ratio kept) and centred on it; every one through resize / crop / normalize."""
        s = self.settings
        size, crop = s["size"], s["crop_size"]
        base_size = (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2
        tile = crop["height"] if crop else size.get("height", size.get("shortest_edge"))
        out, sizes = [], []
        for image in batch:
            height, width = image.shape[1:]
            best_h, best_w = tiling.best_resolution(height, width, s["image_grid_pinpoints"])
            resized = transforms.resize(image, *tiling.fit_inside(height, width, best_h, best_w), self._resample())
            padded = np.pad(resized, ((0, 0), _centred(best_h - resized.shape[1]), _centred(best_w - resized.shape[2])))
            tiles = [padded[:, i:i + tile, j:j + tile] for i in range(0, best_h, tile) for j in range(0, best_w, tile)]
            crops = [transforms.resize(image, *base_size, self._resample())] + tiles
            crops = [self._resize_crop_normalize(c, size) for c in crops]
            if len({c.shape for c in crops}) != 1:
                raise ValueError(f"an image of {height}x{width} gives tiles of sizes {sorted({c.shape for c in crops})}"
                                 f"; image_grid_pinpoints must be multiples of the tile size {tile}, or crop_size set")
            out.append(np.stack(crops))
            sizes.append((height, width))
        if s["do_pad"]:
            most = max(len(tiles) for tiles in out)
            out = [np.pad(tiles, ((0, most - len(tiles)), (0, 0), (0, 0), (0, 0))) for tiles in out]
        return {"pixel_values": _stacked(out), "image_sizes": np.array(sizes, dtype=np.int64)}

    def _tiles(self, samples: list[list[np.ndarray]]) -> dict[str, Any]:
        """Llama 3.2 Vision: each image resized into its best canvas of tiles, padded below and right, split."""
        s = self.settings
        tile, max_tiles = s["size"]["height"], s["max_image_tiles"]
        most_images = max(len(sample) for sample in samples)
        ratio_ids = np.zeros((len(samples), most_images), dtype=np.int64)
        ratio_mask = np.zeros((len(samples), most_images, max_tiles), dtype=np.int64)
        ratio_mask[:, :, 0] = 1
        tiled, num_tiles = [], []
        for i, sample in enumerate(samples):
            num_tiles.append([])
            for j, image in enumerate(sample):
                rows, cols = tiling.tiled_canvas(*image.shape[1:], max_tiles, tile)
                image = transforms.resize(image, *tiling.fit_to_canvas(*image.shape[1:], rows * tile, cols * tile,
                                                                      tile), self._resample())
                image = np.pad(image, ((0, 0), (0, rows * tile - image.shape[1]), (0, cols * tile - image.shape[2])))
                image = self._rescale_and_normalize(image)
                channels = image.shape[0]
                tiles = image.reshape(channels, rows, tile, cols, tile).transpose(1, 3, 0, 2, 4)
                tiled.append((i, j, tiles.reshape(rows * cols, channels, tile, tile)))
                num_tiles[-1].append(rows * cols)
                ratio_ids[i, j] = tiling.tile_arrangements(max_tiles).index((rows, cols)) + 1
                ratio_mask[i, j, :rows * cols] = 1
        pixels = np.zeros((len(samples), most_images, max_tiles, *tiled[0][2].shape[1:]), dtype=np.float32)
        for i, j, tiles in tiled:
            pixels[i, j, :len(tiles)] = tiles
        return {"pixel_values": pixels, "aspect_ratio_ids": ratio_ids, "aspect_ratio_mask": ratio_mask,
                "num_tiles": num_tiles}

    def _pan_and_scan(self, batch: list[np.ndarray]) -> dict[str, Any]:
        """Gemma 3: each image, then (pan-and-scan on) its crops along the long side, each resized."""
        s = self.settings
        out, counts = [], []
        for image in batch:
            boxes = tiling.pan_and_scan_boxes(*image.shape[1:], *(s[k] for k in PAN_AND_SCAN_KEYS)) if s[
                "do_pan_and_scan"] else []
            crops = [image] + [image[:, top:top + h, left:left + w] for top, left, h, w in boxes]
            out.extend(self._resize_crop_normalize(crop, s["size"]) for crop in crops)
            counts.append(len(boxes))
        return {"pixel_values": _stacked(out), "num_crops": np.array(counts, dtype=np.int64)}

    def _naflex(self, batch: list[np.ndarray]) -> dict[str, Any]:
        """SigLIP2 NaFlex: each image resized to at most max_num_patches patches, patches flattened (row, column,
        channel) and padded to max_num_patches, with the mask of real patches and the patch grid."""
        s = self.settings
        patch, most = s["patch_size"], s["max_num_patches"]
        pixels, masks, shapes = [], [], []
        for image in batch:
            if s["do_resize"]:
                image = transforms.resize(image, *tiling.naflex_size(*image.shape[1:], patch, most), self._resample())
            rows, cols = image.shape[1] // patch, image.shape[2] // patch
            if image.shape[1] % patch or image.shape[2] % patch or rows * cols > most:
                raise ValueError(f"an image of {image.shape[1]}x{image.shape[2]} with do_resize false must have sides "
                                 f"that are multiples of patch_size={patch} and at most max_num_patches={most} patches")
            image = np.asarray(self._rescale_and_normalize(image), dtype=np.float32)
            channels = image.shape[0]
            patches = image.reshape(channels, rows, patch, cols, patch).transpose(1, 3, 2, 4, 0)
            pixels.append(np.pad(patches.reshape(rows * cols, -1), ((0, most - rows * cols), (0, 0))))
            masks.append(np.arange(most) < rows * cols)
            shapes.append((rows, cols))
        return {"pixel_values": np.stack(pixels), "pixel_attention_mask": np.stack(masks).astype(np.int32),
                "spatial_shapes": np.array(shapes, dtype=np.int64)}

    def image_grid(self, height: int, width: int) -> tuple[int, int, int]:
        """Qwen2-VL: the (t, h, w) patch grid an image of ``height x width`` becomes. Its placeholder in the
        prompt expands to ``t * h * w // merge_size**2`` image tokens."""
        if not self.dynamic:
            raise ValueError(f"{self.kind} has no patch grid")
        if self.settings["do_resize"]:
            height, width = self._smart_size(height, width)
        return 1, height // self.settings["patch_size"], width // self.settings["patch_size"]

    def _read(self, image) -> np.ndarray:
        return transforms.channels_first(image, bool(self.settings["do_convert_rgb"]),
                                         self.settings["input_data_format"])

    def _resample(self) -> int:
        return DEFAULT_RESAMPLE if self.settings["resample"] is None else self.settings["resample"]

    def _target_size(self, image: np.ndarray, size: dict[str, int]) -> tuple[int, int]:
        height, width = image.shape[1:]
        if "shortest_edge" in size and "longest_edge" in size:
            return transforms.shortest_longest_size(height, width, size["shortest_edge"], size["longest_edge"])
        if "shortest_edge" in size:
            return transforms.shortest_edge_size(height, width, size["shortest_edge"])
        if "max_height" in size:
            return transforms.fit_size(height, width, size["max_height"], size["max_width"])
        return size["height"], size["width"]

    def _rescale_and_normalize(self, image: np.ndarray) -> np.ndarray:
        s = self.settings
        if s["do_rescale"]:
            image = transforms.rescale(image, s["rescale_factor"])
        if s["do_normalize"]:
            image = transforms.normalize(image, s["image_mean"], s["image_std"])
        return image

    def _dynamic(self, batch: list[np.ndarray]) -> dict[str, np.ndarray]:
        s = self.settings
        factor = s["patch_size"] * s["merge_size"]
        patches, grids = [], []
        for image in batch:
            if s["do_resize"]:
                image = transforms.resize(image, *self._smart_size(*image.shape[1:]), self._resample())
            elif image.shape[1] % factor or image.shape[2] % factor:
                raise ValueError(f"an image of {image.shape[1]}x{image.shape[2]} with do_resize false must have "
                                 f"both sides multiples of patch_size * merge_size = {factor}")
            image = self._rescale_and_normalize(image)
            patches.append(transforms.patchify(image, s["patch_size"], s["merge_size"], s["temporal_patch_size"]))
            grids.append((1, image.shape[1] // s["patch_size"], image.shape[2] // s["patch_size"]))
        return {"pixel_values": np.concatenate(patches), "image_grid_thw": np.array(grids, dtype=np.int64)}

    def _smart_size(self, height: int, width: int) -> tuple[int, int]:
        s = self.settings
        return transforms.smart_resize(height, width, s["patch_size"] * s["merge_size"],
                                       s["size"]["shortest_edge"], s["size"]["longest_edge"])


def _image_list(images) -> list:
    """One image, a list (or nested lists) of images, or a 4-D array, as a flat list."""
    if isinstance(images, np.ndarray) and images.ndim == 4:
        return list(images)
    if isinstance(images, (list, tuple)):
        flat = [image for item in images for image in _image_list(item)]
        if not flat:
            raise ValueError("no images given")
        return flat
    return [images]


def _pinpoints(value) -> None:
    """LLaVA-NeXT's image_grid_pinpoints: a non-empty list of [height, width] pairs of positive ints."""
    if not isinstance(value, list) or not value or any(
            not isinstance(p, (list, tuple)) or len(p) != 2 or any(
                isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in p) for p in value):
        raise ValueError(f"image_grid_pinpoints={value!r} must be a non-empty list of [height, width] pairs of "
                         "positive ints")


def _centred(padding: int) -> tuple[int, int]:
    """Padding split before and after, the odd pixel after."""
    return padding // 2, padding - padding // 2


def _stacked(images: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """One array when every image has the same shape and dtype, else the list (as transformers returns)."""
    return np.stack(images) if len({(i.shape, i.dtype) for i in images}) == 1 else images


def _read_json(file: Path) -> dict:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{file} is not a readable preprocessor config: {err}") from None
