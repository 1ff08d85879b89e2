"""An OpenAI-compatible HTTP server over the engine (``jaxformer serve MODEL``), on FastAPI + uvicorn.

One asyncio task drives the ``Engine``: between steps it admits the requests that arrived and ends those whose
client went away (their blocks freed before the next step), then runs ``engine.step`` in a one-thread executor (the
event loop keeps answering meanwhile) and hands each new token to its request's queue. The request handlers turn
tokens into text (``TextStream``: incremental, UTF-8 safe, cut at stop strings) and answer as OpenAI does:

- ``POST /v1/completions`` (a prompt, or a list of them: ``n`` choices each, in OpenAI's order),
  ``POST /v1/chat/completions`` (the checkpoint's chat template rendered with jinja2 as
  transformers' ``apply_chat_template``), streamed by server-sent events with ``"stream": true``; an
  encoder-decoder (Marian, M2M100/NLLB, T5, BART) answers completions alone, the prompt being its source text as the
  folder's tokenizer encodes it (tokenizer.json's post-processor, or Marian's and M2M100's SentencePiece files: their
  special tokens, Marian's and T5's ``</s>``, NLLB's and M2M100's source language as saved, or the request's
  ``src_lang``; ``tgt_lang`` forced first: ``Languages``), and refuses chat;
- ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text).

Sampling parameters go to the engine's ``SamplingParams`` (``min_p`` and ``repetition_penalty`` beside OpenAI's;
``logit_bias``'s token ids, JSON's string keys, as ints);
``n`` choices are n engine requests (a seeded request's choice i draws by seed + i), streamed chunks carrying their
choice's index; ``logprobs`` are the model's raw distribution's, in OpenAI's shapes (completions: tokens,
token_logprobs, top_logprobs, text_offset; chat: content entries of token, logprob, bytes, top_logprobs), a token's
string being the text it adds in context (``TokenPieces``: they join to the choice's text).

Completions' ``echo`` puts the prompt before each choice's text, and with ``logprobs`` its tokens' log-probabilities
before the new ones' (the first token's null: nothing precedes it), as OpenAI's legacy API; ``max_tokens`` 0 then
scores the prompt alone (what lm-evaluation-harness asks for a log-likelihood). A parameter the engine does not honour
yet (``suffix``, tools, ...) is refused by name, never ignored;
errors have OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``. SIGTERM drains: uvicorn stops
accepting, the running requests finish, then the process exits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import math
import re
import secrets
import sys
import time
from pathlib import Path

import jax
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from jaxformer.cache import LinearState
from jaxformer.interop.tokenizer import Languages, tokenizer_settings
from jaxformer.layers import dtype_of
from jaxformer.serving.engine import Engine, RequestOutput, SamplingParams
from jaxformer.serving.sampling import TokenLogprobs

# what transformers' apply_chat_template gives the template besides the messages: the named special tokens
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# OpenAI parameters the engine does not honour yet, each with the values that mean "off" (accepted)
NOT_YET = {"suffix": (None, ""), "tools": (None, []),
           "tool_choice": (None, "none"), "response_format": (None, {"type": "text"})}
COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
          "frequency_penalty", "seed", "stop", "stream", "stream_options", "user", "n", "logprobs", "ignore_eos",
          "logit_bias", "use_beam_search", "length_penalty", "early_stopping"}
# (completions' src_lang and tgt_lang: a translation's languages, ``Languages``)
KEYS = {"completions": COMMON | {"prompt", "best_of", "src_lang", "tgt_lang", "echo"},
        "chat": COMMON | {"messages", "max_completion_tokens", "top_logprobs"}}
MAX_N = 16  # choices a request may ask for (n): each is an engine request of its own
MAX_PROMPTS = 256  # prompts one completions request may hold (a list: n choices each)
# the most top log-probabilities a request may ask for: OpenAI's legacy completions' and chat's bounds
MAX_LOGPROBS = {"completions": 5, "chat": 20}
DISCONNECT_POLL_S = 0.5  # how often a plain (not streamed) answer checks that its client is still there
PROMPT_TAIL_TOKENS = 6  # prompt tokens decoded before the new ones, so a token's leading space decodes as in context


class ApiError(Exception):
    """An answer in OpenAI's error shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# ---------------------------------------------------------------------------------------------- chat template


