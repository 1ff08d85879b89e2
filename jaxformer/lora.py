"""LoRA adapters and int8 kernels on a built model, keeping its weights.

    lora = jf.with_lora(model, rank=8, alpha=16, targets=("q", "v"))   # same base tensors, new adapters
    lora.merge_adapter()                                                 # a plain model: W + scale * A B
    jf.quantized(model, "int8")                                          # int8 projection kernels

Adapters and int8 kernels are configuration (``ModelConfig.lora_*``, ``quantize``), so a model with them is
built, sharded, scanned and checkpointed like any other; these functions move a model's values across such a
change of config. The layer math is in ``jaxformer/layers/weights.py``.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import edges
from jaxformer.model_config import ModelConfig
from jaxformer.layers.weights import (LoraParam, LoRA, Quantized, kernel, layout, quantize_kernel,
                                      refuse_decoding_copy)
from jaxformer.models import FAMILIES, Model, carry_hf_files
from jaxformer.sharding import LAYER_AXES


def _build(cfg: ModelConfig, seed: int) -> Model:
    return FAMILIES[cfg.family](cfg, rngs=nnx.Rngs(seed))


def _rebuilt(cfg: ModelConfig, values: dict[tuple, Any], seed: int = 0, source: Model | None = None) -> Model:
    """A model of ``cfg`` whose variables take ``values`` (flat path -> array). The only variables that may
    be missing are adapter factors, made fresh as PEFT initialises them (A Kaiming-uniform, B zero) from
    ``seed`` and their path, without running (or compiling) the model's initialisation. ``source``'s
    Hugging Face files (``HF_FILES``) carry over."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: _build(cfg, seed)))
    leaves = []
    for path, variable in nnx.to_flat_state(abstract):
        value = values[path] if path in values else _fresh_factor(path, variable, cfg, seed)
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"{_key(path)}: a value of shape {tuple(value.shape)} where {cfg.name!r} has "
                             f"{tuple(variable.shape)}")
        leaves.append((path, variable.replace(jnp.asarray(value, variable.dtype))))
    model = nnx.merge(graphdef, nnx.from_flat_state(leaves))
    return carry_hf_files(source, model)



def _fresh_factor(path: tuple, variable, cfg: ModelConfig, seed: int) -> jax.Array:
    if not isinstance(variable, LoraParam):
        raise ValueError(f"{_key(path)}: no value for this {type(variable).__name__} of {cfg.name!r}")
    if path[-1] == "b":
        return jnp.zeros(variable.shape, variable.dtype)
    # A [(layers,) (experts,) in.., R]: kaiming_uniform_(a=sqrt(5)) over fan_in, bound 1/sqrt(fan_in)
    axes = variable.get_metadata()["axes"]
    fan_in = math.prod(n for n, axis in zip(variable.shape[:-1], axes[:-1]) if axis not in (*LAYER_AXES, "experts"))
    key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(_key(path).encode()))
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, variable.shape, jnp.float32, -bound, bound)


def _key(path: tuple) -> str:
    return "/".join(map(str, path))


def _values(model: Model) -> dict[tuple, Any]:
    return {path: variable[...] for path, variable in nnx.to_flat_state(nnx.state(model))}


def under(path: str, prefixes) -> bool:
    """Whether the '/'-joined parameter ``path`` is one of ``prefixes`` or inside one: ``projector`` holds
    ``projector/linear_1/kernel`` but not ``projector_norm/scale``. The one reading of a listed path, for
    ``lora_trainable`` and ``finetune.train_only`` alike."""
    return any(path == prefix or path.startswith(prefix + "/") for prefix in prefixes)


def unmatched(prefixes, paths) -> list[str]:
    """The ``prefixes`` that hold none of the '/'-joined ``paths``."""
    return [prefix for prefix in prefixes if not any(under(path, (prefix,)) for path in paths)]


