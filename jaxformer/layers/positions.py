"""Token embeddings and positions: the embedding front end, absolute tables and sinusoids, rotary
angles, T5's relative position bias, and Transformer-XL's encodings of distances."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.model_config import ModelConfig
from jaxformer.layers.core import Dense, Norm, dropout, dtype_of, param
from jaxformer.layers.weights import Quantized, project, quantize_kernel

Array = jax.Array


def embedding_width(cfg: ModelConfig) -> tuple[int, str]:
    """The token tables' width and its logical axis: d_model ('embed'), or factorised embeddings' own width
    ('embedding', left unsharded: 128 numbers a row in ALBERT and ELECTRA-small)."""
    return (cfg.d_model, "embed") if cfg.embeddings.width is None else (cfg.embeddings.width, "embedding")


class Embed(nnx.Module):
    """Token embedding table [V, D]; ``attend`` reuses it as the tied output projection. With
    ``quantize_embeddings`` a token table (axes vocab, embed) is int8 with one scale per vocab row
    (``table_scale``): a lookup dequantizes the rows it gathers, ``attend`` is an int8 projection whose
    output channels are the rows."""

    def __init__(self, num: int, cfg: ModelConfig, *, rngs: nnx.Rngs, axes=("vocab", "embed"),
                 width: int | None = None):
        table = param(rngs, (num, width or cfg.d_model), axes, cfg)
        if cfg.quantization is not None and cfg.quantization.embeddings and axes[0] == "vocab":
            q, scale = quantize_kernel(table[...], 1, 1)
            self.table = Quantized(q, axes=axes, dynamic=cfg.quantization.kind == "int8_dynamic")
            self.table_scale = Quantized(scale.astype(dtype_of(cfg.param_dtype)), axes=axes[:1])
        else:
            self.table = table
        self.dtype = dtype_of(cfg.dtype)

    def __call__(self, ids: Array) -> Array:
        rows = jnp.take(self.table[...], ids, axis=0)
        if isinstance(self.table, Quantized):
            scale = jnp.take(self.table_scale[...], ids, axis=0).astype(jnp.float32)
            return (rows.astype(jnp.float32) * scale[..., None]).astype(self.dtype)
        return rows.astype(self.dtype)

    def attend(self, x: Array) -> Array:
        if isinstance(self.table, Quantized):
            return project(self, "table", x, "BTD,VD->BTV", self.dtype)
        return jnp.einsum("BTD,VD->BTV", x, self.table[...].astype(self.dtype))


class PerLayerInputs(nnx.Module):
    """Gemma 4's per-layer inputs [B, T, L, P]: each token's row of a second table (L x P numbers, times sqrt(P))
    plus a projection of its embedding (times D^-1/2, each layer's P numbers normed), the sum times 2^-1/2,
    as transformers' Gemma4TextModel computes them; layer i's block reads [:, :, i] (``Block.per_layer_mix``)."""

    def __init__(self, cfg: ModelConfig, num_layers: int, *, rngs: nnx.Rngs):
        self.layers, self.width, self.d_model = num_layers, cfg.embeddings.per_layer_width, cfg.d_model
        vocab = cfg.embeddings.per_layer_vocab or cfg.vocab_size
        self.table = Embed(vocab, cfg, rngs=rngs, axes=("vocab", "embedding"), width=num_layers * self.width)
        self.projection = Dense(cfg, cfg.d_model, num_layers * self.width, ("embed", "embedding"), rngs=rngs,
                                bias=False)
        self.norm = Norm(cfg, rngs=rngs, width=self.width, axis="embedding")

    def __call__(self, ids: Array, embedded: Array) -> Array:
        """From the token ids [B, T] and their (scaled) embeddings [B, T, D]."""
        shape = (*ids.shape, self.layers, self.width)
        tokens = self.table(ids)
        tokens = (tokens * jnp.asarray(math.sqrt(self.width), tokens.dtype)).reshape(shape)
        projected = self.projection(embedded) * jnp.asarray(self.d_model ** -0.5, embedded.dtype)
        projected = self.norm(projected.reshape(shape))
        return (projected + tokens) * jnp.asarray(2 ** -0.5, projected.dtype)


def sinusoids(positions: Array, d_model: int, layout: str = "transformer") -> Array:
    """Sinusoidal encodings [B, T, D] of positions [B, T]. ``transformer`` (the 2017 paper): PE[p, 2i] =
    sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same). ``fairseq`` (M2M-100, NLLB): the first D/2 numbers sin(p f_i),
    the next cos(p f_i), f_i = exp(-i log(10000) / (D/2 - 1)) in float32 as fairseq and transformers compute it,
    a zero column last when D is odd."""
    if layout == "fairseq":
        half = d_model // 2
        inv_freq = np.exp(np.arange(half, dtype=np.float32) * np.float32(-math.log(10000) / (half - 1)))
        angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
        pe = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
        return pe if d_model % 2 == 0 else jnp.pad(pe, [(0, 0)] * (pe.ndim - 1) + [(0, 1)])
    inv_freq = np.power(10000.0, -np.arange(0, d_model, 2, dtype=np.float64) / d_model).astype(np.float32)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, -1)
    return pe[..., :d_model]


@functools.lru_cache(maxsize=8)
def marian_sinusoids(rows: int, d_model: int) -> np.ndarray:
    """Marian's and Pegasus' table [rows, D] as transformers builds it (and their files may hold it): angles
    p / 10000^(2 (j // 2) / D) in float64, the sines of the even columns' angles first (ceil(D/2) of them),
    then the cosines of the odd columns', rounded to float32 once. Computing the angles in float32 instead
    would miss it by ~1e-5 at a few hundred positions, so the table is made on the host and read by index."""
    j = np.arange(d_model)
    angles = np.arange(rows, dtype=np.float64)[:, None] / np.power(10000, 2 * (j // 2) / d_model)[None, :]
    table = np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=1).astype(np.float32)
    table.flags.writeable = False
    return table


class Positions(nnx.Module):
    """Absolute positions added to the token embeddings: a learned table, sinusoids, or nothing
    (rotary and relative schemes act inside attention instead)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, width: int | None = None, axis: str = "embed"):
        self.kind, self.offset, self.dtype = cfg.position, cfg.embeddings.position_offset, dtype_of(cfg.dtype)
        self.layout, self.pad_token_id = cfg.embeddings.sinusoids, cfg.tokens.pad
        self.d_model, self.max_positions = width or cfg.d_model, cfg.max_positions
        # DeBERTa may add one to its relative terms
        learned = cfg.position == "learned" or (cfg.disentangled is not None and cfg.disentangled.absolute_input)
        rows = cfg.max_positions + cfg.embeddings.position_offset
        self.table = (param(rngs, (rows, self.d_model), ("positions", axis), cfg)
                      if learned else None)

    def __call__(self, positions: Array) -> Array | None:
        if self.table is not None:
            return jnp.take(self.table[...], positions + self.offset, axis=0).astype(self.dtype)
        if self.kind == "sinusoidal":  # row positions + offset of the table M2M-100 computes (its pad row zero)
            rows = positions + self.offset
            if self.layout == "marian":
                table = marian_sinusoids(self.max_positions + self.offset, self.d_model)
                return jnp.take(jnp.asarray(table), rows, axis=0).astype(self.dtype)
            pe = sinusoids(rows, self.d_model, self.layout)
            if self.layout == "fairseq" and self.pad_token_id is not None:
                pe = jnp.where((rows == self.pad_token_id)[..., None], 0.0, pe)
            return pe.astype(self.dtype)
        return None


def rope_frequencies(cfg: ModelConfig, long: bool = False) -> np.ndarray:
    """Inverse frequencies [H/2] in float32, as transformers computes them (with rope scaling); H is the
    rotated width of a head (all of it, or multi-head latent attention's rope part). A ``dynamic`` model's
    are the unscaled ones (a call within ``max_positions``), a ``longrope`` model's its short ones unless
    ``long``. Each step follows transformers' float32 arithmetic, in its order, so the angles agree to the bit
    where the operations do. 2-D axial rotary (``rotary.axial``): the frequencies of a head half as wide (each of
    the two streams turns a run of them)."""
    H = cfg.rope_dim // 2 if cfg.rotary.axial else cfg.rope_dim
    exponents = np.arange(0, H, 2, dtype=np.float32) / np.float32(H)
    powers = (np.float32(cfg.rotary.theta) ** exponents).astype(np.float32)
    inv_freq = (1.0 / powers).astype(np.float32)
    if cfg.rotary.proportion is not None:  # Gemma 4's proportional rotary: the later frequencies stand still
        inv_freq[int(cfg.rotary.proportion * H // 2):] = 0.0
    s = cfg.rotary.scaling
    if s is None or s.kind == "dynamic":
        return inv_freq
    if s.kind == "linear":
        return (inv_freq / np.float32(s.factor)).astype(np.float32)
    if s.kind == "longrope":
        factors = np.asarray(s.long_factor if long else s.short_factor, np.float32)
        return (1.0 / (factors * powers)).astype(np.float32)
    if s.kind == "yarn":
        return _yarn_frequencies(s, H, cfg.rotary.theta, powers)
    return _llama3_frequencies(s, inv_freq)


def _llama3_frequencies(s, inv_freq: np.ndarray) -> np.ndarray:
    """Llama 3.1: keep the high frequencies, divide the low ones by factor, blend the band of wavelengths in
    between. With low_freq_factor == high_freq_factor (Llama 4 Scout) the band holds only a wavelength equal
    to both bounds, where transformers' blend is 0 / 0: no other frequency reads the blend, so it is computed
    only for a band that has width, and a wavelength on the bound of an empty band is refused."""
    low_wavelen = s.original_max_positions / s.low_freq_factor
    high_wavelen = s.original_max_positions / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    if not medium.any():
        return scaled.astype(np.float32)
    if s.high_freq_factor == s.low_freq_factor:
        raise ValueError(f"RopeScaling llama3 with low_freq_factor == high_freq_factor={s.high_freq_factor!r}: the "
                         f"wavelength of inverse frequencies {inv_freq[medium].tolist()} is exactly "
                         f"original_max_positions / low_freq_factor = {low_wavelen!r}, where transformers' blend is "
                         "0 / 0 (NaN); change rope_theta or original_max_positions slightly")
    smooth = (s.original_max_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    return np.where(medium, blended, scaled).astype(np.float32)


def _yarn_frequencies(s, H: int, theta: float, powers: np.ndarray) -> np.ndarray:
    """YaRN: dimension i keeps its frequency when it turns more than beta_fast times over the original
    length, is divided by factor when it turns fewer than beta_slow times, and is ramped in between."""
    def dimension(turns: float) -> float:  # the dimension whose wavelength fits ``turns`` times
        return H * math.log(s.original_max_positions / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension(s.beta_fast), dimension(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, H - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(H // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    keep = (1 - ramp).astype(np.float32)  # 1: the original frequency, 0: the interpolated one
    original = (1.0 / powers).astype(np.float32)
    interpolated = (1.0 / (np.float32(s.factor) * powers)).astype(np.float32)
    return (interpolated * (1 - keep) + original * keep).astype(np.float32)


def _dynamic_frequencies(cfg: ModelConfig, length: Array) -> Array:
    """Dynamic NTK: the frequencies of a call whose largest position is ``length`` - 1 > max_positions,
    the base raised as transformers raises it, in float32 on device (the length is traced)."""
    H, s = cfg.rope_dim, cfg.rotary.scaling
    growth = (jnp.float32(s.factor) * length.astype(jnp.float32) / jnp.float32(cfg.max_positions)
              - jnp.float32(s.factor - 1))
    base = jnp.float32(cfg.rotary.theta) * growth ** jnp.float32(H / (H - 2))
    return 1.0 / base ** (jnp.arange(0, H, 2, dtype=jnp.float32) / jnp.float32(H))


def rope_tables(cfg: ModelConfig, positions: Array, log_scale: Array | None = None) -> tuple[Array, Array]:
    """cos and sin [B, T, H] of one call at positions [B, T] (M-RoPE: [B, T, 3]), as transformers' rotary module
    gives them.
    ``dynamic`` and ``longrope`` choose their frequencies by the call's length, which transformers takes
    as the largest position in the call plus one (pads included): a traced choice, so one compiled step
    serves every length. (transformers also keeps a grown dynamic base across calls until a call falls
    back under max_positions; here each call is its own, which is what a fresh transformers model does
    and what its generation does, whose lengths only grow.) ``log_scale`` [H/2]: LeRoPE's learned numbers, each
    frequency times exp of its own (Mistral Large 4)."""
    inv_freq = jnp.asarray(rope_frequencies(cfg))
    s = cfg.rotary.scaling
    if s is not None and s.kind in ("dynamic", "longrope"):
        length = jnp.max(positions) + 1
        if s.kind == "longrope":
            long = jnp.asarray(rope_frequencies(cfg, long=True))
            inv_freq = jnp.where(length > s.original_max_positions, long, inv_freq)
        else:
            inv_freq = jnp.where(length > cfg.max_positions, _dynamic_frequencies(cfg, length), inv_freq)
    if log_scale is not None:
        inv_freq = inv_freq * jnp.exp(log_scale.astype(jnp.float32))
    cos, sin = rope_angles(inv_freq, positions, cfg.rotary.sections, cfg.rotary.axial)
    if s is not None and s.cos_sin_factor != 1.0:  # yarn's and longrope's attention factor
        factor = jnp.float32(s.cos_sin_factor)
        cos, sin = cos * factor, sin * factor
    return cos, sin


def rope_angles(inv_freq, positions: Array, sections: tuple[int, ...] | None = None,
                axial: bool = False) -> tuple[Array, Array]:
    """cos and sin [B, T, H] for positions [B, T] (the half-split layout of Hugging Face). M-RoPE: positions
    [B, T, 3] (temporal, height, width streams), the frequency pairs cut into runs of ``sections``, run i turning
    by stream i % 3 (transformers' Qwen2.5-VL rotary embedding). ``axial``: positions [B, T, A] turn each stream's
    run of all ``inv_freq`` in turn (2-D axial rotary: a patch's row, then its column)."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    if axial:
        angles = angles.reshape(*positions.shape[:2], -1)
    elif positions.ndim == 3:
        if sections is None:
            raise ValueError(f"rotary positions of shape {positions.shape} (several streams) need M-RoPE's sections "
                             "or axial rotary; this model's rotary has neither")
        starts = np.cumsum((0,) + tuple(sections))
        angles = jnp.concatenate([angles[:, :, i % 3, starts[i]:starts[i + 1]] for i in range(len(sections))],
                                 axis=-1)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def mrope_positions(ids: Array, valid: Array | None, grid_thw: Array, image_token_id: int, merge: int) -> Array:
    """M-RoPE's three position streams [B, T, 3] of a prompt holding images (transformers' Qwen2.5-VL
    ``get_rope_index``): a text token sits at the count of what precedes it in its row, on all three streams; an
    image's tokens (``image_token_id`` placeholders, the k-th run of the batch being image k of ``grid_thw`` [N, 3],
    its patch grid) at that count plus their (frame, row, column) in the merged grid, and the image then counts as
    max(rows, columns). Pads (``valid`` False) sit at 0 and count nothing."""
    real = jnp.ones(ids.shape, bool) if valid is None else valid.astype(bool)
    image = (ids == image_token_id) & real
    grid = jnp.asarray(grid_thw, jnp.int32)
    frames, rows, columns = grid[:, 0], grid[:, 1] // merge, grid[:, 2] // merge
    count = frames * rows * columns
    ends = jnp.cumsum(count)
    order = (jnp.cumsum(image.reshape(-1)) - 1).reshape(ids.shape)  # each placeholder's index in the batch
    k = jnp.clip(jnp.searchsorted(ends, order, side="right"), 0, grid.shape[0] - 1)  # its image
    j = order - (ends - count)[k]  # its index in the image
    h, w = rows[k], columns[k]
    offsets = jnp.stack([j // (h * w), (j // w) % h, j % w], axis=-1)
    counts = jnp.where(image, jnp.where(j == count[k] - 1, jnp.maximum(h, w), 0), real.astype(jnp.int32))
    before = jnp.cumsum(counts, axis=1) - counts
    positions = before[..., None] + jnp.where(image[..., None], offsets, 0)
    return jnp.where(real[..., None], positions, 0).astype(jnp.int32)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotate [B, T, N, H] by the angles [B, T, H]: x * cos + rotate_half(x) * sin."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


def relative_position_buckets(relative: Array, bidirectional: bool, num_buckets: int,
                              max_distance: int) -> Array:
    """T5's bucketing of key - query distances: exact for small distances, logarithmic beyond."""
    bucket = jnp.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative > 0).astype(relative.dtype) * num_buckets
        distance = jnp.abs(relative)
    else:
        distance = jnp.maximum(-relative, 0)
    max_exact = num_buckets // 2
    log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(relative.dtype)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(distance < max_exact, distance, large)


def distance_buckets(cfg: ModelConfig, q_positions: Array, k_positions: Array, bidirectional: bool) -> Array:
    """The T5 bucket [B, T, S] of each key - query distance, from query positions [B, T] and key positions [B, S]."""
    relative = k_positions[:, None, :] - q_positions[:, :, None]
    return relative_position_buckets(relative, bidirectional, cfg.relative_bias.buckets, cfg.relative_bias.max_distance)


class RelativeBias(nnx.Module):
    """T5 relative position bias: one learned scalar per (bucket, head), shared by all layers of a stack (or,
    with ``relative_bias_per_layer``, one table in each layer, which looks up the buckets its stack computed)."""

    def __init__(self, cfg: ModelConfig, *, bidirectional: bool, rngs: nnx.Rngs):
        self.bidirectional, self.config = bidirectional, cfg
        self.table = param(rngs, (cfg.relative_bias.buckets, cfg.num_heads), ("buckets", "heads"), cfg)

    def lookup(self, buckets: Array) -> Array:
        """Bias [B, N, T, S] of buckets [B, T, S]."""
        bias = jnp.take(self.table[...].astype(jnp.float32), buckets, axis=0)  # BTSN
        return jnp.transpose(bias, (0, 3, 1, 2))

    def __call__(self, q_positions: Array, k_positions: Array) -> Array:
        """Bias [B, N, T, S] from query positions [B, T] and key positions [B, S]."""
        return self.lookup(distance_buckets(self.config, q_positions, k_positions, self.bidirectional))


def xl_distances(query_length: int, key_length: int, bidirectional: bool, clamp: int) -> np.ndarray:
    """The key-query distances a Transformer-XL call scores against, largest first: S, S-1, ..., down to
    0 for causal attention (S + 1 of them) or to 1 - T for bidirectional (S + T), each clamped to
    [-clamp, clamp] when ``clamp`` > 0. Query t of T sits at index S - T + t of the S keys (memory first),
    so its distance to key s is S - T + t - s: column T - t + s (``relative_shift``)."""
    distances = np.arange(key_length, -query_length if bidirectional else -1, -1)
    return np.clip(distances, -clamp, clamp) if clamp > 0 else distances


def xl_encodings(distances: np.ndarray, d_model: int) -> Array:
    """Sinusoids of distances [P] -> [P, D], sines in the first half and cosines in the second, as
    Transformer-XL and XLNet lay them out (not interleaved like the 2017 absolute encoding)."""
    inv_freq = jnp.asarray(1.0 / np.power(10000.0, np.arange(0, d_model, 2, dtype=np.float64) / d_model), jnp.float32)
    angles = jnp.asarray(distances, jnp.float32)[:, None] * inv_freq
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def relative_shift(scores: Array, key_length: int) -> Array:
    """Scores [..., T, P] of every query against the ``xl_distances`` -> [..., T, S], query t against key s.

    Query t needs column T - t + s, a diagonal band. Read the same T x P numbers as P rows of T, drop the
    first row and read the rest as T rows of P - 1: row t then starts exactly T - t columns later. Only
    reshapes and slices (Dai et al. 2019, appendix B); nothing larger than the scores is built.
    """
    *lead, T, P = scores.shape
    shifted = scores.reshape(*lead, P, T)[..., 1:, :].reshape(*lead, T, P - 1)
    return shifted[..., :key_length]


class Embeddings(nnx.Module):
    """A stack's front end: token vectors (from a table the family may share between stacks) ->
    optional sqrt(D) scale or multiplier -> absolute positions -> token types -> optional norm -> dropout -> with
    factorised embeddings (``embedding_size``: ALBERT, ELECTRA), a projection to d_model."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, token_types: bool = False):
        width, axis = embedding_width(cfg)
        # the 2017 paper's sqrt(D) and Granite's embedding_multiplier: one product either way
        scale = (math.sqrt(cfg.d_model) if cfg.embeddings.scale else 1.0) * cfg.embeddings.multiplier
        self.scale = None if scale == 1.0 else scale
        self.positions = Positions(cfg, rngs=rngs, width=width, axis=axis)
        self.token_types = (Embed(cfg.embeddings.types, cfg, rngs=rngs, axes=("types", axis), width=width)
                            if token_types and cfg.embeddings.types else None)
        self.norm = Norm(cfg, rngs=rngs, width=width, axis=axis) if cfg.norms.embedding else None
        self.project = (Dense(cfg, width, cfg.d_model, (axis, "embed"), rngs=rngs)
                        if cfg.embeddings.width is not None else None)
        self.dropout_rate = cfg.dropout_rate
        # RoBERTa counts real tokens only; a pad sits on table row pad_token_id.
        self.pad_aware_positions, self.pad_token_id = cfg.embeddings.pad_aware_positions, cfg.tokens.pad
        self.position_offset = cfg.embeddings.position_offset

    def scaled(self, tokens: Array) -> Array:
        """Token vectors times the scale (sqrt(D) and/or the multiplier), where there is one."""
        return tokens if self.scale is None else tokens * jnp.asarray(self.scale, tokens.dtype)

    def default_positions(self, input_ids: Array | None, shape: tuple[int, int]) -> Array:
        """Positions [B, T] when none are given: 0..T-1 in every row, or RoBERTa's count of real tokens."""
        if self.pad_aware_positions and input_ids is not None:
            real = (jnp.asarray(input_ids) != self.pad_token_id).astype(jnp.int32)
            return jnp.cumsum(real, axis=1) * real + (self.pad_token_id - self.position_offset)
        return jnp.broadcast_to(jnp.arange(shape[1], dtype=jnp.int32), shape)

    def document_positions(self, segments: Array) -> Array:
        """Positions [B, T] of documents packed into rows (``segments``: each token's document, a run of one
        id): each document's as ``default_positions`` gives it alone, restarting where it starts."""
        index = jnp.arange(segments.shape[1], dtype=jnp.int32)
        starts = jnp.concatenate([jnp.ones_like(segments[:, :1], bool), segments[:, 1:] != segments[:, :-1]], axis=1)
        within = index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
        if self.pad_aware_positions:  # RoBERTa: a document alone counts its tokens from the row after the pad's
            return within + 1 + self.pad_token_id - self.position_offset
        return within

    def __call__(self, table: Embed, input_ids: Array | None = None, *, inputs_embeds: Array | None = None,
                 positions: Array | None = None, token_type_ids: Array | None = None,
                 key: Array | None = None, absolute: Array | None = None, prescaled: bool = False
                 ) -> tuple[Array, Array]:
        """x [B, T, D] and the positions [B, T] it was embedded at (``positions`` if given). ``absolute`` [1, T, D]
        or [B, T, D]: the position vectors added in place of the table's rows (an image tower's table resampled to
        another grid; Llama 3.2 Vision's, each tile's own, mixed with its aspect ratio's).
        ``prescaled``: ``inputs_embeds`` already hold the scale where it applies (``scaled``: a decoder's token
        vectors with image features placed among them unscaled)."""
        if inputs_embeds is None:
            tokens = table(input_ids)
        else:  # (an image tower has no table: its patches are in the compute dtype)
            tokens = inputs_embeds if table is None else inputs_embeds.astype(table.dtype)
        if positions is None:
            positions = self.default_positions(input_ids, tokens.shape[:2])
        positions = jnp.asarray(positions, jnp.int32)
        x = tokens if prescaled else self.scaled(tokens)
        absolute = self.positions(positions) if absolute is None else absolute
        if absolute is not None:
            x = x + absolute
        if self.token_types is not None:
            x = x + self.token_types(jnp.zeros_like(positions) if token_type_ids is None else token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        x = dropout(x, self.dropout_rate, key)
        return (x if self.project is None else self.project(x)), positions


def log_buckets(relative: np.ndarray, buckets: int, max_distance: int) -> np.ndarray:
    """DeBERTa v2's bucketing of query - key distances: exact within half the buckets either side, then
    logarithmic up to ``max_distance``, sign kept. The arithmetic is float32 as transformers does it (the ceil
    decides the bucket, so a float64 logarithm could move a boundary)."""
    mid = buckets // 2
    sign = np.sign(relative)
    distance = np.where((relative < mid) & (relative > -mid), mid - 1, np.abs(relative))
    ratio = np.log(distance.astype(np.float32) / np.float32(mid)) / np.log(np.float32((max_distance - 1) / mid))
    far = np.ceil(ratio * np.float32(mid - 1)).astype(np.float32) + np.float32(mid)
    return np.where(distance <= mid, relative, far * sign).astype(np.int64)


@functools.lru_cache(maxsize=64)
def disentangled_index(length: int, span: int, buckets: int, max_distance: int) -> np.ndarray:
    """[T, T] int32: the row of DeBERTa's relative-position table that query t and key s read, the distance
    t - s (bucketed when ``buckets``) moved by ``span`` and clamped into the table's 2 * span rows. Indices, not
    position_ids, as transformers builds them; static for a length, so computed once on the host."""
    relative = np.arange(length)[:, None] - np.arange(length)[None, :]
    if buckets:
        relative = log_buckets(relative, buckets, max_distance)
    return np.clip(relative + span, 0, 2 * span - 1).astype(np.int32)


class RelativeEmbeddings(nnx.Module):
    """DeBERTa's relative-position table [2 * span, D], shared by every layer (each projects it with its own
    weights), layer-normed before use in v2/v3 (``relative_embedding_norm``)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        rows = 2 * cfg.disentangled.span(cfg.max_positions)
        self.table = param(rngs, (rows, cfg.d_model), ("relative", "embed"), cfg)
        self.norm = Norm(cfg, rngs=rngs) if cfg.disentangled.norm_table else None
        self.dtype = dtype_of(cfg.dtype)

    def __call__(self) -> Array:
        table = self.table[...].astype(self.dtype)
        return table if self.norm is None else self.norm(table)
