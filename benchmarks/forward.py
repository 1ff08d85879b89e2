"""Forward (inference) throughput on CPU: jaxformer vs transformers' PyTorch models, float32, one run.

A BERT-base-shaped encoder (sequence 128), a T5-small-shaped encoder-decoder (source 128, target 32); with
``--only gemma,t5gemma`` Gemma 2 and T5Gemma blocks at that size (sliding windows and soft caps on); with
``--only xlnet``, an XLNet-base-shaped Transformer-XL segment (128 tokens over a memory of 128, the
evaluation workload of a memory model; transformers' ``XLNetLMHeadModel`` with ``mems``), random weights,
batch 8, no padding. jaxformer runs one jitted forward pass (compiled before timing);
PyTorch runs its eager model under ``torch.inference_mode`` with its default attention (SDPA). Both
sides alternate call by call so they see the same machine load; tokens/s come from the median time.
The target the accelerator issue sets is at least 1.0x on each, aiming for 1.1x.

    python benchmarks/forward.py [--repeats 20] [--batch 8] [--json]
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
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--only", default="bert,t5")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import jax
    import numpy as np
    import torch
    import transformers

    import jaxformer as jf

    transformers.logging.set_verbosity_error()
    rng = np.random.default_rng(0)
    B = args.batch
    def xlnet_memory():
        """A full memory of 128 tokens, the same numbers on both sides: [L, B, M, D] here, L x [M, B, D] there."""
        from jaxformer.cache import Memory

        hidden = rng.standard_normal((12, B, 128, 768)).astype(np.float32)
        return ({"memory": Memory(jax.numpy.asarray(hidden), jax.numpy.ones((B, 128), bool))},
                {"mems": [torch.as_tensor(h.transpose(1, 0, 2).copy()) for h in hidden], "use_mems": True})

    gemma_shape = dict(vocab_size=32000, d_model=768, num_heads=8, num_kv_heads=4, head_dim=96, d_ff=3072,
                       window_size=64, attention_scale=96 ** -0.5, max_positions=512)
    gemma_types = lambda n: tuple("full" if i % 2 else "sliding" for i in range(n))  # noqa: E731
    gemma_hf = dict(vocab_size=32000, hidden_size=768, num_attention_heads=8, num_key_value_heads=4, head_dim=96,
                    intermediate_size=3072, sliding_window=64, query_pre_attn_scalar=96, max_position_embeddings=512)
    setups = {
        "bert": (jf.config("bert-base-uncased").replace(dropout_rate=0.0, attention_dropout_rate=0.0),
                 lambda: transformers.BertModel(transformers.BertConfig()),
                 {"input_ids": rng.integers(0, 30522, (B, 128))}, B * 128),
        "t5": (jf.config("t5-small").replace(dropout_rate=0.0),
               lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
                   d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_heads=8, vocab_size=32128)),
               {"input_ids": rng.integers(0, 32128, (B, 128)), "decoder_input_ids": rng.integers(0, 32128, (B, 32))},
               B * (128 + 32)),
        # Gemma 2's block at about BERT-base size (12 x 768, 8/4 heads of 96, GeGLU 3072, vocab 32000): sliding
        # window 64 under 128 tokens on alternate layers, soft caps on; transformers runs it eagerly (its SDPA
        # path has no soft-capping). T5Gemma: the same block, 6 + 6 layers, source 128 and target 32.
        "gemma": (jf.config("tiny-gemma").replace(**gemma_shape, decoder_layers=12, layer_types=gemma_types(12)),
                  lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
                      **gemma_hf, num_hidden_layers=12, attn_implementation="eager")),
                  {"input_ids": rng.integers(0, 32000, (B, 128))}, B * 128),
        "t5gemma": (jf.config("tiny-t5gemma").replace(**gemma_shape, encoder_layers=6, decoder_layers=6,
                                                      layer_types=gemma_types(6)),
                    lambda: transformers.T5GemmaForConditionalGeneration(transformers.T5GemmaConfig(
                        encoder={**gemma_hf, "num_hidden_layers": 6}, decoder={**gemma_hf, "num_hidden_layers": 6},
                        vocab_size=32000, attn_implementation="eager")),
                    {"input_ids": rng.integers(0, 32000, (B, 128)), "decoder_input_ids": rng.integers(0, 32000, (B, 32))},
                    B * (128 + 32)),
        "xlnet": (jf.config("xlnet-base-cased").replace(dropout_rate=0.0, attention_dropout_rate=0.0, memory_len=128),
                  lambda: transformers.XLNetLMHeadModel(transformers.XLNetConfig(
                      d_model=768, n_layer=12, n_head=12, d_inner=3072, mem_len=128, dropout=0.0)),
                  {"input_ids": rng.integers(0, 32000, (B, 128))}, B * 128),
    }
    results = {}
    for name in args.only.split(","):
        cfg, make_torch, batch, tokens = setups[name]
        graphdef, state = jf.split(jf.build(cfg))

        def forward(state, batch, graphdef=graphdef):
            out = jf.merge(graphdef, state)(**batch)
            return out.logits if out.logits is not None else out.last_hidden_state

        forward = jax.jit(forward)
        jax_batch = {k: jax.numpy.asarray(v) for k, v in batch.items()}
        extra_jax, extra_torch = xlnet_memory() if name == "xlnet" else ({}, {})
        jax_batch.update(extra_jax)
        start = time.perf_counter()
        forward(state, jax_batch).block_until_ready()
        compile_s = time.perf_counter() - start
        torch_model = make_torch().eval()
        torch_batch = {**{k: torch.as_tensor(v) for k, v in batch.items()}, **extra_torch}

        def run_torch():
            with torch.inference_mode():
                torch_model(**torch_batch)

        def run_jax():
            forward(state, jax_batch).block_until_ready()

        for _ in range(args.warmup):
            run_jax()
            run_torch()
        times = {"jaxformer": [], "torch": []}
        for _ in range(args.repeats):
            times["jaxformer"].append(_timed(run_jax))
            times["torch"].append(_timed(run_torch))
        ours = tokens / statistics.median(times["jaxformer"])
        theirs = tokens / statistics.median(times["torch"])
        results[name] = {"jaxformer_tok_s": round(ours, 1), "torch_tok_s": round(theirs, 1),
                         "ratio": round(ours / theirs, 3), "compile_s": round(compile_s, 2)}
    if args.json:
        print(json.dumps(results))
        return
    print(f"float32 forward passes, batch {B}, median of {args.repeats}")
    print(f"{'model':<6} {'jaxformer tok/s':>16} {'torch tok/s':>12} {'ratio':>7} {'compile':>8}")
    for name, r in results.items():
        print(f"{name:<6} {r['jaxformer_tok_s']:>16.0f} {r['torch_tok_s']:>12.0f} {r['ratio']:>6.2f}x "
              f"{r['compile_s']:>7.1f}s")


if __name__ == "__main__":
    main()
