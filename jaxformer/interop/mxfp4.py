"""MXFP4 tensors, as gpt-oss publishes its experts, decoded on load.

MXFP4 (the OCP microscaling format) stores 4-bit floats (e2m1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
negatives), two per byte with the low nibble first, in blocks of 32 along the input axis that share one
power-of-two scale (e8m0: 2 ** (byte - 127)). A checkpoint whose ``quantization_config.quant_method`` is
'mxfp4' holds a weight ``W`` as ``W_blocks`` [..., out, in / 32, 16] (uint8) and ``W_scales`` [..., out,
in / 32] (uint8). ``Decoded`` shows such a folder's tensors with each pair read as the float tensor ``W``
[..., in, out] that transformers' dequantizing loader builds, every value exact (a 4-bit float times a
power of two), so the architecture's rules read it as they read an unquantized file.
"""

from __future__ import annotations

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
BLOCKS, SCALES = "_blocks", "_scales"


def holds_mxfp4(hf: dict) -> bool:
    return (hf.get("quantization_config") or {}).get("quant_method") == "mxfp4"


def unpack(packed: np.ndarray) -> np.ndarray:
    """float32 values of e2m1 numbers packed two a byte [..., n] -> [..., 2 n], the low nibble first."""
    nibbles = packed.view(np.uint8)
    values = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), np.float32)
    values[..., 0::2], values[..., 1::2] = E2M1[nibbles & 0x0F], E2M1[nibbles >> 4]
    return values


def decode(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 [..., in, out] of ``blocks`` [..., out, groups, 16] and ``scales`` [..., out, groups]."""
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {blocks.shape} {blocks.dtype} and scales {scales.shape} {scales.dtype} do not "
                         "pair: expected uint8 [..., out, groups, 16] and uint8 [..., out, groups]")
    values = np.ldexp(unpack(blocks), scales.astype(np.int32)[..., None] - 127)
    return np.swapaxes(values.reshape(*blocks.shape[:-2], -1), -1, -2)


class Decoded:
    """A ``TensorFiles`` view in which every ``W_blocks`` / ``W_scales`` pair reads as the float tensor ``W``."""

    def __init__(self, files):
        self._files = files
        stored = set(files.names)
        pairs = {n[:-len(BLOCKS)] for n in stored if n.endswith(BLOCKS) and n[:-len(BLOCKS)] + SCALES in stored}
        lone = sorted(n for n in stored if n.endswith((BLOCKS, SCALES)) and n.rsplit("_", 1)[0] not in pairs)
        if lone:
            raise ValueError(f"MXFP4 checkpoint: {lone[:10]} lack their {BLOCKS} / {SCALES} partner")
        self._pairs = pairs
        self.names = sorted((stored - {p + s for p in pairs for s in (BLOCKS, SCALES)}) | pairs)

    def get(self, name: str) -> np.ndarray:
        if name in self._pairs:
            return decode(self._files.get(name + BLOCKS), self._files.get(name + SCALES))
        return self._files.get(name)
