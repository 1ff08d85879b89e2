"""The serving engine: continuous batching over a paged KV cache, on the families' one forward.

``Engine(model, num_blocks, block_size, max_num_seqs)`` takes requests (``add_request(prompt_ids,
SamplingParams)``) and ``step()`` advances every running one: a scheduler on the host decides, each step, which
tokens each sequence feeds (one for a decoding sequence, a chunk of its prompt for a prefilling one), gives them
blocks, and runs at most two compiled calls of the model's own ``step`` over a ``PagedKVCache`` (one for the rows
feeding one token, one for the prompt chunks), each sampling every row's next token by its own parameters.

- Continuous batching: a sequence leaves the batch the step it ends (its blocks freed at once) and waiting ones
  join as blocks and ``max_num_seqs`` allow.
- Chunked prefill: a prompt is fed at most ``prefill_chunk`` tokens a step, at most ``prefill_tokens`` prompt
  tokens a step in all, so the decoding sequences never wait for a long prompt.
- Prefix caching: a prompt's full blocks already computed (by any earlier sequence, running or ended) are shared,
  not recomputed (``BlockManager``); the last prompt token is always computed, so shared blocks are never written.
- Preemption by recompute: when a sequence's next tokens find no free block, the sequence admitted last gives its
  blocks back and returns to the waiting queue in its arrival order (first come, first readmitted); readmitted, it
  computes its prompt and the tokens it had generated again (from the prefix cache where still there).
- Bucketed shapes: batch rows, chunk width and block-table width are each rounded up to a power of two (capped), so
  the engine compiles a few programs, not one per batch (``programs`` lists them with their compile times).

Greedy output equals ``model.generate``'s token for token whatever else is in the batch: a row's keys are its own
blocks and padding is masked, so rows never mix.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.cache import DecodeState
from jaxformer.generate import generation_defaults
from jaxformer.layer_plan import layer_plan
from jaxformer.layers import dtype_of
from jaxformer.serving.paged import NULL_BLOCK, BlockManager, PagedKVCache

Array = jax.Array


def paging_problem(model) -> str | None:
    """Why the engine cannot page ``model``'s cache (None: it can). The engine pages per-token keys and values of
    every layer; the other carried states are named here until they page too. Windowed layers (sliding windows,
    chunks) are paged in full: their masks come from positions, so they read the same keys as through their ring
    (a block past every layer's window is not freed early yet)."""
    cfg = model.config
    if cfg.family != "decoder":
        return {"encoder": "an encoder generates no tokens (embeddings are served apart)",
                "encoder_decoder": "an encoder-decoder's decoder reads its source's cross-attention keys and values "
                                   "(EncoderKV), which the engine does not page yet"}.get(
                                       cfg.family, f"family {cfg.family!r} is not a decoder")
    if cfg.head != "lm":
        return f"head {cfg.head!r} gives no next-token logits"
    if cfg.position == "xl":
        return "Transformer-XL carries a segment memory (MemoryKV), not per-token keys and values"
    if cfg.mla:
        return "multi-head latent attention caches latents (LatentCache), which the engine does not page yet"
    if cfg.linear_attention is not None:
        return "linear attention layers carry a fixed-size state per sequence (LinearState), not per-token blocks"
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
    kept = {spec.cache for spec in layer_plan(cfg, cfg.attention, cfg.decoder_layers).layers} - {"full", "window"}
    if kept:
        return f"its layers keep {', '.join(sorted(kept))} caches, not per-token keys and values"
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
    """How one request chooses its tokens. ``temperature`` 0 is greedy; otherwise a draw at that temperature from
    the ``top_k`` likeliest tokens (0: all) within the ``top_p`` nucleus (1: all), by a key from ``seed`` (None: the
    engine's seed and the request's id, see ``Engine``) and the number of tokens drawn so far, so a request draws the
    same tokens whatever else runs (and after a preemption). Stops after ``max_tokens`` or at a stop id (the model's
    EOS ids unless ``ignore_eos``, and ``stop_token_ids``)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        checks = {"max_tokens": (self.max_tokens, "an int >= 1", _is_int(self.max_tokens) and self.max_tokens >= 1),
                  "temperature": (self.temperature, "a finite number >= 0",
                                  _is_number(self.temperature) and 0 <= self.temperature < math.inf),
                  "top_k": (self.top_k, "an int >= 0 (0: off)", _is_int(self.top_k) and self.top_k >= 0),
                  "top_p": (self.top_p, "a number in (0, 1]", _is_number(self.top_p) and 0 < self.top_p <= 1),
                  "seed": (self.seed, "None or an int in [0, 2**32)",
                           self.seed is None or (_is_int(self.seed) and 0 <= self.seed < 2 ** 32)),
                  "stop_token_ids": (self.stop_token_ids, "ints >= 0",
                                     all(_is_int(i) and i >= 0 for i in self.stop_token_ids))}
        for name, (value, want, ok) in checks.items():
            if not ok:
                raise ValueError(f"SamplingParams.{name}={value!r}: want {want}")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class RequestOutput:
    """What a step gave one request: its new tokens, and whether (and why: 'stop', 'length', or 'error': its logits
    were not finite, so it ends with no token) it ended."""

    request_id: int
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None = None


@dataclasses.dataclass(eq=False)  # (one sequence is itself alone: the queues find it by identity)
class Sequence:
    """A request as the scheduler tracks it: its tokens (prompt, then generated), how many of them are in the
    cache (``computed``), its blocks in order and the prefix keys of its full ones; ``seed``: its draws' seed."""

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

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated


def warp_rows(logits: Array, temperature: Array, top_k: Array, top_p: Array) -> Array:
    """``generate.warp_logits`` with each row's own settings [B] (traced here: one program serves every mix):
    logits [B, V] shifted to a maximum of 0, divided by the temperature (a row at 0 is left undivided), then
    -inf outside the ``top_k`` likeliest (0: off) and outside the ``top_p`` nucleus, one sort serving both."""
    B, V = logits.shape
    scaled = (logits - jnp.max(logits, axis=-1, keepdims=True)) / jnp.where(temperature > 0, temperature, 1.0)[:, None]
    order = jnp.argsort(scaled, axis=-1)  # ascending, as transformers' TopPLogitsWarper
    ascending = jnp.take_along_axis(scaled, order, axis=-1)
    kth = jnp.take_along_axis(ascending, jnp.clip(V - top_k, 0, V - 1)[:, None], axis=-1)
    ascending = jnp.where((top_k[:, None] > 0) & (ascending < kth), -jnp.inf, ascending)
    cumulative = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
    remove = (cumulative <= 1.0 - top_p[:, None]).at[:, -1].set(False)  # the likeliest token stays
    return jnp.zeros_like(scaled).at[jnp.arange(B)[:, None], order].set(jnp.where(remove, -jnp.inf, ascending))


def choose_tokens(logits: Array, temperature: Array, top_k: Array, top_p: Array, seeds: Array, drawn: Array
                  ) -> Array:
    """Each row's next token [B] from its logits [B, V] by its own parameters [B]: greedy where ``temperature``
    is 0, else a draw from ``warp_rows`` keyed by the row's seed and ``drawn`` count (so a request draws the same
    tokens whatever batch it is in)."""
    keys = jax.vmap(lambda seed, n: jax.random.fold_in(jax.random.PRNGKey(seed), n))(seeds, drawn)
    draws = jax.vmap(jax.random.categorical)(keys, warp_rows(logits, temperature, top_k, top_p))
    return jnp.where(temperature > 0, draws, jnp.argmax(logits, axis=-1)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "sample"), donate_argnames=("k", "v"))
