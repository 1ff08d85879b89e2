"""Image processors read from ``preprocessor_config.json``, equal to transformers' PIL-backend processors.

    proc = ImageProcessor.from_pretrained("path/to/clip-vit-base-patch32")   # or ImageProcessor.from_dict({...})
    batch = proc([pil_image, array])        # {"pixel_values": float32 [N, 3, 224, 224]}
    proc.save_pretrained("out_dir")         # the preprocessor_config.json transformers would write

Two pipelines, chosen by ``image_processor_type``:
  - classic (ViTImageProcessor, CLIPImageProcessor, SiglipImageProcessor): convert to RGB, resize, center crop,
    rescale, normalize, pad; ``pixel_values`` [N, C, H, W];
  - dynamic resolution (Qwen2VLImageProcessor, which Qwen2-VL and Qwen2.5-VL files name): smart resize to a
    multiple of patch_size * merge_size within [min_pixels, max_pixels], rescale, normalize, then the flattened
    patches of every image concatenated, ``pixel_values`` [patches, C * temporal_patch_size * patch_size**2],
    and ``image_grid_thw`` [N, 3] (1, grid_h, grid_w) per image.

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

from jaxformer.vision import transforms

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
}
# How an int `size` reads when the file does not say (transformers' class attribute default_to_square).
_SQUARE_BY_DEFAULT = {"ViTImageProcessor": True, "CLIPImageProcessor": False, "SiglipImageProcessor": False,
                      "Qwen2VLImageProcessor": False}
# model_type (config.json) -> processor, for a preprocessor_config.json that names no class.
MODEL_TYPES = {"vit": "ViTImageProcessor", "clip": "CLIPImageProcessor", "siglip": "SiglipImageProcessor",
               "qwen2_vl": "Qwen2VLImageProcessor", "qwen2_5_vl": "Qwen2VLImageProcessor"}
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
        valid = COMMON_KEYS + (DYNAMIC_KEYS if dynamic else ())
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
        s = self.settings
        if s["do_resize"]:
            resample = s["resample"]
            if resample is not None and (isinstance(resample, bool) or resample not in transforms.RESAMPLE):
                raise ValueError(f"resample={resample!r} is not a PIL filter number: "
                                 f"{', '.join(f'{k} ({v})' for k, v in transforms.RESAMPLE.items())}")
            if s["size"] is None:
                raise ValueError("do_resize is true but size is null")
            keys = set(s["size"])
            if self.dynamic and keys != {"shortest_edge", "longest_edge"}:
                raise ValueError(f"size={s['size']!r}: Qwen2-VL needs shortest_edge and longest_edge (min and max "
                                 "pixels), or top-level min_pixels and max_pixels")
            if self.dynamic and s["size"]["shortest_edge"] > s["size"]["longest_edge"]:
                raise ValueError(f"size={s['size']!r}: min pixels (shortest_edge) exceed max pixels (longest_edge)")
            if not self.dynamic and keys in ({"longest_edge"}, {"min_pixels", "max_pixels"}):
                raise ValueError(f"size={s['size']!r} is not a size {self.kind} can resize to")
        if not self.dynamic and s["do_center_crop"]:
            if s["crop_size"] is None or set(s["crop_size"]) != {"height", "width"}:
                raise ValueError(f"do_center_crop needs crop_size as {{height, width}}, got {s['crop_size']!r}")
        if not self.dynamic and s["do_pad"] and s["pad_size"] is not None and set(s["pad_size"]) != {"height",
                                                                                                    "width"}:
            raise ValueError(f"pad_size={s['pad_size']!r} must be {{height, width}}")
        if s["do_rescale"] and (isinstance(s["rescale_factor"], bool)
                                or not isinstance(s["rescale_factor"], (int, float))):
            raise ValueError(f"rescale_factor={s['rescale_factor']!r} must be a number when do_rescale is true")
        if s["do_normalize"] and (s["image_mean"] is None or s["image_std"] is None):
            raise ValueError("do_normalize is true but image_mean or image_std is null")
        if s["input_data_format"] not in (None, "channels_first", "channels_last"):
            raise ValueError(f"input_data_format={s['input_data_format']!r} must be channels_first or channels_last")
        if self.dynamic:
            for name in ("patch_size", "temporal_patch_size", "merge_size"):
                _positive_int(name, s[name])

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
        the sizes differ, as with do_resize false); Qwen2-VL returns ``{"pixel_values", "image_grid_thw"}``."""
        s = self.settings
        batch = [self._read(image) for image in _image_list(images)]
        if self.dynamic:
            return self._dynamic(batch)
        out = []
        for image in batch:
            if s["do_resize"]:
                image = transforms.resize(image, *self._target_size(image), self._resample())
            if s["do_center_crop"]:
                image = transforms.center_crop(image, s["crop_size"]["height"], s["crop_size"]["width"])
            image = self._rescale_and_normalize(image)
            out.append(image)
        if s["do_pad"]:
            height, width = ((s["pad_size"]["height"], s["pad_size"]["width"]) if s["pad_size"] else
                             (max(i.shape[1] for i in out), max(i.shape[2] for i in out)))
            out = [transforms.pad(image, height, width) for image in out]
        same = len({(i.shape, i.dtype) for i in out}) == 1
        return {"pixel_values": np.stack(out) if same else out}

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

    def _target_size(self, image: np.ndarray) -> tuple[int, int]:
        size, (height, width) = self.settings["size"], image.shape[1:]
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


def _read_json(file: Path) -> dict:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{file} is not a readable preprocessor config: {err}") from None
