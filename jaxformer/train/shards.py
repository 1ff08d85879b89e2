"""Pre-tokenized corpora: ``jaxformer tokenize`` writes token shards once, training memory-maps them.

A shard folder holds ``shard-NNNNN.bin`` (token ids end to end, raw little-endian uint16 when the vocabulary
fits, else uint32), ``shard-NNNNN.idx.npy`` (int64 document boundaries: document d is
``tokens[idx[d]:idx[d + 1]]``, ``idx[0] == 0``, ``idx[-1]`` the shard's length) and ``manifest.json``. Every
document ends with the tokenizer's ``document_separator``, the one train.py's packing puts after each
document (bytes: a blank line, "\\n\\n"; a tokenizer.json: its EOS), so the shards read end to end are the
stream ``data.pack`` builds from the same documents. A shard holds whole documents and closes at the first
document end at or past ``shard_tokens``.

The manifest is the commit point: a shard's files are written to temporary names and renamed, then the
manifest naming them is replaced. Each source's entry records how many of its units (a .txt paragraph, a
JSONL line, a parquet or arrow row) are in committed shards, so a killed run continues from there and
nothing is written twice; a source already complete (same path, size and mtime) is skipped, so rerunning
with more sources appends them.

Reading happens on a thread, tokenizing in a process pool over chunks of documents (in order, whatever the
worker count), writing on the main thread: memory is bounded by the chunks in flight and one shard's index.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import glob
import gzip
import hashlib
import io
import json
import multiprocessing
import os
import queue
import threading
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from jaxformer.train import data

FORMAT, VERSION = "jaxformer-shards", 1
MANIFEST = "manifest.json"
KINDS = {".jsonl.gz": "jsonl.gz", ".jsonl.zst": "jsonl.zst", ".jsonl": "jsonl", ".txt": "txt",
         ".parquet": "parquet", ".arrow": "arrow"}
DEFAULT_SHARD_TOKENS = 50_000_000  # 100 MB of uint16: few files, and a killed run redoes at most one
CHUNK_CHARS, CHUNK_DOCS = 1 << 20, 4096  # one task of the pool: large enough to hide its overhead
TXT_BLOCK = 1 << 20  # bytes of a .txt read at a time
SEPARATOR_POLICY = ("each document ends with the tokenizer's document_separator, as train.py packs text "
                    "(bytes: a blank line; a tokenizer.json: its EOS, nothing when it has none)")


@dataclasses.dataclass(frozen=True)
class Source:
    path: Path
    kind: str


@dataclasses.dataclass(frozen=True)
class Bad:
    """A unit that is not a document: why (a short reason the summary counts) and where (file:line)."""

    reason: str
    where: str
    detail: str

    def message(self) -> str:
        return f"{self.where}: {self.detail}"


# --------------------------------------------------------------------------------------------------
# Sources: files, globs, directories and Hugging Face datasets folders


def kind_of(path: Path) -> str | None:
    name = path.name.lower()
    return next((kind for suffix, kind in KINDS.items() if name.endswith(suffix)), None)


def _dataset_folder(folder: Path) -> list[Source]:
    """The arrow files of a ``datasets`` folder written by ``save_to_disk``, in its state.json's order."""
    if (folder / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in folder.iterdir() if (p / "state.json").is_file())
        raise ValueError(f"{folder} is a DatasetDict (splits {splits}); give one split's folder, e.g. "
                         f"{folder / (splits[0] if splits else 'train')}")
    state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    files = [folder / item["filename"] for item in state.get("_data_files", [])]
    missing = [str(f) for f in files if not f.is_file()]
    if not files or missing:
        raise ValueError(f"{folder}/state.json names no arrow files, or missing ones: {missing}")
    return [Source(f, "arrow") for f in files]


def _expand_one(path: Path, ignored: list[Path]) -> list[Source]:
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return _dataset_folder(path)
        found = []
        for child in sorted(path.iterdir()):
            if child.is_dir() or kind_of(child):
                found += _expand_one(child, ignored)
            else:
                ignored.append(child)
        return found
    kind = kind_of(path)
    if kind is None:
        raise ValueError(f"{path} is not a source jaxformer tokenize reads; valid: {', '.join(KINDS)} files, "
                         "directories of them, or a datasets folder written by save_to_disk")
    return [Source(path, kind)]


