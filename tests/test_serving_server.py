"""``jaxformer serve``: the real ``openai`` client against one server subprocess on loopback over a tiny Llama with
a byte-level tokenizer and a chat template. Greedy completions and chats equal ``model.generate`` (chats on
transformers' ``apply_chat_template`` ids), streams join to the same text, eight concurrent requests each get their
own generation, stop strings cut the text, errors have OpenAI's shape, a client leaving mid-stream frees its blocks,
and SIGTERM lets a running stream finish before the process ends."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import jaxformer as jf
from jaxformer.interop.tokenizer import load_tokenizer, write_byte_level_tokenizer
from jaxformer.serving import Engine, SamplingParams
from jaxformer.serving.server import ApiError, EngineLoop, Metrics, TextStream, compile_chat_template, \
    load_chat_template
from tests.hf_factory import save_checkpoint

openai = pytest.importorskip("openai")

KEY, NAME, MAX_LEN = "sk-test", "tiny-llama-chat", 128
SPECIAL = {256: "<s>", 257: "</s>", 258: "<|user|>", 259: "<|assistant|>"}
# block tags on lines of their own: transformers' trim_blocks / lstrip_blocks decide what the prompt holds
TEMPLATE = """{{ bos_token }}
{% set turns = namespace(count=0) %}
{% for message in messages %}
    {% set turns.count = turns.count + 1 %}
    {% if message['role'] == 'user' %}
<|user|>{{ message['content'] }}{{ eos_token }}
    {% else %}
<|{{ message['role'] }}|>{{ message['content'] | trim }}{{ eos_token }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt and turns.count %}
<|assistant|>
{% endif %}"""
CHAT = [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "Hello, who are you?"}]
PROMPTS = ["The cat", "Once upon a time there was", "ab", "A longer prompt than the prefill chunk of sixteen",
           "x y z", "Serving engines batch", "0123456789", "Q: why? A:"]
NEW = (9, 5, 12, 7, 10, 6, 11, 8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # no EOS: every request runs its max_tokens, so lengths are known
    path = save_checkpoint("llama", tmp_path_factory.mktemp("served"), changes=dict(
        vocab_size=260, bos_token_id=256, eos_token_id=None, max_position_embeddings=MAX_LEN))
    write_byte_level_tokenizer(path, SPECIAL, {"bos_token": "<s>", "eos_token": "</s>"})
    # greedy picks printable ASCII (the other tokens' logits 0, below the likeliest of 95 random ones): every token
    # is a character, so streams go token by token and stop strings can be taken from the text
    weights = load_file(path / "model.safetensors")
    weights["lm_head.weight"][np.r_[0:32, 127:260]] = 0
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    (path / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def chat_ids(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(CHAT, add_generation_prompt=True,
                                                                          tokenize=True, return_dict=False)


@pytest.fixture(scope="module")
def expected(folder, chat_ids):
    """Each prompt's greedy continuation text: ``model.generate`` on one left-padded batch (the chat last)."""
    model, tokenizer = jf.from_pretrained(folder), load_tokenizer(folder)
    rows = [tokenizer.encode(p) for p in PROMPTS] + [list(chat_ids)]
    width = max(map(len, rows))
    ids, mask = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), np.int32)
    for r, row in enumerate(rows):
        ids[r, width - len(row):], mask[r, width - len(row):] = row, 1
    out = np.asarray(model.generate(ids, mask, max_new_tokens=max(NEW)))[:, width:]
    return [lambda n, row=row, prompt=prompt: tokenizer.continuation(prompt, [*prompt, *row[:n]])
            for prompt, row in zip(rows, out)]


@pytest.fixture(scope="module")
def server(folder):
    """The server process and its address; it prints the address (a free port) once it listens. Its log goes to a
    file: a pipe nobody reads would fill and stop it."""
    log = folder / "server.log"
    with open(log, "w") as errors:
        process = subprocess.Popen(
            [sys.executable, "-m", "jaxformer.cli", "serve", str(folder), "--port", "0", "--served-model-name", NAME,
             "--max-num-seqs", "8", "--block-size", "8", "--num-blocks", "65", "--prefill-chunk", "16",
             "--api-key", KEY], stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        line = process.stdout.readline()
        assert "on http://" in line, line + log.read_text()
        yield process, line.split(" on ")[1].split()[0]
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        process.stdout.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key=KEY, timeout=120, max_retries=0)


def _metrics(url) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_models_health_and_the_api_key(server, client):
    _, url = server
    assert [m.id for m in client.models.list().data] == [NAME]
    assert httpx.get(url + "/health", timeout=30).json() == {"status": "ok"}
    stranger = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        stranger.models.list()
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"


