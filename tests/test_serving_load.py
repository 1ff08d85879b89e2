"""The serving engine and server under load: 10,000 short requests (mixed prompts, some aborted, some preempted in a
small pool) leave every block free, the block manager's books bounded and host memory flat, and meet no program the
warm-up did not compile; a full queue answers 429 over the network; ``--memory`` sizes the pool to the byte; a
request whose logits are not finite gets an OpenAI-shaped 500 (an error chunk when streamed)."""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc

import httpx
import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer as jf
from jaxformer.serving import Engine, SamplingParams
from jaxformer.serving.server import create_app, kv_block_bytes, pool_blocks
from tests.hf_factory import save_checkpoint
from tests.serving_helpers import served

REQUESTS, FIRST = 10_000, 1_000
BLOCK, MAX_LEN, SEQS, CHUNK = 4, 16, 4, 2  # (chunks of 2: one chunk width, fewer programs to warm up)
# host memory that may grow between request 1,000 and 10,000: 64 bytes a request. Anything kept per request (a
# Sequence, its token lists, an output, a dict entry: 100 bytes and up each) would pass it; what may legitimately
# grow (the prefix cache) is bounded by the pool's 8 blocks
GROWTH_BOUND = 64 * (REQUESTS - FIRST)


@pytest.fixture(scope="module")
def model():
    return jf.build(jf.config("tiny-llama").replace(init_std=0.2), seed=0)


def test_ten_thousand_requests_leave_no_block_no_growth_and_no_program_unwarmed(model):
    """A warmed engine (every prefill shape) takes 10,000 requests a few at a time: prompts of 1 to 6 tokens, a
    third of them after a shared prefix of 4 or 8 (up to 12 tokens), 1 or 2 new tokens, greedy or drawn; every 13th
    aborted (waiting or running); 8 blocks of 4 for 4 sequences of up to 16 tokens, so sequences are preempted.
    (Short requests: the run's time is its engine steps, doubled by tracemalloc; longer ones prove nothing more.)"""
    engine = Engine(model, num_blocks=9, block_size=BLOCK, max_num_seqs=SEQS, prefill_chunk=CHUNK,
                    prefill_tokens=4 * SEQS, max_model_len=MAX_LEN, seed=0)
    programs, seconds = engine.warm_up(every_prefill=True)
    warmed = dict(engine.programs)
    rng = np.random.default_rng(0)
    prefixes = [rng.integers(1, 256, n).tolist() for n in (4, 8)]
    submitted, ended, aborts, memory = 0, 0, 0, {}
    live: set[int] = set()
    while ended < REQUESTS:
        while submitted < REQUESTS and len(engine.waiting) < 2 * SEQS:
            n = int(rng.integers(1, 7))
            prompt = rng.integers(1, 256, n).tolist()
            if submitted % 3 == 0:
                prompt = (prefixes[submitted % 2] + prompt)[:12]
            params = SamplingParams(max_tokens=int(rng.integers(1, 3)), temperature=float(submitted % 2),
                                    ignore_eos=True)
            live.add(engine.add_request(prompt, params))
            submitted += 1
            if submitted % 13 == 0:  # a client that leaves at once, or after some steps (below)
                victim = int(rng.choice(sorted(live)))
                assert engine.abort(victim)
                live.discard(victim)
                ended, aborts = ended + 1, aborts + 1
        for output in engine.step():
            if output.finished:
                live.discard(output.request_id)
                ended += 1
        if ended >= FIRST and not memory:
            gc.collect()
            tracemalloc.start()
            memory["start"] = tracemalloc.get_traced_memory()[0]
    gc.collect()
    memory["end"], memory["peak"] = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    manager = engine.manager
    grown = memory["end"] - memory["start"]
    print(f"warm-up: {programs} programs in {seconds:.1f} s; {REQUESTS} requests ({aborts} aborted, "
          f"{engine.preemptions} preemptions, {engine.shared_blocks} blocks shared); host memory traced from request "
          f"{FIRST}: {grown} bytes grown (bound {GROWTH_BOUND}), peak {memory['peak']}; prefix cache "
          f"{len(manager.by_key)} entries")
    assert not engine.has_unfinished() and not live
    assert manager.used() == 0 and not any(manager.refs) and manager.available() == manager.usable
    assert len(manager.by_key) == len(manager.key_of) <= manager.usable and len(manager.evictable) <= manager.usable
    assert engine.preemptions > 0 and engine.shared_blocks > 0 and aborts > 0
    assert engine.programs.keys() == warmed.keys()  # the warm-up met every program the mix needed
    assert grown < GROWTH_BOUND


