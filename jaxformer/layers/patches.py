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
from jaxformer.layers.core import Dense, Norm, activate, dtype_of, param
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
        self.merged = patches.merge > 0  # (Qwen2-VL: patches of ``temporal`` frames, already cut)
        self.projection = Dense(cfg, patches.channels * patches.temporal * patches.patch_size ** 2, cfg.d_model,
                                ("patch", "embed"), rngs=rngs, bias=patches.bias)
        self.class_token = param(rngs, (cfg.d_model,), ("embed",), cfg) if patches.class_token else None

    def __call__(self, pixel_values: Array) -> Array:
        if self.flexible or self.merged:  # (NaFlex, Qwen2-VL: already cut into patches)
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


def check_tiled_pixels(patches: Patches, pixel_values, aspect_ratio_ids, aspect_ratio_mask) -> None:
    """Host-side check of a tiled image batch (what ``jaxformer.vision``'s MllamaImageProcessor returns):
    ``pixel_values`` [B, images, max_tiles, channels, image_size, image_size] floats, ``aspect_ratio_ids``
    [B, images] integers in 0..len(aspect_ratios) (0: no image), ``aspect_ratio_mask`` [B, images, max_tiles]."""
    shape, size = tuple(np.shape(pixel_values)), patches.image_size
    want = (patches.tiles, patches.channels, size, size)
    if pixel_values is None or len(shape) != 6 or shape[2:] != want or 0 in shape[:2]:
        given = "is missing" if pixel_values is None else f"has shape {shape}"
        raise ValueError(f"pixel_values {given}; this tiled image tower reads [batch >= 1, images >= 1, "
                         f"{', '.join(map(str, want))}] (max_tiles, channels, tile height and width), as its image "
                         "processor (MllamaImageProcessor) returns them")
    if not jnp.issubdtype(pixel_values.dtype, jnp.floating):
        raise ValueError(f"pixel_values must hold floating-point numbers, got dtype {pixel_values.dtype}")
    for name, value, expected in (("aspect_ratio_ids", aspect_ratio_ids, shape[:2]),
                                  ("aspect_ratio_mask", aspect_ratio_mask, shape[:3])):
        if value is None or tuple(np.shape(value)) != expected:
            given = "is missing" if value is None else f"has shape {tuple(np.shape(value))}"
            raise ValueError(f"{name} {given}; this tiled image tower needs it of shape {expected} (its image "
                             "processor returns it beside pixel_values)")
    ids = aspect_ratio_ids
    if not isinstance(ids, jax.core.Tracer) and (not np.issubdtype(np.asarray(ids).dtype, np.integer) or not (
            (np.asarray(ids) >= 0) & (np.asarray(ids) <= len(patches.aspect_ratios))).all()):
        raise ValueError(f"aspect_ratio_ids must be integers in [0, {len(patches.aspect_ratios)}] (0: no image, "
                         f"else 1 + the index of the image's arrangement in aspect_ratios), got "
                         f"{np.asarray(ids).tolist()}")


