"""Vision inputs without torch: transformers' image processors in numpy and PIL (see ``processor``), and the
prompt's image placeholders expanded as their multimodal processors expand them (see ``placeholders``)."""

from jaxformer.vision.placeholders import ImagePlaceholders
from jaxformer.vision.processor import CONFIG_NAME, ImageProcessor

__all__ = ["CONFIG_NAME", "ImagePlaceholders", "ImageProcessor"]
