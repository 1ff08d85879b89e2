"""Tokenizers: Hugging Face ``tokenizers`` (tokenizer.json) behind a small batch-encoding interface, and the
SentencePiece files some published folders hold instead (``SentencePieceTokenizer``)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np


class Tokenizer:
    """Text -> padded id batches ready for a model, and ids -> text."""

    def __init__(self, tokenizer, pad_token_id: int | None = None):
        self.tokenizer = tokenizer
        self.pad_token_id = pad_token_id

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, texts: str | list[str], *, max_length: int | None = None, padding_side: str = "right",
                 add_special_tokens: bool = True) -> dict[str, np.ndarray]:
        """Encode a batch: {"input_ids", "attention_mask"} as int32 [B, T], padded to the longest row.

        Rows longer than ``max_length`` raise (silent truncation would change what the model sees).
        """
        rows = [self.encode(t, add_special_tokens) for t in ([texts] if isinstance(texts, str) else texts)]
        return self.pad(rows, max_length=max_length, padding_side=padding_side)

    def pad(self, rows: list[list[int]], *, max_length: int | None = None, padding_side: str = "right"
            ) -> dict[str, np.ndarray]:
        """Encoded ``rows`` as ``__call__``'s batch."""
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side={padding_side!r}; valid: 'left', 'right'")
        if not rows or min(len(r) for r in rows) == 0:
            raise ValueError("every text must encode to at least one token")
        longest = max(len(r) for r in rows)
        if max_length is not None and longest > max_length:
            raise ValueError(f"a text encodes to {longest} tokens, more than max_length={max_length}")
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        ids = np.full((len(rows), longest), pad, np.int32)
        mask = np.zeros((len(rows), longest), np.int32)
        for i, row in enumerate(rows):
            span = slice(longest - len(row), longest) if padding_side == "left" else slice(0, len(row))
            ids[i, span], mask[i, span] = row, 1
        return {"input_ids": ids, "attention_mask": mask}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_bytes(self, ids) -> list[bytes] | None:
        """Each token's own bytes of the text ``decode`` gives, as OpenAI's logprob ``bytes`` (a token that ends
        inside a UTF-8 character has its part of it, so a text's tokens join to its bytes): byte-level BPE's token
        strings read back by GPT-2's byte table; SentencePiece's pieces with '▁' as a space and byte-fallback
        tokens ('<0xE2>') as their byte (a decoder that strips a text's first space is the caller's to mind); a
        special token, which ``decode`` skips, none. None for another decoder (WordPiece, ...): no raw bytes known."""
        read = self._byte_reader
        return None if read is None else [read(int(i)) for i in ids]

    @functools.cached_property
    def _byte_reader(self):
        """id -> its bytes (``token_bytes``) for this tokenizer's decoder, or None."""
        decoder = json.loads(self.tokenizer.to_str()).get("decoder") or {}
        steps = decoder["decoders"] if decoder.get("type") == "Sequence" else [decoder]
        kinds = {step.get("type") for step in steps}
        spaces = {step["replacement"] for step in steps if step.get("type") == "Metaspace"} | {
            step["pattern"].get("String") for step in steps
            if step.get("type") == "Replace" and step.get("content") == " "} - {None}
        special = {i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special}
        if "ByteLevel" in kinds:
            table = {char: b for b, char in enumerate(_byte_characters())}

            def piece(token: str) -> bytes:  # (a character off the table stands for itself, as the decoder reads it)
                return b"".join(bytes([table[c]]) if c in table else c.encode() for c in token)
        elif spaces:
            fallback = "ByteFallback" in kinds

            def piece(token: str) -> bytes:
                if fallback and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                    return bytes([int(token[3:5], 16)])
                for space in spaces:
                    token = token.replace(space, " ")
                return token.encode()
        else:
            return None
        return lambda i: b"" if i in special else piece(self.tokenizer.id_to_token(i))

    def vocabulary(self) -> dict[str, int]:
        """Every token (added ones included) and its id: two tokenizers with equal vocabularies agree on ids."""
        return self.tokenizer.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def continuation(self, prompt_ids, ids) -> str:
        """The text ``ids`` adds after ``prompt_ids`` (``ids`` starts with them), as transformers' text-generation
        pipeline cuts it: the whole row decoded, less the decoded prompt's length. Decoding the new ids alone
        would lose the space a SentencePiece (Metaspace) decoder strips from a row's first token."""
        return self.decode(ids)[len(self.decode(prompt_ids)):]


