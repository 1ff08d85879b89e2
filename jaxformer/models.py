"""The family registry and the builders: a model from a preset name or a ModelConfig.

Every module that needs a model of a config (the package face, interop, checkpoints, FLOPs) builds it
here, so none of them imports the package face.
"""

from __future__ import annotations

import functools
import math

from flax import nnx

from jaxformer.model_config import ModelConfig
from jaxformer.decoder import Decoder
from jaxformer.dual_encoder import DualEncoder
from jaxformer.encoder import Encoder
from jaxformer.encoder_decoder import EncoderDecoder
from jaxformer.layers import RouterBias
from jaxformer.presets import config

FAMILIES = {"encoder": Encoder, "decoder": Decoder, "encoder_decoder": EncoderDecoder, "dual_encoder": DualEncoder}
Model = Encoder | Decoder | EncoderDecoder | DualEncoder

# What a loaded checkpoint's Hugging Face files say beyond the ModelConfig: config.json's fields the model
# does not hold, and generation_config.json (JSON strings, so that nnx keeps them as plain attributes).
HF_FILES = ("hf_config", "generation_config")


def carry_hf_files(source, model):
    """``model`` with ``source``'s ``HF_FILES`` attributes (a model rebuilt from a loaded one)."""
    for name in HF_FILES:
        if getattr(source, name, None) is not None:
            setattr(model, name, getattr(source, name))
    return model


def resolve(name_or_config: str | ModelConfig, dtype: str | None = None, param_dtype: str | None = None) -> ModelConfig:
    """The ModelConfig of a preset name or a config, with the dtypes replaced where given."""
    if isinstance(name_or_config, str):
        cfg = config(name_or_config)
    elif isinstance(name_or_config, ModelConfig):
        cfg = name_or_config
    else:
        raise ValueError(f"build() takes a preset name or a ModelConfig, got {type(name_or_config).__name__}")
    changes = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype)) if v is not None}
    return cfg.replace(**changes) if changes else cfg


def build(name_or_config: str | ModelConfig, seed: int = 0, dtype: str | None = None,
          param_dtype: str | None = None) -> Model:
    """A freshly initialised model of a preset or config; ``model.config`` is its ModelConfig."""
    cfg = resolve(name_or_config, dtype, param_dtype)
    return FAMILIES[cfg.family](cfg, rngs=nnx.Rngs(seed))


def abstract_model(name_or_config: str | ModelConfig) -> Model:
    """The model with abstract arrays (``nnx.eval_shape``): shapes and dtypes, nothing allocated."""
    cfg = resolve(name_or_config)
    return nnx.eval_shape(lambda: FAMILIES[cfg.family](cfg, rngs=nnx.Rngs(0)))


def abstract_params(name_or_config: str | ModelConfig) -> nnx.State:
    """Parameter shapes and dtypes of a model, traced with ``nnx.eval_shape``: nothing is allocated."""
    return nnx.state(abstract_model(name_or_config), nnx.Param)


def param_count(name_or_config: str | ModelConfig) -> int:
    """Number of trained parameters, counted from abstract shapes (works for 175B on a laptop); like
    Hugging Face, DeepSeek-V3's router selection bias (a ``RouterBias``, moved by balancing) is left out."""
    return _param_count(resolve(name_or_config))


@functools.lru_cache(maxsize=256)
def _param_count(cfg: ModelConfig) -> int:
    """``param_count`` of a config (frozen: a key), remembered: tracing the model costs ~0.1 s, and info, parity and
    export code ask again for the same configs."""
    params = nnx.state(abstract_model(cfg), nnx.Param)
    return sum(math.prod(v.shape) for _, v in nnx.to_flat_state(params) if not isinstance(v, RouterBias))
