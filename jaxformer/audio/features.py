"""Whisper's log-mel features without torch, equal to transformers' ``WhisperFeatureExtractor``.

    extractor = FeatureExtractor.from_pretrained("path/to/whisper-large-v3")    # or FeatureExtractor.from_dict({...})
    batch = extractor([waveform, other], sampling_rate=16000)   # {"input_features": float32 [N, 128, 3000]}
    extractor.save_pretrained("out_dir")                        # the preprocessor_config.json transformers writes

Each waveform is cut and padded to ``chunk_length`` seconds (``n_samples``), optionally normalized to zero mean
and unit variance, then: a centred STFT (periodic Hann window of ``n_fft``, hop ``hop_length``, reflect padding),
the power spectrum, the Slaney mel filter bank (0 to 8000 Hz, area-normalized; the bank transformers builds), a
log10 floored at 1e-10, the last frame dropped, values below ``max - 8`` raised to it (per utterance) and
``(x + 4) / 4``. The STFT runs in float64 (transformers' numpy path does; its torch path runs in float32).

Reading a file follows transformers' constructor: the class's defaults overridden by the file's keys. The file's
``n_samples`` and ``nb_max_frames`` are recomputed from ``chunk_length``, ``sampling_rate`` and ``hop_length``, and
the legacy ``mel_filters`` array (openai/whisper-* files) is rebuilt, as transformers does; any other key
(``do_normalize``, which only the call reads, an unknown key) loads at any value and is written back. Writing gives
transformers' ``to_json_string``: every setting with the two derived sizes, sorted, two-space indented.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

CONFIG_NAME = "preprocessor_config.json"
PROCESSOR_CONFIG_NAME = "processor_config.json"  # a transformers-5 processor's settings, the extractor's nested
WHISPER = "WhisperFeatureExtractor"
# config.json's model_types whose extractor is Whisper's (transformers' auto mapping), for a file that names none
MODEL_TYPES = dict.fromkeys(("whisper", "qwen2_audio", "qwen2_5_omni", "qwen3_omni_moe", "voxtral", "glmasr",
                             "audioflamingo3"), WHISPER)
# Keys transformers' constructor sets and its to_dict drops (the class is `WHISPER`; the filters are rebuilt), and
# the sizes it recomputes.
DROPPED_KEYS = ("feature_extractor_type", "processor_class", "mel_filters", "window")
DERIVED_KEYS = ("n_samples", "nb_max_frames")
PADDING = {True: "longest", False: "do_not_pad", "longest": "longest", "max_length": "max_length",
           "do_not_pad": "do_not_pad"}
MEL_MAX_HZ = 8000.0  # Whisper's filters stop at 8 kHz whatever the sampling rate
LOG_FLOOR = 1e-10
DYNAMIC_RANGE = 8.0  # log10 units (80 dB) below the utterance's loudest value
NORM_EPSILON = 1e-7  # zero-mean unit-variance normalization: x / sqrt(var + eps)


@dataclasses.dataclass(frozen=True)
class FeatureExtractor:
    """One Whisper preprocessor_config.json, resolved; ``extra`` holds the file's other keys, written back. The
    defaults are transformers' (whisper-tiny to -large-v2; large-v3 sets feature_size 128)."""
    feature_size: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    chunk_length: int = 30
    n_fft: int = 400
    padding_value: float = 0.0
    dither: float = 0.0
    return_attention_mask: bool | None = False
    padding_side: str = "right"
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for name in ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if self.n_fft < 2:
            raise ValueError(f"n_fft={self.n_fft!r} must be at least 2 (the filter bank needs two frequency bins)")
        for name in ("padding_value", "dither"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}={value!r} must be a finite number")
        if self.return_attention_mask not in (None, True, False):
            raise ValueError(f"return_attention_mask={self.return_attention_mask!r} must be true, false or null")
        if self.padding_side not in ("right", "left"):
            raise ValueError(f"padding_side={self.padding_side!r} must be 'right' or 'left'")

    @property
    def n_samples(self) -> int:
        """The samples of one window: the length every waveform is cut and padded to by default."""
        return self.chunk_length * self.sampling_rate

    @property
    def nb_max_frames(self) -> int:
        return self.n_samples // self.hop_length

    @property
    def mel_filters(self) -> np.ndarray:
        """The filter bank, float64 [1 + n_fft // 2, feature_size]."""
        return mel_filter_bank(self.n_fft, self.feature_size, self.sampling_rate)

    # -------------------------------------------------------------------- reading and writing the file

    @classmethod
    def from_dict(cls, config: dict[str, Any], model_type: str | None = None) -> "FeatureExtractor":
        """Resolve a preprocessor_config.json dict as transformers' class would. ``model_type`` (config.json's)
        names the class when the dict names none."""
        if not isinstance(config, dict):
            raise ValueError(f"a preprocessor config must be a JSON object, got {type(config).__name__}")
        kind = config.get("feature_extractor_type")
        if kind is None and model_type is not None:
            kind = MODEL_TYPES.get(model_type)
            if kind is None:
                raise ValueError(f"model_type={model_type!r} has no feature extractor here; supported: "
                                 f"{sorted(MODEL_TYPES)}")
        if kind not in (None, WHISPER):
            raise ValueError(f"feature_extractor_type={kind!r} is not supported; supported: {WHISPER}")
        settings = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        given = {k: v for k, v in config.items() if k in settings}
        extra = {k: v for k, v in config.items() if k not in settings and k not in DROPPED_KEYS + DERIVED_KEYS}
        return cls(**given, extra=extra)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "FeatureExtractor":
        """Read a folder as transformers does: the ``feature_extractor`` (or ``audio_processor``) object of
        processor_config.json first, else preprocessor_config.json; or a JSON file given itself. The folder's
        config.json names the class when the file does not."""
        path = Path(path)
        file, config = path, None
        if path.is_dir():
            file = path / CONFIG_NAME
            if (path / PROCESSOR_CONFIG_NAME).exists():
                nested = _read_json(path / PROCESSOR_CONFIG_NAME)
                config = nested.get("feature_extractor", nested.get("audio_processor"))
                file = path / PROCESSOR_CONFIG_NAME if config is not None else file
        config = _read_json(file) if config is None else config
        model_type = None
        if (file.parent / "config.json").exists():
            model_config = _read_json(file.parent / "config.json")
            model_type = model_config.get("model_type") if isinstance(model_config, dict) else None
        try:
            return cls.from_dict(config, model_type)
        except ValueError as err:
            raise ValueError(f"{file}: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        """What transformers' ``to_dict`` gives: every setting, the derived sizes, the file's other keys."""
        out = dict(self.extra)
        out.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"})
        out.update(n_samples=self.n_samples, nb_max_frames=self.nb_max_frames, feature_extractor_type=WHISPER)
        return out

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """Write ``folder/preprocessor_config.json`` byte for byte as transformers' ``save_pretrained`` does."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_NAME).write_text(self.to_json_string(), encoding="utf-8")
        return folder / CONFIG_NAME

    # -------------------------------------------------------------------- the features

    def __call__(self, raw_speech, *, sampling_rate: int | None = None, padding: bool | str = "max_length",
                 max_length: int | None = None, truncation: bool = True, pad_to_multiple_of: int | None = None,
                 return_attention_mask: bool | None = None, do_normalize: bool | None = None,
                 rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        """Features of one waveform (1-D array or list of floats) or a batch (a list of them, or a 2-D array),
        mono at ``sampling_rate``; arguments as transformers' ``__call__``. Returns ``input_features`` float32
        [N, feature_size, frames] and, as transformers does, ``attention_mask`` int32: per frame [N, frames]
        when ``return_attention_mask`` is true; per sample [N, samples] when it is not but the mask was made
        anyway (``do_normalize`` true, or the file's ``return_attention_mask`` true). ``rng`` draws the dither
        noise (random by default, as in transformers; no dither, no noise)."""
        if sampling_rate is not None and sampling_rate != self.sampling_rate:
            raise ValueError(f"sampling_rate={sampling_rate!r}, but this extractor reads {self.sampling_rate} Hz "
                             "audio: resample first (read_audio does)")
        if not isinstance(padding, (bool, str)) or padding not in PADDING:
            raise ValueError(f"padding={padding!r} must be 'max_length', 'longest' (or true), 'do_not_pad' (or false)")
        padding = PADDING[padding]
        multiple = pad_to_multiple_of
        if multiple is not None and (isinstance(multiple, bool) or not isinstance(multiple, int) or multiple <= 0):
            raise ValueError(f"pad_to_multiple_of={multiple!r} must be a positive int")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 0):
            raise ValueError(f"max_length={max_length!r} must be a non-negative int (0 or null: n_samples)")
        waveforms = _waveforms(raw_speech)
        # transformers' precedence, kept for equal outputs: the mask is made when either argument is true, or,
        # both unset or false, when the file says so; it is cut to frames only when the argument is true.
        make_mask = return_attention_mask or do_normalize
        make_mask = self.return_attention_mask if make_mask is None else make_mask

        target = _round_up(max_length or self.n_samples, multiple)
        if truncation:
            waveforms = [w[:target] for w in waveforms]
        length = {"max_length": target, "longest": _round_up(max(len(w) for w in waveforms), multiple),
                  "do_not_pad": 0}[padding]
        lengths = {max(len(w), length) for w in waveforms}  # padding never cuts
        if len(lengths) > 1:
            raise ValueError(f"waveforms of lengths {[len(w) for w in waveforms]} stay of different lengths under "
                             f"padding={padding!r}, truncation={truncation!r}: a batch needs one length (pad and "
                             "truncate, or extract one at a time)")
        batch = np.full((len(waveforms), lengths.pop()), self.padding_value, np.float32)
        mask = np.zeros(batch.shape, np.int32)
        for row, waveform in enumerate(waveforms):
            start = batch.shape[1] - len(waveform) if self.padding_side == "left" else 0
            batch[row, start:start + len(waveform)] = waveform
            mask[row, start:start + len(waveform)] = 1
        if batch.shape[1] <= self.n_fft // 2:
            raise ValueError(f"a waveform of {batch.shape[1]} samples (after padding) is too short for n_fft="
                             f"{self.n_fft}: the centred STFT reflects {self.n_fft // 2} samples at each end")
        if do_normalize:
            batch = self._normalized(batch, mask)
        if self.dither != 0.0:
            rng = np.random.default_rng() if rng is None else rng
            batch = batch + np.float32(self.dither) * rng.standard_normal(batch.shape, dtype=np.float32)
        out = {"input_features": np.stack([self.log_mel(w) for w in batch])}
        if return_attention_mask:
            frames = mask[:, ::self.hop_length]  # one per hop; the STFT's last frame was dropped
            out["attention_mask"] = frames[:, :-1] if mask.shape[1] % self.hop_length else frames
        elif make_mask:
            out["attention_mask"] = mask
        return out

    def _normalized(self, batch: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Zero mean and unit variance over each waveform's first ``real length`` samples (transformers' slice,
        which is the real audio when padding is on the right), the padding set to ``padding_value``."""
        out = np.empty_like(batch)
        for row, (waveform, length) in enumerate(zip(batch, mask.sum(-1))):
            real = waveform[:length]
            out[row] = (waveform - real.mean()) / np.sqrt(real.var() + NORM_EPSILON)
            out[row, length:] = self.padding_value
        return out

    def log_mel(self, waveform: np.ndarray) -> np.ndarray:
        """Whisper's log-mel spectrogram of one waveform of L samples: float32 [feature_size, L // hop_length]."""
        half = self.n_fft // 2
        padded = np.pad(np.asarray(waveform, np.float64), half, mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(padded, self.n_fft)[::self.hop_length]
        spectrum = np.fft.rfft(frames * hann_window(self.n_fft), axis=-1)
        power = spectrum.real ** 2 + spectrum.imag ** 2
        mel = np.maximum(power[:-1] @ self.mel_filters, LOG_FLOOR)
        log = np.log10(mel).T
        log = np.maximum(log, log.max() - DYNAMIC_RANGE)
        return ((log + 4.0) / 4.0).astype(np.float32)


@functools.lru_cache(maxsize=8)
def hann_window(length: int) -> np.ndarray:
    """The periodic Hann window (torch.hann_window's): a symmetric one of length + 1 without its last point."""
    window = np.hanning(length + 1)[:-1]
    window.flags.writeable = False
    return window


def _hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    """Slaney's mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic (27 mels per factor 6.4) above."""
    hz = np.asarray(hz, np.float64)
    return np.where(hz < 1000.0, 3.0 * hz / 200.0, 15.0 + np.log(np.maximum(hz, 1e-12) / 1000.0) * (27.0 / np.log(6.4)))


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    return np.where(mel < 15.0, 200.0 * mel / 3.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mel - 15.0)))


