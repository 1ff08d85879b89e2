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
TRAIN_SENTENCES, EVAL_SENTENCES = 3000, 100

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


# Dutch: nouns (singular, plural, article), places, adjectives (bare, inflected), verbs (present ik jij hij wij
# jullie zij, participle, infinitive; "houden van" takes its object after "van"), auxiliaries, the rest by English word
NL_NOUNS = {"dog": ("hond", "honden", "de"), "cat": ("kat", "katten", "de"), "child": ("kind", "kinderen", "het"),
            "man": ("man", "mannen", "de"), "woman": ("vrouw", "vrouwen", "de"),
            "teacher": ("leraar", "leraren", "de"), "friend": ("vriend", "vrienden", "de"),
            "bird": ("vogel", "vogels", "de"), "girl": ("meisje", "meisjes", "het"),
            "doctor": ("dokter", "dokters", "de"), "horse": ("paard", "paarden", "het"),
            "mouse": ("muis", "muizen", "de"), "king": ("koning", "koningen", "de"),
            "queen": ("koningin", "koninginnen", "de"), "cook": ("kok", "koks", "de"),
            "brother": ("broer", "broers", "de"), "sister": ("zus", "zussen", "de"),
            "mother": ("moeder", "moeders", "de"), "father": ("vader", "vaders", "de"),
            "book": ("boek", "boeken", "het"), "house": ("huis", "huizen", "het"), "car": ("auto", "auto's", "de"),
            "apple": ("appel", "appels", "de"), "letter": ("brief", "brieven", "de"),
            "table": ("tafel", "tafels", "de"), "door": ("deur", "deuren", "de"),
            "flower": ("bloem", "bloemen", "de"), "song": ("lied", "liederen", "het"),
            "picture": ("schilderij", "schilderijen", "het"), "tree": ("boom", "bomen", "de"),
            "window": ("raam", "ramen", "het")}
NL_PLACES = {"garden": "in de tuin", "house": "in het huis", "city": "in de stad", "park": "in het park",
             "kitchen": "in de keuken", "school": "in de school", "forest": "in het bos"}
NL_ADJECTIVES = {"big": ("groot", "grote"), "small": ("klein", "kleine"), "old": ("oud", "oude"),
                 "young": ("jong", "jonge"), "red": ("rood", "rode"), "new": ("nieuw", "nieuwe"),
                 "good": ("goed", "goede"), "beautiful": ("mooi", "mooie"), "tired": ("vermoeid", "vermoeide"),
                 "happy": ("blij", "blije"), "black": ("zwart", "zwarte"), "white": ("wit", "witte")}
NL_VERBS = {"see": ("zie ziet ziet zien zien zien", "gezien", "zien"),
            "love": ("hou houdt houdt houden houden houden", "gehouden", "houden"),
            "find": ("vind vindt vindt vinden vinden vinden", "gevonden", "vinden"),
            "buy": ("koop koopt koopt kopen kopen kopen", "gekocht", "kopen"),
            "hear": ("hoor hoort hoort horen horen horen", "gehoord", "horen"),
            "visit": ("bezoek bezoekt bezoekt bezoeken bezoeken bezoeken", "bezocht", "bezoeken"),
            "carry": ("draag draagt draagt dragen dragen dragen", "gedragen", "dragen"),
            "paint": ("schilder schildert schildert schilderen schilderen schilderen", "geschilderd", "schilderen"),
            "wash": ("was wast wast wassen wassen wassen", "gewassen", "wassen"),
            "call": ("roep roept roept roepen roepen roepen", "geroepen", "roepen"),
            "help": ("help helpt helpt helpen helpen helpen", "geholpen", "helpen"),
            "follow": ("volg volgt volgt volgen volgen volgen", "gevolgd", "volgen")}
NL_AUXILIARY = {"haben": "heb hebt heeft hebben hebben hebben", "werden": "zal zult zal zullen zullen zullen",
                "wollen": "wil wilt wil willen willen willen", "können": "kan kunt kan kunnen kunnen kunnen"}
NL_PRONOUNS = {"I": "ik", "you": "jij", "he": "hij", "she": "zij", "we": "wij", "they": "zij"}
NL_ADVERBS = {"today": "vandaag", "now": "nu", "yesterday": "gisteren", "tomorrow": "morgen"}
NL_INTRODUCERS = {"I know that": "Ik weet dat", "she says that": "zij zegt dat", "we think that": "wij denken dat",
                  "he is happy because": "hij is blij omdat", "they laugh because": "zij lachen omdat"}


