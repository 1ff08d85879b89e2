"""Token classification (named-entity recognition): CoNLL-style JSONL, BIO/BIOES tags, entity-level metrics.

Records are {"tokens": ["John", "lives", "in", "New", "York"], "tags": ["B-PER", "O", "O", "B-LOC", "I-LOC"]}
(the layout of Hugging Face's CoNLL sets, with the tags as strings; ``ner_tags`` is read when ``tags`` is
absent). The words are joined by spaces and tokenized once (``encode_offsets``); each word's label sits on
its first subword and the other subwords carry IGNORE, as transformers' token-classification examples do.

Entities follow seqeval's default (non-strict) rules, for BIO and BIOES alike: a chunk starts at B- or S-,
at an I- or E- that follows O, E- or S-, or wherever the type changes; it ends before a B-, S- or O that
follows B- or I-, after every E- and S-, and where the type changes. An entity is right only when its type,
first and last word all match; precision, recall and F1 are micro-averaged over every entity of the
held-out split (not means of per-batch ratios), and ``accuracy`` is the share of words tagged right.
"""

from __future__ import annotations

import json
import re

import jax.numpy as jnp
import numpy as np

from jaxformer.train import data
from jaxformer.train.data import IGNORE
from jaxformer.train.objectives import RecordObjective, ratio, token_cross_entropy

PREFIXES = ("B", "I", "E", "S")  # BIO uses the first two, BIOES all four
WORD = re.compile(r"\w+|[^\w\s]")  # how raw text is cut into words at predict time: words and punctuation marks


def split_tag(tag: str, where: str = "tag") -> tuple[str, str]:
    """(prefix, type) of a tag: ("O", "") for O, ("B", "PER") for B-PER; anything else is a ValueError."""
    if tag == "O":
        return "O", ""
    prefix, dash, kind = tag.partition("-")
    if prefix not in PREFIXES or not dash or not kind:
        raise ValueError(f"{where}: tag {tag!r} is not O or PREFIX-TYPE with a prefix in {', '.join(PREFIXES)} "
                         "(BIO or BIOES, e.g. B-PER, I-LOC, E-ORG, S-MISC)")
    return prefix, kind


def entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """The entities of one tag sequence as (type, first word, last word), by seqeval's default rules."""
    found = []
    prev, prev_type, begin = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):  # the closing O ends an entity still open
        prefix, kind = split_tag(tag)
        type_changed = kind != prev_type
        ends = (prev in ("E", "S") or (prev in ("B", "I") and prefix in ("B", "S", "O"))
                or (prev != "O" and type_changed))
        starts = (prefix in ("B", "S") or (prev in ("E", "S", "O") and prefix in ("I", "E"))
                  or (prefix != "O" and type_changed))
        if ends:
            found.append((prev_type, begin, i - 1))
        if starts:
            begin = i
        prev, prev_type = prefix, kind
    return found


def entity_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Micro precision, recall and F1 over the entities of every sequence (0 where nothing is found),
    and ``accuracy``, the share of tags that match."""
    if len(gold) != len(predicted) or any(len(g) != len(p) for g, p in zip(gold, predicted)):
        raise ValueError("gold and predicted tag sequences must have the same lengths")
    true_total = found_total = correct = 0
    for g, p in zip(gold, predicted):
        true_set, found_set = set(entities(g)), set(entities(p))
        true_total += len(true_set)
        found_total += len(found_set)
        correct += len(true_set & found_set)
    precision = correct / found_total if found_total else 0.0
    recall = correct / true_total if true_total else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    words = sum(len(g) for g in gold)
    right = sum(a == b for g, p in zip(gold, predicted) for a, b in zip(g, p))
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": right / words if words else 0.0}


def word_starts(tokenizer, text: str, spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``text`` and, per word (``spans``: character [start, end) of each), the index of its first
    token, or -1 for a word that no token starts in. A token belongs to the word holding its first
    non-space character (byte-level BPE tokens may begin with the space before a word)."""
    ids, offsets = tokenizer.encode_offsets(text)
    owner = np.full(len(text) + 1, -1, np.int64)
    for w, (start, end) in enumerate(spans):
        owner[start:end] = w
    first = np.full(len(spans), -1, np.int64)
    for t, (start, end) in enumerate(offsets):
        hits = owner[start:max(end, start + 1)]
        hits = hits[hits >= 0]
        if len(hits) and first[hits[0]] < 0:
            first[hits[0]] = t
    return ids, first


