"""Training from token shards end to end (issue 47, items 2 and 5): `jaxformer tokenize`'s folders memory-mapped
by causal_lm, every window of the shard stream visited once an epoch in a reshuffled order, the manifest's
tokenizer checked by name, text files tokenized once into the run folder, a weighted mixture of folders, a
bit-exact resume after `kill -9`, and bad input named by file and line (or shard) before anything compiles,
or skipped and counted with data.on_error=skip."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jaxformer.train import corpus, data, loader, run_config, shards
from jaxformer.train.checkpoints import checkpoint_manager
from jaxformer.train.data import IGNORE, ByteTokenizer
from jaxformer.train.run import train
from jaxformer.train.tasks import make_objective
from conftest import no_compilation

ROOT = Path(__file__).resolve().parents[1]
ROWS, SEQ, STEPS, EVERY = 4, 32, 40, 10
# Every run here trains the same model, batch and schedule: one compiled program (the suite's cache), whatever
# the data.
TINY = ["model.preset=tiny-gpt", f"train.steps={STEPS}", f"train.batch_size={ROWS}", f"train.seq_len={SEQ}",
        "train.log_every=5", "train.sample_tokens=0", "eval.every=1000", "eval.batches=2", "optim.warmup_steps=5",
        f"checkpoint.every={EVERY}", "checkpoint.keep=2"]


def refused(overrides: list[str], run_dir: Path, *fragments: str) -> str:
    """``train`` with ``overrides`` raises a ValueError holding every fragment, nothing compiled, no run written."""
    with no_compilation(), pytest.raises(ValueError) as err:
        train(run_config.load(None, TINY + [f"run.dir={run_dir}"] + overrides), progress=False)
    message = str(err.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "config.yaml").exists()
    return message


def printed_train(overrides: list[str]) -> tuple[dict, str]:
    """An in-process run and what it printed (its notes)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = train(run_config.load(None, TINY + overrides), progress=False)
    return result, out.getvalue()


def paragraphs(text: str) -> list[str]:
    """The documents of a .txt: its blank-line separated paragraphs (data.read_documents' split)."""
    return [p for p in text.split("\n\n") if p.strip()]


# --------------------------------------------------------------------------------------------------
# The corpus: pydoc topics as a .txt and a .jsonl, tokenized into several shards


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("corpus")
    documents = data.default_documents()
    half = len(documents) // 2
    txt, jsonl = folder / "topics.txt", folder / "topics.jsonl"
    txt.write_text("\n\n".join(documents[:half]), encoding="utf-8")
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents[half:]), encoding="utf-8")
    summary = shards.tokenize([str(txt), str(jsonl)], "bytes", folder / "shards", shard_tokens=60_000,
                              progress=False)
    expected = "".join(d + "\n\n" for d in paragraphs(txt.read_text(encoding="utf-8")) + documents[half:])
    return {"txt": txt, "jsonl": jsonl, "shards": folder / "shards", "summary": summary, "text": expected}


def raw_tokens(folder: Path) -> np.ndarray:
    """The shard files end to end, read as plain little-endian integers: the oracle a window is compared to."""
    manifest = shards.read_manifest(folder)
    return np.concatenate([np.fromfile(folder / f"{s['name']}.bin", np.dtype(manifest["dtype"]).newbyteorder("<"))
                           for s in manifest["shards"]]).astype(np.int32)


def document_starts(folder: Path) -> np.ndarray:
    """Where each document begins in the shard files end to end, from the shards' index files."""
    manifest, base, starts = shards.read_manifest(folder), 0, []
    for shard in manifest["shards"]:
        starts.append(base + np.load(folder / f"{shard['name']}.idx.npy")[:-1])
        base += shard["tokens"]
    return np.concatenate(starts)


