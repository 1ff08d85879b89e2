"""Run by tests/test_sharding.py in a subprocess with 8 simulated devices: pipeline parallelism (the ``stage``
mesh axis, ``layers/pipeline.py``) against one device, for the loss, outputs and gradients of a forward pass
of a decoder, an encoder and an encoder-decoder, each under GPipe and the circular schedule, on 4 and 8
devices beside ``data``, ``fsdp`` and ``tensor``; and greedy decoding under ``stage=4``. Prints one JSON
object: per case, the max abs differences and the bytes of the compiled program's collective permutes (the
stages passing activations on)."""

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

# one model per family, with enough layers for 4 stages (8: 4 stages x 2 chunks)
DECODER = jf.config("tiny-llama").replace(decoder_layers=8)
MIXTRAL = jf.config("tiny-mixtral").replace(decoder_layers=4, router_aux_loss_coef=0.01)
# layers of two kinds (a window of 5 on three of four): each chunk must read its own layers' kinds
GEMMA3 = jf.config("tiny-gemma3").replace(decoder_layers=8, layer_types=("sliding", "sliding", "full", "sliding") * 2,
                                          window_size=5)
# a dense first layer that every stage runs whole, then 4 MoE layers with latent attention in the pipeline
DEEPSEEK = jf.config("tiny-deepseek").replace(decoder_layers=5, router_aux_loss_coef=0.01)
ENCODER = jf.config("tiny-bert").replace(encoder_layers=8)
SEQ2SEQ = jf.config("tiny-t5").replace(encoder_layers=4, decoder_layers=4)
# name: (model, mesh, chunks a stage (1: GPipe), microbatches)
CASES = {
    "decoder (LLaMA), GPipe, stage 4": (DECODER, {"stage": 4}, 1, 4),
    "decoder (LLaMA), circular, stage 4 x data 2": (DECODER, {"stage": 4, "data": 2}, 2, 4),
    "decoder (LLaMA), circular, stage 2 x tensor 2 x fsdp 2": (DECODER, {"stage": 2, "tensor": 2, "fsdp": 2}, 2, 4),
    # tokens split over `sequence` too: attention on XLA partitioned along it (the ring does not run in a pipeline)
    "decoder (LLaMA), GPipe, stage 2 x sequence 2 x data 2": (DECODER, {"stage": 2, "sequence": 2, "data": 2},
                                                              1, 2),
    "alternating windows (Gemma 3), circular, stage 2 x data 2": (GEMMA3, {"stage": 2, "data": 2}, 2, 2),
    "MoE decoder (Mixtral), circular, stage 2 x data 2": (MIXTRAL, {"stage": 2, "data": 2}, 2, 4),
    "MoE decoder (Mixtral), GPipe, stage 2 x expert 4": (MIXTRAL, {"stage": 2, "expert": 4}, 1, 2),
    "DeepSeek (dense first layer apart), GPipe, stage 4 x data 2": (DEEPSEEK, {"stage": 4, "data": 2}, 1, 4),
    "encoder (BERT), GPipe, stage 4 x fsdp 2": (ENCODER, {"stage": 4, "fsdp": 2}, 1, 8),
    "encoder (BERT), circular, stage 2 x fsdp 2": (ENCODER, {"stage": 2, "fsdp": 2}, 2, 2),
    "encoder-decoder (T5), GPipe, stage 4 x data 2": (SEQ2SEQ, {"stage": 4, "data": 2}, 1, 4),
    "encoder-decoder (T5), circular, stage 2 x fsdp 2": (SEQ2SEQ, {"stage": 2, "fsdp": 2}, 2, 2),
}
B, T, TARGET = 8, 16, 12


def loss_and_grads(cfg, mesh_shape, ids, mask):
    model = jf.build(cfg, seed=0)
    count = int(np.prod(list(mesh_shape.values())))
    mesh = sharding.make_mesh(mesh_shape, jax.devices()[:count])
    graphdef, params = nnx.split(model)
    # an encoder without a head: a fixed random readout of its last hidden state, so every layer has a gradient
    # (scaled as an initialised head is, for logits of order one)
    readout = jax.random.normal(jax.random.key(1), (cfg.d_model, 32)) / np.sqrt(cfg.d_model)

    def loss(params):
        model = nnx.merge(graphdef, params)
        if cfg.family == "encoder_decoder":
            targets = ids[:, :TARGET]
            out = model(ids, mask, targets, jnp.ones_like(targets))
            logits, weights = out.logits, jnp.ones(targets.shape)
        else:
            out = model(ids, mask)
            targets, weights = ids, mask
            logits = out.logits if out.logits is not None else out.last_hidden_state @ readout
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, (targets % logits.shape[-1])[..., None], axis=-1)[..., 0]
        aux = 0.0 if out.aux_loss is None else out.aux_loss  # MoE: the balancing loss of the whole batch
        return jnp.sum(nll * weights) / jnp.sum(weights) + aux, logits

    if count > 1:
        params = jax.device_put(params, sharding.state_shardings(params, mesh))
    step = jax.jit(sharding.under_mesh(jax.value_and_grad(loss, has_aux=True), mesh)).lower(params).compile()
    (value, logits), grads = step(params)
    return {"loss": float(value), "logits": np.asarray(logits), "grads": [np.asarray(g) for g in jax.tree.leaves(grads)],
            "permutes": sharding.communicated_bytes(step.as_text()).get("collective-permute", 0)}


def main():
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(3, 200, (B, T)), jnp.int32)
    mask = np.ones((B, T), np.int32)
    mask[1, :5] = 0  # left padding
    mask[6, 11:] = 0  # right padding
    mask = jnp.asarray(mask)
    report, references = {}, {}
    for name, (cfg, shape, repeats, microbatches) in CASES.items():
        if cfg not in references:  # one device's numbers, once per model
            references[cfg] = loss_and_grads(cfg, {"data": 1}, ids, mask)
        reference = references[cfg]
        got = loss_and_grads(cfg.replace(pipeline_repeats=repeats, pipeline_microbatches=microbatches), shape, ids,
                             mask)
        valid = np.asarray(mask) > 0 if cfg.family != "encoder_decoder" else np.ones((B, TARGET), bool)
        report[name] = {"mesh": shape, "loss": abs(got["loss"] - reference["loss"]),
                        "logits": float(np.abs(got["logits"] - reference["logits"])[valid].max()),
                        "grads": max(float(np.abs(a - b).max()) for a, b in zip(got["grads"], reference["grads"])),
                        "permuted_bytes": got["permutes"]}
    # decoding runs the cached step, which takes the layers in turn (no pipeline) over the stage-split weights
    model = jf.build(DECODER, seed=0)
    staged = sharding.shard_model(model, sharding.make_mesh({"stage": 4}, jax.devices()[:4]))
    prompt = np.asarray(ids[:2, :6])
    report["greedy tokens under stage 4 equal one device's"] = bool(np.array_equal(
        staged.generate(prompt, max_new_tokens=5), model.generate(prompt, max_new_tokens=5)))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
