"""Run by tests/test_data_processes.py as two JAX processes on loopback and as one: each builds its own rows
(``sharding.process_rows``) of a few steps' batches from a token-shard folder, for causal_lm, span_corruption
and ul2 under data.packing=documents, and records every slice it takes of the memory-mapped shards. Prints one
JSON line: per objective, the rows, the batches, the (shard, first, last) token ranges read and the bytes read.

    python tests/data_processes_check.py FOLDER [COORDINATOR NUM_PROCESSES PROCESS_ID]

FOLDER is written (``write_shards``) when it holds no shards yet; give it beforehand when processes share it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

STEPS, BATCH, SEQ_LEN = 4, 8, 32
SHARD_TOKENS = 600  # about 40 shards: some windows span two of them
# objective -> (model preset, config changes): presets whose attention packs documents
CASES = {"causal_lm": ("tiny-gpt", {}),
         "span_corruption": ("tiny-t5", {"vocab_size": 360}),  # the byte tokenizer's sentinels
         "ul2": ("tiny-t5", {"vocab_size": 360})}


def write_shards(folder: Path) -> Path:
    """A shard folder (bytes tokenizer) of the first 60 KB of the pydoc topics: about 40 shards, so that every
    step's rows lie in many and the steps here never wrap an epoch (the rows are distinct windows)."""
    from jaxformer.train import data, shards

    text, size = [], 0
    for document in data.default_documents():
        text.append(document)
        size += len(document)
        if size > 60_000:
            break
    source = folder.parent / f"{folder.name}.txt"
    source.write_text("\n\n".join(text), encoding="utf-8")
    shards.tokenize([str(source)], "bytes", folder, shard_tokens=SHARD_TOKENS, workers=1, progress=False)
    return folder


class RecordedPiece:
    """A memory-mapped shard that notes every slice taken of it: what a process reads, counted where it is read
    rather than by the stream's own counter."""

    def __init__(self, tokens: np.ndarray, index: int, reads: list):
        self.tokens, self.index, self.reads = tokens, index, reads

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, where):
        if not isinstance(where, slice) or where.step not in (None, 1):
            raise TypeError(f"shard {self.index} read at {where!r}: only contiguous slices are expected")
        first, last, _ = where.indices(len(self.tokens))
        self.reads.append((self.index, first, last))
        return self.tokens[where]


def case(name: str, folder: Path, run_dir: Path) -> dict:
    import jaxformer as jf
    from jaxformer import sharding
    from jaxformer.train import data, run_config
    from jaxformer.train.tasks import make_objective

    preset, changes = CASES[name]
    run = run_config.load(None, [f"train.objective={name}", f"data.train={folder}", "data.packing=documents",
                                 f"train.seq_len={SEQ_LEN}", f"run.dir={run_dir}"])
    objective = make_objective(run, data.ByteTokenizer())
    objective.adapt(jf.config(preset).replace(**changes), True)
    stream, reads = objective.train.stream, []
    stream.pieces[:] = [RecordedPiece(p, i, reads) for i, p in enumerate(stream.pieces)]  # shared with held-out
    rows, batches, ranges = [], [], []
    for step in range(STEPS):
        mine = sharding.process_rows(BATCH)
        batch = objective.batch_rows(step, BATCH, mine)
        rows.append([mine.start, mine.stop])
        batches.append({key: value.tolist() for key, value in batch.items()})
        ranges.append(list(reads))
        reads.clear()
    itemsize = stream.pieces[0].tokens.dtype.itemsize
    return {"rows": rows, "batches": batches, "ranges": ranges, "itemsize": itemsize,
            "bytes_read": sum(last - first for step in ranges for _, first, last in step) * itemsize,
            "stream_bytes_read": stream.bytes_read, "length": objective.train.length,
            "stride": objective.train.stride, "windows": objective.train.counts[0],
            "piece_starts": stream.piece_starts.tolist()}


def main(argv: list[str]) -> None:
    folder = Path(argv[0]).resolve()
    if len(argv) == 4:
        from jaxformer import sharding

        sharding.initialize_distributed(argv[1], int(argv[2]), int(argv[3]))
    elif not (folder / "manifest.json").is_file():
        write_shards(folder)
    import jax

    run_dir = folder.parent / f"run-{jax.process_count()}-{jax.process_index()}"
    report = {"process": jax.process_index(), "processes": jax.process_count(),
              "cases": {name: case(name, folder, run_dir) for name in CASES}}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
