"""Speech recognition for an encoder-decoder that reads audio (Whisper): ``train.objective: transcription``.

Each row is one utterance of the speech set made here (``data.train: spoken:N``, jaxformer/train/spoken.py; held
out: stream 1): its log-mel ``input_features`` (Whisper's feature extractor, its chunk as long as the model's
encoder reads: 2 x max_source_positions frames of 10 ms) and its transcript, written as Whisper's decoder reads
one: ``<|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>`` then the words and ``<|endoftext|>``. The
loss is the decoder's next-token loss on the words and the end token (the four prompt tokens are given, as
generation forces them).

Held out, besides the loss: ``wer``, the word error rate (jiwer's, over all held-out utterances, as speech papers
report it) of the greedy transcripts: after the prompt, the argmax token fed back until ``<|endoftext|>`` (never the
first token, as Whisper's begin_suppress_tokens rule it), and ``exact_match``. ``train.seq_len`` is the decoder's
row length. ``python -m jaxformer.train.spoken PATH`` writes the word-level tokenizer configs/whisper_digits.yaml
reads; a Hugging Face export adds the generation_config.json and tokenizer_config.json with which transformers'
WhisperForConditionalGeneration.generate and WhisperProcessor transcribe as the held-out metric does.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from jaxformer.audio import FeatureExtractor
from jaxformer.decoder import lm_logits
from jaxformer.train import data, spoken
from jaxformer.train.data import IGNORE
from jaxformer.train.objectives import Objective, ratio, token_cross_entropy

PROMPT = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
END = "<|endoftext|>"
FRAMES_PER_SECOND = 100  # Whisper's hop of 160 samples at 16 kHz


class Transcription(Objective):
    """Spoken utterances through the encoder, their transcripts out of the decoder (Whisper)."""

    name, family = "transcription", "encoder_decoder"

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        inner = getattr(tokenizer, "tokenizer", None)
        ids = {token: inner.token_to_id(token) if inner is not None else None for token in (*PROMPT, END, "<unk>")}
        missing = [token for token in (*PROMPT, END) if ids[token] is None]
        if missing:
            raise ValueError(f"data.tokenizer={tokenizer.name!r} lacks Whisper's special tokens {missing}; "
                             "train.objective='transcription' reads configs/data/spoken_tokenizer.json's")
        self.prompt = np.asarray([ids[token] for token in PROMPT], np.int32)
        self.end, self.unknown = ids[END], ids["<unk>"]
        self.utterances = spoken.parse_source(run.data.train)
        if run.data.eval:
            raise ValueError(f"data.eval={run.data.eval!r}: train.objective='transcription' synthesizes its held-out "
                             "utterances (eval.batches x train.batch_size of them); leave data.eval empty")
        spoken.espeak()  # before the run builds anything: the set cannot be made without it
        # the synthesized audio kept in the run folder (none without one: never the working directory)
        self.cache = f"{run.run.dir}/data-cache/spoken" if run.run.dir else None
        # the decoder's rows: the prompt, then the longest transcript (a template's words, its {digits} five digits)
        # and its end token, which greedy decoding must have room to write
        needed = len(PROMPT) + max(len(t.split()) for t in spoken.TEMPLATES) - 1 + spoken.MAX_DIGITS + 1
        if self.seq_len < needed:
            raise ValueError(f"train.seq_len={self.seq_len} is the decoder's row length: it cannot hold the prompt and "
                             f"the longest transcript with its end token ({needed}); set train.seq_len={needed}")
        self.target_len = self.seq_len
        self.processor = None  # the feature extractor, set by ``adapt``: its chunk and mel bins are the model's

    def adapt(self, cfg, fresh):
        cfg = super().adapt(cfg, fresh)
        if cfg.audio is None:
            raise ValueError(f"train.objective='transcription' trains an encoder-decoder that reads audio (Whisper); "
                             f"model {cfg.name!r} reads tokens (model.preset: whisper-tiny, say)")
        start = int(self.prompt[0])
        if fresh:
            cfg = cfg.replace(decoder_start_token_id=start, eos_token_id=self.end, pad_token_id=self.end,
                              bos_token_id=self.end)
        elif cfg.tokens.decoder_start != start:
            raise ValueError(f"model {cfg.name!r} starts its decoder at decoder_start_token_id="
                             f"{cfg.tokens.decoder_start}, but data.tokenizer={self.tokenizer.name!r} spells "
                             f"{PROMPT[0]} {start}; use the model's own tokenizer")
        if cfg.audio.frames % FRAMES_PER_SECOND:
            raise ValueError(f"model {cfg.name!r} reads {cfg.audio.frames} frames (2 x max_source_positions): the "
                             f"feature extractor's chunk is whole seconds of {FRAMES_PER_SECOND} frames; set "
                             "max_source_positions to a multiple of 50")
        self.processor = FeatureExtractor(feature_size=cfg.audio.mel_bins,
                                          chunk_length=cfg.audio.frames // FRAMES_PER_SECOND)
        return cfg.replace(head="lm") if cfg.head != "lm" else cfg

    def _batch(self, indices, stream: int) -> dict[str, np.ndarray]:
        """Utterances ``indices`` of ``stream``: features, and each transcript after the prompt (labels on the
        words and the end token), right padded with the end token."""
        if self.processor is None:
            raise RuntimeError("Transcription.adapt(model_config) sets the feature extractor; call it first")
        said = [spoken.utterance(self.seed, int(i), stream, self.cache) for i in indices]
        too_long = [u.text for u in said if len(u.audio) > self.processor.n_samples]
        if too_long:
            raise ValueError(f"utterance {too_long[0]!r} is longer than the model's {self.processor.chunk_length} s "
                             "chunk: raise max_source_positions")
        words = self.tokenizer.encode_many([u.text for u in said])
        ids = np.full((len(said), self.target_len), self.end, np.int32)
        labels = np.full_like(ids, IGNORE)
        for row, tokens in enumerate(words):
            if self.unknown in tokens:
                raise ValueError(f"data.tokenizer={self.tokenizer.name!r} does not know every word of "
                                 f"{said[row].text!r}")
            reply = np.concatenate([tokens, [self.end]]).astype(np.int32)
            full = np.concatenate([self.prompt, reply])[:self.target_len + 1]
            ids[row, :len(full) - 1] = full[:-1]  # the decoder reads the prompt, then the words
            labels[row, len(self.prompt) - 1:len(full) - 1] = reply[:len(full) - len(self.prompt)]
        features = self.processor([u.audio for u in said], sampling_rate=spoken.SAMPLING_RATE)["input_features"]
        return {"input_features": features.astype(np.float32), "decoder_input_ids": ids, "labels": labels}

    def batch(self, step, batch_size):
        return self._batch(data.epoch_indices(self.utterances, self.seed, step, batch_size), stream=0)

    def eval_batches(self, count, batch_size):
        batches = [self._batch(range(b * batch_size, (b + 1) * batch_size), stream=1) for b in range(count)]
        self.references = [spoken.script(self.seed, i, 1)[0] for i in range(count * batch_size)]
        return batches

    def loss(self, model, batch, key):
        out = model(input_features=batch["input_features"], decoder_input_ids=batch["decoder_input_ids"],
                    dropout_key=key)
        sums = token_cross_entropy(out.logits, batch["labels"], self.run.train.label_smoothing)
        return ratio(sums["loss"]), sums

    def eval_outputs(self, model, batch):
        """Loss and sums as ``loss`` gives them, and each utterance's greedy transcript [B, target_len - 4]: the
        encoder read once, the decoder run on the prompt and the tokens chosen so far (causal: each pass leaves
        the earlier positions as they were), the argmax fed back; after the end token, end tokens. The first token
        is never the end token (Whisper's begin_suppress_tokens, as ``export_files`` writes them)."""
        loss, sums = self.loss(model, batch, None)
        source = model.encode(input_features=batch["input_features"])
        ids = jnp.full(batch["decoder_input_ids"].shape, self.end, jnp.int32).at[:, :len(self.prompt)].set(self.prompt)
        done = jnp.zeros(ids.shape[0], bool)
        for at in range(len(self.prompt), ids.shape[1]):
            hidden = model.decode(ids[:, :at], source).hidden
            logits = lm_logits(model, hidden[:, -1:])[:, 0]
            if at == len(self.prompt):
                logits = logits.at[:, self.end].set(-jnp.inf)
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            token = jnp.where(done, self.end, token)
            done = done | (token == self.end)
            ids = ids.at[:, at].set(token)
        return loss, sums, {"transcript": ids[:, len(self.prompt):]}

    def transcripts(self, rows: np.ndarray) -> list[str]:
        """The text of greedy transcripts (``eval_outputs``' rows): the words before the first end token."""
        heard = []
        for row in rows:
            ends = np.flatnonzero(row == self.end)
            heard.append(self.tokenizer.decode(row[:ends[0]] if len(ends) else row).strip())
        return heard

    def finish_outputs(self, outputs: dict[str, np.ndarray]) -> dict[str, float]:
        """The word error rate of the held-out transcripts (jiwer), and the share transcribed exactly."""
        heard = self.transcripts(outputs["transcript"][:len(self.references)])
        return {"wer": word_error_rate(self.references, heard),
                "exact_match": 100.0 * float(np.mean([h == r for h, r in zip(heard, self.references)]))}

    def export_files(self, folder, model_cfg):
        """What transformers needs to transcribe as the held-out metric does: generation_config.json with Whisper's
        prompt (language and task tokens, <|notimestamps|>; English the model's only language, transcription its
        default task), the end token suppressed first, no other suppression; tokenizer_config.json reading the
        word-level tokenizer.json as it is (WhisperTokenizer would rebuild a byte-level BPE from it)."""
        token = self.tokenizer.tokenizer.token_to_id
        end, start = self.end, int(self.prompt[0])
        generation = {"decoder_start_token_id": start, "bos_token_id": end, "eos_token_id": end, "pad_token_id": end,
                      "max_length": model_cfg.max_positions, "no_timestamps_token_id": token("<|notimestamps|>"),
                      "prev_sot_token_id": token("<|startofprev|>"), "is_multilingual": True,
                      "lang_to_id": {"<|en|>": token("<|en|>")}, "language": "en", "task": "transcribe",
                      "task_to_id": {task: token(f"<|{task}|>") for task in ("transcribe", "translate")},
                      "suppress_tokens": [], "begin_suppress_tokens": [end]}
        settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": END, "eos_token": END,
                    "pad_token": END, "unk_token": "<unk>", "model_max_length": model_cfg.max_positions,
                    "processor_class": "WhisperProcessor"}
        for name, content in (("generation_config.json", generation), ("tokenizer_config.json", settings)):
            (Path(folder) / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def word_error_rate(references: list[str], heard: list[str]) -> float:
    """jiwer's word error rate over a whole set (word edits summed over utterances / reference words), as speech
    papers report it."""
    import jiwer

    return float(jiwer.wer(references, heard))
