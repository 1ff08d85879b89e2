"""An image tower's front end and its attention pooler (``ModelConfig.patches``).

The patch projection is the strided convolution of ViT, CLIP and SigLIP computed as one matmul: each
p x p patch of the C channels flattened in (C, p, p) order, times a kernel [C * p * p, D], which is the
convolution weight [D, C, p, p] reshaped and transposed (so a checkpoint round-trips byte for byte). Patches
run row by row, as the convolution's output flattens. At another resolution (``interpolate_pos_encoding``, as
transformers offers it) the patch grid's position table is resampled as torch's bicubic interpolation does it.
SigLIP2's NaFlex front end (``Patches.flexible``) takes images already cut into patches, padded to one count, and
resizes the square position grid to each image's grid of patches (antialiased bilinear), as transformers does.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.layers.attention import dot_product_attention
from jaxformer.layers.core import Dense, Norm, dtype_of, param
from jaxformer.layers.feedforward import MLP
from jaxformer.model_config import ModelConfig, Patches

Array = jax.Array


def check_pixel_values(patches: Patches, pixel_values, any_size: bool = False) -> None:
    """Host-side check of ``pixel_values``: [B, channels, image_size, image_size] floats, as the tower was built
    (transformers' layout, what ``jaxformer.vision.ImageProcessor`` returns); with ``any_size`` (the positions
    resampled) any height and width of at least one patch."""
    shape = tuple(np.shape(pixel_values))
    want = (patches.channels, patches.image_size, patches.image_size)
    sized = len(shape) == 4 and (shape[1:] == want if not any_size else
                                 shape[1] == want[0] and min(shape[2:]) >= patches.patch_size)
    if not sized or shape[0] == 0:
        size = (f"{want[1]}, {want[2]}] (channels, height and width as its config's num_channels and image_size: "
                "resize the image with its processor, or pass interpolate_pos_encoding=True)" if not any_size else
                f"H, W] (H and W at least patch_size={patches.patch_size})")
        raise ValueError(f"pixel_values has shape {shape}; this image tower reads [batch >= 1, {want[0]}, {size}")
    if not jnp.issubdtype(pixel_values.dtype, jnp.floating):
        raise ValueError(f"pixel_values must hold floating-point numbers, got dtype {pixel_values.dtype}")


def check_flexible_patches(patches: Patches, pixel_values, pixel_attention_mask, spatial_shapes) -> None:
    """Host-side check of a NaFlex image batch (what ``jaxformer.vision.Siglip2ImageProcessor`` returns):
    ``pixel_values`` [B, N, p * p * channels] floats, ``pixel_attention_mask`` [B, N] (or None: every patch real)
    and ``spatial_shapes`` [B, 2], each image's grid of patches (rows, columns), at most N patches."""
    shape, width = tuple(np.shape(pixel_values)), patches.channels * patches.patch_size ** 2
    if pixel_values is None or len(shape) != 3 or shape[0] == 0 or shape[1] == 0 or shape[2] != width:
        given = "is missing" if pixel_values is None else f"has shape {shape}"
        raise ValueError(f"pixel_values {given}; this NaFlex image tower reads [batch >= 1, patches >= 1, {width}] "
                         "(each patch flattened, as Siglip2ImageProcessor returns them)")
    if not jnp.issubdtype(pixel_values.dtype, jnp.floating):
        raise ValueError(f"pixel_values must hold floating-point numbers, got dtype {pixel_values.dtype}")
    if spatial_shapes is None:
        raise ValueError("this NaFlex image tower needs spatial_shapes [batch, 2]: each image's rows and columns of "
                         "patches (its processor returns them)")
    grids = np.asarray(spatial_shapes)
    if grids.shape != (shape[0], 2) or not np.issubdtype(grids.dtype, np.integer):
        raise ValueError(f"spatial_shapes has shape {grids.shape} and dtype {grids.dtype}; expected integers of "
                         f"shape ({shape[0]}, 2)")
    if (grids <= 0).any() or (grids.prod(-1) > shape[1]).any():
        raise ValueError(f"spatial_shapes={grids.tolist()} must give each image rows, columns > 0 and at most "
                         f"{shape[1]} patches (pixel_values' second axis)")
    if pixel_attention_mask is not None and tuple(np.shape(pixel_attention_mask)) != shape[:2]:
        raise ValueError(f"pixel_attention_mask has shape {tuple(np.shape(pixel_attention_mask))}; expected "
                         f"{shape[:2]} (one entry per patch of pixel_values)")


def resized_grid_positions(table: Array, spatial_shapes: Array, length: int) -> Array:
    """[B, length, D]: the square grid of learned positions ``table`` [side * side, D] resized to each image's
    grid (``spatial_shapes`` [B, 2]) with the weights of F.interpolate(mode='bilinear', align_corners=False,
    antialias=True) (a triangle filter widened by the scale when shrinking), row by row, then padded to ``length``
    with the first position's value, as transformers 5's Siglip2VisionEmbeddings computes them (torch's own CPU
    kernel differs from them for a one-column grid)."""
    side = math.isqrt(table.shape[0])
    sizes = spatial_shapes.astype(jnp.float32)[:, None]  # [B, 1, 2]
    at = jnp.arange(length, dtype=jnp.float32)[None, :, None]  # [1, T, 1]
    rows = jnp.floor(at / sizes[..., 1:])
    index = jnp.concatenate([rows, at - rows * sizes[..., 1:]], -1) * (at < sizes.prod(-1, keepdims=True))
    scale = side / sizes
    support = jnp.maximum(scale, 1.0)
    center = (index + 0.5) * scale - 0.5  # [B, T, 2]: each output's source coordinate along rows and columns
    source = jnp.arange(side, dtype=jnp.float32)
    weights = jnp.maximum(1 - jnp.abs(source - center[..., None]) / support[..., None], 0)  # [B, T, 2, side]
    weights = weights / weights.sum(-1, keepdims=True)
    grid = table.astype(jnp.float32).reshape(side, side, -1)
    return jnp.einsum("BTy,BTx,yxD->BTD", weights[..., 0, :], weights[..., 1, :], grid,
                      precision=jax.lax.Precision.HIGHEST).astype(table.dtype)


