"""A prompt's image placeholders expanded as transformers' multimodal processors expand them.

    proc = ImageProcessor.from_pretrained(folder)
    placeholders = ImagePlaceholders.from_pretrained(folder)     # processor_config.json, tokenizer_config.json
    images = proc([photo])
    texts = placeholders.expand(["USER: <image>\\nWhat is this? ASSISTANT:"], images)
    ids = tokenizer(texts)                       # equal to the transformers processor's input_ids

Each image's placeholder becomes what the model's embedding merge expects, from the processed images:
  - LLaVA (``<image>``): (crop height // patch_size) * (crop width // patch_size) + num_additional_image_tokens
    tokens, one fewer when vision_feature_select_strategy is "default" (the CLS feature dropped);
  - LLaVA-NeXT (``<image>``): the base tile's patches plus the best pinpoint's unpadded patch grid and one newline
    per grid row (``tiling.anyres_features``), from ``image_sizes``, the same strategy rule;
  - Qwen2-VL / Qwen2.5-VL (``<|image_pad|>``): ``prod(image_grid_thw) // merge_size**2`` tokens;
  - Gemma 3 (its begin-of-image token): ``\\n\\n<boi>`` + image_seq_length soft image tokens + ``<eoi>\\n\\n``,
    and with pan-and-scan crops the sentence transformers writes around one such sequence per crop;
  - Llama 3.2 Vision (``<|image|>``): left as one token, the bos token put after the leading image tokens when
    the prompt has none; the images reach the text through ``cross_attention_mask`` instead.
Tokenizing the expanded text is the tokenizer's business (its special tokens must include these).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from jaxformer.vision import tiling
from jaxformer.vision.processor import PROCESSOR_CONFIG_NAME, ImageProcessor

# processor_class (processor_config.json) or model_type (config.json) -> the expansion rule.
PROCESSOR_CLASSES = {"LlavaProcessor": "llava", "LlavaNextProcessor": "llava_next", "Qwen2VLProcessor": "qwen2_vl",
                     "Qwen2_5_VLProcessor": "qwen2_vl", "Gemma3Processor": "gemma3", "MllamaProcessor": "mllama"}
MODEL_TYPES = {"llava": "llava", "llava_next": "llava_next", "qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_vl",
               "gemma3": "gemma3", "mllama": "mllama"}
# The tokens each processor uses when the tokenizer names none (Gemma 3's are its tokenizer's own).
DEFAULT_TOKENS = {"llava": {"image_token": "<image>"}, "llava_next": {"image_token": "<image>"},
                  "qwen2_vl": {"image_token": "<|image_pad|>"},
                  "gemma3": {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                             "eoi_token": "<end_of_image>"},
                  "mllama": {"image_token": "<|image|>", "bos_token": "<|begin_of_text|>"}}
# The processor settings each rule reads (processor_config.json, or the processor's constructor arguments).
SETTINGS = {"llava": {"patch_size": None, "vision_feature_select_strategy": None, "num_additional_image_tokens": 0},
            "gemma3": {"image_seq_length": 256}}
SETTINGS["llava_next"] = SETTINGS["llava"]
# The image processor each rule needs, for what it reads of the processed images.
IMAGE_PROCESSORS = {"llava_next": ("LlavaNextImageProcessor",), "qwen2_vl": ("Qwen2VLImageProcessor",),
                    "gemma3": ("Gemma3ImageProcessor",), "mllama": ("MllamaImageProcessor",)}
# What a transformers processor passes its image processor on every call, over the preprocessor config's values
# (its class-level images_kwargs): Gemma 3's processor turns pan-and-scan off unless a call turns it on.
PROCESSOR_IMAGE_KWARGS = {"llava_next": {"do_pad": True},
                          "gemma3": {"do_convert_rgb": True, "do_pan_and_scan": False,
                                     "pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
                                     "pan_and_scan_min_ratio_to_activate": 1.2}}
STRATEGIES = (None, "default", "full")  # transformers counts anything but "default" as full


@dataclasses.dataclass(frozen=True)
class ImagePlaceholders:
    """One processor's placeholder rule: ``kind`` (llava, llava_next, qwen2_vl, gemma3, mllama), the special
    tokens it writes (``tokens``: image_token, and boi/eoi or bos where the rule uses them), the settings it reads,
    and the image processor whose outputs it counts. Build it with ``from_dict`` / ``from_pretrained``."""
    kind: str
    tokens: dict[str, str]
    settings: dict[str, Any]
    image_processor: ImageProcessor

    @classmethod
    def from_dict(cls, config: dict[str, Any], image_processor: ImageProcessor, *, model_type: str | None = None,
                  tokens: dict[str, str] | None = None) -> "ImagePlaceholders":
        """``config``: the processor's settings (processor_config.json; keys the rule does not read are kept by
        the file, not here). ``tokens``: the tokenizer's special tokens (image_token, boi_token, eoi_token,
        bos_token) where they differ from the processor's defaults."""
        if not isinstance(config, dict):
            raise ValueError(f"a processor config must be a JSON object, got {type(config).__name__}")
        name = config.get("processor_class")
        if name in PROCESSOR_CLASSES:
            kind = PROCESSOR_CLASSES[name]
        elif model_type in MODEL_TYPES:
            kind = MODEL_TYPES[model_type]
        else:
            raise ValueError(f"processor_class={name!r} / model_type={model_type!r}: image placeholders are known "
                             f"for {sorted(PROCESSOR_CLASSES)} (model types {sorted(MODEL_TYPES)})")
        if kind in IMAGE_PROCESSORS and image_processor.kind not in IMAGE_PROCESSORS[kind]:
            raise ValueError(f"{kind}'s placeholders count the outputs of {IMAGE_PROCESSORS[kind][0]}, not of "
                             f"image_processor_type={image_processor.kind!r}")
        settings = {key: config.get(key, default) for key, default in SETTINGS.get(kind, {}).items()}
        merged = {**DEFAULT_TOKENS[kind], **({"image_token": config["image_token"]} if config.get("image_token")
                                             and kind in ("llava", "llava_next") else {}),
                  **{k: v for k, v in (tokens or {}).items() if k in DEFAULT_TOKENS[kind] and v is not None}}
        placeholders = cls(kind, merged, settings, image_processor)
        placeholders._validate()
        return placeholders

    def _validate(self) -> None:
        for name, token in self.tokens.items():
            if not isinstance(token, str) or not token:
                raise ValueError(f"{name}={token!r} must be a non-empty string")
        s = self.settings
        if self.kind in ("llava", "llava_next"):
            if isinstance(s["patch_size"], bool) or not isinstance(s["patch_size"], int) or s["patch_size"] <= 0:
                raise ValueError(f"patch_size={s['patch_size']!r} must be the vision tower's patch size (a positive "
                                 "int): it sets the number of image tokens")
            if s["vision_feature_select_strategy"] not in STRATEGIES:
                raise ValueError(f"vision_feature_select_strategy={s['vision_feature_select_strategy']!r} must be "
                                 "'default' (the CLS feature dropped) or 'full'")
            extra = s["num_additional_image_tokens"]
            if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
                raise ValueError(f"num_additional_image_tokens={extra!r} must be an int >= 0")
        if self.kind == "gemma3":
            length = s["image_seq_length"]
            if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
                raise ValueError(f"image_seq_length={length!r} must be a positive int")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, tokens: dict[str, str] | None = None) -> "ImagePlaceholders":
        """Read a checkpoint folder: processor_config.json's settings (absent: the processor's defaults), the
        image processor, config.json's model_type, and the special tokens tokenizer_config.json names (its
        ``extra_special_tokens`` or top-level image_token / boi_token / eoi_token, and bos_token); ``tokens``
        overrides them. ``image_processor`` is the folder's as the transformers processor calls it, with the
        processor's own image settings (``PROCESSOR_IMAGE_KWARGS``) over the file's."""
        path = Path(path)
        config = _json(path / PROCESSOR_CONFIG_NAME)
        model_type = _json(path / "config.json").get("model_type")
        tokenizer = _json(path / "tokenizer_config.json")
        named = {**{k: tokenizer.get(k) for k in ("image_token", "boi_token", "eoi_token", "bos_token")},
                 **(tokenizer.get("extra_special_tokens") if isinstance(tokenizer.get("extra_special_tokens"), dict)
                    else {})}
        named = {k: v.get("content") if isinstance(v, dict) else v for k, v in named.items()}
        image_processor = ImageProcessor.from_pretrained(path)
        kind = PROCESSOR_CLASSES.get(config.get("processor_class"), MODEL_TYPES.get(model_type))
        if kind in PROCESSOR_IMAGE_KWARGS and image_processor.kind in IMAGE_PROCESSORS[kind]:
            image_processor = image_processor.with_settings(**PROCESSOR_IMAGE_KWARGS[kind])
        return cls.from_dict(config, image_processor, model_type=model_type, tokens={**named, **(tokens or {})})

    @property
    def image_token(self) -> str:
        """The placeholder a prompt holds once per image (Gemma 3's is its begin-of-image token)."""
        return self.tokens["boi_token" if self.kind == "gemma3" else "image_token"]

    def num_image_tokens(self, images: dict[str, Any], index: int) -> int:
        """How many image tokens (Gemma 3: soft tokens per sequence) the ``index``-th processed image takes."""
        s = self.settings
        if self.kind == "qwen2_vl":
            return int(np.prod(images["image_grid_thw"][index])) // self.image_processor.settings["merge_size"] ** 2
        if self.kind == "gemma3":
            return s["image_seq_length"]
        if self.kind == "mllama":
            return 1
        if self.kind == "llava":
            height, width = np.shape(images["pixel_values"][index])[-2:]
            count = (height // s["patch_size"]) * (width // s["patch_size"])
        else:
            height, width = (int(v) for v in images["image_sizes"][index])
            tile_height, tile_width = np.shape(images["pixel_values"][0][0])[-2:]
            count = tiling.anyres_features(height, width, tile_height, tile_width, s["patch_size"],
                                           self.image_processor.settings["image_grid_pinpoints"])
        return count + s["num_additional_image_tokens"] - (s["vision_feature_select_strategy"] == "default")

    def replacement(self, images: dict[str, Any], index: int) -> str:
        """The text the ``index``-th image's placeholder becomes."""
        count = self.num_image_tokens(images, index)
        if self.kind == "mllama":
            return self.image_token
        if self.kind != "gemma3":
            return self.image_token * count
        t = self.tokens
        sequence = f"\n\n{t['boi_token']}{t['image_token'] * count}{t['eoi_token']}\n\n"
        crops = int(images["num_crops"][index])
        if not crops:
            return sequence
        return (f"Here is the original image {sequence} and here are some crops to help you see better "
                + " ".join([sequence] * crops))

    def expand(self, text: str | list[str], images: dict[str, Any]) -> list[str]:
        """Every placeholder of ``text`` (a prompt or a batch) replaced, in order across the batch, by its image's
        expansion; ``images`` is the image processor's output for the same images in the same order (ours or
        transformers'). The prompts must hold one placeholder per image. Llama 3.2 Vision's prompts gain their bos
        token instead (after any leading image tokens) when they do not hold it."""
        texts = [text] if isinstance(text, str) else list(text)
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("text must be a string or a list of strings")
        count = self._image_count(images)
        found = [t.count(self.image_token) for t in texts]
        if sum(found) != count:
            raise ValueError(f"the prompts hold {sum(found)} {self.image_token} placeholders for {count} images")
        if self.kind == "mllama":
            if found != [len(sample) for sample in images["num_tiles"]]:
                raise ValueError(f"the prompts hold {found} {self.image_token} tokens; their images number "
                                 f"{[len(sample) for sample in images['num_tiles']]} (one list of images per prompt)")
            return [_with_bos(t, self.tokens["bos_token"], self.image_token) for t in texts]
        replacements = iter([self.replacement(images, i) for i in range(count)])
        pattern = re.compile(re.escape(self.image_token))
        return [pattern.sub(lambda _: next(replacements), t) for t in texts]

    def _image_count(self, images: dict[str, Any]) -> int:
        if self.kind == "qwen2_vl":
            return len(images["image_grid_thw"])
        if self.kind == "gemma3":
            return len(images["num_crops"])
        if self.kind == "mllama":
            return sum(len(sample) for sample in images["num_tiles"])
        if self.kind == "llava_next":
            return len(images["image_sizes"])
        return len(images["pixel_values"])

    def token_type_ids(self, input_ids, image_token_id: int) -> list[list[int]]:
        """1 where a token is the image token, else 0: Gemma 3's ``token_type_ids`` and Qwen2-VL's
        ``mm_token_type_ids`` (images only)."""
        return [[int(token == image_token_id) for token in ids] for ids in _rows(input_ids)]

    def cross_attention_mask(self, input_ids, num_tiles: list[list[int]], image_token_id: int) -> np.ndarray:
        """Llama 3.2 Vision's ``cross_attention_mask`` [batch, length, images, max_image_tiles] (int64): a text
        token sees an image's real tiles from that image's token on, until the next image token (a run of
        adjacent image tokens sees all of them); ``num_tiles`` is the image processor's."""
        if self.kind != "mllama":
            raise ValueError(f"{self.kind} has no cross-attention mask; it is Llama 3.2 Vision's")
        rows = _rows(input_ids)
        spans = [_image_spans(ids, image_token_id) for ids in rows]
        length = max(len(ids) for ids in rows)
        if len(num_tiles) != len(rows) or any(len(s) > len(t) for s, t in zip(spans, num_tiles)):
            raise ValueError(f"num_tiles={num_tiles!r} does not give the tile count of every image token of the "
                             f"{len(rows)} prompts")
        mask = np.zeros((len(rows), length, max([len(s) for s in spans] + [0]),
                         self.image_processor.settings["max_image_tiles"]), dtype=np.int64)
        for b, (sample_spans, sample_tiles) in enumerate(zip(spans, num_tiles)):
            for i, ((start, end), tiles) in enumerate(zip(sample_spans, sample_tiles)):
                mask[b, start:length if end == -1 else min(end, length), i, :tiles] = 1
        return mask


def _image_spans(ids: list[int], image_token_id: int) -> list[tuple[int, int]]:
    """transformers' sparse form: per image token its [start, end) of attending tokens (end -1: to the end)."""
    where = [i for i, token in enumerate(ids) if token == image_token_id]
    if len(where) <= 1:
        return [(where[0], -1)] if where else []
    spans = [[a, b] for a, b in zip(where[:-1], where[1:])] + [[where[-1], len(ids)]]
    end = spans[-1][1]
    for span in reversed(spans):  # adjacent image tokens share the span of the last of them
        if span[0] == span[1] - 1:
            span[1] = end
        end = span[1]
    return [tuple(span) for span in spans]


def _with_bos(prompt: str, bos: str, image_token: str) -> str:
    if bos in prompt:
        return prompt
    leading = 0
    while prompt.startswith(image_token):
        prompt, leading = prompt[len(image_token):], leading + 1
    return f"{image_token * leading}{bos}{prompt}"


def _rows(input_ids) -> list[list[int]]:
    rows = input_ids.tolist() if isinstance(input_ids, np.ndarray) else [list(r) for r in input_ids]
    if not rows or not all(isinstance(r, list) for r in rows):
        raise ValueError("input_ids must be a batch: a list of token id lists or a 2-D array")
    return rows


def _json(file: Path) -> dict:
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{file} is not readable JSON: {err}") from None
    return data if isinstance(data, dict) else {}
