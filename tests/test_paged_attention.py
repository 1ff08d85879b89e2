"""The paged cache's read: a step over a ``PagedKVCache`` gives a ``KVCache`` step's logits (each layer reading its
own rows by block table, in the scanned stack and in the CPU decode loop over separate layers alike, on XLA:CPU a
few blocks at a time), and its compiled step's scratch neither holds every layer's rows at once nor grows with the
rows' table width (an encoder-decoder's source rows neither)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import kernels
from jaxformer.cache import DecodeState
from jaxformer.decoder import unstacked_decoder
from jaxformer.layers import attention
from jaxformer.serving.engine import encode_sources
from jaxformer.serving.paged import PagedKVCache, source_view

BLOCK, BLOCKS_PER_ROW = 4, 4
PROMPTS = (5, 12, 9, 0)  # the last row is padding: no tokens, its table all null blocks


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt", "tiny-gemma"])
def model(request):
    # tiny-llama: GQA and rotary; tiny-gpt: MHA and a position table; tiny-gemma: sliding-window layers among full
    # ones (a scanned body's local flag traced) and a score softcap
    return jf.build(jf.config(request.param), seed=0)


def _inputs(vocab: int):
    """A left-padded prefill (ids, positions, valid [B, T]) of PROMPTS and the decode step's positions [B, 1]."""
    rng = np.random.default_rng(0)
    B, T = len(PROMPTS), max(PROMPTS)
    ids, positions, valid = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32), np.zeros((B, T), bool)
    for row, n in enumerate(PROMPTS):
        ids[row, T - n:] = rng.integers(1, vocab, n)
        positions[row, T - n:] = np.arange(n)
        valid[row, T - n:] = True
    return ids, positions, valid, np.asarray(PROMPTS, np.int32)[:, None]


def _paged_state(cfg, rows: int) -> DecodeState:
    """An empty pool with each row's blocks scattered over it (the padding row's table all null)."""
    rng = np.random.default_rng(1)
    pool = PagedKVCache.empty(cfg.decoder_layers, 1 + rows * BLOCKS_PER_ROW, BLOCK, cfg.kv_heads, cfg.head_dim_,
                              jnp.float32)
    tables = (1 + rng.permutation(rows * BLOCKS_PER_ROW)).reshape(rows, BLOCKS_PER_ROW).astype(np.int32)
    tables[[n == 0 for n in PROMPTS]] = 0
    return DecodeState(PagedKVCache(pool.k, pool.v, jnp.asarray(tables), jnp.zeros(rows, jnp.int32)))


def _steps_agree(model, loop: bool, paged: DecodeState, steps: int) -> DecodeState:
    """``steps`` calls over ``paged`` (a prefill of PROMPTS, then one-token steps; ``loop``: on the decode-loop form)
    give a dense cache's logits within 1e-5 at every real row; the paged state after them."""
    runner = model.for_decode_loop() if loop else model  # (on CPU the loop's layers are separate blocks)
    ids, positions, valid, next_positions = _inputs(model.config.vocab_size)
    real = np.asarray(PROMPTS) > 0
    dense = model.init_cache(len(PROMPTS), BLOCK * BLOCKS_PER_ROW)
    dense = dense.per_layer() if loop else dense  # as generate's loop carries it
    for step in range(steps):
        want, dense = runner.step(ids, positions, valid, dense)
        got, paged = runner.step(ids, positions, valid, paged)
        assert float(jnp.max(jnp.abs(got[real] - want[real]))) < 1e-5, f"step {step}"
        ids, positions, valid = np.asarray(jnp.argmax(want, -1))[:, None], next_positions + step, real[:, None]
    return paged


# how a layer reads its rows (``attention.PAGED_CHUNK_SLOTS``, ``PAGED_ROW_GROUP``): chunks of 2 blocks, rows in
# groups of 2 (the last one row); chunks of 3 (the 4-block tables padded to 6), groups of 3; each row's whole table
# gathered at once (the read off XLA:CPU)
@pytest.mark.parametrize("loop, chunk_slots, row_group", [(False, 2 * BLOCK, 2), (True, 3 * BLOCK, 3),
                                                          (False, None, None)],
                         ids=["scanned-chunks", "decode_loop-padded_chunks", "scanned-whole_tables"])
