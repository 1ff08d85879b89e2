"""The serving engine: continuous batching over a paged KV cache gives each greedy request exactly
``model.generate``'s tokens whatever else runs beside it (chunked prefill, prefix sharing, preemption), frees every
block, compiles a bounded set of programs, and refuses by name the models it cannot page."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer.generate import warp_logits
from jaxformer.serving import BlockManager, Engine, SamplingParams
from jaxformer.serving.engine import zero_blocks
from jaxformer.serving.sampling import warp_rows

BLOCK, CHUNK, MAX_LEN = 8, 16, 64
# 16 prompts of mixed lengths (two longer than a prefill chunk) and mixed output lengths
LENGTHS = (3, 40, 9, 21, 5, 12, 33, 7, 17, 4, 26, 11, 2, 19, 14, 6)
NEW = (12, 5, 9, 16, 3, 8, 14, 10, 6, 11, 4, 13, 7, 15, 9, 5)
SHARED = 2 * BLOCK  # the prefix-sharing prompts' common first blocks
# a seeded draw (its tokens depend on its seed alone, not on its batch) and top-k 1 (a draw that must be greedy)
SAMPLED = SamplingParams(max_tokens=10, temperature=0.8, top_k=20, top_p=0.9, seed=7)
TOP_ONE = SamplingParams(max_tokens=10, temperature=1.3, top_k=1, seed=3)


@pytest.fixture(scope="module")
def model():
    # init_std=0.2: logits far apart. Token equality with generate needs the same numerics across batch and chunk
    # shapes: bit-identical on CPU, while on a GPU another reduction order could flip a near-tie; wide margins keep
    # the comparison about the engine, not about rounding.
    return jf.build(jf.config("tiny-llama").replace(init_std=0.2), seed=0)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    mixed = [rng.integers(1, 256, n).astype(np.int32) for n in LENGTHS]
    prefix = rng.integers(1, 256, SHARED)
    shared = [np.concatenate([prefix, rng.integers(1, 256, n)]).astype(np.int32) for n in (3, 9, 1)]
    return mixed, shared


def _generated(model, prompts, new_tokens, **settings):
    """``model.generate``'s greedy tokens of each prompt: one left-padded batch, one compiled loop."""
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), np.int32)
    mask = np.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):], mask[row, width - len(prompt):] = prompt, 1
    return [list(row[width:]) for row in model.generate(ids, mask, max_new_tokens=new_tokens, **settings)]


@pytest.fixture(scope="module")
def reference(model, prompts):
    return _generated(model, [*prompts[0], *prompts[1]], max(NEW))


def _engine(model, num_blocks, max_num_seqs=16):
    return Engine(model, num_blocks=num_blocks, block_size=BLOCK, max_num_seqs=max_num_seqs, prefill_chunk=CHUNK,
                  max_model_len=MAX_LEN)


def _all_freed(engine):
    manager = engine.manager
    return manager.used() == 0 and manager.available() == manager.usable and not any(manager.refs)


def _submit(engine, prompts):
    ids = [engine.add_request(p, SamplingParams(max_tokens=n, temperature=0)) for p, n in zip(prompts, NEW)]
    return ids, engine.add_request(prompts[0], SAMPLED), engine.add_request(prompts[1], TOP_ONE)


@pytest.fixture(scope="module")
def batched(model, prompts):
    """The 16 greedy requests, a seeded draw and a top-k 1 draw, all at once in a pool with room for all: the
    engine, each request's tokens, the step each got its first token at, and who got tokens at each step."""
    engine = _engine(model, num_blocks=65)
    ids, sampled, top_one = _submit(engine, prompts[0])
    out, first_token_step, emitting = {}, {}, []
    while engine.has_unfinished():
        results = engine.step()
        emitting.append({r.request_id for r in results})
        for r in results:
            out.setdefault(r.request_id, []).extend(r.token_ids)
            first_token_step.setdefault(r.request_id, len(emitting) - 1)
    return engine, (ids, sampled, top_one), out, first_token_step, emitting


