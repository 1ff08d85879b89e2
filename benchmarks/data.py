"""Training data at scale: the measurements of issue 47, one mode a flag (several may be given; each prints a
table, or with ``--json`` one JSON line). Every corpus is made here from Python's own text (the pydoc topics
and the standard library's sources, one document each, repeated to the size asked).

``--rss``: host memory and start-up time of a training run against corpus size. For each ``--gb`` size a .txt
corpus (documents separated by a blank line, blank lines inside a document collapsed so that each stays one
document) is written to ``--workdir`` and tokenized once with ``jaxformer tokenize --tokenizer bytes`` (both
kept there and reused by later runs: writing and tokenizing 10 GB takes a while). Then ``python train.py
data.train=SHARDS train.steps=2 train.log_every=1 train.sample_tokens=0`` (configs/default.yaml otherwise: the
README's first command, tiny-gpt) runs as a subprocess ``--repeats`` times, with no persistent compilation
cache (every run compiles, as a first run does). Measured per run:
- seconds to the first step: from just before the process is launched to the moment its metrics.jsonl holds
  the step-1 record, which the loop writes after step 1's state is ready on the host (log_every=1; no held-out
  evaluation at step 1). Interpreter start, imports, opening the data, building the model, compiling and
  running the step are all inside it; the file is polled every 20 ms.
- peak RSS: ru_maxrss from ``os.wait4`` once the process exits (its high-water resident set over the whole
  run, file pages it mapped included; a process it started and reaped, such as the old path's tokenizing
  workers, counts as the largest of them, not their sum), and VmHWM from /proc/PID/status at the first step.
Printed per size: corpus GB, documents, tokens, the median seconds to the first step, the largest peak RSS.
Two reference rows: ``python-docs`` (the 460 KB default corpus tokenized in memory: the fixed cost of
starting a run) and the old path at the smallest size: ``data.train=CORPUS.txt`` into a fresh run folder,
which tokenizes the file into ``run.dir/data-cache`` before its first step (its time includes that). Targets
(issue 47): peak RSS flat across sizes and under 1.5 GB at 10 GB; first step under 10 s at every size once
tokenized. Disk: each size needs about 3x its GB (the text, then 2 bytes a token of uint16 shards): about 40 GB
for 0.3, 3 and 10, checked before anything is written.

``--loader``: tokens/s the Grain loader delivers alone (``jaxformer.train.loader.batches`` over configs/
default.yaml's causal_lm objective, batch 16 x 128, reading a shard folder: ``--shards DIR``, else a ``--mb``
corpus tokenized with bytes here) against tokens/s the same run's jitted training step consumes on this
machine (built as ``jaxformer.train.run`` builds it; its batches made beforehand, the transfer to the device
timed with the step). Each side runs ``--repeats`` blocks interleaved (A, B, A, B) after a warm-up block each
(the step's compiles): the loader ``--loader-batches`` batches through a fresh iterator each block (thread
start-up included, closed after), the step ``--steps`` steps. Tokens are batch x (seq_len + target length), as
the run's tokens/s counts them. Printed: the median tokens/s of each and their ratio (target >= 20x).

``--tokenize``: the throughput of ``jaxformer tokenize`` against Hugging Face ``datasets.map(tokenizer,
batched=True, num_proc=--workers)`` on the same ``--mb`` MB JSONL file with the same tokenizer, a byte-level
BPE trained here on its first 4 MB with ``tokenizers``' BpeTrainer. Each side runs ``--repeats`` times, interleaved
(A, B, A, B) after one warm-up each, into fresh folders:
- jaxformer: ``jaxformer.train.shards.tokenize`` (what the command runs) with ``--workers`` processes, from the
  JSONL file to committed shards;
- datasets: ``load_dataset("json")`` (the file into its arrow cache), then ``map`` of transformers'
  PreTrainedTokenizerFast over the same tokenizer.json (``add_special_tokens=False``, no attention mask:
  the same ids) with ``num_proc=--workers``, written to its cache.
Printed: the median seconds, MB/s of JSONL, and the ratios datasets / jaxformer for ``map`` alone (the
comparison the issue asks for, target >= 1.0) and for load + map (what a user waits for). The first documents'
ids are checked equal on both sides, so both did the same work. ``--cores N`` pins this process and its
children to N cores (the issue's measurement is on 2).

    python benchmarks/data.py --rss --gb 0.3 3 10 [--workdir /tmp/jaxformer-data-bench] [--repeats 2] [--json]
    python benchmarks/data.py --loader [--shards DIR | --mb 16] [--repeats 3] [--json]
    python benchmarks/data.py --tokenize --mb 200 --cores 2 [--repeats 2] [--workers 2] [--json]

Sizes are for a quiet machine; ``--rss --gb 0.003 --repeats 1``, ``--loader --mb 2`` and ``--tokenize --mb 2``
check that each mode works in well under a minute. ``--tokenize`` and ``--loader`` remove what they wrote;
``--rss`` keeps its corpora and shards in ``--workdir`` (delete the folder to reclaim the disk).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "jaxformer-data-bench"
POLL_S = 0.02


def python_texts_once():
    """Python's own text: the pydoc topics, then every standard-library module's source."""
    from pydoc_data import topics

    yield from (topics.topics[name] for name in sorted(topics.topics))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts):
        try:
            yield path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def python_texts():
    """``python_texts_once``, endlessly."""
    while True:
        yield from python_texts_once()


def write_corpus(path: Path, megabytes: float) -> int:
    """JSONL of {"text": ...} documents up to ``megabytes`` MB; returns the byte count."""
    written, limit = 0, int(megabytes * 1e6)
    with open(path, "w", encoding="utf-8") as file:
        for text in python_texts():
            line = json.dumps({"text": text}) + "\n"
            file.write(line)
            written += len(line.encode("utf-8"))
            if written >= limit:
                return written


def text_documents() -> list[bytes]:
    """``python_texts_once`` as .txt documents: newlines normalised and blank lines inside a document collapsed,
    so that a blank line only ever separates documents (the .txt reader splits there)."""
    documents = []
    for text in python_texts_once():
        text = re.sub(r"\n\s*\n", "\n", text.replace("\r\n", "\n").replace("\r", "\n")).strip("\n")
        if text.strip():
            documents.append(text.encode("utf-8"))
    return documents


def write_text_corpus(path: Path, gigabytes: float) -> int:
    """A .txt corpus of ``gigabytes`` GB at ``path`` unless one is there already (written under a temporary
    name and renamed once whole, so its presence means complete); returns its byte count."""
    if path.is_file():
        return path.stat().st_size
    documents, written, limit = text_documents(), 0, int(gigabytes * 1e9)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb", buffering=1 << 24) as file:
        while written < limit:
            for document in documents:
                file.write(document + b"\n\n")
                written += len(document) + 2
                if written >= limit:
                    break
    partial.rename(path)
    return written


def train_bpe(corpus: Path, out: Path, vocab: int, sample_mb: float = 4.0) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def sample():
        seen = 0
        with open(corpus, encoding="utf-8") as file:
            for line in file:
                seen += len(line)
                yield json.loads(line)["text"]
                if seen >= sample_mb * 1e6:
                    return

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(sample(), trainer)
    tokenizer.save(str(out))
    return out


def tokenize_benchmark(args, work: Path) -> dict:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # what datasets' forked workers get anyway
    import datasets
    from transformers import PreTrainedTokenizerFast

    from jaxformer.train import shards

    datasets.disable_progress_bars()
    corpus = work / "corpus.jsonl"
    size = write_corpus(corpus, args.mb)
    tokenizer_json = train_bpe(corpus, work / "tokenizer.json", args.vocab)
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json))
    runs = iter(range(1_000_000))

    def run_jaxformer():
        out = work / f"shards-{next(runs)}"
        start = time.perf_counter()
        shards.tokenize([str(corpus)], str(tokenizer_json), out, workers=args.workers, progress=False)
        return {"total": time.perf_counter() - start, "out": out}

    def encode(batch):
        return hf_tokenizer(batch["text"], add_special_tokens=False, return_attention_mask=False)

    def run_datasets():
        cache = work / f"hf-cache-{next(runs)}"
        start = time.perf_counter()
        table = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(cache))
        loaded = time.perf_counter()
        mapped = table.map(encode, batched=True, num_proc=args.workers, remove_columns=["text"])
        end = time.perf_counter()
        return {"total": end - start, "map": end - loaded, "out": mapped}

    sides = {"jaxformer": run_jaxformer, "datasets": run_datasets}
    last = {name: fn() for name, fn in sides.items()}  # warm-up: imports, the fork server, datasets' builders
    times = {"jaxformer": [], "datasets": [], "datasets_map": []}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            last[name] = fn()
            times[name].append(last[name]["total"])
            if name == "datasets":
                times["datasets_map"].append(last[name]["map"])
    opened = shards.open_shards(last["jaxformer"]["out"])
    for i in range(3):  # the same ids on both sides (shards end each document with EOS)
        ours = [int(t) for t in opened.document(0, i)[:-1]]
        if ours != last["datasets"]["out"][i]["input_ids"]:
            raise SystemExit(f"document {i}: jaxformer's ids differ from datasets'")
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"corpus_mb": round(size / 1e6, 1), "tokens": opened.total_tokens, "workers": args.workers,
            "cpus": os.cpu_count(), "repeats": args.repeats,
            "jaxformer_s": round(medians["jaxformer"], 3), "datasets_map_s": round(medians["datasets_map"], 3),
            "datasets_load_map_s": round(medians["datasets"], 3),
            "jaxformer_mb_s": round(size / 1e6 / medians["jaxformer"], 2),
            "datasets_map_mb_s": round(size / 1e6 / medians["datasets_map"], 2),
            "ratio_vs_map": round(medians["datasets_map"] / medians["jaxformer"], 3),
            "ratio_vs_load_map": round(medians["datasets"] / medians["jaxformer"], 3)}


# --rss: a training run's memory and start-up against corpus size


def _status_kib(pid: int) -> dict[str, int]:
    """The kB fields of /proc/PID/status (VmHWM, VmRSS, RssAnon, RssFile, ...); empty once it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {key: int(value.split()[0]) for key, _, value in (line.partition(":") for line in lines)
            if value.strip().endswith("kB")}


