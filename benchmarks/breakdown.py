"""Where a step's time goes: the phases of one training step against PyTorch, and XLA's own per-op
profile of a training step and of a decode step, grouped into what they do.

``train`` (default shape ``llama``, any key of ``benchmarks/train.py``): the jitted forward pass (loss
only), forward + backward (``jax.value_and_grad``), the AdamW update alone and the whole donated step,
each against its PyTorch counterpart (forward under ``no_grad``, forward + ``backward()``,
``optimizer.step()``, the whole step), timed interleaved so both sides see the same machine load; the
backward pass is the difference of the medians. Then one profiled step (``jax.profiler``), its XLA ops
grouped by kind: matmuls, attention's softmax and masks, the norms and activations, layout copies
(transposes XLA makes before a matmul), ``lax.scan`` bookkeeping (zero-filled stacked buffers, per-layer
slices and writes), the loss and the optimizer.

``decode``: gpt2 (124M, random weights) greedy decoding of 128 tokens at batch 1 after a 32-token prompt,
one profiled run of the compiled loop, its per-step op time grouped by which weights or arrays each op
reads: attention projections, MLP, LM head, the KV cache, everything else.

Profiled times are the sum of the recorded op durations on XLA's threads (an op that runs on both cores
counts the wall time of the thread that recorded it, so shares are what to read, not the absolute sum).

    python benchmarks/breakdown.py [train|decode] [--shape llama] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import re
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

def train_op_kind(name: str, shape: str, origin: str, vocab: int) -> str:
    """What one XLA op of a training step does, from its name, result shape and source operation."""
    if "jvp(" not in origin:
        return "optimizer (AdamW)"
    if name.startswith(("ynn_fusion", "dot")) and "reduce_sum" not in origin:
        return "matmuls"
    if "dynamic-update-slice" in name or "dynamic-slice" in name or name.startswith("wrapped_broadcast"):
        return "scan bookkeeping"
    if name.startswith(("copy", "transpose")):
        return "layout copies"
    if f",{vocab}]" in shape or f"[{vocab}," in shape:
        return "loss (softmax over the vocabulary)"
    if any(k in origin for k in ("exp", "_where", "select_n", "reduce_max")) or "reduce_sum" in origin:
        return "attention softmax and mask"
    return "norms, activations, residuals"


def _profile_ops(run) -> collections.Counter:
    """Recorded nanoseconds per XLA op name over one ``run()``."""
    import jax

    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            run()
        data = jax.profiler.ProfileData.from_file(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0])
    per_op = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            if "XLAEigen" not in line.name:  # XLA's compute threads
                continue
            for event in line.events:
                if not event.name.startswith(("ThunkExecutor", "SlinkyThreadPool", "while", "end:")):
                    per_op[event.name] += event.duration_ns
    return per_op


def _op_info(hlo_text: str) -> dict[str, tuple[str, str]]:
    """HLO instruction name -> (its result shape, the JAX operation it came from)."""
    info = {}
    for m in re.finditer(r"^\s+%?([\w.\-]+) = (\S+) (.*)$", hlo_text, re.M):
        origin = re.search(r'op_name="([^"]*)"', m.group(3))
        info[m.group(1)] = (m.group(2).split("{")[0], origin.group(1) if origin else "")
    return info


def _median_ms(times: list[float]) -> float:
    return round(1e3 * statistics.median(times), 1)


def train_breakdown(shape: str, repeats: int) -> dict:
    import jax
    import numpy as np
    import optax
    import torch
    import transformers
    from flax import nnx

    import jaxformer as jf
    sys.path.insert(0, str(Path(__file__).parent))
    from train import jaxformer_step, torch_step, workloads

    transformers.logging.set_verbosity_error()
    cfg, make_torch, batch, tokens = workloads(jf, transformers, np.random.default_rng(0))[shape]
    if "tokens" not in batch or shape == "bert":
        raise SystemExit("breakdown.py train covers the causal-LM shapes (gpt, gpt_deep, llama)")
    jax_batch = {k: jax.numpy.asarray(v) for k, v in batch.items()}
    step, state, _, _ = jaxformer_step(cfg, shape, batch, jax, jax.numpy, optax, nnx, jf)
    model = jf.build(cfg)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    ids = jax_batch["tokens"]

    def loss_fn(params):
        logits = nnx.merge(graphdef, params, rest)(ids[:, :-1]).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]).mean()

    forward, forward_backward = jax.jit(loss_fn), jax.jit(jax.value_and_grad(loss_fn))
    optimizer = optax.adamw(1e-4, weight_decay=0.01)
    update = jax.jit(lambda grads, opt_state, params: optimizer.update(grads, opt_state, params))
    grads, opt_state = forward_backward(params)[1], optimizer.init(params)

    reference = make_torch().train()
    torch_ids = torch.as_tensor(batch["tokens"])
    torch_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-4, weight_decay=0.01)
    loss = torch.nn.CrossEntropyLoss()

    def torch_loss():
        return loss(reference(input_ids=torch_ids[:, :-1]).logits.flatten(0, 1), torch_ids[:, 1:].flatten())

    def torch_forward():
        with torch.no_grad():
            torch_loss()

    def torch_backward():
        torch_loss().backward()

    def torch_update():
        torch_optimizer.step()

    torch_whole = torch_step(reference, shape, {k: torch.as_tensor(v) for k, v in batch.items()}, torch)
    holder = {"state": state}

    def whole_step():
        holder["state"], value = step(holder["state"], jax_batch)
        value.block_until_ready()

    phases = {
        "forward": (lambda: forward(params).block_until_ready(), torch_forward),
        "forward + backward": (lambda: forward_backward(params)[0].block_until_ready(), torch_backward),
        "optimizer": (lambda: jax.block_until_ready(update(grads, opt_state, params)), torch_update),
        "whole step": (whole_step, torch_whole),
    }
    times = {name: ([], []) for name in phases}
    for i in range(repeats + 2):  # two warm-up rounds
        for name, (ours, theirs) in phases.items():
            for side, fn in enumerate((ours, theirs)):
                start = time.perf_counter()
                fn()
                if i >= 2:
                    times[name][side].append(time.perf_counter() - start)
        reference.zero_grad(set_to_none=True)  # the optimizer phase stepped the gradients backward() made
    table = {name: {"jaxformer_ms": _median_ms(a), "torch_ms": _median_ms(b)} for name, (a, b) in times.items()}
    table["backward"] = {side: round(table["forward + backward"][side] - table["forward"][side], 1)
                         for side in ("jaxformer_ms", "torch_ms")}
    for row in table.values():
        row["ratio"] = round(row["torch_ms"] / row["jaxformer_ms"], 3)  # > 1: jaxformer faster

    info = _op_info(step.lower(holder["state"], jax_batch).compile().as_text())
    kinds = collections.Counter()
    for name, ns in _profile_ops(whole_step).items():
        kinds[train_op_kind(name, *info.get(name, ("", "")), cfg.vocab_size)] += ns
    total = sum(kinds.values())
    return {"shape": shape, "tokens": tokens, "phases": table,
            "profile_ms": round(total / 1e6, 1),
            "profile_share": {kind: round(ns / total, 3) for kind, ns in kinds.most_common()}}


def decode_breakdown(new_tokens: int = 128, prompt: int = 32) -> dict:
    import jax
    import numpy as np

    import jaxformer as jf
    from jaxformer import flops
    from jaxformer import generate as gen

    model = jf.build("gpt2", seed=0)
    cfg = model.config
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, prompt))
    call_args, gc = gen.prepare(model, ids, max_new_tokens=new_tokens)
    compiled = gen.generate_tokens_jit.lower(*call_args, config=gc).compile()

    def run():
        jax.block_until_ready(compiled(*call_args[1:]))

    run()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    step_ms = 1e3 * statistics.median(times) / new_tokens
    info = _op_info(compiled.as_text())
    per_op = _profile_ops(run)
    D, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    kinds = collections.Counter()
    for name, ns in per_op.items():
        shape, origin = info.get(name, ("", ""))
        dims = [int(d) for d in re.findall(r"\d+", shape.split("[", 1)[-1])] if "[" in shape else []
        if V in dims:
            kind = "LM head (and the first step's prompt)"
        elif name.startswith(("dot", "ynn")) and F in dims:
            kind = "MLP matmuls"
        elif name.startswith(("dot", "ynn")) and D in dims:
            kind = "attention projections and MLP output"
        elif name.startswith(("dot", "ynn")):
            kind = "attention over the cache"
        elif name.startswith(("copy", "transpose")):
            kind = "layout copies (weights, cache)"
        else:
            kind = "norms, softmax, sampling, cache writes"
        kinds[kind] += ns
    total = sum(kinds.values())
    step_bytes = flops.decode_bytes_per_step(cfg, 1, prompt + new_tokens // 2)
    bandwidth, _ = flops.peak_bandwidth()
    return {"step_ms": round(step_ms, 2), "bound_ms": round(1e3 * step_bytes / bandwidth, 2),
            "bandwidth_fraction": round(step_bytes / bandwidth / (step_ms / 1e3), 3),
            "profile_share": {kind: round(ns / total, 3) for kind, ns in kinds.most_common()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", default="train", choices=("train", "decode"))
    parser.add_argument("--shape", default="llama", help="a causal-LM key of benchmarks/train.py")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    result = train_breakdown(args.shape, args.repeats) if args.what == "train" else decode_breakdown()
    if args.json:
        print(json.dumps(result))
        return
    if args.what == "train":
        print(f"{args.shape} train step, float32, medians of {args.repeats}, interleaved with PyTorch eager")
        print(f"{'phase':<20} {'jaxformer ms':>13} {'torch ms':>9} {'torch/jaxformer':>16}")
        for name, row in result["phases"].items():
            print(f"{name:<20} {row['jaxformer_ms']:>13.1f} {row['torch_ms']:>9.1f} {row['ratio']:>15.2f}x")
    else:
        print(f"gpt2 decode at batch 1: {result['step_ms']:.1f} ms a token; the bandwidth bound is "
              f"{result['bound_ms']:.1f} ms ({result['bandwidth_fraction']:.0%} of it reached)")
    print(f"XLA's profile of one {'step' if args.what == 'train' else 'decode loop'}, share of recorded op time:")
    for kind, share in result["profile_share"].items():
        print(f"  {share:6.1%}  {kind}")


if __name__ == "__main__":
    main()
