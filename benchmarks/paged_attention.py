"""The serving engine's paged read on CPU: XLA's (gather, then matmuls) against the C++ kernel (``ffi-cpu``), or
the kernel's engine with its packed calls against the same engine without them.

The same engine twice over ``jf.build("gpt2", seed=0)`` (GPT-2's 124M shape, random weights, float32), on two
``--sides``: 'xla' (``paged_attention="xla"``), 'ffi-cpu' (``jaxformer.native``: each slot read once, straight from
the pool; a step's one-token rows and prompt chunks in one packed call, ``Engine._pack``) or 'ffi-cpu-unpacked' (the
kernel, with the prompt chunks in calls of their own as on XLA: ``Engine.packs`` off). Each level is a closed loop
of C clients: greedy requests of random ids, prompts of 17-252 tokens and 16-128 new tokens drawn as
``benchmarks/serve.py`` draws them (``--per-client`` requests a client, each level its own), every token asked for
(no EOS). Both engines are warmed up and run each level once untimed; then the sides take turns (A, B, A, ...)
``--repeats`` times and each side's median is reported, with the ratio B / A and whether the two sides gave the
same tokens (greedy over random weights: a near-tie the two reduction orders round apart would show here, not as a
failure).

    python benchmarks/paged_attention.py [--sides xla ffi-cpu] [--levels 1 8 32] [--per-client 3] [--repeats 3]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

PROMPTS, NEW = (17, 252), (16, 128)
SIDES = {"xla": "xla", "ffi-cpu": "ffi-cpu", "ffi-cpu-unpacked": "ffi-cpu"}  # a side's paged_attention


def requests(clients: int, per_client: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab, int(rng.integers(*PROMPTS, endpoint=True))).tolist(),
             int(rng.integers(*NEW, endpoint=True))) for _ in range(clients * per_client)]


def run(engine, work: list[tuple[list[int], int]], clients: int) -> tuple[float, int, list]:
    """Every request through ``clients`` concurrent ones: (seconds, tokens, tokens by request in order)."""
    from jaxformer.serving import SamplingParams

    pending, live, out, order = list(work), 0, {}, []
    start = time.perf_counter()
    while pending or engine.has_unfinished():
        while pending and live < clients:
            prompt, new = pending.pop(0)
            order.append(engine.add_request(prompt, SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)))
            live += 1
        for result in engine.step():
            out.setdefault(result.request_id, []).extend(result.token_ids)
            live -= result.finished
    seconds = time.perf_counter() - start
    return seconds, sum(len(t) for t in out.values()), [out[r] for r in order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sides", nargs=2, default=["xla", "ffi-cpu"], choices=SIDES)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--per-client", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.sides[0] == args.sides[1]:
        parser.error(f"--sides {args.sides[0]} {args.sides[1]}: want two different sides")

    import jaxformer as jf
    from jaxformer.serving import Engine

    model = jf.build("gpt2", seed=0)
    longest = PROMPTS[1] + NEW[1]
    top = max(args.levels)
    engines = {}
    for side in args.sides:
        engines[side] = Engine(model, num_blocks=top * -(-longest // 16) + 1, block_size=16, max_num_seqs=top,
                               max_model_len=longest, seed=0, paged_attention=SIDES[side])
        if side == "ffi-cpu-unpacked":
            engines[side].packs = False
        programs, seconds = engines[side].warm_up()
        print(f"{side}: {programs} programs warmed in {seconds:.0f} s", flush=True)
    first, second = args.sides
    rows = []
    for clients in args.levels:
        work = requests(clients, args.per_client, model.config.vocab_size, seed=clients)
        timed = {side: [] for side in engines}
        tokens = {side: run(engine, work, clients)[2] for side, engine in engines.items()}  # (untimed)
        for _ in range(args.repeats):
            for side, engine in engines.items():
                seconds, count, _ = run(engine, work, clients)
                timed[side].append(count / seconds)
        a, b = (statistics.median(timed[side]) for side in args.sides)
        same = sum(x == y for x, y in zip(tokens[first], tokens[second]))
        rows.append(dict(clients=clients, **{f"{side}_tok_s": round(statistics.median(timed[side]), 1)
                                             for side in args.sides},
                         ratio=round(b / a, 2), same_tokens=f"{same}/{len(work)}",
                         runs={side: [round(v, 1) for v in values] for side, values in timed.items()}))
        print(f"{clients:>3} clients: {first} {a:6.1f} tok/s, {second} {b:6.1f} tok/s, {b / a:.2f}x "
              f"(requests with the same tokens: {same}/{len(work)})", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
