"""Extractive question answering (SQuAD v1.1): contexts cut into overlapping windows, the answer's start
and end token trained by cross-entropy, spans decoded across windows back to the context's characters,
and the official exact-match and F1.

Features are built as transformers' run_qa example builds them: ``[CLS] question [SEP] context [SEP]``
with token types 0 for ``[CLS] question [SEP]`` and 1 for the rest; a context longer than one window is
read as several, each sharing ``data.doc_stride`` tokens with the one before. A window's labels are the
answer's first and last token, or the [CLS] position 0 when the answer is not wholly inside it.

Decoding (run_qa's ``postprocess_qa_predictions`` without the null answer): over all windows of an
example, the ``N_BEST`` highest start and end logits are paired; a pair counts if both tokens are context
tokens, end >= start and the span is at most ``data.max_answer_len`` tokens; the best score
start_logit + end_logit wins, and its tokens' character offsets give the answer text.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import string

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.train import data
from jaxformer.train.data import IGNORE
from jaxformer.train.objectives import Objective, ratio, token_cross_entropy

N_BEST = 20  # start and end candidates per window, as run_qa's n_best_size


# --------------------------------------------------------------------------------------------------
# SQuAD's answer normalisation and metrics (v1.1 evaluation script rules), on a 0-100 scale as it reports


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, punctuation dropped, the articles a/an/the dropped, runs of whitespace made one space."""
    text = "".join(char for char in text.lower() if char not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: list[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer."""
    return float(any(normalize_answer(prediction) == normalize_answer(g) for g in gold))


def f1_score(prediction: str, gold: list[str]) -> float:
    """The best bag-of-words F1 between the normalised prediction and a normalised gold answer."""
    def f1(truth: str) -> float:
        predicted, expected = normalize_answer(prediction).split(), normalize_answer(truth).split()
        shared = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
        if shared == 0:
            return 0.0
        precision, recall = shared / len(predicted), shared / len(expected)
        return 2 * precision * recall / (precision + recall)

    return max(f1(g) for g in gold)


def squad_metrics(predictions: list[str], golds: list[list[str]]) -> dict[str, float]:
    """``exact_match`` and ``f1`` averaged over examples, in percent (as the official script prints them)."""
    count = max(len(predictions), 1)
    return {"exact_match": 100.0 * sum(map(exact_match, predictions, golds)) / count,
            "f1": 100.0 * sum(map(f1_score, predictions, golds)) / count}


# --------------------------------------------------------------------------------------------------
# Records


@dataclasses.dataclass(frozen=True)
class Example:
    """One SQuAD record: ``answers`` holds (text, character start) pairs; ``where`` is file:line."""

    id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    where: str


def read_squad(source: str) -> list[Example]:
    """The records of a SQuAD-format JSONL file (Hugging Face ``datasets`` rows): {"context", "question",
    "answers": {"text": [...], "answer_start": [...]}} and optionally "id"; every answer must stand at
    its answer_start in the context."""
    return [parse_record(record, source, line) for line, record in data.read_jsonl(source)]


def parse_record(record: dict, source: str, line: int) -> Example:
    where = f"{source}:{line}"
    context = data.record_field(record, "context", source, line)
    question = data.record_field(record, "question", source, line)
    answers = record.get("answers")
    if not isinstance(answers, dict) or not isinstance(answers.get("text"), list) or not isinstance(
            answers.get("answer_start"), list):
        raise ValueError(f"{where}: field 'answers' must be {{\"text\": [...], \"answer_start\": [...]}}, not "
                         f"{str(answers)[:60]}")
    texts, starts = answers["text"], answers["answer_start"]
    if not texts or len(texts) != len(starts):
        raise ValueError(f"{where}: field 'answers' needs one or more texts and as many answer_start values; it "
                         f"has {len(texts)} and {len(starts)} (unanswerable SQuAD v2 questions are not supported)")
    pairs = []
    for i, (text, start) in enumerate(zip(texts, starts)):
        if not isinstance(text, str) or not text or isinstance(start, bool) or not isinstance(start, int):
            raise ValueError(f"{where}: answers.text[{i}]={text!r} must be a non-empty string and "
                             f"answers.answer_start[{i}]={start!r} an integer")
        if context[start:start + len(text)] != text or start < 0:
            found = context.find(text)
            hint = f"it occurs at {found}" if found >= 0 else "it does not occur in the context"
            raise ValueError(f"{where}: answers.answer_start[{i}]={start} does not point at answers.text[{i}]="
                             f"{text!r} (the context there reads {context[max(start, 0):][:len(text)]!r}; {hint})")
        pairs.append((text, start))
    identifier = record.get("id", str(line))
    if not isinstance(identifier, (str, int)) or isinstance(identifier, bool):
        raise ValueError(f"{where}: field 'id' must be a string or an integer, not {identifier!r}")
    return Example(str(identifier), question, context, tuple(pairs), where)


# --------------------------------------------------------------------------------------------------
# Windows


@dataclasses.dataclass(frozen=True)
class Window:
    """One model row of an example (unpadded): ``offsets`` [len(input_ids), 2] holds each context token's
    character span in the context and -1 for every other position; ``first`` is the row position of its first context
    token and ``token_start`` that token's index in the whole context."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    offsets: np.ndarray
    first: int
    token_start: int


@dataclasses.dataclass(frozen=True)
class Windowing:
    """How a (question, context) pair becomes rows: tokenizer, special ids and the data.* settings."""

    tokenizer: object
    cls: int
    sep: int
    seq_len: int
    stride: int  # tokens shared by neighbouring windows
    max_question_len: int  # 0: questions are never cut

    def question_ids(self, question: str, where: str) -> tuple[np.ndarray, bool]:
        """The question's ids (cut to max_question_len) and whether they were cut; refused when they leave a
        window no more context tokens than the stride."""
        ids = self.tokenizer.encode(question)
        cut = bool(self.max_question_len) and len(ids) > self.max_question_len
        ids = ids[:self.max_question_len] if cut else ids
        room = self.seq_len - 3 - len(ids)
        if room <= self.stride:
            raise ValueError(f"{where}: the question is {len(ids)} tokens, which leaves {max(room, 0)} context tokens "
                             f"in a window of train.seq_len={self.seq_len} ([CLS] question [SEP] context [SEP]); "
                             f"windows need more than data.doc_stride={self.stride}: shorten the question, set "
                             "data.max_question_len, lower data.doc_stride or raise train.seq_len")
        return ids, cut

    def windows(self, question_ids: np.ndarray, context: str) -> list[Window]:
        ids, spans = self.tokenizer.encode_offsets(context)
        room = self.seq_len - 3 - len(question_ids)
        head = np.concatenate([[self.cls], question_ids, [self.sep]]).astype(np.int32)
        first, out, start = len(head), [], 0
        while True:
            piece = slice(start, start + room)
            row = np.concatenate([head, ids[piece], [self.sep]]).astype(np.int32)
            types = np.concatenate([np.zeros(first, np.int32), np.ones(len(row) - first, np.int32)])
            offsets = np.full((len(row), 2), -1, np.int32)
            offsets[first:len(row) - 1] = spans[piece]
            out.append(Window(row, types, offsets, first, start))
            if start + room >= len(ids):
                return out
            start += room - self.stride

    @staticmethod
    def answer_positions(window: Window, char_start: int, char_end: int) -> tuple[int, int]:
        """The row positions of the answer's first and last token (characters [char_start, char_end) of the
        context), or (0, 0), the [CLS] position, when the answer is not wholly inside ``window`` (run_qa's rule:
        the window's first token starts at or before the answer, its last ends at or after it)."""
        context = window.offsets[window.first:len(window.input_ids) - 1]
        if len(context) == 0 or context[0, 0] > char_start or context[-1, 1] < char_end:
            return 0, 0
        first = np.flatnonzero(context[:, 0] <= char_start)[-1]  # the token the answer's first character is in
        last = np.flatnonzero(context[:, 1] >= char_end)[0]
        return window.first + int(first), window.first + int(last)


def best_span(rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]], max_answer_len: int) -> dict:
    """The best answer span over an example's windows: ``rows`` holds (start_logits [T], end_logits [T],
    offsets [T, 2]) per window. Returns {"start", "end", "score"} (characters [start, end) of the context;
    an empty span with score -inf when no pair is valid)."""
    best = {"start": 0, "end": 0, "score": float("-inf")}
    for start_logits, end_logits, offsets in rows:
        length = len(offsets)
        in_context = offsets[:, 0] >= 0
        starts, ends = (_top(logits[:length]) & in_context for logits in (start_logits, end_logits))
        span = np.arange(length)[None, :] - np.arange(length)[:, None]  # end - start
        allowed = starts[:, None] & ends[None, :] & (span >= 0) & (span < max_answer_len)
        if not allowed.any():
            continue
        scores = np.where(allowed, start_logits[:length, None] + end_logits[None, :length], -np.inf)
        s, e = np.unravel_index(np.argmax(scores), scores.shape)
        if scores[s, e] > best["score"]:
            best = {"start": int(offsets[s, 0]), "end": int(offsets[e, 1]), "score": float(scores[s, e])}
    return best


