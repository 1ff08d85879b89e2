"""ModelConfig: one frozen, validated description of every architecture jaxformer builds.

Components are chosen by fields, not by subclasses: a BERT, a GPT-2, a LLaMA, a T5 and the 2017 Transformer
differ only in the values below. Each concern some models lack is a small frozen part, None where absent; each
part checks its own fields and ModelConfig what joins two of them, when it is built, so that a bad config fails
where it is written, naming the field, the value and what would be valid.

Precision policy (the one place it is stated; jaxformer.layers follows it):
- ``param_dtype`` is how parameters are stored; optimizer state follows the parameters. Training keeps float32
  master parameters (``train.compute_dtype`` changes ``dtype`` only).
- ``dtype`` is the compute dtype: weights are cast to it where they are used, and matmul inputs and activations
  between layers are in it.
- Always float32, whatever ``dtype``: attention scores, bias and softmax (matmuls accumulate into float32),
  norms, rotary angles, the MoE router's softmax, logits' loss (the objectives cast).
- Inference in bfloat16 or float16 sets both (``jf.from_pretrained(path, dtype="bfloat16")``,
  ``jf.build(name, dtype=..., param_dtype=...)``), halving the bytes a decode step reads.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any

# dual_encoder: a text tower beside an image tower (``vision``), joined by contrastive similarity (CLIP, SigLIP)
FAMILIES = ("encoder", "decoder", "encoder_decoder", "dual_encoder")
NORMS = ("layernorm", "rmsnorm")
# pre: x + f(norm(x)); post: norm(x + f(x)) (BERT, 2017); output: x + norm(f(x)) (OLMo-2)
NORM_POSITIONS = ("pre", "post", "output")
QK_NORM_SPANS = ("head", "projection", "each_head")
LINEAR_DECAYS = ("head", "channel")  # what one decay rate of a linear layer covers
# the gated ones: swiglu (silu gate), geglu (tanh-form gelu gate: T5 v1.1, Gemma), geglu_erf (exact gelu: ModernBERT)
# quick_gelu: x * sigmoid(1.702 x) (CLIP)
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "quick_gelu", "swiglu", "geglu", "geglu_erf")
GATED_ACTIVATIONS = ("swiglu", "geglu", "geglu_erf")
CLASSIFIER_POOLINGS = ("cls", "mean")
# (none: no positions at all, a causal stack telling order by its mask: Kimi Linear, whose latent attention is NoPE)
POSITIONS = ("sinusoidal", "learned", "rope", "relative", "xl", "disentangled", "none")
# sinusoidal positions: the 2017 paper's (sin and cos interleaved) or fairseq's (M2M-100, NLLB: all sines then
# all cosines, frequencies 10000^(-i / (D/2 - 1)), the pad id's row zero)
SINUSOID_LAYOUTS = ("transformer", "fairseq", "marian")  # interleaved; M2M-100's halves; Marian/Pegasus' halves
DISENTANGLED_TERMS = ("c2p", "p2c")  # DeBERTa: content-to-position, position-to-content
CONV_ACTIVATIONS = ("tanh", "relu", "gelu", "gelu_tanh", "silu")
ATTENTION_PATTERNS = ("bidirectional", "causal", "prefix", "sliding", "alternating")
LAYER_TYPES = ("full", "sliding", "chunked", "window")  # window: Qwen2.5-VL's image tower (Patches.window)
ROPE_SCALINGS = ("linear", "llama3", "yarn", "dynamic", "longrope")
# sparsemixer: PhiMoE's top-2, each weight a softmax over the experts near the best (Experts.jitter_eps)
ROUTER_SCORES = ("softmax", "sigmoid", "sparsemixer", "sqrtsoftplus")
ROUTER_GROUP_SCORES = ("best", "best_two")
ROUTER_AUX_LOSSES = ("batch", "sequence")
MOE_DISPATCHES = ("auto", "grouped", "all_to_all", "dense")
HEADS = (
    "none",  # base model: hidden states only
    "lm",  # next-token logits (decoder and encoder-decoder)
    "mlm",  # BERT/RoBERTa masked-LM head
    "pretraining",  # BERT MLM + next-sentence prediction
    "sequence_classification",
    "token_classification",
    "question_answering",
    "discriminator",  # ELECTRA's replaced-token detection: one logit per token (replaced or original)
    "contrastive",  # a dual encoder's image-text similarities (CLIP, SigLIP)
)
POOLER_ACTIVATIONS = ("tanh", "relu", "gelu")
# an image tower's pooler_output: its first token through a norm of its own, the stack having none (CLIP's
# post_layernorm); or SigLIP's multihead attention pooling head (a learned probe attending over the final-normed
# states, then a norm and an MLP)
IMAGE_POOLERS = ("norm", "attention")
# which token a text tower pools: the first EOS (CLIP; the largest id when eos_token_id is 2, its legacy files),
# the last (SigLIP)
POOLED_TOKENS = ("eos", "last")
ENCODER_HEADS = ("none", "mlm", "pretraining", "sequence_classification", "token_classification",
                 "question_answering", "discriminator")
# encoder-decoders: BART's and T5's classifiers read the decoder's state at the last EOS of input_ids, their span
# heads every decoder position; without decoder_input_ids both read the source shifted right
ENCODER_DECODER_HEADS = ("none", "lm", "sequence_classification", "question_answering")
REMAT_POLICIES = ("none", "full", "dots", "qkv_mlp", "offload")
ATTENTION_BACKENDS = ("auto", "xla", "cudnn", "splash")
DTYPES = ("float32", "bfloat16", "float16")
# LoRA targets: a projection's name, alone or after its sublayer's ("attn.q" spares cross-attention's q)
LORA_PROJECTIONS = ("q", "k", "v", "o", "q_down", "q_up", "kv_down", "wi", "wi_gate", "wo")
LORA_SUBLAYERS = ("attn", "cross_attn", "mlp", "experts", "shared_experts")
QUANTIZATIONS = ("int8", "int8_dynamic")


def _one_of(field: str, value: Any, valid: tuple) -> None:
    if value not in valid:
        raise ValueError(f"ModelConfig.{field}={value!r} is not valid; expected one of {valid}")


def _positive(field: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"ModelConfig.{field}={value!r} must be a positive integer")


def _non_negative(field: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"ModelConfig.{field}={value!r} must be a non-negative integer")


def check_lora_targets(targets, field: str) -> None:
    """Each entry names a projection (LORA_PROJECTIONS), alone or as sublayer.name (LORA_SUBLAYERS)."""
    for target in targets:
        sublayer, _, name = target.rpartition(".")
        if name not in LORA_PROJECTIONS or (sublayer and sublayer not in LORA_SUBLAYERS):
            raise ValueError(f"{field} entry {target!r} names no projection; valid: {', '.join(LORA_PROJECTIONS)}, "
                             f"alone or as sublayer.name with a sublayer from {', '.join(LORA_SUBLAYERS)}")


def _rate(field: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"ModelConfig.{field}={value!r} must lie in [0, 1)")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Context extension for rotary embeddings, as transformers' ``rope_parameters`` describe it.

    - ``linear`` divides every frequency by ``factor``.
    - ``llama3`` divides only the low frequencies and blends the band between ``low_freq_factor`` and
      ``high_freq_factor`` (Llama 3.1; the band is empty when they are equal, as in Llama 4 Scout's file).
    - ``yarn`` (Peng et al. 2023) interpolates (divides by ``factor``) the dimensions that turn fewer than
      ``beta_slow`` times over ``original_max_positions``, keeps those that turn more than ``beta_fast``
      times, ramps linearly in between (bounds floored and ceiled when ``truncate``), and multiplies cos and
      sin by ``attention_factor`` (None: 0.1 ln(factor) + 1, or DeepSeek's ratio of that with ``mscale``
      over that with ``mscale_all_dim``). With multi-head latent attention, ``mscale_all_dim`` also
      multiplies the softmax scale by (0.1 mscale_all_dim ln(factor) + 1)^2, as DeepSeek does.
    - ``dynamic`` (NTK-aware) leaves the frequencies alone until a call's largest position reaches the
      model's ``max_positions``; past it the base grows with that length L:
      theta (factor L / max_positions - factor + 1)^(H / (H - 2)), recomputed each call as transformers does.
    - ``longrope`` (Phi-3) divides frequency i by ``short_factor[i]``, or by ``long_factor[i]`` in a call
      whose largest position passes ``original_max_positions``, and multiplies cos and sin by
      ``attention_factor`` (None: sqrt(1 + ln(factor) / ln(original_max_positions)), 1 when factor <= 1).
    """

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()

    def __post_init__(self):
        if self.kind not in ROPE_SCALINGS:
            raise ValueError(f"RopeScaling.kind={self.kind!r} is not valid; expected one of {ROPE_SCALINGS}")
        if not self.factor > 0:
            raise ValueError(f"RopeScaling.factor={self.factor!r} must be > 0")
        if self.kind in ("llama3", "yarn", "longrope"):
            _positive("rope_scaling.original_max_positions", self.original_max_positions)
        # low == high (Llama 4 Scout's file) leaves no band to blend: transformers computes it, so do we
        if self.kind == "llama3" and not 0 < self.low_freq_factor <= self.high_freq_factor:
            raise ValueError(f"RopeScaling low_freq_factor={self.low_freq_factor!r} and high_freq_factor="
                             f"{self.high_freq_factor!r} must satisfy 0 < low <= high")
        if self.kind == "yarn" and not 0 < self.beta_slow <= self.beta_fast:
            raise ValueError(f"RopeScaling beta_fast={self.beta_fast!r} and beta_slow={self.beta_slow!r} must "
                             "satisfy 0 < beta_slow <= beta_fast")
        if self.attention_factor is not None and not self.attention_factor > 0:
            raise ValueError(f"RopeScaling.attention_factor={self.attention_factor!r} must be > 0")
        for field in ("short_factor", "long_factor"):  # YAML and JSON give lists; a tuple keeps the config hashable
            object.__setattr__(self, field, tuple(float(f) for f in getattr(self, field)))
        if self.kind == "longrope":
            if not self.short_factor or len(self.short_factor) != len(self.long_factor):
                raise ValueError("RopeScaling longrope needs short_factor and long_factor of one length (half the "
                                 f"rotated head width); got {len(self.short_factor)} and {len(self.long_factor)}")
            if not all(f > 0 for f in self.short_factor + self.long_factor):
                raise ValueError("RopeScaling longrope factors must all be > 0")
        elif self.short_factor or self.long_factor:
            raise ValueError(f"RopeScaling short_factor and long_factor belong to longrope, not {self.kind!r}")

    @property
    def cos_sin_factor(self) -> float:
        """What yarn and longrope multiply cos and sin by (so q . k by its square); 1 for the others."""
        if self.attention_factor is not None:
            return self.attention_factor
        if self.kind == "yarn":
            if self.mscale and self.mscale_all_dim:
                return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim)
            return _yarn_mscale(self.factor)
        if self.kind == "longrope" and self.factor > 1:
            return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_positions))
        return 1.0


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature correction 0.1 mscale ln(factor) + 1 (1 when not extending)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


# ---------------------------------------------------------------------------------------------------------------
# Sub-configs: one frozen dataclass per concern. An optional one is None where the model has no such part (a dense
# model's ``experts``, a model without latent attention's ``latent``); each checks its own fields, and ModelConfig
# checks only what joins two concerns. Their fields' flat spellings (``num_experts`` for ``experts.count``: presets,
# config readers, YAML overrides and run folders written before the sub-configs) are listed in ``FLAT`` below.


@dataclasses.dataclass(frozen=True)
class HyperConnections:
    """Manifold-constrained hyper-connections (DeepSeek-V4): the residual stream is ``streams`` copies (hc_mult), each
    sublayer reading a weighted sum of them and joining them through a per-token mixing matrix that
    ``sinkhorn_iters`` Sinkhorn-Knopp rounds bring toward doubly stochastic; ``eps`` floors the weights and sums."""

    streams: int
    sinkhorn_iters: int = 20
    eps: float = 1e-6

    def __post_init__(self):
        _positive("hc_streams", self.streams)
        _positive("hc_sinkhorn_iters", self.sinkhorn_iters)
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"ModelConfig.hc_eps={self.eps!r} must be a finite number >= 0")


COMPRESSED_KINDS = ("sliding", "sparse", "heavy")


@dataclasses.dataclass(frozen=True)
class CompressedAttention:
    """DeepSeek-V4's attention: one shared key-value head over a sliding window plus compressed entries, one per
    block of earlier tokens (``layers``: each layer's kind: 'sliding' the window alone, 'sparse' CSA, whose
    overlapping blocks of ``sparse_rate`` an indexer of ``index_heads`` x ``index_head_dim`` narrows to each query's
    ``index_topk``, 'heavy' HCA, blocks of ``heavy_rate`` all visible once passed). Queries through a low rank
    ``q_rank``; the compressed layers rotate by ``rope_theta`` and ``rope_scaling`` of their own (the window-only
    layers by the model's base, unscaled); the output projection is ``out_groups`` groups of heads, each to
    ``out_rank``, then one projection to d_model."""

    layers: tuple[str, ...]
    q_rank: int = 1024
    sparse_rate: int = 4
    heavy_rate: int = 128
    rope_theta: float = 160000.0
    rope_scaling: RopeScaling | None = None
    index_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    out_groups: int = 8
    out_rank: int = 1024

    def __post_init__(self):
        if isinstance(self.layers, list):  # YAML and JSON hand us lists
            object.__setattr__(self, "layers", tuple(self.layers))
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if not self.layers or any(kind not in COMPRESSED_KINDS for kind in self.layers):
            raise ValueError(f"ModelConfig.compressed_layers={self.layers!r} must give each layer's kind, one of "
                             f"{COMPRESSED_KINDS}")
        for name in ("q_rank", "sparse_rate", "heavy_rate", "index_heads", "index_head_dim", "index_topk",
                     "out_groups", "out_rank"):
            _positive(f"compressed_{name}", getattr(self, name))
        _finite_positive("compressed_rope_theta", self.rope_theta)

    def rate(self, kind: str) -> int:
        return self.sparse_rate if kind == "sparse" else self.heavy_rate


@dataclasses.dataclass(frozen=True)
class Norms:
    """Where and how the blocks normalise (``position``: pre x + f(norm(x)), post norm(x + f(x)), output
    x + norm(f(x)))."""

    kind: str = "layernorm"
    position: str = "pre"
    eps: float = 1e-5
    bias: bool = True  # layernorm only; rmsnorm has no bias
    scale_offset: float = 0.0  # the norm multiplies by (offset + scale): Gemma stores scale - 1 (offset 1.0)
    sandwich: bool = False  # pre-norm plus a norm of each sublayer's output before the residual (Gemma 2/3)
    embedding: bool = False  # a norm right after the embeddings (BERT, BART)
    first_attention: bool = True  # False: the first layer's attention reads its input unnormed (ModernBERT)
    final: bool = True  # a norm after the last block (pre-norm stacks)
    # the last hidden state a call returns is after the final norm (Hugging Face ties it, as most models do);
    # False: the last layer's output before it (CLIP's and SigLIP's towers), last_hidden_state still normed
    final_in_hidden_states: bool = True
    # DeepSeek-V4: each sublayer joins a residual of several copies (the wiring of the block, as position is)
    hyper_connections: HyperConnections | None = None

    def __post_init__(self):
        if isinstance(self.hyper_connections, dict):
            object.__setattr__(self, "hyper_connections", HyperConnections(**self.hyper_connections))
        _one_of("norm", self.kind, NORMS)
        if self.scale_offset not in (0.0, 1.0):
            raise ValueError(f"ModelConfig.norm_scale_offset={self.scale_offset!r} must be 0.0 or 1.0 (Gemma)")
        if self.sandwich and self.position != "pre":
            raise ValueError("ModelConfig.sandwich_norm=True adds output norms to a pre-norm block; set "
                             f"norm_position='pre', not {self.position!r}")
        _one_of("norm_position", self.position, NORM_POSITIONS)
        if not self.eps > 0:
            raise ValueError(f"ModelConfig.norm_eps={self.eps!r} must be > 0")


@dataclasses.dataclass(frozen=True)
class ClampedSwiGLU:
    """gpt-oss's SwiGLU: the gate clamped to <= limit, the up projection to [-limit, limit], and
    gate * sigmoid(alpha * gate) * (up + offset); limit None: no clamp (nor offset), alpha then the gate's gain."""

    limit: float | None = None
    alpha: float = 1.0
    offset: float = 1.0  # what the clamped up projection is shifted by: gpt-oss's 1, DeepSeek-V4's 0 (silu(g) * up)

    def __post_init__(self):
        if self.limit is not None and not self.limit > 0:
            raise ValueError(f"ModelConfig.swiglu_limit={self.limit!r} must be > 0")
        if not self.alpha > 0:
            raise ValueError(f"ModelConfig.swiglu_alpha={self.alpha!r} must be > 0")
        if self.offset not in (0.0, 1.0) or (self.limit is None and self.offset != 1.0):
            raise ValueError(f"ModelConfig.swiglu_offset={self.offset!r} must be 1 (gpt-oss) or 0 (DeepSeek-V4), and "
                             "0 only with a swiglu_limit (the offset shifts the clamped up projection)")