def test_sixteen_concurrent_greedy_requests_equal_generate_whatever_runs_beside_them(batched, reference):
    engine, (ids, sampled, top_one), out, first_token_step, emitting = batched
    for i, request in enumerate(ids):
        assert out[request] == reference[i][:NEW[i]], f"request {i} (prompt of {LENGTHS[i]})"
    assert out[top_one] == reference[1][:10]  # top-k 1 draws the greedy token
    assert len(out[sampled]) == 10 and out[sampled] != reference[0][:10]
    # on the C++ kernel (this CPU's default: tests/test_paged_attention.py) one-token rows and chunks share calls
    assert engine.packs and {program[0] for program in engine.programs} >= {"packed", "head"}
    assert engine.preemptions == 0 and _all_freed(engine)
    # chunked prefill: the 40-token prompt took three chunks, and the others decoded meanwhile
    long = ids[1]
    assert first_token_step[long] >= 2
    assert all(emitting[s] - {long} for s in range(first_token_step[long]))
    # bucketed shapes: rows, chunk width and table width of a model call, rows and penalty-history width of a
    # choice, each a power of two or a midpoint
    shapes = [program[1:4] if program[0] != "choose" else program[1:3] for program in engine.programs]
    assert all(n & (n - 1) == 0 or (n % 3 == 0 and n // 3 & (n // 3 - 1) == 0) for shape in shapes for n in shape)
    print(f"{len(engine.programs)} programs, {sum(engine.programs.values()):.1f} s of first calls: "
          f"{sorted(engine.programs.items())}")


def test_prompt_chunks_run_in_the_calls_that_pad_least_in_programs_already_compiled(model, monkeypatch):
    """On XLA:CPU a padded token costs a real one's compute and a compile costs seconds: after the warm-up (one-row
    programs), a 250-token chunk and a 50-token one run as [1, 256] and [1, 64]; three chunks of about 60 tokens run
    alone until a [3, 64] program is compiled, then together; a 137-token chunk runs as [1, 128] then [1, 12] (not
    [1, 192]), but as one call while those programs would have to compile; and no split of the rows into calls, nor
    of the rows with such chunks in two pieces, costs less (padded tokens, each call's own cost, the programs it
    would compile) than the one chosen. Where calls cost more than padding: one call."""
    import itertools

    from jaxformer.serving import engine as serving

    # (the calls of XLA's read: the C++ kernel's engine packs its chunks into one call, _pack)
    engine = Engine(model, num_blocks=9, block_size=BLOCK, max_num_seqs=8, prefill_chunk=256, max_model_len=MAX_LEN,
                    paged_attention="xla")
    monkeypatch.setitem(serving.CALL_COST_TOKENS, jax.default_backend(), (24, 4096))

    def compiled(shapes):  # as ``_run`` records a model call (no source table)
        engine.programs = {(*shape, None): 0.0 for shape in shapes}

    def rows(*counts):
        return [(serving.Sequence(i, [1] * count, SamplingParams(), frozenset(), 0), count)
                for i, count in enumerate(counts)]

    def widths(calls):
        return [[count for _, count in call] for call in calls]

    compiled(engine.program_shapes())  # the warm-up's: one sequence's chunks
    assert widths(engine._prefill_calls(rows(50, 250))) == [[250], [50]]
    assert widths(engine._prefill_calls(rows(60, 250, 64, 50))) == [[250], [64], [60], [50]]
    compiled([*engine.program_shapes(), ("prefill", 3, 64, engine._table_width(0))])
    assert widths(engine._prefill_calls(rows(60, 250, 64, 50))) == [[250], [64, 60, 50]]
    long = rows(137)
    assert [[(seq.request_id, count) for seq, count in call] for call in engine._prefill_calls(long)] == [
        [(0, 128)], [(0, 9)]]
    compiled([])
    assert widths(engine._prefill_calls(long)) == [[137]]

    def cost(calls):
        done = {program[:4] for program in engine.programs}
        total = 0
        for call in calls:
            shape = ("prefill", serving._bucket(len(call), 8), serving._bucket(max(c for _, c in call), 256),
                     engine._table_width(0))
            total += 24 + shape[1] * shape[2] + (0 if shape in done else 4096)
        return total

    def partitions(items):  # every split of ``items`` into calls, a sequence's two pieces in different ones
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for chosen in range(len(rest) + 1):
            for together in itertools.combinations(rest, chosen):
                if len({seq.request_id for seq, _ in (first, *together)}) <= chosen:
                    continue
                others = [item for item in rest if item not in together]
                for tail in partitions(others):
                    yield [[first, *together], *tail]

    def one_row(count):
        return cost([[(None, count)]])

    split_any = False
    for shapes in (engine.program_shapes(), engine.program_shapes(every_prefill=True)):
        compiled(shapes)
        for counts in ((2, 3, 200, 17, 96, 130), (256, 256, 40, 41, 7, 9), (5, 6, 7, 8, 100, 250)):
            work = rows(*counts)
            calls = engine._prefill_calls(work)
            pieces = []  # the chunks two calls of their own run for less than one, in two pieces
            for seq, count in work:
                head = serving._bucket_floor(count)
                split = head < count and one_row(head) + one_row(count - head) < one_row(count)
                pieces += [(seq, head), (seq, count - head)] if split else [(seq, count)]
            assert sorted(c for call in widths(calls) for c in call) in (sorted(counts),
                                                                         sorted(c for _, c in pieces))
            order = [(seq.request_id, count) for call in calls for seq, count in call]
            for call in calls:  # a sequence at most once a call, its head (the wider piece) first
                assert len({seq.request_id for seq, _ in call}) == len(call)
            assert all(a >= b for (i, a), (j, b) in itertools.combinations(order, 2) if i == j)
            assert cost(calls) == min(cost(split) for plan in (work, pieces) for split in partitions(plan))
            split_any = split_any or len(pieces) > len(work)
    assert split_any  # (the exhaustive comparison met pieces)
    monkeypatch.delitem(serving.CALL_COST_TOKENS, jax.default_backend())
    assert widths(engine._prefill_calls(rows(50, 250))) == [[50, 250]]


def test_preemption_under_a_tiny_pool_gives_the_same_tokens_and_frees_every_block(model, prompts, reference,
                                                                                  batched):
    engine = _engine(model, num_blocks=17)  # 16 blocks of 8: room for two or three of these sequences at once
    ids, sampled, top_one = _submit(engine, prompts[0])
    out = engine.run()
    assert engine.preemptions > 0
    for i, request in enumerate(ids):
        assert out[request] == reference[i][:NEW[i]], f"request {i} (prompt of {LENGTHS[i]})"
    assert out[top_one] == reference[1][:10]
    assert _all_freed(engine)
    # a seeded draw is the same in another batch, recomputed after preemptions
    assert out[sampled] == batched[2][batched[1][1]]


@pytest.mark.parametrize("paged_attention", ["pallas-gpu", "xla"])
def test_every_paged_read_gives_generates_tokens(model, prompts, reference, paged_attention):
    """The engine's other paged reads (on this CPU 'auto' is the C++ kernel wherever it serves the model:
    tests/test_paged_attention.py asserts it is built here):
    'pallas-gpu' (JAX's Pallas paged attention for GPUs, there the default; here in Pallas's interpreter), where a
    one-token row's layers each write the token into their own pool, then the kernel attends over it, prompt chunks
    reading on XLA; and 'xla', XLA's own read of the stacked pool. The 16 mixed greedy requests in a pool small
    enough to preempt give generate's tokens and free every block (the kernel form's logits against a ``KVCache``
    step's, within 1e-5: in tests/test_paged_attention.py)."""
    engine = Engine(model, num_blocks=17, block_size=BLOCK, max_num_seqs=16, prefill_chunk=CHUNK,
                    max_model_len=MAX_LEN, paged_attention=paged_attention)
    ids = [engine.add_request(p, SamplingParams(max_tokens=n, temperature=0)) for p, n in zip(prompts[0], NEW)]
    out = engine.run()
    assert isinstance(engine.pool.k, tuple) == (paged_attention != "xla")
    assert engine.preemptions > 0 and _all_freed(engine)
    for i, request in enumerate(ids):
        assert out[request] == reference[i][:NEW[i]], f"request {i} (prompt of {LENGTHS[i]})"
    if paged_attention != "xla":  # a failed row's blocks are zeroed in each layer's own pool as in the stacked one
        k, v = zero_blocks(engine.pool.k, engine.pool.v, jnp.asarray([1, 3], jnp.int32))
        assert all(not jnp.any(pool[:, [1, 3]]) and jnp.any(pool) for pool in (*k, *v))


def test_prompts_with_a_common_prefix_share_its_blocks(model, prompts, reference):
    engine = _engine(model, num_blocks=65)
    first, *others = prompts[1]
    greedy = SamplingParams(max_tokens=NEW[0], temperature=0)
    out = {}

    def collect(results):
        for r in results:
            out.setdefault(r.request_id, []).extend(r.token_ids)

    ids = [engine.add_request(first, greedy)]
    collect(engine.step())  # the first prompt's first chunk: its two full blocks are computed and cached
    ids += [engine.add_request(p, greedy) for p in others]
    collect(engine.step())
    # the later prompts took the two prefix blocks from the cache and hold only blocks of their own tokens
    assert engine.shared_blocks == 2 * len(others)
    blocks = lambda n: -(-n // BLOCK)  # noqa: E731
    assert engine.manager.used() == blocks(len(first)) + sum(blocks(len(p)) - SHARED // BLOCK for p in others)
    while engine.has_unfinished():
        collect(engine.step())
    for i, request in enumerate(ids):
        assert out[request] == reference[len(LENGTHS) + i][:NEW[0]], f"shared-prefix prompt {i}"
    assert _all_freed(engine)
    # ended, its blocks stay cached: the prompt again computes only its last block
    again = engine.add_request(first, greedy)
    engine.step()
    assert engine.shared_blocks == 2 * len(others) + 2
    # a request ended early (its client went away) frees its blocks at once
    assert engine.abort(again) and not engine.abort(again) and _all_freed(engine)


def test_the_block_manager_counts_shares_and_evicts_cached_blocks_last():
    manager = BlockManager(num_blocks=4, block_size=2)
    a = [manager.allocate(), manager.allocate()]
    manager.remember(a[0], manager.chain(None, [1, 2]))
    assert manager.cached_prefix([1, 2, 3, 4], 2) == [a[0]] and manager.refs[a[0]] == 2
    manager.release(a)  # the cached block is still held by the second sequence
    assert manager.refs[a[0]] == 1 and manager.available() == 2
    manager.release([a[0]])  # cached, held by none: evictable, still found
    assert manager.available() == 3 and manager.cached_prefix([1, 2], 1) == [a[0]]
    manager.release([a[0]])
    taken = [manager.allocate() for _ in range(3)]
    assert taken[-1] == a[0] and manager.allocate() is None  # the uncached free blocks went first
    assert manager.cached_prefix([1, 2], 1) == []


@pytest.mark.parametrize("name, changes, reason", [
    ("tiny-llama", {"attention": "prefix"}, "prefix size"),
    ("whisper-tiny", {}, "audio"),  # (text encoder-decoders are served: tests/test_serving_seq2seq.py)
    ("tiny-transformer-xl", {}, "segment memory"),
])
def test_a_model_the_engine_cannot_page_is_refused_by_name(name, changes, reason):
    cfg = jf.config(name).replace(**changes)
    # (the refusal reads the config alone, before anything is allocated or compiled: a stand-in for the model)
    with pytest.raises(ValueError, match=f"cannot page {cfg.name!r}: .*{reason}"):
        Engine(types.SimpleNamespace(config=cfg), num_blocks=8)


# stacks whose layers carry more than keys and values, and the pool that makes them preempt: DeepSeek-V3's latent
# attention with a NoPE layer, DeepSeek-V3.2's sparse attention (its indexer keeps 4 keys a query), Qwen3-Next's
# layout (three gated-delta-rule linear layers to one attention layer)
STACKS = {
    "latent": ("tiny-deepseek", {"nope": jf.model_config.NoPE((1,))}, 13),
    "sparse": ("tiny-deepseek", {"index_heads": 2, "index_head_dim": 8, "index_topk": 4}, 13),
    "linear": ("tiny-mixtral", {"decoder_layers": 4, "linear_layers": (0, 1, 2), "linear_key_heads": 2,
                                "linear_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 6}, 15),
}


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_latent_and_linear_stacks_are_served_with_generates_tokens(stack):
    """Latent attention's pool holds each token's latent and rotary key (C + R a layer, no values; the indexer's key
    beside), read in the absorbed form; a linear-attention stack's pool holds its attention layers' keys alone,
    each running sequence's linear states in a slot of their own, its prompt chunks in calls of exact widths (a
    padded token would move a convolution window) and nothing shared from the prefix cache (a state holds the whole
    prefix). Mixed greedy requests (two sharing a prompt's first blocks; one longer than a chunk), in a roomy pool
    and in one that preempts, give generate's tokens and give back every block (and slot); a block is
    ``kv_block_bytes`` (a linear stack's state slots ``linear_state_bytes``, which ``--memory`` counts). A linear
    stack's beam search is refused by name (a state cannot fork)."""
    from jaxformer.serving.server import kv_block_bytes, linear_state_bytes, pool_blocks

    name, changes, tight = STACKS[stack]
    cfg = jf.config(name).replace(init_std=0.2, **changes)
    model = jf.build(cfg, seed=0)
    linear = cfg.linear_attention is not None
    rng = np.random.default_rng(2)
    prompts = [rng.integers(1, 256, n).astype(np.int32) for n in (3, 40, 9, 21, 5, 12)]
    prompts += [np.concatenate([prompts[1][:SHARED], rng.integers(1, 256, 4)]).astype(np.int32)]
    for num_blocks, preempts in ((65, False), (tight, True)):
        engine = _engine(model, num_blocks=num_blocks)
        assert engine.pool.nbytes == num_blocks * kv_block_bytes(cfg, BLOCK)
        ids = [engine.add_request(p, SamplingParams(max_tokens=10, temperature=0)) for p in prompts]
        out = engine.run()
        assert [out[request] for request in ids] == _generated(model, prompts, 10)
        assert (engine.preemptions > 0) == preempts and (engine.shared_blocks > 0) != linear and _all_freed(engine)
        if linear:  # (1 attention layer in the pool; 16 slots and the null one)
            assert engine.pool.k.shape[0] == 1 and engine.states[0].shape[:2] == (3, 17)
            assert sorted(engine.free_slots) == list(range(1, 17))
            assert sum(pool.nbytes for pool in engine.states) == linear_state_bytes(cfg, 16)
    if linear:  # --memory: the state slots come out of the budget, the blocks fill the rest
        states, block, memory = linear_state_bytes(cfg, 16), kv_block_bytes(cfg, BLOCK), 0.0003
        blocks = pool_blocks(cfg, BLOCK, 16, memory=memory)
        assert states + blocks * block <= memory * 2 ** 30 < states + (blocks + 1) * block
        with pytest.raises(ValueError, match=f"holds 0 blocks .* beside {states} bytes of linear-attention states"):
            pool_blocks(cfg, BLOCK, 16, memory=states / 2 ** 30)
    if linear:
        with pytest.raises(ValueError, match="beam_width=2: .*linear-attention layers keep one state a sequence"):
            engine.add_request(prompts[0], SamplingParams(temperature=0, beam_width=2))


def _latent_requests_give_generates_tokens(model, seed: int) -> None:
    """Four greedy requests (one longer than a prompt chunk) through 8 rows of a latent-attention model give
    generate's tokens and free every block."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, model.config.vocab_size, n).astype(np.int32) for n in (3, 40, 9, 21)]
    engine = _engine(model, num_blocks=40, max_num_seqs=8)
    ids = [engine.add_request(p, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)) for p in prompts]
    out = engine.run()
    assert [out[request] for request in ids] == _generated(model, prompts, 8, eos_token_id=None)
    assert engine.pool.latent and _all_freed(engine)


def test_kimi_linears_latent_and_linear_layers_serve_generates_tokens(tmp_path):
    """Kimi Linear as published (tiny): Kimi Delta Attention layers, their states in slots, beside multi-head latent
    attention layers, their latents paged; greedy requests (one longer than a prompt chunk) give generate's tokens."""
    from tests.hf_factory import save_checkpoint

    model = jf.from_pretrained(save_checkpoint("kimi_linear", tmp_path))
    assert model.config.mla and model.config.linear_attention is not None
    _latent_requests_give_generates_tokens(model, seed=4)


def test_mistral_large_4s_position_scaled_sparse_latent_layers_serve_generates_tokens(tmp_path):
    """Mistral Large 4's text model as published (tiny), with an LM head of its own (transformers publishes none for
    the text model): sparse latent attention with a NoPE layer, LeRoPE, and each head's queries (its indexer's too)
    scaled by ln(p + 1) with learned slopes drawn away from 0, so a paged row fed a wrong position gives other
    tokens. Greedy requests (one longer than a prompt chunk), beside each other in the calls, give generate's."""
    from flax import nnx

    from tests.hf_factory import save_checkpoint

    text = jf.from_pretrained(save_checkpoint("mistral_large4", tmp_path))
    assert text.config.latent.query_log_position_scale and text.config.latent.indexer is not None
    model = jf.build(text.config.replace(head="lm"), seed=0)
    nnx.update(model, nnx.state(text))  # every weight but the new head's
    _latent_requests_give_generates_tokens(model, seed=5)


def test_windowed_layers_page_in_full_and_read_what_their_ring_holds():
    """Gemma 3: sliding layers (window 8, their own rotary base) between full ones; the sliding layers' masks come
    from positions, so over every slot of the sequence they see what generate's ring of the window holds."""
    model = jf.build(jf.config("tiny-gemma3").replace(init_std=0.2), seed=0)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 256, n).astype(np.int32) for n in (3, 20, 9, 30)]
    engine = _engine(model, num_blocks=33)
    ids = [engine.add_request(p, SamplingParams(max_tokens=10, temperature=0)) for p in prompts]
    out = engine.run()
    assert [out[request] for request in ids] == _generated(model, prompts, 10)
    assert _all_freed(engine)


def test_bad_requests_and_settings_are_refused_before_anything_runs(model):
    engine = _engine(model, num_blocks=8)
    with pytest.raises(ValueError, match="max_model_len=64"):
        engine.add_request(np.ones(60, np.int32), SamplingParams(max_tokens=8))
    with pytest.raises(ValueError, match="the pool has 7"):
        engine.add_request(np.ones(60, np.int32), SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([1, 256])
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([])
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"top_k": -2}, {"max_tokens": 0}, {"seed": -1}):
        with pytest.raises(ValueError, match=f"SamplingParams.{next(iter(bad))}="):
            SamplingParams(**bad)
    with pytest.raises(ValueError, match="paged attention 'flash': want one of auto, xla, pallas-gpu, pallas-tpu"):
        Engine(model, num_blocks=8, paged_attention="flash")
    assert not engine.has_unfinished()


def test_max_model_len_stops_where_positions_or_a_batch_wide_rotary_switch_do():
    def engine(cfg, **settings):  # (the checks read the config alone: a stand-in for the model)
        return Engine(types.SimpleNamespace(config=cfg), num_blocks=8, **settings)
    gpt, llama = jf.config("tiny-gpt"), jf.config("tiny-llama")
    with pytest.raises(ValueError, match="max_model_len=129 exceeds 128 .*position table"):
        engine(gpt, max_model_len=129, allow_beyond_max_positions=True)
    with pytest.raises(ValueError, match="max_model_len=129 exceeds 128 .*allow_beyond_max_positions=True"):
        engine(llama, max_model_len=129)
    half = llama.rope_dim // 2
    longrope = llama.replace(rope_scaling=dict(kind="longrope", factor=4.0, original_max_positions=32,
                                               short_factor=(1.0,) * half, long_factor=(2.0,) * half))
    with pytest.raises(ValueError, match="max_model_len=33 exceeds 32 .*longrope .*original_max_positions=32"):
        engine(longrope, max_model_len=33, allow_beyond_max_positions=True)
    dynamic = llama.replace(rope_scaling=dict(kind="dynamic", factor=2.0))
    with pytest.raises(ValueError, match="max_model_len=129 exceeds 128 .*dynamic"):
        engine(dynamic, max_model_len=129, allow_beyond_max_positions=True)
    # left to its default, max_model_len stops at the switch, and says so
    with pytest.warns(UserWarning, match="max_model_len=32, not max_positions=128: its longrope"):
        assert Engine(jf.build(longrope, seed=0), num_blocks=8).max_model_len == 32
    with pytest.raises(ValueError, match="Engine seed=-1"):
        engine(llama, seed=-1)


def test_a_row_with_non_finite_logits_ends_in_error_and_the_others_do_not_notice(model):
    """A token whose embedding is NaN makes its row's logits NaN: that request ends with finish_reason 'error' and
    no token; the request beside it, and one after it on the blocks it freed, give generate's tokens."""
    poisoned = jf.build(model.config, seed=0)
    poisoned.embed.table[...] = model.embed.table[...].at[7].set(jnp.nan)
    rng = np.random.default_rng(2)
    clean, later = (rng.integers(8, 256, n).astype(np.int32) for n in (12, 20))
    bad = np.concatenate([clean[:5], [7], clean[5:]]).astype(np.int32)
    greedy = SamplingParams(max_tokens=6, temperature=0)
    engine = _engine(poisoned, num_blocks=6)  # a tight pool: the third request takes the first one's blocks
    first, second = engine.add_request(bad, greedy), engine.add_request(clean, greedy)
    results = engine.step()  # both prompts in one call
    assert [(o.token_ids, o.finished, o.finish_reason) for o in results if o.request_id == first] == [
        ((), True, "error")]
    third = engine.add_request(later, greedy)
    out = {second: [token for o in results if o.request_id == second for token in o.token_ids]}
    for request, tokens in engine.run().items():
        out.setdefault(request, []).extend(tokens)
    assert first not in out and [out[second], out[third]] == _generated(poisoned, [clean, later], 6)
    assert _all_freed(engine)


def test_a_chunk_run_in_two_pieces_gives_generate_tokens_and_a_failed_head_ends_its_sequence(model, monkeypatch):
    """A 100-token prompt chunk in two calls of its own ([1, 96], then [1, 4] reading the head's keys from the pool)
    where those programs are compiled: generate's tokens. A head piece whose logits are not finite ends its request
    in error, and its tail never runs."""
    from jaxformer.serving import engine as serving

    monkeypatch.setitem(serving.CALL_COST_TOKENS, jax.default_backend(), (24, 4096))
    poisoned = jf.build(model.config, seed=0)
    poisoned.embed.table[...] = model.embed.table[...].at[7].set(jnp.nan)
    rng = np.random.default_rng(3)
    clean = rng.integers(8, 256, 100).astype(np.int32)
    bad = np.concatenate([clean[:10], [7], clean[11:]]).astype(np.int32)
    # (calls of their own: XLA's read, or the kernel's beside an assistant; a packed call takes any count, _pack)
    engine = Engine(poisoned, num_blocks=40, block_size=BLOCK, max_num_seqs=4, prefill_chunk=128,
                    paged_attention="xla")
    engine.programs = {(*shape, None): 0.0 for shape in engine.program_shapes()}  # priced as warmed
    calls = []
    run = engine._run
    engine._run = lambda kind, rows: calls.append((kind, [(seq.request_id, count) for seq, count in rows])) or run(
        kind, rows)
    greedy = SamplingParams(max_tokens=6, temperature=0)
    first, second = engine.add_request(bad, greedy), engine.add_request(clean, greedy)
    results = engine.step()
    assert calls == [("prefill", [(first, 96)]), ("prefill", [(second, 96)]), ("prefill", [(second, 4)])]
    assert [(o.request_id, o.token_ids, o.finish_reason) for o in results] == [(first, (), "error"),
                                                                                (second, results[1].token_ids, None)]
    out = list(results[1].token_ids)
    out += engine.run()[second]
    assert out == _generated(poisoned, [clean], 6)[0]
    assert _all_freed(engine)


def test_a_packed_call_is_cut_to_a_bucket_where_its_leftover_rides_a_call_that_runs_anyway(model, monkeypatch):
    """``_pack``: one-token rows, then prompt chunks, the last chunks cut so the call's tokens fill a bucket (a
    chunk cut to nothing sits the step out) where one-token rows run the next step anyway or the padding costs more
    than a call; never a one-token row, and never the last prompt token a call would hold."""
    from jaxformer.serving import engine as serving

    monkeypatch.setitem(serving.CALL_COST_TOKENS, jax.default_backend(), (24, 4096))
    engine = Engine(model, num_blocks=9, block_size=BLOCK, max_num_seqs=32, prefill_chunk=256, max_model_len=MAX_LEN)
    sequences = iter(range(100))

    def pack(decoding, *chunks):
        rows = [(serving.Sequence(next(sequences), [1], SamplingParams(), frozenset(), 0), count)
                for count in [1] * decoding + list(chunks)]
        packed = engine._pack(rows[:decoding], rows[decoding:])
        assert packed[:decoding] == rows[:decoding]
        return [count for _, count in packed[decoding:]]

    assert pack(3, 10) == [9]  # 13 -> 12, the token left with the next step's rows
    assert pack(0, 137) == [128]  # alone: padding to 192 costs more than a call of 9
    assert pack(0, 13) == [13]  # 3 tokens of padding cost less than a call
    assert pack(4, 2, 2) == [2, 2]  # a bucket already
    assert pack(8, 2, 3, 2) == [2, 2]  # 15 -> 12: the last chunk cut to nothing, one token of the one before
    assert pack(25, 2) == [2]  # 27's bucket below (24) would cut a one-token row: padded to 32 instead
    assert pack(23, 137) == [105]  # 160 -> 128
    monkeypatch.delitem(serving.CALL_COST_TOKENS, jax.default_backend())  # (calls cost nothing next to padding)
    assert pack(0, 137) == [137] and pack(3, 10) == [9]


def test_a_packed_call_gives_generates_tokens_compiles_only_warmed_programs_and_contains_a_failure(model):
    """A packed call holds one-token rows and prompt chunks (each token a row: its sequence's table, its position),
    read by the C++ kernel; the warm-up compiles every packed program and head a run meets; a chunk whose logits are
    not finite ends its request in error and no other row notices."""
    poisoned = jf.build(model.config, seed=0)
    poisoned.embed.table[...] = model.embed.table[...].at[7].set(jnp.nan)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(8, 256, n).astype(np.int32) for n in (3, 40, 9, 21, 5, 30)]
    bad = np.concatenate([prompts[3][:10], [7], prompts[3][11:]]).astype(np.int32)
    engine = Engine(poisoned, num_blocks=40, block_size=BLOCK, max_num_seqs=4, prefill_chunk=CHUNK,
                    max_model_len=MAX_LEN)
    engine.warm_up()
    warmed = set(engine.programs)
    calls = []
    run = engine._run
    engine._run = lambda kind, rows: calls.append((kind, [count for _, count in rows])) or run(kind, rows)
    greedy = SamplingParams(max_tokens=12, temperature=0)
    ids = [engine.add_request(prompt, greedy) for prompt in prompts[:3]]
    failed = engine.add_request(bad, greedy)
    ids += [engine.add_request(prompt, greedy) for prompt in prompts[4:]]
    out = engine.run()
    assert out[failed] == [] and _all_freed(engine) and set(engine.programs) == warmed
    assert [out[request] for request in ids] == _generated(poisoned, prompts[:3] + prompts[4:], 12)
    mixed = [counts for kind, counts in calls if kind == "packed" and 1 in counts and max(counts) > 1]
    assert mixed and {kind for kind, _ in calls} == {"packed", "decode"}


def test_a_forced_first_token_is_forced_even_where_drafting_would_verify_it(model):
    """A decoder request forcing its first token (``forced_bos_token_id``) whose prompt is cached but its last token
    (a one-token row) is not drafted: a verifying call would take the model's own first token. It gets generate's
    tokens with that token forced, beside a drafting request of the same prompt."""
    pattern = [5, 9, 14, 3, 22, 7]
    prompt = np.asarray((pattern * 4)[:2 * BLOCK + 1], np.int32)  # two full blocks to share, and a repeated run
    engine = Engine(model, num_blocks=17, block_size=BLOCK, max_num_seqs=2, prefill_chunk=CHUNK,
                    max_model_len=MAX_LEN, draft_tokens=3)
    plain = engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0))
    first = engine.run()[plain]
    forced = engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0, forced_bos_token_id=200))
    out = engine.run()[forced]
    assert engine.shared_blocks == 2 and engine.stats()["drafted"] > 0
    assert first == _generated(model, [prompt], 8)[0]
    assert out == _generated(model, [prompt], 8, forced_bos_token_id=200)[0] and out[0] == 200


