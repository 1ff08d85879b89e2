"""Sentence embeddings from a sentence-transformers folder, equal to ``SentenceTransformer(path).encode``.

    emb = jf.Embedder.from_pretrained("path/to/all-MiniLM-L6-v2")
    vectors = emb.encode(["A man is eating food.", "A man rides a horse."])   # float32 [2, 384]
    queries = jf.Embedder.from_pretrained("path/to/embeddinggemma-300m").encode(texts, prompt_name="query")

The folder's options are read and checked by ``interop.sentence_transformers``; this module tokenizes
(truncating to max_seq_length, as sentence-transformers does), runs the encoder and the pooling, Dense and
Normalize steps as one jitted function, and returns numpy. Batches are padded to power-of-two widths and
row counts, so a corpus compiles a handful of shapes instead of one per batch. The extra padding changes no
vector: it is masked, and on the left (decoder-only models such as gte-Qwen2 or e5-mistral, Gemma's tokenizer) it
only shifts rotary positions, which attention sees as distances.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.interop.files import read_json
from jaxformer.interop.hf import from_pretrained
from jaxformer.interop.sentence_transformers import DenseStep, Pipeline, plain_pipeline, read_folder
from jaxformer.interop.tokenizer import load_tokenizer

_SHORTEST_BUCKET = 8
DUAL_ENCODER_TYPES = ("clip", "siglip", "siglip2")  # model types whose folders ImageTextEmbedder reads
_DENSE_ACTIVATIONS = {"tanh": jnp.tanh, "identity": lambda x: x, "relu": jax.nn.relu, "sigmoid": jax.nn.sigmoid,
                      "gelu": lambda x: jax.nn.gelu(x, approximate=False)}


class Embedder:
    """A sentence-transformers pipeline on a jaxformer encoder: ``encode(texts) -> np.ndarray``."""

    def __init__(self, model, tokenizer, pipeline: Pipeline, max_seq_length: int, pad_token_id: int,
                 padding_side: str = "right"):
        self.model = model
        self.tokenizer = tokenizer            # a `tokenizers.Tokenizer`, truncating to max_seq_length
        self.pipeline = pipeline
        self.max_seq_length = max_seq_length
        self.pad_token_id = pad_token_id
        self.padding_side = padding_side
        self.similarity_fn_name = pipeline.similarity_fn_name
        dense = [step for step in pipeline.steps if isinstance(step, DenseStep)]
        self._dense_params = [{k: jnp.asarray(v) for k, v in
                               dict(w=s.weight, b=s.bias, r=s.residual).items() if v is not None} for s in dense]
        self._steps = tuple(("dense", s.activation, s.use_residual) if isinstance(s, DenseStep) else ("normalize",)
                            for s in pipeline.steps)
        self._graphdef, self._state = nnx.split(model)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: str | None = None, allow_pickle: bool = False,
                        pooling: str | None = None, model=None) -> "Embedder":
        """Load a folder written by ``SentenceTransformer.save`` (modules.json, the Hugging Face encoder, its
        tokenizer.json, 1_Pooling/config.json, optional Dense and Normalize modules). Older folders keep
        weights in pickled pytorch_model.bin files, read only with ``allow_pickle=True`` (weights_only).
        ``pooling``: read a Hugging Face folder without modules.json as ``SentenceTransformer(path)`` does, its
        last hidden states pooled so (sentence-transformers picks "mean" for an encoder), nothing after; None
        refuses such a folder. ``model``: the folder's model, already loaded."""
        if _holds_dual_encoder(path):  # CLIP, SigLIP: their text and image embeddings
            return ImageTextEmbedder.from_pretrained(path, dtype)
        plain = pooling is not None and not (Path(path) / "modules.json").exists()
        pipeline = plain_pipeline(path, pooling) if plain else read_folder(path, allow_pickle)
        folder = pipeline.transformer_dir
        model = from_pretrained(folder, dtype=dtype, allow_pickle=allow_pickle) if model is None else model
        cfg = model.config
        if plain:  # sentence-transformers' Pooling takes the encoder's width
            pipeline = dataclasses.replace(pipeline, embedding_dimension=cfg.d_model)
        if cfg.family == "encoder_decoder" or cfg.position == "xl":
            raise ValueError(f"{folder}/config.json holds a {cfg.family} model ({cfg.name}, {cfg.position} positions); "
                             "jaxformer embeds with encoders (BERT, RoBERTa, T5EncoderModel) and decoder-only models "
                             "(Llama, Mistral, Qwen2, Gemma, GPT-2)")
        if pipeline.embedding_dimension != cfg.d_model:
            raise ValueError(f"{path}: Pooling's embedding_dimension={pipeline.embedding_dimension} differs from the "
                             f"encoder's hidden size {cfg.d_model}")
        wrapped = load_tokenizer(folder)
        tokenizer = wrapped.tokenizer
        config_file = folder / "tokenizer_config.json"
        tokenizer_config = read_json(config_file) if config_file.exists() else {}
        max_seq_length = _max_seq_length(pipeline, tokenizer_config, folder, cfg.max_positions)
        sides = {k: tokenizer_config.get(k, "right") for k in ("truncation_side", "padding_side")}
        for field, side in sides.items():
            if side not in ("left", "right"):
                raise ValueError(f"{config_file}: {field}={side!r}; valid: 'left', 'right'")
        # Left padding moves every position of a row; that changes no vector only under rotary positions (scores
        # and windows depend on distances, the pads are masked), so elsewhere the vectors would depend on the batch.
        if sides["padding_side"] == "left" and cfg.position != "rope":
            raise ValueError(f"{config_file}: padding_side='left' is supported for models with rotary positions "
                             f"(Llama, Qwen2, Gemma, ModernBERT), not a {cfg.family} with {cfg.position} positions")
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_seq_length, strategy="longest_first", direction=sides["truncation_side"])
        if pipeline.do_lower_case:
            _lowercase_first(tokenizer)
        pad = wrapped.pad_token_id if wrapped.pad_token_id is not None else 0
        return cls(model, tokenizer, pipeline, max_seq_length, pad, sides["padding_side"])

    def encode(self, texts: str | list[str], batch_size: int = 32, normalize_embeddings: bool = False,
               prompt_name: str | None = None, prompt: str | None = None, truncate_dim: int | None = None
               ) -> np.ndarray:
        """Embeddings as float32 numpy: [N, D] for a list, [D] for one string (as sentence-transformers).
        ``prompt_name`` picks one of the folder's prompts (EmbeddingGemma: "query", "document", ...), ``prompt``
        gives the text itself (it wins over a name); neither: the folder's default prompt, if any.
        ``truncate_dim`` keeps the first dimensions (Matryoshka models), before ``normalize_embeddings``; None: the
        folder's own (config_sentence_transformers.json's truncate_dim), if it has one."""
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("encode takes a string or a list of strings")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}; expected a positive integer")
        if truncate_dim is not None and (isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int)
                                         or truncate_dim < 1):
            raise ValueError(f"truncate_dim={truncate_dim!r}; expected a positive integer or None")
        prompt = self._resolve_prompt(prompt, prompt_name)
        rows = [e.ids for e in self.tokenizer.encode_batch([prompt + t for t in texts])]
        skipped = self.prompt_length(prompt) if prompt and not self.pipeline.include_prompt else 0
        truncate_dim = self.pipeline.truncate_dim if truncate_dim is None else truncate_dim
        out = self.encode_ids(rows, batch_size, normalize_embeddings, truncate_dim, [skipped] * len(rows), "text")
        return out[0] if single else out

    def encode_ids(self, rows: list[list[int]], batch_size: int = 32, normalize_embeddings: bool = False,
                   truncate_dim: int | None = None, skip: list[int] | None = None, what: str = "row") -> np.ndarray:
        """Embeddings [N, D] of token-id rows taken as they are (no prompt added, no truncation: a row not of 1 to
        max_seq_length ids of the vocabulary is a ValueError). ``skip[i]``: row i's first tokens that pooling leaves
        out (a prompt, where the folder's Pooling does not include it). ``what`` names a row in errors."""
        vocab, limit = self.model.config.vocab_size, self.max_seq_length
        for i, row in enumerate(rows):  # checked here: the jitted forward would clamp a bad id silently
            if not 1 <= len(row) <= limit:  # past the limit: positions the model has not learned, or none to pool
                raise ValueError(f"{what} {i} holds {len(row)} token ids; want 1 to {limit} (max_seq_length)")
            if not 0 <= min(row) <= max(row) < vocab:
                cause = ": the tokenizer does not belong to this model" if what == "text" else ""
                raise ValueError(f"{what} {i} holds id {max(row) if max(row) >= vocab else min(row)}, outside the "
                                 f"model's vocabulary [0, {vocab}){cause}")
        skip = np.zeros(len(rows), np.int64) if skip is None else np.asarray(skip, np.int64)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))  # similar lengths share a batch
        width = min(truncate_dim or self.dimension, self.dimension)
        out = np.zeros((len(rows), width), np.float32)
        for start in range(0, len(order), batch_size):
            chosen = order[start:start + batch_size]
            ids, mask = self.pad_rows([rows[i] for i in chosen], batch_size)
            pooled = mask.copy()  # what pooling reads: the attention mask less the prompt's first tokens
            first = mask.argmax(axis=1)[:, None]
            skipped = np.zeros((len(ids), 1), np.int64)
            skipped[:len(chosen), 0] = skip[chosen]
            pooled[(np.arange(mask.shape[1]) >= first) & (np.arange(mask.shape[1]) < first + skipped)] = 0
            vectors = _embed(self._graphdef, self._state, self._dense_params, ids, mask, pooled,
                             pooling=self.pipeline.pooling, steps=self._steps, normalize=bool(normalize_embeddings),
                             width=width)
            out[chosen] = np.asarray(vectors)[:len(chosen)]
        return out

    def _resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str:
        """The prompt text as sentence-transformers resolves it: ``prompt``, else the named one, else the default."""
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ValueError(f"prompt={prompt!r}; expected a string")
            return prompt
        if prompt_name is None:
            return self.pipeline.prompt
        if prompt_name not in self.pipeline.prompts:
            raise ValueError(f"prompt_name={prompt_name!r} is not one of this folder's prompts "
                             f"{sorted(self.pipeline.prompts)} (config_sentence_transformers.json)")
        return self.pipeline.prompts[prompt_name]

    def prompt_length(self, prompt: str | None = None) -> int:
        """The prompt's tokens (default: the folder's default prompt) as sentence-transformers counts them: its
        encoding less a trailing special token."""
        ids = self.tokenizer.encode(self.pipeline.prompt if prompt is None else prompt).ids
        special = {i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special}
        return len(ids) - (1 if ids and ids[-1] in special else 0)

    def similarity(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Scores [N, M] between two sets of embeddings by the folder's similarity_fn_name, as
        ``SentenceTransformer.similarity``: cosine, dot, or negative euclidean / manhattan distance."""
        a = np.atleast_2d(np.asarray(a, np.float32))
        b = np.atleast_2d(np.asarray(b, np.float32))
        name = self.similarity_fn_name
        if name == "cosine":
            a, b = (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12) for x in (a, b))
        if name in ("cosine", "dot"):
            return a @ b.T
        gaps = a[:, None, :] - b[None, :, :]
        return -(np.sqrt((gaps ** 2).sum(-1)) if name == "euclidean" else np.abs(gaps).sum(-1))

    @property
    def dimension(self) -> int:
        dense = [s for s in self.pipeline.steps if isinstance(s, DenseStep)]
        return dense[-1].weight.shape[0] if dense else self.pipeline.embedding_dimension * len(self.pipeline.pooling)

    def pad_rows(self, rows: list[list[int]], batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Pad to a power-of-two width (capped by max_seq_length) and row count (capped by batch_size), on the
        tokenizer's padding side. Filler rows hold one unmasked pad token so no attention row is empty; their
        vectors are dropped."""
        width = min(self.max_seq_length, _next_power_of_two(max(len(r) for r in rows), _SHORTEST_BUCKET))
        count = min(batch_size, _next_power_of_two(len(rows), 1))
        ids = np.full((count, width), self.pad_token_id, np.int32)
        mask = np.zeros((count, width), np.int32)
        mask[len(rows):, -1] = 1
        for i, row in enumerate(rows):
            span = slice(width - len(row), width) if self.padding_side == "left" else slice(0, len(row))
            ids[i, span], mask[i, span] = row, 1
        return ids, mask


def _holds_dual_encoder(path: str | os.PathLike) -> bool:
    """A Hugging Face folder of a CLIP or SigLIP model (no sentence-transformers modules.json)."""
    folder = Path(path)
    return (not (folder / "modules.json").exists() and (folder / "config.json").exists()
            and read_json(folder / "config.json").get("model_type") in DUAL_ENCODER_TYPES)


def _next_power_of_two(n: int, floor: int) -> int:
    return max(floor, 1 << (n - 1).bit_length())


def _max_seq_length(pipeline: Pipeline, tokenizer_config: dict, folder, positions: int) -> int:
    """sentence-transformers' rule: max_seq_length from sentence_bert_config.json, else the tokenizer's
    model_max_length capped by max_position_embeddings; here also capped by the position table, past which
    sentence-transformers itself fails (RoBERTa's 514 counts its two offset rows)."""
    if pipeline.max_seq_length is not None:
        limit = pipeline.max_seq_length
    else:
        limit = tokenizer_config.get("model_max_length") or positions
        hf = read_json(folder / "config.json")
        if isinstance(hf.get("max_position_embeddings"), int) and hf["max_position_embeddings"] != -1:
            limit = min(limit, hf["max_position_embeddings"])
    return int(min(limit, positions))


def _lowercase_first(tokenizer) -> None:
    """do_lower_case: put Lowercase before the tokenizer's normalizer unless one is there already."""
    from tokenizers import normalizers

    current = tokenizer.normalizer
    parts = list(current) if isinstance(current, normalizers.Sequence) else [] if current is None else [current]
    if not any(isinstance(p, normalizers.Lowercase) for p in parts):
        tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), *parts])