def word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the words of raw text (runs of word characters, and each punctuation mark)."""
    return [m.span() for m in WORD.finditer(text)]


class TokenClassification(RecordObjective):
    """NER from {"tokens", "tags"} records: [CLS] subwords [SEP] padded to seq_len, one label per word on its
    first subword. Labels: "O" first (id 0), then the other tags of the data sorted."""

    name, family = "token_classification", "encoder"

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        self.ids = data.require(tokenizer, "pad", "bos", "eos")
        self.train_records, self.held_out_records = data.split_held_out(
            self._read(run.data.train), run.data.eval, run.data.eval_fraction, self._read)
        tags = {tag for _, t in self.train_records + self.held_out_records for tag in t}
        self.label_names = ["O", *sorted(tags - {"O"})]
        self.train_examples = self._encode(self.train_records, "training")
        self.held_out_examples = self._encode(self.held_out_records, "held-out")

    @staticmethod
    def _read(source: str) -> list[tuple[list[str], list[str]]]:
        records = []
        for line, record in data.read_jsonl(source):
            where = f"{source}:{line}"
            key = "tags" if "tags" in record or "ner_tags" not in record else "ner_tags"
            tokens, tags = _strings(record, "tokens", where), _strings(record, key, where)
            if not tokens:
                raise ValueError(f"{where}: field 'tokens' is empty; a record needs at least one word")
            if len(tags) != len(tokens):
                raise ValueError(f"{where}: field {key!r} has {len(tags)} tags for {len(tokens)} tokens; give "
                                 "one tag per token")
            for i, token in enumerate(tokens):
                if not token.strip():
                    raise ValueError(f"{where}: tokens[{i}]={token!r} is blank; every token needs a character")
            for i, tag in enumerate(tags):
                split_tag(tag, f"{where}: {key}[{i}]")
            records.append((tokens, tags))
        return records

    def _encode(self, records, name):
        """Per record: (ids with [CLS]/[SEP], labels per token, each word's token position, the words' tags)."""
        index = {tag: i for i, tag in enumerate(self.label_names)}
        room = self.seq_len - 2
        examples = []
        for tokens, tags in records:
            text, spans = join_words(tokens)
            ids, first = word_starts(self.tokenizer, text, spans)
            if len(ids) > room:
                self._cut += 1
                ids = ids[:room]
            kept = (first >= 0) & (first < len(ids))  # words cut off (or without a token) are not scored
            labels = np.full(len(ids) + 2, IGNORE, np.int32)
            positions = first[kept] + 1  # after [CLS]
            labels[positions] = [index[t] for t, k in zip(tags, kept) if k]
            row = np.concatenate([[self.ids["bos"]], ids, [self.ids["eos"]]]).astype(np.int32)
            examples.append((row, labels, positions, [t for t, k in zip(tags, kept) if k]))
        cut = self._cut
        self._note_cuts(f"{name} sentences", len(records), "train.seq_len", self.seq_len)
        if cut:
            self.notes.append(f"the words past the cut of those {name} sentences are neither trained on nor scored")
        return examples

    def adapt(self, cfg, fresh):
        cfg = super().adapt(cfg, fresh)
        # No pooler: the tags read every position, not the pooled [CLS] (as BertForTokenClassification)
        changes = {"head": "token_classification", "pooler": False, "num_labels": len(self.label_names),
                   "label_names": tuple(self.label_names)}
        if fresh:
            changes["pad_token_id"] = self.ids["pad"]
        return cfg.replace(**changes)

    @staticmethod
    def _blank(example):  # a filler row of the last held-out batch: no label, so no loss and no entities
        return (example[0], np.full(len(example[1]), IGNORE, np.int32))

    def _collate(self, examples):
        ids, mask = data.pad_rows([e[0] for e in examples], self.seq_len, self.ids["pad"])
        labels, _ = data.pad_rows([e[1] for e in examples], self.seq_len, IGNORE)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def loss(self, model, batch, key):
        out = model(batch["input_ids"], batch["attention_mask"], dropout_key=key)
        sums = token_cross_entropy(out.logits, batch["labels"])
        return ratio(sums["loss"]), sums

    def eval_outputs(self, model, batch):
        out = model(batch["input_ids"], batch["attention_mask"])
        sums = token_cross_entropy(out.logits, batch["labels"])
        return ratio(sums["loss"]), sums, {"predictions": jnp.argmax(out.logits, -1).astype(jnp.int32)}

    def finish_outputs(self, outputs):
        """Entity precision, recall and F1 of the held-out split from every row's argmax tags."""
        gold, predicted = [], []
        for (_, _, positions, tags), row in zip(self.held_out_examples, outputs["predictions"]):
            gold.append(tags)
            predicted.append([self.label_names[int(i)] for i in row[positions]])
        scores = entity_scores(gold, predicted)
        return {"precision": scores["precision"], "recall": scores["recall"], "f1": scores["f1"]}


def join_words(tokens: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """The words joined by single spaces, and each word's character span in the result."""
    spans, start = [], 0
    for token in tokens:
        spans.append((start, start + len(token)))
        start += len(token) + 1
    return " ".join(tokens), spans


def _strings(record: dict, key: str, where: str) -> list[str]:
    value = record.get(key)
    if key not in record:
        raise ValueError(f"{where}: the record has no {key!r} field (it has {sorted(record)}); NER records are "
                         '{"tokens": [...], "tags": [...]}')
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        hint = " (integer ner_tags need their names: write the tag strings)" if key == "ner_tags" else ""
        raise ValueError(f"{where}: field {key!r} must be a list of strings, not {json.dumps(value)[:60]}{hint}")
    return value