@dataclasses.dataclass(frozen=True)
class Embeddings:
    """The token, type and absolute position tables, and how the output projection relates to them."""

    tie: bool = True  # the output projection shares the token embedding
    scale: bool = False  # multiply token embeddings by sqrt(d_model) in the compute dtype (2017, Gemma)
    shared: bool = True  # encoder-decoder: one token table for both sides (False: T5Gemma's two)
    types: int = 0  # token-type (segment) embeddings; 0 for none
    # factorised embeddings (ALBERT, ELECTRA): the tables and the embedding norm are this wide, and a projection
    # (with bias) takes them to d_model; an MLM head projects back before its tied output. None: d_model wide.
    width: int | None = None
    position_offset: int = 0  # rows before position 0 in a learned table (RoBERTa, BART use 2)
    pad_aware_positions: bool = False  # RoBERTa: positions count non-pad tokens; pads use row pad_token_id
    # a decoder called without position ids counts each row's real tokens of its attention mask (OPT), so a
    # left-padded row sits at the positions an unpadded one does; False: columns 0..T-1 whatever the mask
    positions_from_mask: bool = False
    # position="sinusoidal": the 2017 paper's layout (sin and cos interleaved), fairseq's (M2M-100, NLLB: all sines
    # then all cosines, frequencies 10000^(-i / (D/2 - 1)), the pad id's row zero) or Marian's halves
    sinusoids: str = "transformer"
    multiplier: float = 1.0  # token vectors times this, in the compute dtype (Granite's embedding_multiplier)
    # per-layer inputs (Gemma 4's per-layer embeddings): a second table of per_layer_width numbers per layer
    # for each token (per_layer_vocab rows; 0: vocab_size), joined with a projection of the embeddings and mixed
    # into each layer's output through its own gate; 0: none
    per_layer_width: int = 0
    per_layer_vocab: int = 0
    # rows of the token table past vocab_size, ids embedded but never predicted (Llama 3.2 Vision's 8: its image
    # token id is vocab_size); the untied output projection stays vocab_size wide
    extra_rows: int = 0

    def __post_init__(self):
        _finite_positive("embedding_multiplier", self.multiplier)
        _non_negative("embedding_extra_rows", self.extra_rows)
        if self.extra_rows and self.tie:
            raise ValueError(f"ModelConfig.embedding_extra_rows={self.extra_rows}: rows no logit has need an untied "
                             "output projection (tie_embeddings=False)")
        _non_negative("per_layer_input_size", self.per_layer_width)
        _non_negative("per_layer_vocab_size", self.per_layer_vocab)
        if self.per_layer_vocab and not self.per_layer_width:
            raise ValueError(f"ModelConfig.per_layer_vocab_size={self.per_layer_vocab} sizes the per-layer input "
                             "table: it needs per_layer_input_size > 0")
        _non_negative("position_offset", self.position_offset)
        _non_negative("type_vocab_size", self.types)
        if self.width is not None:
            _positive("embedding_size", self.width)
        _one_of("sinusoids", self.sinusoids, SINUSOID_LAYOUTS)


@dataclasses.dataclass(frozen=True)
class Patches:
    """The image front end of an encoder tower (ViT, CLIP's and SigLIP's vision models): ``pixel_values``
    [B, channels, image_size, image_size] cut into square patches, each projected to d_model (a strided
    convolution, computed as a matmul over the flattened patch), an optional learned class token first, then the
    learned positions (one per patch and class token: ``max_positions``) and ``norms.embedding`` (CLIP's
    pre-layernorm). The model has no token table (``vocab_size`` 0)."""

    image_size: int
    patch_size: int
    channels: int = 3
    class_token: bool = True  # ViT's and CLIP's learned first token (SigLIP has none)
    bias: bool = True  # the patch projection's bias (CLIP's has none)
    # NaFlex (SigLIP2): images of any aspect ratio arrive already cut into patches [B, N, p * p * channels], padded
    # to N with pixel_attention_mask, their grids in spatial_shapes; the image_size / patch_size square grid of
    # positions is resized to each image's grid (bilinear, antialiased)
    flexible: bool = False
    # Llama 3.2 Vision: each image cut into up to ``tiles`` tiles (pixel_values [B, images, tiles, C, H, W], with
    # aspect_ratio_ids and aspect_ratio_mask); ``aspect_ratios`` the (rows, columns) arrangements, id = index + 1,
    # each with tanh-gated tile embeddings; ``global_layers`` gated layers run over the joined tiles after the stack;
    # the output is the last state beside the outputs of the stack's ``intermediate_layers``, along the width
    tiles: int = 0
    aspect_ratios: tuple[tuple[int, int], ...] = ()
    global_layers: int = 0
    intermediate_layers: tuple[int, ...] = ()
    # Qwen2-VL's dynamic resolution (merge > 0): images of any size arrive cut into patches of ``temporal`` frames
    # [patches, channels * temporal * p * p], each merge x merge block contiguous, with image_grid_thw; positions are
    # 2-D rotary (``rotary.axial``); the merger (norm, Linear, GELU, Linear) turns each block's states into one
    # vector of ``merged_width``. ``window`` (Qwen2.5-VL): the side in pixels of the windows its 'window' layers
    # attend within (0: none). image_size is 0 (no fixed size)
    temporal: int = 1
    merge: int = 0
    merged_width: int = 0
    window: int = 0

    def __post_init__(self):
        object.__setattr__(self, "aspect_ratios", tuple(tuple(pair) for pair in self.aspect_ratios))  # (JSON lists)
        object.__setattr__(self, "intermediate_layers", tuple(self.intermediate_layers))
        if self.merge or (self.temporal, self.merged_width, self.window) != (1, 0, 0):
            self._check_dynamic_resolution()
            return
        for name, value in (("image_size", self.image_size), ("patch_size", self.patch_size),
                            ("image_channels", self.channels)):
            _positive(name, value)
        if not self.tiles and (self.aspect_ratios or self.global_layers or self.intermediate_layers):
            raise ValueError("ModelConfig.aspect_ratios, global_layers and intermediate_layers belong to a tiled "
                             "tower (Llama 3.2 Vision): they need max_tiles > 0")
        # (the tower only counts the pairs: one of more than max_tiles tiles, which no processor gives, is kept)
        if self.tiles and (not self.class_token or self.flexible or not self.aspect_ratios or any(
                len(pair) != 2 or min(pair) < 1 for pair in self.aspect_ratios)):
            raise ValueError(f"ModelConfig.max_tiles={self.tiles} (tiled images) needs class_token=True, no "
                             f"flexible_patches, and aspect_ratios of (rows, columns) pairs, got "
                             f"{self.aspect_ratios!r}")
        _non_negative("max_tiles", self.tiles)
        _non_negative("global_layers", self.global_layers)
        if self.image_size % self.patch_size:
            raise ValueError(f"ModelConfig.patch_size={self.patch_size} must divide image_size={self.image_size} "
                             "(the patches tile the image)")
        if self.flexible and self.class_token:
            raise ValueError("ModelConfig.flexible_patches=True (NaFlex) takes no class_token: its tokens are the "
                             "image's patches alone, padded to a common count")

    def _check_dynamic_resolution(self) -> None:
        for name, value in (("patch_merge_size", self.merge), ("merged_width", self.merged_width),
                            ("temporal_patch_size", self.temporal), ("patch_size", self.patch_size),
                            ("image_channels", self.channels)):
            _positive(name, value)
        _non_negative("image_window", self.window)
        if self.image_size or self.flexible or self.class_token or self.tiles:
            raise ValueError("ModelConfig.patch_merge_size > 0 (Qwen2-VL's dynamic resolution) takes images of any "
                             "size: it needs image_size=0, flexible_patches=False, class_token=False, max_tiles=0, "
                             f"not {self.image_size}, {self.flexible}, {self.class_token}, {self.tiles}")

    @property
    def count(self) -> int:
        """Patches per image."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens(self) -> int:
        """Tokens the tower's stack sees: the patches and the class token."""
        return self.count + int(self.class_token)

    def output_width(self, d_model: int) -> int:
        """The width of a tiled tower's output: the last state and each intermediate layer's output."""
        return d_model * (1 + len(self.intermediate_layers))


@dataclasses.dataclass(frozen=True)
class Audio:
    """An encoder-decoder's audio front end (Whisper): ``input_features`` [B, mel_bins, 2 * source_positions]
    log-mel frames through two 1-D convolutions of width 3 (zero padding 1; the second of stride 2, halving the
    frames), each followed by GELU, plus a stored table of ``source_positions`` position vectors (sinusoids in
    published files, read as stored). The encoder has no token table; the decoder keeps its own learned
    positions (``max_positions``)."""

    mel_bins: int
    source_positions: int = 1500

    def __post_init__(self):
        _positive("num_mel_bins", self.mel_bins)
        _positive("max_source_positions", self.source_positions)

    @property
    def frames(self) -> int:
        """Frames of input_features the encoder reads: the stride-2 convolution halves them to source_positions."""
        return 2 * self.source_positions


@dataclasses.dataclass(frozen=True)
class Rotary:
    """Rotary positions (present exactly when position='rope')."""

    theta: float = 10000.0
    scaling: RopeScaling | None = None
    local_theta: float | None = None  # sliding-window layers' own base, unscaled (Gemma 3); None: theta
    interleave: bool = False  # rotary pairs are adjacent (x0, x1), (x2, x3), as DeepSeek and GPT-J lay them out
    # partial rotary: only the first dim numbers of each query and key head rotate, the rest pass through
    # (GPT-NeoX's rotary_pct of the head, GPT-J's rotary_dim); None: the whole head (MLA: rope_head_dim)
    dim: int | None = None
    # proportional rotary (Gemma 4's full layers): the whole head turns by rotate_half, but only the first
    # int(proportion * H / 2) frequencies (base^(-2i/H), H the head width) are non-zero, the rest stand still
    proportion: float | None = None
    # LeRoPE (Mistral Large 4): each frequency times exp(a learned number), one per frequency, shared by the layers
    learned_frequencies: bool = False
    # 2-D axial rotary (Qwen2-VL's vision towers): positions come as two streams (a patch's row and column); the
    # first half of the frequency pairs turns by the row, the second by the column, each half's frequencies those
    # of a head half as wide
    axial: bool = False
    # M-RoPE (Qwen2-VL, Qwen2.5-VL: mrope_section): positions come as three streams (temporal, height, width); the
    # frequency pairs are cut into runs of these lengths, run i turning by stream i % 3. None: one stream
    sections: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.proportion is not None and not 0 < self.proportion <= 1:
            raise ValueError(f"ModelConfig.rope_proportion={self.proportion!r} must lie in (0, 1]")
        if not self.theta > 0:
            raise ValueError(f"ModelConfig.rope_theta={self.theta!r} must be > 0")
        if isinstance(self.scaling, dict):  # YAML and JSON hand us plain mappings
            object.__setattr__(self, "scaling", RopeScaling(**self.scaling))
        if self.scaling is not None and not isinstance(self.scaling, RopeScaling):
            raise ValueError(f"ModelConfig.rope_scaling={self.scaling!r} must be a RopeScaling")
        if self.local_theta is not None and not self.local_theta > 0:
            raise ValueError(f"ModelConfig.local_rope_theta={self.local_theta!r} must be > 0")
        if self.learned_frequencies and self.local_theta is not None:
            raise ValueError("ModelConfig.rope_learned_frequencies=True scales the stack's one rotary table; it "
                             "cannot be combined with local_rope_theta")
        if self.dim is not None and not (isinstance(self.dim, int) and self.dim > 0 and self.dim % 2 == 0):
            raise ValueError(f"ModelConfig.rotary_dim={self.dim!r} must be a positive even integer")
        if isinstance(self.sections, list):  # JSON hands us a list
            object.__setattr__(self, "sections", tuple(self.sections))
        if self.sections is not None and (not self.sections or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.sections)):
            raise ValueError(f"ModelConfig.rope_sections={self.sections!r} must be a non-empty tuple of positive ints")


@dataclasses.dataclass(frozen=True)
class RelativeBias:
    """T5's bucketed relative position bias: the positions of position='relative', or beside absolute positions
    (MPNet: one table for the stack, distances between token indices 0..T-1 whatever the position ids)."""

    buckets: int = 32
    max_distance: int = 128
    per_layer: bool = False  # each layer's self-attention has its own table (UMT5), not one per stack (T5)

    def __post_init__(self):
        _positive("relative_buckets", self.buckets)
        _positive("relative_max_distance", self.max_distance)
        if self.buckets < 4:
            raise ValueError(f"ModelConfig.relative_buckets={self.buckets} must be >= 4")


@dataclasses.dataclass(frozen=True)
class TransformerXL:
    """Transformer-XL relative attention (present exactly when position='xl'): sinusoidal encodings of key-query
    distances inside attention with learned global content and position biases (u, v); decoder family only."""

    memory_len: int = 0  # segment memory: each layer's inputs of the last memory_len tokens (0: none)
    clamp_len: int = 0  # distances beyond clamp_len use clamp_len's encoding (0: no clamp)
    shared_biases: bool = False  # one u and v for all layers (Transformer-XL) or per layer (XLNet untie_r)
    segments: bool = False  # XLNet: token types enter attention as same/different-segment biases

    def __post_init__(self):
        _non_negative("memory_len", self.memory_len)
        _non_negative("clamp_len", self.clamp_len)


@dataclasses.dataclass(frozen=True)
class Disentangled:
    """DeBERTa's disentangled attention (present exactly when position='disentangled'): a score adds, to content .
    content, the query's content against the key's relative position (c2p) and the key's content against the
    query's (p2c), each term's position vectors from one table of 2 * span relative-position embeddings [span =
    buckets or max_relative_positions] projected per layer; the scale is (head_dim * (1 + terms)) ** -0.5."""

    terms: tuple[str, ...] = ("c2p", "p2c")
    max_relative_positions: int = 0  # distances are clamped to +-this (0: max_positions)
    buckets: int = 0  # >0: distances beyond half of it share log-spaced buckets (DeBERTa v2/v3)
    share_key: bool = False  # positions projected by the layer's own q and k (v2/v3), not their own
    norm_table: bool = False  # the relative table is layer-normed before use (v2/v3 norm_rel_ebd)
    absolute_input: bool = False  # a learned absolute table also adds to the input (position_biased_input)

    def __post_init__(self):
        if isinstance(self.terms, list):  # YAML and JSON hand us lists
            object.__setattr__(self, "terms", tuple(self.terms))
        terms = self.terms
        if not terms or len(set(terms)) != len(terms) or not set(terms) <= set(DISENTANGLED_TERMS):
            raise ValueError(f"ModelConfig.disentangled_terms={terms!r} must name distinct terms among "
                             f"{DISENTANGLED_TERMS} (at least one)")
        _non_negative("max_relative_positions", self.max_relative_positions)
        _non_negative("position_buckets", self.buckets)

    def max_distance(self, max_positions: int) -> int:
        """The largest distance told apart (its log buckets reach it): max_relative_positions, else max_positions."""
        return self.max_relative_positions or max_positions

    def span(self, max_positions: int) -> int:
        """Half the rows of the relative-position table (distances -span .. span - 1 after bucketing)."""
        return self.buckets or self.max_distance(max_positions)


@dataclasses.dataclass(frozen=True)
class NoPE:
    """Layers without rotary positions (Llama 4 every fourth): their queries and keys are not rotated, and the
    query/key norm applies to the rotated layers only. With ``temperature_floor_scale``, their queries are scaled
    by (1 + temperature_scale * log1p(floor((i + 1) / temperature_floor_scale))), i the token's index in the
    sequence, pads included (as transformers counts it)."""

    layers: tuple[int, ...] = ()
    temperature_floor_scale: int | None = None
    temperature_scale: float = 0.1

    def __post_init__(self):
        if isinstance(self.layers, list):  # YAML and JSON hand us lists
            object.__setattr__(self, "layers", tuple(self.layers))
        if sorted(set(self.layers)) != list(self.layers) or not self.layers or not all(
                isinstance(i, int) and i >= 0 for i in self.layers):
            raise ValueError(f"ModelConfig.nope_layers={self.layers!r} must list distinct layer indices in "
                             "increasing order")
        if self.temperature_floor_scale is not None:
            _positive("temperature_floor_scale", self.temperature_floor_scale)
            if not self.temperature_scale > 0:
                raise ValueError(f"ModelConfig.temperature_scale={self.temperature_scale!r} must be > 0")


@dataclasses.dataclass(frozen=True)
class LinearAttention:
    """Layers that mix tokens by the gated delta rule (Gated DeltaNet: Qwen3-Next, Qwen3.5) in place of softmax
    attention. Each value head keeps a state matrix S [key_head_dim, value_head_dim] that every token decays
    by exp(g) and corrects toward its value (S += beta k (v - S^T k)^T); a query reads S^T q. Queries, keys and
    values pass a short causal depthwise convolution first. A cached step carries S and the convolution's last
    ``conv_kernel - 1`` inputs, whatever the length: no KV cache. ``chunk``: tokens per chunk of the parallel form
    that training and prefill run (decoding runs the recurrent form); it changes only float rounding.
    ``decay``: what one decay rate covers, 'head' (a scalar per value head: Gated DeltaNet) or 'channel' (one per
    key channel of each value head: Kimi Delta Attention, whose decay and output gate each come through a
    head-wide low-rank projection and whose output gate is a sigmoid, not silu)."""

    layers: tuple[int, ...] = ()
    key_heads: int = 16
    value_heads: int = 32
    key_head_dim: int = 128
    value_head_dim: int = 128
    conv_kernel: int = 4
    chunk: int = 64
    decay: str = "head"

    def __post_init__(self):
        if isinstance(self.layers, list):  # YAML and JSON hand us lists
            object.__setattr__(self, "layers", tuple(self.layers))
        if sorted(set(self.layers)) != list(self.layers) or not self.layers or not all(
                isinstance(i, int) and i >= 0 for i in self.layers):
            raise ValueError(f"ModelConfig.linear_layers={self.layers!r} must list distinct layer indices in "
                             "increasing order")
        for name in ("key_heads", "value_heads", "key_head_dim", "value_head_dim", "conv_kernel", "chunk"):
            _positive(f"linear_{name}", getattr(self, name))
        if self.value_heads % self.key_heads:
            raise ValueError(f"ModelConfig.linear_key_heads={self.key_heads} must divide linear_value_heads="
                             f"{self.value_heads} (each key head serves a group of value heads)")
        _one_of("linear_decay", self.decay, LINEAR_DECAYS)

    @property
    def conv_width(self) -> int:
        """Channels of the convolution: every query, key and value number of a token."""
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim


