"""Phi-3 (``phi3``): LLaMA's blocks (interop/llama.py) with the queries, keys and values in one tensor
(``qkv_proj``) and the gate and up projections in another (``gate_up_proj``), no attention biases, a window of
``sliding_window`` keys on every layer, rotary positions over ``partial_rotary_factor`` of each head
(Phi-4-mini's three quarters, its longrope sized for that part) and the pretraining length beside the rope
dict. Config and tensor rules, both directions. Its files hold only what LLaMA's and Mistral's hold, in fused
tensors: written only for a model loaded from one."""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop import llama
from jaxformer.interop.rules import (PRETRAINED_LENGTH, Rule, fused_heads_in, heads_out, partial_rope_from_hf,
                                     rotary_width)

STEMS = {"phi3": "Phi3"}
DEFAULTS = {"phi3": dict(llama.COMMON_DEFAULTS, eos_token_id=32000, pad_token_id=32000, num_key_value_heads=None,
                         max_position_embeddings=4096, original_max_position_embeddings=4096, rms_norm_eps=1e-5,
                         sliding_window=None, resid_pdrop=0.0)}
DEFAULT_THETA = 1e4


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    heads = hf["num_attention_heads"]
    theta, scaling, fraction = partial_rope_from_hf(hf, 1.0, DEFAULT_THETA)
    rotary = rotary_width(hf.get("head_dim") or hf["hidden_size"] // heads, fraction, model_type)
    cfg = llama.decoder_config(hf, model_type, arch, (theta, scaling), llama.every_layer_window(hf))
    cfg.update(qkv_bias=False, out_bias=False,  # Phi-3's attention has no biases, whatever attention_bias says
               dropout_rate=float(hf["resid_pdrop"]),  # embd_pdrop: training-time, not modelled (HARMLESS)
               rotary_dim=rotary)
    return cfg


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    llama.decoder_to_hf(cfg, out)
    out.update(sliding_window=cfg.window_size, resid_pdrop=cfg.dropout_rate, embd_pdrop=cfg.dropout_rate)
    if cfg.rotary.scaling is not None and cfg.rotary.scaling.kind in PRETRAINED_LENGTH:  # beside the rope dict, it wins
        out["original_max_position_embeddings"] = cfg.rotary.scaling.original_max_positions
    out.pop("attention_bias", None)
    if cfg.rotary.dim is not None:
        out["rope_parameters"]["partial_rotary_factor"] = cfg.rope_dim / cfg.head_dim_
        out.update(attention_bias=cfg.biases.qkv)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        a = f"{layer}.self_attn"
        return [fused_heads_in([S + ("attn", n) for n in "qkv"], f"{a}.qkv_proj.weight",
                               (cfg.num_heads, cfg.kv_heads, cfg.kv_heads), cfg.head_dim_),
                heads_out(S + ("attn", "o"), f"{a}.o_proj.weight", cfg.num_heads, cfg.head_dim_),
                *llama.norm_rules(S, layer), *llama.fused_gated_mlp_rules(S, f"{layer}.mlp")]

    return llama.decoder_rules(cfg, prefix, block)


ARCHITECTURE = llama.architecture(STEMS, config_from_hf, config_to_hf, rules, defaults=DEFAULTS,
                                  only_as_loaded=("phi3",))
