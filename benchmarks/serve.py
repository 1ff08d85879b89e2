"""Serving under load: ``jaxformer serve`` against ``transformers serve`` (its continuous batching), and our own
sequential ``generate``, on one gpt2-124M-shaped checkpoint on this CPU, float32.

The checkpoint (random weights, transformers' GPT2LMHeadModel in the Hugging Face format, no EOS id, so every
request writes the tokens it asks for) is made in a temporary folder with a byte-level BPE tokenizer trained here
on transformers' own modeling files (its vocabulary filled up to gpt2's 50,257 with byte strings no merge makes).
Both servers load that folder, on 127.0.0.1, as subprocesses:

- ``jaxformer serve FOLDER --port 0 --max-num-seqs C_max`` (its defaults otherwise: blocks of 16, prefill chunks of
  256 and 512 prompt tokens a step, a pool for every sequence at the model's length);
- ``transformers serve FOLDER --continuous-batching --device cpu --dtype float32 --cb-num-blocks N`` (CUDA hidden):
  a pool of the same tokens in its default pages of 256 (left alone, on a CPU it sizes its pool to 90% of the
  machine's memory), its scheduler and batch of 8,192 tokens a step at their defaults.

One load generator, the ``openai`` client (``AsyncOpenAI``) on asyncio: a closed loop of C clients (each sends its
next request as its last one ends; ``--rate R``: Poisson arrivals at R requests/s instead, at most C in flight),
at C = 1, 8, 32. Requests are drawn once from a seeded distribution: a prompt of 16..256 tokens (a window of the
tokenizer's corpus, sent as text to ``/v1/completions``) and 16..128 new tokens, greedy, streamed with
``include_usage`` so each request's token count is the server's own (checked against what was asked). Each level
runs the two servers in turn, the first one alternating level by level (A, B, then B, A). Reported per server and
level: output tokens/s (all requests' tokens over the level's wall time), time to first token (request sent to
first text chunk) and time per output token (a request's first chunk to its last over its tokens - 1), median and
p99, and the tokens a text chunk carried (above 1: tokens arrive in bursts). Paging waste is sampled from
jaxformer's ``/metrics`` every 0.1 s during its run at the top level: the slots of the blocks used
(``jaxformer_kv_blocks_used`` x ``jaxformer_kv_block_size``) that hold no token (``jaxformer_kv_tokens``), over all
samples. The programs jaxformer serve compiled during each timed level are read from ``/metrics`` too
(``jaxformer_programs_compiled``): a compile there stalls every running sequence, so a run that met one did not
measure the steady state.

Before the timed runs, each server runs every level's workload once untimed (``--warm-up``; other requests drawn
from the same distribution, so no timed prompt finds its prefix cached), and jaxformer serve compiles its step
programs as it starts (its default). Each level's requests are its own.

Sequential ``generate``: the same requests (the first ``--sequential`` of the top level's), one at a time,
``model.generate``'s compiled loop (each shape compiled before it is timed, as benchmarks/generate.py does):
tokens/s of new tokens. Ratios: jaxformer / transformers serve at each level, and jaxformer serve at the top level
/ sequential generate. Targets (issue 53): >= 2x transformers serve at 32 clients, >= 4x sequential generate.

``--quick``: a tiny gpt2 (2 layers x 64, vocabulary 2,048), levels 1 and 4, a few short requests: a smoke run of
the whole script (both servers start and answer) in about three minutes, jaxformer serve started with
``--no-warm-up`` (its untimed pass compiles what a run meets, mostly): not a measurement. Time the full run only
on a quiet machine (about half an hour; ``--warm-up top`` shortens it). ``--jaxformer-args`` and
``--transformers-args`` pass more flags (``--jaxformer-args=--prefill-chunk=32``).

    python benchmarks/serve.py [--quick] [--levels 1,8,32] [--per-client 3] [--rate R] [--sequential 16]
                               [--warm-up levels|top|none] [--keep] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

MODEL_NAME = "bench"
START_TIMEOUT_S = 1800  # a server's start: imports, loading, jaxformer's warm-up compiles (every program)
REQUEST_TIMEOUT_S = 600
TRANSFORMERS_PAGE = 256  # tokens a page of transformers' continuous-batching cache holds (its default page_size)


# ---------------------------------------------------------------------------------------------- the checkpoint


def corpus_files(megabytes: float) -> list[Path]:
    """transformers' modeling files, in a fixed order, up to ``megabytes`` of text: the tokenizer's corpus."""
    import transformers

    files, size = [], 0
    for path in sorted(Path(transformers.__file__).parent.glob("models/*/modeling_*.py")):
        files.append(path)
        size += path.stat().st_size
        if size >= megabytes * 1e6:
            break
    return files


def make_tokenizer(files: list[Path], vocab_size: int):
    """A byte-level BPE trained on ``files``, its vocabulary filled to ``vocab_size`` with two- and three-byte
    strings no merge makes (so ids a random model draws still decode). No special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train([str(f) for f in files], trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet,
                                                                 show_progress=False))
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    fillers = (a + b + c for c in ("", *alphabet) for a in alphabet for b in alphabet)
    for text in fillers:
        if len(vocab) >= vocab_size:
            break
        vocab.setdefault(text, len(vocab))
    return Tokenizer.from_str(json.dumps(spec))