def expand_sources(arguments: list[str]) -> tuple[list[Source], list[Path]]:
    """Files, globs and directories (walked in sorted order) -> sources, each once; and the files a directory
    held that are of no kind read here (the caller says so)."""
    sources, ignored = [], []
    for argument in arguments:
        path = Path(argument)
        if path.exists():
            sources += _expand_one(path, ignored)
            continue
        matches = sorted(glob.glob(argument, recursive=True))
        if not matches:
            raise ValueError(f"source {argument!r} is no file or directory and matches no file")
        for match in matches:
            sources += _expand_one(Path(match), ignored)
    unique = {}
    for source in sources:
        unique.setdefault(str(source.path.resolve()), Source(source.path.resolve(), source.kind))
    return list(unique.values()), ignored


def _identity(source: Source) -> dict:
    stat = source.path.stat()
    return {"path": str(source.path), "kind": source.kind, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


# --------------------------------------------------------------------------------------------------
# Readers: each yields (unit, text | Bad) from unit ``start`` on and reports its byte position


class _Meter(io.RawIOBase):
    """A raw file that reports how far it has been read (the progress bar follows compressed bytes)."""

    def __init__(self, raw, at: Callable[[int], None]):
        self.raw, self.at, self.position = raw, at, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = self.raw.readinto(buffer)
        self.position += count or 0
        self.at(self.position)
        return count


def _read_txt(source: Source, field: str, start: int, at) -> Iterator[tuple[int, str | Bad]]:
    """Paragraphs (blank-line separated) as read_documents splits a .txt; newlines read as Python's text mode
    does. Bytes are split before decoding ("\\n" is never inside a UTF-8 character), so one bad byte costs one
    paragraph."""
    unit, line, carry, cr = 0, 1, [], False  # carry: the blocks of a paragraph not yet ended
    with open(source.path, "rb") as file:
        while True:
            block = file.read(TXT_BLOCK)
            at(file.tell())
            end = not block
            if cr:  # a "\r" that ended the previous block: it may pair with a "\n" starting this one
                block = b"\r" + block
            cr = not end and block.endswith(b"\r")
            if cr:
                block = block[:-1]
            block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if not end and b"\n\n" not in (carry[-1][-1:] if carry else b"") + block:
                carry.append(block)  # no paragraph ends here: joined once it does (linear in a long one)
                continue
            pieces = b"".join(carry + [block]).split(b"\n\n")
            carry = [] if end else [pieces.pop()]
            for piece in pieces:
                if unit >= start:
                    yield from _paragraph(source, unit, line, piece)
                unit, line = unit + 1, line + piece.count(b"\n") + 2
            if end:
                return


def _paragraph(source: Source, unit: int, line: int, piece: bytes):
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError as err:
        at = line + piece[:err.start].count(b"\n")
        yield unit, Bad("not UTF-8", f"{source.path}:{at}",
                        f"byte {piece[err.start:err.start + 1]!r} is not UTF-8 text; convert the file to UTF-8")
        return
    if text.strip():
        yield unit, text


def _jsonl_stream(source: Source, file, at):
    meter = io.BufferedReader(_Meter(file, at), 1 << 20)
    if source.kind == "jsonl.gz":
        return gzip.GzipFile(fileobj=meter)
    if source.kind == "jsonl.zst":
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(meter), 1 << 20)
    return meter


def _read_jsonl(source: Source, field: str, start: int, at) -> Iterator[tuple[int, str | Bad]]:
    """Lines of {field: text} (blank lines skipped), plain, gzip or zstandard."""
    with open(source.path, "rb") as file:
        stream, number = _jsonl_stream(source, file, at), 0
        try:
            for number, raw in enumerate(stream, 1):
                if number > start:
                    yield number - 1, _json_record(source, field, number, raw)
        except (OSError, EOFError, _zstd_error()) as err:
            raise ValueError(f"{source.path}: not a readable {source.kind} file after line {number}: {err}") from None


