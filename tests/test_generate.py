"""Generation: cache == no cache, token identity with transformers, sampling properties, one trace,
and every bad input refused before compilation."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

import jaxformer as jf
from jaxformer import generate as gen
from jaxformer.cache import (CompressedCache, HybridCache, RingKVCache, SplitKVCache, cache_numbers_per_token,
                             windowed_layers)

TOL = 1e-5
# Mistral Small 4's case: the prefill expanding the latents and each step absorbing them (two association orders of
# the same float32 sums) differ by 1.01e-5 on an AVX-512 Xeon (under 1e-5 on the machine this test was written on)
CACHE_TOL = {"mistral4": 3e-5}


def _decoder_case(name, **changes):
    return jf.config(name).replace(**{"init_std": 0.2, **changes})


CACHE_CASES = {
    "gpt-causal": _decoder_case("tiny-gpt"),
    "llama-gqa": _decoder_case("tiny-llama"),
    "llama-sliding-3": _decoder_case("tiny-llama", attention="sliding", window_size=3),
    # five layers: two periods of (full, sliding) scanned, then one past them (the prefill; ``run_layers``)
    "gpt-alternating-2": _decoder_case("tiny-gpt", attention="alternating", window_size=2, decoder_layers=5),
    "llama-prefix": _decoder_case("tiny-llama", attention="prefix"),
    "mixtral": _decoder_case("tiny-mixtral"),
    "deepseek-mla": _decoder_case("tiny-deepseek"),  # latent cache: prefill expanded, steps absorbed
    # DeepSeek-V3.2: the indexer keeps 3 keys per query (its keys cached beside the latents)
    "deepseek-v32": _decoder_case("tiny-deepseek", index_heads=2, index_head_dim=16, index_topk=3),
    # GLM-5: the same indexer rotating adjacent pairs of its rotary part (its cached keys in that order)
    "glm-5": _decoder_case("tiny-deepseek", index_heads=2, index_head_dim=16, index_topk=3, index_rope_interleave=True),
    # Mistral Small 4: queries scaled by their position past every 2 positions (prefill and steps cross spans), a
    # softmax router scoring its 4 groups by their best two
    "mistral4": _decoder_case("tiny-deepseek", query_position_scale=0.5, query_position_span=2, router_score="softmax",
                              router_bias=False, router_group_score="best_two"),
    # Mistral Large 4: a plain query, the indexer's from its input (3 keys per query), a NoPE expert layer (its cache
    # slots padded to the rotary layers' width) between rotary ones, LeRoPE, the per-head log-position query scales
    # (drawn off their identity init by _off_identity, so a step reading a wrong position shows)
    "mistral-large4": _decoder_case("tiny-deepseek", decoder_layers=4, q_lora_rank=None, index_heads=2,
                                    index_head_dim=16, index_topk=3, index_rope_interleave=True,
                                    index_query_from_input=True, query_log_position_scale=True,
                                    rope_learned_frequencies=True, rope_interleave=True, nope_layers=(2,),
                                    latent_norm_eps=1e-5, router_score="softmax", router_bias=False,
                                    router_group_score="best_two"),
    # gpt-oss: sinks in every softmax, sliding (window 2) and full layers, biased experts, the clamped SwiGLU
    "gpt-oss": _decoder_case("tiny-mixtral", attention="alternating", window_size=2, layer_types=("sliding", "full"),
                             attention_sinks=True, qkv_bias=True, out_bias=True, expert_bias=True,
                             router_logit_bias=True, swiglu_limit=0.5, swiglu_alpha=1.702),
    # Llama 4: chunks of 2 on the rotary layer, a NoPE layer with its temperature (floor scale 2), weightless q/k
    # norm, adjacent rotary pairs, sigmoid experts on their inputs beside a shared one
    "llama4": _decoder_case("tiny-mixtral", attention="alternating", layer_types=("chunked", "full"),
                            attention_chunk_size=2, nope_layers=(1,), temperature_floor_scale=2, temperature_scale=0.5,
                            qk_norm=True, qk_norm_scale=False, rope_interleave=True, router_score="sigmoid",
                            normalize_router_weights=False, router_weights_on_input=True, shared_experts=1,
                            expert_d_ff=32),
    # Maverick: dense and expert layers in turn, scanned by periods (the decode loop runs them unstacked)
    "llama4-interleaved": _decoder_case("tiny-mixtral", decoder_layers=4, moe_layer_step=2, router_score="sigmoid",
                                        normalize_router_weights=False, router_weights_on_input=True,
                                        shared_experts=1, expert_d_ff=32),
    # Granite's muP multipliers (embeddings, residual branches, attention scale, logits) on SmolLM3's layers: a NoPE
    # layer that slides (window 2) beside a rotary one in full
    "granite-smollm3": _decoder_case("tiny-llama", embedding_multiplier=3.0, residual_multiplier=0.5,
                                     attention_scale=0.1, logits_divisor=4.0, nope_layers=(1,),
                                     attention="alternating", window_size=2, layer_types=("full", "sliding")),
    # OLMoE: q/k norms over the whole projection, softmax top-2 experts not renormalised
    "olmoe": _decoder_case("tiny-mixtral", qk_norm=True, qk_norm_span="projection", normalize_router_weights=False),
    # Phi-3.5-MoE: the sparse mixer's two picks (a wide jitter eps), LayerNorms with biases, q/k/v/o and head biases
    "phimoe": _decoder_case("tiny-mixtral", router_score="sparsemixer", normalize_router_weights=False,
                            router_jitter_eps=0.2, norm="layernorm", norm_bias=True, qkv_bias=True, out_bias=True,
                            lm_head_bias=True),
    # Command R7B with StableLM's and Command R+'s parts: one bias-free LayerNorm for attention and MLP side by
    # side, adjacent rotary pairs on half of each head of the sliding layer (window 2), a NoPE layer in full, each
    # head's own q/k norm, logits times 5 / 6
    "cohere-stablelm": _decoder_case("tiny-llama", norm="layernorm", norm_bias=False, rope_interleave=True,
                                     rotary_dim=4, parallel_residual=True, parallel_shared_norm=True, qk_norm=True,
                                     qk_norm_span="each_head", attention="alternating", window_size=2,
                                     layer_types=("sliding", "full"), nope_layers=(1,),
                                     logits_multiplier=0.8333333333333334),
    # OPT: post-norm (OPT-350m's blocks) without a final norm, ReLU, positions two rows into their table and
    # counted from the attention mask
    "opt": _decoder_case("tiny-gpt", norm_position="post", final_norm=False, activation="relu", position_offset=2,
                         positions_from_mask=True),
    # Qwen3-Next: Gated DeltaNet layers (chunks of 2, so prefill and the full pass cross chunks) around one gated
    # attention layer each period, experts with a gated shared one; two periods of 4 scanned (every other step).
    # Weights at std 0.05: at 0.2 the logits reach 6 and the two forms' float32 roundings differ by up to 3e-5
    "qwen3-next": _decoder_case("tiny-mixtral", init_std=0.05, decoder_layers=8, linear_layers=(0, 1, 2, 4, 5, 6),
                                linear_key_heads=2,
                                linear_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6, linear_chunk=2,
                                attention_gate=True, shared_experts=1, shared_expert_gate=True, expert_d_ff=32,
                                norm_scale_offset=1.0, qk_norm=True),
    # Kimi Linear: Kimi Delta Attention (a decay per key channel; chunks of 2) in layers 0, 1 and 3 beside NoPE latent
    # attention (its latent cache) in layers 2 and 4, the first layer dense (a linear one), then experts
    "kimi-linear": _decoder_case("tiny-deepseek", init_std=0.05, position="none", rope_interleave=False,
                                 decoder_layers=5, linear_layers=(0, 1, 3), linear_key_heads=2, linear_value_heads=2,
                                 linear_key_head_dim=8, linear_value_head_dim=8, linear_decay="channel",
                                 linear_chunk=2),
    # Gemma: sliding and full layers with a window of 2, soft caps (2), Gemma 3's local rotary base; T5Gemma
    "gemma2": _decoder_case("tiny-gemma", window_size=2, attention_softcap=2.0, logits_softcap=3.0),
    "gemma3": _decoder_case("tiny-gemma3", window_size=2),
    # Gemma 4's settings on Gemma 3's layers: per-layer inputs (a step reads its own tokens' rows), normed values,
    # stored layer scalars, the full layer's proportional rotary turning half of each head
    "gemma4": _decoder_case("tiny-gemma3", window_size=2, per_layer_input_size=8, v_norm=True,
                            layer_output_scale=True, rope_proportion=0.5, norm_scale_offset=0.0),
    # and its layer kinds: full layers with wider heads and fewer kv heads whose values are their keys, the last
    # three layers reading layers 1 and 2's keys and values (their cache slices when cached) with a wider MLP
    "gemma4-shared": _decoder_case("tiny-gemma3", window_size=2, v_norm=True, norm_scale_offset=0.0,
                                   decoder_layers=6, layer_types=("sliding", "full") * 3, full_head_dim=32,
                                   full_kv_heads=1, full_keys_as_values=True, kv_shared_layers=3, kv_shared_d_ff=96),
    # and its experts beside each layer's MLP (the 26B A4B): the router reading the unnormed input through its own
    # norm and scale, each expert's weight scaled
    "gemma4-moe": _decoder_case("tiny-gemma3", window_size=2, v_norm=True, norm_scale_offset=0.0, num_experts=4,
                                experts_per_token=2, expert_d_ff=16, router_norm=True, router_expert_scale=True,
                                experts_beside_dense=True),
    "t5gemma": jf.config("tiny-t5gemma").replace(init_std=0.2, window_size=2, attention_softcap=2.0),
    "t5": jf.config("tiny-t5").replace(init_std=0.1),
    "transformer-2017": jf.config("tiny-transformer").replace(init_std=0.2),
    "bart-like": jf.config("bart-base").replace(vocab_size=64, d_model=32, num_heads=4, d_ff=48, encoder_layers=2,
                                                decoder_layers=2, max_positions=40, init_std=0.2, dropout_rate=0.0),
    # DeepSeek-V4 (CompressedCache): HCA blocks of 4, CSA blocks of 2 (the indexer keeping 2), a window of 4, so the
    # prefill and the steps close blocks, CSA's entries overlap across calls and the window rolls
    "deepseek-v4": jf.config("deepseek-v4-flash").replace(
        vocab_size=97, d_model=32, num_heads=4, head_dim=16, rotary_dim=8, d_ff=16, expert_d_ff=16, decoder_layers=4,
        num_experts=4, experts_per_token=2, hash_layers=1, window_size=4, hc_streams=3, hc_sinkhorn_iters=6,
        compressed_layers=("heavy", "sparse", "sliding", "sparse"), compressed_q_rank=24, compressed_sparse_rate=2,
        compressed_heavy_rate=4, compressed_index_heads=8, compressed_index_head_dim=12, compressed_index_topk=2,
        compressed_out_groups=2, compressed_out_rank=8, max_positions=64, init_std=0.2),
}


def _off_identity(model):
    """The parameters that start where they change nothing (Mistral Large 4's log-position query scales, LeRoPE's
    frequency scale) moved off it, so that a cached step skipping them or reading a wrong position differs."""
    state = nnx.state(model, nnx.Param)
    rng = np.random.default_rng(5)
    names = ("log_position_scale", "log_position_bias", "rope_log_scale")
    moved = jax.tree_util.tree_map_with_path(
        lambda path, a: a + 0.2 * rng.standard_normal(a.shape).astype(a.dtype)
        if any(getattr(k, "key", None) in names for k in path) else a, state)
    nnx.update(model, moved)
    return model


@pytest.mark.parametrize("case", sorted(CACHE_CASES))
def test_cache_equals_no_cache(case):
    """Prefill 3 tokens with the family's step, then step one token at a time: each step's logits
    equal the full forward's."""
    cfg, tol = CACHE_CASES[case], CACHE_TOL.get(case, TOL)
    model = _off_identity(jf.build(cfg, seed=1))
    rng = np.random.default_rng(0)
    B, T, prefill = 2, 9, 3
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, T)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    # the full forward and the prefill jitted: one compilation each costs less than an eager call of the model
    stacked = jax.jit(lambda m, i, p, s: m.step(i, p, jnp.ones(i.shape, bool), s))
    if cfg.family == "encoder_decoder":
        source = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, 7)), jnp.int32)
        source_mask = jnp.ones((B, 7), jnp.int32).at[1, 5:].set(0)
        full = jax.jit(lambda m: m(source, source_mask, decoder_input_ids=ids).logits)(model)
        state = model.init_cache(model.encode(source, source_mask), T)
    else:
        prefix, extra = None, {}
        if cfg.attention == "prefix":
            prefix = jnp.array([2, 3])  # decoding one token at a time needs the whole prefix prefilled
            extra = {"prefix_lengths": prefix}
        full = jax.jit(lambda m: m(ids, **extra).logits)(model)
        state = model.init_cache(B, T, prefix)
    logits, state = stacked(model, ids[:, :prefill], positions[:, :prefill], state)
    np.testing.assert_allclose(logits, full[:, prefill - 1], atol=tol, rtol=0)
    step = jax.jit(lambda m, i, p, s: m.for_decode_loop().step(i, p, jnp.ones(i.shape, bool), s))
    # windowed layers: every other step through the stacked layers too (on CPU the loop runs them unstacked)
    windowed = (windowed_layers(cfg, cfg.decoder_layers)[1] is not None or cfg.linear_attention is not None
                or cfg.scores.compressed is not None)
    for t in range(prefill, T):
        logits, state = (stacked if windowed and t % 2 else step)(model, ids[:, t:t + 1], positions[:, t:t + 1], state)
        np.testing.assert_allclose(logits, full[:, t], atol=tol, rtol=0, err_msg=f"{case} position {t}")
    assert int(state.kv.index) == T
    local, window = windowed_layers(cfg, cfg.decoder_layers)
    full = state.kv.full if isinstance(state.kv, (SplitKVCache, HybridCache)) else None if all(local) else state.kv
    if isinstance(full, CompressedCache):  # (its positions are its window's: the last window - 1)
        full = None
        np.testing.assert_array_equal(state.kv.positions, positions[:, T - cfg.window_size + 1:])
    if full is not None:
        np.testing.assert_array_equal(full.positions, positions)
    if window is not None:  # the windowed layers kept their last `window` tokens only, T being several windows
        ring = state.kv.window if isinstance(state.kv, SplitKVCache) else state.kv
        assert isinstance(ring, RingKVCache) and ring.k.shape[0] == sum(local) and ring.length == window
        np.testing.assert_array_equal(np.sort(ring.positions, axis=1), positions[:, T - window:])


