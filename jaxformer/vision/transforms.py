"""The image operations of transformers' PIL backend, in numpy and PIL, step for step.

Every function takes and returns one image channels-first, ``(C, H, W)``, as transformers' ``PilBackend`` holds
it, and keeps its arithmetic: the resize goes through a uint8 PIL image (so it rounds to uint8 there, whatever the
input dtype), rescale multiplies in float64 and stores float32, normalize runs in the image's float dtype. Doing
the same operations in the same order is what makes ``pixel_values`` equal to the reference's bit for bit, not
merely close.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

# PIL's filter numbers, as preprocessor_config.json stores them under "resample".
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
CHANNEL_COUNTS = (1, 3, 4)  # grayscale, RGB, RGBA: the channel counts transformers recognizes


def channels_first(image, do_convert_rgb: bool, layout: str | None = None) -> np.ndarray:
    """One input image as ``(C, H, W)``: a PIL image, or a numpy array ``(H, W)``, ``(H, W, C)`` or ``(C, H, W)``.

    ``do_convert_rgb`` composites transparency onto white and repeats a gray channel three times, as transformers'
    ``convert_to_rgb`` does. ``layout`` ("channels_first" | "channels_last") settles an array's channel axis;
    without it the axis is inferred as transformers infers it (the first axis wins when both could be channels).
    """
    if isinstance(image, Image.Image):
        if do_convert_rgb:
            if "A" in image.getbands() or image.info.get("transparency") is not None:
                white = Image.new("RGBA", image.size, (255, 255, 255, 255))
                image = Image.alpha_composite(white, image.convert("RGBA"))
            image = image.convert("RGB")
        array = np.array(image)
        return array[None] if array.ndim == 2 else np.moveaxis(array, -1, 0)
    if not isinstance(image, np.ndarray):
        raise ValueError(f"an image must be a PIL image or a numpy array, got {type(image).__name__}")
    if not (np.issubdtype(image.dtype, np.integer) or np.issubdtype(image.dtype, np.floating)):
        raise ValueError(f"an image array must hold integers or floats, got dtype {image.dtype}")
    if image.ndim == 2:  # a grayscale array without a channel axis
        image, layout = image[None], "channels_first"
    if image.ndim != 3:
        raise ValueError(f"an image array must be (H, W), (H, W, C) or (C, H, W), got shape {image.shape}")
    if layout is None:
        layout = ("channels_first" if image.shape[0] in CHANNEL_COUNTS else
                  "channels_last" if image.shape[-1] in CHANNEL_COUNTS else None)
    channels = {"channels_first": image.shape[0], "channels_last": image.shape[-1], None: None}[layout]
    if channels not in CHANNEL_COUNTS:
        raise ValueError(f"an image of shape {image.shape} has no channel axis of 1 (gray), 3 (RGB) or 4 (RGBA) "
                         f"channels{f' ({layout})' if layout else ''}")
    image = image if layout == "channels_first" else np.moveaxis(image, -1, 0)
    return _to_rgb(image) if do_convert_rgb else image


def _to_rgb(image: np.ndarray) -> np.ndarray:
    """transformers' numpy ``convert_to_rgb`` on a channels-first array: gray repeated, alpha over white."""
    if image.shape[0] == 1:
        return np.repeat(image, 3, axis=0)
    if image.shape[0] == 3:
        return image
    integer = np.issubdtype(image.dtype, np.integer)
    if not integer and (image.min() < 0.0 or image.max() > 1.0):
        raise ValueError(f"a float RGBA image must lie in [0, 1] to be composited onto white, got "
                         f"[{image.min()}, {image.max()}]")
    white = 255 if integer else 1.0
    alpha = image[3:4] / white
    composite = alpha * image[:3] + (1 - alpha) * white
    return np.round(composite).astype(image.dtype) if integer else composite.astype(image.dtype)


def _pil_ready(image: np.ndarray) -> tuple[np.ndarray, bool]:
    """The uint8 (H, W[, C]) array PIL resizes, and whether it was scaled from [0, 1] (transformers' rule)."""
    array = np.moveaxis(image, 0, -1)
    array = array[..., 0] if array.shape[-1] == 1 else array
    if array.dtype == np.uint8:
        return array, False
    if np.allclose(array, array.astype(int)):
        if array.min() < 0 or array.max() > 255:
            raise ValueError(f"an integer-valued image must lie in [0, 255] to be resized, got "
                             f"[{array.min()}, {array.max()}]")
        return array.astype(np.uint8), False
    if array.min() < 0 or array.max() > 1:
        raise ValueError(f"a float image must lie in [0, 1] (or hold integers in [0, 255]) to be resized, got "
                         f"[{array.min()}, {array.max()}]")
    return rescale(array, 255).astype(np.uint8), True  # truncates, as transformers' cast does


