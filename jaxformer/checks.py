"""Host-side checks of model inputs, run once per public call before anything is traced.

JAX clamps out-of-range gathers silently, so every public entry validates here first. Shape checks
always run; value checks (id ranges, mask values) run whenever the arrays are concrete, i.e. outside a
user's own ``jax.jit``. ``public_call`` is how a family's ``__call__`` gets both: checked once on the
host, then run as one compiled function.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxformer.cache import Memory
from jaxformer.model_config import ModelConfig


# a call's Python switches, static under jit (one compilation per choice): what it returns, and an image tower's
# resampled positions
STATIC_FLAGS = ("output_hidden_states", "output_attentions", "interpolate_pos_encoding")
# inputs that lay out work on the host (Qwen2.5-VL's image grids: its tower's windows): static, as nested tuples
STATIC_VALUES = ("image_grid_thw",)


def public_call(method):
    """A family's ``__call__``: inputs checked once by the model's ``validate``, then run compiled.

    Called with concrete arrays, the inputs are validated (id ranges and all) and the forward pass
    runs under ``jax.jit``, compiled once per input shape: eager op-by-op execution of a scanned
    stack would re-trace it on every call. Called inside a user's own transformation (tracers), the
    shape checks run and then the method, as written.
    """

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
            self.validate(*args, **kwargs)
            return method(self, *args, **kwargs)
        args = tuple(as_array(a, f"argument {i}") for i, a in enumerate(args))
        kwargs = {k: (v if k in STATIC_FLAGS + STATIC_VALUES else as_array(v, k)) for k, v in kwargs.items()}
        self.validate(*args, **kwargs)
        flags = tuple((k, bool(kwargs.pop(k))) for k in STATIC_FLAGS if k in kwargs)
        flags += tuple((k, static_value(kwargs.pop(k))) for k in STATIC_VALUES if kwargs.get(k) is not None)
        graphdef, state = nnx.split(self)
        return _run_compiled(graphdef, state, method, args, kwargs, flags)

    return call


def static_value(x: Any) -> tuple:
    """An array of ints (a grid per image) as nested tuples: hashable, a static argument of a compiled call."""
    return tuple(tuple(row) if isinstance(row, list) else row for row in np.asarray(x).tolist())


def as_array(x: Any, name: str) -> Any:
    """A public call's array argument as an array (None, JAX arrays and carried state such as a
    Transformer-XL ``Memory`` pass through)."""
    return x if x is None or isinstance(x, (jax.Array, Memory)) else id_array(x, name)


def id_array(x: Any, name: str) -> np.ndarray:
    """``x`` (a nested list, numpy array, ...) as a numpy array; ragged rows are a clear error."""
    try:
        return np.asarray(x)
    except ValueError:
        shapes = sorted({str(np.shape(row)) for row in x}) if isinstance(x, (list, tuple)) else "?"
        raise ValueError(f"{name} must be a rectangular [batch, length] array; its rows have shapes "
                         f"{', '.join(shapes)}. Pad the rows to one length and pass an attention_mask") from None


@functools.partial(jax.jit, static_argnames=("graphdef", "method", "flags"))
def _run_compiled(graphdef, state, method, args, kwargs, flags):
    return method(nnx.merge(graphdef, state), *args, **dict(flags), **kwargs)


def _concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(np.shape(x))


def check_ids(ids: Any, vocab_size: int, name: str = "input_ids") -> None:
    if ids is None:
        raise ValueError(f"{name} is required")
    shape = _shape(ids)
    if len(shape) != 2:
        raise ValueError(f"{name} must have shape [batch, length], got {shape}")
    if shape[0] == 0:
        raise ValueError(f"{name} has no rows (a batch of 0); give at least one sequence")
    if shape[1] == 0:
        raise ValueError(f"{name} is empty along the sequence axis; need at least one token")
    if not np.issubdtype(np.asarray(ids).dtype if _concrete(ids) else ids.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if _concrete(ids):
        values = np.asarray(ids)
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{name} holds token id {bad}; valid ids lie in [0, {vocab_size})")


def check_mask(mask: Any, like_shape: tuple[int, ...], name: str, like: str) -> None:
    if mask is None:
        return
    if _shape(mask) != tuple(like_shape):
        raise ValueError(f"{name} has shape {_shape(mask)} but {like} has shape {tuple(like_shape)}; they must match")
    if _concrete(mask):
        values = np.asarray(mask)
        if not np.isin(values, (0, 1)).all():
            raise ValueError(f"{name} must hold only 0 (padding) and 1 (token)")


def check_embeds(embeds: Any, cfg: ModelConfig, name: str) -> None:
    shape = _shape(embeds)
    if len(shape) != 3 or shape[-1] != cfg.d_model or shape[1] == 0:
        raise ValueError(f"{name} must have shape [batch, length, {cfg.d_model}], got {shape}")


def check_length(length: int, cfg: ModelConfig, name: str) -> None:
    """Absolute position schemes have a table of ``max_positions`` rows; beyond it JAX would clamp."""
    if cfg.position in ("learned", "sinusoidal") and length > cfg.max_positions:
        raise ValueError(
            f"{name} has length {length} but {cfg.name!r} has {cfg.max_positions} positions "
            f"({cfg.position}); valid lengths are 1..{cfg.max_positions}")


def check_positions(position_ids: Any, shape: tuple[int, ...], cfg: ModelConfig, name: str = "position_ids") -> None:
    if position_ids is None:
        return
    if _shape(position_ids) != tuple(shape):
        raise ValueError(f"{name} has shape {_shape(position_ids)}; expected {tuple(shape)}")
    if _concrete(position_ids):
        values = np.asarray(position_ids)
        limit = cfg.max_positions if cfg.position in ("learned", "sinusoidal") else None
        if values.min() < 0 or (limit is not None and values.max() >= limit):
            raise ValueError(f"{name} holds {int(values.min())}..{int(values.max())}; valid positions lie in "
                             f"[0, {limit if limit is not None else 'inf'})")


def check_token_types(token_type_ids: Any, shape: tuple[int, ...], cfg: ModelConfig) -> None:
    if token_type_ids is None:
        return
    if cfg.xl is not None and cfg.xl.segments:  # XLNet compares types for equality only: any non-negative ids
        if _shape(token_type_ids) != tuple(shape):
            raise ValueError(f"token_type_ids has shape {_shape(token_type_ids)} but input_ids has shape {tuple(shape)}")
        if _concrete(token_type_ids) and np.asarray(token_type_ids).min() < 0:
            raise ValueError("token_type_ids must be non-negative segment ids")
        return
    if cfg.vision is not None and cfg.vision.bidirectional_images:  # Gemma 3: 1 marks an image token, 0 text
        if _shape(token_type_ids) != tuple(shape):
            raise ValueError(f"token_type_ids has shape {_shape(token_type_ids)} but input_ids has shape "
                             f"{tuple(shape)}")
        if _concrete(token_type_ids) and not np.isin(np.asarray(token_type_ids), (0, 1)).all():
            raise ValueError("token_type_ids mark image tokens (1) among text (0); they hold other values")
        return
    if not cfg.embeddings.types:
        raise ValueError(f"token_type_ids given but {cfg.name!r} has no token-type embeddings (type_vocab_size=0)")
    if _shape(token_type_ids) != tuple(shape):
        raise ValueError(f"token_type_ids has shape {_shape(token_type_ids)} but input_ids has shape {tuple(shape)}")
    if _concrete(token_type_ids):
        values = np.asarray(token_type_ids)
        if values.min() < 0 or values.max() >= cfg.embeddings.types:
            raise ValueError(f"token_type_ids hold {int(values.min())}..{int(values.max())}; valid types lie in "
                             f"[0, {cfg.embeddings.types})")


def check_memory(memory: Any, cfg: ModelConfig, batch: int) -> None:
    """A Transformer-XL memory must be one this model made for this batch: [L, B, M, D] hidden states."""
    if memory is None:
        return
    if cfg.position != "xl":
        raise ValueError(f"memory given but {cfg.name!r} is not a Transformer-XL model (position={cfg.position!r}); "
                         "only position='xl' models carry a segment memory")
    if not isinstance(memory, Memory):
        raise ValueError(f"memory must be a jaxformer.cache.Memory (out.memory of the previous segment, or "
                         f"model.init_memory(batch)), got {type(memory).__name__}")
    L, B, M, D = _shape(memory.hidden)
    if (L, B, D) != (cfg.decoder_layers, batch, cfg.d_model) or _shape(memory.valid) != (batch, M):
        raise ValueError(f"memory holds hidden states {_shape(memory.hidden)} and validity {_shape(memory.valid)}; this "
                         f"model and batch need [{cfg.decoder_layers}, {batch}, M, {cfg.d_model}] and [{batch}, M]")


def check_prefix_lengths(prefix_lengths: Any, cfg: ModelConfig, batch: int, length: int) -> None:
    if cfg.attention != "prefix":
        if prefix_lengths is not None:
            raise ValueError(f"prefix_lengths given but {cfg.name!r} uses attention={cfg.attention!r}, not 'prefix'")
        return
    if prefix_lengths is None:
        raise ValueError("attention='prefix' needs prefix_lengths: an int array [batch] of bidirectional prefix sizes")
    if _shape(prefix_lengths) != (batch,):
        raise ValueError(f"prefix_lengths has shape {_shape(prefix_lengths)}; expected ({batch},)")
    if _concrete(prefix_lengths):
        values = np.asarray(prefix_lengths)
        if values.min() < 0 or values.max() > length:
            raise ValueError(f"prefix_lengths hold {int(values.min())}..{int(values.max())}; valid: 0..{length}")


def segment_problem(cfg: ModelConfig) -> str | None:
    """Why documents cannot be packed into one row of ``cfg``'s model (None: they can): what would carry
    one document's tokens into another's."""
    if cfg.position == "xl":
        return "Transformer-XL's segment memory carries every token of a row into the next call"
    if cfg.attention == "prefix":
        return "attention='prefix' has one bidirectional prefix a row, not one a document"
    if cfg.conv is not None:
        return "DeBERTa v2's convolution beside the first layer mixes neighbouring tokens across documents"
    if cfg.scores.compressed is not None:
        return "DeepSeek-V4's compressors pool blocks of tokens across documents, numbered by index in the row"
    if cfg.nope is not None and cfg.nope.temperature_floor_scale is not None:
        return "Llama 4's attention temperature counts each token's index in the row, not in its document"
    return None


def check_segments(segment_ids: Any, shape: tuple[int, ...], cfg: ModelConfig, name: str = "segment_ids") -> None:
    """Packed documents: an int array of the stream's [batch, length], 1, 2, ... per document (each one run of
    tokens) and 0 on padding."""
    if segment_ids is None:
        return
    problem = segment_problem(cfg)
    if problem:
        raise ValueError(f"{name} given but {cfg.name!r} cannot pack documents: {problem}")
    if _shape(segment_ids) != tuple(shape):
        raise ValueError(f"{name} has shape {_shape(segment_ids)}; expected {tuple(shape)} (one id a token)")
    if not np.issubdtype(np.asarray(segment_ids).dtype if _concrete(segment_ids) else segment_ids.dtype, np.integer):
        raise ValueError(f"{name} must hold integer document ids (1, 2, ... per document, 0 on padding), got dtype "
                         f"{segment_ids.dtype}")
    if not _concrete(segment_ids):
        return
    values = np.asarray(segment_ids)
    if values.min() < 0:
        raise ValueError(f"{name} holds {int(values.min())}; valid ids are 0 (padding) and 1, 2, ... (documents)")
    for row, ids in enumerate(values):
        runs = ids[np.concatenate([[True], ids[1:] != ids[:-1]])]
        documents = runs[runs > 0]
        if len(np.unique(documents)) != len(documents):
            repeated = int(next(d for d in documents if (documents == d).sum() > 1))
            raise ValueError(f"{name} row {row}: document {repeated} appears in two separate runs of tokens; each "
                             "document must be one run (give the later one another id)")


def check_inputs(cfg: ModelConfig, input_ids, inputs_embeds, attention_mask, position_ids=None, token_type_ids=None,
                 names=("input_ids", "attention_mask")) -> tuple[int, int]:
    """Every host-side check of one token stream; returns its (batch, length)."""
    ids_name, mask_name = names
    if inputs_embeds is not None:
        if input_ids is not None:
            raise ValueError(f"give either {ids_name} or its embeddings, not both")
        check_embeds(inputs_embeds, cfg, ids_name.replace("input_ids", "inputs_embeds"))
        shape = tuple(inputs_embeds.shape[:2])
    else:
        check_ids(input_ids, cfg.token_rows, ids_name)
        shape = tuple(input_ids.shape)
    check_mask(attention_mask, shape, mask_name, ids_name)
    check_positions(position_ids, shape, cfg)
    check_token_types(token_type_ids, shape, cfg)
    check_length(shape[1], cfg, ids_name)
    return shape


def require_text(text: str | None, flag: str) -> None:
    """Text a command was given to read: empty or only whitespace is refused (a model would still
    answer, from its special tokens alone, an answer about nothing). None means not given."""
    if text is not None and not text.strip():
        raise ValueError(f"{flag}={text!r} is empty; give some text")


def check_position_streams(cfg: ModelConfig, position_ids: Any, input_ids: Any, inputs_embeds: Any) -> bool:
    """Whether ``position_ids`` are M-RoPE's three streams [3, B, T] (a model with ``rope_sections``), checked;
    any other position_ids are left to ``check_inputs``."""
    if position_ids is None or len(_shape(position_ids)) != 3 or cfg.rotary is None or cfg.rotary.sections is None:
        return False
    given = input_ids if input_ids is not None else inputs_embeds
    want = (3, *_shape(given)[:2])
    if _shape(position_ids) != want:
        raise ValueError(f"position_ids has shape {_shape(position_ids)}; M-RoPE's three streams (temporal, height, "
                         f"width) are {want} (transformers' packed form [4, B, T], text positions first for its "
                         "masks, is not taken: pass its last three)")
    if _concrete(position_ids) and np.asarray(position_ids).min() < 0:
        raise ValueError("position_ids must be non-negative")
    return True


VIDEO_INPUTS = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def refuse_videos(inputs: dict) -> None:
    """Qwen2.5-VL's video inputs, refused by name: jaxformer reads its images only."""
    videos = [name for name in VIDEO_INPUTS if name in inputs]
    if videos:
        raise ValueError(f"{', '.join(videos)}: videos are not supported; jaxformer's vision-language models read "
                         "images (pixel_values, with image_grid_thw for Qwen2.5-VL)")
