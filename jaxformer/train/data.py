"""Training data with nothing downloaded: tokenizers, text and JSONL sources, step-indexed sampling, and
the host-side corruptions objectives apply to it (BERT's masking, T5's span corruption, the prefix-LM
split and UL2's mixture of denoisers).

Every row of a batch is a pure function of (seed, step, row): the pipeline's position *is* the step, which
the checkpoint holds, so a resumed run sees exactly the batches an uninterrupted one would have seen, and
each process builds only its own rows, the same ones whatever the number of processes. Shapes are static:
text is packed into fixed windows (``TokenStream``, ``PackedStream``), records are padded to fixed lengths.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from pathlib import Path

import numpy as np

BYTE_VOCAB = 256
DEFAULT_CORPUS = "python-docs"


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255; then <pad>, <s> (also [CLS]), </s> (also [SEP]), [MASK]; then 100
    T5 sentinels at the top of the vocabulary, <extra_id_0> the highest id, as in T5.

    UL2's mode tokens [R], [X], [S] are the last three sentinels (<extra_id_97>, <extra_id_98>,
    <extra_id_99>: ids 262, 261, 260), so the vocabulary keeps its 360 ids; under UL2 spans then count
    down from <extra_id_0> through <extra_id_96> only (``sentinel_budget``)."""

    SPECIALS = {"pad": 256, "bos": 257, "eos": 258, "mask": 259}
    SENTINELS = 100
    vocab_size = BYTE_VOCAB + len(SPECIALS) + SENTINELS
    MODES = {"mode_R": vocab_size - 98, "mode_X": vocab_size - 99, "mode_S": vocab_size - 100}
    sentinel_count = SENTINELS
    regular_vocab = BYTE_VOCAB  # what MLM's random replacements draw from: real bytes, not specials
    name = "bytes"
    document_separator = np.frombuffer(b"\n\n", np.uint8).astype(np.int32)  # packed text reads as text

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Ids and each id's character span [n, 2] in ``text`` (every byte of a character spans it)."""
        spans = [(i, i + 1) for i, char in enumerate(text) for _ in range(len(char.encode("utf-8")))]
        return self.encode(text), np.asarray(spans, np.int32).reshape(-1, 2)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < BYTE_VOCAB).decode("utf-8", errors="replace")

    def special(self, role: str) -> int | None:
        if role == "sentinel":
            return self.vocab_size - 1
        return self.SPECIALS.get(role, self.MODES.get(role))


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer.json; specials are found by their usual spellings."""

    SPELLINGS = {"pad": ("[PAD]", "<pad>"), "bos": ("[CLS]", "<s>", "<|begin_of_text|>", "<|endoftext|>"),
                 "eos": ("[SEP]", "</s>", "<|end_of_text|>", "<|endoftext|>"), "mask": ("[MASK]", "<mask>"),
                 "sentinel": ("<extra_id_0>",),
                 # UL2's mode tokens: the paper's names, then those of Google's released UL2 checkpoint
                 "mode_R": ("[R]", "[NLU]"), "mode_X": ("[X]", "[NLG]"), "mode_S": ("[S]", "[S2S]")}

    def __init__(self, path: str):
        from jaxformer.interop.tokenizer import load_tokenizer

        self.name = path
        self.tokenizer = load_tokenizer(path).tokenizer
        if self.tokenizer is None:
            raise ValueError(f"data.tokenizer={path!r} holds SentencePiece files (Marian's, M2M100's), which jaxformer "
                             "reads to translate and serve; training reads a tokenizer.json")
        self.vocab_size = self.regular_vocab = self.tokenizer.get_vocab_size(with_added_tokens=True)
        eos = self.special("eos")
        self.document_separator = None if eos is None else np.array([eos], np.int32)
        top, count = self.special("sentinel"), 0  # <extra_id_i> is <extra_id_0> - i, as T5 numbers them
        while top is not None and self.tokenizer.token_to_id(f"<extra_id_{count}>") == top - count:
            count += 1
        self.sentinel_count = count

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, np.int32) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Ids and each id's character span [n, 2] in ``text``, as the tokenizer reports them."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        return np.asarray(encoding.ids, np.int32), np.asarray(encoding.offsets, np.int32).reshape(-1, 2)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def special(self, role: str) -> int | None:
        for spelling in self.SPELLINGS[role]:
            found = self.tokenizer.token_to_id(spelling)
            if found is not None:
                return found
        return None


def make_tokenizer(spec: str) -> ByteTokenizer | HFTokenizer:
    return ByteTokenizer() if spec == "bytes" else HFTokenizer(spec)


def require(tokenizer, *roles: str) -> dict[str, int]:
    """The ids of the special tokens an objective needs, or a ValueError naming what is missing."""
    found = {role: tokenizer.special(role) for role in roles}
    missing = [role for role, value in found.items() if value is None]
    if missing:
        spellings = {role: HFTokenizer.SPELLINGS[role] for role in missing}
        raise ValueError(f"data.tokenizer={tokenizer.name!r} has no {', '.join(missing)} token (looked for "
                         f"{spellings}); this objective needs them")
    return found


def default_documents() -> list[str]:
    """English prose and code shipped with every Python install: the pydoc topics (about 460 KB)."""
    from pydoc_data import topics

    return [topics.topics[name] for name in sorted(topics.topics)]


def read_documents(source: str) -> list[str]:
    """``python-docs``, a .txt file (documents separated by blank lines) or a .jsonl file of {"text": ...}."""
    if source == DEFAULT_CORPUS:
        return default_documents()
    if source.endswith(".jsonl"):
        return [record_field(r, "text", source, line) for line, r in read_jsonl(source)]
    path = Path(source)
    if path.is_dir():
        raise ValueError(f"data source {source!r} is a folder; token shards (jaxformer tokenize) feed causal_lm, "
                         "span_corruption, prefix_lm and ul2, while this objective reads the text itself: give "
                         "a .txt or .jsonl file")
    if not path.is_file():
        raise ValueError(f"data source {source!r} is neither {DEFAULT_CORPUS!r} nor a readable file")
    return [doc for doc in read_text(path).split("\n\n") if doc.strip()]


def read_text(path: Path) -> str:
    """A UTF-8 text file's contents; anything else is a ValueError naming the file and the byte."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start} is {err.object[err.start:err.start + 1]!r}); "
                         "convert it to UTF-8") from None