def make_checkpoint(folder: Path, quick: bool):
    """The gpt2-shaped checkpoint and its tokenizer in ``folder``; returns the tokenizer, the corpus' ids and the
    model's positions."""
    import torch
    import transformers

    files = corpus_files(0.3 if quick else 8)
    shape = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=2048, n_positions=256) if quick else {}
    config = transformers.GPT2Config(bos_token_id=None, eos_token_id=None, **shape)  # no EOS: every token asked
    tokenizer = make_tokenizer(files, config.vocab_size)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer,
                                         model_max_length=config.n_positions).save_pretrained(folder)
    corpus = tokenizer.encode("\n".join(f.read_text(encoding="utf-8") for f in files)).ids
    return tokenizer, corpus, config.n_positions


@dataclasses.dataclass
class Request:
    text: str
    prompt_ids: list[int]
    max_tokens: int


def draw_requests(tokenizer, corpus: list[int], count: int, prompt_range: tuple[int, int],
                  output_range: tuple[int, int], seed: int = 0) -> list[Request]:
    """``count`` requests from a seeded draw: a corpus window of a prompt length, sent as its text (its ids are
    the text re-encoded, which may differ from the window by a token or so at its ends), and a new-token count."""
    import numpy as np

    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(count):
        length = int(rng.integers(prompt_range[0], prompt_range[1] + 1))
        start = int(rng.integers(0, len(corpus) - length))
        text = tokenizer.decode(corpus[start:start + length])
        requests.append(Request(text, tokenizer.encode(text).ids, int(rng.integers(output_range[0],
                                                                                   output_range[1] + 1))))
    return requests


# ---------------------------------------------------------------------------------------------- servers


