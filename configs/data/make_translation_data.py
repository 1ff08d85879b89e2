"""Writes the small English <-> German parallel set that configs/marian_translation.yaml trains on, and its
shared BPE tokenizer (deterministic; run it again to recreate them). Nothing is downloaded.

    translation_train.jsonl    {"source": "__en__ Yesterday my dog saw the cat.",
                                "target": "__de__ Gestern hat mein Hund die Katze gesehen."}   (and de -> en)
    translation_eval.jsonl     held-out pairs: no sentence of it is in the training file
    translation_tokenizer.json BPE over both languages, SentencePiece-style spaces, "$A </s>" appended

Sentences come from a small grammar that does what makes translation more than word lookup: German's verb
second (after a fronted adverb) and verb-final order (participles, infinitives after a modal or the future,
every verb of a subordinate clause), three genders in four cases (articles, possessives and adjective endings
agree), dative objects (helfen, folgen), "sein" as the perfect's auxiliary of folgen, negation placed after a
definite object, and prepositions that take the dative (and contract: in dem -> im). As in M2M-100, each side
starts with its language's token, so one model translates both ways and generation forces the target
language's token first.
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
TRAIN_PAIRS, EVAL_PAIRS = 4000, 200

# English singular, English plural, German singular, German plural, gender; animate nouns can be subjects.
ANIMATE = [("dog", "dogs", "Hund", "Hunde", "m"), ("cat", "cats", "Katze", "Katzen", "f"),
           ("child", "children", "Kind", "Kinder", "n"), ("man", "men", "Mann", "Männer", "m"),
           ("woman", "women", "Frau", "Frauen", "f"), ("teacher", "teachers", "Lehrer", "Lehrer", "m"),
           ("friend", "friends", "Freund", "Freunde", "m"), ("bird", "birds", "Vogel", "Vögel", "m"),
           ("girl", "girls", "Mädchen", "Mädchen", "n"), ("doctor", "doctors", "Arzt", "Ärzte", "m"),
           ("horse", "horses", "Pferd", "Pferde", "n"), ("mouse", "mice", "Maus", "Mäuse", "f"),
           ("king", "kings", "König", "Könige", "m"), ("queen", "queens", "Königin", "Königinnen", "f"),
           ("cook", "cooks", "Koch", "Köche", "m"), ("brother", "brothers", "Bruder", "Brüder", "m"),
           ("sister", "sisters", "Schwester", "Schwestern", "f"), ("mother", "mothers", "Mutter", "Mütter", "f"),
           ("father", "fathers", "Vater", "Väter", "m")]
THINGS = [("book", "books", "Buch", "Bücher", "n"), ("house", "houses", "Haus", "Häuser", "n"),
          ("car", "cars", "Auto", "Autos", "n"), ("apple", "apples", "Apfel", "Äpfel", "m"),
          ("letter", "letters", "Brief", "Briefe", "m"), ("table", "tables", "Tisch", "Tische", "m"),
          ("door", "doors", "Tür", "Türen", "f"), ("flower", "flowers", "Blume", "Blumen", "f"),
          ("song", "songs", "Lied", "Lieder", "n"), ("picture", "pictures", "Bild", "Bilder", "n"),
          ("tree", "trees", "Baum", "Bäume", "m"), ("window", "windows", "Fenster", "Fenster", "n")]
PLACES = [("garden", "Garten", "m"), ("house", "Haus", "n"), ("city", "Stadt", "f"), ("park", "Park", "m"),
          ("kitchen", "Küche", "f"), ("school", "Schule", "f"), ("forest", "Wald", "m")]
ADJECTIVES = [("big", "groß"), ("small", "klein"), ("old", "alt"), ("young", "jung"), ("red", "rot"),
              ("new", "neu"), ("good", "gut"), ("beautiful", "schön"), ("tired", "müde"), ("happy", "glücklich"),
              ("black", "schwarz"), ("white", "weiß")]
# English base, third singular, past, participle; German present (ich du er wir ihr sie), participle, auxiliary,
# the case of its object; things=True: the object may be a thing.
VERBS = [("see", "sees", "saw", "seen", "sehe siehst sieht sehen seht sehen", "gesehen", "haben", "acc", True),
         ("love", "loves", "loved", "loved", "liebe liebst liebt lieben liebt lieben", "geliebt", "haben", "acc", True),
         ("find", "finds", "found", "found", "finde findest findet finden findet finden", "gefunden", "haben", "acc",
          True),
         ("buy", "buys", "bought", "bought", "kaufe kaufst kauft kaufen kauft kaufen", "gekauft", "haben", "acc", True),
         ("hear", "hears", "heard", "heard", "höre hörst hört hören hört hören", "gehört", "haben", "acc", True),
         ("visit", "visits", "visited", "visited", "besuche besuchst besucht besuchen besucht besuchen", "besucht",
          "haben", "acc", False),
         ("carry", "carries", "carried", "carried", "trage trägst trägt tragen tragt tragen", "getragen", "haben",
          "acc", True),
         ("paint", "paints", "painted", "painted", "male malst malt malen malt malen", "gemalt", "haben", "acc", True),
         ("wash", "washes", "washed", "washed", "wasche wäschst wäscht waschen wascht waschen", "gewaschen", "haben",
          "acc", True),
         ("call", "calls", "called", "called", "rufe rufst ruft rufen ruft rufen", "gerufen", "haben", "acc", False),
         ("help", "helps", "helped", "helped", "helfe hilfst hilft helfen helft helfen", "geholfen", "haben", "dat",
          False),
         ("follow", "follows", "followed", "followed", "folge folgst folgt folgen folgt folgen", "gefolgt", "sein",
          "dat", False)]
AUXILIARY = {"haben": "habe hast hat haben habt haben", "sein": "bin bist ist sind seid sind",
             "werden": "werde wirst wird werden werdet werden", "wollen": "will willst will wollen wollt wollen",
             "können": "kann kannst kann können könnt können"}
# English pronoun, German pronoun, German person index (ich du er wir ihr sie), English third singular
PRONOUNS = [("I", "ich", 0, False), ("you", "du", 1, False), ("he", "er", 2, True), ("she", "sie", 2, True),
            ("we", "wir", 3, False), ("they", "sie", 5, False)]
ARTICLES = {  # (kind, case) -> m, f, n, plural
    ("the", "nom"): ("der", "die", "das", "die"), ("the", "acc"): ("den", "die", "das", "die"),
    ("the", "dat"): ("dem", "der", "dem", "den"),
    ("a", "nom"): ("ein", "eine", "ein", None), ("a", "acc"): ("einen", "eine", "ein", None),
    ("a", "dat"): ("einem", "einer", "einem", None),
    ("my", "nom"): ("mein", "meine", "mein", "meine"), ("my", "acc"): ("meinen", "meine", "mein", "meine"),
    ("my", "dat"): ("meinem", "meiner", "meinem", "meinen")}
GENDER = {"m": 0, "f": 1, "n": 2}
ADVERBS = {"present": [("today", "heute"), ("now", "jetzt")], "past": [("yesterday", "gestern")],
           "future": [("tomorrow", "morgen")], "modal": [("today", "heute"), ("now", "jetzt")]}
INTRODUCERS = [("I know that", "Ich weiß, dass"), ("she says that", "sie sagt, dass"),
               ("we think that", "wir denken, dass"), ("he is happy because", "er ist glücklich, weil"),
               ("they laugh because", "sie lachen, weil")]


def adjective_ending(kind: str, case: str, gender: str, plural: bool) -> str:
    """German adjective endings: weak after der-words, mixed after ein-words (ein, mein)."""
    if plural:
        return "en"
    if kind == "the":
        return "e" if case == "nom" or (case == "acc" and gender != "m") else "en"
    if case == "dat" or (case == "acc" and gender == "m"):
        return "en"
    return {"m": "er", "f": "e", "n": "es"}[gender] if case in ("nom", "acc") else "en"


def noun_phrase(rng: random.Random, pool: list, case: str) -> tuple[str, str, bool]:
    """(English, German, English third singular) of a noun phrase in ``case``."""
    en_sg, en_pl, de_sg, de_pl, gender = rng.choice(pool)
    plural = rng.random() < 0.3
    kind = rng.choice(["the", "my"] if plural else ["the", "the", "a", "my"])
    article = ARTICLES[(kind, case)][3 if plural else GENDER[gender]]
    noun_en, noun_de = (en_pl, de_pl) if plural else (en_sg, de_sg)
    if plural and case == "dat" and not noun_de.endswith(("n", "s")):
        noun_de += "n"
    words_en, words_de = [noun_en], [noun_de]
    if rng.random() < 0.35:
        adj_en, adj_de = rng.choice(ADJECTIVES)
        ending = adjective_ending(kind, case, gender, plural)
        words_en.insert(0, adj_en)
        words_de.insert(0, adj_de + (ending[1:] if adj_de.endswith("e") else ending))
    english_article = {"the": "the", "my": "my", "a": "an" if words_en[0][0] in "aeiou" else "a"}[kind]
    return f"{english_article} {' '.join(words_en)}", f"{article} {' '.join(words_de)}", not plural


def sentence(rng: random.Random) -> tuple[str, str]:
    verb = rng.choice(VERBS)
    en_base, en_3sg, en_past, en_part, conj, part_de, aux, case, things = verb
    if rng.random() < 0.35:
        subj_en, subj_de, person, third = rng.choice(PRONOUNS)
    else:
        subj_en, subj_de, third = noun_phrase(rng, ANIMATE, "nom")
        person = 2 if third else 5
    obj_en, obj_de, _ = noun_phrase(rng, ANIMATE + THINGS if things else ANIMATE, case)
    tense = rng.choice(["present", "present", "past", "future", "modal"])
    negated = rng.random() < 0.2 and obj_de.split()[0] not in ("ein", "eine", "einen", "einem", "einer")
    place_en = place_de = None
    if not negated and rng.random() < 0.3:
        en, de, gender = rng.choice(PLACES)
        place_en, place_de = f"in the {en}", ("in der " if gender == "f" else "im ") + de
    # English
    if tense == "present":
        if negated:
            verb_en = f"{'does' if third else 'do'} not {en_base}"
        else:
            verb_en = en_3sg if third else en_base
    elif tense == "past":
        verb_en = f"did not {en_base}" if negated else en_past
    elif tense == "future":
        verb_en = f"will {'not ' if negated else ''}{en_base}"
    else:
        modal = rng.choice(["wollen", "können"])
        verb_en = {"wollen": f"{'does not want' if third else 'do not want'} to {en_base}" if negated else
                   f"{'wants' if third else 'want'} to {en_base}",
                   "können": f"cannot {en_base}" if negated else f"can {en_base}"}[modal]
    english = f"{subj_en} {verb_en} {obj_en}" + (f" {place_en}" if place_en else "")
    # German: the finite verb and what goes to the end
    if tense == "present":
        finite, final = conj.split()[person], []
    elif tense == "past":
        finite, final = AUXILIARY[aux].split()[person], [part_de]
    elif tense == "future":
        finite, final = AUXILIARY["werden"].split()[person], [conj.split()[3]]
    else:
        finite, final = AUXILIARY[modal].split()[person], [conj.split()[3]]
    middle = [obj_de] + (["nicht"] if negated else []) + ([place_de] if place_de else [])
    form = rng.random()
    if form < 0.25:  # a subordinate clause: every verb at the end, the finite one last
        intro_en, intro_de = rng.choice(INTRODUCERS)
        english = f"{intro_en} {english}"
        german = f"{intro_de} {subj_de} {' '.join(middle + final + [finite])}"
    elif form < 0.45:  # a fronted adverb: the finite verb second, before the subject
        adv_en, adv_de = rng.choice(ADVERBS[tense])
        english = f"{adv_en} {english}"
        german = f"{adv_de} {finite} {subj_de} {' '.join(middle + final)}"
    else:
        german = f"{subj_de} {finite} {' '.join(middle + final)}"
    return english[0].upper() + english[1:] + ".", german[0].upper() + german[1:] + "."


def write_tokenizer(texts: list[str], path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<pad>", "</s>", "<unk>", "<s>", "__en__", "__de__"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A $B </s>",
                                                             special_tokens=[("</s>", tokenizer.token_to_id("</s>"))])
    tokenizer.save(str(path))


def main() -> None:
    rng = random.Random(2017)
    pairs: dict[str, str] = {}
    while len(pairs) < TRAIN_PAIRS + EVAL_PAIRS:
        english, german = sentence(rng)
        pairs.setdefault(english, german)
    items = list(pairs.items())
    rng.shuffle(items)
    splits = {"translation_eval.jsonl": items[:EVAL_PAIRS], "translation_train.jsonl": items[EVAL_PAIRS:]}
    for name, split in splits.items():
        records = []
        for english, german in split:
            records.append({"source": f"__en__ {english}", "target": f"__de__ {german}"})
            records.append({"source": f"__de__ {german}", "target": f"__en__ {english}"})
        with open(HERE / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    write_tokenizer([text for english, german in items for text in (english, german)],
                    HERE / "translation_tokenizer.json")


if __name__ == "__main__":
    main()
