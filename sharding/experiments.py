"""The same training step under each parallelism strategy, against the single-device run.

    python sharding/experiments.py [--model tiny-gpt] [--strategies single,pmap,shard_map,dp,fsdp,tp,fsdp_tp]
                                   [--devices 8] [--steps 5] [--json] [--longest]

Strategies (n devices):
    single     one device, jit
    pmap       explicit data parallelism: jax.pmap, gradients summed with psum
    shard_map  explicit data parallelism: jax.shard_map over a 1-D mesh, gradients summed with psum
    dp         jit with shardings, mesh data=n (parameters replicated, batch split)
    fsdp       jit with shardings, mesh fsdp=n (parameters and optimizer state split along `embed`)
    tp         jit with shardings, mesh tensor=t x data=n/t (heads, MLP width, vocabulary split)
    fsdp_tp    jit with shardings, mesh fsdp=n/t x tensor=t
    ep         jit with shardings, mesh expert=e x data=n/e (MoE models only): experts split, every device its
               own rows, tokens sent to their experts' devices and back with an all-to-all
    ep_gspmd   ep's mesh, with the grouped dispatch's partitioning left to GSPMD (moe_dispatch=grouped)
    cp         jit with shardings, mesh sequence=s x data=n/s (context parallelism: every sequence split
               over s devices, ring attention)
    pp         jit with shardings, mesh stage=p x data=n/p (pipeline parallelism, GPipe: each stack's layers
               in p stages, --microbatches flowing through them)
    pp_circular  pp's mesh with the circular schedule: each stage holds 2 chunks of layers, a microbatch
               goes round the ring twice
t (e) is the largest divisor of n, at most n/2 for fsdp_tp, that divides every dimension it splits; s the
largest divisor of n whose 2 s divides the sequence length; p the largest divisor of n, at most n/2, that
divides every stack's layers (2 p for pp_circular; ``--layers`` sets them).

Under pp the table's last lines give each pipeline's bubble: the ideal share of a step a stage idles,
(p - 1) / (M R + p - 1) for M microbatches and R chunks a stage, and the measured one, 1 - (single's step
time / n) / the pipeline's step time: what the step loses against a perfect split of single's work over the
n devices (p stages x n/p data-parallel rows).
On simulated CPU devices the p stages share the host's cores, so the measured figure there holds that
sharing too (docs/sharding.md, "Pipeline parallelism").

Each row also reports the bytes each device sends per step (from the compiled program's collectives,
``sharding.communicated_bytes``; a scanned layer's count once per layer) and the step's temporary memory per
device (XLA's compiled memory analysis: activations and everything else the step allocates besides its
arguments). ``--longest`` doubles the sequence length under ``single`` and ``cp`` while that memory stays within
what ``single`` needs at ``--seq-len``, and prints the longest length each fits (compiled only, never run).

Every strategy starts from the same parameters and takes the same batch; after one step it reports the max
abs difference of the loss and of the updated parameters against `single`, then times ``--steps`` more.
Every strategy asked for is checked (mesh, pipeline schedule) before any compiles, and one that cannot run is
refused in one line (exit 2); one that fails while running leaves the rows of those that finished printed,
then its traceback and a one-line summary (exit 1).
The model trains with its family's objective (causal LM, BERT MLM + NSP, T5 span corruption) and AdamW.
``--devices N`` simulates N CPU devices when no accelerator is present (it must come before JAX starts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

OBJECTIVES = {"decoder": "causal_lm", "encoder": "mlm", "encoder_decoder": "span_corruption"}
ALL = ("single", "pmap", "shard_map", "dp", "fsdp", "tp", "fsdp_tp", "ep", "ep_gspmd", "cp", "pp", "pp_circular")
PIPELINES = {"pp": 1, "pp_circular": 2}  # chunks of layers a stage holds


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-gpt", help="a preset (tiny-gpt, tiny-bert, tiny-t5, tiny-mixtral...)")
    parser.add_argument("--strategies", default="single,pmap,shard_map,dp,fsdp,tp,fsdp_tp",
                        help=f"comma-separated, from {','.join(ALL)}")
    parser.add_argument("--devices", type=int, help="simulate this many CPU devices (default: the devices present)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps after the compared one")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--layers", type=int, default=0, help="each stack's layers (default: the preset's)")
    parser.add_argument("--microbatches", type=int, default=0,
                        help="pp and pp_circular: microbatches a step (default: two per stage)")
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    parser.add_argument("--longest", action="store_true",
                        help="the longest sequence single and cp fit in single's memory at --seq-len")
    args = parser.parse_args(argv)
    args.strategies = args.strategies.split(",")
    unknown = [s for s in args.strategies if s not in ALL]
    if unknown:
        parser.error(f"unknown strategies {unknown}; valid: {', '.join(ALL)}")
    if "single" not in args.strategies:
        args.strategies.insert(0, "single")  # the reference of every diff
    return args


def largest_divisor(n: int, dims: list[int], cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0 and all(x % d == 0 for x in dims))


def mesh_shape(strategy: str, n: int, cfg, seq_len: int) -> dict[str, int]:
    split_by_tensor = [cfg.num_heads, cfg.kv_heads, cfg.d_ff, cfg.vocab_size]
    if strategy in ("single",):
        return {"data": 1}
    if strategy in PIPELINES:
        stacks, chunks = [layers for layers in (cfg.encoder_layers, cfg.decoder_layers) if layers], PIPELINES[strategy]
        stage = max((d for d in range(2, n // 2 + 1) if n % d == 0 and all(layers % (d * chunks) == 0
                                                                            for layers in stacks)), default=None)
        if stage is None:
            raise ValueError(f"strategy {strategy!r}: {cfg.name}'s stacks of {stacks} layers do not split into 2 or "
                             f"more stages x {chunks} chunks on {n} devices; give --layers")
        return {"data": n // stage, "stage": stage}
    if strategy == "cp":
        sequence = max(d for d in range(1, n + 1) if n % d == 0 and seq_len % (2 * d) == 0)
        return {"data": n // sequence, "sequence": sequence}
    if strategy in ("dp", "pmap", "shard_map"):
        return {"data": n}
    if strategy == "fsdp":
        return {"fsdp": n}
    if strategy == "tp":
        tensor = largest_divisor(n, split_by_tensor, n)
        return {"data": n // tensor, "tensor": tensor}
    if strategy == "fsdp_tp":
        tensor = largest_divisor(n, split_by_tensor, max(n // 2, 1))
        return {"fsdp": n // tensor, "tensor": tensor}
    if cfg.experts is None:
        raise ValueError(f"strategy {strategy!r} needs a mixture-of-experts model; {cfg.name} has none")
    expert = largest_divisor(n, [cfg.experts.count], n)
    return {"data": n // expert, "expert": expert}


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.devices:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}".strip()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    import jax
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxformer as jf
    from jaxformer import sharding
    from jaxformer.layers.pipeline import schedule
    from jaxformer.train import run_config
    from jaxformer.sharding import shardings_of
    from jaxformer.train.run import Run, check_pipeline, executed, preset_model_config
    from jaxformer.train.steps import init_state, make_optimizer, make_steps

    def refuse(err: ValueError) -> int:
        print(f"experiments.py: error: {err}", file=sys.stderr)
        return 2

    devices = jax.devices()
    n = len(devices)
    try:
        model_cfg = jf.config(args.model)
        # lr 1e-4: Adam's first step divides each gradient by its own size (+ eps), so an element whose gradient
        # is near eps turns rounding differences between layouts into parameter differences up to lr x 1e-2 (1.6e-5
        # at lr 1e-3 seen); at 1e-4 rounding stays well under the 1e-5 bar, while a wrong update (about lr) is 10x over.
        overrides = [f"model.preset={args.model}", f"train.objective={OBJECTIVES[model_cfg.family]}",
                     f"train.batch_size={args.batch_size}", f"train.seq_len={args.seq_len}", "optim.warmup_steps=0",
                     "optim.lr=1e-4", "optim.clip_norm=1.0", "run.seed=0"]
        if model_cfg.family != "decoder":
            overrides.append("model.overrides.vocab_size=360")  # room for the byte tokenizer's specials
        if args.layers:
            stacks = {"decoder": ["decoder_layers"], "encoder": ["encoder_layers"]}.get(
                model_cfg.family, ["encoder_layers", "decoder_layers"])
            overrides += [f"model.overrides.{stack}={args.layers}" for stack in stacks]
            model_cfg = model_cfg.replace(**{stack: args.layers for stack in stacks})
        cfg = run_config.load(None, overrides)
    except ValueError as err:
        return refuse(err)

    def strategy_plan(strategy: str, cfg=cfg):
        """The mesh shape, mesh and run config of ``strategy``, checked as far as it can be without compiling
        (a ValueError naming the strategy)."""
        try:
            shape = mesh_shape(strategy, n, model_cfg, cfg.train.seq_len)
            if strategy == "ep_gspmd":
                cfg = run_config.load(None, overrides + ["model.overrides.moe_dispatch=grouped"])
            if strategy in PIPELINES:
                microbatches = args.microbatches or 2 * shape["stage"]
                cfg = run_config.load(None, overrides + [f"mesh.stage={shape['stage']}", f"mesh.data={shape['data']}",
                                                         f"train.microbatches={microbatches}",
                                                         f"train.pipeline_repeats={PIPELINES[strategy]}"])
            mesh = sharding.make_mesh(shape, devices[:1] if strategy == "single" else devices)
            check_pipeline(cfg, executed(preset_model_config(cfg), cfg), mesh)
        except ValueError as err:
            raise ValueError(str(err) if str(err).startswith(f"strategy {strategy!r}") else
                             f"strategy {strategy!r}: {err}") from None
        return shape, mesh, cfg

    def one_strategy(strategy: str, batch: dict, cfg=cfg, compile_only: bool = False) -> dict:
        shape, mesh, cfg = strategy_plan(strategy, cfg)
        run = Run.build(cfg, mesh=mesh)
        graphdef, params, rest = nnx.split(run.model, nnx.Param, ...)
        optimizer, _ = make_optimizer(cfg, params)
        state = init_state(cfg, run.model, optimizer)
        if strategy in ("pmap", "shard_map"):
            step, state, batch_in = explicit_data_parallel(strategy, graphdef, rest, optimizer, run.objective,
                                                           state, batch, devices)
        else:
            train_step, _ = make_steps(graphdef, rest, optimizer, run.objective, cfg, mesh, shardings_of(state))
            batch_in = sharding.to_device(batch, NamedSharding(mesh, P(sharding.BATCH_AXES)))
            step = train_step
        start = time.perf_counter()
        compiled = step.lower(state, batch_in).compile()
        compile_s = time.perf_counter() - start
        temp_bytes = int(compiled.memory_analysis().temp_size_in_bytes)
        if compile_only:
            return {"strategy": strategy, "temp_bytes": temp_bytes}
        communicated = sharding.communicated_bytes(compiled.as_text())
        weights = {"params": state["params"], "opt_state": state["opt_state"]}
        # pmap takes host arrays with a leading device axis: each device holds one whole replica.
        held = (sum(np.asarray(x).nbytes for x in jax.tree.leaves(weights)) // n if strategy == "pmap"
                else sharding.bytes_per_device(weights))
        state, metrics = compiled(state, batch_in)
        if "loss" in metrics:  # explicit data parallelism: the all-reduced loss (one copy per device under pmap)
            loss = float(np.asarray(metrics["loss"]).reshape(-1)[0])
        else:
            loss = run.objective.finish({k: float(v[0] / max(v[1], 1.0))
                                         for k, v in jax.device_get(metrics["sums"]).items()})["loss"]
        grad_norm = float(np.asarray(metrics["grad_norm"]).reshape(-1)[0])
        params_after = [np.asarray(x[0] if strategy == "pmap" else x) for x in
                        jax.tree.leaves(jax.device_get(state["params"]))]
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            state, metrics = compiled(state, batch_in)
            jax.block_until_ready(state)
            times.append(time.perf_counter() - start)
        specs = {".".join(map(str, path)): str(v.get_value().sharding.spec) for path, v in
                 nnx.to_flat_state(state["params"] if strategy != "pmap" else nnx.state(run.model, nnx.Param))}
        return {"strategy": strategy, "mesh": shape, "step_ms": round(1000 * statistics.median(times), 2) if times
                else None, "compile_s": round(compile_s, 2), "bytes_per_device": int(held), "temp_bytes": temp_bytes,
                "communicated": communicated, "loss": loss, "schedule": (cfg.train.microbatches, cfg.train.pipeline_repeats),
                "grad_norm": grad_norm, "params": params_after, "specs": specs}

    def explicit_data_parallel(strategy, graphdef, rest, optimizer, objective, state, batch, devices):
        """A train step written with explicit collectives: each device's loss is its share of the
        global mean (numerators over the all-reduced denominators), so the summed gradient equals the
        single-device one."""

        def local_loss(params, rows):
            model = nnx.merge(graphdef, params, rest)
            _, sums = objective.loss(model, rows, None)
            total = sum(weight * sums[term][0] / jax.lax.psum(jax.lax.stop_gradient(sums[term][1]), "data")
                        for term, weight in objective.loss_terms.items() if term in sums)
            return total

        def step(state, rows):
            loss, grads = jax.value_and_grad(local_loss)(state["params"], rows)
            grads, loss = jax.lax.psum((grads, loss), "data")
            updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
            params = optax.apply_updates(state["params"], updates)
            metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
            return {**state, "params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

        host_state = jax.device_get(state)
        if strategy == "pmap":
            per_device = jax.tree.map(lambda x: x.reshape(n, x.shape[0] // n, *x.shape[1:]), batch)
            replicated = jax.tree.map(lambda x: np.broadcast_to(x, (n, *np.shape(x))), host_state)
            return jax.pmap(step, axis_name="data", donate_argnums=0), replicated, per_device
        mesh = jax.sharding.Mesh(np.array(devices), ("data",))
        # check_vma=False: gradients of the replicated parameters stay per-device, so the psum above is
        # the all-reduce (with varying-value checks on, shard_map's autodiff would insert it itself).
        mapped = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P(), P()),
                                       check_vma=False), donate_argnums=0)
        placed = jax.device_put(host_state, NamedSharding(mesh, P()))
        return mapped, placed, jax.device_put(batch, NamedSharding(mesh, P("data")))

    if model_cfg.experts is not None:
        # Explicit data parallelism computes the MoE load-balancing loss per device, which is not the
        # loss of the whole batch; compare it only where the step sees the whole batch.
        args.strategies = [s for s in args.strategies if s not in ("pmap", "shard_map")]
    try:  # every strategy's mesh and schedule before anything compiles
        if args.batch_size % n:
            raise ValueError(f"--batch-size {args.batch_size} does not divide over {n} devices")
        for strategy in ("single", "cp") if args.longest else args.strategies:
            strategy_plan(strategy)
        run0 = Run.build(cfg, mesh=sharding.make_mesh({"data": 1}, devices[:1]))
    except ValueError as err:
        return refuse(err)
    batch = run0.objective.batch(0, cfg.train.batch_size)
    if args.longest:
        return longest_sequences(args, cfg, one_strategy, run_config, Run)
    results, failure = [], None
    for strategy in args.strategies:
        try:
            results.append(one_strategy(strategy, batch))
        except Exception as err:  # noqa: BLE001 -- the rows that finished are printed first, then this
            failure = (f"{traceback.format_exc()}experiments.py: strategy {strategy!r} failed ({type(err).__name__}: "
                       f"{err}); the rows printed are the strategies that finished")
            break
    if not results:
        print(failure, file=sys.stderr)
        return 1
    reference = results[0]
    rows = []
    for r in results:
        param_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(r["params"], reference["params"]))
        rows.append({"strategy": r["strategy"], "mesh": r["mesh"], "step_ms": r["step_ms"], "compile_s": r["compile_s"],
                     "bytes_per_device": r["bytes_per_device"], "temp_bytes": r["temp_bytes"],
                     "communicated": r["communicated"], "loss_diff": abs(r["loss"] - reference["loss"]),
                     "param_diff": param_diff,
                     # Adam's first update is nearly lr * sign(g): blind to a wrongly scaled gradient, which this is not.
                     "grad_norm_rel_diff": abs(r["grad_norm"] / reference["grad_norm"] - 1), "specs": r["specs"]})
        if r["strategy"] in PIPELINES:
            stages, (microbatches, repeats) = r["mesh"]["stage"], r["schedule"]
            measured = (1 - reference["step_ms"] / n / r["step_ms"]) if r["step_ms"] and reference["step_ms"] else None
            rows[-1]["bubble"] = {"stages": stages, "microbatches": microbatches, "repeats": repeats,
                                  "ideal": schedule(stages, repeats, microbatches)[1], "measured": measured}
    if args.json:
        print(json.dumps(rows))
    else:
        print_table(args, rows, model_cfg, devices)
    if failure:
        print(failure, file=sys.stderr)
        return 1
    return 0 if all(max(r["loss_diff"], r["param_diff"], r["grad_norm_rel_diff"]) < 1e-5 for r in rows) else 1


def print_table(args, rows: list[dict], model_cfg, devices) -> None:
    """The rows as a table, then each pipeline's bubble."""
    n = len(devices)
    print(f"{args.model}: {n} {devices[0].platform} devices, batch {args.batch_size} x {args.seq_len}, "
          f"{OBJECTIVES[model_cfg.family]}, AdamW; diffs after one step against 'single'")
    header = (f"{'strategy':<12} {'mesh':<26} {'step ms':>9} {'compile s':>10} {'bytes/device':>13} {'temp/device':>12} "
              f"{'sent/device':>12} "
              f"{'loss diff':>10} {'param diff':>11} {'|g| rel diff':>13}")
    print(header)
    print("-" * len(header))
    for r in rows:
        mesh = " ".join(f"{k}={v}" for k, v in r["mesh"].items())
        print(f"{r['strategy']:<12} {mesh:<26} {r['step_ms'] or float('nan'):>9.2f} {r['compile_s']:>10.2f} "
              f"{r['bytes_per_device']:>13,} {r['temp_bytes']:>12,} {sum(r['communicated'].values()):>12,} "
              f"{r['loss_diff']:>10.2e} {r['param_diff']:>11.2e} "
              f"{r['grad_norm_rel_diff']:>13.2e}")
    for r in rows:
        if "bubble" in r:
            b = r["bubble"]
            measured = "not timed (--steps 0)" if b["measured"] is None else f"measured {b['measured']:.0%}"
            print(f"{r['strategy']}: {b['stages']} stages x {b['repeats']} chunks, {b['microbatches']} microbatches: "
                  f"bubble ideal {b['ideal']:.0%}, {measured} (1 - single's step / {n} devices / this step)")