def read_jsonl(source: str) -> list[tuple[int, dict]]:
    """The records of a JSONL file with their line numbers (blank lines skipped)."""
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"data source {source!r} is not a readable JSONL file")
    records = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{source}:{number} is not JSON: {err}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{source}:{number} must be a JSON object")
        records.append((number, record))
    if not records:
        raise ValueError(f"{source} holds no records")
    return records


# What each JSONL field may hold (JSON true/false are never labels: Python counts them as integers).
FIELD_TYPES = {"text": (str,), "source": (str,), "target": (str,), "label": (str, int)}


def record_field(record: dict, key: str, source: str, line: int):
    """``record[key]``, refused with file, line and field when absent or of the wrong JSON type (a null or
    a number where text belongs would otherwise be trained on as the string "None" or "12345")."""
    if key not in record:
        raise ValueError(f"{source}:{line}: the record has no {key!r} field (it has {sorted(record)})")
    value, kinds = record[key], FIELD_TYPES.get(key, (str,))
    if isinstance(value, bool) or not isinstance(value, kinds):
        wanted = " or ".join({"str": "a string", "int": "an integer"}[k.__name__] for k in kinds)
        raise ValueError(f"{source}:{line}: field {key!r} must be {wanted}, not {json.dumps(value)[:40]}")
    return value


def split_held_out(items: list, eval_source: str, eval_fraction: float, reader) -> tuple[list, list]:
    """Training items and held-out items: ``data.eval`` when given, else the last ``eval_fraction``."""
    if eval_source:
        return items, reader(eval_source)
    cut = int(round(len(items) * (1 - eval_fraction)))
    if cut == len(items) or cut == 0:
        raise ValueError(f"data.eval_fraction={eval_fraction} of {len(items)} items leaves an empty split; "
                         "give more data or a data.eval file")
    return items[:cut], items[cut:]


def step_rng(seed: int, step: int, stream: int = 0) -> np.random.Generator:
    """The host random stream of one step (``stream`` separates independent uses in one step)."""
    return np.random.default_rng((seed, step, stream))


def row_rngs(seed: int, step: int, rows, stream: int = 0) -> list[np.random.Generator]:
    """One random stream per row of a step: a row draws the same on whichever process builds it."""
    return [np.random.default_rng((seed, step, stream, row)) for row in rows]


