"""Writes drafting.jsonl, the text configs/draft_target.yaml and configs/draft_assistant.yaml train on
(deterministic; run it again to recreate it). Nothing is downloaded.

Each record's "text" is a paragraph of two or three English sentences from the translation set's grammar
(make_translation_data.sentence); two paragraphs in three are followed by an edit of it: "Edited:" and the same
paragraph with one noun replaced by another. A model trained on it continues a paragraph with the grammar's
sentences and copies a paragraph it is editing, which is what speculative decoding (a small model agrees
with a larger one on most of the grammar) and prompt lookup (the edit repeats the prompt) are measured on
in benchmarks/generate.py --drafting. A paragraph and its edit (about 220 bytes) mostly fit in one 256-byte
training window, so the model sees what it copies.
"""

import json
import random
import re
from pathlib import Path

from make_translation_data import ANIMATE, THINGS, sentence

HERE = Path(__file__).parent
PARAGRAPHS = 2000
NOUNS = [noun for entry in ANIMATE + THINGS for noun in entry[:2]]


def edited(paragraph: str, rng: random.Random) -> str:
    """The paragraph with one occurrence of a noun replaced by another noun."""
    found = [m for m in re.finditer(r"\b\w+\b", paragraph) if m.group() in NOUNS]
    if not found:
        return paragraph
    word = rng.choice(found)
    other = rng.choice([noun for noun in NOUNS if noun != word.group()])
    return paragraph[:word.start()] + other + paragraph[word.end():]


def main() -> None:
    rng = random.Random(4)
    with open(HERE / "drafting.jsonl", "w", encoding="utf-8") as f:
        for index in range(PARAGRAPHS):
            paragraph = " ".join(sentence(rng)[0] for _ in range(rng.randint(2, 3)))
            text = paragraph + (f"\nEdited: {edited(paragraph, rng)}" if index % 3 else "")
            f.write(json.dumps({"text": text}) + "\n")


if __name__ == "__main__":
    main()
