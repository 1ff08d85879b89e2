"""Run by tests/test_sharding.py in a subprocess with 8 simulated devices: expert parallelism with an
all-to-all (the ``expert`` mesh axis, ``feedforward.exchanged_experts``) against one device, for the loss,
logits and gradients of a forward pass and for a prefill through the cached step. Prints one JSON object: per
case, the max abs differences and how many times the exchange was traced."""

from __future__ import annotations

import json
import os

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jaxformer as jf  # noqa: E402
from jaxformer import sharding  # noqa: E402
from jaxformer.layers import feedforward  # noqa: E402

EXCHANGES = []
_exchange = feedforward.exchanged_experts


def _counted(*args, **kwargs):
    EXCHANGES.append(1)
    return _exchange(*args, **kwargs)


feedforward.exchanged_experts = _counted

MIXTRAL, DEEPSEEK = jf.config("tiny-mixtral"), jf.config("tiny-deepseek")  # 4 and 8 experts
# Mixtral and DeepSeek on 4 and 8 devices, the expert axis alone (one expert a device: DeepSeek on 8) and
# beside data, fsdp, tensor and sequence; then gpt-oss's expert biases (each pair's output bias added where
# its expert is) and Llama 4's routing weights on the experts' inputs
CASES = {
    "Mixtral, 4 devices": (MIXTRAL, {"expert": 4}),
    "Mixtral, 8 devices (expert 4 x sequence 2)": (MIXTRAL, {"expert": 4, "sequence": 2}),
    "DeepSeek, 8 devices": (DEEPSEEK, {"expert": 8}),
    "DeepSeek, 4 devices (expert 2 x tensor 2)": (DEEPSEEK, {"tensor": 2, "expert": 2}),
    "biased experts (gpt-oss-like), expert 4 x data 2": (MIXTRAL.replace(expert_bias=True, router_logit_bias=True),
                                                         {"data": 2, "expert": 4}),
    "weights on inputs (Llama 4-like), expert 4 x fsdp 2": (MIXTRAL.replace(router_weights_on_input=True),
                                                            {"fsdp": 2, "expert": 4}),
}
# the cached step's prefill through the exchange too (each model's first case computes one device's)
PREFILL = ("Mixtral, 4 devices", "Mixtral, 8 devices (expert 4 x sequence 2)", "DeepSeek, 8 devices")


def loss_and_grads(cfg, mesh_shape, ids, mask, with_prefill):
    model = jf.build(cfg, seed=0)
    if cfg.experts.bias:  # give the zero-initialised biases values, so that a misplaced one shows
        graphdef, state = nnx.split(model)
        leaves, tree = jax.tree.flatten(state)
        keys = jax.random.split(jax.random.key(1), len(leaves))
        state = jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(key, x.shape, x.dtype)
                                          if jnp.issubdtype(x.dtype, jnp.floating) else x
                                          for x, key in zip(leaves, keys)])
        model = nnx.merge(graphdef, state)
    count = int(np.prod(list(mesh_shape.values())))
    mesh = sharding.make_mesh(mesh_shape, jax.devices()[:count])
    graphdef, params = nnx.split(model)

    def loss(params):
        out = nnx.merge(graphdef, params)(ids, mask)
        logp = jax.nn.log_softmax(out.logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, ids[..., None], axis=-1)[..., 0]
        return jnp.sum(nll * mask) / jnp.sum(mask) + out.aux_loss, out.logits

    def prefill(params):
        m = nnx.merge(graphdef, params)
        state = m.init_cache(ids.shape[0], ids.shape[1] + 4)
        positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
        return m.step(ids, positions, mask.astype(bool), state)[0]

    if count > 1:
        params = jax.device_put(params, sharding.state_shardings(params, mesh))
    (value, logits), grads = jax.jit(sharding.under_mesh(jax.value_and_grad(loss, has_aux=True), mesh))(params)
    result = {"loss": float(value), "logits": np.asarray(logits), "grads": [np.asarray(g) for g in jax.tree.leaves(grads)]}
    if with_prefill:
        result["prefill"] = np.asarray(jax.jit(sharding.under_mesh(prefill, mesh))(params))
    return result


def main():
    rng = np.random.default_rng(0)
    B, T = 8, 16
    report, references = {}, {}
    ids = jnp.asarray(rng.integers(3, MIXTRAL.vocab_size, (B, T)), jnp.int32)
    mask = np.ones((B, T), np.int32)
    mask[1, :5] = 0  # left padding
    mask = jnp.asarray(mask)
    valid = np.asarray(mask) > 0
    for name, (cfg, shape) in CASES.items():
        cfg = cfg.replace(router_aux_loss_coef=0.01)  # the balancing loss's gradient reaches the router too
        with_prefill = name in PREFILL
        if cfg not in references:  # one device's numbers, once per model
            references[cfg] = loss_and_grads(cfg, {"data": 1}, ids, mask, with_prefill)
        reference = references[cfg]
        EXCHANGES.clear()
        got = loss_and_grads(cfg, shape, ids, mask, with_prefill)
        report[name] = {"mesh": shape, "loss": abs(got["loss"] - reference["loss"]),
                        "logits": float(np.abs(got["logits"] - reference["logits"])[valid].max()),
                        "grads": max(float(np.abs(a - b).max()) for a, b in zip(got["grads"], reference["grads"])),
                        "exchanges": len(EXCHANGES)}
        if with_prefill:
            report[name]["prefill"] = float(np.abs(got["prefill"] - reference["prefill"]).max())
    print(json.dumps(report))


if __name__ == "__main__":
    main()
