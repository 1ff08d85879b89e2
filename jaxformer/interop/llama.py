"""LLaMA and Mistral (``llama``, ``mistral``): RMSNorm, rotary positions, a SwiGLU MLP, grouped-query attention
and an untied head; Mistral's layers each see a window of ``sliding_window`` keys. Config and tensor rules, both
directions.

The decoders that differ from LLaMA by a few keys or tensors build on the public pieces here: the config.json
keys they all say alike (``decoder_config``, ``decoder_to_hf``), a layer's attention and norms and its gated
MLP (``attention_rules``, ``norm_rules``, ``gated_mlp_rules``, ``fused_gated_mlp_rules``) and the model around
the layers (``decoder_rules``). Each keeps its own differences: Mixtral (interop/mixtral.py), Qwen2, Qwen3 and
their MoEs (interop/qwen.py), Phi-3 (interop/phi3.py), GLM and GLM-4 (interop/glm.py)."""

from __future__ import annotations

from typing import Any, Callable

from jaxformer.layer_plan import dense_layers
from jaxformer.model_config import ModelConfig, RopeScaling
from jaxformer.interop.rules import (INVERSE_GATED, Architecture, Rule, activation, attention, copy, fused_linear,
                                     linear, lm_head, rope_from_hf, rope_to_hf)

# What a file that leaves a key out means: transformers' config-class defaults for the keys read below
# (checked against the classes' own fields by tests/test_config_reading.py), and the rotary base.
COMMON_DEFAULTS = dict(hidden_act="silu", tie_word_embeddings=False, attention_dropout=0.0, bos_token_id=1,
                       eos_token_id=2)
DEFAULTS = {
    "llama": dict(COMMON_DEFAULTS, num_key_value_heads=None, max_position_embeddings=2048, rms_norm_eps=1e-6,
                  attention_bias=False, mlp_bias=False),
    "mistral": dict(COMMON_DEFAULTS, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-6,
                    sliding_window=4096),
}
DEFAULT_THETA = 1e4
STEMS = {"llama": "Llama", "mistral": "Mistral"}  # the classes' names: LlamaModel, LlamaForCausalLM
# One layer's tensor rules: block(its stack's path, the file's name of layer {i}, whether its MLP is experts).
Block = Callable[[tuple[str, ...], str, bool], list[Rule]]


def head_dim(hf: dict, heads: int) -> int | None:
    """An explicit head_dim, or None where it is the derived hidden_size / heads (transformers 5 writes that
    one out; a published file leaves it out or null): both files are one model."""
    width = hf.get("head_dim")
    return None if width == hf["hidden_size"] // heads else width


def every_layer_window(hf: dict) -> int | None:
    """The window every layer sees (Mistral, Mixtral, Phi-3: ``sliding_window``, null for none)."""
    return None if hf.get("sliding_window") is None else int(hf["sliding_window"])


def decoder_config(hf: dict, model_type: str, arch: str, rope: tuple[float, RopeScaling | None],
                   window: int | None = None) -> dict[str, Any]:
    """The ModelConfig fields every file of LLaMA's lineage says alike: the sizes, RMSNorm, a gated MLP,
    rotary positions (``rope``: base and scaling as read), causal attention or a ``window`` on every layer,
    and the biases of ``attention_bias`` (q, k, v, o) and ``mlp_bias``."""
    heads = hf["num_attention_heads"]
    theta, scaling = rope
    bias = bool(hf.get("attention_bias", False))
    return dict(family="decoder", d_model=hf["hidden_size"], num_heads=heads,
                num_kv_heads=hf["num_key_value_heads"] or heads, head_dim=head_dim(hf, heads),
                d_ff=hf["intermediate_size"], decoder_layers=hf["num_hidden_layers"], norm="rmsnorm",
                norm_eps=hf["rms_norm_eps"], norm_bias=False,
                activation=activation(hf["hidden_act"], True, model_type), position="rope",
                rope_theta=theta, rope_scaling=scaling, max_positions=hf["max_position_embeddings"],
                attention="causal" if window is None else "sliding", window_size=window, qkv_bias=bias,
                out_bias=bias, mlp_bias=bool(hf.get("mlp_bias", False)), tie_embeddings=hf["tie_word_embeddings"],
                head="none" if arch.endswith("Model") else "lm",
                attention_dropout_rate=hf.get("attention_dropout", 0.0),
                qk_norm=False)


