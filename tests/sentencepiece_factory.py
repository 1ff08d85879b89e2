"""SentencePiece tokenizer folders made here as Marian (OPUS-MT) and M2M100 publish them: models the
``sentencepiece`` library trains on a synthesized corpus, numbered by a vocab.json as theirs are (not in the
model's own order; Marian's without <s>, with language codes and a few pieces of its model missing), saved in
transformers 5's form (the tokenizer class's ``save_pretrained``) or in the older published form
(tokenizer_config.json without ``added_tokens_decoder``, beside special_tokens_map.json)."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

# words with accents, a ligature and full-width letters (NFKC folds them), CJK, an emoji, punctuation
WORDS = ("hello world guten tag straße über café naïve the quick brown fox jumps over lazy dog ﬁsh ＡＢＣ 東京 "
         "😀 a b c , . ! ? don't").split()
OTHER_WORDS = "bonjour le monde très élevé chat noir ça va , . ! ?".split()


def corpus(words: tuple[str, ...] | list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(400)]


def train(path: Path, words, kind: str, size: int, seed: int = 0) -> list[str]:
    """A SentencePiece model of ``kind`` ('unigram', OPUS-MT's; 'bpe', M2M100's) trained on ``words``' sentences,
    written to ``path``; returns its pieces in its own order."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(corpus(words, seed)), model_writer=model,
                                             vocab_size=size, model_type=kind, character_coverage=1.0,
                                             num_threads=1, minloglevel=2)
    path.write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def marian_tokenizer(folder: Path, separate_vocabs: bool = False, legacy: bool = False) -> Path:
    """A Marian tokenizer folder: source.spm and target.spm (other words), vocab.json of </s>, <unk>, the pieces
    (less two of the source model's: they read as <unk>), two target-language codes and <pad> last, as OPUS-MT's;
    with ``separate_vocabs`` a target_vocab.json of the target model's pieces."""
    folder.mkdir(parents=True, exist_ok=True)
    source = train(folder / "source.spm", WORDS, "unigram", 60)
    target = train(folder / "target.spm", OTHER_WORDS, "unigram", 40)

    def numbered(pieces):
        vocab = {"</s>": 0, "<unk>": 1}
        for piece in pieces:
            vocab.setdefault(piece, len(vocab))
        vocab.setdefault("<pad>", len(vocab))
        return vocab
    kept = [p for p in source if p not in ("<unk>", "<s>", "</s>")][2:]
    if separate_vocabs:
        (folder / "vocab.json").write_text(json.dumps(numbered(kept), ensure_ascii=False))
        (folder / "target_vocab.json").write_text(json.dumps(numbered(target[3:]), ensure_ascii=False))
    else:
        vocab = numbered([*kept, *target[3:], ">>fra<<", ">>deu<<"])
        (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    if legacy:  # OPUS-MT's files
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"source_lang": "en", "target_lang": "de", "separate_vocabs": separate_vocabs}))
        (folder / "special_tokens_map.json").write_text(json.dumps(
            {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}))
    else:
        from transformers import MarianTokenizer

        MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
                        target_vocab_file=str(folder / "target_vocab.json") if separate_vocabs else None,
                        separate_vocabs=separate_vocabs, source_lang="en", target_lang="de").save_pretrained(folder)
    return folder


def marian_with_added_tokens(folder: Path) -> Path:
    """A Marian folder in transformers 5's form with added tokens beyond its specials: one marked special (which
    transformers splits out but does not skip), a plain one, and two extra special tokens the vocabulary lacks, one
    the other's prefix (numbered after every other token; a text holding the longer is cut at the longer)."""
    marian_tokenizer(folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    for i, (content, special) in {5: ("<sp>", True), 6: ("<plain>", False)}.items():
        settings["added_tokens_decoder"][str(i)] = {"content": content, "lstrip": False, "normalized": False,
                                                    "rstrip": False, "single_word": False, "special": special}
    settings["extra_special_tokens"] = ["<x>", "<x>y"]
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


def m2m100_tokenizer(folder: Path, legacy: bool = False, language_codes: str = "m2m100", src_lang: str = "de"
                     ) -> Path:
    """An M2M100 tokenizer folder: sentencepiece.bpe.model and fairseq's vocab.json (<s>, <pad>, </s>, <unk>, then
    the pieces); the language tokens (__de__, ...) follow it, as M2M100Tokenizer numbers them. ``legacy``: the
    language tokens listed as additional special tokens in special_tokens_map.json, as published folders list them
    (transformers then splits them out of a text and skips them in decoding)."""
    folder.mkdir(parents=True, exist_ok=True)
    pieces = train(folder / "sentencepiece.bpe.model", WORDS, "bpe", 60)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    if legacy:
        from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

        specials = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "unk_token": "<unk>",
                    "pad_token": "<pad>"}
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {**specials, "src_lang": src_lang, "tgt_lang": None, "language_codes": language_codes,
             "num_madeup_words": 8, "model_max_length": 1024, "tokenizer_class": "M2M100Tokenizer"}))
        (folder / "special_tokens_map.json").write_text(json.dumps(
            {**specials, "additional_special_tokens": [f"__{c}__" for c in FAIRSEQ_LANGUAGE_CODES[language_codes]]}))
    else:
        from transformers import M2M100Tokenizer

        M2M100Tokenizer(str(folder / "vocab.json"), str(folder / "sentencepiece.bpe.model"), src_lang=src_lang,
                        language_codes=language_codes).save_pretrained(folder)
    return folder
