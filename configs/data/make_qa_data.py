"""Writes the small SQuAD-style set that configs/bert_qa.yaml trains on, and its word-level tokenizer
(deterministic; run it again to recreate them). Nothing is downloaded.

    qa_train.jsonl, qa_eval.jsonl   {"id", "context", "question", "answers": {"text": [...], "answer_start": [...]}}
    qa_tokenizer.json               a WordLevel tokenizer.json over every word of both files (lower-cased)

Each context tells of one person (name, home city, birth year, trade, dog) in two or three sentences of
varied templates, shuffled among distractor sentences that name other cities, years, trades, dogs and
people ("The train to Oslo left before 1850.", "A baker named Hugo lived next door.") and plain filler;
each question asks for one of the person's facts, so a reader must find the sentence that states it,
not the first word of the right kind. Contexts run to 50-130 words, often longer than one 64-token
window.

``baseline`` is the trivial reader the config is measured against: the first span in the context of the
answer's kind (the first city for "where", the first year for "when", ...), right whenever no
distractor of that kind comes before the answer.
"""

import json
import random
import re
from pathlib import Path

HERE = Path(__file__).parent
FIRST = ["Ada", "Boris", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Luca",
         "Mira", "Nils", "Olga", "Pavel", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wim", "Xenia", "Yusuf",
         "Zora", "Anton", "Bela", "Cyril", "Dora"]
CITIES = ["Lisbon", "Oslo", "Krakow", "Porto", "Vienna", "Zagreb", "Bergen", "Lyon", "Turin", "Gdansk", "Riga",
          "Tallinn", "Seville", "Ghent", "Basel", "Malmo", "Aarhus", "Bremen", "Graz", "Split", "Leeds", "Cork",
          "Nantes", "Bilbao", "Verona", "Brno", "Pecs", "Tartu", "Kaunas", "Ljubljana"]
JOBS = ["baker", "painter", "carpenter", "teacher", "pilot", "nurse", "chemist", "tailor", "farmer", "lawyer",
        "architect", "librarian", "sailor", "potter", "surgeon", "jeweller", "gardener", "printer", "miner", "cook"]
DOGS = ["Rex", "Bella", "Max", "Luna", "Otto", "Fido", "Nora", "Bruno", "Mila", "Toby", "Kiki", "Ziggy", "Pip",
        "Rolf", "Daisy", "Baxter", "Lola", "Benny", "Sasha", "Milo"]
FILLER = ["The winters there were long and the summers short.", "Most of the family lived nearby.",
          "The town had a small harbour and two bridges.", "Everyone in the street knew each other.",
          "Nobody remembers exactly how it all began.", "Later the house was painted green."]
# Sentences that name values of every kind without stating the person's facts.
DISTRACTORS = ["The train to {city} left at dawn.", "Letters from {city} arrived every spring.",
               "The old bridge dates from {year}.", "The school closed after {year}.",
               "A {job} called {name} lived next door.", "The {job} next door was called {name}.",
               "A stray called {dog} slept by the church.", "{name} sent a card from {city}."]

# Sentences about one person; each fact's value is marked {city} {year} {job} {dog}.
BIRTH = ["{name} was born in {city} in {year}.", "Born in {year}, {name} grew up in {city}.",
         "{name} came into the world in {city} in the year {year}."]
WORK = ["{name} worked as a {job} for many years.", "By trade {name} was a {job}.",
        "{name} earned a living as a {job}."]
DOG = ["{name} kept a dog called {dog}.", "A dog named {dog} followed {name} everywhere.",
       "{name} walked the dog, {dog}, every morning."]
QUESTIONS = {"city": ["Where was {name} born?", "In which city did {name} grow up?"],
             "year": ["When was {name} born?", "In what year was {name} born?"],
             "job": ["What did {name} work as?", "What was the trade of {name}?"],
             "dog": ["What was the name of {name}'s dog?", "What was {name}'s dog called?"],
             "name": ["Who was born in {city}?", "Which person grew up in {city}?"]}
KINDS = {"city": CITIES, "year": None, "job": JOBS, "dog": DOGS}


def paragraph(rng: random.Random) -> tuple[str, dict]:
    """A context and its person {name, city, year, job, dog, starts: each fact's character start}."""
    names, cities, jobs, dogs = (rng.sample(pool, 5) for pool in (FIRST, CITIES, JOBS, DOGS))
    years = [str(y) for y in rng.sample(range(1800, 2000), 5)]
    person, *others = [dict(zip(("name", "city", "year", "job", "dog"), values))
                       for values in zip(names, cities, years, jobs, dogs)]
    sentences = [(rng.choice(BIRTH), person), (rng.choice(WORK), person)]
    sentences += [(rng.choice(DOG), person)] if rng.random() < 0.8 else []
    sentences += [(template, rng.choice(others)) for template in rng.sample(DISTRACTORS, rng.randint(4, 7))]
    sentences += [(rng.choice(FILLER), None) for _ in range(rng.randint(0, 2))]
    rng.shuffle(sentences)
    text, starts = "", {}
    for template, who in sentences:
        text += " " if text else ""
        # Replace the markers left to right, recording where the person's facts land in the context.
        for part in re.split(r"(\{\w+\})", template):
            key = part[1:-1] if part.startswith("{") else None
            value = part if key is None else who[key]
            if who is person and key is not None:  # a name told twice answers at its first mention
                starts.setdefault(key, len(text))
            text += value
    return text, {**person, "starts": starts}


def records(rng: random.Random, paragraphs: int, prefix: str) -> list[dict]:
    out = []
    for p in range(paragraphs):
        context, person = paragraph(rng)
        kinds = [k for k in QUESTIONS if k in person["starts"]]
        for q, kind in enumerate(rng.sample(kinds, 3)):
            question = rng.choice(QUESTIONS[kind]).format(**person)
            answer, start = person[kind], person["starts"][kind]
            assert context[start:start + len(answer)] == answer
            out.append({"id": f"{prefix}{p}-{q}", "context": context, "question": question,
                        "answers": {"text": [answer], "answer_start": [start]}})
    return out


def baseline(record: dict) -> str:
    """The first span of the answer's kind in the context (no reading of the question beyond its kind)."""
    question, context = record["question"], record["context"]
    if question.startswith(("Who", "Which person")):
        return min((context.find(v), v) for v in FIRST if re.search(rf"\b{v}\b", context))[1]
    if question.startswith(("When", "In what year")):
        return re.search(r"\b\d{4}\b", context).group(0)
    kind = "city" if question.startswith(("Where", "In which city")) else "job" if "work" in question or (
        "trade" in question) else "dog"
    return min((context.find(v), v) for v in KINDS[kind] if re.search(rf"\b{v}\b", context))[1]


def write_tokenizer(texts: list[str], path: Path) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normalizer = normalizers.BertNormalizer(lowercase=True)
    splitter = pre_tokenizers.BertPreTokenizer()
    words = sorted({w for t in texts for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(t))})
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(specials + words)}, unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, splitter
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(path))


def main() -> None:
    rng = random.Random(0)
    train, held_out = records(rng, 1200, "train-"), records(rng, 120, "eval-")
    for name, rows in (("qa_train.jsonl", train), ("qa_eval.jsonl", held_out)):
        with open(HERE / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    write_tokenizer([r[k] for r in train + held_out for k in ("context", "question")] + FILLER,
                    HERE / "qa_tokenizer.json")


if __name__ == "__main__":
    main()