def test_decode_past_the_cache_is_refused():
    model = jf.build("tiny-llama")
    state = model.init_cache(1, 4)
    ids = jnp.ones((1, 3), jnp.int32)
    _, state = model.step(ids, jnp.arange(3)[None], jnp.ones((1, 3), bool), state)
    with pytest.raises(ValueError, match="overflows a cache of 4 slots"):
        model.step(ids[:, :2], jnp.arange(3, 5)[None], jnp.ones((1, 2), bool), state)


def test_latent_cache_holds_latent_and_rope_key_only():
    """MLA caches C + R numbers per token and layer (the README's table), not per-head keys and values."""
    cfg = jf.config("tiny-deepseek")
    state = jf.build(cfg).init_cache(2, 10)
    width = cfg.latent.kv_rank + cfg.latent.rope_head_dim
    assert state.kv.latent.shape == (cfg.decoder_layers, 2, 10, width)
    assert state.kv.latent.nbytes // (2 * 10) == cfg.decoder_layers * width * 4
    expanded = cfg.decoder_layers * cfg.num_heads * (cfg.head_dim_ + cfg.latent.rope_head_dim + cfg.value_dim)
    assert cache_numbers_per_token(cfg) == cfg.decoder_layers * width < expanded


def test_gqa_cache_holds_only_kv_heads():
    cfg = jf.config("tiny-llama")
    state = jf.build(cfg).init_cache(2, 10)
    assert state.kv.k.shape == (cfg.decoder_layers, 2, cfg.kv_heads, 10, cfg.head_dim_)  # head-major
    assert cfg.kv_heads < cfg.num_heads