def adjective_ending(kind: str, case: str, gender: str, plural: bool) -> str:
    """German adjective endings: weak after der-words, mixed after ein-words (ein, mein)."""
    if plural:
        return "en"
    if kind == "the":
        return "e" if case == "nom" or (case == "acc" and gender != "m") else "en"
    if case == "dat" or (case == "acc" and gender == "m"):
        return "en"
    return {"m": "er", "f": "e", "n": "es"}[gender]


def noun_phrase(rng: random.Random, pool: list) -> dict:
    """A noun phrase's choices: the noun, its number, determiner and adjective (or None)."""
    plural = rng.random() < 0.3
    return dict(noun=rng.choice(pool), plural=plural, kind=rng.choice(["the", "my"] if plural else ["the", "the", "a", "my"]),
                adjective=rng.choice(ADJECTIVES) if rng.random() < 0.35 else None)


def english_np(np_: dict) -> str:
    en_sg, en_pl = np_["noun"][:2]
    words = ([np_["adjective"][0]] if np_["adjective"] else []) + [en_pl if np_["plural"] else en_sg]
    article = {"the": "the", "my": "my", "a": "an" if words[0][0] in "aeiou" else "a"}[np_["kind"]]
    return f"{article} {' '.join(words)}"


def german_np(np_: dict, case: str) -> str:
    _, _, de_sg, de_pl, gender = np_["noun"]
    plural, kind = np_["plural"], np_["kind"]
    noun = de_pl if plural else de_sg
    if plural and case == "dat" and not noun.endswith(("n", "s")):
        noun += "n"
    words = [noun]
    if np_["adjective"]:
        adjective, ending = np_["adjective"][1], adjective_ending(kind, case, gender, plural)
        words.insert(0, adjective + (ending[1:] if adjective.endswith("e") else ending))
    return f"{ARTICLES[(kind, case)][3 if plural else GENDER[gender]]} {' '.join(words)}"


def dutch_np(np_: dict) -> str:
    singular, plural_form, article = NL_NOUNS[np_["noun"][0]]
    plural, kind = np_["plural"], np_["kind"]
    words = [plural_form if plural else singular]
    if np_["adjective"]:  # bare only after "een" before a het-noun
        bare, inflected = NL_ADJECTIVES[np_["adjective"][0]]
        words.insert(0, bare if kind == "a" and article == "het" and not plural else inflected)
    determiner = {"the": "de" if plural else article, "a": "een", "my": "mijn"}[kind]
    return f"{determiner} {' '.join(words)}"


