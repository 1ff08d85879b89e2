"""Generation under jit: one prefill, then a ``jax.lax.while_loop`` of cached decode steps.

This module holds the loop, the samplers, beam search and the host-side API, and nothing of a model's
forward pass: it calls the family's ``init_cache`` and ``step`` (and an encoder-decoder's ``encode``)
and moves the state they return, whatever its type (``jaxformer.cache``), reordering it for beams with
the state's own ``reorder``. The cache is preallocated for prompt + new tokens and written in place;
visibility follows positions, so left padding, sliding windows, prefix-LM and alternating layers need
nothing here. Greedy, sampling (temperature, top-k, top-p) and beam search follow transformers'
semantics; greedy and beam search are token-identical to it.

``generate_tokens(graphdef, state, input_ids, attention_mask, key, config)`` is the pure form (jit,
shard or vmap it yourself); ``generate(model, ...)`` validates on the host, runs the compiled loop and
trims the output the way transformers does.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import checks, kernels
from jaxformer.cache import DecodeState, cache_numbers, linear_state_bytes
from jaxformer.model_config import ModelConfig
from jaxformer.layers import EncoderOutput, left_padded_positions
from jaxformer.layers.projector import features_per_image

Array = jax.Array
NEG = -1.0e9  # transformers' "very large negative" for beam bookkeeping

TRACE_COUNT = {"generate": 0}  # incremented each time the loop is traced (tests check it stays put)


class _FromTheModel:
    """The default of a token-id argument: the model's own setting. Passing None instead means none, as
    an explicit None does in transformers' generate (no EOS: run to max_new_tokens)."""

    def __repr__(self) -> str:
        return "<the model's>"


FROM_MODEL = _FromTheModel()
# The token ids a checkpoint sets for generation; transformers' generate() uses them unless given.
GENERATION_IDS = ("eos_token_id", "pad_token_id", "bos_token_id", "decoder_start_token_id", "forced_bos_token_id",
                  "forced_eos_token_id", "bad_words_ids")
# ... and every generation default a checkpoint sets that generate() applies: the ids and one switch
CHECKPOINT_SETTINGS = (*GENERATION_IDS, "renormalize_logits")


