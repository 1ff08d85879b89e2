"""Training objectives, one class each: what a batch holds (built on the host, a pure function of
(seed, step)), which model head it trains, and its loss and metrics (traced inside the train step).

    causal_lm        next-token prediction on packed text (GPT-2, LLaMA, Mistral, Mixtral)
    mlm              BERT's masked LM (15%: 80% [MASK], 10% random, 10% kept), with next-sentence prediction
    span_corruption  T5's span corruption (noise density 0.15, mean span 3, sentinels from <extra_id_0> down)
    seq2seq          supervised source -> target pairs from JSONL (the 2017 Transformer, T5, BART)
    classification   sequence classification from JSONL text/label (BERT fine-tuning)

Losses return ``(loss, sums)``: ``sums`` maps each metric to (numerator, denominator), so metrics over
several batches (evaluation) are exact token- or example-weighted means, not means of means.

Transformer-XL models (``carries_memory``) train causal_lm on ordered batches: contiguous rows read
window after window, with each row's segment memory carried from step to step (Dai et al. 2019, 3.2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.train import data
from jaxformer.train.data import IGNORE, mask_tokens, span_corrupt

# --------------------------------------------------------------------------------------------------
# Losses (traced)


def token_cross_entropy(logits: jax.Array, labels: jax.Array, smoothing: float = 0.0) -> dict:
    """Cross-entropy in float32 over positions whose label is not IGNORE, as metric sums.

    With label smoothing ``e`` (the 2017 Transformer used 0.1) the target puts ``1 - e`` on the label and
    spreads ``e`` uniformly over the vocabulary: loss = (1 - e) * nll + e * mean_v(-log p_v).
    """
    logits = logits.astype(jnp.float32)
    valid = labels != IGNORE
    safe = jnp.where(valid, labels, 0)
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    nll = log_normalizer - jnp.take_along_axis(logits, safe[..., None], axis=-1)[..., 0]
    loss = nll if not smoothing else (1 - smoothing) * nll + smoothing * (log_normalizer - logits.mean(-1))
    count = valid.sum().astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == safe) & valid
    return {"loss": (jnp.where(valid, loss, 0.0).sum(), count), "accuracy": (correct.sum().astype(jnp.float32), count)}


def ratio(sums: tuple) -> jax.Array:
    numerator, denominator = sums
    return numerator / jnp.maximum(denominator, 1.0)


# A vector metric of MoE models: (router load [L_moe, E], 1). Summed like the others (over micro-batches),
# its ratio is the mean load; the train step takes it out of the sums to move DeepSeek-V3's selection
# bias and to log it (steps.router_load_metrics), so metric consumers only ever see scalars.
ROUTER_LOAD = "router_load"


# What a loss given a segment memory passes out with its sums: the rolled-forward ``cache.Memory``, not a
# metric. The steps take it out at once (steps._loss_fn), so metric consumers only ever see pairs.
MEMORY = "memory"


def carries_memory(cfg: ModelConfig) -> bool:
    """Whether a model keeps Transformer-XL's segment memory from one call to the next."""
    return cfg.position == "xl" and cfg.memory_len > 0


def with_aux_loss(loss: jax.Array, sums: dict, output) -> tuple[jax.Array, dict]:
    """Adds a MoE model's load-balancing loss (already scaled by router_aux_loss_coef; of the kind of
    ``router_aux_loss``: 'batch' for Switch/Mixtral, 'sequence' for DeepSeek-V3's sequence-wise loss)
    and its router load (``ROUTER_LOAD``); other models' loss and sums pass unchanged."""
    if output.router_load is not None:
        sums = {**sums, ROUTER_LOAD: (output.router_load.astype(jnp.float32), jnp.float32(1.0))}
    if output.aux_loss is None:
        return loss, sums
    return loss + output.aux_loss, {**sums, "aux_loss": (output.aux_loss, jnp.float32(1.0))}


# --------------------------------------------------------------------------------------------------
# Objectives


