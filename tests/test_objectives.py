"""MLM masking statistics and T5 span corruption that reassembles to the original text."""

from __future__ import annotations

import numpy as np
import pytest

from jaxformer.train.data import IGNORE, mask_tokens, random_spans_noise_mask, span_corrupt


def test_mlm_masking_statistics():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, size=(64, 512))
    ids[:, 0], ids[:, -1] = 1, 2  # [CLS] ... [SEP] are never selected
    inputs, labels = mask_tokens(ids, np.random.default_rng(1), vocab_size=1000, mask_id=3, special_ids=(1, 2))
    chosen = labels != IGNORE
    assert not chosen[:, 0].any() and not chosen[:, -1].any()
    assert abs(chosen[:, 1:-1].mean() - 0.15) < 0.005
    np.testing.assert_array_equal(labels[chosen], ids[chosen])
    masked = (inputs == 3) & chosen
    unchanged = (inputs == ids) & chosen
    replaced = chosen & ~masked & ~unchanged
    total = chosen.sum()
    # Within a few percent of 80/10/10 (a random replacement can hit the original token: ~0.1% here).
    assert abs(masked.sum() / total - 0.8) < 0.02
    assert abs(replaced.sum() / total - 0.1) < 0.02
    assert abs(unchanged.sum() / total - 0.1) < 0.02
    np.testing.assert_array_equal(inputs[~chosen], ids[~chosen])


@pytest.mark.parametrize("length", [20, 64, 512])
def test_noise_mask_density_and_spans(length):
    rng = np.random.default_rng(length)
    masks = np.stack([random_spans_noise_mask(length, rng) for _ in range(200)])
    assert abs(masks.mean() - 0.15) < 0.03
    assert not masks[:, 0].any()  # spans alternate starting with kept tokens
    starts = masks & ~np.concatenate([np.zeros((200, 1), bool), masks[:, :-1]], axis=1)
    assert abs(masks.sum() / starts.sum() - 3.0) < 0.6  # mean span length


def test_span_corruption_reassembles_to_the_original():
    rng = np.random.default_rng(7)
    ids = rng.integers(5, 32000, size=(16, 100))
    inputs, targets = span_corrupt(ids, np.random.default_rng(8), sentinel_start=32099)
    for original, source, target in zip(ids, inputs, targets):
        assert len(source) < len(original)
        spans, current = {}, None
        for token in target[:-1]:
            if token >= 32000:
                current = int(token)
                spans[current] = []
            else:
                spans[current].append(int(token))
        assert int(target[-1]) == 32099 - len(spans)  # the closing sentinel
        rebuilt = []
        for token in source:
            rebuilt += spans.pop(int(token)) if token >= 32000 else [int(token)]
        assert not spans
        np.testing.assert_array_equal(rebuilt, original)


# --------------------------------------------------------------------------------------------------
# The objectives' batches: static shapes, the conventions of each paper, and nothing lost


def _objective(name: str, *overrides: str):
    from jaxformer.train import run_config
    from jaxformer.train.data import ByteTokenizer
    from jaxformer.train.tasks import make_objective

    cfg = run_config.load(None, [f"train.objective={name}", *overrides])
    return make_objective(cfg, ByteTokenizer())


def test_mlm_batches_hold_two_segments_and_balanced_next_sentence_labels():
    from jaxformer.train.data import ByteTokenizer

    objective = _objective("mlm", "train.seq_len=96")
    batch = objective.batch(3, 256)
    ids, types, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    assert ids.shape == types.shape == mask.shape == (256, 96)
    assert (ids[:, 0] == ByteTokenizer.SPECIALS["bos"]).all()  # [CLS] first, never masked
    sep = ByteTokenizer.SPECIALS["eos"]
    for row_ids, row_types, row_mask, row_labels in zip(ids, types, mask, batch["labels"]):
        length = row_mask.sum()
        originals = np.where(row_labels != IGNORE, row_labels, row_ids)[:length]
        assert (np.flatnonzero(originals == sep) == [np.flatnonzero(row_types)[0] - 1, length - 1]).all()
        assert (row_ids[length:] == ByteTokenizer.SPECIALS["pad"]).all() and (row_labels[length:] == IGNORE).all()
    assert abs(batch["pair_labels"].mean() - 0.5) < 0.1
    assert abs((batch["labels"] != IGNORE).sum() / (mask.sum() - 3 * 256) - 0.15) < 0.02


def test_span_corruption_batches_have_static_shapes_and_t5_targets():
    from jaxformer.train.data import ByteTokenizer

    objective = _objective("span_corruption", "train.seq_len=64")
    top = ByteTokenizer.vocab_size - 1  # <extra_id_0>
    first, second = objective.batch(0, 8), objective.batch(1, 8)
    for batch in (first, second):
        assert batch["input_ids"].shape == (8, 64) and batch["labels"].shape == (8, objective.target_len)
        assert (batch["labels"][:, 0] == top).all() and (batch["labels"][:, -1] == ByteTokenizer.SPECIALS["eos"]).all()
        np.testing.assert_array_equal(batch["decoder_input_ids"][:, 1:], batch["labels"][:, :-1])
        assert (batch["decoder_input_ids"][:, 0] == ByteTokenizer.SPECIALS["pad"]).all()  # T5 starts with pad
    assert objective.raw_length > 64  # the corrupted input is shorter than the text it came from


