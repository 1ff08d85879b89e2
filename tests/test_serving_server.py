"""``jaxformer serve``: the real ``openai`` client against one server subprocess on loopback over a tiny Llama with
a byte-level tokenizer and a chat template. Greedy completions and chats equal ``model.generate`` (chats on
transformers' ``apply_chat_template`` ids), streams join to the same text, eight concurrent requests each get their
own generation, stop strings cut the text, errors have OpenAI's shape, a client leaving mid-stream frees its blocks,
and SIGTERM lets a running stream finish before the process ends."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import jaxformer as jf
from jaxformer.interop.tokenizer import load_tokenizer, write_byte_level_tokenizer
from jaxformer.serving import Engine, SamplingParams
from jaxformer.serving.server import ApiError, EngineLoop, Metrics, TextStream, TokenPieces, _sampling, \
    compile_chat_template, likeliest_by_piece, load_chat_template
from tests.hf_factory import save_checkpoint
from tests.serving_helpers import served

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
    """The server process and its address."""
    with served(folder, "--served-model-name", NAME, "--max-num-seqs", "8", "--block-size", "8", "--num-blocks", "65",
                "--prefill-chunk", "16", "--api-key", KEY, "--no-warm-up") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key=KEY, timeout=120, max_retries=0)


def _metrics(url) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_models_health_and_the_api_key(server, client):
    process, url = server
    assert "paged attention ffi-cpu" in process.ready_line  # (the C++ kernel: this CPU's default, built here)
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
    ({"n": 0}, openai.BadRequestError, "n", "n=0: want an int in [1, 16]"),
    ({"n": 2, "best_of": 3}, openai.BadRequestError, "best_of", "not supported"),
    ({"logprobs": 6}, openai.BadRequestError, "logprobs", "logprobs=6: want an int in [0, 5]"),
    ({"presence_penalty": 2.5}, openai.BadRequestError, "presence_penalty", "[-2, 2]"),
    ({"frequency_penalty": -3}, openai.BadRequestError, "frequency_penalty", "[-2, 2]"),
    ({"extra_body": {"min_p": 2}}, openai.BadRequestError, "min_p", "min_p=2: want a number in [0, 1]"),
    ({"extra_body": {"repetition_penalty": 0}}, openai.BadRequestError, "repetition_penalty", "> 0"),
    ({"extra_body": {"min_q": 1}}, openai.BadRequestError, "min_q", "unknown parameter"),
    ({"extra_body": {"ignore_eos": 1}}, openai.BadRequestError, "ignore_eos", "want a boolean"),
    ({"logit_bias": {"x": 1}}, openai.BadRequestError, "logit_bias", "want an object mapping token ids"),
    ({"logit_bias": {"5": 101}}, openai.BadRequestError, "logit_bias", "numbers in [-100, 100]"),
    ({"logit_bias": {"5": 1, "99999": 1}}, openai.BadRequestError, "logit_bias", "[99999] outside the vocabulary"),
    ({"suffix": "x"}, openai.BadRequestError, "suffix", "not supported yet"),
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
    assert metrics["jaxformer_programs_compiled_total"] >= 1  # (no warm-up: the requests compiled what they ran)


@pytest.fixture(scope="module")
def reference(folder):
    """The checkpoint in transformers, and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(folder)).eval(), AutoTokenizer.from_pretrained(str(folder))


def test_n_choices_draw_as_requests_seeded_seed_plus_i(client):
    ask = dict(model=NAME, prompt=PROMPTS[1], max_tokens=8, temperature=1.0)
    alone = [client.completions.create(**ask, seed=11 + i).choices[0].text for i in range(3)]
    answer = client.completions.create(**ask, seed=11, n=3)
    assert [(c.index, c.text) for c in answer.choices] == list(enumerate(alone)) and len(set(alone)) > 1
    assert answer.usage.completion_tokens == 24 and answer.usage.prompt_tokens == len(PROMPTS[1])
    streamed = ["", "", ""]
    for chunk in client.completions.create(**ask, seed=11, n=3, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == alone
    chat = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=4, temperature=0, n=2)
    assert [c.index for c in chat.choices] == [0, 1] and chat.choices[0].message.content == \
        chat.choices[1].message.content


