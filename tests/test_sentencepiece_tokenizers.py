"""Marian's and M2M100's SentencePiece folders (no tokenizer.json) read as transformers' MarianTokenizer and
M2M100Tokenizer read them: every text encodes to the reference's ids and every id row decodes to its text, in the
folders transformers 5 saves and in the older published form, with separate vocabularies, M2M100's two language
code sets; M2M100's source language put first and its target's id for the server; bad folders refused by name."""

from __future__ import annotations

import random

import numpy as np
import pytest

from jaxformer.interop.tokenizer import M2M100_LANGUAGES, SentencePieceTokenizer, load_tokenizer
from tests.sentencepiece_factory import m2m100_tokenizer, marian_tokenizer, marian_with_added_tokens

FOLDERS = {
    "marian": lambda folder: marian_tokenizer(folder),
    "marian-published": lambda folder: marian_tokenizer(folder, legacy=True),
    "marian-separate": lambda folder: marian_tokenizer(folder, separate_vocabs=True),
    "marian-separate-published": lambda folder: marian_tokenizer(folder, separate_vocabs=True, legacy=True),
    "marian-added": marian_with_added_tokens,
    "m2m100": lambda folder: m2m100_tokenizer(folder),
    "m2m100-published": lambda folder: m2m100_tokenizer(folder, legacy=True),
    "m2m100-wmt21": lambda folder: m2m100_tokenizer(folder, legacy=True, language_codes="wmt21", src_lang="ja"),
}
# special tokens' text (split out where the reference splits it), language codes (Marian's >>fra<< read as a token
# at a stretch's start; M2M100's __fr__ as the folder lists it), whitespace runs, characters NFKC folds, pieces the
# vocabulary lacks, an empty text
TEXTS = ["hello world", "a</s>b", "a </s> b", "", "  straße   über ", ">>fra<< hello", "x<unk>y", "東京😀",
         "__fr__ hi __de__", "<pad><pad>", "quick brown\tfox\n\nlazy", "ＡＢＣ ﬁsh don't !", "<s>hi</s>",
         "__ja__ hi __xx__", "über>>fra<<x", ">>deu<<über", "  ", "\u00a0a\u3000b", "ça va très élevé", "qwerty",
         "a<sp>b<plain>c<x>d<x>ye<x"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    built = {}

    def get(name):
        if name not in built:
            built[name] = FOLDERS[name](tmp_path_factory.mktemp(name))
        return built[name]
    return get


def _reference(name, folder, **settings):
    from transformers import M2M100Tokenizer, MarianTokenizer

    return (MarianTokenizer if name.startswith("marian") else M2M100Tokenizer).from_pretrained(str(folder), **settings)


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
@pytest.mark.parametrize("name", FOLDERS)
def test_ids_and_text_equal_the_reference_tokenizers(folders, name):
    folder = folders(name)
    reference, ours = _reference(name, folder), load_tokenizer(folder)
    assert isinstance(ours, SentencePieceTokenizer) and ours.tokenizer is None
    for text in TEXTS:
        assert ours.encode(text) == reference(text).input_ids, text
        assert ours.encode(text, add_special_tokens=False) == reference(text, add_special_tokens=False).input_ids
    assert ours.pad_token_id == reference.pad_token_id
    batch = ours(TEXTS[:3])  # (padded with <pad>)
    assert batch["input_ids"][1][batch["attention_mask"][1] == 1].tolist() == reference(TEXTS[1]).input_ids
    assert set(batch["input_ids"][1][batch["attention_mask"][1] == 0].tolist()) == {reference.pad_token_id}
    # rows of the ids the decoder numbers (specials, <unk>, language codes among them), special tokens skipped or not
    rng = random.Random(0)
    ids = sorted(ours.pieces) + ([] if "separate" in name else sorted(ours.added_ids))
    rows = [[rng.choice(ids) for _ in range(rng.randint(0, 12))] for _ in range(200)]
    if "separate" not in name:  # (a source's ids are the target vocabulary's too)
        rows += [reference(text).input_ids for text in TEXTS]
    for row in rows:
        assert ours.decode(row) == reference.decode(row, skip_special_tokens=True), row
        assert ours.decode(row, skip_special_tokens=False) == reference.decode(row), row
    for text in TEXTS:  # a text's pieces' bytes join to its decoded bytes (the first piece's space stripped)
        row = ours.encode(text, add_special_tokens=False)
        if "separate" not in name and ours.vocab[ours.unk] not in row:
            assert b"".join(ours.token_bytes(row)).strip() == ours.decode(row).encode(), text


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
def test_the_language_codes_are_m2m100_tokenizers():
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    assert {name: list(codes) for name, codes in M2M100_LANGUAGES.items()} == FAIRSEQ_LANGUAGE_CODES


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
@pytest.mark.parametrize("name", ["m2m100", "m2m100-published"])
def test_a_request_s_languages_encode_as_m2m100_tokenizer_with_that_src_lang(folders, name):
    """``Languages`` (the server's and the CLI's) over M2M100's files: ``src_lang`` ('fr') puts its token (__fr__)
    first, as ``M2M100Tokenizer(src_lang='fr')`` encodes; ``tgt_lang`` is its token's id (``get_lang_id``); the
    folder's own source language without one; an unknown code refused naming it; Marian names no language."""
    from jaxformer.interop.tokenizer import Languages

    folder = folders(name)
    languages = Languages.of(load_tokenizer(folder), folder)
    assert len(languages.codes) == 100 and languages.source == "de"
    text = "hello world"
    reference = _reference(name, folder)(text).input_ids
    assert languages.encode(text, "de") == load_tokenizer(folder).encode(text) == reference
    for code in ("fr", "zh"):
        other = _reference(name, folder, src_lang=code)
        assert languages.encode(text, code) == other(text).input_ids == load_tokenizer(folder).encode(
            text, source_language=code)
        assert languages.target(code) == other.get_lang_id(code)
    for bad in ("xx", "__fr__", 7):
        with pytest.raises(ValueError, match="is not one of this model's 100 language codes"):
            languages.encode(text, bad)
        with pytest.raises(ValueError, match="is not one of this tokenizer's 100 language codes"):
            load_tokenizer(folder).encode(text, source_language=bad)
    with pytest.raises(ValueError, match="is not one of this tokenizer's 0 language codes .Marian names none"):
        load_tokenizer(folders("marian")).encode(text, source_language="de")
    assert Languages.of(load_tokenizer(folders("marian")), folders("marian")) is None


def test_bad_folders_are_refused_by_name(folders, tmp_path):
    from jaxformer.train.data import HFTokenizer

    with pytest.raises(ValueError, match="reads the fast-tokenizer format tokenizer.json, or Marian's source.spm"):
        load_tokenizer(tmp_path)
    cases = {
        "vocab.json": ('{"</s>": 0}', "lacks the unknown token '<unk>'"),
        "source.spm": ("not a model", "source.spm is not a SentencePiece model"),
        "tokenizer_config.json": ('{"separate_vocabs": true}', "target_vocab.json is not a readable"),
    }
    for file, (content, message) in cases.items():
        folder = tmp_path / file
        folder.mkdir()
        for part in folders("marian").iterdir():
            (folder / part.name).write_bytes(part.read_bytes())
        (folder / file).write_text(content)
        with pytest.raises(ValueError, match=message):
            load_tokenizer(folder)
    m2m = tmp_path / "codes"
    m2m.mkdir()
    for part in folders("m2m100").iterdir():
        (m2m / part.name).write_bytes(part.read_bytes())
    (m2m / "tokenizer_config.json").write_text('{"language_codes": "flores200"}')
    with pytest.raises(ValueError, match="language_codes='flores200'; M2M100's tokenizer knows"):
        load_tokenizer(m2m)
    (m2m / "tokenizer_config.json").write_text('{"src_lang": "tlh"}')
    with pytest.raises(ValueError, match="src_lang='tlh' is not one of the tokenizer's 100 language codes"):
        load_tokenizer(m2m)
    with pytest.raises(ValueError, match="holds SentencePiece files"):
        HFTokenizer(str(folders("marian")))
    assert np.asarray(load_tokenizer(folders("marian"))("hello")["attention_mask"]).all()


@pytest.mark.filterwarnings("ignore:model.init_from=.* replaces configs/default.yaml's preset")
def test_training_from_a_folder_whose_tokenizer_is_sentencepiece_asks_for_one_it_reads(folders, tmp_path):
    """data.tokenizer=auto takes model.init_from's tokenizer.json; a folder whose tokenizer is SentencePiece files
    is refused by name, not trained on bytes in silence, before anything is written in the run folder."""
    import json

    from tests.hf_factory import save_checkpoint
    from train import main

    folder = folders("marian-published")
    save_checkpoint("marian", folder, changes=dict(vocab_size=len(json.loads((folder / "vocab.json").read_text()))))
    with pytest.raises(ValueError, match="holds its tokenizer as SentencePiece files"):
        main([f"run.dir={tmp_path / 'run'}", f"model.init_from=hf:{folder}", "train.objective=seq2seq",
              "train.steps=2", "train.batch_size=2", "train.seq_len=16", "optim.warmup_steps=0"])
    assert not any((tmp_path / "run").iterdir())
    # T5 v1.1 as published: spiece.model, no tokenizer.json (load_tokenizer reads it through transformers)
    from tests.sentencepiece_factory import WORDS, train

    t5 = save_checkpoint("t5-v1_1", tmp_path / "t5")
    train(t5 / "spiece.model", WORDS, "unigram", 60)
    (t5 / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
    with pytest.raises(ValueError, match=r"holds its tokenizer as a SentencePiece model \(spiece.model\) and no "
                                         "tokenizer.json, which training reads: write one with transformers"):
        main([f"run.dir={tmp_path / 'run'}", f"model.init_from=hf:{t5}", "train.objective=seq2seq",
              "train.steps=2", "train.batch_size=2", "train.seq_len=16", "optim.warmup_steps=0"])
    assert not any((tmp_path / "run").iterdir())


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
def test_generate_translates_between_the_languages_named_on_the_command_line(folders, tmp_path, capsys):
    """``jaxformer generate --src-lang fr --tgt-lang de`` over an M2M100 folder with SentencePiece files: the
    prompts encoded as ``M2M100Tokenizer(src_lang='fr')`` encodes them, German's token forced first, the rows
    generate gives decoded; a model without language codes, an unknown code and --tgt-lang beside
    --forced-bos-token-id exit 2 naming the problem."""
    import shutil

    import jaxformer as jf
    from jaxformer.cli import main
    from tests.hf_factory import save_checkpoint

    folder = tmp_path / "m2m100"
    shutil.copytree(folders("m2m100-published"), folder)
    reference = _reference("m2m100", folder, src_lang="fr")
    # (weights wider than the factory's, so the two prompts translate apart; 8 made-up words after the codes)
    save_checkpoint("m2m100", folder, changes=dict(vocab_size=len(reference) + 8, max_position_embeddings=64,
                                                   init_std=0.5))
    model, texts = jf.from_pretrained(folder), ["hello world", "über café, straße"]
    batch = reference(texts, padding=True, return_tensors="np")
    rows = np.asarray(model.generate(batch["input_ids"].astype(np.int32), batch["attention_mask"].astype(np.int32),
                                     max_new_tokens=5, forced_bos_token_id=reference.get_lang_id("de")))
    assert set(rows[:, 1].tolist()) == {reference.get_lang_id("de")}
    expected = "".join(reference.decode(row, skip_special_tokens=True) + "\n" for row in rows)
    argv = ["generate", str(folder), *(a for text in texts for a in ("--prompt", text)), "--max-new-tokens", "5"]
    assert main(argv + ["--src-lang", "fr", "--tgt-lang", "de"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out == expected
    for extra, message in ((["--tgt-lang", "tlh"], "tgt_lang='tlh' is not one of this model's 100 language codes"),
                           (["--tgt-lang", "de", "--forced-bos-token-id", "5"], "give one")):
        assert main(argv + extra) == 2
        assert message in capsys.readouterr().err
    marian = tmp_path / "marian"
    shutil.copytree(folders("marian-published"), marian)
    save_checkpoint("marian", marian, changes=dict(vocab_size=len(load_tokenizer(marian).vocab)))
    assert main(["generate", str(marian), "--prompt", "hello", "--src-lang", "en"]) == 2
    assert "names no languages" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- other families
# (a folder published with its SentencePiece model alone: transformers builds its fast tokenizer by the family's
# class, which load_tokenizer takes)

SENTENCEPIECE_FAMILIES = {  # tokenizer class -> (its file, the model's kind, what it puts around a text)
    "T5Tokenizer": ("spiece.model", "unigram", "T5 v1.1, mT5"),
    "DebertaV2Tokenizer": ("spm.model", "unigram", "DeBERTa-v3"),
    "LlamaTokenizer": ("tokenizer.model", "bpe", "LLaMA"),
}


@pytest.mark.parametrize("family", sorted(SENTENCEPIECE_FAMILIES))
def test_a_folder_with_a_sentencepiece_model_alone_reads_as_transformers_builds_it(tmp_path, family):
    """A folder with its SentencePiece model and a tokenizer_config.json naming its class (T5's spiece.model,
    DeBERTa-v3's spm.model, LLaMA's tokenizer.model), no tokenizer.json: every text encodes to
    ``AutoTokenizer``'s ids (its template's special tokens included) and decodes to its text, the pad id its."""
    import json

    from transformers import AutoTokenizer

    from jaxformer.interop.tokenizer import has_tokenizer, sentencepiece_model
    from tests.sentencepiece_factory import WORDS, train

    file, kind, _ = SENTENCEPIECE_FAMILIES[family]
    train(tmp_path / file, WORDS, kind, 60)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": family}))
    reference, tokenizer = AutoTokenizer.from_pretrained(str(tmp_path)), load_tokenizer(tmp_path)
    assert has_tokenizer(tmp_path) and sentencepiece_model(tmp_path) == tmp_path / file
    for text in TEXTS:
        ids = reference(text).input_ids
        assert tokenizer.encode(text) == ids, text
        assert tokenizer.decode(ids) == reference.decode(ids, skip_special_tokens=True), text
    assert tokenizer.pad_token_id == reference.pad_token_id
    assert tokenizer.vocab_size == len(reference)


def test_a_sentencepiece_model_transformers_cannot_read_is_refused_by_name(tmp_path, monkeypatch):
    import builtins

    from tests.sentencepiece_factory import WORDS, train

    train(tmp_path / "spiece.model", WORDS, "unigram", 60)  # (no tokenizer_config.json nor config.json: no class)
    with pytest.raises(ValueError, match="transformers could not build .* tokenizer from spiece.model"):
        load_tokenizer(tmp_path)
    real_import = builtins.__import__

    def without_transformers(name, *args, **kwargs):
        if name == "transformers":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", without_transformers)
    with pytest.raises(ValueError, match=r"SentencePiece model \(spiece.model\) and no tokenizer.json; jaxformer "
                                         r"reads it through transformers' conversion"):
        load_tokenizer(tmp_path)
