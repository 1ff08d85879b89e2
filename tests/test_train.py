"""The first training path: run configs, the byte-level data, and a causal-LM run whose loss falls."""

from __future__ import annotations

import json

import numpy as np
import pytest

import jax
import optax

from jaxformer.train import run_config
from jaxformer.train.data import ByteTokenizer
from jaxformer.train.report import sample
from jaxformer.train.run import main, train
from jaxformer.train.data import IGNORE
from jaxformer.train.objectives import ratio, token_cross_entropy
from jaxformer.train.tasks import make_objective
from conftest import simulated_devices

TINY = ["train.steps=30", "train.batch_size=8", "train.seq_len=32", "train.log_every=5", "eval.every=15",
        "eval.batches=2", "optim.warmup_steps=5", "train.sample_tokens=0"]


def test_overrides_are_typed_and_unknown_keys_suggest_the_closest(tmp_path):
    cfg = run_config.load(None, ["optim.lr=3e-4", "train.steps=200", "model.preset=tiny-llama",
                                 "model.overrides.decoder_layers=3"])
    assert cfg.optim.lr == 3e-4 and cfg.train.steps == 200 and cfg.model.preset == "tiny-llama"
    assert cfg.model.overrides == {"decoder_layers": 3}
    with pytest.raises(ValueError, match="did you mean 'train.steps'"):
        run_config.load(None, ["train.step=5"])
    with pytest.raises(ValueError, match="optim.schedule"):
        run_config.load(None, ["optim.schedule=exponential"])
    with pytest.raises(ValueError, match="section.key=value"):
        run_config.load(None, ["train.steps"])
    yaml_file = tmp_path / "bad.yaml"
    yaml_file.write_text("train:\n  stpes: 3\n")
    with pytest.raises(ValueError, match="did you mean 'train.steps'"):
        run_config.load(yaml_file)
    yaml_file.write_text("!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ValueError, match="not plain YAML data"):  # safe_load builds no Python objects
        run_config.load(yaml_file)
    yaml_file.write_bytes("train:\n  steps: 5 # caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"bad.yaml is not UTF-8 text \(byte 23\)"):
        run_config.load(yaml_file)


def test_default_config_file_is_valid():
    cfg = run_config.load("configs/default.yaml")
    assert cfg.model.preset == "tiny-gpt" and cfg.train.steps > 0


def test_batches_are_a_function_of_the_step():
    cfg = run_config.load(None, ["train.seq_len=16"])
    objective = make_objective(cfg, ByteTokenizer())
    np.testing.assert_array_equal(objective.batch(7, 4)["input_ids"], objective.batch(7, 4)["input_ids"])
    assert not np.array_equal(objective.batch(7, 4)["input_ids"], objective.batch(8, 4)["input_ids"])
    batch = objective.batch(0, 4)
    assert batch["input_ids"].shape == batch["labels"].shape == (4, 16)
    np.testing.assert_array_equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])  # shifted by one
    held_out = objective.eval_batches(2, 4)
    assert len(held_out) == 2 and all(b["input_ids"].max() < 256 for b in held_out)


def test_masked_loss_ignores_masked_positions():
    logits = np.random.default_rng(0).normal(size=(2, 3, 5)).astype(np.float32)
    labels = np.array([[1, 2, IGNORE], [4, IGNORE, IGNORE]])
    sums = token_cross_entropy(logits, labels)
    changed = np.where(labels == IGNORE, IGNORE, labels)
    assert float(sums["loss"][1]) == 3.0 and float(ratio(sums["loss"])) == float(ratio(token_cross_entropy(
        logits, changed)["loss"]))
    log_p = jax.nn.log_softmax(logits)
    expected = -(log_p[0, 0, 1] + log_p[0, 1, 2] + log_p[1, 0, 4]) / 3
    assert float(ratio(sums["loss"])) == pytest.approx(float(expected), abs=1e-6)