def child_env() -> dict[str, str]:
    """This environment without a persistent compilation cache: each run compiles, as a user's first run does."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}


def training_run(data_train: str, run_dir: Path) -> dict:
    """``python train.py data.train=... train.steps=2`` in a fresh ``run_dir``: seconds from launch to the step-1
    record in metrics.jsonl, VmHWM (GB) then, and the process's peak RSS (GB) from ``os.wait4`` at its exit."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(ROOT / "train.py"), f"data.train={data_train}", f"run.dir={run_dir}",
               "train.steps=2", "train.log_every=1", "train.sample_tokens=0"]
    metrics, log_path = run_dir / "metrics.jsonl", run_dir.with_name(run_dir.name + ".log")
    first_step = at_first_step = None
    with open(log_path, "wb") as log:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
        while True:
            # wait4, not Popen.poll: it reaps the process with its own resource usage (ru_maxrss)
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                process.returncode = os.waitstatus_to_exitcode(status)
                break
            if first_step is None and metrics.is_file() and b"\n" in metrics.read_bytes():
                first_step = time.perf_counter() - start
                at_first_step = _status_kib(process.pid)
            time.sleep(POLL_S)
    output = log_path.read_text(errors="replace")
    if process.returncode != 0 or first_step is None:
        raise SystemExit(f"{' '.join(command)} failed (exit {process.returncode}):\n{output[-3000:]}")
    notes = [line.removeprefix("note: ") for line in output.splitlines() if line.startswith("note: data.")]
    shutil.rmtree(run_dir, ignore_errors=True)
    log_path.unlink()
    return {"first_step_s": first_step, "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,
            "hwm_at_first_step_gb": at_first_step.get("VmHWM", 0) * 1024 / 1e9,
            "anon_at_first_step_gb": at_first_step.get("RssAnon", 0) * 1024 / 1e9,
            "file_at_first_step_gb": at_first_step.get("RssFile", 0) * 1024 / 1e9, "notes": notes}