def resize(image: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    """PIL's resize to ``(height, width)`` with filter ``resample``; float [0, 1] images come back in [0, 1]."""
    array, scaled = _pil_ready(image)
    out = np.array(Image.fromarray(array).resize((width, height), resample=resample))
    out = out[None] if out.ndim == 2 else np.moveaxis(out, -1, 0)
    return rescale(out, 1 / 255) if scaled else out


def shortest_edge_size(height: int, width: int, shortest: int) -> tuple[int, int]:
    """The shorter side set to ``shortest``, the longer one scaled and truncated (torchvision's rule)."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(shortest * long / short)
    return (new_long, shortest) if width <= height else (shortest, new_long)


def shortest_longest_size(height: int, width: int, shortest: int, longest: int) -> tuple[int, int]:
    """transformers' ``get_size_with_aspect_ratio``: the shorter side to ``shortest`` unless the longer one would
    pass ``longest``, then the longer side to ``longest``."""
    raw = None
    low, high = float(min(height, width)), float(max(height, width))
    if high / low * shortest > longest:
        raw = longest * low / high
        shortest = int(round(raw))
    if (height <= width and height == shortest) or (width <= height and width == shortest):
        return height, width
    if width < height:
        return int((raw if raw is not None else shortest) * height / width), shortest
    return shortest, int((raw if raw is not None else shortest) * width / height)


def fit_size(height: int, width: int, max_height: int, max_width: int) -> tuple[int, int]:
    """The aspect ratio kept, scaled until one side meets its maximum (up or down)."""
    scale = min(max_height / height, max_width / width)
    return int(height * scale), int(width * scale)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's target size: both sides multiples of ``factor``, the area within [min_pixels, max_pixels], the
    aspect ratio kept as closely as that allows. Python's ``round`` (half to even) is part of the rule."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"an image of {height}x{width} has an aspect ratio over 200, which Qwen2-VL refuses")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def center_crop(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """The central ``height x width`` window; an image smaller than it is first padded with zeros around."""
    _, h, w = image.shape
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0:
        return image[:, top:top + height, left:left + width]
    new_h, new_w = max(height, h), max(width, w)
    top_pad, left_pad = math.ceil((new_h - h) / 2), math.ceil((new_w - w) / 2)
    padded = np.zeros((image.shape[0], new_h, new_w), dtype=image.dtype)
    padded[:, top_pad:top_pad + h, left_pad:left_pad + w] = image
    top, left = top + top_pad, left + left_pad
    return padded[:, max(0, top):min(new_h, top + height), max(0, left):min(new_w, left + width)]


def rescale(image: np.ndarray, scale: float) -> np.ndarray:
    """``image * scale`` computed in float64, stored as float32 (transformers' order of casts)."""
    return (image.astype(np.float64) * scale).astype(np.float32)


def normalize(image: np.ndarray, mean, std) -> np.ndarray:
    """``(image - mean) / std`` per channel, in the image's float dtype (float32 for integer images)."""
    if not np.issubdtype(image.dtype, np.floating):
        image = image.astype(np.float32)
    channels = image.shape[0]
    mean, std = (np.array(v if isinstance(v, (tuple, list)) else [v] * channels, dtype=image.dtype)
                 for v in (mean, std))
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"an image with {channels} channel(s) cannot be normalized by image_mean / image_std of "
                         f"{len(mean)} / {len(std)} values (set do_convert_rgb to read gray or RGBA images as RGB)")
    return (image - mean[:, None, None]) / std[:, None, None]


def pad(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Zeros below and to the right, up to ``height x width``."""
    _, h, w = image.shape
    if h > height or w > width:
        raise ValueError(f"an image of {h}x{w} cannot be padded to {height}x{width} (pad_size)")
    return np.pad(image, ((0, 0), (0, height - h), (0, width - w)))


def patchify(image: np.ndarray, patch_size: int, merge_size: int, temporal_patch_size: int) -> np.ndarray:
    """Qwen2-VL's flattened patches ``[grid_h * grid_w, C * temporal_patch_size * patch_size**2]``.

    Rows run over merge_size x merge_size blocks, each block's patches contiguous (the order the patch merger
    reads); a still image fills every temporal slot with itself. Columns are (C, T, patch row, patch col)."""
    image = np.asarray(image, dtype=np.float32)
    channels, height, width = image.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    patches = image.reshape(channels, grid_h // merge_size, merge_size, patch_size,
                            grid_w // merge_size, merge_size, patch_size)
    patches = patches.transpose(1, 4, 2, 5, 0, 3, 6)  # (blocks h, blocks w, merge h, merge w, C, row, col)
    patches = np.broadcast_to(patches[:, :, :, :, :, None],
                              (*patches.shape[:5], temporal_patch_size, *patches.shape[5:]))
    return patches.reshape(grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size)
