"""Greedy decoding throughput: jaxformer's compiled loop vs transformers' PyTorch ``generate``.

The gpt2 architecture (124M, random weights, float32, no EOS so every run makes all its tokens) is
saved once in the Hugging Face format and loaded by both. Prompt 32 tokens, 128 new tokens, batch 1
and batch 8. jaxformer's compile time is measured separately (ahead-of-time ``lower().compile()``)
and excluded from its tokens/s. The bandwidth bound at batch 1 is ``jaxformer.flops.peak_bandwidth``
(measured on a CPU by a jitted reduction, the datasheet on an accelerator) divided by the bytes a
decode step must read (``jaxformer.flops.decode_bytes_per_step``: the weights once and the KV cache at
the run's average length).

    python benchmarks/generate.py [--repeats 3] [--json] [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import numpy as np
    import torch
    import transformers

    import jaxformer as jf
    from jaxformer import flops
    from jaxformer import generate as gen

    transformers.logging.set_verbosity_error()
    folder = Path(tempfile.mkdtemp(prefix="jaxformer-generate-"))
    torch.manual_seed(0)
    config = transformers.GPT2Config(bos_token_id=None, eos_token_id=None)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(folder))
    reference = transformers.GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    model = jf.from_pretrained(folder)
    step_bytes = flops.decode_bytes_per_step(model.config, 1, args.prompt + args.new_tokens // 2)

    result: dict[str, float] = {}
    compile_s = 0.0
    for batch in (1, 8):
        ids = np.random.default_rng(batch).integers(0, config.vocab_size, (batch, args.prompt))
        call_args, gc = gen.prepare(model, ids, max_new_tokens=args.new_tokens)
        start = time.perf_counter()
        compiled = gen.generate_tokens_jit.lower(*call_args, config=gc).compile()
        compile_s += time.perf_counter() - start

        def run_jaxformer():
            tokens, steps, bad_step = compiled(*call_args[1:])  # the graphdef is static, baked in
            return gen.assemble(model, ids, tokens, steps, bad_step, gc)

        def run_transformers():
            with torch.no_grad():
                return reference.generate(torch.as_tensor(ids), attention_mask=torch.ones_like(torch.as_tensor(ids)),
                                          max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0).numpy()

        ours, theirs = run_jaxformer(), run_transformers()  # warm up both
        assert ours.shape == theirs.shape == (batch, args.prompt + args.new_tokens)
        times = {"jaxformer": [], "transformers": []}
        for _ in range(args.repeats):
            for name, fn in (("jaxformer", run_jaxformer), ("transformers", run_transformers)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        new_tokens = batch * args.new_tokens
        ours_tok_s = new_tokens / statistics.median(times["jaxformer"])
        hf_tok_s = new_tokens / statistics.median(times["transformers"])
        result[f"jaxformer_tok_s_b{batch}"] = round(ours_tok_s, 2)
        result[f"hf_tok_s_b{batch}"] = round(hf_tok_s, 2)
        result[f"ratio_b{batch}"] = round(ours_tok_s / hf_tok_s, 3)
        result[f"tokens_identical_b{batch}"] = bool(np.array_equal(ours, theirs))

    bandwidth, bandwidth_source = flops.peak_bandwidth()
    bound_tok_s = bandwidth / step_bytes
    result["bandwidth_fraction_b1"] = round(result["jaxformer_tok_s_b1"] / bound_tok_s, 3)
    result["bandwidth_gb_s"] = round(bandwidth / 1e9, 2)
    result["compile_s"] = round(compile_s, 2)
    if args.json:
        print(json.dumps(result))
        return
    print(f"gpt2 (124M, float32) greedy, prompt {args.prompt}, {args.new_tokens} new tokens, median of {args.repeats}")
    print(f"{'batch':>5} {'jaxformer tok/s':>16} {'transformers tok/s':>19} {'ratio':>7}  identical")
    for batch in (1, 8):
        print(f"{batch:>5} {result[f'jaxformer_tok_s_b{batch}']:>16.1f} {result[f'hf_tok_s_b{batch}']:>19.1f} "
              f"{result[f'ratio_b{batch}']:>6.2f}x  {result[f'tokens_identical_b{batch}']}")
    print(f"memory bandwidth {result['bandwidth_gb_s']:.1f} GB/s ({bandwidth_source}); {step_bytes / 1e6:.0f} MB "
          f"read per step -> bound {bound_tok_s:.1f} tok/s at batch 1; jaxformer reaches "
          f"{result['bandwidth_fraction_b1']:.0%}")
    print(f"compile (both batch sizes, excluded above): {result['compile_s']:.1f} s")


if __name__ == "__main__":
    main()