def generation_defaults(model) -> dict[str, Any]:
    """The token ids generate() uses when not given, as transformers' generation_config holds them for a
    loaded checkpoint: its generation_config.json when it had one (config.json's ids then play no part),
    else the ids its config.json itself spells out (not the config class's defaults; a decoder
    sub-config's where the top level has none); a model built here, its ModelConfig's ids. Ids outside
    the vocabulary (tiny test files) could never be emitted and are left out."""
    cfg: ModelConfig = model.config
    saved, hf = getattr(model, "generation_config", None), getattr(model, "hf_config", None)
    if saved:
        source = json.loads(saved)
    elif hf:
        source = json.loads(hf)
        inner = next((source[k] for k in ("decoder", "generator", "text_config")
                      if isinstance(source.get(k), dict)), {})
        source = {k: inner.get(k) if source.get(k) is None else source[k] for k in CHECKPOINT_SETTINGS}
    else:
        flat = cfg.to_flat()
        source = {k: flat.get(k) for k in GENERATION_IDS}

    def in_vocab(value):
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], (list, tuple)):  # bad_words_ids
            return tuple(tuple(int(i) for i in seq) for seq in value if all(0 <= i < cfg.vocab_size for i in seq)) or None
        if isinstance(value, (list, tuple)):
            return tuple(int(i) for i in value if 0 <= i < cfg.vocab_size) or None
        return value if value is None or 0 <= value < cfg.vocab_size else None

    return {**{k: in_vocab(source.get(k)) for k in GENERATION_IDS},
            "renormalize_logits": bool(source.get("renormalize_logits") or False)}


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 32
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    decoder_start_token_id: int | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None
    bad_token_ids: tuple[int, ...] = ()  # single-token bad_words_ids (Marian's pad), never chosen
    renormalize_logits: bool = False  # log-softmax after the processors (Marian's beams score so)
    # Whisper's rules (transformers' SuppressTokens, SuppressTokensAtBegin and WhisperTimeStamp processors, in its
    # order, after the ones above): tokens never chosen, tokens not chosen first, and with ``no_timestamps_token_id``
    # set the timestamp rules over the tokens above it (None: no timestamps); ``max_initial_timestamp_index`` bounds
    # the first timestamp (None: unbounded)
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    no_timestamps_token_id: int | None = None
    max_initial_timestamp_index: int | None = None
    # Drafting (``_drafted``): an assistant model proposes up to ``num_assistant_tokens`` a round ("heuristic":
    # transformers' schedule adapts how many, within that bound), or n-grams of the text so far propose up to
    # ``prompt_lookup_num_tokens``; 0: no drafting
    num_assistant_tokens: int = 0
    num_assistant_tokens_schedule: str = "constant"  # also "heuristic" (transformers'), "adaptive" (below)
    prompt_lookup_num_tokens: int = 0
    max_matching_ngram_size: int = 2
    # "adaptive": each round drafts the count among ``draft_counts`` (0: a plain step) that emits the most tokens
    # per unit of time, from the acceptance measured so far and these costs, in plain target steps: one
    # assistant step, and each token a verifying step runs past the first (``measure_draft_costs``)
    draft_costs: tuple[float, float] = ()
    # an encoder-decoder assistant reads the target's encoding of the source rather than its own (its encoder is the
    # target's, checked by ``check_shared_encoder``: distil-whisper's use)
    assistant_shares_encoder: bool = False

    @property
    def draft_tokens(self) -> int:
        """How many drafted tokens one target step verifies at most (0: no drafting)."""
        return self.num_assistant_tokens or self.prompt_lookup_num_tokens

    @property
    def draft_counts(self) -> tuple[int, ...]:
        """The draft counts a round may choose among, each its own compiled verify width: the adaptive
        schedule's plain step (0), powers of two below the bound and the bound; otherwise the bound (the
        heuristic drafts fewer within that width), and for prompt lookup a plain step where nothing matched."""
        K = self.draft_tokens
        if self.num_assistant_tokens_schedule == "adaptive":
            return (0, *sorted({2 ** i for i in range(K.bit_length()) if 2 ** i < K} | {K}))
        return (K,) if self.num_assistant_tokens else (0, K)

    def validate(self, cfg: ModelConfig) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} must be an integer >= 1")
        if not isinstance(self.num_beams, int) or self.num_beams < 1:
            raise ValueError(f"num_beams={self.num_beams!r} must be an integer >= 1")
        if self.do_sample:
            if self.num_beams > 1:
                raise ValueError("do_sample=True with num_beams > 1 (beam sampling) is not supported")
            if not 0 < self.temperature < float("inf"):
                raise ValueError(f"temperature={self.temperature!r} must be a finite number > 0 when sampling")
            if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
                raise ValueError(f"top_k={self.top_k!r} must be an integer >= 1")
            if self.top_p is not None and not 0 < self.top_p <= 1:
                raise ValueError(f"top_p={self.top_p!r} must lie in (0, 1]")
        else:  # as transformers: sampling settings without sampling are ignored, with a warning
            unused = {"temperature": self.temperature if self.temperature != 1.0 else None, "top_k": self.top_k,
                      "top_p": self.top_p if self.top_p != 1.0 else None}
            for name, value in unused.items():
                if value is not None:
                    warnings.warn(f"do_sample is not set, so {name}={value!r} is ignored (it is only used when "
                                  f"sampling); set do_sample=True or leave {name} out", UserWarning, stacklevel=4)
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"early_stopping={self.early_stopping!r}; valid: True, False, 'never'")
        for eos in self.eos_token_ids:  # first: the pad id defaults to it
            if not 0 <= eos < cfg.vocab_size:
                raise ValueError(f"eos_token_id={eos} must lie in [0, {cfg.vocab_size})")
        for name in ("pad_token_id", "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < cfg.vocab_size:
                raise ValueError(f"{name}={value} must lie in [0, {cfg.vocab_size})")
        for name in ("bad_token_ids", "suppress_tokens", "begin_suppress_tokens"):
            for bad in getattr(self, name):
                if not 0 <= bad < cfg.vocab_size:
                    raise ValueError(f"{'bad_words_ids' if name == 'bad_token_ids' else name} holds {bad}, which "
                                     f"must lie in [0, {cfg.vocab_size})")
        if self.no_timestamps_token_id is not None:
            if not 0 <= self.no_timestamps_token_id < cfg.vocab_size - 1:
                raise ValueError(f"no_timestamps_token_id={self.no_timestamps_token_id} must lie in [0, "
                                 f"{cfg.vocab_size - 1}): the timestamp tokens follow it")
            if len(self.eos_token_ids) != 1:
                raise ValueError(f"the timestamp rules need one eos_token_id (text tokens lie below it), got "
                                 f"{list(self.eos_token_ids)}")
        if self.max_initial_timestamp_index is not None and (
                isinstance(self.max_initial_timestamp_index, bool) or not isinstance(
                    self.max_initial_timestamp_index, int) or self.max_initial_timestamp_index < 0):
            raise ValueError(f"max_initial_timestamp_index={self.max_initial_timestamp_index!r} must be an "
                             "integer >= 0")
        if cfg.head != "lm":
            raise ValueError(f"generation needs an LM head; {cfg.name!r} has head={cfg.head!r}")
        for name in ("num_assistant_tokens", "prompt_lookup_num_tokens", "max_matching_ngram_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (
                    name == "max_matching_ngram_size" and value < 1):
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        schedules = ("constant", "heuristic", "adaptive") if self.num_assistant_tokens else ("constant", "adaptive")
        if self.num_assistant_tokens_schedule not in schedules:
            source = "an assistant" if self.num_assistant_tokens else "prompt lookup"
            raise ValueError(f"num_assistant_tokens_schedule={self.num_assistant_tokens_schedule!r}; valid with "
                             f"{source}: {', '.join(map(repr, schedules))}")
        if self.num_assistant_tokens_schedule == "adaptive" and self.draft_tokens:
            costs = self.draft_costs
            if len(costs) != 2 or not all(isinstance(c, float) and 0 <= c < float("inf") for c in costs):
                raise ValueError(f"draft_costs={costs!r}: the adaptive schedule needs (assistant step, each verified "
                                 "token past the first) as two finite floats >= 0 in plain target steps "
                                 "(measure_draft_costs gives them; generate() measures them itself)")
        if self.assistant_shares_encoder and (not self.num_assistant_tokens or cfg.family != "encoder_decoder"):
            raise ValueError("assistant_shares_encoder is for an encoder-decoder's assistant_model")
        if self.draft_tokens and self.num_beams > 1:
            raise ValueError("drafting (assistant_model or prompt_lookup_num_tokens) verifies one sequence per row; "
                             "it does not combine with beam search (num_beams > 1)")
        if self.draft_tokens and cfg.position == "xl":
            raise ValueError(f"{cfg.name!r} carries a Transformer-XL memory window, which cannot be rewound past "
                             "rejected drafts; generate without assistant_model / prompt_lookup_num_tokens")
        if self.draft_tokens and cfg.scores.compressed is not None:
            raise ValueError(f"{cfg.name!r} has compressed-attention layers (compressed_layers), whose compressors' "
                             "state cannot be rewound past rejected drafts; generate without assistant_model / "
                             "prompt_lookup_num_tokens")
        if self.draft_tokens and cfg.linear_attention is not None:
            raise ValueError(f"{cfg.name!r} has linear-attention layers, whose recurrent state cannot be rewound past "
                             "rejected drafts; generate without assistant_model / prompt_lookup_num_tokens")


# --------------------------------------------------------------------------------------------------
# Choosing tokens


def process_logits(scores: Array, step: Array, max_steps: int, gc: GenerationConfig,
                   first_tokens: Array | None = None, history: Array | None = None) -> Array:
    """Bad words, then forced BOS/EOS, then Whisper's suppressed tokens and timestamp rules, then renormalisation
    (transformers' NoBadWords, ForcedBOS, ForcedEOSTokenLogitsProcessor, SuppressTokensAtBegin, SuppressTokens,
    WhisperTimeStamp and LogitNormalization, in its order) on [rows, V] scores. ``first_tokens`` [rows]: each row's
    own forced first token instead of one forced BOS (a batch translated into several languages at once, each row's
    target language token first). ``history`` [rows, >= step]: the tokens each row chose so far (the timestamp rules
    read them)."""
    vocab = scores.shape[-1]
    if gc.bad_token_ids:
        scores = jnp.where(jnp.isin(jnp.arange(vocab), jnp.asarray(gc.bad_token_ids)), -jnp.inf, scores)
    first = gc.forced_bos_token_id if first_tokens is None else first_tokens  # one id, or one per row
    if first is not None:
        forced = jnp.where(jnp.arange(vocab) == jnp.asarray(first)[..., None], 0.0, -jnp.inf)
        scores = jnp.where(step == 0, forced, scores)
    if gc.forced_eos_token_id is not None:
        forced = jnp.where(jnp.arange(vocab) == gc.forced_eos_token_id, 0.0, -jnp.inf)
        scores = jnp.where(step == max_steps - 1, forced, scores)
    if gc.begin_suppress_tokens:
        banned = jnp.isin(jnp.arange(vocab), jnp.asarray(gc.begin_suppress_tokens))
        scores = jnp.where(banned & (step == 0), -jnp.inf, scores)
    if gc.suppress_tokens:
        scores = jnp.where(jnp.isin(jnp.arange(vocab), jnp.asarray(gc.suppress_tokens)), -jnp.inf, scores)
    if gc.no_timestamps_token_id is not None:
        scores = timestamp_rules(scores, step, gc, history)
    if gc.renormalize_logits:  # transformers' LogitNormalization, the last processor
        scores = jax.nn.log_softmax(scores, axis=-1)
    return scores


def timestamp_rules(scores: Array, step: Array, gc: GenerationConfig, history: Array) -> Array:
    """transformers' WhisperTimeStampLogitsProcessor on [rows, V] scores, from each row's tokens so far ``history``
    [rows, >= step] (those after the prompt): <|notimestamps|> never; timestamps come in pairs (after a pair, text;
    after a lone timestamp, a timestamp or EOS) and never go back (not below the last one, nor repeat it but as the
    pair's second); the first token is a timestamp, at most the ``max_initial_timestamp_index``-th; and where the
    timestamps together are likelier than the likeliest text token, a timestamp is chosen."""
    vocab, begin = scores.shape[-1], gc.no_timestamps_token_id + 1
    ids, column = jnp.arange(vocab), jnp.arange(history.shape[1])
    scores = jnp.where(ids == gc.no_timestamps_token_id, -jnp.inf, scores)
    is_time = (history >= begin) & (column < step)
    last = jnp.take_along_axis(is_time, jnp.full((history.shape[0], 1), jnp.maximum(step - 1, 0)), 1)[:, 0]
    last = last & (step >= 1)
    before = jnp.take_along_axis(is_time, jnp.full((history.shape[0], 1), jnp.maximum(step - 2, 0)), 1)[:, 0]
    before = before | (step < 2)  # a first timestamp counts as the second of a pair
    banned = (last & before)[:, None] & (ids >= begin) | (last & ~before)[:, None] & (ids < gc.eos_token_ids[0])
    latest = jnp.max(jnp.where(is_time, column, -1), axis=1)  # the last timestamp's column (-1: none)
    latest_id = jnp.take_along_axis(history, jnp.maximum(latest, 0)[:, None], 1)[:, 0]
    lowest = jnp.where(latest < 0, begin, latest_id + jnp.where(last & ~before, 0, 1))
    banned |= (ids >= begin) & (ids < lowest[:, None])
    scores = jnp.where(banned, -jnp.inf, scores)
    first = ids < begin
    if gc.max_initial_timestamp_index is not None:
        first |= ids > begin + gc.max_initial_timestamp_index
    scores = jnp.where(first & (step == 0), -jnp.inf, scores)
    logprobs = jax.nn.log_softmax(scores.astype(jnp.float32), axis=-1)
    times = jax.nn.logsumexp(jnp.where(ids >= begin, logprobs, -jnp.inf), axis=-1)
    text = jnp.max(jnp.where(ids < begin, logprobs, -jnp.inf), axis=-1)
    return jnp.where((times > text)[:, None] & (ids < begin), -jnp.inf, scores)


def warp_logits(logits: Array, gc: GenerationConfig) -> Array:
    """Temperature, then top-k, then top-p (nucleus) filtering of [..., V] logits: what a draw is made from.

    The logits are shifted so the largest is 0 before dividing by the temperature (the distribution is
    unchanged): a temperature so small that logits / T would overflow to Inf (and then NaN) draws the
    greedy token instead."""
    shape = logits.shape
    logits = logits.reshape(-1, shape[-1])
    logits = (logits - jnp.max(logits, axis=-1, keepdims=True)) / gc.temperature
    top_p = 1.0 if gc.top_p is None else gc.top_p
    if gc.top_k is not None or top_p < 1.0:
        rows = logits.shape[0]
        logits = filter_top_k_top_p(logits, jnp.full(rows, gc.top_k or 0, jnp.int32),
                                    jnp.full(rows, top_p, jnp.float32))
    return logits.reshape(shape)


# How many of a row's likeliest tokens top-k/top-p filtering looks at first, then next, before it sorts the whole
# vocabulary (the only exact way to a nucleus wider than those): 32 rows of gpt2's 50,257 logits at top-p 0.9 filter
# in 13 ms where the nucleus is tens of tokens, 94 ms where it is about 2,000, 562 ms where it spans most of the row,
# against 400-470 ms sorting every row (XLA:CPU; benchmarks/sampling.py)
NUCLEUS_CANDIDATES = (256, 4096)


def filter_top_k_top_p(logits: Array, top_k: Array, top_p: Array) -> Array:
    """Logits [B, V] at -inf outside each row's ``top_k`` [B] likeliest (0: off; those tied with the k-th stay, as
    transformers' ``TopKLogitsWarper``), then outside its ``top_p`` [B] nucleus (1: off): transformers'
    ``TopPLogitsWarper`` removes a token whose ascending cumulative probability (stable order: of tied tokens the
    lower id counts as less likely) is at most 1 - top_p, that is, whose likelier tokens' probability is at least
    top_p; the likeliest always stays.
    Each row is filtered among its ``NUCLEUS_CANDIDATES`` likeliest tokens where those decide it (the k-th among
    them, the nucleus within them and no tie across their edge), else among more, else over the whole sorted row; a
    row's result does not depend on the others' (a batch sorts only when some row needs it)."""
    B, V = logits.shape
    sizes = [size for size in NUCLEUS_CANDIDATES if size < V]

    def among(level: int) -> Array:
        if level == len(sizes):  # the whole row, by a stable ascending sort read backwards
            ids = jnp.argsort(logits, axis=-1)[:, ::-1].astype(jnp.int32)
            return _filter_candidates(logits, top_k, top_p, ids, jnp.full(B, -jnp.inf, logits.dtype), True)[0]
        # (the likeliest logit past them, for a tie across the edge, as the maximum of the rest: XLA:CPU runs a
        # top-k whose outputs are sliced as a whole sort)
        ids = jax.lax.top_k(logits, sizes[level])[1]
        edge = jnp.max(logits.at[jnp.arange(B)[:, None], ids].set(-jnp.inf), axis=-1)
        filtered, decided = _filter_candidates(logits, top_k, top_p, ids, edge)
        return jax.lax.cond(jnp.all(decided), lambda: filtered,
                            lambda: jnp.where(decided[:, None], filtered, among(level + 1)))

    return among(0)


def _filter_candidates(logits: Array, top_k: Array, top_p: Array, ids: Array, edge: Array,
                       ordered: bool = False) -> tuple[Array, Array]:
    """``filter_top_k_top_p`` decided among the candidates ``ids`` [B, K] (a row's K likeliest; K = V: all), where
    ``edge`` [B] is the likeliest logit outside them (-inf: none); ``ordered``: the ids are already in the order
    below. Returns the filtered logits and, per row, whether the candidates decided it (a row that was not is
    filtered again among more)."""
    B, V = logits.shape
    K = ids.shape[1]
    values = jnp.take_along_axis(logits, ids, axis=-1)
    if not ordered:  # the likeliest first, of tied ones the higher id first (the stable ascending order reversed)
        negated, ids = jax.lax.sort((-values, -ids), num_keys=2)
        values, ids = -negated, -ids
    limited = (top_k > 0)[:, None]
    kth = jnp.take_along_axis(values, jnp.clip(top_k - 1, 0, K - 1)[:, None], axis=-1)
    logits = jnp.where(limited & (logits < kth), -jnp.inf, logits)
    probs = jnp.exp(jnp.where(limited & (values < kth), -jnp.inf, values)
                    - jax.nn.logsumexp(logits, axis=-1, keepdims=True))
    cumulative = jnp.cumsum(probs, axis=-1)
    above = jnp.concatenate([jnp.zeros((B, 1), probs.dtype), cumulative[:, :-1]], axis=-1)  # likelier tokens' mass
    nucleus = (above < top_p[:, None]).at[:, 0].set(True)
    kept = jnp.zeros((B, V), bool).at[jnp.arange(B)[:, None], ids].set(nucleus)
    narrowed = (top_p < 1)[:, None]
    filtered = jnp.where(narrowed & ~kept, -jnp.inf, logits)
    # decided: the k-th is among the candidates, and nothing past them could stay: none is finite, top-k removed
    # them, or the nucleus ends within the candidates with no tie across the edge
    past_edge_removed = (edge == -jnp.inf) | (limited[:, 0] & (edge < kth[:, 0])) | (
        (cumulative[:, -1] >= top_p) & (values[:, -1] > edge))
    decided = (top_k <= K) & (~narrowed[:, 0] | past_edge_removed)
    return filtered, decided


def sample_logits(logits: Array, key: Array, gc: GenerationConfig) -> Array:
    """A categorical draw [...] from ``warp_logits`` of [..., V] logits."""
    return jax.random.categorical(key, warp_logits(logits, gc), axis=-1)


def _choose(logits: Array, step, key: Array, gc: GenerationConfig, first_tokens: Array | None = None,
            history: Array | None = None) -> Array:
    """The next token [B] from a step's logits [B, V]: processed, then sampled or the most likely."""
    scores = process_logits(logits, step, gc.max_new_tokens, gc, first_tokens, history)
    if gc.do_sample:
        return sample_logits(scores, key, gc).astype(jnp.int32)
    return jnp.argmax(scores, axis=-1).astype(jnp.int32)


def _is_eos(tokens: Array, gc: GenerationConfig) -> Array:
    if not gc.eos_token_ids:
        return jnp.zeros(tokens.shape, bool)
    return jnp.isin(tokens, jnp.asarray(gc.eos_token_ids))


# --------------------------------------------------------------------------------------------------
# The loops


def _prefill_inputs(model, input_ids: Array, attention_mask: Array, gc: GenerationConfig, batch_repeat: int,
                    max_new_tokens: int, decoder_input_ids: Array | None = None, input_features: Array | None = None,
                    encoded: EncoderOutput | None = None) -> tuple[Array, Array, Array, DecodeState]:
    """The first step's inputs (decoder ids, their positions and validity) and the empty state it
    runs over, every row repeated ``batch_repeat`` times (beams). An encoder-decoder's prefill runs its decoder
    prompt ``decoder_input_ids`` [B, P] (default: the decoder start token alone) over the encoding of input_ids,
    or of ``input_features`` (an audio encoder: Whisper, whose input_ids and attention_mask are then None), or
    reads the source ``encoded`` already (an assistant sharing the target's encoder)."""
    cfg: ModelConfig = model.config
    rep = lambda a: None if a is None else jnp.repeat(a, batch_repeat, axis=0)  # noqa: E731
    if cfg.family == "encoder_decoder":
        if encoded is None:
            encoded = (model.encode(input_features=input_features) if input_features is not None
                       else model.encode(input_ids, attention_mask.astype(jnp.int32)))
        source = jax.tree.map(rep, encoded)
        rows = source.hidden.shape[0]
        ids = (jnp.full((rows, 1), gc.decoder_start_token_id, jnp.int32) if decoder_input_ids is None
               else rep(decoder_input_ids).astype(jnp.int32))
        # the last chosen token is never fed back
        state = model.init_cache(source, ids.shape[1] + max_new_tokens - 1, gc.draft_tokens)
        positions = jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)
        return ids, positions, jnp.ones_like(ids, bool), state
    mask = attention_mask.astype(jnp.int32)
    positions = left_padded_positions(mask)
    prefix = jnp.sum(mask, axis=1) if cfg.attention == "prefix" else None
    ids = rep(input_ids)
    state = model.init_cache(ids.shape[0], ids.shape[1] + max_new_tokens - 1, rep(prefix), gc.draft_tokens)
    return ids, rep(positions), rep(mask.astype(bool)), state