def test_a_paged_step_gives_a_kv_cache_steps_logits(model, loop, chunk_slots, row_group, monkeypatch):
    monkeypatch.setattr(attention, "PAGED_CHUNK_SLOTS", {} if chunk_slots is None else {"cpu": chunk_slots})
    if row_group is not None:
        monkeypatch.setattr(attention, "PAGED_ROW_GROUP", row_group)
    paged = _steps_agree(model, loop, _paged_state(model.config, len(PROMPTS)), steps=2)
    assert np.array_equal(paged.kv.lengths, np.asarray(PROMPTS) + (np.asarray(PROMPTS) > 0))


@pytest.mark.parametrize("kernel, chunk_slots", [("pallas-gpu", 2 * BLOCK), ("pallas-gpu", None), ("ffi-cpu", None)],
                         ids=["pallas_gpu-chunks", "pallas_gpu-whole_tables", "ffi_cpu"])
def test_a_fused_kernel_step_writes_its_token_then_reads_as_xla_does(model, kernel, chunk_slots, monkeypatch):
    """The fused-kernel form (``kernels.paged_kernel``: each layer its own pool [K, N, block, H]; each layer writes
    its tokens, then the kernel attends): JAX's Pallas GPU paged attention (here in Pallas's interpreter) reads
    one-token steps alone, the prefill reading on XLA (in chunks or as whole tables) and written after the layer
    loop; the CPU kernel in C++ (``jaxformer.native``) reads the prefill too, and Gemma's sliding windows (8 slots:
    the 12-token prompt and the steps after it see fewer than they hold) with its softcap. A prefill and two
    one-token steps give a ``KVCache`` step's logits and lengths; the padding row (length 0) stays finite. A model
    a kernel cannot serve is refused by name, 'auto' on this CPU picks the C++ kernel, and a scanned stack refuses
    the form (it would slice every layer's pool)."""
    monkeypatch.setattr(attention, "PAGED_CHUNK_SLOTS", {} if chunk_slots is None else {"cpu": chunk_slots})
    cfg = model.config
    assert kernels.paged_kernel("auto", cfg) == "ffi-cpu"
    if cfg.name == "tiny-gemma" and kernel == "pallas-gpu":  # it reads every slot up to a row's length
        assert "sliding" in kernels.paged_kernel_refuses(cfg, kernel)
        with pytest.raises(ValueError, match="cannot serve this model: its layers attend sliding"):
            kernels.paged_kernel(kernel, cfg)
        return
    assert kernels.paged_kernel(kernel, cfg) == kernel
    ids, positions, valid, paged = _kernel_steps_agree(model, kernel)
    with pytest.raises(ValueError, match="runs on layers apart"):
        model.step(ids, positions, valid, paged)


def _kernel_steps_agree(model, kernel: str):
    """A prefill and two one-token steps over the fused-kernel form (each layer its own pool) give a ``KVCache``
    step's logits within 1e-5 at every real row (the padding row finite); the last inputs and the paged state."""
    cfg = model.config
    runner = unstacked_decoder(model, always=True)
    ids, positions, valid, next_positions = _inputs(cfg.vocab_size)
    real = np.asarray(PROMPTS) > 0
    dense = model.init_cache(len(PROMPTS), BLOCK * BLOCKS_PER_ROW).per_layer()
    stacked = _paged_state(cfg, len(PROMPTS)).kv
    pool = PagedKVCache.empty(cfg.decoder_layers, stacked.k.shape[1], BLOCK, cfg.kv_heads, cfg.head_dim_,
                              jnp.float32, kernel=kernel)
    paged = DecodeState(dataclasses.replace(pool, tables=stacked.tables, lengths=stacked.lengths))
    step = jax.jit(lambda runner, ids, positions, valid, state: runner.step(ids, positions, valid, state))
    for call in range(3):
        want, dense = step(runner, ids, positions, valid, dense)
        got, paged = step(runner, ids, positions, valid, paged)
        assert bool(jnp.all(jnp.isfinite(got)))
        assert float(jnp.max(jnp.abs(got[real] - want[real]))) < 1e-5, f"call {call}"
        ids, positions, valid = np.asarray(jnp.argmax(want, -1))[:, None], next_positions + call, real[:, None]
    assert np.array_equal(paged.kv.lengths, np.asarray(PROMPTS) + 2 * real)
    assert isinstance(paged.kv.k, tuple) and len(paged.kv.k) == cfg.decoder_layers
    return ids, positions, valid, paged