def test_logprobs_of_completions_and_chats_are_transformers_log_softmax(client, reference):
    import torch

    model, tokenizer = reference
    answer = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=3)
    text, logprobs = answer.choices[0].text, answer.choices[0].logprobs
    prompt = tokenizer.encode(PROMPTS[0])
    generated = tokenizer.encode(text, add_special_tokens=False)  # (every token is a character: see the folder)
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1:-1], -1)
    assert "".join(logprobs.tokens) == text and logprobs.text_offset == [0, 1, 2, 3, 4, 5]
    np.testing.assert_allclose(logprobs.token_logprobs, expected[range(6), generated].numpy(), atol=1e-5)
    for step, top in enumerate(logprobs.top_logprobs):  # greedy: the chosen token is the likeliest
        assert len(top) == 3 and max(top.values()) == logprobs.token_logprobs[step]
        np.testing.assert_allclose(sorted(top.values(), reverse=True), expected[step].topk(3).values, atol=1e-5)
    chat = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=5, temperature=0, logprobs=True,
                                          top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == chat.choices[0].message.content and len(content) == 5
    assert all(entry.bytes == list(entry.token.encode()) and len(entry.top_logprobs) == 2
               and entry.top_logprobs[0].logprob == entry.logprob for entry in content)
    chunks = list(client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=5, temperature=0,
                                                 logprobs=True, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].logprobs is None  # (OpenAI's)
    streamed = [entry for c in chunks if c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert [(e.token, e.top_logprobs) for e in streamed] == [(e.token, []) for e in content]
    # (the same numbers up to float32 rounding, not bit for bit: the second request reads the first's prompt blocks
    # from the prefix cache, another program than the one that computed them)
    np.testing.assert_allclose([e.logprob for e in streamed], [e.logprob for e in content], rtol=0, atol=1e-5)


def test_echo_puts_the_prompt_first_and_scores_its_tokens_as_transformers(client, reference, expected):
    """OpenAI's legacy echo: the prompt before the text, and with logprobs its tokens' (the first null) before the
    new ones'; max_tokens 0 scores the prompt alone, as lm-evaluation-harness asks for a log-likelihood."""
    import torch

    model, tokenizer = reference
    prompt, ids = PROMPTS[3], tokenizer.encode(PROMPTS[3])  # (longer than the server's prefill chunk of 16)
    with torch.no_grad():
        scores = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
    plain = client.completions.create(model=NAME, prompt=prompt, max_tokens=NEW[3], temperature=0, echo=True)
    assert plain.choices[0].text == prompt + expected[3](NEW[3]) and plain.choices[0].logprobs is None
    scored = client.completions.create(model=NAME, prompt=prompt, max_tokens=0, temperature=0, echo=True, logprobs=2)
    logprobs = scored.choices[0].logprobs
    assert scored.choices[0].text == prompt and scored.choices[0].finish_reason == "length"
    assert scored.usage.completion_tokens == 0 and scored.usage.prompt_tokens == len(ids)
    assert "".join(logprobs.tokens) == prompt and logprobs.text_offset == list(range(len(ids)))  # (a byte a token)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    np.testing.assert_allclose(logprobs.token_logprobs[1:], scores[range(len(ids) - 1), ids[1:]].numpy(), atol=1e-5)
    for p, top in enumerate(logprobs.top_logprobs[1:]):
        np.testing.assert_allclose(sorted(top.values(), reverse=True), scores[p].topk(2).values, atol=1e-5)
    chunks = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=4, temperature=0, echo=True,
                                            logprobs=1, stream=True))
    assert chunks[0].choices[0].text == prompt and "".join(c.choices[0].text for c in chunks) == prompt + expected[3](4)
    streamed = [x for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    offsets = [x for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.text_offset]
    assert len(streamed) == len(ids) + 4 and offsets == list(range(len(ids) + 4)) and streamed[0] is None
    np.testing.assert_allclose(streamed[1:len(ids)], logprobs.token_logprobs[1:], atol=1e-5)


def test_a_list_of_prompts_gives_each_its_own_choices_in_openais_order(client, expected):
    """Completions' prompt as a list (strings, or token-id lists): n choices a prompt, choice p * n + i being prompt
    p's i-th, each what the prompt alone gets (greedy: generate's; seeded: the same draws), echoed and streamed too."""
    answer = client.completions.create(model=NAME, prompt=[PROMPTS[0], PROMPTS[2]], max_tokens=5, temperature=0)
    assert [(c.index, c.text) for c in answer.choices] == [(0, expected[0](5)), (1, expected[2](5))]
    assert answer.usage.prompt_tokens == len(PROMPTS[0]) + len(PROMPTS[2]) and answer.usage.completion_tokens == 10
    ask = dict(model=NAME, max_tokens=6, temperature=1.0, seed=5, n=2)
    alone = [[c.text for c in client.completions.create(prompt=p, **ask).choices] for p in PROMPTS[1:3]]
    both = client.completions.create(prompt=[list(PROMPTS[1].encode()), list(PROMPTS[2].encode())], **ask)
    assert [c.text for c in both.choices] == alone[0] + alone[1] and [c.index for c in both.choices] == [0, 1, 2, 3]
    chunks = list(client.completions.create(model=NAME, prompt=[PROMPTS[0], PROMPTS[2]], max_tokens=5, temperature=0,
                                            echo=True, logprobs=1, stream=True))
    for index, p in ((0, 0), (1, 2)):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert "".join(c.text for c in mine) == PROMPTS[p] + expected[p](5)
        assert [x for c in mine if c.logprobs for x in c.logprobs.tokens] == list(PROMPTS[p] + expected[p](5))


@pytest.mark.parametrize("request_, param, words", [
    ({"prompt": []}, "prompt", "want a non-empty string"),
    ({"prompt": ["a", [5]]}, "prompt", "of one of those kinds"),
    ({"prompt": ["a", ""]}, "prompt", "want a non-empty string"),
    ({"prompt": ["a"] * 257}, "prompt", "a list of 1 to 256"),
    ({"echo": "yes"}, "echo", "echo='yes': want a boolean"),
    ({"max_tokens": 0}, "max_tokens", "max_tokens=0: want an int >= 1"),
])
def test_bad_echo_requests_get_openai_shaped_errors(client, request_, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**{"model": NAME, "prompt": "hi", "max_tokens": 4, **request_})
    assert err.value.body["param"] == param and words in err.value.body["message"]


def test_chat_logprob_bytes_are_each_tokens_own_and_join_to_the_content(client):
    """A draw at temperature 2 picks the zeroed non-ASCII bytes too (see the folder), so characters split across
    tokens (seed 5: U+0337 and U+02A0, two tokens each) and bytes that are no UTF-8: each entry's ``bytes`` is its
    token's own byte (a special token's none; before, a character's first byte had none and its second the whole
    character), so they join to the content's bytes (an invalid byte decoding to U+FFFD, as the content's); streamed
    too."""
    request = dict(model=NAME, messages=CHAT, max_tokens=24, temperature=2.0, seed=5, logprobs=True, top_logprobs=2)
    chat = client.chat.completions.create(**request)
    content, text = chat.choices[0].logprobs.content, chat.choices[0].message.content
    assert len(content) == 24 and all(len(entry.bytes) <= 1 for entry in content)
    assert any(entry.bytes and entry.bytes[0] >= 0x80 for entry in content)  # (bytes of multi-byte characters)
    assert bytes(b for entry in content for b in entry.bytes).decode(errors="replace") == text
    chunks = list(client.chat.completions.create(**request, stream=True))
    streamed = [entry for c in chunks if c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


def test_a_penalised_greedy_completion_equals_transformers_generate(client, reference):
    import torch

    model, tokenizer = reference
    answer = client.completions.create(model=NAME, prompt=PROMPTS[6], max_tokens=10, temperature=0,
                                       extra_body={"repetition_penalty": 1.5})
    prompt = torch.tensor([tokenizer.encode(PROMPTS[6])])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False,
                             repetition_penalty=1.5)
    assert answer.choices[0].text == tokenizer.decode(out[0, prompt.shape[1]:])
    sampled = client.completions.create(model=NAME, prompt=PROMPTS[6], max_tokens=10, temperature=0.8, seed=2,
                                        presence_penalty=1.0, frequency_penalty=0.5, extra_body={"min_p": 0.1})
    assert sampled.usage.completion_tokens == 10


def test_beam_search_choices_are_transformers_hypotheses(client, reference, chat_ids):
    """``use_beam_search`` (vLLM's) with ``n`` 3: the choices are transformers' ``generate(num_beams=3,
    num_return_sequences=3)`` hypotheses, best first, for each of two prompts, streamed too (one chunk a choice, at
    the end), and a chat's; beam-search settings the search cannot honour are refused by name."""
    import torch

    model, tokenizer = reference

    def beams(ids, new, **settings):
        prompt = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, do_sample=False,
                                 num_beams=3, num_return_sequences=3, **settings)
        return [tokenizer.decode(row[prompt.shape[1]:]) for row in out]
    ask = dict(model=NAME, prompt=PROMPTS[4:6], max_tokens=8, n=3,
               extra_body={"use_beam_search": True, "length_penalty": 0.5})
    expected = [text for prompt in PROMPTS[4:6] for text in beams(tokenizer.encode(prompt), 8, length_penalty=0.5)]
    answer = client.completions.create(**ask)
    assert [c.text for c in answer.choices] == expected and len(set(expected)) > 3
    assert answer.usage.completion_tokens == 48
    streamed = [""] * 6
    for chunk in client.completions.create(**ask, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == expected
    chat = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=5, n=3,
                                          extra_body={"use_beam_search": True, "early_stopping": True})
    assert [c.message.content for c in chat.choices] == beams(list(chat_ids), 5, early_stopping=True)
    for extra, param, words in (({"temperature": 0.5}, "temperature", "beam search is deterministic"),
                                ({"stop": ["x"]}, "stop", "stop strings do not apply to beam search"),
                                ({"logprobs": 2}, "logprobs", "beam search (beam_width=3) is deterministic"),
                                ({"extra_body": {"use_beam_search": "yes"}}, "use_beam_search", "want a boolean"),
                                ({"n": 9}, "n", "max_num_seqs=8")):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(**{**ask, **extra, "extra_body": {**ask["extra_body"],
                                                                        **extra.get("extra_body", {})}})
        assert err.value.body["param"] == param and words in err.value.body["message"], err.value.body
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=NAME, prompt="hi", max_tokens=4, extra_body={"length_penalty": 2.0})
    assert err.value.body["param"] == "length_penalty" and "applies to beam search only" in err.value.body["message"]


