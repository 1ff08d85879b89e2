"""The size arithmetic of the tiling and variable-resolution processors, as transformers computes it.

Pure functions of image sizes (no pixels): LLaVA-NeXT's ``anyres`` (best resolution among grid pinpoints, the
resized size inside it, and the unpadded feature count its placeholder expands to), Llama 3.2 Vision's tiled
canvas, Gemma 3's pan-and-scan crops and SigLIP2's NaFlex size. Each keeps transformers' rounding (``int``
truncation, ``ceil``, Python's half-to-even ``round``) since a size one pixel off changes every pixel value.
"""

from __future__ import annotations

import functools
import math


def best_resolution(height: int, width: int, pinpoints) -> tuple[int, int]:
    """LLaVA-NeXT: the (height, width) pinpoint that keeps the most of the image's resolution, and among those
    wastes the least canvas (the first wins a tie)."""
    best, most_kept, least_wasted = None, 0, float("inf")
    for pin_height, pin_width in pinpoints:
        scale = min(pin_width / width, pin_height / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = pin_width * pin_height - kept
        if kept > most_kept or (kept == most_kept and wasted < least_wasted):
            best, most_kept, least_wasted = (pin_height, pin_width), kept, wasted
    return best


def fit_inside(height: int, width: int, target_height: int, target_width: int) -> tuple[int, int]:
    """LLaVA-NeXT: the aspect ratio kept, one side equal to the target's, the other rounded up (and capped)."""
    scale_w, scale_h = target_width / width, target_height / height
    if scale_w < scale_h:
        return min(math.ceil(height * scale_w), target_height), target_width
    return target_height, min(math.ceil(width * scale_h), target_width)


def anyres_features(height: int, width: int, tile_height: int, tile_width: int, patch_size: int,
                    pinpoints) -> int:
    """LLaVA-NeXT's feature count for an image of ``height x width`` (before the select strategy drops the CLS
    token): the base tile's patches, plus the tiled grid's patches with the padding rows or columns removed and a
    newline feature per remaining row."""
    best_height, best_width = best_resolution(height, width, pinpoints)
    rows, cols = tile_height // patch_size, tile_width // patch_size
    grid_h, grid_w = rows * (best_height // tile_height), cols * (best_width // tile_width)
    if width / height > grid_w / grid_h:
        padding = (grid_h - int(round(height * (grid_w / width), 7))) // 2
        grid_h -= 2 * padding
    else:
        padding = (grid_w - int(round(width * (grid_h / height), 7))) // 2
        grid_w -= 2 * padding
    return grid_h * grid_w + grid_h + rows * cols


@functools.lru_cache(maxsize=16)
def tile_arrangements(max_tiles: int) -> tuple[tuple[int, int], ...]:
    """Llama 3.2 Vision: every (a, b) tile grid with a * b <= max_tiles, in transformers' order; its index + 1 is
    the image's ``aspect_ratio_id``."""
    return tuple((a, b) for a in range(1, max_tiles + 1) for b in range(1, max_tiles + 1) if a * b <= max_tiles)


def tiled_canvas(height: int, width: int, max_tiles: int, tile: int) -> tuple[int, int]:
    """Llama 3.2 Vision: the tile grid (tiles high, tiles wide) whose canvas needs the least upscaling, else the
    least downscaling; the smaller canvas among equals."""
    canvases = [(a * tile, b * tile) for a, b in tile_arrangements(max_tiles)]
    scales = [min(h / height, w / width) for h, w in canvases]
    up = [s for s in scales if s >= 1]
    chosen = min(up) if up else max(scales)
    canvas_h, canvas_w = min((c for c, s in zip(canvases, scales) if s == chosen), key=lambda c: c[0] * c[1])
    return canvas_h // tile, canvas_w // tile


def fit_to_canvas(height: int, width: int, canvas_height: int, canvas_width: int, tile: int) -> tuple[int, int]:
    """Llama 3.2 Vision: the size an image is resized to inside its canvas (no side below one tile unless the
    aspect ratio forces it; rounded down, at least 1)."""
    target_w, target_h = min(max(width, tile), canvas_width), min(max(height, tile), canvas_height)
    scale_h, scale_w = target_h / height, target_w / width
    if scale_w < scale_h:
        return min(math.floor(height * scale_w) or 1, target_h), target_w
    return target_h, min(math.floor(width * scale_h) or 1, target_w)


def pan_and_scan_boxes(height: int, width: int, min_crop: int, max_crops: int,
                       min_ratio: float) -> list[tuple[int, int, int, int]]:
    """Gemma 3: the (top, left, height, width) crops of an image whose aspect ratio reaches ``min_ratio``, along
    its long side (at least 2, at most ``max_crops``, none smaller than ``min_crop``); none otherwise. A crop may
    run past the image's edge, where it is cut short."""
    long, short = (width, height) if width >= height else (height, width)
    if long / short < min_ratio:
        return []
    count = min(max_crops, max(2, min(int(math.floor(long / min_crop)), int(math.floor(long / short + 0.5)))))
    crops_w, crops_h = (count, 1) if width >= height else (1, count)
    crop_w, crop_h = int(math.ceil(width / crops_w)), int(math.ceil(height / crops_h))
    if min(crop_w, crop_h) < min_crop:
        return []
    return [(crop_h * i, crop_w * j, crop_h, crop_w) for i in range(crops_h) for j in range(crops_w)]


def naflex_size(height: int, width: int, patch_size: int, max_patches: int, eps: float = 1e-5) -> tuple[int, int]:
    """SigLIP2 NaFlex: the largest scale (found by bisection, as transformers does) at which both sides, rounded
    up to multiples of ``patch_size``, hold at most ``max_patches`` patches."""
    def scaled(scale: float, side: int) -> int:
        return int(max(patch_size, math.ceil(side * scale / patch_size) * patch_size))

    low, high = eps / 10, 100.0
    while high - low >= eps:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch_size) * (scaled(scale, width) / patch_size) <= max_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)
