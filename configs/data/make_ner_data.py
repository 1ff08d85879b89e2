"""Writes the small English NER set configs/bert_ner.yaml trains on (deterministic; run it again to recreate
it). Nothing is downloaded: templated sentences filled with people (PER), places (LOC), organisations (ORG)
and other names (MISC: nationalities, events, products), many of them several words long, BIO-tagged in the
layout of Hugging Face's CoNLL sets. A third of every name list appears only in the held-out file, and many
names are coined from syllables (in both files, never the same ones), so the held-out score says how well
the model tags names it never saw: by their context and their shape, not by memory.

    ner_train.jsonl   {"tokens": ["Maria", "Lopez", "flew", "to", "New", "York", "."],
    ner_eval.jsonl     "tags": ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O"]}
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
FIRST = ["Maria", "John", "Aisha", "Kenji", "Olga", "Pedro", "Fatima", "Liam", "Chen", "Sofia", "Omar", "Ingrid",
         "Ravi", "Grace", "Mateo", "Yuki", "Hannah", "Kwame", "Elena", "Tomas", "Priya", "Lars", "Amara", "Diego"]
LAST = ["Lopez", "Smith", "Khan", "Tanaka", "Ivanova", "Silva", "Haddad", "Murphy", "Wang", "Rossi", "Farouk",
        "Berg", "Patel", "Okafor", "Garcia", "Sato", "Schmidt", "Mensah", "Petrova", "Novak", "Iyer", "Larsen"]
LOC = ["Paris", "New York", "Nairobi", "Tokyo", "Buenos Aires", "Lake Geneva", "Berlin", "Cape Town", "Oslo",
       "Mumbai", "South Korea", "Lima", "Rio de Janeiro", "Cairo", "Mount Kenya", "Toronto", "New Zealand",
       "Hanoi", "Santiago", "the Alps", "Lisbon", "Kuala Lumpur", "Iceland", "San Francisco", "Dublin", "Accra",
       "Montreal", "Sri Lanka", "Vienna", "Lagos"]
ORG = ["United Nations", "Acme Corporation", "Red Cross", "Nordic Rail", "Bank of Lagos", "Globex", "Blue River Labs",
       "World Health Organization", "Tesla", "Oxford University", "Atlas Airlines", "Helix Pharma", "Sunrise Media",
       "Orion Systems", "Central Bank", "Green Valley Farms", "Pioneer Insurance", "Kite Robotics", "Delta Textiles",
       "Harbor Logistics", "Vertex Energy", "Summit Hotels", "Maple Foods", "Crescent Motors"]
MISC = ["Olympic Games", "World Cup", "Nobel Prize", "English", "Japanese", "Brazilian", "Kenyan", "French",
        "Tour de France", "Python", "Golden Globe", "Oscar", "Canadian", "Chinese", "Champions League", "Swedish",
        "Booker Prize", "Linux", "Mexican", "Grammy Award", "Irish", "Indian", "Super Bowl", "Android"]

TEMPLATES = [
    "{PER} flew to {LOC} last week .",
    "{PER} works for {ORG} in {LOC} .",
    "The {MISC} team beat rivals from {LOC} on Sunday .",
    "{ORG} opened a new office in {LOC} .",
    "According to {PER} , {ORG} will hire more staff .",
    "{PER} won the {MISC} in {LOC} .",
    "Shares of {ORG} rose after {PER} spoke .",
    "In {LOC} , {PER} met officials from {ORG} .",
    "{PER} and {PER} visited {LOC} for the {MISC} .",
    "The {MISC} festival in {LOC} drew large crowds .",
    "{ORG} said on Monday that profits fell .",
    "A spokesman for {ORG} declined to comment .",
    "{PER} , a {MISC} writer , lives in {LOC} .",
    "Heavy rain hit {LOC} and {LOC} overnight .",
    "{PER} joined {ORG} as chief executive .",
    "Fans in {LOC} celebrated the {MISC} victory .",
    "{ORG} and {ORG} agreed to merge .",
    "{PER} said the weather was fine .",
    "The meeting was held in {LOC} .",
    "Nobody expected the results this year .",
]
NAMES = {"LOC": LOC, "ORG": ORG, "MISC": MISC}
SYLLABLES = ["ka", "lo", "ven", "mi", "tar", "su", "re", "dan", "o", "bel", "ri", "na", "zu", "kor", "e", "lin",
             "ma", "tho", "ga", "sil", "u", "pe", "vor", "ya"]
ORG_WORDS = ["Group", "Labs", "Bank", "Motors", "Systems", "Foods", "Airlines", "Institute", "Partners", "Media"]
MISC_WORDS = ["Cup", "Prize", "Games", "Award", "Open", "Festival"]


def coined(kind: str, rng: random.Random) -> str:
    """A made-up name of the shape of ``kind``'s names (people have two words, organisations a telling last word)."""
    def word() -> str:
        return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()

    if kind == "PER":
        return f"{word()} {word()}"
    if kind == "ORG":
        return f"{word()} {rng.choice(ORG_WORDS)}"
    if kind == "MISC":
        return f"{word()} {rng.choice(MISC_WORDS)}" if rng.random() < 0.5 else word() + "ian"
    return word() if rng.random() < 0.7 else f"{word()} {rng.choice(['City', 'Bay', 'Island', 'Valley'])}"


