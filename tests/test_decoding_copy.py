"""``model.decoding_copy()``: the model laid out once for decoding on CPU (layers separate, projection kernels
outputs first) computes what the model computes, generates its tokens, and refuses to be saved."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from flax import nnx

import jaxformer as jf
from jaxformer.layers.weights import LoraParam, OutputMajor, Quantized
from test_drafting import CASES as DRAFTING_CASES, _batch

# Drafting's cases (GQA with a gated MLP, learned positions and biases, latent attention whose absorbed decode
# reads k_up/v_up whole, a sliding window's ring cache, an encoder-decoder, Llama 4's chunked MoE) and the
# projection forms the copy leaves: an MoE's expert kernels beside a shared expert, a LoRA adapter, an int8 base.
CASES = dict(DRAFTING_CASES, **{
    "mixtral-shared-expert": jf.config("tiny-mixtral").replace(init_std=0.2, shared_experts=1, expert_d_ff=32),
    "llama-lora": jf.config("tiny-llama").replace(init_std=0.2, lora_rank=4, lora_targets=("q", "v", "wo")),
    "llama-int8": jf.config("tiny-llama").replace(init_std=0.2, quantize="int8"),
})


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
    # the same products, each output a dot product over another memory order: float32 rounding only
    if cfg.family == "decoder":
        np.testing.assert_allclose(np.asarray(copy(ids, mask).logits), np.asarray(model(ids, mask).logits),
                                   rtol=0, atol=1e-5)
    else:
        decoder_ids = ids[:, :5]
        np.testing.assert_allclose(np.asarray(copy(ids, mask, decoder_input_ids=decoder_ids).logits),
                                   np.asarray(model(ids, mask, decoder_input_ids=decoder_ids).logits),
                                   rtol=0, atol=1e-5)
    kwargs = dict(max_new_tokens=12, eos_token_id=None, decoder_start_token_id=0)
    np.testing.assert_array_equal(copy.generate(ids, mask, **kwargs), model.generate(ids, mask, **kwargs))
    if case in ("llama-gqa", "t5-encoder-decoder"):
        beams = dict(kwargs, num_beams=3)
        np.testing.assert_array_equal(copy.generate(ids, mask, **beams), model.generate(ids, mask, **beams))


def test_decoding_copy_drafts_and_refuses_to_be_saved(tmp_path):
    """A copy drafts for a copy (tokens as plain greedy's); saving, exporting or merging one is refused with a
    ValueError that names the model to use instead, and nothing is written."""
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
    for action in (lambda: adapted.save_adapter(tmp_path / "adapter"), adapted.merge_adapter):
        with pytest.raises(ValueError, match="decoding copy"):
            action()