def test_after_the_warm_up_a_requests_sampler_settings_compile_a_choice_never_a_model_step(model):
    """Top-p, min-p, penalties, logprobs and a forced first token change which small choice program a call runs
    (``choose_program``: top-p's compiled by the warm-up, the others on first use), never the model's step: after the
    warm-up those requests compile no model program, and their tokens equal each request's alone."""
    engine = Engine(model, num_blocks=16, block_size=BLOCK, max_num_seqs=2, max_model_len=32, seed=0)
    engine.warm_up()
    models = engine.run_step._cache_size()
    warmed = set(engine.programs)
    engine.add_request([3, 1, 4], SamplingParams(max_tokens=4, temperature=0.9, top_p=0.8, seed=1))
    engine.run()
    assert set(engine.programs) == warmed  # (a top-p draw's choice: warmed)
    settings = [SamplingParams(max_tokens=6, temperature=0.9, top_p=0.8, seed=1),
                SamplingParams(max_tokens=6, temperature=0, repetition_penalty=1.3, logprobs=2),
                SamplingParams(max_tokens=6, temperature=1.1, top_k=4, min_p=0.1, frequency_penalty=0.4, seed=2),
                SamplingParams(max_tokens=6, temperature=0, forced_bos_token_id=5)]
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9], [2, 7]]
    ids = [engine.add_request(prompt, params) for prompt, params in zip(prompts, settings)]
    together = engine.run()
    new = set(engine.programs) - warmed
    assert new and {program[0] for program in new} == {"choose"}
    assert engine.run_step._cache_size() == models
    for request, prompt, params in zip(ids, prompts, settings):
        alone = Engine(model, num_blocks=16, block_size=BLOCK, max_num_seqs=2, max_model_len=32, seed=0)
        only = alone.add_request(prompt, params)
        assert alone.run()[only] == together[request]
    assert together[ids[3]][0] == 5


