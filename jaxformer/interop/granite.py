"""IBM Granite (``granite``: the Granite 3 dense decoders; ``granitemoe``: Granite 3's mixtures of experts):
config and tensor rules, both directions.

LLaMA's layers (RMSNorm, rotary positions, GQA, a SwiGLU MLP) under the multipliers of maximal-update
parametrisation (muP), each one number in the file:
- ``embedding_multiplier``: the token vectors times it (``embedding_multiplier``);
- ``residual_multiplier``: each sublayer's output times it as it joins the residual stream
  (``residual_multiplier``);
- ``attention_multiplier``: the softmax scale of q . k in place of head_dim ** -0.5 (``attention_scale``);
- ``logits_scaling``: the logits divided by it (``logits_divisor``).
``attention_bias`` puts biases on q, k, v and o alike; ``mlp_bias`` (biases on the three MLP matrices) is
refused, as for LLaMA. Granite MoE's every MLP is a mixture of ``num_local_experts`` SwiGLU experts: the top
``num_experts_per_tok`` router logits, softmaxed among themselves (a softmax over all experts renormalised over
the chosen ones: the same weights), each expert's gate and up projections one tensor
(``block_sparse_moe.input_linear`` [experts, 2 * intermediate_size, hidden], gate first) and its down projection
another (``output_linear``).
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
import numpy as np

from jaxformer.interop.llama import (DEFAULT_THETA, architecture, attention_rules, decoder_config, decoder_rules,
                                     decoder_to_hf, gated_mlp_rules, norm_rules)
from jaxformer.interop.rules import Rule, linear, refuse, rope_from_hf

STEMS = {"granite": "Granite", "granitemoe": "GraniteMoe"}
# GraniteConfig's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"granite": dict(num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                            rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                            attention_dropout=0.0, mlp_bias=False, embedding_multiplier=1.0, logits_scaling=1.0,
                            residual_multiplier=1.0, attention_multiplier=1.0, pad_token_id=None, bos_token_id=1,
                            eos_token_id=2)}
DEFAULTS["granitemoe"] = {**{k: v for k, v in DEFAULTS["granite"].items() if k != "mlp_bias"}, "num_local_experts": 8,
                          "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    fields = decoder_config(hf, model_type, arch, rope_from_hf(hf, DEFAULT_THETA))
    if model_type == "granite":
        refuse(bool(hf["mlp_bias"]), "granite: mlp_bias=True (biases on gate_proj, up_proj and down_proj) is not "
               "supported: jaxformer's gated MLP has one input bias")
    else:
        refuse(not hf["num_local_experts"], f"granitemoe: num_local_experts={hf['num_local_experts']!r}; a Granite "
               "MoE model needs experts")
        fields.update(num_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
                      router_aux_loss_coef=hf["router_aux_loss_coef"])
    return {**fields, "embedding_multiplier": float(hf["embedding_multiplier"]),
            "residual_multiplier": float(hf["residual_multiplier"]),
            "attention_scale": float(hf["attention_multiplier"]), "logits_divisor": float(hf["logits_scaling"])}


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    decoder_to_hf(cfg, out)
    out.update(attention_bias=cfg.biases.qkv, embedding_multiplier=cfg.embeddings.multiplier,
               residual_multiplier=cfg.residual_multiplier, attention_multiplier=cfg.scale,
               logits_scaling=cfg.logits.divisor)
    if model_type == "granite":
        out["mlp_bias"] = False
    else:
        out.update(num_local_experts=cfg.experts.count, num_experts_per_tok=cfg.experts.per_token,
                   router_aux_loss_coef=cfg.experts.aux_loss_coef)


def _gate_and_up(gate: tuple[str, ...], up: tuple[str, ...], name: str) -> Rule:
    """Each expert's gate and up projections as one tensor [E, 2F, D], gate first <-> two kernels [E, D, F]."""
    def load(t):
        width = t[0].shape[1] // 2
        return [np.transpose(t[0][:, :width], (0, 2, 1)), np.transpose(t[0][:, width:], (0, 2, 1))]

    return Rule((gate, up), (name,), load, lambda ps: [np.transpose(np.concatenate(ps, axis=2), (0, 2, 1))])


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        out = [*attention_rules(cfg, S, f"{layer}.self_attn"), *norm_rules(S, layer)]
        if not experts:
            return out + gated_mlp_rules(cfg, S, f"{layer}.mlp")
        moe, mlp = f"{layer}.block_sparse_moe", S + ("mlp",)
        return out + [linear(mlp + ("router",), f"{moe}.router.layer.weight"),
                      _gate_and_up(mlp + ("wi_gate",), mlp + ("wi",), f"{moe}.input_linear.weight"),
                      Rule((mlp + ("wo",),), (f"{moe}.output_linear.weight",),
                           lambda t: [np.transpose(t[0], (0, 2, 1))], lambda ps: [np.transpose(ps[0], (0, 2, 1))])]

    return decoder_rules(cfg, prefix, block)


ARCHITECTURE = architecture(STEMS, config_from_hf, config_to_hf, rules, defaults=DEFAULTS)