@pytest.fixture(scope="module")
def bpe_tokenizer(corpus_files) -> Path:
    """A byte-level BPE trained here on the corpus: a tokenizer.json other than bytes."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(paragraphs(corpus_files["text"])[:200], trainer)
    path = corpus_files["txt"].parent / "bpe" / "tokenizer.json"
    path.parent.mkdir()
    tokenizer.save(str(path))
    return path


def _config_file(folder: Path, train_source: Path) -> Path:
    """TINY as a YAML file (train.py's subprocess and the in-process runs read the same one)."""
    lines = {}
    for item in TINY + [f"data.train={train_source}"]:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        lines.setdefault(section, []).append(f"  {name}: {value}")
    path = folder / "shards.yaml"
    path.write_text("".join(f"{section}:\n" + "\n".join(body) + "\n" for section, body in lines.items()))
    return path


@pytest.fixture(scope="module")
def shard_run(corpus_files, tmp_path_factory) -> dict:
    """An uninterrupted in-process run over the shard folder: what it returned and printed."""
    folder = tmp_path_factory.mktemp("shard-run")
    config = _config_file(folder, corpus_files["shards"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = train(run_config.load(config, [f"run.dir={folder / 'clean'}"]), progress=False)
    return {"config": config, "dir": folder / "clean", "result": result, "printed": out.getvalue()}


def test_the_tokenized_corpus_lies_in_several_shards_whose_bytes_are_its_documents(corpus_files):
    manifest = shards.read_manifest(corpus_files["shards"])
    assert len(manifest["shards"]) >= 5 and manifest["tokenizer"]["spec"] == "bytes"
    assert corpus_files["summary"].shards_written == len(manifest["shards"])
    raw = raw_tokens(corpus_files["shards"])
    assert len(raw) == manifest["tokens"] and raw.max() < 256
    assert raw.astype(np.uint8).tobytes() == corpus_files["text"].encode("utf-8")  # each document, then "\n\n"


def test_causal_lm_trains_on_the_memory_mapped_shards(shard_run, corpus_files):
    history = shard_run["result"]["history"]
    assert [r["step"] for r in history] == list(range(5, STEPS + 1, 5))
    assert all(np.isfinite(r[k]) for r in history for k in ("loss", "grad_norm"))
    assert np.isfinite(history[-1]["eval_loss"]) and history[-1]["loss"] < history[0]["loss"]
    folder, manifest = corpus_files["shards"], shards.read_manifest(corpus_files["shards"])
    assert (f"note: data.train: {manifest['tokens']:,} tokens in {len(manifest['shards'])} shards of {folder}, "
            "memory-mapped") in shard_run["printed"]
    stream = shard_run["result"]["objective"].train.stream
    assert all(isinstance(piece, np.memmap) for piece in stream.pieces)  # read where a window lies, not loaded
    assert not (shard_run["dir"] / corpus.CACHE).exists()  # a shard folder is read in place


def test_rows_are_windows_of_the_shard_stream_each_visited_once_an_epoch(shard_run, corpus_files):
    objective = shard_run["result"]["objective"]
    train_windows, order = objective.train, objective.order
    raw, starts = raw_tokens(corpus_files["shards"]), document_starts(corpus_files["shards"])
    windows = train_windows.counts[0]
    assert train_windows.length == SEQ + 1 and train_windows.stride == SEQ
    assert windows == (len(train_windows.stream) - SEQ - 1) // SEQ + 1 > 1000
    first, second = (np.array([order[g] for g in range(e * windows, (e + 1) * windows)]) for e in (0, 1))
    every_start = np.arange(windows) * SEQ
    np.testing.assert_array_equal(np.sort(first), every_start)  # each window once in an epoch
    np.testing.assert_array_equal(np.sort(second), every_start)  # and once in the next,
    assert (first != second).mean() > 0.99  # in another order
    # A step's rows are the windows at the order's starts, exactly the shard files' tokens there; the loader
    # (Grain, on threads) delivers the same rows.
    steps = [0, 7, 8, 9, windows // ROWS + 3]  # the last one in the second epoch
    crossed = 0  # rows that hold the end of a document
    dataset = loader.batches(objective, ROWS, steps[-1] + 1, range(ROWS), threads=2, prefetch=2)
    for step in steps:
        batch = objective.batch(step, ROWS)
        delivered = next(loader.start(dataset, step))
        for key in batch:
            np.testing.assert_array_equal(delivered[key], batch[key])
        for r in range(ROWS):
            start = order[step * ROWS + r]
            window = raw[start:start + SEQ + 1]
            np.testing.assert_array_equal(window, train_windows.stream.read(start, SEQ + 1))
            np.testing.assert_array_equal(batch["input_ids"][r], window[:-1])
            # Documents packed: a token that begins one is not predicted from the one before, and segment ids
            # count the documents begun since the window's start (the shards' index is the oracle).
            begins = np.isin(start + np.arange(1, SEQ + 1), starts)
            np.testing.assert_array_equal(batch["labels"][r], np.where(begins, IGNORE, window[1:]))
            np.testing.assert_array_equal(batch["segment_ids"][r], 1 + np.cumsum(np.append(0, begins[:-1])))
            crossed += begins.any()
    assert crossed >= 2


def test_sigkill_then_rerun_resumes_bit_exactly_with_the_loader_state_in_the_checkpoint(shard_run, tmp_path):
    """A train.py run over the shard folder is killed with SIGKILL once its checkpoint at step 20 is on disk
    and steps 21-30 have run (the loader's threads prefetching past them); rerun, it ends with the parameters
    and losses of the uninterrupted run, bit for bit. The kill point is fixed, not raced: the subprocess holds
    still at its step-30 save until it is killed, so the test cannot lose the race on a loaded machine."""
    crashed, gate = tmp_path / "crashed", tmp_path / "at-step-30"
    hold = textwrap.dedent(f"""
        import runpy, sys, time
        import jaxformer.train.run as run

        def save_or_hold(manager, state, position, base=None, save=run.save_checkpoint):
            if position["step"] == {3 * EVERY}:
                manager.wait_until_finished()  # the checkpoint before this one is on disk
                open({str(gate)!r}, "w").close()
                time.sleep(600)  # killed here
            save(manager, state, position, base)

        run.save_checkpoint = save_or_hold
        sys.argv = ["train.py", {str(shard_run['config'])!r}, "run.dir={crashed}"]
        runpy.run_path("train.py", run_name="__main__")
    """)
    process = subprocess.Popen([sys.executable, "-c", hold], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    deadline = time.time() + 600  # only bounds a hung run
    while not gate.exists():
        assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()[-2000:]}"
        assert time.time() < deadline, "the run never reached step 30"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    manager = checkpoint_manager(crashed, 2, read_only=True)
    assert manager.all_steps() == [EVERY, 2 * EVERY]
    import orbax.checkpoint as ocp

    position = manager.restore(2 * EVERY, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]
    manager.close()
    assert position == {"step": 2 * EVERY, "seed": 0, "objective": "causal_lm", "batch_size": ROWS,
                        "loader": {"next_index": 2 * EVERY}, "text": shard_run["result"]["objective"].text_identity}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        resumed = train(run_config.load(shard_run["config"], [f"run.dir={crashed}"]), progress=False)
    assert resumed["start_step"] == 2 * EVERY and f"resuming at step {2 * EVERY}" in out.getvalue()
    clean = shard_run["result"]
    for a, b in zip(jax.tree.leaves(nnx.state(clean["model"], nnx.Param)),
                    jax.tree.leaves(nnx.state(resumed["model"], nnx.Param)), strict=True):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    losses = [{r["step"]: (r["loss"], r.get("eval_loss")) for r in map(json.loads, (d / "metrics.jsonl")
                                                                         .read_text().splitlines())}
              for d in (shard_run["dir"], crashed)]
    assert losses[0] == losses[1] and max(losses[0]) == STEPS


# --------------------------------------------------------------------------------------------------
# The manifest's tokenizer must be the run's


def test_shards_of_another_tokenizer_are_refused_by_name_before_anything_compiles(corpus_files, bpe_tokenizer,
                                                                                     tmp_path):
    folder = corpus_files["shards"]
    refused([f"data.train={folder}", f"data.tokenizer={bpe_tokenizer}"], tmp_path / "train",
            f"data.train={str(folder)!r}", f"{folder} holds tokens of tokenizer 'bytes'",
            f"tokenizer {str(bpe_tokenizer)!r}", "is a different one")
    bpe_shards = tmp_path / "bpe-shards"
    shards.tokenize([str(corpus_files["jsonl"])], str(bpe_tokenizer), bpe_shards, progress=False)
    refused([f"data.train={folder}", f"data.eval={bpe_shards}"], tmp_path / "eval",
            f"data.eval={str(bpe_shards)!r}", f"holds tokens of tokenizer {str(bpe_tokenizer)!r}",
            "tokenizer 'bytes'", "is a different one")


def test_mlm_refuses_a_shard_folder_clearly(corpus_files, tmp_path):
    refused(["model.preset=tiny-bert", "train.objective=mlm", f"data.train={corpus_files['shards']}"], tmp_path,
            f"data source {str(corpus_files['shards'])!r} is a folder",
            "feed causal_lm, span_corruption, prefix_lm and ul2", "give a .txt or .jsonl file")


# --------------------------------------------------------------------------------------------------
# A text file given directly: tokenized once into run.dir/data-cache


def _cache_state(cache: Path) -> dict:
    """Every file under the cache with its bytes and mtime (the lock files aside: each run opens them)."""
    return {str(p.relative_to(cache)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(cache.rglob("*"))
            if p.is_file() and p.suffix != ".lock"}


def test_a_text_file_is_tokenized_once_into_the_run_folder_then_memory_mapped(corpus_files, tmp_path):
    txt = tmp_path / "train.txt"
    shutil.copy(corpus_files["txt"], txt)
    held_out = tmp_path / "held-out.jsonl"  # one bad line: skipped and counted under data.on_error=skip
    lines = corpus_files["jsonl"].read_text(encoding="utf-8").splitlines()
    held_out.write_text("\n".join(lines[:3] + ['{"text": "cut off'] + lines[3:]) + "\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    overrides = [f"data.train={txt}", f"data.eval={held_out}", "data.on_error=skip", f"run.dir={run_dir}"]
    result, printed = printed_train(overrides)
    cache = run_dir / corpus.CACHE
    folders = sorted(p.name for p in cache.iterdir() if p.is_dir())
    assert [f.split("-")[0] for f in folders] == ["held", "train.txt"] and len(folders) == 2
    train_cache = cache / next(f for f in folders if f.startswith("train.txt"))
    held_cache = cache / next(f for f in folders if f.startswith("held"))
    assert f"note: data.train: tokenized {txt} once into {train_cache} (" in printed
    assert (f"note: data.eval: tokenized {held_out} once into {held_cache} (") in printed
    assert f"skipped 1 bad records, first: {held_out}:4: not JSON" in printed
    assert "later runs memory-map it from there" in printed
    assert all(np.isfinite(r["loss"]) for r in result["history"]) and np.isfinite(result["history"][-1]["eval_loss"])
    assert all(isinstance(p, np.memmap) for p in result["objective"].train.stream.pieces)
    np.testing.assert_array_equal(raw_tokens(train_cache), data.ByteTokenizer().encode(
        "".join(d + "\n\n" for d in paragraphs(txt.read_text(encoding="utf-8")))))
    # The same run again (finished: it only builds its data and says so): read from the cache, nothing rewritten.
    before = _cache_state(cache)
    _, again = printed_train(overrides)
    assert f"note: data.train: {txt} read from its token cache {train_cache}" in again
    assert f"note: data.eval: {held_out} read from its token cache {held_cache}" in again
    assert "once into" not in again  # not tokenized again
    assert f"(skipped 1 bad records when tokenized, first: {held_out}:4: not JSON" in again  # still said
    assert _cache_state(cache) == before
    # A changed file is another cache folder, tokenized afresh; the old one is left as it was.
    with open(txt, "a", encoding="utf-8") as file:
        file.write("\n\nOne more paragraph.\n")
    changed = make_objective(run_config.load(None, TINY + overrides), ByteTokenizer())
    assert any(f"data.train: tokenized {txt} once into" in note for note in changed.notes)
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 3
    assert {k: v for k, v in _cache_state(cache).items() if k in before} == before
    # The run cannot resume onto the changed text unawares: its checkpoint names the text it was trained on.
    with pytest.raises(ValueError, match=r"trained on other text than data.train, data.eval and data.mixture give "
                                         r"now \(the training text: [0-9a-f]{16} -> [0-9a-f]{16}"):
        printed_train(overrides)
    printed_train(overrides + ["train.resume=force"])  # forced through, and on the record
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["resumed_with_changes"][0].startswith("the training text: ")


def test_python_docs_is_tokenized_in_memory_and_writes_no_cache(tmp_path):
    """train.py's default data (configs/default.yaml: python-docs) is read in memory, as before shards."""
    cfg = run_config.load(ROOT / "configs" / "default.yaml", [f"run.dir={tmp_path}"])
    assert cfg.data.train == data.DEFAULT_CORPUS and not cfg.data.mixture
    objective = make_objective(cfg, ByteTokenizer())
    assert not objective.notes and not (tmp_path / corpus.CACHE).exists()
    pieces = objective.train.stream.pieces
    assert len(pieces) == 1 and not isinstance(pieces[0], np.memmap)
    documents = data.default_documents()
    np.testing.assert_array_equal(pieces[0], data.pack(ByteTokenizer(), documents, ByteTokenizer.document_separator))


# --------------------------------------------------------------------------------------------------
# data.mixture


def _letter_folder(folder: Path, letter: str) -> Path:
    """Shards of documents made of one letter and spaces only: a row shows which source it came from."""
    documents = [" ".join(letter * (1 + (i + j) % 9) for j in range(60)) for i in range(40)]
    source = folder / f"{letter}.jsonl"
    source.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents), encoding="utf-8")
    shards.tokenize([str(source)], "bytes", folder / letter, shard_tokens=4_000, progress=False)
    return folder / letter


def test_a_mixture_draws_three_rows_of_four_from_the_heavier_folder(tmp_path):
    a, b = _letter_folder(tmp_path, "a"), _letter_folder(tmp_path, "b")
    mixture = f"data.mixture=[{{path: {a}, weight: 3}}, {{path: {b}, weight: 1}}]"
    result, printed = printed_train([mixture, f"run.dir={tmp_path / 'run'}"])
    assert all(np.isfinite(r["loss"]) for r in result["history"]) and np.isfinite(result["history"][-1]["eval_loss"])
    assert "note: data.mixture[0].path: " in printed and f"shards of {b}, memory-mapped" in printed
    objective = result["objective"]
    letters = {ord("a"): 0, ord("b"): 1}

    def source_of(row: np.ndarray) -> int:
        found = {letters[t] for t in row if t in letters}
        assert len(found) == 1, f"a row mixes sources: {bytes(row.astype(np.uint8))!r}"  # no window crosses one
        return found.pop()

    # Grain's mix interleaves by the weights' integer proportions, deterministically: 3 of every 4 consecutive
    # rows come from the first folder, so 1,000 rows (250 steps of 4) hold exactly 750 of its windows.
    rows = np.concatenate([objective.batch(step, ROWS)["input_ids"] for step in range(250)])
    sources = np.array([source_of(row) for row in rows])
    assert (sources == 0).sum() == 750 and (sources == 1).sum() == 250
    held_out = np.concatenate([b["input_ids"] for b in objective.eval_batches(2, ROWS)])
    assert sorted(source_of(row) for row in held_out) == [0] * 6 + [1] * 2  # held-out rows shared by weight too


@pytest.mark.parametrize("mixture, message", [
    ("[{path: A, weight: 1}]", "data.mixture has 1 entries; a mixture weighs two or more sources"),
    ("[{path: A, weight: 0}, {path: B}]", "data.mixture[0].weight=0 must be a positive number"),
    ("[{path: A}, {path: B, weight: -2}]", "data.mixture[1].weight=-2 must be a positive number"),
    ("[{path: A}, {path: B, weight: true}]", "data.mixture[1].weight=True must be a positive number"),
    ("[{path: A}, {path: B, wieght: 2}]", "data.mixture[1] has unknown keys ['wieght']; valid: path, weight"),
    ("[{path: A}, {weight: 2}]", "data.mixture[1].path is missing"),
    ("[{path: A}, {path: C}]", "data.mixture[1].path='C' is neither 'python-docs', a folder jaxformer tokenize"),
])
def test_mixture_entries_are_refused_by_name(tmp_path, mixture, message):
    a, b = _letter_folder(tmp_path, "a"), _letter_folder(tmp_path, "b")
    spelled = mixture.replace("path: A", f"path: {a}").replace("path: B", f"path: {b}")
    with no_compilation(), pytest.raises(ValueError) as err:
        train(run_config.load(None, TINY + [f"data.mixture={spelled}", f"run.dir={tmp_path / 'run'}"]),
              progress=False)
    assert message in str(err.value)


def test_a_mixture_and_data_train_together_are_refused(corpus_files, tmp_path):
    a, b = _letter_folder(tmp_path, "a"), _letter_folder(tmp_path, "b")
    refused([f"data.mixture=[{{path: {a}}}, {{path: {b}}}]", f"data.train={corpus_files['shards']}"], tmp_path / "run",
            f"data.train={str(corpus_files['shards'])!r} and data.mixture are both given", "leave data.train out")


# --------------------------------------------------------------------------------------------------
# Bad input: named by file and line (or shard), before training; or skipped and counted


GOOD = [json.dumps({"text": f"document {i}: " + " ".join(f"w{(i * j) % 97}" for j in range(60))}) for i in range(40)]
GOOD_TEXT = "\n\n".join(f"Paragraph {i}: " + " ".join(f"w{(i * j) % 97}" for j in range(60)) for i in range(40))


@pytest.mark.parametrize("name, content, where, reason, kept", [  # kept: the documents a skipping run keeps
    ("malformed.jsonl", "\n".join(GOOD[:5] + ['{"text": "no end'] + GOOD[5:]).encode(), ":6", "not JSON", 40),
    ("field.jsonl", "\n".join(GOOD[:2] + ['{"body": "x"}'] + GOOD[2:]).encode(), ":3",
     "the record has no 'text' field (it has ['body'])", 40),
    ("null.jsonl", "\n".join(GOOD[:2] + ['{"text": null}'] + GOOD[2:]).encode(), ":3",
     "field 'text' must be a string, not null", 40),
    ("byte.txt", GOOD_TEXT.encode().replace(b"Paragraph 7:", b"Paragraph 7:\xff"), ":15",
     "byte b'\\xff' is not UTF-8 text", 39),
    ("byte.jsonl", "\n".join(GOOD).encode().replace(b"document 9:", b"document 9:\xfe"), ":10", "is not UTF-8", 39),
])
def test_a_bad_record_stops_the_run_by_file_and_line_or_is_skipped_and_counted(tmp_path, name, content, where,
                                                                               reason, kept):
    source = tmp_path / name
    source.write_bytes(content)
    refused([f"data.train={source}"], tmp_path / "stop", f"{source}{where}: ", reason,
            "(data.on_error=skip skips and counts such units)")
    skipping = run_config.load(None, TINY + [f"data.train={source}", "data.on_error=skip",
                                             f"run.dir={tmp_path / 'skip'}"])
    objective = make_objective(skipping, ByteTokenizer())
    note = next(note for note in objective.notes if note.startswith("data.train: tokenized"))
    assert f"skipped 1 bad records, first: {source}{where}: " in note and reason in note
    cache = next((tmp_path / "skip" / corpus.CACHE).glob(f"{name}-*/"))
    assert shards.read_manifest(cache)["documents"] == kept  # every other record


@pytest.mark.parametrize("name, content", [("empty.txt", b""), ("blank.jsonl", b"\n\n  \n")])
def test_an_empty_file_is_named_and_under_skip_still_refused_for_holding_nothing(tmp_path, name, content):
    source = tmp_path / name
    source.write_bytes(content)
    refused([f"data.train={source}"], tmp_path / "stop", f"{source}: holds no documents")
    refused([f"data.train={source}", "data.on_error=skip"], tmp_path / "skip",
            f"data.train={str(source)!r} holds no documents (skipped 1 bad records, first: {source}: holds no "
            "documents)")


@pytest.mark.parametrize("damage", ["bin", "idx"])
@pytest.mark.parametrize("on_error", ["stop", "skip"])  # a damaged shard is never skipped: the folder is wrong
def test_a_shard_truncated_on_disk_is_named(corpus_files, tmp_path, damage, on_error):
    folder = tmp_path / "shards"
    shutil.copytree(corpus_files["shards"], folder)
    damaged = folder / ("shard-00002.bin" if damage == "bin" else "shard-00002.idx.npy")
    os.truncate(damaged, damaged.stat().st_size - 7)
    expected = ("holds", "bytes; the manifest says", "it is truncated or damaged") if damage == "bin" else (
        "cannot be read", "it is truncated or damaged")
    refused([f"data.train={folder}", f"data.on_error={on_error}"], tmp_path / "run", f"data.train={str(folder)!r}",
            str(damaged), *expected)


def test_a_shard_folder_says_what_its_tokenization_skipped_or_left_unfinished(tmp_path, monkeypatch):
    """A folder from a `jaxformer tokenize --on-error skip` that was killed after two shards trains on what it
    holds, and the run's note says both: the records skipped and the source left unfinished."""
    source, folder = tmp_path / "bad.jsonl", tmp_path / "shards"
    source.write_text("\n".join(GOOD[:5] + ['{"text": "no end'] + GOOD[5:]) + "\n", encoding="utf-8")
    close = shards.ShardWriter.close_shard

    def killed_at_the_third(writer):
        if len(writer.manifest["shards"]) == 2:
            raise RuntimeError("killed")
        close(writer)

    monkeypatch.setattr(shards.ShardWriter, "close_shard", killed_at_the_third)
    with pytest.raises(RuntimeError, match="killed"):
        shards.tokenize([str(source)], "bytes", folder, shard_tokens=2_000, on_error="skip", progress=False)
    monkeypatch.undo()
    overrides = TINY + [f"data.train={folder}", f"run.dir={tmp_path / 'run'}"]
    note = make_objective(run_config.load(None, overrides), ByteTokenizer()).notes[0]
    assert note.startswith(f"data.train: {shards.read_manifest(folder)['tokens']:,} tokens in 2 shards of {folder}")
    assert f"(skipped 1 bad records when tokenized, first: {source}:6: not JSON" in note
    assert note.endswith(f"; its tokenization stopped before the end of {source}: rerun jaxformer tokenize to finish it")
    shards.tokenize([str(source)], "bytes", folder, shard_tokens=2_000, on_error="skip", progress=False)
    note = make_objective(run_config.load(None, overrides), ByteTokenizer()).notes[0]
    assert "skipped 1 bad records" in note and "stopped before the end" not in note


def test_a_model_with_segment_memory_refuses_a_mixture_before_anything_compiles(tmp_path):
    """Transformer-XL reads one text in order, row after row: a mixture has no such order."""
    a, b = _letter_folder(tmp_path, "a"), _letter_folder(tmp_path, "b")
    refused(["model.preset=tiny-transformer-xl", "model.overrides.memory_len=16",
             f"data.mixture=[{{path: {a}}}, {{path: {b}}}]"], tmp_path / "run",
            "carries a segment memory, so it reads one text in order; it cannot read data.mixture")
