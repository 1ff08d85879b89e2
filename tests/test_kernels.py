"""Attention backends: every fused kernel this machine can run gives the XLA result, forward and backward.

- splash (the TPU Pallas kernel) runs here in Pallas's interpreter: the same kernel code, block masks,
  segment ids and autodiff rules as on a TPU, so its agreement with XLA is checked to float32 rounding.
- cudnn needs an NVIDIA GPU. Without one, the argument translation (causal and window flags, padding,
  T5's bias, GQA) is checked by routing it through jax's XLA implementation of the same
  ``jax.nn.dot_product_attention`` call; on a GPU the real kernel is checked in bfloat16.

Inputs are padded where the family allows it, and only real positions are compared (padded queries
are undefined in every implementation). Splash tiles queries and keys in blocks of 128, so sequences are 128 long.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import kernels
from conftest import simulated_devices

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "causal": ("tiny-gpt", {}),
    "gqa_rope": ("tiny-llama", {}),
    "sliding": ("tiny-llama", {"attention": "sliding", "window_size": 48}),
    "bidirectional": ("tiny-bert", {}),
    "t5_bias_and_cross": ("tiny-t5", {}),
    "post_norm_seq2seq": ("tiny-transformer", {}),
}
B, T, TARGET = 2, 128, 128


def _batch(cfg):
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, T)), jnp.int32)
    mask = np.ones((B, T), np.int32)
    mask[1, 100:] = 0  # the second row is padded
    batch = {"input_ids": ids, "attention_mask": jnp.asarray(mask)}
    if cfg.family == "encoder_decoder":
        batch["decoder_input_ids"] = ids[:, :TARGET]
        valid = np.ones((B, TARGET), bool)
    else:
        valid = mask.astype(bool)
    return batch, valid


def _logits_and_grads(cfg, batch, valid):
    graphdef, state = nnx.split(jf.build(cfg, seed=3))

    def loss(state):  # over real positions only: what padded queries see is undefined
        out = nnx.merge(graphdef, state)(**batch)
        logits = (out.last_hidden_state if out.logits is None else out.logits).astype(jnp.float32)
        return jnp.mean(jnp.square(logits) * valid[..., None]), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
    return np.asarray(logits), grads


def _compare(case, backend, tolerance, **changes):
    name, overrides = CASES[case]
    reference_cfg = jf.config(name).replace(**overrides, **changes, attention_backend="xla")
    batch, valid = _batch(reference_cfg)
    expected, expected_grads = _logits_and_grads(reference_cfg, batch, valid)
    got, grads = _logits_and_grads(reference_cfg.replace(attention_backend=backend), batch, valid)
    assert np.abs(got - expected)[valid].max() < tolerance
    worst = max(float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max())
                for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)))
    assert worst < tolerance, worst


@pytest.mark.parametrize("case", list(CASES))
def test_splash_kernel_matches_xla(case):
    # Pallas interpreter on CPU: the kernel's arithmetic in float32, so float32 rounding only.
    _compare(case, "splash", 1e-5)


@pytest.fixture
def cudnn_through_xla(monkeypatch):
    """Pretend to be a GPU that accepts the model, and run the cudnn call through jax's XLA path."""
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    monkeypatch.setattr(kernels, "cudnn_refuses", lambda cfg: None)
    monkeypatch.setattr(kernels, "CUDNN_IMPLEMENTATION", "xla")


@pytest.mark.parametrize("case", list(CASES))
def test_cudnn_argument_translation_matches_xla(case, cudnn_through_xla):
    _compare(case, "cudnn", 1e-5)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU")
@pytest.mark.parametrize("case", list(CASES))
def test_cudnn_kernel_matches_xla_in_bfloat16(case):
    # bfloat16 operands: the kernel and XLA round probabilities and partial sums differently.
    _compare(case, "cudnn", 5e-2, dtype="bfloat16")


@pytest.mark.skipif(jax.default_backend() != "tpu", reason="compiled splash attention needs a TPU")
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_splash_kernel_matches_xla_in_bfloat16(case):
    _compare(case, "splash", 5e-2, dtype="bfloat16")


def _backend_used(cfg, **batch):
    """Which kernels a forward pass of ``cfg`` would call, read from its jaxpr."""
    model = jf.build(cfg)
    text = str(jax.make_jaxpr(lambda: model(**batch))())
    return {"splash": "pallas_call" in text, "xla_softmax": "exp" in text}


def test_calls_outside_a_kernels_reach_run_on_xla():
    ids = jnp.zeros((1, T), jnp.int32)
    splash = dict(attention_backend="splash")
    assert _backend_used(jf.config("tiny-gpt").replace(**splash), input_ids=ids)["splash"]
    # Prefix-LM masks, GPT-3 alternating layers and user-given positions have no fused form.
    for changes in ({"attention": "prefix"}, {"attention": "alternating", "window_size": 16}):
        cfg = jf.config("tiny-gpt").replace(**splash, **changes)
        extra = {"prefix_lengths": jnp.array([4])} if changes["attention"] == "prefix" else {}
        assert not _backend_used(cfg, input_ids=ids, **extra)["splash"], changes
    cfg = jf.config("tiny-gpt").replace(**splash)
    assert not _backend_used(cfg, input_ids=ids, position_ids=jnp.arange(T)[None])["splash"]
    # A key length splash cannot tile.
    assert not _backend_used(cfg, input_ids=ids[:, :100])["splash"]
    # T5 self-attention carries an additive bias: XLA; its cross-attention has none: fused.
    t5 = jf.config("tiny-t5").replace(**splash)
    used = _backend_used(t5, input_ids=ids, decoder_input_ids=ids[:, :TARGET])
    assert used["splash"] and used["xla_softmax"]


