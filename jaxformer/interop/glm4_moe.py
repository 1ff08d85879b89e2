"""Zhipu's GLM-4.5 and GLM-4.6 (``glm4_moe``): config and tensor rules, both directions.

LLaMA's pre-norm layers (RMSNorm, grouped-query attention with its own ``head_dim``) with rotary positions on the
first half of each head (``partial_rotary_factor``, 0.5 by default; the halves rotate as LLaMA's do, not in
GLM-4's adjacent pairs), biases on q, k and v alone (``attention_bias``; o has none), optional RMSNorms over each
query and key head (``use_qk_norm``), and DeepSeek-V3's mixture of experts after the first
``first_k_dense_replace`` dense layers: per-expert sigmoid scores, a selection-only bias
(``e_score_correction_bias``), groups (``n_group``, ``topk_group``), the chosen weights renormalised
(``norm_topk_prob``) and scaled (``routed_scaling_factor``), and ``n_shared_experts`` always-on experts.
The published files carry multi-token-prediction layers past ``num_hidden_layers`` (``num_nextn_predict_layers``),
which next-token prediction never reads: skipped with a note, as transformers skips them.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop.llama import (architecture, attention_rules, decoder_config, decoder_rules, decoder_to_hf,
                                     gated_mlp_rules, norm_rules)
from jaxformer.interop.rules import (Rule, copy, linear, partial_rope_from_hf, prediction_layers, refuse,
                                     rope_to_hf, rotary_width, stacked_experts)

STEMS = {"glm4_moe": "Glm4Moe"}
# Glm4MoeConfig's defaults for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"glm4_moe": dict(num_key_value_heads=8, hidden_act="silu", max_position_embeddings=131072,
                             rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
                             attention_dropout=0.0, moe_intermediate_size=1408, num_experts_per_tok=8,
                             n_shared_experts=1, n_routed_experts=128, routed_scaling_factor=1.0, n_group=1,
                             topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, use_qk_norm=False,
                             bos_token_id=None, eos_token_id=None, pad_token_id=None)}
DEFAULT_PARTIAL_ROTARY = 0.5  # Glm4MoeConfig's when no key says


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    experts = hf["n_routed_experts"]
    refuse(not experts, f"glm4_moe: n_routed_experts={experts!r}; a GLM-4.5 model needs routed experts")
    fields = decoder_config(hf, model_type, arch, (10000.0, None))
    width = fields["head_dim"] or hf["hidden_size"] // hf["num_attention_heads"]
    theta, scaling, fraction = partial_rope_from_hf(hf, DEFAULT_PARTIAL_ROTARY)
    rotary = rotary_width(width, fraction, model_type)
    dense = hf["first_k_dense_replace"] or 0
    refuse(dense > hf["num_hidden_layers"], f"glm4_moe: first_k_dense_replace={dense} is more than the "
           f"{hf['num_hidden_layers']} layers")
    fields.update(rope_theta=theta, rope_scaling=scaling, rotary_dim=rotary, out_bias=False, mlp_bias=False,
                  qk_norm=bool(hf["use_qk_norm"]), num_experts=experts, experts_per_token=hf["num_experts_per_tok"],
                  expert_d_ff=hf["moe_intermediate_size"], shared_experts=hf["n_shared_experts"] or 0,
                  dense_layers=dense, router_score="sigmoid", router_groups=hf["n_group"] or 1,
                  router_topk_groups=hf["topk_group"] or 1, router_bias=True,
                  normalize_router_weights=bool(hf["norm_topk_prob"]),
                  routed_scaling=float(hf["routed_scaling_factor"]))
    return fields


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    decoder_to_hf(cfg, out)
    rope = rope_to_hf(cfg)
    rope["partial_rotary_factor"] = cfg.rope_dim / cfg.head_dim_
    out.update(rope_parameters=rope, attention_bias=cfg.biases.qkv, use_qk_norm=cfg.query_key_norm is not None,
               moe_intermediate_size=cfg.expert_width, num_experts_per_tok=cfg.experts.per_token,
               n_shared_experts=cfg.experts.shared, n_routed_experts=cfg.experts.count,
               routed_scaling_factor=cfg.experts.routed_scaling, n_group=cfg.experts.router_groups,
               topk_group=cfg.experts.router_topk_groups, first_k_dense_replace=cfg.experts.dense_layers,
               norm_topk_prob=cfg.experts.normalize_weights, num_nextn_predict_layers=0)
    out.pop("partial_rotary_factor", None)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    def block(S: tuple[str, ...], layer: str, experts: bool) -> list[Rule]:
        a, m, mlp = f"{layer}.self_attn", f"{layer}.mlp", S + ("mlp",)
        out = [*attention_rules(cfg, S, a), *norm_rules(S, layer)]
        if cfg.query_key_norm is not None:
            out += [copy(S + ("attn", "q_norm", "scale"), f"{a}.q_norm.weight"),
                    copy(S + ("attn", "k_norm", "scale"), f"{a}.k_norm.weight")]
        if not experts:
            return out + gated_mlp_rules(cfg, S, m)
        every = range(cfg.experts.count)
        out += [linear(mlp + ("router",), f"{m}.gate.weight"),
                copy(mlp + ("router_bias",), f"{m}.gate.e_score_correction_bias"),
                *[stacked_experts(mlp + (path,), [f"{m}.experts.{e}.{w}.weight" for e in every])
                  for w, path in (("gate_proj", "wi_gate"), ("up_proj", "wi"), ("down_proj", "wo"))]]
        if cfg.experts.shared:
            shared = mlp + ("shared",)
            out += [linear(shared + ("wi_gate",), f"{m}.shared_experts.gate_proj.weight"),
                    linear(shared + ("wi",), f"{m}.shared_experts.up_proj.weight"),
                    linear(shared + ("wo",), f"{m}.shared_experts.down_proj.weight")]
        return out

    return decoder_rules(cfg, prefix, block)


def ignored(hf: dict, names: set[str]) -> tuple[set[str], str]:
    """The published files' multi-token-prediction layers, past num_hidden_layers (transformers' GLM-4.5 skips
    them on load too)."""
    return prediction_layers(hf, names, hf.get("num_nextn_predict_layers", hf.get("num_mtp_layers")) or 0)


ARCHITECTURE = architecture(STEMS, config_from_hf, config_to_hf, rules, defaults=DEFAULTS, ignored=ignored,
                            harmless={"num_nextn_predict_layers": "the multi-token-prediction layers, skipped with a "
                                                                  "note", "num_mtp_layers": "the same, by its name in "
                                                                  "transformers 5's config class"})
