"""The serving engine: continuous batching over a paged KV cache, on the families' one forward.

``Engine(model, num_blocks, block_size, max_num_seqs)`` takes requests (``add_request(prompt_ids,
SamplingParams)``) and ``step()`` advances every running one: a scheduler on the host decides, each step, which
tokens each sequence feeds (one for a decoding sequence, a chunk of its prompt for a prefilling one, its last token
and its drafts for a drafting one), gives them blocks, and runs compiled calls of the model's own ``step`` over a
``PagedKVCache`` (one for the rows feeding one token, one for the drafting rows, and the prompt chunks in one call,
or on XLA:CPU in the few that pad least: ``Engine._prefill_calls``; where the C++ kernel reads the pool, the one-token
rows and the prompt chunks in one packed call, each token a row: ``Engine._pack``), each choosing every row's next
token by its own parameters; an encoder-decoder's newly admitted sources are encoded first, in one more call.

- Continuous batching: a sequence leaves the batch the step it ends (its blocks freed at once) and waiting ones
  join as blocks and ``max_num_seqs`` allow.
- Chunked prefill: a prompt is fed at most ``prefill_chunk`` tokens a step, at most ``prefill_tokens`` prompt
  tokens a step in all, so the decoding sequences never wait for a long prompt.
- Prefix caching: a prompt's full blocks already computed (by any earlier sequence, running or ended) are shared,
  not recomputed (``BlockManager``); the last prompt token is always computed, so shared blocks are never written.
- Preemption by recompute: when a sequence's next tokens find no free block, the sequence admitted last gives its
  blocks back and returns to the waiting queue in its arrival order (first come, first readmitted); readmitted, it
  computes its prompt and the tokens it had generated again (from the prefix cache where still there).
- Bucketed shapes: batch rows and chunk width (and an encoder-decoder's source width) are each rounded up to a
  power of two or the midpoint between two (``_bucket``, capped), block-table width and the penalties' history width
  to a power of two, so the engine compiles a few programs, not one per batch (``programs`` lists them with their
  compile times); a table is at least ``min_table_slots()`` tokens wide (reading that few slots costs no more than
  fewer: fewer programs).

Greedy output equals ``model.generate``'s token for token whatever else is in the batch: a row's keys are its own
blocks and padding is masked, so rows never mix.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import itertools
import json
import math
import time
import warnings
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import kernels
from jaxformer.cache import DecodeState, HybridCache, LinearState
from jaxformer.decoder import step_logits, unstacked_decoder
from jaxformer.generate import NEG, checkpoint_config, generation_defaults
from jaxformer.layer_plan import layer_plan
from jaxformer.layers import EncoderOutput, attention, dtype_of
from jaxformer.serving.paged import NULL_BLOCK, BlockManager, PagedKVCache, source_view
from jaxformer.serving.sampling import (MAX_LOGPROBS, SamplerFlags, SamplingRows, TokenLogprobs, beam_candidates,
                                        choose_tokens, draw_rows, greedy, prompt_lookup, sampling_rows)

Array = jax.Array
MAX_BEAMS = 16  # the widest beam search a request may ask for (its beams are rows of the running batch)


def paging_problem(model) -> str | None:
    """Why the engine cannot page ``model``'s cache (None: it can). The engine pages per-token keys and values (or
    latent attention's latents, and sparse attention's indexer keys) and keeps linear-attention layers' states in
    slots; the other carried states are named here until they page too. Windowed layers (sliding windows,
    chunks) are paged in full: their masks come from positions, so they read the same keys as through their ring
    (a block past every layer's window is not freed early yet)."""
    cfg = model.config
    if cfg.family == "encoder_decoder":
        problem = source_problem(model)
        if problem is not None:
            return problem
    elif cfg.family != "decoder":
        return {"encoder": "an encoder generates no tokens (embeddings are served apart)"}.get(
            cfg.family, f"family {cfg.family!r} is not a decoder")
    if cfg.head != "lm":
        return f"head {cfg.head!r} gives no next-token logits"
    if cfg.position == "xl":
        return "Transformer-XL carries a segment memory (MemoryKV), not per-token keys and values"
    if cfg.scores.compressed is not None:
        return "DeepSeek-V4's compressed attention carries windows and compressed entries (CompressedCache)"
    if cfg.scores.cross_attention_layers:
        return "its cross-attention layers read images' keys and values (ImageCache)"
    scores = cfg.scores
    if scores.kv_shared_layers or scores.full_kv_heads or scores.full_head_dim or scores.full_keys_as_values:
        return "its layers read other layers' keys and values or have heads of their own width (Gemma 4)"
    if cfg.attention == "prefix":
        return "prefix-LM attention needs each row's prefix size, which the engine does not carry"
    if cfg.rotary is not None and cfg.rotary.sections is not None:
        return "M-RoPE carries each row's position-stream offsets (rope_deltas), which the engine does not carry"
    if cfg.nope is not None and cfg.nope.temperature_floor_scale is not None:
        return "Llama 4's attention temperature counts a row's cache index, which a paged batch does not share"
    kept = {spec.cache for spec in layer_plan(cfg, cfg.attention, cfg.decoder_layers).layers}
    kept -= {"full", "window", "latent", "state"}
    if kept:
        return f"its layers keep {', '.join(sorted(kept))} caches, not per-token keys and values"
    return None


def source_problem(model) -> str | None:
    """Why the engine cannot serve encoder-decoder ``model`` (None: it can). A source's cross-attention keys and
    values live in the same block pool as the decoder's own keys, so they must have its [kv_heads, head_dim] shape;
    the source is token ids (an audio encoder's features are not served)."""
    cfg = model.config
    if cfg.audio is not None:
        return "its encoder reads audio features (Whisper), which the engine does not take"
    if cfg.head != "lm":
        return f"head {cfg.head!r} gives no next-token logits"
    source = EncoderOutput(jax.ShapeDtypeStruct((1, 1, cfg.d_model), dtype_of(cfg.dtype)))
    cross = jax.eval_shape(model.decoder.cross_key_values, source).k.shape  # [L, B, S, K, H]
    if tuple(cross[3:]) != (cfg.kv_heads, cfg.head_dim_):
        return (f"its cross-attention keys are [{cross[3]} heads, {cross[4]}] but its self-attention keys "
                f"[{cfg.kv_heads}, {cfg.head_dim_}]: the two share one block pool")
    return None


def position_limit(cfg, allow_beyond_max_positions: bool = False) -> tuple[int | None, str]:
    """The longest sequence the engine serves of a model configured as ``cfg`` (None: no bound) and why. Rotary
    frequencies that switch with a call's length (longrope past ``original_max_positions``, dynamic NTK past
    ``max_positions``) are chosen by the batch's largest position, as transformers and generate choose them, so
    past the switch one row's output would depend on the others': the engine stops short of it. A position
    table ends at ``max_positions``; other positions pass it as generate's ``allow_beyond_max_positions`` lets them."""
    scaling = cfg.rotary.scaling if cfg.rotary is not None else None
    if scaling is not None and scaling.kind in ("longrope", "dynamic"):
        limit, key = ((scaling.original_max_positions, "original_max_positions") if scaling.kind == "longrope"
                      else (cfg.max_positions, "max_positions"))
        return limit, (f"its {scaling.kind} rotary frequencies switch past {key}={limit}, chosen by a batch's longest "
                       "row, so longer rows would change the other rows' output")
    if cfg.position in ("learned", "sinusoidal"):
        return cfg.max_positions, f"its position table has {cfg.max_positions} positions"
    if not allow_beyond_max_positions:
        return cfg.max_positions, (f"it was configured for max_positions={cfg.max_positions} (to serve past it, "
                                   "pass allow_beyond_max_positions=True)")
    return None, ""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request chooses its tokens (``sampling.py``: the order, as transformers' generate). ``logit_bias``
    (token id -> a number in [-100, 100], OpenAI's) is added to the logits first, then they are penalised:
    ``repetition_penalty`` over the prompt and generated ids (1: off), ``presence_penalty`` and
    ``frequency_penalty`` over the generated ids (0: off). ``temperature`` 0 is then greedy; otherwise a draw at that
    temperature from the ``top_k`` likeliest tokens (0: all) within the ``top_p`` nucleus (1: all) and at least
    ``min_p`` times the likeliest's probability (0: off), by a key from ``seed`` (None: the engine's seed and the
    request's id, see ``Engine``) and the number of tokens drawn so far, so a request draws the same tokens whatever
    else runs (and after a preemption). ``logprobs`` k: each new token's log-probability under the model's raw
    distribution and the k likeliest (None: none); ``prompt_logprobs`` k: the same of each prompt token after the
    first, given the ones before it (OpenAI's ``echo`` with ``logprobs``; such a prompt is computed whole, never read
    from the prefix cache). Stops after ``max_tokens`` or at a stop id (the model's EOS ids
    unless ``ignore_eos``, and ``stop_token_ids``). ``forced_bos_token_id``: the request's first token, chosen for
    it as generate's ``forced_bos_token_id`` (a translation's target language: NLLB, M2M100; None: the
    checkpoint's, if any). ``beam_width`` k > 1: transformers' beam search (``generate(num_beams=k)``: its
    ``length_penalty`` and ``early_stopping``), k running sequences that share their blocks where their tokens agree,
    the request's one output at its end carrying the k best hypotheses (``RequestOutput.beams``); deterministic, so
    ``temperature`` 0, and no setting that changes the scores its beams rank by (penalties, logit bias, logprobs)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    forced_bos_token_id: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (a mapping given is kept as its (id, bias) pairs, by id)
    prompt_logprobs: int | None = None
    beam_width: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias
        pairs = bias.items() if isinstance(bias, Mapping) else bias
        try:
            object.__setattr__(self, "logit_bias", tuple(sorted((token, value) for token, value in pairs)))
        except (TypeError, ValueError):
            raise ValueError(f"SamplingParams.logit_bias={bias!r}: want a mapping of token ids to numbers in "
                             f"[-100, 100]") from None
        checks = {"max_tokens": (self.max_tokens, "an int >= 1", _is_int(self.max_tokens) and self.max_tokens >= 1),
                  "temperature": (self.temperature, "a finite number >= 0",
                                  _is_number(self.temperature) and 0 <= self.temperature < math.inf),
                  "top_k": (self.top_k, "an int >= 0 (0: off)", _is_int(self.top_k) and self.top_k >= 0),
                  "top_p": (self.top_p, "a number in (0, 1]", _is_number(self.top_p) and 0 < self.top_p <= 1),
                  "min_p": (self.min_p, "a number in [0, 1]", _is_number(self.min_p) and 0 <= self.min_p <= 1),
                  "repetition_penalty": (self.repetition_penalty, "a finite number > 0",
                                         _is_number(self.repetition_penalty)
                                         and 0 < self.repetition_penalty < math.inf),
                  "presence_penalty": (self.presence_penalty, "a number in [-2, 2]",
                                       _is_number(self.presence_penalty) and -2 <= self.presence_penalty <= 2),
                  "frequency_penalty": (self.frequency_penalty, "a number in [-2, 2]",
                                        _is_number(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2),
                  "logprobs": (self.logprobs, f"None or an int in [0, {MAX_LOGPROBS}]", self.logprobs is None
                               or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS)),
                  "prompt_logprobs": (self.prompt_logprobs, f"None or an int in [0, {MAX_LOGPROBS}]",
                                      self.prompt_logprobs is None or (_is_int(self.prompt_logprobs)
                                                                       and 0 <= self.prompt_logprobs <= MAX_LOGPROBS)),
                  "seed": (self.seed, "None or an int in [0, 2**32)",
                           self.seed is None or (_is_int(self.seed) and 0 <= self.seed < 2 ** 32)),
                  "stop_token_ids": (self.stop_token_ids, "ints >= 0",
                                     all(_is_int(i) and i >= 0 for i in self.stop_token_ids)),
                  "forced_bos_token_id": (self.forced_bos_token_id, "None or an int >= 0",
                                          self.forced_bos_token_id is None
                                          or (_is_int(self.forced_bos_token_id) and self.forced_bos_token_id >= 0)),
                  "logit_bias": (dict(self.logit_bias), "a mapping of token ids (ints >= 0) to numbers in [-100, 100]",
                                 all(_is_int(token) and token >= 0 and _is_number(value) and -100 <= value <= 100
                                     for token, value in self.logit_bias))}
        checks.update({
            "beam_width": (self.beam_width, f"an int in [1, {MAX_BEAMS}]",
                           _is_int(self.beam_width) and 1 <= self.beam_width <= MAX_BEAMS),
            "length_penalty": (self.length_penalty, "a finite number",
                               _is_number(self.length_penalty) and math.isfinite(self.length_penalty)),
            "early_stopping": (self.early_stopping, "True, False or 'never'",
                               self.early_stopping is True or self.early_stopping is False
                               or self.early_stopping == "never")})
        for name, (value, want, ok) in checks.items():
            if not ok:
                raise ValueError(f"SamplingParams.{name}={value!r}: want {want}")
        if self.beam_width == 1:
            for name, off in (("length_penalty", 1.0), ("early_stopping", False)):
                if getattr(self, name) != off:
                    raise ValueError(f"SamplingParams.{name}={getattr(self, name)!r} applies to beam search only "
                                     "(beam_width > 1)")
            return
        # beam search keeps the likeliest sequences by their log-probabilities as generate's processors leave them:
        # settings that draw, or change those scores in ways its beams do not, are refused, never ignored
        for name, off in (("temperature", 0), ("repetition_penalty", 1), ("presence_penalty", 0),
                          ("frequency_penalty", 0), ("logit_bias", ()), ("logprobs", None), ("prompt_logprobs", None)):
            if getattr(self, name) != off:
                raise ValueError(f"SamplingParams.{name}={getattr(self, name)!r}: beam search (beam_width="
                                 f"{self.beam_width}) is deterministic and scores by the model's log-probabilities; "
                                 f"want {name}={off!r}")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class RequestOutput:
    """What a step gave one request: its new tokens, and whether (and why: 'stop', 'length', or 'error': its logits
    were not finite, so it ends with no token) it ended; ``logprobs``: one ``TokenLogprobs`` a new token where the
    request asked for them (``SamplingParams.logprobs``), else None; ``prompt_logprobs``: with a request's first
    token, where it asked for them (``SamplingParams.prompt_logprobs``), one a prompt token, None for the first (it
    has no tokens before it)."""

    request_id: int
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprobs, ...] | None = None
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None = None
    beams: tuple[Hypothesis, ...] | None = None


class Hypothesis(NamedTuple):
    """One of a beam search's best sequences: its tokens, its score (the sum of its tokens' log-probabilities over
    its length to the ``length_penalty``, transformers' ``sequences_scores``) and why it ended ('stop': a stop id;
    'length': ``max_tokens``)."""

    token_ids: tuple[int, ...]
    score: float
    finish_reason: str


@dataclasses.dataclass(eq=False)  # (one sequence is itself alone: the queues find it by identity)
class Sequence:
    """A request as the scheduler tracks it: its tokens (prompt, then generated), how many of them are in the
    cache (``computed``), its blocks in order and the prefix keys of its full ones; ``seed``: its draws' seed. An
    encoder-decoder's request has its ``source`` ids, whose cross-attention keys and values fill ``source_blocks``
    (``encoded``: written; both go with the target's blocks when the sequence ends or is preempted)."""

    request_id: int
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    seed: int
    generated: list[int] = dataclasses.field(default_factory=list)
    blocks: list[int] = dataclasses.field(default_factory=list)
    keys: list[bytes] = dataclasses.field(default_factory=list)
    computed: int = 0
    finish_reason: str | None = None
    source: list[int] | None = None
    source_blocks: list[int] = dataclasses.field(default_factory=list)
    encoded: bool = False
    draft: list[int] = dataclasses.field(default_factory=list)  # this step's drafts, to verify
    drafter_read: int = 0  # (an assistant model drafts) how many of its tokens are in the drafter's pool
    draft_limit: int | None = None  # (draft_schedule 'heuristic') the most it drafts a step (None: draft_tokens)
    slot: int = 0  # (a model with linear-attention layers) its state's slot in the engine's pools (0: none yet)
    # (prompt_logprobs asked) each scored prompt position's TokenLogprobs, and whether they went out with a token
    prompt_scores: dict[int, TokenLogprobs] = dataclasses.field(default_factory=dict)
    prompt_scores_sent: bool = False
    group: BeamGroup | None = None  # a beam search's (``SamplingParams.beam_width`` > 1): its beams' shared state

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated

    def scoring(self) -> bool:
        """Whether this sequence's next call predicts a prompt token whose log-probabilities it asked for."""
        return (self.params.prompt_logprobs is not None and not self.prompt_scores_sent
                and self.computed <= len(self.prompt) - 2)


@dataclasses.dataclass(eq=False)
class BeamGroup:
    """A beam search's state between steps, as generate's ``_beam_search`` carries it for one batch row (the same
    steps, on the host): ``members``, the running beams' sequences in beam order (before the first token: the
    request's one sequence, which every beam copies), their running ``scores``, and the ``width`` best finished
    hypotheses so far (``done_*``, best first; a slot not yet filled scores ``NEG``). ``keep``: the candidates a
    step ranks (two a beam, more where a stop id could take some). ``candidates``: this step's top ``keep``
    log-probabilities of each member (id(member) -> (values, ids)), once its call has run."""

    root: Sequence
    width: int
    keep: int
    members: list[Sequence] = dataclasses.field(default_factory=list)
    scores: np.ndarray | None = None
    done_tokens: list[list[int]] = dataclasses.field(default_factory=list)  # (a hypothesis's length is its list's)
    done_scores: np.ndarray | None = None
    done: np.ndarray | None = None
    improvable: bool = True
    step: int = 0
    candidates: dict[int, tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=dict)

    def restart(self) -> Sequence:
        """The state of a search not begun: the root sequence alone, as it waits to be admitted (first, or again
        after a preemption: the search is deterministic, so run again it finds the same beams)."""
        root, w = self.root, self.width
        root.generated, root.blocks, root.keys, root.computed = [], [], [], 0
        root.source_blocks, root.encoded, root.finish_reason = [], False, None
        self.members, self.step, self.improvable, self.candidates = [root], 0, True, {}
        self.scores = np.zeros(w, np.float32)
        self.scores[1:] = NEG  # (beams 1.. copy beam 0 before the first token: their candidates rank last)
        self.done_tokens = [[] for _ in range(w)]
        self.done_scores, self.done = np.full(w, NEG, np.float32), np.zeros(w, bool)
        return root


def run_step(graphdef, treedef, leaves: list[Array], k: Array, v: Array, ids: Array, positions: Array, valid: Array,
             tables: Array, lengths: Array, source: tuple | None = None, banned: tuple[int, ...] = (),
             verify: bool = False, kernel: str | None = None, targets: Array | None = None, latent: bool = False,
             states: tuple[Array, Array] | None = None, slots: Array | None = None, picks: Array | None = None
             ) -> tuple[Array, Array | None, Array, Array, tuple | None, tuple | None]:
    """One engine call's model work (``step_program`` jits it with the model's ``graphdef`` and its weights'
    ``treedef`` bound, so a call hashes no graph and passes the weights as a flat list, ``leaves``, not a state's
    nested dicts: a 32-row gpt2-124M step 4 ms less on one core): the model's cached ``step`` over the paged pool for
    rows ``ids`` [B, T] (left padded: the last column of every real row is real). Returns the last column's logits
    [B, V] (the rows choose their tokens in a program of their own, ``choose_program``), whether each row's logits
    are all finite [B] (a row that is not ends in error: its token would be argmax of NaNs) and the pool's k, v with
    the rows' tokens written (updated in place: donated). An encoder-decoder's rows read their sources' keys and
    values from the pool by ``source``: (source tables [B, Ms], source lengths [B]). ``verify``: rows feeding
    their last token and drafts: each position's argmax [B, T] in place of the logits, ``banned`` tokens (the
    checkpoint's bad words) never chosen, and as the fifth result those logits [B, T, V] with the bad words banned
    (a drawing row's tokens are drawn from them by ``draw_program``, a program of its own). ``kernel``: the fused
    paged kernel the layers attend by (k, v then hold each layer's own pool). ``targets`` [B, T]: the token each
    position predicts, where a request asked for its prompt's log-probabilities (-1: none); the fifth result is then
    each position's log-probability of its target [B, T] and its ``MAX_LOGPROBS`` likeliest (values and ids
    [B, T, k]), of the raw distribution (else None).
    ``latent``: the pool holds multi-head latent attention's latents (``PagedKVCache.latent``). ``states``: a stack
    with linear-attention layers' (conv, state) pools [L', slots, ...] (``LinearState``'s fields, one slot a running
    sequence), of which the rows read theirs at ``slots`` [B] (a row with nothing computed yet: zeros) and the sixth
    result is the pools with each row's state after the call written back (donated; else None). ``picks`` [P]: a
    packed call (``Engine._pack``: one token a row, a prompt chunk's tokens each a row of its own, which a fused
    kernel's layers write before they attend): the first result is then the hidden states of those rows' tokens
    [P, D] (the tokens whose rows choose; ``head_program`` computes their logits) and the second None."""
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
    kv = PagedKVCache(k, v, tables, lengths, kernel, latent)
    if states is not None:  # (padding rows read and write slot 0, which no sequence holds)
        fresh = lengths == 0
        rows = [jnp.where(fresh.reshape(1, -1, *(1,) * (pool.ndim - 2)), 0, pool[:, slots]) for pool in states]
        kv = HybridCache(kv, LinearState(*rows))
    state = DecodeState(kv, None if source is None else source_view(k, v, *source))
    if picks is None:
        logits, state = model.step(ids, positions, valid, state, every_position=verify or targets is not None)
    else:
        hidden, state = model.step(ids, positions, valid, state, head=False)
        return hidden[picks], None, state.kv.k, state.kv.v, None, states
    if states is not None:
        after = state.kv.linear
        states = tuple(pool.at[:, slots].set(part.astype(pool.dtype))
                       for pool, part in zip(states, (after.conv, after.state)))
        state = dataclasses.replace(state, kv=state.kv.full)
    scores = None
    if targets is not None:
        logprobs = jax.nn.log_softmax(logits, axis=-1)
        top, top_ids = jax.lax.top_k(logprobs, min(MAX_LOGPROBS, logprobs.shape[-1]))
        scores = (jnp.take_along_axis(logprobs, jnp.maximum(targets, 0)[..., None], axis=-1)[..., 0], top,
                  top_ids.astype(jnp.int32))
        logits = logits[:, -1]
    finite = jnp.all(jnp.isfinite(logits), axis=-1)
    if not verify:
        return logits, finite, state.kv.k, state.kv.v, scores, states
    finite = jnp.all(finite | ~valid, axis=-1)  # (the padding columns' logits are no row's)
    logits = _ban(logits, banned)
    return greedy(logits), finite, state.kv.k, state.kv.v, logits, states


@functools.cache
def step_program(graphdef, treedef, kernel: str | None = None, latent: bool = False):
    """``run_step`` jitted with a model's graph, its weights' treedef, the paged kernel and the pool's kind (latents
    or keys and values) bound: one per model layout, so every engine over a model of that layout runs the programs
    the first one compiled."""
    return jax.jit(functools.partial(run_step, graphdef, treedef, kernel=kernel, latent=latent),
                   static_argnames=("banned", "verify"), donate_argnames=("k", "v", "states"))


@functools.cache
def head_program(graphdef, treedef):
    """A packed call's logits: the model's head over the first ``rows`` of its picked hidden states [P, D] (a
    program a rows bucket, whatever the call's tokens) and whether each row's are all finite."""
    def head(leaves: list[Array], hidden: Array, rows: int) -> tuple[Array, Array]:
        logits = step_logits(nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves)), hidden[:rows, None])
        return logits, jnp.all(jnp.isfinite(logits), axis=-1)
    return jax.jit(head, static_argnames="rows")