def _for_the_loop(model, state):
    """The model and decode state a loop of many cached steps runs: ``model.for_decode_loop()`` and, where
    that runs the layers apart (CPU), the state's caches as each layer's own arrays (``DecodeState.per_layer``)."""
    return model.for_decode_loop(), state.per_layer() if kernels.unstack_decode_loops() else state


def _images(pixel_values: Array | None, rows: int, batch_repeat: int, token_type_ids: Array | None = None,
            image_grid_thw: tuple | None = None, cross_inputs: dict | None = None) -> dict[str, Array]:
    """The prefill's images (LLaVA), in row order; each row's (under beams the same number a row: ``prepare``
    checks) repeated ``batch_repeat`` times as its row is, and so the rows' ``token_type_ids`` (Gemma 3's image
    tokens). Decode steps read none. Qwen2.5-VL's patches with their grids ``image_grid_thw`` come repeated for
    beams already (``beam_images``)."""
    types = {} if token_type_ids is None else {"token_type_ids": jnp.repeat(token_type_ids, batch_repeat, axis=0)}
    # Llama 3.2 Vision's (``CROSS_INPUTS``): a row's each, repeated as the row is
    types.update({name: jnp.repeat(value, batch_repeat, axis=0) for name, value in (cross_inputs or {}).items()})
    if pixel_values is None:
        return types
    if image_grid_thw is not None:
        return {"pixel_values": pixel_values, "image_grid_thw": image_grid_thw, **types}
    if batch_repeat == 1:
        return {"pixel_values": pixel_values, **types}
    per_row = pixel_values.reshape(rows, -1, *pixel_values.shape[1:])
    return {"pixel_values": jnp.repeat(per_row, batch_repeat, axis=0).reshape(-1, *pixel_values.shape[1:]), **types}


def _greedy_or_sample(model, input_ids, attention_mask, key, gc: GenerationConfig, first_tokens=None,
                      pixel_values=None, token_type_ids=None, image_grid_thw=None, cross_inputs=None,
                      decoder_input_ids=None, input_features=None):
    N = gc.max_new_tokens
    ids, positions, valid, state = _prefill_inputs(model, input_ids, attention_mask, gc, 1, N, decoder_input_ids,
                                                   input_features)
    B = ids.shape[0]
    logits, state = model.step(ids, positions, valid, state,
                               **_images(pixel_values, B, 1, token_type_ids, image_grid_thw, cross_inputs))
    next_position = positions[:, -1] + 1
    looping, state = _for_the_loop(model, state)  # the one-off prefill keeps the scanned stack (faster to compile)
    choose = lambda logits, step, key, tokens: _choose(logits, step, key, gc, first_tokens, tokens)  # noqa: E731
    key, sub = jax.random.split(key)
    tokens = jnp.full((B, N), gc.pad_token_id, jnp.int32)
    first = choose(logits, 0, sub, tokens)
    tokens = tokens.at[:, 0].set(first)
    finished = _is_eos(first, gc)
    bad = first_non_finite(jnp.int32(-1), logits, 0)

    def cond(carry):
        step, _, _, _, finished, _, _ = carry
        return (step < N) & ~jnp.all(finished)

    def body(carry):
        step, state, tokens, previous, finished, key, bad = carry
        logits, state = looping.step(previous[:, None], (next_position + step - 1)[:, None], jnp.ones((B, 1), bool),
                                     state)
        key, sub = jax.random.split(key)
        token = jnp.where(finished, gc.pad_token_id, choose(logits, step, sub, tokens))
        tokens = jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None], step, axis=1)
        return step + 1, state, tokens, token, finished | _is_eos(token, gc), key, first_non_finite(bad, logits, step)

    carry = (jnp.int32(1), state, tokens, first, finished, key, bad)
    steps, _, tokens, _, _, _, bad = jax.lax.while_loop(cond, body, carry)
    return tokens, steps, bad


def first_non_finite(bad: Array, logits: Array, step) -> Array:
    """The first step whose logits held NaN or Inf (-1 while none has): the host refuses such output
    rather than return the token 0 that argmax makes of NaN."""
    return jnp.where((bad < 0) & ~jnp.all(jnp.isfinite(logits)), jnp.int32(step), bad)


def _gather_beams(x: Array, indices: Array) -> Array:
    """x [B, beams, ...] gathered along the beam axis by indices [B, kept]."""
    return jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), axis=1)


def _beam_search(model, input_ids, attention_mask, gc: GenerationConfig, first_tokens=None, pixel_values=None,
                 token_type_ids=None, image_grid_thw=None, cross_inputs=None, decoder_input_ids=None,
                 input_features=None):
    """transformers' vectorised beam search (length penalty, early stopping True/False/'never')."""
    nb, N = gc.num_beams, gc.max_new_tokens
    ids, positions, valid, state = _prefill_inputs(model, input_ids, attention_mask, gc, nb, N, decoder_input_ids,
                                                   input_features)
    B = ids.shape[0] // nb
    logits, state = model.step(ids, positions, valid, state,
                               **_images(pixel_values, B, nb, token_type_ids, image_grid_thw, cross_inputs))
    next_position = positions[:, -1] + 1
    looping, state = _for_the_loop(model, state)
    keep = max(2, 1 + len(gc.eos_token_ids)) * nb
    top_mask = jnp.arange(keep) < nb
    fill = gc.pad_token_id or (gc.eos_token_ids[0] if gc.eos_token_ids else gc.pad_token_id)
    lp = gc.length_penalty
    first_tokens = None if first_tokens is None else jnp.repeat(first_tokens, nb)

    state = dict(
        step=jnp.int32(0), logits=logits, decode_state=state,
        running=jnp.full((B, nb, N), fill, jnp.int32),
        running_scores=jnp.zeros((B, nb), jnp.float32).at[:, 1:].set(NEG),
        sequences=jnp.full((B, nb, N), fill, jnp.int32),
        scores=jnp.full((B, nb), NEG, jnp.float32),
        lengths=jnp.zeros((B, nb), jnp.int32),
        finished=jnp.zeros((B, nb), bool),
        improvable=jnp.ones((B, 1), bool),
        going=jnp.bool_(True),
        bad=jnp.int32(-1),
    )

    def body(s):
        step = s["step"]
        V = s["logits"].shape[-1]
        bad = first_non_finite(s["bad"], s["logits"], step)
        log_probs = process_logits(jax.nn.log_softmax(s["logits"], axis=-1), step, N, gc, first_tokens,
                                   s["running"].reshape(B * nb, N)).reshape(B, nb, V)
        log_probs = (log_probs + s["running_scores"][:, :, None]).reshape(B, nb * V)
        top_scores, top_index = jax.lax.top_k(log_probs, keep)
        source_beam, token = top_index // V, (top_index % V).astype(jnp.int32)
        candidates = _gather_beams(s["running"], source_beam).at[:, :, step].set(token)
        hits = _is_eos(token, gc) | (step + 1 >= N)

        # The best `nb` candidates that did not stop keep running.
        running_scores_k = top_scores + hits.astype(jnp.float32) * NEG
        next_index = jax.lax.top_k(running_scores_k, nb)[1]
        running = _gather_beams(candidates, next_index)
        running_scores = _gather_beams(running_scores_k, next_index)
        parents = _gather_beams(source_beam, next_index)

        # Candidates among the top `nb` that stopped join the finished set if they beat it.
        just_finished = hits & top_mask[None, :]
        finish_scores = top_scores / ((step + 1).astype(jnp.float32) ** lp)
        full = jnp.all(s["finished"], axis=-1, keepdims=True) & (gc.early_stopping is True)
        finish_scores += full.astype(jnp.float32) * NEG + (~s["improvable"]).astype(jnp.float32) * NEG
        finish_scores += (~just_finished).astype(jnp.float32) * NEG
        merged_scores = jnp.concatenate([s["scores"], finish_scores], axis=1)
        best = jax.lax.top_k(merged_scores, nb)[1]
        sequences = _gather_beams(jnp.concatenate([s["sequences"], candidates], axis=1), best)
        scores = _gather_beams(merged_scores, best)
        lengths = _gather_beams(jnp.concatenate([s["lengths"], jnp.full((B, keep), step + 1)], axis=1), best)
        finished = _gather_beams(jnp.concatenate([s["finished"], just_finished], axis=1), best)

        step = step + 1
        best_length = N if (gc.early_stopping == "never" and lp > 0) else step
        best_possible = running_scores[:, :1] / (jnp.asarray(best_length, jnp.float32) ** lp)
        worst_finished = jnp.where(finished, jnp.min(scores, axis=1, keepdims=True), NEG)
        improvable = s["improvable"] & jnp.any(best_possible > worst_finished, axis=-1, keepdims=True)
        going = (jnp.any(improvable) & ~(jnp.all(finished) & (gc.early_stopping is True)) & ~jnp.all(hits)
                 & (step < N))

        def advance(state):
            rows = (jnp.arange(B)[:, None] * nb + parents).reshape(-1)
            return looping.step(running[:, :, step - 1].reshape(-1, 1), (next_position + step - 1)[:, None],
                                jnp.ones((B * nb, 1), bool), state.reorder(rows))

        logits, state = jax.lax.cond(going, advance, lambda state: (s["logits"], state), s["decode_state"])
        return dict(step=step, logits=logits, decode_state=state, running=running, running_scores=running_scores,
                    sequences=sequences, scores=scores, lengths=lengths, finished=finished, improvable=improvable,
                    going=going, bad=bad)

    final = jax.lax.while_loop(lambda s: s["going"], body, state)
    return final["sequences"][:, 0], jnp.max(final["lengths"][:, 0]), final["bad"]


