"""What the text objectives (causal_lm, span_corruption, prefix_lm, ul2) read: ``data.train``, ``data.eval``
and ``data.mixture`` opened as token streams that are read where a window lies, never held whole.

A source is ``python-docs`` (the pydoc topics, tokenized in memory: 460 KB), a folder ``jaxformer tokenize``
wrote (memory-mapped; its manifest's tokenizer must be the run's), or a text file (.txt, .jsonl, .jsonl.gz,
.jsonl.zst, .parquet) that is tokenized into ``run.dir/data-cache/`` the first time a run reads it and
memory-mapped from there on: a changed file (size or mtime) or another tokenizer gets a new cache folder.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from jaxformer.train import data, shards

CACHE = "data-cache"


@dataclasses.dataclass
class Text:
    """The training text (one stream, or a mixture's streams end to end in ``train_regions``: (begin, end,
    weight) each) and the held-out text, with the notes a run says about where they came from."""

    train: data.TokenStream
    train_regions: list[tuple[int, int, float]]
    held_out: data.TokenStream
    held_out_regions: list[tuple[int, int, float]]
    notes: list[str]

    @property
    def max_id(self) -> int:
        return max(self.train.max_id, self.held_out.max_id)

    @property
    def identity(self) -> str:
        """A hash of which tokens train and which are held out: a checkpoint keeps it, so a resume onto text
        that changed since (a file edited, sources appended to a shard folder) is caught."""
        parts = [(s.identity, s.begin, s.end, r) for s, r in ((self.train, self.train_regions),
                                                               (self.held_out, self.held_out_regions))]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    def packed(self, length: int, stride: int | None = None) -> tuple[data.PackedStream, data.PackedStream]:
        """Training and held-out windows of ``length`` tokens, ``stride`` apart."""
        return (data.PackedStream(self.train, length, "training", stride, self.train_regions),
                data.PackedStream(self.held_out, length, "held-out", stride, self.held_out_regions))


def open_text(run, tokenizer, separator: np.ndarray | None) -> Text:
    """The run's training and held-out text. ``separator`` closes each document of text tokenized in memory
    (python-docs); a shard folder's documents end with the separator they were written with."""
    section, notes = run.data, []
    if section.mixture:
        if section.train != data.DEFAULT_CORPUS:
            raise ValueError(f"data.train={section.train!r} and data.mixture are both given; a mixture names every "
                             "training source: leave data.train out")
        components = parse_mixture(section.mixture)
    else:
        components = [(section.train, 1.0)]
    opened = [open_source(path, run, tokenizer, separator, notes, f"data.mixture[{i}].path" if section.mixture
                          else "data.train") for i, (path, _) in enumerate(components)]
    weights = [weight for _, weight in components]
    if section.eval:
        held_out = [(open_source(section.eval, run, tokenizer, separator, notes, "data.eval"), 1.0)]
        training = list(zip(opened, weights))
    else:
        names = [path for path, _ in components]
        splits = [stream.split(section.eval_fraction, name) for stream, name in zip(opened, names)]
        training = [(head, w) for (head, _), w in zip(splits, weights)]
        held_out = [(tail, w) for (_, tail), w in zip(splits, weights)]
    train, train_regions = joined(training)
    held, held_regions = joined(held_out)
    return Text(train, train_regions, held, held_regions, notes)


def joined(parts: list[tuple[data.TokenStream, float]]) -> tuple[data.TokenStream, list[tuple[int, int, float]]]:
    """Streams end to end as one, and where each one's tokens lie in it (with its weight)."""
    if len(parts) == 1:
        stream, weight = parts[0]
        return stream, [(0, len(stream), weight)]
    pieces, boundaries, regions = [], [], []
    for stream, weight in parts:
        base = int(sum(len(p) for p in pieces))
        pieces += stream.pieces
        boundaries += stream.boundaries
        regions.append((base + stream.begin, base + stream.end, weight))
    whole = data.TokenStream(pieces, boundaries, max_id=max(stream.max_id for stream, _ in parts),
                             identity=hashlib.sha256("|".join(s.identity for s, _ in parts).encode()).hexdigest()[:16])
    return whole, regions