def decoder_to_hf(cfg: ModelConfig, out: dict) -> None:
    """The config.json keys ``decoder_config`` reads, but the biases and the window, which each type says
    its own way (or not at all)."""
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
               head_dim=cfg.head_dim_, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.decoder_layers,
               rms_norm_eps=cfg.norms.eps, hidden_act=INVERSE_GATED[cfg.activation],
               max_position_embeddings=cfg.max_positions, rope_parameters=rope_to_hf(cfg),
               tie_word_embeddings=cfg.embeddings.tie, attention_dropout=cfg.attention_dropout_rate)
    out.pop("rope_theta", None)
    out.pop("rope_scaling", None)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    rope = rope_from_hf(hf, DEFAULT_THETA)
    return decoder_config(hf, model_type, arch, rope, every_layer_window(hf) if model_type == "mistral" else None)


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    decoder_to_hf(cfg, out)
    if model_type == "llama":
        out.update(attention_bias=cfg.biases.qkv, mlp_bias=False)
    else:  # Mistral's file has no biases to say
        out["sliding_window"] = cfg.window_size


def attention_rules(cfg: ModelConfig, S: tuple[str, ...], a: str) -> list[Rule]:
    """A layer's q, k, v and o projections (and their biases, where ``cfg`` has them) under the module ``a``."""
    return attention(cfg, S + ("attn",), f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight",
                     f"{a}.o_proj.weight", f"{a}.q_proj.bias", f"{a}.k_proj.bias", f"{a}.v_proj.bias",
                     f"{a}.o_proj.bias")


def norm_rules(S: tuple[str, ...], layer: str) -> list[Rule]:
    """The RMSNorms before attention and before the MLP."""
    return [copy(S + ("attn_norm", "scale"), f"{layer}.input_layernorm.weight"),
            copy(S + ("mlp_norm", "scale"), f"{layer}.post_attention_layernorm.weight")]


def gated_mlp_rules(cfg: ModelConfig, S: tuple[str, ...], m: str) -> list[Rule]:
    """The gated MLP's three matrices, gate_proj, up_proj and down_proj, under the module ``m``."""
    if cfg.biases.mlp:
        # jaxformer's gated MLP has one input bias (on the up projection); HF has one on each.
        raise ValueError("llama: mlp_bias=True is not supported")
    mlp = S + ("mlp",)
    return [linear(mlp + ("wi_gate",), f"{m}.gate_proj.weight"), linear(mlp + ("wi",), f"{m}.up_proj.weight"),
            linear(mlp + ("wo",), f"{m}.down_proj.weight")]


def fused_gated_mlp_rules(S: tuple[str, ...], m: str) -> list[Rule]:
    """A gated MLP whose gate and up projections are one tensor, gate first (Phi-3's and GLM's gate_up_proj)."""
    mlp = S + ("mlp",)
    return [fused_linear([mlp + ("wi_gate",), mlp + ("wi",)], f"{m}.gate_up_proj.weight"),
            linear(mlp + ("wo",), f"{m}.down_proj.weight")]


def decoder_rules(cfg: ModelConfig, prefix: str, block: Block) -> tuple[list[Rule], dict[str, str]]:
    """The model's tensor rules: the token embeddings, ``block``'s rules for every layer (in the stack
    ``blocks``, and DeepSeek-style ``dense_blocks`` for the first layers where dense layers precede the
    experts), the final norm and the LM head."""
    p = prefix
    layer = f"{p}layers.{{i}}"
    k, n = len(dense_layers(cfg)), cfg.decoder_layers
    out = [copy(("embed", "table"), f"{p}embed_tokens.weight"),
           copy(("decoder", "final_norm", "scale"), f"{p}norm.weight")]
    if k:
        out += [rule.in_layers(0, k) for rule in block(("decoder", "dense_blocks"), layer, False)]
    experts = cfg.experts is not None
    out += [rule.in_layers(k, n) if k else rule for rule in block(("decoder", "blocks"), layer, experts)]
    head, aliases = lm_head(cfg, f"{p}embed_tokens.weight")
    return out + head, aliases


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        return [*attention_rules(cfg, S, f"{layer}.self_attn"), *norm_rules(S, layer),
                *gated_mlp_rules(cfg, S, f"{layer}.mlp")]

    return decoder_rules(cfg, prefix, block)


def architecture(stems: dict[str, str], config_from_hf: Callable, config_to_hf: Callable, rules: Callable,
                 **options: Any) -> Architecture:
    """The ``Architecture`` of LLaMA-like types, each with its classes ``{stem}Model`` and
    ``{stem}ForCausalLM`` (which nests the base model's tensors under ``model.``)."""
    classes = {model_type: (f"{stem}Model", f"{stem}ForCausalLM") for model_type, stem in stems.items()}
    return Architecture(classes, {model_type: "model." for model_type in stems},
                        tuple(f"{stem}Model" for stem in stems.values()), config_from_hf, config_to_hf, rules,
                        **options)


ARCHITECTURE = architecture(STEMS, config_from_hf, config_to_hf, rules,
                            harmless={"pretraining_tp": "transformers 5 never reads it"}, defaults=DEFAULTS)