def tokenized(corpus: Path, out: Path) -> float | None:
    """``jaxformer tokenize CORPUS --tokenizer bytes --out OUT`` unless OUT already holds it whole; the
    seconds it took, None when reused."""
    from jaxformer.train import shards

    if (out / shards.MANIFEST).is_file():
        sources = shards.read_manifest(out)["sources"]
        whole = [(s["path"], s["size"], s["complete"]) for s in sources] == [(str(corpus), corpus.stat().st_size, True)]
        if whole:
            return None
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "jaxformer.cli", "tokenize", str(corpus), "--tokenizer", "bytes",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"jaxformer tokenize {corpus} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def check_disk(workdir: Path, sizes: list[float]) -> None:
    """Refuse to start sizes whose text and shards (about 3 bytes a corpus byte) would not fit on the disk."""
    missing = sum(3 * gb for gb in sizes if not (workdir / f"shards-{gb:g}GB" / "manifest.json").is_file())
    free = shutil.disk_usage(workdir).free / 1e9
    if missing > 0.95 * free:
        raise SystemExit(f"--rss --gb {' '.join(f'{gb:g}' for gb in sizes)} needs about {missing:.1f} GB more in "
                         f"{workdir} (text + uint16 shards); {free:.1f} GB are free: choose another --workdir")