def _pool(h: jax.Array, mask: jax.Array, pooled: jax.Array, mode: str) -> jax.Array:
    """One sentence-transformers pooling mode over padded [B, T, D] float32 states (either side): over the
    ``pooled`` positions; ``mask`` (attention) only places weightedmean's weights, as sentence-transformers."""
    m = pooled[..., None].astype(h.dtype)
    h = jnp.where(m > 0, h, 0.0)  # padded positions out (a query with no visible key need not be finite)
    if mode == "cls":
        return jnp.take_along_axis(h, jnp.argmax(pooled, axis=1)[:, None, None], axis=1)[:, 0]
    if mode == "max":
        return jnp.max(jnp.where(m > 0, h, -jnp.inf), axis=1)
    if mode == "lasttoken":
        last = mask.shape[1] - 1 - jnp.argmax(pooled[:, ::-1], axis=1)
        return jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0]
    if mode == "weightedmean":  # weights 1..T counted from the first real token
        m = m * (jnp.arange(1, mask.shape[1] + 1, dtype=h.dtype) - jnp.argmax(mask, axis=1)[:, None])[..., None]
    total = jnp.maximum(jnp.sum(m, axis=1), 1e-9)
    summed = jnp.sum(h * m, axis=1)  # weightedmean's weights ride on m
    return summed / (jnp.sqrt(total) if mode == "mean_sqrt_len_tokens" else total)


