"""Drafting where the target's cost dominates: a gpt2-124M target and a small assistant distilled from it.

The target is ``jf.build("gpt2", seed=0)`` (GPT-2's 124M shape and 50257-token vocabulary, random weights,
float32). A random gpt2's greedy continuation of a prompt is not degenerate: it repeats a token for a while
(three tokens in four repeat the one before), then moves to another (one it wrote before, or one of a few it
favours), a deterministic function of the context. The assistant is GPT-2's architecture at 2 x 128 with the
same vocabulary and positions (a step reads 27.5 MB, an eighteenth of the target's 502 MB), distilled here:

- its token and position tables are the target's times one random projection 768 -> 128, kept frozen: it
  starts knowing every token as the target does, the ones its training text never shows included (a table
  trained on 256 continuations learns only their few hundred tokens and agrees less on new prompts);
- the target greedily continues 256 prompts of random ids by 128 tokens (jaxformer, 32 rows a call), and the
  assistant's layers are trained on those sequences, next-token cross-entropy on the continuation tokens
  (AdamW, warmup then cosine, 3 epochs); its next-token agreement with the target is then measured on 32
  held-out prompts, beside the agreement of an assistant that only ever repeats the last token.

The pair is saved as Hugging Face folders under runs/drafting_distilled/ and reused by the next run
(``--retrain`` distils again; the data and training times are printed and kept beside the folders). On the
project's 2-core CPU it took 246 s of data and 38 s of training, and the assistant learned to repeat the last
token (held-out agreement 74.5%, repeating alone 74.7%): it never foresees a switch, so a round ends at the
target's next switch and a target step emits about 2.3 tokens at K = 4.

The measured part: held-out prompts (random ids, a seed neither the training nor the agreement prompts used),
``--new-tokens`` new tokens each, no EOS, ``--prompts`` calls per batch size. At batch 1 and batch 4, plain
greedy against drafting with the assistant at each ``--k`` (a constant count of drafts a round), transformers'
"heuristic" schedule at the largest K, and generate's default schedule there when it is another one; all
timed round-robin (plain, K=1, K=2, ..., plain, K=1, ...), each side's median of ``--repeats``. Each row
reports tokens/s, the ratio to plain greedy, tokens per target step ((new tokens) / (target steps), the prefill
included), the acceptance (drafts kept / drafts proposed; at batch 4 the rows advance together, by the fewest
any row kept) and whether its tokens are plain greedy's. At batch 1 also transformers' plain greedy and its
assisted generation with the same pair loaded by AutoModelForCausalLM (its assisted generation takes batch 1
only; its defaults: 20 drafts, confidence-stopped). Beside the table: the machine's memory bandwidth
(``jaxformer.flops.peak_bandwidth``) and the bytes a target step and an assistant step read
(``jaxformer.flops.decode_bytes_per_step``).

With ``--decoding-copy`` jaxformer's sides run on ``model.decoding_copy()`` of both models (made once).

    python benchmarks/drafting.py [--repeats 3] [--new-tokens 128] [--prompts 4] [--k 1 2 3 4 5 6 7 8]
                                  [--retrain] [--decoding-copy] [--json]

``--engine`` measures the serving engine instead (``engine_rows``): greedy requests (``--temperature`` T: seeded
draws at T) of held-out prompts through a closed loop of each ``--clients`` count, plain against the assistant
drafting K = ``max(--k)`` tokens a step (``Engine(draft_model=)``) and prompt lookup drafting as many.

    python benchmarks/drafting.py --engine [--k 4] [--clients 1 4 8] [--new-tokens 128] [--repeats 3]
                                           [--temperature 0] [--schedule constant|heuristic]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "runs" / "drafting_distilled"
PROMPT = 32  # random token ids a prompt holds
ASSISTANT = dict(decoder_layers=2, d_model=128, num_heads=4, d_ff=512)
# Seeds of the prompts: distillation data, held-out agreement, the measured runs (disjoint: no row is shared).
TRAIN_SEED, AGREEMENT_SEED, MEASURE_SEED = 1, 2, 3


def embedding_tables(path, _value) -> bool:
    """An nnx filter: the token table (the tied LM head too) and the position table."""
    return path[0] in ("embed", "embeddings")


def projected_embeddings(assistant, target, seed: int = 0) -> None:
    """Sets ``assistant``'s token and position tables to the ``target``'s times one random matrix
    [target width, assistant width] (entries of variance 1 / assistant width, so inner products, and with them
    which tokens a hidden state points at, are kept on average): the assistant starts knowing every token the
    way the target does, the tokens its training text never shows included."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    wide, narrow = target.config.d_model, assistant.config.d_model
    projection = np.random.default_rng(seed).normal(0.0, narrow ** -0.5, (wide, narrow)).astype(np.float32)
    state = nnx.state(target, embedding_tables)
    nnx.update(assistant, jax.tree.map(lambda table: jnp.asarray(np.asarray(table) @ projection), state))