def tokenizer_settings(folder: str | Path | None) -> dict:
    """A checkpoint folder's tokenizer_config.json ({} where it has none, or no folder)."""
    path = None if folder is None else Path(folder) / "tokenizer_config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path is not None and path.exists() else {}


def has_tokenizer(folder: str | Path) -> bool:
    """Whether ``folder`` holds a tokenizer ``load_tokenizer`` reads."""
    return ((Path(folder) / "tokenizer.json").exists() or sentencepiece_layout(folder) is not None
            or sentencepiece_model(folder) is not None)


# The SentencePiece model a folder published without tokenizer.json holds instead (T5 v1.1's and mT5's spiece.model,
# DeBERTa-v3's spm.model, LLaMA's tokenizer.model, XLM-R's sentencepiece.bpe.model): transformers builds each
# family's fast tokenizer from it in its own way (its class's normalizer, pre-tokenizer, template and added tokens),
# which ``load_tokenizer`` takes as it is (``_from_sentencepiece``), rather than a second copy of every family's.
SENTENCEPIECE_MODELS = ("spiece.model", "spm.model", "tokenizer.model", "sentencepiece.bpe.model")


def sentencepiece_model(folder: str | Path) -> Path | None:
    """The SentencePiece model file of a folder that holds no tokenizer.json (None: it has one, or no such file;
    Marian's and M2M100's files are ``sentencepiece_layout``'s)."""
    folder = Path(folder)
    if not folder.is_dir() or (folder / "tokenizer.json").exists() or sentencepiece_layout(folder) is not None:
        return None
    return next((folder / name for name in SENTENCEPIECE_MODELS if (folder / name).exists()), None)


def _from_sentencepiece(folder: Path, model: Path):
    """The fast tokenizer (a ``tokenizers`` Tokenizer) and pad id transformers' ``AutoTokenizer`` builds from a
    folder's SentencePiece ``model`` and its tokenizer_config.json (or config.json's model type), or a ValueError."""
    how = ("or write tokenizer.json once with transformers: "
           "AutoTokenizer.from_pretrained(folder).save_pretrained(folder)")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(f"{folder} holds its tokenizer as a SentencePiece model ({model.name}) and no tokenizer.json; "
                         f"jaxformer reads it through transformers' conversion (pip install 'jaxformer[compare]'), "
                         f"{how}") from None
    try:
        fast = AutoTokenizer.from_pretrained(str(folder))
    except Exception as err:  # (its own refusals: no class named, a file it cannot read)
        raise ValueError(f"transformers could not build {folder}'s tokenizer from {model.name}: {err}") from None
    backend = getattr(fast, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"transformers reads {folder}'s {model.name} as {type(fast).__name__}, a tokenizer with no "
                         f"fast (tokenizers) form, which jaxformer needs; {how}")
    return backend, fast.pad_token_id


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load ``tokenizer.json`` from a checkpoint folder (or the file itself), or, in a folder without one, the
    SentencePiece files Marian and M2M100 publish (``SentencePieceTokenizer``), or another SentencePiece model as
    transformers builds its fast tokenizer (``sentencepiece_model``: needs transformers)."""
    from tokenizers import Tokenizer as HFTokenizer

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists() and sentencepiece_layout(path) is not None:
        return SentencePieceTokenizer(path)
    pad_id, model = None, sentencepiece_model(path)
    if model is not None:
        tokenizer, pad_id = _from_sentencepiece(path, model)
    elif not file.exists():
        raise ValueError(f"{file} does not exist; jaxformer reads the fast-tokenizer format tokenizer.json, or "
                         f"Marian's {', '.join(MARIAN_FILES)} or M2M100's {', '.join(M2M100_FILES)} (SentencePiece), "
                         f"or a folder's SentencePiece model ({', '.join(SENTENCEPIECE_MODELS)}) through transformers")
    else:
        try:
            tokenizer = HFTokenizer.from_file(str(file))
        except Exception as err:
            raise ValueError(f"{file} is not a valid tokenizer.json: {err}") from None
    folder = file.parent
    if (folder / "tokenizer_config.json").exists():  # transformers' switch: special tokens' text is plain text
        tokenizer.encode_special_tokens = bool(tokenizer_settings(folder).get("split_special_tokens", False))
    for name, key in (("tokenizer_config.json", "pad_token"), ("special_tokens_map.json", "pad_token")):
        if pad_id is None and (folder / name).exists():
            token = _content(json.loads((folder / name).read_text(encoding="utf-8")).get(key))
            pad_id = tokenizer.token_to_id(token) if token else None
    if pad_id is None and tokenizer.padding is not None:
        pad_id = tokenizer.padding.get("pad_id")
    if pad_id is None and (folder / "config.json").exists():
        pad_id = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("pad_token_id")
    return Tokenizer(tokenizer, pad_id)


def _byte_characters() -> list[str]:
    """The character byte-level BPE (GPT-2's) stands each byte for: printable Latin-1 bytes are themselves,
    the rest take the characters from U+0100 on, in byte order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def byte_level_tokenizer(special_tokens: dict[int, str]):
    """A ``tokenizers`` Tokenizer whose ids 0-255 are the UTF-8 bytes of the text (every byte one token, no
    merges) and whose ``special_tokens`` {id: text} follow from 256 on, ids in order. Decoding replaces bytes
    that are not UTF-8 as Python's ``errors="replace"`` does. Special tokens' text in the input is encoded as
    bytes only when ``encode_special_tokens`` is set (transformers: ``split_special_tokens``)."""
    from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

    ids = sorted(special_tokens)
    if ids != list(range(256, 256 + len(ids))):
        raise ValueError(f"special token ids {ids} must follow the bytes: 256, 257, ... in order")
    tokenizer = HFTokenizer(models.BPE({char: b for b, char in enumerate(_byte_characters())}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(special_tokens[i], special=True, normalized=False) for i in ids])
    tokenizer.encode_special_tokens = True
    return tokenizer


def write_byte_level_tokenizer(folder: str | Path, special_tokens: dict[int, str], roles: dict[str, str]) -> None:
    """``byte_level_tokenizer`` as tokenizer.json + tokenizer_config.json in ``folder``, which transformers'
    AutoTokenizer loads (PreTrainedTokenizerFast) encoding and decoding as the bytes do here; ``roles``
    names the special tokens' parts ({"bos_token": "<s>", ...}), those present among ``special_tokens``."""
    folder = Path(folder)
    byte_level_tokenizer(special_tokens).save(str(folder / "tokenizer.json"))
    present = set(special_tokens.values())
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "split_special_tokens": True,
                **{role: token for role, token in roles.items() if token in present}}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def _content(token) -> str | None:
    """A special token as a folder writes it: its text, or an AddedToken dict's ``content``."""
    return token.get("content") if isinstance(token, dict) else token


