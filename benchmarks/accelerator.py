"""Accelerator performance in one command: training MFU and tokens/s of four model shapes, and decoding
against the memory-bandwidth bound; sized to finish in under 8 minutes on one GPU or TPU host.

Training: bf16 compute, float32 master parameters and AdamW state, scanned layers, the train state
donated, ``attention_backend="auto"`` (cuDNN flash attention on NVIDIA GPUs, Pallas splash on TPUs),
dropout off; cross-entropy against random labels on random tokens.

  model        shape                                                          rows/device  remat
  gpt2-medium  GPT-2 medium, 355M, sequence 1024                              16           none
  llama-1b     Llama-3.2-1B: d_model 2048, 16 layers, 32 heads, 8 kv heads,   8            dots
               d_ff 8192, vocab 128256, tied embeddings, rope theta 500000;
               sequence 1024
  bert-large   BERT-large with its MLM head (logits at every position), 335M,  32           none
               sequence 512
  t5-large     T5-large (v1.0), 738M: source 512 tokens, target 128 tokens     32           none

Batches and remat policies are per device, chosen to fit an 80 GB H100. The script lets JAX take 90% of
the device memory (XLA_PYTHON_CLIENT_MEM_FRACTION, unless set), 67 GiB. Estimates from the compiler's
buffer plan of each step (compiled for the CPU, attention keeping only its inputs as a flash kernel
does): gpt2-medium 38 GiB, bert-large 37 GiB, t5-large 46 GiB without remat; the 1B shape, with 14 GiB
of float32 parameters and AdamW moments and 128256-way logits, needs 55 GiB without remat and 40 GiB
when it saves only matmul outputs ("dots": the backward pass recomputes the elementwise ops and the
fused attention's forward, a few percent of the step's FLOPs). ``--remat`` and ``--batch`` override them (a 16 GB TPU v5e chip needs
smaller batches). With several local devices the batch is split over an FSDP mesh of all of them
(parameters and optimizer state too): the global batch is rows/device x devices, and MFU is against
their summed peak.

MFU = model FLOPs of a step (``jaxformer.flops.train_flops_per_step``: 6 x parameters a token passes
through, plus attention with causal counted as half; remat's recomputation not counted) / step time /
peak FLOP/s. The peak is the bf16 datasheet figure on accelerators; on a CPU it is the measured float32
matmul peak (CPUs run bf16 matmuls slower, so float32 is their real ceiling). T5's tokens/s counts
source and target tokens. Step time is the mean of ``--steps`` back-to-back steps after warm-up;
compile time is the ahead-of-time ``lower().compile()`` of the step.

Decoding: the 1B shape with bf16 weights, greedy, random weights (no EOS, so every token is made),
prompt 64, 256 new tokens, batch 1 and 64, on one device. tokens/s = new tokens / time of the compiled
generate call (its one prefill of the prompt included, compile excluded). The bandwidth fraction is the
time the bytes that call must read would take at peak bandwidth (every step reads the weights once and
the KV cache at its current length: ``jaxformer.flops.decode_bytes_per_step``), over the measured time;
1.0 is the memory bound.

``--small`` runs scaled-down shapes (2 layers, d_model 128-256, sequence 128) in seconds on a CPU;
CI runs it. A figure that was not measured (no datasheet for the chip) prints as n/a.

    python benchmarks/accelerator.py [--small] [--json] [--only gpt2-medium,llama-1b,bert-large,t5-large,decode]
                                     [--steps 20] [--remat POLICY] [--batch ROWS_PER_DEVICE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")  # before jax starts: see the memory notes above

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxformer as jf
from jaxformer import flops, sharding
from jaxformer import generate as gen
from jaxformer.model_config import REMAT_POLICIES

TRAIN_NUMERICS = dict(dtype="bfloat16", param_dtype="float32", scan_layers=True, attention_backend="auto",
                      dropout_rate=0.0, attention_dropout_rate=0.0)
DECODE_PROMPT, DECODE_NEW_TOKENS, DECODE_BATCHES = 64, 256, (1, 64)
SMALL_DECODE_PROMPT, SMALL_DECODE_NEW_TOKENS = 16, 32


@dataclasses.dataclass(frozen=True)
class Workload:
    cfg: jf.ModelConfig
    batch: int  # rows per device
    length: int  # tokens per row; the source side of an encoder-decoder
    remat: str
    target: int = 0  # decoder tokens per row of an encoder-decoder


def llama_1b() -> jf.ModelConfig:
    return jf.config("llama-3-8b").replace(name="llama-3.2-1b-shape", d_model=2048, decoder_layers=16,
                                          num_heads=32, num_kv_heads=8, d_ff=8192, tie_embeddings=True,
                                          rope_theta=500000.0)


def small_llama() -> jf.ModelConfig:
    return llama_1b().replace(d_model=256, num_heads=8, num_kv_heads=2, d_ff=512, decoder_layers=2, vocab_size=8192)


def workloads(small: bool) -> dict[str, Workload]:
    if not small:
        return {
            "gpt2-medium": Workload(jf.config("gpt2-medium"), 16, 1024, "none"),
            "llama-1b": Workload(llama_1b(), 8, 1024, "dots"),
            "bert-large": Workload(jf.config("bert-large-uncased").replace(head="mlm", pooler=False), 32, 512, "none"),
            "t5-large": Workload(jf.config("t5-large"), 32, 512, "none", target=128),
        }
    tiny = dict(d_model=128, num_heads=4, d_ff=512, vocab_size=4096)
    return {
        "gpt2-medium": Workload(jf.config("gpt2-medium").replace(decoder_layers=2, max_positions=128, **tiny),
                                4, 128, "none"),
        "llama-1b": Workload(small_llama(), 4, 128, "none"),
        "bert-large": Workload(jf.config("bert-large-uncased").replace(
            head="mlm", pooler=False, encoder_layers=2, max_positions=128, **tiny), 4, 128, "none"),
        "t5-large": Workload(jf.config("t5-large").replace(encoder_layers=2, decoder_layers=2, head_dim=32, **tiny),
                             4, 128, "none", target=32),
    }


STARTED = time.perf_counter()


def note(message: str) -> None:
    """Progress on stderr, so stdout stays the table (or the JSON)."""
    print(f"[{time.perf_counter() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# Training


def make_train_step(graphdef, rest, optimizer, family: str):
    def loss_fn(params, batch):
        model = nnx.merge(graphdef, params, rest)
        if family == "encoder_decoder":
            logits = model(batch["inputs"], decoder_input_ids=batch["decoder_inputs"]).logits
        else:
            logits = model(batch["inputs"]).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["labels"]).mean()

    def train_step(state, batch):
        params, opt_state = state
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    return train_step


def random_batch(work: Workload, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    vocab = work.cfg.vocab_size
    batch = {"inputs": rng.integers(0, vocab, (rows, work.length), dtype=np.int32)}
    label_length = work.target or work.length
    if work.target:
        batch["decoder_inputs"] = rng.integers(0, vocab, (rows, work.target), dtype=np.int32)
    batch["labels"] = rng.integers(0, vocab, (rows, label_length), dtype=np.int32)
    return batch


def bench_train(work: Workload, steps: int, warmup: int, peak: float) -> dict:
    cfg = work.cfg.replace(remat=work.remat, **TRAIN_NUMERICS)
    mesh = sharding.make_mesh({"fsdp": -1})
    rows = work.batch * mesh.size
    model = sharding.sharded_build(lambda: jf.build(cfg), mesh)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    del model
    optimizer = optax.adamw(1e-4, weight_decay=0.01)
    replicated = NamedSharding(mesh, P())
    state = (params, sharding.sharded_optimizer_state(optimizer, params))  # FSDP splits the moments too
    state_shardings = sharding.shardings_of(state)
    rows_sharding = NamedSharding(mesh, P(sharding.BATCH_AXES))
    batch = jax.device_put(random_batch(work, rows), rows_sharding)

    train_step = make_train_step(graphdef, rest, optimizer, cfg.family)
    step = jax.jit(sharding.under_mesh(train_step, mesh), donate_argnums=0, in_shardings=(state_shardings, rows_sharding),
                   out_shardings=(state_shardings, replicated))
    note(f"  compiling ({rows} x {work.length}{f' + {work.target}' if work.target else ''}, remat {work.remat})")
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    note(f"  compiled in {compile_s:.1f}s; {warmup} warm-up + {steps} timed steps")
    for _ in range(warmup):
        state, loss = compiled(state, batch)
    loss.block_until_ready()
    start = time.perf_counter()
    for _ in range(steps):  # back to back, one sync at the end: the host never stalls the device
        state, loss = compiled(state, batch)
    loss = float(loss)
    step_s = (time.perf_counter() - start) / steps
    if not math.isfinite(loss):
        raise FloatingPointError(f"the loss is {loss}")
    step_flops = flops.train_flops_per_step(cfg, rows, work.length, work.target or None)
    peak_dtype = "float32" if jax.default_backend() == "cpu" else "bfloat16"  # as main() chose it
    mfu = flops.utilization(step_flops / step_s, peak_dtype) if math.isfinite(peak) else None
    return {"params": jf.param_count(cfg), "batch": rows, "length": work.length, "target_length": work.target,
            "remat": work.remat, "step_s": step_s, "tokens_per_s": rows * (work.length + work.target) / step_s,
            "flops_per_step": step_flops, "mfu": mfu, "compile_s": compile_s, "loss": loss}


# --------------------------------------------------------------------------------------------------
# Decoding


def bench_decode(cfg: jf.ModelConfig, prompt: int, new_tokens: int, bandwidth: float, repeats: int = 3) -> list[dict]:
    cfg = cfg.replace(dtype="bfloat16", param_dtype="bfloat16", eos_token_id=None)
    # On one device, as decoding reads the weights from one chip's memory; built under jit, which on a
    # CPU takes a fraction of an eager build's time.
    one_device = sharding.make_mesh({"fsdp": 1}, devices=jax.local_devices()[:1])
    model = sharding.sharded_build(lambda: jf.build(cfg), one_device)
    rows = []
    for batch in DECODE_BATCHES:
        ids = np.random.default_rng(batch).integers(0, cfg.vocab_size, (batch, prompt))
        args, gc = gen.prepare(model, ids, max_new_tokens=new_tokens)
        note(f"  decode batch {batch}: compiling")
        start = time.perf_counter()
        compiled = gen.generate_tokens_jit.lower(*args, config=gc).compile()
        compile_s = time.perf_counter() - start

        def run():
            tokens, steps, _ = compiled(*args[1:])  # the graphdef is static, compiled in
            return int(steps)

        note(f"  decode batch {batch}: compiled in {compile_s:.1f}s; 1 warm-up + {repeats} timed runs")
        made = run()
        if made != new_tokens:
            raise RuntimeError(f"decoding stopped after {made} of {new_tokens} tokens")
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        # The prefill reads the weights once at the prompt's length, then each step one token longer.
        must_read = sum(flops.decode_bytes_per_step(cfg, batch, prompt + i) for i in range(new_tokens))
        fraction = must_read / bandwidth / seconds if math.isfinite(bandwidth) else None
        rows.append({"model": "llama-1b", "batch": batch, "prompt": prompt, "new_tokens": new_tokens,
                     "repeats": repeats, "tokens_per_s": batch * new_tokens / seconds, "seconds": seconds,
                     "bytes_per_step": must_read / new_tokens, "bandwidth_fraction": fraction,
                     "compile_s": compile_s})
    return rows


# --------------------------------------------------------------------------------------------------
# Report


def machine(peak: tuple[float, str], peak_dtype: str, bandwidth: tuple[float, str]) -> dict:
    device = jax.local_devices()[0]
    return {"device_kind": device.device_kind, "platform": device.platform, "device_count": jax.local_device_count(),
            "jax": jax.__version__, "peak_flops": peak[0] if math.isfinite(peak[0]) else None,
            "peak_dtype": peak_dtype, "peak_source": peak[1],
            "bandwidth_bytes_per_s": bandwidth[0] if math.isfinite(bandwidth[0]) else None,
            "bandwidth_source": bandwidth[1]}


def _or_na(value, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def print_table(result: dict, steps: int) -> None:
    m = result["machine"]
    print(f"machine: {m['device_kind']} x {m['device_count']} ({m['platform']}), jax {m['jax']}")
    peak, bandwidth = m["peak_flops"], m["bandwidth_bytes_per_s"]
    print(f"peak: {_or_na(peak and peak / 1e12, '.3g')} TFLOP/s {m['peak_dtype']} ({m['peak_source']})")
    print(f"memory bandwidth: {_or_na(bandwidth and bandwidth / 1e9, '.3g')} GB/s per device ({m['bandwidth_source']})")
    if result["train"]:
        print(f"\ntraining: bf16 compute, float32 params + AdamW, scanned, donated, attention auto; "
              f"mean of {steps} steps; MFU against the {m['peak_dtype']} peak")
        print(f"{'model':<12} {'params':>8} {'rows x tokens':>15} {'remat':>6} {'tokens/s':>10} {'MFU':>6} "
              f"{'compile':>8}")
        for name, r in result["train"].items():
            if "error" in r:
                print(f"{name:<12} failed: {r['error']}")
                continue
            shape = f"{r['batch']} x {r['length']}" + (f"+{r['target_length']}" if r["target_length"] else "")
            print(f"{name:<12} {r['params'] / 1e6:>7.0f}M {shape:>15} {r['remat']:>6} {r['tokens_per_s']:>10.0f} "
                  f"{_or_na(r['mfu'], '>6.1%')} {r['compile_s']:>7.1f}s")
    if result["decode"]:
        first = result["decode"][0]
        print(f"\ndecoding: llama-1b shape, bf16 weights, greedy, prompt {first['prompt']}, {first['new_tokens']} new "
              f"tokens, median of {first.get('repeats', 3)}, compile excluded")
        print(f"{'batch':>5} {'tokens/s':>10} {'ms/step':>8} {'of bandwidth bound':>19} {'compile':>8}")
        for r in result["decode"]:
            if "error" in r:
                print(f"{r['batch']:>5} failed: {r['error']}")
                continue
            print(f"{r['batch']:>5} {r['tokens_per_s']:>10.1f} {1e3 * r['seconds'] / r['new_tokens']:>8.2f} "
                  f"{_or_na(r['bandwidth_fraction'], '>19.1%')} {r['compile_s']:>7.1f}s")


def _failure(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="scaled-down shapes that run in seconds on a CPU")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", default="gpt2-medium,llama-1b,bert-large,t5-large,decode")
    parser.add_argument("--steps", type=int, default=None, help="timed train steps (default 20; 2 with --small)")
    parser.add_argument("--remat", choices=REMAT_POLICIES, default=None,
                        help="remat policy for every model (default: per model, see above)")
    parser.add_argument("--batch", type=int, default=None, help="rows per device for every model")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    # Random weights from the rbg generator: their init compiles in half threefry's time (it is most of
    # a --small run's set-up), and no figure here depends on the values.
    jax.config.update("jax_default_prng_impl", "rbg")

    chosen = args.only.split(",")
    table = workloads(args.small)
    unknown = set(chosen) - set(table) - {"decode"}
    if unknown:
        parser.error(f"--only: unknown {sorted(unknown)}; valid: {', '.join([*table, 'decode'])}")
    steps = args.steps or (2 if args.small else 20)
    warmup = 1 if args.small else 2

    # On a CPU bf16 matmuls run slower than float32 ones, so float32 is the CPU's real ceiling.
    peak_dtype = "float32" if jax.default_backend() == "cpu" else "bfloat16"
    note("peak FLOP/s and memory bandwidth")
    peak, bandwidth = flops.peak_flops(peak_dtype), flops.peak_bandwidth()
    result = {"machine": machine(peak, peak_dtype, bandwidth), "small": args.small, "steps": steps,
              "train": {}, "decode": []}

    for name in [n for n in chosen if n in table]:
        work = table[name]
        work = dataclasses.replace(work, remat=args.remat or work.remat, batch=args.batch or work.batch)
        note(f"train {name}")
        try:
            result["train"][name] = bench_train(work, steps, warmup, peak[0])
        except Exception as err:  # one model out of memory must not cost the others' figures
            result["train"][name] = {"error": _failure(err)}
            note(f"  failed: {result['train'][name]['error']}")
    if "decode" in chosen:
        note("decode llama-1b")
        prompt, new = (SMALL_DECODE_PROMPT, SMALL_DECODE_NEW_TOKENS) if args.small else (DECODE_PROMPT, DECODE_NEW_TOKENS)
        try:
            result["decode"] = bench_decode(small_llama() if args.small else llama_1b(), prompt, new, bandwidth[0])
        except Exception as err:
            result["decode"] = [{"model": "llama-1b", "batch": b, "error": _failure(err)} for b in DECODE_BATCHES]
            note(f"  failed: {result['decode'][0]['error']}")
    note("done")
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result, steps)


if __name__ == "__main__":
    main()