def patchify(pixel_values: Array, size: int) -> Array:
    """[B, C, H, W] -> [B, (H/p) * (W/p), C * p * p]: each patch flattened as the convolution weight is."""
    B, C, H, W = pixel_values.shape
    grid = pixel_values.reshape(B, C, H // size, size, W // size, size)
    return grid.transpose(0, 2, 4, 1, 3, 5).reshape(B, (H // size) * (W // size), C * size * size)


@functools.lru_cache(maxsize=32)
def bicubic_matrix(old: int, new: int) -> np.ndarray:
    """[new, old]: torch's bicubic resampling of one axis (align_corners=False, A = -0.75, neighbours past the edge
    clamped to it, no antialiasing) as a matrix, in float32 by torch's formulas. A weight may differ from torch's by
    a float32 rounding (up to 1.3e-6 measured: its compiled kernel fuses multiply-adds), which a position table of
    large values carries into the embeddings (about 1e-6 relative)."""
    f = np.float32
    A, scale = f(-0.75), f(old) / f(new)
    near = lambda x: ((A + f(2)) * x - (A + f(3))) * x * x + f(1)  # noqa: E731  (|x| <= 1)
    far = lambda x: ((A * x - f(5) * A) * x + f(8) * A) * x - f(4) * A  # noqa: E731  (1 < |x| < 2)
    out = np.zeros((new, old), np.float32)
    for i in range(new):
        source = scale * f(i + 0.5) - f(0.5)
        base = math.floor(source)
        t = source - f(base)
        for k, weight in enumerate((far(t + f(1)), near(t), near(f(1) - t), far(f(2) - t))):
            out[i, min(max(base - 1 + k, 0), old - 1)] += weight
    return out


class PatchEmbedding(nnx.Module):
    """pixel_values [B, C, H, W] -> token vectors [B, T, D]: the patches projected, the class token first."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        patches = cfg.patches
        self.size, self.dtype, self.flexible = patches.patch_size, dtype_of(cfg.dtype), patches.flexible
        self.projection = Dense(cfg, patches.channels * patches.patch_size ** 2, cfg.d_model, ("patch", "embed"),
                                rngs=rngs, bias=patches.bias)
        self.class_token = param(rngs, (cfg.d_model,), ("embed",), cfg) if patches.class_token else None

    def __call__(self, pixel_values: Array) -> Array:
        if self.flexible:  # (NaFlex: already cut into patches)
            return self.projection(pixel_values.astype(self.dtype))
        H, W = (n - n % self.size for n in pixel_values.shape[2:])  # (the convolution drops a partial patch)
        x = self.projection(patchify(pixel_values[:, :, :H, :W].astype(self.dtype), self.size))
        if self.class_token is None:
            return x
        first = jnp.broadcast_to(self.class_token[...].astype(x.dtype), (x.shape[0], 1, x.shape[-1]))
        return jnp.concatenate([first, x], axis=1)

    def resampled_positions(self, table: Array, height: int, width: int) -> Array:
        """[1, T, D]: the learned positions ``table`` of the built grid for an image of ``height`` x ``width`` (the
        class token's row as it is, the patch grid's resampled bicubically), as transformers'
        ``interpolate_pos_encoding`` gives them."""
        first = 1 if self.class_token is not None else 0
        grid = table[first:].astype(jnp.float32)
        side = math.isqrt(grid.shape[0])
        rows, cols = bicubic_matrix(side, height // self.size), bicubic_matrix(side, width // self.size)
        patches = jnp.einsum("yh,hwD,xw->yxD", rows, grid.reshape(side, side, -1), cols,
                             precision=jax.lax.Precision.HIGHEST).reshape(-1, grid.shape[-1])
        return jnp.concatenate([table[:first].astype(jnp.float32), patches])[None].astype(self.dtype)


class AttentionPooler(nnx.Module):
    """SigLIP's multihead attention pooling: a learned probe attends over the states (torch's
    nn.MultiheadAttention: q, k, v and output projections with biases), then x + MLP(norm(x)); [B, T, D] -> [B, D]."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D = cfg.d_model
        self.heads, self.dtype = cfg.num_heads, dtype_of(cfg.dtype)
        self.probe = param(rngs, (D,), ("embed",), cfg)
        self.q, self.k, self.v, self.o = (Dense(cfg, D, D, ("embed", "embed_out"), rngs=rngs) for _ in range(4))
        self.norm = Norm(cfg, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs, bias=True)

    def __call__(self, h: Array, valid: Array | None = None) -> Array:
        """``valid`` [B, T]: the real states (NaFlex's padding left out, as torch's key_padding_mask does)."""
        B, T, D = h.shape
        N, H = self.heads, D // self.heads
        probe = jnp.broadcast_to(self.probe[...].astype(h.dtype), (B, 1, D))
        q = self.q(probe).reshape(B, 1, N, H)
        k, v = self.k(h).reshape(B, T, N, H), self.v(h).reshape(B, T, N, H)
        mask = jnp.ones((1, 1, 1, T), bool) if valid is None else valid.astype(bool)[:, None, None, :]
        x = self.o(dot_product_attention(q, k, v, mask, None, H ** -0.5).reshape(B, 1, D))
        return (x + self.mlp(self.norm(x)))[:, 0]
