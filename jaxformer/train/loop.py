"""Causal-LM pretraining: one pure, jitted ``train_step(state, batch) -> (state, metrics)`` with the
train state donated, a loop that reads metrics back only when it logs, and a closing sample."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

import jaxformer as jf
from jaxformer.train.data import BYTE_VOCAB, ByteWindows, decode_bytes, load_corpus
from jaxformer.train.run_config import RunConfig


def causal_lm_loss(logits: jax.Array, targets: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean next-token cross-entropy in float32 over positions where ``mask`` is 1."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    if mask is None:
        return jnp.mean(losses)
    mask = mask.astype(jnp.float32)
    return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def decay_mask(params: nnx.State) -> nnx.State:
    """Weight decay on matrices and embeddings only: not on norms and biases (vectors per layer)."""
    return jax.tree.map(lambda v: v.replace(len([a for a in v.get_metadata()["axes"] if a != "layers"]) >= 2),
                        params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def make_optimizer(cfg: RunConfig, params: nnx.State) -> tuple[optax.GradientTransformation, optax.Schedule]:
    o, steps = cfg.optim, cfg.train.steps
    if o.schedule == "cosine":
        schedule = optax.warmup_cosine_decay_schedule(0.0, o.lr, o.warmup_steps, steps, end_value=o.lr * 0.1)
    elif o.schedule == "linear":
        schedule = optax.join_schedules([optax.linear_schedule(0.0, o.lr, max(o.warmup_steps, 1)),
                                         optax.linear_schedule(o.lr, 0.0, steps - o.warmup_steps)],
                                        [o.warmup_steps])
    else:
        schedule = optax.join_schedules([optax.linear_schedule(0.0, o.lr, max(o.warmup_steps, 1)),
                                         optax.constant_schedule(o.lr)], [o.warmup_steps])
    mask = decay_mask(params)
    chain = [optax.clip_by_global_norm(o.clip_norm)] if o.clip_norm else []
    chain.append(optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay, mask=mask))
    return optax.chain(*chain), schedule


def build_model(cfg: RunConfig):
    model_cfg = jf.config(cfg.model.preset)
    if cfg.model.overrides:
        model_cfg = model_cfg.replace(**cfg.model.overrides)
    if model_cfg.family != "decoder" or model_cfg.head != "lm":
        raise ValueError(f"model.preset={cfg.model.preset!r} is a {model_cfg.family} model; the causal-LM "
                         "objective trains decoder-only models with an LM head")
    if model_cfg.vocab_size < BYTE_VOCAB:
        raise ValueError(f"model vocab_size={model_cfg.vocab_size} is smaller than the byte vocabulary (256)")
    if model_cfg.position in ("learned", "sinusoidal") and cfg.train.seq_len > model_cfg.max_positions:
        raise ValueError(f"train.seq_len={cfg.train.seq_len} exceeds the model's max_positions="
                         f"{model_cfg.max_positions}")
    return jf.build(model_cfg, seed=cfg.run.seed)


def make_steps(graphdef, rest, optimizer):
    """The pure train and eval steps over ``state = (params, opt_state, step)``."""

    def loss_fn(params, batch, key):
        model = nnx.merge(graphdef, params, rest)
        key = key if model.config.dropout_rate or model.config.attention_dropout_rate else None
        logits = model(batch[:, :-1], dropout_key=key).logits
        return causal_lm_loss(logits, batch[:, 1:])

    def train_step(state, batch, key):
        params, opt_state, step, bad_steps = state
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, jax.random.fold_in(key, step))
        grad_norm = optax.tree.norm(grads)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        # A non-finite loss or gradient never reaches the parameters or the optimizer state: the step
        # is dropped and counted, and the loop acts on the count (stop or skip) at its next sync.
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        state = (keep(new_params, params), keep(new_opt_state, opt_state), step + 1,
                 bad_steps + (~finite).astype(jnp.int32))
        return state, {"loss": loss, "grad_norm": grad_norm}

    def eval_step(params, batch):
        return loss_fn(params, batch, None)

    return jax.jit(train_step, donate_argnums=0), jax.jit(eval_step)


def _checkpoint_manager(cfg: RunConfig):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=cfg.checkpoint.keep, enable_async_checkpointing=True)
    return ocp.CheckpointManager(Path(cfg.run.dir).absolute() / "checkpoints", options=options)


def _restore(manager, state):
    """Resume from the newest finalized checkpoint (Orbax ignores half-written ones), if any."""
    import orbax.checkpoint as ocp

    step = manager.latest_step()
    if step is None:
        return state, 0
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    try:
        restored = manager.restore(step, args=ocp.args.StandardRestore(abstract))
    except (ValueError, KeyError) as err:
        raise ValueError(f"the checkpoint at step {step} in {manager.directory} does not match this model and "
                         f"optimizer; start a new run.dir or restore the original config ({err})") from None
    return restored, step


def train(cfg: RunConfig, progress: bool = True) -> dict:
    """Train (resuming from run.dir's newest checkpoint), evaluate on the held-out split, append to
    metrics.jsonl, and return the history, the trained model and the wall time."""
    import orbax.checkpoint as ocp

    windows = ByteWindows(load_corpus(cfg.data.corpus), cfg.train.seq_len, cfg.data.eval_fraction, cfg.run.seed)
    model = build_model(cfg)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer, schedule = make_optimizer(cfg, params)
    train_step, eval_step = make_steps(graphdef, rest, optimizer)
    state = (params, optimizer.init(params), jnp.int32(0), jnp.int32(0))
    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    manager = _checkpoint_manager(cfg) if cfg.checkpoint.every else None
    start_step = 0
    if manager is not None:
        state, start_step = _restore(manager, state)
    key = jax.random.key(cfg.run.seed)  # per-step keys are fold_in(key, step): nothing else to save
    eval_batches = windows.eval_batches(cfg.eval.batches, cfg.train.batch_size)
    tokens_per_step = cfg.train.batch_size * cfg.train.seq_len
    history = []
    bar = tqdm(total=cfg.train.steps, initial=start_step, desc="train", disable=not progress, dynamic_ncols=True)
    started = time.perf_counter()
    last_time, last_step, skipped = started, start_step, int(state[3])
    from tensorboardX import SummaryWriter

    events = SummaryWriter(str(run_dir / "tensorboard"))
    try:
        with open(run_dir / "metrics.jsonl", "a" if start_step else "w", encoding="utf-8") as log:
            for step in range(start_step, cfg.train.steps):
                state, metrics = train_step(state, jnp.asarray(windows.batch(step, cfg.train.batch_size)), key)
                done = step + 1
                last = done == cfg.train.steps
                evaluate = done % cfg.eval.every == 0 or last
                log_now = done % cfg.train.log_every == 0 or evaluate
                save = manager is not None and (done % cfg.checkpoint.every == 0 or last)
                if not (log_now or save):
                    continue
                jax.block_until_ready(state)  # the only host sync in the loop: at logging and saving steps
                bad = int(state[3])
                if bad > skipped and cfg.train.on_nan == "stop":
                    raise FloatingPointError(
                        f"a non-finite loss or gradient occurred between steps {last_step + 1} and {done}; the run "
                        f"stopped and nothing from those steps was saved (train.on_nan=skip drops such updates)")
                if save:
                    manager.save(done, args=ocp.args.StandardSave(state))
                if not log_now:
                    continue
                now = time.perf_counter()
                record = {"step": done, "loss": float(metrics["loss"]), "lr": float(schedule(step)),
                          "grad_norm": float(metrics["grad_norm"]),
                          "tokens_per_s": round(tokens_per_step * (done - last_step) / (now - last_time), 1)}
                if bad > skipped:
                    record["skipped_steps"] = bad
                skipped = bad
                if evaluate:
                    losses = [float(eval_step(state[0], jnp.asarray(b))) for b in eval_batches]
                    record["eval_loss"] = float(np.mean(losses))
                history.append(record)
                log.write(json.dumps(record) + "\n")
                log.flush()
                for name, value in record.items():
                    if name != "step":
                        events.add_scalar(name, value, done)
                bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
                bar.update(done - last_step)
                last_time, last_step = time.perf_counter(), done
    finally:  # a stop (or any error) still waits for checkpoints in flight
        bar.close()
        events.close()
        if manager is not None:
            manager.wait_until_finished()
            manager.close()
    nnx.update(model, state[0])
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    if logged:
        plot_losses(logged, run_dir / "loss.png")
    return {"history": history, "model": model, "seconds": time.perf_counter() - started, "start_step": start_step}


def plot_losses(history: list[dict], path: Path) -> None:
    """run.dir/loss.png: training loss at every logged step and held-out loss where evaluated."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot([r["step"] for r in history], [r["loss"] for r in history], label="train")
    held_out = [r for r in history if "eval_loss" in r]
    axes.plot([r["step"] for r in held_out], [r["eval_loss"] for r in held_out], "o-", label="held-out")
    axes.set(xlabel="step", ylabel="loss (nats / token)", title="training loss")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def sample(model, prompt: str, max_new_tokens: int, seed: int = 0) -> str:
    ids = np.frombuffer(prompt.encode("utf-8"), np.uint8).astype(np.int32)[None]
    limit = model.config.max_positions - ids.shape[1]
    out = model.generate(ids, max_new_tokens=min(max_new_tokens, limit), do_sample=True, temperature=0.8,
                         top_k=40, seed=seed)
    return decode_bytes(out[0])


def main(argv: list[str]) -> int:
    from jaxformer.train.run_config import load

    config_path = argv[0] if argv and not argv[0].count("=") and argv[0].endswith((".yaml", ".yml")) else None
    overrides = argv[1:] if config_path else argv
    if config_path is None and Path("configs/default.yaml").exists():
        config_path = "configs/default.yaml"
    cfg = load(config_path, overrides)
    result = train(cfg)
    if not result["history"]:
        print(f"{cfg.run.dir} already holds a finished run of {cfg.train.steps} steps; nothing to do")
        return 0
    first, last = result["history"][0], result["history"][-1]
    resumed = f" (resumed at step {result['start_step']})" if result["start_step"] else ""
    print(f"trained {cfg.train.steps} steps{resumed} in {result['seconds']:.0f} s: loss {first['loss']:.3f} -> "
          f"{last['loss']:.3f}, held-out loss {last['eval_loss']:.3f}; metrics in {Path(cfg.run.dir) / 'metrics.jsonl'}")
    if cfg.train.sample_tokens:
        print("sample:", sample(result["model"], "The ", cfg.train.sample_tokens, cfg.run.seed))
    return 0