def test_label_smoothing_matches_smoothed_one_hot_targets():
    logits = np.random.default_rng(1).normal(size=(2, 4, 7)).astype(np.float32)
    labels = np.array([[1, 2, 3, IGNORE], [0, 6, IGNORE, IGNORE]])
    valid = labels != IGNORE
    targets = optax.smooth_labels(jax.nn.one_hot(np.where(valid, labels, 0), 7), 0.1)
    expected = (optax.softmax_cross_entropy(logits, targets) * valid).sum() / valid.sum()
    got = ratio(token_cross_entropy(logits, labels, smoothing=0.1)["loss"])
    assert float(got) == pytest.approx(float(expected), abs=1e-6)


def test_training_loss_falls_and_is_reproducible(tmp_path):
    cfg = run_config.load(None, TINY + [f"run.dir={tmp_path}"])
    first = train(cfg, progress=False)
    losses = [r["loss"] for r in first["history"]]
    assert losses[-1] < losses[0] - 0.5, losses
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu"} <= set(records[0])
    assert "eval_loss" in records[-1] and records[-1]["step"] == 30
    png = (tmp_path / "loss.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and b"eval_loss" in events[0].read_bytes()
    again = train(run_config.load(None, TINY + [f"run.dir={tmp_path / 'again'}"]), progress=False)
    assert [r["loss"] for r in again["history"]] == losses  # same seed, same batches, same losses
    text = sample(first["model"], first["objective"], 10)
    assert text.startswith("The ") and len(text.encode()) >= 4


def test_command_line_entry(tmp_path, capsys):
    assert main(TINY + [f"run.dir={tmp_path}", "train.sample_tokens=8"]) == 0
    out = capsys.readouterr().out
    assert "held-out loss" in out and "sample: The " in out
    with pytest.raises(ValueError, match="encoder"):
        main(TINY + [f"run.dir={tmp_path}", "model.preset=tiny-bert"])
    from jaxformer.cli import main as cli_main

    assert cli_main(["train", *TINY, f"run.dir={tmp_path}"]) == 0  # the same run, finished: nothing to train
    assert "already holds a finished run of 30 steps" in capsys.readouterr().out
    assert cli_main(["train", "train.stepz=3"]) == 2


def _tiny_yaml(tmp_path, steps: int) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "model: {preset: tiny-gpt}\n"
        f"train: {{steps: {steps}, batch_size: 8, seq_len: 32, log_every: 5, sample_tokens: 0}}\n"
        "eval: {every: 50, batches: 1}\n"
        "optim: {warmup_steps: 5}\n"
        "checkpoint: {every: 10, keep: 2}\n")
    return str(path)


