"""What a cached step carries from one call to the next: small typed pytrees.

A family's ``step`` takes one of these and returns its successor; the generation loop asks the family
for an empty one (``init_cache``) and otherwise knows only ``step`` and the state's ``reorder``. A new kind of carried state (MLA's latent cache, Transformer-XL's
segment memory) is a new type or field here, never a second forward pass.

- ``KVCache``: every layer's keys and values of earlier tokens (only the kv heads), with each slot's
  position and validity, so visibility (padding, windows, prefixes) is computed from positions.
- ``RingKVCache``: a windowed layer's keys and values (sliding windows, Llama 4's chunks), only the last
  window of tokens, in a ring; ``SplitKVCache``: a stack mixing full and windowed layers, a ``KVCache`` of the
  former and a ring of the latter.
- ``LatentCache``: the same slots for multi-head latent attention, holding each token's compressed
  latent and shared rotary key instead of per-head keys and values.
- ``CompressedCache``: DeepSeek-V4's, by layer kind: each layer's last window keys, its compressors' last blocks
  of projected tokens and the compressed entry of every closed block.
- ``Memory``: Transformer-XL's segment memory, every layer's input hidden states of the last M tokens;
  a bounded window that rolls forward with each call (training, evaluation, the public call).
- ``MemoryKV``: the same window as generation carries it, the keys and values those hidden states
  project to, so a decode step does not project M memory tokens again per layer and token.
- ``EncoderKV``: an encoder-decoder's cross-attention keys and values, computed once per source.
- ``ImageCache``: Llama 3.2 Vision's, a ``KVCache`` of its self-attention layers beside its cross layers' keys and
  values of the images (``ImageKV``), computed once by the prefill.
- ``DecodeState``: what a decoder's step carries: its KV cache (or segment memory), the encoder side,
  the prefix sizes. Drafting rewinds it past the tokens the target rejected (``rewind``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.layer_plan import layer_plan

Array = jax.Array


class LayerArrays:
    """One cache field as each layer's own array (``_Slots.per_layer``), handed to the stack where a stacked
    [L, ...] array would be: indexing a layer returns its array as it is, where XLA's CPU backend copies a
    layer's slice out of a stacked array at every step. Deliberately not a pytree, so the stack's per-layer
    indexing reaches it whole; a slice or a traced index (a scanned stack) gets the layers stacked."""

    def __init__(self, arrays):
        self.arrays = tuple(arrays)

    def __getitem__(self, index):
        if isinstance(index, int):
            return self.arrays[index]
        return jnp.stack(self.arrays)[index]

    def __jax_array__(self):
        return jnp.stack(self.arrays)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedTarget:
    """Where a step's T tokens a row go in a paged pool: their blocks and offsets in them [B, T] (padding: the null
    block), each row's token count once they are written [B] (what a fused paged kernel of one query a row reads up
    to) and each token's position [B, T] (-1: padding; a kernel of several queries a row reads each one's slots up
    to its own)."""

    blocks: Array
    offsets: Array
    lengths: Array
    positions: Array

    @classmethod
    def of(cls, tables: Array, block_size: int, positions: Array, valid: Array, lengths: Array) -> PagedTarget:
        """The slots of tokens at ``positions`` (validity [B, T]) in rows of block ``tables`` [B, M] that hold
        ``lengths`` [B] tokens so far: the token at position p goes to slot p (block ``tables[p // block_size]``,
        offset ``p % block_size``), padding to the null block (block 0, never handed out)."""
        slots = jnp.where(valid, positions, 0)
        blocks = jnp.where(valid, jnp.take_along_axis(tables, slots // block_size, axis=1), 0)
        return cls(blocks, slots % block_size, lengths + jnp.sum(valid, axis=1, dtype=jnp.int32),
                   jnp.where(valid, positions, -1).astype(jnp.int32))

    def put(self, pool: Array, new: Array) -> Array:
        """A layer's own pool [K, N, block_size, H] with the tokens ``new`` [B, K, T, H] written at these slots."""
        return pool.at[:, self.blocks, self.offsets].set(new.transpose(1, 0, 2, 3).astype(pool.dtype))


@functools.partial(jax.tree_util.register_dataclass, data_fields=["pool", "tables", "layer", "target"],
                   meta_fields=["kernel", "window"])
@dataclasses.dataclass(frozen=True)
class PagedRows:
    """One layer's keys (or values) of a paged cache (``serving.paged.PagedKVCache``) as that layer reads them: the
    batch rows' block tables [B, M] and either the whole pool [L, N, K, block_size, H] with the layer's index (a
    Python int, or traced in a scanned stack), or the layer's own pool [K, N, block_size, H] (layer None: the form
    a fused paged kernel reads, ``kernel`` naming it, with ``target``, where this step's tokens go, and the layer's
    sliding ``window``, None: none, which a kernel reads in place of the mask). ``slots``
    gathers the layer's rows by table, only when the layer attends, so a step holds one layer's dense rows at a
    time."""

    pool: Array
    tables: Array
    layer: Array | int | None
    target: PagedTarget | None = None
    kernel: str | None = None
    window: int | None = None

    @property
    def dtype(self):
        return self.pool.dtype

    @property
    def kv_heads(self) -> int:
        return self.pool.shape[0 if self.layer is None else 2]

    @property
    def block_size(self) -> int:
        return self.pool.shape[2 if self.layer is None else 3]

    def slots(self, new: Array) -> Array:
        """The rows' slots [B, K, S, H] (S = M * block_size), head-major as a ``KVCache`` layer's slice: one gather
        from the whole pool at this layer's index (a slice of the pool first would copy the layer's pool), once
        ``new`` (4-D, what this layer computes first: its new keys or values, or its cross-attention's queries) is
        computed. The gather reads the pool and tables alone, so XLA would otherwise run every layer's at the start
        of the step, holding all their rows at once: a select on a condition never true (block ids are >= 0) but
        unknown to XLA makes it wait (see ``cache_written_after`` for the other order XLA needs)."""
        never, first = self.tables[0, 0] < 0, new[0, 0, 0, 0].astype(jnp.int32)
        if self.layer is None:
            return self.blocks(jnp.where(never, first, self.tables))
        return self.blocks(self.tables, jnp.where(never, first, self.layer))

    def blocks(self, tables: Array, layer: Array | int | None = None, heads_first: bool = False) -> Array:
        """The slots [B, K, C * block_size, H] of the blocks ``tables`` [B, C] name (a few of the rows' table
        columns: ``layers.attention``'s chunked read), at this layer (or ``layer``); ``heads_first``: [K, B, ...]."""
        if self.layer is None:  # the layer's own pool [K, N, block_size, H]
            rows = self.pool[:, tables]  # [K, B, C, block_size, H]
            rows = rows if heads_first else rows.swapaxes(0, 1)
        else:
            rows = self.pool[self.layer if layer is None else layer, tables]  # [B, C, K, size, H]
            rows = rows.transpose(2, 0, 1, 3, 4) if heads_first else rows.swapaxes(1, 2)
        B, K, C, size, H = rows.shape
        return rows.reshape(B, K, C * size, H)

    def written(self, new: Array) -> PagedRows:
        """These rows with this step's tokens ``new`` [B, K, T, H] written into the layer's own pool at ``target``
        (the form a fused kernel reads: a layer writes before it attends). In place: nothing else reads this
        layer's pool."""
        return dataclasses.replace(self, pool=self.target.put(self.pool, new))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WrittenPool:
    """A layer's own pool as the layer returns it, this step's tokens written in it (``PagedRows.written``): the
    layer runner keeps these as a tuple of the layers' arrays (``layers.stack``), never stacking them, and the
    paged cache takes them as its pools."""

    pool: Array


def cached_slots(value: Array | PagedRows, new: Array) -> Array:
    """A layer's cache field as attention reads it [B, K, S, H]: a ``KVCache`` slice as it is, a paged one (a cache's,
    or a paged source's cross-attention keys) gathered once this layer's ``new`` is computed (``PagedRows.slots``)."""
    return value.slots(new) if isinstance(value, PagedRows) else value


def cache_written_after(cache: dict, new: dict[str, Array], out: Array) -> dict[str, Array]:
    """A layer's new keys and values ``new`` for its cache's write, ordered after its attention output ``out``
    where the cache is paged: the write updates the pool in place after every layer, and XLA, not seeing every
    layer's read of the pool before it, would copy the whole pool to write it (its CPU backend drops
    ``optimization_barrier``s before that choice). A select on a condition never true ties them."""
    rows = next(iter(cache.values()))  # (keys, or MLA's latents)
    if not isinstance(rows, PagedRows):
        return new
    return written_after(rows.tables, new, out)


def written_after(tables: Array, new: dict[str, Array], out: Array) -> dict[str, Array]:
    """``new`` (keys and values for a paged pool's write) tied after ``out`` by a select on a condition never true
    (a block id of ``tables`` below 0); also how a step over a paged source orders the write after its last layer's
    read of the source (``stack.Stack``)."""
    never = tables[0, 0] < 0
    first = out[(0,) * out.ndim]
    return {name: jnp.where(never, first.astype(value.dtype), value) for name, value in new.items()}


class PagedLayers:
    """A paged cache's layer fields as the stack hands them to each layer (the "cache" entry of its per-layer
    inputs): indexing layer i (an int, or a traced index inside a scanned body) gives layer i's {"k", "v"} as
    ``PagedRows``. Deliberately not a pytree: the stack's runner indexes it at each layer rather than slicing the
    pools per layer (``stack._scan_layers``). ``k``, ``v``: the stacked pools [L, ...], or each layer's own (a
    tuple: the fused-kernel form, ``kernel``), which the layers write themselves at ``target`` (``writing``).
    ``latent``: the pools hold multi-head latent attention's latents, one "head" as wide as a latent and its rotary
    key (``LatentCache``'s slot), in ``k``: layer i's fields are then {"latent"}, and {"index_keys"} from ``v``
    where it has a head (DeepSeek sparse attention's indexer keys, ``IndexedLatentCache``'s)."""

    def __init__(self, k, v, tables: Array, *, lengths: Array | None = None, kernel: str | None = None,
                 target: PagedTarget | None = None, latent: bool = False, windows: tuple[int | None, ...] = ()):
        self.k, self.v, self.tables = k, v, tables
        self.lengths, self.kernel, self.target, self.latent, self.windows = lengths, kernel, target, latent, windows

    @property
    def apart(self) -> bool:
        """Whether each layer has its own pool (the layer runner then unrolls the layers: a scan would slice them)."""
        return isinstance(self.k, tuple)

    def writing(self, positions: Array, valid: Array, windows: tuple[int | None, ...]) -> PagedLayers:
        """These layers told where this step's tokens (positions and validity [B, T]) go, for layers that write
        their own tokens before they attend (the fused-kernel form; the others' are written after the layer loop),
        and each layer's sliding window (None: none), which the kernel reads in place of the mask."""
        if self.kernel is None:
            return self
        target = PagedTarget.of(self.tables, self.k[0].shape[2], positions, valid, self.lengths)
        return PagedLayers(self.k, self.v, self.tables, lengths=self.lengths, kernel=self.kernel, target=target,
                           windows=windows)

    def __getitem__(self, layer) -> dict[str, PagedRows]:
        if self.latent:  # (and DeepSeek sparse attention's indexer keys, one head of v's, where it has them)
            fields = {"latent": PagedRows(self.k, self.tables, layer)}
            return fields if self.v.shape[2] == 0 else {**fields, "index_keys": PagedRows(self.v, self.tables, layer)}
        if self.apart:
            window = self.windows[layer] if self.windows else None
            return {name: PagedRows(pool[layer], self.tables, None, self.target, self.kernel, window)
                    for name, pool in (("k", self.k), ("v", self.v))}
        return {"k": PagedRows(self.k, self.tables, layer), "v": PagedRows(self.v, self.tables, layer)}


class PagedSourceLayers(PagedLayers):
    """A paged source's cross-attention keys and values as the stack hands them to each layer (``EncoderKV.layers``):
    indexing layer i gives its (k, v) ``PagedRows`` pair, where a stacked ``EncoderKV`` gives its (k, v) slice."""

    def __getitem__(self, layer) -> tuple[PagedRows, PagedRows]:
        rows = super().__getitem__(layer)
        return rows["k"], rows["v"]


def _rows_of(value, rows):
    """Batch rows ``rows`` of a layer field: [L, B, ...] stacked, or each layer's [B, ...]."""
    return tuple(a[rows] for a in value) if isinstance(value, tuple) else value[:, rows]


class _PerLayer:
    """What every carried attention state shares: per-layer arrays [L, B, ...] (the token axis at
    ``SEQUENCE_AXIS`` for the caches, at 2 for the memories) named in
    ``LAYER_FIELDS`` and each slot's validity [B, S]. The stack hands each layer its slice of ``layers()``.
    A cache in a CPU decode loop holds each field as a tuple of the layers' own arrays instead
    (``per_layer``)."""

    LAYER_FIELDS: ClassVar[tuple[str, ...]]
    valid: Array

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def layers(self) -> dict[str, Array | LayerArrays]:
        fields = {name: getattr(self, name) for name in self.LAYER_FIELDS}
        return {name: LayerArrays(value) if isinstance(value, tuple) else value for name, value in fields.items()}

    def per_layer(self):
        """This state as a loop over separate layers carries it (``_Slots.per_layer``); a segment memory,
        rolled whole at every step, stays stacked."""
        return self

    def reorder(self, rows: Array):
        """The state of batch rows ``rows`` (beam search: each surviving beam takes its parent's)."""
        return dataclasses.replace(self, **{name: _rows_of(getattr(self, name), rows) for name in self.LAYER_FIELDS},
                                   valid=self.valid[rows])


class _Slots(_PerLayer):
    """What the self-attention caches share besides: each slot's position [B, S] (padding and unwritten
    slots are not valid), and the next slot to write. The stack writes what the layers return once,
    after the layer loop."""

    positions: Array
    index: Array
    SEQUENCE_AXIS: ClassVar[int] = 2  # of the layer arrays: [L, B, S, ...]

    def check_room(self, count: int) -> None:
        """A step that would write past the cache is refused when the index is known on the host (JAX
        would clamp the write silently); under jit the caller sized the cache."""
        if not isinstance(self.index, jax.core.Tracer) and int(self.index) + count > self.length:
            raise ValueError(f"decoding {count} tokens at cache index {int(self.index)} overflows a cache of "
                             f"{self.length} slots")

    def write(self, new: dict[str, Array], positions: Array, valid: Array):
        """The cache with T new tokens written at ``index``: ``new`` holds each layer field's T tokens in
        its own layout ([L, B, T, ...], or [L, B, K, T, H] for keys and values), positions and validity
        are [B, T]. One in-place update per array, after every layer has run."""
        at = self.index
        arrays = {}
        for name in self.LAYER_FIELDS:
            old = getattr(self, name)
            if isinstance(old, tuple):  # each layer's own array (``per_layer``), each updated in place
                start = tuple(at if axis == self.SEQUENCE_AXIS - 1 else 0 for axis in range(old[0].ndim))
                arrays[name] = tuple(jax.lax.dynamic_update_slice(layer, part.astype(layer.dtype), start)
                                     for layer, part in zip(old, new[name]))
                continue
            start = tuple(at if axis == self.SEQUENCE_AXIS else 0 for axis in range(old.ndim))
            arrays[name] = jax.lax.dynamic_update_slice(old, new[name].astype(old.dtype), start)
        count = positions.shape[1]
        return dataclasses.replace(
            self, **arrays, index=at + count,
            positions=jax.lax.dynamic_update_slice_in_dim(self.positions, positions.astype(jnp.int32), at, axis=1),
            valid=jax.lax.dynamic_update_slice_in_dim(self.valid, valid.astype(bool), at, axis=1))

    def reorder(self, rows: Array):
        return dataclasses.replace(super().reorder(rows), positions=self.positions[rows])

    def per_layer(self):
        """This cache with each layer field held as the layers' own arrays (a tuple of L arrays [B, ...]):
        what a CPU decode loop over separate layers carries (``LayerArrays``). The same numbers; made once
        before the loop."""
        return dataclasses.replace(self, **{name: tuple(getattr(self, name)) for name in self.LAYER_FIELDS})

    def rewind(self, index: Array, span: int | None = None):
        """The cache as it was when ``index`` slots were written: the slots from ``index`` on stop being
        keys and are written again next (drafted tokens the target rejected). ``span``: at most that many
        slots were written from ``index`` on, so only they are cleared (the work of a rewind then grows with
        the drafts, not the cache)."""
        index = jnp.asarray(index, jnp.int32)
        if span is None or span >= self.length:
            return dataclasses.replace(self, index=index, valid=self.valid & (jnp.arange(self.length) < index))
        start = jnp.minimum(index, self.length - span)  # as dynamic_slice clamps it: the window stays inside
        window = jax.lax.dynamic_slice_in_dim(self.valid, start, span, axis=1)
        window = window & (start + jnp.arange(span) < index)
        return dataclasses.replace(self, index=index,
                                   valid=jax.lax.dynamic_update_slice_in_dim(self.valid, window, start, axis=1))


def _empty_slots(batch: int, length: int) -> tuple[Array, Array, Array]:
    return jnp.zeros((batch, length), jnp.int32), jnp.zeros((batch, length), bool), jnp.int32(0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache(_Slots):
    """Keys and values k, v [L, B, K, S, H] of the tokens written so far (only the kv heads).

    Head-major, the layout attention's matmuls read: a decode step attends over each layer's [B, K, S, H]
    where it lies. Token-major [B, S, K, H] made XLA copy every layer's cache into that layout at every
    step (on a CPU, a third of gpt2's batch-8 decode step)."""

    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("k", "v")
    SEQUENCE_AXIS: ClassVar[int] = 3
    k: Array
    v: Array
    positions: Array
    valid: Array
    index: Array

    @classmethod
    def empty(cls, layers: int, batch: int, length: int, kv_heads: int, head_dim: int, dtype) -> KVCache:
        shape = (layers, batch, kv_heads, length, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), *_empty_slots(batch, length))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LatentCache(_Slots):
    """Multi-head latent attention's cache: per token and layer, the normalized key/value latent [C]
    followed by the rotated key part shared by every head [R], side by side in one array
    ``latent`` [L, B, S, C + R], so a decode step reads it as one key of width C + R."""

    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("latent",)
    latent: Array
    positions: Array
    valid: Array
    index: Array

    @classmethod
    def empty(cls, layers: int, batch: int, length: int, width: int, dtype) -> LatentCache:
        return cls(jnp.zeros((layers, batch, length, width), dtype), *_empty_slots(batch, length))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class IndexedLatentCache(LatentCache):
    """``LatentCache`` plus what DeepSeek-V3.2's lightning indexer keeps per token and layer: its key
    ``index_keys`` [L, B, S, index_head_dim], normalized and rotated, scored by every later query."""

    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("latent", "index_keys")
    index_keys: Array

    @classmethod
    def empty(cls, layers: int, batch: int, length: int, width: int, dtype, index_width: int = 0
              ) -> IndexedLatentCache:
        slots = _empty_slots(batch, length)
        return cls(jnp.zeros((layers, batch, length, width), dtype), *slots,
                   jnp.zeros((layers, batch, length, index_width), dtype))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RingKVCache(KVCache):
    """The keys and values of windowed layers (sliding windows, Llama 4's chunks): k, v [L, B, K, R, H] hold
    only the last R written tokens, token i in slot i mod R, so the cache's memory is bounded by the window
    whatever the length. ``written`` [R] is the write index each slot holds (-1: none), so ``rewind`` knows
    which slots came after a rewound index. ``positions`` and ``valid`` are per slot as in ``KVCache``:
    masks are computed from positions, so a slot's place in the ring never matters.

    R = window + the most slots a step may write and then rewind (drafts): a query at index t needs the
    keys of the window - 1 indices before it, and a rewound step's writes must not have overwritten them."""

    written: Array

    @classmethod
    def empty(cls, layers: int, batch: int, length: int, kv_heads: int, head_dim: int, dtype) -> RingKVCache:
        shape = (layers, batch, kv_heads, length, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), *_empty_slots(batch, length),
                   jnp.full((length,), -1, jnp.int32))

    def check_room(self, count: int) -> None:
        """A ring never overflows: a write replaces the oldest slots."""

    def write(self, new: dict[str, Array], positions: Array, valid: Array) -> RingKVCache:
        """As ``KVCache.write``, modulo R: only the last R of the T new tokens are kept (a prefill longer than
        the ring). One token (a decode step) is one in-place slice update; more are scattered to their slots."""
        T, R = positions.shape[1], self.length
        kept = min(T, R)
        first = self.index + (T - kept)  # the write index of the first token kept
        tail = lambda a, axis: jax.lax.slice_in_dim(a, T - kept, T, axis=axis)  # noqa: E731
        if kept == 1:
            put = lambda old, part, axis: jax.lax.dynamic_update_slice_in_dim(  # noqa: E731
                old, part.astype(old.dtype), first % R, axis=axis)
        else:
            slots = (first + jnp.arange(kept)) % R

            def put(old, part, axis):
                where = (slice(None),) * axis + (slots,)
                return old.at[where].set(part.astype(old.dtype), unique_indices=True, mode="promise_in_bounds")
        axis = self.SEQUENCE_AXIS

        def put_layers(old, part):  # stacked [L, ...], or each layer's own array (``per_layer``)
            if isinstance(old, tuple):
                return tuple(put(layer, layer_part, axis - 1) for layer, layer_part in zip(old, part))
            return put(old, part, axis)
        return dataclasses.replace(
            self, k=put_layers(self.k, tail(new["k"], axis)), v=put_layers(self.v, tail(new["v"], axis)),
            positions=put(self.positions, tail(positions.astype(jnp.int32), 1), 1),
            valid=put(self.valid, tail(valid.astype(bool), 1), 1),
            written=put(self.written, first + jnp.arange(kept, dtype=jnp.int32), 0), index=self.index + T)

    def rewind(self, index: Array, span: int | None = None) -> RingKVCache:
        """As ``KVCache.rewind``: the slots written at ``index`` or later stop being keys. The older tokens they
        replaced lie outside every later query's window, as R leaves room for the rewound writes. The ring is
        bounded by the window, so ``span`` is not needed to keep the work small."""
        index = jnp.asarray(index, jnp.int32)
        return dataclasses.replace(self, index=index, valid=self.valid & (self.written < index)[None])


