"""What a person sees of a run: notes, a progress bar, metrics.jsonl, TensorBoard events, the loss
plot, and a closing sample."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jax
from tqdm import tqdm

from jaxformer import flops, kernels, sharding
from jaxformer.model_config import ModelConfig
from jaxformer.layers.feedforward import exchanged_experts, expert_dispatch
from jaxformer.layers.pipeline import schedule
from jaxformer.train.objectives import Objective
from jaxformer.train.run_config import RunConfig
from jaxformer.train.steps import finish_metrics, router_load_metrics


def attention_note(model_cfg: ModelConfig, seq_len: int) -> str:
    """Which attention kernel the training step's self-attention runs on (an explicit backend this
    machine cannot serve fails here, before compiling)."""
    pattern = "bidirectional" if model_cfg.family == "encoder" else model_cfg.attention
    backend = kernels.fused_backend(model_cfg, pattern, seq_len, seq_len, has_bias=model_cfg.position == "relative")
    chosen = model_cfg.execution.attention_backend
    note = f"self-attention runs on {backend} (attention_backend={chosen!r}, {kernels.platform()})"
    if backend != "xla" and model_cfg.attention_dropout_rate > 0:
        note += "; attention dropout is on, so training steps use xla (model.overrides.attention_dropout_rate=0 fuses)"
    return note


def expert_note(model_cfg: ModelConfig, rows: int) -> list[str]:
    """How a MoE model's experts are split under a mesh with an ``expert`` axis (none: nothing to say)."""
    devices = sharding.axis_size("expert")
    if model_cfg.experts is None or devices == 1:
        return []
    how = ("tokens sent to them and back by all-to-all" if expert_dispatch(model_cfg, rows) is exchanged_experts
           else f"dispatch partitioned by the compiler (moe_dispatch={model_cfg.experts.dispatch!r})")
    return [f"experts: {model_cfg.experts.count // devices} a device over mesh.expert={devices}, {how}"]


def pipeline_note(model_cfg: ModelConfig, rows: int) -> list[str]:
    """The pipeline's schedule under a mesh with a ``stage`` axis and its ideal bubble (none: nothing to say)."""
    stages = sharding.axis_size("stage")
    if stages == 1:
        return []
    repeats, microbatches = model_cfg.execution.pipeline_repeats, model_cfg.execution.pipeline_microbatches or stages
    iterations, bubble = schedule(stages, repeats, microbatches)
    kind = "GPipe" if repeats == 1 else f"circular, {repeats} chunks a stage"
    return [f"pipeline: {stages} stages ({kind}), {microbatches} microbatches of {rows // microbatches} rows; each "
            f"stage idles {stages - 1} of {iterations} iterations: bubble {bubble:.0%} of a step at best "
            "(more train.microbatches or train.pipeline_repeats shrink it)"]


def _held_out_scores(history: list[dict]) -> list[str]:
    """The eval_* values worth a second panel: scalars other than losses (accuracy, F1, exact match, ...),
    in the order the records first name them."""
    names: dict[str, None] = {}
    for record in history:
        for name, value in record.items():
            if name.startswith("eval_") and "loss" not in name and isinstance(value, (int, float)):
                names[name] = None
    return list(names)