def test_an_engine_that_owns_its_model_holds_one_copy_of_the_weights(prompts, reference):
    """``release_model``: the model's buffers the engine's decode-loop copy does not share (on a CPU its stacked
    layers) are freed, so the live arrays grow by the pool alone, and the engine still gives generate's tokens."""
    model = jf.build(jf.config("tiny-llama").replace(init_std=0.2), seed=0)  # (the module's model, built anew)

    def live_bytes():
        return sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted())

    leaves = [leaf for leaf in jax.tree.leaves(nnx.state(model)) if isinstance(leaf, jax.Array)]
    kept_alone = Engine(model, num_blocks=64, block_size=BLOCK, max_model_len=MAX_LEN)
    assert not any(leaf.is_deleted() for leaf in leaves)  # (by default the caller's model stays whole)
    del kept_alone
    before = live_bytes()
    engine = Engine(model, num_blocks=64, block_size=BLOCK, max_model_len=MAX_LEN, release_model=True)
    freed = sum(leaf.nbytes for leaf in leaves if leaf.is_deleted())
    assert freed > 0 and sum(w.nbytes for w in engine.weights) == sum(leaf.nbytes for leaf in leaves)
    # the live arrays grew by the pool alone (and a scalar or so): the engine's layers apart replaced the stacked
    # ones freed
    assert live_bytes() - before <= engine.pool.nbytes + 1024
    ids = [engine.add_request(prompt, SamplingParams(max_tokens=NEW[i], temperature=0))
           for i, prompt in enumerate(prompts[0][:4])]
    out = engine.run()
    assert [out[i] for i in ids] == [reference[i][:NEW[i]] for i in range(4)]


