"""jaxformer.audio against transformers: ``read_audio`` equal to its ``load_audio(backend="soundfile")`` bit for bit
on WAV, FLAC and OGG files of other rates and channel counts; Whisper's ``input_features`` within 1e-5 of its
``WhisperFeatureExtractor`` (measured: 1.2e-7) on numpy-made signals and speech-like audio (a spoken sentence
where espeak-ng is installed), at 80 and 128 mel bins, for batches of different lengths under every padding, mask
and normalization setting; the preprocessor_config.json written back byte for byte; bad settings, files and
waveforms refused by name.

transformers has two paths: numpy (float64 STFT) when torch is absent, torch (float32 STFT) when it is present.
We follow the numpy path and compare with it at 1e-5; the torch path differs from transformers' own numpy path by
up to 6e-5 on tones and chirps, so against it we check that we are no farther than its own numpy path is."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from jaxformer.audio import FeatureExtractor, read_audio

transformers = pytest.importorskip("transformers")
soundfile = pytest.importorskip("soundfile")
from transformers.models.whisper import feature_extraction_whisper  # noqa: E402

RATE = 16000
TOLERANCE = 1e-5
# The published preprocessor_config.json files, key for key (openai/whisper-tiny's also holds the 201 x 80
# mel_filters array, stood in for by transformers' own bank: both are rebuilt on loading).
WHISPER_TINY = {
    "chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80, "hop_length": 160,
    "mel_filters": feature_extraction_whisper.WhisperFeatureExtractor().mel_filters.tolist(), "n_fft": 400,
    "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right", "padding_value": 0.0,
    "processor_class": "WhisperProcessor", "return_attention_mask": False, "sampling_rate": 16000}
WHISPER_LARGE_V3 = {
    "chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128, "hop_length": 160,
    "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right", "padding_value": 0.0,
    "processor_class": "WhisperProcessor", "return_attention_mask": False, "sampling_rate": 16000}
QWEN2_AUDIO = {**WHISPER_LARGE_V3, "processor_class": "Qwen2AudioProcessor", "return_attention_mask": True}
PUBLISHED = {"whisper-tiny": WHISPER_TINY, "whisper-large-v3": WHISPER_LARGE_V3, "qwen2-audio": QWEN2_AUDIO}


@pytest.fixture
def numpy_path(monkeypatch):
    """transformers' extractor as it runs without torch (its numpy STFT), the path we reproduce."""
    monkeypatch.setattr(feature_extraction_whisper, "is_torch_available", lambda: False)


def _reference(config: dict):
    reference = feature_extraction_whisper.WhisperFeatureExtractor.from_dict(dict(config))
    return reference, FeatureExtractor.from_dict(config)


