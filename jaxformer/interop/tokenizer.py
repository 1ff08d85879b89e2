"""Tokenizers: Hugging Face ``tokenizers`` (tokenizer.json) behind a small batch-encoding interface."""

from __future__ import annotations

import functools
import json
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
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side={padding_side!r}; valid: 'left', 'right'")
        rows = [self.encode(t, add_special_tokens) for t in ([texts] if isinstance(texts, str) else texts)]
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

    def continuation(self, prompt_ids, ids) -> str:
        """The text ``ids`` adds after ``prompt_ids`` (``ids`` starts with them), as transformers' text-generation
        pipeline cuts it: the whole row decoded, less the decoded prompt's length. Decoding the new ids alone
        would lose the space a SentencePiece (Metaspace) decoder strips from a row's first token."""
        return self.decode(ids)[len(self.decode(prompt_ids)):]


def tokenizer_settings(folder: str | Path | None) -> dict:
    """A checkpoint folder's tokenizer_config.json ({} where it has none, or no folder)."""
    path = None if folder is None else Path(folder) / "tokenizer_config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path is not None and path.exists() else {}


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load ``tokenizer.json`` from a checkpoint folder (or the file itself)."""
    from tokenizers import Tokenizer as HFTokenizer

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists():
        raise ValueError(f"{file} does not exist; jaxformer reads the fast-tokenizer format tokenizer.json")
    try:
        tokenizer = HFTokenizer.from_file(str(file))
    except Exception as err:
        raise ValueError(f"{file} is not a valid tokenizer.json: {err}") from None
    pad_id = None
    folder = file.parent
    if (folder / "tokenizer_config.json").exists():  # transformers' switch: special tokens' text is plain text
        tokenizer.encode_special_tokens = bool(tokenizer_settings(folder).get("split_special_tokens", False))
    for name, key in (("tokenizer_config.json", "pad_token"), ("special_tokens_map.json", "pad_token")):
        if pad_id is None and (folder / name).exists():
            token = json.loads((folder / name).read_text(encoding="utf-8")).get(key)
            token = token.get("content") if isinstance(token, dict) else token
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
