"""Run by tests/test_packing.py in a subprocess with 8 simulated devices: packed documents (segment ids) under
context parallelism (the ``sequence`` mesh axis, ring attention) against one device, for the loss, logits and
gradients of a causal, a sliding-window and a bidirectional model and T5 (its cross-attention rides the ring),
with documents that cross the devices' chunks. Prints one JSON object: per case, the max abs differences and
how many attention calls were traced through the ring."""

from __future__ import annotations

import json
import os

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jaxformer as jf  # noqa: E402
from jaxformer import kernels, sharding  # noqa: E402

RING_CALLS = []
_ring = kernels.ring_attention


def _counted(*args, **kwargs):
    RING_CALLS.append(1)
    return _ring(*args, **kwargs)


kernels.ring_attention = _counted

CASES = {
    "causal (LLaMA, GQA)": (jf.config("tiny-llama"), {"data": 2, "sequence": 4}),
    "sliding (Mistral, window 5)": (jf.config("tiny-llama").replace(attention="sliding", window_size=5),
                                    {"sequence": 8}),
    "bidirectional (BERT)": (jf.config("tiny-bert"), {"data": 2, "sequence": 4}),
    "encoder-decoder (T5)": (jf.config("tiny-t5"), {"data": 4, "sequence": 2}),
}
# documents of 7, 13, 9 tokens and 3 pads; 20 and 12; one of 32; 3, 5, 24: boundaries inside every device's chunk
LAYOUTS = ([7, 13, 9], [20, 12], [32], [3, 5, 24])


def segment_ids(T: int) -> np.ndarray:
    rows = []
    for lengths in LAYOUTS:
        row = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)])
        rows.append(np.concatenate([row, np.zeros(T - len(row))]))
    return np.stack(rows).astype(np.int32)


def loss_and_grads(cfg, mesh_shape, ids, segments):
    model = jf.build(cfg, seed=0)
    count = int(np.prod(list(mesh_shape.values())))
    mesh = sharding.make_mesh(mesh_shape, jax.devices()[:count])
    graphdef, params = nnx.split(model)
    real = segments > 0

    def loss(params):
        m = nnx.merge(graphdef, params)
        if cfg.family == "encoder_decoder":
            out = m(ids, decoder_input_ids=ids, segment_ids=segments, decoder_segment_ids=segments)
        else:
            out = m(ids, segment_ids=segments)
        logits = out.logits if out.logits is not None else out.last_hidden_state  # (BERT's bare encoder)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, (ids % logits.shape[-1])[..., None], axis=-1)[..., 0]
        return jnp.sum(nll * real) / jnp.sum(real), logits

    step = jax.jit(sharding.under_mesh(jax.value_and_grad(loss, has_aux=True), mesh))
    if count > 1:
        params = jax.device_put(params, sharding.state_shardings(params, mesh))
    (value, logits), grads = step(params)
    return {"loss": float(value), "logits": np.asarray(logits),
            "grads": [np.asarray(g) for g in jax.tree.leaves(grads)]}


def main():
    rng = np.random.default_rng(0)
    T = 32
    segments = jnp.asarray(segment_ids(T))
    real = np.asarray(segments) > 0
    report = {}
    for name, (cfg, shape) in CASES.items():
        ids = jnp.asarray(rng.integers(3, min(cfg.vocab_size, 97), (len(LAYOUTS), T)), jnp.int32)
        reference = loss_and_grads(cfg, {"data": 1}, ids, segments)
        RING_CALLS.clear()
        got = loss_and_grads(cfg, shape, ids, segments)
        report[name] = {"mesh": shape, "loss": abs(got["loss"] - reference["loss"]),
                        "logits": float(np.abs(got["logits"] - reference["logits"])[real].max()),
                        "grads": max(float(np.abs(a - b).max()) for a, b in zip(got["grads"], reference["grads"])),
                        "ring_calls": len(RING_CALLS)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