@dataclasses.dataclass(frozen=True)
class Scores:
    """What shapes attention besides q . k: its scores, and (``output_gate``) each head's output."""

    scale: float | None = None  # None: head_dim ** -0.5 (T5 uses 1.0)
    inverse_layer_scale: bool = False  # GPT-2's scale_attn_by_inverse_layer_idx: layer i's scores also / (i + 1)
    softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the mask (Gemma 2)
    # attention sinks: a learned logit per head joins each softmax as one more key with no value, so a query
    # may give part of its attention to nothing (gpt-oss)
    sinks: bool = False
    # Longformer: the tokens a call names (``global_attention_mask``) attend to every token and every token to them,
    # by their own query, key and value projections in a softmax of their own (the others keep the layer's pattern)
    global_tokens: bool = False
    # each head's output times sigmoid(x . w_gate) before the output projection (Qwen3-Next's gated attention)
    output_gate: bool = False
    # block-sparse attention (BigBird) in an encoder's stack, on inputs longer than (5 + 2 r) blocks: the sequence
    # cut into blocks of this many tokens, the first and last block global, every other block seeing its two
    # neighbours, the global blocks and r = sparse_random_blocks "random" blocks, which in evaluation are block 0
    # each time (transformers' draw outside training), so block 0 counts 1 + r times in those softmaxes. None: dense
    sparse_block_size: int | None = None
    sparse_random_blocks: int = 0
    # where a layer's keys and values come from when the layers of a stack differ (Gemma 4): the full layers of an
    # alternating stack with a head size and kv head count of their own (None: the model's), their values the
    # keys as projected (before the key norm and rotary; the value norm still applies), and the last
    # kv_shared_layers layers reading the keys and values of the last earlier layer of their kind (computed in the
    # same call; they have no key or value weights and keep no cache), their MLP kv_shared_d_ff wide (None: d_ff)
    full_head_dim: int | None = None
    full_kv_heads: int | None = None
    full_keys_as_values: bool = False
    kv_shared_layers: int = 0
    kv_shared_d_ff: int | None = None
    # position-dependent query scaling (Mistral 4's llama_4_scaling_beta): every layer's queries times
    # 1 + position_scale * ln(1 + floor(p / position_span)), p each token's position, so attention sharpens with
    # distance past each span of positions (the pretraining length); None: no such factor
    position_scale: float | None = None
    position_span: int | None = None
    # DeepSeek-V4's compressed attention (a mixer of its own: ``layers.compressed_attention``)
    compressed: CompressedAttention | None = None
    # Llama 3.2 Vision: these decoder layers attend to the images' states instead of the text (no self-attention;
    # per-head q/k norms, tanh-gated attention and MLP), the rest are Llama's layers
    cross_attention_layers: tuple[int, ...] = ()

    def __post_init__(self):
        if isinstance(self.compressed, dict):
            object.__setattr__(self, "compressed", CompressedAttention(**self.compressed))
        if isinstance(self.cross_attention_layers, list):  # JSON hands us a list
            object.__setattr__(self, "cross_attention_layers", tuple(self.cross_attention_layers))
        layers = self.cross_attention_layers
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers) or list(layers) != sorted(
                set(layers)):
            raise ValueError(f"ModelConfig.cross_attention_layers={layers!r} must be increasing layer indices >= 0")
        if self.scale is not None and not self.scale > 0:
            raise ValueError(f"ModelConfig.attention_scale={self.scale!r} must be > 0")
        if (self.position_scale is None) != (self.position_span is None):
            raise ValueError(f"ModelConfig.query_position_scale={self.position_scale!r} and query_position_span="
                             f"{self.position_span!r} go together: set both or neither")
        if self.position_scale is not None:
            if not (isinstance(self.position_scale, (int, float)) and math.isfinite(self.position_scale)):
                raise ValueError(f"ModelConfig.query_position_scale={self.position_scale!r} must be a finite number")
            _positive("query_position_span", self.position_span)
        for name in ("full_head_dim", "full_kv_heads", "kv_shared_d_ff"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        _non_negative("kv_shared_layers", self.kv_shared_layers)
        _finite_cap("attention_softcap", self.softcap)
        if self.sparse_block_size is not None:
            _positive("sparse_block_size", self.sparse_block_size)
        _non_negative("sparse_random_blocks", self.sparse_random_blocks)
        if self.sparse_random_blocks and self.sparse_block_size is None:
            raise ValueError(f"ModelConfig.sparse_random_blocks={self.sparse_random_blocks} belongs to block-sparse "
                             "attention: it needs sparse_block_size")

    def sparse_threshold(self) -> int | None:
        """The longest input that still attends densely (transformers' switch to 'original_full' at
        seq_length <= (5 + 2 r) * block_size); None without block-sparse attention."""
        if self.sparse_block_size is None:
            return None
        return (5 + 2 * self.sparse_random_blocks) * self.sparse_block_size


@dataclasses.dataclass(frozen=True)
class QueryKeyNorm:
    """A norm (the model's kind) over queries and keys before rotary positions: per head with one scale that
    every head shares (``span='head'``: Gemma 3, Qwen3), over the whole projection, all heads at once
    ('projection': OLMo-2), or per head with each head's own scale and no bias ('each_head': StableLM)."""

    scale: bool = True  # the norm's learned scale; False: none (Llama 4's weightless norm)
    span: str = "head"
    values: bool = False  # the values too, each head by a norm without a learned scale (Gemma 4)

    def __post_init__(self):
        _one_of("qk_norm_span", self.span, QK_NORM_SPANS)
        if self.values and self.span != "head":
            raise ValueError(f"ModelConfig.v_norm=True norms each value head: it needs qk_norm_span='head', not "
                             f"{self.span!r}")
        if self.span == "each_head" and not self.scale:
            raise ValueError("ModelConfig.qk_norm_span='each_head' is a norm by each head's own learned scale: "
                             "it needs qk_norm_scale=True")


@dataclasses.dataclass(frozen=True)
class Indexer:
    """DeepSeek-V3.2's lightning indexer: a small scorer picks each query's ``topk`` keys, and latent attention
    attends to those alone (DeepSeek sparse attention)."""

    heads: int
    head_dim: int = 128
    topk: int = 2048
    # its queries' and keys' rotary part rotates adjacent pairs (GLM-5), not the halves (DeepSeek-V3.2)
    rope_interleave: bool = False
    # its queries from the layer's input, LayerNorm (with bias) then wq (Mistral Large 4, whose attention has no
    # compressed query), not from the compressed query
    query_from_input: bool = False

    def __post_init__(self):
        for field, value in (("index_heads", self.heads), ("index_head_dim", self.head_dim),
                             ("index_topk", self.topk)):
            _positive(field, value)


@dataclasses.dataclass(frozen=True)
class Latent:
    """Multi-head latent attention (DeepSeek-V2/V3). Keys and values are expanded per head from one shared latent
    of ``kv_rank`` numbers per token (what a cache holds, with one shared rotary key of ``rope_head_dim``);
    head_dim is then the query/key part without positions, and the scale (head_dim + rope_head_dim) ** -0.5."""

    kv_rank: int
    q_rank: int | None = None  # a low-rank query projection through this width; None: a plain one
    rope_head_dim: int = 64  # the rotary part of each query and key head
    v_head_dim: int | None = None  # the value head size; None: head_dim
    indexer: Indexer | None = None
    # each head's queries (and its indexer's) times s_h ln(p + 1) + b_h at position p, s and b learned per head
    # (Mistral Large 4's softmax scaling)
    query_log_position_scale: bool = False
    # the latents' RMSNorm eps; None: 1e-6, transformers' RMSNorm default whatever the model's (DeepSeek), where
    # Mistral Large 4 builds them with the model's
    norm_eps: float | None = None

    def __post_init__(self):
        if isinstance(self.indexer, dict):
            object.__setattr__(self, "indexer", Indexer(**self.indexer))
        _positive("kv_lora_rank", self.kv_rank)
        if self.q_rank is not None:
            _positive("q_lora_rank", self.q_rank)
        _positive("rope_head_dim", self.rope_head_dim)
        if self.rope_head_dim % 2:
            raise ValueError(f"ModelConfig.rope_head_dim={self.rope_head_dim} must be even")
        if self.v_head_dim is not None:
            _positive("v_head_dim", self.v_head_dim)
        if self.norm_eps is not None:
            _finite_positive("latent_norm_eps", self.norm_eps)
        if self.indexer is not None:
            if self.q_rank is None and not self.indexer.query_from_input:
                raise ValueError("ModelConfig.index_heads (DeepSeek-V3.2's indexer) reads the compressed query: it "
                                 "needs q_lora_rank (or index_query_from_input=True)")
            if not self.rope_head_dim <= self.indexer.head_dim:
                raise ValueError(f"ModelConfig.index_head_dim={self.indexer.head_dim} must hold the rotary part "
                                 f"(rope_head_dim={self.rope_head_dim})")


@dataclasses.dataclass(frozen=True)
class ParallelResidual:
    """Attention and MLP read the same input and join the residual together, x + attn(norm(x)) + mlp(norm'(x))
    (GPT-NeoX, GPT-J); with ``shared_norm`` both read one norm (GPT-J)."""

    shared_norm: bool = False


@dataclasses.dataclass(frozen=True)
class Biases:
    qkv: bool = True
    key: bool = True  # with qkv: the key projection's (and DeBERTa's position key's) bias; DeBERTa v1 has none
    out: bool = True
    mlp: bool = True


@dataclasses.dataclass(frozen=True)
class Logits:
    """What the LM head adds to its projection."""

    scale_tied: bool = False  # T5 v1.0: decoder output * d_model**-0.5 before the tied head
    fixed_bias: bool = False  # a fixed (non-trained) bias on the logits (BART's final_logits_bias)
    trained_bias: bool = False  # a trained bias on the logits (XLNet's lm_loss.bias)
    softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
    divisor: float = 1.0  # logits / divisor before any softcap (Granite's logits_scaling)
    # logits * multiplier before any divisor and softcap, computed in float32 (Cohere's logit_scale; its 5 / 6 is
    # no divisor exactly: 1.2 as a float32 divisor moves a fifth of the logits by a bit)
    multiplier: float = 1.0

    def __post_init__(self):
        _finite_cap("logits_softcap", self.softcap)
        _finite_positive("logits_divisor", self.divisor)
        _finite_positive("logits_multiplier", self.multiplier)


@dataclasses.dataclass(frozen=True)
class Convolution:
    """DeBERTa v2's convolution beside the first layer: LayerNorm(layer output + act(conv(embeddings))), a 1-D
    convolution over the sequence, ``kernel_size`` wide (odd: the sequence keeps its length), in ``groups``."""

    kernel_size: int
    groups: int = 1
    activation: str = "tanh"

    def __post_init__(self):
        _positive("conv_kernel_size", self.kernel_size)
        _positive("conv_groups", self.groups)
        _one_of("conv_activation", self.activation, CONV_ACTIVATIONS)


@dataclasses.dataclass(frozen=True)
class HeadOptions:
    """The parts of the task heads that vary between families."""

    pooler: bool = False  # BERT pooler: tanh(dense(h[:, 0]))
    # the pooler's nonlinearity: tanh (BERT, RoBERTa), relu (DistilBERT) or exact gelu (ELECTRA's classifier)
    pooler_activation: str = "tanh"
    # ModernBERT: the sequence, token and span classifiers read dense -> activation -> norm of their input first
    # (the MLM head's transform); the sequence classifier's input is the first token or the real tokens' mean
    prediction_head: bool = False
    classifier_pooling: str = "cls"
    # DeBERTa's MLM head is stored as cls.predictions (transformers' legacy=True) or lm_predictions.lm_head (the
    # enhanced mask decoder's head): the same numbers under two names, kept so a file is written back as it came
    mlm_legacy: bool = True
    dense_bias: bool = True  # the bias of the heads' dense transform (MLM, ModernBERT's prediction head)
    mlm_bias: bool = True  # the MLM head's output bias (ModernBERT's decoder_bias)
    num_labels: int = 2
    label_names: tuple[str, ...] = ()  # classification heads: the name of each label id (HF's id2label); () unnamed
    # BigBird's heads: the sequence classifier reads dense -> the model's activation of the first token, a layer of
    # its own beside the pooler (whose tanh output is pooler_output alone); the span classifier reads a post-norm
    # feed-forward sublayer of its own first, LayerNorm(h + W2 act(W1 h)); and the span head keeps the question out
    # of the answer: its tokens (through the first sep_token_id, the first token aside) score 1e6 lower, and without
    # token_type_ids the question's tokens get type 0, the rest type 1
    classifier_transform: bool = False
    span_feed_forward: bool = False
    question_out_of_span: bool = False
    # a text tower's pooler_output: its final-normed state at this token (POOLED_TOKENS; None: BERT's first token
    # through the pooler), then a Linear to ``pooled_projection`` numbers (0: none), with a bias (SigLIP's text head)
    # or without (CLIPTextModelWithProjection's text_projection)
    pooled_token: str | None = None
    pooled_projection: int = 0
    pooled_projection_bias: bool = True
    image_pooler: str | None = None  # IMAGE_POOLERS; None: none (ViT's is BERT's ``pooler``)

    def __post_init__(self):
        _positive("num_labels", self.num_labels)
        if self.pooled_token is not None:
            _one_of("pooled_token", self.pooled_token, POOLED_TOKENS)
        _non_negative("pooled_projection", self.pooled_projection)
        if self.image_pooler is not None:
            _one_of("image_pooler", self.image_pooler, IMAGE_POOLERS)
        if self.pooled_projection and self.pooled_token is None:
            raise ValueError(f"ModelConfig.pooled_projection={self.pooled_projection} projects a pooled token: it "
                             "needs pooled_token set")
        if not self.pooled_projection_bias and not self.pooled_projection:
            raise ValueError("ModelConfig.pooled_projection_bias=False needs pooled_projection > 0 (the projection "
                             "it takes the bias from)")
        if isinstance(self.label_names, list):  # JSON hands us a list
            object.__setattr__(self, "label_names", tuple(self.label_names))
        if self.label_names and len(self.label_names) != self.num_labels:
            raise ValueError(f"ModelConfig.label_names holds {len(self.label_names)} names for num_labels="
                             f"{self.num_labels}; give one name per label, or none")
        _one_of("pooler_activation", self.pooler_activation, POOLER_ACTIVATIONS)
        _one_of("classifier_pooling", self.classifier_pooling, CLASSIFIER_POOLINGS)


@dataclasses.dataclass(frozen=True)
class Experts:
    """A top-k mixture of experts in place of the dense MLP (Mixtral, DeepSeekMoE, Llama 4, gpt-oss)."""

    count: int
    per_token: int = 2
    d_ff: int | None = None  # a routed expert's hidden size; None: the model's d_ff
    shared: int = 0  # always-on experts (DeepSeekMoE): one gated MLP of shared * d_ff
    shared_gate: bool = False  # the shared experts' output times sigmoid(x . w_gate) per token (Qwen2-MoE)
    dense_layers: int = 0  # the first layers keep a dense MLP of d_ff (DeepSeek's first_k_dense_replace)
    # the first hash_layers expert layers pick a token's experts by a fixed table of its id (DeepSeek-V4's tid2eid,
    # read from the checkpoint, never trained); the router's scores still weight them
    hash_layers: int = 0
    # every layer_step-th layer holds the experts, the others a dense MLP of d_ff (Llama 4 Maverick's
    # interleave_moe_layer_step: layers step-1, 2 step-1, ...); 1: every layer past dense_layers
    layer_step: int = 1
    router_score: str = "softmax"  # softmax over experts (Mixtral, DeepSeek-V2) or per-expert sigmoid (V3)
    router_groups: int = 1  # experts split into groups; a token first picks router_topk_groups of them
    router_topk_groups: int = 1  # (group score: best expert under softmax, sum of the best two under sigmoid)
    # a group's score: its best expert ('best') or the sum of its best two ('best_two': Mistral 4's softmax
    # router); None: as router_score implies (best under softmax, best two under sigmoid)
    router_group_score: str | None = None
    router_bias: bool = False  # V3: a per-expert bias added for selection only, moved by balancing, not gradients
    router_logit_bias: bool = False  # a trained bias on the router logits, like any linear layer's (gpt-oss)
    # sparsemixer: an expert joins a pick's softmax when (best - logit) / max(|logit|, best) <= 2 jitter_eps
    jitter_eps: float = 0.0
    bias: bool = False  # each routed expert's projections carry biases (gpt-oss)
    normalize_weights: bool = True  # the k chosen weights are divided by their sum
    weights_on_input: bool = False  # a chosen expert's weight multiplies its input, not its output (Llama 4)
    routed_scaling: float = 1.0  # the routed experts' output is scaled by this (DeepSeek routed_scaling_factor)
    # each chosen expert's weight times a learned scale of that expert's, after normalising (Gemma 4)
    expert_scale: bool = False
    # the router reads RMSNorm(x) (no scale of the norm's own) times a learned scale per channel and d_model^-0.5
    # (Gemma 4)
    router_norm: bool = False
    # the experts beside the layer's dense MLP of d_ff, not in its place (Gemma 4's enable_moe_block): the MLP reads
    # the layer's normed input, the experts their own normed copy (the router the input itself), each branch's output
    # normed, their sum the feed-forward's output
    beside_dense: bool = False
    aux_loss_coef: float = 0.0
    aux_loss: str = "batch"  # batch: Switch/Mixtral over all tokens; sequence: DeepSeek-V3, per row
    # grouped: tokens sorted into blocks by expert, only the chosen run (GSPMD partitions it under a mesh);
    # all_to_all: grouped, with tokens sent to their experts' devices under an expert mesh axis;
    # dense: every expert on every token; auto: all_to_all unless every expert is chosen anyway (then dense)
    dispatch: str = "auto"

    def __post_init__(self):
        _positive("num_experts", self.count)
        if not 1 <= self.per_token <= self.count:
            raise ValueError(f"ModelConfig.experts_per_token={self.per_token} must lie in [1, num_experts="
                             f"{self.count}]")
        _non_negative("shared_experts", self.shared)
        _non_negative("dense_layers", self.dense_layers)
        _non_negative("hash_layers", self.hash_layers)
        if self.d_ff is not None:
            _positive("expert_d_ff", self.d_ff)
        _positive("moe_layer_step", self.layer_step)
        _one_of("router_score", self.router_score, ROUTER_SCORES)
        if self.router_group_score is not None:
            _one_of("router_group_score", self.router_group_score, ROUTER_GROUP_SCORES)
        self._check_groups()
        self._check_sparsemixer()
        if not (isinstance(self.routed_scaling, (int, float)) and math.isfinite(self.routed_scaling)
                and self.routed_scaling > 0):
            raise ValueError(f"ModelConfig.routed_scaling={self.routed_scaling!r} must be a finite number > 0")
        if self.aux_loss_coef < 0:
            raise ValueError(f"ModelConfig.router_aux_loss_coef={self.aux_loss_coef!r} must be >= 0")
        _one_of("router_aux_loss", self.aux_loss, ROUTER_AUX_LOSSES)
        _one_of("moe_dispatch", self.dispatch, MOE_DISPATCHES)
        if self.shared_gate and not self.shared:
            raise ValueError("ModelConfig.shared_expert_gate=True gates the shared experts; it needs "
                             "shared_experts > 0")

    def _check_sparsemixer(self) -> None:
        if not (isinstance(self.jitter_eps, (int, float)) and math.isfinite(self.jitter_eps) and self.jitter_eps >= 0):
            raise ValueError(f"ModelConfig.router_jitter_eps={self.jitter_eps!r} must be a finite number >= 0")
        if self.router_score != "sparsemixer":
            if self.jitter_eps:
                raise ValueError(f"ModelConfig.router_jitter_eps={self.jitter_eps!r} belongs to router_score="
                                 f"'sparsemixer', not {self.router_score!r}")
            return
        # its picks are two, ungrouped and unbiased, each weighted by its own softmax (never renormalised)
        wrong = [f"{name}={value!r}" for name, value, wanted in (
            ("experts_per_token", self.per_token, 2), ("router_groups", self.router_groups, 1),
            ("router_bias", self.router_bias, False), ("normalize_router_weights", self.normalize_weights, False),
            ("router_weights_on_input", self.weights_on_input, False)) if value != wanted]
        if wrong:
            raise ValueError(f"ModelConfig.router_score='sparsemixer' picks two experts, ungrouped and unbiased, each "
                             f"weighted by its own softmax share; it needs experts_per_token=2, router_groups=1, "
                             f"router_bias=False, normalize_router_weights=False, router_weights_on_input=False, "
                             f"not {', '.join(wrong)}")

    def _check_groups(self) -> None:
        _positive("router_groups", self.router_groups)
        _positive("router_topk_groups", self.router_topk_groups)
        if self.count % self.router_groups:
            raise ValueError(f"ModelConfig.router_groups={self.router_groups} does not divide num_experts="
                             f"{self.count}")
        if self.router_topk_groups > self.router_groups:
            raise ValueError(f"ModelConfig.router_topk_groups={self.router_topk_groups} must be <= "
                             f"router_groups={self.router_groups}")
        per_group = self.count // self.router_groups
        if self.router_topk_groups * per_group < self.per_token:
            raise ValueError(f"ModelConfig.router_topk_groups={self.router_topk_groups} groups of {per_group} "
                             f"experts hold fewer than experts_per_token={self.per_token}")
        if self.router_groups > 1 and self.group_score == "best_two" and per_group < 2:
            raise ValueError("ModelConfig.router_groups: a group scored by its best two experts (sigmoid routing, "
                             "router_group_score='best_two') needs at least 2")

    @property
    def group_score(self) -> str:
        """How a group of experts is scored: ``router_group_score``, else as ``router_score`` implies."""
        if self.router_group_score is not None:
            return self.router_group_score
        return "best_two" if self.router_score == "sigmoid" else "best"


@dataclasses.dataclass(frozen=True)
class Tokens:
    """Special token ids the model itself uses (positions, classification pooling, generation)."""

    pad: int | None = None
    bos: int | None = None
    eos: int | tuple[int, ...] | None = None
    decoder_start: int | None = None  # first decoder token of encoder-decoder generation
    sep: int | None = None  # the separator; Longformer's span head puts global attention on the tokens before the first
    # mBART: decoder inputs derived from input_ids (the classification and span heads' default) start with each
    # row's last non-pad token (its language code), not decoder_start
    wrap_decoder_start: bool = False

    def __post_init__(self):
        if isinstance(self.eos, list):
            object.__setattr__(self, "eos", tuple(self.eos))

    @property
    def eos_ids(self) -> tuple:
        return self.eos if isinstance(self.eos, tuple) else (self.eos,)


@dataclasses.dataclass(frozen=True)
class Execution:
    """How the layers run: scanned or unrolled, what is rematerialised, which attention kernel, and under a
    ``stage`` mesh axis (pipeline parallelism, ``layers/pipeline.py``) the microbatches a full pass cuts its rows
    into (0: one per stage) and the chunks each stage holds (1: GPipe; more: the circular schedule, each stage
    holding every S-th chunk of L / (S x repeats) layers). None of it changes the numbers."""

    scan_layers: bool = True
    remat: str = "none"
    attention_backend: str = "auto"  # auto | xla | cudnn | splash (jaxformer/kernels.py)
    pipeline_microbatches: int = 0
    pipeline_repeats: int = 1

    def __post_init__(self):
        _one_of("remat", self.remat, REMAT_POLICIES)
        _one_of("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _non_negative("pipeline_microbatches", self.pipeline_microbatches)
        if self.pipeline_repeats < 1:
            raise ValueError(f"ModelConfig.pipeline_repeats={self.pipeline_repeats} must be >= 1 (1: GPipe)")


@dataclasses.dataclass(frozen=True)
class LoRA:
    """LoRA adapters (jaxformer/layers/weights.py) on the projections ``targets`` names."""

    rank: int
    alpha: float = 8.0
    targets: tuple[str, ...] = ()  # LORA_PROJECTIONS, alone or as "sublayer.name" (LORA_SUBLAYERS)
    dropout: float = 0.0  # on the adapter's input only
    rslora: bool = False  # scale by alpha / sqrt(rank) instead of alpha / rank
    trainable: tuple[str, ...] = ()  # parameter paths ('/'-joined) trained in full with the adapters (modules_to_save)

    def __post_init__(self):
        for field in ("targets", "trainable"):
            value = getattr(self, field)
            if isinstance(value, (list, str)):  # YAML and JSON hand us lists
                object.__setattr__(self, field, (value,) if isinstance(value, str) else tuple(value))
        _positive("lora_rank", self.rank)
        _rate("lora_dropout", self.dropout)
        if not self.targets:
            raise ValueError(f"ModelConfig.lora_rank={self.rank} needs lora_targets: projection names from "
                             f"{LORA_PROJECTIONS}, alone or as sublayer.name with a sublayer from {LORA_SUBLAYERS}")
        check_lora_targets(self.targets, "ModelConfig.lora_targets")
        if not self.alpha > 0:
            raise ValueError(f"ModelConfig.lora_alpha={self.alpha!r} must be > 0")


@dataclasses.dataclass(frozen=True)
class Quantization:
    """int8 projection kernels: 'int8' multiplies in dtype (weight-only), 'int8_dynamic' in int8 (CPU)."""

    kind: str
    embeddings: bool = False  # the token table (and so a tied LM head) int8 too, per vocab row

    def __post_init__(self):
        _one_of("quantize", self.kind, QUANTIZATIONS)


def _finite_positive(field: str, value: Any) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
        raise ValueError(f"ModelConfig.{field}={value!r} must be a finite number > 0")


def _finite_cap(field: str, value: Any) -> None:
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"ModelConfig.{field}={value!r} must be a finite number > 0 (or None: no capping)")


# The flat spelling of every sub-config field: its path in the config. Presets, config readers, overrides (YAML,
# ``jf.config(name, **overrides)``, ``replace``) and run folders written before the sub-configs use it.
FLAT: dict[str, tuple[str, ...]] = {
    "norm": ("norms", "kind"), "norm_position": ("norms", "position"), "norm_eps": ("norms", "eps"),
    "norm_bias": ("norms", "bias"), "norm_scale_offset": ("norms", "scale_offset"),
    "sandwich_norm": ("norms", "sandwich"), "embedding_norm": ("norms", "embedding"),
    "first_attn_norm": ("norms", "first_attention"), "final_norm": ("norms", "final"),
    "final_norm_in_hidden_states": ("norms", "final_in_hidden_states"),
    "swiglu_limit": ("swiglu_clamp", "limit"), "swiglu_alpha": ("swiglu_clamp", "alpha"),
    "swiglu_offset": ("swiglu_clamp", "offset"),
    "tie_embeddings": ("embeddings", "tie"), "scale_embeddings": ("embeddings", "scale"),
    "shared_embeddings": ("embeddings", "shared"), "type_vocab_size": ("embeddings", "types"),
    "embedding_size": ("embeddings", "width"), "position_offset": ("embeddings", "position_offset"),
    "pad_aware_positions": ("embeddings", "pad_aware_positions"), "sinusoids": ("embeddings", "sinusoids"),
    "positions_from_mask": ("embeddings", "positions_from_mask"),
    "embedding_multiplier": ("embeddings", "multiplier"),
    "per_layer_input_size": ("embeddings", "per_layer_width"),
    "per_layer_vocab_size": ("embeddings", "per_layer_vocab"),
    "embedding_extra_rows": ("embeddings", "extra_rows"),
    "rope_theta": ("rotary", "theta"), "rope_scaling": ("rotary", "scaling"),
    "local_rope_theta": ("rotary", "local_theta"), "rope_interleave": ("rotary", "interleave"),
    "rotary_dim": ("rotary", "dim"), "rope_proportion": ("rotary", "proportion"),
    "rope_learned_frequencies": ("rotary", "learned_frequencies"), "rope_sections": ("rotary", "sections"),
    "rope_axial": ("rotary", "axial"),
    "relative_buckets": ("relative_bias", "buckets"), "relative_max_distance": ("relative_bias", "max_distance"),
    "relative_bias_per_layer": ("relative_bias", "per_layer"),
    "memory_len": ("xl", "memory_len"), "clamp_len": ("xl", "clamp_len"),
    "shared_relative_biases": ("xl", "shared_biases"), "relative_segments": ("xl", "segments"),
    "disentangled_terms": ("disentangled", "terms"),
    "max_relative_positions": ("disentangled", "max_relative_positions"),
    "position_buckets": ("disentangled", "buckets"), "share_attention_key": ("disentangled", "share_key"),
    "relative_embedding_norm": ("disentangled", "norm_table"),
    "position_biased_input": ("disentangled", "absolute_input"),
    "linear_layers": ("linear_attention", "layers"), "linear_key_heads": ("linear_attention", "key_heads"),
    "linear_value_heads": ("linear_attention", "value_heads"),
    "linear_key_head_dim": ("linear_attention", "key_head_dim"),
    "linear_value_head_dim": ("linear_attention", "value_head_dim"),
    "linear_conv_kernel": ("linear_attention", "conv_kernel"), "linear_chunk": ("linear_attention", "chunk"),
    "linear_decay": ("linear_attention", "decay"),
    "nope_layers": ("nope", "layers"), "temperature_floor_scale": ("nope", "temperature_floor_scale"),
    "temperature_scale": ("nope", "temperature_scale"),
    "attention_scale": ("scores", "scale"), "inverse_layer_scale": ("scores", "inverse_layer_scale"),
    "attention_softcap": ("scores", "softcap"), "attention_sinks": ("scores", "sinks"),
    "attention_gate": ("scores", "output_gate"),
    "query_position_scale": ("scores", "position_scale"), "query_position_span": ("scores", "position_span"),
    "global_tokens": ("scores", "global_tokens"),
    "full_head_dim": ("scores", "full_head_dim"), "full_kv_heads": ("scores", "full_kv_heads"),
    "full_keys_as_values": ("scores", "full_keys_as_values"), "kv_shared_layers": ("scores", "kv_shared_layers"),
    "kv_shared_d_ff": ("scores", "kv_shared_d_ff"),
    "cross_attention_layers": ("scores", "cross_attention_layers"),
    "sparse_block_size": ("scores", "sparse_block_size"), "sparse_random_blocks": ("scores", "sparse_random_blocks"),
    "qk_norm_scale": ("query_key_norm", "scale"), "qk_norm_span": ("query_key_norm", "span"),
    "v_norm": ("query_key_norm", "values"),
    "hc_streams": ("norms", "hyper_connections", "streams"),
    "hc_sinkhorn_iters": ("norms", "hyper_connections", "sinkhorn_iters"),
    "hc_eps": ("norms", "hyper_connections", "eps"),
    "compressed_layers": ("scores", "compressed", "layers"), "compressed_q_rank": ("scores", "compressed", "q_rank"),
    "compressed_sparse_rate": ("scores", "compressed", "sparse_rate"),
    "compressed_heavy_rate": ("scores", "compressed", "heavy_rate"),
    "compressed_rope_theta": ("scores", "compressed", "rope_theta"),
    "compressed_rope_scaling": ("scores", "compressed", "rope_scaling"),
    "compressed_index_heads": ("scores", "compressed", "index_heads"),
    "compressed_index_head_dim": ("scores", "compressed", "index_head_dim"),
    "compressed_index_topk": ("scores", "compressed", "index_topk"),
    "compressed_out_groups": ("scores", "compressed", "out_groups"),
    "compressed_out_rank": ("scores", "compressed", "out_rank"),
    "kv_lora_rank": ("latent", "kv_rank"), "q_lora_rank": ("latent", "q_rank"),
    "rope_head_dim": ("latent", "rope_head_dim"), "v_head_dim": ("latent", "v_head_dim"),
    "index_heads": ("latent", "indexer", "heads"), "index_head_dim": ("latent", "indexer", "head_dim"),
    "index_topk": ("latent", "indexer", "topk"), "index_rope_interleave": ("latent", "indexer", "rope_interleave"),
    "index_query_from_input": ("latent", "indexer", "query_from_input"),
    "query_log_position_scale": ("latent", "query_log_position_scale"), "latent_norm_eps": ("latent", "norm_eps"),
    "parallel_shared_norm": ("parallel", "shared_norm"),
    "qkv_bias": ("biases", "qkv"), "key_bias": ("biases", "key"), "out_bias": ("biases", "out"),
    "mlp_bias": ("biases", "mlp"),
    "scale_tied_logits": ("logits", "scale_tied"), "logits_bias": ("logits", "fixed_bias"),
    "lm_head_bias": ("logits", "trained_bias"), "logits_softcap": ("logits", "softcap"),
    "logits_divisor": ("logits", "divisor"), "logits_multiplier": ("logits", "multiplier"),
    "conv_kernel_size": ("conv", "kernel_size"), "conv_groups": ("conv", "groups"),
    "conv_activation": ("conv", "activation"),
    "pooler": ("head_options", "pooler"), "pooler_activation": ("head_options", "pooler_activation"),
    "classifier_transform": ("head_options", "classifier_transform"),
    "span_feed_forward": ("head_options", "span_feed_forward"),
    "question_out_of_span": ("head_options", "question_out_of_span"),
    "pooled_token": ("head_options", "pooled_token"), "pooled_projection": ("head_options", "pooled_projection"),
    "pooled_projection_bias": ("head_options", "pooled_projection_bias"),
    "image_pooler": ("head_options", "image_pooler"),
    "prediction_head": ("head_options", "prediction_head"),
    "classifier_pooling": ("head_options", "classifier_pooling"), "mlm_head_legacy": ("head_options", "mlm_legacy"),
    "head_bias": ("head_options", "dense_bias"), "mlm_bias": ("head_options", "mlm_bias"),
    "num_labels": ("head_options", "num_labels"), "label_names": ("head_options", "label_names"),
    "num_experts": ("experts", "count"), "experts_per_token": ("experts", "per_token"),
    "expert_d_ff": ("experts", "d_ff"), "shared_experts": ("experts", "shared"),
    "shared_expert_gate": ("experts", "shared_gate"), "dense_layers": ("experts", "dense_layers"),
    "hash_layers": ("experts", "hash_layers"),
    "moe_layer_step": ("experts", "layer_step"), "router_score": ("experts", "router_score"),
    "router_groups": ("experts", "router_groups"), "router_topk_groups": ("experts", "router_topk_groups"),
    "router_group_score": ("experts", "router_group_score"),
    "router_bias": ("experts", "router_bias"), "router_logit_bias": ("experts", "router_logit_bias"),
    "router_jitter_eps": ("experts", "jitter_eps"),
    "expert_bias": ("experts", "bias"), "normalize_router_weights": ("experts", "normalize_weights"),
    "router_weights_on_input": ("experts", "weights_on_input"), "routed_scaling": ("experts", "routed_scaling"),
    "router_expert_scale": ("experts", "expert_scale"), "router_norm": ("experts", "router_norm"),
    "experts_beside_dense": ("experts", "beside_dense"),
    "router_aux_loss_coef": ("experts", "aux_loss_coef"), "router_aux_loss": ("experts", "aux_loss"),
    "moe_dispatch": ("experts", "dispatch"),
    "pad_token_id": ("tokens", "pad"), "bos_token_id": ("tokens", "bos"), "eos_token_id": ("tokens", "eos"),
    "decoder_start_token_id": ("tokens", "decoder_start"), "wrap_decoder_start": ("tokens", "wrap_decoder_start"),
    "sep_token_id": ("tokens", "sep"),
    "scan_layers": ("execution", "scan_layers"), "remat": ("execution", "remat"),
    "attention_backend": ("execution", "attention_backend"),
    "pipeline_microbatches": ("execution", "pipeline_microbatches"),
    "pipeline_repeats": ("execution", "pipeline_repeats"),
    "lora_rank": ("lora", "rank"), "lora_alpha": ("lora", "alpha"), "lora_targets": ("lora", "targets"),
    "lora_dropout": ("lora", "dropout"), "lora_rslora": ("lora", "rslora"), "lora_trainable": ("lora", "trainable"),
    "quantize": ("quantization", "kind"), "quantize_embeddings": ("quantization", "embeddings"),
    "image_size": ("patches", "image_size"), "patch_size": ("patches", "patch_size"),
    "image_channels": ("patches", "channels"), "class_token": ("patches", "class_token"),
    "patch_bias": ("patches", "bias"), "flexible_patches": ("patches", "flexible"),
    "temporal_patch_size": ("patches", "temporal"), "patch_merge_size": ("patches", "merge"),
    "merged_width": ("patches", "merged_width"), "image_window": ("patches", "window"),
    "max_tiles": ("patches", "tiles"), "aspect_ratios": ("patches", "aspect_ratios"),
    "global_layers": ("patches", "global_layers"), "intermediate_layers": ("patches", "intermediate_layers"),
    "num_mel_bins": ("audio", "mel_bins"), "max_source_positions": ("audio", "source_positions"),
}
GROUPS: dict[str, type] = {
    "norms": Norms, "swiglu_clamp": ClampedSwiGLU, "embeddings": Embeddings, "rotary": Rotary,
    "relative_bias": RelativeBias, "xl": TransformerXL, "disentangled": Disentangled, "nope": NoPE,
    "linear_attention": LinearAttention,
    "scores": Scores, "query_key_norm": QueryKeyNorm, "latent": Latent, "parallel": ParallelResidual,
    "biases": Biases, "logits": Logits, "conv": Convolution, "head_options": HeadOptions, "experts": Experts,
    "tokens": Tokens, "execution": Execution, "lora": LoRA, "quantization": Quantization, "patches": Patches,
    "audio": Audio,
}
OPTIONAL_GROUPS = ("swiglu_clamp", "rotary", "relative_bias", "xl", "disentangled", "nope", "linear_attention",
                   "query_key_norm",
                   "latent", "parallel", "conv", "experts", "lora", "quantization", "patches", "audio")
# flat keys that say only whether an optional part is there
PRESENCE_KEYS = {"qk_norm": "query_key_norm", "parallel_residual": "parallel", "index_relative_bias": "relative_bias"}


@functools.cache  # (the tables are constants; to_flat asks for these thousands of times a second)
def _flat_default(name: str) -> Any:
    path = FLAT[name]
    cls = NESTED.get(path[:2]) or GROUPS[path[0]]
    default = {f.name: f.default for f in dataclasses.fields(cls)}[path[-1]]
    return default if default is not dataclasses.MISSING else OFF[name]


# the parts nested in a part, by their path
NESTED = {("latent", "indexer"): Indexer, ("norms", "hyper_connections"): HyperConnections,
          ("scores", "compressed"): CompressedAttention}

# the flat value of an absent optional part's defining field (its other fields take their dataclass defaults)
OFF = {"num_experts": 0, "kv_lora_rank": None, "index_heads": 0, "conv_kernel_size": 0, "lora_rank": 0,
       "hc_streams": 0, "compressed_layers": (), "image_size": 0, "patch_size": 0, "num_mel_bins": 0,
       "quantize": None, "qk_norm": False, "parallel_residual": False, "index_relative_bias": False}


def _present(group: str, flat: dict) -> bool:
    """Whether a model spelled ``flat`` (every key given) has ``group``."""
    position = flat["position"]
    return {
        "swiglu_clamp": flat["swiglu_limit"] is not None or flat["swiglu_alpha"] != 1.0,
        "rotary": position == "rope", "xl": position == "xl", "disentangled": position == "disentangled",
        "relative_bias": position == "relative" or flat["index_relative_bias"],
        "nope": bool(flat["nope_layers"]), "linear_attention": bool(flat["linear_layers"]),
        "query_key_norm": flat["qk_norm"],
        "latent": flat["kv_lora_rank"] is not None, "parallel": flat["parallel_residual"],
        "conv": flat["conv_kernel_size"] != 0, "experts": flat["num_experts"] != 0,
        "lora": flat["lora_rank"] != 0, "quantization": flat["quantize"] is not None,
        "patches": flat["patch_size"] != 0, "audio": flat["num_mel_bins"] != 0,
    }[group]


# what an absent part's settings need, as its refusal says (flat spelling, ``flat`` the model's)
_NEEDS = {
    "swiglu_clamp": lambda f: "activation='swiglu' with a limit or alpha",
    "rotary": lambda f: f"position='rope', not {f['position']!r}",
    "xl": lambda f: "position='xl' (Transformer-XL relative attention)",
    "disentangled": lambda f: "position='disentangled' (DeBERTa)",
    "relative_bias": lambda f: f"position='relative' or index_relative_bias=True, not position={f['position']!r}",
    "nope": lambda f: "nope_layers (the NoPE layers it tunes)",
    "linear_attention": lambda f: "linear_layers (the layers that run the gated delta rule)",
    "query_key_norm": lambda f: "qk_norm=True",
    "latent": lambda f: "kv_lora_rank (multi-head latent attention)",
    "parallel": lambda f: "parallel_residual=True",
    "conv": lambda f: "conv_kernel_size > 0",
    "experts": lambda f: "num_experts > 0",
    "lora": lambda f: "lora_rank > 0",
    "quantization": lambda f: f"quantize set (one of {QUANTIZATIONS}): the table takes that kind, not None",
    "patches": lambda f: "patch_size > 0 (an image tower)",
    "audio": lambda f: "num_mel_bins > 0 (an audio front end: Whisper)",
}
# settings an absent part leaves without effect that were always accepted: read and let go (they change nothing)
_INERT_WHEN_ABSENT = {
    "experts_per_token", "router_score", "router_groups", "router_topk_groups", "normalize_router_weights",
    "routed_scaling", "router_aux_loss_coef", "router_aux_loss", "moe_dispatch", "rope_theta", "relative_buckets",
    "router_jitter_eps", "router_group_score",
    "relative_max_distance", "disentangled_terms", "temperature_scale", "rope_head_dim", "index_head_dim",
    "index_topk", "index_rope_interleave", "index_query_from_input", "conv_groups", "conv_activation", "lora_alpha",
    "lora_dropout",
    "lora_rslora", "lora_trainable",
    "linear_key_heads", "linear_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel",
    "linear_chunk", "linear_decay",
}


@dataclasses.dataclass(frozen=True)
class Vision:
    """A joined model's image tower and the piece that joins it to the text model this config's top level
    describes. ``tower``: the image encoder's whole config (its dtypes follow the joined model's). CLIP projects
    both pooled outputs to ``projection`` numbers (Linear layers, ``projection_bias``) and scales their cosine
    similarities by exp(a learned log-scale, initially ``logit_scale_init``); SigLIP has no projections (0: its
    towers' heads end at the shared width) and adds a learned ``logit_bias``.

    A decoder reading images (LLaVA) takes the tower's hidden states ``feature_layers`` (indices into its
    hidden_states, negative from the end; several are concatenated along the width), without their first token
    where ``drop_first_token`` (transformers' 'default' strategy: the class token), through the projector
    (Linear, ``projector_activation``, Linear; biases where ``projector_bias``) to the text model's width: they
    replace the embeddings of the ``image_token_id`` placeholders of input_ids, in order."""

    tower: ModelConfig
    projection: int = 0
    projection_bias: bool = False
    logit_scale_init: float = 2.6592  # log(1 / 0.07), CLIP's initial temperature
    logit_bias: bool = False
    feature_layers: tuple[int, ...] = ()  # () but for a decoder reading images
    drop_first_token: bool = False
    projector_activation: str | None = None  # None: no projector (a dual encoder)
    projector_bias: bool = True
    image_token_id: int | None = None
    # Gemma 3's projector: the tower's last_hidden_state average-pooled to this many tokens an image (a square; windows
    # of grid // its side), RMS-normed (1 + w, the tower's eps), times a matrix; 0: not this projector
    pooled_tokens: int = 0
    # Gemma 3: the image tokens (token_type_ids 1) of each image attend to each other both ways in a full pass
    bidirectional_images: bool = False
    # Llama 3.2 Vision: the images reach the text model through its cross layers (scores.cross_attention_layers),
    # not placeholders: the tower's output through one Linear (biased where projector_bias) is what they attend to
    cross_attention: bool = False

    def __post_init__(self):
        if isinstance(self.tower, dict):  # the nested form (to_dict, JSON)
            object.__setattr__(self, "tower", ModelConfig.from_dict(self.tower))
        if not isinstance(self.tower, ModelConfig) or self.tower.family != "encoder":
            raise ValueError(f"ModelConfig.vision.tower must be an encoder's ModelConfig, got {self.tower!r:.80}")
        _non_negative("vision.projection", self.projection)
        if self.projection_bias and not self.projection:
            raise ValueError("ModelConfig.vision.projection_bias=True needs projection > 0 (the layers it biases)")
        if not math.isfinite(self.logit_scale_init):
            raise ValueError(f"ModelConfig.vision.logit_scale_init={self.logit_scale_init!r} must be finite")
        if isinstance(self.feature_layers, list):  # JSON hands us a list
            object.__setattr__(self, "feature_layers", tuple(self.feature_layers))
        states = self.tower.encoder_layers + 1  # the embeddings, then each layer's output
        if any(isinstance(i, bool) or not isinstance(i, int) or not -states <= i < states for i in self.feature_layers):
            raise ValueError(f"ModelConfig.vision.feature_layers={self.feature_layers!r} must index the tower's "
                             f"{states} hidden states (-{states} to {states - 1})")
        pooled, merged, cross = self._check_pooled(), self._check_merged(), self._check_cross()
        joining = (self.feature_layers != (), self.projector_activation is not None, self.image_token_id is not None)
        if not pooled and not merged and not cross and any(joining) and not all(joining):
            raise ValueError("ModelConfig.vision: feature_layers, projector_activation and image_token_id go together "
                             f"(a decoder reading images), got {self.feature_layers!r}, "
                             f"{self.projector_activation!r}, {self.image_token_id!r}")
        projector = self.projector_activation is not None or pooled or merged or cross
        # each kind's fields, which the other kind never reads: refused rather than carried unused
        unread = (("projection", "projection_bias", "logit_scale_init", "logit_bias") if projector else
                  ("feature_layers", "drop_first_token", "projector_activation", "projector_bias", "image_token_id",
                   "bidirectional_images"))
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        settings = ", ".join(f"{name}={getattr(self, name)!r}" for name in unread
                             if getattr(self, name) != defaults[name])
        if settings:
            raise ValueError(f"ModelConfig.vision: {settings} " + ("belong to a dual encoder (CLIP, SigLIP); a "
                             "decoder reading images (projector_activation set) does not read them" if projector else
                             "belong to a decoder reading images (LLaVA); a dual encoder does not read them"))
        if self.projector_activation is not None:
            _one_of("vision.projector_activation", self.projector_activation, ACTIVATIONS)
            if self.projector_activation in GATED_ACTIVATIONS:
                raise ValueError(f"ModelConfig.vision.projector_activation={self.projector_activation!r}: the "
                                 "projector's activation is not gated")

    def _check_pooled(self) -> bool:
        """Gemma 3's pooled projector (``pooled_tokens``): its settings checked; whether it is this one."""
        _non_negative("vision.pooled_tokens", self.pooled_tokens)
        if not self.pooled_tokens:
            return False
        side, patches = math.isqrt(self.pooled_tokens), self.tower.patches
        grid = 0 if patches is None or patches.class_token else patches.image_size // patches.patch_size
        if side * side != self.pooled_tokens or not 0 < side <= grid:  # (a wider side: a pooling window of 0)
            raise ValueError(f"ModelConfig.vision.pooled_tokens={self.pooled_tokens} must be a square whose side is "
                             f"at most the tower's patch grid ({grid} a side, no class token)")
        others = dict(feature_layers=self.feature_layers, drop_first_token=self.drop_first_token,
                      projector_activation=self.projector_activation, projector_bias=self.projector_bias)
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        if any(value != defaults[name] for name, value in others.items()) or self.image_token_id is None:
            raise ValueError(f"ModelConfig.vision.pooled_tokens={self.pooled_tokens} (Gemma 3's projector) reads the "
                             f"tower's last state and needs image_token_id, not {others}, "
                             f"image_token_id={self.image_token_id!r}")
        return True

    @property
    def merged(self) -> bool:
        """Qwen2.5-VL: the tower ends in its own patch merger at the text width (``patches.merge``): its merged
        features replace the image placeholders, with no projector and no feature layers."""
        return self.tower.patches is not None and self.tower.patches.merge > 0

    def _check_merged(self) -> bool:
        """A merging tower's join: only ``image_token_id``; whether it is this one."""
        if not self.merged:
            return False
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        others = {name: getattr(self, name) for name in ("feature_layers", "drop_first_token", "projector_activation",
                                                         "projector_bias", "pooled_tokens", "bidirectional_images")}
        if any(value != defaults[name] for name, value in others.items()) or self.image_token_id is None:
            raise ValueError(f"ModelConfig.vision: a tower with its own merger (patch_merge_size="
                             f"{self.tower.patches.merge}) gives the image features itself; it needs image_token_id "
                             f"and none of {others} (image_token_id={self.image_token_id!r})")
        return True

    def _check_cross(self) -> bool:
        """Llama 3.2 Vision's join (``cross_attention``): a tiled tower, its image_token_id (the processor's
        placeholder, which the model reads no image into) and projector_bias; whether it is this one."""
        if not self.cross_attention:
            return False
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        others = {name: getattr(self, name) for name in ("feature_layers", "drop_first_token", "projector_activation",
                                                         "pooled_tokens", "bidirectional_images")}
        patches = self.tower.patches
        if any(value != defaults[name] for name, value in others.items()) or self.image_token_id is None or (
                patches is None or not patches.tiles):
            raise ValueError(f"ModelConfig.vision.cross_attention=True (Llama 3.2 Vision) joins a tiled tower "
                             f"(max_num_tiles) through the text model's cross layers; it needs image_token_id and "
                             f"none of {others} (image_token_id={self.image_token_id!r})")
        return True

    def text_tower(self, cfg: ModelConfig) -> ModelConfig:
        """The text encoder of the joined model ``cfg``: its top level, as an encoder of its own."""
        return cfg.replace(family="encoder", head="none", vision=None)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture, numerics and compilation choices of one model.

    The top level holds what every model has; each concern some models lack is a sub-config, None where absent
    (``experts``, ``latent``, ``rotary``, ...): build it nested (``experts=Experts(8)``) or flat (``num_experts=8``).

    Layer counts: an encoder uses ``encoder_layers``, a decoder ``decoder_layers``, an encoder-decoder both.
    ``attention`` is the decoder side's self-attention pattern (an encoder's is bidirectional). Precision: see
    the module docstring."""

    family: str = "decoder"
    name: str = "custom"
    vocab_size: int = 32000
    d_model: int = 512
    num_heads: int = 8
    num_kv_heads: int | None = None  # None: as many as num_heads (MHA); 1: MQA; between: GQA
    head_dim: int | None = None  # None: d_model // num_heads
    d_ff: int = 2048
    encoder_layers: int = 0
    decoder_layers: int = 6
    norms: Norms = Norms()
    activation: str = "gelu"  # ACTIVATIONS
    swiglu_clamp: ClampedSwiGLU | None = None
    position: str = "learned"
    max_positions: int = 1024  # longest sequence; learned/sinusoidal tables hold this many rows
    embeddings: Embeddings = Embeddings()
    rotary: Rotary | None = None  # position='rope'
    relative_bias: RelativeBias | None = None  # position='relative' (T5), or beside absolute positions (MPNet)
    xl: TransformerXL | None = None  # position='xl'
    disentangled: Disentangled | None = None  # position='disentangled'
    attention: str = "causal"
    window_size: int | None = None  # sliding and alternating-local attention: keys in (t - w, t]
    # 'alternating': which layers are 'full' and which 'sliding' (Gemma) or 'chunked' (Llama 4); None: GPT-3's, odd
    # layers sliding. An encoder-decoder's encoder follows the same list with keys within w either side.
    layer_types: tuple[str, ...] | None = None
    # 'chunked' layers (Llama 4's local ones): a query sees the keys of its own chunk of this many, up to itself
    attention_chunk_size: int | None = None
    nope: NoPE | None = None
    linear_attention: LinearAttention | None = None  # Gated DeltaNet layers among the attention layers
    scores: Scores = Scores()
    query_key_norm: QueryKeyNorm | None = None
    latent: Latent | None = None
    parallel: ParallelResidual | None = None
    biases: Biases = Biases()
    logits: Logits = Logits()
    # each sublayer's output times this as it joins the residual stream (Granite's residual_multiplier)
    residual_multiplier: float = 1.0
    # each layer's output (the residual stream it hands on) times a stored scalar of its own (Gemma 4's layer_scalar)
    layer_output_scale: bool = False
    clamp_float16: bool = False  # T5: in float16, clamp each sublayer's output into range, as transformers does
    shared_layers: bool = False  # ALBERT: one layer's parameters, applied at every layer of the stack
    conv: Convolution | None = None
    # ELECTRA pretraining ('rtd'): the width of the MLM generator this discriminator trains beside (0: none); see
    # generator_config. Export writes the discriminator alone (``model.generator`` saves on its own).
    generator_width: int = 0
    head: str = "lm"
    head_options: HeadOptions = HeadOptions()
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    experts: Experts | None = None
    tokens: Tokens = Tokens()
    dtype: str = "float32"  # compute dtype; softmax, norms and losses always run in float32 (see above)
    param_dtype: str = "float32"
    init_std: float = 0.02
    execution: Execution = Execution()
    lora: LoRA | None = None
    quantization: Quantization | None = None
    patches: Patches | None = None  # an image tower's front end: pixel_values in place of token ids
    # an image tower and what joins it to the text model here: a dual encoder's (CLIP), a decoder's (LLaVA)
    vision: Vision | None = None
    audio: Audio | None = None  # an encoder-decoder's audio front end (Whisper): input_features in place of ids

    def __post_init__(self):
        _settle_parts(self)
        _settle_vision(self)
        _check_sizes(self)
        _check_positions(self)
        _check_attention_pattern(self)
        _check_attention(self)
        _check_heads(self)
        _check_experts(self)
        _check_compressed_attention(self)
        _check_tokens(self)
        _check_numerics(self)
        _check_adapters(self)

    @property
    def head_dim_(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def token_rows(self) -> int:
        """Rows of the token table: the vocabulary, and ids past it that are embedded but never predicted."""
        return self.vocab_size + self.embeddings.extra_rows

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_heads

    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    @property
    def mla(self) -> bool:
        return self.latent is not None

    @property
    def rope_dim(self) -> int:
        """Width of the rotated part of a query/key head: all of it, ``rotary.dim``, or MLA's rope_head_dim."""
        return self.latent.rope_head_dim if self.latent else (self.rotary and self.rotary.dim) or self.head_dim_

    @property
    def value_dim(self) -> int:
        latent = self.latent
        return latent.v_head_dim if latent is not None and latent.v_head_dim is not None else self.head_dim_

    @property
    def expert_width(self) -> int:
        return self.experts.d_ff if self.experts is not None and self.experts.d_ff is not None else self.d_ff

    @property
    def scale(self) -> float:
        """The softmax scale of q . k (``scores.scale``, else derived: see ``_attention_scale``)."""
        return self.scores.scale if self.scores.scale is not None else _attention_scale(self)

    @property
    def indexer(self) -> Indexer | None:  # DeepSeek-V3.2's, a part of latent attention
        return self.latent.indexer if self.latent is not None else None

    @property
    def segment_memory(self) -> int:  # tokens of Transformer-XL's memory each layer keeps (0: none)
        return self.xl.memory_len if self.xl is not None else 0

    @property
    def num_layers(self) -> int:
        return self.encoder_layers + self.decoder_layers

    # the flat spelling
    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with ``changes``: top-level fields (``experts=None``) or flat names (``num_experts=8``)."""
        cfg = dataclasses.replace(self, **{k: v for k, v in changes.items() if k in GROUPS})
        flat = {k: v for k, v in changes.items() if k not in GROUPS}
        return ModelConfig(**_fields_from_flat({**cfg.to_flat(), **flat})) if flat else cfg

    def to_dict(self) -> dict[str, Any]:
        """The nested form (what run folders and checkpoints store; ``from_dict`` reads it back)."""
        return dataclasses.asdict(self)

    def to_flat(self) -> dict[str, Any]:
        """Every setting under its flat name (absent parts at their 'off' values)."""
        try:
            return dict(_cached_flat(self))
        except TypeError:  # (a field holding an unhashable value: no cache key, computed afresh)
            return _to_flat(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        """A config from its nested form (``to_dict``), its flat spelling (``FLAT``), or a mix; a setting of an
        absent part at a value that changes something is refused, naming what the part needs."""
        flat = {}
        for key, value in data.items():  # nested parts expand first: a flat name given beside one wins
            if key in GROUPS:
                part = GROUPS[key](**value) if isinstance(value, dict) else value
                flat.update(_flat_part(key, part, data.get("position", cls.position)))
        return cls(**_fields_from_flat({**flat, **{k: v for k, v in data.items() if k not in GROUPS}}))



def generator_config(cfg: ModelConfig) -> ModelConfig:
    """ELECTRA's generator of a discriminator ``cfg`` (``generator_width``): as deep, its heads of the same size,
    d_ff scaled with the width, its embeddings those of the discriminator (projected when widths differ)."""
    width, scale = cfg.generator_width, cfg.generator_width / cfg.d_model
    embedding = cfg.embeddings.width or cfg.d_model
    return cfg.replace(d_model=width, num_heads=width // cfg.head_dim_, num_kv_heads=None, head_dim=None,
                       d_ff=max(1, round(cfg.d_ff * scale)), head="mlm", pooler=False, generator_width=0,
                       embedding_size=None if embedding == width else embedding, name=f"{cfg.name}-generator")


def _attention_scale(cfg: ModelConfig) -> float:
    if cfg.disentangled is not None:  # DeBERTa divides by sqrt(head_dim * (1 + position terms))
        return 1.0 / math.sqrt(cfg.head_dim_ * (1 + len(cfg.disentangled.terms)))
    latent = cfg.latent
    scale = 1.0 / math.sqrt(cfg.head_dim_ + (latent.rope_head_dim if latent is not None else 0))
    s = cfg.rotary.scaling if cfg.rotary is not None else None
    if latent is not None and s is not None and s.mscale_all_dim:  # DeepSeek's yarn softmax correction
        scale *= _yarn_mscale(s.factor, s.mscale_all_dim) ** 2
    return scale


def _settle_parts(cfg: ModelConfig) -> None:
    """Each part as its class (JSON and YAML hand the nested form as mappings), and a part that ``position``
    names there with its defaults when it was left out."""
    for name, cls in GROUPS.items():
        value = getattr(cfg, name)
        if isinstance(value, dict):
            object.__setattr__(cfg, name, cls(**value))
        elif value is not None and not isinstance(value, cls):
            raise ValueError(f"ModelConfig.{name}={value!r} must be a {cls.__name__}")
        elif value is None and name not in OPTIONAL_GROUPS:
            raise ValueError(f"ModelConfig.{name} is always present (a {cls.__name__}); it cannot be None")
    named = (("rotary", "rope"), ("xl", "xl"), ("disentangled", "disentangled"), ("relative_bias", "relative"))
    for name, kind in named:
        if getattr(cfg, name) is None and cfg.position == kind:
            object.__setattr__(cfg, name, GROUPS[name]())


def _settle_vision(cfg: ModelConfig) -> None:
    """``vision`` as a Vision (JSON hands a mapping), its tower computing and storing in the joined model's dtypes;
    a dual encoder has one, with the contrastive head; a decoder reading images (LLaVA) one with its projector."""
    vision = cfg.vision
    if isinstance(vision, dict):
        vision = Vision(**vision)
    if vision is not None:
        if not isinstance(vision, Vision):
            raise ValueError(f"ModelConfig.vision={vision!r:.80} must be a Vision")
        tower = vision.tower
        if (tower.dtype, tower.param_dtype) != (cfg.dtype, cfg.param_dtype):
            vision = dataclasses.replace(vision, tower=tower.replace(dtype=cfg.dtype, param_dtype=cfg.param_dtype))
        object.__setattr__(cfg, "vision", vision)
    # a decoder reads images through its projector (LLaVA); a dual encoder joins its towers by similarity
    reads_images = vision is not None and (vision.projector_activation is not None or vision.pooled_tokens > 0
                                           or vision.cross_attention or vision.merged)
    if (cfg.family == "dual_encoder") != (vision is not None and not reads_images) or (
            cfg.family == "dual_encoder") != (cfg.head == "contrastive") or (
            reads_images and cfg.family != "decoder"):
        raise ValueError(f"ModelConfig.family={cfg.family!r}, head={cfg.head!r}, vision "
                         f"{'set' if vision is not None else 'None'}: a dual encoder (family='dual_encoder') has an "
                         "image tower (vision) and the head 'contrastive', and only a dual encoder has them; a "
                         "decoder may read images (vision with its projector_activation, feature_layers and "
                         "image_token_id)")
    if reads_images and not 0 <= vision.image_token_id < cfg.token_rows:
        raise ValueError(f"ModelConfig.vision.image_token_id={vision.image_token_id} must be a token id of the "
                         f"vocabulary [0, {cfg.token_rows})")
    if vision is not None and vision.cross_attention != bool(cfg.scores.cross_attention_layers):
        raise ValueError("ModelConfig.vision.cross_attention (Llama 3.2 Vision) and scores.cross_attention_layers go "
                         f"together: the layers that attend to the images, got {cfg.scores.cross_attention_layers!r}")


# The checks that join two concerns (each part checks its own fields), in the order a config is read.
def _check_sizes(cfg: ModelConfig) -> None:
    _one_of("family", cfg.family, FAMILIES)
    for field in ("d_model", "num_heads", "d_ff", "max_positions"):
        _positive(field, getattr(cfg, field))
    if cfg.patches is None:
        _positive("vocab_size", cfg.vocab_size)
        if cfg.head_options.image_pooler is not None:
            raise ValueError(f"ModelConfig.image_pooler={cfg.head_options.image_pooler!r} pools an image tower's "
                             "states: it needs patch_size (the image front end)")
    else:
        _check_patches(cfg)
    if cfg.audio is not None and (cfg.family != "encoder_decoder" or cfg.position != "learned"):
        raise ValueError(f"ModelConfig.num_mel_bins={cfg.audio.mel_bins} (an audio front end) is built for "
                         f"family='encoder_decoder' with learned decoder positions, not family={cfg.family!r}, "
                         f"position={cfg.position!r}")
    _non_negative("encoder_layers", cfg.encoder_layers)
    _non_negative("decoder_layers", cfg.decoder_layers)
    for need, field in ((cfg.family in ("encoder", "encoder_decoder", "dual_encoder"), "encoder_layers"),
                        (cfg.family in ("decoder", "encoder_decoder"), "decoder_layers")):
        if need != (getattr(cfg, field) > 0):
            raise ValueError(f"ModelConfig.{field}={getattr(cfg, field)} does not fit family={cfg.family!r}: "
                             f"{'must be > 0' if need else 'must be 0'}")
    if cfg.head_dim is None:
        if cfg.d_model % cfg.num_heads:
            raise ValueError(f"ModelConfig.num_heads={cfg.num_heads} does not divide d_model={cfg.d_model}; "
                             "choose a divisor or set head_dim explicitly")
    else:
        _positive("head_dim", cfg.head_dim)
    if cfg.num_kv_heads is not None:
        _positive("num_kv_heads", cfg.num_kv_heads)
        if cfg.num_heads % cfg.num_kv_heads:
            raise ValueError(f"ModelConfig.num_kv_heads={cfg.num_kv_heads} does not divide num_heads="
                             f"{cfg.num_heads}; valid: a divisor of {cfg.num_heads}")
    _one_of("activation", cfg.activation, ACTIVATIONS)
    if cfg.swiglu_clamp is not None and cfg.activation != "swiglu":
        raise ValueError(f"ModelConfig.swiglu_limit / swiglu_alpha shape a SwiGLU; activation is "
                         f"{cfg.activation!r}, not 'swiglu'")
    if cfg.embeddings.per_layer_width and (cfg.family != "decoder" or cfg.norms.position != "pre"
                                           or cfg.parallel is not None or cfg.position == "xl"):
        raise ValueError(f"ModelConfig.per_layer_input_size={cfg.embeddings.per_layer_width} (per-layer inputs) "
                         f"needs a pre-norm family='decoder' without parallel_residual or position='xl', not "
                         f"family={cfg.family!r}, norm_position={cfg.norms.position!r}")
    if cfg.embeddings.width is not None and cfg.family != "encoder":
        raise ValueError(f"ModelConfig.embedding_size factorises an encoder's embeddings (ALBERT, ELECTRA); "
                         f"family={cfg.family!r} does not take it")
    if not cfg.embeddings.shared and cfg.family != "encoder_decoder":
        raise ValueError(f"ModelConfig.shared_embeddings=False (separate encoder and decoder token tables) needs "
                         f"family='encoder_decoder', not {cfg.family!r}")
    norms = cfg.norms
    if norms.position == "output" and (cfg.family != "decoder" or cfg.position == "xl"):
        raise ValueError("ModelConfig.norm_position='output' (OLMo-2: x + norm(f(x))) needs family='decoder' "
                         f"without Transformer-XL memory, not family={cfg.family!r}, position={cfg.position!r}")
    if not norms.first_attention and (norms.position != "pre" or cfg.family != "encoder"
                                      or cfg.shared_layers or cfg.encoder_layers < 2):
        raise ValueError("ModelConfig.first_attn_norm=False drops the first layer's pre-attention norm "
                         "(ModernBERT): it needs family='encoder', norm_position='pre', two or more layers and no "
                         f"shared_layers (family={cfg.family!r}, norm_position={norms.position!r})")

def _check_patches(cfg: ModelConfig) -> None:
    """An image tower: an encoder reading pixels, with a learned position per patch and class token."""
    patches, embeddings = cfg.patches, cfg.embeddings
    if patches.merge:
        _check_merged_patches(cfg)
        return
    wrong = {"family": (cfg.family, "encoder"), "vocab_size": (cfg.vocab_size, 0),
             "position": (cfg.position, "learned"),
             "max_positions": (cfg.max_positions, patches.tokens), "type_vocab_size": (embeddings.types, 0),
             "position_offset": (embeddings.position_offset, 0), "embedding_size": (embeddings.width, None),
             "pad_aware_positions": (embeddings.pad_aware_positions, False)}
    wrong = {name: pair for name, pair in wrong.items() if pair[0] != pair[1]}
    if wrong:
        raise ValueError(f"ModelConfig.patch_size={patches.patch_size} (an image tower) needs "
                         + ", ".join(f"{name}={want!r} (not {got!r})" for name, (got, want) in wrong.items())
                         + f": one learned position per patch and class token ({patches.count} patches"
                         + (" + 1 class token)" if patches.class_token else ")"))
    pooler = cfg.head_options.image_pooler
    if pooler is not None and (cfg.head_options.pooler or (pooler == "norm") == cfg.norms.final):
        raise ValueError(f"ModelConfig.image_pooler={pooler!r} is the tower's only pooler and "
                         + ("normalizes the first token in place of the stack's final norm: it needs final_norm=False"
                            if pooler == "norm" else "reads the final-normed states: it needs final_norm=True")
                         + " and pooler=False")
    # (negative indices count from the last layer, as transformers indexes its tuple of layer outputs)
    layers = cfg.encoder_layers
    if any(not -layers <= i < layers for i in patches.intermediate_layers) or (patches.tiles and (
            cfg.head != "none" or pooler is not None or cfg.norms.position != "pre")):
        raise ValueError(f"ModelConfig: a tiled tower's intermediate_layers={patches.intermediate_layers!r} must "
                         f"index its {cfg.encoder_layers} layers, and it has head='none', no image_pooler and "
                         f"norm_position='pre' (its global layers gate the pre-norm sublayers)")
    if cfg.head not in ("none", "sequence_classification"):
        raise ValueError(f"ModelConfig.head={cfg.head!r} does not fit an image tower (patch_size set); valid: "
                         "'none', 'sequence_classification' (ViT's image classifier on the first token)")
    if cfg.head == "sequence_classification" and (not patches.class_token or cfg.head_options.pooler or pooler):
        # (CLIP's and SigLIP's image classifiers average the states instead: not built)
        raise ValueError("ModelConfig.head='sequence_classification' on an image tower is ViT's classifier: it reads "
                         "the class token, so it needs class_token=True, pooler=False and no image_pooler")


def _check_merged_patches(cfg: ModelConfig) -> None:
    """Qwen2-VL's and Qwen2.5-VL's image towers: 2-D rotary positions, the merger's output as pooler_output."""
    wrong = {"family": (cfg.family, "encoder"), "vocab_size": (cfg.vocab_size, 0), "position": (cfg.position, "rope"),
             "rope_axial": (cfg.rotary is not None and cfg.rotary.axial, True), "head": (cfg.head, "none"),
             "image_pooler": (cfg.head_options.image_pooler, None), "type_vocab_size": (cfg.embeddings.types, 0),
             "embedding_norm": (cfg.norms.embedding, False)}
    wrong = {name: pair for name, pair in wrong.items() if pair[0] != pair[1]}
    if wrong:
        raise ValueError(f"ModelConfig.patch_merge_size={cfg.patches.merge} (Qwen2-VL's image tower) needs "
                         + ", ".join(f"{name}={want!r} (not {got!r})" for name, (got, want) in wrong.items()))