def _top(logits: np.ndarray) -> np.ndarray:
    """Where the N_BEST highest of ``logits`` are."""
    chosen = np.zeros(len(logits), bool)
    chosen[np.argsort(logits)[::-1][:N_BEST]] = True
    return chosen


# --------------------------------------------------------------------------------------------------
# The objective


class QuestionAnswering(Objective):
    """Extractive QA on SQuAD-format JSONL (``read_squad``); the model is an encoder with
    head='question_answering'. Training visits every window of every training record once per epoch in a
    seeded order; evaluation covers all held-out windows and decodes each example's answer from them
    (``best_span``) for ``eval_exact_match`` and ``eval_f1`` (0-100, the official v1.1 rules)."""

    name, family = "question_answering", "encoder"

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        self.ids = data.require(tokenizer, "pad", "bos", "eos")
        d = run.data
        self.max_answer_len = d.max_answer_len
        stride = d.doc_stride or self.seq_len // 4
        if d.max_question_len and self.seq_len - 3 - d.max_question_len <= stride:
            raise ValueError(f"train.seq_len={self.seq_len} leaves {max(self.seq_len - 3 - d.max_question_len, 0)} "
                             f"context tokens per window after data.max_question_len={d.max_question_len} and "
                             f"[CLS], [SEP], [SEP]; windows need more than data.doc_stride={stride}: raise "
                             "train.seq_len or lower data.max_question_len or data.doc_stride")
        self.windowing = Windowing(tokenizer, self.ids["bos"], self.ids["eos"], self.seq_len, stride,
                                   d.max_question_len)
        self.token_types = True  # set by ``adapt``: False for a model without token types (RoBERTa)
        train_examples, self.held_out_examples = data.split_held_out(read_squad(d.train), d.eval, d.eval_fraction,
                                                                     read_squad)
        self.train_features = self._features(train_examples, "training")
        self.held_out_features = self._features(self.held_out_examples, "held-out")

    def _features(self, examples: list[Example], name: str) -> dict[str, np.ndarray]:
        """Every window of ``examples`` as padded arrays, with labels (the first answer, as run_qa) and the
        owning example and character offsets each window needs for decoding."""
        rows, cut = [], 0
        for index, example in enumerate(examples):
            question, was_cut = self.windowing.question_ids(example.question, example.where)
            cut += was_cut
            text, char_start = example.answers[0]
            for window in self.windowing.windows(question, example.context):
                start, end = Windowing.answer_positions(window, char_start, char_start + len(text))
                rows.append((window, start, end, index))
        if cut:
            self.notes.append(f"{cut} of {len(examples)} {name} questions were longer than data.max_question_len="
                              f"{self.windowing.max_question_len} tokens and were cut")
        ids, mask = data.pad_rows([w.input_ids for w, *_ in rows], self.seq_len, self.ids["pad"])
        types, _ = data.pad_rows([w.token_type_ids for w, *_ in rows], self.seq_len, 0)
        offsets = np.full((len(rows), self.seq_len, 2), -1, np.int32)
        for i, (window, *_) in enumerate(rows):
            offsets[i, :len(window.offsets)] = window.offsets
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types,
                "start_positions": np.array([r[1] for r in rows], np.int32),
                "end_positions": np.array([r[2] for r in rows], np.int32),
                "example": np.array([r[3] for r in rows], np.int32), "offsets": offsets}

    def adapt(self, cfg, fresh):
        cfg = super().adapt(cfg, fresh)
        self.token_types = cfg.embeddings.types >= 2
        changes = {"head": "question_answering"}
        if fresh:
            changes["pad_token_id"] = self.ids["pad"]
        return cfg.replace(**changes)

    def _rows(self, features: dict, rows: np.ndarray) -> dict[str, np.ndarray]:
        batch = {k: features[k][rows] for k in ("input_ids", "attention_mask", "token_type_ids", "start_positions",
                                                "end_positions")}
        if not self.token_types:
            batch["token_type_ids"] = np.zeros_like(batch["token_type_ids"])
        return batch

    def batch(self, step, batch_size):
        rows = data.epoch_indices(len(self.train_features["example"]), self.seed, step, batch_size)
        return self._rows(self.train_features, rows)

    def eval_batches(self, count, batch_size):
        """Every held-out window (``count`` is not used: the whole split is read); the last batch is filled
        with rows whose labels carry no loss."""
        total = len(self.held_out_features["example"])
        batches = []
        for start in range(0, total, batch_size):
            rows = np.minimum(np.arange(start, start + batch_size), total - 1)
            batch = self._rows(self.held_out_features, rows)
            filler = np.arange(start, start + batch_size) >= total
            batch["start_positions"][filler] = batch["end_positions"][filler] = IGNORE
            batches.append(batch)
        return batches

    def _forward(self, model, batch, key):
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], dropout_key=key)
        start = token_cross_entropy(out.start_logits, batch["start_positions"])
        end = token_cross_entropy(out.end_logits, batch["end_positions"])
        rows = start["loss"][1]
        # BertForQuestionAnswering's loss: the mean of the start and end cross-entropies
        sums = {"loss": ((start["loss"][0] + end["loss"][0]) / 2, rows), "start_accuracy": start["accuracy"],
                "end_accuracy": end["accuracy"]}
        return ratio(sums["loss"]), sums, out

    def loss(self, model, batch, key):
        loss, sums, _ = self._forward(model, batch, key)
        return loss, sums

    def eval_outputs(self, model, batch):
        """The steps' host-output hook: each window's start and end logits, decoded in ``finish_outputs``."""
        loss, sums, out = self._forward(model, batch, None)
        return loss, sums, {"start_logits": out.start_logits.astype(jnp.float32),
                            "end_logits": out.end_logits.astype(jnp.float32)}

    def finish_outputs(self, outputs: dict[str, np.ndarray]) -> dict[str, float]:
        features = self.held_out_features
        total = len(features["example"])
        answers = self.decode(features, outputs["start_logits"][:total], outputs["end_logits"][:total],
                              [e.context for e in self.held_out_examples])
        golds = [[text for text, _ in e.answers] for e in self.held_out_examples]
        return squad_metrics([a["text"] for a in answers], golds)

    def decode(self, features: dict, start_logits: np.ndarray, end_logits: np.ndarray,
               contexts: list[str]) -> list[dict]:
        """Each context's best answer over its windows: {"text", "start", "end", "score"}."""
        windows = collections.defaultdict(list)
        for i, owner in enumerate(features["example"]):
            windows[int(owner)].append((start_logits[i], end_logits[i], features["offsets"][i]))
        answers = []
        for index, context in enumerate(contexts):
            span = best_span(windows[index], self.max_answer_len)
            answers.append({"text": context[span["start"]:span["end"]], **span})
        return answers


