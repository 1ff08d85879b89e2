"""Questions about pictures for a decoder that reads images (LLaVA): ``train.objective: visual_qa``.

Each row is one drawn scene of ``shapes`` (``data.train: shapes:N``; held out: stream 1) and one question about it,
in LLaVA-1.5's prompt: "USER: <image> What colour are the shapes? ASSISTANT:" then the answer ("red") and EOS. The
``<image>`` placeholder is expanded to one image token per feature of the tower (as the processor expands it), the
pictures are read by CLIP's image processor at the tower's size. Prompts are left padded so that every row's
prompt ends at the same column, answers follow it: the loss is the decoder's next-token loss on the answer tokens
and the EOS only. Positions count each row's real tokens (as generation numbers a left-padded prompt).

Held out, besides the loss: ``answer_accuracy``, the rows whose greedy answer (the argmax token after the prompt,
fed back, up to and including EOS) is exactly the answer, overall and per kind of question, against
``answer_chance``, what answering each kind of question with its most frequent held-out answer scores.
``python -m jaxformer.train.visual_qa PATH`` writes the word-level tokenizer.json configs/llava_shapes.yaml reads.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter

import jax.numpy as jnp
import numpy as np

from jaxformer.layers import left_padded_positions
from jaxformer.layers.projector import features_per_image
from jaxformer.train import shapes
from jaxformer.train.contrastive import DrawnScenes
from jaxformer.train.data import IGNORE
from jaxformer.train.objectives import ratio, token_cross_entropy

IMAGE = "<image>"
PROMPT = "USER: <image> {question} ASSISTANT:"  # LLaVA-1.5's (its newline is whitespace to a word-level tokenizer)
QUESTIONS = {"colour": "What colour are the shapes?", "shape": "What shape are they?",
             "count": "How many shapes are there?", "place": "Where are the shapes?"}

ANSWERS = [*shapes.COLOURS, *shapes.SHAPES, *shapes.COUNTS.values(), *(place.split()[-1] for place in shapes.PLACES)]


def answer(scene: shapes.Scene, kind: str) -> str:
    """The one-word answer to question ``kind`` about ``scene``."""
    return {"colour": scene.colour, "shape": scene.shape, "count": shapes.COUNTS[scene.count],
            "place": scene.place.split()[-1]}[kind]


def question_kind(seed: int, index: int, stream: int) -> str:
    """The question asked about scene ``index`` of ``stream``: a function of the three, like the scene."""
    return list(QUESTIONS)[np.random.default_rng((seed, stream, index, 1)).integers(len(QUESTIONS))]


def vocabulary() -> list[str]:
    """The special tokens, the image placeholder, then every word a prompt or an answer holds, in a fixed order."""
    words = {word for text in (PROMPT, *QUESTIONS.values()) for word in text.split() if not word.startswith("{")}
    words |= set(ANSWERS)
    return [*shapes.SPECIALS, IMAGE, *sorted(words - {IMAGE})]


def build_tokenizer():
    """A word-level ``tokenizers`` tokenizer over ``vocabulary()`` (words split at whitespace); ``<image>`` and
    the specials are special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(vocabulary())}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces
    tokenizer.add_special_tokens([*shapes.SPECIALS, IMAGE])
    return tokenizer


