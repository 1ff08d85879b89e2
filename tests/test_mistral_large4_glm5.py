"""GLM-5 (``glm_moe_dsa``) as transformers computes it: the published file reads as its transformers-5 form and
matches transformers' numbers (its indexer rotating adjacent pairs, over sequences longer than its top-k); layers
that would reuse another layer's top-k choice, and the settings a latent-attention model cannot honour, are
refused by name; greedy and beam generation with left padding are token-identical; a QLoRA fine-tune starts from
the file and learns. Parity of every layer and the bit-exact round trip of the tiny checkpoint are in
test_hf_parity.py, every key changed one at a time in test_config_keys.py, the preset's count against
transformers' in test_presets.py, the cached indexer keys in test_generate.py's CACHE_CASES.

Mistral Small 4 is tested in test_mistral4.py, Mistral Large 4 in test_mistral_large4.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxformer.interop.hf import config_from_hf  # noqa: E402

from family_files import (as_transformers_writes_it, generates_as_transformers, matches_transformers,  # noqa: E402
                          qlora_loss_falls, read, rewritten)

# zai-org/GLM-5's config.json (as public copies of it give it; not checked against the hub file), every key kept,
# sizes and token ids those of the tiny checkpoint: 8 experts (top 3), 1 dense layer, 8 indexer heads of 12 keeping
# 4 keys (the published: 256 experts, top 8, 3 dense layers, 32 indexer heads of 128 keeping 2048)
PUBLISHED = {"architectures": ["GlmMoeDsaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "dtype": "bfloat16", "eos_token_id": [1, 2], "ep_size": 1, "first_k_dense_replace": 1,
             "hidden_act": "silu", "head_dim": 8, "hidden_size": 32, "index_head_dim": 12, "index_n_heads": 8,
             "index_topk": 4, "indexer_rope_interleave": True, "initializer_range": 0.02, "intermediate_size": 48,
             "kv_lora_rank": 12, "max_position_embeddings": 64, "moe_intermediate_size": 16, "moe_layer_freq": 1,
             "model_type": "glm_moe_dsa", "n_group": 1, "n_routed_experts": 8, "n_shared_experts": 1,
             "norm_topk_prob": True, "num_attention_heads": 4, "num_experts_per_tok": 3, "num_hidden_layers": 3,
             "num_key_value_heads": 4, "num_nextn_predict_layers": 1, "pad_token_id": 0, "pretraining_tp": 1,
             "q_lora_rank": 20, "qk_head_dim": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
             "rms_norm_eps": 1e-05, "rope_interleave": True,
             "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}, "routed_scaling_factor": 2.5,
             "scoring_func": "sigmoid", "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc",
             "transformers_version": "5.0.2.dev0", "use_cache": True, "v_head_dim": 12, "vocab_size": 97}


def test_the_published_file_reads_as_its_transformers_5_form_and_matches_transformers(checkpoints, tmp_path):
    cfg = read(PUBLISHED)
    assert read(as_transformers_writes_it(PUBLISHED)).replace(name=cfg.name) == cfg
    indexer = cfg.indexer
    assert (indexer.heads, indexer.head_dim, indexer.topk, indexer.rope_interleave, cfg.rotary.interleave) == \
        (8, 12, 4, True, True)
    assert (cfg.experts.router_score, cfg.experts.router_bias, cfg.experts.dense_layers) == ("sigmoid", True, 1)
    # 9 tokens against a top-4 choice: the later queries attend to their indexer's 4 keys alone
    matches_transformers(rewritten(checkpoints("glm_moe_dsa"), tmp_path / "published", PUBLISHED))


@pytest.mark.parametrize("changes, message", [
    ({"indexer_types": ["full", "shared", "full"]}, r"indexer_types make layers \[1\] 'shared'"),
    ({"index_topk_freq": 2}, r"indexer_types make layers \[2\] 'shared'"),
    ({"index_topk_pattern": "FFS"}, r"indexer_types make layers \[2\] 'shared'"),
    ({"indexer_types": ["full", "full", "sliding"]}, r"indexer_types \['sliding'\] are not supported"),
    ({"q_lora_rank": None}, "q_lora_rank must be set"),
    ({"num_key_value_heads": 2}, "num_key_value_heads=2 differs from num_attention_heads=4"),
    ({"mlp_layer_types": ["sparse", "dense", "sparse"]}, "dense layers first"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED, **changes})


def test_generation_is_token_identical_to_transformers(checkpoints):
    generates_as_transformers(checkpoints("glm_moe_dsa"))


def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(checkpoints, tmp_path):
    qlora_loss_falls(checkpoints("glm_moe_dsa"), tmp_path)
