"""Training objectives, one class each: what a batch holds (built on the host, a pure function of
(seed, step)), which model head it trains, and its loss and metrics (traced inside the train step).

    causal_lm        next-token prediction on packed text (GPT-2, LLaMA, Mistral, Mixtral)
    mlm              BERT's masked LM (15%: 80% [MASK], 10% random, 10% kept), with next-sentence prediction
    sop              ALBERT's: masked LM with sentence-order prediction (two consecutive segments, swapped or not)
    rtd              ELECTRA's replaced token detection: a generator's MLM samples fill the masked tokens and the
                     discriminator tells each token replaced or original (DeBERTa-v3 pretrains this way too)
    span_corruption  T5's span corruption (noise density 0.15, mean span 3, sentinels from <extra_id_0> down)
    seq2seq          supervised source -> target pairs from JSONL (the 2017 Transformer, T5, BART)
    classification   sequence classification from JSONL text/label, or text/text_pair/label (NLI)
    prefix_lm        a window split into a bidirectional prefix and a target continuing it (T5's prefix LM),
                     for encoder-decoders and for decoders with attention='prefix'
    ul2              UL2's mixture of denoisers: span corruption at regular and extreme rates and the prefix
                     LM, each input led by its mode token [R], [X] or [S] (Tay et al. 2022); both families

Losses return ``(loss, sums)``: ``sums`` maps each metric to (numerator, denominator), so metrics over
several batches (evaluation) are exact token- or example-weighted means, not means of means.

Transformer-XL models (``carries_memory``) train causal_lm on ordered batches: contiguous rows read
window after window, with each row's segment memory carried from step to step (Dai et al. 2019, 3.2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.checks import segment_problem
from jaxformer.model_config import ModelConfig
from jaxformer.generate import GenerationConfig, generate_tokens
from jaxformer.train import corpus, data
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


def contrastive_loss(logits_per_text: jax.Array, sigmoid: bool = False) -> dict:
    """A dual encoder's symmetric image-text loss over a batch of matching pairs (text i describes image i;
    ``logits_per_text`` [B, B]), as metric sums, as transformers computes it with ``return_loss``: CLIP's softmax
    form, the mean of the cross-entropies that pick each text's image and each image's text (Radford et al. 2021),
    or SigLIP's sigmoid form (``sigmoid``; Zhai et al. 2023), each pair a binary decision, positive on the
    diagonal, summed over a text's images and averaged over the texts. ``accuracy``: the texts whose most similar
    image is their own."""
    logits = logits_per_text.astype(jnp.float32)
    count = jnp.float32(logits.shape[0])
    own = jnp.arange(logits.shape[0])
    if sigmoid:
        signs = 2.0 * jnp.eye(logits.shape[0], dtype=jnp.float32) - 1.0
        total = -jax.nn.log_sigmoid(signs * logits).sum()
    else:
        picks = lambda x: (jax.nn.logsumexp(x, axis=-1) - x[own, own]).sum()  # noqa: E731  (cross-entropy sums)
        total = (picks(logits) + picks(logits.T)) / 2
    correct = (jnp.argmax(logits, axis=-1) == own).sum().astype(jnp.float32)
    return {"loss": (total, count), "accuracy": (correct, count)}


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
    return cfg.position == "xl" and cfg.segment_memory > 0


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



def pad_changes(cfg, pad: int) -> dict:
    """The config changes that give a fresh model the tokenizer's pad id: positions counted from the pad (RoBERTa,
    M2M-100's ``pad_aware_positions``) start at the row after it, so the offset moves with it."""
    return {"pad_token_id": pad, **({"position_offset": pad + 1} if cfg.embeddings.pad_aware_positions else {})}

