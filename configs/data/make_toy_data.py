"""Writes the two small JSONL sets the seq2seq and classification configs train on (deterministic;
run it again to recreate them). Nothing is downloaded.

    numbers.jsonl        {"source": "40213", "target": "forty thousand two hundred thirteen"}
    sentiment.jsonl      {"text": "the parser was clear and reliable", "label": "positive"}
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
POSITIVE = ["clear", "fast", "reliable", "helpful", "elegant", "simple", "robust", "friendly", "precise", "great"]
NEGATIVE = ["confusing", "slow", "broken", "useless", "clumsy", "fragile", "awkward", "buggy", "vague", "awful"]
SUBJECTS = ["parser", "compiler", "library", "module", "interpreter", "debugger", "manual", "tutorial", "api",
            "release", "installer", "shell", "editor", "profiler", "test suite"]


ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def in_words(n: int) -> str:
    """English words of 0 <= n < 1,000,000."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    if n < 1000:
        return ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + in_words(n % 100))
    return in_words(n // 1000) + " thousand" + ("" if n % 1000 == 0 else " " + in_words(n % 1000))


def main() -> None:
    rng = random.Random(0)
    with open(HERE / "numbers.jsonl", "w", encoding="utf-8") as f:
        for _ in range(4000):
            n = rng.randrange(10 ** rng.randint(1, 5))
            f.write(json.dumps({"source": str(n), "target": in_words(n)}) + "\n")
    with open(HERE / "sentiment.jsonl", "w", encoding="utf-8") as f:
        for _ in range(2000):
            label = rng.choice(["positive", "negative"])
            adjectives = rng.sample(POSITIVE if label == "positive" else NEGATIVE, 2)
            text = f"the {rng.choice(SUBJECTS)} was {adjectives[0]} and {adjectives[1]}"
            f.write(json.dumps({"text": text, "label": label}) + "\n")


if __name__ == "__main__":
    main()
