"""What the encoder family's ideas cost and save, measured side by side on this machine.

``albert``: ALBERT's one shared layer (configs/albert_sop.yaml: six layers of width 128, 64-wide embeddings)
against the same model with six separate layers: parameters, the bytes a checkpoint holds (parameters and
AdamW's two moments), and the time of a jitted, donated sop train step, the two timed interleaved
(A, B, A, B, ...) so machine noise hits both. Sharing divides what is stored, not what is computed.

``electra``: an ELECTRA step (configs/electra_rtd.yaml: the generator's MLM and the discriminator's pass over
the corrupted rows) against a plain MLM step of the same discriminator, interleaved: the time ratio and the
model-FLOPs ratio (jaxformer.flops) of what the generator adds.

``modernbert``: ModernBERT's alternating local attention (two of every three layers see 64 tokens either side)
against the same model with every layer global, at 1024 tokens: forward step times, interleaved.

``deberta``: DeBERTa's disentangled attention at 512 tokens (d_model 256, 4 layers): v3's (256 log buckets,
positions through each layer's own q and k, the 512-row table normed) and v1's (exact distances up to 512,
position projections of their own, 1024 rows) against the same encoder with BERT's learned absolute positions:
the time of a jitted forward and backward pass, interleaved, its model-FLOPs ratio and the parameters.

    python benchmarks/encoders.py [albert|electra|modernbert|deberta|all] [--repeats 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _step(config: str, overrides: list[str]):
    """(jitted train step, its state, one batch, the run) of a config, built as train.py builds it."""
    from flax import nnx

    from jaxformer.sharding import shardings_of
    from jaxformer.train import run_config
    from jaxformer.train.run import Run
    from jaxformer.train.steps import init_state, make_optimizer, make_steps

    cfg = run_config.load(str(ROOT / config), ["run.dir=/tmp/jaxformer-encoders-benchmark", *overrides])
    run = Run.build(cfg)
    graphdef, params, rest = nnx.split(run.model, nnx.Param, ...)
    optimizer, _ = make_optimizer(cfg, params)
    state = init_state(cfg, run.model, optimizer)
    train_step, _ = make_steps(graphdef, rest, optimizer, run.objective, cfg, run.mesh, shardings_of(state))
    return train_step, state, run.objective.batch(0, cfg.train.batch_size), run


def _interleaved(sides: dict, repeats: int) -> dict[str, float]:
    """Median seconds per call of each side's ``run()``, the sides timed in turn ``repeats`` times."""
    import jax

    for run in sides.values():  # compile and warm up
        jax.block_until_ready(run())
    times = {name: [] for name in sides}
    for _ in range(repeats):
        for name, run in sides.items():
            start = time.perf_counter()
            jax.block_until_ready(run())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _stepper(step, state, batch):
    """A run() that applies the donated step to its own state, carried from call to call."""
    holder = {"state": state}

    def run():
        holder["state"], metrics = step(holder["state"], batch)
        return metrics
    return run


def _bytes(tree) -> int:
    import jax

    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree) if hasattr(leaf, "dtype"))


def albert(repeats: int) -> dict:
    sides, record = {}, {}
    for name, shared in (("shared", "true"), ("unshared", "false")):
        step, state, batch, run = _step("configs/albert_sop.yaml", [f"model.overrides.shared_layers={shared}"])
        import jaxformer as jf
        record[name] = {"params": jf.param_count(run.model.config),
                        "checkpoint_bytes": _bytes(state["params"]) + _bytes(state["opt_state"])}
        sides[name] = _stepper(step, state, batch)
    seconds = _interleaved(sides, repeats)
    for name in sides:
        record[name]["step_ms"] = round(1000 * seconds[name], 1)
    record["params_ratio"] = round(record["unshared"]["params"] / record["shared"]["params"], 2)
    record["step_time_ratio"] = round(seconds["shared"] / seconds["unshared"], 3)
    return record


