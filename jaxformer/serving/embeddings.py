"""``jaxformer serve`` on a sentence-transformers folder, or on a plain encoder folder (BERT, RoBERTa, ...: read as
``SentenceTransformer(path)`` reads it, its states mean-pooled, nothing normalized): OpenAI's ``/v1/embeddings``
over ``jaxformer.Embedder``.

- ``POST /v1/embeddings``: ``input`` is a string, a list of strings, a list of token ids or a list of such lists
  (at most 2048 inputs, as OpenAI); ``encoding_format`` "float" (default) or "base64" (little-endian float32, as
  OpenAI); ``dimensions`` only where the model was trained to be truncated (Matryoshka: the folder's own
  ``truncate_dim`` in config_sentence_transformers.json, ``--matryoshka-dimensions``, or config.json's
  ``matryoshka_dimensions`` / ``is_matryoshka`` as vLLM reads them), else 400 by name. Vectors equal
  sentence-transformers' ``encode(texts, truncate_dim=dimensions)``: the first values, not normalized again (OpenAI's
  and vLLM's are; a client that wants unit vectors at a reduced width normalizes them); without ``dimensions``, the
  folder's truncate_dim applies, as in ``encode``. ``user`` accepted; ``usage`` counts the tokens embedded.
- A dual encoder's folder (CLIP, SigLIP: ``jaxformer.ImageTextEmbedder``): ``input`` texts embed by its text tower
  (transformers' ``get_text_features``), and an image by its image tower (``get_image_features``) given as vLLM
  takes one: ``messages`` in place of ``input``, one user message whose content is one ``image_url`` part with a
  ``data:`` URL (base64; the server fetches nothing) or one ``text`` part. No ``dimensions``: not Matryoshka.
- ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus: requests, inputs, tokens, batches, queue).
- ``/v1/completions`` and ``/v1/chat/completions`` answer 400 by name: an embedding model generates nothing.

Texts are tokenized as ``Embedder.encode`` tokenizes them (the folder's default prompt first, pooled or not as its
Pooling says); token ids are embedded as given (no prompt, no special tokens added). An input longer than the
model's max_seq_length gets 400 naming the limit: OpenAI (and vLLM) refuse rather than truncate, and a client that
sent a whole document should not silently get the vector of its start, which is what sentence-transformers'
``encode`` returns.

A request's inputs are tokenized (or its token ids checked) in a worker thread, so a long list keeps no other
request waiting. Concurrent requests are batched: one asyncio task takes what has arrived (whole requests, up to
``max_batch`` inputs; a request holding more runs alone), and ``Embedder.encode_ids`` runs them in a worker thread,
sorted by length and padded to power-of-two widths and row counts, so the compiled shapes stay few (each compiles on
first use). A dual encoder's images are batched so too, apart from texts (a batch takes the first waiting request's
kind, the other's wait in order; ``ImageTextEmbedder.encode_images`` pads the images' count). At most
``max_queue`` requests wait; more are answered 429; a batch whose call fails answers its requests 500 and the
server goes on. Errors have OpenAI's shape, and ``--api-key`` guards the ``/v1/`` routes, as
in ``serving.server``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import io
import json
import time

import numpy as np
from fastapi import FastAPI, Request

from jaxformer.embedder import Embedder, ImageTextEmbedder
from jaxformer.serving.server import (ApiError, add_error_handlers, add_service_routes, check_api_key, listen,
                                      use_compilation_cache)

MAX_INPUTS = 2048  # OpenAI's limit of inputs in one request
KEYS = {"model", "input", "encoding_format", "dimensions", "user"}
IMAGE_KEYS = KEYS | {"messages"}  # (a dual encoder's: an image as vLLM's chat-style embedding request gives it)
ENCODINGS = ("float", "base64")


def matryoshka_widths(config: dict, dimension: int) -> tuple[int, ...] | None:
    """The widths a client may ask for as ``dimensions``, as vLLM reads them from config.json (``config``):
    ``matryoshka_dimensions`` (those), ``is_matryoshka: true`` (any up to the full width); None: not truncatable."""
    widths = config.get("matryoshka_dimensions")
    if widths is not None:
        if not isinstance(widths, list) or not all(isinstance(w, int) and 1 <= w <= dimension for w in widths):
            raise ValueError(f"config.json: matryoshka_dimensions={widths!r}; want a list of widths in "
                             f"[1, {dimension}]")
        return tuple(widths)
    return tuple(range(1, dimension + 1)) if config.get("is_matryoshka") is True else None


@dataclasses.dataclass
class Pending:
    """One request's inputs, waiting for the batcher: token rows and each row's unpooled prompt tokens, or (a dual
    encoder's) ``images``; the answer."""

    rows: list[list[int]]
    skip: list[int]
    future: asyncio.Future
    images: list | None = None

    @property
    def size(self) -> int:
        return len(self.rows) if self.images is None else len(self.images)


class EmbeddingLoop:
    """The batcher: one asyncio task that gathers waiting requests into batches and embeds each in a worker
    thread, so the event loop keeps answering meanwhile."""

    def __init__(self, embedder: Embedder, max_batch: int, max_queue: int, metrics: "Metrics"):
        self.embedder, self.max_batch, self.max_queue, self.metrics = embedder, max_batch, max_queue, metrics
        self.waiting: collections.deque[Pending] = collections.deque()
        self.wake = asyncio.Event()
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="embed")
        self.task: asyncio.Task | None = None

    def submit(self, rows: list[list[int]], skip: list[int], images: list | None = None) -> asyncio.Future:
        """A request's token rows (and their unpooled prompt tokens), or its ``images``: the future of its vectors;
        429 when ``max_queue`` requests wait."""
        if len(self.waiting) >= self.max_queue:
            raise ApiError(429, f"the queue is full ({self.max_queue} requests waiting); retry later",
                           kind="rate_limit_error", code="queue_full")
        pending = Pending(rows, skip, asyncio.get_running_loop().create_future(), images)
        self.waiting.append(pending)
        self.wake.set()
        return pending.future

    def _take(self) -> list[Pending]:
        """Whole requests of the first waiting one's kind (texts or images), in arrival order, up to max_batch
        inputs (at least the first request); the other kind's wait, in their order, for a later batch."""
        batch, count, others = [], 0, collections.deque()
        while self.waiting:
            pending = self.waiting.popleft()
            if pending.future.done():  # a client that went away is skipped
                continue
            if batch and (pending.images is None) != (batch[0].images is None):
                others.append(pending)
            elif not batch or count + pending.size <= self.max_batch:
                batch.append(pending)
                count += pending.size
            else:  # (full: this request and every one after it wait)
                others.append(pending)
                others.extend(self.waiting)
                self.waiting.clear()
        self.waiting = others
        return batch

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                continue
            batch = self._take()
            if not batch:
                continue
            if batch[0].images is not None:  # (a dual encoder's images, in batches of the text rows' size)
                images = [image for pending in batch for image in pending.images]
                embed = functools.partial(self.embedder.encode_images, images, batch_size=self.max_batch)
            else:
                rows = [row for pending in batch for row in pending.rows]
                skip = [n for pending in batch for n in pending.skip]
                embed = functools.partial(self.embedder.encode_ids, rows, self.max_batch, skip=skip)
            try:
                vectors = await loop.run_in_executor(self.executor, embed)
            except Exception as err:  # this batch's requests answer 500; the server goes on
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(err)
                continue
            self.metrics.batches.inc()
            start = 0
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_result(vectors[start:start + pending.size])
                start += pending.size

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self.executor.shutdown(wait=True)