def plot_losses(history: list[dict], path: Path, objective: str = "causal_lm") -> None:
    """run.dir/loss.png: training loss at every logged step and held-out loss where evaluated, the
    learning rate on a second y-axis, and a second panel of the other held-out metrics when there are
    any."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    scores = _held_out_scores(history)
    figure, panels = plt.subplots(2 if scores else 1, 1, figsize=(7, 6.5 if scores else 4), sharex=True,
                                  squeeze=False)
    axes = panels[0, 0]
    axes.plot([r["step"] for r in history], [r["loss"] for r in history], label="train")
    held_out = [r for r in history if "eval_loss" in r]
    if held_out:
        axes.plot([r["step"] for r in held_out], [r["eval_loss"] for r in held_out], "o-", label="held-out")
    alone = [r for r in held_out if "eval_loss_no_memory" in r]  # segment-memory models: the same windows alone
    if alone:
        axes.plot([r["step"] for r in alone], [r["eval_loss_no_memory"] for r in alone], "s--",
                  label="held-out, no memory")
    axes.set(ylabel="loss (nats)", title=f"{objective} loss")
    axes.grid(alpha=0.3)
    handles, labels = axes.get_legend_handles_labels()
    scheduled = [r for r in history if "lr" in r]
    if scheduled:  # the schedule on its own scale: warmup and decay explain bends in the loss
        rate = axes.twinx()
        rate.plot([r["step"] for r in scheduled], [r["lr"] for r in scheduled], color="0.5", linestyle=":",
                  label="learning rate")
        rate.set_ylabel("learning rate")
        rate.set_ylim(bottom=0)
        rate.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        more_handles, more_labels = rate.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    axes.legend(handles, labels, loc="upper right")
    if scores:
        metrics = panels[1, 0]
        for name in scores:
            evaluated = [r for r in history if name in r]
            metrics.plot([r["step"] for r in evaluated], [r[name] for r in evaluated], "o-",
                         label=name.removeprefix("eval_"))
        metrics.set(ylabel="held-out metric", title="held-out metrics")
        metrics.grid(alpha=0.3)
        metrics.legend()
    panels[-1, 0].set_xlabel("step")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def sample(model, objective: Objective, max_new_tokens: int, seed: int = 0) -> str | None:
    """A short generation after training: text after "The " for causal LMs and prefix-LM decoders (the
    prompt their prefix), the first held-out source's output for seq2seq; None for objectives that do not
    generate."""
    tokenizer = objective.tokenizer
    if objective.name == "causal_lm" or (objective.name == "prefix_lm" and model.config.family == "decoder"):
        ids = tokenizer.encode("The ")[None]
        limit = model.config.max_positions - ids.shape[1] if model.config.position == "learned" else max_new_tokens
        out = model.generate(ids, max_new_tokens=min(max_new_tokens, limit), do_sample=True, temperature=0.8,
                             top_k=40, seed=seed)
        return tokenizer.decode(out[0])
    if objective.name == "seq2seq":
        source = objective.held_out_examples[0][0][None]
        out = model.generate(source, max_new_tokens=min(max_new_tokens, objective.target_len))
        return f"{tokenizer.decode(source[0])!r} -> {tokenizer.decode(out[0])!r}"
    return None


def keep_records_up_to(path: Path, step: int) -> None:
    """A resumed run replays the steps after its checkpoint: drop their records from the crashed run, so
    metrics.jsonl holds each step once. Rewritten atomically (temporary file, then rename)."""
    if not step or not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    if len(kept) < len(lines):
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(temporary, path)


class Report:
    """The logging of one run: a progress bar with loss, tokens/s and MFU; one metrics.jsonl record
    and TensorBoard scalars per logged step (process 0 writes them); the non-finite-step check."""

    def __init__(self, cfg: RunConfig, objective: Objective, model_cfg: ModelConfig, schedule, start_step: int,
                 skipped: int, progress: bool = True, forced_changes: list[str] = ()):
        self.cfg, self.objective, self.schedule = cfg, objective, schedule
        self.here = jax.process_index() == 0
        self.metrics_file = Path(cfg.run.dir) / "metrics.jsonl"
        # a dual encoder's image tower reads each picture's patches and class token beside the text
        pictures = model_cfg.vision.tower.patches.tokens if model_cfg.family == "dual_encoder" else 0
        # an encoder reading audio (Whisper) reads the model's source positions, whatever train.seq_len says
        source = cfg.train.seq_len if model_cfg.audio is None else model_cfg.audio.source_positions
        self.tokens_per_step = cfg.train.batch_size * (source + objective.target_len + pictures)
        self.step_flops = flops.train_flops_per_step(model_cfg, cfg.train.batch_size, source, objective.target_len)
        self.compute_dtype = cfg.train.compute_dtype
        self.history: list[dict] = []
        self.bar = tqdm(total=cfg.train.steps, initial=start_step, desc="train", disable=not (progress and self.here),
                        dynamic_ncols=True)
        self.last_time, self.last_step, self.skipped = time.perf_counter(), start_step, skipped
        self.events = self.log_file = None
        if self.here:
            from tensorboardX import SummaryWriter

            self.events = SummaryWriter(str(Path(cfg.run.dir) / "tensorboard"))
            keep_records_up_to(self.metrics_file, start_step)
            self.log_file = open(self.metrics_file, "a" if start_step else "w", encoding="utf-8")
            if forced_changes:  # train.resume=force: what changed, on the record
                self.log_file.write(json.dumps({"step": start_step, "resumed_with_changes": list(forced_changes)}) + "\n")

    def check_finite(self, skipped: int, done: int) -> None:
        """A step dropped for a non-finite loss or gradient ends the run under train.on_nan=stop; under
        skip, more than train.max_skipped_steps of them do (a dead run must not go on saving)."""
        if skipped > self.skipped and self.cfg.train.on_nan == "stop":
            raise FloatingPointError(
                f"a non-finite loss or gradient occurred between steps {self.last_step + 1} and {done}; the run "
                f"stopped and nothing from those steps was saved (train.on_nan=skip drops such updates)")
        if skipped > self.cfg.train.max_skipped_steps:
            raise FloatingPointError(
                f"{skipped} steps had a non-finite loss or gradient and were skipped, more than "
                f"train.max_skipped_steps={self.cfg.train.max_skipped_steps}; the run stopped at step {done} and "
                f"nothing from steps {self.last_step + 1}-{done} was saved")

    def log(self, done: int, metrics: dict, skipped: int, held_out=None) -> None:
        """One record: the step's metrics, lr, gradient norm, throughput since the last record, and the
        held-out metrics when ``held_out`` (a function, not timed) is given. MoE models add the step's
        router load: ``expert_load`` (each expert's share of the routed tokens, averaged over MoE layers)
        and ``max_load`` (busiest expert over mean, worst layer); see ``steps.router_load_metrics``."""
        seconds_per_step = (time.perf_counter() - self.last_time) / (done - self.last_step)
        record = {"step": done, **finish_metrics(self.objective, jax.device_get(metrics["sums"])),
                  "lr": float(self.schedule(done - 1)), "grad_norm": float(metrics["grad_norm"]),
                  "tokens_per_s": round(self.tokens_per_step / seconds_per_step, 1),
                  "mfu": round(flops.utilization(self.step_flops / seconds_per_step, self.compute_dtype), 4)}
        if "router_load" in metrics:  # fetched with the other metrics: no extra host sync
            record |= router_load_metrics(jax.device_get(metrics["router_load"]))
        if skipped > self.skipped:
            record["skipped_steps"] = skipped
        self.skipped = skipped
        if held_out is not None:
            record |= held_out()
        self.history.append(record)
        if self.here:
            self.log_file.write(json.dumps(record) + "\n")
            self.log_file.flush()
            for name, value in record.items():
                if isinstance(value, list):  # expert_load: one scalar per expert, expert_load/0, expert_load/1, ...
                    for i, item in enumerate(value):
                        self.events.add_scalar(f"{name}/{i}", item, done)
                elif name != "step":
                    self.events.add_scalar(name, value, done)
        self.bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}",
                             mfu=f"{100 * record['mfu']:.0f}%")
        self.bar.update(done - self.last_step)
        self.last_time, self.last_step = time.perf_counter(), done

    def close(self) -> None:
        self.bar.close()
        if self.here:
            self.events.close()
            self.log_file.close()

    def plot(self) -> None:
        """run.dir/loss.png from every record in metrics.jsonl (a resumed run's earlier ones too)."""
        if self.here and self.metrics_file.stat().st_size:
            logged = [record for line in self.metrics_file.read_text(encoding="utf-8").splitlines()
                      if "loss" in (record := json.loads(line))]
            plot_losses(logged, self.metrics_file.parent / "loss.png", self.objective.name)