def test_a_logit_bias_completion_and_chat_equal_transformers_sequence_bias(client, reference):
    import torch

    model, tokenizer = reference
    prompt = torch.tensor([tokenizer.encode(PROMPTS[6])])
    with torch.no_grad():
        plain = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False)
    first = int(plain[0, prompt.shape[1]])
    bias = {first: -100, 7: 2.5}  # (the plain first token barred: the text must change)
    answer = client.completions.create(model=NAME, prompt=PROMPTS[6], max_tokens=10, temperature=0,
                                       logit_bias={str(token): value for token, value in bias.items()})
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False,
                             sequence_bias={(token,): float(value) for token, value in bias.items()})
    assert answer.choices[0].text == tokenizer.decode(out[0, prompt.shape[1]:])
    assert answer.choices[0].text != tokenizer.decode(plain[0, prompt.shape[1]:])
    chat = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=6, temperature=0,
                                          logit_bias={"33": 100})  # (this tiny model's logits are far smaller)
    assert chat.choices[0].message.content == tokenizer.decode([33] * 6)


@pytest.mark.parametrize("request_, param, words", [
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs=21: want an int in [0, 20]"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs=true"),
    ({"extra_body": {"best_of": 2}}, "best_of", "unknown parameter"),
])
def test_bad_chat_sampling_gets_openai_shaped_errors(client, request_, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{"model": NAME, "messages": CHAT, "max_tokens": 4, **request_})
    assert err.value.body["param"] == param and words in err.value.body["message"]