@functools.lru_cache(maxsize=8)
def mel_filter_bank(n_fft: int, mel_bins: int, sampling_rate: int) -> np.ndarray:
    """Whisper's mel filters, float64 [1 + n_fft // 2, mel_bins]: triangles between mel_bins + 2 points evenly
    spaced on Slaney's mel scale from 0 to 8 kHz, drawn over the FFT bins' frequencies in Hz, each scaled by 2 /
    its width in Hz (Slaney's area normalization); librosa's ``filters.mel(norm="slaney")``."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(MEL_MAX_HZ), mel_bins + 2))
    bins = np.linspace(0, sampling_rate // 2, 1 + n_fft // 2)
    distance = edges[None, :] - bins[:, None]  # [bins, mel_bins + 2]: how far each edge lies above each bin
    widths = np.diff(edges)
    rising = -distance[:, :-2] / widths[:-1]
    falling = distance[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (edges[2:] - edges[:-2]))
    filters.flags.writeable = False
    return filters


def _round_up(length: int, multiple: int | None) -> int:
    return length if not multiple or length % multiple == 0 else (length // multiple + 1) * multiple


def _waveforms(raw_speech) -> list[np.ndarray]:
    """One waveform (a 1-D array or a list of numbers) or a batch (a list of them, or a 2-D array) as a list of
    float32 1-D arrays, as transformers reads them."""
    if isinstance(raw_speech, np.ndarray):
        if raw_speech.ndim > 2 or raw_speech.ndim == 0:
            raise ValueError(f"an audio array of shape {raw_speech.shape}: give one mono waveform [samples] or a "
                             "batch [N, samples] (read_audio mixes channels down)")
        items = list(raw_speech) if raw_speech.ndim == 2 else [raw_speech]
    elif isinstance(raw_speech, (list, tuple)) and raw_speech:
        items = list(raw_speech) if isinstance(raw_speech[0], (np.ndarray, list, tuple)) else [raw_speech]
    else:
        raise ValueError(f"audio must be a waveform (numpy array or list of floats) or a list of them, got "
                         f"{type(raw_speech).__name__ if raw_speech != [] else 'an empty list'} (read_audio reads "
                         "files)")
    out = []
    for index, item in enumerate(items):
        try:
            waveform = np.asarray(item, dtype=np.float32)
        except (TypeError, ValueError):
            raise ValueError(f"waveform {index} is not a sequence of numbers") from None
        if waveform.ndim != 1:
            raise ValueError(f"waveform {index} has shape {waveform.shape}; each must be mono, 1-D [samples]")
        if not np.isfinite(waveform).all():
            raise ValueError(f"waveform {index} holds NaN or infinite samples")
        out.append(waveform)
    return out


def _read_json(file: Path) -> dict:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{file} is not a readable preprocessor config: {err}") from None
