"""Per-row sampling inside the engine's batched step: every row chooses its next token by its own parameters.

The order is transformers' generate's: each row's ``logit_bias`` added to its tokens' logits (OpenAI's; transformers'
``SequenceBiasLogitsProcessor`` with one-token sequences), then the repetition penalty
(``RepetitionPenaltyLogitsProcessor``: a logit of a token anywhere in the prompt or the generated tokens is divided by
the penalty where positive, multiplied where negative), then the presence and frequency penalties (OpenAI's and
vLLM's: ``presence * (count > 0) + frequency * count`` subtracted, counted over the generated tokens only;
transformers has none), then, for rows that draw, the temperature, top-k, top-p and min-p warpers. A greedy row
takes the argmax of the biased and penalised logits. Log-probabilities are those of the model's raw distribution
(``log_softmax`` of the logits before any processing, vLLM's default).

What a program compiles is fixed by ``SamplerFlags`` (static): a batch of plain greedy rows runs an argmax and nothing
else (no sort, no penalty scatter, no ``log_softmax``). The penalties' token counts are built inside the program from
each row's ids [B, W] (W a power of two, padded with -1), never from a host [B, V] array; so are the biases
(ids and values [B, W]).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.generate import filter_top_k_top_p

Array = jax.Array
MAX_LOGPROBS = 20  # the most top log-probabilities a request may ask for (OpenAI's bound)
PAD_ID = -1  # a history slot holding no token


class SamplerFlags(NamedTuple):
    """What some row of a batch needs (static: each combination is its own program)."""

    sample: bool = False  # some row draws (temperature > 0)
    narrow: bool = False  # some drawing row keeps only its top-k or top-p
    min_p: bool = False  # some drawing row filters by min-p
    penalize: bool = False  # some row has a repetition, presence or frequency penalty
    logprobs: bool = False  # some row asks for log-probabilities
    bias: bool = False  # some row has a logit bias
    beam: int = 0  # some row is a beam's: each row's candidates by beam scores (``beam_candidates``), this many


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingRows:
    """Each row's sampling parameters [B] (``history`` [B, W]: its prompt and generated ids, -1 padded, where the
    generated ones start at ``prompt_lengths``; ``bias_ids`` and ``bias_values`` [B, W']: its logit bias, -1 and 0
    padded), and the draw's key: ``seeds`` and the tokens ``drawn`` so far."""

    temperature: Array
    top_k: Array
    top_p: Array
    min_p: Array
    repetition: Array
    presence: Array
    frequency: Array
    seeds: Array
    drawn: Array
    history: Array
    prompt_lengths: Array
    bias_ids: Array
    bias_values: Array


class TokenLogprobs(NamedTuple):
    """A chosen token's log-probability under the model's raw distribution and the ``k`` likeliest (id, logprob)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def sampling_rows(rows, batch: int, max_width: int) -> tuple[SamplingRows, SamplerFlags]:
    """The batch's arrays (host numpy, ``batch`` rows: the padding rows greedy and unpenalised) and flags from
    ``rows``: (params, seed, tokens so far, prompt length) each, params a ``SamplingParams``. ``max_width``: the
    cap of the history's power-of-two width."""
    columns = {name: np.zeros(batch, np.float32) for name in ("temperature", "top_p", "min_p", "repetition",
                                                                "presence", "frequency")}
    columns["top_p"][:], columns["repetition"][:] = 1, 1
    top_k, seeds, drawn, prompt_lengths = (np.zeros(batch, dtype) for dtype in (np.int32, np.uint32, np.int32,
                                                                                 np.int32))
    for r, (p, seed, tokens, prompt_length) in enumerate(rows):
        for name, value in (("temperature", p.temperature), ("top_p", p.top_p), ("min_p", p.min_p),
                            ("repetition", p.repetition_penalty), ("presence", p.presence_penalty),
                            ("frequency", p.frequency_penalty)):
            columns[name][r] = value
        top_k[r], seeds[r], drawn[r], prompt_lengths[r] = p.top_k, seed, len(tokens) - prompt_length, prompt_length
    drawing = columns["temperature"] > 0
    flags = SamplerFlags(
        sample=bool(drawing.any()), narrow=bool((drawing & ((top_k > 0) | (columns["top_p"] < 1))).any()),
        min_p=bool((drawing & (columns["min_p"] > 0)).any()),
        penalize=bool(((columns["repetition"] != 1) | (columns["presence"] != 0) | (columns["frequency"] != 0)).any()),
        logprobs=any(p.logprobs is not None for p, *_ in rows), bias=any(p.logit_bias for p, *_ in rows))
    width = min(1 << (max(len(tokens) for _, _, tokens, _ in rows) - 1).bit_length(), max_width) \
        if flags.penalize else 1
    history = np.full((batch, width), PAD_ID, np.int32)
    if flags.penalize:
        for r, (_, _, tokens, _) in enumerate(rows):
            history[r, :len(tokens)] = tokens
    width = 1 << (max(len(p.logit_bias) for p, *_ in rows) - 1).bit_length() if flags.bias else 1
    bias_ids, bias_values = np.full((batch, width), PAD_ID, np.int32), np.zeros((batch, width), np.float32)
    for r, (p, *_) in enumerate(rows):
        for c, (token, value) in enumerate(p.logit_bias):
            bias_ids[r, c], bias_values[r, c] = token, value
    return SamplingRows(**columns, top_k=top_k, seeds=seeds, drawn=drawn, history=history,
                        prompt_lengths=prompt_lengths, bias_ids=bias_ids, bias_values=bias_values), flags


