"""Document-aware packing: documents packed into one row with segment ids give each document exactly what it
gives alone (logits and every hidden state, to 1e-5), for a decoder with rotary positions and one with learned
positions, an encoder (MLM) and T5 (inputs and targets packed as t5x packs them); no gradient crosses a
document; the fused kernels that take segment ids (splash, interpreted on CPU; cuDNN's call through jax's XLA
implementation) equal XLA (ring attention: test_sharding.py's context-parallelism check); bad segment ids are refused; train.py's
documents packing trains, and a run folder from before the key resumes as it trained."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import kernels
from jaxformer.train import data
from conftest import jitted, tiny_model

TOL = 1e-5
# two rows: three documents and padding, then two documents filling the row
LAYOUTS = ([5, 9, 7], [11, 13])
T = 24


def packed_row(lengths: list[int], length: int = T) -> np.ndarray:
    """Segment ids of documents of ``lengths`` packed from the start of a row, 0 after them."""
    ids = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)] + [np.zeros(length - sum(lengths))])
    return ids.astype(np.int32)


def packed_batch(vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(seed).integers(0, vocab, (len(LAYOUTS), T)).astype(np.int32)
    return ids, np.stack([packed_row(lengths) for lengths in LAYOUTS])


def documents(segments: np.ndarray):
    """(row, start, end) of every document of a batch of segment ids."""
    for row, ids in enumerate(segments):
        for doc in np.unique(ids[ids > 0]):
            where = np.flatnonzero(ids == doc)
            yield row, int(where[0]), int(where[-1]) + 1


def assert_same(packed, alone, what: str) -> None:
    worst = float(np.abs(np.asarray(packed) - np.asarray(alone)).max())
    assert worst < TOL, f"{what}: {worst}"


@pytest.mark.parametrize("name,changes", [("tiny-llama", {}), ("tiny-gpt", {}), ("tiny-bert", {"head": "mlm"})])
def test_a_packed_row_equals_each_document_alone(name, changes):
    model = jitted(tiny_model(name, **changes))
    ids, segments = packed_batch(model.config.vocab_size)
    packed = model(jnp.asarray(ids), segment_ids=jnp.asarray(segments), output_hidden_states=True)
    for row, start, end in documents(segments):
        alone = model(jnp.asarray(ids[row:row + 1, start:end]), output_hidden_states=True)
        assert_same(packed.logits[row, start:end], alone.logits[0], f"logits of {row}:{start}-{end}")
        for layer, (p, a) in enumerate(zip(packed.hidden_states, alone.hidden_states)):
            assert_same(p[row, start:end], a[0], f"hidden state {layer} of {row}:{start}-{end}")


def test_packed_positions_restart_at_each_document():
    """What the model derives from segment ids: each document's positions from 0 (RoBERTa's from pad + 1)."""
    segments = jnp.asarray(np.stack([packed_row(lengths) for lengths in LAYOUTS]))
    positions = tiny_model("tiny-gpt").embeddings.document_positions(segments)
    expected = [np.concatenate([np.arange(n) for n in lengths] + [np.arange(T - sum(lengths))]) for lengths in LAYOUTS]
    np.testing.assert_array_equal(np.asarray(positions), np.stack(expected))
    roberta = tiny_model("tiny-bert", pad_aware_positions=True, pad_token_id=1, position_offset=2).embeddings
    alone = roberta.default_positions(jnp.full((1, 9), 7), (1, 9))  # a document alone, without padding
    np.testing.assert_array_equal(np.asarray(roberta.document_positions(segments[:1, 5:14])), np.asarray(alone))


def t5_packed_batch(vocab: int):
    """Span-corrupted inputs and targets of five examples packed t5x's way: two rows, example i's
    inputs and targets both segment i, padding 0."""
    rng = np.random.default_rng(1)
    inputs = (([6, 10, 5], 24), ([12, 9], 24))
    targets = (([4, 7, 3], 16), ([8, 5], 16))
    rows = []
    for (source, s_len), (target, t_len) in zip(inputs, targets):
        rows.append((packed_row(source, s_len), packed_row(target, t_len)))
    source_segments = np.stack([r[0] for r in rows])
    target_segments = np.stack([r[1] for r in rows])
    return (rng.integers(0, vocab, source_segments.shape).astype(np.int32), source_segments,
            rng.integers(0, vocab, target_segments.shape).astype(np.int32), target_segments)


def test_t5_packed_inputs_and_targets_equal_each_example_alone():
    model = jitted(tiny_model("tiny-t5"))
    source, source_segments, target, target_segments = t5_packed_batch(model.config.vocab_size)
    packed = model(jnp.asarray(source), None, jnp.asarray(target), None, segment_ids=jnp.asarray(source_segments),
                   decoder_segment_ids=jnp.asarray(target_segments), output_hidden_states=True)
    for (row, s0, s1), (_, t0, t1) in zip(documents(source_segments), documents(target_segments)):
        alone = model(jnp.asarray(source[row:row + 1, s0:s1]), None, jnp.asarray(target[row:row + 1, t0:t1]), None,
                      output_hidden_states=True)
        assert_same(packed.logits[row, t0:t1], alone.logits[0], f"logits of example {row}:{t0}-{t1}")
        for layer, (p, a) in enumerate(zip(packed.encoder_hidden_states, alone.encoder_hidden_states)):
            assert_same(p[row, s0:s1], a[0], f"encoder hidden state {layer}")
        for layer, (p, a) in enumerate(zip(packed.hidden_states, alone.hidden_states)):
            assert_same(p[row, t0:t1], a[0], f"decoder hidden state {layer}")


def test_no_gradient_crosses_a_document():
    """Causality by gradients: the loss on one document's outputs has exactly zero gradient on every other
    document's input embeddings (decoder), and on the other examples' inputs and targets (T5)."""
    model = tiny_model("tiny-llama")
    graphdef, state = nnx.split(model)
    segments = packed_row(LAYOUTS[0])[None]
    x = jax.random.normal(jax.random.key(0), (1, T, model.config.d_model))

    def middle_document_loss(x):
        out = nnx.merge(graphdef, state)(inputs_embeds=x, segment_ids=jnp.asarray(segments))
        return jnp.sum(jnp.where(jnp.asarray(segments == 2)[..., None], out.logits, 0.0) ** 2)

    grad = np.abs(np.asarray(jax.jit(jax.grad(middle_document_loss))(x))).sum(-1)[0]
    assert (grad[segments[0] != 2] == 0).all() and (grad[segments[0] == 2] > 0).all()

    t5 = tiny_model("tiny-t5")
    graphdef, state = nnx.split(t5)
    source, source_segments, target, target_segments = t5_packed_batch(t5.config.vocab_size)
    D = t5.config.d_model
    xs = jax.random.normal(jax.random.key(1), (*source.shape, D))
    xt = jax.random.normal(jax.random.key(2), (*target.shape, D))

    def second_example_loss(xs, xt):
        out = nnx.merge(graphdef, state)(inputs_embeds=xs, decoder_inputs_embeds=xt,
                                         segment_ids=jnp.asarray(source_segments),
                                         decoder_segment_ids=jnp.asarray(target_segments))
        return jnp.sum(jnp.where(jnp.asarray(target_segments[:1] == 2)[..., None], out.logits[:1], 0.0) ** 2)

    gs, gt = (np.abs(np.asarray(g)).sum(-1)[0] for g in jax.jit(jax.grad(second_example_loss, (0, 1)))(xs, xt))
    assert (gs[source_segments[0] != 2] == 0).all() and (gs[source_segments[0] == 2] > 0).all()
    assert (gt[target_segments[0] != 2] == 0).all() and (gt[target_segments[0] == 2] > 0).all()


# --------------------------------------------------------------------------------------------------
# Fused kernels: splash (interpreted on CPU: blocks of 128) and cuDNN's call take segment ids

KERNEL_CASES = {"causal_rope": ("tiny-llama", {}),
                "sliding": ("tiny-llama", {"attention": "sliding", "window_size": 48}),
                "bidirectional": ("tiny-bert", {}), "t5_cross": ("tiny-t5", {})}


def _kernel_run(cfg, batch, real):
    graphdef, state = nnx.split(jf.build(cfg, seed=3))

    def loss(state):
        out = nnx.merge(graphdef, state)(**batch)
        logits = (out.last_hidden_state if out.logits is None else out.logits).astype(jnp.float32)
        return jnp.mean(jnp.square(logits) * real[..., None]), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
    return np.asarray(logits), grads


def _kernel_batch(cfg):
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 128)), jnp.int32)
    segments = jnp.asarray(np.stack([packed_row([40, 50, 30], 128), packed_row([70, 58], 128)]))
    batch = {"input_ids": ids, "segment_ids": segments}
    if cfg.family == "encoder_decoder":
        batch |= {"decoder_input_ids": ids, "decoder_segment_ids": segments}
    return batch, np.asarray(segments) > 0


def _compare_kernel(case: str, backend: str, tolerance: float, **changes) -> None:
    name, overrides = KERNEL_CASES[case]
    cfg = jf.config(name).replace(**overrides, **changes, attention_backend="xla")
    batch, real = _kernel_batch(cfg)
    expected, expected_grads = _kernel_run(cfg, batch, real)
    fused = cfg.replace(attention_backend=backend)
    if backend == "splash":  # the kernel really runs (the packed call is inside its reach)
        model = jf.build(fused, seed=3)
        assert "pallas_call" in str(jax.make_jaxpr(lambda: model(**batch))())
    got, grads = _kernel_run(fused, batch, real)
    assert np.abs(got - expected)[real].max() < tolerance
    worst = max(float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max())
                for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)))
    assert worst < tolerance, worst


@pytest.mark.parametrize("backend", ["splash", "cudnn"])
@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_fused_kernels_take_segment_ids(case, backend, monkeypatch):
    if backend == "cudnn":  # pretend to be a GPU that accepts the model; run the call through jax's XLA path
        monkeypatch.setattr(kernels, "platform", lambda: "gpu")
        monkeypatch.setattr(kernels, "cudnn_refuses", lambda cfg: None)
        monkeypatch.setattr(kernels, "CUDNN_IMPLEMENTATION", "xla")
    _compare_kernel(case, backend, TOL)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU")
@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_cudnn_kernel_takes_segment_ids_in_bfloat16(case):
    # bfloat16 operands: the kernel and XLA round probabilities and partial sums differently (as test_kernels)
    _compare_kernel(case, "cudnn", 5e-2, dtype="bfloat16")


# --------------------------------------------------------------------------------------------------
# Bad segment ids


@pytest.mark.parametrize("segments,message", [
    (np.ones((2, T - 1), np.int32), "expected (2, 24)"),
    (np.full((2, T), -1, np.int32), "valid ids are 0 (padding)"),
    (np.ones((2, T), np.float32), "must hold integer document ids"),
    (np.array([packed_row([5, 9, 7]), np.r_[[1] * 5, [2] * 5, [1] * 14]], np.int32), "document 1 appears in two"),
])
def test_bad_segment_ids_are_refused(segments, message):
    model = tiny_model("tiny-llama")
    ids = np.zeros((2, T), np.int32)
    with pytest.raises(ValueError, match=re.escape(message)):
        model(ids, segment_ids=segments)


def test_models_that_cannot_pack_refuse_segment_ids_by_name():
    ids, segments = packed_batch(256)
    with pytest.raises(ValueError, match="Transformer-XL's segment memory"):
        tiny_model("tiny-transformer-xl")(ids, segment_ids=segments)
    t5 = tiny_model("tiny-t5")
    with pytest.raises(ValueError, match="decoder_segment_ids .* together"):
        t5(ids, None, ids, segment_ids=segments)


# --------------------------------------------------------------------------------------------------
# The data side: train.py's rows under data.packing=documents


def short_documents(tmp_path) -> str:
    """A .txt of 400 documents of two lines of 1 to 4 words (blank lines between them): many a row."""
    corpus = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    line = lambda: " ".join(rng.choice(words, int(rng.integers(1, 5))))  # noqa: E731
    corpus.write_text("\n\n".join(f"{line()}\n{line()}" for _ in range(400)))
    return str(corpus)


def _objective(tmp_path, *overrides: str, preset: str = "tiny-gpt", **changes):
    from jaxformer.train import run_config
    from jaxformer.train.tasks import make_objective

    cfg = run_config.load(None, [f"data.train={short_documents(tmp_path)}", f"run.dir={tmp_path / 'run'}", *overrides])
    objective = make_objective(cfg, data.ByteTokenizer())
    model_config = objective.adapt(jf.config(preset).replace(**changes), True)
    return objective, model_config


def test_causal_lm_rows_number_their_documents_and_never_predict_across_one(tmp_path):
    objective, _ = _objective(tmp_path, "train.seq_len=64")
    assert objective.run.data.packing == "documents" and objective.documents
    concatenated, _ = _objective(tmp_path, "train.seq_len=64", "data.packing=concatenate")
    batch, plain = objective.batch(3, 8), concatenated.batch(3, 8)
    np.testing.assert_array_equal(batch["input_ids"], plain["input_ids"])  # the same windows, now numbered
    segments, separator = batch["segment_ids"], data.ByteTokenizer.document_separator
    assert (segments[:, 0] == 1).all() and set(np.unique(np.diff(segments, axis=1))) == {0, 1}
    for ids, row in zip(batch["input_ids"], segments):  # a document ends with its separator
        starts = np.flatnonzero(np.diff(row)) + 1
        assert all((ids[s - len(separator):s] == separator).all() for s in starts if s >= len(separator))
    crossing = np.concatenate([segments[:, 1:] != segments[:, :-1], np.zeros((8, 1), bool)], axis=1)
    next_first = batch["labels"] == data.IGNORE
    assert (next_first[:, :-1] == crossing[:, :-1]).all() and next_first.any()
    np.testing.assert_array_equal(np.where(next_first, plain["labels"], batch["labels"]), plain["labels"])


def test_span_corruption_packs_each_document_corrupted_alone(tmp_path):
    objective, cfg = _objective(tmp_path, "train.seq_len=64", "train.objective=span_corruption",
                                preset="tiny-t5", vocab_size=360)
    batch = objective.batch(0, 4)
    top, eos, pad = data.ByteTokenizer.vocab_size - 1, data.ByteTokenizer.SPECIALS["eos"], objective.pad
    assert batch["segment_ids"].max() >= 2  # several documents a row
    for row in range(4):
        source_segments, target_segments = batch["segment_ids"][row], batch["decoder_segment_ids"][row]
        assert np.array_equal(np.unique(source_segments[source_segments > 0]),
                              np.unique(target_segments[target_segments > 0]))
        for example in np.unique(source_segments[source_segments > 0]):
            source = batch["input_ids"][row][source_segments == example]
            target = batch["labels"][row][target_segments == example]
            decoder_inputs = batch["decoder_input_ids"][row][target_segments == example]
            assert source[-1] == eos and target[-1] == eos and target[0] == top  # sentinels from <extra_id_0>
            np.testing.assert_array_equal(decoder_inputs, np.r_[pad, target[:-1]])  # T5 starts each from pad
            spans, current = {}, None
            for token in target[:-2]:
                if token > eos:
                    current = int(token)
                    spans[current] = []
                else:
                    spans[current].append(int(token))
            rebuilt = [t for token in source[:-1] for t in (spans.pop(int(token)) if token > eos else [int(token)])]
            assert not spans and data.ByteTokenizer().decode(rebuilt).strip()  # one piece of text, spans restored
        assert (batch["labels"][row][target_segments == 0] == data.IGNORE).all()
    out = jf.build(cfg)(**{k: v for k, v in batch.items() if k != "labels"})
    assert out.logits.shape == (*batch["labels"].shape, cfg.vocab_size)


def test_a_new_run_packs_documents_and_an_existing_one_keeps_what_it_had(tmp_path):
    from jaxformer.train import run_config

    def packing(run_dir, *overrides):
        return run_config.load(None, [f"run.dir={run_dir}", *overrides]).data.packing

    assert packing(tmp_path / "new") == "documents"
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.yaml").write_text("data:\n  train: python-docs\ntrain:\n  steps: 5\n")  # before the key
    assert packing(old) == "concatenate" and packing(old, "data.packing=documents") == "documents"
    (old / "config.yaml").write_text(run_config.dump(run_config.load(None, [f"run.dir={tmp_path / 'new'}"])))
    assert packing(old) == "documents"
    with pytest.raises(ValueError, match="data.packing='words'; valid: 'documents', 'concatenate'"):
        packing(old, "data.packing=words")


def test_train_py_with_documents_packing_trains(tmp_path):
    from jaxformer.train import run_config
    from jaxformer.train.run import train

    cfg = run_config.load(None, ["train.steps=30", "train.batch_size=8", "train.seq_len=64", "train.log_every=5",
                                 "eval.every=30", "eval.batches=2", "optim.warmup_steps=5", "train.sample_tokens=0",
                                 "checkpoint.every=0", f"run.dir={tmp_path / 'run'}", "data.packing=documents",
                                 f"data.train={short_documents(tmp_path)}"])
    history = train(cfg, progress=False)["history"]
    first, last = np.mean([r["loss"] for r in history[:2]]), np.mean([r["loss"] for r in history[-2:]])
    assert last < first - 0.1, [r["loss"] for r in history]
    assert np.isfinite(history[-1]["eval_loss"])


def test_mlm_without_a_pair_task_packs_examples_and_trains_on_them(tmp_path):
    objective, cfg = _objective(tmp_path, "train.seq_len=64", "train.objective=mlm", "data.nsp=false",
                                preset="tiny-bert", vocab_size=360)
    assert objective.documents
    batch = objective.batch(0, 4)
    cls, sep = data.ByteTokenizer.SPECIALS["bos"], data.ByteTokenizer.SPECIALS["eos"]
    originals = np.where(batch["labels"] != data.IGNORE, batch["labels"], batch["input_ids"])
    assert batch["segment_ids"].max(axis=1).min() >= 2  # several examples a row
    for ids, segments in zip(originals, batch["segment_ids"]):
        for example in np.unique(segments[segments > 0]):
            tokens = ids[segments == example]
            assert tokens[0] == cls and tokens[-1] == sep and (tokens == sep).sum() == 2
    np.testing.assert_array_equal(batch["attention_mask"], (batch["segment_ids"] > 0).astype(np.int32))
    model = jf.build(cfg)
    loss, sums = objective.loss(model, batch, None)
    assert np.isfinite(float(loss))
    with_pairs, _ = _objective(tmp_path, "train.seq_len=64", "train.objective=mlm", preset="tiny-bert",
                               vocab_size=360)
    assert not with_pairs.documents and "segment_ids" not in with_pairs.batch(0, 4)  # NSP: one pair a row


def test_a_run_folder_from_before_the_key_resumes_as_it_trained(tmp_path):
    """A run folder whose config.yaml predates data.packing resumes with concatenate: exactly the losses of an
    uninterrupted concatenate run; asking it for documents is a refused change of what it computes."""
    from jaxformer.train.run import main

    def losses(run_dir):
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in records if "loss" in r}

    common = ["train.batch_size=8", "train.seq_len=64", "train.log_every=5", "eval.every=20", "eval.batches=1",
              "optim.schedule=constant", "optim.warmup_steps=2", "train.sample_tokens=0", "checkpoint.every=10",
              f"data.train={short_documents(tmp_path)}"]
    clean, old = tmp_path / "clean", tmp_path / "old"
    main(common + ["train.steps=20", f"run.dir={clean}", "data.packing=concatenate"])
    main(common + ["train.steps=10", f"run.dir={old}", "data.packing=concatenate"])
    stored = (old / "config.yaml").read_text()
    assert "  packing: concatenate\n" in stored
    (old / "config.yaml").write_text(stored.replace("  packing: concatenate\n", ""))  # as written before the key
    with pytest.raises(ValueError, match="data.packing: 'concatenate' -> 'documents'"):
        main(common + ["train.steps=10", f"run.dir={old}", "data.packing=documents"])
    main(common + ["train.steps=20", f"run.dir={old}", "train.resume=force"])  # (force: only the steps change)
    records = [json.loads(line) for line in (old / "metrics.jsonl").read_text().splitlines()]
    assert [r["resumed_with_changes"] for r in records if "resumed_with_changes" in r] == [["train.steps: 10 -> 20"]]
    assert losses(old) == losses(clean)


def test_the_packed_documents_picture_is_causal_inside_each_document():
    from jaxformer.viz import mask_pictures

    picture = next(p for p in mask_pictures(12) if p.name == "packed_documents")
    (panel,) = picture.panels
    blocks = np.zeros((12, 12), bool)
    for start in (0, 4, 8):  # three documents of 4 tokens, each its own lower triangle
        blocks[start:start + 4, start:start + 4] = np.tril(np.ones((4, 4), bool))
    np.testing.assert_array_equal(panel.visible, blocks)
    assert panel.query_labels[:5] == ["a0", "a1", "a2", "a3", "b0"]