def checkpoint_beams(model) -> int:
    """The beam width a checkpoint's generation settings name (``num_beams`` of its generation_config.json, else of
    its config.json, as transformers reads its defaults; 1: none): the width its users most likely ask for."""
    for saved in (getattr(model, "generation_config", None), getattr(model, "hf_config", None)):
        if saved:
            width = json.loads(saved).get("num_beams")
            return width if isinstance(width, int) and not isinstance(width, bool) and width > 1 else 1
    return 1


def _ban(logits: Array, banned: tuple[int, ...]) -> Array:
    return logits.at[..., jnp.asarray(banned)].set(-jnp.inf) if banned else logits


@functools.partial(jax.jit, static_argnames=("sampler", "banned", "renormalize"))
def choose_program(logits: Array, sampling: SamplingRows, sampler: SamplerFlags, banned: tuple[int, ...] = (),
                   forced: Array | None = None, renormalize: bool = False
                   ) -> tuple[Array, tuple | None, tuple | None]:
    """Each row's next token from a call's logits [B, V] by its ``sampling`` (``choose_tokens``; the program holds
    only the machinery ``sampler`` names), and its log-probabilities where asked. A program apart from the model's
    (``run_step``): a request's sampler settings compile this program once per row count and penalty-history
    width (32 rows of gpt2's vocabulary on this CPU: 0.1-0.5 s, top-p's search 1.3-2.1 s), never a variant of the
    model's step for each (rows, width, table width) shape the request meets (the warm-up compiles the greedy,
    plain-draw and top-p choices).
    ``banned``: token ids never chosen (the log-probabilities stay the raw ones); ``forced`` [B]: generate's forced
    tokens, -1 where none (``Engine._forced``). With ``sampler.beam``, also every row's beam candidates
    (``beam_candidates``; ``renormalize``: the checkpoint's ``renormalize_logits``), else None."""
    tokens, logprobs = choose_tokens(_ban(logits, banned), sampling, sampler, logits, forced)
    beams = beam_candidates(logits, sampler.beam, banned, forced, renormalize) if sampler.beam else None
    return tokens, logprobs, beams


