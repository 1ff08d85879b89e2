"""Whisper's assisted generation (issue 52 row 4): a tiny multilingual Whisper drafted for by a distil-whisper-shaped
assistant (one decoder layer, its encoder and its other weights copied from the model's state dict, as distil-whisper
is made) and by an unrelated random Whisper; the output equals plain greedy's and transformers' generate with and
without ``assistant_model``, also under the timestamp rules and with the assistant reading the model's encoding."""

from __future__ import annotations

import copy

import jax
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.audio import FeatureExtractor  # noqa: E402
from family_files import EOS, NEW, RATE, SOT, VOCAB, tiny_whisper, whisper_audio as audio  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(transformers' model, ours, transformers' distil-shaped assistant, ours, our unrelated assistant)."""
    folder = tmp_path_factory.mktemp("drafting")
    reference, model = tiny_whisper(folder / "main", True, 0)
    config = copy.deepcopy(reference.config)
    config.decoder_layers = 1  # the first decoder layer kept, the encoder copied
    distil = transformers.WhisperForConditionalGeneration(config).eval()
    kept = {k: v for k, v in reference.state_dict().items() if not k.startswith("model.decoder.layers.1.")}
    assert not distil.load_state_dict(kept, strict=False).missing_keys
    distil.generation_config = copy.deepcopy(reference.generation_config)
    distil.save_pretrained(folder / "distil")
    torch.manual_seed(7)
    unrelated = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=24, decoder_ffn_dim=24, max_target_positions=64, init_std=0.2,
        pad_token_id=EOS, bos_token_id=EOS, eos_token_id=EOS, decoder_start_token_id=SOT))
    unrelated.save_pretrained(folder / "unrelated")
    return (reference, model, distil, jf.from_pretrained(folder / "distil"), jf.from_pretrained(folder / "unrelated"))


@pytest.fixture(scope="module")
def features():
    return FeatureExtractor()([audio(4, 120, 0), audio(7, 210, 1)], sampling_rate=RATE)["input_features"]


def reference_tokens(model, features, **kwargs):
    with torch.no_grad():
        return model.generate(torch.as_tensor(features), max_new_tokens=NEW, language="en", **kwargs).numpy()


def test_both_assistants_give_plain_greedy_and_transformers_assisted_tokens(models, features):
    """A batch of two drafted by either assistant equals transformers' plain greedy; transformers' assisted
    generate (one row at a time, as it takes) gives the same rows."""
    reference, model, reference_distil, distil, unrelated = models
    expected = reference_tokens(reference, features)
    for assistant in (distil, unrelated):
        got = model.generate(features, max_new_tokens=NEW, language="en", assistant_model=assistant)
        np.testing.assert_array_equal(got, expected, err_msg=assistant.config.name)
    for row in range(2):
        np.testing.assert_array_equal(
            reference_tokens(reference, features[row:row + 1], assistant_model=reference_distil), expected[row:row + 1])


def test_timestamps_and_the_shared_encoder_give_plain_greedy_tokens(models, features):
    """Under the timestamp rules (the drafts and the verifying step read the tokens before them) and with the assistant
    reading the model's encoding, sequences and segments equal transformers' plain greedy (the model walks past the
    window, so a second window is drafted too); the heuristic schedule too."""
    reference, model, _, distil, _ = models
    with torch.no_grad():
        expected = reference.generate(torch.as_tensor(features), max_new_tokens=NEW, language="en",
                                      return_timestamps=True, return_segments=True)
    for kwargs in (dict(assistant_shares_encoder=True), dict(num_assistant_tokens=3,
                                                              num_assistant_tokens_schedule="heuristic")):
        got = model.generate(features, max_new_tokens=NEW, language="en", return_timestamps=True, return_segments=True,
                             assistant_model=distil, **kwargs)
        np.testing.assert_array_equal(got["sequences"], expected["sequences"].numpy(), err_msg=str(kwargs))
        for ours, theirs in zip(got["segments"], expected["segments"]):
            assert [(s["start"], s["end"]) for s in ours] == [(float(s["start"]), float(s["end"])) for s in theirs]


def test_what_drafting_does_not_take_is_refused(models, features):
    _, model, _, distil, unrelated = models
    for kwargs, words in ((dict(assistant_model=unrelated, assistant_shares_encoder=True), "config fields"),
                          (dict(assistant_model=distil, num_beams=2), "beam search"),
                          (dict(num_assistant_tokens=3), "go with an assistant_model"),
                          (dict(prompt_lookup_num_tokens=3), "prompt_lookup_num_tokens")):
        with pytest.raises(ValueError, match=words):
            model.generate(features, language="en", **kwargs)
    changed = nnx.clone(distil)  # the same config, one encoder weight moved
    weights = nnx.state(changed.encoder, nnx.Param)
    nnx.update(changed.encoder, jax.tree.map(lambda w: w + 1e-3, weights))
    with pytest.raises(ValueError, match="encoder weights"):
        model.generate(features, language="en", assistant_model=changed, assistant_shares_encoder=True)
