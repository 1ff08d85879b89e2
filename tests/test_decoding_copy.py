"""``model.decoding_copy()``: the model laid out once for decoding on CPU (layers separate, projection kernels
outputs first) computes what the model computes, generates its tokens, and refuses to be saved."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax import nnx

import jaxformer as jf
from jaxformer import generate as gen
from jaxformer.layers.weights import LoraParam, OutputMajor, Quantized
from test_drafting import CASES as DRAFTING_CASES, _batch
from test_generate import CACHE_CASES

# Drafting's cases (GQA with a gated MLP, learned positions and biases, latent attention whose absorbed decode
# reads k_up/v_up whole, a sliding window's ring cache, an encoder-decoder, Llama 4's chunked MoE) and the
# projection forms the copy leaves: an MoE's expert kernels beside a shared expert, a LoRA adapter, an int8 base.
# All at init_std 0.1: the copy's products sum in another order, so its logits differ from the model's by
# float32 rounding, which grows with the activations; at 0.2 latent attention's came to 1.0e-5, at 0.1 the
# largest difference is 2.5e-6, a margin of 4 under the 1e-5 standard (and the generations still vary).
CASES = {name: cfg.replace(init_std=0.1) for name, cfg in dict(DRAFTING_CASES, **{
    "mixtral-shared-expert": jf.config("tiny-mixtral").replace(shared_experts=1, expert_d_ff=32),
    "llama-lora": jf.config("tiny-llama").replace(lora_rank=4, lora_targets=("q", "v", "wo")),
    "llama-int8": jf.config("tiny-llama").replace(quantize="int8"),
    # its layers live in groups of their kinds (no 'blocks'): the copy must still count as sliced out
    "deepseek-v4-groups": CACHE_CASES["deepseek-v4"],
    # Mistral Large 4's NoPE layers: a block group of their own shapes between rotary expert layers
    "mistral-large4": CACHE_CASES["mistral-large4"],
}).items()}


def _with_trained_adapter(model):
    """LoRA's B starts at zero (the adapter then changes nothing): give it values so the test sees it."""
    state = nnx.state(model, LoraParam)
    rng = np.random.default_rng(3)
    values = jax.tree.map(lambda a: 0.1 * rng.standard_normal(a.shape).astype(a.dtype), state)
    nnx.update(model, values)
    return model


@pytest.mark.parametrize("case", sorted(CASES))
def test_decoding_copy_computes_and_generates_what_the_model_does(case):
    cfg = CASES[case]
    model = jf.build(cfg, seed=1)
    if cfg.lora is not None:
        model = _with_trained_adapter(model)
    copy = model.decoding_copy()
    turned = nnx.state(copy, OutputMajor)
    if cfg.quantization is not None:  # int8 kernels are read by their own product
        assert not turned and nnx.state(copy, Quantized)
    else:
        assert turned, "no kernel was turned outputs first"
    assert copy.for_decode_loop() is copy  # generation on the copy does not slice its layers again
    ids, mask = _batch(cfg.family, np.random.default_rng(0), cfg.vocab_size)
    kwargs = dict(max_new_tokens=12, eos_token_id=None, decoder_start_token_id=0)
    tokens = np.asarray(copy.generate(ids, mask, **kwargs))
    # The model's logits over the text the copy generated: the copy's equal them (the same products, each output a
    # dot product over another memory order: float32 rounding only), and each token the copy generated is their
    # argmax, the model's greedy choice (a check that costs one forward, where the model's own generate() would
    # be one more compile; it matches the model's forward in test_generate.py)
    if cfg.family == "decoder":
        text_mask = np.concatenate([mask, np.ones((len(ids), kwargs["max_new_tokens"]), mask.dtype)], axis=1)
        positions = np.maximum(np.cumsum(text_mask, axis=1) - 1, 0)  # left padding: counted as generation does
        inputs, named, generated = (tokens, text_mask, positions), {}, slice(ids.shape[1], None)
    else:  # (after the decoder start)
        inputs, named, generated = (ids, mask), dict(decoder_input_ids=tokens), slice(1, None)
    expected = np.asarray(model(*inputs, **named).logits)
    np.testing.assert_allclose(np.asarray(copy(*inputs, **named).logits), expected, rtol=0, atol=1e-5)
    choices = expected[:, generated.start - 1:-1].argmax(-1)  # each position's logits choose the next token
    np.testing.assert_array_equal(choices, tokens[:, generated])
    if case in ("llama-gqa", "t5-encoder-decoder"):
        beams = dict(kwargs, num_beams=3)
        np.testing.assert_array_equal(copy.generate(ids, mask, **beams), model.generate(ids, mask, **beams))