@functools.partial(jax.tree_util.register_dataclass, data_fields=["full", "window"], meta_fields=["local_layers"])
@dataclasses.dataclass(frozen=True)
class SplitKVCache:
    """The cache of a stack whose layers mix full attention and a window (Gemma 2/3, gpt-oss, GPT-Neo,
    Llama 4's chunks): a ``KVCache`` of the full layers and a ``RingKVCache`` of the windowed ones, each in
    layer order, and which layers are windowed (static). Both are written by every step, so their indices
    agree; the stack hands each layer its slice of its own kind's cache."""

    full: KVCache
    window: RingKVCache
    local_layers: tuple[bool, ...]

    @property
    def index(self) -> Array:
        return self.full.index

    def kinds(self) -> dict[str, KVCache]:
        """Each kind's cache, keyed as the plan's ``LayerSpec.cache`` names the layers' ('full', 'window')."""
        return {"full": self.full, "window": self.window}

    def check_room(self, count: int) -> None:
        self.full.check_room(count)

    def write(self, new: dict[str, Array], positions: Array, valid: Array) -> SplitKVCache:
        """``new`` holds every layer's T tokens [L, B, K, T, H] in layer order; each kind takes its layers'. (Gemma 4's
        full layers of a shape of their own hand theirs apart, as ``full_k`` and ``full_v``.)"""
        if "full_k" in new:
            return dataclasses.replace(self, full=self.full.write({"k": new["full_k"], "v": new["full_v"]}, positions,
                                                                  valid),
                                       window=self.window.write({"k": new["k"], "v": new["v"]}, positions, valid))

        def of(local):
            rows = np.array([i for i, windowed in enumerate(self.local_layers) if windowed == local])
            return {name: array[rows] for name, array in new.items()}

        return dataclasses.replace(self, full=self.full.write(of(False), positions, valid),
                                   window=self.window.write(of(True), positions, valid))

    def reorder(self, rows: Array) -> SplitKVCache:
        return dataclasses.replace(self, full=self.full.reorder(rows), window=self.window.reorder(rows))

    def per_layer(self) -> SplitKVCache:
        return dataclasses.replace(self, full=self.full.per_layer(), window=self.window.per_layer())

    def rewind(self, index: Array, span: int | None = None) -> SplitKVCache:
        return dataclasses.replace(self, full=self.full.rewind(index, span), window=self.window.rewind(index, span))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LinearState:
    """What the linear layers (the gated delta rule: Qwen3-Next) carry, in their order: the convolution's last
    inputs ``conv`` [L, B, K - 1, C] and each value head's state matrix ``state`` [L, B, Hv, Dk, Dv] (float32).
    Its size never grows with the sequence: a step replaces both (``write``)."""

    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("conv", "state")
    conv: Array
    state: Array

    @classmethod
    def empty(cls, cfg, layers: int, batch: int, dtype) -> LinearState:
        linear = cfg.linear_attention
        return cls(jnp.zeros((layers, batch, linear.conv_kernel - 1, linear.conv_width), dtype),
                   jnp.zeros((layers, batch, linear.value_heads, linear.key_head_dim, linear.value_head_dim),
                             jnp.float32))

    def layers(self) -> dict[str, Array | LayerArrays]:
        return {name: LayerArrays(getattr(self, name)) if isinstance(getattr(self, name), tuple)
                else getattr(self, name) for name in self.LAYER_FIELDS}

    def write(self, new: dict[str, Array]) -> LinearState:
        """The state after a call: ``new`` holds every linear layer's [L, B, ...], in place of the old."""
        def replaced(old, part):
            return tuple(part.astype(old[0].dtype)) if isinstance(old, tuple) else part.astype(old.dtype)
        return dataclasses.replace(self, **{name: replaced(getattr(self, name), new[name])
                                            for name in self.LAYER_FIELDS})

    def reorder(self, rows: Array) -> LinearState:
        return dataclasses.replace(self, **{name: _rows_of(getattr(self, name), rows) for name in self.LAYER_FIELDS})

    def per_layer(self) -> LinearState:
        return dataclasses.replace(self, **{name: tuple(getattr(self, name)) for name in self.LAYER_FIELDS})