class TileEmbeddings(nnx.Module):
    """Llama 3.2 Vision's embeddings of tiled images, one table row per aspect-ratio id, each added times tanh of a
    learned gate: a vector per tile on its patches before the class token joins (``pre``), a position per tile and
    token weighed against the learned positions by the same gate (``positions``: (1 - tanh g) * learned +
    tanh g * per tile), and a vector per tile on the stack's output before the global layers (``post``)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        patches = cfg.patches
        self.tiles, self.tokens = patches.tiles, patches.tokens
        ids = len(patches.aspect_ratios) + 1  # (id 0: no image)
        axes = ("aspect_ratio", "tile_embed")
        table = lambda per_id: param(rngs, (ids, per_id * cfg.d_model), axes, cfg)  # noqa: E731
        gate = lambda: param(rngs, (1,), ("scalar",), cfg, init="zeros")  # noqa: E731  (as transformers starts them)
        self.pre, self.pre_gate = table(patches.tiles), gate()
        self.positions, self.position_gate = table(patches.tiles * patches.tokens), gate()
        self.post, self.post_gate = table(patches.tiles), gate()

    @staticmethod
    def _gate(gate: nnx.Param, dtype) -> Array:
        return jnp.tanh(gate[...]).astype(dtype)

    def per_tile(self, x: Array, table: nnx.Param, gate: nnx.Param, ids: Array) -> Array:
        """x [N, tiles, T, D] plus each tile's gated vector of its image's aspect-ratio id ``ids`` [N]."""
        vectors = table[...][ids].reshape(x.shape[0], self.tiles, 1, x.shape[-1]).astype(x.dtype)
        return x + vectors * self._gate(gate, x.dtype)

    def gated_positions(self, x: Array, learned: Array, ids: Array) -> tuple[Array, Array]:
        """(x [N, tiles, T, D] plus the learned positions [T, D] times 1 - tanh g, each tile's own positions times
        tanh g): the two terms as transformers adds them, one after the other."""
        tanh = self._gate(self.position_gate, x.dtype)
        x = x + (1 - tanh) * learned.astype(x.dtype)
        per_tile = self.positions[...][ids].reshape(x.shape[0], self.tiles, self.tokens, -1).astype(x.dtype)
        return x, tanh * per_tile


def check_merged_patches(patches: Patches, pixel_values, image_grid_thw) -> None:
    """Host-side check of a Qwen2-VL image batch (what ``jaxformer.vision``'s Qwen2VL processor returns):
    ``pixel_values`` [patches, channels * temporal * p * p] floats and ``image_grid_thw`` [N, 3] integers, each
    image's frames, rows and columns of patches (rows and columns multiples of the merge size), that many
    patches in all."""
    width = patches.channels * patches.temporal * patches.patch_size ** 2
    shape = tuple(np.shape(pixel_values))
    if pixel_values is None or len(shape) != 2 or shape[0] == 0 or shape[1] != width:
        given = "is missing" if pixel_values is None else f"has shape {shape}"
        raise ValueError(f"pixel_values {given}; this image tower reads [patches >= 1, {width}] (channels * "
                         "temporal_patch_size * patch_size², as the Qwen2-VL image processor returns them)")
    if not jnp.issubdtype(pixel_values.dtype, jnp.floating):
        raise ValueError(f"pixel_values must hold floating-point numbers, got dtype {pixel_values.dtype}")
    grid_shape = tuple(np.shape(image_grid_thw))
    if image_grid_thw is None or len(grid_shape) != 2 or grid_shape[1] != 3 or grid_shape[0] == 0:
        given = "is missing" if image_grid_thw is None else f"has shape {grid_shape}"
        raise ValueError(f"image_grid_thw {given}; this image tower needs it [images >= 1, 3]: each image's "
                         "frames, rows and columns of patches (its processor returns it beside pixel_values)")
    if isinstance(image_grid_thw, jax.core.Tracer):
        return
    grids = np.asarray(image_grid_thw)
    if not np.issubdtype(grids.dtype, np.integer) or (grids <= 0).any() or (grids[:, 1:] % patches.merge).any():
        raise ValueError(f"image_grid_thw={grids.tolist()} must hold positive integers, rows and columns multiples "
                         f"of patch_merge_size={patches.merge}")
    if int(grids.prod(-1).sum()) != shape[0]:
        raise ValueError(f"image_grid_thw={grids.tolist()} gives {int(grids.prod(-1).sum())} patches but "
                         f"pixel_values holds {shape[0]}")


def merged_layout(patches: Patches, grid_thw: Array, count: int) -> tuple[Array, Array, Array, Array]:
    """Where the stack runs each of ``count`` patches of a Qwen2-VL image batch (traceable: computed from
    image_grid_thw [N, 3] with the patch count known). The processor gives each image's frames in turn, each frame's
    merge x merge blocks row by row; Qwen2.5-VL's tower runs them window by window (``patches.window`` pixels a
    side), each window's blocks row by row, as transformers' window_index orders them. Returns, in the stack's order:
    the processor's index of each patch [P]; its row and column [P, 2] (the 2-D rotary positions); its frame [P]
    (1, 2, ... across images: attention never crosses one, transformers' cu_seqlens); its window [P] (1, 2, ...;
    the frame's where there are no windows)."""
    m = patches.merge
    grid = jnp.asarray(grid_thw, jnp.int32)
    at = jnp.arange(count, dtype=jnp.int32)
    sizes = grid.prod(-1)
    image = jnp.searchsorted(jnp.cumsum(sizes), at, side="right")
    t, h, w = (grid[image, i] for i in range(3))
    local = at - (jnp.cumsum(sizes) - sizes)[image]
    frame = (jnp.cumsum(grid[:, 0]) - grid[:, 0])[image] + local // (h * w)  # counted across the images
    within = local % (h * w)
    block, inner = within // (m * m), within % (m * m)
    block_row, block_col = block // (w // m), block % (w // m)
    rows, cols = block_row * m + inner // m, block_col * m + inner % m
    side = patches.window // m // patches.patch_size  # blocks a window side (transformers' arithmetic)
    if side:
        across = -(-(w // m) // side)  # windows along a frame's row
        # numbered as the windows run: those of the frames before, then this frame's row by row (no product with
        # the patch count, which would overflow int32 on long videos)
        per_frame = -(-(grid[:, 2] // m) // side) * -(-(grid[:, 1] // m) // side)  # windows in a frame, per image
        before = jnp.cumsum(grid[:, 0] * per_frame) - grid[:, 0] * per_frame
        window = (before[image] + local // (h * w) * per_frame[image] + (block_row // side) * across
                  + block_col // side)
    else:
        window = frame
    order = jnp.argsort(window, stable=True)  # (within a window the processor's order is the blocks' row order)
    rotary = jnp.stack([rows, cols], -1)[order]
    return order, rotary, frame[order] + 1, window[order] + 1


class PatchMerger(nnx.Module):
    """Qwen2-VL's merger: each state normed, each merge x merge block's states [merge² * D] joined, then Linear,
    GELU, Linear to ``merged_width`` (the text model's width)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.width = cfg.d_model * cfg.patches.merge ** 2
        self.norm = Norm(cfg, rngs=rngs)
        self.fc1 = Dense(cfg, self.width, self.width, ("embed_out", "mlp"), rngs=rngs)
        self.fc2 = Dense(cfg, self.width, cfg.patches.merged_width, ("mlp", "embed_out"), rngs=rngs)

    def __call__(self, h: Array) -> Array:
        """[P, D] -> [P / merge², merged_width]."""
        return self.fc2(activate("gelu", self.fc1(self.norm(h).reshape(-1, self.width))))