class Objective:
    """Base: the data splits, the model head, batches and the loss of one objective.

    ``family``/``head`` name the model this objective trains; ``adapt`` turns a preset's (or a
    loaded checkpoint's) config into that model, and ``vocab_needed`` is the smallest vocabulary
    that holds every id the batches can contain.
    """

    name = ""
    family = ""
    target_len = 0  # encoder-decoder objectives: decoder tokens per row
    loss_terms = ("loss",)  # the loss is the sum of these metrics' ratios (explicit data parallelism needs it)
    _cut = 0  # records cut to length since the last note

    def __init__(self, run, tokenizer):
        self.run, self.tokenizer = run, tokenizer
        self.seed, self.seq_len = run.run.seed, run.train.seq_len
        self.vocab_needed = tokenizer.vocab_size
        self.notes: list[str] = []  # said once at the start of a run (truncated records and the like)

    def adapt(self, cfg: ModelConfig, fresh: bool) -> ModelConfig:
        """The config of the model this objective trains. ``fresh`` (built from a preset, not loaded):
        the special-token ids come from the tokenizer."""
        if cfg.family != self.family:
            raise ValueError(f"train.objective={self.name!r} trains {self.family} models; model {cfg.name!r} "
                             f"is a {cfg.family} model")
        if cfg.vocab_size < self.vocab_needed:
            raise ValueError(f"the model's vocab_size={cfg.vocab_size} cannot hold the ids of data.tokenizer="
                             f"{self.tokenizer.name!r} ({self.vocab_needed}); set model.overrides.vocab_size="
                             f"{self.vocab_needed} or larger")
        return cfg

    def batch(self, step: int, batch_size: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def eval_batches(self, count: int, batch_size: int) -> list[dict[str, np.ndarray]]:
        raise NotImplementedError

    def loss(self, model, batch: dict, key, memory=None) -> tuple[jax.Array, dict]:
        """The loss and metric sums of one batch; ``memory`` (models that ``carries_memory``, causal_lm
        only) is the batch rows' segment memory, and the sums then carry its successor under ``MEMORY``."""
        raise NotImplementedError

    def finish(self, values: dict[str, float]) -> dict[str, float]:
        """Metrics from summed (numerator / denominator) values; objectives add derived ones here."""
        return values

    def _fixed_length(self, ids: np.ndarray, length: int, tail: list[int]) -> np.ndarray:
        """A record cut to ``length`` tokens with its closing tokens kept; cuts are counted for the notes."""
        if len(ids) + len(tail) > length:
            self._cut += 1
            ids = ids[:length - len(tail)]
        return np.concatenate([ids, np.asarray(tail, np.int32)]).astype(np.int32)

    def _note_cuts(self, what: str, total: int, length_key: str, length: int) -> None:
        if self._cut:
            self.notes.append(f"{self._cut} of {total} {what} were longer than {length_key}={length} tokens and "
                              "were cut")
        self._cut = 0


class CausalLM(Objective):
    """Next-token prediction on documents packed into windows of seq_len + 1 tokens: at seeded offsets,
    or, for a model with segment memory, in order (``PackedStream.row_windows``: row r of a batch goes on
    where row r of the previous one ended, and ``fresh`` marks the rows that start over)."""

    name, family = "causal_lm", "decoder"
    ordered = False  # set by ``adapt``: the model carries a segment memory, so batches are ordered rows

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        documents = data.read_documents(run.data.train)
        train_docs, held_out = data.split_held_out(documents, run.data.eval, run.data.eval_fraction,
                                                   data.read_documents)
        separator = tokenizer.document_separator
        self.train = data.PackedStream.from_documents(tokenizer, train_docs, self.seq_len + 1, "training", separator)
        self.held_out = data.PackedStream.from_documents(tokenizer, held_out, self.seq_len + 1, "held-out", separator)
        self.vocab_needed = int(max(self.train.tokens.max(), self.held_out.tokens.max())) + 1

    def adapt(self, cfg: ModelConfig, fresh: bool) -> ModelConfig:
        cfg = super().adapt(cfg, fresh)
        if cfg.head != "lm":
            cfg = cfg.replace(head="lm")
        self.ordered = carries_memory(cfg)
        return cfg

    @staticmethod
    def _split(windows: np.ndarray, fresh: np.ndarray | None = None) -> dict[str, np.ndarray]:
        batch = {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}
        return batch if fresh is None else {**batch, "fresh": fresh}

    def batch(self, step, batch_size):
        if self.ordered:  # step s reads window s mod windows_per_row of each row: still a function of the step
            return self._split(*self.train.row_windows(step, batch_size))
        return self._split(self.train.windows(data.step_rng(self.seed, step), batch_size))

    def eval_batches(self, count, batch_size):
        if self.ordered:  # consecutive windows of each held-out row, evaluated in order with the memory carried
            return [self._split(*self.held_out.row_windows(i, batch_size)) for i in range(count)]
        windows = self.held_out.fixed_windows(count * batch_size)
        return [self._split(windows[i * batch_size:(i + 1) * batch_size]) for i in range(count)]

    def loss(self, model, batch, key, memory=None):
        if memory is None:
            out = model(batch["input_ids"], dropout_key=key)
        else:  # rows on their first window start over with an empty memory
            out = model(batch["input_ids"], memory=memory.forget(batch["fresh"]), dropout_key=key)
        sums = token_cross_entropy(out.logits, batch["labels"], self.run.train.label_smoothing)
        loss, sums = with_aux_loss(ratio(sums["loss"]), sums, out)
        return (loss, sums) if memory is None else (loss, {**sums, MEMORY: out.memory})


class MaskedLM(Objective):
    """BERT pretraining: [CLS] A [SEP] B [SEP] with B the segment after A half the time (next-sentence
    prediction) and a random segment of another document otherwise; 15% of the tokens are predicted.
    Segments are the non-empty lines of each document. With ``data.nsp=false`` only the MLM loss runs."""

    name, family = "mlm", "encoder"
    loss_terms = ("mlm_loss", "nsp_loss")

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        self.ids = data.require(tokenizer, "pad", "bos", "eos", "mask")
        documents = data.read_documents(run.data.train)
        train_docs, held_out = data.split_held_out(documents, run.data.eval, run.data.eval_fraction,
                                                   data.read_documents)
        self.train, self.held_out = self._segments(train_docs, "training"), self._segments(held_out, "held-out")

    def _segments(self, documents: list[str], name: str) -> dict:
        lines = [[line for line in doc.splitlines() if line.strip()] for doc in documents]
        flat = self.tokenizer.encode_many([line for doc in lines for line in doc])
        owner = np.repeat(np.arange(len(lines)), [len(doc) for doc in lines])
        has_next = np.flatnonzero(owner[:-1] == owner[1:]) if len(owner) > 1 else np.zeros(0, int)
        if len(has_next) == 0 or len(lines) < 2:
            raise ValueError(f"the {name} split needs at least two documents with two or more lines each for "
                             "next-sentence prediction (or set data.nsp=false)")
        return {"segments": flat, "owner": owner, "starts": has_next}

    def adapt(self, cfg, fresh):
        cfg = super().adapt(cfg, fresh)
        head = "pretraining" if self.run.data.nsp else "mlm"
        changes = {"head": head, "pooler": cfg.pooler or head == "pretraining"}
        if fresh:
            changes["pad_token_id"] = self.ids["pad"]
        if cfg.type_vocab_size < 2 and self.run.data.nsp:
            raise ValueError(f"next-sentence prediction needs token types (type_vocab_size >= 2); model "
                             f"{cfg.name!r} has {cfg.type_vocab_size} (set data.nsp=false for RoBERTa-style MLM)")
        return cfg.replace(**changes)

    def _pairs(self, split: dict, rng: np.random.Generator, count: int) -> dict[str, np.ndarray]:
        segments, owner = split["segments"], split["owner"]
        budget = self.seq_len - 3  # [CLS] A [SEP] B [SEP]
        cls, sep = self.ids["bos"], self.ids["eos"]
        rows, types, is_next = [], [], []
        for _ in range(count):
            first = int(rng.choice(split["starts"]))
            follows = bool(rng.random() < 0.5)
            if follows:
                second = first + 1
            else:  # a segment from another document
                second = int(rng.integers(len(segments)))
                while owner[second] == owner[first]:
                    second = int(rng.integers(len(segments)))
            a, b = segments[first], segments[second]
            while len(a) + len(b) > budget:  # BERT trims the longer segment first
                if len(a) >= len(b):
                    a = a[:-1]
                else:
                    b = b[:-1]
            rows.append(np.concatenate([[cls], a, [sep], b, [sep]]).astype(np.int32))
            types.append(np.concatenate([np.zeros(len(a) + 2, np.int32), np.ones(len(b) + 1, np.int32)]))
            is_next.append(0 if follows else 1)  # HF convention: label 0 means "B follows A"
        ids, mask = data.pad_rows(rows, self.seq_len, self.ids["pad"])
        token_types, _ = data.pad_rows(types, self.seq_len, 0)
        inputs, labels = mask_tokens(ids, rng, vocab_size=self.tokenizer.regular_vocab, mask_id=self.ids["mask"],
                                     special_ids=(cls, sep, self.ids["pad"]), select=self.run.data.mask_probability)
        batch = {"input_ids": inputs, "attention_mask": mask, "token_type_ids": token_types,
                 "labels": labels.astype(np.int32)}
        if self.run.data.nsp:
            batch["nsp_labels"] = np.asarray(is_next, np.int32)
        return batch

    def batch(self, step, batch_size):
        return self._pairs(self.train, data.step_rng(self.seed, step), batch_size)

    def eval_batches(self, count, batch_size):
        return [self._pairs(self.held_out, data.step_rng(self.seed, i, stream=1), batch_size) for i in range(count)]

    def loss(self, model, batch, key):
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], dropout_key=key)
        mlm = token_cross_entropy(out.logits, batch["labels"])
        sums = {"mlm_loss": mlm["loss"], "mlm_accuracy": mlm["accuracy"]}
        loss = ratio(mlm["loss"])
        if "nsp_labels" in batch:
            nsp = token_cross_entropy(out.nsp_logits, batch["nsp_labels"])
            sums |= {"nsp_loss": nsp["loss"], "nsp_accuracy": nsp["accuracy"]}
            loss = loss + ratio(nsp["loss"])
        return loss, sums

    def finish(self, values):
        return {"loss": values["mlm_loss"] + values.get("nsp_loss", 0.0), **values}


