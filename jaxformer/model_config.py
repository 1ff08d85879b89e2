"""ModelConfig: one frozen, validated description of every architecture jaxformer builds.

Components are chosen by fields, not by subclasses: a BERT, a GPT-2, a LLaMA, a T5 and the 2017
Transformer differ only in the values below. Every check runs in ``__post_init__`` so that a bad
config fails where it is written, naming the field, the value and what would be valid.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

FAMILIES = ("encoder", "decoder", "encoder_decoder")
NORMS = ("layernorm", "rmsnorm")
# pre: x + f(norm(x)); post: norm(x + f(x)) (BERT, 2017); output: x + norm(f(x)) (OLMo-2)
NORM_POSITIONS = ("pre", "post", "output")
QK_NORM_SPANS = ("head", "projection")
# the gated ones: swiglu (silu gate), geglu (tanh-form gelu gate: T5 v1.1, Gemma), geglu_erf (exact gelu: ModernBERT)
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_erf")
GATED_ACTIVATIONS = ("swiglu", "geglu", "geglu_erf")
CLASSIFIER_POOLINGS = ("cls", "mean")
POSITIONS = ("sinusoidal", "learned", "rope", "relative", "xl", "disentangled")
# sinusoidal positions: the 2017 paper's (sin and cos interleaved) or fairseq's (M2M-100, NLLB: all sines then
# all cosines, frequencies 10000^(-i / (D/2 - 1)), the pad id's row zero)
SINUSOID_LAYOUTS = ("transformer", "fairseq", "marian")  # interleaved; M2M-100's halves; Marian/Pegasus' halves
DISENTANGLED_TERMS = ("c2p", "p2c")  # DeBERTa: content-to-position, position-to-content
CONV_ACTIVATIONS = ("tanh", "relu", "gelu", "gelu_tanh", "silu")
ATTENTION_PATTERNS = ("bidirectional", "causal", "prefix", "sliding", "alternating")
LAYER_TYPES = ("full", "sliding", "chunked")
ROPE_SCALINGS = ("linear", "llama3", "yarn", "dynamic", "longrope")
ROUTER_SCORES = ("softmax", "sigmoid")
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
)
POOLER_ACTIVATIONS = ("tanh", "relu", "gelu")
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


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture, numerics and compilation choices of one model.

    Layer counts: an encoder uses ``encoder_layers``, a decoder ``decoder_layers``, an
    encoder-decoder both. ``attention`` is the self-attention pattern of the decoder side; encoder
    self-attention is always bidirectional.

    Precision policy (the one place it is stated; jaxformer.layers follows it):
    - ``param_dtype`` is how parameters are stored; optimizer state follows the parameters.
      Training keeps float32 master parameters (``train.compute_dtype`` changes ``dtype`` only).
    - ``dtype`` is the compute dtype: weights are cast to it where they are used, and matmul
      inputs and activations between layers are in it.
    - Always float32, whatever ``dtype``: attention scores, bias and softmax (matmuls accumulate into
      float32), norms, rotary angles, the MoE router's softmax, logits' loss (the objectives cast).
    - Inference in bfloat16 or float16 sets both (``jf.from_pretrained(path, dtype="bfloat16")``,
      ``jf.build(name, dtype=..., param_dtype=...)``), halving the bytes a decode step reads.
    """

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

    norm: str = "layernorm"
    norm_position: str = "pre"
    norm_eps: float = 1e-5
    norm_bias: bool = True  # layernorm only; rmsnorm has no bias
    norm_scale_offset: float = 0.0  # the norm multiplies by (offset + scale): Gemma stores scale - 1 (offset 1.0)
    sandwich_norm: bool = False  # pre-norm plus a norm of each sublayer's output before the residual (Gemma 2/3)
    embedding_norm: bool = False  # a norm right after the embeddings (BERT, BART)
    first_attn_norm: bool = True  # False: the first layer's attention reads its input unnormed (ModernBERT)
    final_norm: bool = True  # a norm after the last block (pre-norm stacks)

    activation: str = "gelu"
    # gpt-oss's clamped SwiGLU: the gate clamped to <= limit, the up projection to [-limit, limit], and
    # gate * sigmoid(swiglu_alpha * gate) * (up + 1); None: plain SwiGLU (swiglu_alpha is then the gate's gain)
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.0

    position: str = "learned"
    max_positions: int = 1024  # longest sequence; learned/sinusoidal tables hold this many rows
    position_offset: int = 0  # rows before position 0 in a learned table (RoBERTa, BART use 2)
    pad_aware_positions: bool = False  # RoBERTa: positions count non-pad tokens; pads use row pad_token_id
    sinusoids: str = "transformer"  # position="sinusoidal": the layout (SINUSOID_LAYOUTS)
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    local_rope_theta: float | None = None  # sliding-window layers' own rotary base, unscaled (Gemma 3); None: rope_theta
    relative_buckets: int = 32  # T5 relative position bias
    relative_max_distance: int = 128
    # position="relative": each layer's self-attention has its own bias table (UMT5), not one per stack (T5)
    relative_bias_per_layer: bool = False
    # a T5 relative bias beside absolute positions (MPNet, bidirectional): one table for the stack, its
    # distances counted between token indices 0..T-1 whatever the position ids
    index_relative_bias: bool = False
    # Transformer-XL (position="xl"): sinusoidal encodings of key-query distances inside attention, with
    # learned global content and position biases (u, v); decoder family only.
    memory_len: int = 0  # segment memory: each layer's inputs of the last memory_len tokens (0: none)
    clamp_len: int = 0  # distances beyond clamp_len use clamp_len's encoding (0: no clamp)
    shared_relative_biases: bool = False  # one u and v for all layers (Transformer-XL) or per layer (XLNet untie_r)
    relative_segments: bool = False  # XLNet: token types enter attention as same/different-segment biases
    # DeBERTa (position="disentangled"): a score adds, to content . content, the query's content against the key's
    # relative position (c2p) and the key's content against the query's (p2c), each term's position vectors from
    # one table of 2 * span relative-position embeddings [span = position_buckets or max_relative_positions]
    # projected per layer; the scale is (head_dim * (1 + terms)) ** -0.5.
    disentangled_terms: tuple[str, ...] = ("c2p", "p2c")
    max_relative_positions: int = 0  # distances are clamped to +-this (0: max_positions)
    position_buckets: int = 0  # >0: distances beyond half of it share log-spaced buckets (DeBERTa v2/v3)
    share_attention_key: bool = False  # positions projected by the layer's own q and k (v2/v3), not their own
    relative_embedding_norm: bool = False  # the relative table is layer-normed before use (v2/v3 norm_rel_ebd)
    position_biased_input: bool = False  # disentangled positions also add a learned absolute table to the input

    attention: str = "causal"
    window_size: int | None = None  # sliding and alternating-local attention: keys in (t - w, t]
    # 'alternating': which layers are 'full' and which 'sliding' (Gemma: layer_types) or 'chunked' (Llama 4);
    # None: GPT-3's, odd layers sliding. An encoder-decoder's encoder follows the same list with keys within w
    # of the query either side.
    layer_types: tuple[str, ...] | None = None
    # 'chunked' layers: the sequence is cut into chunks of this many positions and a query sees the keys of its
    # own chunk up to itself (Llama 4's local layers)
    attention_chunk_size: int | None = None
    # layers without rotary positions (NoPE; Llama 4 every fourth): their queries and keys are not rotated, and
    # qk_norm applies to the rotated layers only
    nope_layers: tuple[int, ...] = ()
    # attention temperature on the NoPE layers (Llama 4): queries x (1 + temperature_scale * log1p(floor((i + 1) /
    # temperature_floor_scale))), i the token's index in the sequence, pads included (as transformers counts it)
    temperature_floor_scale: int | None = None
    temperature_scale: float = 0.1
    attention_scale: float | None = None  # None: head_dim ** -0.5 (T5 uses 1.0)
    inverse_layer_scale: bool = False  # GPT-2's scale_attn_by_inverse_layer_idx: layer i's scores also / (i + 1)
    attention_backend: str = "auto"  # auto | xla | cudnn | splash (jaxformer/kernels.py)
    attention_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the mask (Gemma 2)
    qk_norm: bool = False  # RMSNorm over each query and key head before rotary positions (Gemma 3, Qwen3)
    qk_norm_scale: bool = True  # that norm's learned scale; False: none (Llama 4's weightless norm)
    # what the query/key norm spans: each head (Gemma 3, Qwen3) or the whole projection, all heads at once (OLMo-2)
    qk_norm_span: str = "head"
    # attention sinks: a learned logit per head joins each softmax as one more key with no value, so a query
    # may give part of its attention to nothing (gpt-oss)
    attention_sinks: bool = False

    # Multi-head latent attention (DeepSeek-V2/V3), on when kv_lora_rank is set. Keys and values are
    # expanded per head from one shared latent of kv_lora_rank numbers per token (what a cache holds,
    # with one shared rotary key of rope_head_dim); head_dim is then the query/key part without
    # positions (qk_nope_head_dim), and the scale is (head_dim + rope_head_dim) ** -0.5.
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None  # MLA: a low-rank query projection through this width; None: a plain one
    rope_head_dim: int = 64  # MLA: the rotary part of each query and key head
    v_head_dim: int | None = None  # MLA: the value head size; None: head_dim
    # DeepSeek-V3.2's lightning indexer (on when index_heads > 0): a small scorer picks each query's index_topk
    # keys, and latent attention attends to those alone (DeepSeek sparse attention)
    index_heads: int = 0
    index_head_dim: int = 128
    index_topk: int = 2048
    rope_interleave: bool = False  # rotary pairs are adjacent (x0, x1), (x2, x3), as DeepSeek and GPT-J lay them out
    # partial rotary: only the first rotary_dim numbers of each query and key head rotate, the rest pass through
    # (GPT-NeoX's rotary_pct of the head, GPT-J's rotary_dim); None: the whole head (MLA: rope_head_dim)
    rotary_dim: int | None = None
    # attention and MLP read the same input and join the residual together, x + attn(norm(x)) + mlp(norm'(x))
    # (GPT-NeoX, GPT-J); with parallel_shared_norm both read one norm (GPT-J)
    parallel_residual: bool = False
    parallel_shared_norm: bool = False

    qkv_bias: bool = True
    key_bias: bool = True  # with qkv_bias: the key projection's (and DeBERTa's position key's) bias; v1 has none
    out_bias: bool = True
    mlp_bias: bool = True

    tie_embeddings: bool = True  # output projection shares the token embedding
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model) in the compute dtype (2017, Gemma)
    shared_embeddings: bool = True  # encoder-decoder: one token table for both sides (False: T5Gemma's two)
    scale_tied_logits: bool = False  # T5 v1.0: decoder output * d_model**-0.5 before tied head
    clamp_float16: bool = False  # T5: in float16, clamp each sublayer's output into range, as transformers does
    type_vocab_size: int = 0  # token-type (segment) embeddings; 0 for none
    # factorised embeddings (ALBERT, ELECTRA): the token, position and type tables and the embedding norm are
    # this wide, and a projection (with bias) takes them to d_model; an MLM head projects back to this width
    # before its tied output. None: the tables are d_model wide and nothing projects.
    embedding_size: int | None = None
    shared_layers: bool = False  # ALBERT: one layer's parameters, applied at every layer of the stack
    # DeBERTa v2's convolution beside the first layer: LayerNorm(layer output + act(conv(embeddings))), a 1-D
    # convolution over the sequence of this width (0: none) with ``conv_groups`` groups
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_activation: str = "tanh"
    # ELECTRA pretraining (the 'rtd' objective): a discriminator also holds the generator it trains beside, an MLM
    # encoder this wide (heads and d_ff scaled alike, same depth) reading the discriminator's token, position and
    # type embeddings; 0: none. Export writes the discriminator alone (``model.generator`` saves on its own).
    generator_width: int = 0
    logits_bias: bool = False  # a fixed (non-trained) bias on the LM logits (BART's final_logits_bias)
    lm_head_bias: bool = False  # a trained bias on the LM logits (XLNet's lm_loss.bias)
    logits_softcap: float | None = None  # LM logits -> cap * tanh(logits / cap) (Gemma 2)

    head: str = "lm"
    pooler: bool = False  # BERT pooler: tanh(dense(h[:, 0]))
    # the pooler's nonlinearity: tanh (BERT, RoBERTa), relu (DistilBERT) or exact gelu (ELECTRA's classifier)
    pooler_activation: str = "tanh"
    # ModernBERT: the sequence, token and span classifiers read dense -> activation -> norm of their input first
    # (the MLM head's transform); the sequence classifier's input is the first token or the real tokens' mean
    prediction_head: bool = False
    classifier_pooling: str = "cls"
    # DeBERTa's MLM head is stored as cls.predictions (transformers' legacy=True) or lm_predictions.lm_head (the
    # enhanced mask decoder's head): the same numbers under two names, kept so a file is written back as it came
    mlm_head_legacy: bool = True
    head_bias: bool = True  # the bias of the heads' dense transform (MLM, ModernBERT's prediction head)
    mlm_bias: bool = True  # the MLM head's output bias (ModernBERT's decoder_bias)
    num_labels: int = 2
    label_names: tuple[str, ...] = ()  # classification heads: the name of each label id (HF's id2label); () unnamed

    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0

    num_experts: int = 0  # 0: dense FFN; >0: top-k mixture of experts (Mixtral, DeepSeekMoE)
    experts_per_token: int = 2
    expert_d_ff: int | None = None  # a routed expert's hidden size; None: d_ff
    shared_experts: int = 0  # always-on experts (DeepSeekMoE): one gated MLP of shared_experts * expert_d_ff
    shared_expert_gate: bool = False  # the shared experts' output times sigmoid(x . w_gate) per token (Qwen2-MoE)
    dense_layers: int = 0  # the first layers keep a dense MLP of d_ff (DeepSeek's first_k_dense_replace)
    # every moe_layer_step-th layer holds the experts, the others a dense MLP of d_ff (Llama 4 Maverick's
    # interleave_moe_layer_step: layers step-1, 2 step-1, ...); 1: every layer past dense_layers
    moe_layer_step: int = 1
    router_score: str = "softmax"  # softmax over experts (Mixtral, DeepSeek-V2) or per-expert sigmoid (V3)
    router_groups: int = 1  # experts split into groups; a token first picks router_topk_groups of them
    router_topk_groups: int = 1  # (group score: best expert under softmax, sum of the best two under sigmoid)
    router_bias: bool = False  # V3: a per-expert bias added for selection only, moved by balancing, not gradients
    router_logit_bias: bool = False  # a trained bias on the router logits, like any linear layer's (gpt-oss)
    expert_bias: bool = False  # each routed expert's projections carry biases (gpt-oss)
    normalize_router_weights: bool = True  # the k chosen weights are divided by their sum
    router_weights_on_input: bool = False  # a chosen expert's weight multiplies its input, not its output (Llama 4)
    routed_scaling: float = 1.0  # the routed experts' output is scaled by this (DeepSeek routed_scaling_factor)
    router_aux_loss_coef: float = 0.0
    router_aux_loss: str = "batch"  # batch: Switch/Mixtral over all tokens; sequence: DeepSeek-V3, per row
    # grouped: tokens sorted into blocks by expert, only the chosen run (GSPMD partitions it under a mesh);
    # all_to_all: grouped, with tokens sent to their experts' devices under an expert mesh axis;
    # dense: every expert on every token; auto: all_to_all unless every expert is chosen anyway (then dense)
    moe_dispatch: str = "auto"

    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    decoder_start_token_id: int | None = None  # first decoder token of encoder-decoder generation
    # mBART: decoder inputs derived from input_ids (the classification and span heads' default) start with each
    # row's last non-pad token (its language code), not decoder_start_token_id
    wrap_decoder_start: bool = False

    dtype: str = "float32"  # compute dtype; softmax, norms and losses always run in float32 (see above)
    param_dtype: str = "float32"
    scan_layers: bool = True
    remat: str = "none"
    # Under a ``stage`` mesh axis (pipeline parallelism, ``layers/pipeline.py``): the microbatches a full pass
    # cuts its rows into (0: one per stage) and the chunks each stage holds (1: GPipe; more: the circular
    # schedule, each stage holding every S-th chunk of L / (S x repeats) layers). No effect without the axis.
    pipeline_microbatches: int = 0
    pipeline_repeats: int = 1
    init_std: float = 0.02

    # LoRA adapters (jaxformer/layers/weights.py): rank 0 builds none
    lora_rank: int = 0
    lora_alpha: float = 8.0
    lora_targets: tuple[str, ...] = ()  # LORA_PROJECTIONS, alone or as "sublayer.name" (LORA_SUBLAYERS)
    lora_dropout: float = 0.0  # on the adapter's input only
    lora_rslora: bool = False  # scale by alpha / sqrt(rank) instead of alpha / rank
    lora_trainable: tuple[str, ...] = ()  # parameter paths ('/'-joined) trained in full with the adapters (PEFT's modules_to_save)
    # int8 projection kernels: 'int8' multiplies in dtype (weight-only), 'int8_dynamic' in int8 (CPU)
    quantize: str | None = None
    quantize_embeddings: bool = False  # the token table (and so a tied LM head) int8 too, per vocab row

    def __post_init__(self):
        _one_of("family", self.family, FAMILIES)
        for field in ("vocab_size", "d_model", "num_heads", "d_ff", "max_positions", "num_labels"):
            _positive(field, getattr(self, field))
        _non_negative("encoder_layers", self.encoder_layers)
        _non_negative("decoder_layers", self.decoder_layers)
        _non_negative("position_offset", self.position_offset)
        _non_negative("type_vocab_size", self.type_vocab_size)
        need_encoder = self.family in ("encoder", "encoder_decoder")
        need_decoder = self.family in ("decoder", "encoder_decoder")
        if need_encoder != (self.encoder_layers > 0):
            raise ValueError(
                f"ModelConfig.encoder_layers={self.encoder_layers} does not fit family={self.family!r}: "
                f"{'must be > 0' if need_encoder else 'must be 0'}")
        if need_decoder != (self.decoder_layers > 0):
            raise ValueError(
                f"ModelConfig.decoder_layers={self.decoder_layers} does not fit family={self.family!r}: "
                f"{'must be > 0' if need_decoder else 'must be 0'}")

        if self.head_dim is None:
            if self.d_model % self.num_heads:
                raise ValueError(
                    f"ModelConfig.num_heads={self.num_heads} does not divide d_model={self.d_model}; "
                    "choose a divisor or set head_dim explicitly")
        else:
            _positive("head_dim", self.head_dim)
        if self.num_kv_heads is not None:
            _positive("num_kv_heads", self.num_kv_heads)
            if self.num_heads % self.num_kv_heads:
                raise ValueError(
                    f"ModelConfig.num_kv_heads={self.num_kv_heads} does not divide num_heads="
                    f"{self.num_heads}; valid: a divisor of {self.num_heads}")

        _one_of("norm", self.norm, NORMS)
        if self.norm_scale_offset not in (0.0, 1.0):
            raise ValueError(f"ModelConfig.norm_scale_offset={self.norm_scale_offset!r} must be 0.0 or 1.0 (Gemma)")
        if self.sandwich_norm and self.norm_position != "pre":
            raise ValueError("ModelConfig.sandwich_norm=True adds output norms to a pre-norm block; set "
                             f"norm_position='pre', not {self.norm_position!r}")
        _one_of("norm_position", self.norm_position, NORM_POSITIONS)
        if not self.norm_eps > 0:
            raise ValueError(f"ModelConfig.norm_eps={self.norm_eps!r} must be > 0")
        _one_of("activation", self.activation, ACTIVATIONS)
        if self.swiglu_limit is not None or self.swiglu_alpha != 1.0:
            if self.activation != "swiglu":
                raise ValueError(f"ModelConfig.swiglu_limit / swiglu_alpha shape a SwiGLU; activation is "
                                 f"{self.activation!r}, not 'swiglu'")
            if self.swiglu_limit is not None and not self.swiglu_limit > 0:
                raise ValueError(f"ModelConfig.swiglu_limit={self.swiglu_limit!r} must be > 0")
            if not self.swiglu_alpha > 0:
                raise ValueError(f"ModelConfig.swiglu_alpha={self.swiglu_alpha!r} must be > 0")
        _one_of("position", self.position, POSITIONS)
        if self.position == "rope":
            if self.kv_lora_rank is None and self.head_dim_ % 2:
                raise ValueError(f"rotary positions need an even head_dim, got {self.head_dim_}")
            if not self.rope_theta > 0:
                raise ValueError(f"ModelConfig.rope_theta={self.rope_theta!r} must be > 0")
        if self.local_rope_theta is not None:
            if self.position != "rope" or self.attention != "alternating" or not self.local_rope_theta > 0:
                raise ValueError(f"ModelConfig.local_rope_theta={self.local_rope_theta!r} is the rotary base of "
                                 "the sliding layers: it needs position='rope', attention='alternating' and a value > 0")
        if self.rope_scaling is not None:
            if self.position != "rope":
                raise ValueError(f"ModelConfig.rope_scaling is set but position={self.position!r}, not 'rope'")
            if isinstance(self.rope_scaling, dict):  # YAML and JSON hand us plain mappings
                object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
            if not isinstance(self.rope_scaling, RopeScaling):
                raise ValueError(f"ModelConfig.rope_scaling={self.rope_scaling!r} must be a RopeScaling")
            kind, pairs = self.rope_scaling.kind, self.rope_dim // 2
            if kind == "longrope" and len(self.rope_scaling.short_factor) != pairs:
                raise ValueError(f"RopeScaling longrope has {len(self.rope_scaling.short_factor)} factors but the "
                                 f"rotated head width {self.rope_dim} has {pairs} frequency pairs")
            if kind == "dynamic" and self.rope_dim <= 2:
                raise ValueError(f"RopeScaling dynamic raises the base to H / (H - 2); the rotated width "
                                 f"{self.rope_dim} must be > 2")
        if self.position == "relative" or self.index_relative_bias:
            _positive("relative_buckets", self.relative_buckets)
            _positive("relative_max_distance", self.relative_max_distance)
            if self.relative_buckets < 4:
                raise ValueError(f"ModelConfig.relative_buckets={self.relative_buckets} must be >= 4")
        if self.relative_bias_per_layer and self.position != "relative":
            raise ValueError(f"ModelConfig.relative_bias_per_layer=True needs position='relative', not {self.position!r}")
        if self.index_relative_bias and (self.family != "encoder" or self.position not in ("learned", "sinusoidal")):
            raise ValueError("ModelConfig.index_relative_bias=True (MPNet) adds a relative bias beside absolute "
                             f"positions in an encoder; family={self.family!r}, position={self.position!r}")

        _non_negative("memory_len", self.memory_len)
        _non_negative("clamp_len", self.clamp_len)
        if self.position == "xl":
            if self.family != "decoder" or self.attention not in ("causal", "bidirectional"):
                raise ValueError("ModelConfig.position='xl' (Transformer-XL relative attention) needs family='decoder' "
                                 f"and attention 'causal' or 'bidirectional', not {self.family!r} and {self.attention!r}")
            if self.num_kv_heads not in (None, self.num_heads) or self.num_experts:
                raise ValueError("ModelConfig.position='xl' supports multi-head attention with a dense MLP: leave "
                                 "num_kv_heads None and num_experts 0")
            if self.type_vocab_size:
                raise ValueError("ModelConfig.type_vocab_size: Transformer-XL models take token types as relative "
                                 "segments (relative_segments=True), not as embeddings")
        else:
            xl_only = {"memory_len": 0, "clamp_len": 0, "shared_relative_biases": False, "relative_segments": False}
            for field, off in xl_only.items():
                if getattr(self, field) != off:
                    raise ValueError(f"ModelConfig.{field}={getattr(self, field)!r} needs position='xl' "
                                     "(Transformer-XL relative attention)")
        self._check_disentangled()
        _one_of("attention", self.attention, ATTENTION_PATTERNS)
        if self.family == "encoder" and self.attention not in ("bidirectional", "alternating"):
            raise ValueError(
                f"ModelConfig.attention={self.attention!r} does not fit family='encoder'; encoders attend "
                "'bidirectional', or 'alternating' (full layers and layers within window_size either side: ModernBERT)")
        if self.family != "encoder" and self.attention == "bidirectional" and self.position != "xl":
            raise ValueError(
                f"ModelConfig.attention='bidirectional' does not fit family={self.family!r}; valid: "
                "'causal', 'prefix', 'sliding', 'alternating' (or position='xl': XLNet's bidirectional form)")
        if self.family == "encoder_decoder" and self.attention not in ("causal", "sliding", "alternating"):
            raise ValueError(
                f"ModelConfig.attention={self.attention!r} does not fit family='encoder_decoder'; "
                "the decoder attends 'causal', 'sliding' or 'alternating'")
        chunked = self.attention == "alternating" and "chunked" in (self.layer_types or ())
        if chunked:
            if self.family != "decoder" or self.window_size is not None:
                raise ValueError("ModelConfig.layer_types with 'chunked' layers (Llama 4) needs family='decoder' and "
                                 "window_size None (the chunk is attention_chunk_size)")
            _positive("attention_chunk_size", self.attention_chunk_size)
        elif self.attention_chunk_size is not None:
            raise ValueError(f"ModelConfig.attention_chunk_size={self.attention_chunk_size} is set but no layer is "
                             "'chunked' (attention='alternating' with 'chunked' in layer_types)")
        if self.attention in ("sliding", "alternating") and not chunked:
            if self.window_size is None:
                raise ValueError(f"ModelConfig.attention={self.attention!r} needs window_size (a positive int)")
            _positive("window_size", self.window_size)
        elif self.window_size is not None:
            raise ValueError(
                f"ModelConfig.window_size={self.window_size} is set but attention={self.attention!r}; "
                "set attention='sliding' or 'alternating', or window_size=None")
        if self.layer_types is not None:
            if isinstance(self.layer_types, list):  # YAML and JSON hand us lists
                object.__setattr__(self, "layer_types", tuple(self.layer_types))
            if self.attention != "alternating":
                raise ValueError(f"ModelConfig.layer_types is set but attention={self.attention!r}; it lists the "
                                 "'full' and 'sliding' (or 'chunked') layers of attention='alternating'")
            wrong = sorted({t for t in self.layer_types if t not in LAYER_TYPES}, key=str)
            if wrong:
                raise ValueError(f"ModelConfig.layer_types holds {wrong}; each entry must be one of {LAYER_TYPES}")
            if {"sliding", "chunked"} <= set(self.layer_types):
                raise ValueError("ModelConfig.layer_types mixes 'sliding' and 'chunked' layers; a stack has one kind "
                                 "of local layer")
            counts = ({self.encoder_layers} if self.family == "encoder" else
                      {self.decoder_layers} | ({self.encoder_layers} if self.family == "encoder_decoder" else set()))
            if len(counts) > 1 or len(self.layer_types) not in counts:
                raise ValueError(f"ModelConfig.layer_types has {len(self.layer_types)} entries; it needs one per layer "
                                 f"({max(counts)}; an encoder-decoder's two stacks share it, so both need "
                                 "that many layers)")
        for field in ("attention_softcap", "logits_softcap"):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"ModelConfig.{field}={value!r} must be a finite number > 0 (or None: no capping)")
        if self.qk_norm and (self.mla or self.position == "xl"):
            raise ValueError("ModelConfig.qk_norm=True needs standard attention (not kv_lora_rank or position='xl')")
        if not self.shared_embeddings and self.family != "encoder_decoder":
            raise ValueError(f"ModelConfig.shared_embeddings=False (separate encoder and decoder token tables) needs "
                             f"family='encoder_decoder', not {self.family!r}")
        _one_of("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        if self.kv_lora_rank is not None:
            _positive("kv_lora_rank", self.kv_lora_rank)
            if self.q_lora_rank is not None:
                _positive("q_lora_rank", self.q_lora_rank)
            _positive("rope_head_dim", self.rope_head_dim)
            if self.v_head_dim is not None:
                _positive("v_head_dim", self.v_head_dim)
            if self.family != "decoder" or self.position != "rope":
                raise ValueError("ModelConfig.kv_lora_rank (multi-head latent attention) needs family='decoder' "
                                 f"and position='rope', not {self.family!r} and {self.position!r}")
            if self.rope_head_dim % 2:
                raise ValueError(f"ModelConfig.rope_head_dim={self.rope_head_dim} must be even")
            if self.kv_heads != self.num_heads:
                raise ValueError(f"ModelConfig.num_kv_heads={self.num_kv_heads}: multi-head latent attention "
                                 "expands keys and values for every head; leave num_kv_heads None")
            if self.qkv_bias:
                raise ValueError("ModelConfig.qkv_bias=True is not supported with multi-head latent attention")
            if self.index_heads:
                for field in ("index_heads", "index_head_dim", "index_topk"):
                    _positive(field, getattr(self, field))
                if self.q_lora_rank is None:
                    raise ValueError("ModelConfig.index_heads (DeepSeek-V3.2's indexer) reads the compressed query: it "
                                     "needs q_lora_rank")
                if not self.rope_head_dim <= self.index_head_dim:
                    raise ValueError(f"ModelConfig.index_head_dim={self.index_head_dim} must hold the rotary part "
                                     f"(rope_head_dim={self.rope_head_dim})")
        else:
            if self.index_heads:
                raise ValueError("ModelConfig.index_heads (DeepSeek-V3.2's indexer) needs kv_lora_rank (multi-head "
                                 "latent attention)")
            for field, off in {"q_lora_rank": None, "v_head_dim": None}.items():
                if getattr(self, field) != off:
                    raise ValueError(f"ModelConfig.{field}={getattr(self, field)!r} needs kv_lora_rank "
                                     "(multi-head latent attention)")
        if self.rope_interleave and self.position != "rope":
            raise ValueError(f"ModelConfig.rope_interleave=True needs position='rope', not {self.position!r}")
        if self.rotary_dim is not None:
            if self.position != "rope" or self.mla:
                raise ValueError("ModelConfig.rotary_dim (partial rotary) needs position='rope' and standard "
                                 "attention (latent attention sets its rotary width with rope_head_dim)")
            if not (isinstance(self.rotary_dim, int) and 0 < self.rotary_dim <= self.head_dim_
                    and self.rotary_dim % 2 == 0):
                raise ValueError(f"ModelConfig.rotary_dim={self.rotary_dim!r} must be an even integer in "
                                 f"(0, head_dim={self.head_dim_}]")
        if self.parallel_shared_norm and not self.parallel_residual:
            raise ValueError("ModelConfig.parallel_shared_norm=True needs parallel_residual=True")
        if self.parallel_residual and (self.norm_position != "pre" or self.family != "decoder" or self.sandwich_norm
                                       or self.position == "xl"):
            raise ValueError("ModelConfig.parallel_residual=True needs a pre-norm decoder without sandwich norms or "
                             "Transformer-XL memory")
        if self.inverse_layer_scale and (self.mla or self.position == "xl"):
            raise ValueError("ModelConfig.inverse_layer_scale scales standard self-attention; multi-head latent and "
                             "Transformer-XL attention do not take it")
        if isinstance(self.nope_layers, list):  # YAML and JSON hand us lists
            object.__setattr__(self, "nope_layers", tuple(self.nope_layers))
        if self.nope_layers:
            if self.position != "rope" or self.mla or self.family != "decoder":
                raise ValueError("ModelConfig.nope_layers leaves some layers of a rotary decoder unrotated; it needs "
                                 "family='decoder', position='rope' and standard attention")
            if sorted(set(self.nope_layers)) != list(self.nope_layers) or not all(
                    isinstance(i, int) and 0 <= i < self.decoder_layers for i in self.nope_layers):
                raise ValueError(f"ModelConfig.nope_layers={self.nope_layers!r} must list distinct layer indices in "
                                 f"[0, {self.decoder_layers}) in increasing order")
        if self.temperature_floor_scale is not None:
            _positive("temperature_floor_scale", self.temperature_floor_scale)
            if not self.nope_layers:
                raise ValueError("ModelConfig.temperature_floor_scale tunes the NoPE layers' attention; set nope_layers")
            if not self.temperature_scale > 0:
                raise ValueError(f"ModelConfig.temperature_scale={self.temperature_scale!r} must be > 0")
        _one_of("qk_norm_span", self.qk_norm_span, QK_NORM_SPANS)
        if self.qk_norm_span != "head" and not self.qk_norm:
            raise ValueError(f"ModelConfig.qk_norm_span={self.qk_norm_span!r} shapes the query/key norm; it needs "
                             "qk_norm=True")
        if self.norm_position == "output" and (self.family != "decoder" or self.position == "xl"):
            raise ValueError("ModelConfig.norm_position='output' (OLMo-2: x + norm(f(x))) needs family='decoder' "
                             f"without Transformer-XL memory, not family={self.family!r}, position={self.position!r}")
        if not self.qk_norm_scale and not self.qk_norm:
            raise ValueError("ModelConfig.qk_norm_scale=False shapes the query/key norm; it needs qk_norm=True")
        if self.attention_sinks and (self.mla or self.position == "xl"):
            raise ValueError("ModelConfig.attention_sinks=True joins standard attention's softmax; multi-head latent "
                             "and Transformer-XL attention do not take it")
        if self.attention_scale is not None and not self.attention_scale > 0:
            raise ValueError(f"ModelConfig.attention_scale={self.attention_scale!r} must be > 0")

        _one_of("head", self.head, HEADS)
        if self.family == "encoder":
            if self.head not in ENCODER_HEADS:
                raise ValueError(f"ModelConfig.head={self.head!r} does not fit family='encoder'; "
                                 f"expected one of {ENCODER_HEADS}")
            if self.head == "pretraining" and not self.pooler or (
                    self.head == "sequence_classification" and not (self.pooler or self.prediction_head)):
                raise ValueError(f"ModelConfig.head={self.head!r} reads the pooled output; set pooler=True")
        elif self.family == "encoder_decoder":
            self._check_encoder_decoder_head()
        elif self.head not in ("none", "lm"):
            raise ValueError(f"ModelConfig.head={self.head!r} does not fit family={self.family!r}; "
                             "expected 'lm' or 'none'")
        if isinstance(self.label_names, list):  # JSON hands us a list
            object.__setattr__(self, "label_names", tuple(self.label_names))
        if self.label_names and len(self.label_names) != self.num_labels:
            raise ValueError(f"ModelConfig.label_names holds {len(self.label_names)} names for num_labels="
                             f"{self.num_labels}; give one name per label, or none")
        _one_of("pooler_activation", self.pooler_activation, POOLER_ACTIVATIONS)
        _one_of("classifier_pooling", self.classifier_pooling, CLASSIFIER_POOLINGS)
        if (self.prediction_head or self.classifier_pooling != "cls") and (self.family != "encoder" or self.pooler):
            raise ValueError("ModelConfig.prediction_head and classifier_pooling='mean' are ModernBERT's heads: they "
                             f"need family='encoder' without a pooler (family={self.family!r}, pooler={self.pooler})")
        if not self.first_attn_norm and (self.norm_position != "pre" or self.family != "encoder"
                                         or self.shared_layers or self.encoder_layers < 2):
            raise ValueError("ModelConfig.first_attn_norm=False drops the first layer's pre-attention norm "
                             "(ModernBERT): it needs family='encoder', norm_position='pre', two or more layers and no "
                             f"shared_layers (family={self.family!r}, norm_position={self.norm_position!r})")
        if self.embedding_size is not None:
            _positive("embedding_size", self.embedding_size)
            if self.family != "encoder":
                raise ValueError(f"ModelConfig.embedding_size factorises an encoder's embeddings (ALBERT, ELECTRA); "
                                 f"family={self.family!r} does not take it")
        _non_negative("generator_width", self.generator_width)
        if self.generator_width:
            if self.family != "encoder" or self.head != "discriminator":
                raise ValueError("ModelConfig.generator_width is ELECTRA's generator, trained beside a discriminator: "
                                 f"it needs family='encoder' and head='discriminator', not {self.family!r}, "
                                 f"{self.head!r}")
            if self.generator_width % self.head_dim_ or self.generator_width > self.d_model:
                raise ValueError(f"ModelConfig.generator_width={self.generator_width} must be a multiple of the head "
                                 f"size {self.head_dim_} (the generator keeps it) and at most d_model={self.d_model}")
        if self.shared_layers and (self.family != "encoder" or self.num_experts):
            raise ValueError("ModelConfig.shared_layers=True (ALBERT's one set of layer weights) needs a dense "
                             f"family='encoder' model, not family={self.family!r}")
        if self.pooler and self.family != "encoder" and not (
                self.family == "encoder_decoder" and self.head == "sequence_classification"):
            raise ValueError(f"ModelConfig.pooler=True needs family='encoder' (or an encoder-decoder's "
                             f"sequence_classification head), not family={self.family!r}, head={self.head!r}")
        if self.wrap_decoder_start and self.family != "encoder_decoder":
            raise ValueError(f"ModelConfig.wrap_decoder_start=True (mBART's decoder inputs) needs "
                             f"family='encoder_decoder', not {self.family!r}")
        if self.scale_tied_logits and not (self.tie_embeddings and self.head == "lm"):
            raise ValueError("ModelConfig.scale_tied_logits=True needs tie_embeddings=True and head='lm'")

        _rate("dropout_rate", self.dropout_rate)
        _rate("attention_dropout_rate", self.attention_dropout_rate)

        _non_negative("num_experts", self.num_experts)
        if self.num_experts:
            if self.family != "decoder":
                raise ValueError(f"ModelConfig.num_experts={self.num_experts} is supported for "
                                 f"family='decoder', not {self.family!r}")
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise ValueError(
                    f"ModelConfig.experts_per_token={self.experts_per_token} must lie in "
                    f"[1, num_experts={self.num_experts}]")
            for field in ("shared_experts", "dense_layers"):
                _non_negative(field, getattr(self, field))
            if self.expert_d_ff is not None:
                _positive("expert_d_ff", self.expert_d_ff)
            if self.dense_layers >= self.decoder_layers:
                raise ValueError(f"ModelConfig.dense_layers={self.dense_layers} must be < decoder_layers="
                                 f"{self.decoder_layers} (the remaining layers hold the experts)")
            _positive("moe_layer_step", self.moe_layer_step)
            if self.moe_layer_step > 1 and (self.dense_layers or self.decoder_layers % self.moe_layer_step):
                raise ValueError(f"ModelConfig.moe_layer_step={self.moe_layer_step} interleaves dense and expert layers "
                                 f"in periods: it needs dense_layers=0 and decoder_layers={self.decoder_layers} a "
                                 "multiple of it")
            _one_of("router_score", self.router_score, ROUTER_SCORES)
            _positive("router_groups", self.router_groups)
            _positive("router_topk_groups", self.router_topk_groups)
            if self.num_experts % self.router_groups:
                raise ValueError(f"ModelConfig.router_groups={self.router_groups} does not divide num_experts="
                                 f"{self.num_experts}")
            if self.router_topk_groups > self.router_groups:
                raise ValueError(f"ModelConfig.router_topk_groups={self.router_topk_groups} must be <= "
                                 f"router_groups={self.router_groups}")
            per_group = self.num_experts // self.router_groups
            if self.router_topk_groups * per_group < self.experts_per_token:
                raise ValueError(
                    f"ModelConfig.router_topk_groups={self.router_topk_groups} groups of {per_group} experts "
                    f"hold fewer than experts_per_token={self.experts_per_token}")
            if self.router_groups > 1 and self.router_score == "sigmoid" and per_group < 2:
                raise ValueError("ModelConfig.router_groups: sigmoid routing scores a group by its best two "
                                 "experts, so each group needs at least 2")
            if not (isinstance(self.routed_scaling, (int, float)) and math.isfinite(self.routed_scaling)
                    and self.routed_scaling > 0):
                raise ValueError(f"ModelConfig.routed_scaling={self.routed_scaling!r} must be a finite number > 0")
            _one_of("router_aux_loss", self.router_aux_loss, ROUTER_AUX_LOSSES)
            _one_of("moe_dispatch", self.moe_dispatch, MOE_DISPATCHES)
            if self.shared_expert_gate and not self.shared_experts:
                raise ValueError("ModelConfig.shared_expert_gate=True gates the shared experts; it needs "
                                 "shared_experts > 0")
        else:
            moe_only = {"expert_d_ff": None, "shared_experts": 0, "dense_layers": 0, "moe_layer_step": 1,
                        "router_bias": False,
                        "shared_expert_gate": False, "router_logit_bias": False, "expert_bias": False,
                        "router_weights_on_input": False}
            for field, off in moe_only.items():
                if getattr(self, field) != off:
                    raise ValueError(f"ModelConfig.{field}={getattr(self, field)!r} needs num_experts > 0")
        if self.router_aux_loss_coef < 0:
            raise ValueError(f"ModelConfig.router_aux_loss_coef={self.router_aux_loss_coef!r} must be >= 0")

        for field in ("pad_token_id", "bos_token_id", "decoder_start_token_id"):
            value = getattr(self, field)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"ModelConfig.{field}={value} must lie in [0, vocab_size={self.vocab_size})")
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        eos = self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)
        if any(e is not None and not 0 <= e < self.vocab_size for e in eos):
            raise ValueError(f"ModelConfig.eos_token_id={self.eos_token_id} must lie in [0, vocab_size={self.vocab_size})")
        if self.pad_aware_positions and (self.pad_token_id is None or self.position not in ("learned", "sinusoidal")
                                         or self.position_offset <= self.pad_token_id):
            raise ValueError("ModelConfig.pad_aware_positions=True needs learned or sinusoidal positions, a "
                             "pad_token_id, and position_offset > pad_token_id (RoBERTa: pad_token_id=1, "
                             "position_offset=2)")
        _one_of("sinusoids", self.sinusoids, SINUSOID_LAYOUTS)
        if self.sinusoids != "transformer" and self.position != "sinusoidal":
            raise ValueError(f"ModelConfig.sinusoids={self.sinusoids!r} lays out sinusoidal positions; position is "
                             f"{self.position!r}")
        for field in ("logits_bias", "lm_head_bias"):
            if getattr(self, field) and self.head != "lm":
                raise ValueError(f"ModelConfig.{field}=True needs head='lm'")

        _one_of("dtype", self.dtype, DTYPES)
        _one_of("param_dtype", self.param_dtype, DTYPES)
        _one_of("remat", self.remat, REMAT_POLICIES)
        _non_negative("pipeline_microbatches", self.pipeline_microbatches)
        if self.pipeline_repeats < 1:
            raise ValueError(f"ModelConfig.pipeline_repeats={self.pipeline_repeats} must be >= 1 (1: GPipe)")
        if not self.init_std > 0:
            raise ValueError(f"ModelConfig.init_std={self.init_std!r} must be > 0")
        self._check_adapters()

    def _check_encoder_decoder_head(self) -> None:
        if self.head not in ENCODER_DECODER_HEADS:
            raise ValueError(f"ModelConfig.head={self.head!r} does not fit family='encoder_decoder'; "
                             f"expected one of {ENCODER_DECODER_HEADS}")
        if self.head == "sequence_classification" and not self.pooler:
            raise ValueError("ModelConfig.head='sequence_classification' of an encoder-decoder reads the pooled "
                             "output (dense -> tanh of the decoder state at the last EOS); set pooler=True")
        if self.head == "sequence_classification" and (isinstance(self.eos_token_id, bool)
                                                       or not isinstance(self.eos_token_id, int)):
            raise ValueError(f"ModelConfig.head='sequence_classification' of an encoder-decoder pools at the last "
                             f"eos_token_id of each row; it needs one id, not {self.eos_token_id!r}")
        if self.wrap_decoder_start and (self.head not in ("sequence_classification", "question_answering")
                                        or self.pad_token_id is None):
            raise ValueError("ModelConfig.wrap_decoder_start=True (mBART) derives decoder inputs for the "
                             "sequence_classification and question_answering heads from the last non-pad token: it "
                             f"needs one of those heads and a pad_token_id (head={self.head!r}, "
                             f"pad_token_id={self.pad_token_id})")

    def _check_adapters(self) -> None:
        for field in ("lora_targets", "lora_trainable"):
            if isinstance(getattr(self, field), (list, str)):  # YAML and JSON hand us lists
                value = getattr(self, field)
                object.__setattr__(self, field, (value,) if isinstance(value, str) else tuple(value))
        _non_negative("lora_rank", self.lora_rank)
        _rate("lora_dropout", self.lora_dropout)
        if self.lora_rank and not self.lora_targets:
            raise ValueError(f"ModelConfig.lora_rank={self.lora_rank} needs lora_targets: projection names from "
                             f"{LORA_PROJECTIONS}, alone or as sublayer.name with a sublayer from {LORA_SUBLAYERS}")
        if self.lora_targets and not self.lora_rank:
            raise ValueError("ModelConfig.lora_targets is set but lora_rank=0; give the adapters a rank > 0")
        check_lora_targets(self.lora_targets, "ModelConfig.lora_targets")
        if self.lora_rank and not self.lora_alpha > 0:
            raise ValueError(f"ModelConfig.lora_alpha={self.lora_alpha!r} must be > 0")
        expert_targets = [t for t in self.lora_targets if t in ("wi", "wi_gate", "wo") or t.startswith("experts.")]
        if self.lora_dropout and self.num_experts and expert_targets:
            raise ValueError(f"ModelConfig.lora_dropout={self.lora_dropout} cannot reach the experts' adapters "
                             f"(merged into each expert's kernel for the dispatch), which lora_targets {expert_targets} "
                             "name; use lora_dropout=0 or target 'mlp.*' / 'shared_experts.*' only")
        if self.quantize is not None:
            _one_of("quantize", self.quantize, QUANTIZATIONS)
        if self.quantize_embeddings and self.quantize is None:
            raise ValueError("ModelConfig.quantize_embeddings=True needs quantize set (one of "
                             f"{QUANTIZATIONS}): the table takes that kind, not None")

    def _check_disentangled(self) -> None:
        """DeBERTa's fields: disentangled positions and the convolution beside the first layer."""
        if isinstance(self.disentangled_terms, list):  # YAML and JSON hand us lists
            object.__setattr__(self, "disentangled_terms", tuple(self.disentangled_terms))
        _non_negative("max_relative_positions", self.max_relative_positions)
        _non_negative("position_buckets", self.position_buckets)
        if self.position == "disentangled":
            terms = self.disentangled_terms
            if not terms or len(set(terms)) != len(terms) or not set(terms) <= set(DISENTANGLED_TERMS):
                raise ValueError(f"ModelConfig.disentangled_terms={terms!r} must name distinct terms among "
                                 f"{DISENTANGLED_TERMS} (at least one)")
            if self.family != "encoder" or self.num_kv_heads not in (None, self.num_heads) or self.mla:
                raise ValueError("ModelConfig.position='disentangled' (DeBERTa) needs family='encoder' with "
                                 f"multi-head attention (family={self.family!r}, num_kv_heads={self.num_kv_heads})")
            if self.position_buckets and not self.relative_span // 2 < self.max_relative_distance - 1:
                raise ValueError(f"ModelConfig.position_buckets={self.position_buckets} spaces buckets up to "
                                 f"max_relative_positions={self.max_relative_distance}, which must exceed half the "
                                 "buckets plus one")
        else:
            deberta_only = {"max_relative_positions": 0, "position_buckets": 0, "share_attention_key": False,
                            "relative_embedding_norm": False, "position_biased_input": False}
            for field, off in deberta_only.items():
                if getattr(self, field) != off:
                    raise ValueError(f"ModelConfig.{field}={getattr(self, field)!r} needs position='disentangled' "
                                     "(DeBERTa)")
        _non_negative("conv_kernel_size", self.conv_kernel_size)
        if self.conv_kernel_size:
            if self.family != "encoder" or self.conv_kernel_size % 2 == 0 or self.shared_layers:
                raise ValueError(f"ModelConfig.conv_kernel_size={self.conv_kernel_size} (DeBERTa's convolution) "
                                 "needs family='encoder', an odd width (the sequence keeps its length) and no "
                                 "shared_layers")
            _positive("conv_groups", self.conv_groups)
            if self.d_model % self.conv_groups:
                raise ValueError(f"ModelConfig.conv_groups={self.conv_groups} must divide d_model={self.d_model}")
            _one_of("conv_activation", self.conv_activation, CONV_ACTIVATIONS)

    # Derived sizes: properties, so there is one source of truth and replace() never goes stale.
    @property
    def head_dim_(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_heads

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Which layers of an 'alternating' stack attend locally (within the window, or Llama 4's chunk):
        ``layer_types``, or GPT-3's odd layers. An encoder-decoder's stacks have equal depth whenever
        layer_types is given."""
        if self.layer_types is not None:
            return tuple(t != "full" for t in self.layer_types)
        return tuple(i % 2 == 1 for i in range(max(self.decoder_layers, self.encoder_layers)))

    @property
    def dense_layer_ids(self) -> tuple[int, ...]:
        """The decoder layers of a mixture-of-experts model that keep a dense MLP: the first ``dense_layers``,
        or those outside every ``moe_layer_step``-th (none without experts)."""
        if not self.num_experts:
            return ()
        if self.moe_layer_step > 1:
            return tuple(i for i in range(self.decoder_layers) if (i + 1) % self.moe_layer_step)
        return tuple(range(self.dense_layers))

    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def rope_dim(self) -> int:
        """Width of the rotated part of a query/key head: all of it, ``rotary_dim``, or MLA's rope_head_dim."""
        return self.rope_head_dim if self.mla else self.rotary_dim or self.head_dim_

    @property
    def value_dim(self) -> int:
        return self.v_head_dim if self.v_head_dim is not None else self.head_dim_

    @property
    def expert_width(self) -> int:
        return self.expert_d_ff if self.expert_d_ff is not None else self.d_ff

    @property
    def relative_span(self) -> int:
        """DeBERTa: half the rows of the relative-position table (distances -span .. span - 1 after bucketing)."""
        return self.position_buckets or self.max_relative_distance

    @property
    def max_relative_distance(self) -> int:
        """DeBERTa: the largest distance told apart (its log buckets reach it): max_relative_positions, else max_positions."""
        return self.max_relative_positions or self.max_positions

    @property
    def scale(self) -> float:
        if self.attention_scale is not None:
            return self.attention_scale
        if self.position == "disentangled":  # DeBERTa divides by sqrt(head_dim * (1 + position terms))
            return 1.0 / math.sqrt(self.head_dim_ * (1 + len(self.disentangled_terms)))
        scale = 1.0 / math.sqrt(self.head_dim_ + (self.rope_head_dim if self.mla else 0))
        s = self.rope_scaling
        if self.mla and s is not None and s.mscale_all_dim:  # DeepSeek's yarn softmax correction
            scale *= _yarn_mscale(s.factor, s.mscale_all_dim) ** 2
        return scale

    @property
    def num_layers(self) -> int:
        return self.encoder_layers + self.decoder_layers

    def generator_config(self) -> "ModelConfig":
        """ELECTRA's generator of this discriminator (``generator_width``): as deep, its heads of the same size,
        d_ff scaled with the width, its embeddings those of the discriminator (projected when widths differ)."""
        width, scale = self.generator_width, self.generator_width / self.d_model
        embedding = self.embedding_size or self.d_model
        return self.replace(d_model=width, num_heads=width // self.head_dim_, num_kv_heads=None, head_dim=None,
                            d_ff=max(1, round(self.d_ff * scale)), head="mlm", pooler=False, generator_width=0,
                            embedding_size=None if embedding == width else embedding, name=f"{self.name}-generator")

    def replace(self, **changes: Any) -> "ModelConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"ModelConfig has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"ModelConfig has no field(s) {sorted(unknown)}")
        return cls(**data)