def _check_positions(cfg: ModelConfig) -> None:
    _one_of("position", cfg.position, POSITIONS)
    for name, kind in (("rotary", "rope"), ("xl", "xl"), ("disentangled", "disentangled")):
        if getattr(cfg, name) is not None and cfg.position != kind:
            raise ValueError(f"ModelConfig.{name} is set but position={cfg.position!r}, not {kind!r}")
    if cfg.rotary is not None:
        _check_rotary(cfg, cfg.rotary)
    if cfg.relative_bias is not None and cfg.position != "relative" and (
            cfg.family != "encoder" or cfg.position not in ("learned", "sinusoidal")):
        raise ValueError("ModelConfig.index_relative_bias=True (MPNet) adds a relative bias beside absolute "
                         f"positions in an encoder; family={cfg.family!r}, position={cfg.position!r}")
    if cfg.relative_bias is not None and cfg.relative_bias.per_layer and cfg.position != "relative":
        raise ValueError(f"ModelConfig.relative_bias_per_layer=True needs position='relative', not {cfg.position!r}")
    if cfg.xl is not None:
        if cfg.family != "decoder" or cfg.attention not in ("causal", "bidirectional"):
            raise ValueError("ModelConfig.position='xl' (Transformer-XL relative attention) needs family='decoder' "
                             f"and attention 'causal' or 'bidirectional', not {cfg.family!r} and {cfg.attention!r}")
        if cfg.num_kv_heads not in (None, cfg.num_heads) or cfg.experts is not None:
            raise ValueError("ModelConfig.position='xl' supports multi-head attention with a dense MLP: leave "
                             "num_kv_heads None and num_experts 0")
        if cfg.embeddings.types:
            raise ValueError("ModelConfig.type_vocab_size: Transformer-XL models take token types as relative "
                             "segments (relative_segments=True), not as embeddings")
    if cfg.disentangled is not None:
        if cfg.family != "encoder" or cfg.num_kv_heads not in (None, cfg.num_heads):
            raise ValueError("ModelConfig.position='disentangled' (DeBERTa) needs family='encoder' with "
                             f"multi-head attention (family={cfg.family!r}, num_kv_heads={cfg.num_kv_heads})")
        d, longest = cfg.disentangled, cfg.disentangled.max_distance(cfg.max_positions)
        if d.buckets and not d.span(cfg.max_positions) // 2 < longest - 1:
            raise ValueError(f"ModelConfig.position_buckets={d.buckets} spaces buckets up to "
                             f"max_relative_positions={longest}, which must exceed half the "
                             "buckets plus one")
    embeddings = cfg.embeddings
    if embeddings.pad_aware_positions and (cfg.tokens.pad is None or cfg.position not in ("learned", "sinusoidal")
                                           or embeddings.position_offset <= cfg.tokens.pad):
        raise ValueError("ModelConfig.pad_aware_positions=True needs learned or sinusoidal positions, a "
                         "pad_token_id, and position_offset > pad_token_id (RoBERTa: pad_token_id=1, "
                         "position_offset=2)")
    if embeddings.positions_from_mask and (cfg.family != "decoder" or embeddings.pad_aware_positions):
        raise ValueError("ModelConfig.positions_from_mask=True counts a decoder's positions from its attention mask "
                         f"(OPT): it needs family='decoder' (not {cfg.family!r}) and pad_aware_positions=False")
    if embeddings.sinusoids != "transformer" and cfg.position != "sinusoidal":
        raise ValueError(f"ModelConfig.sinusoids={embeddings.sinusoids!r} lays out sinusoidal positions; "
                         f"position is {cfg.position!r}")

