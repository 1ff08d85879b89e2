"""Reference-free properties of the three families, on tiny float32 models.

Who-sees-whom is measured with derivatives: the Jacobian block d out[t] / d in[t'] is exactly
zero where attention is masked (masked scores are float32-min, whose softmax weight underflows to
0) and non-zero where information can flow. Everything else compares two ways of computing the same
thing (jit/eager, scan/unrolled, remat/no remat, padded/unpadded, cached/full) to 1e-6.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from flax import nnx

import jaxformer as jf
from jaxformer.layer_plan import local_layers
from jaxformer.layers import (Attention, ExpertWeights, MoE, Routing, Unit, apply_rope, dense_experts, dropout,
                              grouped_experts, ragged_experts, rope_angles, rope_frequencies, route, visibility_mask)
from conftest import call, dependency, embeds, jitted, tiny_config, tiny_model, token_ids

TOL = dict(atol=1e-6, rtol=1e-6)


def causal(T: int) -> np.ndarray:
    return np.tril(np.ones((T, T), bool))


def assert_pattern(dep: np.ndarray, expected: np.ndarray):
    """Dependency must be exactly zero where ``expected`` is False and non-zero where True."""
    assert dep.shape == expected.shape
    leaks = np.argwhere((dep != 0) & ~expected)
    missing = np.argwhere((dep == 0) & expected)
    assert leaks.size == 0, f"output t depends on forbidden input t' at (t, t') = {leaks.tolist()}"
    assert missing.size == 0, f"output t does not depend on allowed input t' at (t, t') = {missing.tolist()}"


# ==================================================================================================
# Causality by gradients
#
# Module-level output functions (not lambdas) so each model's Jacobian compiles once.


def _decoder_logits(model, x, *args):
    return model(inputs_embeds=x).logits


def _prefix_logits(model, x, lengths):
    return model(inputs_embeds=x, prefix_lengths=lengths).logits


def _encoder_hidden(model, x):
    return model(inputs_embeds=x).last_hidden_state


def _seq2seq_both_sides(model, src, tgt):
    out = model(inputs_embeds=src, decoder_inputs_embeds=tgt)
    return out.encoder_last_hidden_state, out.logits


def _grid(T_out: int, T_in: int | None = None):
    return np.arange(T_out)[:, None], np.arange(T_in or T_out)[None, :]


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama", "tiny-transformer-xl"])
def test_decoder_only_is_causal(name):
    model = tiny_model(name)
    dep = dependency(model, _decoder_logits, embeds(2, 7, model.config.d_model))
    for row in dep:
        assert_pattern(row, causal(7))


@pytest.mark.parametrize("name", ["tiny-t5", "tiny-transformer"])
def test_encoder_decoder_who_sees_whom(name):
    # One Jacobian of (encoder output, decoder logits) w.r.t. (source, target) embeddings.
    model = tiny_model(name)
    S, T, D = 5, 6, model.config.d_model
    (enc_src, enc_tgt), (dec_src, dec_tgt) = dependency(model, _seq2seq_both_sides,
                                                        (embeds(2, S, D, seed=1), embeds(2, T, D, seed=2)))
    for b in range(2):
        assert_pattern(enc_src[b], np.ones((S, S), bool))  # encoder: bidirectional
        assert_pattern(enc_tgt[b], np.zeros((S, T), bool))  # the encoder never sees the target
        assert_pattern(dec_src[b], np.ones((T, S), bool))  # cross-attention: every source position
        assert_pattern(dec_tgt[b], causal(T))  # decoder self-attention: causal


def test_encoder_is_bidirectional():
    model = tiny_model("tiny-bert")
    for row in dependency(model, _encoder_hidden, embeds(2, 6, model.config.d_model, seed=5)):
        assert_pattern(row, np.ones((6, 6), bool))


def test_prefix_lm():
    # Inside the prefix every position sees the whole prefix; after it, causal. One row per
    # prefix length: none (plain causal), part of the sequence, all of it (bidirectional).
    T, prefixes = 7, [0, 3, 7]
    model = tiny_model("tiny-gpt", attention="prefix")
    dep = dependency(model, _prefix_logits, embeds(3, T, 64, seed=8), jnp.array(prefixes))
    t, s = _grid(T)
    for row, prefix in zip(dep, prefixes):
        assert_pattern(row, (s <= t) | (s < prefix))


def _silence_attention(model, layer: int | None):
    """The model's state with one layer's attention output projection zeroed: that layer then
    moves no information between positions, and the other layers' masks show alone."""
    state = nnx.state(model)
    if layer is not None:
        o = state["decoder"]["blocks"]["attn"]["o"]
        state["decoder"]["blocks"]["attn"]["o"] = o.replace(o[...].at[layer].set(0.0))
    return state