def epoch_indices(count: int, seed: int, step: int, batch_size: int) -> np.ndarray:
    """Rows of step ``step`` when ``count`` records are visited in a fresh seeded order every epoch."""
    positions = np.arange(step * batch_size, (step + 1) * batch_size)
    epochs, offsets = np.divmod(positions, count)
    orders = {int(e): np.random.default_rng((seed, int(e))).permutation(count) for e in np.unique(epochs)}
    return np.array([orders[int(e)][o] for e, o in zip(epochs, offsets)])


PACKINGS = ("documents", "concatenate")  # data.packing: attention within each document, or across the window


def pack(tokenizer, documents: list[str], separator: np.ndarray | None = None) -> np.ndarray:
    """The documents' tokens end to end, ``separator`` after each: one int32 stream."""
    return pack_documents(tokenizer, documents, separator)[0]


def pack_documents(tokenizer, documents: list[str], separator: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The documents' tokens end to end, ``separator`` after each (it belongs to the document it closes):
    one int32 stream, and where in it each document starts [documents]."""
    pieces, starts, at = [], [], 0
    for ids in tokenizer.encode_many(documents):
        starts.append(at)
        pieces.append(ids)
        if separator is not None:
            pieces.append(separator)
        at += len(ids) + (0 if separator is None else len(separator))
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    return tokens, np.asarray(starts, np.int64)


class TokenStream:
    """Token ids end to end, over pieces that each hold whole documents (a corpus's memory-mapped shards, or
    one array in memory), and where each document starts; a view ``[begin, end)`` of them. Only the bytes a
    read touches are read (``bytes_read`` counts them), so host memory does not grow with the corpus."""

    def __init__(self, pieces: list[np.ndarray], boundaries: list[np.ndarray], begin: int = 0,
                 end: int | None = None, max_id: int | None = None, identity: str = ""):
        self.pieces, self.boundaries = pieces, boundaries  # boundaries[p]: int64 [documents + 1], 0 .. len
        self.piece_starts = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)
        self.begin, self.end = begin, int(self.piece_starts[-1]) if end is None else end
        self.max_id = max_id  # the largest id in the pieces, when known without reading them
        self.identity = identity  # names the pieces' tokens (a hash), so a resume can tell the text changed
        self.bytes_read, self._counting = 0, threading.Lock()  # the loader's threads read at once

    @classmethod
    def from_documents(cls, tokenizer, documents: list[str], separator: np.ndarray | None = None) -> "TokenStream":
        """Documents tokenized in memory, ``separator`` after each (it belongs to the document it closes)."""
        tokens, starts = pack_documents(tokenizer, documents, separator)
        return cls([tokens], [np.append(starts, len(tokens))], max_id=int(tokens.max()) if len(tokens) else 0,
                   identity=hashlib.sha256(tokens.tobytes()).hexdigest()[:16])

    def __len__(self) -> int:
        return self.end - self.begin

    def _pieces(self, start: int, count: int):
        """(piece, first, last, where in the read) of each piece a read of ``count`` tokens at ``start`` meets."""
        at = self.begin + start
        if start < 0 or count < 0 or at + count > self.end:
            raise IndexError(f"tokens [{start}, {start + count}) lie outside a stream of {len(self)}")
        piece = int(np.searchsorted(self.piece_starts, at, side="right")) - 1
        done = 0
        while done < count:
            first = at + done - int(self.piece_starts[piece])
            last = min(len(self.pieces[piece]), first + count - done)
            yield piece, first, last, done
            done += last - first
            piece += 1

    def read(self, start: int, count: int) -> np.ndarray:
        """``count`` ids from ``start`` (stream positions), as int32."""
        out = np.empty(count, np.int32)
        for piece, first, last, at in self._pieces(start, count):
            window = self.pieces[piece][first:last]
            out[at:at + last - first] = window
            with self._counting:
                self.bytes_read += window.nbytes
        return out

    def segments(self, start: int, count: int) -> np.ndarray:
        """Segment ids [count] of ``count`` tokens from ``start``: 1 for the document the read begins in (or
        its tail), 2 for the next, ... (int32, packed rows as t5x and MaxText number them)."""
        begins = np.zeros(count, np.int32)
        for piece, first, last, at in self._pieces(start, count):
            bounds = self.boundaries[piece]
            lo, hi = np.searchsorted(bounds, [first, last], side="left")
            inside = np.asarray(bounds[lo:hi]) - first + at  # documents beginning inside this part of the read
            begins[inside[inside > 0]] = 1
        return np.cumsum(begins, dtype=np.int32) + 1

    def split(self, fraction: float, name: str) -> tuple["TokenStream", "TokenStream"]:
        """The whole stream (not a view) cut at a document boundary into its first documents and the last
        ``fraction`` of them."""
        if (self.begin, self.end) != (0, int(self.piece_starts[-1])):
            raise ValueError("only a whole token stream splits into training and held-out documents")
        documents = sum(len(b) - 1 for b in self.boundaries)
        cut = int(round(documents * (1 - fraction)))
        if cut in (0, documents):
            raise ValueError(f"data.eval_fraction={fraction} of {name}'s {documents} documents leaves an empty "
                             "split; give more data or a data.eval")
        counts = np.cumsum([len(b) - 1 for b in self.boundaries])
        piece = int(np.searchsorted(counts, cut, side="right"))
        before = cut - (int(counts[piece - 1]) if piece else 0)
        at = int(self.piece_starts[piece]) + int(self.boundaries[piece][before])
        head, tail = (TokenStream(self.pieces, self.boundaries, b, e, self.max_id, self.identity)
                      for b, e in ((self.begin, at), (at, self.end)))
        return head, tail


class PackedStream:
    """A token stream cut into windows of ``length`` tokens that follow each other ``stride`` tokens apart
    (``length - 1`` for next-token prediction: a window's last token, its last label, is the next one's first
    input, so every token is predicted once an epoch). ``regions`` ((begin, end, weight) each; default the
    whole stream) are the sources of a mixture laid end to end: no window crosses one, and training rows draw
    from each in proportion to its weight.

    Training rows visit each region's windows in a seeded order reshuffled every epoch (Grain's lazy index
    shuffle: no permutation is held in memory; Grain's mix weighs the regions), so row ``g`` of a run is a pure
    function of (seed, g); held-out windows are fixed. Models with segment memory read the stream in order
    instead (``row_windows``)."""

    def __init__(self, stream: TokenStream, length: int, name: str, stride: int | None = None,
                 regions: list[tuple[int, int, float]] | None = None):
        self.stream, self.length, self.name = stream, length, name
        self.stride = length if stride is None else stride
        self.regions = [(0, len(stream), 1.0)] if regions is None else regions
        self.counts = []  # windows per region
        for i, (begin, end, _) in enumerate(self.regions):
            if end - begin < length:
                which = f"the {name} split" + (f" of data.mixture[{i}]" if len(self.regions) > 1 else "")
                raise ValueError(f"{which} has {end - begin} tokens, too few for windows of {length} "
                                 "(lower train.seq_len or give more text)")
            self.counts.append((end - begin - length) // self.stride + 1)

    def order(self, seed: int):
        """Window starts in training order: ``order(seed)[g]`` is where row g of the run begins (a Grain
        MapDataset, endless)."""
        import grain

        orders = [grain.MapDataset.range(count).shuffle(seed=(seed + i) % 2**32).repeat()
                  .map(lambda window, begin=begin: begin + window * self.stride)
                  for i, (count, (begin, _, _)) in enumerate(zip(self.counts, self.regions))]
        return orders[0] if len(orders) == 1 else grain.MapDataset.mix(orders, [w for _, _, w in self.regions])

    def fixed_starts(self, count: int) -> np.ndarray:
        """``count`` window starts evenly spaced over each region, regions sharing them by weight: the same
        every time."""
        weights = np.array([w for _, _, w in self.regions])
        shares = np.maximum(np.round(count * weights / weights.sum()).astype(int), 1)
        shares[0] = max(shares[0] + count - shares.sum(), 0)  # the rounding's remainder: ``count`` rows in all
        return np.concatenate([begin + np.linspace(0, n - 1, share).astype(np.int64) * self.stride
                               for (begin, _, _), n, share in zip(self.regions, self.counts, shares)])[:count]

    def cut(self, starts) -> np.ndarray:
        """The windows [count, length] that begin at ``starts``."""
        return np.stack([self.stream.read(int(s), self.length) for s in starts])

    def segments(self, starts) -> np.ndarray:
        """Segment ids [count, length] of the windows at ``starts`` (``TokenStream.segments``)."""
        return np.stack([self.stream.segments(int(s), self.length) for s in starts])

    def row_windows(self, index: int, rows: int, which=None) -> tuple[np.ndarray, np.ndarray]:
        """Transformer-XL's ordered batches: the stream cut into ``rows`` contiguous rows, each read window
        after window, so a row's segment memory always holds the text just before its window. Batch
        ``index`` is window ``index mod windows_per_row`` of every row; consecutive windows share one token
        (a window's last token, its last label, is the next window's first input), so inputs follow each
        other without a gap and every token is predicted once per pass. ``which``: the rows to read (this
        process's; default all). Returns the windows [len(which), length] and ``fresh``: true on a row's first
        window, where its memory must be emptied."""
        row_len, advance = len(self.stream) // rows, self.length - 1
        per_row = (row_len - 1) // advance
        if per_row < 1:
            raise ValueError(f"the {self.name} split has {len(self.stream)} tokens, too few to cut into {rows} "
                             f"contiguous rows of windows of {self.length} (lower train.batch_size or "
                             "train.seq_len, or give more text)")
        window = index % per_row
        which = range(rows) if which is None else which
        starts = np.asarray(which, np.int64) * row_len + window * advance
        return self.cut(starts), np.full(len(starts), window == 0)


def pad_rows(rows: list[np.ndarray], length: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows right-padded to ``length`` as int32 [B, length], with the mask of real tokens."""
    ids = np.full((len(rows), length), pad, np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    return ids, mask


# --------------------------------------------------------------------------------------------------
# Corruption (host-side numpy): BERT's masking and T5's span corruption


IGNORE = -100  # label of positions that carry no loss


def mask_tokens(ids: np.ndarray, rng: np.random.Generator, *, vocab_size: int, mask_id: int,
                special_ids: tuple[int, ...] = (), select: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masking: ``select`` of the non-special tokens are predicted; of those 80% become
    ``mask_id``, 10% a random token and 10% stay. Returns (inputs, labels with IGNORE elsewhere)."""
    if not 0 < select < 1:
        raise ValueError(f"select={select} must lie in (0, 1)")
    candidates = ~np.isin(ids, np.asarray(special_ids, ids.dtype)) if special_ids else np.ones(ids.shape, bool)
    chosen = candidates & (rng.random(ids.shape) < select)
    labels = np.where(chosen, ids, IGNORE)
    action = rng.random(ids.shape)
    inputs = np.where(chosen & (action < 0.8), mask_id, ids)
    random_tokens = rng.integers(0, vocab_size, ids.shape)
    inputs = np.where(chosen & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs.astype(ids.dtype), labels


def span_counts(length: int, noise_density: float, mean_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of T5's noise mask over ``length`` tokens: the same for every row of that
    length, so the lengths of corrupted inputs and targets are known before any row is drawn."""
    noise = min(max(int(round(length * noise_density)), 1), length - 1)
    return noise, max(int(round(noise / mean_span_length)), 1)


def random_spans_noise_mask(length: int, rng: np.random.Generator, noise_density: float = 0.15,
                            mean_span_length: float = 3.0) -> np.ndarray:
    """T5's noise mask: about ``noise_density`` of ``length`` tokens in spans of mean length
    ``mean_span_length``, alternating with kept spans and starting with a kept one."""
    noise, spans = span_counts(length, noise_density, mean_span_length)
    kept = length - noise

    def partition(total: int) -> np.ndarray:  # `spans` positive parts summing to total, uniformly
        cuts = np.sort(rng.choice(np.arange(1, total), spans - 1, replace=False)) if spans > 1 else np.array([], int)
        return np.diff(np.concatenate([[0], cuts, [total]]))

    noise_lengths, kept_lengths = partition(noise), partition(kept)
    mask = np.zeros(length, bool)
    start = 0
    for keep, drop in zip(kept_lengths, noise_lengths):
        start += keep
        mask[start:start + drop] = True
        start += drop
    return mask


def span_corrupt(ids: np.ndarray, rng: np.random.Generator, *, sentinel_start: int, noise_density: float = 0.15,
                 mean_span_length: float = 3.0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """T5's span corruption of each row: noise spans become one sentinel each in the input
    (``sentinel_start``, then ``sentinel_start - 1``, ... as T5's <extra_id_0>, <extra_id_1>, ...);
    the target lists each sentinel followed by the span it hides, and ends with the next sentinel."""
    inputs, targets = [], []
    for row in ids:
        mask = random_spans_noise_mask(len(row), rng, noise_density, mean_span_length)
        starts = mask & ~np.concatenate([[False], mask[:-1]])
        sentinels = sentinel_start - (np.cumsum(starts) - 1)
        if sentinels.min() < 0:
            raise ValueError("more noise spans than sentinel ids below sentinel_start")
        inputs.append(np.where(starts, sentinels, row)[~mask | starts].astype(ids.dtype))
        pieces = [np.concatenate([[sentinels[i]], row[i:i + _run_length(mask, i)]]) for i in np.flatnonzero(starts)]
        closing = sentinel_start - int(starts.sum())
        targets.append(np.concatenate(pieces + [[closing]]).astype(ids.dtype))
    return inputs, targets


def span_corrupt_documents(window: np.ndarray, segments: np.ndarray, rng: np.random.Generator, *,
                           sentinel_start: int, eos: int, input_len: int, target_len: int,
                           noise_density: float = 0.15, mean_span_length: float = 3.0
                           ) -> list[tuple[np.ndarray, np.ndarray]]:
    """T5's span corruption of each document of one packed window on its own, as t5x corrupts examples
    before packing them: (input + EOS, target + EOS) per document, in order, as many as fit ``input_len``
    and ``target_len`` together (the last one cut to fit). A document of fewer than 2 tokens has no span to
    hide and is left out."""
    def lengths(n: int) -> tuple[int, int]:
        noise, spans = span_counts(n, noise_density, mean_span_length)
        return n - noise + spans + 1, noise + spans + 2

    examples, room = [], [input_len, target_len]
    for document in np.unique(segments):
        piece = window[segments == document]
        n = len(piece)
        while n >= 2 and any(need > left for need, left in zip(lengths(n), room)):
            n -= 1
        if n < 2:
            if len(piece) < 2:
                continue
            break  # no room left in this row
        inputs, targets = span_corrupt(piece[None, :n], rng, sentinel_start=sentinel_start,
                                       noise_density=noise_density, mean_span_length=mean_span_length)
        example = (np.append(inputs[0], eos).astype(np.int32), np.append(targets[0], eos).astype(np.int32))
        room = [room[0] - len(example[0]), room[1] - len(example[1])]
        examples.append(example)
    return examples


def _run_length(mask: np.ndarray, start: int) -> int:
    end = start
    while end < len(mask) and mask[end]:
        end += 1
    return end - start


def prefix_range(length: int, target_fraction: float) -> tuple[int, int]:
    """The shortest and longest prefix of a ``length``-token split whose target (the suffix) averages
    ``target_fraction`` of it: the prefix is uniform over [max(1, (1 - 2 f)(length - 1)), length - 1], so the
    target runs from 1 to about 2 f length tokens (f = 0.5: a split point uniform over the window, as T5's
    prefix LM; f = 0.25: UL2's S-denoiser, the rule of T5's random_prefix_noise_mask generalised below 0.5)."""
    if not 0 < target_fraction <= 0.5:
        raise ValueError(f"target_fraction={target_fraction} must lie in (0, 0.5]")
    longest = length - 1
    return min(longest, max(1, int(round((1 - 2 * target_fraction) * longest)))), longest


def random_prefix_length(length: int, rng: np.random.Generator, target_fraction: float) -> int:
    shortest, longest = prefix_range(length, target_fraction)
    return int(rng.integers(shortest, longest + 1))


@dataclasses.dataclass(frozen=True)
class Denoiser:
    """One task of UL2's mixture of denoisers (Tay et al. 2022, "UL2: Unifying Language Learning
    Paradigms"). Modes "R" (regular) and "X" (extreme) are T5's span corruption: ``rate`` of a window's
    tokens hidden in spans of mean length ``mean_span``, each span one sentinel in the input, the target
    spelling the spans out. Mode "S" is the prefix LM: the target is a suffix of mean length ``rate`` of
    the window (``prefix_range``). ``weight``: how often an example draws this denoiser, relative to the rest.
    The mode names the mode token the input starts with."""

    mode: str
    rate: float
    mean_span: float = 0.0
    weight: float = 1.0

    def lengths(self, raw: int) -> tuple[int, int, int]:
        """The longest input, the longest target and the longest input + target made of ``raw`` tokens
        (no mode token, no EOS). Span corruption's are exact; the S split trades one for the other."""
        if self.mode == "S":
            return raw - 1, raw - prefix_range(raw, self.rate)[0], raw
        noise, spans = span_counts(raw, self.rate, self.mean_span)
        return raw - noise + spans, noise + spans + 1, raw + 2 * spans + 1

    def sentinels(self, raw: int) -> int:
        """Sentinel ids one row of ``raw`` tokens uses (its spans and the closing one)."""
        return 0 if self.mode == "S" else span_counts(raw, self.rate, self.mean_span)[1] + 1

    def apply(self, row: np.ndarray, rng: np.random.Generator,
              sentinel_start: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(input, target) of one row of tokens; span sentinels count down from ``sentinel_start``."""
        if self.mode == "S":
            cut = random_prefix_length(len(row), rng, self.rate)
            return row[:cut], row[cut:]
        inputs, targets = span_corrupt(row[None], rng, sentinel_start=sentinel_start, noise_density=self.rate,
                                       mean_span_length=self.mean_span)
        return inputs[0], targets[0]


# UL2's seven denoisers (Tay et al. 2022), each drawn equally often by default.
UL2_DENOISERS = ({"mode": "R", "mean_span": 3, "rate": 0.15}, {"mode": "R", "mean_span": 8, "rate": 0.15},
                 {"mode": "X", "mean_span": 3, "rate": 0.5}, {"mode": "X", "mean_span": 8, "rate": 0.5},
                 {"mode": "X", "mean_span": 64, "rate": 0.15}, {"mode": "X", "mean_span": 64, "rate": 0.5},
                 {"mode": "S", "rate": 0.25})


def parse_denoisers(items) -> tuple[Denoiser, ...]:
    """Denoisers from data.denoisers (a list of {mode, rate, mean_span, weight} mappings); each fault is a
    ValueError naming the entry and the key, e.g. ``data.denoisers[2].rate``."""
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError("data.denoisers must be a non-empty list of {mode, rate, mean_span, weight} mappings, "
                         f"not {items!r}")
    fields = ("mode", "rate", "mean_span", "weight")
    denoisers = []
    for i, item in enumerate(items):
        where = f"data.denoisers[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be a mapping with keys {', '.join(fields)}, not {item!r}")
        unknown = sorted(set(item) - set(fields))
        if unknown:
            raise ValueError(f"{where} has unknown keys {unknown}; valid: {', '.join(fields)}")
        mode = item.get("mode")
        if mode not in ("R", "X", "S"):
            raise ValueError(f"{where}.mode={mode!r}; valid: 'R', 'X', 'S'")
        rate, weight = _number(item, "rate", where), _number(item, "weight", where, 1.0)
        if mode == "S":
            if "mean_span" in item:
                raise ValueError(f"{where}.mean_span: an S-denoiser (prefix LM) has no spans; leave it out")
            if not 0 < rate <= 0.5:
                raise ValueError(f"{where}.rate={rate} (the S-denoiser's mean target fraction) must lie in (0, 0.5]")
            mean_span = 0.0
        else:
            mean_span = _number(item, "mean_span", where)
            if not 0 < rate < 1:
                raise ValueError(f"{where}.rate={rate} (the fraction of tokens hidden) must lie in (0, 1)")
            if mean_span < 1:
                raise ValueError(f"{where}.mean_span={mean_span} must be >= 1")
        if weight <= 0:
            raise ValueError(f"{where}.weight={weight} must be > 0")
        denoisers.append(Denoiser(mode, rate, mean_span, weight))
    return tuple(denoisers)


def _number(item: dict, name: str, where: str, default: float | None = None) -> float:
    value = item.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ValueError(f"{where}.{name}={value!r} must be a finite number")
    return float(value)


def sentinel_budget(tokenizer, reserved: tuple[int, ...] = ()) -> int:
    """How many sentinel ids count down from <extra_id_0> before the tokenizer's sentinels end or a
    ``reserved`` id (a mode token kept among them, as ByteTokenizer's) is reached."""
    top = tokenizer.special("sentinel")
    budget = 0 if top is None else tokenizer.sentinel_count
    for token in reserved:
        if top is not None and top - budget < token <= top:
            budget = top - token
    return budget