def _check_rotary(cfg: ModelConfig, rotary: Rotary) -> None:
    if cfg.latent is None and cfg.head_dim_ % 2:
        raise ValueError(f"rotary positions need an even head_dim, got {cfg.head_dim_}")
    plain = Rotary(theta=rotary.theta, axial=True)
    if rotary.axial and (cfg.patches is None or not cfg.patches.merge or rotary != plain or cfg.head_dim_ % 4):
        raise ValueError("ModelConfig.rope_axial=True (2-D rotary over a patch's row and column) is Qwen2-VL's image "
                         "tower's: it needs patch_merge_size > 0, a head_dim divisible by 4 and no other rotary "
                         f"setting but rope_theta, got head_dim={cfg.head_dim_}, {rotary}")
    if rotary.local_theta is not None and cfg.attention != "alternating":
        raise ValueError(f"ModelConfig.local_rope_theta={rotary.local_theta!r} is the rotary base of the "
                         "sliding layers: it needs position='rope', attention='alternating' and a value > 0")
    if rotary.proportion is not None and (cfg.latent is not None or rotary.dim is not None):
        raise ValueError(f"ModelConfig.rope_proportion={rotary.proportion!r} (proportional rotary) turns the whole "
                         "head of standard attention: it needs rotary_dim None and no kv_lora_rank")
    if rotary.dim is not None and (cfg.latent is not None or rotary.dim > cfg.head_dim_):
        raise ValueError(f"ModelConfig.rotary_dim={rotary.dim!r} (partial rotary) must be an even integer in "
                         f"(0, head_dim={cfg.head_dim_}] with standard attention (latent attention sets its "
                         "rotary width with rope_head_dim)")
    if rotary.sections is not None and (sum(rotary.sections) != cfg.rope_dim // 2 or rotary.interleave
                                        or rotary.local_theta is not None):
        raise ValueError(f"ModelConfig.rope_sections={rotary.sections!r} (M-RoPE) must sum to the "
                         f"{cfg.rope_dim // 2} frequency pairs of the rotated width, with rope_interleave=False and "
                         "no local_rope_theta")
    if rotary.scaling is not None:
        kind, pairs = rotary.scaling.kind, cfg.rope_dim // 2
        if kind == "longrope" and len(rotary.scaling.short_factor) != pairs:
            raise ValueError(f"RopeScaling longrope has {len(rotary.scaling.short_factor)} factors but the "
                             f"rotated head width {cfg.rope_dim} has {pairs} frequency pairs")
        if kind == "dynamic" and cfg.rope_dim <= 2:
            raise ValueError(f"RopeScaling dynamic raises the base to H / (H - 2); the rotated width "
                             f"{cfg.rope_dim} must be > 2")