def test_ignore_eos_is_taken_and_draft_tokens_reach_the_engine(folder, client, expected, monkeypatch, capsys):
    import jaxformer.serving.server as server_module
    from jaxformer.cli import main

    answer = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=NEW[0], temperature=0,
                                       extra_body={"ignore_eos": True})
    assert answer.choices[0].text == expected[0](NEW[0])
    chat = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=3, temperature=0,
                                          extra_body={"ignore_eos": False})
    assert chat.usage.completion_tokens == 3
    settings = {}
    monkeypatch.setattr(server_module, "serve", lambda *args, **kwargs: settings.update(kwargs))
    assert main(["serve", str(folder), "--draft-tokens", "3", "--no-warm-up"]) == 0
    assert settings["draft_tokens"] == 3 and "draft_model" not in settings and settings["draft_schedule"] == "constant"
    assert main(["serve", str(folder), "--draft-tokens", "3", "--draft-schedule", "heuristic"]) == 0
    assert settings["draft_schedule"] == "heuristic"
    assert main(["serve", str(folder), "--draft-tokens", "2", "--assistant-model", str(folder)]) == 0
    assert settings["draft_tokens"] == 2 and settings["draft_model"].config.family == "decoder"
    assert main(["serve", str(folder), "--assistant-model", str(folder)]) == 2
    assert "--assistant-model" in (error := capsys.readouterr().err) and "give --draft-tokens K" in error


