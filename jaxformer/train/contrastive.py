"""Contrastive image-text training of a dual encoder (CLIP, SigLIP) on matching pairs: each batch holds B captions
(``input_ids``, ``attention_mask``) and their B pictures (``pixel_values``), and the loss is the symmetric one of
``objectives.contrastive_loss`` (CLIP's softmax form, or SigLIP's sigmoid form for a model with a logit bias),
every other row of the batch a negative.

The pairs are the drawn set of ``shapes`` (``data.train: shapes:N``), preprocessed by CLIP's image processor at
the image tower's size. Held out, besides the loss and in-batch retrieval accuracy: zero-shot classification, each
held-out picture given the class (colour x shape) whose prompt "a photo of a red circle" is most similar to it
(``zero_shot_accuracy``), against ``zero_shot_chance`` (one over the number of classes). ``DrawnScenes`` holds
what this objective shares with ``visual_qa`` (LLaVA's questions about the same pictures).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxformer.dual_encoder import unit
from jaxformer.model_config import ModelConfig
from jaxformer.train import data, shapes
from jaxformer.train.objectives import Objective, contrastive_loss, ratio
from jaxformer.vision import ImageProcessor


def image_processor(size: int) -> ImageProcessor:
    """CLIP's processor for pictures of ``size`` pixels square (its resize and crop then keep them as they are)."""
    return ImageProcessor.from_dict({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": size},
                                     "crop_size": {"height": size, "width": size}})


class DrawnScenes(Objective):
    """What the objectives over the drawn scenes of ``shapes`` share (``contrastive``, ``visual_qa``): the
    tokenizer's pad and EOS (and <s> where it has one), ``data.train``'s scenes (stream 0), held-out scenes drawn
    from stream 1 (so no ``data.eval``), pictures preprocessed at the image tower's size. A subclass's
    ``_batch(indices, stream)`` lays out its rows; ``held_out_only`` names the entry only held-out batches keep."""

    held_out_only = ""

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        self.ids = data.require(tokenizer, "pad", "eos")
        self.bos = tokenizer.special("bos")
        self.scenes = shapes.parse_source(run.data.train)
        if run.data.eval:
            raise ValueError(f"data.eval={run.data.eval!r}: train.objective={self.name!r} draws its held-out scenes "
                             "(eval.batches x train.batch_size of them); leave data.eval empty")
        self.processor = None  # set by ``read_pictures`` (from ``adapt``): the image tower's size is the model's

    def read_pictures(self, cfg: ModelConfig, tower: ModelConfig) -> None:
        """Draw pictures for ``tower`` (model ``cfg``'s image tower), which must read RGB ones of a fixed size."""
        if tower.patches is None or tower.patches.channels != 3 or tower.patches.flexible:
            raise ValueError(f"train.objective={self.name!r} draws RGB pictures of one size; model {cfg.name!r}'s "
                             "image tower must read 3-channel pixel_values of a fixed image_size")
        self.processor = image_processor(tower.patches.image_size)

    def _draw(self, indices, stream: int) -> tuple[list[shapes.Scene], np.ndarray]:
        """Scenes ``indices`` of ``stream`` and their pixel_values."""
        if self.processor is None:
            raise RuntimeError(f"{type(self).__name__}.adapt(model_config) sets the picture size; call it first")
        size = self.processor.settings["crop_size"]["height"]
        scenes = [shapes.scene(self.seed, int(i), size, stream) for i in indices]
        return scenes, self.processor([s.image for s in scenes])["pixel_values"]

    def _batch(self, indices, stream: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def batch(self, step, batch_size):
        batch = self._batch(data.epoch_indices(self.scenes, self.seed, step, batch_size), stream=0)
        del batch[self.held_out_only]  # (a held-out metric's)
        return batch

    def eval_batches(self, count, batch_size):
        return [self._batch(range(b * batch_size, (b + 1) * batch_size), stream=1) for b in range(count)]


class Contrastive(DrawnScenes):
    """Matching caption-picture pairs of the drawn shapes through both towers, the symmetric contrastive loss."""

    name, family, held_out_only = "contrastive", "dual_encoder", "classes"

    def __init__(self, run, tokenizer):
        super().__init__(run, tokenizer)
        self.prompts = self._rows(shapes.class_prompts(), "class prompts")

    def adapt(self, cfg, fresh):
        cfg = super().adapt(cfg, fresh)
        tower = cfg.vision.tower
        self.read_pictures(cfg, tower)
        if cfg.dropout_rate or cfg.attention_dropout_rate or tower.dropout_rate or tower.attention_dropout_rate:
            raise ValueError(f"model {cfg.name!r} sets dropout, which the dual encoder's forward does not apply; set "
                             "model.overrides.dropout_rate=0 and attention_dropout_rate=0 (and the tower's)")
        eos = self.ids["eos"]
        if fresh:
            cfg = cfg.replace(eos_token_id=eos, pad_token_id=self.ids["pad"], bos_token_id=self.bos)
        elif cfg.tokens.eos != eos:
            raise ValueError(f"model {cfg.name!r} pools its text at eos_token_id={cfg.tokens.eos}, but data.tokenizer="
                             f"{self.tokenizer.name!r} ends each caption with {eos}; use the model's own tokenizer")
        if cfg.head_options.pooled_token == "eos" and eos == 2:
            raise ValueError(f"data.tokenizer={self.tokenizer.name!r} has EOS id 2, which CLIP's text model reads as "
                             "its legacy rule (pool at the largest id): use a tokenizer whose EOS is another id")
        return cfg

    def _rows(self, texts: list[str], what: str) -> dict[str, np.ndarray]:
        """Captions as rows of train.seq_len: <s> (where the tokenizer has one), the words, </s>, padding."""
        head = np.asarray([] if self.bos is None else [self.bos], np.int32)
        rows = [self._fixed_length(np.concatenate([head, ids]), self.seq_len, [self.ids["eos"]])
                for ids in self.tokenizer.encode_many(texts)]
        self._note_cuts(what, len(texts), "train.seq_len", self.seq_len)
        ids, mask = data.pad_rows(rows, self.seq_len, self.ids["pad"])
        return {"input_ids": ids, "attention_mask": mask}

    def _batch(self, indices, stream: int) -> dict[str, np.ndarray]:
        """The pairs of scenes ``indices`` of ``stream``, pictures preprocessed, and their zero-shot classes."""
        scenes, pixel_values = self._draw(indices, stream)
        return {**self._rows([s.caption for s in scenes], "captions"), "pixel_values": pixel_values,
                "classes": np.array([s.label for s in scenes], np.int32)}

    def loss(self, model, batch, key):
        out = model(batch["input_ids"], batch["pixel_values"], batch["attention_mask"])
        sums = contrastive_loss(out.logits_per_text, sigmoid=model.config.vision.logit_bias)
        if "classes" in batch:  # held out: every picture against every class prompt
            prompts = model.get_text_features(jnp.asarray(self.prompts["input_ids"]),
                                              jnp.asarray(self.prompts["attention_mask"])).pooler_output
            chosen = jnp.argmax(model.similarity(unit(prompts), out.image_embeds), axis=0)
            correct = (chosen == batch["classes"]).sum().astype(jnp.float32)
            sums["zero_shot_accuracy"] = (correct, jnp.float32(len(chosen)))
        return ratio(sums["loss"]), sums

    def finish(self, values):
        if "zero_shot_accuracy" in values:
            values = {**values, "zero_shot_chance": 1.0 / len(self.prompts["input_ids"])}
        return values