def _check_attention_pattern(cfg: ModelConfig) -> None:
    _one_of("attention", cfg.attention, ATTENTION_PATTERNS)
    encoder = cfg.family in ("encoder", "dual_encoder")  # (a dual encoder's top level is its text encoder)
    text_tower = cfg.head_options.pooled_token is not None  # CLIP's: each token sees itself and the left
    if encoder and cfg.attention not in ("bidirectional", "alternating") + (("causal",) if text_tower else ()):
        raise ValueError(
            f"ModelConfig.attention={cfg.attention!r} does not fit family={cfg.family!r}; encoders attend "
            "'bidirectional', 'alternating' (full layers and layers within window_size either side: ModernBERT) or, "
            "a text tower alone (pooled_token set: CLIP's), 'causal' (no cache, no generation)")
    if not encoder and cfg.attention == "bidirectional" and cfg.position != "xl":
        raise ValueError(
            f"ModelConfig.attention='bidirectional' does not fit family={cfg.family!r}; valid: "
            "'causal', 'prefix', 'sliding', 'alternating' (or position='xl': XLNet's bidirectional form)")
    if cfg.family == "encoder_decoder" and cfg.attention not in ("causal", "sliding", "alternating"):
        raise ValueError(f"ModelConfig.attention={cfg.attention!r} does not fit family='encoder_decoder'; "
                         "the decoder attends 'causal', 'sliding' or 'alternating'")
    if isinstance(cfg.layer_types, list):  # YAML and JSON hand us lists
        object.__setattr__(cfg, "layer_types", tuple(cfg.layer_types))
    chunked = cfg.attention == "alternating" and "chunked" in (cfg.layer_types or ())
    if chunked:
        if cfg.family != "decoder" or cfg.window_size is not None:
            raise ValueError("ModelConfig.layer_types with 'chunked' layers (Llama 4) needs family='decoder' and "
                             "window_size None (the chunk is attention_chunk_size)")
        _positive("attention_chunk_size", cfg.attention_chunk_size)
    elif cfg.attention_chunk_size is not None:
        raise ValueError(f"ModelConfig.attention_chunk_size={cfg.attention_chunk_size} is set but no layer is "
                         "'chunked' (attention='alternating' with 'chunked' in layer_types)")
    windowed = cfg.attention == "alternating" and "window" in (cfg.layer_types or ())
    if windowed and (cfg.patches is None or not cfg.patches.window or cfg.window_size is not None):
        raise ValueError("ModelConfig.layer_types with 'window' layers (Qwen2.5-VL's image tower) needs image_window "
                         "> 0 (the windows' side in pixels) and window_size None")
    if cfg.attention in ("sliding", "alternating") and not (chunked or windowed):
        if cfg.window_size is None:
            raise ValueError(f"ModelConfig.attention={cfg.attention!r} needs window_size (a positive int)")
        _positive("window_size", cfg.window_size)
    elif cfg.window_size is not None:
        raise ValueError(f"ModelConfig.window_size={cfg.window_size} is set but attention={cfg.attention!r}; "
                         "set attention='sliding' or 'alternating', or window_size=None")
    if cfg.layer_types is not None:
        _check_layer_types(cfg)