def _zstd_error() -> type:
    import zstandard

    return zstandard.ZstdError


def _json_record(source: Source, field: str, number: int, raw: bytes) -> str | Bad | None:
    where = f"{source.path}:{number}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return Bad("not UTF-8", where, f"byte {err.start + 1} of the line ({raw[err.start:err.start + 1]!r}) is not "
                                       "UTF-8; convert the file to UTF-8")
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        return Bad("not JSON", where, f"not JSON: {err}")
    if not isinstance(record, dict):
        return Bad("not a JSON object", where, f"must be a JSON object with a {field!r} field")
    if field not in record:
        return Bad(f"no {field!r} field", where, f"the record has no {field!r} field (it has {sorted(record)})")
    if not isinstance(record[field], str):
        return Bad(f"{field!r} not text", where, f"field {field!r} must be a string, not "
                                                 f"{json.dumps(record[field])[:40]}")
    return record[field]


def _text_column(source: Source, schema, field: str) -> Bad | None:
    import pyarrow as pa

    if field not in schema.names:
        return Bad(f"no {field!r} field", str(source.path), f"has no column {field!r} (it has {schema.names})")
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        return Bad(f"{field!r} not text", str(source.path), f"column {field!r} holds {kind}, not strings")
    return None


def _rows(source: Source, field: str, start: int, first_row: int, batches) -> Iterator[tuple[int, str | Bad]]:
    row = first_row
    for batch in batches:
        for value in batch.column(field).to_pylist():
            if row >= start:
                yield row, value if value is not None else Bad(f"{field!r} not text", f"{source.path}: row {row}",
                                                               f"field {field!r} is null")
            row += 1