@pytest.mark.parametrize("silenced, reach", [(1, 3), (None, 5)], ids=["one-layer", "two-layers"])
def test_sliding_window_receptive_field(silenced, reach):
    # Window 3 (Mistral-style, rotary): one layer sees (t-3, t]; two layers see (t-5, t], each hop
    # adding window - 1. "One layer" is layer 0 alone, layer 1's attention silenced.
    T = 9
    model = tiny_model("tiny-llama", attention="sliding", window_size=3)
    t, s = _grid(T)
    for row in dependency(model, _decoder_logits, embeds(1, T, 64, seed=9), state=_silence_attention(model, silenced)):
        assert_pattern(row, (s <= t) & (s > t - reach))


@pytest.mark.parametrize("silenced, expected", [(1, "causal"), (0, "local"), (None, "causal")],
                         ids=["layer0-only", "layer1-only", "both-layers"])
def test_alternating_layers_dense_then_local(silenced, expected):
    # GPT-3 alternation (window 2): layer 0 alone is dense (sees everything to its left, far beyond
    # the window), layer 1 alone is local, and both together are dense again.
    T, window = 7, 2
    model = tiny_model("tiny-gpt", attention="alternating", window_size=window)
    t, s = _grid(T)
    pattern = causal(T) if expected == "causal" else (s <= t) & (s > t - window)
    for row in dependency(model, _decoder_logits, embeds(1, T, 64, seed=11), state=_silence_attention(model, silenced)):
        assert_pattern(row, pattern)


# ==================================================================================================
# visibility_mask


def _mask(pattern, q, k, valid=None, **kw):
    q = jnp.asarray(q)[None]
    k = jnp.asarray(k)[None]
    valid = None if valid is None else jnp.asarray(valid)[None]
    out = visibility_mask(pattern, q, k, valid, **kw)
    chex.assert_shape(out, (1, 1, q.shape[1], k.shape[1]))
    assert out.dtype == jnp.bool_
    return np.asarray(out[0, 0])


def test_visibility_mask_patterns():
    p = np.arange(6)
    t, s = p[:, None], p[None, :]
    np.testing.assert_array_equal(_mask("bidirectional", p, p), np.ones((6, 6), bool))
    np.testing.assert_array_equal(_mask("causal", p, p), s <= t)
    np.testing.assert_array_equal(_mask("sliding", p, p, window=2), (s <= t) & (s > t - 2))
    np.testing.assert_array_equal(_mask("sliding", p, p, window=1), s == t)
    np.testing.assert_array_equal(_mask("sliding", p, p, window=6), s <= t)
    np.testing.assert_array_equal(_mask("prefix", p, p, prefix_lengths=jnp.array([3])), (s <= t) | (s < 3))


def test_visibility_mask_key_validity_and_cache_positions():
    # Keys marked invalid are hidden from every query (padding), whatever the pattern.
    p = np.arange(5)
    valid = np.array([1, 1, 1, 0, 1])
    for pattern in ("bidirectional", "causal"):
        m = _mask(pattern, p, p, valid)
        assert not m[:, 3].any()
        np.testing.assert_array_equal(np.delete(m, 3, axis=1), np.delete(_mask(pattern, p, p), 3, axis=1))
    # Queries at absolute positions 4..5 against a 8-slot cache: keys beyond the query are hidden.
    m = _mask("causal", np.array([4, 5]), np.arange(8))
    np.testing.assert_array_equal(m, np.arange(8)[None, :] <= np.array([4, 5])[:, None])
    m = _mask("sliding", np.array([4, 5]), np.arange(8), window=2)
    np.testing.assert_array_equal(m, np.array([[0, 0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1, 0, 0]], bool))


def test_visibility_mask_batched_prefix_lengths():
    p = jnp.broadcast_to(jnp.arange(4), (2, 4))
    m = np.asarray(visibility_mask("prefix", p, p, prefix_lengths=jnp.array([0, 2]))[:, 0])
    t, s = np.arange(4)[:, None], np.arange(4)[None, :]
    np.testing.assert_array_equal(m[0], s <= t)
    np.testing.assert_array_equal(m[1], (s <= t) | (s < 2))


# ==================================================================================================
# Padding invariance
#
# Unpadded batch [2, T] against the same rows right-padded to [2, T + 3] with attention_mask zeros;
# then, at the padded shape (no new compilation), ragged rows and junk in the padded slots.