def electra(repeats: int) -> dict:
    from jaxformer.flops import train_flops_per_step

    rtd = _step("configs/electra_rtd.yaml", [])
    mlm = _step("configs/electra_rtd.yaml", ["train.objective=mlm", "data.nsp=false"])
    seconds = _interleaved({"rtd": _stepper(*rtd[:3]), "mlm": _stepper(*mlm[:3])}, repeats)
    batch, length = rtd[3].cfg.train.batch_size, rtd[3].cfg.train.seq_len
    flops = {name: train_flops_per_step(run.model.config, batch, length) for name, (*_, run) in
             (("rtd", rtd), ("mlm", mlm))}
    return {"rtd_step_ms": round(1000 * seconds["rtd"], 1), "mlm_step_ms": round(1000 * seconds["mlm"], 1),
            "time_ratio": round(seconds["rtd"] / seconds["mlm"], 3),
            "flops_ratio": round(flops["rtd"] / flops["mlm"], 3)}


def modernbert(repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxformer as jf

    cfg = jf.config("modernbert-base").replace(vocab_size=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2, d_model=256, num_heads=4, d_ff=384, encoder_layers=6,
                                               layer_types=("full", "sliding", "sliding") * 2, max_positions=1024)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 1024, (2, 1024)))
    sides = {}
    for name, changes in (("alternating", {}), ("global", dict(attention="bidirectional", window_size=None,
                                                               layer_types=None, local_rope_theta=None))):
        model = jf.build(cfg.replace(**changes))
        forward = jax.jit(lambda m, x: m(x).last_hidden_state)
        sides[name] = lambda model=model, forward=forward: forward(model, ids)
    seconds = _interleaved(sides, repeats)
    return {"alternating_ms": round(1000 * seconds["alternating"], 1), "global_ms": round(1000 * seconds["global"], 1),
            "time_ratio": round(seconds["alternating"] / seconds["global"], 3)}


def deberta(repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    import jaxformer as jf
    from jaxformer.flops import train_flops_per_step

    length, batch = 512, 4
    v3 = jf.config("deberta-v3-small").replace(vocab_size=1024, d_model=256, num_heads=4, d_ff=1024, encoder_layers=4,
                                               dropout_rate=0.0, attention_dropout_rate=0.0)
    variants = {"v3": v3, "v1": jf.config("deberta-base").replace(
        vocab_size=1024, d_model=256, num_heads=4, d_ff=1024, encoder_layers=4, dropout_rate=0.0,
        attention_dropout_rate=0.0),
        "absolute": v3.replace(position="learned", position_buckets=0, share_attention_key=False,
                               relative_embedding_norm=False)}
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 1024, (batch, length)))
    sides, record = {}, {}
    for name, cfg in variants.items():
        graphdef, params = nnx.split(jf.build(cfg), nnx.Param)
        grad = jax.jit(jax.grad(lambda p, graphdef=graphdef: jnp.mean(nnx.merge(graphdef, p)(ids).last_hidden_state ** 2)))
        sides[name] = lambda grad=grad, params=params: grad(params)
        record[name] = {"params": jf.param_count(cfg), "flops": train_flops_per_step(cfg, batch, length)}
    seconds = _interleaved(sides, repeats)
    out = {f"{name}_ms": round(1000 * seconds[name], 1) for name in sides}
    for name in ("v3", "v1"):
        out[f"{name}_time_ratio"] = round(seconds[name] / seconds["absolute"], 3)
        out[f"{name}_flops_ratio"] = round(record[name]["flops"] / record["absolute"]["flops"], 3)
        out[f"{name}_params"] = record[name]["params"]
    out["absolute_params"] = record["absolute"]["params"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="?", default="all", choices=("albert", "electra", "modernbert", "deberta", "all"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    chosen = ("albert", "electra", "modernbert", "deberta") if args.which == "all" else (args.which,)
    results = {name: globals()[name](args.repeats) for name in chosen}
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for name, record in results.items():
        print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in record.items()))


if __name__ == "__main__":
    main()