def _read_parquet(source: Source, field: str, start: int, at) -> Iterator[tuple[int, str | Bad]]:
    """Rows of a parquet file, read one record batch at a time (row groups before ``start`` are not read)."""
    import pyarrow.parquet as pq

    file = pq.ParquetFile(source.path)
    bad = _text_column(source, file.schema_arrow, field)
    if bad:
        yield 0, bad
        return
    group, first_row = 0, 0
    while group < file.num_row_groups and first_row + file.metadata.row_group(group).num_rows <= start:
        first_row += file.metadata.row_group(group).num_rows
        group += 1
    total, size = max(file.metadata.num_rows, 1), source.path.stat().st_size
    batches = file.iter_batches(batch_size=4096, row_groups=list(range(group, file.num_row_groups)), columns=[field])
    for unit, item in _rows(source, field, start, first_row, batches):
        if unit % 4096 == 0:
            at(size * unit // total)
        yield unit, item


def _read_arrow(source: Source, field: str, start: int, at) -> Iterator[tuple[int, str | Bad]]:
    """Rows of an Arrow IPC file or stream (``datasets`` writes streams), memory-mapped, batch by batch."""
    import pyarrow as pa

    with pa.memory_map(str(source.path)) as mapped:
        is_file = mapped.read(6) == b"ARROW1"
        mapped.seek(0)
        reader = pa.ipc.open_file(mapped) if is_file else pa.ipc.open_stream(mapped)
        bad = _text_column(source, reader.schema, field)
        if bad:
            yield 0, bad
            return
        batches = ((reader.get_batch(i) for i in range(reader.num_record_batches)) if is_file else reader)
        for unit, item in _rows(source, field, start, 0, batches):
            if unit % 4096 == 0:
                at(mapped.tell())
            yield unit, item


READERS = {"txt": _read_txt, "jsonl": _read_jsonl, "jsonl.gz": _read_jsonl, "jsonl.zst": _read_jsonl,
           "parquet": _read_parquet, "arrow": _read_arrow}


def read_units(source: Source, field: str, start: int = 0,
               at: Callable[[int], None] = lambda position: None) -> Iterator[tuple[int, str | Bad]]:
    """(unit, document text or Bad) of one source from unit ``start`` on; a source with no document at all is
    one Bad ("empty file"). ``at`` hears the byte position reached."""
    seen = False
    try:
        for unit, item in READERS[source.kind](source, field, start, at):
            if item is not None:
                seen = True
                yield unit, item
    except (ValueError, OSError) as err:  # pyarrow's and the decompressors' errors name no file: name it
        if str(source.path) in str(err):
            raise
        raise ValueError(f"{source.path}: not a readable {source.kind} file: {err}") from None
    if not seen and start == 0:
        yield 0, Bad("empty file", str(source.path), "holds no documents")


# --------------------------------------------------------------------------------------------------
# Tokenizing: one function for the pool's workers and the in-process path


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def tokenizer_identity(spec: str, tokenizer) -> dict:
    """What names a tokenizer in the manifest: its spec and a hash of its tokenizer.json ("bytes" for bytes),
    and transformers' split_special_tokens switch, which changes the ids of the same file."""
    if spec == "bytes":
        return {"spec": "bytes", "sha256": "bytes"}
    file = Path(spec) / "tokenizer.json" if Path(spec).is_dir() else Path(spec)
    return {"spec": spec, "sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
            "split_special_tokens": bool(tokenizer.tokenizer.encode_special_tokens)}


class Encoder:
    """Documents -> (their tokens end to end, each followed by the separator; each document's length)."""

    def __init__(self, spec: str):
        self.tokenizer = data.make_tokenizer(spec)
        self.separator = self.tokenizer.document_separator
        self.dtype = token_dtype(self.tokenizer.vocab_size)

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        pieces = self.tokenizer.encode_many(texts)
        extra = 0 if self.separator is None else len(self.separator)
        lengths = np.fromiter((len(p) + extra for p in pieces), np.int64, len(pieces))
        if extra:
            pieces = [part for piece in pieces for part in (piece, self.separator)]
        tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
        return tokens.astype(self.dtype), lengths


_worker_encoder: Encoder | None = None


def _start_worker(spec: str) -> None:
    global _worker_encoder
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the pool is the parallelism: one thread per worker
    _worker_encoder = Encoder(spec)


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return _worker_encoder(texts)


class _Now:
    """A chunk encoded in this process when the writer asks for it (the reader thread runs ahead)."""

    def __init__(self, encode, texts):
        self.encode, self.texts = encode, texts

    def result(self):
        return self.encode(self.texts)


# --------------------------------------------------------------------------------------------------
# The folder: manifest, lock, shard writing


def _write_atomically(path: Path, write: Callable) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def _save_manifest(out: Path, manifest: dict) -> None:
    _write_atomically(out / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode("utf-8")))


def read_manifest(out: Path) -> dict:
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise ValueError(f"{out} holds no {MANIFEST}: not a folder written by jaxformer tokenize")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"{path} is format {manifest.get('format')!r} version {manifest.get('version')!r}; "
                         f"this jaxformer reads {FORMAT!r} version {VERSION}")
    return manifest


def check_tokenizer(manifest: dict, identity: dict, out) -> None:
    """Refuse, by name, a tokenizer other than the one the shards were written with."""
    held = manifest["tokenizer"]
    if held.get("sha256") != identity["sha256"] or held.get("split_special_tokens") != identity.get(
            "split_special_tokens"):
        raise ValueError(f"{out} holds tokens of tokenizer {held['spec']!r} (sha256 {held['sha256'][:16]}); "
                         f"tokenizer {identity['spec']!r} (sha256 {identity['sha256'][:16]}) is a different one; "
                         "use that tokenizer, or another folder")


def _shard_name(index: int) -> str:
    return f"shard-{index:05d}"