def longest_sequences(args, cfg, one_strategy, run_config, Run) -> int:
    """For single and cp: the longest sequence (doubling from --seq-len) whose step's temporary memory per
    device stays within single's at --seq-len, or that the model's position table and the data allow (said
    so). Compiled only."""
    import dataclasses

    import jax

    from jaxformer import sharding

    def temp_bytes(strategy: str, seq_len: int) -> int:
        longer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seq_len=seq_len))
        one_device = sharding.make_mesh({"data": 1}, jax.devices()[:1])
        batch = Run.build(longer, mesh=one_device).objective.batch(0, longer.train.batch_size)
        return one_strategy(strategy, batch, cfg=longer, compile_only=True)["temp_bytes"]

    budget = temp_bytes("single", args.seq_len)
    rows = []
    for strategy in ("single", "cp"):
        length, used, limit = args.seq_len, budget, None
        while True:
            try:
                needed = temp_bytes(strategy, 2 * length)
            except ValueError as err:  # a longer sequence than the position table or the held-out text holds
                limit = f"{2 * length} tokens refused: {err}"
                break
            if needed > budget:
                break
            length, used = 2 * length, needed
        rows.append({"strategy": strategy, "longest_seq_len": length, "temp_bytes": used, "budget_bytes": budget,
                     "limit": limit})
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{args.model}: the longest sequence whose step fits single's temporary memory at {args.seq_len} tokens "
          f"({budget:,} bytes a device), batch {args.batch_size}")
    for r in rows:
        limit = f"; not memory: {r['limit']}" if r["limit"] else ""
        print(f"{r['strategy']:<8} {r['longest_seq_len']:>8} tokens  ({r['temp_bytes']:,} bytes a device{limit})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
