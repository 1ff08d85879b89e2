"""Mixtral (``mixtral``): Mistral with every MLP a mixture of SwiGLU experts (``num_local_experts``, the top
``num_experts_per_tok`` of a softmax router, their weights renormalised), each expert's w1 (gate), w3 (up) and
w2 (down) its own tensor under ``block_sparse_moe``; a rotary base of 1e6 by default. Config and tensor rules,
both directions; the rest is LLaMA's (interop/llama.py)."""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop import llama
from jaxformer.interop.rules import Rule, linear, refuse, rope_from_hf, stacked_experts

STEMS = {"mixtral": "Mixtral"}
DEFAULTS = {"mixtral": dict(llama.COMMON_DEFAULTS, num_key_value_heads=8, max_position_embeddings=131072,
                            rms_norm_eps=1e-5, sliding_window=None, num_local_experts=8, num_experts_per_tok=2,
                            router_aux_loss_coef=0.001, router_jitter_noise=0.0)}
DEFAULT_THETA = 1e6


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    rope = rope_from_hf(hf, DEFAULT_THETA)
    window = llama.every_layer_window(hf)
    refuse(hf["router_jitter_noise"] > 0, "mixtral: router_jitter_noise > 0 is not supported")
    cfg = llama.decoder_config(hf, model_type, arch, rope, window)
    refuse(not hf["num_local_experts"], f"mixtral: num_local_experts={hf['num_local_experts']!r}; a Mixtral "
           "model needs experts")
    cfg.update(num_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
               router_aux_loss_coef=hf["router_aux_loss_coef"])
    return cfg


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    llama.decoder_to_hf(cfg, out)
    out["sliding_window"] = cfg.window_size
    out.update(num_local_experts=cfg.experts.count, num_experts_per_tok=cfg.experts.per_token,
               router_aux_loss_coef=cfg.experts.aux_loss_coef, router_jitter_noise=0.0)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        out = [*llama.attention_rules(cfg, S, f"{layer}.self_attn"), *llama.norm_rules(S, layer)]
        if not experts:
            return out + llama.gated_mlp_rules(cfg, S, f"{layer}.mlp")
        moe, mlp = f"{layer}.block_sparse_moe", S + ("mlp",)
        return out + [linear(mlp + ("router",), f"{moe}.gate.weight"),
                      *[stacked_experts(mlp + (path,), [f"{moe}.experts.{e}.{w}.weight"
                                                        for e in range(cfg.experts.count)])
                        for w, path in (("w1", "wi_gate"), ("w3", "wi"), ("w2", "wo"))]]

    return llama.decoder_rules(cfg, prefix, block)


ARCHITECTURE = llama.architecture(STEMS, config_from_hf, config_to_hf, rules, defaults=DEFAULTS)
