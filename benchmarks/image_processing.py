"""Image preprocessing speed: jaxformer.vision.ImageProcessor vs transformers' image processor, same images.

``--images`` photograph-like PIL drawings (gradient, noise, shapes, text) of mixed sizes (96 to 1024 a side, a
quarter of them RGBA) go through CLIP ViT-B/32's and Qwen2.5-VL-7B's published preprocessor configs, each
library in turn, ``--repeats`` times, alternating (A, B, A, B, ...) so machine load hits both, after one untimed
pass each. transformers' side is the processor AutoImageProcessor gives here: the PIL backend when torchvision
is absent (its "fast" torchvision backend otherwise, whose resize gives other numbers). Reports images/s from
the median times, their ratio and the largest difference between the two outputs.

    python benchmarks/image_processing.py [--images 64] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from side_by_side import interleaved  # (this folder)

CONFIGS = {
    "clip-vit-base-patch32": {
        "crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
        "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "size": 224},
    "qwen2.5-vl-7b": {
        "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"},
}


def drawings(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    images = []
    for i in range(count):
        width, height = (int(v) for v in rng.integers(96, 1025, size=2))
        y, x = np.mgrid[0:height, 0:width]
        rgb = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin(x / 9 + y / 13)], -1)
        image = Image.fromarray(np.clip(rgb + rng.normal(0, 10, rgb.shape), 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(image)
        draw.ellipse((width * 0.1, height * 0.2, width * 0.6, height * 0.8), fill=(200, 50, 50))
        draw.text((5, 5), f"image {i}", fill=(255, 255, 255))
        images.append(image.convert("RGBA") if i % 4 == 3 else image)
    return images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from transformers import AutoImageProcessor
    from transformers.utils import logging

    from jaxformer.vision import ImageProcessor

    logging.set_verbosity_error()
    images = drawings(args.images)
    results = {}
    for name, config in CONFIGS.items():
        folder = Path(tempfile.mkdtemp(prefix="jaxformer-images-"))
        (folder / "preprocessor_config.json").write_text(json.dumps(config))
        theirs = AutoImageProcessor.from_pretrained(str(folder))
        ours = ImageProcessor.from_pretrained(folder)
        sides = {"jaxformer": lambda: ours(images), "transformers": lambda: theirs(images, return_tensors="np")}
        outputs, seconds, _ = interleaved(sides, args.repeats)
        rate = {side: args.images / median for side, median in seconds.items()}
        diff = max(float(np.abs(np.asarray(outputs["jaxformer"][k]) - np.asarray(outputs["transformers"][k])).max())
                   for k in outputs["transformers"])
        results[name] = {"reference": type(theirs).__name__, "jaxformer_images_s": round(rate["jaxformer"], 1),
                         "transformers_images_s": round(rate["transformers"], 1),
                         "ratio": round(rate["jaxformer"] / rate["transformers"], 3), "max_abs_diff": diff}
    if args.json:
        print(json.dumps({"images": args.images, "repeats": args.repeats, **results}))
        return
    print(f"{args.images} PIL drawings, 96-1024 a side, a quarter RGBA; median of {args.repeats}, interleaved")
    for name, row in results.items():
        print(f"  {name:<22} jaxformer {row['jaxformer_images_s']:7.1f} images/s, {row['reference']} "
              f"{row['transformers_images_s']:7.1f} images/s, ratio {row['ratio']:.2f}x, "
              f"largest difference {row['max_abs_diff']:.1e}")


if __name__ == "__main__":
    main()