def test_the_cpu_kernel_reads_sinks_beside_sliding_windows_and_a_softcap():
    """gpt-oss's attention sinks (each head's learned logit in every softmax) on Gemma's alternating 8-slot windows
    and softcap: through the CPU kernel, a ``KVCache`` step's logits within 1e-5; the Pallas kernels refuse them."""
    model = jf.build(jf.config("tiny-gemma").replace(attention_sinks=True), seed=0)
    assert model.config.scores.sinks and kernels.paged_kernel("auto", model.config) == "ffi-cpu"
    assert "sinks" in kernels.paged_kernel_refuses(jf.config("tiny-llama").replace(attention_sinks=True), "pallas-gpu")
    _kernel_steps_agree(model, "ffi-cpu")


@pytest.mark.parametrize("softcap, window, sinks", [(None, None, False), (2.0, None, False), (None, 3, False),
                                                    (None, None, True)], ids=["plain", "softcap", "window", "sinks"])
def test_the_cpu_kernel_attends_each_query_to_its_slots_up_to_its_position(softcap, window, sinks):
    """The C++ kernel (``jaxformer.native``) against a dense softmax in numpy: grouped queries (3 per kv head), rows
    of several queries (a prompt chunk's: each reads its row's slots up to its own position, or a sliding window's
    last 3 of them, starting mid-block), a row of one query and padding after it, a padding row; blocks of 4
    scattered over the pool, a query ending mid-block; each head's sink logit joining its softmax. Within 1e-5, a
    padding query's output 0. A table naming a block outside the pool, or a position past a row's blocks, is an
    error, not a read outside the pool."""
    from jaxformer.cache import PagedRows, PagedTarget

    rng = np.random.default_rng(0)
    K, G, H, S, N, M = 2, 3, 16, 4, 12, 3
    positions = np.asarray([[3, 4, 5, 6, 7], [10, -1, -1, -1, -1], [-1] * 5], np.int32)
    B, T = positions.shape
    tables = rng.permutation(np.arange(1, N))[:B * M].reshape(B, M).astype(np.int32)
    q = rng.standard_normal((B, T, K * G, H)).astype(np.float32)
    keys, values = (rng.standard_normal((K, N, S, H)).astype(np.float32) for _ in range(2))
    sink = rng.standard_normal(K * G).astype(np.float32) if sinks else None
    scale = H ** -0.5

    def attend(tables, positions):
        target = PagedTarget(jnp.zeros((B, T), jnp.int32), jnp.zeros((B, T), jnp.int32), jnp.zeros(B, jnp.int32),
                             jnp.asarray(positions))
        k, v = (PagedRows(jnp.asarray(pool), jnp.asarray(tables), None, target, "ffi-cpu", window)
                for pool in (keys, values))
        return np.asarray(jax.jit(kernels.paged_attention, static_argnums=(3, 4))(
            jnp.asarray(q), k, v, scale, softcap, None if sink is None else jnp.asarray(sink)))

    got = attend(tables, positions)
    for b, t in np.ndindex(B, T):
        p = positions[b, t]
        if p < 0:
            assert not np.any(got[b, t])
            continue
        slots = np.arange(0 if window is None else max(0, p + 1 - window), p + 1)
        k, v = (pool[:, tables[b, slots // S], slots % S] for pool in (keys, values))  # [K, p + 1, H]
        scores = np.einsum("kgh,ksh->kgs", q[b, t].reshape(K, G, H).astype(np.float64), k) * scale
        scores = scores if softcap is None else softcap * np.tanh(scores / softcap)
        if sink is not None:  # one more logit, of a key without a value
            scores = np.concatenate([scores, sink.reshape(K, G, 1)], axis=-1)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights = weights / weights.sum(-1, keepdims=True)
        want = np.einsum("kgs,ksh->kgh", weights[..., :p + 1 - slots[0]], v).reshape(K * G, H)
        assert float(np.max(np.abs(got[b, t] - want))) < 1e-5, (b, t)
    outside = tables.copy()
    outside[1, 2] = N
    # (XLA raises the kernel's error as a JaxRuntimeError on a program's first run, a ValueError after)
    with pytest.raises((ValueError, RuntimeError), match="names a block outside the pool"):
        attend(outside, positions)
    with pytest.raises((ValueError, RuntimeError), match="past its row's blocks"):
        attend(tables, np.where(positions == 10, M * S, positions))


def test_without_a_compiler_the_engine_reads_on_xla_and_an_asked_cpu_kernel_says_why(monkeypatch):
    """The C++ kernel is built on first use with ``$CXX``: without one, or when the build fails, the build says why;
    'auto' then reads on XLA and asking for 'ffi-cpu' by name is a ValueError that gives the reason."""
    from jaxformer import native

    assert native._register("no-such-compiler") == "no C++ compiler 'no-such-compiler' on PATH to build it (set $CXX)"
    assert native._register("false").startswith("building it failed: false failed on paged_attention.cc")
    cfg = jf.config("tiny-llama")
    monkeypatch.setattr(native, "paged_attention", lambda: "no C++ compiler 'g++' on PATH to build it (set $CXX)")
    assert kernels.paged_kernel("auto", cfg) is None
    with pytest.raises(ValueError, match=r"'ffi-cpu' cannot serve this model: no C\+\+ compiler 'g\+\+' on PATH"):
        kernels.paged_kernel("ffi-cpu", cfg)
    monkeypatch.undo()
    assert kernels.paged_kernel("auto", cfg) == "ffi-cpu"


def test_the_tpu_kernel_reads_a_bfloat16_pool_as_the_xla_read_does():
    """'pallas-tpu' (JAX's Pallas paged attention for TPUs, here in Pallas's TPU interpreter) reads keys and values
    in bfloat16, so it serves bfloat16 models alone: a float32 one is refused by name. A bfloat16 tiny-llama's
    prefill and two one-token steps give the XLA paged read's logits within 0.01 (bfloat16 activations: the
    kernel's float32 sums, in another order, move an output by an ulp of bfloat16 now and then; measured 0.002 on
    logits of 0.6)."""
    with pytest.raises(ValueError, match="reads keys and values in bfloat16, which would round a float32 model's"):
        kernels.paged_kernel("pallas-tpu", jf.config("tiny-llama"))
    model = jf.build(jf.config("tiny-llama").replace(dtype="bfloat16"), seed=0)
    cfg = model.config
    runner = unstacked_decoder(model, always=True)
    ids, positions, valid, next_positions = _inputs(cfg.vocab_size)
    real = np.asarray(PROMPTS) > 0
    xla = _paged_state(cfg, len(PROMPTS))
    xla = DecodeState(dataclasses.replace(xla.kv, k=xla.kv.k.astype(jnp.bfloat16), v=xla.kv.v.astype(jnp.bfloat16)))
    pool = PagedKVCache.empty(cfg.decoder_layers, xla.kv.k.shape[1], BLOCK, cfg.kv_heads, cfg.head_dim_,
                              jnp.bfloat16, kernel="pallas-tpu")
    fused = DecodeState(dataclasses.replace(pool, tables=xla.kv.tables, lengths=xla.kv.lengths))
    step = jax.jit(lambda runner, ids, positions, valid, state: runner.step(ids, positions, valid, state))
    for call in range(3):
        want, xla = step(runner, ids, positions, valid, xla)
        got, fused = step(runner, ids, positions, valid, fused)
        assert bool(jnp.all(jnp.isfinite(got)))
        assert float(jnp.max(jnp.abs(got[real] - want[real]).astype(jnp.float32))) < 0.01, f"call {call}"
        ids, positions, valid = np.asarray(jnp.argmax(want, -1))[:, None], next_positions + call, real[:, None]


@pytest.mark.parametrize("loop", [False, True], ids=["scanned", "decode_loop"])
def test_a_paged_source_gives_an_encoder_kv_steps_logits(loop):
    """T5's cross-attention over its sources' keys and values in blocks of the pool (as the engine writes them:
    ``encode_sources``) reads as over a dense ``EncoderKV``."""
    model = jf.build(jf.config("tiny-t5"), seed=0)
    cfg = model.config
    runner = model.for_decode_loop() if loop else model
    rng = np.random.default_rng(2)
    sources = (7, 13, 3, 16)  # right padded into 4 blocks a row
    B, width = len(sources), BLOCK * BLOCKS_PER_ROW
    ids, valid = np.zeros((B, width), np.int32), np.zeros((B, width), bool)
    for row, n in enumerate(sources):
        ids[row, :n], valid[row, :n] = rng.integers(1, cfg.vocab_size, n), True
    dense = model.init_cache(model.encode(ids, valid.astype(np.int32)), 2)
    dense = dense.per_layer() if loop else dense
    tables = jnp.asarray((1 + rng.permutation(B * (BLOCKS_PER_ROW + 1))).reshape(B, -1), jnp.int32)
    pool = PagedKVCache.empty(cfg.decoder_layers, 1 + tables.size, BLOCK, cfg.kv_heads, cfg.head_dim_, jnp.float32)
    k, v = encode_sources(*nnx.split(model), pool.k, pool.v, jnp.asarray(ids), jnp.asarray(valid),
                          tables[:, :BLOCKS_PER_ROW])
    paged = DecodeState(PagedKVCache(k, v, tables[:, BLOCKS_PER_ROW:], jnp.zeros(B, jnp.int32)),
                        source_view(k, v, tables[:, :BLOCKS_PER_ROW], jnp.asarray(sources, jnp.int32)))
    tokens = np.zeros((B, 1), np.int32)  # (T5 starts from its pad, 0)
    for step in range(2):
        positions, ones = np.full((B, 1), step, np.int32), np.ones((B, 1), bool)
        want, dense = runner.step(tokens, positions, ones, dense)
        got, paged = runner.step(tokens, positions, ones, paged)
        assert float(jnp.max(jnp.abs(got - want))) < 1e-5, f"step {step}"
        tokens = np.asarray(jnp.argmax(want, -1), np.int32)[:, None]


def test_the_compiled_decode_step_reads_the_pool_in_chunks_whatever_the_table_width():
    """The first read gathered [L, B, K, S, H] keys and values before the layer loop, the second each layer's
    [B, K, S, H] where it attends; on XLA:CPU each layer now reads a few blocks at a time (``PAGED_CHUNK_SLOTS``),
    so the compiled one-token step's scratch stays under every layer's keys and does not grow with the rows'
    table width (4x the slots: less than one more layer's keys, the wider tables and masks)."""
    cfg = jf.config("tiny-llama").replace(decoder_layers=6)
    model = jf.build(cfg, seed=0)
    B, L, K, H = 8, cfg.decoder_layers, cfg.kv_heads, cfg.head_dim_

    def step(graphdef, weights, k, v, ids, positions, valid, tables, lengths):
        logits, state = nnx.merge(graphdef, weights).step(ids, positions, valid,
                                                          DecodeState(PagedKVCache(k, v, tables, lengths)))
        return logits, state.kv.k, state.kv.v

    def scratch(runner, M: int) -> int:
        pool = jax.ShapeDtypeStruct((L, 1 + B * M, K, BLOCK, H), jnp.float32)
        return _scratch(step, runner, pool, B, jax.ShapeDtypeStruct((B, M), jnp.int32),
                        jax.ShapeDtypeStruct((B,), jnp.int32))

    narrow = 32  # S = 128 slots a row
    layer_keys = B * K * narrow * BLOCK * H * 4
    for runner in (model, model.for_decode_loop()):
        low, high = scratch(runner, narrow), scratch(runner, 4 * narrow)
        assert high < L * layer_keys and high - low < layer_keys, (low, high)


def test_the_compiled_encoder_decoder_step_reads_its_source_in_chunks_whatever_its_width():
    """The first cross read gathered every decoder layer's source keys and values [L, B, S, K, H] from the pool before
    the layer loop; each layer now reads its own a few blocks at a time where it attends: the compiled one-token
    step's scratch stays under every layer's source keys and does not grow with the source tables' width."""
    cfg = jf.config("tiny-t5").replace(decoder_layers=6)
    model = jf.build(cfg, seed=0)
    B, M = 8, 2  # a row: 8 target slots
    L, K, H = cfg.decoder_layers, cfg.kv_heads, cfg.head_dim_

    def step(graphdef, weights, k, v, ids, positions, valid, tables, lengths, source_tables, source_lengths):
        state = DecodeState(PagedKVCache(k, v, tables, lengths), source_view(k, v, source_tables, source_lengths))
        logits, state = nnx.merge(graphdef, weights).step(ids, positions, valid, state)
        return logits, state.kv.k, state.kv.v

    def scratch(runner, source: int) -> int:
        pool = jax.ShapeDtypeStruct((L, 1 + B * (M + source), K, BLOCK, H), jnp.float32)
        lengths = jax.ShapeDtypeStruct((B,), jnp.int32)
        return _scratch(step, runner, pool, B, jax.ShapeDtypeStruct((B, M), jnp.int32), lengths,
                        jax.ShapeDtypeStruct((B, source), jnp.int32), lengths)

    narrow = 64  # 256 source slots a row
    layer_source_keys = B * K * narrow * BLOCK * H * 4
    for runner in (model, model.for_decode_loop()):
        low, high = scratch(runner, narrow), scratch(runner, 4 * narrow)
        assert high < L * layer_source_keys and high - low < layer_source_keys, (low, high)


def _scratch(step, runner, pool, rows: int, *tables_and_more) -> int:
    """The temporary bytes XLA's memory analysis counts for ``step`` compiled over ``runner``'s weights, the pool
    donated, one token for each of ``rows`` rows."""
    graphdef, weights = nnx.split(runner)
    column = jax.ShapeDtypeStruct((rows, 1), jnp.int32)
    compiled = jax.jit(step, static_argnums=0, donate_argnums=(2, 3)).lower(
        graphdef, weights, pool, pool, column, column, jax.ShapeDtypeStruct((rows, 1), bool), *tables_and_more)
    return compiled.compile().memory_analysis().temp_size_in_bytes


# DeepSeek-V3.2's sparse attention at tiny sizes: the indexer keeps 4 keys a query (fewer than the prompts hold)
INDEXER = {"index_heads": 2, "index_head_dim": 8, "index_topk": 4}


@pytest.mark.parametrize("loop", [False, True], ids=["scanned", "decode_loop"])
@pytest.mark.parametrize("changes", [{}, {"nope": (1,)}, INDEXER], ids=["rotary", "nope_layer", "indexer"])
def test_a_paged_latent_step_gives_a_latent_cache_steps_logits(loop, changes, monkeypatch):
    """Multi-head latent attention (tiny DeepSeek-V3) over a paged pool of latents (``PagedKVCache.latent``: one head
    C + R wide, read in its absorbed form at every width): a prefill and two one-token steps give a ``LatentCache``
    step's logits within 1e-5 (its prefill attends the expanded per-head keys: the same sums, another order), with
    a NoPE layer too (its slots' R zeros scored by a zero-padded query), and with DeepSeek sparse attention (the
    indexer's keys paged beside the latents, every slot scored, each query attending its top 4); chunks of 2
    blocks."""
    monkeypatch.setattr(attention, "PAGED_CHUNK_SLOTS", {"cpu": 2 * BLOCK})
    cfg = jf.config("tiny-deepseek")
    if "nope" in changes:
        cfg = cfg.replace(nope=jf.model_config.NoPE(changes["nope"]))
    elif changes:
        cfg = cfg.replace(**changes)
    model = jf.build(cfg, seed=0)
    rows, width = len(PROMPTS), cfg.latent.kv_rank + cfg.latent.rope_head_dim
    index_width = cfg.indexer.head_dim if cfg.indexer is not None else 0
    pool = PagedKVCache.empty(cfg.decoder_layers, 1 + rows * BLOCKS_PER_ROW, BLOCK, 1, width, jnp.float32,
                              latent=True, index_width=index_width)
    assert pool.v.shape[2:] == ((1, BLOCK, index_width) if index_width else (0, BLOCK, width))  # (no values)
    tables = _paged_state(cfg, rows).kv.tables
    paged = DecodeState(PagedKVCache(pool.k, pool.v, tables, jnp.zeros(rows, jnp.int32), latent=True))
    paged = _steps_agree(model, loop, paged, steps=3)
    assert np.array_equal(paged.kv.lengths, np.asarray(PROMPTS) + 2 * (np.asarray(PROMPTS) > 0))


# gated-delta-rule linear layers at tiny sizes, among 8 layers: Qwen3-Next's period (three linear layers, then a
# full attention layer), scanned period by period; or a run of linear layers, then a run of attention layers, each
# run scanned layer by layer
LINEAR = {"linear_key_heads": 2, "linear_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 6,
          "decoder_layers": 8}


@pytest.mark.parametrize("loop", [False, True], ids=["scanned", "decode_loop"])
@pytest.mark.parametrize("linear_layers", [(0, 1, 2, 4, 5, 6), (0, 1, 2, 3)], ids=["periods", "runs"])
def test_linear_layers_states_beside_a_paged_pool_give_a_hybrid_caches_logits(loop, linear_layers, monkeypatch):
    """A stack of linear-attention layers and attention layers (``HybridCache``): the attention layers' keys paged
    (the pool holds those layers alone) beside the linear layers' states of the batch rows, in the scanned stack
    (each attention layer indexing the pool at its rank inside the scan's body) and the decode loop: a prefill and
    two one-token steps give a ``HybridCache`` step's logits within 1e-5."""
    from jaxformer.cache import HybridCache, LinearState

    monkeypatch.setattr(attention, "PAGED_CHUNK_SLOTS", {"cpu": 2 * BLOCK})
    cfg = jf.config("tiny-mixtral").replace(**LINEAR, linear_layers=linear_layers)
    model = jf.build(cfg, seed=0)
    assert isinstance(model.init_cache(1, BLOCK).kv, HybridCache)
    rows, attention_layers = len(PROMPTS), cfg.decoder_layers - len(linear_layers)
    pool = PagedKVCache.empty(attention_layers, 1 + rows * BLOCKS_PER_ROW, BLOCK, cfg.kv_heads, cfg.head_dim_,
                              jnp.float32)
    tables = _paged_state(cfg, rows).kv.tables
    states = LinearState.empty(cfg, len(linear_layers), rows, jnp.float32)
    paged = DecodeState(HybridCache(PagedKVCache(pool.k, pool.v, tables, jnp.zeros(rows, jnp.int32)), states))
    paged = _steps_agree(model, loop, paged, steps=3)
    assert np.array_equal(paged.kv.full.lengths, np.asarray(PROMPTS) + 2 * (np.asarray(PROMPTS) > 0))
