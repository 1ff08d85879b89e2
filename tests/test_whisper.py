"""Whisper: a tiny model of the published front end's shape (80 mel bins, 1500 source positions, so 3000 frames from
jaxformer.audio.FeatureExtractor) against transformers: every encoder and decoder state and the logits, the export,
cached decoding from a multi-token decoder prompt, and the refusals (wrong frame count, ids to an audio model, a
config whose keys disagree)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.audio import FeatureExtractor  # noqa: E402
from jaxformer.cli import main as cli_main  # noqa: E402
from jaxformer.compare import compare, format_table  # noqa: E402
from jaxformer.interop.files import TensorFiles  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402

TOLERANCE = 1e-5
RATE = 16000
# the front end as published (80 bins, 1500 positions), everything else tiny; std 0.2 as hf_factory's, eos 2
TINY = dict(vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, num_mel_bins=80,
            max_source_positions=1500, max_target_positions=40, init_std=0.2, pad_token_id=1, bos_token_id=0,
            eos_token_id=2, decoder_start_token_id=3, begin_suppress_tokens=None)


def signals() -> list[np.ndarray]:
    """Synthetic audio at 16 kHz: a rising chirp (3 s), noise (5 s), a vowel-like harmonic tone with a vibrato
    and its formant-shaped partials (2 s)."""
    rng = np.random.default_rng(0)
    t = np.arange(3 * RATE) / RATE
    chirp = 0.5 * np.sin(2 * np.pi * (100 * t + (4000 - 100) / (2 * 3) * t ** 2))
    noise = 0.1 * rng.standard_normal(5 * RATE)
    t = np.arange(2 * RATE) / RATE
    pitch = 120 * (1 + 0.02 * np.sin(2 * np.pi * 5 * t))
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    vowel = sum(np.exp(-((k * 120 - 700) / 300) ** 2) * np.sin(k * phase) for k in range(1, 30))
    return [chirp.astype(np.float32), noise.astype(np.float32), (0.3 * vowel).astype(np.float32)]


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    """(folder of a tiny WhisperForConditionalGeneration saved by transformers, its jaxformer model, the features of
    the three signals)."""
    torch.manual_seed(0)
    reference = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**TINY)).eval()
    with torch.no_grad():  # norms start at 1 and 0, biases at 0: perturbed so their mapping is tested
        for name, p in reference.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
        # the convolutions read 3 x 80 and 3 x 32 numbers: at std 0.2 their states reach ~10, where float32's
        # rounding of a convolution against XLA's nears 1e-5; a quarter keeps them O(1), as hf_factory's patches
        for conv in (reference.model.encoder.conv1, reference.model.encoder.conv2):
            conv.weight.mul_(0.25)
    folder = tmp_path_factory.mktemp("whisper")
    reference.save_pretrained(folder)
    features = FeatureExtractor()(signals(), sampling_rate=RATE)["input_features"]
    return folder, jf.from_pretrained(folder), features


def test_every_state_and_the_logits_match_transformers_on_extracted_features(whisper):
    folder, model, features = whisper
    assert features.shape == (3, 80, 3000)
    decoder_ids = np.random.default_rng(1).integers(3, 97, (3, 7))
    rows = compare(folder, None, input_features=features, decoder_input_ids=decoder_ids, model=model)
    names = [r.name for r in rows]
    assert {"encoder embeddings", "encoder layer 2", "encoder output", "decoder 2", "logits"} <= set(names), names
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


def test_the_export_is_byte_exact_and_compare_reads_it_from_an_audio_file(whisper, tmp_path, capsys):
    """save_pretrained writes the file's bytes; `jaxformer compare EXPORT --audio WAV` (a 22.05 kHz file, resampled)
    then has transformers load the export and reports the features' row and every layer's within 1e-5."""
    import soundfile

    folder, model, _ = whisper
    out = tmp_path / "export"
    model.save_pretrained(out)
    before, after = TensorFiles(folder), TensorFiles(out)
    assert set(before.names) == set(after.names) and "proj_out.weight" not in after.names  # (tied: not written)
    for name in after.names:
        a, b = before.get(name), after.get(name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
    FeatureExtractor().save_pretrained(out)
    t = np.arange(22050 * 2) / 22050
    soundfile.write(tmp_path / "tone.wav", 0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t), 22050)
    assert cli_main(["compare", str(out), "--audio", str(tmp_path / "tone.wav"), "--input-ids", "3,50,60"]) == 0
    report = capsys.readouterr().out
    assert report.split("\n")[2].startswith("input features") and "decoder 2" in report and "logits" in report


def greedy_from_prompt(model, features: np.ndarray, prompt: np.ndarray, steps: int, eos: int, pad: int) -> np.ndarray:
    """Greedy decoding through the encoder-decoder's cached API, as pure jitted functions of the model's state: the
    encoder run once (``encode``) into the cross-attention keys and values (``init_cache``), the decoder prompt in
    one step over the empty cache, then one token a step (``step``); finished rows take ``pad``."""
    B, P = prompt.shape
    graphdef, params = nnx.split(model)

    @jax.jit
    def prefill(params, features, prompt):
        model = nnx.merge(graphdef, params)
        state = model.init_cache(model.encode(input_features=features), P + steps)
        positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
        return model.step(prompt, positions, jnp.ones((B, P), bool), state)

    @jax.jit
    def step(params, token, position, state):
        return nnx.merge(graphdef, params).step(token[:, None], jnp.full((B, 1), position), jnp.ones((B, 1), bool),
                                                state)

    logits, state = prefill(params, jnp.asarray(features), jnp.asarray(prompt, jnp.int32))
    tokens, finished = [], np.zeros(B, bool)
    for t in range(steps):
        token = np.where(finished, pad, np.asarray(logits).argmax(-1)).astype(np.int32)
        tokens.append(token)
        finished |= token == eos
        if finished.all() or t == steps - 1:
            break
        logits, state = step(params, token, np.int32(P + t), state)
    return np.concatenate([prompt, np.stack(tokens, 1)], axis=1)


def test_cached_decoding_from_a_decoder_prompt_equals_transformers_generate(whisper):
    """decoder_start + forced tokens (as Whisper's language, task and no-timestamps tokens are) as the prompt; the
    plain GenerationMixin.generate (Whisper's own adds its prompt and suppression rules: built on top of this)."""
    folder, model, features = whisper
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()
    prompt = np.array([[3, 40, 41, 42], [3, 50, 51, 52], [3, 60, 61, 62]])
    with torch.no_grad():
        expected = transformers.GenerationMixin.generate(
            reference, input_features=torch.as_tensor(features), decoder_input_ids=torch.as_tensor(prompt),
            max_new_tokens=8, do_sample=False, num_beams=1).numpy()
    ours = greedy_from_prompt(model, features, prompt, 8, eos=2, pad=1)
    np.testing.assert_array_equal(ours, expected)


def test_wrong_inputs_are_refused_naming_what_would_be_valid(whisper):
    folder, model, features = whisper
    with pytest.raises(ValueError, match=r"reads audio: give input_features \[batch, 80, 3000\] in place of input_ids"):
        compare(folder, np.array([[3, 5]]), model=model)
    with pytest.raises(ValueError, match=r"input_features has shape \(3, 80, 2999\).*\[batch >= 1, 80, 3000\]"):
        model(input_features=features[..., :-1], decoder_input_ids=np.array([[3]] * 3))
    with pytest.raises(ValueError, match="reads audio: pass input_features"):
        model(np.array([[5, 6]]), decoder_input_ids=np.array([[3]]))
    with pytest.raises(ValueError, match="needs decoder_input_ids"):
        model(input_features=features)
    with pytest.raises(ValueError, match="which reads no audio"):
        jf.build("tiny-t5")(np.array([[5, 6]]), decoder_input_ids=np.array([[0]]), input_features=features)


def test_older_files_keys_are_read_or_harmless_and_an_alias_wins_as_in_transformers():
    """openai's files carry generation settings and num_hidden_layers, WhisperConfig's alias of encoder_layers,
    which wins over it there (as the other aliases of its attribute_map do)."""
    written = transformers.WhisperConfig(**TINY).to_dict()
    older = {**written, "architectures": ["WhisperForConditionalGeneration"], "num_hidden_layers": 2,
             "forced_decoder_ids": [[1, 50], [2, 51]], "suppress_tokens": [5, 6], "scale_embedding": True}
    cfg = config_from_hf(older)
    assert cfg.audio.mel_bins == 80 and cfg.audio.source_positions == 1500 and not cfg.biases.key
    assert cfg == config_from_hf({**written, "architectures": ["WhisperForConditionalGeneration"]})
    assert transformers.WhisperConfig.from_dict({**older, "num_hidden_layers": 3}).encoder_layers == 3
    assert config_from_hf({**older, "num_hidden_layers": 3}).encoder_layers == 3
