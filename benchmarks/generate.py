"""Greedy decoding throughput: jaxformer's compiled loop vs transformers' PyTorch ``generate``.

The gpt2 architecture (124M, random weights, float32, no EOS so every run makes all its tokens) is
saved once in the Hugging Face format and loaded by both. Prompt 32 tokens, 128 new tokens, batch 1
and batch 8. jaxformer's compile time is measured separately (ahead-of-time ``lower().compile()``)
and excluded from its tokens/s. The bandwidth bound at batch 1 is ``jaxformer.flops.peak_bandwidth``
(measured on a CPU by a jitted reduction, the datasheet on an accelerator) divided by the bytes a
decode step must read (``jaxformer.flops.decode_bytes_per_step``: the weights once and the KV cache at
the run's average length).

With ``--int8`` it instead compares jaxformer with itself: the same gpt2 shape (random weights, built
directly, no torch needed) in float32 against its int8 forms (``jf.quantized``): weight-only ``int8``
and ``int8_dynamic``, each with the tied embedding / LM head left float32 or made int8 too
(``embeddings=True``). Runs interleave float32 and each int8 form; the ratio is int8 tokens/s over
float32 tokens/s; "agree" is the fraction of generated tokens equal to float32's.

    python benchmarks/generate.py [--repeats 3] [--json] [--new-tokens 128] [--int8]
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
    parser.add_argument("--int8", action="store_true", help="float32 vs int8 jaxformer instead of vs transformers")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.int8:
        int8_main(args)
        return

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


INT8_KINDS = (("int8", False), ("int8", True), ("int8_dynamic", False), ("int8_dynamic", True))


def int8_main(args) -> None:
    import numpy as np

    import jaxformer as jf
    from jaxformer import generate as gen

    base = jf.build("gpt2", seed=0)
    models = {"float32": base}
    for kind, embeddings in INT8_KINDS:
        models[kind + ("+embed" if embeddings else "")] = jf.quantized(base, kind, embeddings=embeddings)
    result: dict[str, float] = {}
    for batch in (1, 8):
        ids = np.random.default_rng(batch).integers(0, base.config.vocab_size, (batch, args.prompt))
        runs = {}
        for name, model in models.items():
            call_args, gc = gen.prepare(model, ids, max_new_tokens=args.new_tokens)
            compiled = gen.generate_tokens_jit.lower(*call_args, config=gc).compile()
            runs[name] = (model, call_args, gc, compiled)

        def run(name):
            model, call_args, gc, compiled = runs[name]
            tokens, steps, bad_step = compiled(*call_args[1:])
            return gen.assemble(model, ids, tokens, steps, bad_step, gc)

        outputs = {name: run(name) for name in runs}  # warm up every form
        times = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name in runs:  # float32, int8, float32, int8+embed, ...: each form beside float32 in time
                for one in ("float32", name) if name != "float32" else ():
                    start = time.perf_counter()
                    run(one)
                    times[one].append(time.perf_counter() - start)
        new_tokens = batch * args.new_tokens
        reference = outputs["float32"][:, args.prompt:]
        for name in runs:
            tok_s = new_tokens / statistics.median(times[name])
            result[f"{name}_tok_s_b{batch}"] = round(tok_s, 2)
            if name != "float32":
                result[f"{name}_ratio_b{batch}"] = round(tok_s / result[f"float32_tok_s_b{batch}"], 3)
                result[f"{name}_agree_b{batch}"] = round(float(np.mean(outputs[name][:, args.prompt:] == reference)), 3)
    if args.json:
        print(json.dumps(result))
        return
    print(f"gpt2 shape (124M, random weights) greedy, prompt {args.prompt}, {args.new_tokens} new tokens, "
          f"median of {args.repeats}; int8 forms vs float32 jaxformer, interleaved")
    print(f"{'batch':>5} {'form':>19} {'tok/s':>8} {'vs float32':>10} {'agree':>6}")
    for batch in (1, 8):
        for name in models:
            ratio = result.get(f"{name}_ratio_b{batch}", 1.0)
            agree = result.get(f"{name}_agree_b{batch}", 1.0)
            print(f"{batch:>5} {name:>19} {result[f'{name}_tok_s_b{batch}']:>8.1f} {ratio:>9.2f}x {agree:>6.2f}")


if __name__ == "__main__":
    main()