@functools.partial(jax.jit, static_argnames="sampler")
def draw_program(logits: Array, tokens: Array, sampling: SamplingRows, sampler: SamplerFlags, first: Array) -> Array:
    """A verifying call's tokens [B, T] where some row draws: at each position of its ``logits`` [B, T, V] (the bad
    words banned), the token ``choose_tokens`` would draw there undrafted, by the same warpers and the key of the
    row's seed and its count of tokens drawn by then (``first`` [B]: the column of each row's first real position).
    A draft is therefore kept exactly when the row draws it anyway: speculative sampling's rule for a draft that is
    a point mass (prompt lookup, an assistant's greedy token), kept with the probability the model gives it and
    otherwise replaced by a draw from the model's distribution without it; and a request draws the same tokens
    drafted or not. Greedy rows keep ``tokens``, their argmax. (Drafting rows have no penalty, bias or logprobs.)"""
    B, T, V = logits.shape
    drawn = jnp.maximum(sampling.drawn[:, None] + jnp.arange(T, dtype=jnp.int32) - first[:, None], 0)
    positions = dataclasses.replace(jax.tree.map(lambda a: jnp.repeat(a, T, axis=0), sampling),  # a row a position
                                    drawn=drawn.reshape(-1))
    tokens = draw_rows(logits.reshape(B * T, V).astype(jnp.float32), positions, sampler, tokens.reshape(-1))
    return tokens.reshape(B, T).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("k", "v"))
def encode_sources(graphdef, weights, k: Array, v: Array, ids: Array, valid: Array, tables: Array
                   ) -> tuple[Array, Array]:
    """An encoder-decoder's sources ``ids`` [B, S] (right padded: ``valid``) encoded, and every decoder layer's
    cross-attention keys and values of them written into the pool's blocks by the rows' source ``tables`` [B, M]
    (slot s: source token s; padding to the null block), as a step writes its tokens. Returns the pool's k, v."""
    model = nnx.merge(graphdef, weights)
    cross = model.decoder.cross_key_values(model.encode(ids, valid.astype(jnp.int32)))  # k, v [L, B, S, K, H]
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)
    pool = PagedKVCache(k, v, tables, jnp.zeros(ids.shape[0], jnp.int32)).write(
        {"k": cross.k.swapaxes(2, 3), "v": cross.v.swapaxes(2, 3)}, positions, valid)
    return pool.k, pool.v


# A compiled call's own cost in prompt tokens, and a program's compile on a request's path, by backend
# (``Engine._prefill_calls``): XLA:CPU computes a padded token as dearly as a real one (gpt2-124M prompt chunks: 1.0 ms
# a token, and 23 ms a call whatever its width, reading the weights), so prompt chunks of different widths run in calls
# of their own where that saves more than a call costs; and it compiles a program in seconds (gpt2-124M prompt-chunk
# programs of 2 and 3 rows: 2.4-4.4 s on one core, stalling every running sequence), so a step runs its chunks in
# programs already compiled (the warm-up's one-row ones) rather than compile another to save a call. Elsewhere (no
# entry) every prompt chunk of a step runs in one call.
CALL_COST_TOKENS = {"cpu": (24, 4096)}
# The most bytes of log-probabilities a scoring call holds (its [rows, width, vocabulary] float32): its rows are
# capped so (at prompt chunks of 256: gpt2's 50,257 tokens 4 rows, Llama 3's 128,256 two, Gemma's 262,144 one)
SCORE_CALL_BYTES = 256 << 20


def min_table_slots() -> int:
    """The narrowest block table, in tokens. Where each layer reads its rows a chunk at a time up to the last slot
    any row sees (XLA:CPU: ``attention.PAGED_CHUNK_SLOTS``; its C++ kernel reads up to each query's position), a
    wider table costs only its mask: 512 (fewer programs).
    Where each layer gathers its rows' whole tables: 64 (a gpt2-124M 16-row decode step measured the same at 16 to
    64 slots, block 16)."""
    return 64 if attention.PAGED_CHUNK_SLOTS.get(jax.default_backend()) is None else 512


@functools.partial(jax.jit, donate_argnames=("k", "v"))
def zero_blocks(k: Array, v: Array, blocks: Array) -> tuple[Array, Array]:
    """The pool's k, v with ``blocks`` zeroed in every layer (in place: donated, so no second pool is held); the
    block axis is 1 in the stacked pool [L, N, ...] and in each layer's own [K, N, ...] alike."""
    return jax.tree.map(lambda pool: pool.at[:, blocks].set(0), (k, v))


@functools.partial(jax.jit, donate_argnames=("k", "v"))
def copy_blocks(k: Array, v: Array, sources: Array, targets: Array) -> tuple[Array, Array]:
    """The pool's k, v with each of the blocks ``targets`` holding what the block at the same place of ``sources``
    holds, in every layer (in place: donated): copy on write, for a beam about to write its next token into a
    partly written block another beam shares. Padding pairs copy the null block onto itself."""
    return jax.tree.map(lambda pool: pool.at[:, targets].set(pool[:, sources]), (k, v))