# --------------------------------------------------------------------------------------------------
# Drafting: speculative decoding (an assistant model) and prompt lookup


def _in_vocabulary(logits: Array, vocab: int) -> Array:
    """An assistant's logits over the target's vocabulary: ids the target lacks are cut (a larger padded
    table), ids the assistant lacks are never proposed (-inf)."""
    own = logits.shape[-1]
    if own >= vocab:
        return logits[..., :vocab]
    return jnp.pad(logits, [(0, 0)] * (logits.ndim - 1) + [(0, vocab - own)], constant_values=-jnp.inf)


def _shifted(a: Array, by: int, fill) -> Array:
    """a [B, W] moved left by ``by`` columns (a[:, j + by] at j), ``fill`` past the end."""
    return jnp.pad(a[:, by:], ((0, 0), (0, by)), constant_values=fill) if by else a


def lookup_drafts(text: Array, known: Array, length: Array, count: int, ngram: int) -> tuple[Array, Array]:
    """Prompt lookup, as transformers' PromptLookupCandidateGenerator chooses: the longest n-gram (at most
    ``ngram`` tokens) ending the text so far, ``text[:, :length]``, that occurs earlier in it; its first
    occurrence's next ``count`` tokens (fewer where the text ends) are the drafts. ``known`` marks real
    tokens (a padded prompt's pads never match). Returns drafts [B, count] and how many are real [B]."""
    B, W = text.shape
    column = jnp.arange(W)
    start = jnp.full((B,), -1, jnp.int32)  # where the continuation begins (-1: no match yet)
    for size in range(ngram, 0, -1):  # the longest match wins
        tail = jax.lax.dynamic_slice_in_dim(text, length - size, size, axis=1)
        tail_known = jnp.all(jax.lax.dynamic_slice_in_dim(known, length - size, size, axis=1), axis=1) & (length > size)
        match = column[None] + size < length  # something follows the occurrence (so it is not the tail itself)
        for i in range(size):
            match &= (_shifted(text, i, -1) == tail[:, i:i + 1]) & _shifted(known, i, False)
        found = jnp.any(match, axis=1) & tail_known & (start < 0)
        start = jnp.where(found, jnp.argmax(match, axis=1) + size, start)
    drafts = jnp.take_along_axis(text, jnp.clip(start[:, None] + jnp.arange(count), 0, W - 1), axis=1)
    real = jnp.where(start >= 0, jnp.minimum(count, length - start), 0)
    return drafts, real.astype(jnp.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _DraftingCarry:
    """What one drafting round hands the next: the ``while_loop`` carry of ``_drafted``."""
    step: Array  # tokens emitted so far (the next one's column of the output)
    state: DecodeState  # the target's cache: every token before the last one emitted
    assistant_state: DecodeState | None  # the assistant's: every token before the last two (None: prompt lookup)
    pair: Array  # [B, 2] the last two tokens emitted: the assistant's round runs both, the target's the second
    text: Array  # [B, C + N + K + 1] the prompt (an encoder-decoder's source), then what was emitted
    known: Array  # [B, C + N + K + 1] which of ``text`` are real tokens (not padding, not yet written)
    finished: Array  # [B] rows that emitted an EOS
    drafts_now: Array  # how many drafts the assistant proposes this round (the heuristic schedule moves it)
    kept: Array  # the adaptive schedule's evidence, decayed each round it drafts: drafts kept, and rounds that
    lost: Array  # ended on a rejected draft (a draft is then kept with probability kept / (kept + lost))
    plain_run: Array  # rounds since the adaptive schedule last drafted
    key: Array
    bad: Array  # the first step whose logits were not finite (-1: none)
    rounds: Array  # target steps taken after the prefill


@dataclasses.dataclass(frozen=True)
class _Drafting:
    """What every round of one drafted generation shares (fixed for the loop, so not carried)."""
    target: Any  # the target's decode-loop form
    assistant: Any  # the assistant's decode-loop form; None: prompt lookup drafts
    gc: GenerationConfig
    vocab: int  # the target's
    next_position: Array  # [B] the position of the first emitted token
    prompt_columns: int  # C: where the emitted tokens start in ``text``
    first_tokens: Array | None  # each row's forced first token (``process_logits``)

    def history(self, text: Array) -> Array | None:
        """The tokens emitted so far from ``text`` (then drafts written after them), which the timestamp rules read
        (None without them)."""
        return None if self.gc.no_timestamps_token_id is None else text[:, self.prompt_columns:]


# The adaptive schedule: how fast its evidence fades (a prompt's easy and hard stretches differ), the evidence
# it starts from (a draft kept half the time), and after how many plain rounds it drafts once to look again
EVIDENCE_DECAY, PRIOR_KEPT, PRIOR_LOST, PROBE_AFTER = 0.9, 1.0, 1.0, 16


def _assistant_choice(logits: Array, at, key: Array, gc: GenerationConfig, vocab: int,
                      history: Array | None = None) -> tuple[Array, Array | None]:
    """The assistant's draft [B] from its logits over the target's vocabulary, processed as the target's
    are (``history``: the tokens before it, for the timestamp rules), and (sampling) the distribution q [B, V] it
    was drawn from."""
    scores = process_logits(_in_vocabulary(logits, vocab), at, gc.max_new_tokens, gc, None, history)
    if gc.do_sample:
        warped = warp_logits(scores, gc)
        return jax.random.categorical(key, warped, axis=-1).astype(jnp.int32), jax.nn.softmax(warped, axis=-1)
    return jnp.argmax(scores, axis=-1).astype(jnp.int32), None


def _draft_from_assistant(run: _Drafting, carry: _DraftingCarry, key: Array, count: int):
    """``count`` cached assistant steps in one scan: the first runs the last two tokens emitted, each next one
    the draft before it (the heuristic schedule: only the first ``carry.drafts_now`` of them run). Returns
    drafts [B, count], their probabilities q [B, count, V] (sampling; else None) and the assistant's state."""
    gc, step, B = run.gc, carry.step, carry.pair.shape[0]
    keys = jax.random.split(key, count)
    pair_positions = (run.next_position + step - 2)[:, None] + jnp.arange(2)
    logits, a_state = run.assistant.step(carry.pair, pair_positions, jnp.ones((B, 2), bool), carry.assistant_state)
    history = run.history(carry.text)
    first, first_q = _assistant_choice(logits, step, keys[0], gc, run.vocab, history)

    def one_more(loop, j):
        a_state, token, q, history = loop
        if history is not None:  # the draft before this one, for the timestamp rules
            history = jax.lax.dynamic_update_slice_in_dim(history, token[:, None], step + j - 1, axis=1)
        logits, a_state = run.assistant.step(token[:, None], (run.next_position + step - 1 + j)[:, None],
                                             jnp.ones((B, 1), bool), a_state)
        token, q = _assistant_choice(logits, step + j, keys[j], gc, run.vocab, history)
        return (a_state, token, q, history), (token, q)

    def maybe_one_more(loop, j):  # the heuristic's count moves at run time within the compiled width
        return jax.lax.cond(j < carry.drafts_now, one_more, lambda loop, j: (loop, loop[1:3]), loop, j)

    more = maybe_one_more if gc.num_assistant_tokens_schedule == "heuristic" else one_more
    (a_state, *_), (tokens, qs) = jax.lax.scan(more, (a_state, first, first_q, history), jnp.arange(1, count))
    drafts = jnp.concatenate([first[:, None], tokens.T], axis=1)
    probs = None if first_q is None else jnp.concatenate([first_q[:, None], qs.transpose(1, 0, 2)], axis=1)
    return drafts, probs, a_state


def _chosen_count(run: _Drafting, carry: _DraftingCarry, matched: Array | None) -> Array:
    """Which of ``gc.draft_counts`` this round drafts (an index). Prompt lookup without matches (``matched``,
    the most drafts any row found, is 0) takes a plain step. The adaptive schedule takes the count whose
    expected tokens, 1 + a + ... + a^k for a draft kept with probability a, over its cost in plain steps (k
    assistant steps, a verifying step k tokens wider) is highest, a plain step when none beats one; after
    PROBE_AFTER plain rounds it drafts once, which is all that can show the acceptance has risen."""
    gc, counts = run.gc, jnp.asarray(run.gc.draft_counts)
    if len(gc.draft_counts) == 1:
        return jnp.int32(0)
    can_draft = jnp.bool_(True) if matched is None else matched > 0
    if gc.num_assistant_tokens_schedule != "adaptive":  # prompt lookup, constant: (0, K)
        return can_draft.astype(jnp.int32)
    assistant_cost, verify_cost = gc.draft_costs
    if run.assistant is None:
        assistant_cost = 0.0
    usable = counts if matched is None else jnp.minimum(counts, matched)
    kept = carry.kept / (carry.kept + carry.lost)
    powers = kept ** jnp.arange(gc.draft_tokens + 1)
    expected = jnp.sum(jnp.where(jnp.arange(gc.draft_tokens + 1) <= usable[:, None], powers, 0.0), axis=1)
    # a plain round still runs the assistant once, over the token it has not seen
    cost = 1.0 + counts * verify_cost + jnp.maximum(counts, 1) * assistant_cost
    best = jnp.argmax(expected / cost).astype(jnp.int32)
    probe = (best == 0) & (carry.plain_run >= PROBE_AFTER) & can_draft
    return jnp.where(probe, 1, best)


def _target_scores(run: _Drafting, step: Array, state: DecodeState, last: Array, drafts: Array,
                   history: Array | None = None):
    """The target's one step over ``last`` [B] and ``drafts`` [B, W - 1]: processed scores [B, W, V] (column
    i's choose the token after the i-th token fed: ``last``, then the drafts; ``history``: the tokens emitted, for
    the timestamp rules), its state, and whether every logit was finite."""
    B, width = drafts.shape[0], drafts.shape[1] + 1
    fed = jnp.concatenate([last[:, None], drafts], axis=1)
    logits, state = run.target.step(fed, (run.next_position + step - 1)[:, None] + jnp.arange(width),
                                    jnp.ones((B, width), bool), state, every_position=True)
    at = step + jnp.arange(width)
    if history is not None:  # the drafts follow the tokens emitted; column i's rules read those before it
        history = jax.lax.dynamic_update_slice_in_dim(history, drafts, step, axis=1)
    process = lambda sc, t: process_logits(sc, t, run.gc.max_new_tokens, run.gc, run.first_tokens,  # noqa: E731
                                           history)
    scores = jax.vmap(process, in_axes=(1, 0), out_axes=1)(logits, at)
    return scores, state, jnp.all(jnp.isfinite(logits))


def _accept_greedy(scores: Array, drafts: Array) -> tuple[Array, Array]:
    """Greedy acceptance: a draft [B, W - 1] is kept where it is the target's own choice; a row stopping at
    column i emits the target's choice there. Returns what is kept and the token per stopping column [B, W]."""
    own = jnp.argmax(scores, axis=-1).astype(jnp.int32)
    return drafts == own[:, :-1], own


def _accept_sampled(scores: Array, drafts: Array, q: Array | None, real: Array, key: Array,
                    gc: GenerationConfig) -> tuple[Array, Array]:
    """Speculative sampling: a draft x is kept with probability min(1, p(x) / q(x)); a row stopping at a
    rejected draft emits a draw from max(0, p - q) renormalised (p where that is all 0), past the drafts a
    draw from p. A lookup draft (``q`` None, a point mass) is kept when the target's own draw equals it.
    Returns what is kept [B, W - 1] and the token per stopping column [B, W], as ``_accept_greedy``."""
    keys = jax.random.split(key, 3)
    warped = warp_logits(scores, gc)
    own = jax.random.categorical(keys[0], warped, axis=-1).astype(jnp.int32)
    if q is None:
        return drafts == own[:, :-1], own
    drafted = jnp.arange(drafts.shape[1]) < real[:, None]
    p = jax.nn.softmax(warped, axis=-1)
    q = q[:, :drafts.shape[1]]
    ratio = (jnp.take_along_axis(p[:, :-1], drafts[..., None], -1)
             / jnp.take_along_axis(q, drafts[..., None], -1))[..., 0]
    accept = jax.random.uniform(keys[1], ratio.shape) < ratio
    residual = jnp.maximum(p[:, :-1] - q, 0.0)
    total = jnp.sum(residual, axis=-1, keepdims=True)
    residual = jnp.where(total > 0, residual / jnp.where(total > 0, total, 1.0), p[:, :-1])
    corrected = jax.random.categorical(keys[2], jnp.log(residual), axis=-1).astype(jnp.int32)
    return accept, own.at[:, :-1].set(jnp.where(drafted, corrected, own[:, :-1]))


def _verify(width: int, run: _Drafting, step, state, last, drafts, real, q, key, history=None):
    """The target's step over ``last`` and the first ``width - 1`` drafts, judged by the acceptance rule: each
    row's count of drafts kept before its first rejected one [B], the token it emits if it stops at each column
    [B, K + 1], the state, and whether every logit was finite."""
    gc = run.gc
    drafts = drafts[:, :width - 1]
    scores, state, finite = _target_scores(run, step, state, last, drafts, history)
    if gc.do_sample:
        accept, stop = _accept_sampled(scores, drafts, q, real, key, gc)
    else:
        accept, stop = _accept_greedy(scores, drafts)
    accept &= jnp.arange(width - 1) < real[:, None]
    accepted = jnp.sum(jnp.cumprod(accept, axis=1), axis=1).astype(jnp.int32)
    stop = jnp.pad(stop, ((0, 0), (0, gc.draft_tokens + 1 - width)), constant_values=gc.pad_token_id)
    return accepted, stop, state, finite


def _emitted(n: Array, accepted: Array, drafts: Array, stop: Array, pad: int) -> tuple[Array, Array, Array]:
    """A round's n + 1 tokens per row [B, K + 1] (padded after), rows advancing together by n drafts: the n
    drafts, then at column n the row's own next draft where it accepted more, else the target's token there.
    Also that last token [B] and which columns are emitted [K + 1]."""
    B = drafts.shape[0]
    column = jnp.arange(drafts.shape[1] + 1)
    emitting = column <= n
    drafts = jnp.pad(drafts, ((0, 0), (0, 1)), constant_values=pad)
    at_n = jnp.where(accepted > n, drafts[:, n], jnp.take_along_axis(stop, jnp.full((B, 1), n), 1)[:, 0])
    emitted = jnp.where(column < n, drafts, at_n[:, None])
    return jnp.where(emitting, emitted, pad), at_n, emitting


def _ended(emitted: Array, emitting: Array, n: Array, finished: Array,
           gc: GenerationConfig) -> tuple[Array, Array, Array]:
    """Where a round's tokens end rows: what is written to the text [B, K + 1] (padded from a row's EOS on, and
    for rows finished before), the rows finished now, and how far the output advances (n + 1 tokens; once every
    row has finished, only as far as the last row needed)."""
    eos = _is_eos(emitted, gc) & emitting & ~finished[:, None]
    after_eos = (jnp.cumsum(eos, axis=1) - eos) > 0
    shown = jnp.where(finished[:, None] | after_eos, gc.pad_token_id, emitted)
    ended = jnp.any(eos, axis=1)
    now_finished = finished | ended
    needed = jnp.where(finished, 0, jnp.where(ended, jnp.argmax(eos, axis=1) + 1, n + 1))
    return shown, now_finished, jnp.where(jnp.all(now_finished), jnp.max(needed), n + 1)


def _round_of(count: int, run: _Drafting, carry: _DraftingCarry, looked_up: Array | None, matches: Array | None,
              draft_key: Array, verify_key: Array):
    """Draft ``count`` tokens (0: none, a plain step) and verify them with one target step ``count + 1`` wide.
    Returns each row's count of drafts kept [B], the token it emits if it stops at each column [B, K + 1], the
    drafts [B, K], the target's and the assistant's states, whether every logit was finite, and how many drafts
    every unfinished row had (the acceptance the adaptive schedule learns from)."""
    B, K = carry.pair.shape[0], run.gc.draft_tokens
    q, a_state = None, carry.assistant_state
    if run.assistant is None:
        drafts, real = looked_up[:, :count], jnp.minimum(matches, count)
    elif count:
        drafts, q, a_state = _draft_from_assistant(run, carry, draft_key, count)
        real = jnp.full((B,), jnp.minimum(carry.drafts_now, count), jnp.int32)
    else:  # a plain step; the assistant still takes the older of the last two tokens, to stay one behind
        drafts, real = jnp.zeros((B, 0), jnp.int32), jnp.zeros((B,), jnp.int32)
        position = (run.next_position + carry.step - 2)[:, None]
        _, a_state = run.assistant.step(carry.pair[:, :1], position, jnp.ones((B, 1), bool), a_state)
    accepted, stop, state, finite = _verify(count + 1, run, carry.step, carry.state, carry.pair[:, 1], drafts, real,
                                            q, verify_key, run.history(carry.text))
    drafted = jnp.min(jnp.where(carry.finished, count, real))
    return accepted, stop, jnp.pad(drafts, ((0, 0), (0, K - count))), state, a_state, finite, drafted


def _drafting_round(run: _Drafting, carry: _DraftingCarry) -> _DraftingCarry:
    """One round: choose how many to draft, draft, verify the drafts with the target's step, accept, rewind both
    caches past what was rejected (only the slots this round wrote), append what was emitted."""
    gc, step = run.gc, carry.step
    K = gc.draft_tokens
    key, draft_key, verify_key = jax.random.split(carry.key, 3)
    looked_up = matches = None
    if run.assistant is None:
        looked_up, matches = lookup_drafts(carry.text, carry.known, run.prompt_columns + step, K,
                                           gc.max_matching_ngram_size)
    chosen = _chosen_count(run, carry, None if matches is None else jnp.max(jnp.where(carry.finished, 0, matches)))
    rounds = [functools.partial(_round_of, count, run) for count in gc.draft_counts]
    operands = (carry, looked_up, matches, draft_key, verify_key)
    accepted, stop, drafts, state, a_state, finite, drafted = (
        rounds[0](*operands) if len(rounds) == 1 else jax.lax.switch(chosen, rounds, *operands))

    n = jnp.min(jnp.where(carry.finished, K, accepted))  # accept: every unfinished row accepted at least n drafts
    emitted, at_n, emitting = _emitted(n, accepted, drafts, stop, gc.pad_token_id)
    shown, finished, advance = _ended(emitted, emitting, n, carry.finished, gc)

    state = state.rewind(carry.state.kv.index + n + 1, K + 1)  # rewind: everything before the last token emitted
    if a_state is not None:  # everything before the last two
        a_state = a_state.rewind(carry.assistant_state.kv.index + n + 1, K + 1)

    at = run.prompt_columns + step  # append
    last = carry.pair[:, 1]
    previous = jnp.take_along_axis(emitted, jnp.full((emitted.shape[0], 1), jnp.maximum(n - 1, 0)), 1)[:, 0]
    before = jnp.where(n > 0, previous, last)  # the next round's pair: the last two tokens emitted
    drafts_now = carry.drafts_now
    if gc.num_assistant_tokens_schedule == "heuristic":  # transformers': +2 after a full round, else -1
        drafts_now = jnp.where(n == drafts_now, jnp.minimum(drafts_now + 2, K), jnp.maximum(drafts_now - 1, 1))
    observed = drafted > 0  # the adaptive schedule's evidence: n kept of `drafted`, and whether one was rejected
    decay = jnp.where(observed, EVIDENCE_DECAY, 1.0)
    return _DraftingCarry(
        step=step + advance, state=state, assistant_state=a_state, pair=jnp.stack([before, at_n], axis=1),
        text=jax.lax.dynamic_update_slice_in_dim(carry.text, shown, at, axis=1),
        known=jax.lax.dynamic_update_slice_in_dim(carry.known, jnp.broadcast_to(emitting, shown.shape), at, axis=1),
        finished=finished, drafts_now=drafts_now,
        kept=carry.kept * decay + jnp.where(observed, jnp.minimum(n, drafted), 0),
        lost=carry.lost * decay + (observed & (n < drafted)),
        plain_run=jnp.where(observed, 0, carry.plain_run + 1), key=key,
        bad=jnp.where((carry.bad < 0) & ~finite, step, carry.bad), rounds=carry.rounds + 1)


def _drafted(model, assistant, input_ids, attention_mask, key, gc: GenerationConfig, first_tokens=None,
             decoder_input_ids=None, input_features=None):
    """Greedy or sampled decoding that emits several tokens per target step: a round drafts K tokens (the
    ``assistant``'s own cached greedy or sampled steps, or, with ``assistant`` None, prompt lookup), the
    target's ``step`` runs its last token and the K drafts at once (the same step that decodes one token,
    with every position's logits), keeps the drafts it agrees with and adds its own next token, and both
    caches are rewound past what it rejected (``_drafting_round``). Greedy output is plain greedy's;
    sampling accepts a draft with probability min(1, p/q) and otherwise draws from max(0, p - q)
    (speculative sampling; a lookup draft, q a point mass, is accepted when the target's own draw equals
    it), so every token is drawn from the target's distribution. Rows of a batch advance together by the
    fewest any unfinished row accepted.

    The target's cache holds every token before the last one emitted; the assistant's every token before
    the last two, which open its next round (so a round whose drafts were all accepted needs no extra
    assistant step for the last of them). Returns tokens, steps and bad step as ``_greedy_or_sample`` does,
    and the number of target steps taken after the prefill (rounds). An encoder-decoder's ``decoder_input_ids`` and
    ``input_features`` are ``_prefill_inputs``'; with ``gc.assistant_shares_encoder`` the source is encoded once,
    by the target."""
    N, K = gc.max_new_tokens, gc.draft_tokens
    inputs = dict(decoder_input_ids=decoder_input_ids, input_features=input_features)
    encoded = None
    if gc.assistant_shares_encoder:
        encoded = (model.encode(input_features=input_features) if input_features is not None
                   else model.encode(input_ids, attention_mask.astype(jnp.int32)))
    ids, positions, valid, state = _prefill_inputs(model, input_ids, attention_mask, gc, 1, N + K, **inputs,
                                                   encoded=encoded)
    B = ids.shape[0]
    logits, state = model.step(ids, positions, valid, state)

    # The text drafts look up and results are written to: the prompt (an encoder-decoder's source; none for audio),
    # then what was emitted; room for one round past max_new_tokens.
    C = 0 if input_ids is None else input_ids.shape[1]
    text = jnp.full((B, C + N + K + 1), gc.pad_token_id, jnp.int32)
    known = jnp.zeros((B, C + N + K + 1), bool)
    if input_ids is not None:
        text, known = text.at[:, :C].set(input_ids.astype(jnp.int32)), known.at[:, :C].set(attention_mask.astype(bool))
    key, sub = jax.random.split(key)
    first = _choose(logits, 0, sub, gc, first_tokens, text[:, C:] if gc.no_timestamps_token_id is not None else None)
    a_state = None
    if assistant is not None:
        a_ids, a_positions, a_valid, a_state = _prefill_inputs(assistant, input_ids, attention_mask, gc, 1, N + K,
                                                               **inputs, encoded=encoded)
        _, a_state = assistant.step(a_ids, a_positions, a_valid, a_state)
        a_state = a_state.rewind(a_state.kv.index - 1)  # its last prompt token opens the first round

    looping, state = _for_the_loop(model, state)
    drafting = None
    if assistant is not None:
        drafting, a_state = _for_the_loop(assistant, a_state)
    run = _Drafting(target=looping, assistant=drafting, gc=gc, vocab=model.config.vocab_size,
                    next_position=positions[:, -1] + 1, prompt_columns=C, first_tokens=first_tokens)
    carry = _DraftingCarry(
        step=jnp.int32(1), state=state, assistant_state=a_state, pair=jnp.stack([ids[:, -1], first], axis=1),
        text=text.at[:, C].set(first), known=known.at[:, C].set(True), finished=_is_eos(first, gc),
        drafts_now=jnp.int32(K), kept=jnp.float32(PRIOR_KEPT), lost=jnp.float32(PRIOR_LOST), plain_run=jnp.int32(0),
        key=key, bad=first_non_finite(jnp.int32(-1), logits, 0), rounds=jnp.int32(0))
    going = lambda carry: (carry.step < N) & ~jnp.all(carry.finished)  # noqa: E731
    carry = jax.lax.while_loop(going, functools.partial(_drafting_round, run), carry)
    steps = jnp.minimum(carry.step, N)
    tokens = jnp.where(jnp.arange(N) < steps, carry.text[:, C:C + N], gc.pad_token_id)
    return tokens, steps, carry.bad, carry.rounds


def generate_tokens(graphdef, state, input_ids: Array, attention_mask: Array, key: Array,
                    config: GenerationConfig, first_tokens: Array | None = None, pixel_values: Array | None = None,
                    token_type_ids: Array | None = None, image_grid_thw: tuple | None = None,
                    cross_inputs: dict | None = None, decoder_input_ids: Array | None = None,
                    input_features: Array | None = None) -> tuple[Array, Array, Array]:
    """Pure generation: returns new tokens [B, max_new_tokens] (padded after EOS), how many columns
    are meaningful (transformers trims its output to that many), and the first step whose logits were
    not finite (-1: none; the tokens are then meaningless). Jit with ``static_argnames=("graphdef", "config")``.
    ``first_tokens`` [B]: each row's forced first token (``process_logits``). ``pixel_values``: the images of a
    decoder that reads them (LLaVA), read by the prefill alone (checked by ``prepare``), as are ``token_type_ids``
    (Gemma 3's image tokens), and Qwen2.5-VL's ``image_grid_thw`` (a tuple of (t, h, w) tuples, static: its tower
    lays out its windows on the host; with beams, images and grids repeated per beam: ``beam_images``). An
    encoder-decoder's ``decoder_input_ids`` [B, P]: its decoder prompt (default: the decoder start token), run by
    the prefill; ``input_features``: an audio encoder's input in place of input_ids and attention_mask (None)."""
    if config.draft_tokens:
        return drafted_tokens(graphdef, state, input_ids, attention_mask, key, config, first_tokens,
                              decoder_input_ids, input_features)[:3]
    TRACE_COUNT["generate"] += 1
    model = nnx.merge(graphdef, state)
    if config.num_beams > 1:
        return _beam_search(model, input_ids, attention_mask, config, first_tokens, pixel_values, token_type_ids,
                            image_grid_thw, cross_inputs, decoder_input_ids, input_features)
    return _greedy_or_sample(model, input_ids, attention_mask, key, config, first_tokens, pixel_values,
                             token_type_ids, image_grid_thw, cross_inputs, decoder_input_ids, input_features)


# Llama 3.2 Vision's image inputs beside pixel_values, each [B, ...]: read by the prefill alone
CROSS_INPUTS = ("aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask")


def loop_images(model, input_ids, gc: GenerationConfig, inputs: dict) -> dict:
    """``generate_tokens``' image arguments from ``prepare``'s keyword arguments ``inputs`` (checked there): arrays,
    Llama 3.2 Vision's as ``cross_inputs``; Qwen2.5-VL's grids static, its images repeated for beams here."""
    images = {name: jnp.asarray(inputs[name]) for name in ("pixel_values", "token_type_ids")
              if inputs.get(name) is not None}
    cross = {name: jnp.asarray(inputs[name]) for name in CROSS_INPUTS if inputs.get(name) is not None}
    if cross:
        images["cross_inputs"] = cross
    if inputs.get("image_grid_thw") is not None:
        pixels, grids = beam_images(input_ids, inputs["pixel_values"], inputs["image_grid_thw"], gc.num_beams,
                                    model.config)
        images.update(pixel_values=jnp.asarray(pixels), image_grid_thw=grids)
    return images

generate_tokens_jit = jax.jit(generate_tokens, static_argnames=("graphdef", "config", "image_grid_thw"))


def beam_images(input_ids, pixel_values, image_grid_thw, beams: int, cfg: ModelConfig) -> tuple[np.ndarray, tuple]:
    """Qwen2.5-VL's patches and grids with each row's images repeated ``beams`` times, as its row is (the k-th
    placeholder run of the batch is image k, its t * h * w / merge² tokens and its t * h * w patches)."""
    grid = np.asarray(image_grid_thw)
    patches = grid.prod(axis=1)
    tokens = patches // cfg.vision.tower.patches.merge ** 2
    row_ends = np.cumsum(np.sum(np.asarray(input_ids) == cfg.vision.image_token_id, axis=1))
    ends = np.searchsorted(np.cumsum(tokens), row_ends, side="right")  # each row's images end before this one
    starts, patch_ends = np.concatenate([[0], ends[:-1]]), np.concatenate([[0], np.cumsum(patches)])
    pixels = [np.asarray(pixel_values)[patch_ends[a]:patch_ends[b]]
              for a, b in zip(starts, ends) for _ in range(beams)]
    grids = [tuple(map(int, g)) for a, b in zip(starts, ends) for _ in range(beams) for g in grid[a:b]]
    return np.concatenate(pixels), tuple(grids)


def drafted_tokens(graphdef, state, input_ids: Array, attention_mask: Array, key: Array, config: GenerationConfig,
                   first_tokens: Array | None = None, decoder_input_ids: Array | None = None,
                   input_features: Array | None = None) -> tuple[Array, Array, Array, Array]:
    """``generate_tokens`` with drafting (``config.draft_tokens``), also returning how many target steps ran
    after the prefill: (new tokens) / (steps + 1) is the tokens a target step emits. With an assistant,
    ``graphdef, state`` split the pair ``(model, assistant)`` (``prepare`` does it)."""
    TRACE_COUNT["generate"] += 1
    merged = nnx.merge(graphdef, state)
    model, assistant = merged if config.num_assistant_tokens else (merged, None)
    return _drafted(model, assistant, input_ids, attention_mask, key, config, first_tokens, decoder_input_ids,
                    input_features)


drafted_tokens_jit = jax.jit(drafted_tokens, static_argnames=("graphdef", "config"))


# --------------------------------------------------------------------------------------------------
# The eager entry point


def _config_from_kwargs(model, kwargs: dict[str, Any]) -> GenerationConfig:
    """transformers' rules for the token ids: an argument left out takes the model's default
    (``generation_defaults``), an explicit None means none; no pad id pads with the first EOS; an
    encoder-decoder without a decoder start starts from BOS."""
    cfg: ModelConfig = model.config
    defaults = generation_defaults(model)
    given = {k: kwargs.pop(k) for k in CHECKPOINT_SETTINGS if k in kwargs}
    ids = {k: defaults[k] if given.get(k, FROM_MODEL) is FROM_MODEL else given[k] for k in CHECKPOINT_SETTINGS}
    eos = ids["eos_token_id"]
    eos_ids = tuple(int(e) for e in eos) if isinstance(eos, (tuple, list)) else (() if eos is None else (int(eos),))
    pad = ids["pad_token_id"]
    pad = (eos_ids[0] if eos_ids else 0) if pad is None else pad  # transformers' fallback: pad with EOS
    start = ids["decoder_start_token_id"]
    start = ids["bos_token_id"] if start is None else start
    if cfg.family == "encoder_decoder" and start is None:
        raise ValueError("encoder-decoder generation needs decoder_start_token_id or bos_token_id (in the "
                         "checkpoint or as an argument)")
    return GenerationConfig(eos_token_ids=eos_ids, pad_token_id=int(pad), decoder_start_token_id=_integer(start),
                            forced_bos_token_id=_integer(ids["forced_bos_token_id"]),
                            forced_eos_token_id=_integer(ids["forced_eos_token_id"]),
                            bad_token_ids=_bad_tokens(ids["bad_words_ids"], eos_ids),
                            renormalize_logits=bool(ids["renormalize_logits"]), **kwargs)


def checkpoint_config(model, **settings) -> GenerationConfig:
    """A validated GenerationConfig of ``settings`` (its fields, and the token ids of ``CHECKPOINT_SETTINGS``),
    the checkpoint's ids where not given, as ``prepare`` builds it (Whisper's generate builds its own so)."""
    gc = _config_from_kwargs(model, settings)
    gc.validate(model.config)
    return gc


def _bad_tokens(bad_words_ids, eos_ids: tuple[int, ...]) -> tuple[int, ...]:
    """transformers' ``bad_words_ids`` (a list of token sequences) as the tokens never to choose; as its
    NoBadWordsLogitsProcessor, a bad word that is an EOS id is dropped. Sequences of more than one token (banned
    only after their prefix) are refused: jaxformer bans single tokens."""
    if bad_words_ids is None:
        return ()
    if (not isinstance(bad_words_ids, (list, tuple)) or not bad_words_ids
            or not all(isinstance(seq, (list, tuple)) and seq for seq in bad_words_ids)):
        raise ValueError(f"bad_words_ids={bad_words_ids!r} must be a non-empty list of non-empty lists of token ids")
    longer = [list(seq) for seq in bad_words_ids if len(seq) > 1]
    if longer:
        raise ValueError(f"bad_words_ids holds sequences of more than one token ({longer[:3]}); only single-token "
                         "bad words are supported (pass bad_words_ids=None to generate without them)")
    tokens = [_integer(seq[0]) for seq in bad_words_ids]
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ValueError(f"bad_words_ids={bad_words_ids!r} must hold integer token ids")
    return tuple(sorted({t for t in tokens if t not in eos_ids}))


def prepare(model, input_ids, attention_mask=None, *, max_new_tokens: int = 32, do_sample: bool = False,
            temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, num_beams: int = 1,
            length_penalty: float = 1.0, early_stopping: bool | str = False, eos_token_id=FROM_MODEL,
            pad_token_id=FROM_MODEL, decoder_start_token_id=FROM_MODEL, forced_bos_token_id=FROM_MODEL,
            forced_eos_token_id=FROM_MODEL, bad_words_ids=FROM_MODEL, renormalize_logits=FROM_MODEL, seed: int = 0,
            allow_beyond_max_positions: bool = False, assistant_model=None, num_assistant_tokens: int | None = None,
            num_assistant_tokens_schedule: str | None = None, prompt_lookup_num_tokens: int | None = None,
            max_matching_ngram_size: int | None = None, draft_costs: tuple[float, float] | None = None,
            pixel_values=None, token_type_ids=None, image_grid_thw=None, aspect_ratio_ids=None,
            aspect_ratio_mask=None, cross_attention_mask=None, decoder_input_ids=None, mm_token_type_ids=None
            ) -> tuple[tuple, GenerationConfig]:
    """Validate everything on the host and return the arguments of ``generate_tokens`` (after the
    static config) and the config. Nothing is traced, compiled or allocated here, but for the adaptive
    drafting schedule's one measurement of its costs on this device (``measure_draft_costs``, once per shape).

    The token ids (``eos_token_id``, an int or a list; ``pad_token_id``, ``decoder_start_token_id``,
    ``forced_bos_token_id``, ``forced_eos_token_id``, and ``bad_words_ids``, single tokens never chosen) and
    ``renormalize_logits`` left out are the checkpoint's (``generation_defaults``);
    None turns one off, as in transformers. Integer arguments may be numpy integers. Prompt + new tokens
    beyond the model's position table, or beyond ``max_positions`` for rotary (but dynamic NTK) and
    relative models unless ``allow_beyond_max_positions``, are refused, and so is a KV cache larger than
    the memory free on the device.

    Drafting, as transformers' assisted generation: ``assistant_model`` (a jaxformer model of the same family
    and tokenizer, usually smaller) drafts up to ``num_assistant_tokens`` tokens a round (default 5), or up to
    ``prompt_lookup_num_tokens`` tokens are drafted from the longest n-gram match (up to
    ``max_matching_ngram_size``, default 2) in the prompt and the text so far. The target verifies a round's
    drafts in one step; greedy output is unchanged, sampled output is drawn from the target's distribution.
    How many a round drafts, ``num_assistant_tokens_schedule``: 'adaptive' (the default) chooses each round
    from the acceptance so far and the costs of drafting measured on this device (or given, ``draft_costs``),
    taking plain steps while drafting does not pay, so that drafting is never much slower than plain decoding;
    'constant' always drafts the bound (prompt lookup: wherever a match is found); 'heuristic' (an assistant
    only) is transformers' schedule, +2 after a round whose drafts were all kept, else -1. Sampled output
    under 'adaptive' depends on the costs (the random draws fall differently): pass ``draft_costs`` or
    'constant' to make it repeat across machines.

    ``pixel_values``: images for a decoder that reads them (LLaVA), checked here against the placeholders of
    ``input_ids``; they are not among the arguments handed back: pass them to ``generate_tokens`` as
    ``pixel_values=`` (its prefill reads them). Drafting does not take images. ``token_type_ids`` (Gemma 3: 1 on
    the image tokens, whose images then see themselves both ways in the prefill) go the same way, and so does
    ``image_grid_thw`` (Qwen2.5-VL: each image's patch grid, static; ``generate`` repeats images for beams; its
    processor's ``mm_token_type_ids`` are checked against the image tokens, then not read; ``loop_images``), and an
    encoder-decoder's ``decoder_input_ids`` [B, P]: the decoder prompt its prefill runs (default: the start token)."""
    cfg: ModelConfig = model.config
    if assistant_model is not None and prompt_lookup_num_tokens is not None:
        raise ValueError("pass assistant_model or prompt_lookup_num_tokens, not both: each is a way of drafting")
    if assistant_model is None and num_assistant_tokens is not None:
        raise ValueError("num_assistant_tokens counts an assistant's drafts: they need an assistant_model")
    if assistant_model is None and prompt_lookup_num_tokens is None and (
            num_assistant_tokens_schedule is not None or draft_costs is not None):
        raise ValueError("num_assistant_tokens_schedule and draft_costs need drafting (assistant_model or "
                         "prompt_lookup_num_tokens)")
    if prompt_lookup_num_tokens is None and max_matching_ngram_size is not None:
        raise ValueError("max_matching_ngram_size needs prompt_lookup_num_tokens")
    if assistant_model is not None:
        check_assistant(model, assistant_model)
    if pixel_values is not None and (cfg.family != "decoder" or cfg.vision is None):
        raise ValueError(f"pixel_values given to {cfg.name!r}, which reads no images")
    if pixel_values is not None and (assistant_model is not None or prompt_lookup_num_tokens is not None):
        raise ValueError("drafting (assistant_model, prompt_lookup_num_tokens) does not take images: generate with "
                         "pixel_values without it")
    integers = {name: _integer(value) for name, value in (("max_new_tokens", max_new_tokens), ("num_beams", num_beams),
                                                          ("top_k", top_k), ("seed", seed))}
    counts = {name: _integer(value) for name, value in (
        ("num_assistant_tokens", num_assistant_tokens), ("prompt_lookup_num_tokens", prompt_lookup_num_tokens),
        ("max_matching_ngram_size", max_matching_ngram_size))}
    for name, value in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    draft_source = assistant_model is not None or prompt_lookup_num_tokens is not None
    measure_costs = draft_source and num_assistant_tokens_schedule in (None, "adaptive") and draft_costs is None
    drafting = dict(  # transformers' default n-gram; a smaller draft count than its 20, verified in one step
        num_assistant_tokens=0 if assistant_model is None else counts["num_assistant_tokens"] or 5,
        num_assistant_tokens_schedule=num_assistant_tokens_schedule or ("adaptive" if draft_source else "constant"),
        # measured below, once everything else is known to be valid
        draft_costs=(0.0, 0.0) if measure_costs else () if draft_costs is None else tuple(
            float(c) if isinstance(c, (int, float)) and not isinstance(c, bool) else c for c in draft_costs),
        prompt_lookup_num_tokens=counts["prompt_lookup_num_tokens"] or 0,
        max_matching_ngram_size=counts["max_matching_ngram_size"] or 2)
    gc = _config_from_kwargs(model, dict(
        max_new_tokens=integers["max_new_tokens"], do_sample=do_sample, temperature=float(temperature),
        top_k=integers["top_k"], top_p=None if top_p is None else float(top_p), num_beams=integers["num_beams"],
        length_penalty=float(length_penalty), early_stopping=early_stopping, eos_token_id=eos_token_id,
        pad_token_id=pad_token_id, decoder_start_token_id=decoder_start_token_id,
        forced_bos_token_id=forced_bos_token_id, forced_eos_token_id=forced_eos_token_id,
        bad_words_ids=bad_words_ids, renormalize_logits=renormalize_logits, **drafting))
    gc.validate(cfg)
    ids = checks.id_array(input_ids, "input_ids")
    checks.check_ids(ids, cfg.token_rows)
    mask = np.ones_like(ids) if attention_mask is None else checks.id_array(attention_mask, "attention_mask")
    checks.check_mask(mask, ids.shape, "attention_mask", "input_ids")
    prompt = decoder_prompt_length(cfg, decoder_input_ids, ids.shape[0], gc)
    if token_type_ids is not None:
        if cfg.family != "decoder" or cfg.vision is None or not cfg.vision.bidirectional_images:
            raise ValueError(f"token_type_ids given to generate for {cfg.name!r}: generation takes them to mark "
                             "image tokens (Gemma 3), which this model does not read")
        if assistant_model is not None or prompt_lookup_num_tokens is not None:
            raise ValueError("drafting (assistant_model, prompt_lookup_num_tokens) does not take token_type_ids")
        model.validate(ids, mask, token_type_ids=np.asarray(token_type_ids))
    if mm_token_type_ids is not None:
        model.validate(ids, mask, mm_token_type_ids=np.asarray(mm_token_type_ids))
    cross = dict(aspect_ratio_ids=aspect_ratio_ids, aspect_ratio_mask=aspect_ratio_mask,
                 cross_attention_mask=cross_attention_mask)
    if any(value is not None for value in cross.values()) or (cfg.scores.cross_attention_layers and
                                                              pixel_values is not None):
        model.validate(ids, mask, pixel_values=None if pixel_values is None else np.asarray(pixel_values),
                       **{name: np.asarray(value) for name, value in cross.items() if value is not None})
        if pixel_values is None:
            raise ValueError(f"{', '.join(name for name, value in cross.items() if value is not None)} go with "
                             "pixel_values: generation reads the images' states from them (Llama 3.2 Vision)")
    elif image_grid_thw is not None:
        if assistant_model is not None or prompt_lookup_num_tokens is not None:
            raise ValueError("drafting (assistant_model, prompt_lookup_num_tokens) does not take images")
        model.validate(ids, mask, pixel_values=None if pixel_values is None else np.asarray(pixel_values),
                       image_grid_thw=image_grid_thw)
    elif pixel_values is not None:
        model.validate(ids, mask, pixel_values=np.asarray(pixel_values))
        per_row, per_image = set(np.sum(ids == cfg.vision.image_token_id, axis=1).tolist()), features_per_image(cfg)
        if gc.num_beams > 1 and (len(per_row) > 1 or min(per_row) % per_image):
            raise ValueError(f"beam search repeats each row with its images: every row must hold as many image "
                             f"placeholders, whole images of {per_image} each, got {sorted(per_row)} (generate the "
                             "rows apart)")
    if cfg.family == "decoder":
        if not mask[:, -1].all():
            raise ValueError("decoder-only generation needs left padding: every row's last token must be real "
                             "(attention_mask[:, -1] == 1); pad on the left")
        longest = int(mask.sum(axis=1).max()) + gc.max_new_tokens
    else:
        checks.check_length(ids.shape[1], cfg, "input_ids")
        longest = prompt + gc.max_new_tokens
    # Transformer-XL has no position table and a bounded memory: it generates past any length; dynamic rope
    # scaling exists to stretch a model past its max_positions, as it does with transformers
    table = cfg.position in ("learned", "sinusoidal")
    scaling = cfg.rotary.scaling if cfg.rotary is not None else None
    unbounded = cfg.position == "xl" or (scaling is not None and scaling.kind == "dynamic")
    if longest > cfg.max_positions and not unbounded and (table or not allow_beyond_max_positions):
        limit = (f"has {cfg.max_positions} positions" if table else
                 f"was configured for {cfg.max_positions} (max_positions; to generate past it, pass "
                 "allow_beyond_max_positions=True, on the command line --allow-beyond-max-positions)")
        prompt = longest - gc.max_new_tokens
        if cfg.family == "decoder" and prompt >= cfg.max_positions:  # no max_new_tokens would help
            verb = "fills" if prompt == cfg.max_positions else "exceeds"
            raise ValueError(f"the prompt itself ({prompt} tokens) {verb} the positions of {cfg.name!r}, which {limit}; "
                             f"shorten it to at most "
                             f"{cfg.max_positions - 1} tokens (its last ones, say) to generate")
        raise ValueError(f"prompt plus max_new_tokens needs {longest} positions but {cfg.name!r} {limit}; lower "
                         f"max_new_tokens to at most {cfg.max_positions - longest + gc.max_new_tokens}")
    _refuse_a_cache_rebuild(model, ids.shape[1], gc.max_new_tokens)
    slots = ids.shape[1] + gc.max_new_tokens - 1 if cfg.family == "decoder" else prompt + gc.max_new_tokens - 1
    if cfg.position == "xl":  # the memory holds memory_len tokens (all of them when it has no memory_len)
        slots = cfg.segment_memory or slots
    slots += gc.draft_tokens  # a verifying step writes its drafts before rewinding
    check_cache_memory(cfg, ids.shape[0] * gc.num_beams, slots, gc.draft_tokens)
    if assistant_model is not None:
        check_cache_memory(assistant_model.config, ids.shape[0], slots, gc.draft_tokens)
    graphdef, state = nnx.split(model if assistant_model is None else (model, assistant_model))
    args = (graphdef, state, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32),
            jax.random.key(integers["seed"]))
    if measure_costs:
        gc = dataclasses.replace(gc, draft_costs=measure_draft_costs(model, assistant_model, args[2], args[3], gc))
    return args, gc