class Metrics:
    """The embedding server's Prometheus series."""

    def __init__(self, waiting):
        from prometheus_client import CollectorRegistry, Counter
        from prometheus_client.core import GaugeMetricFamily

        self.registry = CollectorRegistry()
        self.requests = Counter("jaxformer_embedding_requests", "embedding requests answered", ["status"],
                                registry=self.registry)
        self.inputs = Counter("jaxformer_embedding_inputs", "inputs embedded", registry=self.registry)
        self.prompt_tokens = Counter("jaxformer_prompt_tokens", "tokens embedded", registry=self.registry)
        self.batches = Counter("jaxformer_embedding_batches", "batches the model ran", registry=self.registry)

        class Queue:
            def collect(self):
                yield GaugeMetricFamily("jaxformer_queue_length", "requests waiting for the model", value=waiting())

        self.registry.register(Queue())


def _inputs(value, embedder: Embedder, prompt: str, prompt_skip: int) -> tuple[list[list[int]], list[int]]:
    """The token rows of ``input`` and how many of each row's first tokens pooling skips, or an ApiError."""
    shape = "want a non-empty string, a list of them, a list of token ids, or a list of such lists"
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(i, int) for i in value)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"input: {shape}", param="input")
    if len(value) > MAX_INPUTS:
        raise ApiError(400, f"input: {len(value)} inputs; at most {MAX_INPUTS} in one request", param="input")
    texts = [i for i, item in enumerate(value) if isinstance(item, str)]
    if texts and len(texts) != len(value):
        raise ApiError(400, f"input: mixes strings and token ids; {shape}", param="input")
    limit, vocab = embedder.max_seq_length, embedder.model.config.vocab_size
    if texts:
        if not all(value):
            raise ApiError(400, f"input[{value.index('')}] is an empty string", param="input")
        # (a dual encoder's tokenizer is load_tokenizer's, which truncates nothing)
        tokenizer = embedder.tokenizer.tokenizer if isinstance(embedder, ImageTextEmbedder) else embedder.tokenizer
        encoded = tokenizer.encode_batch([prompt + text for text in value])
        for i, encoding in enumerate(encoded):
            # (the sentence-transformers tokenizer truncates at max_seq_length: its overflow says it did)
            if encoding.overflowing or len(encoding.ids) > limit:
                raise ApiError(400, f"input[{i}] is longer than the model's {limit} tokens (max_seq_length"
                                    f"{', the default prompt included' if prompt else ''}); shorten it",
                               param="input", code="context_length_exceeded")
        return [e.ids for e in encoded], [prompt_skip] * len(value)
    for i, row in enumerate(value):
        if not isinstance(row, list) or not row or not all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in row):
            raise ApiError(400, f"input[{i}]: {shape}", param="input")
        if len(row) > limit:
            raise ApiError(400, f"input[{i}] has {len(row)} tokens, more than the model's {limit} (max_seq_length)",
                           param="input", code="context_length_exceeded")
        if not 0 <= min(row) <= max(row) < vocab:
            raise ApiError(400, f"input[{i}] holds a token id outside the vocabulary [0, {vocab})", param="input")
    return value, [0] * len(value)