def _bucket(n: int, cap: int) -> int:
    """The least of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (the powers of two and the midpoints between them) at or above
    ``n``, at most ``cap``: a padded batch wastes under a third of its rows, where powers alone waste up to half."""
    power = 1 << max(n - 1, 0).bit_length()
    return min(3 * power // 4 if power >= 4 and 3 * power // 4 >= n else power, cap)


def _bucket_floor(n: int) -> int:
    """The greatest of the widths ``_bucket`` gives (1, 2, 3, 4, 6, 8, 12, ...) at or below ``n`` >= 1."""
    power = 1 << (n.bit_length() - 1)
    return 3 * power // 2 if power >= 2 and 3 * power // 2 <= n else power


def _exact_pieces(count: int) -> list[int]:
    """``count`` tokens as widths ``_bucket`` leaves as they are (128 + 8 + 1 for 137), widest first: a model whose
    linear-attention layers carry a state runs a row's prompt chunk in calls of these widths, padding nothing."""
    pieces = []
    while count:
        pieces.append(_bucket_floor(count))
        count -= pieces[-1]
    return pieces


def _plan(rows: list[tuple[Sequence, int]], shape, call: int, compile_cost: int, compiled: set,
          most: int | None = None) -> tuple[float, list[list[tuple[Sequence, int]]]]:
    """The least-cost cut of ``rows`` (sequence, tokens), widest first, into calls of at most ``most`` rows (None:
    any), and its cost: a call costs ``call`` tokens, its padded [rows, width] program (``shape`` of its rows: (kind,
    rows, width, ...), the first row the widest) and ``compile_cost`` where that program is not ``compiled``
    (``Engine._prefill_calls``, ``Engine._encode_calls``); a sequence's two pieces never share a call, and its head
    (the wider) runs first."""
    rows = sorted(rows, key=lambda row: -row[1])
    # least[j]: the least cost of the first j rows, and where its last call starts
    least = [(0, 0)] + [(math.inf, 0)] * len(rows)
    for j in range(1, len(rows) + 1):
        for i in range(j):
            if len({id(seq) for seq, _ in rows[i:j]}) < j - i or (most is not None and j - i > most):
                continue
            program = shape(rows[i:j])
            cost = least[i][0] + call + program[1] * program[2] + (0 if program in compiled else compile_cost)
            if cost < least[j][0]:
                least[j] = (cost, i)
    calls, j = [], len(rows)
    while j:
        calls.append(rows[least[j][1]:j])
        j = least[j][1]
    return least[-1][0], calls[::-1]


def paged_pool(cfg, num_blocks: int, block_size: int, kernel: str | None) -> PagedKVCache:
    """An empty pool of ``num_blocks`` blocks for ``cfg``'s layers that keep per-token keys (multi-head latent
    attention: one head as wide as a latent and its rotary key, and DeepSeek sparse attention's indexer key beside;
    linear-attention layers keep none: their states live in slots, ``Engine.states``)."""
    heads, width = (1, cfg.latent.kv_rank + cfg.latent.rope_head_dim) if cfg.mla else (cfg.kv_heads, cfg.head_dim_)
    index_width = cfg.indexer.head_dim if cfg.mla and cfg.indexer is not None else 0
    linear = 0 if cfg.linear_attention is None else len(cfg.linear_attention.layers)
    return PagedKVCache.empty(cfg.decoder_layers - linear, num_blocks, block_size, heads, width, dtype_of(cfg.dtype),
                              kernel, latent=cfg.mla, index_width=index_width)


def decode_form(model, kernel: str | None, release: bool) -> tuple[tuple, list[Array], Callable]:
    """``model`` as the engine runs every call: its decode-loop form (on a CPU its layers apart; elsewhere the model
    itself), on XLA:CPU 1.1-1.2x faster for prompt chunks than the scanned stack (gpt2-124M, 64-256 tokens); a fused
    paged kernel's form has each layer its own pool, so its layers run apart on every backend. Returns its
    (graphdef, treedef), its weights as a flat list and its jitted step (``step_program``). ``release``: free the
    model's buffers this form does not share (one copy of the weights stays; the model cannot run afterwards)."""
    looping = model.for_decode_loop() if kernel is None else unstacked_decoder(model, always=True)
    graphdef, weights = nnx.split(looping)
    leaves, treedef = jax.tree.flatten(weights)
    if release:
        kept = {id(leaf) for leaf in leaves}
        for leaf in jax.tree.leaves(nnx.state(model)):
            if isinstance(leaf, jax.Array) and id(leaf) not in kept:
                leaf.delete()
    return (graphdef, treedef), leaves, step_program(graphdef, treedef, kernel, model.config.mla)


@dataclasses.dataclass
class Drafter:
    """An assistant model that drafts for greedy and drawing rows (``Engine(draft_model=)``): its weights and step
    program (``decode_form``) and its own pool, read and written through the target's block tables, so a block id
    holds the same positions in both pools."""

    weights: list[Array]
    run_step: Callable
    pool: PagedKVCache


class Engine:
    """Continuous batching of generation requests over a paged KV cache (module docstring). ``num_blocks`` blocks
    of ``block_size`` tokens in one pool per layer (block 0 is the null block); at most ``max_num_seqs`` sequences
    run at once; ``prefill_chunk`` prompt tokens per sequence and ``prefill_tokens`` in all per step;
    ``max_model_len``: the longest prompt + generation (default: the model's ``max_positions``, capped where
    ``position_limit`` stops, with a warning: longrope rotary at ``original_max_positions``); past ``max_positions``
    only with ``allow_beyond_max_positions`` (rotary and relative positions, as generate). ``seed``: the draws of
    requests without a seed of their own are keyed by it and their request id (None: a fresh seed each Engine, so
    two engines draw differently; give one to repeat a run's draws). ``draft_tokens`` k: plain greedy and drawing
    requests draft up to k tokens a step by prompt lookup (``sampling.prompt_lookup``), verified in the same step
    (one call of every drafting row, each position's greedy token or its draw: ``draw_program``): the output is the
    same, in fewer steps where drafts match; a rejected draft's slots are overwritten later (``stats``: drafts
    proposed and accepted). ``draft_schedule``: how many of the k a row drafts, 'constant' (k) or 'heuristic'
    (transformers' ``num_assistant_tokens_schedule``, each row by its own drafts: two more after a step that kept
    all it drafted, at most k; one fewer after one that did not, at least 1), which spends less on rows whose drafts
    are rarely kept (a draw at a high temperature) within the verifying calls' compiled widths.
    ``draft_model``: an assistant model drafts instead (vLLM's draft-model speculative decoding, transformers'
    ``assistant_model``): a decoder whose tokens are the target's (its vocabulary no larger), k of its greedy
    tokens a step, one call of all drafting rows each, verified as above. It keeps its own pool of the same blocks
    (``Drafter``), which every prompt chunk writes too; a row catches up on the tokens it has not read (the
    target's own token after a draft, two after a wholly accepted one) in its first call of a step.
    ``paged_attention``: what the steps read the paged cache by (``kernels.paged_kernel``): 'auto' (the backend's
    fused paged kernel where it serves the model: 'pallas-gpu' on NVIDIA GPUs and 'pallas-tpu' on TPUs for one-token
    rows of bfloat16 models, 'ffi-cpu' on CPUs for every call of float32 ones (``jaxformer.native``); else XLA),
    'xla', or a kernel by name (a Pallas one off its platform in Pallas's interpreter, for tests).
    ``release_model``: the engine owns ``model``: the buffers of it that the engine's own copy (the decode-loop form:
    on a CPU its layers apart) does not share are freed at once, so one copy of the weights stays, whoever still
    refers to the model (which cannot run afterwards); ``jaxformer serve`` does so."""

    def __init__(self, model, num_blocks: int, block_size: int = 16, max_num_seqs: int = 16,
                 prefill_chunk: int = 256, prefill_tokens: int | None = None, max_model_len: int | None = None,
                 allow_beyond_max_positions: bool = False, seed: int | None = None, draft_tokens: int = 0,
                 draft_model=None, paged_attention: str = "auto", release_model: bool = False,
                 draft_schedule: str = "constant"):
        cfg = model.config
        problem = paging_problem(model)
        if problem is not None:
            raise ValueError(f"the serving engine cannot page {cfg.name!r}: {problem}")
        self.kernel = kernels.paged_kernel(paged_attention, cfg)
        prefill_tokens = 2 * prefill_chunk if prefill_tokens is None else prefill_tokens
        limit, why = position_limit(cfg, allow_beyond_max_positions)
        if max_model_len is None:
            max_model_len = Engine.default_max_model_len(cfg, allow_beyond_max_positions)
            if max_model_len < cfg.max_positions:
                warnings.warn(f"Engine max_model_len={max_model_len}, not max_positions={cfg.max_positions}: {why}")
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_num_seqs", max_num_seqs),
                            ("prefill_chunk", prefill_chunk), ("prefill_tokens", prefill_tokens),
                            ("max_model_len", max_model_len)):
            if not _is_int(value) or value < 1:
                raise ValueError(f"Engine {name}={value!r}: want an int >= 1")
        if limit is not None and max_model_len > limit:
            raise ValueError(f"Engine max_model_len={max_model_len} exceeds {limit} for {cfg.name!r}: {why}")
        if seed is not None and not (_is_int(seed) and 0 <= seed < 2 ** 32):
            raise ValueError(f"Engine seed={seed!r}: want None or an int in [0, 2**32)")
        if not _is_int(draft_tokens) or draft_tokens < 0:
            raise ValueError(f"Engine draft_tokens={draft_tokens!r}: want an int >= 0 (0: no drafting)")
        self.draft_tokens = draft_tokens
        if draft_schedule not in ("constant", "heuristic"):
            raise ValueError(f"Engine draft_schedule={draft_schedule!r}: want 'constant' or 'heuristic'")
        self.draft_schedule = draft_schedule
        self.drafted = self.accepted = 0  # draft tokens proposed and accepted so far
        self.seed = int(np.random.SeedSequence().entropy % 2 ** 32) if seed is None else int(seed)
        self.config = cfg
        self.manager = BlockManager(num_blocks, block_size)
        self.block_size, self.max_num_seqs, self.prefill_chunk = block_size, max_num_seqs, prefill_chunk
        self.prefill_tokens, self.max_model_len = prefill_tokens, max_model_len
        self.max_blocks = -(-self.max_model_len // block_size)  # a sequence's blocks at most
        self.pool = paged_pool(cfg, num_blocks, block_size, self.kernel)
        # (linear-attention layers (Qwen3-Next, Kimi Linear) keep no keys: their fixed-size states live in pools of
        # one slot a running sequence, slot 0 the padding rows')
        linear = 0 if cfg.linear_attention is None else len(cfg.linear_attention.layers)
        self.states, self.free_slots = None, []
        if linear:
            empty = LinearState.empty(cfg, linear, max_num_seqs + 1, dtype_of(cfg.dtype))
            self.states, self.free_slots = (empty.conv, empty.state), list(range(max_num_seqs, 0, -1))
        eos = generation_defaults(model)["eos_token_id"]
        self.eos_ids = frozenset(() if eos is None else (eos,) if isinstance(eos, int) else eos)
        # the other ids generate applies (checkpoint_config): bad words never chosen, a forced first and last token
        # (``_forced``), an encoder-decoder's decoder prompt (its start token)
        ids = checkpoint_config(model)
        self.banned = ids.bad_token_ids
        self.renormalize = ids.renormalize_logits  # (beam scores only: it moves no argmax)
        self.forced_bos, self.forced_eos = ids.forced_bos_token_id, ids.forced_eos_token_id
        self.checkpoint_beams = checkpoint_beams(model)  # (the beam width the warm-up compiles the choice of)
        encoder_decoder = cfg.family == "encoder_decoder"
        self.decoder_prompt = [ids.decoder_start_token_id] if encoder_decoder else None
        # a source's length at most: the encoder's positions, and the pool beside its shortest target's blocks
        self.max_source_len = None
        if encoder_decoder:
            self.max_source_len = min(limit or math.inf, (self.manager.usable - 1) * block_size)
            self.source_why = why if limit is not None and self.max_source_len == limit else "the pool's size"
        self.graph, self.weights, self.run_step = decode_form(model, self.kernel, release_model)
        self.drafter = None
        if draft_model is not None:
            problem = self._draft_problem(draft_model)
            if problem is not None:
                raise ValueError(f"Engine draft_model {draft_model.config.name!r}: {problem}")
            kernel = kernels.paged_kernel(paged_attention, draft_model.config)
            # (the model as its own assistant, a test's: the same weights and programs, a pool of its own)
            _, weights, run = ((None, self.weights, self.run_step) if draft_model is model
                               else decode_form(draft_model, kernel, release_model))
            self.drafter = Drafter(weights, run, paged_pool(draft_model.config, num_blocks, block_size, kernel))
        # the prefix-cached blocks whose every slot the assistant's pool holds for their tokens (``_advance``): a
        # sequence sharing them starts its assistant there, not at a block a non-drafting row (or one ended
        # before its assistant caught up) left without them
        self.drafter_blocks: set[int] = set()
        # one call a step for the one-token rows and the prompt chunks together (``_pack``): where the kernel reads
        # every call's rows itself, each token a row of its own reads straight from the pool, so a step reads the
        # weights once, not once a call. (An assistant's pool reads the chunks at their own shapes; an
        # encoder-decoder's and a linear stack's calls never take the kernel.)
        self.packs = self.kernel in kernels.MANY_QUERY_KERNELS and self.drafter is None
        # the bucket of a packed call's most tokens (every packed program's is one at or below it)
        self.max_packed = _bucket(self._packable(self.max_blocks), math.inf)
        self.waiting: list[Sequence] = []  # arrival order (a request's id is its place in it)
        self.running: list[Sequence] = []  # admission order
        self.ids = itertools.count()
        # each program run and its first call's seconds (its compilation): a step's model call, (kind, rows, width,
        # table width, source table width or None), and its rows' choice, ("choose", rows, history width,
        # logit-bias width, SamplerFlags, whether a token is forced) (``_run``); a source encoding, ("encode", rows,
        # source width)
        self.programs: dict[tuple, float] = {}
        self.preemptions = self.shared_blocks = 0  # sequences preempted; blocks taken from the prefix cache
        self.copies: list[tuple[int, int]] = []  # (source, target) blocks to copy before the step's calls

    # ------------------------------------------------------------------------------------------ requests

    def _draft_problem(self, draft_model) -> str | None:
        """Why ``draft_model`` cannot draft for this engine's model (None: it can)."""
        cfg, target = draft_model.config, self.config
        if self.draft_tokens < 1:
            return "give draft_tokens >= 1, the tokens it drafts a step"
        if target.family != "decoder":
            return f"{target.name!r} is an encoder-decoder, whose rows draft nothing"
        if self.states is not None:
            return f"{target.name!r}'s linear-attention states cannot be rewound past a rejected draft"
        problem = paging_problem(draft_model)
        if problem is None and cfg.family != "decoder":
            problem = "an encoder-decoder drafts nothing"
        if problem is None and cfg.linear_attention is not None:
            problem = "its linear-attention states cannot be rewound past a rejected draft"
        if problem is not None:
            return problem
        if cfg.vocab_size > target.vocab_size:
            return (f"its vocabulary ({cfg.vocab_size}) is larger than {target.name!r}'s ({target.vocab_size}): its "
                    "tokens must be the target's")
        draft_limit, _ = position_limit(cfg)
        longest = min(cfg.max_positions, draft_limit or math.inf)
        if longest < self.max_model_len:
            return f"it reads {longest} positions at most, fewer than max_model_len={self.max_model_len}"
        return None

    def add_request(self, prompt_ids=None, params: SamplingParams | None = None, source_ids=None) -> int:
        """Queue a request; returns its id. Refused at once (``check_request``). An encoder-decoder's request
        gives its ``source_ids`` (encoded once, when it is admitted) and, as ``prompt_ids``, its decoder prompt
        (None: the decoder start token alone, as generate starts)."""
        params = SamplingParams() if params is None else params
        prompt = self.check_request(prompt_ids, params, source_ids)
        request_id = next(self.ids)
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_ids))
        seed = params.seed
        if seed is None:  # the engine's seed and the request's id, mixed into one
            seed = int(np.random.SeedSequence([self.seed, request_id]).generate_state(1)[0])
        source = None if source_ids is None else self._ids(source_ids)
        seq = Sequence(request_id, prompt, params, frozenset(stops), seed, source=source)
        if params.beam_width > 1:
            seq.group = BeamGroup(seq, params.beam_width, self._beam_keep(params, stops))
            seq.group.restart()
        self.waiting.append(seq)
        return request_id

    def _beam_keep(self, params: SamplingParams, stops) -> int:
        """The candidates a beam search ranks each step, as generate's: two a beam, one more a beam for each stop
        id past the first (so enough go on running however many stop)."""
        return max(2, 1 + len(stops)) * params.beam_width

    def check_request(self, prompt_ids, params: SamplingParams, source_ids=None) -> list[int]:
        """The prompt's ids as a list (an encoder-decoder's decoder prompt: None gives its start token), or a
        ValueError: token ids outside the vocabulary, an empty prompt, prompt + ``max_tokens`` beyond
        ``max_model_len`` or (with the source's blocks) beyond what the pool holds; an encoder-decoder's source
        missing, empty or longer than ``max_source_len``, a decoder's given. It reads the engine's settings alone,
        so a server calls it from any thread, while a step runs."""
        source_blocks = self._check_source(source_ids)
        if prompt_ids is None and self.decoder_prompt is not None:
            prompt_ids = self.decoder_prompt
        prompt = [] if prompt_ids is None else self._ids(prompt_ids)
        if not prompt:
            raise ValueError("prompt_ids is empty: want at least one token id")
        bad = [i for i in prompt if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ValueError(f"prompt_ids hold {bad[:5]} outside the vocabulary [0, {self.config.vocab_size})")
        if params.prompt_logprobs is not None and self.decoder_prompt is not None:
            raise ValueError("SamplingParams.prompt_logprobs: an encoder-decoder's prompt is its source, which the "
                             "decoder does not predict")
        biased = [token for token, _ in params.logit_bias if token >= self.config.vocab_size]
        if biased:
            raise ValueError(f"SamplingParams.logit_bias holds {biased[:5]} outside the vocabulary "
                             f"[0, {self.config.vocab_size})")
        forced = params.forced_bos_token_id
        if forced is not None and forced >= self.config.vocab_size:
            raise ValueError(f"SamplingParams.forced_bos_token_id={forced} is outside the vocabulary "
                             f"[0, {self.config.vocab_size})")
        total = len(prompt) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt of {len(prompt)} tokens + max_tokens={params.max_tokens} = {total} exceeds "
                             f"max_model_len={self.max_model_len}")
        width = params.beam_width
        if width > 1 and self.states is not None:
            raise ValueError(f"SamplingParams.beam_width={width}: {self.config.name!r}'s linear-attention layers keep "
                             "one state a sequence, which beams cannot share or fork (beam search is generate's "
                             "for it)")
        if width > self.max_num_seqs:
            raise ValueError(f"SamplingParams.beam_width={width}: each beam is a row of the batch, and the engine runs "
                             f"at most max_num_seqs={self.max_num_seqs}")
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_ids))
        if width > 1 and self._beam_keep(params, stops) > self.config.vocab_size:
            raise ValueError(f"SamplingParams.beam_width={width} ranks {self._beam_keep(params, stops)} candidates a "
                             f"step, more than the vocabulary's {self.config.vocab_size} tokens")
        # (beams share the prompt's full blocks, and at worst nothing after them: a search the pool cannot hold so
        # would preempt itself for ever)
        blocks, shared = -(-total // self.block_size), len(prompt) // self.block_size
        needed = shared + width * (blocks - shared)
        if needed + source_blocks > self.manager.usable:
            source = f" and a source of {source_blocks} blocks" if source_blocks else ""
            beams = f" ({blocks - shared} for each of {width} beams)" if width > 1 else ""
            raise ValueError(f"prompt of {len(prompt)} tokens + max_tokens={params.max_tokens} needs {needed} blocks "
                             f"of {self.block_size}{beams}{source}; the pool has {self.manager.usable}")
        return prompt

    @staticmethod
    def _ids(ids) -> list[int]:
        return [int(i) for i in np.asarray(ids).reshape(-1)]

    def _check_source(self, source_ids) -> int:
        """The blocks an encoder-decoder's source takes (0: a decoder's request, which has none), or a ValueError."""
        if self.max_source_len is None:
            if source_ids is not None:
                raise ValueError(f"source_ids are an encoder-decoder's; {self.config.name!r} is a decoder: pass the "
                                 "prompt as prompt_ids")
            return 0
        if source_ids is None:
            raise ValueError(f"{self.config.name!r} is an encoder-decoder: its request needs source_ids (what the "
                             "encoder reads)")
        source = self._ids(source_ids)
        if not source:
            raise ValueError("source_ids is empty: want at least one token id")
        bad = [i for i in source if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ValueError(f"source_ids hold {bad[:5]} outside the vocabulary [0, {self.config.vocab_size})")
        if len(source) > self.max_source_len:
            raise ValueError(f"source of {len(source)} tokens exceeds max_source_len={self.max_source_len} "
                             f"({self.source_why})")
        return -(-len(source) // self.block_size)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: int) -> bool:
        """End a request now (its client went away), freeing its blocks (every beam's); False if it had already
        ended."""
        for seq in self.running:
            if seq.request_id == request_id:
                for member in self._members(seq):
                    self._free(member)
                    self.running.remove(member)
                return True
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                return True
        return False

    def stats(self) -> dict[str, int]:
        """What a server reports: requests waiting and running, blocks used of the pool's, preemptions so far,
        blocks shared from the prefix cache so far, programs compiled, tokens in the running sequences' blocks (an
        encoded source's too), draft tokens proposed and accepted so far."""
        return {"waiting": len(self.waiting), "running": len(self.running), "blocks_used": self.manager.used(),
                "tokens_held": sum(seq.computed + (len(seq.source) if seq.encoded else 0) for seq in self.running),
                "blocks": self.manager.usable, "preemptions": self.preemptions, "shared_blocks": self.shared_blocks,
                "programs": len(self.programs), "drafted": self.drafted, "accepted_drafts": self.accepted}

    def run(self) -> dict[int, list[int]]:
        """Step until every request ended: each request's generated tokens."""
        out: dict[int, list[int]] = {}
        while self.has_unfinished():
            for result in self.step():
                out.setdefault(result.request_id, []).extend(result.token_ids)
        return out

    # ------------------------------------------------------------------------------------------ scheduling

    def _draftable(self, seq: Sequence) -> bool:
        """Whether ``seq`` drafts its next tokens (``draft_tokens``): a plain greedy or drawing request (no penalties,
        no logit bias, no logprobs, no forced first token) of a decoder without forced tokens, whose choices one
        verifying call reproduces (the argmax of the logits with the bad words banned, or ``draw_program``'s draws
        from them)."""
        p = seq.params
        return (self.draft_tokens > 0 and seq.source is None and seq.group is None and self.states is None
                and self.forced_bos is None
                and self.forced_eos is None and p.forced_bos_token_id is None
                and p.repetition_penalty == 1 and p.presence_penalty == 0 and p.frequency_penalty == 0
                and not p.logit_bias and p.logprobs is None)

    def _draft_limit(self, seq: Sequence) -> int:
        """The most drafts ``seq`` proposes a step: ``draft_tokens``, or its own under the heuristic schedule."""
        return self.draft_tokens if seq.draft_limit is None else seq.draft_limit

    def _blocks_for(self, seq: Sequence, count: int) -> bool:
        """Give ``seq`` the blocks its next ``count`` tokens go to; False when the pool has too few free. A partly
        written block it shares (a beam's, forked from another beam's) becomes its own first: a fresh block, which
        the step fills with the shared one's contents before its calls (``copies``), the shared one left to the
        others."""
        need = -(-(seq.computed + count) // self.block_size) - len(seq.blocks)
        at = seq.computed // self.block_size
        shared = at < len(seq.blocks) and self.manager.refs[seq.blocks[at]] > 1
        if need + shared > self.manager.available():
            return False
        if shared:
            block = self._allocate()
            self.copies.append((seq.blocks[at], block))
            self.manager.release([seq.blocks[at]])
            seq.blocks[at] = block
        seq.blocks += [self._allocate() for _ in range(need)]
        return True

    def _allocate(self) -> int:
        """A free block (``BlockManager.allocate``), whose assistant keys, if any, are a former owner's."""
        block = self.manager.allocate()
        self.drafter_blocks.discard(block)
        return block

    def _source_blocks(self, seq: Sequence) -> bool:
        """Give an encoder-decoder's admitted ``seq`` the blocks its source's keys and values go to (written by
        ``_encode`` this step); False when the pool has too few free."""
        need = 0 if seq.source is None else -(-len(seq.source) // self.block_size)
        if need > self.manager.available():
            return False
        seq.source_blocks = [self._allocate() for _ in range(need)]
        return True

    def _free(self, seq: Sequence) -> None:
        self.manager.release(seq.source_blocks + seq.blocks)
        seq.blocks, seq.keys, seq.computed, seq.drafter_read = [], [], 0, 0
        seq.source_blocks, seq.encoded = [], False
        if seq.slot:  # (its state is read again only as zeros: a sequence given the slot starts from nothing)
            self.free_slots.append(seq.slot)
            seq.slot = 0

    def _fail(self, seq: Sequence) -> None:
        """End ``seq`` in error (its logits were not finite) with no token, and every beam of its search. What it
        wrote may be NaN too, and a masked slot still multiplies its value by a weight of 0 (NaN again): the blocks
        held by it alone (by its beams alone) leave the prefix cache and are zeroed, with the null block its padding
        wrote to, before anyone reads them again."""
        members = self._members(seq)
        held = collections.Counter(block for member in members for block in member.source_blocks + member.blocks)
        alone = [block for block, count in held.items() if self.manager.refs[block] == count]
        self.manager.forget(alone)
        k, v = zero_blocks(self.pool.k, self.pool.v, jnp.asarray([NULL_BLOCK, *alone], jnp.int32))
        self.pool = dataclasses.replace(self.pool, k=k, v=v)
        if self.drafter is not None:  # (its pool: the same blocks)
            pool = self.drafter.pool
            k, v = zero_blocks(pool.k, pool.v, jnp.asarray([NULL_BLOCK, *alone], jnp.int32))
            self.drafter.pool = dataclasses.replace(pool, k=k, v=v)
            self.drafter_blocks.difference_update(alone)
        for member in members:
            member.finish_reason = "error"
            self._free(member)
            self.running.remove(member)

    @staticmethod
    def _members(seq: Sequence) -> list[Sequence]:
        """The sequences that go together with ``seq``: its beam search's running beams, or itself."""
        return [seq] if seq.group is None else list(seq.group.members)

    def _rows(self, seq: Sequence) -> int:
        """The batch rows ``seq``'s request takes: its beam width (a search not yet begun holds them for its beams)."""
        return seq.params.beam_width

    def _preempt(self, seq: Sequence) -> None:
        """``seq`` gives its blocks back and waits again in its arrival order, to compute its tokens anew; a beam
        search's beams all go, and it begins again (``BeamGroup.restart``)."""
        freed = set()
        for member in self._members(seq):
            freed.update(member.blocks)
            self._free(member)
            self.running.remove(member)
        if seq.group is not None:
            self.copies = [(source, target) for source, target in self.copies if target not in freed]
            seq = seq.group.restart()
        bisect.insort(self.waiting, seq, key=lambda waiting: waiting.request_id)
        self.preemptions += 1

    def _schedule(self) -> list[tuple[Sequence, int]]:
        """This step's work: (sequence, tokens it feeds), every running sequence that can go, then admissions, then
        the decoding rows' drafts in the blocks left (``_drafts``)."""
        work, budget, preempted = [], self.prefill_tokens, False
        for seq in list(self.running):
            if seq not in self.running:  # preempted for an older sequence's blocks
                continue
            left = len(seq.tokens) - seq.computed
            count = 1 if left == 1 else min(left, self.prefill_chunk, budget)
            if count == 0:
                continue
            while not self._blocks_for(seq, count):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq or (victim.group is not None and victim.group is seq.group):
                    break
            else:
                work.append((seq, count))
                budget -= count if left > 1 else 0
        if preempted:  # (a beam search's beams scheduled before one of them was preempted with all the others)
            running = set(map(id, self.running))
            work = [(seq, count) for seq, count in work if id(seq) in running]
        rows = sum(map(self._rows, {id(seq.group or seq): seq for seq in self.running}.values()))
        while (self.waiting and not preempted and rows + self._rows(self.waiting[0]) <= self.max_num_seqs
               and budget > 0):
            seq = self.waiting[0]
            tokens = seq.tokens
            # (an encoder-decoder's decoder keys depend on its source, which the prefix keys do not hold: not shared)
            # (nor a prompt whose log-probabilities are asked: each of its positions is computed)
            # (nor a model with linear-attention layers: its states hold the whole prefix, which no block does)
            cacheable = (len(tokens) - 1) // self.block_size \
                if seq.source is None and seq.params.prompt_logprobs is None and self.states is None else 0
            shared = self.manager.cached_prefix(tokens, cacheable)
            seq.blocks, seq.computed = list(shared), len(shared) * self.block_size
            seq.drafter_read = self.block_size * next(  # (up to the first shared block its pool lacks)
                (i for i, block in enumerate(shared) if block not in self.drafter_blocks), len(shared))
            seq.keys = self._prefix_keys(tokens, len(shared))
            count = min(len(tokens) - seq.computed, self.prefill_chunk, budget)
            if not self._source_blocks(seq) or not self._blocks_for(seq, count):
                self._free(seq)
                break
            self.waiting.pop(0)
            self.running.append(seq)
            if self.states is not None:
                seq.slot = self.free_slots.pop()
            rows += self._rows(seq)
            self.shared_blocks += len(shared)
            work.append((seq, count))
            budget -= count
        return self._drafts(work)

    def _drafts(self, work: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """``work`` with each drafting row's drafts (``_draftable``, feeding its one last token: by prompt lookup or
        the assistant model, ``_assistant_drafts``) added to its count: as many as fit in its blocks and those still
        free once every row and admission of the step has its own, so a draft never takes a block another sequence
        needs this step (it preempts none)."""
        asked = []
        for seq, count in work:
            if count == 1 and len(seq.tokens) - seq.computed == 1 and self._draftable(seq):
                room = (len(seq.blocks) + self.manager.available()) * self.block_size - seq.computed - 1
                most = min(self._draft_limit(seq), room, seq.params.max_tokens - len(seq.generated) - 1)
                if self.drafter is None:
                    seq.draft = prompt_lookup(seq.tokens, most)
                    most = len(seq.draft)
                elif most > 0:
                    asked.append((seq, most))
                self._blocks_for(seq, 1 + most)  # (within room: it gets them)
        if asked:
            self._assistant_drafts(asked)
        return [(seq, count + len(seq.draft)) for seq, count in work]

    def _assistant_drafts(self, rows: list[tuple[Sequence, int]]) -> None:
        """Each row's ``count`` greedy tokens of the assistant model as its ``draft``: one call of every row still
        drafting a token, each feeding what its pool has not read (at most two tokens a call: the target's last
        token, and after a wholly accepted draft the draft's last one; a row further behind reads the rest first,
        ``_catch_up``), so its calls compile two widths."""
        for seq, _ in rows:
            self._catch_up(seq, len(seq.tokens) - 1)
        drafting = rows
        while drafting:
            feeds = [(seq, seq.tokens + seq.draft) for seq, _ in drafting]
            fed = [min(2, len(tokens) - seq.drafter_read) for seq, tokens in feeds]
            chosen = self._draft_call([(seq, tokens, seq.drafter_read, n) for (seq, tokens), n in zip(feeds, fed)])
            for (seq, tokens), token in zip(feeds, chosen):
                if seq.drafter_read == len(tokens):  # (read up to its last token: what follows is a draft)
                    seq.draft.append(int(token))
            drafting = [(seq, count) for seq, count in drafting if len(seq.draft) < count]

    def _prefix_keys(self, tokens: list[int], blocks: int) -> list[bytes]:
        keys, key = [], None
        for b in range(blocks):
            key = self.manager.chain(key, tokens[b * self.block_size:(b + 1) * self.block_size])
            keys.append(key)
        return keys

    # ------------------------------------------------------------------------------------------ one step

    def step(self) -> list[RequestOutput]:
        """Schedule; encode the admitted sources (an encoder-decoder's); run the one-token rows, the drafting rows (one
        compiled call each) and the prompt chunks (``_prefill_calls``); hand back each request's new tokens (a drafting
        row's kept drafts and the model's next one) and whether it ended."""
        work = self._schedule()
        self._copy_blocks()
        for sources in self._encode_calls([seq for seq, _ in work if seq.source is not None and not seq.encoded]):
            self._encode(sources)
        # (a prompt whose log-probabilities are asked runs its chunks in calls of their own, which score every
        # position: such a call holds its rows' log-probabilities at every position, [B, T, V], so its rows are few)
        scored = [w for w in work if w[0].scoring()]
        work = [w for w in work if not w[0].scoring()]
        # (the one-token rows longest first: each group of rows reads up to its own longest, attention.PAGED_ROW_GROUP)
        decode = sorted((w for w in work if w[1] == 1), key=lambda w: -w[0].computed)
        chunks = [w for w in work if w[1] > 1 and not w[0].draft]
        if self.packs and chunks:
            calls = [("packed", self._pack(decode, chunks))]
        else:
            calls = [("decode", decode)] + [("prefill", rows) for rows in self._prefill_calls(chunks)]
        calls.append(("verify", [w for w in work if w[0].draft]))
        calls += [("score", rows) for rows in self._prefill_calls(scored, "score")]
        outputs = []
        for kind, rows in calls:
            # (a chunk's head piece that ended in error; a beam whose search another beam's error ended)
            rows = [row for row in rows if row[0].finish_reason is None]
            if rows:
                *result, scores = self._run(kind, rows)
                if scores is not None:
                    self._keep_scores(rows, *scores)
                outputs += self._advance(rows, *result)
        return outputs

    def _pack(self, decode: list[tuple[Sequence, int]], chunks: list[tuple[Sequence, int]]
              ) -> list[tuple[Sequence, int]]:
        """A packed call's rows: the one-token rows, then the prompt chunks, the last chunks cut short so the
        call's tokens fill a bucket (``_bucket_floor``) rather than pad to the next one, where the tokens left
        ride in a call that runs anyway (one-token rows run the next step too) or padding costs more than a call
        (``CALL_COST_TOKENS``): a 137-token prompt alone runs 128 tokens, then 9, not 137 padded to 192; beside
        23 one-token rows, 105 of its tokens now (128 in all) and the rest with the next step's rows. A chunk cut
        to nothing sits this step out (its blocks stay its own)."""
        rows = decode + chunks
        total = sum(count for _, count in rows)
        fits = _bucket_floor(total)
        padding = _bucket(total, self.max_packed) - total
        call = CALL_COST_TOKENS.get(jax.default_backend(), (math.inf,))[0]
        if not padding or fits <= len(decode) or not (decode or padding > call):
            return rows
        excess, kept = total - fits, list(decode)
        for seq, count in reversed(chunks):
            cut = min(excess, count)
            excess -= cut
            if count > cut:
                kept.insert(len(decode), (seq, count - cut))
        return kept

    def _copy_blocks(self) -> None:
        """Copy the blocks the schedule asked for (copy on write, ``_blocks_for``) in one call, the pairs padded to a
        bucket (the null block onto itself)."""
        if not self.copies:
            return
        count = _bucket(len(self.copies), self.manager.usable)
        sources, targets = (np.full(count, NULL_BLOCK, np.int32) for _ in range(2))
        sources[:len(self.copies)], targets[:len(self.copies)] = zip(*self.copies)
        started = time.perf_counter()
        k, v = copy_blocks(self.pool.k, self.pool.v, sources, targets)
        self.pool = dataclasses.replace(self.pool, k=k, v=v)
        self.programs.setdefault(("copy", count), time.perf_counter() - started)
        self.copies = []

    def _keep_scores(self, rows: list[tuple[Sequence, int]], target: np.ndarray, top: np.ndarray,
                     top_ids: np.ndarray) -> None:
        """A scoring call's log-probabilities ([B, T] and [B, T, k], left padded as the call's ids) kept by the prompt
        position each column predicts."""
        T = target.shape[1]
        for r, (seq, count) in enumerate(rows):
            k = seq.params.prompt_logprobs
            for column in range(T - count, T):
                predicted = seq.computed + column - (T - count) + 1
                if predicted < len(seq.prompt):
                    pairs = tuple((int(i), float(x)) for i, x in zip(top_ids[r, column, :k], top[r, column, :k]))
                    seq.prompt_scores[predicted] = TokenLogprobs(seq.prompt[predicted], float(target[r, column]),
                                                                 pairs)

    def _prefill_calls(self, rows: list[tuple[Sequence, int]], kind: str = "prefill"
                       ) -> list[list[tuple[Sequence, int]]]:
        """The prompt-chunk rows split into calls: one call where a call costs more than padding
        (``CALL_COST_TOKENS``), else the rows, widest first, cut where the padded tokens of the calls' [rows, width]
        buckets, the calls' own cost and the programs they would compile are least (a 250-token chunk and a
        50-token one: [1, 256] and [1, 64], not [2, 256]; two of 60 tokens: [2, 64] once compiled, else two calls).
        A chunk that two calls of its own would run for less than one (137 tokens: [1, 128] then [1, 12], not
        [1, 192]) is offered as those two pieces, its head first (the plan with them or without, whichever costs
        less): the tail's call reads the head's keys from the pool, as a later chunk reads an earlier one's.
        ``kind`` "score": chunks of prompts whose log-probabilities are asked, whose calls hold every position's
        log-probabilities [rows, width, vocabulary]: at most ``_score_rows()`` rows a call."""
        if not rows:
            return [rows]
        if self.states is not None:  # (a padded token would move a linear layer's convolution window)
            return [[(seq, piece)] for seq, count in rows for piece in _exact_pieces(count)]
        most = self._score_rows() if kind == "score" else None
        costs = CALL_COST_TOKENS.get(jax.default_backend())
        if costs is None:
            return [rows] if most is None else [rows[i:i + most] for i in range(0, len(rows), most)]
        call, compile_cost = costs
        compiled = {program[:4] for program in self.programs}

        def shape(rows: list[tuple[Sequence, int]]) -> tuple:
            return (kind, _bucket(len(rows), self.max_num_seqs), _bucket(rows[0][1], self.prefill_chunk),
                    self._table_width(max(len(seq.blocks) for seq, _ in rows)))

        def alone(seq: Sequence, count: int) -> float:  # the cost of a call of this chunk alone
            return _plan([(seq, count)], shape, call, compile_cost, compiled)[0]

        pieces = []
        for seq, count in rows:
            head = _bucket_floor(count)
            if head < count and alone(seq, head) + alone(seq, count - head) < alone(seq, count):
                pieces += [(seq, head), (seq, count - head)]
            else:
                pieces.append((seq, count))
        plans = [_plan(rows, shape, call, compile_cost, compiled, most)]
        if len(pieces) > len(rows):
            plans.append(_plan(pieces, shape, call, compile_cost, compiled, most))
        return min(plans, key=lambda plan: plan[0])[1]

    def _score_rows(self) -> int:
        """The most rows a scoring call holds: a bucket whose widest call's log-probabilities [rows, prefill_chunk,
        vocabulary] (float32) fit ``SCORE_CALL_BYTES``; at least one."""
        fit = SCORE_CALL_BYTES // (4 * self.prefill_chunk * self.config.vocab_size)
        return _bucket_floor(min(max(fit, 1), self.max_num_seqs))

    def _encode_calls(self, admitted: list[Sequence]) -> list[list[Sequence]]:
        """The admitted sources split into encoding calls as prompt chunks are (``_prefill_calls``): where a call
        costs more than padding, all at once; else the least-cost cut, which after the warm-up runs each source in
        a one-row program at its width (sources of 20 and 250 tokens: [1, 24] and [1, 256], not [2, 256])."""
        costs = CALL_COST_TOKENS.get(jax.default_backend())
        if not admitted or costs is None:
            return [admitted] if admitted else []

        def shape(rows: list[tuple[Sequence, int]]) -> tuple:
            return self._encode_shape([seq for seq, _ in rows])
        calls = _plan([(seq, len(seq.source)) for seq in admitted], shape, *costs, set(self.programs))[1]
        return [[seq for seq, _ in rows] for rows in calls]

    def _encode_shape(self, sources: list[Sequence]) -> tuple[str, int, int]:
        """The ("encode", rows, source width) program of ``sources``, both bucketed."""
        return ("encode", _bucket(len(sources), self.max_num_seqs),
                _bucket(max(len(seq.source) for seq in sources), self.max_source_len))

    def _forced(self, rows: list[tuple[Sequence, int]], B: int) -> np.ndarray | None:
        """The rows' forced tokens [B] (-1: the row chooses), as generate forces them: the request's
        ``forced_bos_token_id`` or else the checkpoint's as its first token, ``forced_eos_token_id`` as its last (at
        ``max_tokens``; it wins where both fall on one token). None where nothing can be forced: a decoder whose
        checkpoint forces nothing and whose rows ask nothing (its programs hold no forcing). An encoder-decoder's
        calls always hold it (a request's target language compiles no other program than the warm-up's)."""
        firsts = [self.forced_bos if seq.params.forced_bos_token_id is None else seq.params.forced_bos_token_id
                  for seq, _ in rows]
        if self.forced_eos is None and self.decoder_prompt is None and all(first is None for first in firsts):
            return None
        forced = np.full(B, -1, np.int32)
        for r, (seq, count) in enumerate(rows):
            if seq.computed + count < len(seq.tokens):  # a prompt chunk short of the prompt's end: no token yet
                continue
            drawn = len(seq.generated)
            if self.forced_eos is not None and drawn == seq.params.max_tokens - 1:
                forced[r] = self.forced_eos
            elif firsts[r] is not None and drawn == 0:
                forced[r] = firsts[r]
        return forced

    def _encode(self, admitted: list[Sequence]) -> None:
        """Encode the ``admitted`` encoder-decoder sequences' sources (one compiled call, rows and source width
        bucketed: ``_encode_calls``) into their source blocks, before their first decoder step reads them."""
        if not admitted:
            return
        program = self._encode_shape(admitted)
        _, B, S = program
        ids = np.full((B, S), self.config.tokens.pad or 0, np.int32)
        valid, tables = np.zeros((B, S), bool), np.full((B, -(-S // self.block_size)), NULL_BLOCK, np.int32)
        for r, seq in enumerate(admitted):
            ids[r, :len(seq.source)], valid[r, :len(seq.source)] = seq.source, True
            tables[r, :len(seq.source_blocks)] = seq.source_blocks
            seq.encoded = True
        started = time.perf_counter()
        graphdef, treedef = self.graph
        k, v = encode_sources(graphdef, jax.tree.unflatten(treedef, self.weights), self.pool.k, self.pool.v, ids, valid,
                              tables)
        self.pool = dataclasses.replace(self.pool, k=k, v=v)
        self.programs.setdefault(program, time.perf_counter() - started)

    def _source_rows(self, rows: list[tuple[Sequence, int]], B: int) -> tuple[np.ndarray, np.ndarray] | None:
        """An encoder-decoder's rows' source tables [B, Ms] (``_source_table_width``) and source lengths [B] (None:
        a decoder's rows)."""
        if self.max_source_len is None:
            return None
        width = self._source_table_width(max(len(seq.source_blocks) for seq, _ in rows))
        tables, lengths = np.full((B, width), NULL_BLOCK, np.int32), np.zeros(B, np.int32)
        for r, (seq, _) in enumerate(rows):
            tables[r, :len(seq.source_blocks)] = seq.source_blocks
            lengths[r] = len(seq.source or ())
        return tables, lengths

    def _run(self, kind: str, rows: list[tuple[Sequence, int]]
             ) -> tuple[np.ndarray, tuple | None, tuple | None, np.ndarray, tuple | None]:
        B = _bucket(len(rows), self.max_num_seqs)
        # (verify: its token and k drafts)
        widest = self.prefill_chunk if kind in ("prefill", "score") else 1 + self.draft_tokens
        T = 1 if kind in ("decode", "packed") else _bucket(max(count for _, count in rows), widest)
        M = self._table_width(max(len(seq.blocks) for seq, _ in rows))
        picks = None
        if kind == "packed":
            inputs, picks = self._packed_inputs(rows, M)
        else:
            inputs = self._inputs([(seq, seq.tokens + seq.draft, seq.computed, count) for seq, count in rows], B, T,
                                  M)
        ids, positions, valid, tables, lengths = inputs
        source = self._source_rows(rows, B)
        targets = None
        if kind == "score":  # each column's next prompt token (-1: the first new token, or padding)
            targets = np.full((B, T), -1, np.int32)
            for r, (seq, count) in enumerate(rows):
                predicted = seq.prompt[seq.computed + 1:seq.computed + count + 1]
                targets[r, T - count:T - count + len(predicted)] = predicted
        # (host arrays go to the program as they are: its call transfers them, where jnp.asarray dispatched one
        # operation each, 20 us apiece)
        started = time.perf_counter()
        slots = None if self.states is None else np.asarray([seq.slot for seq, _ in rows] + [0] * (B - len(rows)),
                                                            np.int32)
        out, finite, k, v, scores, states = self.run_step(self.weights, self.pool.k, self.pool.v, ids, positions,
                                                          valid, tables, lengths, source, self.banned,
                                                          kind == "verify", targets=targets, states=self.states,
                                                          slots=slots, picks=picks)
        self.pool, self.states = dataclasses.replace(self.pool, k=k, v=v), states
        self.programs.setdefault((kind, ids.shape[0], T, M, None if source is None else source[0].shape[1]),
                                 time.perf_counter() - started)
        if picks is not None:  # the choosing rows' logits, in a program of a rows bucket (its own call)
            started = time.perf_counter()
            out, finite = head_program(*self.graph)(self.weights, out, B)
            self.programs.setdefault(("head", B), time.perf_counter() - started)
        if self.drafter is not None and kind in ("prefill", "score"):  # its pool reads every prompt chunk too
            for seq, _ in rows:  # (first what it lacks before the chunk: a shared block it holds no keys of)
                self._catch_up(seq, seq.computed)
            self._draft_call([(seq, seq.tokens, seq.computed, count) for seq, count in rows], inputs)
        chosen, logprobs, beams = out, None, None  # (verify: each position's greedy token; draws below)
        if kind == "verify":
            if any(seq.params.temperature > 0 for seq, _ in rows):  # (each position's draw in place of the argmax)
                sampling, sampler = sampling_rows([(seq.params, seq.seed, seq.tokens, len(seq.prompt))
                                                   for seq, _ in rows], B, 1)
                first = np.asarray([T - count for _, count in rows] + [0] * (B - len(rows)), np.int32)
                started = time.perf_counter()
                chosen = draw_program(scores, out, sampling, sampler, first)
                self.programs.setdefault(("draw", B, T, sampler), time.perf_counter() - started)
            scores = None  # (a verifying call's logits: for the draws only)
        else:
            # the rows' settings, built while the model's call runs (the penalties' histories: every id so far, at
            # most max_model_len, in a power-of-two width)
            sampling, sampler = sampling_rows([(seq.params, seq.seed, seq.tokens, len(seq.prompt)) for seq, _ in rows],
                                              B, 1 << (self.max_model_len - 1).bit_length())
            keep = max((seq.group.keep for seq, _ in rows if seq.group is not None), default=0)
            if keep:  # (a power of two: few programs)
                sampler = sampler._replace(beam=min(1 << (keep - 1).bit_length(), self.config.vocab_size))
            forced, started = self._forced(rows, B), time.perf_counter()
            chosen, logprobs, beams = choose_program(out, sampling, sampler, self.banned, forced,
                                                     self.renormalize and bool(keep))
            self.programs.setdefault(("choose", B, sampling.history.shape[1], sampling.bias_ids.shape[1], sampler,
                                      forced is not None),
                                     time.perf_counter() - started)
        chosen, finite = np.asarray(chosen), np.asarray(finite)
        logprobs = None if logprobs is None else tuple(np.asarray(a) for a in logprobs)
        beams = None if kind == "verify" or beams is None else tuple(np.asarray(a) for a in beams)
        return chosen, logprobs, beams, finite, None if scores is None else tuple(np.asarray(a) for a in scores)

    def _inputs(self, feeds: list[tuple[Sequence, list[int], int, int]], B: int, T: int, M: int
                ) -> tuple[np.ndarray, ...]:
        """A call's host arrays [B, T] (ids, positions, valid) and [B, M] (block tables), and the tokens each row's
        pool holds [B], of ``feeds``: (sequence, its tokens, how many of them the pool holds, how many it feeds), left
        padded (the last column of every real row is real)."""
        ids, positions = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
        valid, tables = np.zeros((B, T), bool), np.full((B, M), NULL_BLOCK, np.int32)
        lengths = np.zeros(B, np.int32)
        for r, (seq, tokens, start, count) in enumerate(feeds):
            ids[r, T - count:] = tokens[start:start + count]
            positions[r, T - count:] = np.arange(start, start + count)
            valid[r, T - count:] = True
            tables[r, :len(seq.blocks)] = seq.blocks
            lengths[r] = start
        return ids, positions, valid, tables, lengths

    def _packable(self, table: int) -> int:
        """The most tokens a packed call of rows holding at most ``table`` blocks feeds: its one-token rows and
        ``prefill_tokens`` prompt tokens, a row's chunk at most ``prefill_chunk`` and its table's slots."""
        return min(self.max_num_seqs - 1 + self.prefill_tokens,
                   self.max_num_seqs * min(self.prefill_chunk, table * self.block_size))

    def _packed_inputs(self, rows: list[tuple[Sequence, int]], M: int) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """A packed call's host arrays (``_inputs``'s, each token a row of its own: its sequence's table, its
        position, the tokens before it as its length; rows up to a bucket of the tokens, ``max_packed`` at most)
        and the row of each sequence's last token [max_num_seqs] (whose logits its row chooses by)."""
        total = sum(count for _, count in rows)
        N = _bucket(total, self.max_packed)
        ids, positions = np.zeros((N, 1), np.int32), np.zeros((N, 1), np.int32)
        valid, tables = np.zeros((N, 1), bool), np.full((N, M), NULL_BLOCK, np.int32)
        picks, at = np.zeros(self.max_num_seqs, np.int32), 0
        for r, (seq, count) in enumerate(rows):
            start = seq.computed
            ids[at:at + count, 0] = seq.tokens[start:start + count]
            positions[at:at + count, 0] = np.arange(start, start + count)
            tables[at:at + count, :len(seq.blocks)] = seq.blocks
            at += count
            picks[r] = at - 1
        valid[:total] = True
        return (ids, positions, valid, tables, positions[:, 0].copy()), picks

    def _catch_up(self, seq: Sequence, upto: int) -> None:
        """Let the assistant's pool read ``seq``'s tokens up to ``upto`` where it lags further (blocks shared from the
        prefix cache that it holds no keys of: an undrafted row's generated tokens), in one-row calls of the widths
        its prompt chunks and drafting calls compiled."""
        while seq.drafter_read < upto:
            count = min(upto - seq.drafter_read, self.prefill_chunk)
            feed = [(seq, seq.tokens, seq.drafter_read, count)]
            if count <= 2:
                self._draft_call(feed)
            else:
                self._draft_call(feed, self._inputs(feed, 1, _bucket(count, self.prefill_chunk),
                                                    self._table_width(len(seq.blocks))))

    def _draft_call(self, feeds: list[tuple[Sequence, list[int], int, int]], inputs: tuple | None = None
                    ) -> np.ndarray | None:
        """The assistant model's call over ``feeds`` (as ``_inputs`` takes them; ``inputs``: a prompt-chunk call's
        arrays, which it reads too) into its own pool, each row's ``drafter_read`` past what it fed where that
        continued it: each row's greedy next token (the checkpoint's bad words banned), or nothing for a prompt
        chunk's (its pool is all it keeps)."""
        drafter, chunk = self.drafter, inputs is not None
        B = _bucket(len(feeds), self.max_num_seqs)
        T = inputs[0].shape[1] if chunk else max(count for *_, count in feeds)
        M = inputs[3].shape[1] if chunk else self._table_width(max(len(seq.blocks) for seq, *_ in feeds))
        ids, positions, valid, tables, lengths = inputs if chunk else self._inputs(feeds, B, T, M)
        started = time.perf_counter()
        out, _, k, v, _, _ = drafter.run_step(drafter.weights, drafter.pool.k, drafter.pool.v, ids, positions, valid,
                                              tables, lengths, None, self.banned, not chunk)
        drafter.pool = dataclasses.replace(drafter.pool, k=k, v=v)
        self.programs.setdefault(("draft" if not chunk else "draft prefill", B, T, M), time.perf_counter() - started)
        for seq, _, start, count in feeds:
            if seq.drafter_read == start:
                seq.drafter_read += count
        return None if chunk else np.asarray(out)[:len(feeds), -1]

    def _source_table_width(self, blocks: int) -> int:
        """The source-table width of rows whose sources hold at most ``blocks`` blocks: where each layer reads its
        rows a chunk at a time up to the last slot any row sees (XLA:CPU, ``min_table_slots``), the widest source's,
        whose unread slots cost only their mask (a step program for every source width, not one per bucket: 8, not
        80, at the server's defaults over a 512-position Marian); elsewhere a bucket of ``blocks``."""
        widest = -(-self.max_source_len // self.block_size)
        return widest if attention.PAGED_CHUNK_SLOTS.get(jax.default_backend()) else _bucket(blocks, widest)

    def _table_width(self, blocks: int) -> int:
        """The block-table width bucket of rows holding at most ``blocks`` blocks: a power of two (no midpoints: a
        table's width costs little next to its rows, ``min_table_slots``), at least ``min_table_slots`` tokens, at
        most ``max_blocks``."""
        return min(1 << (max(blocks, -(-min_table_slots() // self.block_size)) - 1).bit_length(), self.max_blocks)

    def _advance(self, rows: list[tuple[Sequence, int]], chosen: np.ndarray, logprobs: tuple | None,
                 beams: tuple | None, finite: np.ndarray) -> list[RequestOutput]:
        """Book the rows' written tokens (remembering newly full blocks for prefix caching) and their new tokens
        (with their log-probabilities where asked); end the sequences that stopped, freeing their blocks, and those
        whose logits were not finite (``_fail``). A row that fed drafts (``chosen`` [B, T]: each position's greedy
        token) keeps those equal to the model's own choices, then the model's token after the last one kept. A
        beam's row hands its candidates (``beams``: values and ids [B, K]) to its search, which steps once every
        beam's are in (``_beam_step``)."""
        outputs = []
        for r, (seq, count) in enumerate(rows):
            if seq.finish_reason is not None:  # (a beam whose search another beam's error ended)
                continue
            if not finite[r]:
                self._fail(seq)
                outputs.append(RequestOutput(seq.request_id, (), True, "error"))
                continue
            new = [int(chosen[r])] if chosen.ndim == 1 else [int(t) for t in chosen[r, -count:]]
            drafted = bool(seq.draft)
            if drafted:  # the drafts up to the first the model would not choose, and its own token there
                kept = next((i for i, (draft, own) in enumerate(zip(seq.draft, new)) if draft != own), len(seq.draft))
                if self.draft_schedule == "heuristic":  # (transformers' schedule, this row's alone)
                    limit = self._draft_limit(seq)
                    seq.draft_limit = min(limit + 2, self.draft_tokens) if kept == len(seq.draft) else max(limit - 1, 1)
                self.drafted, self.accepted = self.drafted + len(seq.draft), self.accepted + kept
                new, count, seq.draft = new[:kept + 1], kept + 1, []
            seq.computed += count
            # (an assistant's pool read the kept drafts; past them, what it read is overwritten when read again)
            seq.drafter_read = min(seq.drafter_read, seq.computed)
            # blocks that held rejected drafts alone go back now, not to crowd out another's next token (a chunk's
            # head piece keeps its tail's blocks: the tail runs later in this step)
            spare = seq.blocks[-(-seq.computed // self.block_size):] if drafted else []
            if spare:
                self.manager.release(spare)
                del seq.blocks[-len(spare):]
            tokens = seq.tokens + new[:-1]  # (a row's kept drafts are in the cache now)
            # (an encoder-decoder's target blocks depend on its source, which the prefix keys do not hold: its blocks
            # are never remembered, as admission never looks them up)
            while seq.source is None and (len(seq.keys) + 1) * self.block_size <= seq.computed:
                b = len(seq.keys)
                seq.keys.append(self.manager.chain(seq.keys[-1] if seq.keys else None,
                                                   tokens[b * self.block_size:(b + 1) * self.block_size]))
                self.manager.remember(seq.blocks[b], seq.keys[-1])
            if self.drafter is not None:  # (its pool's keys up to drafter_read are the verified tokens')
                self.drafter_blocks.update(seq.blocks[:min(len(seq.keys), seq.drafter_read // self.block_size)])
            if seq.computed < len(tokens):  # a prompt chunk short of the prompt's end: no token yet
                continue
            if seq.group is not None:
                seq.group.candidates[id(seq)] = (beams[0][r], beams[1][r])
                if len(seq.group.candidates) == len(seq.group.members):
                    outputs += self._beam_step(seq.group)
                continue
            emitted = []
            for token in new:
                emitted.append(token)
                seq.generated.append(token)
                if token in seq.stop_ids:
                    seq.finish_reason = "stop"
                elif len(seq.generated) == seq.params.max_tokens:
                    seq.finish_reason = "length"
                if seq.finish_reason is not None:
                    break
            if seq.finish_reason is not None:
                self._free(seq)
                self.running.remove(seq)
            asked = None
            if seq.params.logprobs is not None:  # (the program computed them: some row asked)
                chosen_logprob, top, top_ids = (a[r] for a in logprobs)
                pairs = tuple((int(i), float(x)) for i, x in zip(top_ids[:seq.params.logprobs],
                                                                 top[:seq.params.logprobs]))
                asked = (TokenLogprobs(token, float(chosen_logprob), pairs),)
            prompt_scores = None
            if seq.params.prompt_logprobs is not None and not seq.prompt_scores_sent:  # (with the first token)
                prompt_scores = (None, *(seq.prompt_scores[p] for p in range(1, len(seq.prompt))))
                seq.prompt_scores_sent = True
            outputs.append(RequestOutput(seq.request_id, tuple(emitted), seq.finish_reason is not None,
                                         seq.finish_reason, asked, prompt_scores))
        return outputs

    def _beam_step(self, group: BeamGroup) -> list[RequestOutput]:
        """One step of generate's beam search (``generate._beam_search``'s loop body for one batch row, here on the
        host in float32, ranking as ``jax.lax.top_k`` does: ties to the lower beam, then the lower id) from every
        beam's candidates: the best ``keep`` continuations; the best ``width`` of them that did not stop go on, each
        a new sequence holding its parent's blocks (shared: a partly written one is copied when written,
        ``_blocks_for``) and its new token, to feed next step; those among the best ``width`` that stopped join
        the finished hypotheses if they rank there. Where the search ends, its one output: the best hypothesis's
        tokens, and every hypothesis (``RequestOutput.beams``)."""
        params, w, keep, step = group.root.params, group.width, group.keep, group.step
        N, lp, neg = params.max_tokens, np.float32(params.length_penalty), np.float32(NEG)
        beams = group.members if step else group.members * w  # (before the first token every beam is the root)
        values = np.stack([group.candidates[id(seq)][0][:keep] for seq in beams])
        ids = np.stack([group.candidates[id(seq)][1][:keep] for seq in beams]).reshape(-1)
        totals = (values + group.scores[:, None]).reshape(-1)
        beam_of = np.repeat(np.arange(w), keep)
        top = np.lexsort((ids, beam_of, -totals))[:keep]
        top_scores, source, token = totals[top], beam_of[top], ids[top]
        hits = np.isin(token, list(group.root.stop_ids)) | (step + 1 >= N)

        # the best `width` candidates that did not stop keep running
        running = top_scores + hits.astype(np.float32) * neg
        going_on = np.argsort(-running, kind="stable")[:w]

        # candidates among the best `width` that stopped join the finished hypotheses if they rank there
        just_finished = hits & (np.arange(keep) < w)
        finish = top_scores / (np.float32(step + 1) ** lp)
        full = bool(group.done.all()) and params.early_stopping is True
        finish = finish + (np.float32(full) * neg + np.float32(not group.improvable) * neg)
        finish = finish + (~just_finished).astype(np.float32) * neg
        merged = np.concatenate([group.done_scores, finish])
        best = np.argsort(-merged, kind="stable")[:w]
        tokens = group.done_tokens + [beams[b].generated + [int(t)] for b, t in zip(source, token)]
        group.done_tokens = [tokens[i] for i in best]
        group.done_scores = merged[best]
        group.done = np.concatenate([group.done, just_finished])[best]

        step += 1
        best_length = N if (params.early_stopping == "never" and lp > 0) else step
        best_possible = running[going_on[0]] / (np.float32(best_length) ** lp)
        worst_finished = np.where(group.done, group.done_scores.min(), neg)
        group.improvable = group.improvable and bool(np.any(best_possible > worst_finished))
        going = (group.improvable and not (group.done.all() and params.early_stopping is True) and not hits.all()
                 and step < N)
        old, at = group.members, min(self.running.index(seq) for seq in group.members)
        group.candidates, group.step = {}, step
        if going:
            children = []
            for b in going_on:
                parent = beams[source[b]]
                child = dataclasses.replace(parent, generated=parent.generated + [int(token[b])],
                                            blocks=list(parent.blocks), keys=list(parent.keys),
                                            source_blocks=list(parent.source_blocks), draft=[], prompt_scores={})
                self.manager.share(child.source_blocks + child.blocks)
                children.append(child)
            group.members, group.scores = children, running[going_on]
        for seq in old:
            self._free(seq)
            self.running.remove(seq)
        if going:
            self.running[at:at] = group.members
            return []
        hypotheses = tuple(Hypothesis(tuple(tokens), float(score),
                                      "stop" if tokens and tokens[-1] in group.root.stop_ids else "length")
                           for tokens, score in zip(group.done_tokens, group.done_scores))
        best = hypotheses[0]
        return [RequestOutput(group.root.request_id, best.token_ids, True, best.finish_reason, beams=hypotheses)]

    # ------------------------------------------------------------------------------------------ warm-up

    def program_shapes(self, every_prefill: bool = False) -> list[tuple]:
        """The (kind, rows, width, table width) buckets the scheduler can run (``_run``): the one-token calls, each
        row bucket by each table-width bucket; the prompt-chunk calls, each chunk width by each table width that
        holds a chunk that wide, of one sequence or (``every_prefill``) of as many as the prefill budget admits
        (its narrowest chunks taking 2 tokens each). An encoder-decoder's ("encode", rows, source width) calls
        (``_encode_calls``: one source a call where calls are priced, XLA:CPU, else as many as a step admits; each
        width bucket up to ``max_source_len``) and its one-token calls (its prompt chunks with ``every_prefill``
        only), each by each source-table width (a fifth element, ``_source_table_width``: one on XLA:CPU); it drafts
        nothing. Tiny Marian in ``tests/test_serving_seq2seq.py`` (4 rows, 4 blocks a sequence, sources up to 40
        tokens in blocks of 8) on XLA:CPU: 11 encode and 4 one-token shapes (44 and 20 when each rows bucket encoded
        and each source-table bucket stepped); at the server's defaults (16 rows, blocks of 16) a 512-position
        source gives 18 and 8 (144 and 80)."""
        def buckets(low: int, high: int, cap: int) -> list[int]:
            return sorted({_bucket(n, cap) for n in range(low, high + 1)})
        rows = buckets(1, self.max_num_seqs, self.max_num_seqs)
        tables = sorted({self._table_width(n) for n in range(1, self.max_blocks + 1)})
        shapes = [("decode", count, 1, width) for count in rows for width in tables]
        # (an encoder-decoder's decoder prompt is its start token: it feeds prompt chunks only when readmitted after
        # a preemption or given a longer decoder prompt, so those are warmed with ``every_prefill`` alone)
        prefilled = (every_prefill or self.max_source_len is None) and not self.packs
        chunks = buckets(2, min(self.prefill_chunk, self.prefill_tokens), self.prefill_chunk) if prefilled else []
        if self.packs:  # (every packed call's tokens bucket, each table width; the head at each rows bucket)
            shapes += [("packed", count, 1, width) for width in tables
                       for count in buckets(2, self._packable(width), self.max_packed)]
            shapes += [("head", count, 1) for count in rows]
        for narrower, chunk in zip([1, *chunks], chunks):
            narrowest = narrower + 1  # the fewest tokens a chunk of this bucket feeds
            most = min(self.max_num_seqs, 1 + (self.prefill_tokens - narrowest) // 2) if every_prefill else 1
            shapes += [("prefill", count, chunk, width) for count in buckets(1, most, self.max_num_seqs)
                       for width in tables if width * self.block_size >= narrowest]
        if self.max_source_len is not None:  # (an admission feeds at least one token of the prefill budget)
            admitted = buckets(1, min(self.max_num_seqs, self.prefill_tokens), self.max_num_seqs)
            if CALL_COST_TOKENS.get(jax.default_backend()) and not every_prefill:
                admitted = [1]  # (``_encode_calls``: one source a call, unless a wider program is compiled)
            widths = buckets(1, self.max_source_len, self.max_source_len)
            source_tables = sorted({self._source_table_width(n)
                                    for n in range(1, -(-self.max_source_len // self.block_size) + 1)})
            return ([("encode", count, width) for count in admitted for width in widths]
                    + [(*shape, blocks) for shape in shapes for blocks in source_tables])
        if self.draft_tokens:  # a drafting row's last token and its 1 to k drafts
            shapes += [("verify", count, fed, width) for count in rows
                       for fed in buckets(2, self.draft_tokens + 1, self.draft_tokens + 1) for width in tables]
        if self.drafter is not None:  # the assistant's calls, each row feeding one token or two (its prompt chunks
            shapes += [("draft", count, fed, width)  # run beside the target's, at their shapes)
                       for count in rows for fed in (1, 2) for width in tables]
        return shapes

    def warm_up(self, every_prefill: bool = False) -> tuple[int, float]:
        """Compile now, before any request, the programs of ``program_shapes`` (one-token calls at every batch
        size and table width, and one sequence's prompt chunks; ``every_prefill``: several sequences' chunks too,
        three times as many programs at the server's defaults), and at each batch size the choice of greedy rows, of
        plain temperature draws (OpenAI's default request) and of draws with top-p (or top-k), and a drafting
        engine's verifying calls' plain draws at each rows and tokens fed (``draw_program``; with top-p, top-k or
        min-p they compile on first use); a request with min-p, penalties, a logit bias or logprobs compiles its own
        choice program on first use (``choose_program``, a row count at a time), never a model step. An
        encoder-decoder's: its sources' encodings and its one-token calls, at each source width (``program_shapes``).
        The calls run on stand-in rows whose every block, a source's too, is the null block (written, never read;
        a stand-in's source is one token, so its cross-attention stays finite), so nothing a request sees changes.
        Where the checkpoint names a beam width (``checkpoint_beams``: OPUS-MT's and BART summarisers' 4), the choice
        of such a search's rows too, at each batch size, and the copies of its shared blocks at each count a step can
        make (a search of another width, or mixed with draws in one call, compiles its own choice on first use).
        Returns the programs compiled and the seconds taken."""
        before, started = len(self.programs), time.perf_counter()
        greedy, drawn = SamplingParams(max_tokens=1, temperature=0), SamplingParams(max_tokens=1)
        choices = (greedy, drawn, SamplingParams(max_tokens=1, top_p=0.9))
        beams = self.checkpoint_beams
        if 1 < beams <= self.max_num_seqs and self.states is None:
            beam = SamplingParams(max_tokens=1, temperature=0, beam_width=beams)
            if self._beam_keep(beam, self.eos_ids) <= self.config.vocab_size:
                choices += (beam,)
        drawing = set()  # the row counts whose draws' choices are compiled
        drew = set()  # the (rows, tokens fed) of verifying calls whose draws are compiled (``draw_program``)
        for kind, rows, width, *tables in self.program_shapes(every_prefill):
            if kind == "draft":
                stand_ins = [Sequence(-1, [0] * width, greedy, frozenset(), 0, blocks=[NULL_BLOCK] * tables[0])
                             for _ in range(rows)]
                self._draft_call([(seq, seq.prompt, 0, width) for seq in stand_ins])
                continue
            if kind == "head":
                hidden = jnp.zeros((self.max_num_seqs, self.config.d_model), dtype_of(self.config.dtype))
                began = time.perf_counter()
                head_program(*self.graph)(self.weights, hidden, rows)
                self.programs.setdefault(("head", rows), time.perf_counter() - began)
                continue
            if kind == "packed":  # stand-in chunks, as few rows as hold the bucket's fewest tokens
                fewest = next(n for n in range(2, rows + 1) if _bucket(n, self.max_packed) == rows)
                most = min(self.prefill_chunk, tables[0] * self.block_size)
                self._run(kind, [(Sequence(-1, [0] * most, greedy, frozenset(), 0, blocks=[NULL_BLOCK] * tables[0]),
                                  min(most, fewest - at)) for at in range(0, fewest, most)])
                continue
            if kind == "encode":
                self._encode([Sequence(-1, [0], greedy, frozenset(), 0, source=[0] * width,
                                       source_blocks=[NULL_BLOCK] * -(-width // self.block_size))
                              for _ in range(rows)])
                continue
            table, source_table = (*tables, None)[:2]
            rows = min(rows, self.max_num_seqs)
            # (a model call a shape, and two more a row count to compile its draws' choices; a verifying call's
            # stand-ins draw at the first table width of each rows and tokens fed, compiling their draws too)
            if kind == "verify":
                settings = (greedy,) if (rows, width) in drew else (drawn,)
                drew.add((rows, width))
            else:
                settings = (greedy,) if rows in drawing else choices
            for params in settings:
                stand_in = [(Sequence(-1, [0] * width, params, frozenset(), 0, blocks=[NULL_BLOCK] * table,
                                      source=None if source_table is None else [0],
                                      source_blocks=[NULL_BLOCK] * (source_table or 0)), width)
                            for _ in range(rows)]
                if params.beam_width > 1:  # (a stand-in group: its rows rank the search's candidates)
                    for seq, _ in stand_in:
                        seq.group = BeamGroup(seq, beams, self._beam_keep(params, self.eos_ids))
                self._run(kind, stand_in)
            if kind != "verify":
                drawing.add(rows)
        if any(params.beam_width > 1 for params in choices):  # (a step copies at most a block a row)
            for count in sorted({_bucket(n, self.manager.usable) for n in range(1, self.max_num_seqs + 1)}):
                self.copies = [(NULL_BLOCK, NULL_BLOCK)] * count
                self._copy_blocks()
        return len(self.programs) - before, time.perf_counter() - started

    @staticmethod
    def default_max_model_len(cfg, allow_beyond_max_positions: bool = False) -> int:
        """``max_model_len`` when none is given: ``max_positions``, or short of it where ``position_limit`` stops (a
        server sizes its default pool by it before it builds the engine)."""
        limit, _ = position_limit(cfg, allow_beyond_max_positions)
        return cfg.max_positions if limit is None else min(cfg.max_positions, limit)