class Objective:
    """Base: the data splits, the model head, batches and the loss of one objective.

    ``family``/``head`` name the model this objective trains; ``adapt`` turns a preset's (or a
    loaded checkpoint's) config into that model, and ``vocab_needed`` is the smallest vocabulary
    that holds every id the batches can contain.
    """

    name = ""
    family = ""
    target_len = 0  # encoder-decoder objectives: decoder tokens per row
    # the loss is the weighted sum of these metrics' ratios (explicit data parallelism needs it)
    loss_terms: dict[str, float] = {"loss": 1.0}
    _cut = 0  # records cut to length since the last note
    text_identity: str | None = None  # objectives reading a token stream: ``corpus.Text.identity``

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
        if cfg.generator_width and self.name != "rtd":  # an ELECTRA run fine-tuned: its generator stays behind
            cfg = cfg.replace(generator_width=0)
        return cfg

    def batch(self, step: int, batch_size: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def batch_rows(self, step: int, batch_size: int, rows: range) -> dict[str, np.ndarray]:
        """Rows ``rows`` of step ``step``'s batch (a process's share). Objectives that read a token stream
        build only those; the rest, whose examples are few and in memory, cut them from the whole batch."""
        return {k: v[rows.start:rows.stop] for k, v in self.batch(step, batch_size).items()}

    def eval_batches(self, count: int, batch_size: int) -> list[dict[str, np.ndarray]]:
        raise NotImplementedError

    def loss(self, model, batch: dict, key, memory=None) -> tuple[jax.Array, dict]:
        """The loss and metric sums of one batch; ``memory`` (models that ``carries_memory``, causal_lm
        only) is the batch rows' segment memory, and the sums then carry its successor under ``MEMORY``."""
        raise NotImplementedError

    def finish(self, values: dict[str, float]) -> dict[str, float]:
        """Metrics from summed (numerator / denominator) values; objectives add derived ones here."""
        return values

    def export_files(self, folder, model_cfg: ModelConfig) -> None:
        """Files a Hugging Face export (``evaluate.export_hf``) writes beside the weights and the tokenizer for
        transformers to run the model as this objective trained it (Whisper's prompt ids); most need none."""

    # Objectives whose held-out metrics are not sums (entity F1, answer spans) define
    # ``eval_outputs(model, batch) -> (loss, sums, per-row outputs)`` and ``finish_outputs(outputs)``:
    # the eval step then brings the rows' outputs to the host (steps.has_host_outputs).
    eval_outputs = None

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
    where row r of the previous one ended, and ``fresh`` marks the rows that start over). With
    ``data.packing=documents`` a window's rows carry segment ids: attention stays inside each document
    and no token is trained to predict the next document's first token."""

    name, family = "causal_lm", "decoder"
    ordered = False  # set by ``adapt``: the model carries a segment memory, so batches are ordered rows
    documents = False  # set by ``adapt``: data.packing=documents, on a model that can pack them

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        text = corpus.open_text(run, tokenizer, tokenizer.document_separator)
        self.notes, self.text_identity = self.notes + text.notes, text.identity
        self.train, self.held_out = text.packed(self.seq_len + 1, stride=self.seq_len)
        self.order = self.train.order(self.seed)
        self.vocab_needed = text.max_id + 1

    def adapt(self, cfg: ModelConfig, fresh: bool) -> ModelConfig:
        cfg = super().adapt(cfg, fresh)
        if cfg.attention == "prefix":
            raise ValueError(f"model {cfg.name!r} has attention='prefix', which needs prefix lengths that "
                             "train.objective='causal_lm' does not give; use train.objective=prefix_lm or ul2")
        if cfg.head != "lm":
            cfg = cfg.replace(head="lm")
        self.ordered = carries_memory(cfg)
        if self.ordered and len(self.train.regions) > 1:
            raise ValueError(f"model {cfg.name!r} carries a segment memory, so it reads one text in order; it "
                             "cannot read data.mixture: give one source as data.train")
        self.documents = documents_packing(self, cfg)
        return cfg

    @staticmethod
    def _split(windows: np.ndarray, fresh: np.ndarray | None = None,
               segments: np.ndarray | None = None) -> dict[str, np.ndarray]:
        batch = {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}
        if segments is not None:  # the last token of a document does not predict the next one's first
            batch["labels"] = np.where(segments[:, 1:] == segments[:, :-1], batch["labels"], IGNORE).astype(np.int32)
            batch["segment_ids"] = segments[:, :-1]
        return batch if fresh is None else {**batch, "fresh": fresh}

    def _windows(self, stream: data.PackedStream, starts: np.ndarray) -> dict[str, np.ndarray]:
        return self._split(stream.cut(starts), segments=stream.segments(starts) if self.documents else None)

    def batch(self, step, batch_size):
        return self.batch_rows(step, batch_size, range(batch_size))

    def batch_rows(self, step, batch_size, rows):
        if self.ordered:  # step s reads window s mod windows_per_row of each row: still a function of the step
            return self._split(*self.train.row_windows(step, batch_size, rows))
        return self._windows(self.train, row_starts(self.order, step, batch_size, rows))

    def eval_batches(self, count, batch_size):
        if self.ordered:  # consecutive windows of each held-out row, evaluated in order with the memory carried
            return [self._split(*self.held_out.row_windows(i, batch_size)) for i in range(count)]
        starts = self.held_out.fixed_starts(count * batch_size)
        return [self._windows(self.held_out, starts[i * batch_size:(i + 1) * batch_size]) for i in range(count)]

    def loss(self, model, batch, key, memory=None):
        if memory is None:
            out = model(batch["input_ids"], dropout_key=key, segment_ids=batch.get("segment_ids"))
        else:  # rows on their first window start over with an empty memory
            out = model(batch["input_ids"], memory=memory.forget(batch["fresh"]), dropout_key=key)
        sums = token_cross_entropy(out.logits, batch["labels"], self.run.train.label_smoothing)
        loss, sums = with_aux_loss(ratio(sums["loss"]), sums, out)
        return (loss, sums) if memory is None else (loss, {**sums, MEMORY: out.memory})


def row_starts(order, step: int, batch_size: int, rows: range) -> np.ndarray:
    """Where rows ``rows`` of step ``step``'s batch begin: row g = step * batch_size + r of the run's order."""
    return np.array([order[step * batch_size + r] for r in rows], np.int64)


def documents_packing(objective: Objective, cfg: ModelConfig) -> bool:
    """Whether ``objective``'s rows carry segment ids: data.packing=documents on a model that can pack
    documents. A model that cannot (Transformer-XL's memory reads the stream on across documents; ``checks.
    segment_problem`` names the others) reads windows across documents, as the run's notes say."""
    if objective.run.data.packing != "documents":
        return False
    problem = "its segment memory carries each row on" if carries_memory(cfg) else segment_problem(cfg)
    if problem:
        objective.notes.append(f"data.packing=documents does not apply to model {cfg.name!r} ({problem}): its "
                               "windows are read across documents, as data.packing=concatenate reads them")
        return False
    return True