class _EncoderDecoderObjective(Objective):
    family = "encoder_decoder"

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        # The first decoder token: T5 starts from <pad>, the 2017 Transformer from <s>. A loaded model's
        # own decoder_start_token_id replaces it in ``adapt``.
        self.decoder_start = tokenizer.special("pad" if self.name == "span_corruption" else "bos")

    def adapt(self, cfg, fresh):
        cfg = super().adapt(cfg, fresh)
        if fresh:
            cfg = cfg.replace(pad_token_id=self.tokenizer.special("pad"), eos_token_id=self.tokenizer.special("eos"),
                              decoder_start_token_id=self.decoder_start)
        if cfg.decoder_start_token_id is None:
            raise ValueError(f"model {cfg.name!r} has no decoder_start_token_id; set model.overrides."
                             "decoder_start_token_id")
        self.decoder_start = cfg.decoder_start_token_id
        return cfg.replace(head="lm") if cfg.head != "lm" else cfg

    def _decoder_inputs(self, targets: np.ndarray) -> np.ndarray:
        """Teacher forcing: the decoder reads the start token, then the target shifted right."""
        shifted = np.where(targets == IGNORE, self.pad, targets)[:, :-1]
        return np.concatenate([np.full((len(targets), 1), self.decoder_start, np.int32), shifted], axis=1)

    def loss(self, model, batch, key):
        out = model(batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"],
                    batch.get("decoder_attention_mask"), dropout_key=key)
        sums = token_cross_entropy(out.logits, batch["labels"], self.run.train.label_smoothing)
        return ratio(sums["loss"]), sums


