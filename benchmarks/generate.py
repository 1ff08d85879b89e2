"""Greedy decoding throughput: jaxformer's compiled loop vs transformers' PyTorch ``generate``.

The gpt2 architecture (124M, random weights, float32, no EOS so every run makes all its tokens) is
saved once in the Hugging Face format and loaded by both. Prompt 32 tokens, 128 new tokens, batch 1
and batch 8. jaxformer's compile time is measured separately (ahead-of-time ``lower().compile()``)
and excluded from its tokens/s. The bandwidth bound at batch 1 is ``jaxformer.flops.peak_bandwidth``
(measured on a CPU by a jitted reduction, the datasheet on an accelerator) divided by the bytes a
decode step must read (``jaxformer.flops.decode_bytes_per_step``: the weights once and the KV cache at
the run's average length). Three sides, interleaved: jaxformer's ``generate`` on the model, the same on its
decoding copy (``model.decoding_copy()``, made once before the timing: layers separate, kernels outputs first),
and transformers.

With ``--int8`` it instead compares jaxformer with itself: the same gpt2 shape (random weights, built
directly, no torch needed) in float32 against its int8 forms (``jf.quantized``): weight-only ``int8``
and ``int8_dynamic``, each with the tied embedding / LM head left float32 or made int8 too
(``embeddings=True``). Runs interleave float32 and each int8 form; the ratio is int8 tokens/s over
float32 tokens/s; "agree" is the fraction of generated tokens equal to float32's.

With ``--drafting`` it measures drafting at batch 1 on a trained pair: configs/draft_target.yaml (GPT 4 x 256)
and its assistant configs/draft_assistant.yaml (1 x 128), both on configs/data/drafting.jsonl, trained here
by train.py when runs/ lacks them (about 11 minutes; ``--retrain`` trains again) and exported to Hugging Face
folders. Prompts come from the held-out tenth of that file, which neither run trained on: "continue" is a
paragraph's first 100 bytes; "grounded" is an edit task, a paragraph, "Edited:" and the edited version's
first 20 bytes (the rest of what to write lies in the prompt). Interleaved, plain greedy against: the
assistant drafting up to ``--draft-tokens`` a round, prompt lookup (up to 6 tokens, n-grams up to 4 bytes),
each under every ``--schedules`` (the adaptive default, and constant: always the bound), transformers' plain
greedy and its assisted generation with the same exported pair (its defaults: 20 drafts, confidence-stopped).
Each row reports tokens/s, the ratio to jaxformer's plain greedy on the same task, the tokens one target step
emits, what a target step (a drafting round, drafts included) costs in plain greedy steps, and whether the
tokens equal plain greedy's. This pair is the overhead case: a target step costs little more than an
assistant step, so what a round spends besides the two models shows; benchmarks/drafting.py is the case
drafting exists for, a target whose step is expensive.

With ``--window`` it measures the rolling caches of windowed layers: two models of one shape (8 x 512, GQA 8/2,
random weights, vocabulary 8192), one whose every layer attends within ``--window-size`` tokens (Mistral) and
one alternating windowed and full layers (Gemma 2, gpt-oss), decode a prompt of 32 tokens to 4 windows past it,
at batch 1 and 8, with their windowed layers' caches rolling (a ring of the window's slots, the default) and
with a cache of every position (the same loop, ``cache.empty_cache`` told that no layer is windowed).
Interleaved; each row reports tokens/s, the ratio rolling / full, the decode state's cache bytes and whether
the tokens are equal.

    python benchmarks/generate.py [--repeats 3] [--json] [--new-tokens 128] [--int8 | --drafting | --window]
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
    parser.add_argument("--drafting", action="store_true", help="assisted and prompt lookup decoding, trained pair")
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4, help="held-out documents (drafting)")
    parser.add_argument("--retrain", action="store_true", help="train the drafting pair again")
    parser.add_argument("--schedules", default="adaptive,constant",
                        help="drafting schedules, comma-separated (drafting; 'constant' alone runs on older versions)")
    parser.add_argument("--window", action="store_true", help="rolling caches of windowed layers vs full caches")
    parser.add_argument("--window-size", type=int, default=256)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.int8:
        int8_main(args)
        return
    if args.window:
        window_main(args)
        return
    if args.drafting:
        drafting_main(args)
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
    copy = model.decoding_copy()  # made once, as a program that generates many times would
    for batch in (1, 8):
        ids = np.random.default_rng(batch).integers(0, config.vocab_size, (batch, args.prompt))
        sides = {}
        for name, source in (("jaxformer", model), ("copy", copy)):
            call_args, gc = gen.prepare(source, ids, max_new_tokens=args.new_tokens)
            start = time.perf_counter()
            compiled = gen.generate_tokens_jit.lower(*call_args, config=gc).compile()
            compile_s += time.perf_counter() - start

            def run(compiled=compiled, call_args=call_args, gc=gc):
                tokens, steps, bad_step = compiled(*call_args[1:])  # the graphdef is static, baked in
                return gen.assemble(model, ids, tokens, steps, bad_step, gc)
            sides[name] = run

        def run_transformers():
            with torch.no_grad():
                return reference.generate(torch.as_tensor(ids), attention_mask=torch.ones_like(torch.as_tensor(ids)),
                                          max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0).numpy()
        sides["transformers"] = run_transformers

        outputs = {name: fn() for name, fn in sides.items()}  # warm up every side
        assert all(out.shape == (batch, args.prompt + args.new_tokens) for out in outputs.values())
        times = {name: [] for name in sides}
        for _ in range(args.repeats):
            for name, fn in sides.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        new_tokens = batch * args.new_tokens
        tok_s = {name: new_tokens / statistics.median(t) for name, t in times.items()}
        result[f"jaxformer_tok_s_b{batch}"] = round(tok_s["jaxformer"], 2)
        result[f"copy_tok_s_b{batch}"] = round(tok_s["copy"], 2)
        result[f"hf_tok_s_b{batch}"] = round(tok_s["transformers"], 2)
        result[f"ratio_b{batch}"] = round(tok_s["jaxformer"] / tok_s["transformers"], 3)
        result[f"copy_ratio_b{batch}"] = round(tok_s["copy"] / tok_s["transformers"], 3)
        result[f"tokens_identical_b{batch}"] = bool(np.array_equal(outputs["jaxformer"], outputs["transformers"])
                                                    and np.array_equal(outputs["copy"], outputs["transformers"]))

    bandwidth, bandwidth_source = flops.peak_bandwidth()
    bound_tok_s = bandwidth / step_bytes
    result["bandwidth_fraction_b1"] = round(result["jaxformer_tok_s_b1"] / bound_tok_s, 3)
    result["copy_bandwidth_fraction_b1"] = round(result["copy_tok_s_b1"] / bound_tok_s, 3)
    result["bandwidth_gb_s"] = round(bandwidth / 1e9, 2)
    result["compile_s"] = round(compile_s, 2)
    if args.json:
        print(json.dumps(result))
        return
    print(f"gpt2 (124M, float32) greedy, prompt {args.prompt}, {args.new_tokens} new tokens, median of {args.repeats}"
          " (decoding copy: model.decoding_copy(), made once)")
    print(f"{'batch':>5} {'jaxformer tok/s':>16} {'decoding copy':>14} {'transformers tok/s':>19} {'ratio':>7} "
          f"{'copy ratio':>11}  identical")
    for batch in (1, 8):
        print(f"{batch:>5} {result[f'jaxformer_tok_s_b{batch}']:>16.1f} {result[f'copy_tok_s_b{batch}']:>14.1f} "
              f"{result[f'hf_tok_s_b{batch}']:>19.1f} {result[f'ratio_b{batch}']:>6.2f}x "
              f"{result[f'copy_ratio_b{batch}']:>10.2f}x  {result[f'tokens_identical_b{batch}']}")
    print(f"memory bandwidth {result['bandwidth_gb_s']:.1f} GB/s ({bandwidth_source}); {step_bytes / 1e6:.0f} MB "
          f"read per step -> bound {bound_tok_s:.1f} tok/s at batch 1; jaxformer reaches "
          f"{result['bandwidth_fraction_b1']:.0%}, its decoding copy {result['copy_bandwidth_fraction_b1']:.0%}")
    print(f"compile (both batch sizes, both jaxformer sides, excluded above): {result['compile_s']:.1f} s")


ROOT = Path(__file__).resolve().parent.parent
PAIR = {"target": "configs/draft_target.yaml", "assistant": "configs/draft_assistant.yaml"}


def trained_pair(retrain: bool) -> dict[str, Path]:
    """Hugging Face folders of the drafting pair, trained first when their runs are missing."""
    import subprocess
    import sys

    import yaml

    from jaxformer.cli import main as cli

    folders = {}
    out = Path(tempfile.mkdtemp(prefix="jaxformer-drafting-"))
    for role, config in PAIR.items():
        run = ROOT / yaml.safe_load((ROOT / config).read_text())["run"]["dir"]
        if retrain or not (run / "config.yaml").exists():
            print(f"training the {role} ({config}) ...", flush=True)
            subprocess.run([sys.executable, str(ROOT / "train.py"), str(ROOT / config), f"run.dir={run}",
                            "train.sample_tokens=0"], check=True, cwd=ROOT)
        folders[role] = out / role
        cli(["convert", str(run), "--to-hf", str(folders[role])])
    return folders


def drafting_main(args) -> None:
    import numpy as np
    import torch
    import transformers

    import jaxformer as jf
    from jaxformer import generate as gen
    from jaxformer.train.data import ByteTokenizer

    transformers.logging.set_verbosity_error()
    folders = trained_pair(args.retrain)
    target, assistant = jf.from_pretrained(folders["target"]), jf.from_pretrained(folders["assistant"])
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(folders["target"])).eval()
    reference_assistant = transformers.AutoModelForCausalLM.from_pretrained(str(folders["assistant"])).eval()
    tokenizer = ByteTokenizer()
    records = [json.loads(line)["text"] for line in (ROOT / "configs/data/drafting.jsonl").read_text().splitlines()]
    held_out = records[-len(records) // 10:]  # train.py's held-out split (data.eval_fraction 0.1)
    plain_paragraphs = [text for text in held_out if "\nEdited: " not in text][:args.prompts]
    edits = [text.split("\nEdited: ") for text in held_out if "\nEdited: " in text][:args.prompts]
    tasks = {"continue": [tokenizer.encode(text[:100])[None] for text in plain_paragraphs],
             "grounded": [tokenizer.encode(f"{before}\nEdited: {after[:20]}")[None] for before, after in edits]}
    N, K = args.new_tokens, args.draft_tokens
    settings = {"plain": {}}
    for schedule in args.schedules.split(","):
        settings[f"assistant K={K}, {schedule}"] = dict(assistant_model=assistant, num_assistant_tokens=K,
                                                       num_assistant_tokens_schedule=schedule)
        # bytes: a 2-byte n-gram (transformers' default size, meant for word pieces) matches almost anywhere
        settings[f"prompt lookup K=6, n-gram 4, {schedule}"] = dict(
            prompt_lookup_num_tokens=6, max_matching_ngram_size=4, num_assistant_tokens_schedule=schedule)

    def compiled(ids, kwargs):
        call_args, gc = gen.prepare(target, ids, max_new_tokens=N, eos_token_id=None, **kwargs)
        loop = gen.drafted_tokens_jit if gc.draft_tokens else gen.generate_tokens_jit
        program = loop.lower(*call_args, config=gc).compile()

        def run():
            tokens, steps, bad, *rounds = program(*call_args[1:])
            out = gen.assemble(target, ids, tokens, steps, bad, gc)
            target_steps = int(rounds[0]) + 1 if rounds else N
            return out, target_steps
        return run

    def hf(ids, kwargs):
        def run():
            with torch.no_grad():
                out = reference.generate(torch.as_tensor(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                                         max_new_tokens=N, min_new_tokens=N, do_sample=False, pad_token_id=0,
                                         eos_token_id=None, **kwargs).numpy()
            return out, None
        return run

    rows = {}
    for task, prompts in tasks.items():
        runners = {name: [compiled(ids, kwargs) for ids in prompts] for name, kwargs in settings.items()
                   if not (task == "continue" and "lookup" in name)}
        if task == "continue":
            runners["transformers plain"] = [hf(ids, {}) for ids in prompts]
            runners["transformers assisted"] = [hf(ids, dict(assistant_model=reference_assistant)) for ids in prompts]
        plain = [run()[0] for run in runners["plain"]]  # warm up every runner, keep plain's tokens
        outputs = {name: [run() for run in runs] for name, runs in runners.items()}
        times = {name: [] for name in runners}
        for _ in range(args.repeats):
            for name, runs in runners.items():  # plain, drafted, plain, ...: noise hits every side alike
                start = time.perf_counter()
                for run in runs:
                    run()
                times[name].append(time.perf_counter() - start)
        plain_step = statistics.median(times["plain"]) / (N * len(prompts))  # seconds of one plain step
        for name in runners:
            seconds = statistics.median(times[name])
            target_steps = None if outputs[name][0][1] is None else sum(o[1] for o in outputs[name])
            rows[f"{task}: {name}"] = dict(
                tok_s=round(N * len(prompts) / seconds, 1),
                identical=all(np.array_equal(o[0], p) for o, p in zip(outputs[name], plain)),
                # tokens a target step emits, and what a step (a drafting round) costs in plain steps
                tokens_per_step=None if target_steps is None else round(N * len(prompts) / target_steps, 2),
                step_cost=None if target_steps is None else round(seconds / target_steps / plain_step, 2))
        base = rows[f"{task}: plain"]["tok_s"]
        for name in runners:
            rows[f"{task}: {name}"]["vs_plain"] = round(rows[f"{task}: {name}"]["tok_s"] / base, 2)
        if task == "continue" and f"assistant K={K}, constant" in runners and hasattr(gen, "decode_step_seconds"):
            ids = prompts[0]
            _, gc = gen.prepare(target, ids, max_new_tokens=N, eos_token_id=None, assistant_model=assistant,
                                num_assistant_tokens=K, num_assistant_tokens_schedule="constant")
            parts = {"assistant": gen.decode_step_seconds(assistant, ids, np.ones_like(ids), gc, 1, 5) * K,
                     "verify": gen.decode_step_seconds(target, ids, np.ones_like(ids), gc, K + 1, 5),
                     "plain step": gen.decode_step_seconds(target, ids, np.ones_like(ids), gc, 1, 5)}
            row = rows[f"continue: assistant K={K}, constant"]
            round_s = row["step_cost"] * plain_step
            rows["round"] = {name: round(seconds / plain_step, 3) for name, seconds in parts.items()}
            rows["round"]["round"] = row["step_cost"]
            rows["round"]["rest"] = round((round_s - parts["assistant"] - parts["verify"]) / plain_step, 3)
    first = args.schedules.split(",")[0]
    ours = rows[f"continue: assistant K={K}, {first}"]["tok_s"]
    theirs = rows["continue: transformers assisted"]["tok_s"]
    rows["assisted vs transformers assisted"] = round(ours / theirs, 2)
    if args.json:
        print(json.dumps(rows))
        return
    shape = lambda cfg: f"{cfg.decoder_layers} x {cfg.d_model}"  # noqa: E731
    print(f"drafting at batch 1: target GPT {shape(target.config)}, assistant {shape(assistant.config)} (bytes of "
          f"configs/data/drafting.jsonl), {args.prompts} held-out prompts per task, {N} new tokens each, median of "
          f"{args.repeats}, interleaved")
    print(f"{'task: decoding':<52} {'tok/s':>8} {'vs plain':>9} {'tok/step':>9} {'step cost':>10}  same tokens")
    for name, row in rows.items():
        if isinstance(row, dict) and "tok_s" in row:
            per_step = "" if row["tokens_per_step"] is None else f"{row['tokens_per_step']:.2f}"
            cost = "" if row["step_cost"] is None else f"{row['step_cost']:.2f}"
            print(f"{name:<52} {row['tok_s']:>8.1f} {row['vs_plain']:>8.2f}x {per_step:>9} {cost:>10}  "
                  f"{row['identical']}")
    print("tok/step: tokens a target step emits; step cost: a target step's time (a drafting round's, with its "
          "drafts) in plain greedy steps")
    print(f"jaxformer assisted vs transformers assisted: {rows['assisted vs transformers assisted']:.2f}x")
    if "round" in rows:
        r = rows["round"]
        print(f"a constant round of {K} drafts costs {r['round']:.2f} plain steps (a plain step in the loop; "
              f"{r['plain step']:.2f} timed alone): {K} assistant steps {r['assistant']:.2f} + the {K + 1}-token "
              f"verifying step {r['verify']:.2f} + the rest (choosing, accepting, rewinding, appending) "
              f"{r['rest']:.2f}")


def window_main(args) -> None:
    import contextlib
    from unittest import mock

    import jax
    import numpy as np

    import jaxformer as jf
    from jaxformer import cache
    from jaxformer import generate as gen

    W, prompt = args.window_size, 32
    new_tokens = 4 * W  # the cache ends 4 windows (and a prompt) long
    shape = dict(decoder_layers=8, d_model=512, num_heads=8, num_kv_heads=2, d_ff=1408, vocab_size=8192,
                 max_positions=2 * (prompt + new_tokens), window_size=W)
    models = {"sliding (Mistral)": jf.build(jf.config("tiny-llama").replace(attention="sliding", **shape), seed=0),
              "alternating (Gemma 2)": jf.build(jf.config("tiny-llama").replace(
                  attention="alternating", layer_types=("sliding", "full") * 4, **shape), seed=0)}

    def full_cache():  # every layer's cache holds every position: what jaxformer did before rolling caches
        return mock.patch.object(cache, "windowed_layers", lambda cfg, layers: ((False,) * layers, None))

    rows = {}
    for name, model in models.items():
        for batch in (1, 8):
            ids = np.random.default_rng(batch).integers(0, shape["vocab_size"], (batch, prompt))
            runs = {}
            for side, patch in (("rolling", contextlib.nullcontext), ("full", full_cache)):
                with patch():  # traced (and its cache laid out) under the setting; a jit of its own per side
                    call_args, gc = gen.prepare(model, ids, max_new_tokens=new_tokens, eos_token_id=None)
                    loop = jax.jit(lambda *a, config, graphdef: gen.generate_tokens(graphdef, *a, config=config),
                                   static_argnames=("graphdef", "config"))
                    program = loop.lower(*call_args[1:], config=gc, graphdef=call_args[0]).compile()
                    state = jax.eval_shape(lambda: model.init_cache(batch, prompt + new_tokens - 1))
                    cache_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(state.kv))

                def run(program=program, call_args=call_args, gc=gc):
                    tokens, steps, bad = program(*call_args[1:])
                    return gen.assemble(model, ids, tokens, steps, bad, gc)
                runs[side] = (run, cache_bytes)
            outputs = {side: runs[side][0]() for side in runs}  # warm up
            times = {side: [] for side in runs}
            for _ in range(args.repeats):
                for side in runs:  # rolling, full, rolling, full, ...
                    start = time.perf_counter()
                    runs[side][0]()
                    times[side].append(time.perf_counter() - start)
            tok_s = {side: batch * new_tokens / statistics.median(times[side]) for side in runs}
            rows[f"{name} b{batch}"] = dict(
                rolling_tok_s=round(tok_s["rolling"], 1), full_tok_s=round(tok_s["full"], 1),
                ratio=round(tok_s["rolling"] / tok_s["full"], 3), rolling_cache_bytes=runs["rolling"][1],
                full_cache_bytes=runs["full"][1], identical=bool(np.array_equal(outputs["rolling"], outputs["full"])))
    if args.json:
        print(json.dumps(rows))
        return
    print(f"windowed layers (window {W}), 8 x 512 GQA 8/2, random weights: prompt {prompt} + {new_tokens} new tokens "
          f"(4 windows), median of {args.repeats}; rolling caches vs full caches, interleaved")
    print(f"{'model, batch':<28} {'rolling tok/s':>13} {'full tok/s':>11} {'ratio':>7} {'rolling MiB':>12} "
          f"{'full MiB':>9}  same tokens")
    for name, row in rows.items():
        print(f"{name:<28} {row['rolling_tok_s']:>13.1f} {row['full_tok_s']:>11.1f} {row['ratio']:>6.2f}x "
              f"{row['rolling_cache_bytes'] / 2**20:>12.1f} {row['full_cache_bytes'] / 2**20:>9.1f}  {row['identical']}")


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