# --------------------------------------------------------------------------------------------------
# Sampling and greedy properties (reference-free)


@pytest.fixture(scope="module")
def llama():
    return jf.build(jf.config("tiny-llama").replace(init_std=0.2), seed=2)


PROMPT = np.array([[5, 17, 42, 9], [0, 0, 33, 8]])
PROMPT_MASK = np.array([[1, 1, 1, 1], [0, 0, 1, 1]])


def test_same_seed_same_tokens_and_seeds_differ(llama):
    a = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=12, do_sample=True, seed=1)
    b = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=12, do_sample=True, seed=1)
    c = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=12, do_sample=True, seed=2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def _step_logits(model, sequences, mask, prompt_len):
    """Logits that chose each generated token, recomputed by a full forward with left-pad positions."""
    full_mask = np.concatenate([mask, np.ones((mask.shape[0], sequences.shape[1] - mask.shape[1]), int)], axis=1)
    positions = np.maximum(np.cumsum(full_mask, axis=1) - 1, 0)
    logits = np.asarray(model(sequences, full_mask, positions).logits)
    return logits[:, prompt_len - 1:-1]


@pytest.mark.parametrize("top_k", [1, 3])
def test_top_k_never_leaves_the_top_k(llama, top_k):
    for seed in range(4):
        out = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=6, do_sample=True, top_k=top_k, seed=seed)
        logits = _step_logits(llama, out, PROMPT_MASK, PROMPT.shape[1])
        chosen = out[:, PROMPT.shape[1]:]
        top = np.argsort(-logits, axis=-1)[..., :top_k]
        assert (chosen[..., None] == top).any(-1).all()