def test_requests_without_a_seed_draw_by_the_engines_seed():
    """A request's own seed repeats its draws in any engine; without one, the engine's seed and its id key them:
    the same seed repeats them, and a fresh engine (seed None) draws anew."""
    model = jf.build(jf.config("tiny-llama"), seed=0)  # (init_std default: flat logits, so draws vary)
    unseeded = SamplingParams(max_tokens=12, temperature=1.0)

    def draws(seed):
        engine = Engine(model, num_blocks=8, block_size=BLOCK, max_model_len=MAX_LEN, seed=seed)
        request = engine.add_request([1, 2, 3], unseeded)
        return engine.run()[request]
    assert draws(5) == draws(5) and draws(5) != draws(6) and draws(None) != draws(None)


def test_each_rows_sampling_settings_filter_as_generate_does_for_one():
    logits = jax.random.normal(jax.random.key(0), (5, 64)) * 3
    settings = [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.5, 10, 0.6), (2.0, 64, 0.95)]
    temperature, top_k, top_p = (jnp.asarray(column) for column in zip(*settings))
    warped = warp_rows(logits, temperature, top_k.astype(jnp.int32), top_p)
    for row, (t, k, p) in enumerate(settings):
        one = warp_logits(logits[row], types.SimpleNamespace(temperature=t, top_k=k or None, top_p=p))
        np.testing.assert_allclose(warped[row], one, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------- beam search

# (width, length penalty, early stopping) of each beam request: every stopping rule, and penalties both ways
BEAMS = ((4, 1.0, False), (3, 0.6, True), (2, 2.0, "never"), (3, 1.0, False), (2, 0.6, "never"), (4, 2.0, True))
BEAM_STOPS = (176, 152)  # tokens the tiny model emits often (greedy rows above): some beams end early


@pytest.fixture(scope="module")
def beam_reference(model, prompts):
    """Each beam request's tokens by ``model.generate(num_beams=...)`` (token for token transformers', tested in
    tests/test_generate.py), one prompt a call, and its prompt and max_tokens."""
    requests = []
    for i, (width, penalty, early) in enumerate(BEAMS):
        prompt, new = prompts[0][i], NEW[i] + 4
        row = model.generate(prompt[None], np.ones((1, len(prompt)), np.int32), max_new_tokens=new, num_beams=width,
                             length_penalty=penalty, early_stopping=early, eos_token_id=list(BEAM_STOPS))
        tokens = [int(t) for t in row[0, len(prompt):]]
        ends = [j for j, t in enumerate(tokens) if t in BEAM_STOPS]
        requests.append((prompt, SamplingParams(max_tokens=new, temperature=0, stop_token_ids=BEAM_STOPS,
                                                beam_width=width, length_penalty=penalty, early_stopping=early),
                         tokens[:ends[0] + 1] if ends else tokens))
    return requests


@pytest.mark.parametrize("num_blocks", [65, 21])
def test_beam_search_requests_equal_generates_beams_beside_greedy_ones(model, prompts, reference, beam_reference,
                                                                       num_blocks):
    """Six beam searches (widths 2-4, every early-stopping rule, length penalties 0.6-2) and the 16 greedy
    requests in one engine: each search's best hypothesis is generate's beam search's, each greedy request still
    generate's greedy tokens. Beams share their parents' blocks and copy a partly written one when they write it
    (copy programs run); in a pool of 20 blocks searches are preempted whole and begin again, with the same result;
    every block is free at the end."""
    engine = _engine(model, num_blocks=num_blocks)
    beams = [engine.add_request(prompt, params) for prompt, params, _ in beam_reference]
    greedy, _, _ = _submit(engine, prompts[0])
    outputs = {}
    while engine.has_unfinished():
        for result in engine.step():
            outputs.setdefault(result.request_id, []).append(result)
    for i, request in enumerate(greedy):
        assert [t for r in outputs[request] for t in r.token_ids] == reference[i][:NEW[i]]
    for request, (_, params, expected) in zip(beams, beam_reference):
        [result] = outputs[request]  # (one output, at the end)
        assert list(result.token_ids) == expected and result.finished
        assert len(result.beams) == params.beam_width and result.beams[0].token_ids == result.token_ids
        assert [h.score for h in result.beams] == sorted((h.score for h in result.beams), reverse=True)
    reasons = {h.finish_reason for request in beams for h in outputs[request][0].beams}
    assert reasons == {"stop", "length"}  # (hypotheses ended by a stop id, and by max_tokens)
    assert any(program[0] == "copy" for program in engine.programs)
    assert (engine.preemptions > 0) == (num_blocks == 21)
    assert _all_freed(engine)


def test_beam_search_settings_are_refused_by_name(model):
    engine = _engine(model, num_blocks=9, max_num_seqs=4)
    with pytest.raises(ValueError, match="beam_width=5: each beam is a row of the batch.*max_num_seqs=4"):
        engine.add_request([1, 2], SamplingParams(temperature=0, beam_width=5))
    with pytest.raises(ValueError, match=r"needs 9 blocks of 8 \(3 for each of 3 beams\); the pool has 8"):
        engine.add_request([1, 2], SamplingParams(max_tokens=20, temperature=0, beam_width=3))
    for bad in ({"temperature": 1.0}, {"repetition_penalty": 1.2}, {"logit_bias": {3: 1.0}}, {"logprobs": 2}):
        with pytest.raises(ValueError, match=f"SamplingParams.{next(iter(bad))}=.*beam search .beam_width=2. is "
                                             "deterministic"):
            SamplingParams(**{"temperature": 0, "beam_width": 2, **bad})
    for bad in ({"length_penalty": 0.5}, {"early_stopping": True}):
        with pytest.raises(ValueError, match=f"SamplingParams.{next(iter(bad))}=.* applies to beam search only"):
            SamplingParams(**bad)
    for bad in ({"beam_width": 0}, {"beam_width": 17}, {"early_stopping": "always"}, {"length_penalty": np.inf}):
        with pytest.raises(ValueError, match=f"SamplingParams.{next(iter(bad))}=.*want"):
            SamplingParams(**{"temperature": 0, **bad})
