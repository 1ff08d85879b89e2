"""Top-k/top-p filtering of a serving batch: ``filter_top_k_top_p`` (decided among each row's likeliest tokens, the
whole row sorted only where they do not decide it) against the whole-row stable sort it replaced, same rows.

32 rows of gpt2's 50,257 logits, shaped three ways: peaked (a nucleus of tens of tokens, decided among the 256
likeliest), wide (about 2,000: among the 4,096 likeliest) and flat (a random model's: the nucleus spans most of the
row, so the whole row is sorted). Each side runs jitted, ``--repeats`` times, alternating (A, B, A, B, ...) so machine load hits both, after
one untimed call each; reports the median milliseconds and their ratio, and checks both keep the same tokens but
for one at a nucleus's edge (the old sort sums the probabilities from the least likely up, the new from the
likeliest down: float32 rounds the two sums apart).

    python benchmarks/sampling.py [--rows 32] [--vocab 50257] [--top-p 0.9] [--repeats 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.generate import filter_top_k_top_p


def whole_row_sort(logits, top_k, top_p):
    """The filter as the engine ran it before: one stable argsort of every row (transformers' ascending order)."""
    B, V = logits.shape
    order = jnp.argsort(logits, axis=-1)
    ascending = jnp.take_along_axis(logits, order, axis=-1)
    kth = jnp.take_along_axis(ascending, jnp.clip(V - top_k, 0, V - 1)[:, None], axis=-1)
    ascending = jnp.where((top_k[:, None] > 0) & (ascending < kth), -jnp.inf, ascending)
    cumulative = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
    remove = (cumulative <= 1.0 - top_p[:, None]).at[:, -1].set(False)
    return jnp.zeros_like(logits).at[jnp.arange(B)[:, None], order].set(jnp.where(remove, -jnp.inf, ascending))


def rows(shape: str, count: int, vocab: int, rng) -> np.ndarray:
    """Logits whose likeliest tokens fall off as a power of their rank (a Zipf-like tail, as language models'
    do), steeply (peaked), gently (wide), or not at all (flat: normal noise of a random model)."""
    if shape == "flat":
        return rng.standard_normal((count, vocab)).astype(np.float32)
    steepness = {"peaked": 1.5, "wide": 1.2}[shape]
    ranks = np.arange(1, vocab + 1)
    out = np.empty((count, vocab), np.float32)
    for row in out:
        row[rng.permutation(vocab)] = -steepness * np.log(ranks) + rng.standard_normal(vocab) * 0.1
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    new, old = jax.jit(filter_top_k_top_p), jax.jit(whole_row_sort)
    top_k = jnp.zeros(args.rows, jnp.int32)
    top_p = jnp.full(args.rows, args.top_p, jnp.float32)
    report = {}
    for shape in ("peaked", "wide", "flat"):
        logits = jnp.asarray(rows(shape, args.rows, args.vocab, rng))
        kept = [np.isfinite(np.asarray(side(logits, top_k, top_p))) for side in (new, old)]
        # (the two sum the nucleus's float32 probabilities in opposite orders: a token at its edge may differ)
        differing = int((kept[0] != kept[1]).sum(axis=-1).max())
        assert differing <= 1, f"{shape}: the two filters keep {differing} different tokens in a row"
        times = {"candidates": [], "sort": []}
        for _ in range(args.repeats):
            for name, side in (("candidates", new), ("sort", old)):
                started = time.perf_counter()
                side(logits, top_k, top_p).block_until_ready()
                times[name].append(time.perf_counter() - started)
        ms = {name: 1e3 * statistics.median(values) for name, values in times.items()}
        nucleus = kept[0].sum(axis=-1)
        report[shape] = {**ms, "speedup": ms["sort"] / ms["candidates"], "most_differing_in_a_row": differing,
                         "nucleus_tokens": [int(nucleus.min()), int(np.median(nucleus)), int(nucleus.max())]}
    if args.json:
        print(json.dumps(report, indent=2))
        return report
    print(f"{args.rows} rows of {args.vocab} logits, top-p {args.top_p}, {jax.default_backend()}, median of "
          f"{args.repeats} interleaved")
    for shape, r in report.items():
        low, mid, high = r["nucleus_tokens"]
        print(f"  {shape:7s} nucleus {low}-{high} tokens (median {mid}): candidates {r['candidates']:7.1f} ms, "
              f"whole-row sort {r['sort']:7.1f} ms: {r['speedup']:.1f}x")
    return report


if __name__ == "__main__":
    main()