def _message_input(messages):
    """The one image (PIL, RGB) or text of a chat-style embedding request's ``messages`` (vLLM's form for a
    multimodal embedding model), or an ApiError naming them."""
    from PIL import Image, UnidentifiedImageError

    shape = ("messages: want one user message whose content is one part, {'type': 'image_url', 'image_url': {'url': "
             "'data:image/...;base64,...'}} or {'type': 'text', 'text': ...}")
    if not (isinstance(messages, list) and len(messages) == 1 and isinstance(messages[0], dict)
            and messages[0].get("role") == "user"):
        raise ApiError(400, shape, param="messages")
    content = messages[0].get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)):
        raise ApiError(400, shape + " (a dual encoder embeds an image or a text, not both in one vector)",
                       param="messages")
    part = content[0]
    if part.get("type") == "text" and isinstance(part.get("text"), str) and part["text"]:
        return part["text"]
    url = (part.get("image_url") or {}).get("url") if part.get("type") == "image_url" else None
    if not isinstance(url, str):
        raise ApiError(400, shape, param="messages")
    header, comma, data = url.partition(",")
    if not (url.startswith("data:") and header.endswith(";base64") and comma):
        raise ApiError(400, "messages: an image_url must be a data: URL of base64 bytes (data:image/png;base64,...); "
                            "the server fetches nothing", param="messages")
    try:
        image = Image.open(io.BytesIO(base64.b64decode(data, validate=True)))
        image.load()
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as err:
        raise ApiError(400, f"messages: the image_url's data is not an image PIL reads: {err}",
                       param="messages") from None
    return image.convert("RGB")


def _saved_width(embedder) -> int | None:
    """The width a sentence-transformers folder was saved to truncate its vectors to (None: none, or a dual
    encoder)."""
    return None if isinstance(embedder, ImageTextEmbedder) else embedder.pipeline.truncate_dim


