"""Transformer-XL: segment memory against XLNet's content stream over consecutive segments (the memory
tensors too), segments == one long pass, no gradient into the memory, generation past the segment
length with a memory of constant size, and what bad input gets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer as jf
from jaxformer.cache import MemoryKV
from conftest import tiny_model, token_ids

TOLERANCE = 1e-5


@pytest.mark.parametrize("name, token_types", [("xlnet", False), ("xlnet-bi-relu", True), ("xlnet-tied-clamped", True)])
def test_three_segments_with_memory_match_xlnet(name, token_types, checkpoints):
    """Segments of 4 tokens with mem_len 6: the memory fills (4), then rolls (6 of 8), then rolls again.
    Every hidden state, the logits and each layer's memory agree at 1e-5."""
    pytest.importorskip("transformers")
    import torch
    from jaxformer.compare import reference_model

    path = checkpoints(name)
    reference, model = reference_model(path), jf.from_pretrained(path)
    rng = np.random.default_rng(0)
    mems, memory = None, None
    for segment in range(3):
        ids = rng.integers(3, 97, size=(2, 4))
        types = rng.integers(0, 2, size=(2, 4)) if token_types else None
        with torch.no_grad():
            ref = reference(input_ids=torch.as_tensor(ids), mems=mems, use_mems=True, output_hidden_states=True,
                            token_type_ids=None if types is None else torch.as_tensor(types))
        out = model(ids, memory=memory, token_type_ids=types, output_hidden_states=True)
        for i, (r, o) in enumerate(zip(ref.hidden_states, out.hidden_states)):
            np.testing.assert_allclose(np.asarray(o), r.numpy(), atol=TOLERANCE, err_msg=f"segment {segment} state {i}")
        if getattr(ref, "logits", None) is not None:
            np.testing.assert_allclose(np.asarray(out.logits), ref.logits.numpy(), atol=TOLERANCE)
        filled = ref.mems[0].shape[0]
        assert out.memory.length == 6 and int(out.memory.valid.sum(axis=1)[0]) == filled
        for layer, ref_mem in enumerate(ref.mems):  # [M, B, D] in transformers, [L, B, M, D] here
            np.testing.assert_allclose(np.asarray(out.memory.hidden[layer, :, -filled:]),
                                       ref_mem.numpy().transpose(1, 0, 2), atol=TOLERANCE)
        mems, memory = ref.mems, out.memory


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_segments_with_memory_equal_one_long_pass(norm_position):
    """With a memory that covers everything before it, three segments of 5 give the logits of one pass
    over all 15 tokens (the pre-norm form normalises the memory like the segment)."""
    model = tiny_model("tiny-transformer-xl", memory_len=10, norm_position=norm_position, final_norm=norm_position == "pre")
    ids = token_ids(2, 15)
    whole = model(ids).logits
    memory, parts = None, []
    for start in range(0, 15, 5):
        out = model(ids[:, start:start + 5], memory=memory)
        parts.append(out.logits)
        memory = out.memory
    np.testing.assert_allclose(np.concatenate(parts, axis=1), np.asarray(whole), atol=TOLERANCE)
    # a memory shorter than the context forgets: the last segment then differs
    short, memory = tiny_model("tiny-transformer-xl", memory_len=3, norm_position=norm_position,
                               final_norm=norm_position == "pre"), None
    for start in range(0, 15, 5):
        out = short(ids[:, start:start + 5], memory=memory)
        memory = out.memory
    assert np.abs(np.asarray(out.logits) - np.asarray(whole[:, 10:])).max() > 1e-3


def test_no_gradient_flows_into_the_memory():
    """The next segment's loss does not depend, through the memory, on the previous segment's inputs,
    although its forward value does."""
    model = tiny_model("tiny-transformer-xl")
    first = jax.random.normal(jax.random.key(0), (2, 6, 64))
    ids = token_ids(2, 6, seed=1)

    def next_segment_loss(embeds):
        memory = model(inputs_embeds=embeds).memory
        return jnp.sum(model(ids, memory=memory).logits ** 2)

    assert float(jnp.abs(jax.grad(next_segment_loss)(first)).max()) == 0.0
    assert float(next_segment_loss(first)) != float(next_segment_loss(first * 2))


def test_generation_runs_past_the_segment_with_a_memory_of_constant_size():
    """Greedy generation of 40 tokens with an 8-token memory (prompt 5) equals a loop over the public
    call that feeds one token at a time with the memory; the state keeps 8 slots throughout."""
    model = tiny_model("tiny-transformer-xl", memory_len=8, seed=3)
    prompt = token_ids(2, 5, seed=2)
    generated = model.generate(prompt, max_new_tokens=40)
    out = model(prompt)
    tokens, memory = [jnp.argmax(out.logits[:, -1], -1)], out.memory
    for _ in range(39):
        out = model(tokens[-1][:, None], memory=memory)
        assert out.memory.hidden.shape == (2, 2, 8, 64)
        tokens.append(jnp.argmax(out.logits[:, -1], -1))
        memory = out.memory
    np.testing.assert_array_equal(generated[:, 5:], np.stack(tokens, axis=1))
    beams = model.generate(prompt, max_new_tokens=12, num_beams=3)
    assert beams.shape == (2, 17)


