"""Mistral Small 4 (``mistral4``): config and tensor rules, both directions.

DeepSeek-V3's layers (multi-head latent attention with a low-rank query, routed plus shared experts after the
first ``first_k_dense_replace`` dense layers) with three differences in the numbers:
- every layer's queries are scaled by their position, 1 + beta ln(1 + floor(p / L)) (``llama_4_scaling_beta``
  and ``original_max_position_embeddings`` of ``rope_parameters``; ``query_position_scale``,
  ``query_position_span``). Llama 4's attention temperature is another formula (floor((i + 1) / L) of the slot
  index i, NoPE layers only), so it is not reused;
- the router scores experts with a softmax, with no selection bias, and scores a group by the sum of its best two
  experts (``router_group_score='best_two'``; DeepSeek-V2's softmax router takes the best one);
- the routed experts are stored fused, as transformers 5 holds them: ``gate_up_proj`` [E, 2F, D] (the gate's F
  rows first) and ``down_proj`` [E, D, F].
Rotary positions cover the ``qk_rope_head_dim`` part alone (``partial_rotary_factor`` is derived from it);
transformers' class rotates with a scaled rope type only (its own 'default' is the whole head wide, which the
rotary part cannot take), so a 'default' file is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop import deepseek
from jaxformer.interop.rules import Architecture, Rule, refuse, rope_from_hf, rope_to_hf

CLASSES = {"mistral4": ("Mistral4Model", "Mistral4ForCausalLM")}
# Mistral4Config's defaults, for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"mistral4": dict(
    vocab_size=131072, hidden_size=4096, intermediate_size=12288, moe_intermediate_size=2048, num_hidden_layers=36,
    num_attention_heads=32, num_key_value_heads=32, n_shared_experts=1, n_routed_experts=128,
    routed_scaling_factor=1.0, kv_lora_rank=256, q_lora_rank=1024, qk_rope_head_dim=64, v_head_dim=128,
    qk_nope_head_dim=64, n_group=1, topk_group=1, num_experts_per_tok=4, first_k_dense_replace=0, norm_topk_prob=True,
    hidden_act="silu", max_position_embeddings=1048576, rms_norm_eps=1e-6, pad_token_id=11, bos_token_id=1,
    eos_token_id=2, tie_word_embeddings=False, rope_parameters=None, rope_interleave=True, attention_bias=False,
    attention_dropout=0.0)}


def default_rope(hf: dict) -> dict:
    """The rotary settings Mistral4Config writes for a file without any (Mistral Small 4's)."""
    return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0, "original_max_position_embeddings": 8192,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}


