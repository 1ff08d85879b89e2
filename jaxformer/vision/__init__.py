"""Vision inputs without torch: transformers' image processors in numpy and PIL (see ``processor``)."""

from jaxformer.vision.processor import CONFIG_NAME, ImageProcessor

__all__ = ["CONFIG_NAME", "ImageProcessor"]