def extra_special_tokens(settings: dict) -> list[str]:
    """The extra special tokens a tokenizer_config.json (or special_tokens_map.json) lists: ``extra_special_tokens``,
    or ``additional_special_tokens`` in older folders (strings, or AddedToken dicts' contents)."""
    tokens = settings.get("extra_special_tokens") or settings.get("additional_special_tokens") or []
    tokens = [_content(token) for token in (tokens.values() if isinstance(tokens, dict) else tokens)]
    return [token for token in tokens if isinstance(token, str)]


def _fill(template: list[int | str], ids: list[int], language: int | None) -> list[int]:
    """A template of token ids, "text" and "language" (``Languages``) with ``ids`` and ``language`` in place."""
    out = []
    for part in template:
        out += ids if part == "text" else [language] if part == "language" else [part]
    return out


class Languages:
    """An encoder-decoder's language tokens, for a translation request's ``src_lang`` and ``tgt_lang`` (the names
    transformers' translation pipeline and tokenizers use): NLLB, M2M100, mBART-50. ``codes``: each code's token id;
    ``template``: a source's ids around its text ("text") and its language's token ("language"), as the tokenizer
    puts them; ``source``: the code a text is in unless the request names another. ``encode`` puts the request's
    code where the template has it; ``target`` is a code's id, which the engine forces as the first generated token
    (generate's ``forced_bos_token_id``)."""

    def __init__(self, tokenizer, codes: dict[str, int], template: list[int | str], source: str):
        self.tokenizer, self.codes, self.template, self.source = tokenizer, codes, template, source

    @classmethod
    def of(cls, tokenizer, folder: str | Path | None) -> Languages | None:
        """The languages of ``tokenizer`` (``load_tokenizer``'s) and its folder, or None where it names none
        (Marian, T5, BART: one language pair, or none named). M2M100's SentencePiece files: its tokenizer's own
        codes (``de``: the token ``__de__``), the code first. A tokenizer.json: its codes are its extra special
        tokens as tokenizer_config.json lists them (``extra_special_tokens``; ``additional_special_tokens`` in
        older folders), and the source language is the code its post-processor's template puts around the text
        (NLLB: ``[code] text </s>``; its legacy form and mBART's: ``text </s> [code]``), as the tokenizer's
        ``src_lang`` setter rebuilds that template."""
        if isinstance(tokenizer, SentencePieceTokenizer):
            if not tokenizer.languages:
                return None
            return cls(tokenizer, tokenizer.languages, tokenizer.template, tokenizer.source_language)
        codes = {name: i for name in extra_special_tokens(tokenizer_settings(folder))
                 if (i := tokenizer.token_to_id(name)) is not None}
        processor = json.loads(tokenizer.tokenizer.to_str()).get("post_processor") or {}
        steps = processor.get("processors", []) if processor.get("type") == "Sequence" else [processor]
        step = next((step for step in steps if step.get("type") == "TemplateProcessing"), None)
        if step is None:
            return None
        names = [piece["SpecialToken"]["id"] if "SpecialToken" in piece else None for piece in step["single"]]
        source = [name for name in names if name in codes]
        if not source:
            return None
        special = {name: token["ids"] for name, token in step["special_tokens"].items()}
        template = []
        for name in names:
            template += ["text"] if name is None else ["language"] if name == source[0] else special[name]
        return cls(tokenizer, codes, template, source[0])

    def encode(self, text: str, src_lang: str) -> list[int]:
        """``text``'s ids with ``src_lang``'s code where the template puts the source language (a ValueError naming
        an unknown code)."""
        code = self._code(src_lang, "src_lang")
        return _fill(self.template, self.tokenizer.encode(text, add_special_tokens=False), code)

    def target(self, tgt_lang: str) -> int:
        return self._code(tgt_lang, "tgt_lang")

    def _code(self, language, param: str) -> int:
        if not isinstance(language, str) or language not in self.codes:
            known = sorted(self.codes)
            raise ValueError(f"{param}={language!r} is not one of this model's {len(known)} language codes "
                             f"({', '.join(known[:6])}{', ...' if len(known) > 6 else ''})")
        return self.codes[language]