def test_decoding_reads_the_memory_as_keys_and_values_with_the_logits_of_the_hidden_state_memory():
    """Generation carries ``MemoryKV`` (keys and values, projected once per token) where the public call
    carries hidden states: over 30 single-token steps past an 8-token window both give the same logits,
    and the state keeps 8 slots."""
    model = tiny_model("tiny-transformer-xl", memory_len=8, seed=3)
    ids = token_ids(2, 31, seed=4)
    state = model.init_cache(2, 31)
    assert isinstance(state.kv, MemoryKV) and state.kv.k.shape == (2, 2, 8, 4, 16)
    step = jax.jit(model.step)
    logits, state = step(ids[:, :1], jnp.zeros((2, 1), jnp.int32), jnp.ones((2, 1), bool), state)
    memory = model(ids[:, :1]).memory
    for t in range(1, 31):
        logits, state = step(ids[:, t:t + 1], jnp.full((2, 1), t, jnp.int32), jnp.ones((2, 1), bool), state)
        out = model(ids[:, t:t + 1], memory=memory)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(out.logits[:, -1]), atol=TOLERANCE)
        memory = out.memory
    assert state.kv.k.shape == (2, 2, 8, 4, 16) and bool(state.kv.valid.all())


def test_eval_memory_may_be_longer_than_the_configured_one():
    model = tiny_model("tiny-transformer-xl")
    memory = model.init_memory(2, 48)
    out = model(token_ids(2, 4), memory=memory)
    assert out.memory.length == 48 and int(out.memory.valid.sum()) == 8


def test_bad_memory_and_config_are_refused():
    xl, gpt = tiny_model("tiny-transformer-xl"), tiny_model("tiny-gpt")
    ids = token_ids(2, 4)
    with pytest.raises(ValueError, match="not a Transformer-XL model"):
        gpt(ids, memory=xl.init_memory(2))
    with pytest.raises(ValueError, match="need"):
        xl(ids, memory=xl.init_memory(3))
    with pytest.raises(ValueError, match="must be a jaxformer.cache.Memory"):
        xl(ids, memory=np.zeros((2, 2, 4, 64)))
    with pytest.raises(ValueError, match="perm_mask: XLNet's two-stream permutation pretraining is not supported"):
        xl(ids, perm_mask=np.zeros((2, 4, 4)))
    with pytest.raises(ValueError, match="init_memory"):
        gpt.init_memory(2)
    with pytest.raises(ValueError, match="memory_len=4 needs position='xl'"):
        jf.config("tiny-gpt").replace(memory_len=4)
    with pytest.raises(ValueError, match="position='xl'"):
        jf.config("tiny-transformer-xl").replace(num_kv_heads=2)


def test_xlnet_options_outside_the_content_stream_are_refused(tmp_path):
    from jaxformer.interop.hf import config_from_hf

    base = dict(model_type="xlnet", architectures=["XLNetLMHeadModel"], vocab_size=97, d_model=32, n_layer=2,
                n_head=4, d_inner=48)
    for field, value in (("bi_data", True), ("same_length", True), ("reuse_len", 4), ("attn_type", "perm")):
        with pytest.raises(ValueError, match=field if field != "attn_type" else "attn_type"):
            config_from_hf({**base, field: value})
    cfg = config_from_hf({**base, "mem_len": None, "clamp_len": -1, "untie_r": False})
    assert (cfg.segment_memory, cfg.xl.clamp_len, cfg.xl.shared_biases) == (0, 0, True)


def test_training_flops_count_the_memory():
    """MFU's model FLOPs of tiny-transformer-xl (D 64, 4 x 16 heads, 2 layers, memory 32) over 8 tokens,
    counted by hand: 6 x (74,752 stack + 16,384 tied head) parameters, causal attention over 4.5 own keys
    on average, and per layer the 32 memory keys (12 x 64 x 32), the position scores over 41 distances
    (6 x 64 x 41) and the memory's key/value projections forward and into the weight gradient
    (4 x 32/8 x 2 x 64 x 64)."""
    from jaxformer import flops

    per_token = 6 * (74_752 + 16_384) + 12 * 2 * 64 * 4.5 + 2 * (12 * 64 * 32 + 6 * 64 * 41 + 4 * 4 * 2 * 64 * 64)
    assert flops.train_flops_per_step(jf.config("tiny-transformer-xl"), 1, 8) == 8 * per_token