@functools.partial(jax.tree_util.register_dataclass, data_fields=["full", "linear"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class HybridCache:
    """The cache of a stack mixing attention layers with linear ones (Qwen3-Next: three linear layers to one
    full): a ``KVCache`` of the attention layers and a ``LinearState`` of the linear ones, each in layer order.
    The stack hands each layer its slice of its own kind's (``kinds``, keyed as the plan's ``LayerSpec.cache``).
    A recurrent state cannot be rewound past drafts a target rejected: drafting refuses these models."""

    full: KVCache | LatentCache  # (Kimi Linear's attention layers are latent attention's: a LatentCache)
    linear: LinearState
    # (the serving engine's: ``full`` a paged pool, latents where ``latent`` says so, and the batch rows' states)

    @property
    def index(self) -> Array:
        return self.full.index

    def kinds(self) -> dict[str, KVCache | LatentCache | LinearState]:
        latent = isinstance(self.full, LatentCache) or getattr(self.full, "latent", False)
        return {"latent" if latent else "full": self.full, "state": self.linear}

    def check_room(self, count: int) -> None:
        self.full.check_room(count)

    def write(self, new: dict[str, Array], positions: Array, valid: Array) -> HybridCache:
        """``new`` holds the attention layers' keys and values {"k", "v"} (or latents {"latent"}) and the linear
        layers' states {"conv", "state"}, each kind's layers in order."""
        attention = {name: new[name] for name in self.full.LAYER_FIELDS}
        return dataclasses.replace(self, full=self.full.write(attention, positions, valid),
                                   linear=self.linear.write(new))

    def reorder(self, rows: Array) -> HybridCache:
        return dataclasses.replace(self, full=self.full.reorder(rows), linear=self.linear.reorder(rows))

    def per_layer(self) -> HybridCache:
        return dataclasses.replace(self, full=self.full.per_layer(), linear=self.linear.per_layer())


class _KindSlots:
    """One kind's arrays of a ``CompressedCache`` as the stack hands them out (``kinds``): ``layers()`` [L, ...]."""

    def __init__(self, arrays: dict[str, Array]):
        self.arrays = arrays

    def layers(self) -> dict[str, Array]:
        return self.arrays


@functools.partial(jax.tree_util.register_dataclass, data_fields=["by_kind", "positions", "valid", "index"],
                   meta_fields=["length", "rates"])
@dataclasses.dataclass(frozen=True)
class CompressedCache:
    """DeepSeek-V4's state (compressed attention), per layer kind ('sliding', 'sparse', 'heavy'; ``by_kind``: each
    kind's arrays [L_kind, B, ...], in layer order). Every layer keeps its window's last ``window - 1`` keys
    ``keys`` [.., W - 1, H] (its values too), oldest first, their positions and validity ``positions`` / ``valid``
    [B, W - 1] shared by all. A compressed layer keeps its compressor's last ``copies * rate`` projected tokens and
    gates ``kv_tail`` / ``gate_tail`` [.., copies * rate, copies * H] (the unfinished block; CSA's overlapping
    entries read the block before it too) and every closed block's entry ``entries`` [.., length // rate, H] in
    block order; a CSA layer keeps its indexer's the same way (``index_kv_tail``, ``index_gate_tail``,
    ``index_entries`` of index_head_dim). How many blocks have closed follows from ``index`` (every row writes
    each token), so no count is kept. Drafting refuses these models: a compressor's state is not rewound."""

    by_kind: dict[str, dict[str, Array]]
    positions: Array
    valid: Array
    index: Array
    length: int
    rates: tuple[tuple[str, int], ...]  # each compressed kind's block size, ("compressed_sparse", 4), ...

    @classmethod
    def empty(cls, cfg, batch: int, length: int, dtype) -> CompressedCache:
        part, H = cfg.scores.compressed, cfg.head_dim_
        kept = max(cfg.window_size - 1, 0)
        kinds = {}
        for kind in dict.fromkeys(part.layers):
            L = part.layers.count(kind)
            arrays = {"keys": jnp.zeros((L, batch, kept, H), dtype)}
            widths = {"": H, "index_": part.index_head_dim} if kind == "sparse" else {"": H} if kind == "heavy" else {}
            copies = 2 if kind == "sparse" else 1
            for prefix, width in widths.items():
                rate = part.rate(kind)
                tail = (L, batch, copies * rate, copies * width)
                arrays.update({f"{prefix}kv_tail": jnp.zeros(tail, dtype),
                               f"{prefix}gate_tail": jnp.full(tail, -jnp.inf, dtype),  # (as ``Compressor.empty_tail``)
                               f"{prefix}entries": jnp.zeros((L, batch, length // rate, width), dtype)})
            kinds[f"compressed_{kind}"] = arrays
        rates = tuple((f"compressed_{kind}", part.rate(kind)) for kind in ("sparse", "heavy"))
        return cls(kinds, jnp.zeros((batch, kept), jnp.int32), jnp.zeros((batch, kept), bool), jnp.int32(0), length,
                   rates)

    def kinds(self) -> dict[str, _KindSlots]:
        """Each kind's arrays, keyed as the plan's ``LayerSpec.cache`` ('compressed_sparse', ...), with the write
        index as ``start`` (one per layer, so each layer's slice holds it)."""
        return {kind: _KindSlots({**arrays, "start": jnp.full((arrays["keys"].shape[0],), self.index, jnp.int32)})
                for kind, arrays in self.by_kind.items()}

    def check_room(self, count: int) -> None:
        if not isinstance(self.index, jax.core.Tracer) and int(self.index) + count > self.length:
            raise ValueError(f"decoding {count} tokens at cache index {int(self.index)} overflows a cache of "
                             f"{self.length} slots")

    def write(self, new: dict[str, Array], positions: Array, valid: Array) -> CompressedCache:
        """``new`` holds each layer's next window keys and compressor tails ({kind}_keys, ...: replacing the old) and
        the entries of the blocks this call's T tokens may close ({kind}_entries [L, B, T // rate + 1, H]: those that
        closed are written at their block numbers, the rest dropped)."""
        T, rates = positions.shape[1], dict(self.rates)
        kinds = {}
        for kind, arrays in self.by_kind.items():
            short = kind[len("compressed_"):]
            kinds[kind] = {name: (self._entries(old, new[f"{short}_{name}"], T, rates[kind]) if name.endswith("entries")
                                  else new[f"{short}_{name}"].astype(old.dtype)) for name, old in arrays.items()}
        kept = self.positions.shape[1]

        def keep(old, part):  # the window's last kept slots
            return jnp.concatenate([old, part.astype(old.dtype)], axis=1)[:, T:] if kept else old
        return dataclasses.replace(self, by_kind=kinds, positions=keep(self.positions, positions),
                                   valid=keep(self.valid, valid), index=self.index + T)

    def _entries(self, old: Array, candidates: Array, T: int, rate: int) -> Array:
        """``old`` [L, B, W, H] with the ``candidates`` [L, B, K, H] of blocks index // rate + k written at their
        numbers where they closed among this call's T tokens (an unclosed one's number is past W: dropped)."""
        numbers = self.index // rate + jnp.arange(candidates.shape[2], dtype=jnp.int32)
        numbers = jnp.where((numbers + 1) * rate <= self.index + T, numbers, old.shape[2])
        return old.at[:, :, numbers].set(candidates.astype(old.dtype), mode="drop")

    def reorder(self, rows: Array) -> CompressedCache:
        return dataclasses.replace(self, by_kind=jax.tree.map(lambda a: a[:, rows], self.by_kind),
                                   positions=self.positions[rows], valid=self.valid[rows])

    def per_layer(self) -> CompressedCache:
        return self

    def rewind(self, index: Array, span: int | None = None) -> CompressedCache:
        raise ValueError("compressed_layers (DeepSeek-V4): a compressor's state cannot be rewound past rejected drafts")


def windowed_layers(cfg, layers: int) -> tuple[tuple[bool, ...], int | None]:
    """(which of a decoder stack's ``layers`` keep a ring of their window when cached, that window), as the
    stack's layer plan says: every layer of a 'sliding' one, the local layers of an 'alternating' one (Llama
    4's chunks: the chunk size); (all False, None) otherwise."""
    return layer_plan(cfg, cfg.attention, layers).windowed()


def empty_cache(cfg, layers: int, batch: int, length: int, dtype, rewind: int = 0
                ) -> KVCache | LatentCache | SplitKVCache | HybridCache:
    """The empty self-attention cache a config's layers fill: latents for MLA (with the indexer's keys for
    DeepSeek-V3.2), else keys and values, the windowed layers' in a ring of window + ``rewind`` slots (the
    most a step writes and then rewinds: drafts) when that is shorter than ``length``; beside the linear layers'
    states where a stack has them (``HybridCache``)."""
    if cfg.scores.compressed is not None:  # DeepSeek-V4: windows, compressor tails and entries, by layer kind
        return CompressedCache.empty(cfg, batch, length, dtype)
    if cfg.scores.cross_attention_layers:  # Llama 3.2 Vision: the images' keys and values come with the prefill
        self_layers = layers - len(cfg.scores.cross_attention_layers)
        return ImageCache(KVCache.empty(self_layers, batch, length, cfg.kv_heads, cfg.head_dim_, dtype))
    if cfg.linear_attention is not None:
        linear = len(cfg.linear_attention.layers)
        full = (LatentCache.empty(layers - linear, batch, length, cfg.latent.kv_rank + cfg.latent.rope_head_dim, dtype)
                if cfg.mla else KVCache.empty(layers - linear, batch, length, cfg.kv_heads, cfg.head_dim_, dtype))
        return HybridCache(full, LinearState.empty(cfg, linear, batch, dtype))
    if cfg.mla and cfg.indexer is not None:
        return IndexedLatentCache.empty(layers, batch, length, cfg.latent.kv_rank + cfg.latent.rope_head_dim, dtype,
                                        cfg.indexer.head_dim)
    if cfg.mla:
        return LatentCache.empty(layers, batch, length, cfg.latent.kv_rank + cfg.latent.rope_head_dim, dtype)
    local, window = windowed_layers(cfg, layers)
    ring = None if window is None else window + rewind
    # Gemma 4: kv-shared layers keep no cache (they read an earlier layer's); full layers may have heads of their own
    local = local[:layers - cfg.scores.kv_shared_layers]
    full_kv, full_width = cfg.scores.full_kv_heads or cfg.kv_heads, cfg.scores.full_head_dim or cfg.head_dim_
    own_full = (full_kv, full_width) != (cfg.kv_heads, cfg.head_dim_) or cfg.scores.full_keys_as_values
    if (ring is None or ring >= length) and not own_full:
        return KVCache.empty(len(local), batch, length, cfg.kv_heads, cfg.head_dim_, dtype)
    if all(local):
        return RingKVCache.empty(len(local), batch, ring, cfg.kv_heads, cfg.head_dim_, dtype)
    return SplitKVCache(KVCache.empty(local.count(False), batch, length, full_kv, full_width, dtype),
                        RingKVCache.empty(local.count(True), batch, min(ring, length), cfg.kv_heads, cfg.head_dim_,
                                          dtype), local)


def cache_numbers_per_token(cfg) -> int:
    """Numbers one token adds to a decoder's self-attention cache, all layers: (C + R) per layer for
    MLA (and the indexer's key), 2 x kv heads x head size per layer otherwise (Transformer-XL's
    ``MemoryKV`` too). Windowed layers count as full ones here; ``cache_numbers`` bounds them."""
    if cfg.mla:
        indexer = cfg.indexer.head_dim if cfg.indexer is not None else 0
        per_layer = cfg.latent.kv_rank + cfg.latent.rope_head_dim + indexer
    else:
        per_layer = 2 * cfg.kv_heads * cfg.head_dim_
    linear = len(cfg.linear_attention.layers) if cfg.linear_attention is not None else 0
    full_layers, full_extra = _own_full_layers(cfg)
    cached = cfg.decoder_layers - linear - cfg.scores.kv_shared_layers - len(cfg.scores.cross_attention_layers)
    return cached * per_layer + full_layers * full_extra


def _own_full_layers(cfg) -> tuple[int, int]:
    """(Gemma 4's caching full layers with heads of their own, the numbers each adds a token beyond a sliding
    layer's); (0, 0) otherwise."""
    scores = cfg.scores
    if scores.full_head_dim is None and scores.full_kv_heads is None:
        return 0, 0
    local = windowed_layers(cfg, cfg.decoder_layers)[0][:cfg.decoder_layers - scores.kv_shared_layers]
    full = 2 * (scores.full_kv_heads or cfg.kv_heads) * (scores.full_head_dim or cfg.head_dim_)
    return local.count(False), full - 2 * cfg.kv_heads * cfg.head_dim_


def linear_state_bytes(cfg) -> int:
    """Bytes one row's linear layers carry (``LinearState``), whatever the length: each layer's state matrices
    in float32 and its convolution window in ``cfg.dtype``; 0 without linear layers."""
    linear = cfg.linear_attention
    if linear is None:
        return 0
    state = linear.value_heads * linear.key_head_dim * linear.value_head_dim * 4
    window = (linear.conv_kernel - 1) * linear.conv_width * jnp.dtype(cfg.dtype).itemsize
    return len(linear.layers) * (state + window)


def _rings(cfg) -> tuple[int, int, int, int] | None:
    """(numbers a token adds to one layer, full layers, windowed layers, window) of a decoder whose windowed
    layers keep rings; None where none do (no window, MLA's latent cache, Transformer-XL's memory)."""
    if cfg.mla or cfg.position == "xl":
        return None
    local, window = windowed_layers(cfg, cfg.decoder_layers)
    if window is None:
        return None
    local = local[:cfg.decoder_layers - cfg.scores.kv_shared_layers]  # (Gemma 4's kv-shared layers keep none)
    return 2 * cfg.kv_heads * cfg.head_dim_, local.count(False), local.count(True), window


def compressed_footprint(cfg) -> tuple[int, int]:
    """DeepSeek-V4's state per row as numbers, as ``CompressedCache`` holds it: (what each token adds: one entry of
    head_dim per block of rate tokens in each compressed layer, the indexer's of index_head_dim beside each CSA one,
    rounded up; what stays bounded: every layer's window - 1 keys, which are its values too, and each compressor's
    last copies x rate projected tokens and gates, copies x width each: CSA's two halves, over its unfinished block
    and the one before it)."""
    part, H = cfg.scores.compressed, cfg.head_dim_
    per_token, bounded = 0, len(part.layers) * max(cfg.window_size - 1, 0) * H
    for kind in part.layers:
        if kind == "sliding":
            continue
        rate, copies = part.rate(kind), 2 if kind == "sparse" else 1
        widths = (H, part.index_head_dim) if kind == "sparse" else (H,)
        per_token += -(-sum(widths) // rate)
        bounded += sum(2 * (copies * rate) * (copies * width) for width in widths)
    return per_token, bounded


def cache_footprint(cfg) -> tuple[int, int]:
    """A decoder's self-attention cache per row as numbers: (what each token adds, all full layers; what the
    windowed layers' rings hold at most, all of them). What ``jaxformer info`` prints."""
    if cfg.scores.compressed is not None:
        return compressed_footprint(cfg)
    rings = _rings(cfg)
    if rings is None:
        return cache_numbers_per_token(cfg), 0
    per_layer, full, windowed, window = rings
    full_layers, full_extra = _own_full_layers(cfg)
    return per_layer * full + full_layers * full_extra, per_layer * windowed * window


def cache_numbers(cfg, slots: int, rewind: int = 0) -> int:
    """Numbers a decoder's self-attention cache of ``slots`` tokens holds per row, as ``empty_cache`` lays
    it out: the windowed layers' rings hold window + ``rewind`` slots at most."""
    rings = _rings(cfg)
    if rings is None:
        return cache_numbers_per_token(cfg) * slots
    per_layer, full, windowed, window = rings
    full_layers, full_extra = _own_full_layers(cfg)
    return per_layer * (full * slots + windowed * min(slots, window + rewind)) + full_layers * full_extra * slots


class _Window(_PerLayer):
    """What Transformer-XL's two memory forms share: the layer arrays hold the last M tokens, oldest
    first, and ``valid`` says which slots hold a real token (padding and slots not yet filled do not). A
    call attends over the window and then rolls it forward by its own tokens (``extend``); it never
    grows, so generation runs past any length with constant state. No gradient flows into it: ``extend``
    stops it."""

    def extend(self, new: dict[str, Array], valid: Array):
        """The window after a call of T tokens: ``new`` holds each layer field's [L, B, T, ...] (real where
        ``valid`` [B, T]); the last M of (window, new), without gradient."""
        M = self.length

        def roll(old, added, axis):
            joined = jnp.concatenate([old, added.astype(old.dtype)], axis=axis)
            return jax.lax.stop_gradient(jax.lax.slice_in_dim(joined, joined.shape[axis] - M, joined.shape[axis],
                                                              axis=axis))

        return dataclasses.replace(self, **{name: roll(getattr(self, name), new[name], 2) for name in self.LAYER_FIELDS},
                                   valid=roll(self.valid, valid.astype(bool), 1))

    def forget(self, rows: Array):
        """The window with the rows where ``rows`` [B] is true emptied (a stream that starts over)."""
        return dataclasses.replace(self, valid=self.valid & ~rows[:, None])

    def check_room(self, count: int) -> None:
        """A window never overflows: it keeps the last M tokens whatever a call adds."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Memory(_Window):
    """Transformer-XL's segment memory: the input hidden states of every layer for the last M tokens,
    ``hidden`` [L, B, M, D], and their validity [B, M]. What ``model(ids, memory=...)`` takes and returns."""

    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("hidden",)
    hidden: Array
    valid: Array

    @classmethod
    def empty(cls, layers: int, batch: int, length: int, width: int, dtype) -> Memory:
        return cls(jnp.zeros((layers, batch, length, width), dtype), jnp.zeros((batch, length), bool))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MemoryKV(_Window):
    """The segment memory as generation carries it: the keys and values k, v [L, B, M, K, H] its hidden
    states project to. Transformer-XL's keys hold no position (distances enter through the separate
    position term), so a token's key and value never change while it stays in the window: a decode step
    reads them, as from a KV cache, instead of projecting M hidden states again in every layer."""

    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("k", "v")
    k: Array
    v: Array
    valid: Array

    @classmethod
    def empty(cls, layers: int, batch: int, length: int, kv_heads: int, head_dim: int, dtype) -> MemoryKV:
        shape = (layers, batch, length, kv_heads, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch, length), bool))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EncoderKV:
    """Cross-attention keys and values of a fixed encoder output, every layer: k, v [L, B, S, K, H];
    ``valid`` [B, S] is the source's attention mask (None: no padding). Paged (the serving engine's, with the rows'
    source ``tables`` [B, M]): k, v are the pool [L, N, K, block_size, H] whose blocks hold the sources (slot s of a
    row's table: its token s; S = M * block_size), and each layer gathers its own rows where it attends
    (``layers``), so a step never holds every layer's keys of the sources at once."""

    k: Array
    v: Array
    valid: Array | None
    tables: Array | None = None

    @property
    def length(self) -> int:
        """S: the source slots of a row."""
        return self.k[0].shape[1] if self.tables is None else self.tables.shape[1] * self.k.shape[3]

    def layers(self) -> tuple | PagedSourceLayers:
        """The keys and values as the stack hands them to the layers: (k, v) stacked [L, ...] (each layer's own
        arrays: ``LayerArrays``), or a paged source's pools and tables (``PagedSourceLayers``)."""
        if self.tables is not None:
            return PagedSourceLayers(self.k, self.v, self.tables)
        return tuple(LayerArrays(a) if isinstance(a, tuple) else a for a in (self.k, self.v))

    def per_layer(self) -> EncoderKV:
        """k and v as each layer's own array [B, S, K, H] (``_Slots.per_layer``)."""
        return dataclasses.replace(self, k=tuple(self.k), v=tuple(self.v))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ImageKV:
    """Llama 3.2 Vision's cross layers' keys and values of the images, k, v [L_cross, B, S, K, H] (keys normed),
    computed once by the prefill; ``visible`` [B, S]: the image keys the prompt's last token sees, which every
    generated token sees too (transformers repeats the cross_attention_mask's last row)."""

    k: Array
    v: Array
    visible: Array

    def layers(self) -> dict[str, Array | LayerArrays]:
        return {name: LayerArrays(value) if isinstance(value, tuple) else value
                for name, value in (("k", self.k), ("v", self.v))}

    def per_layer(self) -> ImageKV:
        return dataclasses.replace(self, k=tuple(self.k), v=tuple(self.v))


class _NoImages:
    """The cross layers' slice of an ``ImageCache`` that read no images (text alone): nothing, so they pass
    their input on, as transformers skips them."""

    @staticmethod
    def layers() -> dict:
        return {}


@functools.partial(jax.tree_util.register_dataclass, data_fields=["full", "images"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class ImageCache:
    """Llama 3.2 Vision's state: a ``KVCache`` of the self-attention layers beside the cross layers' ``ImageKV``
    (None until a prefill reads images; for text alone it stays None). The stack hands each layer its slice of
    its own kind's (``kinds``, keyed as the plan's ``LayerSpec.cache``)."""

    full: KVCache
    images: ImageKV | None = None

    @property
    def index(self) -> Array:
        return self.full.index

    def kinds(self) -> dict:
        return {"full": self.full, "images": _NoImages if self.images is None else self.images}

    def check_room(self, count: int) -> None:
        self.full.check_room(count)

    def write(self, new: dict[str, Array], positions: Array, valid: Array) -> ImageCache:
        """``new``: the self-attention layers' keys and values (the images' were written by the prefill)."""
        return dataclasses.replace(self, full=self.full.write(new, positions, valid))

    def reorder(self, rows: Array) -> ImageCache:
        """Beams of one input share its images, so their keys and values stay where they are."""
        return dataclasses.replace(self, full=self.full.reorder(rows))

    def rewind(self, index: Array, span: int | None = None) -> ImageCache:
        return dataclasses.replace(self, full=self.full.rewind(index, span))

    def per_layer(self) -> ImageCache:
        return dataclasses.replace(self, full=self.full.per_layer(),
                                   images=None if self.images is None else self.images.per_layer())


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    """What a decoder's cached step carries: its self-attention cache (Transformer-XL: its segment
    memory), the encoder side of an encoder-decoder (None for decoder-only models), and prefix-LM prefix
    sizes [B] (None otherwise). M-RoPE (Qwen2.5-VL): ``rope_deltas`` [B, 3], what each position stream adds to a
    step's position (its prompt's last stream position less its last position; zeros for a text prompt)."""

    kv: KVCache | SplitKVCache | LatentCache | MemoryKV
    encoder: EncoderKV | None = None
    prefix_lengths: Array | None = None
    rope_deltas: Array | None = None

    def reorder(self, rows: Array) -> DecodeState:
        """Beam search: rows take their parents' caches. Beams of one input share its encoder output
        and prefix (and rope deltas), so those stay where they are."""
        return dataclasses.replace(self, kv=self.kv.reorder(rows))

    def rewind(self, index: Array, span: int | None = None) -> DecodeState:
        """Drafting: the self-attention cache back to ``index`` written slots, of which at most ``span`` were
        written past it (a memory window cannot rewind)."""
        return dataclasses.replace(self, kv=self.kv.rewind(index, span))

    def per_layer(self) -> DecodeState:
        """This state with every cache held as each layer's own arrays, for a decode loop over separate layers
        (``model.for_decode_loop()`` on CPU): XLA's CPU backend copies a layer's slice out of a stacked cache at
        every step (gpt2, batch 1, 168 slots: 23.4 -> 22.1 ms a step without the copies)."""
        encoder = None if self.encoder is None else self.encoder.per_layer()
        return dataclasses.replace(self, kv=self.kv.per_layer(), encoder=encoder)