# ------------------------------------------------------------------------------------------ SentencePiece files

# Tokenizers published as SentencePiece models beside a vocab.json, with no tokenizer.json: Marian's (OPUS-MT:
# source.spm, target.spm, vocab.json) and M2M100's (sentencepiece.bpe.model, vocab.json), read as transformers'
# ``MarianTokenizer`` and ``M2M100Tokenizer`` read them. The ``sentencepiece`` library cuts each stretch of text
# between added tokens into pieces; the folder's vocab.json numbers them, not the SentencePiece model (a piece it
# lacks is ``<unk>``); the model's template puts its tokens around the text (Marian: ``text </s>``; M2M100:
# ``__en__ text </s>``, the source language's token first).
MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")
M2M100_FILES = ("sentencepiece.bpe.model", "vocab.json")
# M2M100Tokenizer's language codes by its ``language_codes`` setting (fairseq's order): code i is the token
# __code__, numbered len(vocab.json) + i
M2M100_LANGUAGES = {
    "m2m100": ("af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi "
               "hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns "
               "oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh "
               "zu").split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}
# each class's special tokens where the folder names none (its __init__ defaults)
DEFAULT_SPECIALS = {"marian": {"unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"},
                    "m2m100": {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "unk_token": "<unk>",
                               "pad_token": "<pad>"}}
