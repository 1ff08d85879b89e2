"""Whisper's generate against transformers' ``WhisperForConditionalGeneration.generate`` on tiny checkpoints saved by
transformers with the published generation_config.json keys (a multilingual one with lang_to_id / task_to_id and
legacy forced_decoder_ids, an English-only one), features from jaxformer.audio.FeatureExtractor of synthesized audio:
the suppress / begin-suppress / timestamp rules against transformers' processors on random scores and histories, then
greedy and beam tokens identical with the language forced or detected, translation, timestamps, prompt_ids, and
long-form audio (several windows: sequences and segments equal)."""

from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxformer import speech_generation  # noqa: E402
from jaxformer.audio import FeatureExtractor  # noqa: E402
from jaxformer.generate import GenerationConfig, process_logits  # noqa: E402
from family_files import NEW, NO_TIMESTAMPS, PREV, RATE, tiny_whisper, whisper_audio as audio  # noqa: E402
from transformers.generation.logits_process import (  # noqa: E402
    SuppressTokensAtBeginLogitsProcessor, SuppressTokensLogitsProcessor, WhisperTimeStampLogitsProcessor)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(transformers' and jaxformer's multilingual model, the same pair English-only)."""
    return (*tiny_whisper(tmp_path_factory.mktemp("multilingual"), True, 0),
            *tiny_whisper(tmp_path_factory.mktemp("english"), False, 1))


@pytest.fixture(scope="module")
def features():
    """Two short clips as one window each [2, 80, 3000], and 45 s and 38 s of audio (long-form) with their masks."""
    extract = FeatureExtractor()
    short = extract([audio(4, 120, 0), audio(7, 210, 1)], sampling_rate=RATE)["input_features"]
    long = extract([audio(45, 140, 2), audio(38, 190, 3)], sampling_rate=RATE, padding="longest", truncation=False,
                   return_attention_mask=True)
    return short, long["input_features"], long["attention_mask"]


def reference(model, features, **kwargs):
    tensors = {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    with torch.no_grad():
        return model.generate(torch.as_tensor(features), max_new_tokens=NEW, **tensors)


def test_the_logits_rules_match_transformers_processors():
    """SuppressTokensAtBegin, SuppressTokens and WhisperTimeStamp (pairs, monotonic, the first timestamp's bound, the
    timestamp-logprob rule) on random scores (some already -inf) and random histories of text and timestamps: the
    same -inf pattern and the same finite scores."""
    vocab, no_timestamps, eos, prompt = 64, 40, 30, 3
    rng = np.random.default_rng(0)

    @functools.partial(jax.jit, static_argnames="gc")
    def ours(scores, step, history, gc):
        return process_logits(scores, step, 10, gc, None, history)

    for trial in range(240):
        rows, step, initial = 5, int(rng.integers(0, 8)), (None, 0, 3)[trial % 3]
        history = np.where(rng.random((rows, 10)) < 0.5, rng.integers(no_timestamps + 1, vocab, (rows, 10)),
                           rng.integers(0, no_timestamps + 1, (rows, 10)))
        if trial % 2:  # timestamps mostly rising, as a model emits them
            history = np.where(history > no_timestamps, np.sort(history, axis=1), history)
        scores = (3 * rng.standard_normal((rows, vocab))).astype(np.float32)
        scores[rng.random((rows, vocab)) < 0.05] = -np.inf
        gc = GenerationConfig(max_new_tokens=10, eos_token_ids=(eos,), suppress_tokens=(5, 7),
                              begin_suppress_tokens=(eos, 9), no_timestamps_token_id=no_timestamps,
                              max_initial_timestamp_index=initial)
        settings = types.SimpleNamespace(no_timestamps_token_id=no_timestamps, eos_token_id=eos, bos_token_id=0,
                                         max_initial_timestamp_index=initial)
        expected = torch.as_tensor(scores)
        ids = torch.as_tensor(np.concatenate([np.full((rows, prompt), 50), history[:, :step]], axis=1))
        for processor in (SuppressTokensAtBeginLogitsProcessor([eos, 9], prompt), SuppressTokensLogitsProcessor([5, 7]),
                          WhisperTimeStampLogitsProcessor(settings, begin_index=prompt)):
            expected = processor(ids, expected)
        expected = expected.numpy()
        got = np.asarray(ours(jnp.asarray(scores), jnp.int32(step), jnp.asarray(history), gc))
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected), err_msg=f"trial {trial}")
        np.testing.assert_array_equal(got[np.isfinite(expected)], expected[np.isfinite(expected)])


def test_forced_and_detected_languages_and_translation_match_transformers(models, features):
    """One prompt shape (start, language, task, <|notimestamps|>): a forced language by code, by name and per row;
    translation; and the language detected per row, equal to transformers' detect_language."""
    reference_model, model = models[:2]
    short = features[0]
    detected = speech_generation.detect_language(model, short)
    np.testing.assert_array_equal(detected, reference_model.detect_language(torch.as_tensor(short)).numpy())
    for kwargs in (dict(), dict(language="de"), dict(language="english", task="translate"),
                   dict(language=["<|fr|>", "es"])):
        expected = reference(reference_model, short, **kwargs).numpy()
        np.testing.assert_array_equal(model.generate(input_features=short, max_new_tokens=NEW, **kwargs), expected,
                                      err_msg=str(kwargs))


