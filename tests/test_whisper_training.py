"""Speech recognition training (configs/whisper_digits.yaml, shortened): espeak-ng's utterances as Whisper's log-mel
features, the transcript after Whisper's prompt with labels on the words and <|endoftext|> alone; a short run lowers
the loss and reports the held-out word error rate (jiwer) of greedy transcripts, before training and after; the
export (`jaxformer convert RUN --to-hf OUT`'s files) loads in transformers' WhisperForConditionalGeneration and
WhisperProcessor, whose generate (English, transcribe, no timestamps) writes our greedy transcripts word for word,
so the same WER."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from jaxformer.train import spoken, transcription
from jaxformer.train.data import IGNORE, HFTokenizer
from jaxformer.train.run_config import load

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="the speech set is spoken by espeak-ng (.ci/run installs it)")

CONFIG, TOKENIZER = "configs/whisper_digits.yaml", "configs/data/spoken_tokenizer.json"
STEPS = 15  # the loss logged over steps 11-15 is well under steps 1-5's (measured 2.45 against 2.95)
SHORT = [f"train.steps={STEPS}", f"eval.every={STEPS}", f"checkpoint.every={STEPS}", "train.batch_size=16",
         "train.log_every=5", "eval.batches=1", "optim.warmup_steps=3", "data.train=spoken:96"]


def _objective(overrides=()):
    from jaxformer.train.run import preset_model_config
    from jaxformer.train.tasks import make_objective

    cfg = load(CONFIG, ["run.dir=", *overrides])
    objective = make_objective(cfg, HFTokenizer(TOKENIZER))
    return objective, objective.adapt(preset_model_config(cfg), fresh=True)


def test_the_tokenizer_file_is_the_one_the_module_builds():
    with open(TOKENIZER, encoding="utf-8") as f:
        assert json.load(f) == json.loads(spoken.build_tokenizer().to_str())


def test_rows_hold_the_features_the_prompt_and_the_transcript_alone_as_labels():
    objective, model_cfg = _objective()
    token = objective.tokenizer.tokenizer.token_to_id
    prompt = [token(t) for t in transcription.PROMPT]
    assert model_cfg.tokens.decoder_start == prompt[0] == 20 and model_cfg.tokens.eos == token("<|endoftext|>")
    batch = objective.eval_batches(1, 4)[0]
    assert batch["input_features"].shape == (4, 80, 500)  # 5 s of 10 ms frames
    for row in range(4):
        text = spoken.script(objective.seed, row, stream=1)[0]
        words = [token(w) for w in text.split()]
        ids, labels = batch["decoder_input_ids"][row], batch["labels"][row]
        assert ids[:4 + len(words)].tolist() == prompt + words
        assert labels[3:4 + len(words)].tolist() == words + [objective.end]
        assert (labels[:3] == IGNORE).all() and (labels[4 + len(words):] == IGNORE).all()
    assert objective.references[:4] == [spoken.script(objective.seed, i, stream=1)[0] for i in range(4)]


@pytest.mark.parametrize("overrides, message", [
    (["train.seq_len=12"], r"train.seq_len=12 is the decoder's row length.*set train.seq_len=13"),
    (["model.overrides.max_source_positions=225"], "max_source_positions to a multiple of 50"),
    (["data.train=spoken:0"], "'spoken' or 'spoken:N'"),
    pytest.param(["model.preset=t5-small", "model.overrides.vocab_size=28"], "reads tokens",
                 marks=pytest.mark.filterwarnings("ignore:model.preset='t5-small' replaces")),
])
def test_the_objective_refuses_what_it_cannot_train_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        _objective(overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A short run (STEPS steps of 16 utterances), the greedy transcripts of its last evaluation as the eval step
    itself wrote them (the rows its eval_wer is computed from), and its export as a Hugging Face folder."""
    from jaxformer.train.evaluate import export_hf
    from jaxformer.train.run import train

    run_dir, out = tmp_path_factory.mktemp("whisper_digits"), tmp_path_factory.mktemp("whisper_digits_hf")
    evaluated, finish = [], transcription.Transcription.finish_outputs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transcription.Transcription, "finish_outputs",
                      lambda self, outputs: evaluated.append(outputs["transcript"]) or finish(self, outputs))
        result = train(load(CONFIG, [f"run.dir={run_dir}", *SHORT]), progress=False)
    export_hf(run_dir, out)
    return result, evaluated[-1], out


def test_a_short_run_lowers_the_loss_and_reports_the_word_error_rate(trained):
    history = trained[0]["history"]
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["eval_wer"] >= 0 and 0 <= history[-1]["eval_exact_match"] <= 100


def test_the_export_transcribes_in_transformers_as_our_greedy_decoding(trained):
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    result, transcripts, folder = trained
    objective = result["objective"]
    batch = objective.eval_batches(1, 16)[0]
    ours = objective.transcripts(np.asarray(transcripts))

    processor = WhisperProcessor.from_pretrained(folder)
    audio = [spoken.utterance(objective.seed, i, 1, objective.cache).audio for i in range(16)]
    features = processor(audio, sampling_rate=spoken.SAMPLING_RATE, return_tensors="np")["input_features"]
    # the exported 5 s extractor; 1e-4: with torch installed transformers takes its float32 STFT, up to 6e-5 from
    # its own float64 numpy path, which ours follows within 1e-5 (tests/test_audio_features.py)
    np.testing.assert_allclose(features, batch["input_features"], atol=1e-4)
    reference = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        generated = reference.generate(torch.from_numpy(batch["input_features"]), language="en", task="transcribe",
                                       max_new_tokens=objective.target_len - len(transcription.PROMPT))
    theirs = [text.strip() for text in processor.batch_decode(generated, skip_special_tokens=True)]
    assert theirs == ours
    wer = transcription.word_error_rate(objective.references, theirs)
    assert wer == pytest.approx(result["history"][-1]["eval_wer"], abs=1e-12)


def test_model_flops_count_the_convolutions_in_front_of_the_encoder():
    from jaxformer import flops

    _, cfg = _objective()
    fewer = cfg.replace(num_mel_bins=40)  # conv1's input: 40 fewer bins at each of 500 frames, all else the same
    gap = flops.train_flops_per_step(cfg, 2, 250, 13) - flops.train_flops_per_step(fewer, 2, 250, 13)
    assert gap == pytest.approx(2 * 6 * 3 * 128 * 500 * 40, rel=1e-12)