def test_attention_dropout_falls_back_to_xla_with_the_same_result():
    cfg = jf.config("tiny-gpt").replace(attention_dropout_rate=0.1)
    ids = jnp.asarray(np.random.default_rng(1).integers(0, 256, (B, T)), jnp.int32)
    key = jax.random.key(7)
    outs = [jf.build(cfg.replace(attention_backend=b))(ids, dropout_key=key).logits for b in ("xla", "splash")]
    assert float(jnp.abs(outs[0] - outs[1]).max()) == 0.0


def test_generation_with_a_fused_backend_is_token_identical():
    # The encoder's full pass runs fused; decoding with a KV cache runs on XLA.
    ids = jnp.asarray(np.random.default_rng(2).integers(0, 256, (2, 128)), jnp.int32)
    runs = [jf.build(jf.config("tiny-transformer").replace(attention_backend=b)).generate(
        ids, max_new_tokens=6, decoder_start_token_id=0)
            for b in ("xla", "splash")]
    np.testing.assert_array_equal(np.asarray(runs[0]), np.asarray(runs[1]))


def test_a_backend_the_machine_cannot_serve_is_refused():
    with pytest.raises(ValueError, match="attention_backend='flash' is not valid"):
        jf.config("tiny-gpt").replace(attention_backend="flash")
    if jax.default_backend() != "gpu":
        model = jf.build(jf.config("tiny-gpt").replace(attention_backend="cudnn"))
        with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
            model(jnp.zeros((1, 8), jnp.int32))


def test_cudnn_refuses_what_its_documentation_excludes():
    assert "bfloat16 or float16" in kernels.cudnn_refuses(jf.config("tiny-gpt"))
    odd = jf.config("tiny-gpt").replace(dtype="bfloat16", num_heads=8, head_dim=12)
    assert "multiple of 8" in kernels.cudnn_refuses(odd)
    assert kernels.cudnn_refuses(jf.config("gpt2").replace(dtype="bfloat16")) is None


def test_splash_under_a_mesh_runs_per_shard_and_matches_one_device():
    # Pallas kernels are opaque to the SPMD partitioner: under a data x tensor mesh they run in shard_map.
    script = """
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
import jaxformer as jf
from jaxformer import sharding
ids = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 128)), jnp.int32)
def grads(backend, mesh):
    cfg = jf.config("tiny-llama").replace(attention_backend=backend)
    model = jf.build(cfg) if mesh is None else sharding.sharded_build(lambda: jf.build(cfg), mesh)
    graphdef, state = nnx.split(model)
    loss = lambda s: jnp.mean(jnp.square(nnx.merge(graphdef, s)(ids).logits))
    if mesh is None:
        return jax.jit(jax.grad(loss))(state)
    with jax.set_mesh(mesh):
        text = jax.jit(jax.grad(loss)).lower(state).as_text()
        assert "sdy.manual_computation" in text  # the kernel runs inside shard_map
        return jax.jit(jax.grad(loss))(state)
mesh = sharding.make_mesh({"data": 2, "tensor": 2})
a, b = grads("xla", None), grads("splash", mesh)
print(max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))))
"""
    env = simulated_devices(4, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 1e-5


@pytest.mark.parametrize("here, changes, pattern, has_bias, length, expected", [
    ("gpu", {"dtype": "bfloat16"}, "causal", False, 128, "cudnn"),
    ("gpu", {"dtype": "bfloat16"}, "bidirectional", True, 128, "cudnn"),  # T5: bias goes in as a bias
    ("gpu", {"dtype": "bfloat16"}, "causal", True, 127, "xla"),  # cuDNN's biased backward needs even lengths
    ("gpu", {}, "causal", False, 128, "xla"),  # float32 compute: cuDNN refuses it
    ("gpu", {"dtype": "bfloat16"}, "prefix", False, 128, "xla"),
    ("tpu", {}, "causal", False, 256, "splash"),
    ("tpu", {}, "sliding", False, 128, "splash"),
    ("tpu", {}, "bidirectional", True, 128, "xla"),  # splash takes no additive bias
    ("tpu", {}, "causal", False, 100, "xla"),  # not a multiple of its 128-wide blocks
    ("cpu", {"dtype": "bfloat16"}, "causal", False, 128, "xla"),
])
def test_auto_picks_the_kernel_of_the_platform(monkeypatch, here, changes, pattern, has_bias, length, expected):
    monkeypatch.setattr(kernels, "platform", lambda: here)
    cfg = jf.config("gpt2").replace(**changes)  # head_dim 64: within cuDNN's limits
    if pattern == "sliding":
        cfg = cfg.replace(attention="sliding", window_size=32)
    assert kernels.fused_backend(cfg, pattern, length, length, has_bias=has_bias) == expected