def split(names: list[str], rng: random.Random) -> tuple[list[str], list[str]]:
    """(seen, unseen): a third of the names, chosen at random, kept for the held-out file only."""
    shuffled = names[:]
    rng.shuffle(shuffled)
    cut = len(shuffled) // 3
    return shuffled[cut:], shuffled[:cut]


def sentence(template: str, pools: dict, rng: random.Random, unseen: float, coin: float, avoid: set) -> dict:
    tokens, tags = [], []
    for word in template.split():
        if not (word.startswith("{") and word.endswith("}")):
            tokens.append(word)
            tags.append("O")
            continue
        kind = word[1:-1]
        seen, held = pools[kind]
        draw = rng.random()
        if draw < coin:
            name = coined(kind, rng)
            while name in avoid:  # coined names of the held-out file are new to the model too
                name = coined(kind, rng)
            avoid.add(name)
        else:
            name = rng.choice(held if held and draw < coin + unseen else seen)
        parts = name.split()
        if kind == "LOC" and parts[0] == "the":  # "the Alps": the article is not part of the name
            tokens.append("the")
            tags.append("O")
            parts = parts[1:]
        tokens += parts
        tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(parts) - 1)
    tokens[0] = tokens[0][0].upper() + tokens[0][1:]
    return {"tokens": tokens, "tags": tags}


def person(rng: random.Random, first: list[str], last: list[str]) -> str:
    return rng.choice(first) if rng.random() < 0.2 else f"{rng.choice(first)} {rng.choice(last)}"


def main() -> None:
    rng = random.Random(0)
    parts = {kind: split(names, rng) for kind, names in NAMES.items()}
    first, last = split(FIRST, rng), split(LAST, rng)
    people_seen = sorted({person(rng, first[0], last[0]) for _ in range(200)})
    people_unseen = sorted({person(rng, first[1], last[1]) for _ in range(60)})
    train_pools = {**{kind: (seen, []) for kind, (seen, _) in parts.items()}, "PER": (people_seen, [])}
    eval_pools = {**parts, "PER": (people_seen, people_unseen)}
    used: set = set()
    for name, count, pools, unseen, coin in (("ner_train.jsonl", 1600, train_pools, 0.0, 0.4),
                                             ("ner_eval.jsonl", 300, eval_pools, 0.25, 0.25)):
        with open(HERE / name, "w", encoding="utf-8") as f:
            for _ in range(count):
                f.write(json.dumps(sentence(rng.choice(TEMPLATES), pools, rng, unseen, coin, used)) + "\n")


if __name__ == "__main__":
    main()