class ShardWriter:
    """Appends documents to the open shard's temporary file; at ``shard_tokens`` renames it, writes its
    index, and commits the manifest with every source's progress up to that document."""

    def __init__(self, out: Path, manifest: dict, shard_tokens: int, dtype: np.dtype,
                 sources: list[dict], on_shard: Callable[[], None] = lambda: None):
        self.out, self.manifest, self.shard_tokens, self.dtype = out, manifest, shard_tokens, dtype
        self.sources = sources  # this run's live entries, in reading order
        self.on_shard = on_shard
        self.file, self.size, self.lengths, self.max_id = None, 0, [], 0

    def documents(self, order: int, tokens: np.ndarray, lengths: np.ndarray, units: list[int]) -> None:
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        first = 0
        while first < len(lengths):
            target = bounds[first] + self.shard_tokens - self.size  # the document end that fills the shard
            last = int(min(max(np.searchsorted(bounds, target), first + 1), len(lengths)))
            self._append(tokens[bounds[first]:bounds[last]], lengths[first:last])
            entry = self.sources[order]
            entry["units_done"] = units[last - 1] + 1
            entry["documents"] += last - first
            entry["tokens"] += int(bounds[last] - bounds[first])
            first = last
            if self.size >= self.shard_tokens:
                self.close_shard()

    def skipped(self, order: int, unit: int, bad: Bad) -> None:
        entry = self.sources[order]
        entry["units_done"] = unit + 1
        entry["skipped"][bad.reason] = entry["skipped"].get(bad.reason, 0) + 1
        entry.setdefault("first_skipped", {}).setdefault(bad.reason, bad.message())

    def _append(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        if self.file is None:
            self.file = open(self.out / f"{_shard_name(len(self.manifest['shards']))}.bin.tmp", "wb")
        self.file.write(tokens.tobytes())
        self.size += len(tokens)
        self.lengths.append(lengths)
        self.max_id = max(self.max_id, int(tokens.max())) if len(tokens) else self.max_id

    def close_shard(self) -> None:
        if self.file is None:
            return
        name = _shard_name(len(self.manifest["shards"]))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.out / f"{name}.bin.tmp", self.out / f"{name}.bin")
        lengths = np.concatenate(self.lengths)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        _write_atomically(self.out / f"{name}.idx.npy", lambda f: np.save(f, offsets))
        self.manifest["shards"].append({"name": name, "tokens": self.size, "documents": len(lengths),
                                        "max_id": self.max_id})
        self.file, self.size, self.lengths, self.max_id = None, 0, [], 0
        self.commit()
        self.on_shard()

    def commit(self) -> None:
        """The manifest with every shard so far and each touched source's progress, atomically replaced."""
        held = {entry["path"]: i for i, entry in enumerate(self.manifest["sources"])}
        for entry in self.sources:
            if entry["units_done"] or entry["complete"]:
                if entry["path"] in held:
                    self.manifest["sources"][held[entry["path"]]] = json.loads(json.dumps(entry))
                else:
                    held[entry["path"]] = len(self.manifest["sources"])
                    self.manifest["sources"].append(json.loads(json.dumps(entry)))
        self.manifest["tokens"] = sum(s["tokens"] for s in self.manifest["shards"])
        self.manifest["documents"] = sum(s["documents"] for s in self.manifest["shards"])
        _save_manifest(self.out, self.manifest)

    def abandon(self) -> None:
        if self.file is not None:
            self.file.close()
            (self.out / Path(self.file.name).name).unlink(missing_ok=True)
            self.file = None


def _open_folder(out: Path, identity: dict, encoder: Encoder) -> dict:
    """The folder's manifest (a new one for an empty folder), its tokenizer checked; stale temporaries gone."""
    if (out / MANIFEST).is_file():
        manifest = read_manifest(out)
        check_tokenizer(manifest, identity, out)
    else:
        if any(p.name != ".lock" for p in out.iterdir()):
            raise ValueError(f"--out {out} holds files but no {MANIFEST}; give an empty or a new folder")
        out.mkdir(parents=True, exist_ok=True)
        separator = [] if encoder.separator is None else [int(i) for i in encoder.separator]
        manifest = {"format": FORMAT, "version": VERSION, "tokenizer": identity,
                    "vocab_size": encoder.tokenizer.vocab_size, "dtype": encoder.dtype.name,
                    "byte_order": "little", "separator": separator, "separator_policy": SEPARATOR_POLICY,
                    "eos": encoder.tokenizer.special("eos"), "tokens": 0, "documents": 0, "shards": [],
                    "sources": []}
        _save_manifest(out, manifest)
    for stale in out.glob("*.tmp"):
        stale.unlink()
    return manifest


