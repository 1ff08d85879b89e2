"""An encoder's audio front end (``ModelConfig.audio``: Whisper): log-mel frames -> two 1-D convolutions of width 3
with GELU (the second of stride 2, halving the frames) -> a stored table of position vectors. Kernels are
[width, in, out] (torch's Conv1d weight is [out, in, width]); the convolutions accumulate in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.layers.core import Buffer, activate, dropout, dtype_of, param
from jaxformer.layers.positions import sinusoids
from jaxformer.model_config import Audio, ModelConfig

Array = jax.Array
WIDTH = 3  # both convolutions' kernel width (zero padding 1 either side)


def check_input_features(audio: Audio, input_features) -> None:
    """Host-side check: [batch >= 1, mel_bins, frames] floats, exactly 2 * source_positions frames, as transformers
    requires (what ``jaxformer.audio.FeatureExtractor`` gives: 30 s padded or cut to 3000 frames)."""
    shape = tuple(np.shape(input_features))
    if len(shape) != 3 or shape[0] == 0 or shape[1:] != (audio.mel_bins, audio.frames):
        raise ValueError(f"input_features has shape {shape}; this model reads [batch >= 1, {audio.mel_bins}, "
                         f"{audio.frames}] (num_mel_bins={audio.mel_bins} log-mel bins, 2 * max_source_positions="
                         f"{audio.frames} frames: pad or cut the audio to that length, as its FeatureExtractor does)")
    dtype = input_features.dtype if hasattr(input_features, "dtype") else np.asarray(input_features).dtype
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"input_features must hold floating-point numbers, got dtype {dtype}")


class AudioFrontEnd(nnx.Module):
    """input_features [B, mel_bins, frames] -> x [B, source_positions, D]: conv1 + GELU, conv2 (stride 2) + GELU,
    plus the position table (all of its rows: the input is always that long), then dropout. The table is a Buffer,
    stored but not trained, as transformers freezes it; built here as Whisper's sinusoids (fairseq's layout)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        audio, D = cfg.audio, cfg.d_model
        self.conv1 = param(rngs, (WIDTH, audio.mel_bins, D), ("conv_width", "conv_in", "embed"), cfg)
        self.conv1_bias = param(rngs, (D,), ("embed",), cfg, init="zeros")
        self.conv2 = param(rngs, (WIDTH, D, D), ("conv_width", "conv_in", "embed"), cfg)
        self.conv2_bias = param(rngs, (D,), ("embed",), cfg, init="zeros")
        table = sinusoids(jnp.arange(audio.source_positions), D, "fairseq")
        self.positions = Buffer(table.astype(dtype_of(cfg.param_dtype)), axes=("positions", "embed"))
        self.dtype, self.dropout_rate = dtype_of(cfg.dtype), cfg.dropout_rate

    def _conv(self, x: Array, kernel: nnx.Param, bias: nnx.Param, stride: int) -> Array:
        y = jax.lax.conv_general_dilated(x, kernel[...].astype(self.dtype), window_strides=(stride,),
                                         padding=[(1, 1)], dimension_numbers=("NWC", "WIO", "NWC"),
                                         preferred_element_type=jnp.float32).astype(self.dtype)
        return activate("gelu", y + bias[...].astype(self.dtype))

    def __call__(self, input_features: Array, key: Array | None = None) -> Array:
        x = jnp.swapaxes(jnp.asarray(input_features, self.dtype), 1, 2)  # [B, frames, mel_bins]
        x = self._conv(self._conv(x, self.conv1, self.conv1_bias, 1), self.conv2, self.conv2_bias, 2)
        return dropout(x + self.positions[...].astype(self.dtype), self.dropout_rate, key)