# measure_draft_costs's results by model pair, batch, draft count and cache-length bucket; the oldest dropped
# past MEASURED_DRAFT_COSTS_KEPT, so a server seeing every prompt length holds a bounded table
MEASURED_DRAFT_COSTS: collections.OrderedDict = collections.OrderedDict()
MEASURED_DRAFT_COSTS_KEPT = 64
TIMED_STEPS = 8  # decode steps per timed call: one dispatch is then a small part of what is timed


def cache_length_bucket(slots: int) -> int:
    """The power of two at or above ``slots``: the costs of drafting change slowly with the cache's length,
    so generations whose caches share a bucket share one measurement (three programs compiled and timed)
    rather than each new prompt length paying for its own."""
    return 1 << max(slots - 1, 0).bit_length()


def measure_draft_costs(model, assistant, input_ids: Array, attention_mask: Array, gc: GenerationConfig,
                        repeats: int = 3) -> tuple[float, float]:
    """What drafting costs on this device, in plain target steps: (one assistant step, each token a verifying
    target step runs past the first). Timed over the caches this generation allocates: the target's decode
    step 1 and ``gc.draft_tokens + 1`` tokens wide and the assistant's 1 wide (none for prompt lookup), each
    TIMED_STEPS steps in one compiled loop, the fastest of ``repeats`` calls. Measured once per model pair,
    batch, draft count and ``cache_length_bucket`` of prompt + new tokens (at the first length seen in it);
    the adaptive schedule reads them (``_chosen_count``)."""
    shape_key = (nnx.graphdef(model), None if assistant is None else nnx.graphdef(assistant), input_ids.shape[0],
                 cache_length_bucket(input_ids.shape[1] + gc.max_new_tokens), gc.draft_tokens)
    if shape_key in MEASURED_DRAFT_COSTS:
        MEASURED_DRAFT_COSTS.move_to_end(shape_key)
        return MEASURED_DRAFT_COSTS[shape_key]
    timed = functools.partial(decode_step_seconds, input_ids=input_ids, attention_mask=attention_mask, gc=gc,
                              repeats=repeats)
    plain, wide = timed(model, width=1), timed(model, width=gc.draft_tokens + 1)
    drafting = 0.0 if assistant is None else timed(assistant, width=1)
    MEASURED_DRAFT_COSTS[shape_key] = costs = (round(drafting / plain, 3),
                                               round(max(wide / plain - 1.0, 0.0) / gc.draft_tokens, 3))
    while len(MEASURED_DRAFT_COSTS) > MEASURED_DRAFT_COSTS_KEPT:
        MEASURED_DRAFT_COSTS.popitem(last=False)
    return costs


