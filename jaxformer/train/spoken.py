"""A speech set made here, nothing downloaded: digit strings and short sentences about them, spoken by the
Debian package ``espeak-ng`` in a range of voices, speeds and pitches, resampled to Whisper's 16 kHz. Utterance
``index`` of stream ``stream`` under ``seed`` is a pure function of the three (the words, the voice, the speed and
the pitch are drawn from them; espeak-ng renders the same audio for the same arguments), synthesized on demand and
kept in a cache folder, so a run's batches stay a function of (seed, step). ``data.train: spoken:N`` reads N
training utterances (stream 0); held-out ones come from stream 1.

``python -m jaxformer.train.spoken PATH`` writes the word-level tokenizer.json (every word a transcript holds, and
Whisper's special tokens) that configs/whisper_digits.yaml reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# a digit string alone, or inside one of a few sentences (words outside the digits, so a model must hear them)
TEMPLATES = ("{digits}", "{digits}", "the code is {digits}", "call {digits}", "my number is {digits}",
             "room {digits} please")
# English voices of espeak-ng's own data (no mbrola), each with a few of its variants (male and female)
VOICES = ("en", "en-us", "en-gb-scotland", "en-029", "en-gb-x-rp")
VARIANTS = ("m1", "m3", "m5", "f1", "f2", "f4")
SPEEDS, PITCHES = (135, 195), (30, 70)  # words a minute, espeak-ng's pitch (0-99): drawn uniformly in these
SAMPLING_RATE = 16_000
MAX_DIGITS = 5  # a digit string holds 2 to 5 digits
DEFAULT_UTTERANCES = 2_000


@dataclasses.dataclass(frozen=True)
class Utterance:
    """One utterance: ``audio`` float32 mono at 16 kHz and its ``text``; how it was spoken, for checks."""

    audio: np.ndarray
    text: str
    voice: str
    speed: int
    pitch: int


def script(seed: int, index: int, stream: int = 0) -> tuple[str, str, int, int]:
    """What utterance ``index`` of ``stream`` says and how: (text, voice, speed, pitch)."""
    rng = np.random.default_rng((seed, stream, index))
    digits = " ".join(DIGITS[d] for d in rng.integers(0, 10, size=int(rng.integers(2, MAX_DIGITS + 1))))
    text = TEMPLATES[rng.integers(len(TEMPLATES))].format(digits=digits)
    voice = f"{VOICES[rng.integers(len(VOICES))]}+{VARIANTS[rng.integers(len(VARIANTS))]}"
    return text, voice, int(rng.integers(SPEEDS[0], SPEEDS[1] + 1)), int(rng.integers(PITCHES[0], PITCHES[1] + 1))


def espeak() -> str:
    """The espeak-ng executable, or a ValueError saying how to get it."""
    found = shutil.which("espeak-ng")
    if found is None:
        raise ValueError("the spoken set is synthesized by espeak-ng, which is not installed: install the Debian "
                         "package (apt-get install espeak-ng)")
    return found


def speak(text: str, voice: str, speed: int, pitch: int) -> np.ndarray:
    """``text`` spoken by espeak-ng, float32 mono at 16 kHz (soundfile reads its WAV, soxr resamples it)."""
    from jaxformer.audio import read_audio

    done = subprocess.run([espeak(), "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", text],
                          capture_output=True, check=False, timeout=60)
    if done.returncode != 0 or not done.stdout:
        raise ValueError(f"espeak-ng failed on {text!r} (voice {voice}): {done.stderr.decode(errors='replace')[:200]}")
    return read_audio(done.stdout, sampling_rate=SAMPLING_RATE)


def utterance(seed: int, index: int, stream: int = 0, cache: str | Path | None = None) -> Utterance:
    """Utterance ``index`` of ``stream``, synthesized or read from ``cache`` (a folder of .npy files named by
    what was said and how, so a cache never serves another utterance's audio)."""
    text, voice, speed, pitch = script(seed, index, stream)
    path = None
    if cache is not None:
        key = hashlib.sha1(f"{text}|{voice}|{speed}|{pitch}".encode()).hexdigest()[:16]
        path = Path(cache) / f"{key}.npy"
        if path.exists():
            return Utterance(np.load(path), text, voice, speed, pitch)
    audio = speak(text, voice, speed, pitch)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial.npy")
        np.save(partial, audio)
        partial.replace(path)  # whole or absent: a run stopped mid-write leaves no torn file behind
    return Utterance(audio, text, voice, speed, pitch)


def parse_source(spec: str) -> int:
    """The number of training utterances of ``data.train``: ``spoken`` (DEFAULT_UTTERANCES) or ``spoken:N``."""
    name, _, count = spec.partition(":")
    if name != "spoken" or (count and not (count.isdigit() and int(count) > 0)):
        raise ValueError(f"data.train={spec!r}: the speech set made here is 'spoken' or 'spoken:N' (N training "
                         "utterances, a positive integer)")
    return int(count) if count else DEFAULT_UTTERANCES


# Whisper's special tokens as a tiny English model needs them (the names transformers' generate reads from
# generation_config.json): the padding and unknown word before the words, the prompt's tokens after them, in Whisper's
# order, <|notimestamps|> last: transformers' generate takes every id above it for a timestamp
SPECIALS = ("<|endoftext|>", "<unk>")
PROMPT_SPECIALS = ("<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
                   "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>")


def vocabulary() -> list[str]:
    """The padding and unknown word, every word a transcript can hold, then the prompt's special tokens."""
    words = set(DIGITS) | {word for template in TEMPLATES for word in template.split() if not word.startswith("{")}
    return [*SPECIALS, *sorted(words), *PROMPT_SPECIALS]


def build_tokenizer():
    """A word-level ``tokenizers`` tokenizer over ``vocabulary()``: words split at whitespace, joined with spaces
    when decoded, the special tokens marked special (decoding skips them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(vocabulary())}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces
    tokenizer.add_special_tokens([*SPECIALS, *PROMPT_SPECIALS])
    return tokenizer


if __name__ == "__main__":
    build_tokenizer().save(sys.argv[1] if len(sys.argv) > 1 else "configs/data/spoken_tokenizer.json")
