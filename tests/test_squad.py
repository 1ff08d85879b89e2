"""Extractive question answering: SQuAD's metrics against the official v1.1 rules, windows whose answer
straddles a boundary decoded back to the exact characters (bytes and a WordPiece tokenizer.json), the
shipped config beating its baseline through train.py's code path, and bad input refused."""

from __future__ import annotations

import collections
import importlib.util
import json
import re
import string

import numpy as np
import pytest

from jaxformer.train import run_config, squad
from jaxformer.train.data import ByteTokenizer, make_tokenizer
from jaxformer.train.squad import QuestionAnswering, Windowing, best_span


# --------------------------------------------------------------------------------------------------
# The official SQuAD v1.1 evaluation functions, written out as the reference


def official_normalize(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        return "".join(ch for ch in text if ch not in set(string.punctuation))

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def official_f1(prediction, ground_truth):
    prediction_tokens, ground_truth_tokens = official_normalize(prediction).split(), official_normalize(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision, recall = num_same / len(prediction_tokens), num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def official_em(prediction, ground_truth):
    return official_normalize(prediction) == official_normalize(ground_truth)


CASES = [("The Eiffel Tower", ["eiffel tower"]), ("an apple, a pear", ["apple pear"]), ("Paris!", ["paris"]),
         ("  New   York ", ["new york city", "New York"]), ("Denver Broncos", ["Carolina Panthers"]),
         ("the big red dog", ["red dog", "a big cat"]), ("Santa Clara, California", ["Santa Clara"]),
         ("1,000", ["1000"]), ("theatre", ["the atre"]), ("", ["something"]), ("a", ["the"]),
         ("Anna's book", ["annas book", "the book"])]


def test_exact_match_and_f1_follow_the_official_script():
    for prediction, gold in CASES:
        assert squad.exact_match(prediction, gold) == max(float(official_em(prediction, g)) for g in gold)
        assert squad.f1_score(prediction, gold) == pytest.approx(max(official_f1(prediction, g) for g in gold))
    metrics = squad.squad_metrics([p for p, _ in CASES], [g for _, g in CASES])
    assert metrics["exact_match"] == pytest.approx(100 * np.mean([max(official_em(p, g) for g in gs) for p, gs in CASES]))
    assert metrics["f1"] == pytest.approx(100 * np.mean([max(official_f1(p, g) for g in gs) for p, gs in CASES]))
    assert squad.f1_score("the big red dog", ["red dog"]) == pytest.approx(0.8)  # partial overlap, articles gone


# --------------------------------------------------------------------------------------------------
# Windows and decoding


def wordpiece_file(tmp_path):
    """A tiny WordPiece tokenizer.json trained here (words split into ## pieces), nothing downloaded."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    tokenizer.train_from_iterator([FILLER * 3, "the purple elephantine question answering"], trainer)
    path = tmp_path / "wordpiece.json"
    tokenizer.save(str(path))
    return str(path)


FILLER = "Tall grass grew along the river where otters played at dusk. "


@pytest.mark.parametrize("kind", ["bytes", "wordpiece"])
def test_answer_straddling_a_window_boundary_is_decoded_from_the_window_that_holds_it(kind, tmp_path):
    tokenizer = ByteTokenizer() if kind == "bytes" else make_tokenizer(wordpiece_file(tmp_path))
    specials = [tokenizer.special(r) for r in ("bos", "eos")]
    seq_len, stride = (48, 12) if kind == "bytes" else (24, 6)
    windowing = Windowing(tokenizer, *specials, seq_len, stride, 0)
    question = windowing.question_ids("What was purple?", "q")[0]
    room = seq_len - 3 - len(question)
    # Put the answer across the first window's end: its first token before the boundary, its last after.
    filler_ids, filler_spans = tokenizer.encode_offsets(FILLER * 4)
    cut = filler_spans[room - 1, 0]
    context = FILLER * 4
    context = context[:cut] + "purple elephantine " + context[cut:]
    answer_start, answer = cut, "purple elephantine"
    windows = windowing.windows(question, context)
    assert len(windows) >= 3 and all(len(w.input_ids) <= seq_len for w in windows)
    for window in windows:  # every context token's offsets point at its own characters
        ids, _ = tokenizer.encode_offsets(context)
        spans = window.offsets[window.first:len(window.input_ids) - 1]
        np.testing.assert_array_equal(window.input_ids[window.first:-1],
                                      ids[window.token_start:window.token_start + len(spans)])
        assert (window.token_type_ids[:window.first] == 0).all() and (window.token_type_ids[window.first:] == 1).all()
    labels = [Windowing.answer_positions(w, answer_start, answer_start + len(answer)) for w in windows]
    assert labels[0] == (0, 0)  # the answer does not end inside the first window
    holding = [i for i, (s, e) in enumerate(labels) if s > 0]
    assert holding and holding[0] == 1
    rows = []
    for i, window in enumerate(windows):  # logits that point at the answer where a window holds it whole
        start_logits, end_logits = np.zeros(seq_len, np.float32), np.zeros(seq_len, np.float32)
        offsets = np.full((seq_len, 2), -1, np.int32)
        offsets[:len(window.offsets)] = window.offsets
        if i in holding:
            start_logits[labels[i][0]], end_logits[labels[i][1]] = 9.0, 9.0
        else:  # and in the first window at its share of the answer, less sure
            start_logits[len(window.input_ids) - 3], end_logits[len(window.input_ids) - 2] = 4.0, 4.0
        rows.append((start_logits, end_logits, offsets))
    span = best_span(rows, max_answer_len=30)
    assert (span["start"], span["end"]) == (answer_start, answer_start + len(answer))
    assert context[span["start"]:span["end"]] == answer
    assert best_span(rows, max_answer_len=1)["score"] < 18  # a two-token-or-longer answer is no longer allowed


# --------------------------------------------------------------------------------------------------
# The shipped config, end to end


def load_generator():
    spec = importlib.util.spec_from_file_location("make_qa_data", "configs/data/make_qa_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bert_qa_config_trains_beats_the_baseline_and_answers(tmp_path):
    from jaxformer.train.evaluate import restore_run
    from jaxformer.train.run import train

    held_out = [json.loads(line) for line in open("configs/data/qa_eval.jsonl", encoding="utf-8")]
    generator = load_generator()
    baseline = squad.squad_metrics([generator.baseline(r) for r in held_out],
                                   [r["answers"]["text"] for r in held_out])
    cfg = run_config.load("configs/bert_qa.yaml", [f"run.dir={tmp_path / 'run'}", "checkpoint.every=10000",
                                                   "eval.every=400", "train.log_every=400"])  # one evaluation, at the end
    history = train(cfg, progress=False)["history"]
    last = history[-1]
    assert last["eval_exact_match"] > baseline["exact_match"] + 20, (last, baseline)
    assert last["eval_f1"] > baseline["f1"] + 20
    run, _ = restore_run(tmp_path / "run")
    record = held_out[0]
    answers = squad.predict_answers(run, run.model, record["question"], [record["context"], "Ada Novak was born "
                                                                                            "in Oslo in 1900."])
    for answer, context in zip(answers, [record["context"], "Ada Novak was born in Oslo in 1900."]):
        assert set(answer) == {"text", "start", "end", "score"}
        assert 0 <= answer["start"] < answer["end"] <= len(context) and context[answer["start"]:answer["end"]] == \
            answer["text"]


# --------------------------------------------------------------------------------------------------
# Bad input


GOOD = {"id": "q1", "context": "Ada Novak was born in Oslo.", "question": "Where was Ada born?",
        "answers": {"text": ["Oslo"], "answer_start": [22]}}


def objective_of(tmp_path, records, *overrides):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    cfg = run_config.load(None, ["train.objective=question_answering", f"data.train={path}", f"data.eval={path}",
                                 "train.seq_len=64", *overrides])
    return QuestionAnswering(cfg, ByteTokenizer())


def test_bad_records_and_settings_are_refused(tmp_path):
    objective = objective_of(tmp_path, [GOOD])
    assert len(objective.train_features["example"]) == 1 and objective.train_features["start_positions"][0] > 0
    moved = {**GOOD, "answers": {"text": ["Oslo"], "answer_start": [21]}}
    with pytest.raises(ValueError, match=r"qa.jsonl:2: answers.answer_start\[0\]=21 does not point at .*occurs at 22"):
        objective_of(tmp_path, [GOOD, moved])
    with pytest.raises(ValueError, match=r"qa.jsonl:1: the record has no 'question' field"):
        objective_of(tmp_path, [{k: v for k, v in GOOD.items() if k != "question"}])
    with pytest.raises(ValueError, match=r"qa.jsonl:1: field 'answers'"):
        objective_of(tmp_path, [{k: v for k, v in GOOD.items() if k != "answers"}])
    with pytest.raises(ValueError, match=r"one or more texts and as many answer_start"):
        objective_of(tmp_path, [{**GOOD, "answers": {"text": ["Oslo"], "answer_start": []}}])
    long_question = {**GOOD, "question": "Where " * 10 + "was Ada born?"}
    with pytest.raises(ValueError, match=r"qa.jsonl:1: the question is 73 tokens, which leaves 0 context tokens"):
        objective_of(tmp_path, [long_question])
    assert objective_of(tmp_path, [long_question], "data.max_question_len=20").notes  # cut when asked, and said
    with pytest.raises(ValueError, match=r"train.seq_len=24 leaves 1 context tokens per window after "
                                         r"data.max_question_len=20"):
        objective_of(tmp_path, [GOOD], "train.seq_len=24", "data.max_question_len=20", "data.doc_stride=1")
    with pytest.raises(ValueError, match="data.doc_stride=-1"):
        objective_of(tmp_path, [GOOD], "data.doc_stride=-1")