def decode_step_seconds(model, input_ids: Array, attention_mask: Array, gc: GenerationConfig, width: int,
                  repeats: int) -> float:
    """Seconds of one of ``model``'s cached decode steps ``width`` tokens wide, over the empty cache a drafted
    generation of ``gc`` allocates (a step reads every slot, written or not), rewound after each step."""
    graphdef, weights = nnx.split(model)

    @jax.jit
    def empty_state(weights):  # as the loop carries it
        model = nnx.merge(graphdef, weights)
        state = _prefill_inputs(model, input_ids, attention_mask, gc, 1, gc.max_new_tokens + gc.draft_tokens)[3]
        return _for_the_loop(model, state)[1]

    empty = empty_state(weights)
    rows = input_ids.shape[0]

    @jax.jit
    def steps(weights, state):
        looping = nnx.merge(graphdef, weights).for_decode_loop()
        positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (rows, width))

        def one(i, carry):  # each step's tokens depend on the last one's logits: no step is left out
            token, state = carry
            logits, written = looping.step(jnp.broadcast_to(token, (rows, width)), positions,
                                           jnp.ones((rows, width), bool), state, every_position=width > 1)
            return jnp.argmax(logits.reshape(-1, logits.shape[-1])[0]).astype(jnp.int32), written.rewind(0)
        return jax.lax.fori_loop(0, TIMED_STEPS, one, (jnp.int32(0), state))[0]

    jax.block_until_ready(steps(weights, empty))  # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(steps(weights, empty))
        best = min(best, time.perf_counter() - start)
    return best / TIMED_STEPS


