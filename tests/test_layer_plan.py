"""The layer plan (what each layer is, computed once) and OLMo-2's two block features: the output norm
(x + norm(f(x))) and the query/key norm over the whole projection, each checked against its formula."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer.cache import SplitKVCache
from jaxformer.cli import main as cli_main
from jaxformer.layer_plan import LayerPlan, Segment, layer_plan, stack_plans
from jaxformer.layers.attention import Attention, visibility_mask
from jaxformer.layers.stack import Block, LayerInputs

OLMO2_LIKE = dict(norm_position="output", qk_norm=True, qk_norm_span="projection")


def randomized(module: nnx.Module, seed: int = 1) -> nnx.Module:
    """``module`` with every parameter drawn at random (norm scales away from 1, so a missing norm shows)."""
    graphdef, state = nnx.split(module)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [1.0 + 0.3 * jax.random.normal(k, a.shape) for k, a in zip(keys, leaves)]
    return nnx.merge(graphdef, jax.tree.unflatten(tree, leaves))


def rms_norm(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def test_projection_qk_norm_is_one_rms_norm_over_all_heads():
    cfg = jf.config("tiny-llama").replace(qk_norm=True, qk_norm_span="projection")
    N, K, H = cfg.num_heads, cfg.kv_heads, cfg.head_dim_
    attn = randomized(Attention(cfg, rngs=nnx.Rngs(0)))
    assert attn.q_norm.scale.shape == (N, H) and attn.k_norm.scale.shape == (K, H)
    x = np.asarray(jax.random.normal(jax.random.key(2), (2, 5, cfg.d_model)))
    T = x.shape[1]
    positions = jnp.broadcast_to(jnp.arange(T), (2, T))
    out, _, _ = attn(jnp.asarray(x), mask=visibility_mask("causal", positions, positions))

    weight = lambda name: np.asarray(getattr(attn, name)[...])  # noqa: E731
    q = rms_norm(np.einsum("btd,dnh->btnh", x, weight("q")).reshape(2, T, N * H),
                 np.asarray(attn.q_norm.scale[...]).reshape(-1), cfg.norms.eps).reshape(2, T, N, H)
    k = rms_norm(np.einsum("btd,dkh->btkh", x, weight("k")).reshape(2, T, K * H),
                 np.asarray(attn.k_norm.scale[...]).reshape(-1), cfg.norms.eps).reshape(2, T, K, H)
    v = np.einsum("btd,dkh->btkh", x, weight("v"))
    k, v = np.repeat(k, N // K, axis=2), np.repeat(v, N // K, axis=2)
    scores = np.einsum("btnh,bsnh->bnts", q, k) * cfg.scale
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = np.einsum("btnh,nhd->btd", np.einsum("bnts,bsnh->btnh", probs, v), weight("o"))
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5, rtol=1e-5)


def test_output_norm_block_adds_the_normed_sublayer_outputs():
    cfg = jf.config("tiny-llama").replace(**OLMO2_LIKE)
    block = randomized(Block(cfg, layer_plan(cfg, "causal", 1)[0], rngs=nnx.Rngs(0)))
    assert block.attn_norm is None and block.mlp_norm is None  # OLMo-2 has no input norms
    x = jax.random.normal(jax.random.key(3), (2, 6, cfg.d_model))
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    inputs = LayerInputs(mask=visibility_mask("causal", positions, positions))
    out = block(x, inputs)[0]

    def norm(h, module):
        return rms_norm(np.asarray(h), np.asarray(module.scale[...]), cfg.norms.eps)

    after_attention = np.asarray(x) + norm(block.attn(x, mask=inputs.mask)[0], block.attn_post_norm)
    expected = after_attention + norm(block.mlp(jnp.asarray(after_attention), None), block.mlp_post_norm)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5, rtol=1e-5)


def test_olmo2_like_decoder_decodes_as_its_full_pass():
    """A decoder with both features: prefill then one cached step give the full pass's logits."""
    cfg = jf.config("tiny-llama").replace(**OLMO2_LIKE)
    model = randomized(jf.Decoder(cfg, rngs=nnx.Rngs(0)), seed=4)
    ids = jnp.array([[3, 4, 5, 6, 7, 8]])
    full = model(ids).logits
    state = model.init_cache(1, 8)
    ones = jnp.ones((1, 6), bool)
    first, state = model.step(ids[:, :5], jnp.arange(5)[None], ones[:, :5], state, every_position=True)
    last, _ = model.step(ids[:, 5:], jnp.arange(5, 6)[None], ones[:, 5:], state, every_position=True)
    np.testing.assert_allclose(np.concatenate([first, last], axis=1), full, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# The plan: what each layer of a published model is


def decoder_plan(name: str) -> LayerPlan:
    return stack_plans(jf.config(name))["decoder"]


def test_gemma3_plan_has_five_sliding_layers_to_each_full_one():
    plan = decoder_plan("gemma-3-1b")
    assert len(plan) == 26 and plan.period() == 6 and plan.apart() == 0
    for i, spec in enumerate(plan.layers):
        full = i % 6 == 5
        assert (spec.attention, spec.window, spec.rotary, spec.cache) == (
            ("causal", None, "global", "full") if full else ("sliding", 512, "local", "window"))
        assert (spec.group, spec.index, spec.feed_forward) == ("blocks", i, "dense")
    assert plan.windowed() == (tuple(i % 6 != 5 for i in range(26)), 512)
    # one scan over all 26 layers without a cache; a split cache's rings and full slots: period 6, 2 layers past
    assert plan.segments() == [Segment(0, 26, 1)] and plan.segments(split_cache=True) == [Segment(0, 26, 6)]


def test_maverick_plan_interleaves_dense_and_expert_layers_over_chunked_and_nope_ones():
    plan = decoder_plan("llama-4-maverick-17b-128e")
    assert plan.period() == 4 and plan.count("dense_blocks") == plan.count("blocks") == 24
    for i, spec in enumerate(plan.layers):
        full = i % 4 == 3
        assert (spec.attention, spec.window, spec.nope, spec.cache) == (
            ("causal", None, True, "full") if full else ("chunked", 8192, False, "window"))
        assert (spec.group, spec.index) == (("blocks", i // 2) if i % 2 else ("dense_blocks", i // 2))
        assert spec.feed_forward == ("experts+shared" if i % 2 else "dense")
    assert plan.segments() == [Segment(0, 48, 2)] and plan.segments(split_cache=True) == [Segment(0, 48, 4)]


def test_deepseek_v3_runs_its_three_dense_layers_apart():
    plan = decoder_plan("deepseek-v3")
    assert plan.apart() == 3 and plan.period() == 1
    assert [spec.group for spec in plan.layers[:4]] == ["dense_blocks"] * 3 + ["blocks"]
    assert {(spec.mixer, spec.cache) for spec in plan.layers} == {("latent", "latent")}
    assert plan.segments() == [Segment(0, 3, 1), Segment(3, 61, 1)]


@pytest.mark.parametrize("name, overrides, special", [("modernbert-base", {}, "unnormed attention"),
                                                     ("deberta-v3-base", {"conv_kernel_size": 3}, "convolution")])
def test_first_layer_specials_get_a_group_of_their_own(name, overrides, special):
    plan = stack_plans(jf.config(name).replace(**overrides))["encoder"]
    assert (plan[0].group, plan[0].special, plan[1].group, plan[1].index) == ("first_block", special, "blocks", 0)
    assert all(spec.cache == "none" for spec in plan.layers)


def test_albert_places_its_one_shared_layer_everywhere():
    plan = stack_plans(jf.config("albert-base-v2"))["encoder"]
    assert plan.count("blocks") == 1 and {spec.index for spec in plan.layers} == {0}


def test_mistral_windows_every_layer():
    assert decoder_plan("mistral-7b").windowed() == ((True,) * 32, 4096)


@pytest.mark.parametrize("name", ["tiny-deepseek", "tiny-gemma3", "tiny-t5gemma", "tiny-bert"])
def test_stack_block_groups_hold_what_the_plan_places(name):
    model = nnx.eval_shape(lambda: jf.build(jf.config(name)))
    for stack_name, plan in stack_plans(jf.config(name)).items():
        stack = getattr(model, stack_name)
        assert stack.plan == plan
        for group, blocks in stack.block_groups().items():
            assert jax.tree.leaves(nnx.state(blocks, nnx.Param))[0].shape[0] == plan.count(group)


def test_info_prints_the_layer_plan(capsys):
    assert cli_main(["info", "gemma-3-1b"]) == 0
    out = capsys.readouterr().out
    assert "decoder layer plan:" in out and "26 layers; period 6; parameters: blocks 26" in out


# --------------------------------------------------------------------------------------------------
# The runner: one code path, scanned by period or unrolled, with or without a split cache


def maverick_like(layers: int = 10) -> jf.ModelConfig:
    """Llama 4 Maverick's layout at toy size: dense and expert layers in turn, three chunked layers to each
    full NoPE one; 10 layers: two whole periods of 4, then 2 past them."""
    return jf.config("llama-4-maverick-17b-128e").replace(
        d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, d_ff=128, expert_d_ff=32, num_experts=4,
        decoder_layers=layers, vocab_size=256, max_positions=128, attention_chunk_size=4, temperature_floor_scale=4,
        layer_types=tuple("full" if (i + 1) % 4 == 0 else "chunked" for i in range(layers)),
        nope_layers=tuple(i for i in range(layers) if (i + 1) % 4 == 0), bos_token_id=0, eos_token_id=1,
        pad_token_id=2)


def test_scanned_periods_unrolled_layers_and_a_split_cache_agree():
    cfg = maverick_like()
    scanned = randomized(jf.Decoder(cfg, rngs=nnx.Rngs(0)), seed=5)
    unrolled = nnx.merge(nnx.graphdef(jf.Decoder(cfg.replace(scan_layers=False), rngs=nnx.Rngs(0))),
                         nnx.state(scanned))
    ids = jax.random.randint(jax.random.key(6), (2, 11), 3, 256)
    full = jax.jit(lambda m, ids: m(ids).logits)(scanned, ids)
    np.testing.assert_allclose(jax.jit(lambda m, ids: m(ids).logits)(unrolled, ids), full, atol=1e-5, rtol=1e-5)
    state = scanned.init_cache(2, 16)  # longer than the chunk: rings for the chunked layers
    assert isinstance(state.kv, SplitKVCache)
    ones = jnp.ones((2, 11), bool)
    positions = jnp.broadcast_to(jnp.arange(11), (2, 11))
    step = jax.jit(lambda m, ids, at, valid, state: m.step(ids, at, valid, state, every_position=True))
    first, state = step(scanned, ids[:, :7], positions[:, :7], ones[:, :7], state)
    logits = [first]
    for t in range(7, 11):
        last, state = step(scanned, ids[:, t:t + 1], positions[:, t:t + 1], ones[:, t:t + 1], state)
        logits.append(last)
    np.testing.assert_allclose(np.concatenate(logits, axis=1), full, atol=1e-5, rtol=1e-5)