def test_decoding_copy_drafts_and_refuses_to_be_saved(tmp_path):
    """A copy drafts for a copy (tokens as plain greedy's); saving, exporting, merging, adding adapters to or
    quantizing one is refused with a ValueError that names the model to use instead, and nothing is written."""
    cfg = CASES["llama-gqa"]
    model = jf.build(cfg, seed=1)
    copy, assistant = model.decoding_copy(), jf.build(cfg.replace(decoder_layers=1), seed=2).decoding_copy()
    ids, mask = _batch(cfg.family, np.random.default_rng(0), cfg.vocab_size)
    kwargs = dict(max_new_tokens=10, eos_token_id=None)
    drafted = copy.generate(ids, mask, assistant_model=assistant, num_assistant_tokens=3,
                            num_assistant_tokens_schedule="constant", **kwargs)
    np.testing.assert_array_equal(drafted, model.generate(ids, mask, **kwargs))
    with pytest.raises(ValueError, match="decoding copy"):
        copy.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()
    adapted = jf.build(CASES["llama-lora"], seed=1).decoding_copy()
    for action in (lambda: adapted.save_adapter(tmp_path / "adapter"), adapted.merge_adapter,
                   lambda: jf.with_lora(copy), lambda: jf.quantized(copy)):
        with pytest.raises(ValueError, match="decoding copy"):
            action()


@pytest.mark.parametrize("case", ["llama-gqa", "mistral-sliding-3", "llama4-chunked", "deepseek-latent-cache",
                                  "t5-encoder-decoder"])
def test_a_per_layer_state_steps_as_the_stacked_one(case):
    """A decode loop over separate layers carries each layer's cache as its own array (``per_layer``): a
    prefill then two steps (one token, then three, as a drafting round verifies) give the same logits and
    write the same caches as the stacked state, for plain, ring, split, latent and encoder-decoder caches; a
    beam reorder takes the same rows."""
    cfg = CASES[case]
    model = jf.build(cfg, seed=1).for_decode_loop()
    ids, mask = _batch(cfg.family, np.random.default_rng(0), cfg.vocab_size)
    gc = gen.prepare(model, ids, mask, max_new_tokens=6, decoder_start_token_id=0)[1]
    ids, positions, valid, state = gen._prefill_inputs(model, jnp.asarray(ids), jnp.asarray(mask), gc, 1, 6)
    # jitted: eagerly, each step compiled its every operation on its own (~300 programs a case)
    run = jax.jit(lambda m, *args, wide=False: m.step(*args, every_position=wide), static_argnames="wide")
    _, stacked = run(model, ids, positions, valid, state)
    split = stacked.per_layer()
    assert jax.tree.structure(split) != jax.tree.structure(stacked)  # each layer field became a tuple of layers
    step = positions[:, -1:] + 1
    for width in (1, 3):
        tokens, at = jnp.full((ids.shape[0], width), 5, jnp.int32), step + jnp.arange(width)
        expected, stacked = run(model, tokens, at, jnp.ones_like(tokens, bool), stacked, wide=width > 1)
        got, split = run(model, tokens, at, jnp.ones_like(tokens, bool), split, wide=width > 1)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
        step = step + width
    for mine, theirs in zip(jax.tree.leaves(split), jax.tree.leaves(stacked.per_layer())):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))
    rows = jnp.asarray([1, 1])
    for mine, theirs in zip(jax.tree.leaves(split.reorder(rows)), jax.tree.leaves(stacked.reorder(rows).per_layer())):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))
