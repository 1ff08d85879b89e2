"""Token classification (NER), sentence-pair classification and ``jaxformer predict``: entity scores equal
seqeval's (the reference, a dev extra), word labels sit on first subwords (bytes and WordPiece), the shipped
NER config beats the all-O baseline on its held-out names and predict prints the entities, pairs get their
token types and longest-first cuts, and bad records are refused by file, line and field."""

from __future__ import annotations

import json
import random
import warnings

import numpy as np
import pytest

from jaxformer.train import run_config
from jaxformer.train.data import IGNORE, ByteTokenizer, make_tokenizer
from jaxformer.train.objectives import longest_first
from jaxformer.train.tagging import entities, entity_scores, join_words, word_starts
from jaxformer.train.tasks import make_objective

# --------------------------------------------------------------------------------------------------
# Entity rules and scores against seqeval

HAND_MADE = [  # (gold, predicted) batches of sentences
    ([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-LOC"]]),  # all right
    ([["B-PER", "I-PER", "I-PER", "O"]], [["B-PER", "I-PER", "O", "O"]]),  # boundary short: no match
    ([["B-ORG", "I-ORG", "O"]], [["B-LOC", "I-LOC", "O"]]),  # type mismatch
    ([["O", "I-PER", "I-PER", "O", "I-LOC"]], [["O", "B-PER", "I-PER", "O", "B-LOC"]]),  # I- without B- starts one
    ([["B-PER", "I-LOC", "O"]], [["B-PER", "B-LOC", "O"]]),  # type change inside: two entities
    ([["B-PER", "E-PER", "S-LOC", "O"]], [["B-PER", "E-PER", "B-LOC", "O"]]),  # BIOES
    ([["S-PER", "B-ORG", "I-ORG", "E-ORG"]], [["S-PER", "B-ORG", "E-ORG", "E-ORG"]]),  # BIOES: E then E splits
    ([["B-MISC", "O"], ["O", "S-LOC"]], [["O", "O"], ["O", "O"]]),  # empty predictions
    ([["O", "O"]], [["B-PER", "O"]]),  # nothing to find, one false alarm
    ([["O"]], [["O"]]),  # nothing anywhere
]


@pytest.mark.parametrize("gold, predicted", HAND_MADE)
def test_entity_scores_equal_seqeval_on_hand_made_cases(gold, predicted):
    from seqeval.metrics import f1_score, precision_score, recall_score
    from seqeval.metrics.sequence_labeling import get_entities

    with warnings.catch_warnings():  # seqeval warns on 0/0; its value is 0, as ours
        warnings.simplefilter("ignore")
        expected = {"precision": precision_score(gold, predicted), "recall": recall_score(gold, predicted),
                    "f1": f1_score(gold, predicted)}
    scores = entity_scores(gold, predicted)
    for name, value in expected.items():
        assert scores[name] == pytest.approx(value, abs=1e-12), name
    for sentence in gold + predicted:
        assert sorted(entities(sentence)) == sorted(get_entities(sentence))


def test_entity_scores_equal_seqeval_on_random_bio_and_bioes_sequences():
    """Random tags (ill-formed ones included) in both schemes: the same entities, the same micro scores, and the
    same per-type F1 as seqeval's default classification_report."""
    from seqeval.metrics import classification_report, f1_score, precision_score, recall_score
    from seqeval.metrics.sequence_labeling import get_entities

    rng = random.Random(0)
    for scheme in ("BIO", "BIOES"):
        tags = ["O"] + [f"{p}-{t}" for p in scheme if p != "O" for t in ("PER", "LOC", "ORG")]
        for _ in range(40):
            gold = [[rng.choice(tags) for _ in range(rng.randint(1, 9))] for _ in range(6)]
            predicted = [[g if rng.random() < 0.6 else rng.choice(tags) for g in s] for s in gold]
            for sentence in gold:
                assert sorted(entities(sentence)) == sorted(get_entities(sentence))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expected = (precision_score(gold, predicted), recall_score(gold, predicted), f1_score(gold, predicted))
                report = classification_report(gold, predicted, output_dict=True)
            scores = entity_scores(gold, predicted)
            assert (scores["precision"], scores["recall"], scores["f1"]) == pytest.approx(expected, abs=1e-12)
            assert report["micro avg"]["f1-score"] == pytest.approx(scores["f1"], abs=1e-12)


# --------------------------------------------------------------------------------------------------
# Word alignment


def wordpiece_file(tmp_path) -> str:
    """A tiny WordPiece tokenizer.json trained here (long words split into ## pieces), nothing downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=70, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    corpus = ["Zoë visited Kilimanjaro .", "Maria flew to New York .", "the cat sat on the mat ."]
    tokenizer.train_from_iterator(corpus * 5, trainer)
    path = tmp_path / "wordpiece.json"
    tokenizer.save(str(path))
    return str(path)


def test_word_starts_point_at_each_words_first_token_bytes_and_wordpiece(tmp_path):
    words = ["Zoë", "visited", "Kilimanjaro", "."]
    text, spans = join_words(words)
    ids, first = word_starts(ByteTokenizer(), text, spans)
    assert list(first) == [0, 5, 13, 25]  # bytes: "Zoë" is four bytes, then a space
    assert len(ids) == len(text.encode())
    wordpiece = make_tokenizer(wordpiece_file(tmp_path))
    ids, first = word_starts(wordpiece, text, spans)
    pieces = [wordpiece.tokenizer.id_to_token(int(i)) for i in ids]
    starts = [i for i, piece in enumerate(pieces) if not piece.startswith("##")]
    assert list(first) == starts and len(pieces) > len(words)  # words split into pieces; each starts one


def _ner_objective(tmp_path, records, *overrides, tokenizer=None):
    source = tmp_path / "ner.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = run_config.load(None, ["train.objective=token_classification", f"data.train={source}",
                                 f"data.eval={source}", "train.seq_len=32", *overrides])
    return make_objective(cfg, tokenizer or ByteTokenizer())


RECORDS = [{"tokens": ["Maria", "flew", "to", "New", "York", "."], "tags": ["B-PER", "O", "O", "B-LOC", "I-LOC", "O"]},
           {"tokens": ["the", "cat", "sat", "."], "tags": ["O", "O", "O", "O"]}]


@pytest.mark.parametrize("kind", ["bytes", "wordpiece"])
def test_labels_sit_on_first_subwords_and_the_rest_is_ignored(tmp_path, kind):
    tokenizer = ByteTokenizer() if kind == "bytes" else make_tokenizer(wordpiece_file(tmp_path))
    objective = _ner_objective(tmp_path, RECORDS, tokenizer=tokenizer)
    assert objective.label_names == ["O", "B-LOC", "B-PER", "I-LOC"]  # O first, then sorted
    batch = objective.eval_batches(1, 4)[0]  # two records and two filler rows without labels
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    text, spans = join_words(RECORDS[0]["tokens"])
    _, first = word_starts(tokenizer, text, spans)
    expected = np.full(32, IGNORE)
    expected[first + 1] = [objective.label_names.index(t) for t in RECORDS[0]["tags"]]  # +1: after [CLS]
    np.testing.assert_array_equal(labels, expected)
    assert ids[0] == tokenizer.special("bos") and (batch["labels"][2:] == IGNORE).all()
    assert (labels != IGNORE).sum() == 6 < batch["attention_mask"][0].sum() - 2  # more tokens than words


def test_long_sentences_are_cut_with_a_note_and_their_cut_words_are_not_scored(tmp_path):
    long = {"tokens": ["word"] * 10 + ["Paris"], "tags": ["O"] * 10 + ["B-LOC"]}
    objective = _ner_objective(tmp_path, [long, RECORDS[0]], "train.seq_len=24")
    assert "were cut" in " ".join(objective.notes)
    _, labels, positions, tags = objective.held_out_examples[0]
    assert len(tags) == 5 and (labels != IGNORE).sum() == 5  # "word" x5 fit in 22 bytes; "Paris" does not


# --------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("record, message", [
    ({"tokens": ["a", "b"], "tags": ["O"]}, ":2: field 'tags' has 1 tags for 2 tokens"),
    ({"tokens": ["a"], "tags": ["X-PER"]}, ":2: tags\\[0\\]: tag 'X-PER' is not O or PREFIX-TYPE"),
    ({"tokens": ["a"], "tags": ["B"]}, ":2: tags\\[0\\]: tag 'B' is not O or PREFIX-TYPE"),
    ({"tokens": [], "tags": []}, ":2: field 'tokens' is empty"),
    ({"tokens": ["a", " "], "tags": ["O", "O"]}, ":2: tokens\\[1\\]=' ' is blank"),
    ({"tokens": "a b", "tags": ["O", "O"]}, ":2: field 'tokens' must be a list of strings"),
    ({"tokens": ["a"], "ner_tags": [3]}, ":2: field 'ner_tags' must be a list of strings"),
    ({"words": ["a"], "tags": ["O"]}, ":2: the record has no 'tokens' field"),
])
def test_bad_ner_records_are_refused_by_file_line_and_field(tmp_path, record, message):
    with pytest.raises(ValueError, match=r"ner.jsonl" + message):
        _ner_objective(tmp_path, [RECORDS[0], record])


def test_mixed_pair_and_single_records_are_refused(tmp_path):
    source = tmp_path / "nli.jsonl"
    source.write_text('{"text": "a", "text_pair": "b", "label": "yes"}\n{"text": "c", "label": "no"}\n')
    with pytest.raises(ValueError, match=r"nli.jsonl:2: the record has no 'text_pair' field, but .*nli.jsonl:1 has"):
        make_objective(run_config.load(None, ["train.objective=classification", f"data.train={source}",
                                              f"data.eval={source}"]), ByteTokenizer())


# --------------------------------------------------------------------------------------------------
# Sentence pairs


def test_longest_first_cuts_as_the_tokenizers_library_does():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "w": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    for la in range(9):
        for lb in range(9):
            for budget in range(1, 12):
                tokenizer.enable_truncation(budget + 3, strategy="longest_first")
                types = tokenizer.encode(" ".join("w" * la), " ".join("w" * lb)).type_ids
                a, b = longest_first(np.arange(la), np.arange(lb), budget)
                assert (len(a), len(b)) == (types.count(0) - 2, types.count(1) - 1), (la, lb, budget)


def test_pair_batches_hold_token_types_and_a_short_run_trains_and_predicts(tmp_path, capsys):
    from jaxformer.train.run import train

    rng = random.Random(0)
    animals, places = ["cat", "dog", "owl", "fox"], ["barn", "park", "lake", "hill"]
    lines = []
    for _ in range(96):
        a, b = rng.choice(animals), rng.choice(animals)
        lines.append({"text": f"the {a} sat by the {rng.choice(places)}", "text_pair": f"a {b} was there",
                      "label": "entailment" if a == b else "contradiction"})
    lines.append({"text": "x" * 40, "text_pair": "yy", "label": "contradiction"})  # cut on its long side only
    source = tmp_path / "nli.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in lines))
    overrides = ["model.preset=tiny-bert", "model.overrides.vocab_size=360", "train.objective=classification",
                 f"data.train={source}", "train.seq_len=32", "train.batch_size=8", "train.steps=4",
                 "eval.every=4", "train.log_every=4", f"run.dir={tmp_path / 'run'}", "train.sample_tokens=0",
                 "optim.warmup_steps=1"]
    cfg = run_config.load(None, overrides)
    objective = make_objective(cfg, ByteTokenizer())
    assert objective.pairs and objective.label_names == ["contradiction", "entailment"]
    ids, types, _ = objective.held_out_examples[-1]
    cls, sep = ByteTokenizer.SPECIALS["bos"], ByteTokenizer.SPECIALS["eos"]
    expected = [cls] + [ord("x")] * 27 + [sep, ord("y"), ord("y"), sep]  # 40 + 2 cut to 29: x loses 13
    assert list(ids) == expected and list(types) == [0] * 29 + [1] * 3
    batch = objective.batch(0, 8)
    assert batch["token_type_ids"].shape == (8, 32)
    first_sep = np.argmax(batch["input_ids"] == sep, axis=1)
    for row, types, cut, mask in zip(batch["input_ids"], batch["token_type_ids"], first_sep, batch["attention_mask"]):
        assert (types[:cut + 1] == 0).all() and (types[cut + 1:mask.sum()] == 1).all()
    result = train(cfg, progress=False)
    assert result["model"].config.head_options.label_names == ("contradiction", "entailment")
    assert np.isfinite(result["history"][-1]["eval_loss"])

    from jaxformer.cli import main

    capsys.readouterr()  # the run's notes
    assert main(["predict", str(tmp_path / "run"), "--text", "the cat sat by the lake", "--text-pair",
                 "a cat was there", "--json"]) == 0
    prediction = json.loads(capsys.readouterr().out)["predictions"][0]
    assert prediction["label"] in ("contradiction", "entailment")
    assert sum(prediction["probabilities"].values()) == pytest.approx(1, abs=1e-5)


# --------------------------------------------------------------------------------------------------
# The shipped config, end to end, and predict


@pytest.fixture(scope="module")
def ner_run(tmp_path_factory):
    """configs/bert_ner.yaml through train.py's own code path (fewer steps), once for the tests below."""
    from jaxformer.train.run import main

    run_dir = tmp_path_factory.mktemp("ner") / "run"
    assert main(["configs/bert_ner.yaml", f"run.dir={run_dir}", "train.steps=120", "eval.every=120",
                 "train.log_every=40"]) == 0
    return run_dir


def test_ner_config_trains_past_the_all_o_baseline(ner_run):
    last = [json.loads(line) for line in (ner_run / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["eval_f1"] > 0.3  # all-O scores 0; a third of the held-out names were never seen
    assert 0 < last["eval_precision"] <= 1 and 0 < last["eval_recall"] <= 1
    assert last["eval_accuracy"] > 0.8
    model = json.loads((ner_run / "model.json").read_text())
    labels = model["head_options"]
    assert model["head"] == "token_classification" and labels["label_names"][0] == "O"
    assert labels["num_labels"] == len(labels["label_names"]) == 9


def test_predict_prints_the_entities_of_a_ner_run(ner_run, capsys):
    from jaxformer.cli import main

    text = "Maria Lopez flew to New York last week ."
    assert main(["predict", str(ner_run), "--text", text, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["predictions"][0]["entities"]
    assert found, "no entities predicted"
    for entity in found:
        assert text[entity["start"]:entity["end"]] == entity["text"]
        assert entity["type"] in ("PER", "LOC", "ORG", "MISC") and 0 < entity["score"] <= 1
    assert main(["predict", str(ner_run), "--text", text]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(text) and found[0]["text"] in printed
    assert main(["predict", str(ner_run), "--text", text, "--text-pair", "x"]) == 2  # not a classification run


def test_label_names_go_out_to_hugging_face_config_and_back():
    import jaxformer as jf
    from jaxformer.interop import bert

    cfg = jf.config("tiny-bert").replace(head="token_classification", pooler=False, num_labels=3,
                                         label_names=("O", "B-X", "I-X"))
    hf = {"pad_token_id": 0, "max_position_embeddings": 128}
    bert.config_to_hf(cfg, "bert", hf)
    assert hf["id2label"] == {"0": "O", "1": "B-X", "2": "I-X"} and hf["label2id"]["I-X"] == 2
    back = bert.config_from_hf(json.loads(json.dumps(hf)), "bert", "BertForTokenClassification", set())
    assert back["label_names"] == ("O", "B-X", "I-X") and back["num_labels"] == 3
    plain = {**hf, "id2label": {"0": "LABEL_0", "1": "LABEL_1"}}  # transformers' defaults name nothing
    assert bert.config_from_hf(plain, "bert", "BertForTokenClassification", set())["label_names"] == ()
    with pytest.raises(ValueError, match="label_names holds 3 names for num_labels=4"):
        cfg.replace(num_labels=4)
