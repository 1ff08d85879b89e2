"""Whisper feature extraction speed: jaxformer.audio.FeatureExtractor vs transformers' WhisperFeatureExtractor.

``--minutes`` of speech-like audio (voiced syllables with pauses over a little noise, 16 kHz) cut into 30 s
windows go through whisper-large-v3's published preprocessor config (128 mel bins), each library in turn,
``--repeats`` times, alternating (A, B, A, B, ...) so machine load hits both, after one untimed pass each.
transformers' side is its default: the torch STFT (float32) when torch is installed, its numpy STFT otherwise;
``--numpy-reference`` forces the numpy one, the path jaxformer reproduces. Reports audio seconds processed per
wall second from the median times, their ratio and the largest difference between the two outputs.
``--small`` (one minute, one repeat) only checks that the script runs.

    python benchmarks/audio_features.py [--minutes 10] [--repeats 5] [--numpy-reference] [--small] [--json]
"""

from __future__ import annotations

import argparse
import json
import warnings

import numpy as np

from side_by_side import interleaved  # (this folder)

RATE = 16000
WINDOW_SECONDS = 30
WHISPER_LARGE_V3 = {
    "chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128, "hop_length": 160,
    "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right", "padding_value": 0.0,
    "processor_class": "WhisperProcessor", "return_attention_mask": False, "sampling_rate": 16000}


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """Voiced syllables: a glottal pulse train (pitch gliding around 120 Hz) through three vowel formants, in
    syllable envelopes with pauses, plus breath noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    pitch = 120 + 25 * np.sin(2 * np.pi * 0.7 * t)
    pulses = np.diff(np.floor(np.cumsum(pitch) / RATE), prepend=0.0)
    ring = np.arange(int(0.02 * RATE)) / RATE
    voice = sum(np.convolve(pulses, np.exp(-np.pi * bandwidth * ring) * np.sin(2 * np.pi * formant * ring))[:len(t)]
                for formant, bandwidth in ((700, 80), (1200, 90), (2600, 120)))
    envelope = np.clip(np.sin(2 * np.pi * 3.5 * t), 0, None) * (np.sin(2 * np.pi * 0.4 * t) > -0.6)
    signal = voice * envelope + 0.01 * rng.standard_normal(len(t))
    return (0.5 * signal / np.abs(signal).max()).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--numpy-reference", action="store_true", help="time transformers' numpy STFT path")
    parser.add_argument("--small", action="store_true", help="one minute, one repeat: checks the script runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.small:
        args.minutes, args.repeats = 1.0, 1
    warnings.filterwarnings("ignore")
    from transformers import WhisperFeatureExtractor
    from transformers.models.whisper import feature_extraction_whisper
    from transformers.utils import logging

    from jaxformer.audio import FeatureExtractor

    logging.set_verbosity_error()
    if args.numpy_reference:
        feature_extraction_whisper.is_torch_available = lambda: False
    audio = speech_like(args.minutes * 60)
    step = WINDOW_SECONDS * RATE
    windows = [audio[start:start + step] for start in range(0, len(audio), step)]
    theirs = WhisperFeatureExtractor.from_dict(dict(WHISPER_LARGE_V3))
    ours = FeatureExtractor.from_dict(WHISPER_LARGE_V3)
    sides = {"jaxformer": lambda: ours(windows)["input_features"],
             "transformers": lambda: theirs(windows, sampling_rate=RATE, return_tensors="np")["input_features"]}
    outputs, seconds, _ = interleaved(sides, args.repeats)
    speed = {side: len(audio) / RATE / median for side, median in seconds.items()}
    path = "numpy" if args.numpy_reference or not feature_extraction_whisper.is_torch_available() else "torch"
    row = {"minutes": args.minutes, "windows": len(windows), "repeats": args.repeats, "reference_stft": path,
           "jaxformer_audio_s_per_s": round(speed["jaxformer"], 1),
           "transformers_audio_s_per_s": round(speed["transformers"], 1),
           "ratio": round(speed["jaxformer"] / speed["transformers"], 3),
           "max_abs_diff": float(np.abs(outputs["jaxformer"] - outputs["transformers"]).max())}
    if args.json:
        print(json.dumps(row))
        return
    print(f"{args.minutes:g} min of speech-like audio in {len(windows)} windows of {WINDOW_SECONDS} s, 128 mel bins; "
          f"median of {args.repeats}, interleaved")
    print(f"  jaxformer {row['jaxformer_audio_s_per_s']:.1f} audio s/s, transformers ({path} STFT) "
          f"{row['transformers_audio_s_per_s']:.1f} audio s/s, ratio {row['ratio']:.2f}x, "
          f"largest difference {row['max_abs_diff']:.1e}")


if __name__ == "__main__":
    main()