def _plan(sources: list[Source], manifest: dict, field: str, out: Path) -> tuple[list[dict], list[str]]:
    """This run's entries (resumed ones continue where the manifest left them) and the paths skipped as done."""
    held = {entry["path"]: entry for entry in manifest["sources"]}
    plan, done = [], []
    for source in sources:
        now = _identity(source)
        before = held.get(now["path"])
        if before is None:
            plan.append({**now, "field": field, "units_done": 0, "complete": False, "documents": 0, "tokens": 0,
                         "skipped": {}})
            continue
        if (before["size"], before["mtime_ns"]) != (now["size"], now["mtime_ns"]):
            raise ValueError(f"{source.path} changed since it was tokenized into {out} (size {before['size']} -> "
                             f"{now['size']}, mtime_ns {before['mtime_ns']} -> {now['mtime_ns']}); its earlier "
                             "tokens are in the shards: tokenize into another folder")
        if before["complete"]:
            done.append(now["path"])
        else:
            if before.get("field", field) != field:
                raise ValueError(f"{source.path} was started with --field {before['field']!r}, not {field!r}")
            plan.append(json.loads(json.dumps(before)))
    return plan, done


# --------------------------------------------------------------------------------------------------
# The command


@dataclasses.dataclass
class Summary:
    out: Path
    shards_written: int
    tokens_written: int
    documents_written: int
    already_done: list[str]
    ignored: list[Path]
    skipped: dict[str, int]
    first_skipped: dict[str, str]
    unfinished: list[str]  # sources an earlier run began that this one was not given

    def lines(self) -> list[str]:
        lines = [f"wrote {self.shards_written} shards ({self.tokens_written:,} tokens, {self.documents_written:,} "
                 f"documents) to {self.out}"]
        if self.already_done:
            lines.append(f"skipped {len(self.already_done)} sources already tokenized there (same path, size, mtime)")
        if self.ignored:
            lines.append(f"ignored {len(self.ignored)} files of no kind read here, e.g. {self.ignored[0]}")
        for reason, count in sorted(self.skipped.items()):
            lines.append(f"skipped {count} units: {reason} (first: {self.first_skipped[reason]})")
        if self.unfinished:
            lines.append(f"{len(self.unfinished)} sources an earlier run began are unfinished (name them again to "
                         f"finish them): {', '.join(self.unfinished[:3])}")
        return lines


def tokenize(arguments: list[str], tokenizer: str, out: str | Path, *, field: str = "text",
             shard_tokens: int = DEFAULT_SHARD_TOKENS, workers: int | None = None, on_error: str = "stop",
             progress: bool = True, skip_hint: str = "--on-error skip") -> Summary:
    """Tokenize ``arguments`` (files, globs, directories) into shards under ``out``: see the module docstring.
    ``skip_hint``: how the caller's user asks to skip bad units, named in the error that stops at one."""
    if on_error not in ("stop", "skip"):
        raise ValueError(f"--on-error {on_error!r}; valid: stop, skip")
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise ValueError(f"--shard-tokens {shard_tokens!r} must be a positive integer")
    automatic, workers = workers is None, len(os.sched_getaffinity(0)) if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"--workers {workers!r} must be a positive integer")
    sources, ignored = expand_sources(list(arguments))
    encoder = Encoder(tokenizer)
    identity = tokenizer_identity(tokenizer, encoder.tokenizer)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder (new, or one jaxformer tokenize wrote)")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"another jaxformer tokenize is writing {out}") from None
        manifest = _open_folder(out, identity, encoder)
        plan, done = _plan(sources, manifest, field, out)
        if automatic and sum(entry["size"] for entry in plan) < workers * CHUNK_CHARS:
            workers = 1  # under a chunk per core, starting the pool would cost more than it shares
        shards_before = len(manifest["shards"])
        tokens_before, documents_before = manifest["tokens"], manifest["documents"]
        _run(plan, manifest, out, encoder, tokenizer, field, shard_tokens, workers, on_error, progress, skip_hint)
    skipped, first = {}, {}
    for entry in plan:
        for reason, count in entry["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + count
            first.setdefault(reason, entry["first_skipped"][reason])
    named = {entry["path"] for entry in plan}
    unfinished = [e["path"] for e in manifest["sources"] if not e["complete"] and e["path"] not in named]
    return Summary(out, len(manifest["shards"]) - shards_before, manifest["tokens"] - tokens_before,
                   manifest["documents"] - documents_before, done, ignored, skipped, first, unfinished)


def _pool(workers: int, spec: str):
    if workers == 1:
        return None
    context = multiprocessing.get_context("forkserver")  # no fork of a process that may run JAX's threads
    context.set_forkserver_preload([__name__])  # workers start from a server that imported this module once
    return concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                                  initargs=(spec,))