def random_prompts(rows: int, length: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, (rows, length), dtype=np.int32)


def greedy_continuations(model, prompts: np.ndarray, new_tokens: int, rows_per_call: int = 32) -> np.ndarray:
    """The model's greedy continuations of ``prompts`` [R, P] (no EOS): the full sequences [R, P + new_tokens].
    Rows go ``rows_per_call`` at a time through one compiled loop (a last short call is padded with rows of
    its own, whose output is dropped)."""
    from jaxformer import generate as gen

    rows = prompts.shape[0]
    rows_per_call = min(rows_per_call, rows)
    padded = np.resize(prompts, (-(-rows // rows_per_call) * rows_per_call, prompts.shape[1]))
    program, out = None, []
    for start in range(0, padded.shape[0], rows_per_call):
        ids = padded[start:start + rows_per_call]
        call_args, gc = gen.prepare(model, ids, max_new_tokens=new_tokens, eos_token_id=None)
        program = program or gen.generate_tokens_jit.lower(*call_args, config=gc).compile()
        tokens, steps, bad = program(*call_args[1:])
        out.append(gen.assemble(model, ids, tokens, steps, bad, gc))
    return np.concatenate(out)[:rows]


def continuation_batch(sequences: np.ndarray, prompt: int) -> dict[str, np.ndarray]:
    """Next-token inputs and labels of whole sequences, the labels of the prompt's own tokens ignored: the
    assistant learns what the target writes, not the random ids it was given."""
    from jaxformer.train.data import IGNORE

    labels = sequences[:, 1:].copy()
    labels[:, : prompt - 1] = IGNORE
    return {"input_ids": sequences[:, :-1], "labels": labels}


def train_assistant(model, sequences: np.ndarray, prompt: int, *, epochs: int, batch_size: int = 16,
                    lr: float = 3e-3, seed: int = 0, freeze_embeddings: bool = False, log=None):
    """Trains ``model`` in place on ``sequences``'s continuations (``continuation_batch``), AdamW with a
    linear warmup and cosine decay, rows shuffled per epoch; returns the mean loss of each epoch. With
    ``freeze_embeddings`` the token and position tables stay as they are."""
    import jax
    import optax
    from flax import nnx

    from jaxformer.train.objectives import ratio, token_cross_entropy

    data = continuation_batch(sequences, prompt)
    steps_per_epoch = sequences.shape[0] // batch_size
    total = max(epochs * steps_per_epoch, 1)
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(total // 20, 1), total, end_value=lr * 0.05)
    optimizer = optax.adamw(schedule, weight_decay=0.01)
    frozen_filter = embedding_tables if freeze_embeddings else nnx.Nothing
    graphdef, frozen, params, rest = nnx.split(model, frozen_filter, nnx.Param, ...)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        def loss_fn(params):
            logits = nnx.merge(graphdef, frozen, params, rest)(batch["input_ids"]).logits
            return ratio(token_cross_entropy(logits, batch["labels"])["loss"])
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    order_rng, losses = np.random.default_rng(seed), []
    for epoch in range(epochs):
        order, total_loss = order_rng.permutation(sequences.shape[0]), 0.0
        for i in range(steps_per_epoch):
            rows = order[i * batch_size:(i + 1) * batch_size]
            params, opt_state, loss = step(params, opt_state, {k: v[rows] for k, v in data.items()})
            total_loss += float(loss)
        losses.append(total_loss / max(steps_per_epoch, 1))
        if log:
            log(f"  epoch {epoch + 1}/{epochs}: loss {losses[-1]:.3f}")
    nnx.update(model, params)
    return losses


def agreement(model, sequences: np.ndarray, prompt: int) -> float:
    """How often the model's next token (argmax, teacher-forced on the target's own text) is the target's."""
    import jax

    from jaxformer.train.objectives import ratio, token_cross_entropy

    batch = continuation_batch(sequences, prompt)
    logits = jax.jit(lambda ids: model(ids).logits)(batch["input_ids"])
    return float(ratio(token_cross_entropy(logits, batch["labels"])["accuracy"]))


def repeat_rate(sequences: np.ndarray, prompt: int) -> float:
    """How often the target's next token is the one before it, over ``agreement``'s positions: the agreement of
    an assistant that only ever repeats."""
    return float(np.mean(sequences[:, prompt:] == sequences[:, prompt - 1:-1]))


TRAIN_ROWS, AGREEMENT_ROWS, DATA_NEW_TOKENS, EPOCHS = 256, 32, 128, 3


def distil(log=print) -> tuple[object, object, dict]:
    """The target, the assistant distilled from it, and how (times, sizes, held-out agreement)."""
    import jaxformer as jf

    target = jf.build("gpt2", seed=0)
    assistant = jf.build(target.config.replace(name="gpt2-assistant", **ASSISTANT), seed=0)
    projected_embeddings(assistant, target)
    vocab = target.config.vocab_size
    start = time.perf_counter()
    log(f"distilling: the target continues {TRAIN_ROWS + AGREEMENT_ROWS} random prompts by {DATA_NEW_TOKENS} "
        "greedy tokens ...")
    prompts = np.concatenate([random_prompts(TRAIN_ROWS, PROMPT, vocab, TRAIN_SEED),
                              random_prompts(AGREEMENT_ROWS, PROMPT, vocab, AGREEMENT_SEED)])
    sequences = greedy_continuations(target, prompts, DATA_NEW_TOKENS)
    train, held_out = sequences[:TRAIN_ROWS], sequences[TRAIN_ROWS:]
    data_s = time.perf_counter() - start
    before = agreement(assistant, held_out, PROMPT)
    log(f"  {data_s:.0f} s; training the assistant {EPOCHS} epochs ...")
    start = time.perf_counter()
    losses = train_assistant(assistant, train, PROMPT, epochs=EPOCHS, freeze_embeddings=True, log=log)
    train_s = time.perf_counter() - start
    info = dict(data_s=round(data_s, 1), train_s=round(train_s, 1), train_rows=TRAIN_ROWS, epochs=EPOCHS,
                new_tokens=DATA_NEW_TOKENS, losses=[round(loss, 4) for loss in losses],
                agreement_before=round(before, 4), agreement=round(agreement(assistant, held_out, PROMPT), 4),
                train_agreement=round(agreement(assistant, train[:AGREEMENT_ROWS], PROMPT), 4),
                repeat_rate=round(repeat_rate(held_out, PROMPT), 4), assistant=ASSISTANT)
    log(f"  {train_s:.0f} s; held-out next-token agreement with the target {info['agreement']:.1%} "
        f"(untrained {before:.1%}; repeating the last token {info['repeat_rate']:.1%})")
    return target, assistant, info


def distilled_pair(retrain: bool, log=print) -> tuple[dict[str, Path], dict]:
    """Hugging Face folders of the target and its distilled assistant under ``CACHE``, distilled first when
    missing (or ``retrain``), and the distillation's record."""
    import jaxformer as jf

    folders = {role: CACHE / role for role in ("target", "assistant")}
    record = CACHE / "distillation.json"
    if retrain or not record.exists() or not all((f / "config.json").exists() for f in folders.values()):
        target, assistant, info = distil(log)
        record.unlink(missing_ok=True)  # written last: a run cut short is distilled again
        for role, model in (("target", target), ("assistant", assistant)):
            jf.save_pretrained(model, folders[role])
        record.write_text(json.dumps(info, indent=1) + "\n")
    return folders, json.loads(record.read_text())


def jaxformer_runners(target, calls: list[np.ndarray], new_tokens: int, **drafting) -> list:
    """Compiled greedy runs of each of ``calls`` (prompts of one shape, one program), plain or drafting as
    ``drafting`` says. A run returns the full sequences, the target steps it took (the prefill's included) and
    the drafts it accepted and proposed (proposed: None where the count a round drafts varies)."""
    from jaxformer import generate as gen

    prepared = [gen.prepare(target, ids, max_new_tokens=new_tokens, eos_token_id=None, **drafting) for ids in calls]
    first, gc = prepared[0]
    loop = gen.drafted_tokens_jit if gc.draft_tokens else gen.generate_tokens_jit
    program = loop.lower(*first, config=gc).compile()
    constant = gc.num_assistant_tokens_schedule == "constant"

    def runner(ids, call_args):
        def run():
            tokens, steps, bad, *rounds = program(*call_args[1:])  # the graphdef is static, baked in
            out = gen.assemble(target, ids, tokens, steps, bad, gc)
            if not rounds:
                return out, new_tokens, 0, 0
            rounds = int(rounds[0])  # a round emits its accepted drafts and the target's own token
            return out, rounds + 1, int(steps) - 1 - rounds, rounds * gc.draft_tokens if constant else None
        return run
    return [runner(ids, call_args) for ids, (call_args, _) in zip(calls, prepared)]


def transformers_runner(reference, ids: np.ndarray, new_tokens: int, assistant=None):
    import torch

    kwargs = {} if assistant is None else dict(assistant_model=assistant)

    def run():
        with torch.no_grad():
            out = reference.generate(torch.as_tensor(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                                     max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                     pad_token_id=0, eos_token_id=None, **kwargs).numpy()
        return out, None, 0, 0
    return run


def measure(target, assistant, folders: dict[str, Path], args, log=print) -> dict[str, dict]:
    """Every setting at batch 1 and 4 (transformers' at batch 1), timed round-robin; one row per setting."""
    N, vocab = args.new_tokens, target.config.vocab_size
    from jaxformer import generate as gen

    top = max(args.k)
    settings = {"plain": {}}
    for k in args.k:
        settings[f"K={k}"] = dict(assistant_model=assistant, num_assistant_tokens=k,
                                  num_assistant_tokens_schedule="constant")
    settings[f"heuristic K<={top}"] = dict(assistant_model=assistant, num_assistant_tokens=top,
                                           num_assistant_tokens_schedule="heuristic")
    rows = {}
    for batch in (1, 4):
        calls = [random_prompts(batch, PROMPT, vocab, MEASURE_SEED * 1000 + batch * 100 + i)
                 for i in range(args.prompts)]
        default = dict(assistant_model=assistant, num_assistant_tokens=top)  # generate's own choice of schedule
        schedule = gen.prepare(target, calls[0], max_new_tokens=N, eos_token_id=None, **default)[1]
        if schedule.num_assistant_tokens_schedule != "constant":  # a constant default is the K=top row
            settings[f"{schedule.num_assistant_tokens_schedule} K<={top} (default)"] = default
        log(f"batch {batch}: compiling {len(settings)} settings ...")
        runners = {name: jaxformer_runners(target, calls, N, **kwargs) for name, kwargs in settings.items()}
        if batch == 1:
            reference, reference_assistant = transformers_pair(folders)
            runners["transformers plain"] = [transformers_runner(reference, ids, N) for ids in calls]
            runners["transformers assisted"] = [transformers_runner(reference, ids, N, reference_assistant)
                                                for ids in calls]
        rows.update(timed(runners, batch, N, args.repeats, log))
        log(table({name: row for name, row in rows.items() if row["batch"] == batch}))  # shown as soon as known
    return rows


def table(rows: dict[str, dict]) -> str:
    lines = [f"{'batch, decoding':<30} {'tok/s':>8} {'vs plain':>9} {'tok/step':>9} {'accepted':>9}  "
             "same tokens as plain"]
    for name, row in rows.items():
        per_step = "" if row["tokens_per_target_step"] is None else f"{row['tokens_per_target_step']:.2f}"
        accepted = "" if row["acceptance"] is None else f"{row['acceptance']:.0%}"
        lines.append(f"{name:<30} {row['tok_s']:>8.1f} {row['vs_plain']:>8.2f}x {per_step:>9} {accepted:>9}  "
                     f"{row['identical']}")
    return "\n".join(lines)


def transformers_pair(folders: dict[str, Path]):
    import transformers

    transformers.logging.set_verbosity_error()
    load = transformers.AutoModelForCausalLM.from_pretrained
    return load(str(folders["target"])).eval(), load(str(folders["assistant"])).eval()


def timed(runners: dict[str, list], batch: int, new_tokens: int, repeats: int, log=print) -> dict[str, dict]:
    """Warm every runner up (its outputs kept), then time them round-robin ``repeats`` times: plain, K=1,
    K=2, ..., plain, K=1, ...: noise from the rest of the machine hits every side alike."""
    outputs = {name: [run() for run in runs] for name, runs in runners.items()}
    times = {name: [] for name in runners}
    for repeat in range(repeats):
        log(f"batch {batch}: repeat {repeat + 1}/{repeats}")
        for name, runs in runners.items():
            start = time.perf_counter()
            for run in runs:
                run()
            times[name].append(time.perf_counter() - start)
    plain = [out[0] for out in outputs["plain"]]
    rows = {}
    for name, results in outputs.items():
        tok_s = batch * new_tokens * len(results) / statistics.median(times[name])
        steps = [r[1] for r in results]
        proposed = [r[3] for r in results]
        rows[f"b{batch} {name}"] = dict(
            batch=batch, tok_s=round(tok_s, 1),
            tokens_per_target_step=None if None in steps else round(new_tokens * len(steps) / sum(steps), 2),
            acceptance=(round(sum(r[2] for r in results) / sum(proposed), 3)
                        if None not in proposed and sum(proposed) else None),
            identical=all(np.array_equal(r[0], p) for r, p in zip(results, plain)))
    for row in rows.values():
        row["vs_plain"] = round(row["tok_s"] / rows[f"b{batch} plain"]["tok_s"], 2)
    return rows


def engine_rows(target, assistant, args, log=print) -> dict[str, dict]:
    """The serving engine's greedy requests (``--engine``; ``--temperature`` T > 0: draws at T, each request seeded
    by its prompt's index, so every side draws the same tokens: speculative sampling's drafts are kept where the
    draw equals them): a closed loop of C clients at each ``--clients`` level, each request a held-out prompt and
    ``--new-tokens`` tokens, plain against drafting K = ``max(--k)`` tokens by the assistant
    (``Engine(draft_model=)``) and by prompt lookup (``--schedule``: the engine's ``draft_schedule``); each engine
    warmed up first, the sides timed round-robin (plain, assistant, lookup, plain, ...), each side's median of
    ``--repeats``."""
    from jaxformer.serving import Engine, SamplingParams

    k, levels, N = max(args.k), args.clients, args.new_tokens
    longest = PROMPT + N
    drafting = dict(draft_tokens=k, draft_schedule=args.schedule)
    settings = {"plain": {}, f"assistant K={k}": dict(drafting, draft_model=assistant),
                f"prompt lookup K={k}": drafting}
    engines = {}
    for name, extra in settings.items():
        engines[name] = Engine(target, num_blocks=max(levels) * -(-longest // 16) + 1, block_size=16,
                               max_num_seqs=max(levels), max_model_len=longest, seed=0, **extra)
        programs, seconds = engines[name].warm_up()
        log(f"engine, {name}: {programs} programs warmed in {seconds:.0f} s")
    rows = {}
    for clients in levels:
        prompts = random_prompts(2 * clients, PROMPT, target.config.vocab_size, MEASURE_SEED * 1000 + 500 + clients)

        def run(engine):
            """Every prompt through ``clients`` concurrent requests: (seconds, tokens by request, drafted, kept)."""
            pending, live, out = list(enumerate(prompts)), 0, {}
            drafted, kept = engine.drafted, engine.accepted
            start = time.perf_counter()
            while pending or engine.has_unfinished():
                while pending and live < clients:
                    index, prompt = pending.pop(0)
                    engine.add_request(prompt.tolist(), SamplingParams(max_tokens=N, temperature=args.temperature,
                                                                       seed=index, ignore_eos=True))
                    live += 1
                for result in engine.step():
                    out.setdefault(result.request_id, []).extend(result.token_ids)
                    live -= result.finished
            seconds = time.perf_counter() - start
            return seconds, sorted(out.values()), engine.drafted - drafted, engine.accepted - kept

        results = {name: [run(engine)] for name, engine in engines.items()}  # (untimed: each one's first pass)
        for repeat in range(args.repeats):
            log(f"engine, {clients} clients: repeat {repeat + 1}/{args.repeats}")
            for name, engine in engines.items():
                results[name].append(run(engine))
        plain = results["plain"][0][1]
        for name, runs in results.items():
            seconds = statistics.median(r[0] for r in runs[1:])
            drafted = sum(r[2] for r in runs)
            rows[f"engine c{clients} {name}"] = dict(
                clients=clients, tok_s=round(len(prompts) * N / seconds, 1),
                acceptance=round(sum(r[3] for r in runs) / drafted, 3) if drafted else None,
                identical=all(r[1] == plain for r in runs))
        for name in settings:
            row = rows[f"engine c{clients} {name}"]
            row["vs_plain"] = round(row["tok_s"] / rows[f"engine c{clients} plain"]["tok_s"], 2)
        log(engine_table({name: row for name, row in rows.items() if row["clients"] == clients}))
    return rows


def engine_table(rows: dict[str, dict]) -> str:
    lines = [f"{'clients, decoding':<34} {'tok/s':>8} {'vs plain':>9} {'accepted':>9}  same tokens as plain"]
    for name, row in rows.items():
        accepted = "" if row["acceptance"] is None else f"{row['acceptance']:.0%}"
        lines.append(f"{name:<34} {row['tok_s']:>8.1f} {row['vs_plain']:>8.2f}x {accepted:>9}  {row['identical']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=4, help="held-out calls per batch size")
    parser.add_argument("--k", type=int, nargs="+", default=list(range(1, 9)), help="drafts a round")
    parser.add_argument("--retrain", action="store_true", help="distil the assistant again")
    parser.add_argument("--decoding-copy", action="store_true",
                        help="jaxformer's sides on model.decoding_copy() of the target and the assistant")
    parser.add_argument("--engine", action="store_true",
                        help="the serving engine instead: plain against drafting by the assistant and by prompt "
                             "lookup (K = the largest --k), greedy requests in a closed loop of each --clients")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8], help="--engine: concurrent requests")
    parser.add_argument("--temperature", type=float, default=0.0, help="--engine: requests draw at this temperature")
    parser.add_argument("--schedule", choices=("constant", "heuristic"), default="constant",
                        help="--engine: the drafting engines' draft_schedule")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import jaxformer as jf
    from jaxformer import flops

    log = (lambda message: None) if args.json else (lambda message: print(message, flush=True))  # noqa: E731
    folders, distillation = distilled_pair(args.retrain, log)
    models = {role: jf.from_pretrained(folder) for role, folder in folders.items()}
    if args.engine:
        rows = engine_rows(models["target"], models["assistant"], args, log)
        if args.json:
            print(json.dumps(dict(rows=rows, distillation=distillation)))
            return
        print(f"\nthe serving engine: target gpt2 (124M, random weights, float32), the distilled assistant (held-out "
              f"agreement {distillation['agreement']:.1%}); {PROMPT}-token prompts, {args.new_tokens} new tokens, "
              f"twice as many requests as clients, median of {args.repeats}, round-robin")
        print(engine_table(rows))
        return
    if args.decoding_copy:
        models = {role: model.decoding_copy() for role, model in models.items()}
    rows = measure(models["target"], models["assistant"], folders, args, log)
    cache_length = PROMPT + args.new_tokens // 2
    step_bytes = {role: flops.decode_bytes_per_step(model.config, 1, cache_length) for role, model in models.items()}
    bandwidth, source = flops.peak_bandwidth()
    if args.json:
        print(json.dumps(dict(rows=rows, distillation=distillation, step_bytes=step_bytes,
                              bandwidth_bytes_per_s=bandwidth)))
        return
    d = distillation
    print(f"\ndrafting: target gpt2 (124M, random weights, float32), assistant GPT-2 {ASSISTANT['decoder_layers']} x "
          f"{ASSISTANT['d_model']} distilled from it ({d['train_rows']} prompts x {d['new_tokens']} greedy tokens: "
          f"{d['data_s']:.0f} s; {d['epochs']} epochs: {d['train_s']:.0f} s; held-out next-token agreement "
          f"{d['agreement']:.1%}, repeating the last token {d['repeat_rate']:.1%})")
    print(f"{args.prompts} held-out calls per batch size, prompt {PROMPT} random ids, {args.new_tokens} new tokens, "
          f"no EOS, median of {args.repeats}, round-robin")
    print(table(rows))
    print(f"memory bandwidth {bandwidth / 1e9:.1f} GB/s ({source}); a batch-1 step at {cache_length} cached tokens "
          f"reads {step_bytes['target'] / 1e6:.0f} MB (target), {step_bytes['assistant'] / 1e6:.1f} MB (assistant): "
          f"bound {bandwidth / step_bytes['target']:.1f} target steps/s")
    print("transformers' assisted generation takes batch 1 only (its defaults: 20 drafts, confidence-stopped)")


if __name__ == "__main__":
    main()