def test_a_greedy_completion_equals_generate_and_its_stream_joins_to_it(client, expected):
    answer = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=NEW[0], temperature=0)
    assert answer.choices[0].text == expected[0](NEW[0]) and answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == NEW[0] and answer.usage.prompt_tokens == len(PROMPTS[0].encode())
    chunks = list(client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=NEW[0], temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected[0](NEW[0])
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (NEW[0] - 1) + ["length"]  # one a token


def test_a_chat_renders_the_template_as_transformers_and_equals_generate(folder, client, expected, chat_ids):
    from transformers import AutoTokenizer

    template, tokens = load_chat_template(folder)
    rendered = compile_chat_template(template).render(messages=CHAT, add_generation_prompt=True, **tokens)
    assert rendered == AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=False)
    answer = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=10, temperature=0)
    assert answer.choices[0].message.content == expected[-1](10)
    assert answer.choices[0].message.role == "assistant" and answer.usage.prompt_tokens == len(chat_ids)
    chunks = list(client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens == 10
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == expected[-1](10)


def test_eight_concurrent_requests_each_equal_their_own_generate(server, expected):
    async def ask(client, i):
        return await client.completions.create(model=NAME, prompt=PROMPTS[i], max_tokens=NEW[i], temperature=0)

    async def all_at_once():
        async with openai.AsyncOpenAI(base_url=server[1] + "/v1", api_key=KEY, timeout=120, max_retries=0) as client:
            return await asyncio.gather(*(ask(client, i) for i in range(len(PROMPTS))))

    answers = asyncio.run(all_at_once())
    for i, answer in enumerate(answers):
        assert answer.choices[0].text == expected[i](NEW[i]), f"prompt {i}: {PROMPTS[i]!r}"


def test_a_stop_string_cuts_the_text(client, expected):
    text = expected[2](NEW[2])
    stop = text[5:7]
    for stream in (False, True):
        answer = client.completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=NEW[2], temperature=0,
                                           stop=[stop, "never appears"], stream=stream)
        chunks = list(answer) if stream else [answer]
        assert "".join(c.choices[0].text for c in chunks) == text[:text.find(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("request_, error, param, words", [
    ({"temperature": -1.0}, openai.BadRequestError, "temperature", "temperature=-1.0"),
    ({"prompt": "y" * 200}, openai.BadRequestError, "prompt", f"max_model_len={MAX_LEN}"),
    ({"n": 2}, openai.BadRequestError, "n", "not supported"),
    ({"logprobs": 2}, openai.BadRequestError, "logprobs", "not supported"),
    ({"extra_body": {"min_q": 1}}, openai.BadRequestError, "min_q", "unknown parameter"),
    ({"model": "gpt-5"}, openai.NotFoundError, "model", NAME),
])
def test_bad_requests_get_openai_shaped_errors(client, request_, error, param, words):
    with pytest.raises(error) as err:
        client.completions.create(**{"model": NAME, "prompt": "hi", "max_tokens": 4, **request_})
    assert err.value.body["param"] == param and words in err.value.body["message"]


def test_a_client_leaving_mid_stream_frees_its_blocks_and_metrics_read(server):
    _, url = server
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": NAME, "prompt": "leave early", "max_tokens": 100, "temperature": 0.7, "seed": 1,
            "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=60) as response:
        assert next(response.iter_lines()).startswith("data: ")
    deadline = time.monotonic() + 30
    while (metrics := _metrics(url))["jaxformer_running_sequences"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metrics["jaxformer_running_sequences"] == metrics["jaxformer_queue_length"] == 0
    assert metrics["jaxformer_kv_blocks_used"] == 0 and metrics["jaxformer_kv_blocks"] == 64
    assert metrics["jaxformer_generated_tokens_total"] > 0 and metrics["jaxformer_time_to_first_token_seconds_count"]


def test_sigterm_lets_a_running_stream_finish_then_exits(server, client, expected):
    process, _ = server
    stream = client.completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=NEW[2], temperature=0, stream=True)
    chunks = [next(iter(stream))]
    process.send_signal(signal.SIGTERM)
    chunks += list(stream)
    assert "".join(c.choices[0].text for c in chunks) == expected[2](NEW[2])
    assert process.wait(60) == -signal.SIGTERM  # uvicorn drains, then ends by the signal it caught


def test_text_streams_hold_back_partial_characters_and_stop_strings(folder):
    tokenizer = load_tokenizer(folder)
    stream = TextStream(tokenizer, tokenizer.encode("ab"), ("END",))
    pieces = [stream.add(list(ids), False) for ids in ("é".encode()[:1], "é".encode()[1:], b"xE", b"N", b"D")]
    assert pieces == [("", False), ("é", False), ("x", False), ("", False), ("", True)] and stream.text == "éx"


def test_a_full_queue_answers_429():
    """(In process, the loop not stepping: two requests wait, so the third finds the queue full.)"""
    engine = Engine(jf.build(jf.config("tiny-llama")), num_blocks=9, block_size=8, max_model_len=64)

    async def fill():
        loop = EngineLoop(engine, max_queue=2, metrics=Metrics(lambda: None))
        for _ in range(2):
            loop.submit([1, 2, 3], SamplingParams(max_tokens=4), "prompt")
        with pytest.raises(ApiError) as err:
            loop.submit([1, 2, 3], SamplingParams(max_tokens=4), "prompt")
        return err.value

    err = asyncio.run(fill())
    assert err.status == 429 and err.body()["error"]["code"] == "queue_full"


def test_named_templates_in_tokenizer_config_render_as_transformers(tmp_path):
    """A template kept in tokenizer_config.json, as named templates (the "default" one serves chats)."""
    import json

    from transformers import AutoTokenizer

    write_byte_level_tokenizer(tmp_path, SPECIAL, {"bos_token": "<s>", "eos_token": "</s>"})
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    settings["chat_template"] = [{"name": "default", "template": TEMPLATE},
                                 {"name": "tool_use", "template": "{{ raise_exception('tools') }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    template, tokens = load_chat_template(tmp_path)
    assert compile_chat_template(template).render(messages=CHAT, add_generation_prompt=True, **tokens) == \
        AutoTokenizer.from_pretrained(str(tmp_path)).apply_chat_template(CHAT, add_generation_prompt=True,
                                                                         tokenize=False)
