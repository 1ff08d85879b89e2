"""LoRA adapters on the shared projections, without a reference: a zero B changes nothing, a merged
adapter equals the factored one in every family (experts and latent attention included), scan equals
unrolled, a cached decode equals the uncached forward, dropout reaches only the adapter's input, and bad
targets are refused by name. PEFT parity is in test_peft.py, training in test_lora_train.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer.layers.weights import LoraParam

ALL = ("q", "k", "v", "o", "wi", "wi_gate", "wo")
IDS = np.array([[3, 14, 15, 92, 65, 35, 89, 79], [2, 71, 82, 81, 82, 84, 59, 0]])


def _random_b(model, seed=7, scale=0.05):
    """Give every adapter factor a random value (B starts at zero, which would hide the update)."""
    state = nnx.state(model, LoraParam)
    leaves, tree = jax.tree.flatten(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [v.replace(scale * jax.random.normal(k, v.shape, v.dtype)) for v, k in zip(leaves, keys)]
    nnx.update(model, jax.tree.unflatten(tree, leaves))
    return model


def _logits(model, ids=IDS):
    kw = {"decoder_input_ids": ids} if model.config.family == "encoder_decoder" else {}
    return np.asarray(model(ids, **kw).logits)


# LLaMA and Mixtral are covered by tiny-deepseek's gated MLP, experts and shared experts, and test_peft.py
CASES = [("tiny-gpt", ALL), ("tiny-t5", ("q", "v", "cross_attn.o", "wo")),
         ("tiny-deepseek", ("q_down", "q_up", "kv_down", "o", "wi", "wi_gate", "wo")),
         ("tiny-transformer-xl", ("q", "k", "v", "o", "wi"))]


@pytest.mark.parametrize("name, targets", CASES, ids=[c[0] for c in CASES])
def test_adapters_start_as_the_identity_and_merge_exactly(name, targets):
    cfg = jf.config(name)
    if cfg.family == "encoder":
        cfg = cfg.replace(head="mlm")
    base = jf.build(cfg, seed=1)
    before = _logits(base)
    lora = jf.with_lora(base, rank=4, alpha=8, targets=targets)
    # B = 0: the base model's outputs (the zero update is still computed, in another compiled program
    # whose float32 sums XLA may order differently: 1e-6 rather than bit equality)
    np.testing.assert_allclose(_logits(lora), before, atol=1e-6, rtol=0)
    adapters = jf.lora.adapter_paths(lora)
    assert adapters and all(p.endswith(("/a", "/b")) for p in adapters)
    _random_b(lora)
    changed = _logits(lora)
    assert np.abs(changed - before).max() > 1e-3
    merged = lora.merge_adapter()
    assert merged.config.lora is None and not jf.lora.adapter_paths(merged)
    np.testing.assert_allclose(_logits(merged), changed, atol=1e-5, rtol=0)
    # the base tensors were copied, not shared
    np.testing.assert_array_equal(_logits(base), before)


def test_adapters_shard_scan_and_cache_like_the_base():
    cfg = jf.config("tiny-llama")
    lora = _random_b(jf.with_lora(jf.build(cfg, seed=2), rank=4, alpha=16, targets=ALL, rslora=True))
    scanned = _logits(lora)
    twin = jf.build(lora.config.replace(scan_layers=False))  # the same parameter layout, unrolled
    nnx.update(twin, nnx.state(lora))
    np.testing.assert_allclose(_logits(twin), scanned, atol=1e-5, rtol=0)
    # greedy decoding through the KV cache equals argmax of the full forward, token by token
    prompt = IDS[:1, :4]
    out = np.asarray(lora.generate(prompt, max_new_tokens=6))
    for t in range(4, out.shape[1]):
        assert out[0, t] == _logits(lora, out[:, :t])[0, -1].argmax()
    # every adapter factor carries logical axes of its rank: 'lora_rank' plus the kernel's own
    for path, axes in jf.layers.logical_axes(lora).items():
        if path.endswith(("_lora/a", "_lora/b")):
            assert "lora_rank" in axes and axes[0] == "layers", (path, axes)


def test_lora_dropout_reaches_only_the_adapter_input():
    cfg = jf.config("tiny-gpt")
    lora = _random_b(jf.with_lora(jf.build(cfg, seed=3), rank=4, targets=("q", "v"), dropout=0.5))
    ids = jnp.asarray(IDS)
    evaluation = lora(ids).logits
    trained_a = lora(ids, dropout_key=jax.random.key(0)).logits
    trained_b = lora(ids, dropout_key=jax.random.key(1)).logits
    assert np.abs(np.asarray(trained_a - evaluation)).max() > 1e-4
    assert np.abs(np.asarray(trained_a - trained_b)).max() > 1e-4
    # with B = 0 the adapters contribute nothing, dropped or not: the base model has no dropout of its own
    plain = jf.with_lora(jf.build(cfg, seed=3), rank=4, targets=("q", "v"), dropout=0.5)
    np.testing.assert_array_equal(np.asarray(plain(ids, dropout_key=jax.random.key(0)).logits),
                                  np.asarray(plain(ids).logits))


@pytest.mark.parametrize("changes, message", [
    (dict(lora_rank=4), "needs lora_targets"),
    (dict(lora_targets=("q",)), "lora_targets=.*needs lora_rank > 0"),
    (dict(lora_rank=4, lora_targets=("q_proj",)), "names no projection"),
    (dict(lora_rank=4, lora_targets=("decoder.q",)), "names no projection"),
    (dict(lora_rank=4, lora_targets=("q",), lora_alpha=0.0), "lora_alpha"),
    (dict(lora_rank=4, lora_targets=("q",), lora_dropout=1.0), "lora_dropout"),
    (dict(lora_rank=-1, lora_targets=("q",)), "lora_rank"),
    (dict(quantize="int4"), "quantize"),
])
def test_bad_adapter_settings_are_named(changes, message):
    with pytest.raises(ValueError, match=message):
        jf.config("tiny-gpt").replace(**changes)


def test_bad_adapter_requests_are_named():
    base = jf.build("tiny-gpt")
    with pytest.raises(ValueError, match="cannot reach the experts"):
        jf.config("tiny-mixtral").replace(lora_rank=4, lora_targets=("wi",), lora_dropout=0.1)
    with pytest.raises(ValueError, match="name no projection"):
        jf.with_lora(base, targets=("q_down",))  # latent attention's, absent from GPT-2
    with pytest.raises(ValueError, match="match no parameter path"):
        jf.with_lora(base, targets=("q",), trainable=("decoder/classifier",))
    with pytest.raises(ValueError, match="already has LoRA"):
        jf.with_lora(jf.with_lora(base, targets=("q",)), targets=("v",))
    with pytest.raises(ValueError, match="no LoRA adapters"):
        base.merge_adapter()