def test_top_p_never_leaves_the_nucleus(llama):
    top_p = 0.6
    for seed in range(4):
        out = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=6, do_sample=True, top_p=top_p, seed=seed)
        logits = _step_logits(llama, out, PROMPT_MASK, PROMPT.shape[1])
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        chosen = out[:, PROMPT.shape[1]:]
        p_chosen = np.take_along_axis(probs, chosen[..., None], -1)
        # Inside the nucleus: the probability mass strictly above the chosen token is below top_p.
        mass_above = np.where(probs > p_chosen, probs, 0).sum(-1)
        assert (mass_above < top_p + 1e-6).all()


def test_temperature_to_zero_is_greedy(llama):
    greedy = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=10)
    cold = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=10, do_sample=True, temperature=1e-5, seed=7)
    np.testing.assert_array_equal(greedy, cold)


def test_left_padded_row_generates_what_it_would_alone(llama):
    batch = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=8)
    alone = llama.generate(PROMPT[1:, 2:], max_new_tokens=8)
    np.testing.assert_array_equal(batch[1, 2:], alone[0])


def test_eos_stops_and_pads(llama):
    free = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=10)
    eos = int(free[0, PROMPT.shape[1] + 1])  # row 0 emits it at its second new token
    out = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=10, eos_token_id=eos, pad_token_id=0)
    row = out[0, PROMPT.shape[1]:]
    first = int(np.argmax(row == eos))
    assert (row[first + 1:] == 0).all()
    both_stop = llama.generate(PROMPT[:1], PROMPT_MASK[:1], max_new_tokens=10, eos_token_id=eos)
    assert both_stop.shape[1] == PROMPT.shape[1] + 2  # the loop ended early and the output is trimmed