def test_timestamps_greedy_and_beams_match_transformers(models, features):
    """With return_timestamps the rules shape every step; the output holds timestamp tokens (the rules ran)."""
    reference_model, model = models[:2]
    for kwargs in (dict(language="en"), dict(language="en", num_beams=3)):
        expected = reference(reference_model, features[0], return_timestamps=True, return_segments=True, **kwargs)
        got = model.generate(features[0], max_new_tokens=NEW, return_timestamps=True, return_segments=True, **kwargs)
        np.testing.assert_array_equal(got["sequences"], expected["sequences"].numpy(), err_msg=str(kwargs))
        assert np.sum(got["sequences"] > NO_TIMESTAMPS) >= 4, got["sequences"]
        for ours, theirs in zip(got["segments"], expected["segments"]):
            assert [(s["start"], s["end"]) for s in ours] == [(float(s["start"]), float(s["end"])) for s in theirs]


def test_prompt_ids_and_beams_match_transformers(models, features):
    reference_model, model = models[:2]
    prompt = np.array([PREV, 5, 6, 9])
    for kwargs in (dict(prompt_ids=prompt, language="fr"), dict(num_beams=2, language="fr")):
        expected = reference(reference_model, features[0], **kwargs).numpy()
        np.testing.assert_array_equal(model.generate(features[0], max_new_tokens=NEW, **kwargs), expected,
                                      err_msg=str(kwargs))


def test_an_english_only_model_matches_transformers_and_takes_no_language(models, features):
    reference_model, model = models[2:]
    np.testing.assert_array_equal(model.generate(features[0], max_new_tokens=NEW),
                                  reference(reference_model, features[0]).numpy())
    with pytest.raises(ValueError, match="English-only"):
        model.generate(features[0], language="en")


def test_long_form_audio_matches_transformers_window_by_window(models, features):
    """45 s and 38 s in one batch (masks): sequential windows shifted by the last timestamp, sequences and every
    segment's start, end and tokens equal; the audio takes several windows."""
    reference_model, model = models[:2]
    _, long, mask = features
    expected = reference(reference_model, long, attention_mask=mask, language="en", return_segments=True)
    got = model.generate(long, attention_mask=mask, max_new_tokens=NEW, language="en", return_segments=True)
    np.testing.assert_array_equal(got["sequences"], expected["sequences"].numpy())
    for ours, theirs in zip(got["segments"], expected["segments"]):
        assert [(s["start"], s["end"], s["tokens"].tolist()) for s in ours] == [
            (float(s["start"]), float(s["end"]), s["tokens"].tolist()) for s in theirs]
        assert max(s["end"] for s in ours) > 30.0, ours  # past the first window


def test_what_is_not_implemented_is_refused_by_name(models, features):
    model = models[1]
    short, long, mask = features
    for kwargs, words in ((dict(temperature=(0.0, 0.2)), "temperature fallback"),
                          (dict(condition_on_prev_tokens=True), "condition_on_prev_tokens"),
                          (dict(return_token_timestamps=True), "return_token_timestamps"),
                          (dict(task="summarize"), "task='summarize'"), (dict(language="klingon"), "klingon")):
        with pytest.raises(ValueError, match=words):
            model.generate(short, **kwargs)
    with pytest.raises(ValueError, match="return_timestamps=True"):
        model.generate(long, attention_mask=mask, return_timestamps=False)
    with pytest.raises(ValueError, match="attention_mask"):
        model.generate(long)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(short, max_new_tokens=62, language="en")