def _check_layer_types(cfg: ModelConfig) -> None:
    if cfg.attention != "alternating":
        raise ValueError(f"ModelConfig.layer_types is set but attention={cfg.attention!r}; it lists the "
                         "'full' and 'sliding' (or 'chunked') layers of attention='alternating'")
    wrong = sorted({t for t in cfg.layer_types if t not in LAYER_TYPES}, key=str)
    if wrong:
        raise ValueError(f"ModelConfig.layer_types holds {wrong}; each entry must be one of {LAYER_TYPES}")
    if len({"sliding", "chunked", "window"} & set(cfg.layer_types)) > 1:
        raise ValueError("ModelConfig.layer_types mixes 'sliding', 'chunked' or 'window' layers; a stack has one "
                         "kind of local layer")
    counts = ({cfg.encoder_layers} if cfg.family == "encoder" else
              {cfg.decoder_layers} | ({cfg.encoder_layers} if cfg.family == "encoder_decoder" else set()))
    if len(counts) > 1 or len(cfg.layer_types) not in counts:
        raise ValueError(f"ModelConfig.layer_types has {len(cfg.layer_types)} entries; it needs one per layer "
                         f"({max(counts)}; an encoder-decoder's two stacks share it, so both need "
                         "that many layers)")

def _check_attention(cfg: ModelConfig) -> None:
    standard = cfg.latent is None and cfg.position != "xl"
    if cfg.indexer is not None and (cfg.linear_attention is not None or cfg.position == "none"):
        raise ValueError("ModelConfig.index_heads (the lightning indexer) rotates its keys and is cached beside plain "
                         "latent layers: it cannot be combined with linear_layers or position='none'")
    if cfg.scores.global_tokens and (cfg.family != "encoder" or cfg.position not in ("learned", "sinusoidal", "rope")
                              or cfg.relative_bias is not None):
        raise ValueError(f"ModelConfig.global_tokens=True (Longformer) needs family='encoder' and plain attention "
                         f"(learned, sinusoidal or rotary positions, no relative bias), not family={cfg.family!r}, "
                         f"position={cfg.position!r}")
    if cfg.scores.sparse_block_size is not None and (
            cfg.family == "decoder" or cfg.position not in ("learned", "sinusoidal") or cfg.relative_bias is not None
            or cfg.scores.global_tokens or cfg.scores.softcap is not None or cfg.scores.sinks):
        raise ValueError(f"ModelConfig.sparse_block_size={cfg.scores.sparse_block_size} (BigBird's block-sparse "
                         "attention) needs an encoder's stack of plain attention (learned or sinusoidal positions; no "
                         f"relative bias, global tokens, softcap or sinks), not family={cfg.family!r}, "
                         f"position={cfg.position!r}")
    if cfg.query_key_norm is not None and not standard:
        raise ValueError("ModelConfig.qk_norm=True needs standard attention (not kv_lora_rank or position='xl')")
    if cfg.latent is not None:
        # position='none': the rotary part of each query and key passes unrotated (Kimi Linear's MLA)
        if cfg.family != "decoder" or cfg.position not in ("rope", "none"):
            raise ValueError("ModelConfig.kv_lora_rank (multi-head latent attention) needs family='decoder' "
                             f"and position 'rope' or 'none', not {cfg.family!r} and {cfg.position!r}")
        if cfg.kv_heads != cfg.num_heads:
            raise ValueError(f"ModelConfig.num_kv_heads={cfg.num_kv_heads}: multi-head latent attention "
                             "expands keys and values for every head; leave num_kv_heads None")
        if cfg.biases.qkv:
            raise ValueError("ModelConfig.qkv_bias=True is not supported with multi-head latent attention")
    if cfg.parallel is not None and (cfg.norms.position != "pre" or cfg.family != "decoder"
                                      or cfg.norms.sandwich or cfg.position == "xl"):
        raise ValueError("ModelConfig.parallel_residual=True needs a pre-norm decoder without sandwich norms or "
                         "Transformer-XL memory")
    if cfg.scores.inverse_layer_scale and not standard:
        raise ValueError("ModelConfig.inverse_layer_scale scales standard cfg-attention; multi-head latent and "
                         "Transformer-XL attention do not take it")
    if cfg.scores.position_scale is not None and (cfg.family != "decoder" or cfg.position != "rope"
                                                   or cfg.disentangled is not None):
        raise ValueError("ModelConfig.query_position_scale scales a rotary decoder's queries by their positions; it "
                         f"needs family='decoder' and position='rope', not {cfg.family!r} and {cfg.position!r}")
    if cfg.scores.sinks and not standard:
        raise ValueError("ModelConfig.attention_sinks=True joins standard attention's softmax; multi-head latent "
                         "and Transformer-XL attention do not take it")
    if cfg.nope is not None:
        if cfg.position != "rope" or cfg.family != "decoder":
            raise ValueError("ModelConfig.nope_layers leaves some layers of a rotary decoder unrotated; it needs "
                             "family='decoder' and position='rope'")
        # a latent NoPE layer has shapes of its own (a block group of its own), built as an expert layer
        dense = set(range(cfg.experts.dense_layers)) if cfg.latent is not None and cfg.experts is not None else set()
        if cfg.latent is not None and (cfg.experts is None or dense & set(cfg.nope.layers)
                                       or cfg.nope.temperature_floor_scale is not None):
            raise ValueError(f"ModelConfig.nope_layers={cfg.nope.layers!r} with multi-head latent attention: NoPE "
                             "latent layers are expert layers (num_experts > 0, none among the dense_layers), "
                             "without temperature_floor_scale")
        if cfg.nope.layers[-1] >= cfg.decoder_layers:
            raise ValueError(f"ModelConfig.nope_layers={cfg.nope.layers!r} must list distinct layer indices in "
                             f"[0, {cfg.decoder_layers}) in increasing order")
    if cfg.scores.output_gate and not standard:
        raise ValueError("ModelConfig.attention_gate=True gates standard attention's heads; multi-head latent and "
                         "Transformer-XL attention do not take it")
    linear = cfg.linear_attention
    if linear is not None:
        if cfg.family != "decoder" or cfg.attention != "causal" or cfg.position == "xl" or cfg.shared_layers:
            raise ValueError("ModelConfig.linear_layers (Gated DeltaNet layers) needs family='decoder', "
                             "attention='causal' beside standard or latent attention and no shared_layers, not "
                             f"family={cfg.family!r}, attention={cfg.attention!r}, position={cfg.position!r}")
        if linear.layers[-1] >= cfg.decoder_layers:
            raise ValueError(f"ModelConfig.linear_layers={linear.layers!r} must list distinct layer indices in "
                             f"[0, {cfg.decoder_layers}) in increasing order")
        # the dense layers are one block group: all linear layers (Kimi Linear's first) or none of them
        dense = set(range(cfg.experts.dense_layers)) if cfg.experts is not None else set()
        if cfg.experts is not None and (cfg.experts.layer_step > 1 or (dense & set(linear.layers) and
                                                                        not dense <= set(linear.layers))):
            raise ValueError("ModelConfig.linear_layers with experts needs experts in every layer past the first "
                             f"dense_layers={cfg.experts.dense_layers}, and those all linear or none "
                             f"(moe_layer_step={cfg.experts.layer_step}, linear_layers={linear.layers})")
    _check_layer_key_values(cfg, standard)
    if cfg.conv is not None and (cfg.family != "encoder" or cfg.conv.kernel_size % 2 == 0 or cfg.shared_layers):
        raise ValueError(f"ModelConfig.conv_kernel_size={cfg.conv.kernel_size} (DeBERTa's convolution) needs "
                         "family='encoder', an odd width (the sequence keeps its length) and no shared_layers")
    if cfg.conv is not None and cfg.d_model % cfg.conv.groups:
        raise ValueError(f"ModelConfig.conv_groups={cfg.conv.groups} must divide d_model={cfg.d_model}")

def _check_layer_key_values(cfg: ModelConfig, standard: bool) -> None:
    """Gemma 4's full layers with attention of their own shape, and its layers reading another's keys and values."""
    scores = cfg.scores
    own_full = scores.full_head_dim is not None or scores.full_kv_heads is not None or scores.full_keys_as_values
    if own_full and (cfg.family != "decoder" or cfg.attention != "alternating" or not standard
                     or not {"full", "sliding"} <= set(local_pattern_kinds(cfg))):
        raise ValueError("ModelConfig.full_head_dim, full_kv_heads and full_keys_as_values shape the full layers of "
                         "an alternating decoder stack (beside its sliding ones) of standard attention, not "
                         f"family={cfg.family!r}, attention={cfg.attention!r}")
    if scores.full_kv_heads is not None and cfg.num_heads % scores.full_kv_heads:
        raise ValueError(f"ModelConfig.full_kv_heads={scores.full_kv_heads} must divide num_heads={cfg.num_heads}")
    if scores.kv_shared_d_ff is not None and not scores.kv_shared_layers:
        raise ValueError(f"ModelConfig.kv_shared_d_ff={scores.kv_shared_d_ff} sizes the MLP of the layers that "
                         "share keys and values: it needs kv_shared_layers > 0")
    cross = scores.cross_attention_layers
    if cross and (cfg.family != "decoder" or not standard or cfg.experts is not None or cfg.shared_layers
                  or cfg.linear_attention is not None or scores.kv_shared_layers or cross[-1] >= cfg.decoder_layers):
        raise ValueError(f"ModelConfig.cross_attention_layers={cross!r} (Llama 3.2 Vision) index the layers of a "
                         f"decoder of {cfg.decoder_layers} layers of standard attention, without experts, shared, "
                         "linear or kv-shared layers")
    if not scores.kv_shared_layers:
        return
    if cfg.family != "decoder" or not standard or cfg.position != "rope" or cfg.shared_layers \
            or cfg.linear_attention is not None or cfg.attention not in ("causal", "alternating"):
        raise ValueError(f"ModelConfig.kv_shared_layers={scores.kv_shared_layers} (Gemma 4) needs a rotary decoder "
                         "of standard attention, causal or alternating, without shared_layers or linear layers")
    first = cfg.decoder_layers - scores.kv_shared_layers
    kinds = local_pattern_kinds(cfg)
    if first < 1 or not set(kinds[first:]) <= set(kinds[:first]):
        raise ValueError(f"ModelConfig.kv_shared_layers={scores.kv_shared_layers}: the last layers read the keys and "
                         "values of an earlier layer of their kind (full or sliding), so each kind among them needs "
                         f"one among the first {max(first, 0)} of the {cfg.decoder_layers} layers")


def local_pattern_kinds(cfg: ModelConfig) -> tuple[str, ...]:
    """Each decoder layer's kind, 'full' or 'sliding' (any local pattern), as the layer plan places them."""
    if cfg.attention == "alternating":  # (as layer_plan.local_layers reads them: layer_types, else odd layers local)
        if cfg.layer_types is not None:
            return tuple("full" if t == "full" else "sliding" for t in cfg.layer_types)
        return tuple("sliding" if i % 2 else "full" for i in range(cfg.decoder_layers))
    return ("sliding" if cfg.attention == "sliding" else "full",) * cfg.decoder_layers