def _losses(run_dir) -> dict[int, float]:
    """The logged loss of every step; a resumed run logs each step once (its replayed steps' records from
    before the crash are dropped)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert len(steps) == len(set(steps)) and steps == sorted(steps), steps
    return {r["step"]: r["loss"] for r in records}


def test_kill_9_then_rerun_resumes_bit_exactly(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    # killed at its second checkpoint: the 180 steps left outlast any delay of this loop, on a loaded machine too
    config = _tiny_yaml(tmp_path, steps=200)
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    command = [sys.executable, "train.py", config]
    process = subprocess.Popen(command + [f"run.dir={crashed}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600  # only bounds a hung run: a loaded machine is slow
    while not (crashed / "checkpoints" / "20").is_dir():
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    # A half-written checkpoint left by a crash must not break the next run.
    (crashed / "checkpoints" / "990.orbax-checkpoint-tmp-123").mkdir(exist_ok=True)
    resumed = subprocess.run(command + [f"run.dir={crashed}"], capture_output=True, text=True, check=True)
    assert "resumed at step" in resumed.stdout
    assert "note: discarded the partial checkpoint checkpoints/990.orbax-checkpoint-tmp-123" in resumed.stdout
    assert not (crashed / "checkpoints" / "990.orbax-checkpoint-tmp-123").exists()
    subprocess.run(command + [f"run.dir={clean}"], capture_output=True, text=True, check=True)
    reference, after_crash = _losses(clean), _losses(crashed)
    assert max(reference) == 200
    assert {step: after_crash[step] for step in reference} == reference  # bit for bit, every logged step


def test_restoring_into_a_different_model_fails_clearly(tmp_path):
    config = _tiny_yaml(tmp_path, steps=10)
    main([config, f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match="model d_model: 64 -> 32"):
        main([config, f"run.dir={tmp_path / 'run'}", "model.overrides.d_model=32"])


def test_a_resume_that_would_change_the_computation_is_refused_and_writes_nothing(tmp_path):
    """Same shapes, another function (activation, norm position), or another batch, length, schedule or
    precision: refused with the list of differences, and the run folder keeps its files byte for byte;
    train.resume=force resumes and puts the differences on the record in metrics.jsonl."""
    config, run_dir = _tiny_yaml(tmp_path, steps=10), tmp_path / "run"
    main([config, f"run.dir={run_dir}"])
    kept = {name: (run_dir / name).read_bytes() for name in ("config.yaml", "model.json", "metrics.jsonl")}
    changes = ["train.steps=20", "model.overrides.activation=relu", "model.overrides.norm_position=post",
               "train.batch_size=4", "train.compute_dtype=bfloat16"]
    with pytest.raises(ValueError) as refused:
        main([config, f"run.dir={run_dir}", *changes])
    for difference in ("train.steps: 10 -> 20", "model activation: 'gelu_tanh' -> 'relu'",
                       "model norm_position: 'pre' -> 'post'", "train.batch_size: 8 -> 4",
                       "train.compute_dtype: 'float32' -> 'bfloat16'", "train.resume=force"):
        assert difference in str(refused.value)
    assert {name: (run_dir / name).read_bytes() for name in kept} == kept
    # What only changes reporting, evaluation or checkpointing resumes as it is.
    main([config, f"run.dir={run_dir}", "train.steps=10", "train.log_every=2", "eval.batches=2"])
    main([config, f"run.dir={run_dir}", "train.steps=20", "train.resume=force"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    forced = [r for r in records if "resumed_with_changes" in r]
    assert forced == [{"step": 10, "resumed_with_changes": ["train.steps: 10 -> 20"]}]
    assert max(r["step"] for r in records) == 20


def test_resume_compares_the_tokenizer_it_resolves_to_not_its_spelling(tmp_path):
    """data.tokenizer=auto without a model folder resolves to bytes: a rerun that says bytes resumes the
    same run; a tokenizer.json (or another file under the same name) is a different computation."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    config, run_dir = _tiny_yaml(tmp_path, steps=10), tmp_path / "run"
    main([config, f"run.dir={run_dir}", "data.tokenizer=auto"])
    assert main([config, f"run.dir={run_dir}", "data.tokenizer=bytes"]) == 0  # finished: nothing to do
    words = Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1, "the": 2}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(tmp_path / "words.json"))
    # The accepted rerun wrote its own spelling into the folder's config.yaml, as every resume does.
    with pytest.raises(ValueError, match=r"data.tokenizer: 'bytes' \(bytes\) -> '.*words.json' "
                                         r"\(a tokenizer.json of [\d,]+ bytes\)"):
        main([config, f"run.dir={run_dir}", f"data.tokenizer={tmp_path / 'words.json'}"])


def test_non_finite_loss_stops_or_skips(tmp_path):
    base = TINY + ["checkpoint.every=10"]
    # A learning rate this large blows the weights up within a few steps.
    with pytest.raises(FloatingPointError, match="non-finite"):
        main(base + [f"run.dir={tmp_path / 'stop'}", "optim.lr=1e12", "optim.clip_norm=0"])
    skip = base + ["optim.lr=1e12", "optim.clip_norm=0", "train.on_nan=skip"]
    cfg = run_config.load(None, skip + [f"run.dir={tmp_path / 'skip'}", "train.max_skipped_steps=30"])
    result = train(cfg, progress=False)
    assert any("skipped_steps" in r for r in result["history"]) and result["skipped"] > 0
    params = [np.asarray(x) for x in __import__("jax").tree.leaves(__import__("flax").nnx.state(result["model"]))]
    assert all(np.isfinite(p).all() for p in params)  # dropped updates never reached the weights
    # A dead run does not go on: past train.max_skipped_steps (default 10) it stops like on_nan=stop, and no
    # checkpoint after the last good one is written.
    with pytest.raises(FloatingPointError, match=r"steps had a non-finite loss or gradient and were skipped, "
                                                 r"more than train.max_skipped_steps=10") as stopped:
        main(skip + [f"run.dir={tmp_path / 'dead'}"])
    stop_step = int(str(stopped.value).split("stopped at step ")[1].split()[0])
    saved = [int(p.name) for p in (tmp_path / "dead" / "checkpoints").iterdir() if p.name.isdigit()]
    assert stop_step < 30 and all(step < stop_step for step in saved)


