"""Vision inputs without torch: transformers' image processors in numpy and PIL (see ``processor``), the prompt's
image placeholders expanded as their multimodal processors expand them (see ``placeholders``), and image files
read with PIL (``read_image``)."""

from jaxformer.vision.loading import read_image
from jaxformer.vision.placeholders import ImagePlaceholders
from jaxformer.vision.processor import CONFIG_NAME, ImageProcessor

__all__ = ["CONFIG_NAME", "ImagePlaceholders", "ImageProcessor", "read_image"]