def create_app(embedder: Embedder, model_name: str, api_key: str | None = None, max_queue: int = 1024,
               max_batch: int = 32, widths: tuple[int, ...] | None = None) -> FastAPI:
    """The FastAPI app serving ``embedder`` as ``model_name``; ``widths``: the ``dimensions`` a request may ask
    for (None: the folder's: any if it was saved with a truncate_dim, else config.json's, else none). The batcher
    starts and stops with the app. ``embedder``: a sentence-transformers ``Embedder`` or a dual encoder's
    ``ImageTextEmbedder`` (texts and images; no prompt, no Matryoshka widths)."""
    dual = isinstance(embedder, ImageTextEmbedder)
    if widths is None and _saved_width(embedder) is not None:  # saved truncated: a Matryoshka model
        widths = tuple(range(1, embedder.dimension + 1))
    if widths is None and not dual:
        config = json.loads((embedder.pipeline.transformer_dir / "config.json").read_text(encoding="utf-8"))
        widths = matryoshka_widths(config, embedder.dimension)
    state: dict = {}
    metrics = Metrics(lambda: len(state["loop"].waiting) if "loop" in state else 0)
    created = int(time.time())
    prompt = "" if dual else embedder.pipeline.prompt
    prompt_skip = embedder.prompt_length() if prompt and not embedder.pipeline.include_prompt else 0

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state["loop"] = EmbeddingLoop(embedder, max_batch, max_queue, metrics)
        state["loop"].start()
        yield
        await state["loop"].stop()

    app = FastAPI(title="jaxformer serve (embeddings)", lifespan=lifespan)
    add_error_handlers(app)

    add_service_routes(app, metrics.registry, model_name, created, embedder.max_seq_length, api_key)

    @app.post("/v1/completions")
    @app.post("/v1/chat/completions")
    async def generation(request: Request):
        check_api_key(request, api_key)
        raise ApiError(400, f"{model_name!r} is an embedding model: this server answers /v1/embeddings, not "
                            f"{request.url.path}", code="unsupported_endpoint")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        check_api_key(request, api_key)
        try:
            body = await request.json()
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None
        try:
            answer = await embed(body)
        except ApiError as err:
            metrics.requests.labels(str(err.status)).inc()
            raise
        metrics.requests.labels("200").inc()
        return answer

    async def embed(body) -> dict:
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        for key in body:
            if key not in (IMAGE_KEYS if dual else KEYS):
                raise ApiError(400, f"unknown parameter {key!r}", param=key, code="unknown_parameter")
        if body.get("model") != model_name:
            raise ApiError(404, f"model={body.get('model')!r} is not served here; this server serves "
                                f"{model_name!r}", param="model", code="model_not_found")
        encoding = body.get("encoding_format") or "float"
        if encoding not in ENCODINGS:
            raise ApiError(400, f"encoding_format={encoding!r}: want one of {list(ENCODINGS)}",
                           param="encoding_format")
        dimensions = body.get("dimensions")
        if dimensions is not None:
            if widths is None:
                raise ApiError(400, f"dimensions={dimensions!r}: {model_name!r} was not trained to be truncated "
                                    f"(Matryoshka); its embeddings have {embedder.dimension} dimensions",
                               param="dimensions", code="unsupported_parameter")
            if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions not in widths:
                shown = (f"[1, {embedder.dimension}]" if widths == tuple(range(1, embedder.dimension + 1))
                         else str(list(widths)))
                raise ApiError(400, f"dimensions={dimensions!r}: want one of {shown}", param="dimensions")
        if body.get("user") is not None and not isinstance(body["user"], str):
            raise ApiError(400, f"user={body['user']!r}: want a string", param="user")
        if dual and ("messages" in body) == ("input" in body):
            raise ApiError(400, "give input (texts) or messages (one image, or one text), one of them", param="input")
        message = await asyncio.to_thread(_message_input, body["messages"]) if "messages" in body else None
        rows, text = [], body.get("input") if message is None or isinstance(message, str) else None
        if isinstance(message, str):
            text = message
        if text is not None:
            # Up to 2048 texts to tokenize, or id rows to check: in a worker thread, the event loop answering
            # meanwhile (an ApiError raised there reaches the client as raised here).
            rows, skip = await asyncio.to_thread(_inputs, text, embedder, prompt, prompt_skip)
            answer = state["loop"].submit(rows, skip)  # (429 when the queue is full)
        else:  # an image: batched with the images of other requests
            answer = state["loop"].submit([], [], images=[message])
        try:
            vectors = await answer
        except Exception as err:  # the model call failed: OpenAI's shape of a server error
            raise ApiError(500, f"the embedder failed: {err!r}", kind="server_error") from None
        vectors = vectors[:, :dimensions or _saved_width(embedder) or embedder.dimension]
        tokens = sum(map(len, rows))
        metrics.inputs.inc(len(vectors))
        metrics.prompt_tokens.inc(tokens)
        data = [{"object": "embedding", "index": i,
                 "embedding": (base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
                               if encoding == "base64" else v.tolist())} for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    return app


def compile_programs(embedder: Embedder | ImageTextEmbedder, max_batch: int) -> tuple[int, float]:
    """Compile every program the batcher can meet: each padded row count up to ``max_batch`` times each padded
    width up to max_seq_length, as ``Embedder.pad_rows`` (a dual encoder's ``padded_width``) buckets them, and a dual
    encoder's image calls, one a padded image count (SigLIP 2's at one patch grid: another compiles on first use).
    Returns (programs, seconds)."""
    start = time.perf_counter()
    if isinstance(embedder, ImageTextEmbedder):
        from PIL import Image

        widths = {embedder.padded_width(n) for n in range(1, embedder.max_seq_length + 1)}
        counts = {min(max_batch, 1 << (n - 1).bit_length()) for n in range(1, max_batch + 1)}
        for width in widths:
            for count in counts:
                embedder.encode_ids([[0] * width] * count, max_batch)
        for count in counts:
            embedder.encode_images([Image.new("RGB", (32, 32))] * count, batch_size=max_batch)
        return (len(widths) + 1) * len(counts), time.perf_counter() - start
    pad = embedder.pad_token_id
    widths = {embedder.pad_rows([[pad] * n], 1)[0].shape[1] for n in range(1, embedder.max_seq_length + 1)}
    counts = {embedder.pad_rows([[pad]] * n, max_batch)[0].shape[0] for n in range(1, max_batch + 1)}
    for width in widths:
        for count in counts:
            embedder.encode_ids([[embedder.pad_token_id] * width] * count, max_batch)
    return len(widths) * len(counts), time.perf_counter() - start


def serve(embedder: Embedder, model_name: str, host: str, port: int, api_key: str | None, max_queue: int,
          max_batch: int, widths: tuple[int, ...] | None = None, warm_up: bool = True,
          compilation_cache: str | None = None) -> None:
    """Serve ``embedder`` until SIGTERM / Ctrl-C; prints the address once it listens (port 0: a free port).
    ``widths``: the Matryoshka widths a request may ask for (None: the folder's, as ``create_app`` reads them);
    ``warm_up``: compile the batcher's programs before listening; ``compilation_cache``: a folder where
    compiled programs are kept across starts (JAX's persistent cache)."""
    import uvicorn

    for flag, value in (("--max-queue", max_queue), ("--max-num-seqs", max_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{flag}={value!r}: want an int >= 1")
    if widths is not None and not all(isinstance(w, int) and 1 <= w <= embedder.dimension for w in widths):
        raise ValueError(f"--matryoshka-dimensions={list(widths)}: want widths in [1, {embedder.dimension}]")
    if compilation_cache is not None:
        use_compilation_cache(compilation_cache)
    app = create_app(embedder, model_name, api_key, max_queue, max_batch, widths)
    warmed = ""
    if warm_up:
        programs, seconds = compile_programs(embedder, max_batch)
        warmed = f", {programs} programs compiled in {seconds:.1f} s"
    sock = listen(host, port)
    print(f"jaxformer serve: {model_name!r} on http://{host}:{sock.getsockname()[1]} (embeddings of "
          f"{_saved_width(embedder) or embedder.dimension} dimensions, max_seq_length="
          f"{embedder.max_seq_length}, batches of {max_batch}{warmed})", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=None))
    server.run(sockets=[sock])