def _speech_like(seconds: float, seed: int) -> np.ndarray:
    """Voiced syllables: a glottal pulse train (pitch gliding around 120 Hz) through three vowel formants, in
    syllable envelopes with pauses, plus breath noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    pitch = 120 + 25 * np.sin(2 * np.pi * 0.7 * t)
    pulses = np.diff(np.floor(np.cumsum(pitch) / RATE), prepend=0.0)
    voice = np.zeros_like(t)
    ring = np.arange(int(0.02 * RATE)) / RATE
    for formant, bandwidth in ((700, 80), (1200, 90), (2600, 120)):
        voice += np.convolve(pulses, np.exp(-np.pi * bandwidth * ring) * np.sin(2 * np.pi * formant * ring))[:len(t)]
    envelope = np.clip(np.sin(2 * np.pi * 3.5 * t), 0, None) * (np.sin(2 * np.pi * 0.4 * t) > -0.6)
    signal = voice * envelope + 0.01 * rng.standard_normal(len(t))
    return (0.5 * signal / np.abs(signal).max()).astype(np.float32)


def _chirp(seconds: float, low: float, high: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.8 * np.sin(2 * np.pi * (low * t + (high - low) * t ** 2 / (2 * seconds)))).astype(np.float32)


@pytest.fixture(scope="module")
def signals() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(12 * RATE) / RATE
    return {
        "tone 440 Hz 12 s": (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32),
        "chirp 50 Hz-7.9 kHz 9 s": _chirp(9, 50, 7900),
        "white noise 5 s": (0.3 * rng.standard_normal(5 * RATE)).astype(np.float32),
        "silence 3 s": np.zeros(3 * RATE, np.float32),
        "clipped tone 4 s": np.clip(3 * np.sin(2 * np.pi * 220 * t[:4 * RATE]), -1, 1).astype(np.float32),
        "short 0.3 s": (0.2 * rng.standard_normal(int(0.3 * RATE))).astype(np.float32),
        "long 37 s chirp": _chirp(37, 100, 4000),
        "speech-like 6 s": _speech_like(6, seed=1),
        "quiet pulse 1 s": (1e-4 * (np.arange(RATE) % 400 == 0)).astype(np.float32),
    }


def _assert_close(got: dict, expected, tolerance: float = TOLERANCE) -> float:
    """Same keys, shapes and dtypes; input_features within ``tolerance``, masks equal. Returns the largest gap."""
    assert set(got) == set(expected)
    for key in expected:
        want = np.asarray(expected[key])
        assert got[key].shape == want.shape and got[key].dtype == want.dtype, (key, got[key].shape, want.shape)
        if key != "input_features":
            assert np.array_equal(got[key], want), key
    gap = float(np.abs(got["input_features"].astype(np.float64) - expected["input_features"]).max())
    assert gap <= tolerance, gap
    return gap


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_configs_give_transformers_features(name, signals, numpy_path):
    reference, ours = _reference(PUBLISHED[name])
    batch = list(signals.values())
    _assert_close(ours(batch, sampling_rate=RATE), reference(batch, sampling_rate=RATE))
    for signal in batch[:2]:  # one waveform at a time, and as a list of floats
        _assert_close(ours(signal), reference(signal, sampling_rate=RATE))
    _assert_close(ours(batch[-1].tolist()), reference(batch[-1].tolist(), sampling_rate=RATE))


def test_torch_path_is_as_close_to_us_as_to_its_own_numpy_path(signals):
    """Where transformers runs its torch STFT (float32), we are no farther from it than its numpy path is."""
    reference, ours = _reference(WHISPER_LARGE_V3)
    batch = list(signals.values())
    torch_features = reference(batch, sampling_rate=RATE)["input_features"]
    numpy_features = reference._np_extract_fbank_features(
        np.stack([np.pad(s[:480000], (0, max(0, 480000 - len(s)))) for s in batch]), "cpu")
    own_gap = np.abs(torch_features - numpy_features).max()
    assert np.abs(ours(batch)["input_features"] - torch_features).max() <= own_gap + 1e-6 <= 1e-4


CALLS = {
    "attention mask": {"return_attention_mask": True},
    "normalized": {"do_normalize": True},
    "normalized with mask": {"do_normalize": True, "return_attention_mask": True},
    "longest": {"padding": "longest", "return_attention_mask": True},
    "longest, multiple of 1000": {"padding": True, "pad_to_multiple_of": 1000, "return_attention_mask": True},
    "longest, no truncation": {"padding": "longest", "truncation": False, "return_attention_mask": True},
    "max_length 2 s": {"max_length": 2 * RATE, "return_attention_mask": True},
    "max_length 12345, multiple of 160": {"max_length": 12345, "pad_to_multiple_of": 160, "do_normalize": True},
    "mask false": {"return_attention_mask": False},
}


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("config", ["whisper-tiny", "qwen2-audio"])
def test_call_arguments_give_transformers_features(call, config, signals, numpy_path):
    reference, ours = _reference(PUBLISHED[config])
    batch = [signals[n] for n in ("speech-like 6 s", "short 0.3 s", "long 37 s chirp", "silence 3 s")]
    _assert_close(ours(batch, **CALLS[call]), reference(batch, sampling_rate=RATE, **CALLS[call]))


VARIANTS = {
    "left padding, padding value 0.1": {**WHISPER_LARGE_V3, "padding_side": "left", "padding_value": 0.1},
    "8 kHz, n_fft 256, hop 80, 10 s chunks": {**WHISPER_TINY, "sampling_rate": 8000, "n_fft": 256, "hop_length": 80,
                                             "chunk_length": 10, "n_samples": 80000, "nb_max_frames": 1000},
    "odd n_fft 401, 64 bins": {**WHISPER_TINY, "n_fft": 401, "feature_size": 64},
    "legacy: no dither, no padding_side, mel_filters null": {
        k: v for k, v in {**WHISPER_LARGE_V3, "mel_filters": None}.items() if k not in ("padding_side",)},
}


@pytest.mark.filterwarnings("ignore:At least one mel filter")  # 8 kHz audio: the bins above 4 kHz are empty
@pytest.mark.parametrize("name", list(VARIANTS))
def test_config_variants_give_transformers_features(name, signals, numpy_path):
    reference, ours = _reference(VARIANTS[name])
    batch = [signals[n] for n in ("chirp 50 Hz-7.9 kHz 9 s", "short 0.3 s", "white noise 5 s")]
    for kwargs in ({}, {"padding": "longest", "return_attention_mask": True, "do_normalize": True}):
        _assert_close(ours(batch, **kwargs), reference(batch, sampling_rate=ours.sampling_rate, **kwargs))


def test_spoken_sentence_gives_transformers_features(tmp_path, numpy_path):
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed (Debian package espeak-ng): no spoken sentence to read; the "
                    "synthetic speech-like signal stands in for it in the other tests")
    wav = tmp_path / "sentence.wav"
    subprocess.run([espeak, "-w", str(wav), "The quick brown fox jumps over the lazy dog, twice."], check=True,
                   capture_output=True)
    waveform = read_audio(wav)  # espeak speaks at 22050 Hz: read_audio resamples
    np.testing.assert_array_equal(waveform, transformers.audio_utils.load_audio(str(wav), backend="soundfile"))
    reference, ours = _reference(WHISPER_LARGE_V3)
    _assert_close(ours(waveform, return_attention_mask=True),
                  reference(waveform, sampling_rate=RATE, return_attention_mask=True))


def test_dither_adds_seeded_noise(signals):
    silence = signals["silence 3 s"]
    plain = FeatureExtractor()(silence)["input_features"]
    dithered = FeatureExtractor(dither=1e-4)
    first = dithered(silence, rng=np.random.default_rng(7))["input_features"]
    assert np.array_equal(first, dithered(silence, rng=np.random.default_rng(7))["input_features"])
    assert not np.array_equal(first, plain)  # noise lifts the silent spectrum off the 1e-10 floor


# ------------------------------------------------------------------------------------------------ the file

@pytest.mark.filterwarnings("ignore:At least one mel filter")
@pytest.mark.parametrize("name", list(PUBLISHED) + list(VARIANTS) + ["extras"])
def test_preprocessor_config_round_trip(name, tmp_path):
    config = {**PUBLISHED, **VARIANTS, "extras": {**QWEN2_AUDIO, "do_normalize": True, "padding_value": 0,
                                                   "return_attention_mask": None, "custom": [1, None]}}[name]
    reference, ours = _reference(config)
    reference.save_pretrained(tmp_path / "theirs")
    written = ours.save_pretrained(tmp_path / "ours")
    assert written.read_bytes() == (tmp_path / "theirs" / "preprocessor_config.json").read_bytes()
    assert FeatureExtractor.from_pretrained(tmp_path / "ours") == ours


def test_folders_are_read_as_transformers_reads_them(tmp_path):
    unnamed = {k: v for k, v in WHISPER_LARGE_V3.items() if k != "feature_extractor_type"}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(unnamed))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    assert FeatureExtractor.from_pretrained(tmp_path).feature_size == 128  # config.json's model_type names it
    with pytest.raises(ValueError, match="model_type='wav2vec2'"):
        FeatureExtractor.from_dict(unnamed, model_type="wav2vec2")
    # a transformers-5 processor folder: processor_config.json's nested feature_extractor comes first
    nested = {"feature_extractor": {**WHISPER_TINY, "chunk_length": 20}, "processor_class": "WhisperProcessor"}
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    theirs = transformers.WhisperFeatureExtractor.from_pretrained(str(tmp_path))
    assert FeatureExtractor.from_pretrained(tmp_path).to_json_string() == theirs.to_json_string()
    (tmp_path / "processor_config.json").write_text(json.dumps({"audio_processor": WHISPER_LARGE_V3}))
    theirs = transformers.WhisperFeatureExtractor.from_pretrained(str(tmp_path))
    assert FeatureExtractor.from_pretrained(tmp_path).to_json_string() == theirs.to_json_string()


@pytest.mark.parametrize("config, message", [
    ({**WHISPER_TINY, "feature_extractor_type": "Wav2Vec2FeatureExtractor"}, "feature_extractor_type="),
    ({**WHISPER_TINY, "feature_size": 0}, "feature_size=0"),
    ({**WHISPER_TINY, "chunk_length": 30.0}, "chunk_length=30.0"),
    ({**WHISPER_TINY, "hop_length": True}, "hop_length=True"),
    ({**WHISPER_TINY, "n_fft": 1}, "n_fft=1"),
    ({**WHISPER_TINY, "dither": None}, "dither=None"),
    ({**WHISPER_TINY, "padding_value": "0"}, "padding_value='0'"),
    ({**WHISPER_TINY, "padding_side": "center"}, "padding_side='center'"),
    ({**WHISPER_TINY, "return_attention_mask": "yes"}, "return_attention_mask='yes'"),
])
def test_bad_settings_are_refused_by_name(config, message):
    with pytest.raises(ValueError, match=message):
        FeatureExtractor.from_dict(config)


@pytest.mark.parametrize("audio, kwargs, message", [
    (np.zeros((2, 2, 100), np.float32), {}, "mono waveform"),
    ("speech.wav", {}, "read_audio reads files"),
    ([], {}, "empty list"),
    ([np.zeros(100), np.zeros((2, 10))], {}, "waveform 1 has shape"),
    ([np.array([0.0, np.nan])], {}, "NaN"),
    (np.zeros(16000, np.float32), {"sampling_rate": 44100}, "sampling_rate=44100"),
    (np.zeros(16000, np.float32), {"padding": "shortest"}, "padding='shortest'"),
    (np.zeros(16000, np.float32), {"pad_to_multiple_of": 0}, "pad_to_multiple_of=0"),
    ([np.zeros(500), np.zeros(600)], {"padding": False}, "stay of different lengths"),
    ([np.zeros(500000), np.zeros(100)], {"truncation": False}, "stay of different lengths"),
    (np.zeros(150, np.float32), {"padding": "longest"}, "too short for n_fft=400"),
])
def test_bad_waveforms_are_refused_by_name(audio, kwargs, message):
    with pytest.raises(ValueError, match=message):
        FeatureExtractor()(audio, **kwargs)


# ------------------------------------------------------------------------------------------------ reading files

FILES = {  # name: (format, subtype, rate, channels)
    "wav pcm16 stereo 44.1 kHz": ("WAV", "PCM_16", 44100, 2),
    "wav float 16 kHz": ("WAV", "FLOAT", 16000, 1),
    "flac 24-bit 22.05 kHz": ("FLAC", "PCM_24", 22050, 1),
    "ogg vorbis 48 kHz 3 channels": ("OGG", "VORBIS", 48000, 3),
    "wav u8 8 kHz": ("WAV", "PCM_U8", 8000, 1),
}


@pytest.fixture(scope="module")
def audio_files(tmp_path_factory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("audio")
    out = {}
    for index, (name, (kind, subtype, rate, channels)) in enumerate(FILES.items()):
        t = np.arange(int(1.7 * rate)) / rate
        samples = np.stack([0.4 * np.sin(2 * np.pi * (300 + 150 * c) * t) + 0.05 * np.sin(2 * np.pi * 3000 * t)
                            for c in range(channels)], -1)
        path = folder / f"{index}.{kind.lower()}"
        soundfile.write(path, samples, rate, subtype=subtype, format=kind)
        out[name] = path
    return out


@pytest.mark.parametrize("name", list(FILES))
def test_read_audio_equals_transformers_load_audio(name, audio_files):
    path = audio_files[name]
    expected = transformers.audio_utils.load_audio(str(path), backend="soundfile")
    for rate, want in ((RATE, expected), (24000, transformers.audio_utils.load_audio(str(path), 24000, backend=
                                                                                      "soundfile"))):
        got = read_audio(path, sampling_rate=rate)
        assert got.dtype == np.float32 and got.ndim == 1
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(read_audio(path.read_bytes()), expected)
    assert np.abs(expected).max() <= 1.0


def test_a_read_file_gives_transformers_features(audio_files, numpy_path):
    reference, ours = _reference(WHISPER_LARGE_V3)
    waveforms = [read_audio(audio_files[n]) for n in ("wav pcm16 stereo 44.1 kHz", "ogg vorbis 48 kHz 3 channels")]
    _assert_close(ours(waveforms), reference(waveforms, sampling_rate=RATE))


def test_bad_files_are_refused_by_name(tmp_path):
    (tmp_path / "notes.txt").write_text("not audio")
    soundfile.write(tmp_path / "empty.wav", np.zeros((0, 1)), 16000)
    cases = [(tmp_path / "missing.wav", {}, "does not exist"), (tmp_path / "notes.txt", {}, "soundfile can read"),
             (b"RIFF....WAVEjunk", {}, "soundfile can read"), (tmp_path / "empty.wav", {}, "no audio"),
             (np.zeros(10), {}, "path or the file's bytes, got ndarray"),
             (tmp_path / "notes.txt", {"sampling_rate": 0}, "sampling_rate=0")]
    for source, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            read_audio(source, **kwargs)


def test_the_audio_package_imports_nothing_else_of_jaxformer():
    """jaxformer.audio stands alone on numpy, soundfile and soxr: a data pipeline may use it without the model."""
    import ast
    from pathlib import Path

    import jaxformer.audio

    for file in Path(jaxformer.audio.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert all(n == "jaxformer.audio" or n.startswith("jaxformer.audio.") or not n.startswith("jaxformer")
                       for n in names), (file.name, names)
