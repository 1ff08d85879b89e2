"""DeBERTa v2's convolution beside the first layer: local n-gram features of the embeddings added to the
first layer's output (``conv_kernel_size``; the published v2 xlarge and xxlarge have one, v3 has none)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.model_config import ModelConfig
from jaxformer.layers.core import Norm, activate, dropout, dtype_of, param

Array = jax.Array


class SequenceConvolution(nnx.Module):
    """LayerNorm(first layer's output + act(conv(embeddings))), pads zeroed before and after: a 1-D
    convolution over the sequence, ``conv_kernel_size`` wide (odd: zero padding keeps the length), in
    ``conv_groups`` groups of channels. Kernel [width, D / groups, D] (torch's Conv1d weight is [D, D / groups,
    width])."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, width, groups = cfg.d_model, cfg.conv.kernel_size, cfg.conv.groups
        self.kernel = param(rngs, (width, D // groups, D), ("conv_width", "conv_in", "embed"), cfg)
        self.bias = param(rngs, (D,), ("embed",), cfg, init="zeros")
        self.norm = Norm(cfg, rngs=rngs)
        self.groups, self.activation, self.dropout_rate = groups, cfg.conv.activation, cfg.dropout_rate
        self.dtype = dtype_of(cfg.dtype)

    def __call__(self, embeddings: Array, layer_output: Array, valid: Array | None, key: Array | None = None
                 ) -> Array:
        real = 1.0 if valid is None else valid[..., None].astype(self.dtype)
        half = self.kernel.shape[0] // 2
        out = jax.lax.conv_general_dilated(
            embeddings * real, self.kernel[...].astype(self.dtype), window_strides=(1,), padding=[(half, half)],
            dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=self.groups,
            preferred_element_type=jnp.float32).astype(self.dtype)
        out = activate(self.activation, dropout((out + self.bias[...].astype(self.dtype)) * real, self.dropout_rate,
                                                key))
        return self.norm(layer_output + out) * real