def parse_mixture(items) -> list[tuple[str, float]]:
    """(path, weight) of each data.mixture entry; each fault names the entry and the key."""
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"data.mixture must be a list of {{path, weight}} mappings, not {items!r}")
    parsed = []
    for i, item in enumerate(items):
        where = f"data.mixture[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be a mapping with keys path and weight (default 1), not {item!r}")
        unknown = sorted(set(item) - {"path", "weight"})
        if unknown:
            raise ValueError(f"{where} has unknown keys {unknown}; valid: path, weight")
        if "path" not in item:
            raise ValueError(f"{where}.path is missing: a shard folder or a text file")
        path, weight = item["path"], item.get("weight", 1.0)
        if not isinstance(path, str) or not path:
            raise ValueError(f"{where}.path={path!r} must be a shard folder or a text file")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not np.isfinite(weight) or weight <= 0:
            raise ValueError(f"{where}.weight={weight!r} must be a positive number")
        parsed.append((path, float(weight)))
    if len(parsed) < 2:
        raise ValueError(f"data.mixture has {len(parsed)} entries; a mixture weighs two or more sources (one: "
                         "give it as data.train)")
    return parsed


def open_source(source: str, run, tokenizer, separator, notes: list[str], key: str) -> data.TokenStream:
    if source == data.DEFAULT_CORPUS:
        return data.TokenStream.from_documents(tokenizer, data.default_documents(), separator)
    path = Path(source)
    if path.is_dir():
        try:
            opened = shards.open_shards(path, tokenizer=tokenizer.name)
        except ValueError as err:  # another tokenizer, a truncated shard: say which data key named the folder
            raise ValueError(f"{key}={source!r}: {err}") from None
        count, first = skipped_records(opened.manifest)
        unfinished = [entry["path"] for entry in opened.manifest["sources"] if not entry["complete"]]
        notes.append(f"{key}: {opened.total_tokens:,} tokens in {len(opened.tokens)} shards of {path}, "
                     "memory-mapped" + (f" (skipped {count} bad records when tokenized, first: {first})" if count
                                        else "")
                     + (f"; its tokenization stopped before the end of {', '.join(unfinished)}: rerun jaxformer "
                        "tokenize to finish it" if unfinished else ""))
        return nonempty(opened, key, source)
    if not path.is_file():
        raise ValueError(f"{key}={source!r} is neither {data.DEFAULT_CORPUS!r}, a folder jaxformer tokenize wrote, "
                         "nor a readable file")
    if shards.kind_of(path) is None:
        raise ValueError(f"{key}={source!r}: a text source is one of {', '.join(shards.KINDS)}, or a folder "
                         "jaxformer tokenize wrote")
    return nonempty(shards.open_shards(cached(path, run, tokenizer, notes, key)), key, source)


def nonempty(opened: shards.Shards, key: str, source: str) -> data.TokenStream:
    """The shards' stream; a folder without a token (an empty source, or every record skipped) is refused by
    name rather than as an empty split."""
    if opened.total_tokens == 0:
        count, first = skipped_records(opened.manifest)
        raise ValueError(f"{key}={source!r} holds no documents" + (f" (skipped {count} bad records, first: {first})"
                                                                   if count else ""))
    return opened.stream()


def skipped_records(manifest: dict) -> tuple[int, str]:
    """How many records a folder's tokenization skipped (data.on_error=skip), and the first one's fault."""
    count, first = 0, ""
    for source in manifest["sources"]:
        count += sum(source["skipped"].values())
        first = first or next(iter(source.get("first_skipped", {}).values()), "")
    return count, first


def cached(path: Path, run, tokenizer, notes: list[str], key: str) -> Path:
    """The cache folder of ``path`` under ``run.dir/data-cache``, tokenized there first if it is not yet (one
    process at a time; a killed tokenization continues where it stopped)."""
    stat = path.stat()
    identity = shards.tokenizer_identity(tokenizer.name, tokenizer)
    digest = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{identity['sha256']}|"
                            f"{identity.get('split_special_tokens')}".encode()).hexdigest()[:16]
    folder = Path(run.run.dir) / CACHE / f"{path.name}-{digest}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process of this run tokenizing it: wait, then read its shards
        if _complete(folder):  # records skipped when it was tokenized are said again: never silent
            count, first = skipped_records(shards.read_manifest(folder))
            notes.append(f"{key}: {path} read from its token cache {folder}"
                         + (f" (skipped {count} bad records when tokenized, first: {first})" if count else ""))
            return folder
        shards.tokenize([str(path)], tokenizer.name, folder, on_error=run.data.on_error,
                        progress=sys.stderr.isatty(), skip_hint="data.on_error=skip")
    manifest = shards.read_manifest(folder)  # a tokenization resumed after a kill: the whole folder's counts
    count, first = skipped_records(manifest)
    notes.append(f"{key}: tokenized {path} once into {folder} ({manifest['tokens']:,} tokens"
                 + (f"; skipped {count} bad records, first: {first}" if count else "")
                 + "); later runs memory-map it from there")
    return folder


def _complete(folder: Path) -> bool:
    if not (folder / shards.MANIFEST).is_file():
        return False
    return all(source["complete"] for source in shards.read_manifest(folder)["sources"])
