"""``jaxformer tokenize``: every source format, the shards' bytes against train.py's packing of the same
documents, dtype by vocabulary, worker-count independence, resume after a real SIGKILL, appending, refusals
and bad input (named by file and line, or skipped and counted)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxformer import cli
from jaxformer.train import data, shards

ROOT = Path(__file__).resolve().parents[1]


def documents(count: int = 60) -> list[str]:
    """Real English and code with inner newlines and non-ASCII, no blank lines inside a document."""
    texts = [" ".join(doc.strip().split("\n\n")) for doc in data.default_documents()]  # no blank lines inside
    return texts[:count - 1] + ["Ünïcödé — 文字 ✓ and an emoji 🙂 at the end"]


def write_txt(path: Path, docs: list[str]) -> Path:
    path.write_text("\n\n".join(docs), encoding="utf-8")
    return path


def write_jsonl(path: Path, docs: list[str], opener=open) -> Path:
    with opener(path, "wt", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc, "id": len(doc)}) + "\n")
    return path


def stream(folder: Path) -> np.ndarray:
    """A shard folder's tokens end to end, as int32."""
    opened = shards.open_shards(folder)
    return np.concatenate([np.zeros(0, np.int32)] + [np.asarray(t) for t in opened.tokens]).astype(np.int32)


def packed(tokenizer_spec: str, docs: list[str]) -> np.ndarray:
    tokenizer = data.make_tokenizer(tokenizer_spec)
    return data.pack(tokenizer, docs, tokenizer.document_separator)


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".bin", ".npy")}


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> str:
    """A byte-level BPE (with an EOS) trained here on the test documents: a real tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(documents(), trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def run(sources, tokenizer, out, **options) -> shards.Summary:
    options.setdefault("workers", 1)
    return shards.tokenize([str(s) for s in sources], tokenizer, out, progress=False, **options)


# ------------------------------------------------------------------------------------------------
# What the shards hold


def test_txt_shards_are_train_py_packing_byte_for_byte(tmp_path):
    docs = documents()
    source = write_txt(tmp_path / "corpus.txt", docs)
    assert data.read_documents(str(source)) == docs
    run([source], "bytes", tmp_path / "out", shard_tokens=3000)
    opened = shards.open_shards(tmp_path / "out", tokenizer="bytes")
    np.testing.assert_array_equal(stream(tmp_path / "out"), packed("bytes", docs))
    assert opened.manifest["dtype"] == "uint16" and opened.tokens[0].dtype == np.dtype("<u2")
    # whole documents per shard, each closing at the first document end at or past shard_tokens
    assert len(opened.tokens) > 3
    for tokens, offsets in zip(opened.tokens[:-1], opened.offsets[:-1]):
        assert len(tokens) >= 3000 > offsets[-2]
    encoded = [np.concatenate([data.ByteTokenizer().encode(d), [10, 10]]) for d in docs]
    flat = [opened.document(s, i) for s in range(len(opened.tokens)) for i in range(len(opened.offsets[s]) - 1)]
    assert len(flat) == len(docs) and all(np.array_equal(a, b) for a, b in zip(flat, encoded))


@pytest.mark.parametrize("block", [1, 2, 3, 7])
def test_txt_paragraphs_are_read_documents_paragraphs_whatever_the_block_size(tmp_path, monkeypatch, block):
    """Blocks split "\r\n", "\n\n" and UTF-8 characters; the streamed paragraphs stay read_documents'."""
    import random

    monkeypatch.setattr(shards, "TXT_BLOCK", block)
    rng = random.Random(block)
    pieces = ["a", "b", "\n", "\r", "\r\n", "é", "🙂", " ", "\n\n", "\t"]
    for trial in range(150):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        (tmp_path / "t.txt").write_bytes(text.encode("utf-8"))
        read = [item for _, item in shards.read_units(shards.Source(tmp_path / "t.txt", "txt"), "text")]
        expected = data.read_documents(str(tmp_path / "t.txt"))
        assert read == (expected or [shards.Bad("empty file", str(tmp_path / "t.txt"), "holds no documents")]), text