def test_one_trace_per_shape(llama):
    llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=5)
    traces = gen.TRACE_COUNT["generate"]
    for _ in range(3):
        llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=5)
    other_prompt = (PROMPT + 1) % 256
    llama.generate(other_prompt, PROMPT_MASK, max_new_tokens=5)
    assert gen.TRACE_COUNT["generate"] == traces
    llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=6)
    assert gen.TRACE_COUNT["generate"] == traces + 1


def test_pure_function_form_jits_and_vmaps(llama):
    graphdef, state = jf.split(llama)
    config = gen.GenerationConfig(max_new_tokens=4, pad_token_id=0)
    tokens, steps, bad_step = jax.jit(gen.generate_tokens, static_argnames=("graphdef", "config"))(
        graphdef, state, jnp.asarray(PROMPT), jnp.asarray(PROMPT_MASK), jax.random.key(0), config)
    np.testing.assert_array_equal(np.asarray(tokens), llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=4)[:, 4:])
    assert int(steps) == 4 and int(bad_step) == -1


@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": 200}, "positions"),
    ({"num_beams": 0}, "num_beams"),
    ({"do_sample": True, "top_p": 0.0}, "top_p"),
    ({"do_sample": True, "top_p": 1.5}, "top_p"),
    ({"do_sample": True, "temperature": 0.0}, "temperature"),
    ({"do_sample": True, "top_k": 0}, "top_k"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"eos_token_id": 999}, "eos_token_id"),
    ({"early_stopping": "sometimes"}, "early_stopping"),
    ({"bad_words_ids": [[3, 4]]}, "more than one token"),
    ({"bad_words_ids": [[999]]}, "bad_words_ids holds 999"),
    ({"bad_words_ids": [3]}, "list of non-empty lists"),
])
def test_bad_generation_arguments(kwargs, message):
    model = jf.build("tiny-gpt")  # 128 learned positions
    traces = gen.TRACE_COUNT["generate"]
    with pytest.raises(ValueError, match=message):
        model.generate(np.ones((1, 4), int), **kwargs)
    assert gen.TRACE_COUNT["generate"] == traces  # refused before anything was traced


def test_right_padding_is_refused_for_decoder_only():
    model = jf.build("tiny-gpt")
    with pytest.raises(ValueError, match="left padding"):
        model.generate(np.ones((2, 4), int), np.array([[1, 1, 1, 1], [1, 1, 0, 0]]), max_new_tokens=2)


def test_encoder_decoder_needs_a_start_token():
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        jf.build("tiny-t5").generate(np.ones((1, 4), int), max_new_tokens=2)
    out = jf.build("tiny-t5").generate(np.ones((1, 4), int), max_new_tokens=3, decoder_start_token_id=0)
    assert out.shape == (1, 4) and out[0, 0] == 0


# --------------------------------------------------------------------------------------------------
# Token identity with transformers


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_factory import save_checkpoint  # noqa: E402
from jaxformer.compare import reference_model  # noqa: E402


def _batch(family, rng):
    ids = rng.integers(3, 97, (3, 7))
    mask = np.ones_like(ids)
    if family == "decoder":  # left padding
        mask[1, :2], mask[2, :4] = 0, 0
    else:  # the encoder takes right padding
        mask[1, 5:], mask[2, 3:] = 0, 0
    return ids * mask, mask