def _pad(ids: jax.Array, extra: int, seed: int, lengths=None):
    """Right-pad ``ids`` by ``extra`` junk tokens; mask real tokens (first ``lengths[b]`` of row b)."""
    B, T = ids.shape
    lengths = [T] * B if lengths is None else lengths
    junk = token_ids(B, T + extra, seed=seed)
    mask = (np.arange(T + extra)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    padded = jnp.where(mask == 1, jnp.pad(ids, ((0, 0), (0, extra))), junk)
    return padded, jnp.asarray(mask)


def _real(x, mask) -> np.ndarray:
    return np.asarray(x)[np.asarray(mask, bool)]


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-bert"])
def test_right_padding_does_not_change_real_positions(name):
    model = jitted(tiny_model(name))
    ids = token_ids(2, 6, seed=12)
    plain = model(ids, None)
    padded, mask = _pad(ids, 3, seed=13)
    out = model(padded, mask)
    chex.assert_trees_all_close(out.last_hidden_state[:, :6], plain.last_hidden_state, **TOL)
    if plain.logits is not None:
        chex.assert_trees_all_close(out.logits[:, :6], plain.logits, **TOL)
    if plain.pooler_output is not None:
        chex.assert_trees_all_close(out.pooler_output, plain.pooler_output, **TOL)

    # What sits in the padded slots is irrelevant: other junk, and ragged rows (row 1 has 2 real tokens)
    for lengths in ([6, 6], [6, 2]):
        a, mask = _pad(ids, 3, seed=14, lengths=lengths)
        b, _ = _pad(ids, 3, seed=15, lengths=lengths)
        assert (a != b).any()
        chex.assert_trees_all_close(_real(model(a, mask).last_hidden_state, mask),
                                    _real(model(b, mask).last_hidden_state, mask), **TOL)
    if model.config.family == "encoder":
        # ...but the mask matters: unmasked junk changes a bidirectional encoder's outputs.
        assert not np.allclose(_real(model(a, jnp.ones_like(mask)).last_hidden_state, mask),
                               _real(model(a, mask).last_hidden_state, mask), atol=1e-4)


def test_right_padding_encoder_decoder():
    model = jitted(tiny_model("tiny-t5"))
    src, tgt = token_ids(2, 6, seed=16), token_ids(2, 4, seed=17)
    plain = model(src, None, tgt, None)
    src_pad, src_mask = _pad(src, 3, seed=18)
    tgt_pad, tgt_mask = _pad(tgt, 2, seed=19)
    out = model(src_pad, src_mask, tgt_pad, tgt_mask)
    chex.assert_trees_all_close(out.encoder_last_hidden_state[:, :6], plain.encoder_last_hidden_state, **TOL)
    chex.assert_trees_all_close(out.logits[:, :4], plain.logits, **TOL)

    # ragged rows, different junk in the padded slots of both streams
    runs = []
    for seed in (20, 21):
        s, s_mask = _pad(src, 3, seed=seed, lengths=[6, 2])
        t, t_mask = _pad(tgt, 2, seed=seed + 10, lengths=[4, 1])
        o = model(s, s_mask, t, t_mask)
        runs.append((_real(o.encoder_last_hidden_state, s_mask), _real(o.logits, t_mask)))
    chex.assert_trees_all_close(runs[0], runs[1], **TOL)


def test_moe_padding_invariance_and_aux_loss():
    # Routing is per token, and the load-balancing statistics count real tokens only.
    model = jitted(tiny_model("tiny-mixtral"))
    ids = token_ids(2, 6, seed=12)
    padded, mask = _pad(ids, 3, seed=13)
    plain, out = model(ids, None), model(padded, mask)
    chex.assert_trees_all_close(out.logits[:, :6], plain.logits, **TOL)
    a, b = plain.aux_loss, out.aux_loss
    chex.assert_trees_all_close(a, b, **TOL)
    unmasked = model(padded, jnp.ones_like(mask)).aux_loss
    assert not np.allclose(a, unmasked, atol=1e-6), "padding tokens should count when unmasked"


# ==================================================================================================
# jit == eager, scan == unrolled, remat == none, bfloat16 ~ float32


def _pure_forward(model):
    graphdef, state = jf.split(model)
    family = model.config.family

    def forward(state, ids):
        m = jf.merge(graphdef, state)
        out = m(ids, decoder_input_ids=ids[:, :4]) if family == "encoder_decoder" else m(ids)
        return out.logits if out.logits is not None else out.last_hidden_state

    return forward, state


class JitEqualsEagerTest(chex.TestCase):
    """The pure (split/merge) forward, jitted and not, equals the plain eager call."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("tiny-bert", "tiny-llama", "tiny-t5")  # one per family
    def test_pure_forward(self, name):
        # The reference is the model's own call under jit; the without_jit variant runs the pure
        # forward eagerly (op by op), so with_jit/without_jit together check jit == eager.
        model = tiny_model(name)
        ids = token_ids(2, 6, seed=19)
        direct = call(model, ids, dec_ids=ids[:, :4])
        expected = direct.logits if direct.logits is not None else direct.last_hidden_state
        forward, state = _pure_forward(model)
        got = self.variant(forward)(state, ids)
        chex.assert_shape(got, expected.shape)
        chex.assert_tree_all_finite(got)
        chex.assert_trees_all_close(got, expected, **TOL)


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-llama", "tiny-t5"])
def test_op_by_op_equals_compiled(name):
    """A concrete call compiles the forward (public_call); under jax.disable_jit the same
    call runs op by op. Both must agree."""
    model = tiny_model(name)
    ids = token_ids(2, 6, seed=19)
    kwargs = {"decoder_input_ids": ids[:, :4]} if model.config.family == "encoder_decoder" else {}
    compiled = model(ids, **kwargs)
    with jax.disable_jit():
        eager = model(ids, **kwargs)
    chex.assert_trees_all_close(eager.last_hidden_state, compiled.last_hidden_state, **TOL)


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-t5", "tiny-mixtral", "tiny-transformer-xl"])
def test_scan_equals_unrolled(name):
    scanned = tiny_model(name)
    unrolled = tiny_model(name, scan_layers=False)
    # Same seed, same parameters: the layout does not depend on scan_layers.
    chex.assert_trees_all_equal(nnx.state(scanned, nnx.Param), nnx.state(unrolled, nnx.Param))
    ids = token_ids(2, 6, seed=20)
    a = call(scanned, ids, dec_ids=ids[:, :4], output_hidden_states=True)
    b = call(unrolled, ids, dec_ids=ids[:, :4], output_hidden_states=True)
    chex.assert_trees_all_close(a, b, **TOL)


def _loss_and_grads(model, ids):
    """(loss, logits), gradients w.r.t. every parameter, and the jaxpr of the gradient step."""
    graphdef, state = jf.split(model)

    def loss(state):
        out = call(jf.merge(graphdef, state), ids, dec_ids=ids, jit=False)
        logp = jax.nn.log_softmax(out.logits.astype(jnp.float32))
        nll = -jnp.mean(jnp.take_along_axis(logp[:, :-1], ids[:, 1:, None], axis=-1))
        return nll + (0.0 if out.aux_loss is None else out.aux_loss), out.logits

    step = jax.value_and_grad(loss, has_aux=True)
    (value, logits), grads = jax.jit(step)(state)
    return (value, logits), grads, jax.make_jaxpr(step)(state)


@functools.lru_cache(maxsize=None)
def _remat_case(scan: bool, policy: str):
    return _loss_and_grads(tiny_model("tiny-gpt", scan_layers=scan, remat=policy), token_ids(2, 6, seed=21))


@pytest.mark.parametrize("scan, policy", [(True, "full"), (True, "dots"), (False, "qkv_mlp"), (True, "offload")],
                         ids=["scan-full", "scan-dots", "unrolled-qkv_mlp", "scan-offload"])
def test_remat_equals_no_remat(scan, policy):
    # Reference: scanned, no remat (scan == unrolled is tested on its own above). Every policy is
    # covered; the unrolled case checkpoints each layer separately.
    base_outputs, base_grads, base_jaxpr = _remat_case(True, "none")
    outputs, grads, jaxpr = _remat_case(scan, policy)
    assert "remat" not in str(base_jaxpr)
    assert "remat" in str(jaxpr), f"remat={policy!r} did not wrap the layer body in jax.checkpoint"
    if policy == "offload":  # the named activations travel to host memory and back
        assert "MemorySpace.Host" in str(jaxpr)
    chex.assert_trees_all_close(outputs, base_outputs, **TOL)  # loss and logits
    chex.assert_trees_all_close(grads, base_grads, **TOL)
    # the gradient is a real one: every layer of the block stack receives signal
    q_grad = np.abs(np.asarray(grads["decoder"]["blocks"]["attn"]["q"][...]))
    assert (q_grad.max(axis=(1, 2, 3)) > 0).all(), "a layer got no gradient"


@pytest.mark.parametrize("policy", ["bfloat16-compute", "bfloat16-weights", "float16-weights"])
@pytest.mark.parametrize("name", ["tiny-bert", "tiny-llama", "tiny-t5"])  # one per family
def test_low_precision_close_to_float32(name, policy):
    # bfloat16-compute: float32 master parameters, bfloat16 matmuls (training). *-weights: parameters
    # stored in the low dtype too (inference). bfloat16 keeps 8 significant bits (unit roundoff
    # 2**-8 ~ 4e-3); these tiny models land at ~5e-3 to 8e-3 relative error (norm of the logit
    # difference over the norm of the float32 logits); float16 (11 bits) 7e-4 to 9e-4. The bounds
    # (2e-2, 4e-3) leave headroom over that and still fail if something runs well below that accuracy
    # (float16 overflow, a softmax or norm accumulated in low precision over long rows).
    dtype, weights = policy.split("-")
    ids = token_ids(2, 6, seed=22)
    f32 = call(tiny_model(name), ids, dec_ids=ids[:, :4])
    changes = {"dtype": dtype} if weights == "compute" else {"dtype": dtype, "param_dtype": dtype}
    low_model = tiny_model(name, **changes)
    low = call(low_model, ids, dec_ids=ids[:, :4])
    ref = f32.logits if f32.logits is not None else f32.last_hidden_state
    got = low.logits if low.logits is not None else low.last_hidden_state
    assert got.dtype == jnp.dtype(dtype)
    stored = jax.tree.leaves(nnx.state(low_model, nnx.Param))[0].dtype
    assert stored == (jnp.float32 if weights == "compute" else jnp.dtype(dtype))
    chex.assert_tree_all_finite(got)
    got, ref = np.asarray(got, np.float32), np.asarray(ref)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < (2e-2 if dtype == "bfloat16" else 4e-3), f"{policy} relative error {rel:.3g}"
    assert rel > 0  # it did compute in lower precision


# ==================================================================================================
# Hidden states


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-bert", "tiny-t5", "tiny-mixtral"])
def test_hidden_states_follow_hf_convention(name):
    model = tiny_model(name)
    cfg = model.config
    ids = token_ids(2, 6, seed=23)
    out = call(model, ids, dec_ids=ids[:, :4], output_hidden_states=True)
    stack_layers = cfg.encoder_layers if cfg.family == "encoder" else cfg.decoder_layers
    T = 4 if cfg.family == "encoder_decoder" else 6
    assert len(out.hidden_states) == stack_layers + 1
    for h in out.hidden_states:
        chex.assert_shape(h, (2, T, cfg.d_model))
    chex.assert_trees_all_equal(out.hidden_states[-1], out.last_hidden_state)
    if cfg.family == "encoder_decoder":
        assert len(out.encoder_hidden_states) == cfg.encoder_layers + 1
        chex.assert_trees_all_equal(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)
    # layers change the stream: consecutive entries differ
    for a, b in zip(out.hidden_states[:-1], out.hidden_states[1:]):
        assert not np.allclose(a, b)
    # off by default
    assert call(model, ids, dec_ids=ids[:, :4]).hidden_states is None


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-bert", "tiny-t5", "tiny-gemma"])
def test_attentions_are_the_visibility_pattern_as_distributions(name):
    """output_attentions: one [B, N, T, S] float32 array per layer whose valid rows sum to 1 and put no
    weight where the pattern hides a key (padding, the future, outside the window); asking for them
    changes nothing else, and the scanned and unrolled stacks return the same weights. (Each family's
    values are checked against transformers in test_hf_parity.)"""
    model = tiny_model(name, **({"window_size": 3} if name == "tiny-gemma" else {}))  # a window inside T
    cfg = model.config
    ids = token_ids(2, 6, seed=31, low=3)
    mask = np.ones((2, 6), np.int32)
    mask[1, 4:] = 0
    dec_ids = ids[:, :4]
    out = call(model, ids, mask, dec_ids=dec_ids, output_attentions=True)
    plain = call(model, ids, mask, dec_ids=dec_ids)
    chex.assert_trees_all_equal(out.last_hidden_state, plain.last_hidden_state)
    assert plain.attentions is None and plain.cross_attentions is None
    T = 4 if cfg.family == "encoder_decoder" else 6
    layers = cfg.encoder_layers if cfg.family == "encoder" else cfg.decoder_layers
    assert len(out.attentions) == layers
    for i, weights in enumerate(out.attentions):
        chex.assert_shape(weights, (2, cfg.num_heads, T, T))
        assert weights.dtype == jnp.float32
        chex.assert_trees_all_close(weights.sum(-1), jnp.ones((2, cfg.num_heads, T)), atol=1e-6)
        if cfg.family == "encoder":
            np.testing.assert_array_equal(np.asarray(weights[1, :, :, 4:]), 0.0)  # padded keys
        else:
            upper = np.triu(np.ones((T, T), bool), 1)
            assert not np.asarray(weights)[:, :, upper].any(), "a query attended to a later token"
            if cfg.attention == "alternating" and local_layers(cfg)[i]:
                band = np.tril(np.ones((T, T), bool), -cfg.window_size)
                assert not np.asarray(weights)[:, :, band].any(), "a sliding layer looked beyond its window"
    if cfg.family == "encoder_decoder":
        assert len(out.encoder_attentions) == cfg.encoder_layers and len(out.cross_attentions) == cfg.decoder_layers
        chex.assert_shape(out.cross_attentions[0], (2, cfg.num_heads, 4, 6))
        np.testing.assert_array_equal(np.asarray(out.cross_attentions[0][1, :, :, 4:]), 0.0)
    if name == "tiny-gpt":
        unrolled = call(jf.build(cfg.replace(scan_layers=False)), ids, mask, output_attentions=True)
        chex.assert_trees_all_close(unrolled.attentions, out.attentions, atol=1e-6)


def test_transformer_xl_attentions_span_memory_and_segment():
    model = tiny_model("tiny-transformer-xl")
    cfg = model.config
    first = model(token_ids(2, 5, seed=32), output_attentions=True)
    second = model(token_ids(2, 5, seed=33), memory=first.memory, output_attentions=True)
    M = first.memory.length
    chex.assert_shape(second.attentions[0], (2, cfg.num_heads, 5, M + 5))
    assert float(second.attentions[0][..., :M].sum()) > 0, "the second segment ignored its memory"
    own = np.asarray(second.attentions[0][..., M:])
    assert not own[:, :, np.triu(np.ones((5, 5), bool), 1)].any()


def test_first_hidden_state_is_the_embedding_output():
    model = tiny_model("tiny-gpt")  # learned positions, no embedding norm
    ids = token_ids(2, 6, seed=24)
    out = call(model, ids, output_hidden_states=True)
    expected = model.embed.table[...][ids] + model.embeddings.positions.table[...][:6][None]
    chex.assert_trees_all_close(out.hidden_states[0], expected, **TOL)


# ==================================================================================================
# Mixture of experts


def test_mixtral_output_and_aux_loss():
    out = call(tiny_model("tiny-mixtral"), token_ids(2, 6, seed=25))
    chex.assert_shape(out.logits, (2, 6, 256))
    chex.assert_tree_all_finite(out.logits)
    chex.assert_shape(out.aux_loss, ())
    assert float(out.aux_loss) > 0
    dense = call(tiny_model("tiny-llama"), token_ids(2, 6, seed=25))
    assert dense.aux_loss is None


def _jit_call(module, *args):
    graphdef, state = nnx.split(module)
    return jax.jit(lambda state, *args: nnx.merge(graphdef, state)(*args))(state, *args)


def _moe_reference(moe: MoE, x: np.ndarray, k: int) -> np.ndarray:
    """Softmax router, top-k, renormalised weights, weighted sum of SwiGLU experts (numpy, float64)."""
    router = np.asarray(moe.router[...], np.float64)
    wi, wg, wo = (np.asarray(p[...], np.float64) for p in (moe.wi, moe.wi_gate, moe.wo))
    x = np.asarray(x, np.float64)
    logits = x @ router
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            top = np.argsort(-probs[b, t])[:k]
            weights = probs[b, t, top] / probs[b, t, top].sum()
            assert np.isclose(weights.sum(), 1.0)
            for w, e in zip(weights, top):
                g = x[b, t] @ wg[e]
                h = g / (1 + np.exp(-g)) * (x[b, t] @ wi[e])
                out[b, t] += w * (h @ wo[e])
    return out


@pytest.mark.parametrize("k", [1, 2])
def test_moe_routing_matches_topk_reference(k):
    cfg = tiny_config("tiny-mixtral", experts_per_token=k)
    moe = MoE(cfg, rngs=nnx.Rngs(0))
    # larger router weights so the top-k choice is decisive and not a near-tie
    moe.router[...] = moe.router[...] * 50
    x = embeds(2, 5, cfg.d_model, seed=26)
    y, stats = _jit_call(moe, x)
    chex.assert_shape(y, x.shape)
    np.testing.assert_allclose(np.asarray(y), _moe_reference(moe, np.asarray(x), k), atol=1e-6, rtol=1e-4)
    chex.assert_shape((stats["load"], stats["prob"]), ((cfg.experts.count,), (cfg.experts.count,)))
    np.testing.assert_allclose(np.sum(stats["load"]), 1.0, rtol=1e-6)  # shares of the token-expert pairs
    np.testing.assert_allclose(np.sum(stats["prob"]), 1.0, rtol=1e-6)


def test_moe_combine_weights_sum_to_one():
    # With every expert identical, any convex combination of experts equals that one expert.
    cfg = tiny_config("tiny-mixtral")
    moe = MoE(cfg, rngs=nnx.Rngs(1))
    for p in (moe.wi, moe.wi_gate, moe.wo):
        p[...] = jnp.broadcast_to(p[...][:1], p.shape)
    x = embeds(2, 5, cfg.d_model, seed=27)
    y, _ = _jit_call(moe, x)
    wi, wg, wo = moe.wi[...][0], moe.wi_gate[...][0], moe.wo[...][0]
    expected = (jax.nn.silu(x @ wg) * (x @ wi)) @ wo
    chex.assert_trees_all_close(y, expected, atol=1e-6, rtol=1e-5)


def _expert_weights(cfg, seed):
    moe = MoE(cfg, rngs=nnx.Rngs(seed))
    biases = [None if b is None else jax.random.normal(jax.random.PRNGKey(seed + i), b.shape) * 0.5
              for i, b in enumerate((moe.bi, moe.bi_gate, moe.bo))]  # (zero at init: random, so they count)
    return moe, ExpertWeights(moe.wi[...], None if moe.wi_gate is None else moe.wi_gate[...], moe.wo[...], *biases)


# gpt-oss's experts: biases on every projection and the clamped SwiGLU, its limit low enough to clamp here
GPT_OSS_EXPERTS = {"expert_bias": True, "swiglu_limit": 0.5, "swiglu_alpha": 1.702}


@pytest.mark.parametrize("preset, changes", [("tiny-mixtral", {}), ("tiny-deepseek", {}),
                                             ("tiny-mixtral", {"activation": "gelu", "experts_per_token": 1}),
                                             ("tiny-mixtral", GPT_OSS_EXPERTS),
                                             ("tiny-mixtral", {"activation": "gelu", "expert_bias": True}),
                                             # Llama 4: sigmoid scores on the experts' inputs
                                             ("tiny-mixtral", {"router_score": "sigmoid", "experts_per_token": 2,
                                                               "normalize_router_weights": False,
                                                               "router_weights_on_input": True})])
def test_grouped_dispatch_equals_dense_experts_forward_and_gradients(preset, changes):
    """The sorted, block-grouped dispatch computes what running every expert computes: outputs and the
    gradients of x, of every expert weight and of the router (through the routing weights)."""
    cfg = tiny_config(preset, init_std=0.2, **changes)
    moe, weights = _expert_weights(cfg, seed=30)
    x = embeds(3, 7, cfg.d_model, seed=31)
    router = moe.router[...]
    cotangent = embeds(3, 7, cfg.d_model, seed=36)  # a linear loss: no cancellation in large squares

    def loss(dispatch, x, router, weights):
        routing = route(cfg, jnp.einsum("BTD,DE->BTE", x, router), None)
        y = dispatch(x, routing, weights, Unit.of(cfg), cfg.experts.weights_on_input)
        return jnp.sum(y * cotangent), y

    results = {}
    for dispatch in (grouped_experts, ragged_experts, dense_experts):  # ragged: the GPU/TPU path
        grad_fn = jax.jit(jax.value_and_grad(functools.partial(loss, dispatch), argnums=(0, 1, 2), has_aux=True))
        results[dispatch] = grad_fn(x, router, weights)
    (_, y_dense), grads_dense = results[dense_experts]
    for dispatch in (grouped_experts, ragged_experts):
        (_, y_grouped), grads_grouped = results[dispatch]
        np.testing.assert_allclose(y_grouped, y_dense, atol=1e-5, rtol=0)
        # Gradients sum many products in a different order (per expert group vs all experts at once), so
        # they agree to the parity bound times their own scale (the router's reach ~10), not to 1e-5 absolute.
        # With k = 1 the normalised routing weight is 1 and the router's gradient is rounding noise of sums
        # that cancel: 2.3e-6 against 1.4e-7 under XLA:CPU's -O2 and -O0 code (below 2e-6 under its default
        # -O3), so a bound tighter than 1e-5 fails on correct code.
        for grouped, dense in zip(jax.tree.leaves(grads_grouped), jax.tree.leaves(grads_dense)):
            scale = max(1.0, float(jnp.max(jnp.abs(dense))))
            np.testing.assert_allclose(grouped, dense, atol=1e-5 * scale, rtol=0)


def test_grouped_dispatch_with_repeated_and_idle_experts():
    """A token may list one expert twice (both shares count) and experts may receive no token at all:
    the ragged groups then hold two rows of that token, or none."""
    cfg = tiny_config("tiny-deepseek", init_std=0.2)
    _, weights = _expert_weights(cfg, seed=32)
    x = embeds(2, 3, cfg.d_model, seed=33)
    experts = jnp.array([[[1, 1], [1, 2], [2, 1]], [[1, 1], [2, 2], [1, 2]]])  # experts 0 and 3..7 idle
    gates = jax.random.uniform(jax.random.PRNGKey(34), experts.shape)
    routing = Routing(experts, gates, jnp.zeros((2, 3, cfg.experts.count)))

    def both(x, weights):
        return (grouped_experts(x, routing, weights, Unit.of(cfg)),
                dense_experts(x, routing, weights, Unit.of(cfg)))

    y_grouped, y_dense = jax.jit(both)(x, weights)
    np.testing.assert_allclose(y_grouped, y_dense, atol=1e-5, rtol=0)
    cotangent = embeds(2, 3, cfg.d_model, seed=37)
    grads = [jax.jit(jax.grad(lambda x, w, i=i: jnp.sum(both(x, w)[i] * cotangent), argnums=(0, 1)))(x, weights)
             for i in (0, 1)]
    for grouped, dense in zip(*map(jax.tree.leaves, grads)):
        np.testing.assert_allclose(grouped, dense, atol=2e-6 * max(1.0, float(jnp.max(jnp.abs(dense)))), rtol=0)
    idle = jnp.array([0, 3, 4, 5, 6, 7])
    for w in jax.tree.leaves(grads[0][1]):  # idle experts get exactly zero gradient
        np.testing.assert_array_equal(w[idle], 0.0)


def test_deepseek_router_groups_and_bias_select_but_do_not_weigh():
    """V3 routing: the bias changes which experts are chosen, never their weights (those are the raw
    sigmoid scores, renormalised and scaled); group-limited selection stays inside the best groups."""
    cfg = tiny_config("tiny-deepseek")
    logits = jax.random.normal(jax.random.PRNGKey(35), (2, 5, cfg.experts.count)) * 3
    bias = jnp.zeros(cfg.experts.count).at[0].set(10.0)  # expert 0 always wins selection
    plain, biased = route(cfg, logits, None), route(cfg, logits, bias)
    assert bool(jnp.all(jnp.any(biased.experts == 0, axis=-1)))
    scores = jax.nn.sigmoid(logits)
    chosen = jnp.take_along_axis(scores, biased.experts, axis=-1)
    np.testing.assert_allclose(biased.weights, cfg.experts.routed_scaling * chosen / chosen.sum(-1, keepdims=True), rtol=1e-6)
    per_group = cfg.experts.count // cfg.experts.router_groups
    groups = plain.experts // per_group  # at most router_topk_groups distinct groups per token
    distinct = jnp.sum(jax.nn.one_hot(groups, cfg.experts.router_groups).max(axis=-2), axis=-1)
    assert int(distinct.max()) <= cfg.experts.router_topk_groups


# ==================================================================================================
# KV cache hook of Attention


@pytest.mark.parametrize("name, chunks", [("tiny-llama", (4, 3)), ("tiny-gpt", (1,) * 7)],
                         ids=["gqa-rope-4+3", "mha-bias-token-by-token"])
def test_attention_kv_cache_equals_full_pass(name, chunks):
    cfg = tiny_config(name)
    attn = Attention(cfg, rngs=nnx.Rngs(3))
    B, T, S = 2, sum(chunks), 10
    x = embeds(B, T, cfg.d_model, seed=28)
    # make the (zero-initialised) biases non-zero so they are exercised
    for bias in (attn.q_bias, attn.k_bias, attn.v_bias, attn.o_bias):
        if bias is not None:
            bias[...] = bias[...] + 0.1

    K, H = cfg.kv_heads, cfg.head_dim_
    graphdef, state = nnx.split(attn)

    @jax.jit
    def run(state, x, start, cache):
        """Queries at absolute positions start..start+n-1, over x itself or over (cache, x)."""
        n = x.shape[1]
        q_pos = start + jnp.broadcast_to(jnp.arange(n), (B, n))
        rope = rope_angles(rope_frequencies(cfg), q_pos) if cfg.position == "rope" else None
        own = visibility_mask("causal", q_pos, q_pos)
        module = nnx.merge(graphdef, state)
        if cache is None:  # the full pass, and its (rotated) keys for comparison
            y, new_kv, _ = module(x, mask=own, rope=rope)
            k, _ = module.key_values(x)
            return y, new_kv, k if rope is None else apply_rope(k, *rope)
        # The hook attends over the cache (slots written so far are valid) next to this call's own
        # keys, and hands back only the new keys/values, head-major [B, K, n, H]; the caller writes them.
        slots = jnp.broadcast_to(jnp.arange(S), (B, S))
        cached = visibility_mask("causal", q_pos, slots, slots < start)
        y, new_kv, _ = module(x, mask=(cached, own), rope=rope, cache=cache)
        assert new_kv["k"].shape == new_kv["v"].shape == (B, K, n, H)
        cache = {name: jax.lax.dynamic_update_slice_in_dim(cache[name], new_kv[name], start, axis=2)
                 for name in ("k", "v")}
        return y, cache, None

    full, no_kv, full_keys = run(state, x, 0, None)
    assert no_kv is None

    cache = {"k": jnp.zeros((B, K, S, H)), "v": jnp.zeros((B, K, S, H))}
    outputs, start, x_host = [], 0, np.asarray(x)
    for n in chunks:
        y, cache, _ = run(state, x_host[:, start:start + n], start, cache)
        outputs.append(y)
        start += n
    chex.assert_trees_all_close(jnp.concatenate(outputs, axis=1), full, **TOL)
    chex.assert_trees_all_close(cache["k"][:, :, :T], full_keys.transpose(0, 2, 1, 3), **TOL)
    np.testing.assert_array_equal(np.asarray(cache["k"][:, :, T:]), 0.0)  # slots beyond T never written


# ==================================================================================================
# Dropout keys


def test_dropout_only_with_a_key_and_deterministic_per_key():
    x = embeds(2, 6, 64, seed=30)
    chex.assert_trees_all_equal(dropout(x, 0.5, None), x)  # no key: evaluation, the identity
    dropped = dropout(x, 0.5, jax.random.key(0))
    zeros = np.asarray(dropped) == 0
    assert 0.3 < zeros.mean() < 0.7
    chex.assert_trees_all_close(np.asarray(dropped)[~zeros], 2 * np.asarray(x)[~zeros], **TOL)  # inverted

    noisy = tiny_model("tiny-gpt", dropout_rate=0.2, attention_dropout_rate=0.2)
    plain = tiny_model("tiny-gpt")
    chex.assert_trees_all_equal(nnx.state(noisy, nnx.Param), nnx.state(plain, nnx.Param))
    ids = token_ids(2, 6, seed=29)
    reference = call(plain, ids).logits
    key = jax.random.key(0)
    a = call(noisy, ids, dropout_key=key).logits
    chex.assert_trees_all_equal(a, call(noisy, ids, dropout_key=key).logits)
    assert not np.allclose(a, reference, atol=1e-3)
    assert not np.allclose(a, call(noisy, ids, dropout_key=jax.random.key(1)).logits, atol=1e-3)