def with_lora(model: Model, rank: int = 8, alpha: float = 8.0, targets: tuple[str, ...] = ("q", "v"),
              dropout: float = 0.0, rslora: bool = False, trainable: tuple[str, ...] = (), seed: int = 0) -> Model:
    """``model`` with LoRA adapters of ``rank`` on the projections ``targets`` names (B zero, so its outputs
    are unchanged until trained), sharing nothing with the input. An existing adapter is an error."""
    refuse_decoding_copy(model, "add adapters to")
    cfg = model.config
    if cfg.lora is not None:
        raise ValueError(f"{cfg.name!r} already has LoRA adapters (rank {cfg.lora.rank}); merge_adapter() first")
    new = cfg.replace(lora_rank=rank, lora_alpha=alpha, lora_targets=tuple(targets), lora_dropout=dropout,
                      lora_rslora=rslora, lora_trainable=tuple(trainable))
    model_paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model))}
    unknown = unmatched(new.lora.trainable, model_paths)
    if unknown:
        raise ValueError(f"lora_trainable {unknown} match no parameter path of {cfg.name!r}")
    lora = _rebuilt(new, _values(model), seed, source=model)
    if not any(isinstance(v, LoraParam) for _, v in nnx.to_flat_state(nnx.state(lora))):
        raise ValueError(f"lora targets {tuple(targets)} name no projection of {cfg.name!r}")
    return lora


def merge_adapter(model: Model) -> Model:
    """A plain model (no adapters) whose kernels are W + scaling * A B: what PEFT's ``merge_and_unload``
    gives. The merge runs in float32; an int8 base is dequantized first, so the result is a float model."""
    refuse_decoding_copy(model, "merge the adapters of")
    cfg = model.config
    if cfg.lora is None:
        raise ValueError(f"{cfg.name!r} has no LoRA adapters to merge")
    plain = cfg.replace(lora_rank=0, lora_targets=(), lora_dropout=0.0, lora_rslora=False, lora_trainable=(),
                        quantize=None, quantize_embeddings=False)
    return _rebuilt(plain, _dense_values(model, jnp.dtype(cfg.param_dtype)), source=model)


edges.provide("merge_adapter", merge_adapter)


def _dense_values(model: Model, dtype) -> dict[tuple, Any]:
    """Every variable of ``model`` that a plain float model has, each kernel dequantized and merged."""
    values = {}
    for path, module in nnx.iter_graph(model):
        if not isinstance(module, nnx.Module) or isinstance(module, LoRA):
            continue
        for name, value in vars(module).items():
            if not isinstance(value, nnx.Variable) or isinstance(value, LoraParam) or \
                    (name.endswith("_scale") and isinstance(value, Quantized)):
                continue
            shape = layout(module, name)
            values[(*path, name)] = value[...] if shape is None else kernel(module, name, dtype, *shape)
    return values


def quantized(model: Model, kind: str = "int8", embeddings: bool = False) -> Model:
    """``model`` with int8 projection kernels (symmetric, per output channel) and everything else as it was;
    ``embeddings`` makes the token table (and so a tied LM head) int8 too, one scale per vocab row.
    An adapter stays as it is, in float, on top of the int8 kernel (QLoRA's arrangement)."""
    refuse_decoding_copy(model, "quantize")
    cfg = model.config
    if cfg.quantization is not None:
        raise ValueError(f"{cfg.name!r} is already quantized ({cfg.quantization.kind})")
    target = cfg.replace(quantize=kind, quantize_embeddings=bool(embeddings))
    abstract = nnx.eval_shape(lambda: _build(target, 0))
    values = _values(model)
    for path, module in nnx.iter_graph(abstract):
        if not isinstance(module, nnx.Module):
            continue
        for name, value in vars(module).items():
            if isinstance(value, Quantized) and not name.endswith("_scale"):
                inputs, batch = layout(module, name)
                q, scale = _quantize_kernel(values[(*path, name)], batch, inputs)
                values[(*path, name)], values[(*path, f"{name}_scale")] = q, scale
    return _rebuilt(target, values, source=model)


# compiled once per kernel shape (eagerly, each of its few operations compiled alone, for every kernel)
_quantize_kernel = jax.jit(quantize_kernel, static_argnums=(1, 2))


def trainable(cfg: ModelConfig) -> nnx.filterlib.Filter:
    """The variables a LoRA fine-tune trains: the adapters and the paths ``lora_trainable`` lists (a
    classification head, say). Everything else stays frozen."""
    prefixes = tuple(cfg.lora.trainable)

    def listed(path, variable) -> bool:
        return isinstance(variable, nnx.Param) and under("/".join(map(str, path)), prefixes)

    return nnx.Any(LoraParam, listed)


def adapter_paths(model: Model) -> list[str]:
    """'/'-joined paths of the adapter factors, for reports."""
    return ["/".join(map(str, p)) for p, v in nnx.to_flat_state(nnx.state(model, LoraParam))]