def rope_and_query_scale(hf: dict, model_type: str) -> tuple[float, Any, dict[str, Any]]:
    """(theta, scaling, the query-scale fields) of Mistral 4's rope_parameters: its own keys taken out before
    the rotary kind is read (``llama_4_scaling_beta``; ``max_position_embeddings``, which nothing reads; the
    derived ``partial_rotary_factor``, which must give the rotary part's width)."""
    params = dict(hf.get("rope_scaling") or hf["rope_parameters"] or default_rope(hf))
    if "rope_theta" in hf:  # a file of the older form keeps its base at the top level, as transformers reads it
        params.setdefault("rope_theta", hf["rope_theta"])
    beta, span = params.pop("llama_4_scaling_beta", None), params.get("original_max_position_embeddings")
    params.pop("max_position_embeddings", None)
    rope, head = hf["qk_rope_head_dim"], hf["qk_nope_head_dim"] + hf["qk_rope_head_dim"]
    fraction = params.pop("partial_rotary_factor", rope / head)
    refuse(int(head * fraction) != rope, f"{model_type}: rope_parameters partial_rotary_factor={fraction} rotates "
           f"{int(head * fraction)} numbers of each {head}-wide head; its latent attention rotates "
           f"qk_rope_head_dim={rope}")
    refuse(beta is None or span is None, f"{model_type}: rope_parameters needs llama_4_scaling_beta and "
           f"original_max_position_embeddings (every layer scales its queries by them), got {beta!r} and {span!r}")
    refuse(float(span) != int(span) or int(span) <= 0, f"{model_type}: rope_parameters "
           f"original_max_position_embeddings={span!r} must be a positive whole number of positions")
    kind = params.get("rope_type", params.get("type", "default"))
    refuse(kind == "default" and hf["qk_nope_head_dim"] > 0, f"{model_type}: rope_type 'default' is not supported: "
           "transformers' Mistral 4 then builds its rotary table the whole head wide, which the rotary part "
           "cannot take (its forward fails)")
    if kind in ("default", "linear", "dynamic"):  # read by the query scale alone for these kinds
        params.pop("original_max_position_embeddings")
    theta, scaling = rope_from_hf({"rope_parameters": params, "max_position_embeddings": hf["max_position_embeddings"]})
    return theta, scaling, dict(query_position_scale=float(beta), query_position_span=int(span))


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    theta, scaling, query_scale = rope_and_query_scale(hf, model_type)
    return dict(
        **deepseek.latent_decoder(hf, model_type, arch, hf["n_routed_experts"], (theta, scaling)), **query_scale,
        rope_interleave=bool(hf["rope_interleave"]), dense_layers=hf["first_k_dense_replace"] or 0,
        router_score="softmax", router_group_score="best_two", router_groups=hf["n_group"] or 1,
        router_topk_groups=hf["topk_group"] or 1, router_bias=False,
        normalize_router_weights=bool(hf["norm_topk_prob"]))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    deepseek.config_to_hf(cfg, "deepseek_v3", out)
    out["rope_parameters"] = {**rope_to_hf(cfg), "llama_4_scaling_beta": cfg.scores.position_scale,
                              "original_max_position_embeddings": cfg.scores.position_span}
    for key in ("num_nextn_predict_layers", "head_dim", "qk_head_dim"):  # not its keys, or derived by its class
        out.pop(key, None)


def _fused_experts(gate_path, up_path, name) -> Rule:
    """Mistral 4's gate_up_proj [E, 2F, D] (the gate's F rows, then the up projection's) <-> two [E, D, F]."""
    return Rule((gate_path, up_path), (name,),
                lambda t: [w.transpose(0, 2, 1) for w in np.split(t[0], 2, axis=1)],
                lambda ps: [np.concatenate([w.transpose(0, 2, 1) for w in ps], axis=1)])


def _experts_out(path, name) -> Rule:
    """down_proj [E, D, F] <-> [E, F, D]."""
    return Rule((path,), (name,), lambda t: [t[0].transpose(0, 2, 1)], lambda ps: [ps[0].transpose(0, 2, 1)])


def experts_rules(mlp: tuple[str, ...], experts: str) -> list[Rule]:
    """The routed experts under ``mlp`` (the parameters) read from the fused tensors of the module ``experts``."""
    return [_fused_experts(mlp + ("wi_gate",), mlp + ("wi",), f"{experts}.gate_up_proj"),
            _experts_out(mlp + ("wo",), f"{experts}.down_proj")]


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    """DeepSeek's rules (interop/deepseek.py) with the routed experts read from their fused tensors."""
    out, aliases = deepseek.rules(cfg, "deepseek_v3", arch, prefix)
    out = [rule for rule in out if not any(".mlp.experts." in name for name in rule.names)]
    experts = experts_rules(("decoder", "blocks", "mlp"), f"{prefix}layers.{{i}}.mlp.experts")
    return out + [rule.in_layers(cfg.experts.dense_layers, cfg.decoder_layers) for rule in experts], aliases


HARMLESS = {
    **dict.fromkeys(("head_dim", "qk_head_dim"), "derived from qk_rope_head_dim and qk_nope_head_dim by the config "
                                                 "class, whatever the file says"),
    "pretraining_tp": "transformers 5 never reads it",
}

ARCHITECTURE = Architecture(CLASSES, {"mistral4": "model."}, ("Mistral4Model",), config_from_hf, config_to_hf, rules,
                            harmless=HARMLESS, defaults=DEFAULTS)
