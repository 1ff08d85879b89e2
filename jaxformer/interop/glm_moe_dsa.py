"""Zhipu's GLM-5 (``glm_moe_dsa``): config and tensor rules, both directions.

DeepSeek-V3.2's layers under another name: multi-head latent attention with a low-rank query, the lightning
indexer of DeepSeek sparse attention (each query attends to its ``index_topk`` best keys), and DeepSeek-V3's
sigmoid-routed experts after the first ``first_k_dense_replace`` dense layers (``mlp_layer_types``). One
difference in the numbers: the indexer rotates adjacent pairs of its rotary part, as the attention does,
where DeepSeek-V3.2's indexer rotates halves (``index_rope_interleave``). The tensors are named as DeepSeek's,
so deepseek.rules reads and writes them.

transformers' class may also let a layer reuse the previous full layer's top-k choice instead of running its
own indexer (``indexer_types`` 'shared', or the ``index_topk_freq`` / ``index_skip_topk_offset`` /
``index_topk_pattern`` schedules that derive them); jaxformer does not carry one layer's choice to the next,
so such a file is refused by name. GLM-5's published file runs the indexer in every layer.
The published file carries one multi-token-prediction layer past ``num_hidden_layers``, skipped with a note.
"""

from __future__ import annotations

from typing import Any

from jaxformer.model_config import ModelConfig
from jaxformer.interop import deepseek
from jaxformer.interop.rules import Architecture, Rule, prediction_layers, refuse, rope_from_hf

CLASSES = {"glm_moe_dsa": ("GlmMoeDsaModel", "GlmMoeDsaForCausalLM")}
# GlmMoeDsaConfig's defaults, for the keys a file may leave out (checked by tests/test_config_reading.py)
DEFAULTS = {"glm_moe_dsa": dict(
    vocab_size=154880, hidden_size=6144, intermediate_size=12288, moe_intermediate_size=2048, num_hidden_layers=78,
    num_attention_heads=64, num_key_value_heads=64, n_shared_experts=1, n_routed_experts=256,
    routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=2048, qk_rope_head_dim=64, v_head_dim=256,
    qk_nope_head_dim=192, n_group=1, topk_group=1, num_experts_per_tok=8, norm_topk_prob=True, hidden_act="silu",
    max_position_embeddings=202752, rms_norm_eps=1e-5, pad_token_id=None, bos_token_id=0, eos_token_id=1,
    tie_word_embeddings=False, mlp_layer_types=None, attention_bias=False, attention_dropout=0.0, index_topk=2048,
    index_head_dim=128, index_n_heads=32, mlp_bias=False, first_k_dense_replace=3, layer_types=None,
    indexer_types=None)}
INDEXER_KINDS = ("full", "shared")


def indexer_types(hf: dict, model_type: str = "glm_moe_dsa") -> list[str]:
    """Each layer's indexer mode as the config class derives it: ``indexer_types``, else ``index_topk_pattern``
    ('F' full, 'S' shared), else full for the first ``index_skip_topk_offset`` layers (2) and then every
    ``index_topk_freq``-th (1: all)."""
    layers = hf["num_hidden_layers"]
    kinds, pattern = hf["indexer_types"], hf.get("index_topk_pattern")
    freq, offset = max(hf.get("index_topk_freq", 1), 1), hf.get("index_skip_topk_offset", 2)
    if kinds is None and pattern is not None:
        kinds = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern] if isinstance(pattern, str) else pattern
    if kinds is None:
        kinds = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    refuse(set(kinds) - set(INDEXER_KINDS), f"{model_type}: indexer_types {sorted(set(kinds) - set(INDEXER_KINDS))} "
           f"are not supported; expected {list(INDEXER_KINDS)}")
    return list(kinds)


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(bool(hf["mlp_bias"]), "glm_moe_dsa: mlp_bias=true is not supported")
    refuse(hf["q_lora_rank"] is None, "glm_moe_dsa: q_lora_rank must be set (its indexer reads the compressed query)")
    refuse(not hf["index_n_heads"], f"glm_moe_dsa: index_n_heads={hf['index_n_heads']!r}; its sparse attention "
           "needs the indexer's heads")
    shared = [i for i, kind in enumerate(indexer_types(hf)) if kind == "shared"]
    refuse(bool(shared), f"glm_moe_dsa: indexer_types make layers {shared} 'shared' (reusing an earlier layer's "
           "top-k keys, from indexer_types or index_topk_freq / index_skip_topk_offset / index_topk_pattern); "
           "jaxformer runs the indexer in every layer")
    experts = hf.get("num_experts") or hf["n_routed_experts"]  # the config class re-routes num_experts
    return dict(
        **deepseek.latent_decoder(hf, model_type, arch, experts, rope_from_hf(hf)), rope_interleave=True,
        index_heads=hf["index_n_heads"], index_head_dim=hf["index_head_dim"], index_topk=hf["index_topk"],
        index_rope_interleave=True, dense_layers=deepseek.indexed_dense_layers(hf, model_type),
        router_score="sigmoid", router_groups=hf["n_group"] or 1, router_topk_groups=hf["topk_group"] or 1,
        router_bias=True, normalize_router_weights=bool(hf["norm_topk_prob"]))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    deepseek.config_to_hf(cfg, "deepseek_v32", out)
    k, L = cfg.experts.dense_layers, cfg.decoder_layers
    out.update(mlp_bias=False, indexer_types=["full"] * L, mlp_layer_types=["dense"] * k + ["sparse"] * (L - k))
    out.pop("head_dim", None)  # the class sets it to qk_rope_head_dim whatever a file says


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    return deepseek.rules(cfg, "deepseek_v32", arch, prefix)


def ignored(hf: dict, names: set[str]) -> tuple[set[str], str]:
    """The published file's multi-token-prediction layer past num_hidden_layers (transformers skips it too)."""
    return prediction_layers(hf, names, hf.get("num_nextn_predict_layers") or 0)


HARMLESS = {
    **dict.fromkeys(("head_dim", "qk_head_dim"), "derived from qk_rope_head_dim and qk_nope_head_dim by the config "
                                                 "class, whatever the file says"),
    "num_nextn_predict_layers": "the multi-token-prediction layer, skipped with a note",
}

ARCHITECTURE = Architecture(CLASSES, {"glm_moe_dsa": "model."}, ("GlmMoeDsaModel",), config_from_hf, config_to_hf,
                            rules, ignored=ignored, harmless=HARMLESS, defaults=DEFAULTS)