def summarize_runs(runs: list[dict]) -> dict:
    return {"first_step_s": round(statistics.median(r["first_step_s"] for r in runs), 2),
            "first_step_s_all": [round(r["first_step_s"], 2) for r in runs],
            "peak_rss_gb": round(max(r["peak_rss_gb"] for r in runs), 3),
            "hwm_at_first_step_gb": round(max(r["hwm_at_first_step_gb"] for r in runs), 3),
            "anon_at_first_step_gb": round(max(r["anon_at_first_step_gb"] for r in runs), 3),
            "file_at_first_step_gb": round(max(r["file_at_first_step_gb"] for r in runs), 3)}


def rss_benchmark(args) -> dict:
    from jaxformer.train import shards

    workdir = Path(args.workdir).resolve()  # the manifest names its source by absolute path
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = sorted(args.gb)
    check_disk(workdir, sizes)
    rows = []
    for gb in sizes:
        corpus, out = workdir / f"python-{gb:g}GB.txt", workdir / f"shards-{gb:g}GB"
        started = time.perf_counter()
        written = corpus.is_file()
        size = write_text_corpus(corpus, gb)
        write_s = None if written else time.perf_counter() - started
        tokenize_s = tokenized(corpus, out)
        manifest = shards.read_manifest(out)
        runs = [training_run(str(out), workdir / "runs" / f"{gb:g}GB") for _ in range(args.repeats)]
        rows.append({"source": f"shards-{gb:g}GB", "corpus_gb": round(size / 1e9, 3),
                     "documents": manifest["documents"], "tokens": manifest["tokens"],
                     "write_s": write_s and round(write_s, 1), "tokenize_s": tokenize_s and round(tokenize_s, 1),
                     **summarize_runs(runs)})
    baseline = [training_run("python-docs", workdir / "runs" / "python-docs") for _ in range(args.repeats)]
    result = {"repeats": args.repeats, "cpus": os.cpu_count(), "workdir": str(workdir), "sizes": rows,
              "python_docs": summarize_runs(baseline)}
    if not args.no_old_path:  # once: its first run is the measurement, a second would read the cache
        smallest = workdir / f"python-{sizes[0]:g}GB.txt"
        old = training_run(str(smallest), workdir / "runs" / "old-path")
        result["old_path"] = {"source": smallest.name, "corpus_gb": rows[0]["corpus_gb"], **summarize_runs([old]),
                              "notes": old["notes"]}
    return result


def print_rss(result: dict) -> None:
    print(f"training run to its first step (train.py, tiny-gpt, train.steps=2), {result['cpus']} CPUs, median of "
          f"{result['repeats']} runs (peak RSS: the largest); corpora in {result['workdir']}")
    header = (f"{'data.train':<22} {'corpus GB':>9} {'documents':>10} {'tokens':>15} {'first step s':>12} "
              f"{'peak RSS GB':>11} {'peak at step 1':>14}")
    print(header)
    print("-" * len(header))

    def line(name, row):
        documents = f"{row['documents']:,}" if "documents" in row else ""
        tokens = f"{row['tokens']:,}" if "tokens" in row else ""
        corpus = f"{row['corpus_gb']:.3f}" if "corpus_gb" in row else ""
        print(f"{name:<22} {corpus:>9} {documents:>10} {tokens:>15} {row['first_step_s']:>12.2f} "
              f"{row['peak_rss_gb']:>11.3f} {row['hwm_at_first_step_gb']:>14.3f}")

    line("python-docs (memory)", result["python_docs"])
    for row in result["sizes"]:
        line(row["source"], row)
    if "old_path" in result:
        line(f"{result['old_path']['source']} *", result["old_path"])
        print("* the old path: a .txt given directly, its first run tokenizes it into run.dir/data-cache (every "
              "core) before step 1; that time is inside its first-step seconds. The run said:")
        for note in result["old_path"]["notes"]:
            print(f"  {note}")
    made = [f"{row['source']}: text written in {row['write_s']} s" for row in result["sizes"] if row["write_s"]]
    made += [f"{row['source']}: jaxformer tokenize {row['tokenize_s']} s "
             f"({row['corpus_gb'] * 1e3 / row['tokenize_s']:.0f} MB/s)" for row in result["sizes"] if row["tokenize_s"]]
    if made:
        print("made this time: " + "; ".join(made))
    worst = max(row["peak_rss_gb"] for row in result["sizes"])
    slowest = max(row["first_step_s"] for row in result["sizes"])
    print(f"targets: peak RSS flat and < 1.5 GB at 10 GB (largest here {worst:.3f} GB); first step < 10 s at every "
          f"size once tokenized (slowest here {slowest:.2f} s)")