def load_chat_template(folder: str | Path) -> tuple[str | None, dict[str, str]]:
    """A checkpoint folder's chat template (None: it has none) and the special tokens the template sees, where
    transformers finds them: chat_template.jinja, else tokenizer_config.json's ``chat_template`` (a string, or
    named templates of which "default" is used); the tokens from tokenizer_config.json then special_tokens_map.json."""
    folder = Path(folder)
    settings = tokenizer_settings(folder)
    template = settings.get("chat_template")
    if isinstance(template, list):
        template = {entry["name"]: entry["template"] for entry in template}.get("default")
    if (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    tokens = {}
    mapped = {}
    if (folder / "special_tokens_map.json").exists():
        mapped = json.loads((folder / "special_tokens_map.json").read_text(encoding="utf-8"))
    for name in SPECIAL_TOKEN_NAMES:
        token = settings.get(name, mapped.get(name))
        token = token.get("content") if isinstance(token, dict) else token
        if token is not None:
            tokens[name] = str(token)
    return template, tokens


def _language(param: str, use, *args):
    """A ``Languages`` call (``encode(text, src_lang)``, ``target(tgt_lang)``), an unknown code a 400 on ``param``."""
    try:
        return use(*args)
    except ValueError as err:
        raise ApiError(400, str(err), param=param) from None


def compile_chat_template(template: str):
    """The template compiled in the environment transformers' ``apply_chat_template`` renders in: a sandbox that
    trims blocks, with loop controls, a ``tojson`` that keeps non-ASCII and HTML characters, ``raise_exception``,
    ``strftime_now``, a ``dict`` that only builds dicts and a ``namespace`` that refuses underscored names
    (``{% generation %}`` marks render as their content)."""
    from datetime import datetime

    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlocks(jinja2.ext.Extension):
        # transformers' marks of the assistant's tokens (for training masks): here they render as their content
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_content"), [], [], body).set_lineno(lineno)

        def _content(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class TemplateDict:  # the builtin's two uses, not the type itself
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):  # jinja's signature: namespace(self=...) stays an attribute
            self, attrs = args[0], dict(*args[1:], **kwargs)
            for name in attrs:
                Namespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template's namespace cannot hold {name!r}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlocks, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       dict=TemplateDict(), namespace=Namespace)
    return env.from_string(template)


# ---------------------------------------------------------------------------------------------- text


class TextStream:
    """One request's text as its tokens arrive: each ``add`` returns the new text that is safe to send (none that
    may still change: a trailing incomplete UTF-8 character, the start of a stop string) and whether a stop string
    ended it (the text cut before it). The tokens are decoded after the prompt's last few, as the whole row's
    decoding continues the prompt (a SentencePiece decoder strips the space of a text's first token only)."""

    def __init__(self, tokenizer, prompt_ids: list[int], stops: tuple[str, ...]):
        self.tokenizer, self.stops = tokenizer, stops
        self.tail = prompt_ids[-PROMPT_TAIL_TOKENS:]
        self.start = len(tokenizer.decode(self.tail))
        self.token_ids: list[int] = []
        self.sent = 0  # characters of the text sent
        self.text = ""

    def add(self, token_ids, finished: bool) -> tuple[str, bool]:
        self.token_ids += token_ids
        text = self.tokenizer.decode(self.tail + self.token_ids)[self.start:]
        cut = min((i for i in (text.find(stop, max(self.sent - len(stop) + 1, 0)) for stop in self.stops) if i >= 0),
                  default=-1)
        if cut >= 0:
            text, finished = text[:cut], True
        safe = len(text)
        if not finished:
            safe = len(text.rstrip("\ufffd"))
            held = max((n for stop in self.stops for n in range(1, len(stop)) if text[:safe].endswith(stop[:n])),
                       default=0)
            safe -= held
        delta = text[self.sent:safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        self.text = text[:self.sent]
        return delta, cut >= 0


class TokenPieces:
    """The text each new token of one choice adds, for its log-probabilities: decoded in context as ``TextStream``
    decodes it (after the tokens before it, so a SentencePiece token keeps its leading space), a token that ends
    inside a UTF-8 character adding nothing and the one that completes it the whole character, so the tokens join to
    the choice's text. A top candidate's piece is the text it would add in the same place. Beside each piece, the
    token's own bytes (``Tokenizer.token_bytes``: a character split across tokens split as they split it, as OpenAI's
    ``bytes``, so they join to the text's bytes), less a leading space the decoder strips from the text's first
    token; where the tokenizer's decoder gives no raw bytes (WordPiece, ...), the piece's UTF-8 bytes."""

    def __init__(self, tokenizer, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.context = list(prompt_ids[-PROMPT_TAIL_TOKENS:])  # the tokens before the next one (a few suffice)

    def add(self, entries, finished: bool = False) -> list[tuple[str, bytes, list[tuple[str, bytes, float]]]]:
        """Each ``TokenLogprobs`` entry's token's (piece, bytes) and its top candidates' (piece, bytes,
        log-probability), in order; ``finished``: the entries end the choice, so its last incomplete character stays
        (as ``TextStream`` ends)."""
        out = []
        for j, entry in enumerate(entries):
            last = finished and j == len(entries) - 1
            before = len(self._text(self.context))
            ids = [entry.token_id, *(i for i, _ in entry.top)]
            pieces = [self._text(self.context + [i], last)[before:] for i in ids]
            raw = self.tokenizer.token_bytes(ids) or [piece.encode() for piece in pieces]
            # (nothing decoded before it: the token is the text's first, whose leading space a decoder may strip)
            raw = [b[1:] if before == 0 and b[:1] == b" " and not piece.startswith(" ") else b
                   for piece, b in zip(pieces, raw)]
            out.append((pieces[0], raw[0], [(piece, b, x) for piece, b, (_, x) in zip(pieces[1:], raw[1:], entry.top)]))
            self.context = (self.context + [entry.token_id])[-PROMPT_TAIL_TOKENS:]
        return out

    def _text(self, ids: list[int], last: bool = False) -> str:
        """``ids`` decoded, less a trailing incomplete character unless they are the choice's ``last``."""
        text = self.tokenizer.decode(ids)
        return text if last else text.rstrip("\ufffd")


def likeliest_by_piece(candidates) -> dict[str, float]:
    """(piece, log-probability) candidates as OpenAI's completions' ``top_logprobs`` dict: of two ids with the same
    piece (the bytes of one character, say), the likelier's, as vLLM's and OpenAI's dicts keep one."""
    out: dict[str, float] = {}
    for piece, logprob in candidates:
        if logprob > out.get(piece, -math.inf):
            out[piece] = logprob
    return out


# ---------------------------------------------------------------------------------------------- the engine loop


@dataclasses.dataclass(eq=False)
class Pending:
    """A request between its handler and the engine: the engine's outputs for it arrive on ``outputs``."""

    prompt: list[int]
    params: SamplingParams
    arrived: float
    outputs: asyncio.Queue = dataclasses.field(default_factory=asyncio.Queue)
    request_id: int | None = None  # the engine's, once admitted
    first_token: float | None = None
    aborted: bool = False
    source: list[int] | None = None  # an encoder-decoder's source ids (``prompt``: its decoder prompt)


class EngineLoop:
    """Drives an ``Engine`` from the event loop (module docstring); ``submit`` and ``abort`` are called by handlers
    on the loop's thread and take effect between steps. At most ``max_queue`` requests wait for the engine."""

    def __init__(self, engine: Engine, max_queue: int, metrics):
        self.engine, self.max_queue, self.metrics = engine, max_queue, metrics
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.arrivals: list[Pending] = []
        self.aborts: list[Pending] = []
        self.by_id: dict[int, Pending] = {}
        self.snapshot = engine.stats()
        self.wake = asyncio.Event()
        self.failure: BaseException | None = None
        self.task: asyncio.Task | None = None

    def waiting(self) -> int:
        return self.snapshot["waiting"] + len(self.arrivals)

    def submit(self, prompt: list[int] | None, params: SamplingParams, param: str,
               source: list[int] | None = None) -> Pending:
        """Queue a request, or an ApiError: the engine failed, the queue is full, the prompt is refused (the
        request's ``param`` named). An encoder-decoder's request gives its ``source`` (``prompt`` None: the decoder
        starts from its start token)."""
        if self.failure is not None:
            raise ApiError(503, f"the engine failed: {self.failure!r}", kind="server_error")
        if self.waiting() >= self.max_queue:
            raise ApiError(429, f"the queue is full ({self.max_queue} requests waiting); retry later",
                           code="queue_full", kind="rate_limit_error")
        try:
            prompt = self.engine.check_request(prompt, params, source)
        except ValueError as err:  # (a setting the model refuses, a logit bias beyond its ids, names itself)
            raise ApiError(400, str(err).replace("SamplingParams.", ""), param=_setting(err) or param,
                           code="context_length_exceeded"
                           if "exceeds" in str(err) or "the pool has" in str(err) else None) from None
        pending = Pending(prompt, params, time.perf_counter(), source=source)
        self.arrivals.append(pending)
        self.wake.set()
        return pending

    def abort(self, pending: Pending) -> None:
        """End a request whose client went away (its blocks are freed before the next step)."""
        if not pending.aborted:
            pending.aborted = True
            self.aborts.append(pending)
            self.wake.set()

    def _admit(self) -> None:
        for pending in self.aborts:
            if pending in self.arrivals:
                self.arrivals.remove(pending)
            elif pending.request_id is not None and self.by_id.pop(pending.request_id, None) is not None:
                self.engine.abort(pending.request_id)
                self.metrics.finished.labels("abort").inc()
        self.aborts.clear()
        for pending in self.arrivals:
            pending.request_id = self.engine.add_request(pending.prompt, pending.params, pending.source)
            self.by_id[pending.request_id] = pending
            # (an encoder-decoder's prompt is its source, as its usage counts it, not its decoder's start token)
            self.metrics.prompt_tokens.inc(len(pending.prompt if pending.source is None else pending.source))
        self.arrivals.clear()
        self.snapshot = self.engine.stats()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._admit()
                if not self.engine.has_unfinished():
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                outputs = await loop.run_in_executor(self.executor, self.engine.step)
                self._deliver(outputs)
        except Exception as err:  # every waiting handler answers 500 rather than hanging
            self.failure = err
            for pending in [*self.by_id.values(), *self.arrivals]:
                pending.outputs.put_nowait(err)
            raise

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        now = time.perf_counter()
        for output in outputs:
            pending = self.by_id.get(output.request_id)
            if pending is None:  # aborted while the step ran
                continue
            if pending.first_token is None:
                pending.first_token = now
                self.metrics.time_to_first_token.observe(now - pending.arrived)
            self.metrics.generated_tokens.inc(len(output.token_ids))
            if output.finished:
                del self.by_id[output.request_id]
                self.metrics.finished.labels(output.finish_reason).inc()
            pending.outputs.put_nowait(output)
        self.snapshot = self.engine.stats()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        self.executor.shutdown(wait=True)


class Metrics:
    """The server's Prometheus series: counters and a histogram kept as requests go, and the engine's state read
    at each scrape (queue length, running sequences, blocks used and in all, preemptions, programs compiled)."""

    def __init__(self, loop_state):
        from prometheus_client import CollectorRegistry, Counter, Histogram
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.registry = CollectorRegistry()
        self.generated_tokens = Counter("jaxformer_generated_tokens", "tokens generated", registry=self.registry)
        self.prompt_tokens = Counter("jaxformer_prompt_tokens", "prompt tokens admitted", registry=self.registry)
        self.finished = Counter("jaxformer_requests_finished", "requests ended: by the engine (stop, length) or "
                                "by the server (abort: a stop string, or the client went away)", ["finish_reason"],
                                registry=self.registry)
        self.time_to_first_token = Histogram(
            "jaxformer_time_to_first_token_seconds", "from a request's arrival to its first token",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=self.registry)

        class EngineState:
            def collect(self):
                loop = loop_state()
                if loop is None:
                    return
                stats = loop.snapshot
                for name, help_text, value in (
                        ("jaxformer_queue_length", "requests waiting for the engine", loop.waiting()),
                        ("jaxformer_running_sequences", "sequences in the running batch", stats["running"]),
                        ("jaxformer_kv_blocks_used", "KV-cache blocks held by sequences", stats["blocks_used"]),
                        ("jaxformer_kv_blocks", "KV-cache blocks in the pool", stats["blocks"]),
                        ("jaxformer_kv_tokens", "tokens in the KV cache of running sequences (a shared prefix counted "
                         "for each): against blocks used, the paging waste", stats["tokens_held"]),
                        ("jaxformer_kv_block_size", "tokens a KV-cache block holds", loop.engine.block_size)):
                    yield GaugeMetricFamily(name, help_text, value=value)
                yield CounterMetricFamily("jaxformer_preemptions", "sequences preempted for blocks",
                                          value=stats["preemptions"])
                yield CounterMetricFamily("jaxformer_programs_compiled", "step programs compiled (one compiled while "
                                          "requests run stalls them for its compile)", value=stats["programs"])
                yield CounterMetricFamily("jaxformer_draft_tokens", "draft tokens proposed (prompt lookup or the "
                                          "assistant model)", value=stats["drafted"])
                yield CounterMetricFamily("jaxformer_accepted_draft_tokens", "draft tokens the model kept",
                                          value=stats["accepted_drafts"])

        self.registry.register(EngineState())


# ---------------------------------------------------------------------------------------------- requests


def _sampling(body: dict, default_max_tokens: int | None, kind: str = "completions"
              ) -> tuple[SamplingParams, tuple[str, ...]]:
    """The request's SamplingParams and stop strings, or an ApiError naming the parameter. Log-probabilities:
    completions' ``logprobs`` k (0..5), chat's ``logprobs`` (bool) with ``top_logprobs`` k (0..20). A ``seed``
    outside [0, 2**32) (OpenAI takes any int) is folded into it (``_seed``); ``top_k`` -1 is vLLM's "off" (0 here).
    ``use_beam_search`` (vLLM's): a beam search ``n`` wide (``SamplingParams.beam_width``; its ``length_penalty`` and
    ``early_stopping``), whose n best hypotheses are the choices; its temperature is 0."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    stop = body.get("stop")
    stops = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise ApiError(400, f"stop={stop!r}: want a non-empty string or a list of at most 4", param="stop")
    beams = body.get("use_beam_search", False)
    if not isinstance(beams, bool):
        raise ApiError(400, f"use_beam_search={beams!r}: want a boolean", param="use_beam_search")
    if beams and stops:  # (a stop string cuts a hypothesis's text after the search ranked it whole)
        raise ApiError(400, "stop strings do not apply to beam search, which ranks each hypothesis whole (they end "
                            "at the model's EOS or at max_tokens)", param="stop")
    if beams and body.get("temperature") not in (None, 0):
        raise ApiError(400, f"temperature={body['temperature']!r}: beam search is deterministic (temperature 0)",
                       param="temperature")
    values = {"max_tokens": default_max_tokens if max_tokens is None else max_tokens,
              "temperature": body.get("temperature"), "top_p": body.get("top_p"), "top_k": body.get("top_k"),
              "seed": _seed(body.get("seed")), "logprobs": _logprobs(body, kind), "logit_bias": _logit_bias(body),
              **{name: body.get(name) for name in ("min_p", "repetition_penalty", "presence_penalty",
                                                   "frequency_penalty", "ignore_eos", "length_penalty",
                                                   "early_stopping")}}
    if beams:
        values.update(temperature=0, beam_width=_choices(body, kind))
    if isinstance(values["top_k"], int) and values["top_k"] == -1:
        values["top_k"] = 0
    if values["ignore_eos"] is not None and not isinstance(values["ignore_eos"], bool):  # (vLLM's extension)
        raise ApiError(400, f"ignore_eos={values['ignore_eos']!r}: want a boolean", param="ignore_eos")
    if isinstance(values["temperature"], (int, float)) and values["temperature"] > 2:
        raise ApiError(400, f"temperature={values['temperature']!r}: want a number in [0, 2]", param="temperature")
    try:
        return SamplingParams(**{k: v for k, v in values.items() if v is not None}), tuple(stops)
    except (ValueError, TypeError) as err:
        raise ApiError(400, str(err).replace("SamplingParams.", ""), param=_setting(err)) from None


def _setting(err: Exception) -> str | None:
    """The request parameter behind the ``SamplingParams`` field a refusal names (its message starts
    "SamplingParams.NAME"; a beam search's width is its ``n``), or None."""
    named = re.match(r"SamplingParams\.(\w+)", str(err))
    return None if named is None else {"beam_width": "n"}.get(named.group(1), named.group(1))


def _logit_bias(body: dict) -> dict[int, object] | None:
    """OpenAI's ``logit_bias`` (token ids as JSON's string keys -> biases) with int keys, or an ApiError naming it
    (the biases' range is ``SamplingParams``'s to check)."""
    bias = body.get("logit_bias")
    if bias is None:
        return None
    if not isinstance(bias, dict) or not all(isinstance(key, str) and key.isascii() and key.isdigit() for key in bias):
        raise ApiError(400, f"logit_bias={bias!r}: want an object mapping token ids to numbers in [-100, 100]",
                       param="logit_bias")
    return {int(key): value for key, value in bias.items()}


def _seed(seed):
    """An int seed outside [0, 2**32) folded into it, the same way every time (numpy's SeedSequence of its sign and
    size); another value as given (None, or one ``SamplingParams`` refuses by name)."""
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed < 2 ** 32:
        return int(np.random.SeedSequence([int(seed < 0), abs(seed)]).generate_state(1)[0])
    return seed


def _logprobs(body: dict, kind: str) -> int | None:
    """How many top log-probabilities a token carries (None: no logprobs), or an ApiError naming the parameter."""
    asked, top, most = body.get("logprobs"), body.get("top_logprobs"), MAX_LOGPROBS[kind]
    if kind == "completions":
        if asked is not None and not (isinstance(asked, int) and not isinstance(asked, bool) and 0 <= asked <= most):
            raise ApiError(400, f"logprobs={asked!r}: want an int in [0, {most}]", param="logprobs")
        return asked
    if asked is not None and not isinstance(asked, bool):
        raise ApiError(400, f"logprobs={asked!r}: want a boolean", param="logprobs")
    if top is not None and not (isinstance(top, int) and not isinstance(top, bool) and 0 <= top <= most):
        raise ApiError(400, f"top_logprobs={top!r}: want an int in [0, {most}]", param="top_logprobs")
    if top and not asked:
        raise ApiError(400, f"top_logprobs={top!r} needs logprobs=true", param="top_logprobs")
    return (top or 0) if asked else None


def _prompts(prompt) -> list[str | list[int]]:
    """Completions' ``prompt`` as a list of prompts (OpenAI's forms: a string, a list of token ids, or a list of
    either, at most ``MAX_PROMPTS``), or an ApiError naming it."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_id(i) for i in prompt)):
        prompt = [prompt]
    ok = isinstance(prompt, list) and 0 < len(prompt) <= MAX_PROMPTS and all(
        (isinstance(p, str) and p) or (isinstance(p, list) and p and all(_is_id(i) for i in p)) for p in prompt)
    if not ok or len({isinstance(p, str) for p in prompt}) > 1:
        raise ApiError(400, f"prompt: want a non-empty string, a non-empty list of token ids, or a list of 1 to "
                            f"{MAX_PROMPTS} of one of those kinds", param="prompt")
    return prompt


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _choices(body: dict, kind: str) -> int:
    """The request's ``n`` (``best_of``, completions', only equal to it), or an ApiError naming the parameter."""
    n = body.get("n")
    n = 1 if n is None else n
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise ApiError(400, f"n={n!r}: want an int in [1, {MAX_N}]", param="n")
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise ApiError(400, f"best_of={best_of!r} other than n={n} is not supported by jaxformer serve",
                       param="best_of", code="unsupported_parameter")
    return n


def _check_keys(body, kind: str) -> None:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for key, value in body.items():
        if key in NOT_YET:
            if value not in NOT_YET[key]:
                raise ApiError(400, f"{key}={value!r} is not supported yet by jaxformer serve", param=key,
                               code="unsupported_parameter")
        elif key not in KEYS[kind]:
            raise ApiError(400, f"unknown parameter {key!r}", param=key, code="unknown_parameter")
    if not isinstance(body.get("stream", False), bool):
        raise ApiError(400, f"stream={body['stream']!r}: want a boolean", param="stream")


async def _merged(generators):
    """(i, item) from the async ``generators`` as their items arrive, each drained by a task of its own; an error
    in one ends them all and is raised here, and leaving early cancels every task (their ``finally`` runs)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def drain(i, generator):
        try:
            async for item in generator:
                await queue.put((i, item, None))
        except Exception as err:  # handed to the consumer, raised there
            await queue.put((i, None, err))
            return
        await queue.put((i, None, None))

    tasks = [asyncio.ensure_future(drain(i, generator)) for i, generator in enumerate(generators)]
    try:
        running = len(tasks)
        while running:
            i, item, err = await queue.get()
            if err is not None:
                raise err
            if item is None:
                running -= 1
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()


def _sse(payload) -> str:
    return f"data: {json.dumps(payload) if not isinstance(payload, str) else payload}\n\n"


def add_error_handlers(app: FastAPI) -> None:
    """Errors in OpenAI's shape: ours (ApiError) and the framework's (unknown route, wrong method)."""

    @app.exception_handler(ApiError)
    async def api_error(request, err: ApiError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):
        return JSONResponse(ApiError(err.status_code, str(err.detail)).body(), status_code=err.status_code)


def add_service_routes(app: FastAPI, registry, model_name: str, created: int, max_model_len: int,
                       api_key: str | None, failure=lambda: None) -> None:
    """The routes every server has: ``/health`` (503 with the error once ``failure()`` returns one), Prometheus
    ``/metrics`` of ``registry`` and ``/v1/models`` (behind the API key)."""

    @app.get("/health")
    async def health():
        failed = failure()
        if failed is not None:
            return JSONResponse({"status": "failed", "error": repr(failed)}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        check_api_key(request, api_key)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "jaxformer", "max_model_len": max_model_len}]}


def check_api_key(request: Request, api_key: str | None) -> None:
    """401 unless the request carries ``Authorization: Bearer api_key`` (None: no key asked)."""
    given = request.headers.get("authorization", "")
    if api_key is not None and not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
        raise ApiError(401, "missing or incorrect API key (Authorization: Bearer KEY)", code="invalid_api_key")


def listen(host: str, port: int):
    """A socket listening on host:port (port 0: a free one), or a ValueError naming the flags."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ValueError(f"cannot listen on --host {host} --port {port}: {err.strerror}") from None
    sock.listen(2048)  # connections made before uvicorn starts wait in the backlog
    return sock


def create_app(engine: Engine, tokenizer, model_name: str, chat_template: str | None = None,
               special_tokens: dict[str, str] | None = None, api_key: str | None = None, max_queue: int = 1024,
               languages: Languages | None = None):
    """The FastAPI app serving ``engine`` as ``model_name``; the engine loop starts and stops with the app.
    ``languages``: an encoder-decoder's language codes (``Languages``), which a completion's ``src_lang`` and
    ``tgt_lang`` name (None: the model takes neither)."""
    state: dict = {}
    metrics = Metrics(lambda: state.get("loop"))
    template = None if chat_template is None else compile_chat_template(chat_template)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state["loop"] = EngineLoop(engine, max_queue, metrics)
        state["loop"].start()
        yield
        await state["loop"].stop()

    app = FastAPI(title="jaxformer serve", lifespan=lifespan)
    add_error_handlers(app)
    add_service_routes(app, metrics.registry, model_name, created, engine.max_model_len, api_key,
                       failure=lambda: state["loop"].failure)

    async def read(request: Request, kind: str) -> dict:
        check_api_key(request, api_key)
        try:
            body = await request.json()
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None
        _check_keys(body, kind)
        if body.get("model") != model_name:
            raise ApiError(404, f"model={body.get('model')!r} is not served here; this server serves "
                                f"{model_name!r}", param="model", code="model_not_found")
        return body

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await read(request, "completions")
        prompts = _prompts(body.get("prompt"))
        src_lang, tgt_lang = body.get("src_lang"), body.get("tgt_lang")
        if languages is None and (src_lang, tgt_lang) != (None, None):
            raise ApiError(400, f"{model_name!r} takes no language codes (its tokenizer's template holds none): "
                                "src_lang and tgt_lang are for translation models that name their languages (NLLB, "
                                "M2M100, mBART-50)", param="src_lang" if src_lang is not None else "tgt_lang")
        if src_lang is not None and not isinstance(prompts[0], str):
            raise ApiError(400, "src_lang applies to a text prompt; token ids carry their own language code",
                           param="src_lang")
        ids = [prompt if not isinstance(prompt, str) else tokenizer.encode(prompt) if src_lang is None
               else _language("src_lang", languages.encode, prompt, src_lang) for prompt in prompts]
        echo = body.get("echo", False)
        if not isinstance(echo, bool):
            raise ApiError(400, f"echo={echo!r}: want a boolean", param="echo")
        if echo and engine.decoder_prompt is not None:
            raise ApiError(400, f"{model_name!r} is an encoder-decoder: its prompt is the source, which it does not "
                                "continue, so there is nothing to echo", param="echo")
        score_only = echo and body.get("max_tokens") == 0  # (the prompt scored, no token kept: one is drawn)
        params, stops = _sampling({**body, "max_tokens": 1} if score_only else body, 16)
        if echo and params.logprobs is not None:
            params = dataclasses.replace(params, prompt_logprobs=params.logprobs)
        if tgt_lang is not None:
            forced = _language("tgt_lang", languages.target, tgt_lang)
            params = dataclasses.replace(params, forced_bos_token_id=forced)
        echoed = [prompt if isinstance(prompt, str) else tokenizer.decode(prompt) for prompt in prompts] \
            if echo else None
        return await answer(request, body, "text_completion", ids, params, stops, echoed, score_only)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await read(request, "chat")
        if engine.decoder_prompt is not None:
            raise ApiError(400, f"{model_name!r} is an encoder-decoder (translation, summarization): it has no chat; "
                                "send the source text as /v1/completions' prompt", param="messages")
        if template is None:
            raise ApiError(400, f"{model_name!r} has no chat template (chat_template.jinja or tokenizer_config.json's "
                                "chat_template); use /v1/completions", param="messages")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and "role" in m for m in messages):
            raise ApiError(400, "messages: want a non-empty list of {role, content} objects", param="messages")
        try:
            messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
            text = template.render(messages=messages, tools=None, documents=None, add_generation_prompt=True,
                                   **(special_tokens or {}))
        except Exception as err:  # the template's own refusals (raise_exception) and its errors
            raise ApiError(400, f"the chat template refused the messages: {err}", param="messages") from None
        ids = tokenizer.encode(text, add_special_tokens=False)
        params, stops = _sampling(body, max(engine.max_model_len - len(ids), 1), "chat")
        return await answer(request, body, "chat.completion", [ids], params, stops)

    async def answer(request: Request, body: dict, kind: str, prompts: list[list[int]], params: SamplingParams,
                     stops: tuple[str, ...], echoed: list[str] | None = None, score_only: bool = False):
        """The answer to a request, whole or streamed: ``n`` choices for each of its ``prompts`` (ids), each an
        engine request, choice ``p * n + i`` being prompt p's i-th (OpenAI's order). ``echoed``: each prompt's text,
        put before its choices' (completions' ``echo``); ``score_only``: keep no new token. A beam search is one
        engine request a prompt, whose hypotheses are its choices, best first."""
        loop = state["loop"]
        per_prompt = _choices(body, kind)
        n = per_prompt * len(prompts)  # (every choice of the answer)
        beams = params.beam_width > 1
        pendings: list[Pending] = []
        try:  # n engine requests a prompt, its choice i of a seeded request drawing by seed + i
            for ids in prompts:
                # an encoder-decoder's prompt is its source; its decoder starts from its start token
                prompt, source = (None, ids) if engine.decoder_prompt is not None else (ids, None)
                param = "prompt" if kind == "text_completion" else "messages"
                if beams:
                    pendings += [loop.submit(prompt, params, param, source)] * per_prompt
                    continue
                for i in range(per_prompt):
                    seed = None if params.seed is None else (params.seed + i) % 2 ** 32
                    pendings.append(loop.submit(prompt, dataclasses.replace(params, seed=seed), param, source))
        except ApiError:
            for pending in pendings:
                loop.abort(pending)
            raise
        texts = [TextStream(tokenizer, pending.prompt, stops) for pending in pendings]
        token_pieces = [TokenPieces(tokenizer, pending.prompt) for pending in pendings]
        offsets = [0] * n  # each choice's characters so far in its tokens' text (completions' text_offset)
        streaming = body.get("stream", False)
        answer_id = f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{secrets.token_hex(12)}"

        searches: dict[int, asyncio.Future] = {}  # a beam search's one output, read once for all its choices

        def next_output(index: int):
            if not beams:
                return pendings[index].outputs.get()
            prompt = index // per_prompt
            if prompt not in searches:
                searches[prompt] = asyncio.ensure_future(pendings[index].outputs.get())
            return asyncio.shield(searches[prompt])  # (a choice's timeout cancels its wait, not the read)

        async def pieces(index: int):
            """(new text, finish reason or None, the new tokens' TokenLogprobs, the prompt's where they came with
            this output) of choice ``index`` as the engine's tokens arrive; aborts the request if left early."""
            pending, text = pendings[index], texts[index]
            try:
                while True:
                    if streaming:  # a stream's handler is cancelled when its client goes away
                        output = await next_output(index)
                    else:  # a plain answer's is not: look now and then
                        try:
                            output = await asyncio.wait_for(next_output(index), DISCONNECT_POLL_S)
                        except TimeoutError:
                            if await request.is_disconnected():
                                return
                            continue
                    if isinstance(output, BaseException):
                        raise ApiError(500, f"the engine failed: {output!r}", kind="server_error")
                    if output.finish_reason == "error":  # the engine ended it with no token (RequestOutput)
                        raise ApiError(500, "the model's logits for this request's next token were not finite (NaN "
                                            "or inf); it was ended", kind="server_error", code="non_finite_logits")
                    if beams:  # (choice i: the search's i-th best hypothesis)
                        hypothesis = output.beams[index % per_prompt]
                        output = RequestOutput(output.request_id, hypothesis.token_ids, True, hypothesis.finish_reason)
                    if score_only:  # (the prompt's log-probabilities came with the token, which is not kept)
                        yield "", "length", (), output.prompt_logprobs
                        return
                    delta, stopped = text.add(list(output.token_ids), output.finished)
                    finish = "stop" if stopped else output.finish_reason
                    yield delta, finish, output.logprobs or (), output.prompt_logprobs
                    if finish is not None:
                        return
            finally:
                loop.abort(pending)  # a no-op once the engine ended it
                search = searches.get(index // per_prompt)
                if search is not None and not search.done():  # (left early: its output will never come)
                    search.cancel()

        def usage():
            done = sum(len(text.token_ids) for text in texts)
            prompt_tokens = sum(map(len, prompts))
            return {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}

        def logprobs_of(index: int, entries, finished: bool) -> dict | None:
            """OpenAI's logprobs of choice ``index``'s next tokens ``entries`` (TokenLogprobs; ``finished``: its
            last), each token's text as it adds to the choice's (``TokenPieces``); None where not asked."""
            if params.logprobs is None:
                return None
            pieces = token_pieces[index].add(entries, finished)
            if kind == "text_completion":
                text_offset = []
                for piece, _, _ in pieces:
                    text_offset.append(offsets[index])
                    offsets[index] += len(piece)
                return {"tokens": [piece for piece, _, _ in pieces], "token_logprobs": [e.logprob for e in entries],
                        "top_logprobs": [likeliest_by_piece((p, x) for p, _, x in top) for _, _, top in pieces],
                        "text_offset": text_offset}

            def token(piece: str, raw: bytes, logprob: float) -> dict:
                return {"token": piece, "logprob": logprob, "bytes": list(raw)}
            return {"content": [{**token(piece, raw, entry.logprob), "top_logprobs": [token(*c) for c in top]}
                                for entry, (piece, raw, top) in zip(entries, pieces)]}

        def prompt_logprobs_of(index: int, scores) -> dict | None:
            """Completions' logprobs of the echoed prompt (``scores``: the engine's, None first), its tokens' text as
            they add to the prompt's; choice ``index``'s offsets then go on after the echoed text."""
            if params.logprobs is None:
                return None
            first = TokenLogprobs(prompts[index // per_prompt][0], 0.0, ())  # (its text only: no log-probability)
            pieces = TokenPieces(tokenizer, []).add([first, *scores[1:]])
            text_offset, offset = [], 0
            for piece, _, _ in pieces:
                text_offset.append(offset)
                offset += len(piece)
            offsets[index] = len(echoed[index // per_prompt])
            return {"tokens": [piece for piece, _, _ in pieces],
                    "token_logprobs": [None, *(entry.logprob for entry in scores[1:])],
                    "top_logprobs": [None, *(likeliest_by_piece((p, x) for p, _, x in top)
                                             for _, _, top in pieces[1:])],
                    "text_offset": text_offset}

        def choice(index: int, delta: str, finish, streaming: bool, entries=None, scores=None) -> dict:
            """Choice ``index``'s answer or chunk; ``entries`` None: one that carries no tokens (a chat stream's
            first, naming the role: its logprobs null, as OpenAI's). ``scores``: the echoed prompt's log-probabilities,
            before the entries'."""
            echoed_logprobs = None if scores is None else prompt_logprobs_of(index, scores)  # (offsets: first)
            logprobs = None if entries is None else logprobs_of(index, entries, finish is not None)
            if echoed_logprobs is not None:
                logprobs = echoed_logprobs if logprobs is None else {
                    key: value + logprobs[key] for key, value in echoed_logprobs.items()}
            if kind == "text_completion":
                return {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish}
            message = {"role": "assistant", "content": delta}
            return {"index": index, ("delta" if streaming else "message"): message, "logprobs": logprobs,
                    "finish_reason": finish}

        head = {"id": answer_id, "created": int(time.time()), "model": model_name}
        if not streaming:
            async def collect(index: int):
                finish, entries, scores = None, [], None
                async for _, finish, new, prompt_scores in pieces(index):
                    entries += new
                    scores = scores or prompt_scores
                echo = "" if echoed is None else echoed[index // per_prompt]
                return choice(index, echo + texts[index].text, finish, False, entries, scores)

            tasks = [asyncio.ensure_future(collect(i)) for i in range(n)]
            try:
                choices = await asyncio.gather(*tasks)
            finally:  # one choice failed: the others end too
                for task in tasks:
                    task.cancel()
            return {**head, "object": kind, "choices": choices, "usage": usage()}

        chunk_kind = "chat.completion.chunk" if kind == "chat.completion" else kind
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events():
            if kind == "chat.completion":  # OpenAI's first chunk of each choice names the role
                for i in range(n):
                    yield _sse({**head, "object": chunk_kind, "choices": [choice(i, "", None, True)]})
            held = [[] for _ in range(n)]  # logprobs of tokens whose text is held back, sent with the next chunk
            # the echoed prompt goes first, a chunk of its own, with the first token's output (which carries the
            # prompt's log-probabilities)
            echoing = [echoed is not None] * n
            try:
                async for i, (delta, finish, new, scores) in _merged([pieces(i) for i in range(n)]):
                    if echoing[i]:
                        echoing[i] = False
                        yield _sse({**head, "object": chunk_kind,
                                    "choices": [choice(i, echoed[i // per_prompt], None, True, None, scores)]})
                    held[i] += new
                    if delta or finish is not None:
                        chunk = choice(i, delta, finish, True, held[i])
                        held[i] = []
                        if finish is not None and kind == "chat.completion":
                            chunk["delta"] = {"content": delta} if delta else {}
                        yield _sse({**head, "object": chunk_kind, "choices": [chunk]})
            except ApiError as err:
                yield _sse(err.body())
            if include_usage:
                yield _sse({**head, "object": chunk_kind, "choices": [], "usage": usage()})
            yield _sse("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def kv_block_bytes(cfg, block_size: int) -> int:
    """The bytes one block of the engine's pool holds: every decoder layer's keys and values of ``block_size``
    tokens at the cache's dtype (an encoder-decoder's source blocks are the same size; multi-head latent attention's
    latents and rotary keys, C + R a token and layer, and the indexer's keys of DeepSeek sparse attention; the
    attention layers' alone beside linear-attention layers, whose states are the engine's, a slot a sequence)."""
    per_token = 2 * cfg.kv_heads * cfg.head_dim_
    if cfg.mla:  # (and DeepSeek sparse attention's indexer key)
        per_token = cfg.latent.kv_rank + cfg.latent.rope_head_dim + (cfg.indexer.head_dim if cfg.indexer else 0)
    layers = cfg.decoder_layers - (len(cfg.linear_attention.layers) if cfg.linear_attention is not None else 0)
    return layers * per_token * block_size * np.dtype(dtype_of(cfg.dtype)).itemsize


def linear_state_bytes(cfg, max_num_seqs: int) -> int:
    """The bytes of the engine's linear-attention state slots (0 without linear-attention layers): one slot a running
    sequence and the padding rows' (``LinearState``: each layer's convolution inputs at the model's dtype and its
    float32 state matrices), allocated whatever the pool."""
    if cfg.linear_attention is None:
        return 0
    slots = jax.eval_shape(lambda: LinearState.empty(cfg, len(cfg.linear_attention.layers), max_num_seqs + 1,
                                                     dtype_of(cfg.dtype)))  # (the engine's, not allocated)
    return sum(math.prod(part.shape) * part.dtype.itemsize for part in jax.tree.leaves(slots))


def use_compilation_cache(folder: str | Path) -> None:
    """Keep every program compiled from now on in ``folder`` (JAX's persistent cache, however short its compile:
    a server's many small programs add up), so a later start reads them back rather than compiling them again."""
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def pool_blocks(cfg, block_size: int, max_num_seqs: int, num_blocks: int | None = None, memory: float | None = None,
                max_model_len: int | None = None, draft_cfg=None) -> int:
    """The blocks of a server's pool: ``num_blocks`` as given, or as many as ``memory`` GiB holds
    (``kv_block_bytes`` each, and an assistant model's (``draft_cfg``) as many again in its own pool; the null block
    among them; linear-attention layers' state slots come out of it first, ``linear_state_bytes``), or by default
    room for ``max_num_seqs`` sequences at ``max_model_len`` (the engine's default where None) and the null
    block."""
    if memory is None:
        if num_blocks is not None:
            return num_blocks
        longest = max_model_len or Engine.default_max_model_len(cfg)
        return max_num_seqs * -(-longest // block_size) + 1
    if num_blocks is not None:
        raise ValueError(f"--num-blocks={num_blocks} and --memory={memory} both size the pool: give one")
    if not isinstance(memory, (int, float)) or not 0 < memory < math.inf:
        raise ValueError(f"--memory={memory!r}: want a number of GiB > 0")
    block, states = kv_block_bytes(cfg, block_size), linear_state_bytes(cfg, max_num_seqs)
    block += 0 if draft_cfg is None else kv_block_bytes(draft_cfg, block_size)
    blocks = int(max(memory * 2 ** 30 - states, 0) // block)
    if blocks < 2:
        beside = f" beside {states} bytes of linear-attention states ({max_num_seqs + 1} slots)" if states else ""
        raise ValueError(f"--memory={memory} GiB holds {blocks} blocks of {block} bytes{beside}: want room for 2 at "
                         "least (one is the null block)")
    return blocks


def serve(model, tokenizer, folder: str | Path | None, model_name: str, host: str, port: int, api_key: str | None,
          max_queue: int, memory: float | None = None, warm_up: bool = True, compilation_cache: str | None = None,
          **engine_settings) -> None:
    """Build the engine over ``model`` (which it then owns: ``Engine(release_model=True)`` frees what its copy does
    not share) and serve it until SIGTERM / Ctrl-C (which drain the running requests).
    ``folder``: where the chat template is read from (None: none). The pool: ``num_blocks``, or as many blocks as
    ``memory`` GiB holds, or by default room for ``max_num_seqs`` sequences at ``max_model_len``. ``warm_up``:
    compile the common programs (``Engine.warm_up``) before listening; ``compilation_cache``: a folder where
    compiled programs are kept across starts (JAX's persistent cache). Prints the address once it listens (port 0:
    a free port)."""
    import uvicorn

    if not isinstance(max_queue, int) or max_queue < 1:
        raise ValueError(f"--max-queue={max_queue!r}: want an int >= 1")
    draft = engine_settings.get("draft_model")
    engine_settings["num_blocks"] = pool_blocks(model.config, engine_settings["block_size"],
                                                engine_settings["max_num_seqs"], engine_settings.get("num_blocks"),
                                                memory, engine_settings.get("max_model_len"),
                                                None if draft is None else draft.config)
    if compilation_cache is not None:
        use_compilation_cache(compilation_cache)
    engine = Engine(model, release_model=True, **engine_settings)  # (the caller's model: not run again)
    warmed = ""
    if warm_up:
        print("jaxformer serve: compiling the engine's programs before listening (--no-warm-up: each on first use; "
              "--compilation-cache DIR: kept for the next start)", file=sys.stderr, flush=True)
        programs, seconds = engine.warm_up()
        warmed = f", {programs} programs compiled in {seconds:.1f} s"
    template, special_tokens = load_chat_template(folder) if folder is not None else (None, {})
    languages = None
    if engine.decoder_prompt is not None:  # an encoder-decoder: does it name its languages?
        languages = Languages.of(tokenizer, folder)
    app = create_app(engine, tokenizer, model_name, template, special_tokens, api_key, max_queue, languages)
    sock = listen(host, port)
    print(f"jaxformer serve: {model_name!r} on http://{host}:{sock.getsockname()[1]} "
          f"({engine.manager.usable} blocks of {engine.block_size}, max_num_seqs={engine.max_num_seqs}, "
          f"max_model_len={engine.max_model_len}, paged attention {engine.kernel or 'xla'}{warmed})", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=None))
    server.run(sockets=[sock])