def predict_answers(run, model, question: str, contexts: list[str]) -> list[dict]:
    """The answer to ``question`` in each of ``contexts``, read by a trained QA model: {"text", "start",
    "end" (characters [start, end) of the context), "score" (start + end logit; None when no span is
    valid)}. ``run`` is the training run the model comes from (``evaluate.restore_run``): its tokenizer
    and data.* settings window the text."""
    objective = run.objective
    if not isinstance(objective, QuestionAnswering):
        raise ValueError(f"the run trained train.objective={objective.name!r}, not 'question_answering'")
    if model.config.head != "question_answering":
        raise ValueError(f"the model has head={model.config.head!r}; answering needs 'question_answering'")
    if not contexts or not all(isinstance(c, str) and c for c in contexts):
        raise ValueError("contexts must be one or more non-empty strings")
    windowing = objective.windowing
    question_ids, _ = windowing.question_ids(question, "the question")
    rows, owners = [], []
    for index, context in enumerate(contexts):
        for window in windowing.windows(question_ids, context):
            rows.append(window)
            owners.append(index)
    ids, mask = data.pad_rows([w.input_ids for w in rows], objective.seq_len, objective.ids["pad"])
    types, _ = data.pad_rows([w.token_type_ids for w in rows], objective.seq_len, 0)
    if not objective.token_types:
        types = np.zeros_like(types)
    offsets = np.full((len(rows), objective.seq_len, 2), -1, np.int32)
    for i, window in enumerate(rows):
        offsets[i, :len(window.offsets)] = window.offsets
    out = model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    start_logits, end_logits = (np.asarray(jax.device_get(x), np.float32) for x in (out.start_logits, out.end_logits))
    features = {"example": np.array(owners), "offsets": offsets}
    answers = objective.decode(features, start_logits, end_logits, contexts)
    # no valid span in any window: an empty answer whose score is None (JSON has no -Infinity)
    return [{**a, "score": a["score"] if np.isfinite(a["score"]) else None} for a in answers]