def check_assistant(model, assistant) -> None:
    """An assistant drafts for the target when it is a generating model of the same family whose cache can
    be rewound; its vocabulary may differ in size only (a padded table), as the tokenizer is shared."""
    cfg, own = model.config, getattr(assistant, "config", None)
    if not isinstance(own, ModelConfig):
        raise ValueError(f"assistant_model must be a jaxformer model (got {type(assistant).__name__})")
    if own.family != cfg.family:
        raise ValueError(f"assistant_model is {own.family}, the model {cfg.family}: drafts need the same family "
                         "(and tokenizer)")
    if own.head != "lm":
        raise ValueError(f"assistant_model needs an LM head; {own.name!r} has head={own.head!r}")
    if own.position == "xl":
        raise ValueError(f"assistant_model {own.name!r} carries a Transformer-XL memory window, which cannot be "
                         "rewound past rejected drafts")
    if own.linear_attention is not None:
        raise ValueError(f"assistant_model {own.name!r} has linear-attention layers, whose recurrent state cannot be "
                         "rewound past rejected drafts")


def check_shared_encoder(model, assistant) -> None:
    """``assistant_shares_encoder`` holds where the assistant would encode the source as the target does (the family's
    ``encoder_difference``: distil-whisper's assistants copy the teacher's encoder); refused naming what differs."""
    cfg, own = model.config, getattr(assistant, "config", None)
    if cfg.family != "encoder_decoder" or getattr(own, "family", None) != "encoder_decoder":
        raise ValueError("assistant_shares_encoder needs an encoder-decoder model and assistant_model")
    difference = model.encoder_difference(assistant)
    if difference:
        raise ValueError(f"assistant_shares_encoder: the assistant's {difference} differ from the model's, so it "
                         "cannot read the model's encoding")