SPECIAL_ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def sentencepiece_layout(folder: str | Path) -> str | None:
    """'marian' or 'm2m100' where ``folder`` holds that tokenizer's files, else None."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    for layout, files in (("marian", MARIAN_FILES), ("m2m100", M2M100_FILES)):
        if all((folder / name).exists() for name in files):
            return layout
    return None


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is not a readable {what}: {err}") from None


class SentencePieceTokenizer(Tokenizer):
    """A Marian or M2M100 tokenizer folder (``sentencepiece_layout``), with ``Tokenizer``'s interface. It holds no
    ``tokenizers`` object (``tokenizer`` is None). ``languages``: M2M100's language codes and their tokens' ids
    ({} for Marian, whose language pair is the checkpoint's); ``source_language``: the code a text is encoded in
    unless another is asked (the folder's ``src_lang``, else English, as M2M100Tokenizer); ``template``: the ids
    around a text, "text" where it goes and "language" where the source language's token goes."""

    def __init__(self, folder: str | Path):
        import sentencepiece

        folder = Path(folder)
        self.layout = sentencepiece_layout(folder)
        if self.layout is None:
            raise ValueError(f"{folder} holds neither Marian's {', '.join(MARIAN_FILES)} nor M2M100's "
                             f"{', '.join(M2M100_FILES)}")
        settings = tokenizer_settings(folder)
        self.vocab = _read_json(folder / "vocab.json", "vocab.json")
        if not isinstance(self.vocab, dict) or not all(isinstance(i, int) for i in self.vocab.values()):
            raise ValueError(f"{folder / 'vocab.json'} is not a mapping of pieces to ids")

        def processor(name: str):
            model = sentencepiece.SentencePieceProcessor()
            try:
                model.Load(str(folder / name))
            except (OSError, RuntimeError) as err:
                raise ValueError(f"{folder / name} is not a SentencePiece model: {err}") from None
            return model

        specials, extra, added = self._special_tokens(folder, settings)
        self.unk = specials["unk_token"]
        if self.unk not in self.vocab:
            raise ValueError(f"{folder / 'vocab.json'} lacks the unknown token {self.unk!r}")
        self.languages, self.lang_tokens = {}, {}
        if self.layout == "marian":
            self.separate_vocabs = bool(settings.get("separate_vocabs", False))
            self.encoder_model, target_model = processor("source.spm"), processor("target.spm")
            self.decoder_model = target_model if self.separate_vocabs else self.encoder_model
            decoder_vocab = self.vocab
            if self.separate_vocabs:
                decoder_vocab = _read_json(folder / "target_vocab.json", "target vocabulary")
            self.pieces = {i: piece for piece, i in decoder_vocab.items()}
        else:
            codes = settings.get("language_codes", "m2m100")
            if codes not in M2M100_LANGUAGES:
                raise ValueError(f"tokenizer_config.json's language_codes={codes!r}; M2M100's tokenizer knows "
                                 f"{sorted(M2M100_LANGUAGES)}")
            self.encoder_model = self.decoder_model = processor("sentencepiece.bpe.model")
            self.languages = {code: len(self.vocab) + i for i, code in enumerate(M2M100_LANGUAGES[codes])}
            self.lang_tokens = {f"__{code}__": i for code, i in self.languages.items()}
            self.pieces = {i: piece for piece, i in self.vocab.items()}
            self.pieces.update({i: token for token, i in self.lang_tokens.items()})
        # added tokens: what the folder numbers, then every special token at its own id (one the vocabulary lacks
        # after every other token, as transformers adds it); text is split at them
        self.added = {token: i for i, token in added.items()}
        for token in [*specials.values(), *extra]:
            if token not in self.added:
                known = token in self.vocab or token in self.lang_tokens
                self.added[token] = self._piece_id(token) if known else len(self.vocab.keys() | self.added.keys())
        self.added_ids = {i: token for token, i in self.added.items()}
        # (an alternation tried longest first finds the longest token that starts first, as transformers' trie)
        self._added_pattern = re.compile("|".join(map(re.escape, sorted(filter(None, self.added), key=len,
                                                                         reverse=True))) or "(?!)")
        # (skipped in decoding: the named and extra special tokens; an added token marked special is not, as in
        # transformers)
        self.special_ids = {self.added[token] for token in [*specials.values(), *extra]}
        self.eos_id = self.added[specials["eos_token"]]
        self.source_language = None
        if self.languages:
            self.source_language = settings.get("src_lang") or "en"
            if self.source_language not in self.languages:
                raise ValueError(f"tokenizer_config.json's src_lang={self.source_language!r} is not one of the "
                                 f"tokenizer's {len(self.languages)} language codes")
            self.template = ["language", "text", self.eos_id]
        else:
            self.template = ["text", self.eos_id]
        pad = specials.get("pad_token")
        super().__init__(None, self.added.get(pad) if pad is not None else None)

    def _special_tokens(self, folder: Path, settings: dict) -> tuple[dict[str, str], list[str], dict]:
        """The named special tokens (role -> text), the extra special tokens, and the added tokens (id -> text), as
        transformers reads them: tokenizer_config.json, whose ``added_tokens_decoder`` makes it the whole record;
        else special_tokens_map.json beside it (older folders)."""
        added = {int(i): _content(token) for i, token in (settings.get("added_tokens_decoder") or {}).items()}
        merged = dict(settings)
        if "added_tokens_decoder" not in settings and (folder / "special_tokens_map.json").exists():
            merged.update(_read_json(folder / "special_tokens_map.json", "special_tokens_map.json"))
        specials = dict(DEFAULT_SPECIALS[self.layout])
        specials.update({role: _content(merged[role]) for role in SPECIAL_ROLES if merged.get(role) is not None})
        return specials, extra_special_tokens(merged), added

    def _piece_id(self, piece: str) -> int:
        """A piece's id: M2M100's language tokens, then vocab.json, else ``<unk>`` (vocab.json does not follow the
        SentencePiece model's own numbering)."""
        if piece in self.lang_tokens:
            return self.lang_tokens[piece]
        return self.vocab.get(piece, self.vocab[self.unk])

    @property
    def vocab_size(self) -> int:
        return max([*self.vocab.values(), *self.added.values(), *self.lang_tokens.values()]) + 1

    def _segments(self, text: str) -> list[str | int]:
        """``text`` cut at its added tokens (the longest that starts first; their ids), the rest as text."""
        out, start = [], 0
        for match in self._added_pattern.finditer(text):
            if start < match.start():
                out.append(text[start:match.start()])
            out.append(self.added[match.group()])
            start = match.end()
        return out + ([text[start:]] if start < len(text) else [])

    def encode(self, text: str, add_special_tokens: bool = True, source_language: str | None = None) -> list[int]:
        """``text``'s ids, in the template (``source_language``: M2M100's code to put first; the folder's default
        unless given) where ``add_special_tokens``."""
        if source_language is not None and source_language not in self.languages:
            raise ValueError(f"source_language={source_language!r} is not one of this tokenizer's "
                             f"{len(self.languages)} language codes{' (Marian names none)' * (not self.languages)}")
        ids = []
        for segment in self._segments(text):
            if isinstance(segment, int):
                ids.append(segment)
                continue
            if self.layout == "marian" and segment.startswith(">>") and (end := segment.find("<<")) != -1:
                ids.append(self._piece_id(segment[:end + 2]))  # a target-language code (>>fra<<), as Marian reads it
                segment = segment[end + 2:]
            ids += [self._piece_id(piece) for piece in self.encoder_model.encode(segment, out_type=str)]
        if not add_special_tokens:
            return ids
        return _fill(self.template, ids, self.languages.get(source_language or self.source_language))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` as the reference's ``decode``: runs of pieces through the SentencePiece model (Marian:
        the source model unless its vocabularies are separate, as its ``decode`` defaults), each special token kept
        as its text unless skipped (Marian: a space after it)."""
        text, run = "", []
        for i in (int(i) for i in ids):
            if skip_special_tokens and i in self.special_ids:
                continue
            token = self.added_ids.get(i) or self._piece(i)
            if token in self.added and self.added[token] in self.special_ids:
                text += self.decoder_model.decode_pieces(run) + token + (" " if self.layout == "marian" else "")
                run = []
            else:
                run.append(token)
        text += self.decoder_model.decode_pieces(run)
        return (text.replace("\u2581", " ") if self.layout == "marian" else text).strip()

    def _piece(self, i: int) -> str:
        if i in self.pieces:
            return self.pieces[i]
        if self.layout == "marian" and 0 <= i < self.decoder_model.get_piece_size():
            return self.decoder_model.id_to_piece(i) or self.unk  # (MarianTokenizer falls back to the model's)
        return self.unk

    def token_bytes(self, ids) -> list[bytes]:
        """Each token's bytes (``Tokenizer.token_bytes``): its piece with '▁' as a space, a byte-fallback piece
        ('<0xE2>') as its byte, a special token none."""
        out = []
        for i in (int(i) for i in ids):
            piece = "" if i in self.special_ids else self.added_ids.get(i) or self._piece(i)
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                out.append(bytes([int(piece[3:5], 16)]))
            else:
                out.append(piece.replace("\u2581", " ").encode())
        return out

    def vocabulary(self) -> dict[str, int]:
        return {**self.vocab, **self.lang_tokens, **self.added}

    def token_to_id(self, token: str) -> int | None:
        return self.added.get(token, self.lang_tokens.get(token, self.vocab.get(token)))
