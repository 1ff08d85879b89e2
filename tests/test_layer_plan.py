"""The layer plan (what each layer is, computed once) and OLMo-2's two block features: the output norm
(x + norm(f(x))) and the query/key norm over the whole projection, each checked against its formula."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxformer as jf
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
                 np.asarray(attn.q_norm.scale[...]).reshape(-1), cfg.norm_eps).reshape(2, T, N, H)
    k = rms_norm(np.einsum("btd,dkh->btkh", x, weight("k")).reshape(2, T, K * H),
                 np.asarray(attn.k_norm.scale[...]).reshape(-1), cfg.norm_eps).reshape(2, T, K, H)
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
    block = randomized(Block(cfg, rngs=nnx.Rngs(0)))
    assert block.attn_norm is None and block.mlp_norm is None  # OLMo-2 has no input norms
    x = jax.random.normal(jax.random.key(3), (2, 6, cfg.d_model))
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    inputs = LayerInputs(mask=visibility_mask("causal", positions, positions))
    out = block(x, inputs)[0]

    def norm(h, module):
        return rms_norm(np.asarray(h), np.asarray(module.scale[...]), cfg.norm_eps)

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