def _integer(value):
    """Python or numpy integers as int (None stays None); anything else is left to the validation."""
    if isinstance(value, np.integer):
        return int(value)
    return value


def decoder_prompt_length(cfg: ModelConfig, decoder_input_ids, rows: int, gc: GenerationConfig) -> int:
    """The columns of an encoder-decoder's decoder prompt (1: the start token alone), ``decoder_input_ids`` checked:
    one row of ids per source row, in the vocabulary, and no drafting (which starts from the start token)."""
    if decoder_input_ids is None:
        return 1
    if cfg.family != "encoder_decoder":
        raise ValueError(f"decoder_input_ids are an encoder-decoder's decoder prompt; {cfg.name!r} is {cfg.family}: "
                         "pass the prompt as input_ids")
    if gc.draft_tokens:
        raise ValueError("drafting starts the decoder from its start token: it takes no decoder_input_ids")
    ids = checks.id_array(decoder_input_ids, "decoder_input_ids")
    checks.check_ids(ids, cfg.vocab_size, "decoder_input_ids")
    if ids.shape[0] != rows or ids.shape[1] < 1:
        raise ValueError(f"decoder_input_ids has shape {ids.shape}; generation reads [{rows}, >= 1]: one prompt per "
                         "row of input_ids")
    return ids.shape[1]


def _refuse_a_cache_rebuild(model, columns: int, max_new_tokens: int) -> None:
    """transformers' Phi-3 drops its cache and runs the whole sequence again at the step whose input first
    passes original_max_position_embeddings, so that every key takes longrope's long factors; jaxformer's
    loop keeps its cache (as transformers' other longrope models do). A Phi-3 generation that crosses that
    length would differ from transformers' without a word, so it is refused."""
    cfg: ModelConfig = model.config
    s = cfg.rotary.scaling if cfg.rotary is not None else None
    if s is None or s.kind != "longrope" or json.loads(getattr(model, "hf_config", None) or "{}").get(
            "model_type") != "phi3":
        return
    original = s.original_max_positions
    if columns <= original < columns + max_new_tokens - 1:
        raise ValueError(f"{cfg.name!r} is a Phi-3 file with longrope: at {original + 1} tokens transformers "
                         "rebuilds its cache with the long factors, which jaxformer's generate does not; keep "
                         f"prompt columns + max_new_tokens within {original + 1} (max_new_tokens <= "
                         f"{original + 1 - columns}), or start from a prompt longer than {original} tokens")


def check_cache_memory(cfg: ModelConfig, rows: int, slots: int, rewind: int = 0) -> None:
    """Refuse, before allocating it, a KV cache larger than the memory free on the device (windowed layers
    hold window + ``rewind`` slots)."""
    itemsize = jnp.dtype(cfg.dtype).itemsize
    needed = (cache_numbers(cfg, slots, rewind) * itemsize + linear_state_bytes(cfg)) * rows
    free = free_memory()
    if free is not None and needed > free:
        raise ValueError(f"the KV cache for {rows} rows x {slots} tokens needs {needed / 2**30:.1f} GiB "
                         f"({needed:,} bytes) but {free / 2**30:.1f} GiB are free on {jax.devices()[0].platform}; "
                         "lower max_new_tokens, num_beams or the batch")


def free_memory() -> int | None:
    """Bytes free on the default device: its allocator's limit minus what is in use on an accelerator,
    the host's available memory on a CPU; None when neither can be read."""
    stats = jax.devices()[0].memory_stats() if jax.default_backend() != "cpu" else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    try:  # MemAvailable counts the page cache the kernel would give back; MemFree does not
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def assemble(model, input_ids, tokens, steps, bad_step, gc: GenerationConfig, decoder_input_ids=None) -> np.ndarray:
    """transformers' output layout from the loop's fixed-size result (an encoder-decoder's after its decoder prompt,
    ``decoder_input_ids`` or the start token); refused when the model's logits were not finite at some step (argmax
    would have turned NaN into token 0)."""
    if int(bad_step) >= 0:
        raise ValueError(f"the model produced NaN or Inf logits at generation step {int(bad_step)} "
                         f"({model.config.dtype} compute), so its tokens are meaningless; check the weights for "
                         "NaN/Inf, or run in float32 if the activations overflow")
    tokens = np.asarray(tokens)[:, : int(steps)]
    if model.config.family == "encoder_decoder":
        start = (np.full((tokens.shape[0], 1), gc.decoder_start_token_id, tokens.dtype) if decoder_input_ids is None
                 else np.asarray(decoder_input_ids).astype(tokens.dtype))
        return np.concatenate([start, tokens], axis=1)
    return np.concatenate([np.asarray(input_ids).astype(tokens.dtype), tokens], axis=1)


def generate(model, input_ids, attention_mask=None, **kwargs) -> np.ndarray:
    """Hugging Face's ``generate`` contract: decoder-only returns prompt + new tokens, encoder-decoder
    the decoder sequence starting with the decoder start token; rows are padded after EOS and the
    output is trimmed to the last step any row needed. Keyword arguments: see ``prepare``."""
    checks.refuse_videos(kwargs)
    args, gc = prepare(model, input_ids, attention_mask, **kwargs)
    images = loop_images(model, input_ids, gc, kwargs)
    if kwargs.get("decoder_input_ids") is not None:
        images["decoder_input_ids"] = jnp.asarray(kwargs["decoder_input_ids"], jnp.int32)
    tokens, steps, bad_step = generate_tokens_jit(*args, config=gc, **images)
    return assemble(model, input_ids, tokens, steps, bad_step, gc, kwargs.get("decoder_input_ids"))