def test_values_take_their_field_types():
    assert run_config.load(None, ["optim.lr=1e12"]).optim.lr == 1e12
    with pytest.raises(ValueError, match="train.steps='many' must be int"):
        run_config.load(None, ["train.steps=many"])


# --------------------------------------------------------------------------------------------------
# Every objective's config, and what a finished run is used for


QUICK = ["train.steps=40", "train.log_every=5", "eval.every=40", "eval.batches=2",
         "optim.warmup_steps=5", "train.sample_tokens=0", "checkpoint.every=20"]


@pytest.mark.parametrize("config", ["default", "bert_mlm", "t5_span", "transformer_seq2seq", "bert_classification"])
def test_each_objective_config_trains_and_its_loss_falls(tmp_path, config):
    # 8 rows a step: the generative losses fall as well as at the files' 16 or 32, at a quarter to a half of the
    # compute; two-class classification keeps its 16 (at 8, 40 steps' losses stay within noise of log 2)
    rows = [] if config == "bert_classification" else ["train.batch_size=8"]
    cfg = run_config.load(f"configs/{config}.yaml", QUICK + ["train.seq_len=64", *rows, f"run.dir={tmp_path}"])
    history = train(cfg, progress=False)["history"]
    first, last = np.mean([r["loss"] for r in history[:2]]), np.mean([r["loss"] for r in history[-2:]])
    assert last < first - 0.1, [r["loss"] for r in history]
    assert np.isfinite(history[-1]["eval_loss"])


def test_mixture_of_experts_trains_with_its_load_balancing_loss(tmp_path):
    cfg = run_config.load(None, TINY + ["model.preset=tiny-mixtral", f"run.dir={tmp_path}"])
    history = train(cfg, progress=False)["history"]
    assert all(r["aux_loss"] > 0 for r in history) and history[-1]["loss"] < history[0]["loss"] - 0.3