class SpanCorruption(_EncoderDecoderObjective):
    """T5 pretraining on packed text: each window of ``raw_length`` tokens loses about 15% of its
    tokens in spans of mean length 3 to sentinels; the target spells out the spans. ``raw_length`` is
    the longest window whose corrupted input (with EOS) fits train.seq_len, so every shape is static."""

    name = "span_corruption"

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        self.ids = data.require(tokenizer, "pad", "eos", "sentinel")
        self.pad = self.ids["pad"]
        self.density, self.mean_span = run.data.noise_density, run.data.mean_span_length
        self.raw_length = max(n for n in range(2, 4 * self.seq_len) if self._lengths(n)[0] <= self.seq_len)
        self.target_len = self._lengths(self.raw_length)[1]
        documents = data.read_documents(run.data.train)
        train_docs, held_out = data.split_held_out(documents, run.data.eval, run.data.eval_fraction,
                                                   data.read_documents)
        eos = np.array([self.ids["eos"]], np.int32)
        self.train = data.PackedStream.from_documents(tokenizer, train_docs, self.raw_length, "training", eos)
        self.held_out = data.PackedStream.from_documents(tokenizer, held_out, self.raw_length, "held-out", eos)

    def _lengths(self, raw: int) -> tuple[int, int]:
        """(input, target) lengths with EOS, for a window of ``raw`` tokens (as random_spans_noise_mask counts)."""
        noise = min(max(int(round(raw * self.density)), 1), raw - 1)
        spans = max(int(round(noise / self.mean_span)), 1)
        return raw - noise + spans + 1, noise + spans + 2

    def _corrupt(self, windows: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        inputs, targets = span_corrupt(windows, rng, sentinel_start=self.ids["sentinel"],
                                       noise_density=self.density, mean_span_length=self.mean_span)
        eos = [self.ids["eos"]]
        input_ids, mask = data.pad_rows([np.concatenate([row, eos]) for row in inputs], self.seq_len, self.pad)
        labels = np.stack([np.concatenate([row, eos]) for row in targets]).astype(np.int32)
        return {"input_ids": input_ids, "attention_mask": mask, "decoder_input_ids": self._decoder_inputs(labels),
                "labels": labels}

    def batch(self, step, batch_size):
        rng = data.step_rng(self.seed, step)
        return self._corrupt(self.train.windows(rng, batch_size), rng)

    def eval_batches(self, count, batch_size):
        windows = self.held_out.fixed_windows(count * batch_size)
        return [self._corrupt(windows[i * batch_size:(i + 1) * batch_size], data.step_rng(self.seed, i, stream=1))
                for i in range(count)]


class _RecordObjective(Objective):
    """Objectives over JSONL records: each epoch visits every training record once in a seeded order;
    evaluation covers the whole held-out split (its last batch padded with rows that carry no loss)."""

    def _load(self, run, fields: tuple[str, ...]) -> None:
        def read(source: str) -> list[tuple]:
            return [tuple(data.record_field(r, f, source, line) for f in fields) for line, r in data.read_jsonl(source)]

        self.train_records, self.held_out_records = data.split_held_out(read(run.data.train), run.data.eval,
                                                                        run.data.eval_fraction, read)

    def batch(self, step, batch_size):
        rows = data.epoch_indices(len(self.train_examples), self.seed, step, batch_size)
        return self._collate([self.train_examples[i] for i in rows])

    def eval_batches(self, count, batch_size):
        examples = self.held_out_examples
        batches = []
        for start in range(0, len(examples), batch_size):
            chunk = examples[start:start + batch_size]
            filler = [self._blank(chunk[0])] * (batch_size - len(chunk))
            batches.append(self._collate(chunk + filler))
        return batches


class Seq2Seq(_RecordObjective, _EncoderDecoderObjective):
    """Supervised pairs {"source": ..., "target": ...}: source + EOS padded to data.source_len
    (default train.seq_len), target + EOS padded to data.target_len; padding carries no loss."""

    name = "seq2seq"

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        self.ids = data.require(tokenizer, "pad", "eos")
        self.pad = self.ids["pad"]
        self.target_len = run.data.target_len or self.seq_len
        self._load(run, ("source", "target"))
        self.train_examples = self._encode(self.train_records, "training")
        self.held_out_examples = self._encode(self.held_out_records, "held-out")

    def _encode(self, records: list[tuple], name: str) -> list[tuple[np.ndarray, np.ndarray]]:
        eos = [self.ids["eos"]]
        sources = self.tokenizer.encode_many([str(s) for s, _ in records])
        targets = self.tokenizer.encode_many([str(t) for _, t in records])
        sources = [self._fixed_length(s, self.seq_len, eos) for s in sources]
        self._note_cuts(f"{name} sources", len(records), "train.seq_len", self.seq_len)
        targets = [self._fixed_length(t, self.target_len, eos) for t in targets]
        self._note_cuts(f"{name} targets", len(records), "data.target_len", self.target_len)
        return list(zip(sources, targets))

    @staticmethod
    def _blank(example):
        return (example[0], np.zeros(0, np.int32))  # no target tokens: no loss

    def _collate(self, examples):
        source, mask = data.pad_rows([s for s, _ in examples], self.seq_len, self.pad)
        labels, label_mask = data.pad_rows([t for _, t in examples], self.target_len, self.pad)
        labels = np.where(label_mask == 1, labels, IGNORE).astype(np.int32)
        decoder_mask = np.concatenate([np.ones((len(examples), 1), np.int32), label_mask[:, :-1]], axis=1)
        return {"input_ids": source, "attention_mask": mask, "decoder_input_ids": self._decoder_inputs(labels),
                "decoder_attention_mask": decoder_mask, "labels": labels}


class Classification(_RecordObjective):
    """Sequence classification from {"text": ..., "label": ...}: [CLS] text [SEP] padded to seq_len.
    Labels are integers (0..n-1) or strings (sorted, then numbered); the head gets one output per label."""

    name, family = "classification", "encoder"

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        self.ids = data.require(tokenizer, "pad", "bos", "eos")
        self._load(run, ("text", "label"))
        labels = [label for _, label in self.train_records + self.held_out_records]
        if all(isinstance(label, int) and not isinstance(label, bool) for label in labels):
            if min(labels) < 0:
                raise ValueError(f"{run.data.train}: integer labels must be >= 0, found {min(labels)}")
            self.label_names = [str(i) for i in range(max(labels) + 1)]
        elif all(isinstance(label, str) for label in labels):
            self.label_names = sorted(set(labels))
        else:
            raise ValueError(f"{run.data.train}: labels must be all integers or all strings")
        if len(self.label_names) < 2:
            raise ValueError(f"{run.data.train}: classification needs at least two labels, found {self.label_names}")
        self.train_examples = self._encode(self.train_records, "training")
        self.held_out_examples = self._encode(self.held_out_records, "held-out")

    def _encode(self, records, name):
        index = {name: i for i, name in enumerate(self.label_names)}
        texts = self.tokenizer.encode_many([str(t) for t, _ in records])
        tail = [self.ids["eos"]]
        examples = [(np.concatenate([[self.ids["bos"]], self._fixed_length(ids, self.seq_len - 1, tail)]),
                     index[str(label)]) for ids, (_, label) in zip(texts, records)]
        self._note_cuts(f"{name} texts", len(records), "train.seq_len", self.seq_len)
        return examples

    def adapt(self, cfg, fresh):
        cfg = super().adapt(cfg, fresh)
        changes = {"head": "sequence_classification", "pooler": True, "num_labels": len(self.label_names)}
        if fresh:
            changes["pad_token_id"] = self.ids["pad"]
        return cfg.replace(**changes)

    @staticmethod
    def _blank(example):
        return (example[0], IGNORE)

    def _collate(self, examples):
        ids, mask = data.pad_rows([ids for ids, _ in examples], self.seq_len, self.ids["pad"])
        return {"input_ids": ids, "attention_mask": mask, "labels": np.asarray([y for _, y in examples], np.int32)}

    def loss(self, model, batch, key):
        out = model(batch["input_ids"], batch["attention_mask"], dropout_key=key)
        sums = token_cross_entropy(out.logits, batch["labels"])
        return ratio(sums["loss"]), sums


OBJECTIVES = {cls.name: cls for cls in (CausalLM, MaskedLM, SpanCorruption, Seq2Seq, Classification)}


def make_objective(run, tokenizer) -> Objective:
    return OBJECTIVES[run.train.objective](run, tokenizer)
