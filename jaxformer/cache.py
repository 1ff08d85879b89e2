"""What a cached step carries from one call to the next: small typed pytrees.

A family's ``step`` takes one of these and returns its successor; the generation loop asks the family
for an empty one (``init_cache``) and otherwise knows only ``step`` and the state's ``reorder``. A new kind of carried state (MLA's latent cache, Transformer-XL's
segment memory) is a new type or field here, never a second forward pass.

- ``KVCache``: every layer's keys and values of earlier tokens (only the kv heads), with each slot's
  position and validity, so visibility (padding, windows, prefixes) is computed from positions.
- ``EncoderKV``: an encoder-decoder's cross-attention keys and values, computed once per source.
- ``DecodeState``: what a decoder's step carries: its KV cache, the encoder side, the prefix sizes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Keys and values k, v [L, B, S, K, H] of the tokens written so far; ``positions`` and ``valid``
    [B, S] say where each slot's token sits and whether it is real (padding and unwritten slots are
    not); ``index`` is the next slot to write."""

    k: Array
    v: Array
    positions: Array
    valid: Array
    index: Array

    @classmethod
    def empty(cls, layers: int, batch: int, length: int, kv_heads: int, head_dim: int, dtype) -> KVCache:
        shape = (layers, batch, length, kv_heads, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch, length), jnp.int32),
                   jnp.zeros((batch, length), bool), jnp.int32(0))

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def check_room(self, count: int) -> None:
        """A step that would write past the cache is refused when the index is known on the host (JAX
        would clamp the write silently); under jit the caller sized the cache."""
        if not isinstance(self.index, jax.core.Tracer) and int(self.index) + count > self.length:
            raise ValueError(f"decoding {count} tokens at cache index {int(self.index)} overflows a cache of "
                             f"{self.length} slots")

    def write(self, k: Array, v: Array, positions: Array, valid: Array) -> KVCache:
        """The cache with T new tokens written at ``index``: k, v [L, B, T, K, H], positions and
        validity [B, T]. One in-place update per array, after every layer has run."""
        at = self.index
        return KVCache(jax.lax.dynamic_update_slice(self.k, k.astype(self.k.dtype), (0, 0, at, 0, 0)),
                       jax.lax.dynamic_update_slice(self.v, v.astype(self.v.dtype), (0, 0, at, 0, 0)),
                       jax.lax.dynamic_update_slice_in_dim(self.positions, positions.astype(jnp.int32), at, axis=1),
                       jax.lax.dynamic_update_slice_in_dim(self.valid, valid.astype(bool), at, axis=1),
                       at + k.shape[2])

    def reorder(self, rows: Array) -> KVCache:
        """The cache of batch rows ``rows`` (beam search: each surviving beam takes its parent's)."""
        return dataclasses.replace(self, k=self.k[:, rows], v=self.v[:, rows], positions=self.positions[rows],
                                   valid=self.valid[rows])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EncoderKV:
    """Cross-attention keys and values of a fixed encoder output, every layer: k, v [L, B, S, K, H];
    ``valid`` [B, S] is the source's attention mask (None: no padding)."""

    k: Array
    v: Array
    valid: Array | None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    """What a decoder's cached step carries: its self-attention cache, the encoder side of an
    encoder-decoder (None for decoder-only models), and prefix-LM prefix sizes [B] (None otherwise)."""

    kv: KVCache
    encoder: EncoderKV | None = None
    prefix_lengths: Array | None = None

    def reorder(self, rows: Array) -> DecodeState:
        """Beam search: rows take their parents' caches. Beams of one input share its encoder output
        and prefix, so those stay where they are."""
        return dataclasses.replace(self, kv=self.kv.reorder(rows))