def run_step(graphdef, weights, k: Array, v: Array, ids: Array, positions: Array, valid: Array, tables: Array,
             lengths: Array, sampling: tuple, sample: bool) -> tuple[Array, Array, Array, Array]:
    """One compiled engine call: the model's cached ``step`` over the paged pool for rows ``ids`` [B, T] (left
    padded: the last column of every real row is real), then each row's next token (``sample``: some row samples;
    otherwise the program holds no sampler). Returns the tokens [B], whether each row's logits are all finite [B]
    (a row that is not ends in error: its token would be argmax of NaNs) and the pool's k, v with the rows' tokens
    written (updated in place: the pool is donated)."""
    model = nnx.merge(graphdef, weights)
    state = DecodeState(PagedKVCache(k, v, tables, lengths))
    logits, state = model.step(ids, positions, valid, state)
    tokens = choose_tokens(logits, *sampling) if sample else jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return tokens, jnp.all(jnp.isfinite(logits), axis=-1), state.kv.k, state.kv.v


def _bucket(n: int, cap: int) -> int:
    """The power of two at or above ``n``, at most ``cap``."""
    return min(1 << max(n - 1, 0).bit_length(), cap)


class Engine:
    """Continuous batching of generation requests over a paged KV cache (module docstring). ``num_blocks`` blocks
    of ``block_size`` tokens in one pool per layer (block 0 is the null block); at most ``max_num_seqs`` sequences
    run at once; ``prefill_chunk`` prompt tokens per sequence and ``prefill_tokens`` in all per step;
    ``max_model_len``: the longest prompt + generation (default: the model's ``max_positions``, capped where
    ``position_limit`` stops, with a warning: longrope rotary at ``original_max_positions``); past ``max_positions``
    only with ``allow_beyond_max_positions`` (rotary and relative positions, as generate). ``seed``: the draws of
    requests without a seed of their own are keyed by it and their request id (None: a fresh seed each Engine, so
    two engines draw differently; give one to repeat a run's draws)."""

    def __init__(self, model, num_blocks: int, block_size: int = 16, max_num_seqs: int = 16,
                 prefill_chunk: int = 32, prefill_tokens: int | None = None, max_model_len: int | None = None,
                 allow_beyond_max_positions: bool = False, seed: int | None = None):
        cfg = model.config
        problem = paging_problem(model)
        if problem is not None:
            raise ValueError(f"the serving engine cannot page {cfg.name!r}: {problem}")
        prefill_tokens = 2 * prefill_chunk if prefill_tokens is None else prefill_tokens
        limit, why = position_limit(cfg, allow_beyond_max_positions)
        if max_model_len is None:
            max_model_len = cfg.max_positions if limit is None else min(cfg.max_positions, limit)
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
        self.seed = int(np.random.SeedSequence().entropy % 2 ** 32) if seed is None else int(seed)
        self.model, self.config = model, cfg
        self.manager = BlockManager(num_blocks, block_size)
        self.block_size, self.max_num_seqs, self.prefill_chunk = block_size, max_num_seqs, prefill_chunk
        self.prefill_tokens, self.max_model_len = prefill_tokens, max_model_len
        self.max_blocks = -(-self.max_model_len // block_size)  # a sequence's blocks at most
        self.pool = PagedKVCache.empty(cfg.decoder_layers, num_blocks, block_size, cfg.kv_heads, cfg.head_dim_,
                                       dtype_of(cfg.dtype))
        eos = generation_defaults(model)["eos_token_id"]
        self.eos_ids = frozenset(() if eos is None else (eos,) if isinstance(eos, int) else eos)
        # as generate: the prefill on the model, the one-token steps on its decode-loop form (CPU: layers apart)
        self.graphs = {"prefill": nnx.split(model), "decode": nnx.split(model.for_decode_loop())}
        self.waiting: list[Sequence] = []  # arrival order (a request's id is its place in it)
        self.running: list[Sequence] = []  # admission order
        self.ids = itertools.count()
        # each program run, (kind, rows, width, table width, samples), and its first call's seconds (its compilation)
        self.programs: dict[tuple, float] = {}
        self.preemptions = self.shared_blocks = 0  # sequences preempted; blocks taken from the prefix cache

    # ------------------------------------------------------------------------------------------ requests

    def add_request(self, prompt_ids, params: SamplingParams | None = None) -> int:
        """Queue a request; returns its id. Refused at once (``check_request``)."""
        params = SamplingParams() if params is None else params
        prompt = self.check_request(prompt_ids, params)
        request_id = next(self.ids)
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_ids))
        seed = params.seed
        if seed is None:  # the engine's seed and the request's id, mixed into one
            seed = int(np.random.SeedSequence([self.seed, request_id]).generate_state(1)[0])
        self.waiting.append(Sequence(request_id, prompt, params, frozenset(stops), seed))
        return request_id

    def check_request(self, prompt_ids, params: SamplingParams) -> list[int]:
        """The prompt's ids as a list, or a ValueError: token ids outside the vocabulary, an empty prompt, prompt +
        ``max_tokens`` beyond ``max_model_len`` or beyond what the pool holds. It reads the engine's settings alone,
        so a server calls it from any thread, while a step runs."""
        prompt = [int(i) for i in np.asarray(prompt_ids).reshape(-1)]
        if not prompt:
            raise ValueError("prompt_ids is empty: want at least one token id")
        bad = [i for i in prompt if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ValueError(f"prompt_ids hold {bad[:5]} outside the vocabulary [0, {self.config.vocab_size})")
        total = len(prompt) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt of {len(prompt)} tokens + max_tokens={params.max_tokens} = {total} exceeds "
                             f"max_model_len={self.max_model_len}")
        if -(-total // self.block_size) > self.manager.usable:
            raise ValueError(f"prompt of {len(prompt)} tokens + max_tokens={params.max_tokens} needs "
                             f"{-(-total // self.block_size)} blocks of {self.block_size}; the pool has "
                             f"{self.manager.usable}")
        return prompt

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: int) -> bool:
        """End a request now (its client went away), freeing its blocks; False if it had already ended."""
        for seq in self.running:
            if seq.request_id == request_id:
                self._free(seq)
                self.running.remove(seq)
                return True
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                return True
        return False

    def stats(self) -> dict[str, int]:
        """What a server reports: requests waiting and running, blocks used of the pool's, preemptions so far,
        blocks shared from the prefix cache so far, programs compiled."""
        return {"waiting": len(self.waiting), "running": len(self.running), "blocks_used": self.manager.used(),
                "blocks": self.manager.usable, "preemptions": self.preemptions, "shared_blocks": self.shared_blocks,
                "programs": len(self.programs)}

    def run(self) -> dict[int, list[int]]:
        """Step until every request ended: each request's generated tokens."""
        out: dict[int, list[int]] = {}
        while self.has_unfinished():
            for result in self.step():
                out.setdefault(result.request_id, []).extend(result.token_ids)
        return out

    # ------------------------------------------------------------------------------------------ scheduling

    def _blocks_for(self, seq: Sequence, count: int) -> bool:
        """Give ``seq`` the blocks its next ``count`` tokens go to; False when the pool has too few free."""
        need = -(-(seq.computed + count) // self.block_size) - len(seq.blocks)
        if need > self.manager.available():
            return False
        seq.blocks += [self.manager.allocate() for _ in range(need)]
        return True

    def _free(self, seq: Sequence) -> None:
        self.manager.release(seq.blocks)
        seq.blocks, seq.keys, seq.computed = [], [], 0

    def _fail(self, seq: Sequence) -> None:
        """End ``seq`` in error (its logits were not finite) with no token. What it wrote may be NaN too, and a
        masked slot still multiplies its value by a weight of 0 (NaN again): the blocks it held alone leave the
        prefix cache and are zeroed, with the null block its padding wrote to, before anyone reads them again."""
        alone = [block for block in seq.blocks if self.manager.refs[block] == 1]
        self.manager.forget(alone)
        blocks = jnp.asarray([NULL_BLOCK, *alone], jnp.int32)
        self.pool = dataclasses.replace(self.pool, k=self.pool.k.at[:, :, blocks].set(0),
                                        v=self.pool.v.at[:, :, blocks].set(0))
        seq.finish_reason = "error"
        self._free(seq)
        self.running.remove(seq)

    def _preempt(self, seq: Sequence) -> None:
        """``seq`` gives its blocks back and waits again in its arrival order, to compute its tokens anew."""
        self._free(seq)
        self.running.remove(seq)
        bisect.insort(self.waiting, seq, key=lambda waiting: waiting.request_id)
        self.preemptions += 1

    def _schedule(self) -> list[tuple[Sequence, int]]:
        """This step's work: (sequence, tokens it feeds), every running sequence that can go, then admissions."""
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
                if victim is seq:
                    break
            else:
                work.append((seq, count))
                budget -= count if left > 1 else 0
        while self.waiting and not preempted and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            tokens = seq.tokens
            shared = self.manager.cached_prefix(tokens, (len(tokens) - 1) // self.block_size)
            seq.blocks, seq.computed = list(shared), len(shared) * self.block_size
            seq.keys = self._prefix_keys(tokens, len(shared))
            count = min(len(tokens) - seq.computed, self.prefill_chunk, budget)
            if not self._blocks_for(seq, count):
                self._free(seq)
                break
            self.waiting.pop(0)
            self.running.append(seq)
            self.shared_blocks += len(shared)
            work.append((seq, count))
            budget -= count
        return work

    def _prefix_keys(self, tokens: list[int], blocks: int) -> list[bytes]:
        keys, key = [], None
        for b in range(blocks):
            key = self.manager.chain(key, tokens[b * self.block_size:(b + 1) * self.block_size])
            keys.append(key)
        return keys

    # ------------------------------------------------------------------------------------------ one step

    def step(self) -> list[RequestOutput]:
        """Schedule, run the one-token rows and the prompt chunks (one compiled call each), and hand back each
        request's new token and whether it ended."""
        work = self._schedule()
        outputs = []
        for kind, rows in (("decode", [w for w in work if w[1] == 1]), ("prefill", [w for w in work if w[1] > 1])):
            if rows:
                outputs += self._advance(rows, *self._run(kind, rows))
        return outputs

    def _run(self, kind: str, rows: list[tuple[Sequence, int]]) -> tuple[np.ndarray, np.ndarray]:
        B = _bucket(len(rows), 1 << (self.max_num_seqs - 1).bit_length())
        T = 1 if kind == "decode" else _bucket(max(count for _, count in rows), self.prefill_chunk)
        M = _bucket(max(len(seq.blocks) for seq, _ in rows), self.max_blocks)
        ids, positions = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
        valid, tables = np.zeros((B, T), bool), np.full((B, M), NULL_BLOCK, np.int32)
        lengths, temperature, top_p = np.zeros(B, np.int32), np.zeros(B, np.float32), np.ones(B, np.float32)
        top_k, seeds, drawn = np.zeros(B, np.int32), np.zeros(B, np.uint32), np.zeros(B, np.int32)
        for r, (seq, count) in enumerate(rows):
            tokens = seq.tokens
            ids[r, T - count:] = tokens[seq.computed:seq.computed + count]  # left padded: the last column is real
            positions[r, T - count:] = np.arange(seq.computed, seq.computed + count)
            valid[r, T - count:] = True
            tables[r, :len(seq.blocks)] = seq.blocks
            lengths[r] = seq.computed
            p = seq.params
            temperature[r], top_k[r], top_p[r] = p.temperature, p.top_k, p.top_p
            seeds[r], drawn[r] = seq.seed, len(seq.generated)
        sample = bool(np.any(temperature > 0))
        program, started = (kind, B, T, M, sample), time.perf_counter()
        graphdef, weights = self.graphs[kind]
        sampling = tuple(jnp.asarray(a) for a in (temperature, top_k, top_p, seeds, drawn))
        chosen, finite, k, v = run_step(graphdef, weights, self.pool.k, self.pool.v, jnp.asarray(ids),
                                        jnp.asarray(positions), jnp.asarray(valid), jnp.asarray(tables),
                                        jnp.asarray(lengths), sampling, sample)
        self.pool = dataclasses.replace(self.pool, k=k, v=v)
        chosen, finite = np.asarray(chosen), np.asarray(finite)
        self.programs.setdefault(program, time.perf_counter() - started)
        return chosen, finite

    def _advance(self, rows: list[tuple[Sequence, int]], chosen: np.ndarray, finite: np.ndarray
                 ) -> list[RequestOutput]:
        """Book the rows' written tokens (remembering newly full blocks for prefix caching) and their new tokens;
        end the sequences that stopped, freeing their blocks, and those whose logits were not finite (``_fail``)."""
        outputs = []
        for r, (seq, count) in enumerate(rows):
            if not finite[r]:
                self._fail(seq)
                outputs.append(RequestOutput(seq.request_id, (), True, "error"))
                continue
            seq.computed += count
            tokens = seq.tokens
            while (len(seq.keys) + 1) * self.block_size <= seq.computed:
                b = len(seq.keys)
                seq.keys.append(self.manager.chain(seq.keys[-1] if seq.keys else None,
                                                   tokens[b * self.block_size:(b + 1) * self.block_size]))
                self.manager.remember(seq.blocks[b], seq.keys[-1])
            if seq.computed < len(tokens):  # a prompt chunk short of the prompt's end: no token yet
                continue
            token = int(chosen[r])
            seq.generated.append(token)
            if token in seq.stop_ids:
                seq.finish_reason = "stop"
            elif len(seq.generated) == seq.params.max_tokens:
                seq.finish_reason = "length"
            if seq.finish_reason is not None:
                self._free(seq)
                self.running.remove(seq)
            outputs.append(RequestOutput(seq.request_id, (token,), seq.finish_reason is not None, seq.finish_reason))
        return outputs