class Server:
    """A server subprocess in its own process group (transformers serve runs its model in a child process), its
    output in a file; ``stop`` ends the group: SIGTERM, then SIGKILL after 20 s."""

    def __init__(self, name: str, command: list[str], log: Path, model: str):
        self.name, self.command, self.log, self.model = name, command, log, model  # model: the name requests give
        self.output = open(log, "wb")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
        self.process = subprocess.Popen(command, stdout=self.output, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        self.base_url: str | None = None

    def tail(self, lines: int = 30) -> str:
        self.output.flush()
        return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])

    def fail(self, why: str):
        raise RuntimeError(f"{self.name} {why}\n  command: {' '.join(self.command)}\n  its output's last lines:\n"
                           f"{self.tail()}")

    def wait_ready(self, find_url, timeout: float = START_TIMEOUT_S) -> None:
        """Until ``find_url(its output)`` gives the address and ``/health`` answers 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.fail(f"exited with status {self.process.returncode} before it was ready")
            if self.base_url is None:
                self.base_url = find_url(self.log.read_text(encoding="utf-8", errors="replace"))
            if self.base_url is not None:
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as answer:
                        if answer.status == 200:
                            return
            time.sleep(0.5)
        self.fail(f"was not ready after {timeout:.0f} s")

    def cpu_seconds(self) -> float:
        """CPU time of the group's processes (user + system), for the idle server's share while the other runs."""
        total = 0.0
        ticks = os.sysconf("SC_CLK_TCK")
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.process.pid:  # its process group
                    total += (int(fields[11]) + int(fields[12])) / ticks
        return total

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.output.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_jaxformer(folder: Path, logs: Path, max_num_seqs: int, extra: list[str]) -> Server:
    command = [str(Path(sys.executable).parent / "jaxformer"), "serve", str(folder), "--host", "127.0.0.1",
               "--port", "0", "--served-model-name", MODEL_NAME, "--max-num-seqs", str(max_num_seqs), *extra]
    return Server("jaxformer serve", command, logs / "jaxformer.log", MODEL_NAME)


def start_transformers(folder: Path, logs: Path, pool_tokens: int, extra: list[str]) -> Server:
    # its pool holds what jaxformer's holds, in its default pages of 256 tokens (on a CPU it would otherwise take
    # 90% of the machine's memory)
    command = [str(Path(sys.executable).parent / "transformers"), "serve", str(folder), "--continuous-batching",
               "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(free_port()),
               "--cb-num-blocks", str(-(-pool_tokens // TRANSFORMERS_PAGE)), "--log-level", "warning", *extra]
    # a server started with a model answers to that name only
    return Server("transformers serve", command, logs / "transformers.log", str(folder))


def jaxformer_url(output: str) -> str | None:
    found = re.search(r"on (http://127\.0\.0\.1:\d+)", output)
    return found and found.group(1)


def transformers_url(command: list[str]):
    port = command[command.index("--port") + 1]
    return lambda output: f"http://127.0.0.1:{port}"


# ---------------------------------------------------------------------------------------------- load


@dataclasses.dataclass
class Result:
    sent: float
    first: float | None = None  # first text chunk
    last: float | None = None
    chunks: int = 0
    tokens: int = 0  # the server's usage.completion_tokens
    asked: int = 0


async def one_request(client, model: str, request: Request) -> Result:
    result = Result(time.perf_counter(), asked=request.max_tokens)
    stream = await client.completions.create(model=model, prompt=request.text, max_tokens=request.max_tokens,
                                             temperature=0, stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].text:
            result.first = result.first or now
            result.last = now
            result.chunks += 1
        if chunk.usage is not None:
            result.tokens = chunk.usage.completion_tokens
    return result


async def run_level(server: Server, requests: list[Request], clients: int, rate: float | None, seed: int,
                    metrics_sampler=None) -> tuple[list[Result], float, list]:
    """Every request through ``clients`` concurrent clients (closed loop, or Poisson arrivals at ``rate``);
    (results in request order, wall seconds, the sampler's samples)."""
    import numpy as np
    from openai import AsyncOpenAI

    gaps = np.random.default_rng(seed).exponential(1 / rate, len(requests)) if rate else np.zeros(len(requests))
    slots = asyncio.Semaphore(clients)
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0,
                           timeout=REQUEST_TIMEOUT_S) as client:
        async def guarded(request: Request) -> Result:
            try:
                return await one_request(client, server.model, request)
            finally:
                slots.release()

        samples: list = []
        sampler = None if metrics_sampler is None else asyncio.create_task(metrics_sampler(samples))
        start = time.perf_counter()
        tasks = []
        for i, request in enumerate(requests):
            await asyncio.sleep(gaps[i])
            await slots.acquire()
            tasks.append(asyncio.create_task(guarded(request)))
        results = await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
    return results, wall, samples