def _run(plan, manifest, out, encoder, spec, field, shard_tokens, workers, on_error, progress, skip_hint) -> None:
    from tqdm import tqdm

    todo = sum(entry["size"] for entry in plan)
    bar = tqdm(total=todo, unit="B", unit_scale=True, desc="tokenize", disable=not progress or not todo)
    writer = ShardWriter(out, manifest, shard_tokens, encoder.dtype, plan,
                         on_shard=lambda: bar.set_postfix_str(f"{manifest['tokens']:,} tokens", refresh=False))
    pool = _pool(workers, spec)
    events: queue.Queue = queue.Queue(maxsize=2 * workers + 2)
    stop = threading.Event()
    encode = (lambda texts: pool.submit(_encode_in_worker, texts)) if pool else (lambda texts: _Now(encoder, texts))
    reader = threading.Thread(target=_produce, args=(plan, field, on_error, encode, events, stop), daemon=True)
    reader.start()
    try:
        while True:
            event = events.get()
            if event[-1] is not None:  # the bar follows what is tokenized, so its MB/s is the throughput
                bar.update(event[-1] - bar.n)
            if event[0] == "chunk":
                _, order, units, pending, _ = event
                try:
                    tokens, lengths = pending.result()
                except BrokenProcessPool:
                    raise RuntimeError("a tokenizing worker process died (killed, out of memory, or unable to start: "
                                       "a script read from stdin cannot start workers; --workers 1 runs in this "
                                       "process); rerun to continue from the last committed shard") from None
                writer.documents(order, tokens, lengths, units)
            elif event[0] == "bad":
                _, order, unit, bad, _ = event
                if on_error == "stop":
                    raise ValueError(f"{bad.message()} ({skip_hint} skips and counts such units)")
                writer.skipped(order, unit, bad)
            elif event[0] == "end":
                plan[event[1]]["complete"] = True
            elif event[0] == "error":
                raise event[1]
            else:
                break
        writer.close_shard()
        writer.commit()
    finally:
        stop.set()
        writer.abandon()
        bar.close()
        if pool:
            pool.shutdown(wait=True, cancel_futures=True)


def _produce(plan, field, on_error, encode, events, stop) -> None:
    """The reader thread: every source's units in order, documents grouped into chunks handed to ``encode``.
    Each event ends with the bytes of the run's sources read when it was made (None: no news)."""
    def put(event):
        while not stop.is_set():
            try:
                events.put(event, timeout=0.1)
                return
            except queue.Full:
                continue
        raise SystemExit  # the writer stopped: end this thread quietly

    try:
        before = 0  # the bytes of the sources read to the end
        for order, entry in enumerate(plan):
            source = Source(Path(entry["path"]), entry["kind"])
            reached = [0]

            def at(position, reached=reached):
                reached[0] = max(reached[0], position)

            texts, units, chars = [], [], 0
            for unit, item in read_units(source, field, entry["units_done"], at):
                if isinstance(item, Bad):
                    if texts:
                        put(("chunk", order, units, encode(texts), before + reached[0]))
                        texts, units, chars = [], [], 0
                    put(("bad", order, unit, item, before + reached[0]))
                    if on_error == "stop":
                        return
                    continue
                texts.append(item)
                units.append(unit)
                chars += len(item)
                if chars >= CHUNK_CHARS or len(texts) >= CHUNK_DOCS:
                    put(("chunk", order, units, encode(texts), before + reached[0]))
                    texts, units, chars = [], [], 0
            before += entry["size"]
            if texts:
                put(("chunk", order, units, encode(texts), before))
            put(("end", order, before))
        put(("done", None))
    except SystemExit:
        return
    except Exception as err:  # handed to the writer, which raises it on the main thread
        try:
            put(("error", err, None))
        except SystemExit:
            return