@pytest.mark.parametrize("name, num_beams", [(name, beams) for name in ["gpt2", "llama", "mistral", "t5", "bart"]
                                             for beams in (1, 3)] + [("deepseek-v2", 1), ("deepseek-v3", 3),
                                                                     ("qwen3", 3), ("phi3", 1), ("gpt-neo", 3),
                                                                     ("openai-gpt", 1), ("qwen3-moe", 1),
                                                                     ("qwen2-moe", 3), ("gpt-neox", 3), ("gptj", 1),
                                                                     ("glm", 1), ("glm4", 3), ("gpt-oss", 3),
                                                                     ("llama4", 3), ("llama4-interleaved", 1),
                                                                     ("deepseek-v32", 3), ("gemma2", 1), ("gemma3", 3), ("t5gemma", 1), ("mt5", 3),
                                                                     ("m2m100", 1), ("m2m100", 3), ("mbart", 3),
                                                                     ("marian", 1), ("marian", 3),
                                                                     ("marian-separate", 1), ("pegasus", 3)])
def test_token_identical_to_transformers(name, num_beams, tmp_path):
    save_checkpoint(name, tmp_path)
    model, reference = jf.from_pretrained(tmp_path), reference_model(tmp_path)
    ids, mask = _batch(model.config.family, np.random.default_rng(0))
    kwargs = dict(max_new_tokens=10, num_beams=num_beams, do_sample=False, length_penalty=1.0)
    if name == "bart":
        kwargs["forced_eos_token_id"] = 2
    if name in ("m2m100", "mbart"):  # translation: the target language's token forced after the decoder start
        kwargs["forced_bos_token_id"] = 7

    def theirs(**changes):
        with torch.no_grad():
            return reference.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), **kwargs,
                                      **changes).numpy()

    # The free runs below are transformers': ours would be one more compile each (the token ids are static), and
    # the runs compared after them are token-identical only where the free runs agree.
    if name.startswith("marian"):  # OPUS-MT's generation_config: its pad a bad word, beams scored renormalised;
        # a token the free run emits is banned too, so that the ban changes the output
        banned = int(theirs()[0, 2])
        _rewrite(tmp_path, "generation_config.json", bad_words_ids=[[1], [banned]], renormalize_logits=True)
        model, reference = jf.from_pretrained(tmp_path), reference_model(tmp_path)
        assert model.generation_config and banned not in model.generate(ids, mask, **kwargs)
    # Make EOS happen: take a token the free run emits early, so stopping, padding and (for beams)
    # finished hypotheses are all exercised.
    start = ids.shape[1] if model.config.family == "decoder" else 1
    kwargs["eos_token_id"] = int(theirs()[0, start + 2])
    # All three stopping rules on one model per family; the default elsewhere (each is a new compile).
    rules = [False, True, "never"] if num_beams > 1 and name in ("gpt2", "t5") else [False]
    for early_stopping in rules:
        ours = model.generate(ids, mask, early_stopping=early_stopping, **kwargs)
        expected = theirs(early_stopping=early_stopping)
        assert ours.shape == expected.shape, (early_stopping, ours, expected)
        np.testing.assert_array_equal(ours, expected, err_msg=f"early_stopping={early_stopping}")


def _rewrite(folder, name, **changes):
    import json

    path = folder / name
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(changes)
    data = {k: v for k, v in data.items() if v is not _DROP}
    path.write_text(json.dumps(data))


_DROP = object()


def test_token_ids_left_out_or_none_follow_transformers(tmp_path):
    """The token-id arguments as transformers' generate() reads them: left out, the checkpoint's
    (generation_config.json's when it has one, config.json's otherwise); None, none at all; forced EOS from
    the checkpoint applied. Token-identical to transformers in each case, and save_pretrained keeps them."""
    save_checkpoint("llama", tmp_path / "ckpt")
    folder = tmp_path / "ckpt"
    ids, mask = _batch("decoder", np.random.default_rng(0))
    free = jf.from_pretrained(folder).generate(ids, mask, max_new_tokens=10, eos_token_id=None)
    early, later = int(free[0, ids.shape[1] + 1]), int(free[2, ids.shape[1] + 3])
    # config.json stops at `later`; generation_config.json, which wins in transformers, at `early` or `later`
    _rewrite(folder, "config.json", eos_token_id=later)
    _rewrite(folder, "generation_config.json", eos_token_id=[early, later])
    cases = [({}, "generation_config.json's two EOS ids"), ({"eos_token_id": None}, "an explicit None: no EOS"),
             ({"eos_token_id": later}, "an explicit id")]
    results = {}
    for source in ("generation_config.json", "config.json"):
        if source == "config.json":  # no generation_config.json: config.json's ids, forced EOS included
            (folder / "generation_config.json").unlink()
            _rewrite(folder, "config.json", forced_eos_token_id=early)
            cases = [({}, "config.json's EOS and forced EOS"), ({"forced_eos_token_id": None}, "forcing turned off")]
        model, reference = jf.from_pretrained(folder), reference_model(folder)
        for kwargs, what in cases:
            ours = model.generate(ids, mask, max_new_tokens=10, **kwargs)
            with torch.no_grad():
                theirs = reference.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                                            max_new_tokens=10, do_sample=False, **kwargs).numpy()
            np.testing.assert_array_equal(ours, theirs, err_msg=f"{source}: {what}")
            results[what] = ours
    for a, b in [("generation_config.json's two EOS ids", "an explicit id"),
                 ("an explicit id", "an explicit None: no EOS"),
                 ("config.json's EOS and forced EOS", "forcing turned off")]:
        assert not np.array_equal(results[a], results[b]), (a, b)  # each setting changes the tokens here
    model.save_pretrained(tmp_path / "saved")
    again = jf.from_pretrained(tmp_path / "saved")
    assert gen.generation_defaults(again) == gen.generation_defaults(model)


