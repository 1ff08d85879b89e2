"""The prefix LM and UL2's mixture of denoisers: what their batches hold in both model families, who sees
whom in a prefix-LM decoder, each denoiser's statistics, and the errors of their configs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from conftest import dependency, embeds
from jaxformer.train import run_config
from jaxformer.train.data import IGNORE, ByteTokenizer, Denoiser, parse_denoisers
from jaxformer.train.tasks import make_objective

TOKENIZER = ByteTokenizer()
PAD, EOS = TOKENIZER.special("pad"), TOKENIZER.special("eos")
MODES = {mode: TOKENIZER.special(f"mode_{mode}") for mode in "RXS"}
TOP = TOKENIZER.special("sentinel")  # <extra_id_0>
T5 = jf.config("tiny-t5").replace(vocab_size=ByteTokenizer.vocab_size)


def _objective(name: str, model_cfg, *overrides: str, tokenizer=TOKENIZER):
    """The objective and the model config it adapted (which lays out its batches)."""
    objective = make_objective(run_config.load(None, [f"train.objective={name}", *overrides]), tokenizer)
    return objective, objective.adapt(model_cfg, fresh=True)


def _in_stream(objective, tokens) -> bool:
    """Whether ``tokens`` (text bytes) are a contiguous piece of the training stream."""
    stream = objective.train.stream.read(0, len(objective.train.stream)).astype(np.uint8).tobytes()
    return np.asarray(tokens, np.uint8).tobytes() in stream


# --------------------------------------------------------------------------------------------------
# The prefix LM


def test_prefix_lm_decoder_batches_predict_the_target_only():
    objective, cfg = _objective("prefix_lm", jf.config("tiny-gpt"), "train.seq_len=32")
    assert cfg.attention == "prefix" and "attention 'causal' -> 'prefix'" in objective.notes[0]
    assert objective.target_len == 0 and objective.raw_lengths == [33]  # seq_len + 1: one window per row
    batch = objective.batch(0, 256)
    ids, labels, prefix = batch["input_ids"], batch["labels"], batch["prefix_lengths"]
    assert ids.shape == labels.shape == (256, 32) and prefix.shape == (256,) and prefix.dtype == np.int32
    assert 1 <= prefix.min() and prefix.max() <= 32
    np.testing.assert_array_equal(labels[:, :-1][labels[:, :-1] != IGNORE], ids[:, 1:][labels[:, :-1] != IGNORE])
    # The label of position t is token t + 1: IGNORE exactly where that token is still the prefix.
    np.testing.assert_array_equal(labels == IGNORE, np.arange(32)[None] + 1 < prefix[:, None])
    target = 33 - prefix  # data.target_fraction=0.5: the split point uniform over the window
    assert abs(target.mean() / 33 - 0.5) < 0.05
    np.testing.assert_array_equal(objective.batch(7, 8)["input_ids"], objective.batch(7, 8)["input_ids"])
    assert not np.array_equal(objective.batch(7, 8)["prefix_lengths"], objective.batch(8, 8)["prefix_lengths"])

    graphdef, state = nnx.split(jf.build(cfg))

    @jax.jit
    def loss_and_logits(state, batch):
        model = nnx.merge(graphdef, state)
        logits = model(batch["input_ids"], prefix_lengths=batch["prefix_lengths"]).logits
        return *objective.loss(model, batch, None), logits

    small = {k: v[:4] for k, v in batch.items()}
    loss, sums, logits = loss_and_logits(state, small)
    log_p = np.asarray(jax.nn.log_softmax(logits))
    picked = [-log_p[b, t, small["labels"][b, t]] for b in range(4) for t in range(32)
              if t + 1 >= small["prefix_lengths"][b]]
    assert float(sums["loss"][1]) == len(picked) == int(target[:4].sum())
    assert float(loss) == pytest.approx(float(np.mean(picked)), abs=1e-5)


def _prefix_logits(model, x, lengths):
    return model(inputs_embeds=x, prefix_lengths=lengths).logits


def test_prefix_lm_decoder_sees_its_prefix_both_ways_and_its_target_causally():
    """d logits[t] / d embedding[t']: non-zero for a later prefix token t' at an earlier prefix position t,
    zero for any later target token; target positions see everything before them."""
    objective, cfg = _objective("prefix_lm", jf.config("tiny-gpt"), "train.seq_len=8")
    lengths = objective.batch(3, 64)["prefix_lengths"]
    lengths = jnp.asarray([lengths[(lengths > 1) & (lengths < 7)][0], 6], jnp.int32)  # a prefix, a target
    dep = dependency(jf.build(cfg), _prefix_logits, embeds(2, 8, cfg.d_model, seed=3), lengths)
    t, s = np.arange(8)[:, None], np.arange(8)[None, :]
    for row, p in zip(dep, np.asarray(lengths)):
        sees = (s <= t) | ((t < p) & (s < p))
        assert (row[sees] != 0).all() and (row[~sees] == 0).all()
        assert row[0, p - 1] != 0  # the first token reads the last of the prefix


def test_prefix_lm_encoder_decoder_reads_the_prefix_and_predicts_the_rest():
    objective, cfg = _objective("prefix_lm", T5, "train.seq_len=32", "data.target_fraction=0.25")
    assert cfg.tokens.decoder_start == PAD and objective.raw_lengths == [32] and objective.target_len == 17
    batch = objective.batch(0, 64)
    assert batch["input_ids"].shape == (64, 32) and batch["labels"].shape == (64, 17)
    assert (batch["decoder_input_ids"][:, 0] == PAD).all()
    fractions = []
    for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"]):
        prefix, target = ids[:mask.sum()], labels[labels != IGNORE]
        assert prefix[-1] == EOS and target[-1] == EOS
        assert _in_stream(objective, np.concatenate([prefix[:-1], target[:-1]]))  # one window, split
        fractions.append((len(target) - 1) / 32)
    assert abs(np.mean(fractions) - 0.25) < 0.04


# --------------------------------------------------------------------------------------------------
# UL2


def _reassemble(source: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, int, int]:
    """The window a span-corrupted (source, target) pair came from, its noise tokens and its spans;
    asserts that the sentinels count down from <extra_id_0> alike on both sides."""
    is_sentinel = (target > MODES["R"]) & (target <= TOP)  # the mode tokens sit just below the sentinels
    starts = np.flatnonzero(is_sentinel)
    spans = {int(target[a]): target[a + 1:b] for a, b in zip(starts[:-1], starts[1:])}
    order = [int(i) for i in source if MODES["R"] < i <= TOP]
    assert order == list(spans) == list(range(TOP, TOP - len(order), -1))
    assert int(target[starts[-1]]) == TOP - len(order) and starts[-1] == len(target) - 1  # the closing one
    window = np.concatenate([spans[int(i)] if MODES["R"] < i <= TOP else [i] for i in source])
    return window, sum(len(s) for s in spans.values()), len(spans)


@pytest.mark.parametrize("denoiser, seq_len", [
    ({"mode": "R", "mean_span": 3, "rate": 0.15}, 256), ({"mode": "R", "mean_span": 8, "rate": 0.15}, 640),
    ({"mode": "X", "mean_span": 3, "rate": 0.5}, 256), ({"mode": "X", "mean_span": 8, "rate": 0.5}, 256),
    ({"mode": "X", "mean_span": 64, "rate": 0.15}, 4096), ({"mode": "X", "mean_span": 64, "rate": 0.5}, 1536),
    ({"mode": "S", "rate": 0.25}, 256),
])
def test_each_ul2_denoiser_hides_its_rate_in_spans_of_its_mean_length(denoiser, seq_len):
    """Windows long enough for ten spans or more, so the span count's rounding stays within 5%."""
    spec = "[{" + ", ".join(f"{k}: {v}" for k, v in denoiser.items()) + "}]"
    objective, _ = _objective("ul2", T5, f"train.seq_len={seq_len}", f"data.denoisers={spec}")
    noise = kept = spans = 0
    for step in range(2):
        batch = objective.batch(step, 32)
        assert (batch["input_ids"][:, 0] == MODES[denoiser["mode"]]).all()
        for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"]):
            source, target = ids[1:mask.sum()], labels[labels != IGNORE]
            assert source[-1] == EOS and target[-1] == EOS
            if denoiser["mode"] == "S":  # the target is the window's suffix
                window, hidden, count = np.concatenate([source[:-1], target[:-1]]), len(target) - 1, 1
            else:
                window, hidden, count = _reassemble(source[:-1], target[:-1])
            assert _in_stream(objective, window)
            noise, kept, spans = noise + hidden, kept + len(window) - hidden, spans + count
    assert abs(noise / (noise + kept) - denoiser["rate"]) < 0.02
    if denoiser["mode"] != "S":
        assert abs(noise / spans / denoiser["mean_span"] - 1) < 0.05


def test_ul2_mixes_the_denoisers_by_weight_in_static_shapes():
    objective, _ = _objective("ul2", T5, "train.seq_len=128")  # the paper's seven, uniformly
    assert objective.target_len == 128  # X (mean span 64, rate 0.5) hides half of a 248-token window
    batches = [objective.batch(step, 64) for step in range(6)]
    assert {b["labels"].shape for b in batches} == {(64, 128)}
    first = np.concatenate([b["input_ids"][:, 0] for b in batches])
    shares = {mode: np.mean(first == token) for mode, token in MODES.items()}
    assert abs(shares["R"] - 2 / 7) < 0.06 and abs(shares["X"] - 4 / 7) < 0.06 and abs(shares["S"] - 1 / 7) < 0.06
    for batch in batches:  # nothing cut: every target ends in EOS
        assert all(EOS in row[row != IGNORE][-1:] for row in batch["labels"])
    weighted, _ = _objective("ul2", T5, "train.seq_len=64",
                             "data.denoisers=[{mode: R, mean_span: 3, rate: 0.15, weight: 3}, {mode: S, rate: 0.25}]")
    first = np.concatenate([weighted.batch(step, 64)["input_ids"][:, 0] for step in range(4)])
    assert abs(np.mean(first == MODES["R"]) - 0.75) < 0.07


def test_ul2_decoder_rows_are_mode_input_then_target():
    """A decoder with attention='prefix' reads [mode] input, then target, in one row of seq_len + 1 tokens."""
    objective, cfg = _objective("ul2", jf.config("tiny-gpt").replace(vocab_size=360), "train.seq_len=64")
    assert cfg.attention == "prefix" and objective.target_len == 0
    batch = objective.batch(0, 32)
    for ids, labels, p in zip(batch["input_ids"], batch["labels"], batch["prefix_lengths"]):
        assert ids[0] in MODES.values()
        target = labels[labels != IGNORE]
        np.testing.assert_array_equal(target, ids[p:p + len(target) - 1].tolist() + [target[-1]])
        if ids[0] != MODES["S"]:
            _reassemble(ids[1:p], target)  # sentinels agree between the prefix and the target


def test_denoiser_lengths_are_those_it_makes():
    rng = np.random.default_rng(0)
    row = rng.integers(0, 256, 300).astype(np.int32)
    for spec in parse_denoisers([{"mode": "X", "mean_span": 8, "rate": 0.5}, {"mode": "S", "rate": 0.25}]):
        made = [spec.apply(row, rng, TOP) for _ in range(200)]
        longest_input, longest_target, longest_row = spec.lengths(300)
        assert max(len(s) for s, _ in made) <= longest_input and max(len(t) for _, t in made) <= longest_target
        assert max(len(s) + len(t) for s, t in made) == longest_row
    prefix, suffix = Denoiser("S", 0.25).apply(row, rng, None)
    np.testing.assert_array_equal(np.concatenate([prefix, suffix]), row)


# --------------------------------------------------------------------------------------------------
# What bad settings get


@pytest.mark.parametrize("denoisers, message", [
    ("[]", r"data.denoisers must be a non-empty list"),
    ("[{mode: Q, rate: 0.15, mean_span: 3}]", r"data.denoisers\[0\].mode='Q'; valid: 'R', 'X', 'S'"),
    ("[{mode: R, rate: 0.15, mean_span: 3}, {mode: R, rate: 1.5, mean_span: 3}]",
     r"data.denoisers\[1\].rate=1.5 \(the fraction of tokens hidden\) must lie in \(0, 1\)"),
    ("[{mode: R, rate: 0.15}]", r"data.denoisers\[0\].mean_span=None must be a finite number"),
    ("[{mode: X, rate: 0.5, mean_span: 0.5}]", r"data.denoisers\[0\].mean_span=0.5 must be >= 1"),
    ("[{mode: S, rate: 0.25, mean_span: 3}]", r"data.denoisers\[0\].mean_span: an S-denoiser \(prefix LM\) has no"),
    ("[{mode: S, rate: 0.75}]", r"data.denoisers\[0\].rate=0.75 \(the S-denoiser's mean target fraction\)"),
    ("[{mode: S, rate: 0.25, weight: 0}]", r"data.denoisers\[0\].weight=0.0 must be > 0"),
    ("[{mode: S, rate: 0.25, span: 3}]", r"data.denoisers\[0\] has unknown keys \['span'\]"),
])
def test_bad_denoisers_are_refused_by_key(denoisers, message):
    with pytest.raises(ValueError, match=message):
        run_config.load(None, ["train.objective=ul2", f"data.denoisers={denoisers}"])


def test_settings_that_do_not_fit_are_refused_before_anything_compiles(tmp_path):
    from jaxformer.train.run import train

    with pytest.raises(ValueError, match=r"model.adapt='t5'; valid: '' \(none\), 'encoder_decoder', 'prefix_lm'"):
        run_config.load(None, ["model.adapt=t5"])
    with pytest.raises(ValueError, match=r"data.target_fraction=0.75 must lie in \(0, 0.5\]"):
        run_config.load(None, ["data.target_fraction=0.75"])
    with pytest.raises(ValueError, match=r"data.denoisers\[2\] \(X: mean_span 3, rate 0.5\) needs 128 sentinel ids"):
        _objective("ul2", T5, "train.seq_len=512")  # the byte tokenizer has 97 besides the mode tokens
    with pytest.raises(ValueError, match="trains encoder-decoder models and decoders; model 'tiny-bert' is an encoder"):
        _objective("prefix_lm", jf.config("tiny-bert"))
    with pytest.raises(ValueError, match="attention='sliding'"):
        _objective("prefix_lm", jf.config("tiny-gpt").replace(attention="sliding", window_size=4))
    with pytest.raises(ValueError, match="use train.objective=prefix_lm or ul2"):
        _objective("causal_lm", jf.config("tiny-gpt").replace(attention="prefix"))
    with pytest.raises(ValueError, match=r"model.adapt='encoder_decoder': adapt\(\) takes a decoder-only model"):
        train(run_config.load(None, ["model.preset=tiny-bert", "model.adapt=encoder_decoder",
                                     f"run.dir={tmp_path}"]), progress=False)
    assert not (tmp_path / "checkpoints").exists()


def test_ul2_with_a_hugging_face_tokenizer_needs_its_mode_tokens(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from jaxformer.train.data import HFTokenizer, default_documents

    def tokenizer_with(specials: list[str]) -> HFTokenizer:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
        tokenizer.train_from_iterator(default_documents()[:50], trainers.BpeTrainer(vocab_size=400,
                                                                                   special_tokens=specials))
        path = tmp_path / f"{len(specials)}.json"
        tokenizer.save(str(path))
        return HFTokenizer(str(path))

    sentinels = [f"<extra_id_{i}>" for i in range(99, -1, -1)]  # <extra_id_0> the highest of them, as T5
    plain = tokenizer_with(["<pad>", "</s>", *sentinels])
    assert plain.sentinel_count == 100
    with pytest.raises(ValueError, match=r"has no mode_R, mode_S, mode_X token \(looked for .*'\[NLU\]'"):
        _objective("ul2", T5, tokenizer=plain)
    with_modes = tokenizer_with(["<pad>", "</s>", "[R]", "[X]", "[S]", *sentinels])
    objective, _ = _objective("ul2", T5.replace(vocab_size=400), "train.seq_len=64", tokenizer=with_modes)
    batch = objective.batch(0, 16)
    assert set(batch["input_ids"][:, 0]) <= {with_modes.special(f"mode_{m}") for m in "RXS"}