def _l2_normalize(x: jax.Array) -> jax.Array:
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # torch's F.normalize eps


@functools.partial(jax.jit, static_argnames=("graphdef", "pooling", "steps", "normalize", "width"))
def _embed(graphdef, state, dense_params, ids, mask, pooled, *, pooling, steps, normalize, width):
    """The encoder, pooling, Dense and Normalize steps, then the first ``width`` dimensions: one compiled
    function per padded shape."""
    h = nnx.merge(graphdef, state)(ids, attention_mask=mask).last_hidden_state.astype(jnp.float32)
    x = jnp.concatenate([_pool(h, mask, pooled, mode) for mode in pooling], axis=-1)
    dense = iter(dense_params)
    for step in steps:
        if step[0] == "normalize":
            x = _l2_normalize(x)
            continue
        _, activation, use_residual = step
        p = next(dense)
        y = _DENSE_ACTIVATIONS[activation](x @ p["w"].T + (p["b"] if "b" in p else 0))
        x = y + (x @ p["r"].T if "r" in p else x) if use_residual else y
    x = x[..., :width]
    return _l2_normalize(x) if normalize else x


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _text_features(graphdef, state, ids, mask):
    return nnx.merge(graphdef, state).get_text_features(ids, mask).pooler_output.astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _image_features(graphdef, state, pixel_values):
    return nnx.merge(graphdef, state).get_image_features(pixel_values).pooler_output.astype(jnp.float32)