def test_record_batches_visit_every_record_once_per_epoch():
    from jaxformer.train.data import epoch_indices

    seen = np.concatenate([epoch_indices(10, 0, step, 4) for step in range(5)])  # two epochs of 10
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    assert not np.array_equal(seen[:10], seen[10:20])  # a new order every epoch


def test_seq2seq_and_classification_batches(tmp_path):
    from jaxformer.train.data import ByteTokenizer

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(f'{{"source": "source {i}", "target": "target number {i}"}}\n' for i in range(20)))
    objective = _objective("seq2seq", f"data.train={pairs}", "train.seq_len=16", "data.target_len=12")
    objective.decoder_start = 257
    batch = objective.batch(0, 4)
    eos = ByteTokenizer.SPECIALS["eos"]
    for labels, decoder_in, decoder_mask in zip(batch["labels"], batch["decoder_input_ids"],
                                                batch["decoder_attention_mask"]):
        kept = labels[labels != IGNORE]
        assert kept[-1] == eos and len(kept) == 12 and ByteTokenizer().decode(kept) == "target numb"  # cut, EOS kept
        assert decoder_in[0] == 257 and (decoder_in[1:len(kept)] == kept[:-1]).all()
        assert decoder_mask.sum() == len(kept)
    assert "were cut" in " ".join(objective.notes)  # "target number 12" + EOS is 17 > 12 tokens

    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text("".join(f'{{"text": "text {i}", "label": "{"ab"[i % 2]}"}}\n' for i in range(30)))
    objective = _objective("classification", f"data.train={labelled}", "train.seq_len=16")
    assert objective.label_names == ["a", "b"]
    held_out = objective.eval_batches(1, 4)  # 3 held-out records: one batch, one filler row
    assert len(held_out) == 1 and list(held_out[0]["labels"][3:]) == [IGNORE]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match=":1: the record has no 'label' field"):
        _objective("classification", f"data.train={bad}")


@pytest.mark.parametrize("objective, record, message", [
    ("classification", '{"text": null, "label": 1}', "field 'text' must be a string, not null"),
    ("classification", '{"text": 12345, "label": 1}', "field 'text' must be a string, not 12345"),
    ("classification", '{"text": "x", "label": true}', "field 'label' must be a string or an integer, not true"),
    ("classification", '{"text": "x", "label": null}', "field 'label' must be a string or an integer, not null"),
    ("seq2seq", '{"source": "x", "target": ["y"]}', "field 'target' must be a string, not [\"y\"]"),
    ("causal_lm", '{"text": {"a": 1}}', "field 'text' must be a string, not {\"a\": 1}"),
])
def test_jsonl_fields_of_the_wrong_type_are_refused_with_file_and_line(tmp_path, objective, record, message):
    """Not trained on as the strings "None" or "12345", and no raw AttributeError: file, line, field."""
    bad = tmp_path / "bad.jsonl"
    good = {"classification": '{"text": "fine", "label": 0}', "seq2seq": '{"source": "a", "target": "b"}',
            "causal_lm": '{"text": "fine"}'}[objective]
    bad.write_text(f"{good}\n\n{record}\n")  # a blank line between: the line number counts it
    with pytest.raises(ValueError) as err:
        _objective(objective, f"data.train={bad}")
    assert str(err.value).startswith(f"{bad}:3: {message}")  # text tokenized into the cache adds how to skip it


def test_training_text_that_is_not_utf8_is_refused_by_name(tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\u00e9 au lait\n\nmore text".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt:1: byte b'\\xe9' is not UTF-8 text"):
        _objective("causal_lm", f"data.train={latin}")


def test_training_with_a_hugging_face_tokenizer(tmp_path):
    """A BPE tokenizer.json trained here (tokenizers, no download) drives a LLaMA-style causal LM run."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from jaxformer.train import run_config
    from jaxformer.train.data import default_documents
    from jaxformer.train.run import train

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    tokenizer.train_from_iterator(default_documents(), trainers.BpeTrainer(vocab_size=500,
                                                                           special_tokens=["<pad>", "</s>"]))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    cfg = run_config.load(None, ["model.preset=tiny-llama", "model.overrides.vocab_size=512", "train.steps=30",
                                 "train.batch_size=8", "train.seq_len=32", "train.log_every=5", "eval.every=30",
                                 "eval.batches=1", "optim.warmup_steps=5", f"data.tokenizer={tmp_path}",
                                 f"run.dir={tmp_path / 'run'}", "checkpoint.every=30"])
    history = train(cfg, progress=False)["history"]
    assert history[-1]["loss"] < history[0]["loss"] - 0.5
    assert (tmp_path / "run" / "tokenizer.json").exists()  # the run folder is self-contained
    with pytest.raises(ValueError, match="vocab_size=256 cannot hold"):
        train(run_config.load(None, [f"data.tokenizer={tmp_path}", f"run.dir={tmp_path / 'small'}",
                                     "model.preset=tiny-llama"]), progress=False)