# --loader: what the Grain loader delivers against what a training step consumes


def loader_benchmark(args, work: Path) -> dict:
    import jax

    from jaxformer import sharding
    from jaxformer.sharding import shardings_of
    from jaxformer.train import loader
    from jaxformer.train.run import Run
    from jaxformer.train.run_config import load
    from jaxformer.train.steps import batch_sharding, init_state, make_optimizer, make_steps, split_model

    folder = Path(args.shards) if args.shards else work / "shards"
    if not args.shards:
        corpus = work / "corpus.txt"
        write_text_corpus(corpus, args.mb / 1e3)
        tokenized(corpus, folder)
    cfg = load(ROOT / "configs" / "default.yaml", [f"data.train={folder}", f"run.dir={work / 'run'}"])
    run = Run.build(cfg)
    graphdef, params, rest = split_model(run.model)
    optimizer, _ = make_optimizer(cfg, params)
    state = init_state(cfg, run.model, optimizer)
    train_step, _ = make_steps(graphdef, rest, optimizer, run.objective, cfg, run.mesh, shardings_of(state))
    rows, batch_size = batch_sharding(run.mesh), cfg.train.batch_size
    tokens_per_batch = batch_size * (cfg.train.seq_len + run.objective.target_len)
    blocks = args.repeats + 1  # the first of each side is a warm-up
    total = blocks * (args.loader_batches + args.steps)
    dataset = loader.batches(run.objective, batch_size, total, sharding.process_rows(batch_size),
                             cfg.data.loader_threads, cfg.data.prefetch)
    position = 0

    def run_loader():
        nonlocal position
        start = time.perf_counter()
        iterator = loader.start(dataset, position)
        for _ in range(args.loader_batches):
            next(iterator)
        seconds = time.perf_counter() - start
        iterator.close()  # no prefetching into the step block that follows
        position += args.loader_batches
        return args.loader_batches * tokens_per_batch / seconds

    def run_steps():
        nonlocal state, position
        made = [run.objective.batch_rows(position + i, batch_size, sharding.process_rows(batch_size))
                for i in range(args.steps)]
        position += args.steps
        start = time.perf_counter()
        for batch in made:
            state, metrics = train_step(state, sharding.from_process_rows(batch, rows))
        jax.block_until_ready((state, metrics))
        return args.steps * tokens_per_batch / (time.perf_counter() - start)

    speeds = {"loader": [], "step": []}
    for block in range(blocks):
        for name, measure in (("loader", run_loader), ("step", run_steps)):
            value = measure()
            if block:
                speeds[name].append(value)
    loader_speed, step_speed = (statistics.median(speeds[name]) for name in ("loader", "step"))
    return {"data": str(folder) if args.shards else f"{args.mb:g} MB of text, bytes", "batch_size": batch_size,
            "seq_len": cfg.train.seq_len, "loader_threads": cfg.data.loader_threads, "prefetch": cfg.data.prefetch,
            "loader_batches": args.loader_batches, "steps": args.steps, "repeats": args.repeats,
            "cpus": os.cpu_count(), "loader_tokens_per_s": round(loader_speed), "step_tokens_per_s": round(step_speed),
            "loader_all": [round(v) for v in speeds["loader"]], "step_all": [round(v) for v in speeds["step"]],
            "ratio": round(loader_speed / step_speed, 2)}


