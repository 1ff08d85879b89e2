"""LLaMA and its relatives (``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``mixtral``, ``phi3``,
``qwen2_moe``, ``qwen3_moe``, ``glm``, ``glm4``; GLM: half of each head rotating in adjacent pairs, GLM-4
with Gemma-style output norms): RMSNorm, rotary positions, gated MLPs or experts (Mixtral's, and the Qwen
MoEs' softmax top-k with their first layers dense and Qwen2-MoE's gated shared expert), GQA, Qwen3's RMSNorm
over each query and key head, Phi-3's fused qkv and gate/up tensors; config and tensor rules, both
directions."""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (PRETRAINED_LENGTH, Architecture, Rule, activation, attention, copy, fused_heads_in,
                                     fused_linear, heads_out, linear, lm_head, partial_rope_from_hf, refuse,
                                     rope_from_hf, rope_to_hf, rotary_width, stacked_experts)

STEMS = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "mixtral": "Mixtral",
         "phi3": "Phi3", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "glm": "Glm", "glm4": "Glm4"}
GLM = ("glm", "glm4")
QWEN = ("qwen2", "qwen3", "qwen2_moe")  # the window only under use_sliding_window, sliding from max_window_layers
QWEN_MOE = ("qwen2_moe", "qwen3_moe")
CLASSES = {model_type: (f"{stem}Model", f"{stem}ForCausalLM") for model_type, stem in STEMS.items()}


# What a file that leaves a key out means: transformers' config-class defaults for the keys read below
# (checked against the classes' own fields by tests/test_config_reading.py); the rotary base too.
_COMMON = dict(hidden_act="silu", tie_word_embeddings=False, attention_dropout=0.0, bos_token_id=1, eos_token_id=2)
DEFAULTS = {
    "llama": dict(_COMMON, num_key_value_heads=None, max_position_embeddings=2048, rms_norm_eps=1e-6,
                  attention_bias=False, mlp_bias=False),
    "mistral": dict(_COMMON, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-6,
                    sliding_window=4096),
    "mixtral": dict(_COMMON, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
                    sliding_window=None, num_local_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.001,
                    router_jitter_noise=0.0),
    "qwen2": dict(_COMMON, bos_token_id=None, eos_token_id=None, num_key_value_heads=32,
                  max_position_embeddings=32768, rms_norm_eps=1e-6,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=28),
    "phi3": dict(_COMMON, eos_token_id=32000, pad_token_id=32000, num_key_value_heads=None,
                 max_position_embeddings=4096, original_max_position_embeddings=4096, rms_norm_eps=1e-5,
                 sliding_window=None, resid_pdrop=0.0),
    "qwen2_moe": dict(_COMMON, bos_token_id=None, eos_token_id=None, num_key_value_heads=16, qkv_bias=True,
                      max_position_embeddings=32768, rms_norm_eps=1e-6, use_sliding_window=False, sliding_window=4096,
                      max_window_layers=28, decoder_sparse_step=1, mlp_only_layers=None, num_experts=60,
                      num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                      norm_topk_prob=False, router_aux_loss_coef=0.001),
    "qwen3_moe": dict(_COMMON, bos_token_id=None, eos_token_id=None, num_key_value_heads=4, attention_bias=False,
                      max_position_embeddings=32768, rms_norm_eps=1e-6, use_sliding_window=False, sliding_window=4096,
                      decoder_sparse_step=1, mlp_only_layers=None, num_experts=128, num_experts_per_tok=8,
                      moe_intermediate_size=768, norm_topk_prob=False, router_aux_loss_coef=0.001),
    **dict.fromkeys(GLM, dict(_COMMON, bos_token_id=None, eos_token_id=None, pad_token_id=151329,
                              num_key_value_heads=2, head_dim=128, max_position_embeddings=131072,
                              rms_norm_eps=1.5625e-07, attention_bias=True)),
    "qwen3": dict(_COMMON, bos_token_id=None, eos_token_id=None, num_key_value_heads=32, head_dim=128,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, attention_bias=False,
                  use_sliding_window=False, sliding_window=4096, max_window_layers=28),
}
DEFAULT_THETA = {"mixtral": 1e6}


def _qwen2_layer_types(hf: dict) -> tuple[list[str], int | None]:
    """Qwen2's layer types and window as its config class derives them: the window exists only under
    use_sliding_window (default 4096), and without layer_types the layers from max_window_layers (default
    28) on are the sliding ones."""
    window, first_sliding = hf["sliding_window"], hf["max_window_layers"]
    window = window if hf["use_sliding_window"] else None
    kinds = hf.get("layer_types") or ["sliding_attention" if window is not None and i >= first_sliding
                                      else "full_attention" for i in range(hf["num_hidden_layers"])]
    return kinds, window


