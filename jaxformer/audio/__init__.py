"""Audio inputs without torch: files read and resampled as transformers reads them (see ``loading``), and
Whisper's log-mel features equal to transformers' ``WhisperFeatureExtractor`` (see ``features``)."""

from jaxformer.audio.features import CONFIG_NAME, FeatureExtractor
from jaxformer.audio.loading import read_audio

__all__ = ["CONFIG_NAME", "FeatureExtractor", "read_audio"]
