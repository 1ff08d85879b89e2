"""Training-step throughput: jaxformer (jitted step, donated state, optax AdamW) vs transformers'
PyTorch models in eager mode and under ``torch.compile`` (inductor; torch.optim.AdamW either way), float32,
same architecture, same machine, one run, the three sides timed in turn step by step.

Shapes (as the training issue states them): a GPT-2 architecture with 6 layers, d_model 512, 8 heads,
vocab 8192, sequence 256, batch 8 (``gpt``; ``gpt_deep``: 12 layers of d_model 256, 4 heads); a
LLaMA-shaped decoder (``llama``: 6 layers, d_model 512, GQA 8/2, SwiGLU 1408, RoPE, RMSNorm, untied head,
vocab 8192, sequence 256, batch 8) against ``LlamaForCausalLM`` with its default (SDPA) attention; a
BERT-base-shaped encoder with its MLM head (sequence 128, batch 8); a T5-small-shaped encoder-decoder
(source 128, target 32, batch 8); a Mixtral-shaped mixture of experts
(4 layers, d_model 256, 8 experts top-2 of width 512, GQA 8/2, vocab 8192, sequence 256, batch 8),
against MixtralForCausalLM with transformers' default kernels (``mixtral``: sdpa attention, grouped_mm
experts) and with its eager ones (``mixtral_eager``: a Python loop over the experts that got tokens). Each side runs a few warm-up steps,
then ``--steps`` timed steps; the median step time gives tokens/s (T5 counts source + target tokens).
MFU is ``jaxformer.flops.utilization``: model FLOPs over the float32 peak of ``jaxformer.flops.peak_flops``
(on a CPU the best of several square matmul sizes, measured once per process and raised if a step runs
faster, so MFU cannot pass 100%; the datasheet on an accelerator). Model FLOPs use the dense estimate 6 x parameters x tokens; for the
encoder-decoder each side counts its own tokens (encoder parameters x source tokens, decoder parameters
and the tied embedding/head x target tokens). Attention's own FLOPs are left out, as in the 6N rule.
The mixture of experts counts only the experts a token is routed to (``jaxformer.flops``, which also
counts attention): running every expert would not be model FLOPs.

It also reports the compile time of a full-size gpt2 (124M, sequence 1024, scanned layers, batch 8,
dropout off) train step, compiled ahead of time from abstract shapes (``lower().compile()`` on
``ShapeDtypeStruct`` arguments, so nothing is allocated) before anything else, as a user's first step
would be; the target is under 30 s.

``lora`` compares fine-tune steps of the same GPT-2 shape inside jaxformer: the full fine-tune step
(every parameter differentiated, AdamW over all of them) against LoRA rank 8 on q and v (only the
adapters differentiated and optimized, the base an undonated step argument, as train.py's
``finetune.lora``) and QLoRA (the same with int8 projection kernels), timed interleaved (full, LoRA,
QLoRA, full, ...), with each one's training memory computed from shapes: weights + gradients + AdamW
moments, in bytes.

    python benchmarks/train.py [--steps 5] [--json] [--only gpt,bert,t5,llama,gpt_deep,mixtral,mixtral_eager,lora]
        [--skip-compile]
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


def jaxformer_step(cfg, family: str, batch, jax, jnp, optax, nnx, jf, abstract: bool = False):
    """A jitted train step over (params, opt_state) with the state donated, and its initial state (only
    shapes and dtypes when ``abstract``: nothing is allocated)."""
    model = nnx.eval_shape(lambda: jf.build(cfg)) if abstract else jf.build(cfg)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer = optax.adamw(1e-4, weight_decay=0.01)

    def loss_fn(params, batch):
        model = nnx.merge(graphdef, params, rest)
        if family == "t5":
            logits = model(batch["source"], decoder_input_ids=batch["target"][:, :-1]).logits
            labels = batch["target"][:, 1:]
        elif family == "bert":
            logits, labels = model(batch["tokens"]).logits, batch["labels"]
        else:
            logits, labels = model(batch["tokens"][:, :-1]).logits, batch["tokens"][:, 1:]
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()

    def step(state, batch):
        params, opt_state = state
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    def count(tree):
        return sum(x.size for x in jax.tree.leaves(tree))

    if cfg.experts is not None:  # routed experts only
        from jaxformer.flops import train_flops_per_step

        tokens_per_example = batch["tokens"].shape[1] - 1
        return (jax.jit(step, donate_argnums=0), (params, optimizer.init(params)), count(params),
                train_flops_per_step(cfg, 1, tokens_per_example) / tokens_per_example)
    if family == "t5":  # each side's parameters see only that side's tokens
        source, target = batch["source"].shape[1], batch["target"].shape[1] - 1
        flops_per_example = 6 * (count(params["encoder"]) * source
                                 + (count(params["decoder"]) + count(params["embed"])) * target)
        tokens_per_example = source + target
    else:
        tokens_per_example = batch["tokens"].shape[1] - (0 if family == "bert" else 1)
        flops_per_example = 6 * count(params) * tokens_per_example
    opt_state = jax.eval_shape(optimizer.init, params) if abstract else optimizer.init(params)
    return (jax.jit(step, donate_argnums=0), (params, opt_state), count(params),
            flops_per_example / tokens_per_example)


def gpt2_compile_seconds(jax, jnp, optax, nnx, jf, batch_size: int = 8) -> float:
    """Seconds to trace, lower and compile the train step of the full gpt2 preset from abstract shapes."""
    cfg = jf.config("gpt2").replace(dropout_rate=0.0, attention_dropout_rate=0.0)
    length = cfg.max_positions
    tokens = jax.ShapeDtypeStruct((batch_size, length + 1), jnp.int32)  # inputs and next-token labels
    start = time.perf_counter()
    step, state, _, _ = jaxformer_step(cfg, "gpt", {"tokens": tokens}, jax, jnp, optax, nnx, jf, abstract=True)
    step.lower(state, {"tokens": tokens}).compile()
    return time.perf_counter() - start


def lora_steps(cfg, batch, jax, jnp, optax, nnx, jf) -> dict:
    """Full, LoRA (r=8 on q, v) and QLoRA fine-tune steps of ``cfg`` on a causal-LM batch: for each, the
    jitted step ``(state, frozen, batch) -> (state, loss)`` (state donated), its arguments, and the bytes
    of weights, gradients and AdamW moments from shapes."""
    from jaxformer.layers.weights import Quantized
    from jaxformer.lora import trainable

    def nbytes(tree):
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))

    out = {}
    for name, changes in (("full", {}), ("lora", {"lora_rank": 8, "lora_alpha": 16.0, "lora_targets": ("q", "v")}),
                          ("qlora", {"lora_rank": 8, "lora_alpha": 16.0, "lora_targets": ("q", "v"),
                                     "quantize": "int8"})):
        model_cfg = cfg.replace(**changes)
        model = jf.build(model_cfg)
        train_filter = trainable(model_cfg) if model_cfg.lora is not None else nnx.Param
        frozen_filter = nnx.All(nnx.Any(nnx.Param, Quantized), nnx.Not(train_filter))
        graphdef, params, frozen, rest = nnx.split(model, train_filter, frozen_filter, ...)
        optimizer = optax.adamw(1e-4, weight_decay=0.01)

        def loss_fn(params, frozen, batch, graphdef=graphdef, rest=rest):
            logits = nnx.merge(graphdef, params, frozen, rest)(batch["tokens"][:, :-1]).logits
            return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                                   batch["tokens"][:, 1:]).mean()

        def step(state, frozen, batch, loss_fn=loss_fn, optimizer=optimizer):
            params, opt_state = state
            loss, grads = jax.value_and_grad(loss_fn)(params, frozen, batch)  # d/d params only
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        opt_state = optimizer.init(params)
        memory = {"weights": nbytes(params) + nbytes(frozen), "grads": nbytes(params), "adam": nbytes(opt_state)}
        out[name] = {"step": jax.jit(step, donate_argnums=0), "state": (params, opt_state), "frozen": frozen,
                     "trained": sum(x.size for x in jax.tree.leaves(params)), "memory": memory}
    return out


def lora_comparison(cfg, batch, steps: int, warmup: int, jax, jnp, optax, nnx, jf) -> dict:
    """Median step times of the full, LoRA and QLoRA fine-tunes, timed interleaved, and their memory."""
    runs = lora_steps(cfg, batch, jax, jnp, optax, nnx, jf)
    jax_batch = {k: jnp.asarray(v) for k, v in batch.items()}
    times = {name: [] for name in runs}
    for i in range(warmup + steps):
        for name, r in runs.items():  # full, lora, qlora, full, ...: all see the same machine load
            start = time.perf_counter()
            r["state"], loss = r["step"](r["state"], r["frozen"], jax_batch)
            loss.block_until_ready()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    full = statistics.median(times["full"])
    return {name: {"step_s": round(statistics.median(times[name]), 4),
                   "speedup_vs_full": round(full / statistics.median(times[name]), 3),
                   "trained_params": int(r["trained"]), **{f"{k}_bytes": int(v) for k, v in r["memory"].items()},
                   "total_bytes": int(sum(r["memory"].values()))} for name, r in runs.items()}


def torch_step(model, family: str, batch, torch):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        if family == "t5":
            logits = model(input_ids=batch["source"], decoder_input_ids=batch["target"][:, :-1]).logits
            labels = batch["target"][:, 1:]
        elif family == "bert":
            logits, labels = model(input_ids=batch["tokens"]).logits, batch["labels"]
        else:
            logits, labels = model(input_ids=batch["tokens"][:, :-1]).logits, batch["tokens"][:, 1:]
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def workloads(jf, transformers, rng, batch_size: int = 8) -> dict:
    """name -> (jaxformer config, a builder of the transformers model, a batch of numpy arrays, tokens per
    step) for every training shape this benchmark knows."""
    setups = {
        "gpt": (jf.config("gpt2").replace(d_model=512, num_heads=8, d_ff=2048, decoder_layers=6, vocab_size=8192,
                                         max_positions=256, dropout_rate=0.0, attention_dropout_rate=0.0),
                lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
                    n_embd=512, n_layer=6, n_head=8, vocab_size=8192, n_positions=256, resid_pdrop=0.0,
                    embd_pdrop=0.0, attn_pdrop=0.0)),
                {"tokens": rng.integers(0, 8192, (batch_size, 257))}, batch_size * 256),
        "bert": (jf.config("bert-base-uncased").replace(head="mlm", pooler=False, dropout_rate=0.0,
                                                        attention_dropout_rate=0.0),
                 lambda: transformers.BertForMaskedLM(transformers.BertConfig(
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
                 {"tokens": rng.integers(0, 30522, (batch_size, 128)),
                  "labels": rng.integers(0, 30522, (batch_size, 128))}, batch_size * 128),
        "t5": (jf.config("t5-small").replace(dropout_rate=0.0),
               lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
                   d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_heads=8, vocab_size=32128, dropout_rate=0.0)),
               {"source": rng.integers(0, 32128, (batch_size, 128)), "target": rng.integers(0, 32128, (batch_size, 33))},
               batch_size * (128 + 32)),
    }
    setups["llama"] = (
        jf.config("tiny-llama").replace(d_model=512, num_heads=8, num_kv_heads=2, d_ff=1408, decoder_layers=6,
                                        vocab_size=8192, max_positions=256),
        lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=512, intermediate_size=1408, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
            vocab_size=8192, max_position_embeddings=256, rope_theta=10000.0)),
        {"tokens": rng.integers(0, 8192, (batch_size, 257))}, batch_size * 256)
    gpt, gpt_torch, gpt_batch, gpt_tokens = setups["gpt"]
    setups["gpt_deep"] = (gpt.replace(d_model=256, num_heads=4, d_ff=1024, decoder_layers=12),
                          lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
                              n_embd=256, n_layer=12, n_head=4, vocab_size=8192, n_positions=256, resid_pdrop=0.0,
                              embd_pdrop=0.0, attn_pdrop=0.0)), gpt_batch, gpt_tokens)
    mixtral = jf.config("tiny-mixtral").replace(d_model=256, num_heads=8, num_kv_heads=2, d_ff=512, decoder_layers=4,
                                                vocab_size=8192, max_positions=256, num_experts=8, experts_per_token=2,
                                                router_aux_loss_coef=0.0)
    for name, kernels in (("mixtral", {}), ("mixtral_eager", {"attn_implementation": "eager",
                                                              "experts_implementation": "eager"})):
        setups[name] = (mixtral, lambda kernels=kernels: transformers.MixtralForCausalLM._from_config(
            transformers.MixtralConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                                       num_key_value_heads=2, vocab_size=8192, max_position_embeddings=256,
                                       num_local_experts=8, num_experts_per_tok=2, rope_theta=1e6,
                                       router_aux_loss_coef=0.0), **kernels),
            {"tokens": rng.integers(0, 8192, (batch_size, 257))}, batch_size * 256)
    return setups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--only", default="gpt,bert,t5,llama,gpt_deep,mixtral,mixtral_eager,lora")
    parser.add_argument("--skip-compile", action="store_true", help="skip the full-size gpt2 compile time")
    parser.add_argument("--no-torch-compile", action="store_true", help="leave out the torch.compile column")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import torch
    import transformers
    from flax import nnx

    import jaxformer as jf
    from jaxformer.flops import peak_flops, utilization

    transformers.logging.set_verbosity_error()
    setups = workloads(jf, transformers, np.random.default_rng(0))
    peak, peak_source = peak_flops("float32")
    # first, cold, as a user's first compile
    gpt2_compile_s = None if args.skip_compile else gpt2_compile_seconds(jax, jnp, optax, nnx, jf)
    results, lora = {}, None
    for name in args.only.split(","):
        if name == "lora":
            cfg, _, batch, _ = setups["gpt"]
            lora = lora_comparison(cfg, batch, args.steps, args.warmup, jax, jnp, optax, nnx, jf)
            continue
        cfg, make_torch, batch, tokens = setups[name]
        step, state, params, flops_per_token = jaxformer_step(cfg, name, batch, jax, jnp, optax, nnx, jf)
        jax_batch = {k: jnp.asarray(v) for k, v in batch.items()}
        start = time.perf_counter()
        state, loss = step(state, jax_batch)
        loss.block_until_ready()
        compile_s = time.perf_counter() - start
        torch_batch = {k: torch.as_tensor(v) for k, v in batch.items()}
        torch_model = make_torch().train()
        runs = {"torch": torch_step(torch_model, name, torch_batch, torch)}
        compiled_model = None
        if not args.no_torch_compile:  # its own copy: inductor compiles forward and backward on the first steps
            compiled_model = make_torch().train()
            runs["torch_compile"] = torch_step(torch.compile(compiled_model), name, torch_batch, torch)
            start = time.perf_counter()
            runs["torch_compile"]()
            torch_compile_s = time.perf_counter() - start
        for _ in range(args.warmup):
            state, loss = step(state, jax_batch)
            for run in runs.values():
                run()
        loss.block_until_ready()
        times = {"jaxformer": [], **{side: [] for side in runs}}
        for _ in range(args.steps):  # in turn, so every side sees the same machine load
            start = time.perf_counter()
            state, loss = step(state, jax_batch)
            loss.block_until_ready()
            times["jaxformer"].append(time.perf_counter() - start)
            for side, run in runs.items():
                times[side].append(_timed(run))
        ours = tokens / statistics.median(times["jaxformer"])
        theirs = tokens / statistics.median(times["torch"])
        results[name] = {"jaxformer_tok_s": round(ours, 1), "torch_tok_s": round(theirs, 1),
                         "ratio": round(ours / theirs, 3), "mfu": round(utilization(flops_per_token * ours, "float32"), 3),
                         "compile_s": round(compile_s, 1), "params": int(params)}
        if compiled_model is not None:
            compiled = tokens / statistics.median(times["torch_compile"])
            results[name].update(torch_compile_tok_s=round(compiled, 1), ratio_vs_compile=round(ours / compiled, 3),
                                 torch_compile_s=round(torch_compile_s, 1))
        del torch_model, compiled_model, state
    peak, peak_source = peak_flops("float32")  # as raised by any step that outran the probe
    if args.json:
        print(json.dumps({**results, "peak_flops": round(peak), "peak_source": peak_source, "gpt2_124m_compile_s": gpt2_compile_s and round(gpt2_compile_s, 1),
                          **({"lora": lora} if lora else {})}))
        return
    if results:
        print(f"float32 train steps, median of {args.steps}; peak {peak / 1e9:.0f} GFLOP/s ({peak_source})")
        print(f"{'model':<14} {'params':>12} {'jaxformer tok/s':>16} {'torch tok/s':>12} {'ratio':>7} "
              f"{'compiled tok/s':>15} {'ratio':>7} {'MFU':>6} {'compile':>8}")
    for name, r in results.items():
        compiled = (f"{r['torch_compile_tok_s']:>15.0f} {r['ratio_vs_compile']:>6.2f}x" if "torch_compile_tok_s" in r
                    else f"{'-':>15} {'-':>7}")
        print(f"{name:<14} {r['params']:>12,} {r['jaxformer_tok_s']:>16.0f} {r['torch_tok_s']:>12.0f} "
              f"{r['ratio']:>6.2f}x {compiled} {r['mfu']:>6.1%} {r['compile_s']:>7.1f}s")
    if lora:
        print(f"fine-tune steps of the gpt shape, median of {args.steps}, interleaved; memory = weights + grads + "
              "AdamW moments, from shapes")
        print(f"{'step':<8} {'trained':>12} {'step s':>8} {'vs full':>8} {'weights MB':>11} {'grads MB':>9} "
              f"{'adam MB':>8} {'total MB':>9}")
        for name, r in lora.items():
            print(f"{name:<8} {r['trained_params']:>12,} {r['step_s']:>8.3f} {r['speedup_vs_full']:>7.2f}x "
                  f"{r['weights_bytes'] / 1e6:>11.1f} {r['grads_bytes'] / 1e6:>9.2f} {r['adam_bytes'] / 1e6:>8.2f} "
                  f"{r['total_bytes'] / 1e6:>9.1f}")
    if gpt2_compile_s is not None:
        print(f"compile of a full-size gpt2 (124M, 8 x 1024, scanned) train step, ahead of time: "
              f"{gpt2_compile_s:.1f} s (target: under 30 s)")


if __name__ == "__main__":
    main()