def bias_rows(logits: Array, ids: Array, values: Array) -> Array:
    """Logits [B, V] with each row's ``values`` [B, W] added at its token ``ids`` [B, W] (-1: none): a row without a
    bias keeps its logits bit for bit."""
    B, V = logits.shape
    return logits.at[jnp.arange(B)[:, None], jnp.where(ids < 0, V, ids)].add(values, mode="drop")


def penalize_rows(logits: Array, repetition: Array, presence: Array, frequency: Array, history: Array,
                  prompt_lengths: Array) -> Array:
    """Logits [B, V] with each row's repetition penalty over its ``history`` [B, W] (prompt and generated ids, -1:
    none) and its presence and frequency penalties over the generated ids (from ``prompt_lengths`` [B] on).
    A row at the neutral values (1, 0, 0) keeps its logits bit for bit."""
    B, V = logits.shape
    rows = jnp.arange(B)[:, None]
    ids = jnp.where(history < 0, V, history)  # out of range: dropped by the scatters
    seen = jnp.zeros((B, V), bool).at[rows, ids].set(True, mode="drop")
    generated = (jnp.arange(history.shape[1])[None] >= prompt_lengths[:, None]).astype(logits.dtype)
    counts = jnp.zeros((B, V), logits.dtype).at[rows, ids].add(generated, mode="drop")
    r = repetition[:, None]
    logits = jnp.where(seen, jnp.where(logits < 0, logits * r, logits / r), logits)
    return logits - frequency[:, None] * counts - presence[:, None] * (counts > 0)


def warp_rows(logits: Array, temperature: Array, top_k: Array, top_p: Array, min_p: Array | None = None,
              narrow: bool = True) -> Array:
    """``generate.warp_logits`` with each row's own settings [B] (traced here: one program serves every mix):
    logits [B, V] shifted to a maximum of 0, divided by the temperature (a row at 0 is left undivided), then
    -inf outside the ``top_k`` likeliest (0: off) and outside the ``top_p`` nucleus (``filter_top_k_top_p``;
    ``narrow`` False: no row filters so, and none of it is compiled), then below ``min_p`` times the likeliest
    token's probability (None: no row filters so). Rows that do not draw (temperature 0) filter nothing: their
    settings never make the batch look further for a nucleus."""
    drawing = temperature > 0
    scaled = (logits - jnp.max(logits, axis=-1, keepdims=True)) / jnp.where(drawing, temperature, 1.0)[:, None]
    if narrow:
        scaled = filter_top_k_top_p(scaled, jnp.where(drawing, top_k, 0), jnp.where(drawing, top_p, 1.0))
    if min_p is not None:  # transformers' MinPLogitsWarper: the likeliest token always stays (min_p <= 1)
        probs = jax.nn.softmax(scaled, axis=-1)
        scaled = jnp.where(probs < min_p[:, None] * jnp.max(probs, axis=-1, keepdims=True), -jnp.inf, scaled)
    return scaled


def greedy(scores: Array) -> Array:
    """Each row's argmax over the last axis (int32; its first maximal index, as ``jnp.argmax``), as a max and a
    min: XLA:CPU runs ``argmax``'s two-operand reduce 2-4x slower (32 rows of gpt2's 50,257 logits: 4 ms against
    1-2). A row without a maximum (NaN) gets its last index, as the engine fails such a row anyway."""
    width = scores.shape[-1]
    top = jnp.max(scores, axis=-1, keepdims=True)
    first = jnp.min(jnp.where(scores == top, jnp.arange(width, dtype=jnp.int32), width), axis=-1)
    return jnp.minimum(first, width - 1)