def _head_dim(hf: dict, heads: int) -> int | None:
    """An explicit head_dim, or None where it is the derived hidden_size / heads (transformers 5 writes that
    one out; a published file leaves it out or null): both files are one model."""
    head_dim = hf.get("head_dim")
    return None if head_dim == hf["hidden_size"] // heads else head_dim


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    heads = hf["num_attention_heads"]
    rotary = None
    if model_type in GLM:  # its config class rotates half of each head by default
        theta, scaling, fraction = partial_rope_from_hf(hf, 0.5)
        rotary = rotary_width(hf["head_dim"] or hf["hidden_size"] // heads, fraction, model_type)
    elif model_type == "phi3":  # Phi-4-mini rotates three quarters of each head (longrope sized for that part)
        theta, scaling, fraction = partial_rope_from_hf(hf, 1.0)
        rotary = rotary_width(hf.get("head_dim") or hf["hidden_size"] // heads, fraction, model_type)
    else:
        theta, scaling = rope_from_hf(hf, DEFAULT_THETA.get(model_type, 1e4))
    pattern, window = "causal", None
    if model_type in ("mistral", "mixtral", "phi3") and hf.get("sliding_window") is not None:
        pattern, window = "sliding", int(hf["sliding_window"])
    if model_type in QWEN:
        kinds, qwen_window = _qwen2_layer_types(hf)
        refuse(len(set(kinds)) > 1, f"{model_type}: a mix of sliding and full attention layers is not supported "
               f"(layer_types {kinds})")
        refuse(kinds[0] == "sliding_attention" and qwen_window is None, f"{model_type}: sliding layers need "
               "use_sliding_window=true and a sliding_window")
        if kinds[0] == "sliding_attention":
            pattern, window = "sliding", int(qwen_window)
    if model_type == "qwen3_moe":  # its attention reads no layer types: a window would be every layer's
        refuse(bool(hf["use_sliding_window"]), f"qwen3_moe: use_sliding_window=true (window {hf['sliding_window']}) "
               "is not supported")
    refuse(model_type == "mixtral" and hf["router_jitter_noise"] > 0, "mixtral: router_jitter_noise > 0 is not supported")
    bias = bool(hf.get("attention_bias", False)) and model_type != "phi3"  # Phi-3's attention has no biases
    cfg = dict(family="decoder", d_model=hf["hidden_size"], num_heads=heads,
               num_kv_heads=hf["num_key_value_heads"] or heads, head_dim=_head_dim(hf, heads),
               d_ff=hf["intermediate_size"], decoder_layers=hf["num_hidden_layers"], norm="rmsnorm",
               norm_eps=hf["rms_norm_eps"], norm_bias=False,
               activation=activation(hf["hidden_act"], True, model_type), position="rope",
               rope_theta=theta, rope_scaling=scaling, max_positions=hf["max_position_embeddings"],
               attention=pattern, window_size=window, qkv_bias=bias, out_bias=bias,
               mlp_bias=bool(hf.get("mlp_bias", False)), tie_embeddings=hf["tie_word_embeddings"],
               head="none" if arch.endswith("Model") else "lm", attention_dropout_rate=hf["attention_dropout"],
               qk_norm=model_type in ("qwen3", "qwen3_moe"))
    if model_type in ("qwen2", "qwen2_moe"):  # biases on q, k and v only (Qwen2-MoE: its qkv_bias, default on)
        cfg.update(qkv_bias=bool(hf["qkv_bias"]) if model_type == "qwen2_moe" else True, out_bias=False)
    if model_type in QWEN_MOE:
        cfg.update(_qwen_experts(hf, model_type))
    if model_type in GLM:  # biases on q, k and v only; GLM-4 norms each sublayer's output too
        cfg.update(rotary_dim=rotary, rope_interleave=True, out_bias=False, sandwich_norm=model_type == "glm4")
    if model_type == "mixtral":
        refuse(not hf["num_local_experts"], f"mixtral: num_local_experts={hf['num_local_experts']!r}; a Mixtral "
               "model needs experts")
        cfg.update(num_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
                   router_aux_loss_coef=hf["router_aux_loss_coef"])
    if model_type == "phi3":
        cfg["dropout_rate"] = float(hf["resid_pdrop"])  # embd_pdrop: training-time, not modelled (HARMLESS)
        cfg["rotary_dim"] = rotary
    return cfg


def _qwen_experts(hf: dict, model_type: str) -> dict[str, Any]:
    """The Qwen MoEs' experts: softmax top-k, renormalised when norm_topk_prob; layer i holds experts when it
    is not in mlp_only_layers and (i + 1) is a multiple of decoder_sparse_step, which jaxformer models when
    the dense layers come first; Qwen2-MoE adds one shared expert, its output gated by a sigmoid."""
    layers, step, only = hf["num_hidden_layers"], hf["decoder_sparse_step"], set(hf["mlp_only_layers"] or ())
    dense = [i for i in range(layers) if i in only or (i + 1) % step]
    refuse(dense != list(range(len(dense))), f"{model_type}: dense layers {dense} (mlp_only_layers="
           f"{hf['mlp_only_layers']}, decoder_sparse_step={step}) are supported only as the first layers")
    width = hf["moe_intermediate_size"]
    # Qwen3-MoE's config class keeps num_experts as num_local_experts (what it writes), which wins
    local, named = hf.get("num_local_experts"), hf["num_experts"]
    experts = local or named
    refuse(not experts, f"{model_type}: num_experts={experts!r}; a {model_type} model needs experts")
    out = dict(num_experts=experts, experts_per_token=hf["num_experts_per_tok"], expert_d_ff=width,
               normalize_router_weights=bool(hf["norm_topk_prob"]), router_aux_loss_coef=hf["router_aux_loss_coef"],
               dense_layers=len(dense))
    if model_type == "qwen2_moe":
        shared = hf["shared_expert_intermediate_size"]
        refuse(shared % width != 0, f"qwen2_moe: shared_expert_intermediate_size={shared} is not a multiple of "
               f"moe_intermediate_size={width}; jaxformer's shared experts are whole experts wide")
        out.update(shared_experts=shared // width, shared_expert_gate=True)
    return out


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
               head_dim=cfg.head_dim_, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.decoder_layers,
               rms_norm_eps=cfg.norms.eps, hidden_act="silu" if cfg.activation == "swiglu" else "gelu_pytorch_tanh",
               max_position_embeddings=cfg.max_positions, rope_parameters=rope_to_hf(cfg),
               tie_word_embeddings=cfg.embeddings.tie, attention_dropout=cfg.attention_dropout_rate)
    out.pop("rope_theta", None)
    out.pop("rope_scaling", None)
    if model_type == "llama":
        out.update(attention_bias=cfg.biases.qkv, mlp_bias=False)
    if model_type in ("mistral", "mixtral", "phi3", *QWEN):
        out["sliding_window"] = cfg.window_size
    if model_type == "phi3":
        out.update(resid_pdrop=cfg.dropout_rate, embd_pdrop=cfg.dropout_rate)
        if cfg.rotary.scaling is not None and cfg.rotary.scaling.kind in PRETRAINED_LENGTH:  # beside the rope dict, it wins
            out["original_max_position_embeddings"] = cfg.rotary.scaling.original_max_positions
        out.pop("attention_bias", None)
    if model_type in ("qwen3", "qwen3_moe"):
        out["attention_bias"] = cfg.biases.qkv
    if model_type in QWEN_MOE:
        out.update(num_experts=cfg.experts.count, num_experts_per_tok=cfg.experts.per_token,
                   moe_intermediate_size=cfg.expert_width, norm_topk_prob=cfg.experts.normalize_weights,
                   router_aux_loss_coef=cfg.experts.aux_loss_coef, decoder_sparse_step=1,
                   mlp_only_layers=list(range(cfg.experts.dense_layers)))
    if model_type == "qwen2_moe":
        out.update(qkv_bias=cfg.biases.qkv, shared_expert_intermediate_size=cfg.experts.shared * cfg.expert_width)
    if model_type in GLM or (model_type == "phi3" and cfg.rotary.dim is not None):
        out["rope_parameters"]["partial_rotary_factor"] = cfg.rope_dim / cfg.head_dim_
        out.update(attention_bias=cfg.biases.qkv)
    if model_type in QWEN:
        sliding = cfg.attention == "sliding"
        out.update(use_sliding_window=sliding,
                   layer_types=["sliding_attention" if sliding else "full_attention"] * cfg.decoder_layers)
        if sliding:
            out["max_window_layers"] = 0
    if model_type == "mixtral":
        out.update(num_local_experts=cfg.experts.count, num_experts_per_tok=cfg.experts.per_token,
                   router_aux_loss_coef=cfg.experts.aux_loss_coef, router_jitter_noise=0.0)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("decoder", "blocks")
    layer = f"{p}layers.{{i}}"
    a = f"{layer}.self_attn"
    if model_type == "phi3":  # queries, keys and values in one tensor
        projections = [fused_heads_in([L + ("attn", n) for n in "qkv"], f"{a}.qkv_proj.weight",
                                      (cfg.num_heads, cfg.kv_heads, cfg.kv_heads), cfg.head_dim_),
                       heads_out(L + ("attn", "o"), f"{a}.o_proj.weight", cfg.num_heads, cfg.head_dim_)]
    else:
        projections = attention(cfg, L + ("attn",), f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight",
                                f"{a}.o_proj.weight", f"{a}.q_proj.bias", f"{a}.k_proj.bias", f"{a}.v_proj.bias",
                                f"{a}.o_proj.bias")
    def block_rules(S: tuple[str, ...], moe: bool) -> list[Rule]:
        """One stack's tensors: ``blocks``, or DeepSeek-style ``dense_blocks`` for the first dense layers."""
        mlp, m = S + ("mlp",), f"{layer}.mlp"
        out = [*[Rule(tuple(S + path[2:] for path in r.paths), r.names, r.load, r.save) for r in projections],
               *([copy(S + ("attn", "q_norm", "scale"), f"{a}.q_norm.weight"),
                  copy(S + ("attn", "k_norm", "scale"), f"{a}.k_norm.weight")] if cfg.query_key_norm is not None else []),
               copy(S + ("attn_norm", "scale"), f"{layer}.input_layernorm.weight"),
               copy(S + ("mlp_norm", "scale"), f"{layer}.post_attention_layernorm.weight"),
               *([copy(S + ("attn_post_norm", "scale"), f"{layer}.post_self_attn_layernorm.weight"),
                  copy(S + ("mlp_post_norm", "scale"), f"{layer}.post_mlp_layernorm.weight")]
                 if cfg.norms.sandwich else [])]  # GLM-4
        if moe and model_type == "mixtral":
            moe_name = f"{layer}.block_sparse_moe"
            return out + [linear(mlp + ("router",), f"{moe_name}.gate.weight"),
                          *[stacked_experts(mlp + (path,), [f"{moe_name}.experts.{e}.{w}.weight"
                                                            for e in range(cfg.experts.count)])
                            for w, path in (("w1", "wi_gate"), ("w3", "wi"), ("w2", "wo"))]]
        if moe:  # the Qwen MoEs
            out += [linear(mlp + ("router",), f"{m}.gate.weight"),
                    *[stacked_experts(mlp + (path,), [f"{m}.experts.{e}.{w}.weight" for e in range(cfg.experts.count)])
                      for w, path in (("gate_proj", "wi_gate"), ("up_proj", "wi"), ("down_proj", "wo"))]]
            if cfg.experts.shared:
                out += [linear(mlp + ("shared", "wi_gate"), f"{m}.shared_expert.gate_proj.weight"),
                        linear(mlp + ("shared", "wi"), f"{m}.shared_expert.up_proj.weight"),
                        linear(mlp + ("shared", "wo"), f"{m}.shared_expert.down_proj.weight"),
                        Rule((mlp + ("shared_gate",),), (f"{m}.shared_expert_gate.weight",), lambda t: [t[0][0]],
                             lambda ps: [ps[0][None]])]
            return out
        if model_type in ("phi3", *GLM):  # the gate, then the up projection, in one tensor
            return out + [fused_linear([mlp + ("wi_gate",), mlp + ("wi",)], f"{m}.gate_up_proj.weight"),
                          linear(mlp + ("wo",), f"{m}.down_proj.weight")]
        if cfg.biases.mlp:
            # jaxformer's gated MLP has one input bias (on the up projection); HF has one on each.
            raise ValueError("llama: mlp_bias=True is not supported")
        return out + [linear(mlp + ("wi_gate",), f"{m}.gate_proj.weight"), linear(mlp + ("wi",), f"{m}.up_proj.weight"),
                      linear(mlp + ("wo",), f"{m}.down_proj.weight")]

    k, L = len(cfg.dense_layer_ids), cfg.decoder_layers
    out = [copy(("embed", "table"), f"{p}embed_tokens.weight"),
           copy(("decoder", "final_norm", "scale"), f"{p}norm.weight")]
    if k:
        out += [rule.in_layers(0, k) for rule in block_rules(("decoder", "dense_blocks"), moe=False)]
    out += [rule.in_layers(k, L) if k else rule for rule in block_rules(("decoder", "blocks"), cfg.experts is not None)]
    head, aliases = lm_head(cfg, f"{p}embed_tokens.weight")
    return out + head, aliases


ARCHITECTURE = Architecture(CLASSES, {model_type: "model." for model_type in STEMS},
                            tuple(f"{stem}Model" for stem in STEMS.values()), config_from_hf, config_to_hf,
                            rules, harmless={"pretraining_tp": "transformers 5 never reads it",
                                             "max_window_layers": "in Qwen3-MoE's files, which nothing of it reads "
                                                                  "(Qwen2's and Qwen3's read theirs)"},
                            defaults=DEFAULTS, only_as_loaded=("phi3",))