def print_loader(result: dict) -> None:
    print(f"configs/default.yaml (tiny-gpt, causal_lm, batch {result['batch_size']} x {result['seq_len']}) over "
          f"{result['data']}; {result['cpus']} CPUs; median of {result['repeats']} blocks each, interleaved")
    print(f"Grain loader alone   {result['loader_tokens_per_s']:>12,} tokens/s   ({result['loader_batches']} batches "
          f"a block, {result['loader_threads']} threads, prefetch {result['prefetch']}, iterator start included)")
    print(f"train step           {result['step_tokens_per_s']:>12,} tokens/s   ({result['steps']} jitted steps a "
          "block, after warm-up)")
    print(f"ratio loader / step: {result['ratio']:.1f}x (target >= 20x)")


def print_tokenize(result: dict) -> None:
    cores = f" pinned to {result['cores']} cores," if result.get("cores") else ""
    print(f"corpus {result['corpus_mb']} MB of JSONL, {result['tokens']:,} tokens, {result['workers']} workers,{cores} "
          f"{result['cpus']} CPUs, median of {result['repeats']}")
    print(f"jaxformer tokenize      {result['jaxformer_s']:8.2f} s  {result['jaxformer_mb_s']:6.2f} MB/s")
    print(f"datasets map            {result['datasets_map_s']:8.2f} s  {result['datasets_map_mb_s']:6.2f} MB/s"
          f"   (load_dataset + map {result['datasets_load_map_s']:.2f} s)")
    print(f"ratio datasets map / jaxformer: {result['ratio_vs_map']:.2f}x  "
          f"(load + map / jaxformer: {result['ratio_vs_load_map']:.2f}x; target >= 1.0)")


def in_temporary_folder(measure, args, prefix: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        return measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rss", action="store_true", help="a training run's peak RSS and first step vs corpus size")
    parser.add_argument("--loader", action="store_true", help="the Grain loader's tokens/s vs a train step's")
    parser.add_argument("--tokenize", action="store_true", help="jaxformer tokenize vs datasets.map")
    parser.add_argument("--gb", type=float, nargs="+", default=[0.3, 3, 10], help="--rss: corpus sizes in GB")
    parser.add_argument("--workdir", default=str(DEFAULT_WORKDIR),
                        help="--rss: where corpora and shards are written and reused (about 3x each size)")
    parser.add_argument("--no-old-path", action="store_true",
                        help="--rss: skip the reference run that tokenizes the smallest .txt into its data-cache")
    parser.add_argument("--mb", type=float, default=16,
                        help="--tokenize, --loader: corpus size in MB (--tokenize's measurement: 200)")
    parser.add_argument("--shards", help="--loader: a shard folder to read (default: a --mb corpus made here)")
    parser.add_argument("--loader-batches", type=int, default=200, help="--loader: batches a loader block")
    parser.add_argument("--steps", type=int, default=20, help="--loader: training steps a step block")
    parser.add_argument("--repeats", type=int, default=2, help="runs (--rss) or interleaved blocks of each side")
    parser.add_argument("--workers", type=int, default=2,
                        help="--tokenize: jaxformer's --workers and datasets' num_proc")
    parser.add_argument("--vocab", type=int, default=8192, help="--tokenize: the BPE's vocabulary size")
    parser.add_argument("--cores", type=int, help="pin this process and its children to this many cores")
    parser.add_argument("--json", action="store_true", help="one JSON line a mode")
    args = parser.parse_args()
    if not (args.rss or args.loader or args.tokenize):
        parser.error("choose a measurement: --rss, --loader, --tokenize (several may be given)")
    if args.repeats < 1 or args.loader_batches < 1 or args.steps < 1 or min(args.gb) <= 0 or args.mb <= 0:
        parser.error("--repeats, --loader-batches, --steps, --gb and --mb must be positive")
    if args.cores:
        available = sorted(os.sched_getaffinity(0))
        if args.cores > len(available):
            parser.error(f"--cores {args.cores}: this process may run on {len(available)} cores")
        os.sched_setaffinity(0, available[:args.cores])
    modes = [(args.rss, lambda: rss_benchmark(args), print_rss),
             (args.loader, lambda: in_temporary_folder(loader_benchmark, args, "jaxformer-loader-bench-"),
              print_loader),
             (args.tokenize, lambda: in_temporary_folder(tokenize_benchmark, args, "jaxformer-tokenize-bench-"),
              print_tokenize)]
    for chosen, measure, show in modes:
        if not chosen:
            continue
        result = measure() | ({"cores": args.cores} if args.cores else {})
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            show(result)
            print(flush=True)


if __name__ == "__main__":
    sys.exit(main())
