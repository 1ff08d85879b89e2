"""Gated DeltaNet layers (Qwen3-Next's and Qwen3.5's linear attention) against full attention, on this machine.

Two decoders of one size: Qwen3.5's block (8 layers of 512, 8 query heads and 2 kv heads of 64 behind an output
gate, a dense SwiGLU of 1536, 32,000 tokens), one with three linear layers to every full one (4 key heads serving
8 value heads, 64 wide), the other with full attention in every layer. Random weights, float32, batch 1. For each
context length it measures, alternating the two models call by call so both see the same machine load:

- prefill: one jitted forward pass over the whole context (the linear layers' chunked parallel form);
- decode: the time of one cached step after a prefill of that length (the linear layers' recurrent form), the
  median of ``--steps`` steps;
- decode memory: what a cached step carries per row, in bytes (``cache.cache_numbers`` and the linear layers'
  state): the full model's grows with the context in every layer, the hybrid's only in its full layers.

With ``--reference``, transformers' Qwen3_5ForCausalLM of the same shape (its PyTorch fallback of the chunked
rule, eager) prefills the shortest context beside jaxformer's hybrid, for the ratio against the reference.

    python benchmarks/linear_attention.py [--lengths 512,2048,8192] [--repeats 5] [--steps 16] [--reference]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,2048,8192")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxformer as jf
    from jaxformer.cache import cache_numbers, linear_state_bytes

    lengths = [int(n) for n in args.lengths.split(",")]
    longest = max(lengths) + args.steps + 1
    shape = dict(vocab_size=32000, d_model=512, num_heads=8, num_kv_heads=2, head_dim=64, d_ff=1536, decoder_layers=8,
                 max_positions=longest, norm_scale_offset=1.0, qk_norm=True, attention_gate=True, rotary_dim=16,
                 init_std=0.02)
    linear = dict(linear_layers=(0, 1, 2, 4, 5, 6), linear_key_heads=4, linear_value_heads=8, linear_key_head_dim=64,
                  linear_value_head_dim=64)
    configs = {"hybrid": jf.config("tiny-llama").replace(**shape, **linear),
               "full": jf.config("tiny-llama").replace(**shape)}
    models = {name: jf.build(cfg, seed=0) for name, cfg in configs.items()}
    rng = np.random.default_rng(0)
    results = {"params": {name: jf.param_count(cfg) for name, cfg in configs.items()}, "lengths": {}}

    def prefill_fn(model):
        return jax.jit(lambda m, ids: m(ids).logits)

    def decode_fn(model):
        return jax.jit(lambda m, ids, positions, state: m.step(ids, positions, jnp.ones(ids.shape, bool), state))

    prefills = {name: prefill_fn(m) for name, m in models.items()}
    steps = {name: decode_fn(m) for name, m in models.items()}
    for length in lengths:
        ids = jnp.asarray(rng.integers(0, 32000, (1, length)), jnp.int32)
        row = {}
        for name, model in models.items():  # compile both first
            prefills[name](model, ids).block_until_ready()
        times = {name: [] for name in models}
        for _ in range(args.repeats):
            for name, model in models.items():
                times[name].append(_timed(lambda: prefills[name](model, ids).block_until_ready()))
        prefill = {name: statistics.median(t) for name, t in times.items()}
        states, decode_times = {}, {name: [] for name in models}
        for name, model in models.items():  # a prefill of ``length`` tokens, then steps one token at a time
            state = model.init_cache(1, length + args.steps + 1)
            _, states[name] = model.step(ids, jnp.arange(length)[None], jnp.ones((1, length), bool), state)
            token = ids[:, -1:]
            out = steps[name](model, token, jnp.full((1, 1), length), states[name])
            jax.block_until_ready(out)
        for step in range(args.steps):
            for name, model in models.items():
                position = jnp.full((1, 1), length + step)
                start = time.perf_counter()
                logits, states[name] = steps[name](model, ids[:, -1:], position, states[name])
                logits.block_until_ready()
                decode_times[name].append(time.perf_counter() - start)
        decode = {name: statistics.median(t) for name, t in decode_times.items()}
        memory = {name: cache_numbers(cfg, length) * 4 + linear_state_bytes(cfg) for name, cfg in configs.items()}
        row = {"prefill_s": prefill, "prefill_speedup": prefill["full"] / prefill["hybrid"],
               "decode_step_s": decode, "decode_speedup": decode["full"] / decode["hybrid"],
               "decode_memory_bytes": memory, "memory_ratio": memory["hybrid"] / memory["full"]}
        results["lengths"][length] = row

    if args.reference:
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        hf = transformers.Qwen3_5TextConfig(
            vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
            num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
            linear_key_head_dim=64, linear_value_head_dim=64, max_position_embeddings=longest,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
        reference = transformers.Qwen3_5ForCausalLM(hf).eval()
        length = min(lengths)
        ids = rng.integers(0, 32000, (1, length))
        ours, theirs = [], []
        with torch.inference_mode():
            reference(torch.as_tensor(ids))
            for _ in range(args.repeats):
                ours.append(_timed(lambda: prefills["hybrid"](models["hybrid"], jnp.asarray(ids)).block_until_ready()))
                theirs.append(_timed(lambda: reference(torch.as_tensor(ids))))
        results["reference_prefill"] = {"length": length, "jaxformer_s": statistics.median(ours),
                                        "transformers_s": statistics.median(theirs),
                                        "ratio": statistics.median(theirs) / statistics.median(ours)}

    if args.json:
        print(json.dumps(results, indent=2))
        return
    params = results["params"]
    print(f"hybrid (6 Gated DeltaNet + 2 full layers) {params['hybrid']:,} parameters; full attention "
          f"{params['full']:,}; batch 1, float32, {jax.devices()[0].platform}")
    print(f"{'context':>8}  {'prefill hybrid':>14}  {'full':>8}  {'x':>5}  {'decode step hybrid':>18}  {'full':>8}  "
          f"{'x':>5}  {'memory hybrid':>13}  {'full':>10}")
    for length, row in results["lengths"].items():
        p, d, m = row["prefill_s"], row["decode_step_s"], row["decode_memory_bytes"]
        print(f"{length:>8}  {p['hybrid'] * 1e3:>11.1f} ms  {p['full'] * 1e3:>5.1f} ms  {row['prefill_speedup']:>4.2f}x"
              f"  {d['hybrid'] * 1e3:>15.2f} ms  {d['full'] * 1e3:>5.2f} ms  {row['decode_speedup']:>4.2f}x"
              f"  {m['hybrid'] / 2**20:>9.1f} MiB  {m['full'] / 2**20:>6.1f} MiB")
    if "reference_prefill" in results:
        r = results["reference_prefill"]
        print(f"prefill of {r['length']} tokens, jaxformer's hybrid {r['jaxformer_s'] * 1e3:.1f} ms, transformers' "
              f"{r['transformers_s'] * 1e3:.1f} ms: {r['ratio']:.2f}x")


if __name__ == "__main__":
    main()
