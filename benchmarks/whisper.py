"""Whisper transcription speed on CPU: jaxformer's ``model.generate`` against transformers' Whisper ``generate``.

A whisper-tiny-shaped model (4 + 4 layers of 384, 80 mel bins, the published vocabulary of 51,865 and its
special ids; random weights, float32, its timestamp embeddings scaled down so that, as a trained model does, it
writes text rather than timestamps), saved once in the Hugging Face format with an English-only
generation_config.json and loaded by both. The audio: 30 s of a synthesized voiced signal (one window), made into
features once (the same numpy code on both sides, outside the timing). Greedy with ``--new-tokens`` tokens, and
beams (``--beams``); both sides alternate call by call so they see the same machine load. The real-time factor is
seconds of audio per second of transcription (higher is faster); the ratio is ours over transformers'. jaxformer
compiles on its first call, which is not timed (the compile time is printed). The issue's target: >= 1.5x.

    python benchmarks/whisper.py [--repeats 5] [--new-tokens 96] [--beams 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

from side_by_side import interleaved  # (this folder)

SECONDS = 30.0


def voiced(seconds: float, rate: int = 16_000):
    """A vowel-like tone gliding in pitch over a little noise (the tests' synthetic speech)."""
    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * np.cumsum(140 * (1 + 0.2 * np.sin(2 * np.pi * 0.3 * t))) / rate
    voice = sum(np.exp(-((k * 140 - 700) / 300) ** 2) * np.sin(k * phase) for k in range(1, 20))
    return (0.3 * voice + 0.02 * np.random.default_rng(0).standard_normal(len(t))).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import numpy as np
    import torch
    import transformers

    import jaxformer as jf
    from jaxformer.audio import FeatureExtractor

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.WhisperConfig(
        vocab_size=51865, d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
        decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80,
        max_target_positions=448, pad_token_id=50257, bos_token_id=50257, eos_token_id=50257,
        decoder_start_token_id=50258, begin_suppress_tokens=None, suppress_tokens=None)
    model = transformers.WhisperForConditionalGeneration(config)
    with torch.no_grad():  # timestamps (from <|0.00|>, 50364 on) scaled down; the head is tied to the embeddings
        model.model.decoder.embed_tokens.weight[50364:] *= 0.1
    folder = Path(tempfile.mkdtemp(prefix="jaxformer-whisper-"))
    model.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps(dict(
        bos_token_id=50257, eos_token_id=50257, pad_token_id=50257, decoder_start_token_id=50258, max_length=448,
        begin_suppress_tokens=[220, 50257], no_timestamps_token_id=50363, is_multilingual=False,
        suppress_tokens=[1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93],
        max_initial_timestamp_index=50, prev_sot_token_id=50361, forced_decoder_ids=[[1, 50363]])))
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()
    ours = jf.from_pretrained(folder)
    features = FeatureExtractor()(voiced(SECONDS), sampling_rate=16_000)["input_features"]
    torch_features = torch.as_tensor(features)

    result = {}
    for name, beams in (("greedy", 1), (f"beams{args.beams}", args.beams)):
        def run_ours(beams=beams):
            return np.asarray(ours.generate(features, max_new_tokens=args.new_tokens, num_beams=beams))

        def run_theirs(beams=beams):
            with torch.inference_mode():
                return reference.generate(torch_features, max_new_tokens=args.new_tokens, num_beams=beams).numpy()

        outputs, seconds, first_call = interleaved({"jaxformer": run_ours, "transformers": run_theirs}, args.repeats)
        first, theirs, compile_s = outputs["jaxformer"], outputs["transformers"], first_call["jaxformer"]
        rtf = {side: SECONDS / median for side, median in seconds.items()}
        result[name] = dict(jaxformer_rtf=round(rtf["jaxformer"], 1), transformers_rtf=round(rtf["transformers"], 1),
                            ratio=round(rtf["jaxformer"] / rtf["transformers"], 2), tokens=int(first.shape[-1]),
                            tokens_identical=bool(first.shape == theirs.shape and (first == theirs).all()),
                            first_call_s=round(compile_s, 1))
    if args.json:
        print(json.dumps(result))
        return
    print(f"whisper-tiny shape, random weights, float32, {SECONDS:.0f} s of audio, {args.new_tokens} new tokens at "
          f"most, median of {args.repeats} (real-time factor: audio seconds per second)")
    for name, row in result.items():
        print(f"{name:>8}: jaxformer {row['jaxformer_rtf']:.1f}x real time, transformers {row['transformers_rtf']:.1f}x"
              f" -> {row['ratio']:.2f}x; {row['tokens']} tokens, identical: {row['tokens_identical']}; first call "
              f"(compiling) {row['first_call_s']:.1f} s")


if __name__ == "__main__":
    main()
