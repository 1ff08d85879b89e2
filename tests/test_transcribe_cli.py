"""``jaxformer transcribe`` against transformers on tiny Whisper checkpoints (tests/family_files.py's, with a word-level
tokenizer.json in Whisper's vocabulary layout and preprocessor_config.json): WAV files of synthesized voice-like sound
read as transformers' pipeline reads them, transcripts equal to transformers' generate + decode, JSON segments' times
equal to its segments', SRT / WebVTT cues, and the errors a user meets named before anything runs."""

from __future__ import annotations

import functools
import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
soundfile = pytest.importorskip("soundfile")

from jaxformer import cli  # noqa: E402
from jaxformer.audio import FeatureExtractor, read_audio  # noqa: E402
from family_files import EOS, NEW, NO_TIMESTAMPS, RATE, VOCAB, tiny_whisper, whisper_audio  # noqa: E402
from hf_factory import save_checkpoint  # noqa: E402


def whisper_tokenizer(folder):
    """Words w0 ... w49, then Whisper's special tokens (decoding skips them) and its timestamps <|0.00|> ...
    <|30.00|>, not special, as the published tokenizer.json holds them: the command leaves them out of the text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(EOS)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces
    specials = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|fr|>", "<|es|>", "<|translate|>",
                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    tokenizer.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", normalized=False) for i in range(1501)])
    assert tokenizer.get_vocab_size() == VOCAB and tokenizer.token_to_id("<|notimestamps|>") == NO_TIMESTAMPS
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}))


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    """(folder, transformers' model, its tokenizer) of a multilingual Whisper; an English-only copy beside it."""
    folder = tmp_path_factory.mktemp("whisper")
    reference = tiny_whisper(folder, True, 0)[0]
    FeatureExtractor().save_pretrained(folder)
    whisper_tokenizer(folder)
    english = shutil.copytree(folder, folder.parent / "english")
    settings = json.loads((english / "generation_config.json").read_text())
    settings.update(is_multilingual=False, forced_decoder_ids=[[1, NO_TIMESTAMPS]])
    for key in ("lang_to_id", "task_to_id"):
        del settings[key]
    (english / "generation_config.json").write_text(json.dumps(settings))
    return folder, reference, transformers.AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def wavs(tmp_path_factory):
    """Two short clips (one window each) and 45 s (long-form: several windows), as 16-bit WAV files."""
    folder = tmp_path_factory.mktemp("audio")
    files = {}
    for name, seconds, pitch in (("short", 4, 120), ("other", 7, 210), ("long", 45, 140)):
        files[name] = str(folder / f"{name}.wav")
        soundfile.write(files[name], whisper_audio(seconds, pitch, len(files)), RATE, subtype="PCM_16")
    return files


@functools.cache  # (the subtitle formats share one run)
def expected(whisper, wav, **kwargs) -> dict:
    """transformers' transcript of ``wav``: the pipeline's features (30 s padding, none past 30 s), its generate, its
    tokenizer's decode without the timestamps (WhisperTokenizer's decode drops them too)."""
    _, reference, tokenizer = whisper
    extractor, waveform = FeatureExtractor(), read_audio(wav)
    unpadded = dict(truncation=False, padding="longest") if len(waveform) > extractor.n_samples else {}
    features = extractor(waveform, sampling_rate=RATE, **unpadded)["input_features"]
    with torch.no_grad():
        out = reference.generate(torch.as_tensor(features), return_segments=True, max_new_tokens=NEW, **kwargs)
    text = lambda ids: tokenizer.decode([t for t in ids.tolist() if t <= NO_TIMESTAMPS],  # noqa: E731
                                        skip_special_tokens=True).strip()
    return {"file": wav, "text": text(out["sequences"][0]),
            "segments": [{"start": round(float(s["start"]), 3), "end": round(float(s["end"]), 3),
                          "text": text(s["tokens"])} for s in out["segments"][0]]}


def transcribe(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(["transcribe", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_transcripts_and_segments_match_transformers(whisper, wavs, capsys):
    """A clip and long-form audio (its windows moved by the timestamps, which long audio turns on): one JSON line per
    file whose text and segments (start, end, text) are transformers'."""
    code, out, err = transcribe(capsys, whisper[0], wavs["short"], wavs["long"], "--format", "json", "--language",
                                "en", "--max-new-tokens", NEW)
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert records == [expected(whisper, wavs["short"], language="en"),
                       expected(whisper, wavs["long"], language="en")]
    assert records[1]["segments"][-1]["end"] > 30 and len(records[1]["segments"]) > 1, records[1]
    assert all(record["text"] and "<|" not in record["text"] for record in records), records


def test_text_lines_with_beams_a_detected_language_and_timestamps(whisper, wavs, capsys):
    code, out, err = transcribe(capsys, whisper[0], wavs["short"], wavs["other"], "--num-beams", 2,
                                "--max-new-tokens", NEW, "--timestamps")
    assert code == 0, err
    assert out.splitlines() == [expected(whisper, wavs[name], num_beams=2, return_timestamps=True)["text"]
                                for name in ("short", "other")]
    code, out, err = transcribe(capsys, whisper[0], wavs["other"], "--task", "translate", "--max-new-tokens", NEW)
    assert code == 0, err
    assert out == expected(whisper, wavs["other"], task="translate")["text"] + "\n"


def test_subtitles_are_written_per_file_into_the_output_folder(whisper, wavs, capsys, tmp_path):
    for kind in ("srt", "vtt"):
        code, _, err = transcribe(capsys, whisper[0], wavs["short"], wavs["long"], "--format", kind, "--language",
                                  "en", "--max-new-tokens", NEW, "--output", tmp_path / "subtitles")
        assert code == 0, err
        for name in ("short", "long"):  # subtitles turn the timestamps on
            segments = expected(whisper, wavs[name], language="en", return_timestamps=True)["segments"]
            written = (tmp_path / "subtitles" / f"{name}.{kind}").read_text()
            assert written == cli.subtitles(segments, kind)
            assert written.count(" --> ") == sum(bool(s["text"]) for s in segments) > 0, written


def test_subtitle_cues_and_clocks():
    segments = [{"start": 0.0, "end": 2.5, "text": "w1 w2"}, {"start": 2.5, "end": 3.0, "text": " "},
                {"start": 3661.0196, "end": 3725.4, "text": "two\n\nlines "}]
    assert cli.subtitles(segments, "srt") == ("1\n00:00:00,000 --> 00:00:02,500\nw1 w2\n\n"
                                              "2\n01:01:01,020 --> 01:02:05,400\ntwo lines\n")
    assert cli.subtitles(segments, "vtt") == ("WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nw1 w2\n\n"
                                              "01:01:01.020 --> 01:02:05.400\ntwo lines\n")


def test_errors_are_named_before_anything_runs(whisper, wavs, capsys, tmp_path):
    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("not a sound")
    text_model = save_checkpoint("gpt2", tmp_path / "gpt2")
    (tmp_path / "again").mkdir()
    same_name = shutil.copy(wavs["short"], tmp_path / "again" / "short.wav")
    folder = whisper[0]
    for argv, message in (
            ((folder, tmp_path / "missing.wav"), "missing.wav' does not exist"),
            ((folder, not_audio), "notes.wav is not an audio file"),
            ((text_model, wavs["short"]), "gpt2 holds a decoder model ('gpt2') that reads no audio"),
            ((folder.parent / "english", wavs["short"], "--language", "en"), "English-only"),
            ((folder, wavs["short"], "--language", "klingon"), "klingon"),
            ((folder, wavs["short"], wavs["other"], "--format", "srt"), "give --output DIR for 2 files"),
            ((folder, wavs["short"], same_name, "--output", tmp_path / "out"), "would write the same short.txt")):
        code, out, err = transcribe(capsys, *argv)
        assert code == 2 and message in err and not out, (argv, err)
    assert not (tmp_path / "out").exists()