def sentence(rng: random.Random) -> tuple[str, str, str]:
    """One sentence's choices, written in English, German and Dutch."""
    verb = rng.choice(VERBS)
    en_base, en_3sg, en_past, en_part, conj, part_de, aux, case, things = verb
    pronoun = rng.choice(PRONOUNS) if rng.random() < 0.35 else None
    subject = None if pronoun else noun_phrase(rng, ANIMATE)
    third = pronoun[3] if pronoun else not subject["plural"]
    person = pronoun[2] if pronoun else (2 if third else 5)
    obj = noun_phrase(rng, ANIMATE + THINGS if things else ANIMATE)
    tense = rng.choice(["present", "present", "past", "future", "modal"])
    modal = rng.choice(["wollen", "können"]) if tense == "modal" else None
    negated = rng.random() < 0.2 and obj["kind"] != "a"
    place = rng.choice(PLACES) if not negated and rng.random() < 0.3 else None
    form = rng.random()
    intro = rng.choice(INTRODUCERS) if form < 0.25 else None
    adverb = rng.choice(ADVERBS["modal" if modal else tense]) if 0.25 <= form < 0.45 else None

    # English
    if tense == "present":
        verb_en = f"{'does' if third else 'do'} not {en_base}" if negated else (en_3sg if third else en_base)
    elif tense == "past":
        verb_en = f"did not {en_base}" if negated else en_past
    elif tense == "future":
        verb_en = f"will {'not ' if negated else ''}{en_base}"
    elif modal == "wollen":
        verb_en = (f"{'does' if third else 'do'} not want to {en_base}" if negated else
                   f"{'wants' if third else 'want'} to {en_base}")
    else:
        verb_en = f"cannot {en_base}" if negated else f"can {en_base}"
    english = f"{pronoun[0] if pronoun else english_np(subject)} {verb_en} {english_np(obj)}"
    english += f" in the {place[0]}" if place else ""
    english = f"{intro[0]} {english}" if intro else f"{adverb[0]} {english}" if adverb else english

    # German: the finite verb second, or last in a subordinate clause; participles and infinitives at the end
    finite, final = {"present": (conj.split()[person], []), "past": (AUXILIARY[aux].split()[person], [part_de]),
                     "future": (AUXILIARY["werden"].split()[person], [conj.split()[3]])}.get(
        tense, (AUXILIARY[modal].split()[person] if modal else None, [conj.split()[3]]))
    subj_de = pronoun[1] if pronoun else german_np(subject, "nom")
    place_de = (("in der " if place[2] == "f" else "im ") + place[1]) if place else None
    middle = [german_np(obj, case)] + (["nicht"] if negated else []) + ([place_de] if place_de else [])
    if intro:
        german = f"{intro[1]} {subj_de} {' '.join(middle + final + [finite])}"
    elif adverb:
        german = f"{adverb[1]} {finite} {subj_de} {' '.join(middle + final)}"
    else:
        german = f"{subj_de} {finite} {' '.join(middle + final)}"

    # Dutch: the same second place, but a subordinate clause's finite verb before its participle or infinitive;
    # no cases; "niet" before a prepositional object
    nl_conj, nl_part, nl_inf = NL_VERBS[en_base]
    nl_finite, nl_final = {"present": (nl_conj.split()[person], []),
                           "past": (NL_AUXILIARY["haben"].split()[person], [nl_part]),
                           "future": (NL_AUXILIARY["werden"].split()[person], [nl_inf])}.get(
        tense, (NL_AUXILIARY[modal].split()[person] if modal else None, [nl_inf]))
    subj_nl = NL_PRONOUNS[pronoun[0]] if pronoun else dutch_np(subject)
    obj_nl = ("van " if en_base == "love" else "") + dutch_np(obj)
    not_nl = ["niet"] if negated else []
    middle_nl = (not_nl + [obj_nl] if en_base == "love" else [obj_nl] + not_nl)
    middle_nl += [NL_PLACES[place[0]]] if place else []
    if intro:
        dutch = f"{NL_INTRODUCERS[intro[0]]} {subj_nl} {' '.join(middle_nl + [nl_finite] + nl_final)}"
    elif adverb:  # inverted "jij" drops the -t: "zie jij", "heb jij"
        inverted = nl_finite[:-1] if person == 1 and nl_finite.endswith("t") else nl_finite
        dutch = f"{NL_ADVERBS[adverb[0]]} {inverted} {subj_nl} {' '.join(middle_nl + nl_final)}"
    else:
        dutch = f"{subj_nl} {nl_finite} {' '.join(middle_nl + nl_final)}"
    return tuple(text[0].upper() + text[1:] + "." for text in (english, german, dutch))


def write_tokenizer(texts: list[str], path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<pad>", "</s>", "<unk>", "<s>", "__en__", "__de__", "__nl__"]
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
    sentences: dict[str, tuple[str, str]] = {}
    while len(sentences) < TRAIN_SENTENCES + EVAL_SENTENCES:
        english, german, dutch = sentence(rng)
        sentences.setdefault(english, (german, dutch))
    items = list(sentences.items())
    rng.shuffle(items)
    splits = {"translation_eval.jsonl": items[:EVAL_SENTENCES], "translation_train.jsonl": items[EVAL_SENTENCES:]}
    for name, split in splits.items():
        records = []
        for english, translations in split:
            for language, other in zip(("de", "nl"), translations):  # English to each, and back
                records.append({"source": f"__en__ {english}", "target": f"__{language}__ {other}"})
                records.append({"source": f"__{language}__ {other}", "target": f"__en__ {english}"})
        with open(HERE / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    write_tokenizer([text for english, others in items for text in (english, *others)],
                    HERE / "translation_tokenizer.json")


if __name__ == "__main__":
    main()