# --------------------------------------------------------------------------------------------------
# Reading shards back


@dataclasses.dataclass
class Shards:
    """A shard folder, memory-mapped: ``tokens[i]`` is shard i's ids, ``offsets[i]`` its document
    boundaries (int64, one more than its documents, memory-mapped too)."""

    manifest: dict
    tokens: list[np.ndarray]
    offsets: list[np.ndarray]

    @property
    def separator(self) -> np.ndarray:
        return np.asarray(self.manifest["separator"], np.int32)

    @property
    def total_tokens(self) -> int:
        return self.manifest["tokens"]

    def document(self, shard: int, index: int) -> np.ndarray:
        """Document ``index`` of shard ``shard``, its separator included."""
        start, end = self.offsets[shard][index], self.offsets[shard][index + 1]
        return self.tokens[shard][start:end]

    def stream(self) -> data.TokenStream:
        """The shards end to end as one token stream (nothing read until a window is)."""
        known = [shard.get("max_id") for shard in self.manifest["shards"]]  # folders before it: the vocabulary
        max_id = max(known, default=0) if None not in known else self.manifest["vocab_size"] - 1
        written = json.dumps([self.manifest["tokenizer"], self.manifest["shards"]], sort_keys=True)
        return data.TokenStream(self.tokens, self.offsets, max_id=max_id,
                                identity=hashlib.sha256(written.encode()).hexdigest()[:16])


def open_shards(folder: str | Path, tokenizer: str | None = None) -> Shards:
    """Memory-map a folder written by ``jaxformer tokenize``: every shard's size and index are checked against
    the manifest (a truncated or missing shard is named); ``tokenizer`` (a data.tokenizer spec), when given,
    must be the one the shards were written with. Nothing is read but the indexes' ends, so opening costs
    the same at any corpus size."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if tokenizer is not None:
        check_tokenizer(manifest, tokenizer_identity(tokenizer, data.make_tokenizer(tokenizer)), folder)
    dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
    tokens, offsets = [], []
    for shard in manifest["shards"]:
        bin_path, idx_path = folder / f"{shard['name']}.bin", folder / f"{shard['name']}.idx.npy"
        if not bin_path.is_file() or not idx_path.is_file():
            raise ValueError(f"shard {bin_path} or its index {idx_path.name} is missing; the manifest lists it")
        expected = shard["tokens"] * dtype.itemsize
        if bin_path.stat().st_size != expected:
            raise ValueError(f"shard {bin_path} holds {bin_path.stat().st_size} bytes; the manifest says "
                             f"{shard['tokens']} tokens ({expected} bytes): it is truncated or damaged")
        try:
            index = np.load(idx_path, mmap_mode="r")
        except (ValueError, OSError) as err:
            raise ValueError(f"index {idx_path} cannot be read ({err}): it is truncated or damaged") from None
        if (index.dtype != np.int64 or index.shape != (shard["documents"] + 1,) or index[0] != 0
                or index[-1] != shard["tokens"]):
            raise ValueError(f"index {idx_path} does not describe {shard['documents']} documents of "
                             f"{shard['tokens']} tokens, as the manifest says")
        tokens.append(np.memmap(bin_path, dtype, "r") if expected else np.zeros(0, dtype))
        offsets.append(index)
    return Shards(manifest, tokens, offsets)