class VisualQA(DrawnScenes):
    """One question about each drawn picture, answered by a decoder that reads the picture (LLaVA)."""

    name, family, held_out_only = "visual_qa", "decoder", "kinds"

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        inner = getattr(tokenizer, "tokenizer", None)
        self.image_token = inner.token_to_id(IMAGE) if inner is not None else None
        if self.image_token is None:
            raise ValueError(f"data.tokenizer={tokenizer.name!r} has no {IMAGE!r} token for the image placeholder; "
                             "train.objective='visual_qa' reads configs/data/llava_shapes_tokenizer.json's words")
        self.unknown = inner.token_to_id("<unk>")
        self.answer_len = 1 + max(len(ids) for ids in self._encode(ANSWERS))  # the longest answer and its EOS
        self.per_image = 0  # set by ``adapt``: the image tower's token count is the model's

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        encoded = self.tokenizer.encode_many(texts)
        unknown = [t for t, ids in zip(texts, encoded) if self.unknown in ids]
        if unknown:
            raise ValueError(f"data.tokenizer={self.tokenizer.name!r} does not know every word of {unknown[0]!r}")
        return encoded

    def adapt(self, cfg, fresh):
        cfg = super().adapt(cfg, fresh)
        vision = cfg.vision
        if vision is None or vision.projector_activation is None:
            raise ValueError(f"train.objective='visual_qa' trains a decoder that reads images through a projector "
                             f"(LLaVA); model {cfg.name!r} has none (model.preset: llava-1.5-7b, say)")
        self.read_pictures(cfg, vision.tower)
        if fresh:
            cfg = cfg.replace(pad_token_id=self.ids["pad"], eos_token_id=self.ids["eos"], bos_token_id=self.bos,
                              vision=dataclasses.replace(vision, image_token_id=self.image_token))
        elif vision.image_token_id != self.image_token:
            raise ValueError(f"model {cfg.name!r} reads images at image_token_id={vision.image_token_id}, but "
                             f"data.tokenizer={self.tokenizer.name!r} spells {IMAGE!r} {self.image_token}; use the "
                             "model's own tokenizer")
        cfg = cfg.replace(head="lm") if cfg.head != "lm" else cfg
        self.per_image = features_per_image(cfg)
        longest = max(len(p) for p in self._prompts(list(QUESTIONS)))
        if longest + self.answer_len > self.seq_len:
            raise ValueError(f"train.seq_len={self.seq_len} cannot hold the longest prompt ({longest} tokens, "
                             f"{self.per_image} of them the image's) and answer ({self.answer_len} with EOS): set "
                             f"train.seq_len={longest + self.answer_len} or more")
        return cfg

    def _prompts(self, kinds: list[str]) -> list[np.ndarray]:
        """The prompts of questions ``kinds``: <s> (where the tokenizer has one), the words, the image
        placeholder expanded to one token per image feature."""
        head = [] if self.bos is None else [self.bos]
        rows = self._encode([PROMPT.format(question=QUESTIONS[kind]) for kind in kinds])
        return [np.asarray(head + [t for t in ids for _ in range(self.per_image if t == self.image_token else 1)],
                           np.int32) for ids in rows]

    def _batch(self, indices, stream: int) -> dict[str, np.ndarray]:
        """Scenes ``indices`` of ``stream`` with their questions: each prompt left padded to end at column
        seq_len - answer_len, its answer and EOS after it, labels on those alone."""
        scenes, pixel_values = self._draw(indices, stream)
        kinds = [question_kind(self.seed, int(i), stream) for i in indices]
        answers = self._encode([answer(s, k) for s, k in zip(scenes, kinds)])
        end = self.seq_len - self.answer_len  # where every prompt ends
        ids = np.full((len(scenes), self.seq_len), self.ids["pad"], np.int32)
        mask = np.zeros_like(ids)
        labels = np.full_like(ids, IGNORE)
        for row, (prompt, said) in enumerate(zip(self._prompts(kinds), answers)):
            reply = np.concatenate([said, [self.ids["eos"]]]).astype(np.int32)
            ids[row, end - len(prompt):end + len(reply)] = np.concatenate([prompt, reply])
            mask[row, end - len(prompt):end + len(reply)] = 1
            labels[row, end - 1:end - 1 + len(reply)] = reply  # each answer token predicted from the one before
        return {"input_ids": ids, "attention_mask": mask, "labels": labels,
                "pixel_values": pixel_values, "kinds": np.array([list(QUESTIONS).index(k) for k in kinds], np.int32)}

    def eval_batches(self, count, batch_size):
        batches = super().eval_batches(count, batch_size)
        end = self.seq_len - self.answer_len
        pairs = [(int(kind), tuple(label[end - 1:end - 1 + self.answer_len])) for b in batches
                 for kind, label in zip(b["kinds"], b["labels"])]
        totals = Counter(kind for kind, _ in pairs)
        best = Counter()  # each kind's most frequent answer: how many rows it answers
        for (kind, _), seen in Counter(pairs).items():
            best[kind] = max(best[kind], seen)
        self.chance = sum(best.values()) / max(1, sum(totals.values()))
        return batches

    def _forward(self, model, ids, batch, key=None):
        mask = batch["attention_mask"]
        return model(ids, mask, left_padded_positions(mask), pixel_values=batch["pixel_values"],
                     dropout_key=key).logits

    def loss(self, model, batch, key):
        logits = self._forward(model, batch["input_ids"], batch, key)
        sums = token_cross_entropy(logits, batch["labels"], self.run.train.label_smoothing)
        if "kinds" in batch:  # held out: greedy answers, each token fed back, against the answer and its EOS
            sums |= self._greedy_answers(model, batch, logits)
        return ratio(sums["loss"]), sums

    def _greedy_answers(self, model, batch, logits) -> dict:
        """Greedy generation after each prompt, ``answer_len`` tokens (teacher-forced logits give the first; each
        further token is one more forward with the tokens so far in place: causal attention leaves the positions
        before them as they were), counted right where every token up to and including the answer's EOS is."""
        end = self.seq_len - self.answer_len
        ids, labels = batch["input_ids"], batch["labels"]
        chosen = []
        for k in range(self.answer_len):
            if k:
                ids = ids.at[:, end + k - 1].set(chosen[-1])
                logits = self._forward(model, ids, batch)
            chosen.append(jnp.argmax(logits[:, end - 1 + k], axis=-1).astype(ids.dtype))
        wanted = labels[:, end - 1:end - 1 + self.answer_len]
        right = jnp.all((jnp.stack(chosen, axis=1) == wanted) | (wanted == IGNORE), axis=1)
        sums = {"answer_accuracy": (right.sum().astype(jnp.float32), jnp.float32(len(right)))}
        for i, kind in enumerate(QUESTIONS):
            asked = batch["kinds"] == i
            sums[f"answer_accuracy_{kind}"] = ((right & asked).sum().astype(jnp.float32),
                                               asked.sum().astype(jnp.float32))
        return sums

    def finish(self, values):
        if "answer_accuracy" in values:
            values = {**values, "answer_chance": self.chance}
        return values


if __name__ == "__main__":
    build_tokenizer().save(sys.argv[1] if len(sys.argv) > 1 else "configs/data/llava_shapes_tokenizer.json")