class ImageTextEmbedder:
    """A dual encoder's (CLIP's, SigLIP's) text and image embeddings from a Hugging Face folder (config.json,
    weights, tokenizer.json, preprocessor_config.json), equal to transformers' ``get_text_features`` and
    ``get_image_features`` (CLIP's projected, SigLIP's as its heads give them), and zero-shot classification:

        emb = jf.ImageTextEmbedder.from_pretrained("path/to/clip-vit-base-patch32")   # or jf.Embedder's
        texts = emb.encode(["a photo of a cat", "a photo of a dog"])                   # float32 [2, 512]
        images = emb.encode_images([Image.open("cat.jpg")])                            # float32 [1, 512]
        probabilities = emb.classify([Image.open("cat.jpg")], ["a photo of a cat", "a photo of a dog"])

    Texts are tokenized as each model was trained: CLIP's padded to the batch's longest row under the attention
    mask (it pools at the EOS token); SigLIP's padded to its full length and read without a mask, as its tokenizer
    gives them (padding='max_length'; it pools at the last position)."""

    def __init__(self, model, tokenizer, processor):
        self.model, self.tokenizer, self.processor = model, tokenizer, processor
        self._graphdef, self._state = nnx.split(model)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: str | None = None) -> "ImageTextEmbedder":
        from jaxformer.vision import ImageProcessor

        model = from_pretrained(path, dtype=dtype)
        if model.config.family != "dual_encoder":
            raise ValueError(f"{path} holds a {model.config.family} model; ImageTextEmbedder reads dual encoders "
                             "(CLIP, SigLIP); sentence-transformers folders go to jf.Embedder")
        return cls(model, load_tokenizer(path), ImageProcessor.from_pretrained(path))

    @property
    def max_seq_length(self) -> int:
        return self.model.config.max_positions

    @functools.cached_property
    def dimension(self) -> int:
        """The embeddings' width (CLIP's projection; SigLIP's pooled text states, as wide as its image ones)."""
        features = functools.partial(_text_features, self._graphdef)
        return int(jax.eval_shape(features, self._state, np.zeros((1, 1), np.int32), None).shape[-1])

    def encode(self, texts: str | list[str], normalize_embeddings: bool = False) -> np.ndarray:
        """Text embeddings as float32 numpy: [N, D] for a list, [D] for one string."""
        batch = self.tokenizer(texts, max_length=self.max_seq_length)
        rows = [list(row[mask.astype(bool)]) for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
        return self._finish(self.encode_ids(rows, len(rows)), normalize_embeddings, isinstance(texts, str))

    def encode_ids(self, rows: list[list[int]], batch_size: int = 32, skip: list[int] | None = None) -> np.ndarray:
        """Text embeddings [N, D] of token-id rows as given (their special tokens included), in batches of at most
        ``batch_size`` rows, padded to power-of-two row counts and (CLIP, under the attention mask) widths, so a
        server compiles a few shapes: SigLIP's rows are read at their full length, the pads too, as its tokenizer
        gives them. A row not of 1 to max_seq_length ids of the vocabulary is a ValueError. (``skip``: the
        sentence-transformers embedder's prompt tokens; a dual encoder has none.)"""
        cfg, limit, vocab = self.model.config, self.max_seq_length, self.model.config.vocab_size
        if skip is not None and any(skip):
            raise ValueError("a dual encoder's text embeddings pool no prompt: skip must be 0 for every row")
        for i, row in enumerate(rows):
            if not 1 <= len(row) <= limit or not 0 <= min(row) <= max(row) < vocab:
                raise ValueError(f"row {i}: want 1 to {limit} ids (max_positions) in the vocabulary [0, {vocab})")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        whole = cfg.head_options.pooled_token == "last"  # SigLIP: every row its full length, no mask
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        out = None
        for start in range(0, len(order), batch_size):
            chosen = order[start:start + batch_size]
            width = self.padded_width(len(rows[chosen[0]]))
            count = min(batch_size, _next_power_of_two(len(chosen), 1))
            ids, mask = np.full((count, width), pad, np.int32), np.zeros((count, width), np.int32)
            mask[len(chosen):, 0] = 1  # (filler rows: one token seen, their vectors dropped)
            for r, i in enumerate(chosen):
                ids[r, :len(rows[i])], mask[r, :len(rows[i])] = rows[i], 1
            vectors = np.asarray(_text_features(self._graphdef, self._state, ids, None if whole else mask))
            out = np.zeros((len(rows), vectors.shape[-1]), np.float32) if out is None else out
            out[chosen] = vectors[:len(chosen)]
        return out

    def padded_width(self, length: int) -> int:
        """The width ``encode_ids`` pads a batch whose longest row holds ``length`` ids to: a power of two (at least
        8, at most max_positions), SigLIP's every row max_positions."""
        if self.model.config.head_options.pooled_token == "last":
            return self.max_seq_length
        return min(self.max_seq_length, _next_power_of_two(length, _SHORTEST_BUCKET))

    def encode_images(self, images, normalize_embeddings: bool = False, batch_size: int = 32) -> np.ndarray:
        """Image embeddings as float32 numpy [N, D] (PIL images or arrays, as ``jaxformer.vision.ImageProcessor``
        reads them; one image gives [D]), in batches of at most ``batch_size`` images padded to power-of-two counts
        (blank filler images, their vectors dropped), so a server compiles a few shapes (SigLIP 2's NaFlex images:
        unpadded, each batch's patch grids its own program)."""
        inputs = self.processor(images)
        naflex = {key: inputs[key] for key in ("pixel_attention_mask", "spatial_shapes") if key in inputs}  # SigLIP2
        single = not isinstance(images, (list, tuple)) and np.ndim(images) < 4
        pixels = inputs["pixel_values"]
        if naflex:  # (each image's patch grid shapes the program: read on the host, so run as it comes, unpadded)
            features = [self.model.get_image_features(pixels[start:start + batch_size],
                                                      **{key: value[start:start + batch_size]
                                                         for key, value in naflex.items()}).pooler_output
                        for start in range(0, len(pixels), batch_size)]
            return self._finish(np.concatenate([np.asarray(f) for f in features]), normalize_embeddings, single)
        # (a list where the sizes differ, not resized: each image its own call)
        groups = [np.asarray(image)[None] for image in pixels] if isinstance(pixels, list) else [np.asarray(pixels)]
        batches = []
        for group in groups:
            for start in range(0, len(group), batch_size):
                chosen = group[start:start + batch_size]
                count = min(batch_size, _next_power_of_two(len(chosen), 1))
                filler = np.zeros((count - len(chosen), *chosen.shape[1:]), chosen.dtype)
                vectors = _image_features(self._graphdef, self._state, np.concatenate([chosen, filler]))
                batches.append(np.asarray(vectors)[:len(chosen)])
        return self._finish(np.concatenate(batches), normalize_embeddings, single)

    def classify(self, images, labels: list[str]) -> np.ndarray:
        """Zero-shot classification [N_images, N_labels]: each image's probability of each label text, a softmax
        over the labels (CLIP) or each label's own sigmoid (SigLIP, whose logits carry a bias)."""
        text = self.encode(list(labels), normalize_embeddings=True)
        image = self.encode_images(images if isinstance(images, (list, tuple)) else [images], normalize_embeddings=True)
        logits = self.model.similarity(jnp.asarray(text), jnp.asarray(image)).T
        sigmoid = self.model.config.vision.logit_bias
        return np.asarray(jax.nn.sigmoid(logits) if sigmoid else jax.nn.softmax(logits, axis=-1), np.float32)

    @staticmethod
    def _finish(vectors, normalize: bool, single: bool) -> np.ndarray:
        vectors = np.asarray(_l2_normalize(vectors) if normalize else vectors, np.float32)
        return vectors[0] if single else vectors