def test_tokenizer_json_shards_are_train_py_packing_with_eos(tmp_path, bpe):
    docs = documents()
    source = write_jsonl(tmp_path / "corpus.jsonl", docs)
    run([source], bpe, tmp_path / "out", shard_tokens=2000)
    manifest = shards.read_manifest(tmp_path / "out")
    eos = data.make_tokenizer(bpe).special("eos")
    assert manifest["separator"] == [eos] and manifest["eos"] == eos
    np.testing.assert_array_equal(stream(tmp_path / "out"), packed(bpe, data.read_documents(str(source))))


def write_formats(folder: Path, docs: list[str]) -> Path:
    """The documents as .jsonl.gz, .jsonl.zst, .parquet (row groups of 7) and an .arrow file (batches of 9)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    folder.mkdir()
    table = pa.table({"id": list(range(len(docs))), "text": docs})
    write_jsonl(folder / "a.jsonl.gz", docs, gzip.open)
    with open(folder / "b.jsonl.zst", "wb") as raw:
        raw.write(zstandard.ZstdCompressor().compress("".join(json.dumps({"text": d}) + "\n" for d in docs).encode()))
    pq.write_table(table, folder / "c.parquet", row_group_size=7)  # several row groups, read one at a time
    with pa.OSFile(str(folder / "d.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=9)
    return folder


FORMATS = ("a.jsonl.gz", "b.jsonl.zst", "c.parquet", "d.arrow")


def test_every_source_format_reads_the_same_documents(tmp_path, bpe):
    import pyarrow as pa

    docs = documents(40)
    expected = packed(bpe, docs)
    table = pa.table({"id": list(range(len(docs))), "text": docs})
    formats = write_formats(tmp_path / "formats", docs)
    saved = tmp_path / "saved"  # a datasets folder as save_to_disk writes it: arrow streams listed in state.json
    saved.mkdir()
    halves = [table.slice(0, 25), table.slice(25)]
    for i, half in enumerate(halves):
        with pa.OSFile(str(saved / f"data-0000{i}-of-00002.arrow"), "wb") as sink, \
                pa.ipc.new_stream(sink, half.schema) as writer:
            writer.write_table(half, max_chunksize=6)
    (saved / "state.json").write_text(json.dumps({"_data_files": [{"filename": f"data-0000{i}-of-00002.arrow"}
                                                                  for i in range(2)]}))
    (formats / "notes.md").write_text("not a source")
    for name in FORMATS:
        run([formats / name], bpe, tmp_path / f"out-{name}", shard_tokens=500)
        np.testing.assert_array_equal(stream(tmp_path / f"out-{name}"), expected, err_msg=name)
    run([saved], bpe, tmp_path / "out-saved", shard_tokens=500)
    np.testing.assert_array_equal(stream(tmp_path / "out-saved"), expected)
    # a directory is read in sorted order; a glob too; files of other kinds are ignored and said so
    summary = run([formats], bpe, tmp_path / "out-dir", shard_tokens=500)
    np.testing.assert_array_equal(stream(tmp_path / "out-dir"), np.tile(expected, 4))
    assert summary.ignored == [formats / "notes.md"] and "ignored 1 files" in "\n".join(summary.lines())
    run([str(formats / "*.parquet"), str(formats / "[ab]*")], bpe, tmp_path / "out-glob")
    assert shards.read_manifest(tmp_path / "out-glob")["documents"] == 3 * len(docs)


def test_a_folder_written_by_datasets_save_to_disk(tmp_path, bpe):
    import datasets

    docs = documents(30)
    datasets.Dataset.from_dict({"text": docs, "n": list(range(30))}).save_to_disk(str(tmp_path / "ds"),
                                                                                  num_shards=2)
    run([tmp_path / "ds"], bpe, tmp_path / "out")
    np.testing.assert_array_equal(stream(tmp_path / "out"), packed(bpe, docs))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs})}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"DatasetDict \(splits \['train'\]\); give one split's folder"):
        run([tmp_path / "dd"], bpe, tmp_path / "out-dd")


def test_token_dtype_follows_the_vocabulary(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70_000)} | {"</s>": 70_000, "[UNK]": 70_001}
    big = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    big.pre_tokenizer = pre_tokenizers.Whitespace()
    big.save(str(tmp_path / "big.json"))
    write_jsonl(tmp_path / "c.jsonl", ["w1 w65535 w65536 w69999", "w3"])
    run([tmp_path / "c.jsonl"], str(tmp_path / "big.json"), tmp_path / "out")
    opened = shards.open_shards(tmp_path / "out")
    assert opened.manifest["dtype"] == "uint32" and opened.manifest["vocab_size"] == 70_002
    np.testing.assert_array_equal(opened.tokens[0], [1, 65535, 65536, 69999, 70000, 3, 70000])
    assert shards.token_dtype(65536) == np.uint16 and shards.token_dtype(65537) == np.uint32


def test_the_worker_count_does_not_change_a_byte(tmp_path, bpe, monkeypatch):
    monkeypatch.setattr(shards, "CHUNK_DOCS", 3)  # many small chunks, so the pool's tasks finish out of order
    docs = documents()
    sources = [write_jsonl(tmp_path / "a.jsonl", docs[:35]), write_txt(tmp_path / "b.txt", docs[35:])]
    run(sources, bpe, tmp_path / "one", shard_tokens=700, workers=1)
    run(sources, bpe, tmp_path / "three", shard_tokens=700, workers=3)
    assert folder_bytes(tmp_path / "one") == folder_bytes(tmp_path / "three")
    assert len(folder_bytes(tmp_path / "one")) > 6
    one, three = (shards.read_manifest(tmp_path / n) for n in ("one", "three"))
    assert one["shards"] == three["shards"] and one["sources"] == three["sources"]


# ------------------------------------------------------------------------------------------------
# Resuming and appending


def test_a_killed_run_resumes_at_the_next_unfinished_shard(tmp_path):
    """The run is killed (SIGKILL) while blocked opening a FIFO named after the corpus, so the moment of the kill
    is fixed without timing: every full shard of the corpus is committed, the last one is in progress."""
    corpus = write_txt(tmp_path / "corpus.txt", documents(120))
    run([corpus], "bytes", tmp_path / "reference", shard_tokens=4000)
    full = len(shards.read_manifest(tmp_path / "reference")["shards"]) - 1
    assert full >= 3
    os.mkfifo(tmp_path / "stalls.txt")  # opening it blocks: no writer ever comes
    out = tmp_path / "out"
    command = [sys.executable, "-m", "jaxformer.cli", "tokenize", str(corpus), str(tmp_path / "stalls.txt"),
               "--tokenizer", "bytes", "--out", str(out), "--shard-tokens", "4000", "--workers", "2"]
    process = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120  # a bound on a hung run, not a timing the test depends on
        while not ((out / "manifest.json").is_file() and len(shards.read_manifest(out)["shards"]) == full):
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "the run never committed its full shards"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait() == -signal.SIGKILL
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the run's pool workers and fork server, if still there
        except ProcessLookupError:
            pass
    committed = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("shard-*")
                 if not p.name.endswith(".tmp")}
    entry = shards.read_manifest(out)["sources"][0]
    assert len(committed) == 2 * full and not entry["complete"] and entry["units_done"] > 0
    summary = run([corpus], "bytes", out, shard_tokens=4000)
    assert summary.shards_written == 1  # only the unfinished shard: nothing written twice
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("shard-*")
            if p.name in committed} == committed
    assert folder_bytes(out) == folder_bytes(tmp_path / "reference")
    assert shards.read_manifest(out)["sources"] == shards.read_manifest(tmp_path / "reference")["sources"]
    assert not list(out.glob("*.tmp"))


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_resumes_in_the_middle_of_a_source(tmp_path, bpe, name, monkeypatch):
    """A run that dies after committing two shards (here: an exception in the third) continues from the unit
    after the last committed document, mid row group or mid compressed stream, to the uninterrupted result."""
    source = write_formats(tmp_path / "formats", documents(40)) / name
    run([source], bpe, tmp_path / "reference", shard_tokens=600)
    close = shards.ShardWriter.close_shard

    def dies_at_the_third(writer):
        if len(writer.manifest["shards"]) == 2:
            raise RuntimeError("killed")
        close(writer)

    monkeypatch.setattr(shards.ShardWriter, "close_shard", dies_at_the_third)
    with pytest.raises(RuntimeError, match="killed"):
        run([source], bpe, tmp_path / "out", shard_tokens=600)
    entry = shards.read_manifest(tmp_path / "out")["sources"][0]
    assert not entry["complete"] and 0 < entry["units_done"] < 40
    monkeypatch.setattr(shards.ShardWriter, "close_shard", close)
    assert run([source], bpe, tmp_path / "out", shard_tokens=600).shards_written > 0
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "reference")
    assert shards.read_manifest(tmp_path / "out")["sources"] == shards.read_manifest(tmp_path / "reference")["sources"]


def test_new_sources_append_and_a_source_already_tokenized_is_skipped(tmp_path, bpe):
    docs = documents()
    first, second = write_jsonl(tmp_path / "a.jsonl", docs[:30]), write_txt(tmp_path / "b.txt", docs[30:])
    run([first], bpe, tmp_path / "out", shard_tokens=900)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("shard-*")}
    summary = run([first, second, first], bpe, tmp_path / "out", shard_tokens=900)
    assert summary.already_done == [str(first)] and summary.documents_written == len(docs) - 30
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("shard-*") if p.name in before} == before
    np.testing.assert_array_equal(stream(tmp_path / "out"), packed(bpe, docs))
    again = run([first, second], bpe, tmp_path / "out")
    assert again.shards_written == 0 and len(again.already_done) == 2


# ------------------------------------------------------------------------------------------------
# Refusals and bad input


def test_refusals_name_what_is_wrong(tmp_path, bpe):
    source = write_txt(tmp_path / "a.txt", documents(5))
    run([source], "bytes", tmp_path / "out")
    with pytest.raises(ValueError, match=r"holds tokens of tokenizer 'bytes'.*tokenizer '.*tokenizer.json'.* is a "
                                         r"different one"):
        run([source], bpe, tmp_path / "out")
    with pytest.raises(ValueError, match="holds tokens of tokenizer 'bytes'"):
        shards.open_shards(tmp_path / "out", tokenizer=bpe)
    source.write_text("changed\n")
    with pytest.raises(ValueError, match=r"a.txt changed since it was tokenized .*tokenize into another folder"):
        run([source], "bytes", tmp_path / "out")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(ValueError, match=r"holds files but no manifest.json"):
        run([source], "bytes", tmp_path / "busy")
    (tmp_path / "a.csv").write_text("x")
    with pytest.raises(ValueError, match=r"a.csv is not a source .* valid: .jsonl.gz, .jsonl.zst, .jsonl, .txt"):
        run([tmp_path / "a.csv"], "bytes", tmp_path / "new")
    with pytest.raises(ValueError, match="matches no file"):
        run([str(tmp_path / "none-*.jsonl")], "bytes", tmp_path / "new")
    for name, contents in (("broken.parquet", b"PAR1 not parquet"), ("broken.jsonl.gz", b"\x1f\x8b\x08 cut"),
                           ("broken.jsonl.zst", b"not zstandard")):
        (tmp_path / name).write_bytes(contents)
        with pytest.raises(ValueError, match=rf"{name}: not a readable"):
            run([tmp_path / name], "bytes", tmp_path / f"out-{name}")
    with pytest.raises(ValueError, match="--shard-tokens 0 must be a positive integer"):
        run([source], "bytes", tmp_path / "new", shard_tokens=0)


def test_open_shards_names_a_truncated_shard(tmp_path):
    run([write_txt(tmp_path / "a.txt", documents(30))], "bytes", tmp_path / "out", shard_tokens=2000)
    shard = tmp_path / "out" / "shard-00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(ValueError, match=r"shard-00001.bin holds \d+ bytes; the manifest says \d+ tokens"):
        shards.open_shards(tmp_path / "out")


BAD_INPUTS = {  # name: (file contents, the message when stopping, the reason counted when skipping)
    "json.jsonl": (b'{"text": "one"}\n{"text": "two"\n{"text": "three"}\n', r"json.jsonl:2: not JSON", "not JSON"),
    "field.jsonl": (b'{"text": "one"}\n\n{"body": "x"}\n{"text": "three"}\n',
                    r"field.jsonl:3: the record has no 'text' field \(it has \['body'\]\)", "no 'text' field"),
    "null.jsonl": (b'{"text": "one"}\n{"text": null}\n{"text": "three"}\n',
                   r"null.jsonl:2: field 'text' must be a string, not null", "'text' not text"),
    "byte.jsonl": (b'{"text": "one"}\n{"text": "t\xffwo"}\n{"text": "three"}\n',
                   r"byte.jsonl:2: byte 12 of the line \(b'\\xff'\) is not UTF-8", "not UTF-8"),
    "byte.txt": (b"one\n\ntwo\nt\xffwo\n\nthree", r"byte.txt:4: byte b'\\xff' is not UTF-8", "not UTF-8"),
    "empty.txt": (b"\n\n  \n", r"empty.txt: holds no documents", "empty file"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_stops_naming_file_and_line_or_is_skipped_and_counted(tmp_path, name):
    contents, message, reason = BAD_INPUTS[name]
    (tmp_path / name).write_bytes(contents)
    with pytest.raises(ValueError, match=message):
        run([tmp_path / name], "bytes", tmp_path / "stop")
    summary = run([tmp_path / name], "bytes", tmp_path / "skip", on_error="skip")
    assert summary.skipped == {reason: 1} and f"skipped 1 units: {reason}" in "\n".join(summary.lines())
    kept = [] if name == "empty.txt" else ["one", "three"]
    np.testing.assert_array_equal(stream(tmp_path / "skip"), packed("bytes", kept))


def test_parquet_null_rows_and_missing_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["one", None, "three"]}), tmp_path / "nulls.parquet")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match=r"nulls.parquet: row 1: field 'text' is null"):
        run([tmp_path / "nulls.parquet"], "bytes", tmp_path / "a")
    with pytest.raises(ValueError, match=r"other.parquet: has no column 'text' \(it has \['body'\]\)"):
        run([tmp_path / "other.parquet"], "bytes", tmp_path / "b")
    summary = run([tmp_path / "nulls.parquet", tmp_path / "other.parquet"], "bytes", tmp_path / "c", on_error="skip")
    assert summary.skipped == {"'text' not text": 1, "no 'text' field": 1}
    np.testing.assert_array_equal(stream(tmp_path / "c"), packed("bytes", ["one", "three"]))


def test_the_command_line(tmp_path, capsys):
    source = write_jsonl(tmp_path / "a.jsonl", documents(10))
    assert cli.main(["tokenize", str(source), "--tokenizer", "bytes", "--out", str(tmp_path / "out"),
                     "--workers", "1"]) == 0
    assert "wrote 1 shards" in capsys.readouterr().out
    (tmp_path / "b.jsonl").write_text('{"text": "x"}\nnot json\n')
    assert cli.main(["tokenize", str(tmp_path / "b.jsonl"), "--tokenizer", "bytes", "--out", str(tmp_path / "out"),
                     "--workers", "1"]) == 2
    assert "b.jsonl:2: not JSON" in capsys.readouterr().err
