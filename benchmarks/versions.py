"""Two versions of jaxformer side by side: a train step's and a decode's time, and the HLO ops each lowers to.

For a refactor that must change nothing (issue 48's config and layer-plan redesign): the working tree against
an earlier commit, exported with ``git archive`` into a temporary folder. Each measurement runs in its own
subprocess that imports jaxformer from one of the two trees, and the two trees take turns (before, after,
before, after, ...), so a slower stretch of a shared machine falls on both. Reported per case: the median time
of each side, their ratio (after / before: below 1 is faster), and the number of HLO operations its jitted
function lowers to (StableHLO, before optimisation; equal or fewer is the constraint).

Cases (tiny-preset families at the benchmark shapes of ``benchmarks/train.py``: 6 layers, d_model 512, batch 8,
sequence 256; decode: batch 1, prompt 32, 64 new tokens, greedy):
    train_llama, train_deepseek, train_gemma3, decode_llama, decode_deepseek, decode_gemma3

    python benchmarks/versions.py --before 3cb94c0 [--rounds 3] [--only train_llama,decode_llama] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = dict(d_model=512, num_heads=8, d_ff=1408, decoder_layers=6, vocab_size=8192, max_positions=512)
CASES = {
    "train_llama": ("tiny-llama", dict(SHAPE, num_kv_heads=2)),
    "train_deepseek": ("tiny-deepseek", dict(d_model=256, decoder_layers=4, vocab_size=8192, max_positions=512)),
    "train_gemma3": ("tiny-gemma3", dict(vocab_size=8192, max_positions=512)),
    "decode_llama": ("tiny-llama", dict(SHAPE, num_kv_heads=2)),
    "decode_deepseek": ("tiny-deepseek", dict(d_model=256, decoder_layers=4, vocab_size=8192, max_positions=512)),
    "decode_gemma3": ("tiny-gemma3", dict(vocab_size=8192, max_positions=512)),
}


def _hlo_ops(lowered) -> int:
    """Operations in a lowered function's StableHLO text (one per line that assigns a value)."""
    return sum(1 for line in lowered.as_text().splitlines() if " = " in line and not line.lstrip().startswith("//"))


def _train(preset: str, changes: dict, steps: int) -> dict:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    import jaxformer as jf

    model = jf.build(jf.config(preset).replace(**changes), seed=0)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer = optax.adamw(1e-4)
    opt_state = optimizer.init(params)
    ids = jax.random.randint(jax.random.key(0), (8, 257), 0, model.config.vocab_size)

    def loss_fn(params, ids):
        logits = nnx.merge(graphdef, params, rest)(ids[:, :-1]).logits.astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]).mean()

    def step(params, opt_state, ids):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jitted = jax.jit(step, donate_argnums=(0, 1))
    ops = _hlo_ops(jitted.lower(params, opt_state, ids))
    times = []
    for i in range(steps + 2):  # two warm-up steps (the first compiles)
        start = time.perf_counter()
        params, opt_state, loss = jitted(params, opt_state, ids)
        loss.block_until_ready()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "hlo_ops": ops}


def _decode(preset: str, changes: dict, steps: int) -> dict:
    import numpy as np

    import jaxformer as jf
    from jaxformer import generate as generation

    model = jf.build(jf.config(preset).replace(**changes), seed=0)
    ids = np.random.default_rng(0).integers(3, model.config.vocab_size, (1, 32))
    args, gc = generation.prepare(model, ids, None, max_new_tokens=64, do_sample=False, eos_token_id=None)
    ops = _hlo_ops(generation.generate_tokens_jit.lower(*args, config=gc))
    times = []
    for i in range(steps + 1):  # one warm-up call (it compiles)
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=64, do_sample=False, eos_token_id=None)
        if i >= 1:
            times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "hlo_ops": ops}


def measure(case: str, steps: int) -> dict:
    preset, changes = CASES[case]
    return (_train if case.startswith("train") else _decode)(preset, changes, steps)


def _run(tree: Path, case: str, steps: int) -> dict:
    code = (f"import sys; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(ROOT / 'benchmarks')!r});"
            f"import json, versions; print(json.dumps(versions.measure({case!r}, {steps})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the commit to compare the working tree against")
    parser.add_argument("--rounds", type=int, default=3, help="subprocesses per side and case, taken in turns")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (or decodes) per subprocess")
    parser.add_argument("--only", default=",".join(CASES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = args.only.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; valid: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        before.mkdir()
        archive = subprocess.run(["git", "archive", args.before, "jaxformer"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        results = {}
        for case in cases:
            runs = {"before": [], "after": []}
            for _ in range(args.rounds):
                for side, tree in (("before", before), ("after", ROOT)):
                    runs[side].append(_run(tree, case, args.steps))
            sides = {side: {"seconds": statistics.median(r["seconds"] for r in rs), "hlo_ops": rs[0]["hlo_ops"]}
                     for side, rs in runs.items()}
            sides["ratio"] = sides["after"]["seconds"] / sides["before"]["seconds"]
            results[case] = sides
            if not args.json:
                b, a = sides["before"], sides["after"]
                print(f"{case:16s} before {b['seconds'] * 1e3:8.1f} ms  after {a['seconds'] * 1e3:8.1f} ms  "
                      f"after/before {sides['ratio']:.3f}   HLO ops {b['hlo_ops']} -> {a['hlo_ops']}", flush=True)
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
