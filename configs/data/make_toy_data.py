"""Writes the two small JSONL sets the seq2seq and classification configs train on (deterministic;
run it again to recreate them). Nothing is downloaded: the text comes from Python's own pydoc topics.

    reverse_words.jsonl  {"source": "five words of python docs", "target": "docs python of words five"}
    sentiment.jsonl      {"text": "the parser was clear and reliable", "label": "positive"}
"""

import json
import random
import re
from pathlib import Path

from pydoc_data import topics

HERE = Path(__file__).parent
POSITIVE = ["clear", "fast", "reliable", "helpful", "elegant", "simple", "robust", "friendly", "precise", "great"]
NEGATIVE = ["confusing", "slow", "broken", "useless", "clumsy", "fragile", "awkward", "buggy", "vague", "awful"]
SUBJECTS = ["parser", "compiler", "library", "module", "interpreter", "debugger", "manual", "tutorial", "api",
            "release", "installer", "shell", "editor", "profiler", "test suite"]


def phrases(rng: random.Random) -> list[str]:
    words = re.findall(r"[a-z]+", " ".join(topics.topics[name] for name in sorted(topics.topics)).lower())
    return [" ".join(words[i:i + rng.randint(3, 6)]) for i in range(0, len(words) - 6, 7)]


def main() -> None:
    rng = random.Random(0)
    pairs = phrases(rng)[:4000]
    with open(HERE / "reverse_words.jsonl", "w", encoding="utf-8") as f:
        for phrase in pairs:
            f.write(json.dumps({"source": phrase, "target": " ".join(reversed(phrase.split()))}) + "\n")
    with open(HERE / "sentiment.jsonl", "w", encoding="utf-8") as f:
        for _ in range(2000):
            label = rng.choice(["positive", "negative"])
            adjectives = rng.sample(POSITIVE if label == "positive" else NEGATIVE, 2)
            text = f"the {rng.choice(SUBJECTS)} was {adjectives[0]} and {adjectives[1]}"
            f.write(json.dumps({"text": text, "label": label}) + "\n")


if __name__ == "__main__":
    main()
