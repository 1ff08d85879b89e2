"""An image-caption set drawn here, nothing downloaded: coloured shapes (circle, square, triangle, cross), one to
three of one kind in one place of the picture, each captioned in one of a few templates ("two red circles on
the left", "a photo of a blue square"). Scene ``index`` of stream ``stream`` under ``seed`` is a pure function of
the three, drawn on demand, so a run's batches stay a function of (seed, step). ``data.train: shapes:N`` reads
N training scenes (stream 0); held-out scenes come from stream 1.

Zero-shot classes are colour x shape, each prompted "a photo of a {colour} {shape}" ("an orange ..."), a caption
the training templates also write for single shapes. ``python -m jaxformer.train.shapes PATH`` writes the word-level
tokenizer.json (every word the captions and prompts use) that configs/clip_shapes.yaml reads.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from PIL import Image, ImageDraw

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (50, 90, 235), "yellow": (235, 210, 40),
           "purple": (150, 60, 200), "orange": (245, 135, 30)}
SHAPES = {"circle": "circles", "square": "squares", "triangle": "triangles", "cross": "crosses"}
COUNTS = {1: "one", 2: "two", 3: "three"}
# each place's box in fractions of the picture (x0, y0, x1, y1): its shapes sit in equal cells along its longer side
PLACES = {"on the left": (0.0, 0.0, 0.5, 1.0), "on the right": (0.5, 0.0, 1.0, 1.0),
          "at the top": (0.0, 0.0, 1.0, 0.5), "at the bottom": (0.0, 0.5, 1.0, 1.0),
          "in the middle": (0.125, 0.25, 0.875, 0.75)}
TEMPLATES = ("{count} {colour} {shapes} {place}", "a photo of {count} {colour} {shapes} {place}",
             "{count} {colour} {shapes}", "a photo of {count} {colour} {shapes}")
PROMPT = "a photo of {article} {colour} {shape}"
SPECIALS = ("<pad>", "<s>", "<unk>", "</s>")  # ids 0-3: the EOS is not 2, which CLIP reads as its legacy rule
DEFAULT_SCENES = 10_000


@dataclasses.dataclass(frozen=True)
class Scene:
    """One picture [H, W, 3] uint8 and its caption; ``centres`` (x, y) of each shape drawn, for checks."""

    image: np.ndarray
    caption: str
    colour: str
    shape: str
    count: int
    place: str
    centres: tuple[tuple[int, int], ...]

    @property
    def label(self) -> int:
        """The zero-shot class: colour x shape, in the order of ``class_prompts``."""
        return list(COLOURS).index(self.colour) * len(SHAPES) + list(SHAPES).index(self.shape)


def class_prompts() -> list[str]:
    return [PROMPT.format(article=article(colour), colour=colour, shape=shape)
            for colour in COLOURS for shape in SHAPES]


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _draw(draw: ImageDraw.ImageDraw, shape: str, x: int, y: int, r: int, fill: tuple[int, int, int]) -> None:
    if shape == "circle":
        draw.ellipse((x - r, y - r, x + r, y + r), fill=fill)
    elif shape == "square":
        half = max(2, round(0.8 * r))  # about a circle's area
        draw.rectangle((x - half, y - half, x + half, y + half), fill=fill)
    elif shape == "triangle":
        draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
    else:  # cross
        arm = max(1, r // 3)
        draw.rectangle((x - r, y - arm, x + r, y + arm), fill=fill)
        draw.rectangle((x - arm, y - r, x + arm, y + r), fill=fill)


def _within(rng: np.random.Generator, start: float, end: float, r: int) -> int:
    """A centre whose shape of half-size ``r`` stays inside [start, end) (the middle when it barely fits)."""
    low, high = int(np.ceil(start)) + r, int(end) - 1 - r
    return int(rng.integers(low, high + 1)) if high >= low else int((start + end) / 2)


def scene(seed: int, index: int, size: int, stream: int = 0) -> Scene:
    """Scene ``index`` of ``stream``: a dark grey background, ``count`` shapes of one colour and kind in one place
    (sizes and positions jittered within their cells), its caption in a template drawn with it."""
    rng = np.random.default_rng((seed, stream, index))
    colour, shape = list(COLOURS)[rng.integers(len(COLOURS))], list(SHAPES)[rng.integers(len(SHAPES))]
    count, place = int(rng.integers(1, 4)), list(PLACES)[rng.integers(len(PLACES))]
    grey = int(rng.integers(0, 90))
    image = Image.new("RGB", (size, size), (grey, grey, grey))
    draw = ImageDraw.Draw(image)
    x0, y0, x1, y1 = (round(f * size) for f in PLACES[place])
    across = (x1 - x0) >= (y1 - y0)
    step = ((x1 - x0) if across else (y1 - y0)) / count
    radius = int(rng.integers(size // 12, size // 7 + 1))
    centres = []
    for i in range(count):
        cx0, cy0 = (x0 + i * step, y0) if across else (x0, y0 + i * step)
        cx1, cy1 = (cx0 + step, y1) if across else (x1, cy0 + step)
        r = max(2, min(radius, int(min(cx1 - cx0, cy1 - cy0)) // 2 - 1))
        x, y = _within(rng, cx0, cx1, r), _within(rng, cy0, cy1, r)
        _draw(draw, shape, x, y, r, COLOURS[colour])
        centres.append((x, y))
    template = TEMPLATES[rng.integers(len(TEMPLATES))]
    number = (article(colour) if rng.random() < 0.5 else "one") if count == 1 else COUNTS[count]
    caption = template.format(count=number, colour=colour, shapes=shape if count == 1 else SHAPES[shape], place=place)
    return Scene(np.asarray(image), caption, colour, shape, count, place, tuple(centres))


def parse_source(spec: str) -> int:
    """The number of training scenes of ``data.train``: ``shapes`` (DEFAULT_SCENES) or ``shapes:N``."""
    name, _, count = spec.partition(":")
    if name != "shapes" or (count and not (count.isdigit() and int(count) > 0)):
        raise ValueError(f"data.train={spec!r}: train.objective 'contrastive' and 'visual_qa' read the drawn "
                         "pictures, 'shapes' or 'shapes:N' (N training scenes, a positive integer)")
    return int(count) if count else DEFAULT_SCENES


def vocabulary() -> list[str]:
    """Every word a caption or prompt can hold, after the special tokens, in a fixed order."""
    words = {word for template in (*TEMPLATES, PROMPT) for word in template.split() if not word.startswith("{")}
    words |= set(COLOURS) | set(SHAPES) | set(SHAPES.values()) | set(COUNTS.values()) | {"a", "an"}
    words |= {word for place in PLACES for word in place.split()}
    return [*SPECIALS, *sorted(words)]


def build_tokenizer():
    """A word-level ``tokenizers`` tokenizer over ``vocabulary()``: words split at whitespace, each encoding
    wrapped in <s> ... </s> as CLIP's tokenizer wraps its rows."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {word: i for i, word in enumerate(vocabulary())}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                             special_tokens=[("<s>", 1), ("</s>", 3)])
    tokenizer.add_special_tokens(list(SPECIALS))
    return tokenizer


if __name__ == "__main__":
    build_tokenizer().save(sys.argv[1] if len(sys.argv) > 1 else "configs/data/shapes_tokenizer.json")