def test_an_assistant_model_drafts_for_the_greedy_requests(folder, expected):
    """``--assistant-model`` (the checkpoint itself, so every draft is kept): greedy completions, one streamed (a
    step's kept drafts arrive in one chunk, so fewer chunks than tokens), equal generate's; /metrics counts the
    drafts proposed and kept."""
    with served(folder, "--served-model-name", NAME, "--max-num-seqs", "4", "--block-size", "8", "--num-blocks", "33",
                "--prefill-chunk", "16", "--no-warm-up", "--draft-tokens", "2", "--assistant-model",
                str(folder)) as (_, url):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120, max_retries=0)
        for i, prompt in enumerate(PROMPTS[:3]):
            answer = client.completions.create(model=NAME, prompt=prompt, max_tokens=NEW[i], temperature=0)
            assert answer.choices[0].text == expected[i](NEW[i])
        chunks = list(client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=NEW[0], temperature=0,
                                                stream=True))
        assert "".join(c.choices[0].text for c in chunks) == expected[0](NEW[0]) and len(chunks) < NEW[0]
        metrics = _metrics(url)
    assert metrics["jaxformer_accepted_draft_tokens_total"] == metrics["jaxformer_draft_tokens_total"] > 0


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


def test_logprob_tokens_are_their_text_in_context_and_join_to_it():
    """A SentencePiece-style tokenizer (Metaspace pieces, byte fallback), where a token decoded alone loses its
    leading space and a character's bytes decode apart as U+FFFD: in context, each token's piece is the text it adds,
    so the pieces join to ``TextStream``'s text, a character's last byte giving it whole; a top candidate's piece is
    what it would add there, and of two candidates with one piece the completions' dict keeps the likelier."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models

    from jaxformer.interop.tokenizer import Tokenizer
    from jaxformer.serving.sampling import TokenLogprobs

    vocab = ["<unk>", "\u2581Hello", "\u2581world", "\u2581caf", "<0xC3>", "<0xA9>", "!", "<0xE2>"]
    sentencepiece = HFTokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    sentencepiece.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                               decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tokenizer = Tokenizer(sentencepiece)
    prompt, generated = [1], [2, 3, 4, 5, 6]
    stream = TextStream(tokenizer, prompt, ())
    stream.add(generated, True)
    assert stream.text == " world caf\u00e9!" and tokenizer.decode([2]) == "world"  # (alone: its space lost)
    tops = [((2, -0.1), (3, -2.0)), ((3, -0.2), (2, -1.5)), ((4, -0.3), (7, -1.2), (6, -2.0)), ((5, -0.1), (6, -3.0)),
            ((6, -0.5),)]
    entries = [TokenLogprobs(token, top[0][1], top) for token, top in zip(generated, tops)]
    pieces = TokenPieces(tokenizer, prompt)
    got = pieces.add(entries[:3]) + pieces.add(entries[3:], finished=True)  # (as a stream's chunks bring them)
    # each token's own bytes beside its piece: a byte-fallback token is its byte, '\u2581' a space
    assert got == [(" world", b" world", [(" world", b" world", -0.1), (" caf", b" caf", -2.0)]),
                   (" caf", b" caf", [(" caf", b" caf", -0.2), (" world", b" world", -1.5)]),
                   ("", b"\xc3", [("", b"\xc3", -0.3), ("", b"\xe2", -1.2), ("!", b"!", -2.0)]),
                   ("\u00e9", b"\xa9", [("\u00e9", b"\xa9", -0.1), ("\ufffd!", b"!", -3.0)]),
                   ("!", b"!", [("!", b"!", -0.5)])]
    assert "".join(piece for piece, _, _ in got) == stream.text
    assert b"".join(raw for _, raw, _ in got) == stream.text.encode()
    assert likeliest_by_piece((p, x) for p, _, x in got[2][2]) == {"": -0.3, "!": -2.0}
    # a choice that ends inside a character keeps its U+FFFD, as its text does
    cut = TextStream(tokenizer, prompt, ())
    cut.add([3, 4], True)
    ended = TokenPieces(tokenizer, prompt).add([TokenLogprobs(3, -0.1, ()), TokenLogprobs(4, -0.2, ())], True)
    assert [piece for piece, _, _ in ended] == [" caf", "\ufffd"] and "".join(p for p, _, _ in ended) == cut.text
    assert b"".join(raw for _, raw, _ in ended).decode(errors="replace") == cut.text
    # the text's first token (nothing decoded before it) loses its leading space to the decoder's Strip, bytes too
    first = TokenPieces(tokenizer, []).add([TokenLogprobs(2, -0.1, ((2, -0.1), (3, -0.2)))])
    assert first == [("world", b"world", [("world", b"world", -0.1), ("caf", b"caf", -0.2)])]


def test_logprob_bytes_of_byte_level_bpe_split_characters_as_the_tokens_do():
    """GPT-2's byte-level BPE, trained here so that "日本" and "ñ" split mid-character: each token's bytes are its
    own (OpenAI's), joining to the text's; a special token, which decoding skips, has none; a WordPiece decoder has
    no raw bytes (the caller falls back to the piece's)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from jaxformer.interop.tokenizer import Tokenizer
    from jaxformer.serving.sampling import TokenLogprobs

    bpe = HFTokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(["h\u00e9llo w\u00f6rld", "\u65e5\u672c\u8a9e \u00f1and\u00fa", "hello world"] * 50,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer, text = Tokenizer(bpe), "h\u00e9llo \u65e5\u672c w\u00f6rld \u00f1"
    ids = tokenizer.encode(text) + [bpe.token_to_id("<eos>")]
    raw = tokenizer.token_bytes(ids)
    assert b"".join(raw) == text.encode() and raw[-1] == b""
    assert any(len(b) and not b.decode(errors="ignore") for b in raw)  # (some token holds part of a character)
    pieces = TokenPieces(tokenizer, ids[:1]).add([TokenLogprobs(i, -1.0, ((i, -1.0),)) for i in ids[1:]], True)
    assert [b for _, b, _ in pieces] == raw[1:] and all(top[0][1] == b for _, b, top in pieces)
    assert "".join(piece for piece, _, _ in pieces) == tokenizer.decode(ids)[len(tokenizer.decode(ids[:1])):]
    wordpiece = HFTokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wordpiece.decoder = decoders.WordPiece()
    assert Tokenizer(wordpiece).token_bytes([1]) is None


def test_any_int_seed_folds_into_range_and_top_k_minus_one_is_off():
    """OpenAI clients send any int seed: one outside [0, 2**32) is folded into it, the same way each time."""
    seeds = (-1, 2 ** 32, 2 ** 70, -2 ** 70, 7)
    folded = [_sampling({"seed": seed}, 4)[0].seed for seed in seeds]
    assert all(0 <= seed < 2 ** 32 for seed in folded) and len(set(folded)) == len(seeds) and folded[-1] == 7
    assert folded == [_sampling({"seed": seed}, 4)[0].seed for seed in seeds]
    assert _sampling({"top_k": -1}, 4)[0].top_k == 0
    with pytest.raises(ApiError, match="top_k=-2"):
        _sampling({"top_k": -2}, 4)