def _check_heads(cfg: ModelConfig) -> None:
    _one_of("head", cfg.head, HEADS)
    options = cfg.head_options
    if cfg.family == "encoder":
        if cfg.head not in ENCODER_HEADS:
            raise ValueError(f"ModelConfig.head={cfg.head!r} does not fit family='encoder'; "
                             f"expected one of {ENCODER_HEADS}")
        if cfg.head == "pretraining" and not options.pooler or (
                cfg.head == "sequence_classification" and not (options.pooler or options.prediction_head
                                                               or cfg.patches is not None)):
            raise ValueError(f"ModelConfig.head={cfg.head!r} reads the pooled output; set pooler=True")
    elif cfg.family == "encoder_decoder":
        _check_encoder_decoder_head(cfg)
    elif cfg.family == "dual_encoder":
        pass  # its head, 'contrastive', is checked with its image tower (_settle_vision)
    elif cfg.head not in ("none", "lm"):
        raise ValueError(f"ModelConfig.head={cfg.head!r} does not fit family={cfg.family!r}; "
                         "expected 'lm' or 'none'")
    if (options.prediction_head or options.classifier_pooling != "cls") and (
            cfg.family != "encoder" or options.pooler):
        raise ValueError("ModelConfig.prediction_head and classifier_pooling='mean' are ModernBERT's heads: they "
                         f"need family='encoder' without a pooler (family={cfg.family!r}, pooler={options.pooler})")
    if options.pooled_token is not None and (cfg.family not in ("encoder", "dual_encoder") or options.pooler):
        raise ValueError(f"ModelConfig.pooled_token={options.pooled_token!r} is a text tower's pooling: it needs "
                         f"family 'encoder' or 'dual_encoder' without BERT's pooler (family={cfg.family!r}, "
                         f"pooler={options.pooler})")
    if options.pooled_token == "eos" and not isinstance(cfg.tokens.eos, int):
        raise ValueError(f"ModelConfig.pooled_token='eos' pools at eos_token_id, which must be one id, not "
                         f"{cfg.tokens.eos!r}")
    if options.classifier_transform and (cfg.family != "encoder" or cfg.head != "sequence_classification"):
        raise ValueError("ModelConfig.classifier_transform=True is an encoder's sequence classifier's own dense "
                         f"layer: it needs family='encoder' and head='sequence_classification', not {cfg.family!r}, "
                         f"{cfg.head!r}")
    for field in ("span_feed_forward", "question_out_of_span"):
        if getattr(options, field) and (cfg.family != "encoder" or cfg.head != "question_answering"):
            raise ValueError(f"ModelConfig.{field}=True belongs to an encoder's span head: it needs family='encoder' "
                             f"and head='question_answering', not {cfg.family!r}, {cfg.head!r}")
    if options.question_out_of_span and cfg.tokens.sep is None:
        raise ValueError("ModelConfig.question_out_of_span=True finds the question's end at the first sep_token_id; "
                         "set sep_token_id")
    _non_negative("generator_width", cfg.generator_width)
    if cfg.generator_width:
        if cfg.family != "encoder" or cfg.head != "discriminator":
            raise ValueError("ModelConfig.generator_width is ELECTRA's generator, trained beside a discriminator: "
                             f"it needs family='encoder' and head='discriminator', not {cfg.family!r}, "
                             f"{cfg.head!r}")
        if cfg.generator_width % cfg.head_dim_ or cfg.generator_width > cfg.d_model:
            raise ValueError(f"ModelConfig.generator_width={cfg.generator_width} must be a multiple of the head "
                             f"size {cfg.head_dim_} (the generator keeps it) and at most d_model={cfg.d_model}")
    if cfg.shared_layers and (cfg.family != "encoder" or cfg.experts is not None):
        raise ValueError("ModelConfig.shared_layers=True (ALBERT's one set of layer weights) needs a dense "
                         f"family='encoder' model, not family={cfg.family!r}")
    if options.pooler and cfg.family != "encoder" and not (
            cfg.family == "encoder_decoder" and cfg.head == "sequence_classification"):
        raise ValueError(f"ModelConfig.pooler=True needs family='encoder' (or an encoder-decoder's "
                         f"sequence_classification head), not family={cfg.family!r}, head={cfg.head!r}")
    if cfg.logits.scale_tied and not (cfg.embeddings.tie and cfg.head == "lm"):
        raise ValueError("ModelConfig.scale_tied_logits=True needs tie_embeddings=True and head='lm'")
    for field, value in (("logits_bias", cfg.logits.fixed_bias), ("lm_head_bias", cfg.logits.trained_bias)):
        if value and cfg.head != "lm":
            raise ValueError(f"ModelConfig.{field}=True needs head='lm'")

def _check_encoder_decoder_head(cfg: ModelConfig) -> None:
    if cfg.head not in ENCODER_DECODER_HEADS:
        raise ValueError(f"ModelConfig.head={cfg.head!r} does not fit family='encoder_decoder'; "
                         f"expected one of {ENCODER_DECODER_HEADS}")
    eos, pad = cfg.tokens.eos, cfg.tokens.pad
    if cfg.head == "sequence_classification" and not cfg.head_options.pooler:
        raise ValueError("ModelConfig.head='sequence_classification' of an encoder-decoder reads the pooled "
                         "output (dense -> tanh of the decoder state at the last EOS); set pooler=True")
    if cfg.head == "sequence_classification" and (isinstance(eos, bool) or not isinstance(eos, int)):
        raise ValueError(f"ModelConfig.head='sequence_classification' of an encoder-decoder pools at the last "
                         f"eos_token_id of each row; it needs one id, not {eos!r}")
    if cfg.tokens.wrap_decoder_start and (cfg.head not in ("sequence_classification", "question_answering")
                                           or pad is None):
        raise ValueError("ModelConfig.wrap_decoder_start=True (mBART) derives decoder inputs for the "
                         "sequence_classification and question_answering heads from the last non-pad token: it "
                         f"needs one of those heads and a pad_token_id (head={cfg.head!r}, pad_token_id={pad})")

def _check_experts(cfg: ModelConfig) -> None:
    experts = cfg.experts
    if experts is None:
        return
    if cfg.family != "decoder":
        raise ValueError(f"ModelConfig.num_experts={experts.count} is supported for family='decoder', not "
                         f"{cfg.family!r}")
    if experts.dense_layers >= cfg.decoder_layers:
        raise ValueError(f"ModelConfig.dense_layers={experts.dense_layers} must be < decoder_layers="
                         f"{cfg.decoder_layers} (the remaining layers hold the experts)")
    if experts.beside_dense and (cfg.norms.position != "pre" or cfg.parallel is not None):
        raise ValueError("ModelConfig.experts_beside_dense=True (the experts beside a dense MLP, each branch normed) "
                         f"is built for pre-norm sequential blocks, not norm_position={cfg.norms.position!r}"
                         + (" with parallel_residual" if cfg.parallel is not None else ""))
    if experts.hash_layers and (experts.layer_step > 1
                                or experts.dense_layers + experts.hash_layers > cfg.decoder_layers):
        raise ValueError(f"ModelConfig.hash_layers={experts.hash_layers} must count expert layers that follow the "
                         f"dense_layers={experts.dense_layers}, within decoder_layers={cfg.decoder_layers} (and "
                         f"moe_layer_step=1, not {experts.layer_step})")
    if experts.layer_step > 1 and (experts.dense_layers or cfg.decoder_layers % experts.layer_step):
        raise ValueError(f"ModelConfig.moe_layer_step={experts.layer_step} interleaves dense and expert layers "
                         f"in periods: it needs dense_layers=0 and decoder_layers={cfg.decoder_layers} a "
                         "multiple of it")

def _check_compressed_attention(cfg: ModelConfig) -> None:
    """DeepSeek-V4's compressed attention and hyper-connections, as its layers build them."""
    part, hyper = cfg.scores.compressed, cfg.norms.hyper_connections
    if hyper is not None and (cfg.family != "decoder" or cfg.norms.position != "pre" or cfg.parallel is not None):
        raise ValueError(f"ModelConfig.hc_streams={hyper.streams} (hyper-connections) is built for a decoder of "
                         "pre-norm sequential blocks")
    if hyper is not None:
        ignored = {"sandwich_norm": cfg.norms.sandwich, "experts_beside_dense": cfg.experts is not None and
                   cfg.experts.beside_dense, "per_layer_input_size": bool(cfg.embeddings.per_layer_width)}
        if any(ignored.values()):
            raise ValueError(f"ModelConfig.hc_streams (hyper-connections) joins each sublayer's plain output: "
                             f"{[name for name, on in ignored.items() if on]} cannot be combined with it")
    if cfg.experts is not None and cfg.experts.hash_layers and part is None:
        raise ValueError(f"ModelConfig.hash_layers={cfg.experts.hash_layers} (token-id routed experts) is built "
                         "with compressed attention's layer groups (DeepSeek-V4) only")
    if part is None:
        return
    ignored = {"qk_norm": cfg.query_key_norm is not None, "attention_softcap": cfg.scores.softcap is not None,
               "nope_layers": cfg.nope is not None, "query_position_scale": cfg.scores.position_scale is not None,
               "attention_dropout_rate": bool(cfg.attention_dropout_rate),
               "dense_layers": cfg.experts is not None and bool(cfg.experts.dense_layers)}
    if any(ignored.values()):
        raise ValueError(f"ModelConfig.compressed_layers (DeepSeek-V4's attention) does not take "
                         f"{[name for name, on in ignored.items() if on]}")
    if cfg.family != "decoder" or len(part.layers) != cfg.decoder_layers:
        raise ValueError(f"ModelConfig.compressed_layers gives {len(part.layers)} kinds: it needs a decoder with as "
                         f"many layers (decoder_layers={cfg.decoder_layers}, family={cfg.family!r})")
    rotary = cfg.rotary
    if rotary is None or not rotary.interleave or rotary.dim is None or rotary.dim % 2:
        raise ValueError("ModelConfig.compressed_layers rotates each head's trailing rotary_dim numbers in adjacent "
                         "pairs: it needs position='rope', rope_interleave=True and an even rotary_dim")
    if rotary.dim > min(cfg.head_dim_, part.index_head_dim):
        raise ValueError(f"ModelConfig.rotary_dim={rotary.dim} must fit in head_dim={cfg.head_dim_} and "
                         f"compressed_index_head_dim={part.index_head_dim}")
    if cfg.attention != "sliding" or cfg.window_size is None or not cfg.scores.sinks or cfg.num_kv_heads != 1:
        raise ValueError("ModelConfig.compressed_layers attend over a sliding window with sinks, one key-value head: "
                         "they need attention='sliding', a window_size, attention_sinks=True and num_kv_heads=1")
    if (cfg.num_heads * cfg.head_dim_) % part.out_groups:
        raise ValueError(f"ModelConfig.compressed_out_groups={part.out_groups} must divide num_heads * head_dim = "
                         f"{cfg.num_heads * cfg.head_dim_}")


def _check_tokens(cfg: ModelConfig) -> None:
    tokens = cfg.tokens
    for field, value in (("pad_token_id", tokens.pad), ("bos_token_id", tokens.bos),
                         ("decoder_start_token_id", tokens.decoder_start), ("sep_token_id", tokens.sep)):
        if value is not None and not 0 <= value < cfg.vocab_size:
            raise ValueError(f"ModelConfig.{field}={value} must lie in [0, vocab_size={cfg.vocab_size})")
    if any(e is not None and not 0 <= e < cfg.vocab_size for e in tokens.eos_ids):
        raise ValueError(f"ModelConfig.eos_token_id={tokens.eos} must lie in [0, vocab_size={cfg.vocab_size})")
    if tokens.wrap_decoder_start and cfg.family != "encoder_decoder":
        raise ValueError(f"ModelConfig.wrap_decoder_start=True (mBART's decoder inputs) needs "
                         f"family='encoder_decoder', not {cfg.family!r}")

def _check_numerics(cfg: ModelConfig) -> None:
    _one_of("dtype", cfg.dtype, DTYPES)
    _one_of("param_dtype", cfg.param_dtype, DTYPES)
    if not cfg.init_std > 0:
        raise ValueError(f"ModelConfig.init_std={cfg.init_std!r} must be > 0")
    _rate("dropout_rate", cfg.dropout_rate)
    _rate("attention_dropout_rate", cfg.attention_dropout_rate)
    _finite_positive("residual_multiplier", cfg.residual_multiplier)


def _check_adapters(cfg: ModelConfig) -> None:
    lora = cfg.lora
    if lora is None:
        return
    expert_targets = [t for t in lora.targets if t in ("wi", "wi_gate", "wo") or t.startswith("experts.")]
    if lora.dropout and cfg.experts is not None and expert_targets:
        raise ValueError(f"ModelConfig.lora_dropout={lora.dropout} cannot reach the experts' adapters "
                         f"(merged into each expert's kernel for the dispatch), which lora_targets {expert_targets} "
                         "name; use lora_dropout=0 or target 'mlp.*' / 'shared_experts.*' only")



def _to_flat(cfg: ModelConfig) -> dict[str, Any]:
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in GROUPS}
    for name, path in FLAT.items():
        out[name] = _read_path(cfg, path, name)
    out.update(qk_norm=cfg.query_key_norm is not None, parallel_residual=cfg.parallel is not None,
               index_relative_bias=cfg.relative_bias is not None and cfg.position != "relative")
    return out


# (export's round trips compare the same configs' flat forms again and again; ``to_flat`` hands out copies)
_cached_flat = functools.lru_cache(maxsize=1024)(_to_flat)


def _fields_from_flat(data: dict[str, Any]) -> dict[str, Any]:
    top = {f.name for f in dataclasses.fields(ModelConfig) if f.name not in GROUPS}
    unknown = set(data) - top - set(FLAT) - set(PRESENCE_KEYS)
    if unknown:
        raise ValueError(f"ModelConfig has no field(s) {sorted(unknown)}")
    flat = {**{name: _flat_default(name) for name in FLAT}, **dict.fromkeys(PRESENCE_KEYS, False),
            "position": ModelConfig.position, **data}
    fields = {name: flat[name] for name in top if name in flat}
    if flat["router_aux_loss_coef"] < 0:  # checked on a dense model too, as it always was
        raise ValueError(f"ModelConfig.router_aux_loss_coef={flat['router_aux_loss_coef']!r} must be >= 0")
    _rate("lora_dropout", flat["lora_dropout"])
    for group in GROUPS:
        fields[group] = _part(group, flat, data)
    return fields


def _read_path(cfg: ModelConfig, path: tuple[str, ...], name: str) -> Any:
    value = cfg
    for step in path:
        value = getattr(value, step)
        if value is None and step != path[-1]:
            return OFF[name] if name in OFF else _flat_default(name)
    return value


def _flat_part(group: str, value: Any, position: str) -> dict[str, Any]:
    """The flat names of one part given in nested form (None: the part absent)."""
    if group in PRESENCE_KEYS.values():
        key = next(k for k, g in PRESENCE_KEYS.items() if g == group)
        present = {key: value is not None}
        if group == "relative_bias":
            present = {key: value is not None and position != "relative"}
    else:
        present = {}
    if value is None:
        return {**present, **{name: OFF[name] for name, path in FLAT.items() if path[0] == group and name in OFF}}
    flat = dict(present)
    for name, path in FLAT.items():
        if path[0] == group:
            part = value if len(path) == 2 else getattr(value, path[1])
            flat[name] = getattr(part, path[-1]) if part is not None else OFF.get(name, _flat_default(name))
    return flat


def _part(group: str, flat: dict, given: dict) -> Any:
    """The sub-config ``group`` of a model spelled ``flat`` (``given``: what the caller set), or None if absent."""
    names = [name for name, path in FLAT.items() if path[0] == group]
    if group in OPTIONAL_GROUPS and not _present(group, flat):
        for name in names:
            if name in given and name not in _INERT_WHEN_ABSENT and _as_tuple(given[name]) != _off_value(name):
                raise ValueError(f"ModelConfig.{name}={given[name]!r} needs {_NEEDS[group](flat)}")
        return None
    values = {FLAT[name][1]: flat[name] for name in names if len(FLAT[name]) == 2}
    if group == "norms":  # hyper-connections, the block's residual wiring, are there when they have streams
        values["hyper_connections"] = (HyperConnections(flat["hc_streams"], flat["hc_sinkhorn_iters"], flat["hc_eps"])
                                       if flat["hc_streams"] != 0 else None)
        if values["hyper_connections"] is None:
            _refuse_without(("norms", "hyper_connections"), "hc_streams", given)
    if group == "scores":  # compressed attention is there when it gives the layers' kinds
        names = [name for name, path in FLAT.items() if path[:2] == ("scores", "compressed")]
        values["compressed"] = (CompressedAttention(**{FLAT[name][2]: flat[name] for name in names})
                                if flat["compressed_layers"] else None)
        if values["compressed"] is None:
            _refuse_without(("scores", "compressed"), "compressed_layers", given)
    if group == "latent":  # the indexer, a part of latent attention, is there when it has heads
        values["indexer"] = (Indexer(flat["index_heads"], flat["index_head_dim"], flat["index_topk"],
                                     flat["index_rope_interleave"], flat["index_query_from_input"])
                             if flat["index_heads"] != 0 else None)
        if flat["index_heads"] == 0 and given.get("index_rope_interleave"):
            raise ValueError("ModelConfig.index_rope_interleave=True needs index_heads > 0 (the indexer it rotates)")
    return GROUPS[group](**values)


def _refuse_without(part: tuple[str, str], key: str, given: dict) -> None:
    """A setting of a nested part given while the part is absent (``key`` unset) would be dropped: refused."""
    for name, path in FLAT.items():
        if path[:2] == part and name != key and name in given and _as_tuple(given[name]) != _off_value(name):
            raise ValueError(f"ModelConfig.{name}={given[name]!r} needs {key} (the part it sets is absent)")


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value  # JSON and YAML hand tuples back as lists


def _off_value(name: str) -> Any:
    return OFF[name] if name in OFF else _flat_default(name)


@functools.cache
def flat_type_hints() -> dict[str, Any]:
    """The type of each top-level field and flat name (the presence keys are bools)."""
    hints = {name: hint for name, hint in typing.get_type_hints(ModelConfig).items() if name not in GROUPS}
    for name, path in FLAT.items():
        part = NESTED.get(path[:2]) or GROUPS[path[0]]
        hints[name] = typing.get_type_hints(part)[path[-1]]
    return {**hints, **dict.fromkeys(PRESENCE_KEYS, bool)}
