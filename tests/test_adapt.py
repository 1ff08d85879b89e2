"""jf.adapt: a decoder-only model into an encoder-decoder (T5Gemma) or a prefix-LM, every tensor copied."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

import jaxformer as jf

from conftest import tiny_model


def _flat(model) -> dict:
    return {tuple(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model))}


@pytest.mark.parametrize("preset", ["tiny-gemma", "tiny-llama", "tiny-gpt"])
def test_encoder_decoder_layers_are_the_decoder_only_tensors(preset):
    source = jf.build(jf.config(preset).replace(init_std=0.2), seed=1)
    adapted = jf.adapt(source, "encoder_decoder")
    cfg = adapted.config
    assert (cfg.family, cfg.encoder_layers, cfg.decoder_layers) == ("encoder_decoder",) + (source.config.decoder_layers,) * 2
    before, after = _flat(source), _flat(adapted)
    layer_tensors = [p for p in before if p[:2] == ("decoder", "blocks")]
    assert layer_tensors
    for path in layer_tensors:
        np.testing.assert_array_equal(after[("encoder",) + path[1:]], before[path], err_msg=str(path))
        np.testing.assert_array_equal(after[path], before[path], err_msg=str(path))
        sublayer = {"attn": "cross_attn", "attn_norm": "cross_norm", "attn_post_norm": "cross_post_norm"}.get(path[2])
        if sublayer:  # cross-attention starts as the layer's self-attention
            np.testing.assert_array_equal(after[path[:2] + (sublayer,) + path[3:]], before[path], err_msg=str(path))
    for table in (("embed", "table"), ("encoder_embed", "table")):
        np.testing.assert_array_equal(after[table], before[("embed", "table")])


def test_adapted_gemma_saves_as_t5gemma_and_transformers_agrees(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from jaxformer.compare import compare, format_table

    # a window (2) shorter than the inputs, so the encoder's two-sided windows are exercised too
    source = jf.build(jf.config("tiny-gemma").replace(init_std=0.2, window_size=2, attention_softcap=2.0), seed=2)
    adapted = jf.adapt(source, "encoder_decoder")
    adapted.save_pretrained(tmp_path)
    ids = np.random.default_rng(0).integers(3, 256, size=(2, 7))
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    rows = compare(tmp_path, ids, mask, model=adapted)
    assert all(r.max_abs <= 1e-5 for r in rows), format_table(rows, 1e-5)
    again = jf.from_pretrained(tmp_path)
    assert again.config.replace(name=adapted.config.name) == adapted.config.replace(dtype="float32")


def test_prefix_lm_keeps_every_tensor_and_sees_its_prefix():
    source = tiny_model("tiny-llama")
    adapted = jf.adapt(source, "prefix_lm")
    assert adapted.config.attention == "prefix"
    before, after = _flat(source), _flat(adapted)
    assert before.keys() == after.keys() and all(np.array_equal(before[p], after[p]) for p in before)
    ids = np.arange(1, 7)[None]
    # a full prefix makes every position see every token: the first position's logits change with the last token
    full = np.array([6])
    changed = ids.copy()
    changed[0, -1] = 9
    first = lambda x: np.asarray(adapted(x, prefix_lengths=full).logits[0, 0])  # noqa: E731
    assert np.abs(first(ids) - first(changed)).max() > 1e-4


@pytest.mark.parametrize("preset, kind, message", [
    ("tiny-bert", "encoder_decoder", "decoder-only"),
    ("tiny-t5", "encoder_decoder", "decoder-only"),
    ("tiny-mixtral", "encoder_decoder", "num_experts"),
    ("tiny-deepseek", "encoder_decoder", "kv_lora_rank"),
    ("tiny-transformer-xl", "encoder_decoder", "position='xl'"),
    ("tiny-gemma", "prefix_lm", "attention='alternating'"),
    ("tiny-gpt", "encoder", "expected one of"),
])
def test_what_does_not_carry_over_is_refused_by_name(preset, kind, message):
    with pytest.raises(ValueError, match=message):
        jf.adapt(tiny_model(preset), kind)