def draw(keys: Array, logits: Array) -> Array:
    """Each row's draw [B] from its logits [B, V] by its key [B]: ``jax.random.categorical``'s token (the argmax of
    the logits plus the key's Gumbel noise, the same noise), its argmax taken by ``greedy`` (XLA:CPU's argmax reduce
    took 26 ms of a 32-row gpt2 step on one core)."""
    noise = jax.vmap(lambda key: jax.random.gumbel(key, logits.shape[-1:], logits.dtype))(keys)
    return greedy(noise + logits)


def choose_tokens(logits: Array, rows: SamplingRows, flags: SamplerFlags, raw: Array | None = None,
                  forced: Array | None = None) -> tuple[Array, tuple | None]:
    """Each row's next token [B] from its logits [B, V] (module docstring), drawn rows keyed by their seed and
    ``drawn`` count (so a request draws the same tokens whatever batch it is in); with ``flags.logprobs``, also
    the raw log-probability of each chosen token [B] and the ``MAX_LOGPROBS`` likeliest (values and ids [B, k]).
    ``raw``: the model's logits where ``logits`` already bans some tokens (the log-probabilities are of these;
    default: ``logits``); ``forced`` [B]: a token that replaces the row's choice where >= 0 (generate's forced
    first or last token), reported with its own log-probability."""
    raw = (logits if raw is None else raw).astype(jnp.float32)
    scores = logits.astype(jnp.float32)
    if flags.bias:
        scores = bias_rows(scores, rows.bias_ids, rows.bias_values)
    if flags.penalize:
        scores = penalize_rows(scores, rows.repetition, rows.presence, rows.frequency, rows.history,
                               rows.prompt_lengths)
    tokens = greedy(scores)
    if flags.sample:
        tokens = draw_rows(scores, rows, flags, tokens)
    tokens = tokens.astype(jnp.int32)
    if forced is not None:
        tokens = jnp.where(forced >= 0, forced, tokens)
    if not flags.logprobs:
        return tokens, None
    logprobs = jax.nn.log_softmax(raw, axis=-1)
    top, top_ids = jax.lax.top_k(logprobs, min(MAX_LOGPROBS, logprobs.shape[-1]))
    return tokens, (jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0], top, top_ids.astype(jnp.int32))


def draw_rows(scores: Array, rows: SamplingRows, flags: SamplerFlags, tokens: Array) -> Array:
    """``tokens`` [B] with each drawing row's (temperature > 0) replaced by its draw from its ``scores`` [B, V]
    (biased and penalised already), warped by its settings and keyed by its seed and its count of tokens ``drawn``
    (so a request draws the same tokens whatever batch it is in, or whether it drafts: ``engine.draw_program``)."""
    keys = jax.vmap(lambda seed, n: jax.random.fold_in(jax.random.PRNGKey(seed), n))(rows.seeds, rows.drawn)
    warped = warp_rows(scores, rows.temperature, rows.top_k, rows.top_p, rows.min_p if flags.min_p else None,
                       flags.narrow)
    return jnp.where(rows.temperature > 0, draw(keys, warped), tokens)


def beam_candidates(logits: Array, count: int, banned: tuple[int, ...] = (), forced: Array | None = None,
                    renormalize: bool = False) -> tuple[Array, Array]:
    """Each row's ``count`` likeliest next tokens as generate's beam search scores them (``generate.process_logits``
    over ``log_softmax``, transformers' order): the log-probabilities of its logits [B, V], the ``banned`` tokens
    (bad words) at -inf, a ``forced`` token [B] (-1: none) alone at 0, then normalised again where the checkpoint
    asks (``renormalize_logits``). Values [B, count] and ids, ``jax.lax.top_k``'s (ties: the lower id first)."""
    scores = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    if banned:
        scores = scores.at[..., jnp.asarray(banned)].set(-jnp.inf)
    if forced is not None:
        alone = jnp.where(jnp.arange(scores.shape[-1]) == forced[:, None], 0.0, -jnp.inf)
        scores = jnp.where(forced[:, None] >= 0, alone, scores)
    if renormalize:
        scores = jax.nn.log_softmax(scores, axis=-1)
    top, ids = jax.lax.top_k(scores, count)
    return top, ids.astype(jnp.int32)


def prompt_lookup(tokens: list[int], count: int, ngram: int = 2) -> list[int]:
    """Prompt-lookup drafts, as transformers' PromptLookupCandidateGenerator (and generate's ``lookup_drafts``)
    choose them: the longest n-gram (at most ``ngram`` tokens) ending ``tokens`` that occurs earlier in them; the
    ``count`` tokens after its first occurrence (fewer where the tokens end; none without a match)."""
    n = len(tokens)
    for size in range(min(ngram, n - 1), 0, -1):  # the longest match wins
        tail = tokens[n - size:]
        for start in range(n - size):  # (something follows an occurrence: it is not the tail itself)
            if tokens[start:start + size] == tail:
                return tokens[start + size:start + size + count]
    return []
