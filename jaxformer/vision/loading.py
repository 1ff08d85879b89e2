"""Image files read with PIL, for the command line and anyone holding a path rather than a picture; which image
inputs the command line prepares for a model."""

from __future__ import annotations

import os


def read_image(path: str | os.PathLike, flag: str = "image"):
    """The PIL image stored at ``path``, loaded (the file closed); any format PIL reads. ``flag`` names the
    argument in the error a missing or unreadable file raises."""
    from PIL import Image

    name = os.fspath(path)
    if not os.path.isfile(name):
        raise ValueError(f"{flag} {name}: no such file")
    try:
        with Image.open(name) as picture:
            picture.load()
            return picture
    except OSError as err:  # (PIL's UnidentifiedImageError too)
        raise ValueError(f"{flag} {name}: not a readable image ({err})") from None


def image_tower(cfg):
    """The ModelConfig of ``cfg``'s image tower: its vision part's (a dual encoder, LLaVA) or ``cfg`` itself."""
    return cfg.vision.tower if cfg.vision is not None else cfg


def refuse_unprepared_images(cfg, path, flag: str) -> None:
    """Refuses a model whose image tower reads inputs beside pixel_values that ``flag`` does not prepare: Llama 3.2
    Vision's tiles (aspect_ratio_ids and aspect_ratio_mask) and Qwen2-VL's patches of any size (image_grid_thw)."""
    tower = image_tower(cfg)
    patches = tower.patches
    if patches is not None and (patches.tiles or patches.merge):
        inputs = ("tiled images (with aspect_ratio_ids and aspect_ratio_mask)" if patches.tiles else
                  "images of any size cut into patches (with image_grid_thw)")
        raise ValueError(f"{flag} on {path}: its image tower ({tower.name!r}) reads {inputs}; {flag} prepares "
                         "pixel_values (ViT's, CLIP's, SigLIP's, LLaVA's) and not those inputs yet")