def test_eval_reproduces_the_logged_metrics_and_convert_gives_a_transformers_folder(tmp_path, capsys):
    import torch
    import transformers

    from jaxformer.cli import main as cli_main

    run_dir = tmp_path / "run"
    cfg = run_config.load("configs/bert_mlm.yaml", QUICK + ["train.seq_len=64", "eval.every=20",
                                                            f"run.dir={run_dir}"])
    history = train(cfg, progress=False)["history"]
    logged = {r["step"]: r for r in history if "eval_loss" in r}
    assert sorted(logged) == [20, 40]
    capsys.readouterr()  # the run's own notes
    for step in (20, None):
        assert cli_main(["eval", str(run_dir), "--json"] + (["--step", str(step)] if step else [])) == 0
        metrics = json.loads(capsys.readouterr().out)
        expected = logged[step or 40]
        assert {k: v for k, v in metrics.items() if k != "step"} == {k: v for k, v in expected.items()
                                                                    if k.startswith("eval_")}
    assert cli_main(["convert", str(run_dir), "--to-hf", str(tmp_path / "hf")]) == 0
    reference = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    from jaxformer.train.evaluate import restore_run

    run, _ = restore_run(run_dir)
    batch = run.objective.eval_batches(1, 4)[0]
    ours = run.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    with torch.no_grad():
        theirs = reference(**{k: torch.as_tensor(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids")})
    np.testing.assert_allclose(np.asarray(ours.logits), theirs.prediction_logits.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(ours.nsp_logits), theirs.seq_relationship_logits.numpy(), atol=1e-5, rtol=0)
    assert cli_main(["eval", str(run_dir), "model.preset=tiny-gpt"]) == 2
    assert "only data.*, eval.* and mesh.* can change" in capsys.readouterr().err
    assert cli_main(["eval", str(run_dir), "--step", "7"]) == 2
    assert "no checkpoint of step 7" in capsys.readouterr().err


def test_the_translation_config_scores_bleu_and_its_export_translates_as_transformers(tmp_path, capsys,
                                                                                       monkeypatch):
    """configs/marian_translation.yaml, shortened: jaxformer eval reproduces the logged eval_bleu, which is
    sacrebleu's corpus BLEU of the eval step's own translations (each starting with its target language's
    token, forced); the exported MarianMTModel translates token for token as jaxformer, beams and the target
    language's token forced, and jaxformer generate prints the same text. (The eval step's outputs are read
    from the step itself, not regenerated by another program whose float rounding could differ.)"""
    import sacrebleu
    import torch
    import transformers
    from tokenizers import Tokenizer

    from jaxformer.cli import main as cli_main
    from jaxformer.train.evaluate import restore_run
    from jaxformer.train.objectives import Seq2Seq

    run_dir = tmp_path / "run"
    cfg = run_config.load("configs/marian_translation.yaml", [
        "train.steps=200", "train.log_every=50", "eval.every=200", "optim.warmup_steps=50", "train.sample_tokens=0",
        "checkpoint.every=200", "train.batch_size=16", "model.overrides.d_model=64", "model.overrides.d_ff=256",
        "model.overrides.encoder_layers=2", "model.overrides.decoder_layers=2", f"run.dir={run_dir}"])
    logged = train(cfg, progress=False)["history"][-1]
    assert 0 <= logged["eval_bleu"] <= 100 and 0 <= logged["eval_exact_match"] <= 100

    outputs = {}
    score = Seq2Seq.finish_outputs
    monkeypatch.setattr(Seq2Seq, "finish_outputs", lambda self, out: outputs.update(out) or score(self, out))
    capsys.readouterr()
    assert cli_main(["eval", str(run_dir), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["eval_bleu"] == logged["eval_bleu"] and metrics["eval_exact_match"] == logged["eval_exact_match"]
    run, _ = restore_run(run_dir)
    objective = run.objective
    rows = outputs["translation"][:len(objective.references)]
    np.testing.assert_array_equal(rows[:, 0], [target[0] for _, target in objective.held_out_examples])
    translations = []
    for row in rows:
        ends = np.flatnonzero(row == 1)  # </s>
        translations.append(objective.tokenizer.decode(row[:ends[0]] if len(ends) else row))
    assert sacrebleu.corpus_bleu(translations, [objective.references]).score == logged["eval_bleu"]
    assert 100 * np.mean([t == r for t, r in zip(translations, objective.references)]) == logged["eval_exact_match"]

    hf = tmp_path / "hf"
    assert cli_main(["convert", str(run_dir), "--to-hf", str(hf)]) == 0
    reference = transformers.MarianMTModel.from_pretrained(hf).eval()
    tokenizer = Tokenizer.from_file(str(hf / "tokenizer.json"))
    german = tokenizer.token_to_id("__de__")
    prompts = ["__en__ Yesterday my old dog followed the queen in the garden.", "__en__ The cat sees a bird."]
    encoded = [tokenizer.encode(p).ids for p in prompts]
    ids = np.zeros((2, max(map(len, encoded))), np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(encoded):  # right-padded, as jaxformer generate pads a source
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    settings = dict(max_new_tokens=20, num_beams=4, forced_bos_token_id=german)
    ours = run.model.generate(ids, mask, **settings)
    with torch.no_grad():
        theirs = reference.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), **settings).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert (ours[:, 1] == german).all()
    capsys.readouterr()
    assert cli_main(["generate", str(hf), "--prompt", prompts[0], "--prompt", prompts[1], "--max-new-tokens", "20",
                     "--num-beams", "4", "--forced-bos-token-id", str(german)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [tokenizer.decode([int(t) for t in row]) for row in theirs]


@pytest.mark.parametrize("kind", ["bert", "distilbert", "deberta-v3"])
def test_fine_tuning_a_hugging_face_checkpoint_for_classification(tmp_path, capsys, kind):
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "bert":
        hf_config = transformers.BertConfig(vocab_size=360, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=128, max_position_embeddings=64, pad_token_id=256)
        transformers.BertForMaskedLM(hf_config).save_pretrained(tmp_path / "bert")  # a pretrained MLM, no classifier
    elif kind == "distilbert":  # no token types, a ReLU pre_classifier where BERT has its tanh pooler
        hf_config = transformers.DistilBertConfig(vocab_size=360, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                                  max_position_embeddings=64, pad_token_id=256)
        transformers.DistilBertForMaskedLM(hf_config).save_pretrained(tmp_path / "bert")
    else:  # DeBERTa-v3: disentangled attention, no token types, the enhanced mask decoder's MLM head; gelu pooler
        hf_config = transformers.DebertaV2Config(vocab_size=360, hidden_size=64, num_hidden_layers=2,
                                                 num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                                                 pad_token_id=256, relative_attention=True, pos_att_type="p2c|c2p",
                                                 position_buckets=16, share_att_key=True, norm_rel_ebd="layer_norm",
                                                 position_biased_input=False, legacy=False)
        transformers.DebertaV2ForMaskedLM(hf_config).save_pretrained(tmp_path / "bert")
    cfg = run_config.load("configs/bert_classification.yaml", [
        f"model.init_from=hf:{tmp_path / 'bert'}", "train.steps=60", "eval.every=60", "train.log_every=10",
        f"run.dir={tmp_path / 'run'}", "train.sample_tokens=0", "checkpoint.every=0"])
    result = train(cfg, progress=False)
    assert "freshly initialised" in capsys.readouterr().out  # the new pooler and classifier are named
    assert result["history"][-1]["eval_accuracy"] > 0.8  # two balanced classes: chance is 0.5
    model = result["model"]
    assert model.config.head == "sequence_classification" and model.config.head_options.num_labels == 2


def test_gradient_accumulation_equals_one_big_batch():
    """One step with the batch in four micro-batches: the same loss and, through SGD with learning rate 1
    (so the update is the gradient itself), the same gradient as one big batch, to float32 rounding."""
    from flax import nnx

    from jaxformer.sharding import shardings_of
    from jaxformer.train.run import Run
    from jaxformer.train.steps import init_state, make_steps

    results = []
    for accumulate in (1, 4):
        cfg = run_config.load(None, TINY + [f"train.grad_accum={accumulate}"])
        run = Run.build(cfg)
        graphdef, params, rest = nnx.split(run.model, nnx.Param, ...)
        optimizer = optax.sgd(1.0)
        state = init_state(cfg, run.model, optimizer)
        train_step, _ = make_steps(graphdef, rest, optimizer, run.objective, cfg, run.mesh, shardings_of(state))
        after, metrics = train_step(state, run.objective.batch(0, 8))
        results.append((float(ratio(metrics["sums"]["loss"])), jax.tree.leaves(after["params"])))
    (loss_one, params_one), (loss_four, params_four) = results
    assert loss_four == pytest.approx(loss_one, rel=1e-6)
    for a, b in zip(params_one, params_four):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=0)


def test_bfloat16_compute_keeps_float32_parameters_and_trains(tmp_path):
    result = train(run_config.load(None, TINY + [f"run.dir={tmp_path}", "train.compute_dtype=bfloat16"]),
                   progress=False)
    losses = [r["loss"] for r in result["history"]]
    assert losses[-1] < losses[0] - 0.5
    params = jax.tree.leaves(__import__("flax").nnx.state(result["model"], __import__("flax").nnx.Param))
    assert {p.dtype for p in params} == {np.dtype("float32")} and result["model"].config.dtype == "bfloat16"


def test_a_non_finite_gradient_leaves_parameters_and_optimizer_state_unchanged():
    from flax import nnx

    from jaxformer.sharding import shardings_of
    from jaxformer.train.run import Run
    from jaxformer.train.steps import init_state, make_optimizer, make_steps

    cfg = run_config.load(None, TINY + ["train.on_nan=skip"])
    run = Run.build(cfg)
    graphdef, params, rest = nnx.split(run.model, nnx.Param, ...)
    optimizer, _ = make_optimizer(cfg, params)
    state = init_state(cfg, run.model, optimizer)
    train_step, _ = make_steps(graphdef, rest, optimizer, run.objective, cfg, run.mesh, shardings_of(state))
    table = state["params"]["embed"]["table"]
    table.value = table.value.at[0, 0].set(np.nan)
    before = jax.tree.map(np.array, state)
    after, _ = train_step(state, run.objective.batch(0, 8))
    assert int(after["skipped"]) == 1 and int(after["step"]) == 1
    for old, new in zip(jax.tree.leaves((before["params"], before["opt_state"])),
                        jax.tree.leaves((after["params"], after["opt_state"]))):
        np.testing.assert_array_equal(np.asarray(new), old)  # NaN where it was NaN, every other value kept


@pytest.mark.parametrize("overrides, message", [
    (["model.overrides.num_heads=5"], "num_heads"),
    (["train.seq_len=200"], "train.seq_len=200 exceeds the model's position table"),
    (["mesh.data=2"], "mesh .* holds 2 devices; there are 1"),
    (["train.grad_accum=3"], "train.grad_accum=3 must be >= 1 and divide train.batch_size=8"),
    (["train.objective=mlm"], "trains encoder models"),
    (["model.preset=tiny-bert", "train.objective=mlm"], "vocab_size=256 cannot hold"),
    (["mesh.tensor=-1", "mesh.data=-1"], "only one mesh axis may be -1"),
    pytest.param(["model.overrides.attention_backend=cudnn"], "attention_backend='cudnn' needs an NVIDIA GPU",
                 marks=pytest.mark.skipif(jax.default_backend() == "gpu", reason="a GPU can serve cudnn")),
])
def test_config_errors_name_the_field_before_anything_compiles(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        train(run_config.load(None, TINY + [f"run.dir={tmp_path}"] + overrides), progress=False)
    assert not (tmp_path / "checkpoints").exists()


def test_data_parallel_over_four_devices_matches_one_device(tmp_path):
    """The same run on four simulated devices (mesh.data=4): the batch is split, the losses are not."""
    import subprocess
    import sys

    short = TINY + ["train.steps=6", "train.log_every=1", "eval.every=6"]
    one = train(run_config.load("configs/default.yaml", short + [f"run.dir={tmp_path / 'one'}"]),
                progress=False)["history"]
    env = simulated_devices(4)
    subprocess.run([sys.executable, "train.py", *short, f"run.dir={tmp_path / 'four'}", "mesh.data=4"], env=env,
                   check=True, capture_output=True)
    four = [json.loads(line) for line in (tmp_path / "four" / "metrics.jsonl").read_text().splitlines()]
    # The gradient's sum over devices adds partial sums in another order: float32 rounding, which a few
    # steps of training amplify only slightly.
    np.testing.assert_allclose([r["loss"] for r in four], [r["loss"] for r in one], rtol=1e-5)
    failed = subprocess.run([sys.executable, "train.py", *TINY, f"run.dir={tmp_path / 'bad'}", "mesh.data=4",
                             "train.batch_size=6"], env=env, capture_output=True, text=True)
    assert failed.returncode == 2
    assert ("train.batch_size=6 / train.grad_accum=1: a micro-batch of 6 rows does not divide over the "
            "data-parallel size mesh.data x mesh.fsdp x mesh.expert = 4 x 1 x 1 = 4") in failed.stderr


def test_another_preset_on_the_command_line_drops_the_files_overrides_for_its_own(tmp_path):
    """The default config's GPT widths must not leak into a BERT: they are dropped, and said so."""
    with pytest.warns(UserWarning, match=r"model.preset='tiny-bert' replaces configs/default.yaml's 'tiny-gpt', so "
                                         r"that file's model.overrides for it \(d_model, num_heads, d_ff, "
                                         r"max_positions\) are not applied"):
        cfg = run_config.load("configs/default.yaml", ["model.preset=tiny-bert", "model.overrides.decoder_layers=4"])
    assert cfg.model.overrides == {"decoder_layers": 4}  # given on the command line: kept
    assert run_config.load("configs/default.yaml", ["train.steps=700"]).model.overrides["d_model"] == 128
    # A checkpoint to start from replaces the file's preset just as well (the README's QLoRA command).
    with pytest.warns(UserWarning, match=r"model.init_from='hf:some/llama' replaces configs/default.yaml's preset "
                                         r"'tiny-gpt', so that file's model.overrides for it \(d_model, num_heads, "
                                         r"d_ff, decoder_layers, max_positions\) are not applied"):
        cfg = run_config.load("configs/default.yaml", ["model.init_from=hf:some/llama"])
    assert cfg.model.overrides == {}


def test_a_run_shorter_than_the_warmup_warms_up_over_a_tenth_of_it():
    with pytest.warns(UserWarning, match=r"optim.warmup_steps=50 is not below train.steps=20; warming up over 2"):
        cfg = run_config.load("configs/default.yaml", ["train.steps=20"])
    assert cfg.optim.warmup_steps == 2
    with pytest.raises(ValueError, match="optim.warmup_steps=-1 must be >= 0"):
        run_config.load(None, ["optim.warmup_steps=-1"])


def test_a_learning_rate_must_be_finite():
    for lr in ("inf", "nan", "0"):
        with pytest.raises(ValueError, match=f"optim.lr={float(lr)} must be a finite number > 0"):
            run_config.load(None, [f"optim.lr={lr}"])


# --------------------------------------------------------------------------------------------------
# The prefix LM, UL2, and a decoder run adapted into an encoder-decoder (T5Gemma-style)


def test_prefix_lm_config_trains_and_its_loss_falls(tmp_path):
    cfg = run_config.load("configs/prefix_lm.yaml", QUICK + ["train.steps=20", "eval.every=20", "train.seq_len=32",
                                                             "train.batch_size=8", "checkpoint.every=0",
                                                             f"run.dir={tmp_path}"])
    result = train(cfg, progress=False)
    history = result["history"]
    assert np.mean([r["loss"] for r in history[-2:]]) < np.mean([r["loss"] for r in history[:2]]) - 0.1
    assert np.isfinite(history[-1]["eval_loss"]) and result["model"].config.attention == "prefix"


def test_a_decoder_run_adapted_into_an_encoder_decoder_trains_ul2_then_seq2seq(tmp_path, capsys):
    """configs/t5gemma_adapt.yaml from a tiny decoder run's folder (model.adapt=encoder_decoder, the byte
    vocabulary grown to 360 ids), then configs/t5gemma_numbers.yaml from that run; both losses fall."""
    from jaxformer.train.run import load_run_model

    short = ["train.steps=12", "train.log_every=4", "eval.every=12", "eval.batches=1", "optim.warmup_steps=2",
             "train.sample_tokens=0", "checkpoint.every=12", "train.batch_size=8"]
    decoder, adapted, numbers = tmp_path / "decoder", tmp_path / "adapted", tmp_path / "numbers"
    train(run_config.load(None, short + ["train.seq_len=32", f"run.dir={decoder}"]), progress=False)
    result = train(run_config.load("configs/t5gemma_adapt.yaml", short + [
        "train.seq_len=32", f"model.init_from=jaxformer:{decoder}", f"run.dir={adapted}"]), progress=False)
    assert "embed.table rows 256..359" in capsys.readouterr().out  # the vocabulary grew
    model, losses = result["model"], [r["loss"] for r in result["history"]]
    assert model.config.family == "encoder_decoder" and model.config.encoder_layers == 2
    assert losses[-1] < losses[0] - 0.2, losses
    result = train(run_config.load("configs/t5gemma_numbers.yaml", short + [
        f"model.init_from=jaxformer:{adapted}", f"run.dir={numbers}"]), progress=False)
    losses = [r["loss"] for r in result["history"]]
    assert losses[-1] < losses[0] - 0.2, losses
    assert load_run_model(numbers).config == result["model"].config  # a run folder is a model to start from
    unsaved = tmp_path / "unsaved"  # a run folder whose run saved no checkpoint
    unsaved.mkdir()
    for name in ("config.yaml", "model.json"):
        (unsaved / name).write_bytes((decoder / name).read_bytes())
    with pytest.raises(ValueError, match="unsaved/checkpoints holds no finished checkpoint to start from"):
        load_run_model(unsaved)