def scrape(base_url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def waste_sampler(server: Server, every_s: float = 0.1):
    """A task body sampling (slots in the used blocks, tokens they hold) from jaxformer's /metrics while a level
    runs."""
    async def sample(samples: list) -> None:
        loop = asyncio.get_running_loop()
        while True:
            values = await loop.run_in_executor(None, scrape, server.base_url)
            if values["jaxformer_kv_blocks_used"]:
                samples.append((values["jaxformer_kv_blocks_used"] * values["jaxformer_kv_block_size"],
                                values["jaxformer_kv_tokens"]))
            await asyncio.sleep(every_s)
    return sample


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def summarize(results: list[Result], wall: float) -> dict:
    tokens = sum(r.tokens for r in results)
    ttft = [r.first - r.sent for r in results if r.first is not None]
    tpot = [(r.last - r.first) / (r.tokens - 1) for r in results if r.first is not None and r.tokens > 1]
    return {"tok_s": tokens / wall, "tokens": tokens, "requests": len(results), "wall_s": wall,
            "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
            "tpot_p50_ms": 1e3 * percentile(tpot, 50), "tpot_p99_ms": 1e3 * percentile(tpot, 99),
            "tokens_per_chunk": tokens / max(sum(r.chunks for r in results), 1),
            "short": sum(r.tokens != r.asked for r in results)}


async def warm_up(server: Server, workloads: list[tuple[list[Request], int]]) -> None:
    """Untimed: each (requests, clients) once, so the timed runs meet no first use (jaxformer compiles a shape
    bucket on its first use unless its server warmed up at start; transformers allocates on its first calls)."""
    for requests, clients in workloads:
        await run_level(server, requests, clients, None, 0)


# ---------------------------------------------------------------------------------------------- sequential


def sequential_generate(folder: Path, requests: list[Request]) -> dict:
    """Our ``generate``, one request at a time: each shape compiled ahead (not timed), then run."""
    import numpy as np

    import jaxformer as jf
    from jaxformer import generate as gen

    model = jf.from_pretrained(folder)
    compiled = []
    compile_s = time.perf_counter()
    for request in requests:
        ids = np.asarray([request.prompt_ids])
        call_args, gc = gen.prepare(model, ids, max_new_tokens=request.max_tokens)
        compiled.append((ids, call_args, gc, gen.generate_tokens_jit.lower(*call_args, config=gc).compile()))
    compile_s = time.perf_counter() - compile_s
    tokens, start = 0, time.perf_counter()
    for ids, call_args, gc, program in compiled:
        out = gen.assemble(model, ids, *program(*call_args[1:]), gc)
        tokens += out.shape[1] - ids.shape[1]
    wall = time.perf_counter() - start
    return {"tok_s": tokens / wall, "tokens": tokens, "requests": len(requests), "wall_s": wall,
            "compile_s": compile_s}


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model and a few requests: a smoke run")
    parser.add_argument("--levels", help="concurrent clients, comma-separated (default 1,8,32; quick: 1,4)")
    parser.add_argument("--per-client", type=int, default=3, help="requests a level sends per client (at least 8)")
    parser.add_argument("--rate", type=float, help="Poisson arrivals at this many requests/s (default: closed loop)")
    parser.add_argument("--sequential", type=int, default=16, help="requests timed through sequential generate")
    parser.add_argument("--jaxformer-args", default="", help="more flags for jaxformer serve")
    parser.add_argument("--transformers-args", default="", help="more flags for transformers serve")
    parser.add_argument("--warm-up", choices=("levels", "top", "none"), default="levels",
                        help="untimed runs first: every level's workload (default), the top level's only, or none")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (checkpoint, server logs)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    levels = [int(c) for c in (args.levels or ("1,4" if args.quick else "1,8,32")).split(",")]
    prompt_range, output_range = ((8, 48), (4, 16)) if args.quick else ((16, 256), (16, 128))
    per_level = {c: max(8, args.per_client * c) for c in levels}
    sequential = 2 if args.quick else args.sequential
    # quick: the warm-up pass below compiles what the runs meet, sooner than the server's compiling every program
    jaxformer_extra = args.jaxformer_args.split() + (["--no-warm-up"] if args.quick else [])

    work = Path(tempfile.mkdtemp(prefix="jaxformer-serve-bench-"))
    folder = work / "gpt2"
    start = time.perf_counter()
    tokenizer, corpus, n_positions = make_checkpoint(folder, args.quick)
    # each level its own requests, the warm-up others again: no prompt meets a prefix cache filled by an earlier run
    drawn = draw_requests(tokenizer, corpus, 2 * sum(per_level.values()), prompt_range, output_range)
    workload, warm_workload = {}, {}
    for c in levels:
        workload[c], drawn = drawn[:per_level[c]], drawn[per_level[c]:]
        warm_workload[c], drawn = drawn[:per_level[c]], drawn[per_level[c]:]
    requests = [r for c in levels for r in workload[c]]
    made_s = time.perf_counter() - start
    servers = []
    try:
        servers.append(start_jaxformer(folder, work, max(levels), jaxformer_extra))
        # jaxformer's default pool: every sequence at its longest
        pool_tokens = max(levels) * n_positions
        servers.append(start_transformers(folder, work, pool_tokens, args.transformers_args.split()))
        starts = {}
        for server, find in ((servers[0], jaxformer_url), (servers[1], transformers_url(servers[1].command))):
            began = time.perf_counter()
            server.wait_ready(find)
            starts[server.name] = time.perf_counter() - began
        warm = {"levels": [(warm_workload[c], c) for c in levels],
                "top": [(warm_workload[max(levels)], max(levels))], "none": []}[args.warm_up]
        for server in servers:
            began = time.perf_counter()
            asyncio.run(warm_up(server, warm))
            starts[server.name + " warm-up"] = time.perf_counter() - began
        table: dict[str, dict[int, dict]] = {server.name: {} for server in servers}
        idle_cpu: dict[str, float] = {server.name: 0.0 for server in servers}
        compiled: dict[int, int] = {}  # jaxformer's programs compiled during each timed level (0: steady state)
        waste_samples = []
        for turn, clients in enumerate(levels):
            order = servers if turn % 2 == 0 else servers[::-1]
            for server in order:
                other = servers[1] if server is servers[0] else servers[0]
                sampler = waste_sampler(server) \
                    if server is servers[0] and clients == max(levels) else None
                other_cpu = other.cpu_seconds()
                programs = scrape(server.base_url)["jaxformer_programs_compiled_total"] if server is servers[0] else 0
                results, wall, samples = asyncio.run(run_level(server, workload[clients], clients,
                                                               args.rate, clients, sampler))
                idle_cpu[other.name] += other.cpu_seconds() - other_cpu
                if server is servers[0]:
                    compiled[clients] = int(scrape(server.base_url)["jaxformer_programs_compiled_total"] - programs)
                table[server.name][clients] = summarize(results, wall)
                waste_samples += samples
    except BaseException:
        for server in servers:
            print(f"--- {server.name}'s output, last lines:\n{server.tail()}", file=sys.stderr)
        print(f"(the checkpoint and the servers' whole output are kept in {work})", file=sys.stderr)
        raise
    finally:
        for server in servers:
            server.stop()
    seq = sequential_generate(folder, workload[max(levels)][:sequential])
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    report(args, levels, per_level, table, seq, waste_samples, idle_cpu, starts, made_s, requests, work, compiled)


def report(args, levels, per_level, table, seq, waste_samples, idle_cpu, starts, made_s, requests, work,
           compiled) -> None:
    ours, theirs = "jaxformer serve", "transformers serve"
    top = max(levels)
    slots = sum(s[0] for s in waste_samples)
    waste = (slots - sum(s[1] for s in waste_samples)) / slots if slots else None
    result = {
        "levels": {str(c): {name: {k: round(v, 2) if isinstance(v, float) else v for k, v in table[name][c].items()}
                            for name in table} for c in levels},
        "ratio_vs_transformers": {str(c): round(table[ours][c]["tok_s"] / table[theirs][c]["tok_s"], 3)
                                  for c in levels},
        "sequential_generate": {k: round(v, 2) if isinstance(v, float) else v for k, v in seq.items()},
        "ratio_vs_sequential_at_top": round(table[ours][top]["tok_s"] / seq["tok_s"], 3),
        "paging_waste": None if waste is None else round(waste, 4),
        "paging_waste_samples": len(waste_samples),
        "idle_server_cpu_s": {k: round(v, 2) for k, v in idle_cpu.items()},
        "jaxformer_programs_compiled_in_timed_runs": {str(c): n for c, n in compiled.items()},
        "start_s": {k: round(v, 1) for k, v in starts.items()}, "checkpoint_s": round(made_s, 1),
    }
    if args.json:
        print(json.dumps(result))
        return
    prompts = [len(r.prompt_ids) for r in requests]
    print(f"gpt2{' (quick: 2 x 64)' if args.quick else ' 124M'} random weights, float32, CPU; "
          f"{'closed loop' if not args.rate else f'Poisson arrivals at {args.rate}/s'}; prompts "
          f"{min(prompts)}..{max(prompts)} tokens (mean {statistics.mean(prompts):.0f}), new tokens "
          f"{min(r.max_tokens for r in requests)}..{max(r.max_tokens for r in requests)}, greedy")
    print(f"{'clients':>7} {'server':<19} {'requests':>8} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} "
          f"{'TPOT p50':>9} {'p99':>8} {'tok/chunk':>9} {'short':>5}")
    for c in levels:
        for name in (ours, theirs):
            row = table[name][c]
            print(f"{c:>7} {name:<19} {per_level[c]:>8} {row['tok_s']:>8.1f} {row['ttft_p50_ms']:>7.0f}ms "
                  f"{row['ttft_p99_ms']:>6.0f}ms {row['tpot_p50_ms']:>7.1f}ms {row['tpot_p99_ms']:>6.1f}ms "
                  f"{row['tokens_per_chunk']:>9.2f} {row['short']:>5}")
        print(f"{'':>7} ratio jaxformer / transformers serve: {result['ratio_vs_transformers'][str(c)]:.2f}x")
    print(f"sequential generate ({seq['requests']} of the requests, one at a time, compiled ahead in "
          f"{seq['compile_s']:.0f} s): {seq['tok_s']:.1f} tok/s; jaxformer serve at {top} clients / it: "
          f"{result['ratio_vs_sequential_at_top']:.2f}x")
    if waste is None:
        print("paging waste: no sample (the run ended before /metrics showed a block used)")
    else:
        print(f"paging waste at {top} clients: {100 * waste:.1f}% of the used blocks' slots hold no token "
              f"({len(waste_samples)} samples of /metrics: jaxformer_kv_tokens against kv_blocks_used x block size)")
    print("idle server's CPU while the other ran: " + ", ".join(f"{k} {v:.1f} s" for k, v in idle_cpu.items()))
    print("jaxformer serve's programs compiled during the timed runs (0: none stalled them): "
          + ", ".join(f"{n} at {c} clients" for c, n in compiled.items()))
    print("start (ready) and warm-up seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in starts.items())
          + f"; checkpoint made in {made_s:.0f} s" + (f"; kept in {work}" if args.keep else ""))
    print("short: requests whose server-counted tokens differ from max_tokens (should be 0: no EOS); tok/chunk: "
          "tokens a text chunk carried on average (above 1: tokens arrive in bursts, and TPOT reads low)")
    if args.quick:
        print("(--quick is a smoke run: jaxformer serve starts without its warm-up there, so shapes the warm-up "
              "pass missed compile inside the timed runs; these are not measurements)")


if __name__ == "__main__":
    main()