class MaskedLM(Objective):
    """BERT pretraining: [CLS] A [SEP] B [SEP] with B the segment after A half the time (next-sentence
    prediction) and a random segment of another document otherwise; 15% of the tokens are predicted.
    Segments are the non-empty lines of each document. With ``data.nsp=false`` only the MLM loss runs."""

    name, family = "mlm", "encoder"
    pair_task = "nsp"  # what the pretraining head's two logits predict about the pair (its metrics' prefix)
    documents = False  # set by ``adapt``: data.packing=documents without a pair task, several examples a row

    @property
    def loss_terms(self) -> dict[str, float]:
        return {"mlm_loss": 1.0, f"{self.pair_task}_loss": 1.0}

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        self.ids = data.require(tokenizer, "pad", "bos", "eos", "mask")
        documents = data.read_documents(run.data.train)
        train_docs, held_out = data.split_held_out(documents, run.data.eval, run.data.eval_fraction,
                                                   data.read_documents)
        self.train, self.held_out = self._segments(train_docs, "training"), self._segments(held_out, "held-out")

    @property
    def pairs(self) -> bool:
        """Whether the pretraining head's pair task runs (``data.nsp`` for BERT's)."""
        return self.run.data.nsp

    def _segments(self, documents: list[str], name: str) -> dict:
        lines = [[line for line in doc.splitlines() if line.strip()] for doc in documents]
        flat = self.tokenizer.encode_many([line for doc in lines for line in doc])
        owner = np.repeat(np.arange(len(lines)), [len(doc) for doc in lines])
        has_next = np.flatnonzero(owner[:-1] == owner[1:]) if len(owner) > 1 else np.zeros(0, int)
        if len(has_next) == 0 or len(lines) < 2:
            raise ValueError(f"the {name} split needs at least two documents with two or more lines each for "
                             f"train.objective={self.name!r}'s segment pairs" + (" (or set data.nsp=false)"
                                                                                 if self.name == "mlm" else ""))
        return {"segments": flat, "owner": owner, "starts": has_next}

    def adapt(self, cfg, fresh):
        cfg = super().adapt(cfg, fresh)
        head = "pretraining" if self.pairs else "mlm"
        changes = {"head": head, "pooler": cfg.head_options.pooler or head == "pretraining"}
        if fresh:
            changes.update(pad_changes(cfg, self.ids["pad"]))
        if cfg.embeddings.types < 2 and self.pairs:
            raise ValueError(f"{self.pair_task} needs token types (type_vocab_size >= 2); model {cfg.name!r} has "
                             f"{cfg.embeddings.types}" + (" (set data.nsp=false for RoBERTa-style MLM)"
                                                         if self.name == "mlm" else ""))
        # a pair task's head reads one pair a row: rows stay one example each, padded
        self.documents = not self.pairs and documents_packing(self, cfg)
        return cfg.replace(**changes)

    def _pick(self, split: dict, rng: np.random.Generator) -> tuple[int, int, int]:
        """Segments A and B of one row and the pair label: B follows A (label 0, HF's convention) or B is
        a segment of another document (1)."""
        segments, owner = split["segments"], split["owner"]
        first = int(rng.choice(split["starts"]))
        if rng.random() < 0.5:
            return first, first + 1, 0
        second = int(rng.integers(len(segments)))
        while owner[second] == owner[first]:
            second = int(rng.integers(len(segments)))
        return first, second, 1

    def _example(self, a: np.ndarray, b: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """[CLS] A [SEP] B [SEP] and its token types, A and B trimmed to ``budget`` tokens together."""
        while len(a) + len(b) > budget:  # BERT trims the longer segment first
            if len(a) >= len(b):
                a = a[:-1]
            else:
                b = b[:-1]
        ids = np.concatenate([[self.ids["bos"]], a, [self.ids["eos"]], b, [self.ids["eos"]]]).astype(np.int32)
        return ids, np.concatenate([np.zeros(len(a) + 2, np.int32), np.ones(len(b) + 1, np.int32)])

    def _pairs(self, split: dict, rng: np.random.Generator, count: int) -> dict[str, np.ndarray]:
        segments = split["segments"]
        if self.documents:
            return self._packed_pairs(split, rng, count)
        rows, types, pair_labels = [], [], []
        for _ in range(count):
            first, second, label = self._pick(split, rng)
            ids, row_types = self._example(segments[first], segments[second], self.seq_len - 3)
            rows.append(ids)
            types.append(row_types)
            pair_labels.append(label)
        batch = self._masked(rows, types, rng)
        if self.pairs:
            batch["pair_labels"] = np.asarray(pair_labels, np.int32)
        return batch

    def _masked(self, rows: list[np.ndarray], types: list[np.ndarray], rng: np.random.Generator,
                segments: list[np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Rows padded to train.seq_len, then BERT's masking of every token but the specials."""
        cls, sep = self.ids["bos"], self.ids["eos"]
        ids, mask = data.pad_rows(rows, self.seq_len, self.ids["pad"])
        token_types, _ = data.pad_rows(types, self.seq_len, 0)
        inputs, labels = mask_tokens(ids, rng, vocab_size=self.tokenizer.regular_vocab, mask_id=self.ids["mask"],
                                     special_ids=(cls, sep, self.ids["pad"]), select=self.run.data.mask_probability)
        batch = {"input_ids": inputs, "attention_mask": mask, "token_type_ids": token_types,
                 "labels": labels.astype(np.int32)}
        if segments is not None:
            batch["segment_ids"] = data.pad_rows(segments, self.seq_len, 0)[0]
        return batch

    def _packed_pairs(self, split: dict, rng: np.random.Generator, count: int) -> dict[str, np.ndarray]:
        """data.packing=documents: examples [CLS] A [SEP] B [SEP] packed into each row until it is full (the
        last trimmed to fit, none under 8 tokens), numbered 1, 2, ... (``segment_ids``; 0: padding)."""
        rows, types, numbers = [], [], []
        for _ in range(count):
            examples, room = [], self.seq_len
            while room >= 8:
                first, second, _ = self._pick(split, rng)
                examples.append(self._example(split["segments"][first], split["segments"][second], room - 3))
                room -= len(examples[-1][0])
            rows.append(np.concatenate([ids for ids, _ in examples]))
            types.append(np.concatenate([kinds for _, kinds in examples]))
            numbers.append(np.concatenate([np.full(len(ids), i + 1, np.int32) for i, (ids, _) in enumerate(examples)]))
        return self._masked(rows, types, rng, numbers)

    def batch(self, step, batch_size):
        return self._pairs(self.train, data.step_rng(self.seed, step), batch_size)

    def eval_batches(self, count, batch_size):
        return [self._pairs(self.held_out, data.step_rng(self.seed, i, stream=1), batch_size) for i in range(count)]

    @staticmethod
    def token_types(model, batch) -> jax.Array | None:
        """The batch's segment ids for a model with token-type embeddings; None for one without (DistilBERT,
        ModernBERT, DeBERTa), which refuses them."""
        return batch["token_type_ids"] if model.config.embeddings.types else None

    def loss(self, model, batch, key):
        out = model(batch["input_ids"], batch["attention_mask"], self.token_types(model, batch), dropout_key=key,
                    segment_ids=batch.get("segment_ids"))
        mlm = token_cross_entropy(out.logits, batch["labels"])
        sums = {"mlm_loss": mlm["loss"], "mlm_accuracy": mlm["accuracy"]}
        loss = ratio(mlm["loss"])
        if "pair_labels" in batch:
            pair = token_cross_entropy(out.nsp_logits, batch["pair_labels"])
            task = self.pair_task
            sums |= {f"{task}_loss": pair["loss"], f"{task}_accuracy": pair["accuracy"]}
            loss = loss + ratio(pair["loss"])
        return loss, sums

    def finish(self, values):
        return {"loss": values["mlm_loss"] + values.get(f"{self.pair_task}_loss", 0.0), **values}


class SentenceOrder(MaskedLM):
    """ALBERT pretraining (Lan et al. 2019): MLM plus sentence-order prediction. A and B are two consecutive
    segments of one document, swapped half the time (label 1, as transformers' ``sentence_order_label``); unlike
    NSP's random second segment, topic gives nothing away, so the head must learn coherence."""

    name, pair_task = "sop", "sop"

    @property
    def pairs(self) -> bool:
        return True

    def _pick(self, split, rng):
        first = int(rng.choice(split["starts"]))
        return (first + 1, first, 1) if rng.random() < 0.5 else (first, first + 1, 0)


def binary_cross_entropy(logits: jax.Array, targets: jax.Array, valid: jax.Array) -> dict:
    """Sigmoid cross-entropy in float32 over the ``valid`` positions, and the accuracy of logit > 0, as sums."""
    logits = logits.astype(jnp.float32)
    targets = targets.astype(jnp.float32)
    loss = jnp.maximum(logits, 0) - logits * targets + jnp.log1p(jnp.exp(-jnp.abs(logits)))
    count = valid.sum().astype(jnp.float32)
    correct = ((logits > 0) == (targets > 0.5)) & valid
    return {"loss": (jnp.where(valid, loss, 0.0).sum(), count), "accuracy": (correct.sum().astype(jnp.float32), count)}


class ReplacedTokenDetection(MaskedLM):
    """ELECTRA pretraining (Clark et al. 2020): a small generator fills the masked positions with samples from
    its MLM distribution, and the discriminator (the model kept) tells, for every real token, whether it was
    replaced. Both train at once: loss = MLM(generator) + train.rtd_weight * BCE(discriminator), the sampling
    outside the gradient. The generator is the model's ``generator_width`` encoder, reading the
    discriminator's embeddings; a model without one gets train.generator_fraction of its width. The inputs are
    BERT's segment pairs without a pair task; each row carries its sampling seed, so a batch (training or
    held-out) is corrupted the same way every time it is seen. A sample equal to the original token counts as
    original, as in the paper. Held-out metrics: both losses, the generator's accuracy, the discriminator's
    accuracy over all tokens and its recall on the replaced ones."""

    name, pair_task = "rtd", "rtd"

    @property
    def pairs(self) -> bool:
        return False

    @property
    def loss_terms(self) -> dict[str, float]:
        return {"mlm_loss": 1.0, "rtd_loss": self.run.train.rtd_weight}

    def adapt(self, cfg, fresh):
        cfg = Objective.adapt(self, cfg, fresh)
        changes = {"head": "discriminator", "pooler": False}
        if fresh:
            changes.update(pad_changes(cfg, self.ids["pad"]))
        if not cfg.generator_width:
            heads = max(1, round(cfg.num_heads * self.run.train.generator_fraction))
            changes["generator_width"] = heads * cfg.head_dim_
        return cfg.replace(**changes)

    def _pairs(self, split, rng, count):
        batch = super()._pairs(split, rng, count)
        batch["sample_seeds"] = rng.integers(0, 2**31 - 1, size=count).astype(np.int32)
        return batch

    def loss(self, model, batch, key):
        gen_key, disc_key = (None, None) if key is None else tuple(jax.random.split(key))
        ids, mask, types = batch["input_ids"], batch["attention_mask"], self.token_types(model, batch)
        generated = model.generator(ids, mask, types, dropout_key=gen_key)
        mlm = token_cross_entropy(generated.logits, batch["labels"])
        chosen = batch["labels"] != IGNORE
        original = jnp.where(chosen, batch["labels"], ids)
        logits = jax.lax.stop_gradient(generated.logits.astype(jnp.float32))
        keys = jax.vmap(jax.random.key)(batch["sample_seeds"])
        sampled = jax.vmap(jax.random.categorical)(keys, logits).astype(ids.dtype)
        corrupted = jnp.where(chosen, sampled, original)
        replaced = corrupted != original
        judged = model(corrupted, mask, types, dropout_key=disc_key)
        real = mask.astype(bool)
        rtd = binary_cross_entropy(judged.logits, replaced, real)
        caught = ((judged.logits > 0) & replaced).sum().astype(jnp.float32)
        sums = {"mlm_loss": mlm["loss"], "mlm_accuracy": mlm["accuracy"], "rtd_loss": rtd["loss"],
                "rtd_accuracy": rtd["accuracy"], "rtd_recall": (caught, replaced.sum().astype(jnp.float32)),
                "replaced": (replaced.sum().astype(jnp.float32), real.sum().astype(jnp.float32))}
        return ratio(mlm["loss"]) + self.run.train.rtd_weight * ratio(rtd["loss"]), sums

    def finish(self, values):
        return {"loss": values["mlm_loss"] + self.run.train.rtd_weight * values["rtd_loss"], **values}


class _EncoderDecoderObjective(Objective):
    family = "encoder_decoder"
    decoder_start_role = "bos"  # the first decoder token: T5 (and UL2) start from <pad>, the 2017 Transformer <s>

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        # A loaded model's own decoder_start_token_id replaces the tokenizer's in ``adapt``.
        self.decoder_start = tokenizer.special(self.decoder_start_role)

    def adapt(self, cfg, fresh):
        cfg = super().adapt(cfg, fresh)
        # Special-token ids: a fresh model takes the tokenizer's; a loaded one keeps its own and takes the
        # tokenizer's only where it has none (a decoder-only model adapted into an encoder-decoder, say).
        ids = {"pad_token_id": self.tokenizer.special("pad"), "eos_token_id": self.tokenizer.special("eos"),
               "decoder_start_token_id": self.decoder_start}
        changes = {field: value for field, value in ids.items() if fresh or cfg.to_flat()[field] is None}
        if "pad_token_id" in changes:
            changes.update(pad_changes(cfg, changes["pad_token_id"]))
        cfg = cfg.replace(**changes)
        if cfg.tokens.decoder_start is None:
            raise ValueError(f"model {cfg.name!r} has no decoder_start_token_id; set model.overrides."
                             "decoder_start_token_id")
        self.decoder_start = cfg.tokens.decoder_start
        return cfg.replace(head="lm") if cfg.head != "lm" else cfg

    def _decoder_inputs(self, targets: np.ndarray) -> np.ndarray:
        """Teacher forcing: the decoder reads the start token, then the target shifted right."""
        shifted = np.where(targets == IGNORE, self.pad, targets)[:, :-1]
        return np.concatenate([np.full((len(targets), 1), self.decoder_start, np.int32), shifted], axis=1)

    def _collate(self, examples: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        """(source, target) pairs, each already ending in EOS: the source padded to train.seq_len, the target
        to target_len; padding carries no loss, and the decoder reads the start token, then the target."""
        source, mask = data.pad_rows([s for s, _ in examples], self.seq_len, self.pad)
        labels, label_mask = data.pad_rows([t for _, t in examples], self.target_len, self.pad)
        labels = np.where(label_mask == 1, labels, IGNORE).astype(np.int32)
        decoder_mask = np.concatenate([np.ones((len(examples), 1), np.int32), label_mask[:, :-1]], axis=1)
        return {"input_ids": source, "attention_mask": mask, "decoder_input_ids": self._decoder_inputs(labels),
                "decoder_attention_mask": decoder_mask, "labels": labels}

    def loss(self, model, batch, key):
        out = model(batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"],
                    batch.get("decoder_attention_mask"), dropout_key=key, segment_ids=batch.get("segment_ids"),
                    decoder_segment_ids=batch.get("decoder_segment_ids"))
        sums = token_cross_entropy(out.logits, batch["labels"], self.run.train.label_smoothing)
        return ratio(sums["loss"]), sums


class SpanCorruption(_EncoderDecoderObjective):
    """T5 pretraining on packed text: each window of ``raw_length`` tokens loses about 15% of its
    tokens in spans of mean length 3 to sentinels; the target spells out the spans. ``raw_length`` is
    the longest window whose corrupted input (with EOS) fits train.seq_len, so every shape is static."""

    name, decoder_start_role = "span_corruption", "pad"
    documents = False  # set by ``adapt``: data.packing=documents, each document corrupted and packed apart

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        self.ids = data.require(tokenizer, "pad", "eos", "sentinel")
        self.pad = self.ids["pad"]
        self.density, self.mean_span = run.data.noise_density, run.data.mean_span_length
        self.raw_length = max(n for n in range(2, 4 * self.seq_len) if self._lengths(n)[0] <= self.seq_len)
        self.target_len = self._lengths(self.raw_length)[1]
        text = corpus.open_text(run, tokenizer, np.array([self.ids["eos"]], np.int32))
        self.notes, self.text_identity = self.notes + text.notes, text.identity
        self.train, self.held_out = text.packed(self.raw_length)
        self.order = self.train.order(self.seed)
        self.vocab_needed = max(self.vocab_needed, text.max_id + 1)

    def _lengths(self, raw: int) -> tuple[int, int]:
        """(input, target) lengths with EOS, for a window of ``raw`` tokens (as random_spans_noise_mask counts)."""
        noise, spans = data.span_counts(raw, self.density, self.mean_span)
        return raw - noise + spans + 1, noise + spans + 2

    def _corrupt(self, windows: np.ndarray, rngs: list[np.random.Generator]) -> dict[str, np.ndarray]:
        inputs, targets = [], []
        for window, rng in zip(windows, rngs):
            source, target = span_corrupt(window[None], rng, sentinel_start=self.ids["sentinel"],
                                          noise_density=self.density, mean_span_length=self.mean_span)
            inputs += source
            targets += target
        eos = [self.ids["eos"]]
        input_ids, mask = data.pad_rows([np.concatenate([row, eos]) for row in inputs], self.seq_len, self.pad)
        labels = np.stack([np.concatenate([row, eos]) for row in targets]).astype(np.int32)
        return {"input_ids": input_ids, "attention_mask": mask, "decoder_input_ids": self._decoder_inputs(labels),
                "labels": labels}

    def adapt(self, cfg, fresh):
        cfg = super().adapt(cfg, fresh)
        self.documents = documents_packing(self, cfg)
        return cfg

    def _packed(self, windows: np.ndarray, segments: np.ndarray,
                rngs: list[np.random.Generator]) -> dict[str, np.ndarray]:
        """Each window's documents corrupted one by one, then packed t5x's way: inputs into a row of
        train.seq_len, targets into one of target_len, example i numbered i on both sides (0: padding); each
        example's decoder inputs start from the start token."""
        rows = [data.span_corrupt_documents(window, segment, rng, sentinel_start=self.ids["sentinel"],
                                            eos=self.ids["eos"], input_len=self.seq_len, target_len=self.target_len,
                                            noise_density=self.density, mean_span_length=self.mean_span)
                for window, segment, rng in zip(windows, segments, rngs)]

        def packed(parts: list[list[np.ndarray]], length: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
            joined = lambda row: np.concatenate(row) if row else np.zeros(0, np.int32)  # noqa: E731
            ids, _ = data.pad_rows([joined(row) for row in parts], length, pad)
            numbered = [joined([np.full(len(p), i + 1) for i, p in enumerate(row)]) for row in parts]
            return ids, data.pad_rows(numbered, length, 0)[0]

        input_ids, segment_ids = packed([[source for source, _ in row] for row in rows], self.seq_len, self.pad)
        labels, decoder_segment_ids = packed([[target for _, target in row] for row in rows], self.target_len,
                                             self.pad)
        decoder_inputs, _ = packed([[np.concatenate([[self.decoder_start], target[:-1]]) for _, target in row]
                                    for row in rows], self.target_len, self.pad)
        return {"input_ids": input_ids, "attention_mask": (segment_ids > 0).astype(np.int32),
                "segment_ids": segment_ids, "decoder_input_ids": decoder_inputs,
                "decoder_attention_mask": (decoder_segment_ids > 0).astype(np.int32),
                "decoder_segment_ids": decoder_segment_ids,
                "labels": np.where(decoder_segment_ids > 0, labels, IGNORE).astype(np.int32)}

    def _windows(self, stream: data.PackedStream, starts: np.ndarray, rngs: list[np.random.Generator]) -> dict:
        if self.documents:
            return self._packed(stream.cut(starts), stream.segments(starts), rngs)
        return self._corrupt(stream.cut(starts), rngs)

    def batch(self, step, batch_size):
        return self.batch_rows(step, batch_size, range(batch_size))

    def batch_rows(self, step, batch_size, rows):
        return self._windows(self.train, row_starts(self.order, step, batch_size, rows),
                             data.row_rngs(self.seed, step, rows))

    def eval_batches(self, count, batch_size):
        starts = self.held_out.fixed_starts(count * batch_size)
        return [self._windows(self.held_out, starts[i * batch_size:(i + 1) * batch_size],
                              data.row_rngs(self.seed, i, range(batch_size), stream=1)) for i in range(count)]


class RecordObjective(Objective):
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


class Seq2Seq(RecordObjective, _EncoderDecoderObjective):
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
        if run.eval.bleu:  # the eval step translates too: host outputs (steps.has_host_outputs)
            self.eval_outputs = self._translate
            # the targets as the tokenizer reads them back, as the translations will be
            self.references = [self.tokenizer.decode(target) for _, target in self.held_out_examples]

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

    def _translate(self, model, batch):
        """Loss and sums as ``loss`` gives them, and each source's translation [B, target_len]: the one
        generation loop ``generate`` runs, traced into the eval step."""
        loss, sums = self.loss(model, batch, None)
        config = GenerationConfig(max_new_tokens=self.target_len, num_beams=self.run.eval.num_beams,
                                  eos_token_ids=(self.ids["eos"],), pad_token_id=self.pad,
                                  decoder_start_token_id=self.decoder_start)
        first = None
        if self.run.eval.force_first_target_token:  # (a padding row's labels are all IGNORE: it starts with pad)
            first = jnp.where(batch["labels"][:, 0] < 0, self.pad, batch["labels"][:, 0])
        graphdef, state = nnx.split(model)
        tokens, _, _ = generate_tokens(graphdef, state, batch["input_ids"], batch["attention_mask"],
                                       jax.random.key(0), config, first)
        return loss, sums, {"translation": tokens}

    def finish_outputs(self, outputs: dict[str, np.ndarray]) -> dict[str, float]:
        """Corpus BLEU (sacrebleu, its default 13a tokenisation) and the share of exact translations, over the
        held-out pairs (the padding rows of a last short batch left out)."""
        import sacrebleu

        eos = self.ids["eos"]
        translations = []
        for row in outputs["translation"][:len(self.references)]:
            ends = np.flatnonzero(row == eos)
            translations.append(self.tokenizer.decode(row[:ends[0]] if len(ends) else row))
        exact = np.mean([t == r for t, r in zip(translations, self.references)])
        return {"bleu": float(sacrebleu.corpus_bleu(translations, [self.references]).score),
                "exact_match": 100.0 * float(exact)}


def longest_first(a: np.ndarray, b: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """A pair of token rows cut to ``budget`` tokens together as the tokenizers library's longest_first
    (transformers' default truncation) does: the longer loses tokens from its end until it is no longer than
    the other, then both are halved (the longer, or on a tie the second, keeping an odd token)."""
    if len(a) + len(b) <= budget:
        return a, b
    short, long = sorted((len(a), len(b)))
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget // 2 + budget % 2
    return (a[:long], b[:short]) if len(a) > len(b) else (a[:short], b[:long])


class Classification(RecordObjective):
    """Sequence classification from {"text": ..., "label": ...}: [CLS] text [SEP] padded to seq_len; or of
    sentence pairs (NLI) from {"text": ..., "text_pair": ..., "label": ...}: [CLS] text [SEP] text_pair [SEP]
    with token types 0 up to the first [SEP] and 1 after it, the longer side cut first when the pair does not
    fit (transformers' truncation='longest_first'). Every record of a run is a pair or none is.
    Labels are integers (0..n-1) or strings (sorted, then numbered); the head gets one output per label.
    An encoder-decoder (BART, T5) reads the same rows, no token types: its classifier pools the decoder state
    at each row's last [SEP] (its eos_token_id), the decoder reading the row shifted right."""

    name, family = "classification", "encoder"
    families = ("encoder", "encoder_decoder")

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        self.ids = data.require(tokenizer, "pad", "bos", "eos")
        self.train_records, self.held_out_records = data.split_held_out(self._read(run.data.train), run.data.eval,
                                                                        run.data.eval_fraction, self._read)
        self.pairs = self._pair_kind(run.data.train, self.train_records, self.held_out_records)
        labels = [label for _, _, label, _ in self.train_records + self.held_out_records]
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

    @staticmethod
    def _read(source: str) -> list[tuple]:
        """(text, text_pair or None, label, where) per record; ``where`` (file:line) names it in errors."""
        def pair(record, line):
            return data.record_field(record, "text_pair", source, line) if "text_pair" in record else None

        return [(data.record_field(r, "text", source, line), pair(r, line), data.record_field(r, "label", source, line),
                 f"{source}:{line}") for line, r in data.read_jsonl(source)]

    @staticmethod
    def _pair_kind(source: str, *splits: list[tuple]) -> bool:
        """Whether the records are sentence pairs; a mix of pairs and single texts is refused (a single text
        among pairs is more likely a record missing its text_pair than one meant to be read alone)."""
        records = [r for split in splits for r in split]
        pairs = [r for r in records if r[1] is not None]
        if pairs and len(pairs) < len(records):
            single = next(r for r in records if r[1] is None)
            raise ValueError(f"{single[3]}: the record has no 'text_pair' field, but {pairs[0][3]} has one; "
                             f"sentence-pair classification needs every record to be a pair (or none; in {source} "
                             f"{len(pairs)} of {len(records)} are)")
        return bool(pairs)

    def _encode(self, records, name):
        index = {label: i for i, label in enumerate(self.label_names)}
        cls, sep = self.ids["bos"], self.ids["eos"]
        firsts = self.tokenizer.encode_many([t for t, _, _, _ in records])
        seconds = self.tokenizer.encode_many([p for _, p, _, _ in records]) if self.pairs else [None] * len(records)
        examples = []
        for a, b, (_, _, label, _) in zip(firsts, seconds, records):
            if b is None:
                ids = np.concatenate([[cls], self._fixed_length(a, self.seq_len - 1, [sep])]).astype(np.int32)
                types = np.zeros(len(ids), np.int32)
            else:
                self._cut += len(a) + len(b) > self.seq_len - 3
                a, b = longest_first(a, b, self.seq_len - 3)
                ids = np.concatenate([[cls], a, [sep], b, [sep]]).astype(np.int32)
                types = np.concatenate([np.zeros(len(a) + 2, np.int32), np.ones(len(b) + 1, np.int32)])
            examples.append((ids, types, index[str(label)]))
        self._note_cuts(f"{name} {'pairs' if self.pairs else 'texts'}", len(records), "train.seq_len", self.seq_len)
        return examples

    def adapt(self, cfg, fresh):
        if cfg.family in self.families:
            self.family = cfg.family
        cfg = super().adapt(cfg, fresh)
        changes = {"head": "sequence_classification", "pooler": True, "num_labels": len(self.label_names),
                   "label_names": tuple(self.label_names)}
        if fresh:
            changes.update(pad_changes(cfg, self.ids["pad"]))
        if cfg.family == "encoder_decoder":
            return self._encoder_decoder(cfg, fresh, changes)
        if self.pairs and cfg.embeddings.types < 2:
            raise ValueError(f"sentence-pair classification tells the two texts apart by token types "
                             f"(type_vocab_size >= 2); model {cfg.name!r} has type_vocab_size={cfg.embeddings.types}")
        return cfg.replace(**changes)

    def _encoder_decoder(self, cfg, fresh, changes):
        """An encoder-decoder classifier pools at the rows' closing [SEP]: that is its eos_token_id (a fresh
        model's, or checked on a loaded one), and its decoder starts from decoder_start_token_id (a fresh
        model's: the tokenizer's EOS, as BART's)."""
        sep = self.ids["eos"]
        changes.update(scale_tied_logits=False, logits_bias=False)  # (the LM head's settings go with it)
        if fresh:
            changes.update(eos_token_id=sep, decoder_start_token_id=sep)
        elif cfg.tokens.eos != sep:
            raise ValueError(f"model {cfg.name!r} pools at eos_token_id={cfg.tokens.eos}, but data.tokenizer="
                             f"{self.tokenizer.name!r} closes each row with {sep}; use the model's own tokenizer")
        elif cfg.tokens.decoder_start is None and not cfg.tokens.wrap_decoder_start:
            changes["decoder_start_token_id"] = sep
        return cfg.replace(**changes)

    @staticmethod
    def _blank(example):
        return (example[0], example[1], IGNORE)

    def _collate(self, examples):
        ids, mask = data.pad_rows([ids for ids, _, _ in examples], self.seq_len, self.ids["pad"])
        types, _ = data.pad_rows([types for _, types, _ in examples], self.seq_len, 0)
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types,
                "labels": np.asarray([y for _, _, y in examples], np.int32)}

    def loss(self, model, batch, key):
        if model.config.family == "encoder_decoder":  # (its decoder reads the rows shifted right)
            out = model(batch["input_ids"], batch["attention_mask"], dropout_key=key)
        else:
            types = batch["token_type_ids"] if model.config.embeddings.types else None
            out = model(batch["input_ids"], batch["attention_mask"], types, dropout_key=key)
        sums = token_cross_entropy(out.logits, batch["labels"])
        return ratio(sums["loss"]), sums


class _Denoising(_EncoderDecoderObjective):
    """Objectives whose examples are (input, target) pairs that one of ``denoisers`` (``data.Denoiser``: span
    corruption or the prefix-LM split) makes of a window of packed text, in one of two model families:

    - an encoder-decoder reads the input (after the denoiser's mode token, ``with_modes``) and EOS in its
      encoder and predicts the target and EOS by teacher forcing, as span_corruption and seq2seq do;
    - a decoder with attention='prefix' reads input then target as one row of train.seq_len + 1 tokens,
      shifted by one: the input is its bidirectional prefix (``prefix_lengths`` [B]) and only the target's
      tokens carry loss. A causal decoder is switched to attention='prefix' (said in a note).

    Shapes are static and nothing is cut: each denoiser reads the longest window whose worst case fits
    (input within train.seq_len and target within ``target_len``, the longest target any denoiser makes;
    or the whole row within train.seq_len + 1), and shorter rows are padded. Which family is known once
    ``adapt`` has seen the model's config, so the windows are laid out there."""

    families = ("encoder_decoder", "decoder")
    decoder_start_role = "pad"  # as T5, whose span corruption UL2 extends
    with_modes = False

    def __init__(self, run, tokenizer, denoisers: tuple[data.Denoiser, ...]):
        super().__init__(run, tokenizer)
        self.denoisers = denoisers
        weights = np.array([d.weight for d in denoisers])
        self.weights = weights / weights.sum()
        self.modes = data.require(tokenizer, *sorted({f"mode_{d.mode}" for d in denoisers})) if self.with_modes else {}
        self.text = corpus.open_text(run, tokenizer, tokenizer.document_separator)
        self.notes, self.text_identity = self.notes + self.text.notes, self.text.identity
        self.raw_lengths: list[int] = []  # per denoiser, set by ``adapt``

    def adapt(self, cfg, fresh):
        if cfg.family not in self.families:
            raise ValueError(f"train.objective={self.name!r} trains encoder-decoder models and decoders; model "
                             f"{cfg.name!r} is an {cfg.family} model")
        self.family = cfg.family
        if cfg.family == "encoder_decoder":
            self._layout()
            return super().adapt(cfg, fresh)
        if cfg.attention not in ("causal", "prefix") or cfg.position == "xl":
            raise ValueError(f"train.objective={self.name!r} reads each input as a bidirectional prefix "
                             f"(attention='prefix'); model {cfg.name!r} has attention={cfg.attention!r} and "
                             f"position={cfg.position!r}, whose window or segment memory a prefix would drop")
        if cfg.attention == "causal":
            self.notes.append(f"train.objective={self.name!r}: model {cfg.name!r} attends with a bidirectional "
                              "prefix (attention 'causal' -> 'prefix'), the targets causally")
            cfg = cfg.replace(attention="prefix")
        self._layout()
        cfg = Objective.adapt(self, cfg, fresh)
        return cfg.replace(head="lm") if cfg.head != "lm" else cfg

    def _layout(self) -> None:
        """Window length per denoiser, target length, the ids the rows use and the vocabulary they need."""
        enc_dec, mode = self.family == "encoder_decoder", int(self.with_modes)
        seq_len = self.seq_len

        def fits(denoiser: data.Denoiser, raw: int) -> bool:
            longest_input, _, longest_row = denoiser.lengths(raw)
            return mode + longest_input + 1 <= seq_len if enc_dec else mode + longest_row <= seq_len + 1

        self.raw_lengths = []
        for i, denoiser in enumerate(self.denoisers):
            if not fits(denoiser, 2):
                raise ValueError(f"train.seq_len={seq_len} is too short for {self._describe(i)}")
            raw = 2
            while fits(denoiser, raw + 1):
                raw += 1
            self.raw_lengths.append(raw)
        lengths = [d.lengths(raw) for d, raw in zip(self.denoisers, self.raw_lengths)]
        self.target_len = max(target + 1 for _, target, _ in lengths) if enc_dec else 0
        roles = ["eos"] if enc_dec else []
        if enc_dec or any(mode + row < seq_len + 1 for _, _, row in lengths):
            roles.append("pad")  # rows shorter than their length are padded
        spans = [i for i, d in enumerate(self.denoisers) if d.mode != "S"]
        self.ids = data.require(self.tokenizer, *roles, *(["sentinel"] if spans else []))
        self.pad = self.ids.get("pad", 0)  # 0 is never written when no row is short
        budget = data.sentinel_budget(self.tokenizer, tuple(self.modes.values()))
        for i in spans:
            needed = self.denoisers[i].sentinels(self.raw_lengths[i])
            if needed > budget:
                raise ValueError(f"{self._describe(i)} needs {needed} sentinel ids for windows of "
                                 f"{self.raw_lengths[i]} tokens (train.seq_len={seq_len}); data.tokenizer="
                                 f"{self.tokenizer.name!r} has {budget} besides the mode tokens: lower "
                                 "train.seq_len, the rate or raise the mean_span")
        self.train, self.held_out = self.text.packed(max(self.raw_lengths))
        self.order = self.train.order(self.seed)
        self.vocab_needed = int(max([*self.ids.values(), *self.modes.values(), self.text.max_id])) + 1

    def _describe(self, i: int) -> str:
        d = self.denoisers[i]
        what = f"rate {d.rate}" if d.mode == "S" else f"mean_span {d.mean_span:g}, rate {d.rate}"
        return f"data.denoisers[{i}] ({d.mode}: {what})" if self.with_modes else f"train.objective={self.name!r}"

    def _laid_out(self) -> None:
        if not self.raw_lengths:
            raise RuntimeError(f"{type(self).__name__}.adapt(model_config) lays out the batches; call it first")

    def _examples(self, windows: np.ndarray, rngs: list[np.random.Generator]) -> dict[str, np.ndarray]:
        pairs = []
        for window, rng in zip(windows, rngs):
            i = rng.choice(len(self.denoisers), p=self.weights)
            denoiser = self.denoisers[i]
            source, target = denoiser.apply(window[:self.raw_lengths[i]], rng, self.ids.get("sentinel"))
            if self.with_modes:
                source = np.concatenate([[self.modes[f"mode_{denoiser.mode}"]], source])
            pairs.append((source.astype(np.int32), target.astype(np.int32)))
        if self.family == "encoder_decoder":
            eos = [self.ids["eos"]]
            return self._collate([(np.concatenate([s, eos]), np.concatenate([t, eos])) for s, t in pairs])
        rows, prefix = [np.concatenate(pair) for pair in pairs], np.array([len(s) for s, _ in pairs], np.int32)
        ids, real = data.pad_rows(rows, self.seq_len + 1, self.pad)
        predicted = np.arange(1, self.seq_len + 1)  # the label of position t is token t + 1
        labels = np.where((predicted >= prefix[:, None]) & (real[:, 1:] == 1), ids[:, 1:], IGNORE)
        return {"input_ids": ids[:, :-1], "labels": labels.astype(np.int32), "prefix_lengths": prefix}

    def batch(self, step, batch_size):
        return self.batch_rows(step, batch_size, range(batch_size))

    def batch_rows(self, step, batch_size, rows):
        self._laid_out()
        windows = self.train.cut(row_starts(self.order, step, batch_size, rows))
        return self._examples(windows, data.row_rngs(self.seed, step, rows))

    def eval_batches(self, count, batch_size):
        self._laid_out()
        windows = self.held_out.cut(self.held_out.fixed_starts(count * batch_size))
        return [self._examples(windows[i * batch_size:(i + 1) * batch_size],
                               data.row_rngs(self.seed, i, range(batch_size), stream=1)) for i in range(count)]

    def loss(self, model, batch, key):
        if model.config.family == "encoder_decoder":
            return super().loss(model, batch, key)
        out = model(batch["input_ids"], prefix_lengths=batch["prefix_lengths"], dropout_key=key)
        sums = token_cross_entropy(out.logits, batch["labels"], self.run.train.label_smoothing)
        return with_aux_loss(ratio(sums["loss"]), sums, out)


class PrefixLM(_Denoising):
    """The prefix LM (Raffel et al. 2020, 3.3; UL2's S-denoiser): each window of packed text is split into a
    prefix, read bidirectionally, and the target that continues it; the target averages
    data.target_fraction of the window (0.5: the split point uniform over it, as T5's prefix LM)."""

    name = "prefix_lm"

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer, (data.Denoiser("S", run.data.target_fraction),))


class UL2(_Denoising):
    """UL2's mixture of denoisers (data.denoisers, default the paper's seven, drawn uniformly): each example
    draws one, and its input starts with that denoiser's mode token. Sentinels count down from <extra_id_0>
    as in span_corruption; with the byte tokenizer the mode tokens are its last three sentinels."""

    name, with_modes = "ul2", True

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer, data.parse_denoisers(run.data.denoisers))
