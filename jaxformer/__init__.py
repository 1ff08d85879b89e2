"""jaxformer: the three Transformer families (encoder, decoder, encoder-decoder) in JAX/Flax NNX.

Shape legend, used in every einsum and docstring:
    B batch    T query length    S key length    D d_model    N query heads    K kv heads
    G query heads per kv head    H head dim    F feed-forward width    V vocabulary
    E experts    L layers

    import jaxformer as jf
    model = jf.build("tiny-gpt")
    out = model(input_ids)
    graphdef, state = jf.split(model)      # pure-function use under jax.jit / jax.grad
"""

from __future__ import annotations

import math

import jax
from flax import nnx

from jaxformer.boundary import ModelOutput
from jaxformer.config import ModelConfig, RopeScaling
from jaxformer.decoder import Decoder
from jaxformer.encoder import Encoder
from jaxformer.encoder_decoder import EncoderDecoder
from jaxformer.presets import config, presets

__all__ = ["ModelConfig", "RopeScaling", "ModelOutput", "Encoder", "Decoder", "EncoderDecoder", "build",
           "config", "presets", "split", "merge", "abstract_params", "param_count", "from_pretrained",
           "load_tokenizer"]

_FAMILY_CLASSES = {"encoder": Encoder, "decoder": Decoder, "encoder_decoder": EncoderDecoder}


def _resolve(name_or_config: str | ModelConfig, dtype: str | None, param_dtype: str | None) -> ModelConfig:
    if isinstance(name_or_config, str):
        cfg = config(name_or_config)
    elif isinstance(name_or_config, ModelConfig):
        cfg = name_or_config
    else:
        raise ValueError(f"build() takes a preset name or a ModelConfig, got {type(name_or_config).__name__}")
    changes = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype)) if v is not None}
    return cfg.replace(**changes) if changes else cfg


def build(name_or_config: str | ModelConfig, seed: int = 0, dtype: str | None = None,
          param_dtype: str | None = None) -> Encoder | Decoder | EncoderDecoder:
    """A freshly initialised model of a preset or config; ``model.config`` is its ModelConfig."""
    cfg = _resolve(name_or_config, dtype, param_dtype)
    return _FAMILY_CLASSES[cfg.family](cfg, rngs=nnx.Rngs(seed))


def abstract_params(name_or_config: str | ModelConfig) -> nnx.State:
    """Parameter shapes and dtypes of a model, traced with ``nnx.eval_shape``: nothing is allocated."""
    cfg = _resolve(name_or_config, None, None)
    model = nnx.eval_shape(lambda: _FAMILY_CLASSES[cfg.family](cfg, rngs=nnx.Rngs(0)))
    return nnx.state(model, nnx.Param)


def param_count(name_or_config: str | ModelConfig) -> int:
    """Number of parameters, counted from abstract shapes (works for 175B on a laptop)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_params(name_or_config)))


def from_pretrained(path, dtype: str | None = None, allow_pickle: bool = False):
    """Load a Hugging Face checkpoint folder (config.json + safetensors); no torch needed."""
    from jaxformer.interop.hf import from_pretrained as load

    return load(path, dtype=dtype, allow_pickle=allow_pickle)


def load_tokenizer(path):
    """The tokenizer.json of a checkpoint folder, as batches of ids ready for the model."""
    from jaxformer.interop.tokenizer import load_tokenizer as load

    return load(path)


split = nnx.split
merge = nnx.merge