def test_memory_sizes_the_pool_to_the_byte_and_excludes_num_blocks(model):
    cfg = model.config
    memory = 0.0003  # GiB
    blocks = pool_blocks(cfg, BLOCK, SEQS, memory=memory)
    engine = Engine(model, num_blocks=blocks, block_size=BLOCK, max_num_seqs=SEQS, max_model_len=MAX_LEN)
    held = engine.pool.nbytes
    assert held == blocks * kv_block_bytes(cfg, BLOCK) <= memory * 2 ** 30 < held + kv_block_bytes(cfg, BLOCK)
    # (an assistant model's pool holds the same blocks: here as wide as the model's, so half as many fit)
    assert pool_blocks(cfg, BLOCK, SEQS, memory=memory, draft_cfg=cfg) == int(memory * 2 ** 30
                                                                              // (2 * kv_block_bytes(cfg, BLOCK)))
    with pytest.raises(ValueError, match="--num-blocks=8 and --memory=0.0003 both size the pool"):
        pool_blocks(cfg, BLOCK, SEQS, num_blocks=8, memory=memory)
    with pytest.raises(ValueError, match="holds 0 blocks"):
        pool_blocks(cfg, BLOCK, SEQS, memory=1e-9)
    # the default: max_num_seqs sequences at the engine's max_model_len (longrope: its switch, not max_positions)
    half = cfg.rope_dim // 2
    longrope = cfg.replace(rope_scaling=dict(kind="longrope", factor=4.0, original_max_positions=32,
                                             short_factor=(1.0,) * half, long_factor=(2.0,) * half))
    assert pool_blocks(longrope, BLOCK, SEQS) == SEQS * 32 // BLOCK + 1


def test_non_finite_logits_answer_an_openai_shaped_500(model):
    """A prompt holding a token whose embedding is NaN: the plain answer is a 500 in OpenAI's shape, the stream
    ends with an error chunk; a clean request beside them is answered."""
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from jaxformer.interop.tokenizer import Tokenizer, byte_level_tokenizer

    poisoned = jf.build(model.config, seed=0)
    poisoned.embed.table[...] = model.embed.table[...].at[7].set(jnp.nan)
    engine = Engine(poisoned, num_blocks=9, block_size=BLOCK, max_num_seqs=SEQS, prefill_chunk=CHUNK,
                    max_model_len=MAX_LEN)
    body = {"model": "m", "prompt": [5, 7, 9], "max_tokens": 2, "temperature": 0}
    with TestClient(create_app(engine, Tokenizer(byte_level_tokenizer({})), "m")) as client:
        answer = client.post("/v1/completions", json=body)
        assert answer.status_code == 500 and answer.json()["error"]["code"] == "non_finite_logits"
        assert answer.json()["error"]["type"] == "server_error"
        lines = client.post("/v1/completions", json={**body, "stream": True}).text.strip().split("\n\n")
        assert '"non_finite_logits"' in lines[-2] and lines[-1] == "data: [DONE]"
        clean = client.post("/v1/completions", json={**body, "prompt": [5, 8, 9]})
        assert clean.status_code == 200 and clean.json()["usage"]["completion_tokens"] == 2
        metrics = {s.name: s.value for f in text_string_to_metric_families(client.get("/metrics").text)
                   for s in f.samples}
    # what a benchmark reads for paging waste: tokens held against blocks used of block_size tokens
    assert metrics["jaxformer_kv_tokens"] == metrics["jaxformer_kv_blocks_used"] == 0
    assert metrics["jaxformer_kv_block_size"] == BLOCK


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    """A server that runs one sequence at a time and queues one more, over a tiny Llama that can generate for a
    long while (16,384 positions): a long request keeps it busy for minutes, far longer than the test needs."""
    from jaxformer.interop.tokenizer import write_byte_level_tokenizer

    path = save_checkpoint("llama", tmp_path_factory.mktemp("slow"), changes=dict(
        vocab_size=260, bos_token_id=256, eos_token_id=None, max_position_embeddings=16_384))
    write_byte_level_tokenizer(path, {256: "<s>", 257: "</s>"}, {"bos_token": "<s>", "eos_token": "</s>"})
    with served(path, "--served-model-name", "slow", "--max-num-seqs", "1", "--max-queue", "1",
                "--no-warm-up") as (_, url):
        yield url


def test_a_full_queue_answers_429_over_the_network(slow_server):
    """One request runs (16,000 tokens to go), one waits (the queue of 1 is full): the next is refused with 429."""
    openai = pytest.importorskip("openai")
    from prometheus_client.parser import text_string_to_metric_families

    client = openai.OpenAI(base_url=slow_server + "/v1", api_key="none", timeout=600, max_retries=0)
    running = client.completions.create(model="slow", prompt="long", max_tokens=16_000, stream=True)
    next(iter(running))  # its first token: it runs
    answered = []  # (the waiting request's answer: a thread's exception would not reach the test)
    waiting = threading.Thread(target=lambda: answered.append(
        client.completions.create(model="slow", prompt="next", max_tokens=2)))
    waiting.start()

    def queued() -> float:
        text = httpx.get(slow_server + "/metrics", timeout=30).text
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}[
            "jaxformer_queue_length"]
    deadline = time.monotonic() + 120
    while queued() < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(openai.RateLimitError) as err:
        client.completions.create(model="slow", prompt="one too many", max_tokens=2)
    assert err.value.status_code == 429 and err.value.body["code"] == "queue_full"
    running.close()  # its client leaves: the waiting request runs and ends
    waiting.join(300)
    assert not waiting.is_alive() and len(answered) == 1
    assert answered[0].choices[0].finish_reason == "length" and answered[0].usage.completion_tokens == 2
