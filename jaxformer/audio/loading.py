"""Audio files to waveforms without torch: ``soundfile`` (libsndfile, shipped inside its wheel) decodes, ``soxr``
resamples. The steps are transformers' ``load_audio(..., backend="soundfile")`` and librosa's ``load``: channels
averaged to mono, ``soxr_hq`` resampling, the result padded or cut to ``ceil(frames * rate / file_rate)``."""

from __future__ import annotations

import io
import math
import os

import numpy as np


def read_audio(source: str | os.PathLike | bytes | bytearray, sampling_rate: int = 16000) -> np.ndarray:
    """Read a WAV, FLAC, OGG (or any other libsndfile format) file, given as a path or its bytes, as a mono float32
    waveform at ``sampling_rate`` Hz. PCM files read into [-1, 1); a float file's samples come as stored, and
    resampling a full-scale signal may overshoot 1 slightly (as in transformers and librosa, which do not clip)."""
    import soundfile
    import soxr

    if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, int) or sampling_rate <= 0:
        raise ValueError(f"sampling_rate={sampling_rate!r} must be a positive int (Hz)")
    if isinstance(source, (bytes, bytearray)):
        name, handle = f"<{len(source)} bytes>", io.BytesIO(bytes(source))
    elif isinstance(source, (str, os.PathLike)):
        name, handle = os.fspath(source), os.fspath(source)
        if not os.path.isfile(handle):
            raise ValueError(f"audio file {name!r} does not exist")
    else:
        raise ValueError(f"read_audio takes a path or the file's bytes, got {type(source).__name__}")
    try:
        with soundfile.SoundFile(handle) as file:
            file_rate = file.samplerate
            channels = file.read(dtype="float32", always_2d=True).T
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as err:
        raise ValueError(f"{name} is not an audio file soundfile can read (WAV, FLAC, OGG, ...): {err}") from None
    if channels.shape[1] == 0:
        raise ValueError(f"{name} holds no audio (0 frames)")
    waveform = channels.mean(axis=0) if channels.shape[0] > 1 else channels[0]
    if file_rate != sampling_rate:
        frames = math.ceil(waveform.shape[0] * sampling_rate / file_rate)
        waveform = soxr.resample(waveform, file_rate, sampling_rate, quality="soxr_hq")
        waveform = np.pad(waveform, (0, max(0, frames - waveform.shape[0])))[:frames]
    return np.ascontiguousarray(waveform, dtype=np.float32)