def test_an_encoder_decoder_without_a_decoder_start_starts_from_bos(tmp_path):
    """transformers falls back to BOS when no decoder start is set, and refuses when neither is."""
    save_checkpoint("bart", tmp_path)
    for name in ("config.json", "generation_config.json"):
        _rewrite(tmp_path, name, decoder_start_token_id=_DROP)
    model, reference = jf.from_pretrained(tmp_path), reference_model(tmp_path)
    ids, mask = _batch("encoder_decoder", np.random.default_rng(0))
    ours = model.generate(ids, mask, max_new_tokens=4)
    with torch.no_grad():
        theirs = reference.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), max_new_tokens=4,
                                    do_sample=False, num_beams=1).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert (ours[:, 0] == model.config.tokens.bos).all()
    for name in ("config.json", "generation_config.json"):
        _rewrite(tmp_path, name, bos_token_id=_DROP)
    reference = reference_model(tmp_path)
    with pytest.raises(ValueError, match="decoder_start_token_id` or `bos_token_id"):
        reference.generate(torch.as_tensor(ids), max_new_tokens=4)
    with pytest.raises(ValueError, match="needs decoder_start_token_id or bos_token_id"):
        jf.from_pretrained(tmp_path).generate(ids, mask, max_new_tokens=4)


# --------------------------------------------------------------------------------------------------
# Arguments and outputs that would otherwise go wrong silently


def test_numpy_integers_are_accepted_as_integer_arguments(llama):
    expected = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=3, num_beams=2)
    got = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=np.int64(3), num_beams=np.int32(2), seed=np.int64(0))
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("ids, message", [([[1, 2, 3], [4, 5]], r"rows have shapes \(2,\), \(3,\)"),
                                          (np.zeros((0, 4), np.int32), "has no rows")], ids=["ragged", "empty"])
def test_ragged_or_empty_batches_are_refused_before_compiling(llama, ids, message):
    traces = gen.TRACE_COUNT["generate"]
    with pytest.raises(ValueError, match=message):
        llama.generate(ids, max_new_tokens=2)
    with pytest.raises(ValueError, match=message):
        llama(ids)
    assert gen.TRACE_COUNT["generate"] == traces


@pytest.mark.parametrize("num_beams", [1, 2])
def test_non_finite_logits_are_refused_not_turned_into_token_0(num_beams):
    model = jf.build("tiny-llama")
    model.decoder.final_norm.scale[...] = jnp.full_like(model.decoder.final_norm.scale[...], jnp.nan)
    with pytest.raises(ValueError, match="NaN or Inf logits at generation step 0"):
        model.generate(PROMPT, PROMPT_MASK, max_new_tokens=3, num_beams=num_beams)


def test_a_temperature_too_small_to_divide_by_samples_the_greedy_token(llama):
    """Logits / 2e-38 overflow float32 (inf - inf = NaN made every draw token 0); shifted by their max
    first, the top token stays at 0 and the others go to -inf: the greedy choice."""
    greedy = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=5)
    for seed in range(3):
        sampled = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=5, do_sample=True, temperature=2e-38, seed=seed)
        np.testing.assert_array_equal(sampled, greedy)


