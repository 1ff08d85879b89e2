"""Run by tests/test_sharding.py in a subprocess with 8 simulated devices: context parallelism (the
``sequence`` mesh axis, ring attention) against one device, for the loss and gradients of a training step
and for a prefill, on padded rows and on rows of packed documents (segment ids) whose boundaries fall inside
every device's chunk. Prints one JSON object: per case, the max abs differences and how many attention calls
were traced through the ring."""

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

# each case on one mesh: sequence alone, beside data, and beside fsdp and tensor
CASES = {
    "causal (LLaMA, GQA)": (jf.config("tiny-llama"), {"data": 2, "sequence": 4}),
    "sliding (Mistral, window 5)": (jf.config("tiny-llama").replace(attention="sliding", window_size=5), {"sequence": 8}),
    "sinks and soft caps (gpt-oss-like)": (jf.config("tiny-llama").replace(attention_sinks=True, attention_softcap=3.0),
                                           {"fsdp": 2, "tensor": 2, "sequence": 2}),
    "bidirectional (BERT)": (jf.config("tiny-bert").replace(dropout_rate=0.0, attention_dropout_rate=0.0),
                             {"data": 2, "sequence": 4}),
    # T5's relative bias keeps its self-attention on XLA (whose partitioner gathers the keys); its
    # cross-attention, source and target of one length here, rides the ring
    "encoder-decoder (T5)": (jf.config("tiny-t5").replace(dropout_rate=0.0), {"data": 4, "sequence": 2}),
}


# packed rows: documents of 7, 13, 9 tokens and 3 pads; 20 and 12; one of 32; 3, 5, 24
LAYOUTS = ([7, 13, 9], [20, 12], [32], [3, 5, 24])


def segment_ids(T: int) -> np.ndarray:
    rows = []
    for lengths in LAYOUTS:
        row = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)])
        rows.append(np.concatenate([row, np.zeros(T - len(row))]))
    return np.stack(rows).astype(np.int32)


def loss_and_grads(cfg, mesh_shape, ids, mask, segments=None):
    """Loss, logits and gradients over rows that are padded (``mask``) or packed (``segments``, 0 on pads)."""
    model = jf.build(cfg, seed=0)
    count = int(np.prod(list(mesh_shape.values())))
    mesh = sharding.make_mesh(mesh_shape, jax.devices()[:count])
    graphdef, params = nnx.split(model)
    packed = {} if segments is None else {"segment_ids": segments}

    def loss(params):
        m = nnx.merge(graphdef, params)
        if cfg.family == "encoder_decoder":
            sides = {} if segments is None else {"decoder_segment_ids": segments}
            out = m(ids, None if segments is not None else mask, decoder_input_ids=ids,
                    decoder_attention_mask=None if segments is not None else mask, **packed, **sides)
        else:
            out = m(ids, None if segments is not None else mask, **packed)
        logits = out.logits if out.logits is not None else out.last_hidden_state  # (BERT's bare encoder)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, (ids % logits.shape[-1])[..., None], axis=-1)[..., 0]
        return jnp.sum(nll * mask) / jnp.sum(mask), logits

    step = jax.jit(sharding.under_mesh(jax.value_and_grad(loss, has_aux=True), mesh))
    if count > 1:
        params = jax.device_put(params, sharding.state_shardings(params, mesh))
    (value, logits), grads = step(params)
    result = {"loss": float(value), "logits": np.asarray(logits), "grads": [np.asarray(g) for g in jax.tree.leaves(grads)]}
    if cfg.family == "decoder" and segments is None:  # a prefill: the cached step over the prompt (XLA, partitioned)
        def prefill(params):
            m = nnx.merge(graphdef, params)
            state = m.init_cache(ids.shape[0], ids.shape[1] + 4)
            positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
            return m.step(ids, positions, mask.astype(bool), state)[0]
        result["prefill"] = np.asarray(jax.jit(sharding.under_mesh(prefill, mesh))(params))
    return result


def main():
    rng = np.random.default_rng(0)
    B, T = 4, 32
    report = {}
    packed = segment_ids(T)
    for name, (cfg, shape) in CASES.items():
        ids = jnp.asarray(rng.integers(3, min(cfg.vocab_size, 97), (B, T)), jnp.int32)
        mask = np.ones((B, T), np.int32)
        if cfg.family == "decoder":
            mask[1, :5] = 0  # left padding
        else:
            mask[1, 20:] = 0
        for label, rows, segments in ((name, mask, None), (f"packed: {name}", packed > 0, packed)):
            rows, segments = jnp.asarray(rows, jnp.int32), None if segments is None else jnp.asarray(segments)
            reference = loss_and_grads(cfg, {"data": 1}, ids, rows, segments)
            RING_CALLS.clear()
            got = loss_and_grads(cfg, shape, ids, rows, segments)
            row = {"mesh": shape, "loss": abs(got["loss"] - reference["loss"]),
                   "logits": float(np.abs(got["logits"] - reference["logits"])[np.asarray(rows) > 0].max()),
                   "grads": max(float(np.abs(a - b).max()) for a, b in zip(got["grads"], reference["grads"])),
                   "ring_calls": len(RING_CALLS)}
            if "prefill" in got:
                row["prefill"] = float(np.abs(got["prefill"] - reference["prefill"]).max())
            report[label] = row
    print(json.dumps(report))


if __name__ == "__main__":
    main()
