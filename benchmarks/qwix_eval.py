"""Does Google's qwix (LoRA, QLoRA, PTQ int8) fit jaxformer's scanned, logically sharded NNX modules?

Two questions, answered by running it:

1. Model level: ``qwix.quantize_model`` with a PTQ int8 rule and ``qwix.apply_lora_to_model`` on
   ``jf.build("tiny-llama")``, with its layers scanned (the default) and unrolled (``scan_layers=False``).
   Prints, per case, what happened: the exception, or the error of the logits and which variables qwix
   added. qwix finds a weight by intercepting ``jnp.einsum`` / ``lax.dot_general`` inside a module's
   method and then writes the quantized weight (or the LoRA factors) back onto that module object.
2. Op level, where the model level fails: qwix's core ``qwix.einsum`` on ``QArray`` operands against
   jaxformer's own int8 projection (``jaxformer.layers.weights.project``) at gpt2 decode shapes (one
   token per row, rows 1 and 8; an MLP kernel 768 x 3072 and the tied head 50257 x 768), weight-only and
   with activations quantized too, interleaved, median microseconds and the ratio to float32.

    python benchmarks/qwix_eval.py [--repeats 30]

Exits 0 with a note when qwix is not installed (it is not a dependency of jaxformer).
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
import warnings


def model_level(jf, qwix, nnx, jnp, np) -> None:
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 12)), jnp.int32)
    for scan in (True, False):
        base = jf.build(jf.config("tiny-llama").replace(scan_layers=scan), seed=0)
        reference = np.asarray(base(ids).logits)
        before = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(base))}
        cases = {
            "PTQ int8 (quantize_model)": lambda: qwix.quantize_model(
                base, qwix.PtqProvider([qwix.QuantizationRule(module_path=".*", weight_qtype="int8")]), ids),
            "LoRA rank 4 (apply_lora_to_model)": lambda: qwix.apply_lora_to_model(
                base, qwix.LoraProvider(module_path=".*", rank=4, alpha=8.0), ids, rngs=nnx.Rngs(0)),
        }
        for label, make in cases.items():
            where = f"tiny-llama scan_layers={scan}: {label}"
            try:
                model = make()
                error = np.linalg.norm(np.asarray(model(ids).logits) - reference) / np.linalg.norm(reference)
                after = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model))}
                print(f"{where}: ran; logits relative error {error:.2e}; new variables {sorted(after - before)[:6]}")
            except Exception as exc:  # the finding is the exception itself
                frames = traceback.extract_tb(exc.__traceback__)
                site = next((f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in reversed(frames)
                             if "jaxformer" in f.filename or "qwix" in f.filename), "?")
                print(f"{where}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:160]} (at {site})")


def op_level(jf, qwix, nnx, jax, jnp, np, repeats: int) -> None:
    from jaxformer.layers.weights import project, projection

    cfg = jf.config("gpt2")
    rng = np.random.default_rng(0)
    print(f"\nop level, median of {repeats} interleaved calls, microseconds (ratio to float32)")
    print(f"{'shape':>22} {'rows':>4} {'float32':>8} {'jf int8':>14} {'qwix int8':>14} {'jf int8_dyn':>14} "
          f"{'qwix w8a8':>14}")
    for name, (d_in, d_out), equation in (("mlp wi 768x3072", (768, 3072), "BTD,DF->BTF"),
                                          ("tied head 50257x768", (50257, 768), "BTD,FD->BTF")):
        shape = (d_in, d_out) if equation.endswith("DF->BTF") else (d_in, d_out)
        w = jnp.asarray(rng.standard_normal(shape) * 0.02, jnp.float32)
        out_axis = 1 if equation.split(",")[1].startswith("D") else 0
        modules = {}
        for kind in ("int8", "int8_dynamic"):
            holder = nnx.Module()
            k_cfg = cfg.replace(quantize=kind)
            axes = ("embed", "mlp") if out_axis == 1 else ("vocab", "embed")
            # inputs=1, batch=0 for D->F; the head's kernel has its output first, so it is a batch axis
            projection(holder, "w", k_cfg, nnx.Rngs(0), shape, axes, inputs=1, batch=0 if out_axis == 1 else 1)
            modules[kind] = holder
        qw = qwix.quantize(w, jnp.int8, channelwise_axes=(out_axis,))
        for rows in (1, 8):
            x = jnp.asarray(rng.standard_normal((rows, 1, 768)), jnp.float32)
            fns = {
                "float32": jax.jit(lambda x, w: jnp.einsum(equation, x, w)),
                "jf int8": jax.jit(lambda x, m: project(m, "w", x, equation, jnp.float32)),
                "qwix int8": jax.jit(lambda x, q: qwix.einsum(equation, x, q)),
                "jf int8_dyn": jax.jit(lambda x, m: project(m, "w", x, equation, jnp.float32)),
                "qwix w8a8": jax.jit(lambda x, q: qwix.einsum(
                    equation, qwix.quantize(x, jnp.int8, channelwise_axes=(0, 1)), q)),
            }
            args = {"float32": w, "jf int8": modules["int8"], "qwix int8": qw, "jf int8_dyn": modules["int8_dynamic"],
                    "qwix w8a8": qw}
            times = {k: [] for k in fns}
            for k, f in fns.items():
                jax.block_until_ready(f(x, args[k]))
            for _ in range(repeats):
                for k, f in fns.items():
                    start = time.perf_counter()
                    jax.block_until_ready(f(x, args[k]))
                    times[k].append(time.perf_counter() - start)
            us = {k: statistics.median(v) * 1e6 for k, v in times.items()}
            cells = [f"{us[k]:>7.0f} ({us[k] / us['float32']:.2f})" for k in list(fns)[1:]]
            print(f"{name:>22} {rows:>4} {us['float32']:>8.0f} " + " ".join(f"{c:>14}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    try:
        import qwix
    except ImportError:
        print("qwix is not installed (pip install qwix); nothing to evaluate")
        return
    warnings.filterwarnings("ignore")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    import jaxformer as jf

    print(f"qwix {getattr(qwix, '__version__', '?')}, jax {jax.__version__}, flax {nnx.__name__.split('.')[0]} "
          f"on {jax.devices()[0].device_kind}")
    model_level(jf, qwix, nnx, jnp, np)
    op_level(jf, qwix, nnx, jax, jnp, np, args.repeats)


if __name__ == "__main__":
    main()
