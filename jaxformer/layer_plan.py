"""What each layer of a stack is, decided once from the config: the layer plan.

``layer_plan(cfg, pattern, num_layers)`` gives one small frozen ``LayerSpec`` per layer (its attention
pattern and window, which rotary table it reads, which cache it keeps, its feed-forward, where its
parameters live) and the stack's repeating period, as transformers and the flax gemma example build
per-layer types at construction and MaxText scans a named period of mixed layers. Everything that asks
"what is layer i" reads it: the stack's block groups and its one runner, the masks, the caches
(``cache.empty_cache``), and ``jaxformer info``, which prints it as a table.

It sits beside ``model_config`` (it reads nothing but the config), so the caches and the layers both read it.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jaxformer.model_config import ModelConfig, QueryKeyNorm


def local_layers(cfg: ModelConfig) -> tuple[bool, ...]:
    """Which layers of an 'alternating' stack attend locally (within the window, or Llama 4's chunk):
    ``layer_types``, or GPT-3's odd layers. An encoder-decoder's stacks have equal depth whenever layer_types is
    given."""
    if cfg.layer_types is not None:
        return tuple(t != "full" for t in cfg.layer_types)
    return tuple(i % 2 == 1 for i in range(max(cfg.decoder_layers, cfg.encoder_layers)))


def dense_layers(cfg: ModelConfig) -> tuple[int, ...]:
    """The decoder layers of a mixture-of-experts model that keep a dense MLP: the first ``dense_layers``, or those
    outside every ``layer_step``-th (Llama 4 Maverick); none without experts."""
    experts = cfg.experts
    if experts is None:
        return ()
    if experts.layer_step > 1:
        return tuple(i for i in range(cfg.decoder_layers) if (i + 1) % experts.layer_step)
    return tuple(range(experts.dense_layers))


def stack_patterns(stack_pattern: str, attention: str, layer_types: tuple[str, ...] | None = None
                   ) -> tuple[str, str | None]:
    """(the pattern of a stack's full layers, that of its local layers or None): an 'alternating' decoder's
    local layers use 'sliding' (or 'chunked', when ``layer_types`` say so) and the others 'causal'; the
    encoder of an alternating encoder-decoder (T5Gemma) uses 'bidirectional_sliding' on its sliding layers, and
    Qwen2.5-VL's image tower 'window' on its window layers (a token sees its window's tokens: ``Tokens.windows``)."""
    if stack_pattern == "alternating":
        return "causal", "chunked" if "chunked" in (layer_types or ()) else "sliding"
    if stack_pattern == "bidirectional" and attention == "alternating":
        return "bidirectional", "window" if "window" in (layer_types or ()) else "bidirectional_sliding"
    return stack_pattern, None


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer, as the plan decides it (all static)."""

    # its visibility pattern: causal, sliding, chunked, prefix, bidirectional, bidirectional_sliding, window
    attention: str
    window: int | None  # sliding: keys within this many positions; chunked: the chunk size
    local: bool  # reads the stack's local mask (an alternating stack's sliding or chunked layers)
    # which rotary table it reads: 'global', 'local' (Gemma 3's own base), 'none' (a NoPE layer of a rotary stack:
    # Llama 4); None: the stack has no rotary positions
    rotary: str | None
    # 'standard', 'latent' (MLA), 'relative' (T5's bias), 'xl' (Transformer-XL), 'disentangled', 'linear' (the gated
    # delta rule: Qwen3-Next's linear layers), 'global' (Longformer's global tokens beside the layer's pattern),
    # 'block_sparse' (BigBird's blocks: global, window and random, on inputs past the dense threshold), 'cross'
    # (Llama 3.2 Vision's cross-attention layers: they attend to the images' states alone, through gates)
    mixer: str
    # what a cached step keeps: 'full', 'window' (a ring of window slots), 'latent', 'memory', 'state' (a linear
    # layer's state matrix and convolution window), 'compressed_sliding' / '_sparse' / '_heavy' (DeepSeek-V4's kinds:
    # ``cache.CompressedCache``), 'images' (a cross layer's keys and values of the images: ``cache.ImageCache``), 'none'
    cache: str
    # 'dense', 'experts', 'experts+shared', 'dense+experts' (Gemma 4: the experts beside the MLP), and DeepSeek-V4's
    # 'hashed experts' / 'hashed experts+shared' (experts picked by token id)
    feed_forward: str
    # the stack's block group holding its parameters (``GROUPS``): 'first_block', 'dense_blocks', 'linear_blocks',
    # 'blocks', Gemma 4's 'full_blocks', 'shared_blocks', 'shared_full_blocks', Mistral Large 4's 'nope_blocks',
    # Llama 3.2 Vision's 'cross_blocks'
    group: str
    index: int  # its index in that group's stacked parameters (ALBERT: 0 for every layer)
    # Gemma 4's kv-shared layers: the earlier layer whose keys and values (of this call, and its cache slice) this
    # one reads; such a layer has no key or value weights and keeps no cache ('none'). None: its own
    kv_source: int | None = None
    special: str | None = None  # the first layer's: 'unnormed attention' (ModernBERT), 'convolution' (DeBERTa v2)
    # DeepSeek-V4's 'compressed' mixer: the layer's kind, 'sliding' (the window alone), 'sparse' (CSA), 'heavy' (HCA)
    compressed: str | None = None
    cross_attention: bool = False  # attends to an encoder's output too (an encoder-decoder's decoder)
    # each sublayer's output times tanh of a learned number of its own before it joins the residual (the global
    # layers of Llama 3.2 Vision's tower)
    gated: bool = False

    @property
    def nope(self) -> bool:
        return self.rotary == "none"


# DeepSeek-V4's block groups: a compressed-attention kind's layers (its compressor and indexer, or none), and the
# hash-routed expert layers of each kind apart (their token table, no router bias)
COMPRESSED_GROUPS = tuple(f"{hashed}{kind}_blocks" for hashed in ("hash_", "")
                          for kind in ("sliding", "sparse", "heavy"))

# the block groups a stack may hold, in the order the runner meets their first layers in ``table``'s summary
GROUPS = ("first_block", "dense_blocks", "linear_blocks", "blocks", "full_blocks", "shared_blocks",
          "shared_full_blocks", "nope_blocks", "cross_blocks", *COMPRESSED_GROUPS)


class Segment(NamedTuple):
    """Layers [start, end) that one scan runs: ``period`` layers a step (the rest past whole periods unrolled)."""

    start: int
    end: int
    period: int


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """Every layer's spec, the stack's two mask patterns, and whether the specs are known per layer when the
    layers are traced (``known``; False for a pipeline stage's chunk, whose layers are picked by a traced stage
    index: there the per-layer flags travel as arrays)."""

    layers: tuple[LayerSpec, ...]
    patterns: tuple[str, str | None]
    known: bool = True

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> LayerSpec:
        return self.layers[i]

    @property
    def local(self) -> tuple[bool, ...]:
        return tuple(spec.local for spec in self.layers)

    @property
    def nope(self) -> tuple[bool, ...]:
        return tuple(spec.nope for spec in self.layers)

    def first_of(self, group: str) -> LayerSpec:
        """The spec of a group's first layer: what its blocks are built as (a group's layers share their shapes)."""
        return next(spec for spec in self.layers if spec.group == group)

    def count(self, group: str) -> int:
        """How many parameter slots a block group holds (ALBERT's shared 'blocks': one)."""
        return len({spec.index for spec in self.layers if spec.group == group})

    def windowed(self) -> tuple[tuple[bool, ...], int | None]:
        """(which layers keep a ring of their window when cached, that window or None when none does)."""
        flags = tuple(spec.cache == "window" for spec in self.layers)
        return flags, next((spec.window for spec in self.layers if spec.cache == "window"), None)

    def apart(self) -> int:
        """How many leading layers run apart from the repeating rest (ModernBERT's and DeBERTa's first layer,
        DeepSeek's dense ones): those before the runner's last segment."""
        return self.segments()[-1].start if self.layers else 0

    def period(self) -> int:
        """The repeating period of the layers past those run apart (Gemma 3: 6, Llama 4 Maverick: 4)."""
        kinds = [dataclasses.replace(spec, index=0) for spec in self.layers[self.apart():]]
        return _period(kinds)

    def segments(self, split_cache: bool = False) -> list[Segment]:
        """The runs the runner scans: each group's leading run of its own, then the rest by its period of
        parameter shapes (which group, and under a split cache which kind of cache slice). Layers that
        differ only in mask, rotary table or NoPE share a scanned body, told apart by per-layer flags."""
        keys = [(spec.group, spec.cache if split_cache else None) for spec in self.layers]
        segments, start = [], 0
        while start < len(keys):
            end = start
            while end < len(keys) and keys[end][0] == keys[start][0]:
                end += 1
            # interleaved groups: one periodic run, to the last layer of any group met in it (Gemma 4's kv-shared
            # layers, groups of their own, then run after the layers they read)
            last = lambda group: max(i for i, key in enumerate(keys) if key[0] == group) + 1  # noqa: E731
            while end < len(keys) and (reach := max(last(key[0]) for key in keys[start:end])) > end:
                end = reach
            segments.append(Segment(start, end, _period(keys[start:end])))
            start = end
        return segments

    def chunk(self, length: int) -> LayerPlan:
        """A pipeline stage's chunk of ``length`` layers of the main group, picked by a traced stage index."""
        spec = self.layers[-1]
        return LayerPlan(tuple(dataclasses.replace(spec, index=i) for i in range(length)), self.patterns, known=False)

    def table(self) -> str:
        """The plan as a text table: the layers run apart one a row, then one row per position of the period
        (the layers it covers: ``a-b`` for a period of one, else every period-th from the first)."""
        head = ("layers", "attention", "window", "rotary", "mixer", "cache", "feed-forward", "parameters", "special")
        apart, period, count = self.apart(), self.period(), len(self.layers)
        rows = [head]
        for first in [*range(apart), *range(apart, min(apart + period, count))]:
            covered = [first] if first < apart else list(range(first, count, period))
            s = self.layers[first]
            rows.append((_layer_list(covered), s.attention, "" if s.window is None else str(s.window), s.rotary or "",
                         s.mixer, s.cache, s.feed_forward, s.group, s.special or ("gated" if s.gated else "")))
        shown = [c for c in range(len(head)) if any(row[c] for row in rows[1:])]  # no column that is empty throughout
        rows = [[row[c] for c in shown] for row in rows]
        widths = [max(len(row[c]) for row in rows) for c in range(len(shown))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        groups = ", ".join(f"{group} {self.count(group)}" for group in GROUPS if self.count(group))
        lines.append(f"{count} layers; period {period}" + (f" after {apart} run apart" if apart else "")
                     + f"; parameters: {groups}")
        return "\n".join(lines)


def _layer_list(layers: list[int]) -> str:
    if len(layers) == 1:
        return str(layers[0])
    if layers[1] - layers[0] == 1:
        return f"{layers[0]}-{layers[-1]}"
    shown = layers if len(layers) <= 4 else [*layers[:2], "...", layers[-1]]
    return ",".join(map(str, shown))


def _period(kinds: list) -> int:
    count = len(kinds)
    return next((p for p in range(1, count + 1) if all(kinds[i] == kinds[i % p] for i in range(count))), 1)


def layer_plan(cfg: ModelConfig, pattern: str, num_layers: int, *, cross_attention: bool = False,
               gated: bool = False) -> LayerPlan:
    """The plan of a stack of ``num_layers`` layers of visibility ``pattern`` (a decoder's: ``cfg.attention``;
    an encoder's: 'bidirectional'), with cross-attention in each layer or not, gated sublayers or not."""
    full, local_pattern = stack_patterns(pattern, cfg.attention, cfg.layer_types)
    local = local_layers(cfg)[:num_layers] if local_pattern else (False,) * num_layers
    dense = set(dense_layers(cfg)) if not cross_attention else set()
    first_apart = not cfg.norms.first_attention or cfg.conv is not None
    special = "convolution" if cfg.conv is not None else "unnormed attention" if not cfg.norms.first_attention else None
    linear = set(cfg.linear_attention.layers) if cfg.linear_attention is not None and not cross_attention else set()
    scores = cfg.scores
    own_full = scores.full_head_dim is not None or scores.full_kv_heads is not None or scores.full_keys_as_values
    sources = kv_sources(local, scores.kv_shared_layers) if pattern == cfg.attention else {}
    cross = set(scores.cross_attention_layers) if pattern == cfg.attention and not cross_attention else set()
    counts = dict.fromkeys(GROUPS, 0)
    layers = []
    for i in range(num_layers):
        attention = local_pattern if local[i] else full
        window = cfg.attention_chunk_size if attention == "chunked" else (
            cfg.window_size if attention in ("sliding", "bidirectional_sliding") else None)
        group = ("first_block" if first_apart and i == 0 else "dense_blocks" if i in dense else
                 "linear_blocks" if i in linear else "blocks")
        # Gemma 4: full layers with attention of their own shape, and the kv-shared layers (no key or value weights,
        # their own MLP width) of each kind, each a group of their own
        kv_source = sources.get(i)
        if kv_source is not None:
            group = "shared_blocks" if local[i] else "shared_full_blocks"
        elif own_full and not local[i] and group == "blocks":
            group = "full_blocks"
        elif cfg.mla and cfg.nope is not None and i in cfg.nope.layers and group == "blocks":
            group = "nope_blocks"  # latent attention without its rotary part: shapes of its own (Mistral Large 4)
        elif i in cross:  # Llama 3.2 Vision: attention to the images alone, its own norms and gates
            group = "cross_blocks"
        index = 0 if group == "blocks" and cfg.shared_layers else counts[group]
        counts[group] += 1
        rotary = None if i in linear or i in cross else _rotary(cfg, i, local[i])  # (nor do linear and cross layers)
        compressed = cfg.scores.compressed.layers[i] if cfg.scores.compressed is not None else None
        feed_forward = _feed_forward(cfg, group)
        if compressed is not None:  # DeepSeek-V4: a group per kind, its hash-routed expert layers apart
            hashed = cfg.experts is not None and i - cfg.experts.dense_layers in range(cfg.experts.hash_layers)
            group = f"{'hash_' if hashed else ''}{compressed}_blocks" if group == "blocks" else group
            index = counts[group]
            counts[group] += 1
            feed_forward = "hashed " + feed_forward if hashed else feed_forward
        layers.append(LayerSpec(
            attention=attention, window=window, local=local[i], rotary=rotary,
            mixer="linear" if i in linear else "cross" if i in cross else "compressed" if compressed else
            _mixer(cfg, pattern),
            cache=("state" if i in linear else "images" if i in cross else "none" if kv_source is not None else
                   f"compressed_{compressed}" if compressed else _cache(cfg, pattern, attention)),
            feed_forward=feed_forward, group=group, index=index,
            special=special if group == "first_block" else None, cross_attention=cross_attention, kv_source=kv_source,
            compressed=compressed, gated=gated))
    return LayerPlan(tuple(layers), (full, local_pattern))


def kv_sources(local: tuple[bool, ...], shared: int) -> dict[int, int]:
    """Gemma 4's kv-shared layers (the last ``shared``) and the layer each reads: the last earlier layer of its kind
    (local or not) before them, as transformers' ``kv_sharing_modes`` pairs them."""
    first = len(local) - shared
    if not shared or first < 1:
        return {}
    producer = {kind: max(i for i in range(first) if local[i] == kind) for kind in set(local[:first])}
    return {i: producer[local[i]] for i in range(first, len(local))}


def layer_config(cfg: ModelConfig, spec: LayerSpec) -> ModelConfig:
    """The config a layer's block is built from: Gemma 4's full layers' own head size and kv head count, its kv-shared
    layers' own MLP width, Llama 3.2 Vision's cross layers' q/k norms (the model's config for every other layer)."""
    scores, changes = cfg.scores, {}
    if not spec.local and spec.group in ("full_blocks", "shared_full_blocks"):
        if scores.full_head_dim is not None:
            changes["head_dim"] = scores.full_head_dim
        if scores.full_kv_heads is not None:
            changes["num_kv_heads"] = scores.full_kv_heads
    if spec.kv_source is not None and scores.kv_shared_d_ff is not None:
        changes["d_ff"] = scores.kv_shared_d_ff
    if spec.mixer == "cross":  # Llama 3.2 Vision: each query and key head normed (one scale every head shares)
        changes["query_key_norm"] = QueryKeyNorm()
    return cfg.replace(**changes) if changes else cfg


def _rotary(cfg: ModelConfig, i: int, local: bool) -> str | None:
    if cfg.position != "rope":
        return None
    if cfg.nope is not None and i in cfg.nope.layers:
        return "none"
    return "local" if local and cfg.rotary.local_theta is not None else "global"


def _mixer(cfg: ModelConfig, pattern: str) -> str:
    if cfg.scores.sparse_block_size is not None and pattern == "bidirectional":  # BigBird: an encoder's stack only
        return "block_sparse"
    if cfg.mla:
        return "latent"
    if cfg.position in ("xl", "disentangled"):
        return cfg.position
    if cfg.relative_bias is not None:  # T5's, or MPNet's beside absolute positions
        return "relative"
    if cfg.scores.global_tokens:  # Longformer: the layer's pattern plus global tokens with their own projections
        return "global"
    return "standard"


def _cache(cfg: ModelConfig, pattern: str, attention: str) -> str:
    if pattern.startswith("bidirectional") or cfg.family in ("encoder", "dual_encoder"):  # (CLIP's causal text tower)
        return "none"
    if cfg.position == "xl":
        return "memory"
    if cfg.mla:
        return "latent"
    return "window" if attention in ("sliding", "chunked") else "full"


def _feed_forward(cfg: ModelConfig, group: str) -> str:
    if cfg.experts is None or group == "dense_blocks":
        return "dense"
    if cfg.experts.beside_dense:
        return "dense+experts"
    return "experts+shared" if cfg.experts.shared else "experts"


def encoder_pattern(cfg: ModelConfig) -> str:
    """An encoder stack's visibility: bidirectional, but causal where an encoder's own ``attention`` says so (CLIP's
    text tower; an encoder-decoder's ``attention`` is its decoder's)."""
    return "causal" if cfg.family in ("encoder", "dual_encoder") and cfg.attention == "causal" else "bidirectional"


def stack_plans(cfg: ModelConfig) -> dict[str, LayerPlan]:
    """The plan of each stack a model of ``cfg`` builds, by the stack's name: an encoder's bidirectional one
    (causal: CLIP's text tower), a decoder's of ``cfg.attention`` (with cross-attention in an encoder-decoder); a
    dual encoder's text encoder, then its image tower's (``vision``); a tiled image tower's gated layers over its
    joined tiles (``global_encoder``, the Encoder's attribute holding them: Llama 3.2 Vision's)."""
    plans = {}
    if cfg.family in ("encoder", "encoder_decoder", "dual_encoder"):
        plans["encoder"] = layer_plan(cfg, encoder_pattern(cfg), cfg.encoder_layers)
    if cfg.patches is not None and cfg.patches.global_layers:  # Llama 3.2 Vision's gated layers over the tiles
        plans["global_encoder"] = layer_plan(cfg, "bidirectional", cfg.patches.global_layers, gated=True)
    if cfg.vision is not None:
        tower = stack_plans(cfg.vision.tower)
        plans["vision"] = tower["encoder"]
        if "global_encoder" in tower:
            plans["vision global"] = tower["global_encoder"]
    if cfg.family in ("decoder", "encoder_decoder"):
        plans["decoder"] = layer_plan(cfg, cfg.attention, cfg.decoder_layers,
                                      cross_attention=cfg.family == "encoder_decoder")
    return plans