def test_a_prompt_longer_than_the_model_is_named_as_the_problem():
    """No max_new_tokens helps a prompt that already fills the position table: the error says so, not
    'lower max_new_tokens to at most -N'."""
    gpt = jf.build("tiny-gpt")  # learned positions: 128
    for length, verb in ((130, "exceeds"), (128, "fills")):
        with pytest.raises(ValueError, match=rf"the prompt itself \({length} tokens\) {verb} the positions of "
                                             r"'tiny-gpt', which has 128 positions; shorten it to at most 127"):
            gpt.generate(np.ones((1, length), np.int32), max_new_tokens=4)
    with pytest.raises(ValueError, match="needs 131 positions but 'tiny-gpt' has 128 positions; lower "
                                         "max_new_tokens to at most 3"):
        gpt.generate(np.ones((1, 125), np.int32), max_new_tokens=6)


def test_sampling_settings_without_sampling_are_ignored_with_a_warning(llama):
    """As transformers: temperature, top_k and top_p are only read when sampling; given without it they
    change nothing, and the caller is told."""
    greedy = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=3)
    with pytest.warns(UserWarning, match=r"do_sample is not set, so \w+=\S+ is ignored") as caught:
        ignored = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=3, temperature=-1, top_k=5, top_p=0.5)
    told = [str(w.message) for w in caught if "do_sample is not set" in str(w.message)]  # (not JAX's own warnings)
    assert {message.split(" is ignored")[0].split("so ")[1] for message in told} == {
        "temperature=-1.0", "top_k=5", "top_p=0.5"}
    np.testing.assert_array_equal(ignored, greedy)


def test_unbounded_generation_is_refused_before_anything_is_allocated(llama, monkeypatch):
    limit = llama.config.max_positions
    with pytest.raises(ValueError, match=f"needs {4 + 100_000} positions .* configured for {limit} .*"
                                         "allow_beyond_max_positions=True"):
        llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=100_000)
    monkeypatch.setattr(gen, "free_memory", lambda: 2**30)  # 1 GiB free
    with pytest.raises(ValueError, match=r"the KV cache for 2 rows x 10000003 tokens needs .* GiB \(.* bytes\) but "
                                         r"1.0 GiB are free"):
        llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=10_000_000, allow_beyond_max_positions=True)
    # Allowed and small enough: rotary positions run past max_positions.
    out = llama.generate(PROMPT, PROMPT_MASK, max_new_tokens=limit, allow_beyond_max_positions=True)
    assert out.shape[1] > limit


@pytest.mark.parametrize("num_beams", [1, 3])
def test_each_row_may_force_its_own_first_token(num_beams, tmp_path):
    """``first_tokens`` (a batch translated into several languages, the eval step's forcing): each row is what
    forcing its token on the whole batch gives that row."""
    save_checkpoint("m2m100", tmp_path)
    model = jf.from_pretrained(tmp_path)
    ids, mask = _batch("encoder_decoder", np.random.default_rng(0))
    graphdef, state = jf.split(model)
    config = gen.GenerationConfig(max_new_tokens=6, num_beams=num_beams, eos_token_ids=(2,), pad_token_id=1,
                                  decoder_start_token_id=2)
    run = lambda first: np.asarray(gen.generate_tokens_jit(graphdef, state, jnp.asarray(ids), jnp.asarray(mask),  # noqa: E731
                                                           jax.random.key(0), config, first)[0])
    languages = np.array([7, 9, 7][:len(ids)], np.int32)
    mixed = run(jnp.asarray(languages))
    for token in (7, 9):
        alone = run(jnp.full(len(ids), token, jnp.int32))
        np.testing.assert_array_equal(mixed[languages == token], alone[languages == token])
        assert (alone[:, 0] == token).all()


@pytest.mark.parametrize("name, num_beams", [("t5", 1), ("bart", 3)])
def test_a_decoder_prompt_of_several_tokens_matches_transformers(name, num_beams, tmp_path):
    """decoder_input_ids [B, P] (the start token and forced words, as Whisper's prompt is): the prefill runs them
    all; the output starts with them, as transformers' does."""
    save_checkpoint(name, tmp_path)
    model, reference = jf.from_pretrained(tmp_path), reference_model(tmp_path)
    ids, mask = _batch("encoder_decoder", np.random.default_rng(0))
    start = model.generate(ids[:1], mask[:1], max_new_tokens=1)[0, 0]
    prompt = np.concatenate([np.full((3, 1), start), np.random.default_rng(1).integers(3, 97, (3, 3))], axis=1)
    kwargs = dict(max_new_tokens=8, num_beams=num_beams, do_sample=False)
    ours = model.generate(ids, mask, decoder_input_ids=prompt, **kwargs)
    with torch.no_grad():
        theirs = reference.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                                    decoder_input_ids=torch.as_tensor(prompt), **kwargs).numpy()
    np.testing.assert_array_equal(ours, theirs)
    with pytest.raises(ValueError, match="one prompt per row"):
        model.generate(ids, mask, decoder_input_ids=prompt[:2], **kwargs)
