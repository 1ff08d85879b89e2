"""The paged KV cache and its block manager.

``PagedKVCache`` is one more typed cache (``jaxformer.cache``): a pool of fixed-size blocks per layer, shared by
every sequence the engine runs, and a block table per batch row. A decoder's cached step reads and writes it
through the same family code as a ``KVCache``: the stack asks it for each layer's keys and values of earlier tokens
(``layers``), for each slot's position and validity (the masks) and, after the layer loop, to ``write`` the step's
new keys and values. Reading gathers each row's blocks into a dense per-row view [L, B, K, S, H] by its block
table (one XLA gather, then the stack's dense attention over it); writing scatters the new tokens into their blocks.
A fused paged-attention kernel would replace the gather and the attention over the view, reading each row's blocks
where they lie: a layer's pool [K, N, block_size, H] is the layout of JAX's Pallas paged attention for GPUs
(``jax.experimental.pallas.ops.gpu.paged_attention``, one query a row: the decode steps) and TPUs
(``ops.tpu.paged_attention``; ``ops.tpu.ragged_paged_attention`` also takes prompt chunks, in a layout of its own).

Slots are a sequence's token positions: the token at position p lives in slot p of its row's blocks (block
``table[p // block_size]``, offset ``p % block_size``), so a slot's position is its index and a row's first
``lengths`` slots are the valid ones. Block 0 is never handed out: table entries past a row's blocks point at it
and padded tokens are written there, so it holds nothing anyone reads.

``BlockManager`` is the host side: allocation, reference counts, freeing, and prefix caching (a full block is
known by a digest of the token ids of its whole prefix; a later sequence starting with the same tokens shares it).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
NULL_BLOCK = 0  # never allocated: table padding points here and padded tokens are written here


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedKVCache:
    """Keys and values of every sequence in blocks: k, v [L, K, N, block_size, H] (N blocks, head-major as ``KVCache``
    holds them), the batch rows' block tables [B, M] and how many tokens each row has written ``lengths`` [B]. A
    row's view is its M blocks in order: S = M * block_size slots."""

    k: Array
    v: Array
    tables: Array
    lengths: Array

    @classmethod
    def empty(cls, layers: int, blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype) -> PagedKVCache:
        shape = (layers, kv_heads, blocks, block_size, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((1, 1), jnp.int32),
                   jnp.zeros((1,), jnp.int32))

    @property
    def block_size(self) -> int:
        return self.k.shape[3]

    @property
    def length(self) -> int:
        return self.tables.shape[1] * self.block_size

    @property
    def positions(self) -> Array:
        """Each slot's position [B, S]: its index."""
        return jnp.broadcast_to(jnp.arange(self.length, dtype=jnp.int32), (self.tables.shape[0], self.length))

    @property
    def valid(self) -> Array:
        """[B, S]: the slots each row has written."""
        return jnp.arange(self.length) < self.lengths[:, None]

    def layers(self) -> dict[str, Array]:
        """Each layer's keys and values as dense rows [L, B, K, S, H], gathered by block table."""
        def view(pool):
            L, K, _, size, H = pool.shape
            B, M = self.tables.shape
            rows = pool[:, :, self.tables]  # [L, K, B, M, size, H]
            return rows.transpose(0, 2, 1, 3, 4, 5).reshape(L, B, K, M * size, H)
        return {"k": view(self.k), "v": view(self.v)}

    def check_room(self, count: int) -> None:
        """Checks nothing: the tables are traced, so room is the caller's to guarantee (see ``write``)."""

    def write(self, new: dict[str, Array], positions: Array, valid: Array) -> PagedKVCache:
        """The pool with T new tokens a row written at their positions' slots: ``new`` holds k, v [L, B, K, T, H],
        positions and validity are [B, T] (padding goes to the null block). One scatter per array. The caller
        guarantees room: every valid position's block is in its row's table (the engine's block manager gives
        them before the step); a position past the table is dropped unwritten (its block reads out of range)."""
        size = self.block_size
        slots = jnp.where(valid, positions, 0)
        blocks = jnp.where(valid, jnp.take_along_axis(self.tables, slots // size, axis=1), NULL_BLOCK)
        offsets = slots % size

        def put(pool, part):  # pool[:, :, blocks, offsets] is [L, K, B, T, H]
            return pool.at[:, :, blocks, offsets].set(part.transpose(0, 2, 1, 3, 4).astype(pool.dtype))
        return dataclasses.replace(self, k=put(self.k, new["k"]), v=put(self.v, new["v"]),
                                   lengths=self.lengths + jnp.sum(valid, axis=1, dtype=jnp.int32))


class BlockManager:
    """The pool's blocks on the host: which are free, how many sequences hold each, and which full blocks are
    known by their contents (prefix caching).

    A full block's key is a digest of its tokens and every token before them (sha256 of its parent's key and its
    own ids, flat at any depth, as vLLM chains them), so two sequences share a block only when their whole prefixes
    up to its end agree. A cached block whose last
    holder ended stays cached but evictable (least recently freed first): a later prompt with that prefix takes it
    back, and allocation takes it only when no uncached block is free."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks}, block_size={block_size}: want num_blocks >= 2 (block 0 is "
                             "the null block) and block_size >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free = collections.deque(range(1, num_blocks))  # never cached, or evicted
        self.evictable: collections.OrderedDict[int, None] = collections.OrderedDict()  # cached, held by none
        self.refs = [0] * num_blocks
        self.by_key: dict[bytes, int] = {}  # a full block's prefix key -> its block
        self.key_of: dict[int, bytes] = {}

    @property
    def usable(self) -> int:
        return self.num_blocks - 1

    def available(self) -> int:
        return len(self.free) + len(self.evictable)

    def used(self) -> int:
        """Blocks held by some sequence."""
        return self.usable - self.available()

    @staticmethod
    def chain(parent: bytes | None, ids) -> bytes:
        """The key of a full block of ``ids`` after the block keyed ``parent`` (None: the first block)."""
        return hashlib.sha256((parent or b"") + np.asarray(ids, np.int64).tobytes()).digest()

    def cached_prefix(self, tokens: list[int], limit: int) -> list[int]:
        """The cached blocks of the first full blocks of ``tokens`` (at most ``limit`` blocks), taken: each one's
        reference count goes up."""
        found, key = [], None
        for b in range(limit):
            key = self.chain(key, tokens[b * self.block_size:(b + 1) * self.block_size])
            block = self.by_key.get(key)
            if block is None:
                break
            found.append(block)
        for block in found:
            self.evictable.pop(block, None)
            self.refs[block] += 1
        return found

    def allocate(self) -> int | None:
        """A free block held once, or None when the pool is full. A cached block is evicted only when no
        uncached one is free."""
        if self.free:
            block = self.free.popleft()
        elif self.evictable:
            block, _ = self.evictable.popitem(last=False)
            del self.by_key[self.key_of.pop(block)]
        else:
            return None
        self.refs[block] = 1
        return block

    def release(self, blocks: list[int]) -> None:
        """A sequence lets go of its blocks (last block first, so its prefix's blocks stay cached longest)."""
        for block in reversed(blocks):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                if block in self.key_of:
                    self.evictable[block] = None
                else:
                    self.free.append(block)

    def forget(self, blocks: list[int]) -> None:
        """``blocks`` no longer hold what their keys say (their writer failed): they leave the prefix cache."""
        for block in blocks:
            key = self.key_of.pop(block, None)
            if key is not None:
                del self.by_key[key]

    def remember(self, block: int, key: bytes) -> None:
        """``block`` is full and its prefix key is ``key``: later prompts with that prefix may share it. A prefix
        already cached in another block keeps that one."""
        if key not in self.by_key and block not in self.key_of:
            self.by_key[key], self.key_of[block] = block, key
