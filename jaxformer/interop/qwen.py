"""Qwen2, Qwen3 and their MoEs (``qwen2``, ``qwen3``, ``qwen2_moe``, ``qwen3_moe``): LLaMA's blocks
(interop/llama.py) with biases on q, k and v alone (Qwen2; Qwen2-MoE's ``qkv_bias``) or Qwen3's RMSNorm over
each query and key head; a sliding window only under ``use_sliding_window``, from layer ``max_window_layers``
on (Qwen3-MoE's attention reads no layer types); the MoEs' softmax top-k experts with their dense layers
first, and Qwen2-MoE's shared expert, its output gated by a sigmoid. Config and tensor rules, both
directions."""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop import llama
from jaxformer.interop.rules import Rule, copy, linear, refuse, rope_from_hf, stacked_experts

STEMS = {"qwen2": "Qwen2", "qwen3": "Qwen3", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe"}
# The window only under use_sliding_window, and sliding from max_window_layers on (Qwen3-MoE reads neither)
LAYER_TYPED = ("qwen2", "qwen3", "qwen2_moe")
MOE = ("qwen2_moe", "qwen3_moe")
HEAD_NORMS = ("qwen3", "qwen3_moe")
_COMMON = dict(llama.COMMON_DEFAULTS, bos_token_id=None, eos_token_id=None, max_position_embeddings=32768,
               rms_norm_eps=1e-6, use_sliding_window=False, sliding_window=4096)
_EXPERTS = dict(decoder_sparse_step=1, mlp_only_layers=None, norm_topk_prob=False, router_aux_loss_coef=0.001)
# Their config classes' defaults for the keys read below (checked by tests/test_config_reading.py)
DEFAULTS = {
    "qwen2": dict(_COMMON, num_key_value_heads=32, max_window_layers=28),
    "qwen3": dict(_COMMON, num_key_value_heads=32, head_dim=128, attention_bias=False, max_window_layers=28),
    "qwen2_moe": dict(_COMMON, **_EXPERTS, num_key_value_heads=16, qkv_bias=True, max_window_layers=28, num_experts=60,
                      num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632),
    "qwen3_moe": dict(_COMMON, **_EXPERTS, num_key_value_heads=4, attention_bias=False, num_experts=128,
                      num_experts_per_tok=8, moe_intermediate_size=768),
}
DEFAULT_THETA = 1e4


def _layer_types(hf: dict) -> tuple[list[str], int | None]:
    """The layer types and window as Qwen2's config class derives them: the window exists only under
    use_sliding_window (default 4096), and without layer_types the layers from max_window_layers (default
    28) on are the sliding ones."""
    window, first_sliding = hf["sliding_window"], hf["max_window_layers"]
    window = window if hf["use_sliding_window"] else None
    kinds = hf.get("layer_types") or ["sliding_attention" if window is not None and i >= first_sliding
                                      else "full_attention" for i in range(hf["num_hidden_layers"])]
    return kinds, window


def _window(hf: dict, model_type: str) -> int | None:
    """The window every layer sees, or None; a mix of sliding and full layers is refused."""
    if model_type not in LAYER_TYPED:  # Qwen3-MoE's attention reads no layer types: a window would be every layer's
        refuse(bool(hf["use_sliding_window"]), f"qwen3_moe: use_sliding_window=true (window {hf['sliding_window']}) "
               "is not supported")
        return None
    kinds, window = _layer_types(hf)
    refuse(len(set(kinds)) > 1, f"{model_type}: a mix of sliding and full attention layers is not supported "
           f"(layer_types {kinds})")
    refuse(kinds[0] == "sliding_attention" and window is None, f"{model_type}: sliding layers need "
           "use_sliding_window=true and a sliding_window")
    return int(window) if kinds[0] == "sliding_attention" else None


def _experts(hf: dict, model_type: str) -> dict[str, Any]:
    """The MoEs' experts: softmax top-k, renormalised when norm_topk_prob; layer i holds experts when it
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


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    rope = rope_from_hf(hf, DEFAULT_THETA)
    cfg = llama.decoder_config(hf, model_type, arch, rope, _window(hf, model_type))
    cfg["qk_norm"] = model_type in HEAD_NORMS
    if model_type in ("qwen2", "qwen2_moe"):  # biases on q, k and v only (Qwen2-MoE: its qkv_bias, default on)
        cfg.update(qkv_bias=bool(hf["qkv_bias"]) if model_type == "qwen2_moe" else True, out_bias=False)
    if model_type in MOE:
        cfg.update(_experts(hf, model_type))
    return cfg


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    llama.decoder_to_hf(cfg, out)
    if model_type in LAYER_TYPED:
        out["sliding_window"] = cfg.window_size
    if model_type in HEAD_NORMS:
        out["attention_bias"] = cfg.biases.qkv
    if model_type in MOE:
        out.update(num_experts=cfg.experts.count, num_experts_per_tok=cfg.experts.per_token,
                   moe_intermediate_size=cfg.expert_width, norm_topk_prob=cfg.experts.normalize_weights,
                   router_aux_loss_coef=cfg.experts.aux_loss_coef, decoder_sparse_step=1,
                   mlp_only_layers=list(range(cfg.experts.dense_layers)))
    if model_type == "qwen2_moe":
        out.update(qkv_bias=cfg.biases.qkv, shared_expert_intermediate_size=cfg.experts.shared * cfg.expert_width)
    if model_type in LAYER_TYPED:
        sliding = cfg.attention == "sliding"
        out.update(use_sliding_window=sliding,
                   layer_types=["sliding_attention" if sliding else "full_attention"] * cfg.decoder_layers)
        if sliding:
            out["max_window_layers"] = 0


def expert_rules(cfg: ModelConfig, mlp: tuple[str, ...], m: str) -> list[Rule]:
    """The router, each expert's gate, up and down projections, and Qwen2-MoE's gated shared expert."""
    out = [linear(mlp + ("router",), f"{m}.gate.weight"),
           *[stacked_experts(mlp + (path,), [f"{m}.experts.{e}.{w}.weight" for e in range(cfg.experts.count)])
             for w, path in (("gate_proj", "wi_gate"), ("up_proj", "wi"), ("down_proj", "wo"))]]
    if cfg.experts.shared:
        out += [linear(mlp + ("shared", "wi_gate"), f"{m}.shared_expert.gate_proj.weight"),
                linear(mlp + ("shared", "wi"), f"{m}.shared_expert.up_proj.weight"),
                linear(mlp + ("shared", "wo"), f"{m}.shared_expert.down_proj.weight"),
                Rule((mlp + ("shared_gate",),), (f"{m}.shared_expert_gate.weight",), lambda t: [t[0][0]],
                     lambda ps: [ps[0][None]])]
    return out


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        a, m = f"{layer}.self_attn", f"{layer}.mlp"
        head_norms = [copy(S + ("attn", "q_norm", "scale"), f"{a}.q_norm.weight"),
                      copy(S + ("attn", "k_norm", "scale"), f"{a}.k_norm.weight")]
        return [*llama.attention_rules(cfg, S, a), *(head_norms if cfg.query_key_norm is not None else []),
                *llama.norm_rules(S, layer),
                *(expert_rules(cfg, S + ("mlp",), m) if experts else llama.gated_mlp_rules(cfg, S, m))]

    return llama.decoder_rules(cfg, prefix, block)


ARCHITECTURE = llama.architecture(STEMS, config_from_hf, config_to_hf, rules, defaults=DEFAULTS, harmless={
    "max_window_layers": "in Qwen3-MoE's files, which nothing of it reads (Qwen2's and Qwen3's read theirs)"})
