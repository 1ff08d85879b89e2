"""Block-wise FP8 checkpoints (DeepSeek-V3 / R1 / V3.1 / V3.2, Kimi K2, Qwen3-*-FP8 and others), decoded on load.

A checkpoint whose ``quantization_config.quant_method`` is 'fp8' (transformers' FineGrainedFP8Config) stores each
quantized Linear weight ``W`` as float8_e4m3fn [..., out, in] beside ``W_scale_inv`` [..., ceil(out / b0),
ceil(in / b1)] for ``weight_block_size`` [b0, b1] (usually [128, 128]; null: one scale for the whole tensor). The
value is ``W[i, j] * W_scale_inv[i // b0, j // b1]``: a block at the bottom or right edge is partial when a width is
not a multiple of the block (DeepSeek-V3's kv_a_proj_with_mqa has 576 rows, 4.5 blocks), as transformers' FP8Linear
and DeepSeek's own weight_dequant read it. Modules left unquantized (``modules_to_not_convert``, the embeddings, the
head, routers, norms) are stored as ordinary tensors without a scale. ``Decoded`` shows a folder's tensors with each
pair read as that float32 product (one float32 multiply, as transformers' dequantizing loader computes it: the same
bits), so every architecture's rules read it as they read an unquantized file; the scales never reach the check
for unused tensors. DeepSeek-V4's own files name ``W.weight``'s scale ``W.scale`` (transformers renames every
``.scale`` to ``.weight_scale_inv``), and pack its experts as FP4 (``expert_dtype`` 'fp4'): int8 bytes of two e2m1
values each, the low nibble first, beside UE8M0 scales whose grid sets the block (1 x 32), as transformers' dequantizing
loader reads them. The forward then runs on the decoded weights, as transformers' does with ``dequantize=True`` (its
only path on CPU); its FP8 GPU kernels also round each activation to FP8 per 128 inputs, which this does not.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from jaxformer.interop.mxfp4 import unpack as unpack_fp4

SCALE = "_scale_inv"
OWN_SCALE = ".scale"  # DeepSeek-V4's spelling: W.scale beside W.weight
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
FORMATS = ("e4m3", "float8_e4m3fn")  # the spellings published files give the one format decoded here
SCALE_DTYPES = (np.float32, np.float16, ml_dtypes.bfloat16)  # fp32 (V3) scales, or the 16-bit floats


def holds_fp8(hf: dict) -> bool:
    # (dict.get: asking must not count as reading the key, so another quant_method is still refused as unread)
    quantization = dict.get(hf, "quantization_config")
    return isinstance(quantization, dict) and quantization.get("quant_method") == "fp8"


def weight_block(quantization: dict) -> tuple[int, int] | None:
    """The block [rows, columns] one scale covers (None: one scale per tensor), after refusing by name each
    quantization_config setting that changes the numbers in a way not decoded here. Keys that change nothing load:
    ``dequantize`` (always so here), ``modules_to_not_convert`` / ``ignored_layers`` (those modules' tensors are
    stored unquantized, without a scale, and read as they are), ``scale_fmt`` (the scales' stored dtype says it)."""
    def refuse(key: str, why: str) -> None:
        raise ValueError(f"quantization_config.{key}={quantization.get(key)!r} is not supported: {why}; "
                         "supported: block-wise FP8 (fmt 'e4m3', activation_scheme 'dynamic'), decoded on load")

    if quantization.get("fmt", "e4m3") not in FORMATS:
        refuse("fmt", f"only float8_e4m3fn weights ({' / '.join(FORMATS)}) are decoded")
    if str(quantization.get("activation_scheme", "dynamic")).lower() != "dynamic":
        refuse("activation_scheme", "static activation scales (activation_scale tensors) round each input to FP8")
    if quantization.get("expert_dtype", "fp8") not in ("fp8", "fp4"):
        refuse("expert_dtype", "experts are stored as FP8 or packed as FP4")
    if quantization.get("scale_fmt", "float") not in ("float", "ue8m0"):
        refuse("scale_fmt", "scales are float32 ('float') or powers of two ('ue8m0')")
    if quantization.get("modules_to_convert"):
        refuse("modules_to_convert", "FP8 embedding tables are not decoded")
    block = quantization.get("weight_block_size", [128, 128])
    if block is None:
        return None
    if not (isinstance(block, (list, tuple)) and len(block) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        refuse("weight_block_size", "it must be two positive integers [rows, columns] (or null: one scale a tensor)")
    return int(block[0]), int(block[1])


def scales_as_float32(scales: np.ndarray, name: str) -> np.ndarray:
    """float32 scales: stored as floats, or as UE8M0 exponents (a byte b is 2 ** (b - 127), 'ue8m0' files)."""
    if scales.dtype == np.uint8 or scales.dtype == np.dtype(ml_dtypes.float8_e8m0fnu):
        return np.ldexp(np.float32(1), scales.view(np.uint8).astype(np.int32) - 127)
    if scales.dtype not in [np.dtype(d) for d in SCALE_DTYPES]:
        raise ValueError(f"FP8 checkpoint: {name} is {scales.dtype}; scales are float32, float16, bfloat16 or UE8M0")
    return scales.astype(np.float32)


def expected_scale_shape(shape: tuple[int, ...], block: tuple[int, int] | None) -> tuple[int, ...]:
    if block is None:
        return ()
    return (*shape[:-2], math.ceil(shape[-2] / block[0]), math.ceil(shape[-1] / block[1]))


def fp4_block(name: str, packed: np.ndarray, scales: np.ndarray, scale_name: str) -> tuple[int, int]:
    """The block of FP4 weights packed two a byte [..., out, in / 2]: what their scale grid divides them into, as
    transformers derives it (refusing a grid that does not divide them)."""
    rows, width = packed.shape[-2], 2 * packed.shape[-1]
    if scales.ndim != packed.ndim or scales.shape[:-2] != packed.shape[:-2] or rows % scales.shape[-2] \
            or width % scales.shape[-1]:
        raise ValueError(f"FP8 checkpoint: {scale_name} has shape {list(scales.shape)}, which does not divide the "
                         f"FP4 weights {name} [{', '.join(map(str, (*packed.shape[:-1], width)))}] into blocks")
    return rows // scales.shape[-2], width // scales.shape[-1]


def check_pair(name: str, weight: np.ndarray, scales: np.ndarray, block: tuple[int, int] | None,
               scale_name: str | None = None) -> None:
    """Refuse, naming the tensors, a weight that is not float8_e4m3fn (or FP4 packed in int8) or scales that do not
    tile it by ``block``."""
    scale_name = scale_name or name + SCALE
    if weight.dtype == np.int8 and weight.ndim >= 2:
        fp4_block(name, weight, scales, scale_name)
        return
    if weight.dtype != E4M3 or weight.ndim < 2:
        raise ValueError(f"FP8 checkpoint: {name} has {scale_name} beside it but is {weight.dtype} "
                         f"{list(weight.shape)}; a scaled weight must be float8_e4m3fn [..., out, in] (or FP4 packed "
                         "two a byte in int8)")
    wanted = expected_scale_shape(weight.shape, block)
    per_tensor = block is None and scales.size == 1 and scales.ndim <= weight.ndim
    if tuple(scales.shape) != wanted and not per_tensor:
        raise ValueError(f"FP8 checkpoint: {scale_name} has shape {list(scales.shape)}; {name} "
                         f"{list(weight.shape)} in blocks of weight_block_size={list(block) if block else None} "
                         f"needs {list(wanted)}")


def decode(weight: np.ndarray, scales: np.ndarray, block: tuple[int, int] | None, name: str = "W",
           scale_name: str | None = None) -> np.ndarray:
    """float32 ``weight`` [..., out, in] times its block's scale (edge blocks cropped), in the file's layout; FP4
    packed in int8 [..., out, in / 2] unpacked first, its block read from the scale grid."""
    scale_name = scale_name or name + SCALE
    check_pair(name, weight, scales, block, scale_name)
    if weight.dtype == np.int8:
        block = fp4_block(name, weight, scales, scale_name)
        weight = unpack_fp4(weight)
    values = weight.astype(np.float32)
    scales = scales_as_float32(scales, scale_name)
    if block is None:
        return values * scales.reshape(())
    # scales spread over rows only, then over columns through a view of the weight (no second weight-sized array)
    rows, cols = weight.shape[-2:]
    by_row = np.repeat(scales, block[0], axis=-2)[..., :rows, :]
    whole = cols // block[1]
    values[..., :whole * block[1]].reshape(*weight.shape[:-1], whole, block[1])[...] *= by_row[..., :whole, None]
    if cols % block[1]:
        values[..., whole * block[1]:] *= by_row[..., whole:]
    return values


def _quantized(files, name: str, stored: set[str]) -> bool:
    """Whether ``name`` is a stored float8 or packed-FP4 (int8) tensor, which a ``.scale`` beside it scales."""
    return name in stored and (files.get(name).dtype == np.int8 or files.get(name).dtype.name.startswith("float8"))


class Decoded:
    """A ``TensorFiles`` view in which every float8 (or packed FP4) ``W`` / ``W_scale_inv`` pair (``P.weight`` /
    ``P.scale`` in DeepSeek-V4's files) reads as the float32 tensor ``W``. Every pair is checked when the view is made
    (dtype and scale shape), before anything is built."""

    def __init__(self, files, hf: dict):
        self._files = files
        self._block = weight_block(hf["quantization_config"])
        stored = set(files.names)
        self._scale_of = {n[:-len(SCALE)]: n for n in stored if n.endswith(SCALE)}
        # (a P.scale beside no quantized P.weight is a parameter of its own: Gemma 4's router.scale)
        self._scale_of.update({n[:-len(OWN_SCALE)] + ".weight": n for n in stored if n.endswith(OWN_SCALE)
                               and _quantized(files, n[:-len(OWN_SCALE)] + ".weight", stored)})
        lone_scales = sorted(s for w, s in self._scale_of.items() if w not in stored)
        if lone_scales:
            raise ValueError(f"FP8 checkpoint: {lone_scales[:10]} scale no tensor of the file")
        for name, scale in sorted(self._scale_of.items()):
            check_pair(name, files.get(name), files.get(scale), self._block, scale)
        # a float8 tensor without its scale has no defined value (transformers would leave the scale uninitialised)
        scales = set(self._scale_of.values())
        # (and with expert_dtype 'fp4', an int8 tensor without its scale is packed FP4 of no defined value)
        fp4 = hf.get("expert_dtype") == "fp4"
        unscaled = sorted(n for n in stored - set(self._scale_of) - scales
                          if files.get(n).dtype.name.startswith("float8") or (fp4 and files.get(n).dtype == np.int8))
        if unscaled:
            raise ValueError(f"FP8 checkpoint: {unscaled[:10]} are float8 (or packed FP4) and no {SCALE} (or "
                             f"{OWN_SCALE}) tensor scales them (Mistral's '.qscale_weight' scales are not read)")
        self.names = sorted(stored - scales)

    def get(self, name: str) -> np.ndarray:
        if name in self._scale_of:
            scale = self._scale_of[name]
            return decode(self._files.get(name), self._files.get(scale), self._block, name, scale)
        return self._files.get(name)


def quantize(weight: np.ndarray, block: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray]:
    """(float8_e4m3fn weight, float32 scale_inv) of a float weight [..., out, in], as transformers' Fp8Quantize
    computes them (each block's largest magnitude becomes 448; an all-zero block keeps scale 1), with partial edge
    blocks as the published files have them. For tests and the held-out measurement: export writes floats."""
    weight = np.asarray(weight, np.float32)
    rows, cols = weight.shape[-2:]
    b0, b1 = block or (rows, cols)
    grid = expected_scale_shape(weight.shape, (b0, b1))
    padded = np.zeros((*weight.shape[:-2], grid[-2] * b0, grid[-1] * b1), np.float32)
    padded[..., :rows, :cols] = weight
    blocks = padded.reshape(*weight.shape[:-2], grid[-2], b0, grid[-1], b1)
    peak = np.abs(blocks).max(axis=(-3, -1))
    fp8_max = np.float32(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
    scale = np.where(peak > 0, fp8_max / np.where(peak > 0, peak, 1), np.float32(1)).astype(np.float32)
    scaled = blocks * scale[..., :, None, :, None]
    values = np.clip(scaled, -fp8_max, fp8_max).astype(E4M3).reshape(padded.shape)[..., :rows, :cols]
    scale_inv = (np.float32(1) / scale).astype(np.float32)
    return np.ascontiguousarray(values), (scale_inv.reshape(()) if block is None else scale_inv)
