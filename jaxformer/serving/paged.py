"""The paged KV cache and its block manager.

``PagedKVCache`` is one more typed cache (``jaxformer.cache``): a pool of fixed-size blocks per layer, shared by
every sequence the engine runs, and a block table per batch row. A decoder's cached step reads and writes it
through the same family code as a ``KVCache``: the stack asks it for each layer's keys and values of earlier tokens
(``layers``), for each slot's position and validity (the masks) and, after the layer loop, to ``write`` the step's
new keys and values. Each layer reads its own rows only, when it attends: ``layers`` hands the stack the pools and
tables (``cache.PagedLayers``), and each layer's attention reads its rows by block table from the whole pool at its
index (``cache.PagedRows``; a Python index in the CPU decode loop over separate layers, a traced one in the scanned
stack). On XLA:CPU it reads a few blocks at a time up to the last slot any row sees, with an online softmax
(``layers.attention._paged_part``): a gpt2-124M 32-row decode step's scratch 8.7 MiB whatever the table width (the
first read, every layer's rows gathered before the layer loop: 1,728 MiB), the step 1.5-1.7x faster than
gathering each layer's whole tables. Elsewhere each layer gathers its rows' whole tables [B, K, S, H] and attends
over them as over a ``KVCache`` slice. The pool is block-major, [L, N, K, block_size, H]: a block's keys are one
contiguous run, which XLA:CPU's gather copies about twice as fast as [L, K, N, block_size, H]'s per-head pieces.
Writing scatters the new tokens into their blocks, after every layer. An encoder-decoder's sources live in blocks of
the same pool, and each layer reads its cross-attention keys and values the same way (``source_view``). Multi-head
latent attention's pool holds its latents as one key head (``PagedKVCache.latent``), its layers reading them in
their absorbed form.

Fused kernels (``kernels.paged_kernel``): JAX's Pallas paged attention, one query a row, on NVIDIA GPUs
(``jax.experimental.pallas.ops.gpu.paged_attention``) and on TPUs for bfloat16 models (``ops.tpu.paged_attention``,
which reads keys and values in bfloat16); on CPUs for float32 models ours in C++ (``jaxformer.native``, through
XLA's FFI), any number of queries a row, sliding windows and sinks included. All read a layer's pool
[K, N, block_size, H] alone and return normalized outputs, so a step's own tokens must be in the pool before the
layer attends: in that form each layer has its own pool (a tuple, which the layer runner keeps apart, the layers
unrolled) and each layer writes its tokens, then the kernel attends (``cache.PagedRows.written``). Under a Pallas
kernel prompt chunks and drafts read on XLA and are written after the layer loop. TPU's ragged paged attention
(chunks and one-token rows in one call, keys and values interleaved in one pool) is not wired: JAX's TPU
interpreter cannot run it here (a reshaped buffer it does not index), so it could not be tested.

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
import functools
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.cache import EncoderKV, PagedLayers, PagedTarget, WrittenPool

Array = jax.Array
NULL_BLOCK = 0  # never allocated: table padding points here and padded tokens are written here (PagedTarget)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["k", "v", "tables", "lengths"],
                   meta_fields=["kernel", "latent"])
@dataclasses.dataclass(frozen=True)
class PagedKVCache:
    """Keys and values of every sequence in blocks: k, v [L, N, K, block_size, H] (N blocks, each head-major as a
    ``KVCache`` row, so a block is one contiguous run a gather copies whole), the batch rows' block tables [B, M] and
    how many tokens each row has written ``lengths`` [B]. A row's view is its M blocks in order: S = M * block_size
    slots. With a fused paged ``kernel`` (``kernels.paged_kernel``) k and v are each layer's own pool instead, a tuple
    of L arrays [K, N, block_size, H] (the layout the kernel reads), which each layer of a step the kernel reads
    writes itself before it attends (``cache.PagedRows.written``); a Pallas kernel's longer steps write after the
    layer loop, as in the stacked form. Only a model whose layers the kernel serves gets this form
    (``kernels.paged_kernel_refuses``): the kernel reads each query's slots up to its position (or its layer's
    window), whatever the mask.
    ``latent``: multi-head latent attention's pool (``LatentCache``'s per-token latent and rotary key, C + R wide):
    k [L, N, 1, block_size, C + R], read as one key head that is also the value (the layers' absorbed form), and v
    empty (no kv heads: no bytes), or with DeepSeek sparse attention the indexer's keys [L, N, 1, block_size,
    index_head_dim] (``IndexedLatentCache``'s ``index_keys``)."""

    k: Array | tuple[Array, ...]
    v: Array | tuple[Array, ...]
    tables: Array
    lengths: Array
    kernel: str | None = None
    latent: bool = False

    @classmethod
    def empty(cls, layers: int, blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype,
              kernel: str | None = None, latent: bool = False, index_width: int = 0) -> PagedKVCache:
        """An empty pool; ``latent`` (kv_heads 1, head_dim C + R) with ``index_width``: the indexer keys' width (0:
        none)."""
        if latent:
            k = jnp.zeros((layers, blocks, 1, block_size, head_dim), dtype)
            v = jnp.zeros((layers, blocks, int(index_width > 0), block_size, index_width or head_dim), dtype)
            return cls(k, v, jnp.zeros((1, 1), jnp.int32), jnp.zeros((1,), jnp.int32), latent=True)
        if kernel is None:
            shape = (layers, blocks, kv_heads, block_size, head_dim)
            k, v = jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)
        else:
            shape = (kv_heads, blocks, block_size, head_dim)
            k, v = (tuple(jnp.zeros(shape, dtype) for _ in range(layers)) for _ in range(2))
        return cls(k, v, jnp.zeros((1, 1), jnp.int32), jnp.zeros((1,), jnp.int32), kernel)

    @property
    def LAYER_FIELDS(self) -> tuple[str, ...]:  # noqa: N802 (the name every cache's layer fields go by)
        """What a step's layers hand back to ``write``: keys and values, or latents (and indexer keys)."""
        if not self.latent:
            return ("k", "v")
        return ("latent",) if self.v.shape[2] == 0 else ("latent", "index_keys")

    @property
    def block_size(self) -> int:
        return self.k[0].shape[2] if self.kernel is not None else self.k.shape[3]

    @property
    def length(self) -> int:
        return self.tables.shape[1] * self.block_size

    @property
    def nbytes(self) -> int:
        """The pools' bytes (stacked, or each layer's own)."""
        return sum(pool.nbytes for pool in jax.tree.leaves((self.k, self.v)))

    @property
    def positions(self) -> Array:
        """Each slot's position [B, S]: its index."""
        return jnp.broadcast_to(jnp.arange(self.length, dtype=jnp.int32), (self.tables.shape[0], self.length))

    @property
    def valid(self) -> Array:
        """[B, S]: the slots each row has written."""
        return jnp.arange(self.length) < self.lengths[:, None]

    def layers(self) -> PagedLayers:
        """The pools and tables, from which each layer gathers its own rows when it attends (``PagedRows``): a
        step never holds every layer's dense view at once."""
        return PagedLayers(self.k, self.v, self.tables, lengths=self.lengths, kernel=self.kernel, latent=self.latent)

    def check_room(self, count: int) -> None:
        """Checks nothing: the tables are traced, so room is the caller's to guarantee (see ``write``)."""

    def write(self, new: dict[str, Array], positions: Array, valid: Array) -> PagedKVCache:
        """The pool with T new tokens a row written at their positions' slots: ``new`` holds k, v [L, B, K, T, H],
        positions and validity are [B, T] (padding goes to the null block). One scatter per array. The caller
        guarantees room: every valid position's block is in its row's table (the engine's block manager gives
        them before the step); a position past the table is dropped unwritten (its block reads out of range).
        In the fused-kernel form ``new`` may instead hold each layer's pool as the layer wrote it (a tuple of
        ``WrittenPool``s): they become the pools."""
        target = PagedTarget.of(self.tables, self.block_size, positions, valid, self.lengths)
        if self.latent:  # the latents [L, B, T, C + R] as one head's keys; the indexer's keys as v's, or none
            latents = new["latent"][:, :, None]
            index_keys = new["index_keys"][:, :, None] if "index_keys" in new else jnp.zeros(
                latents.shape[:2] + (0,) + latents.shape[3:], self.v.dtype)
            new = {"k": latents, "v": index_keys}
        if isinstance(new["k"], tuple) and isinstance(new["k"][0], WrittenPool):
            return dataclasses.replace(self, k=tuple(w.pool for w in new["k"]), v=tuple(w.pool for w in new["v"]),
                                       lengths=target.lengths)

        def put(pool, part):  # pool[:, blocks, :, offsets] is [B, T, L, K, H]
            return pool.at[:, target.blocks, :, target.offsets].set(part.transpose(1, 3, 0, 2, 4).astype(pool.dtype))

        def put_apart(pools, parts):  # each layer's own pool
            return tuple(target.put(pool, part) for pool, part in zip(pools, parts))
        put = put if self.kernel is None else put_apart
        return dataclasses.replace(self, k=put(self.k, new["k"]), v=put(self.v, new["v"]), lengths=target.lengths)


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

    def share(self, blocks: list[int]) -> None:
        """Held blocks held once more (a beam forked from another shares its blocks)."""
        for block in blocks:
            self.refs[block] += 1

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


def source_view(k: Array, v: Array, tables: Array, lengths: Array) -> EncoderKV:
    """An encoder-decoder's cross-attention keys and values of each row's source as the paged ``EncoderKV`` a cached
    decoder step reads: the pool's k, v [L, N, K, block_size, H] and the rows' source tables [B, M] (slot s of a
    source holds its token s), from which each decoder layer gathers its own rows where it attends (as from a
    ``PagedKVCache``), so a step never holds every layer's [B, M * block_size, K, H] at once; a row's first
    ``lengths`` [B] slots are its source."""
    return EncoderKV(k, v, jnp.arange(tables.shape[1] * k.shape[3]) < lengths[:, None], tables)
