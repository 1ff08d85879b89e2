"""Mistral Small 4 (``mistral4``) as transformers computes it: the file as its config class writes it (the published
form, every key kept, sizes made tiny) reads as its transformers-5 form and matches transformers' numbers, queries
scaled by their position over three spans of the test sequence; the settings transformers cannot run or jaxformer
cannot honour are refused by name; greedy and beam generation with left padding are token-identical; a QLoRA
fine-tune starts from the file and learns. Parity of every layer and the bit-exact round trip of the tiny checkpoint
are in test_hf_parity.py, every key changed one at a time in test_config_keys.py, the preset's count against
transformers' in test_presets.py, the position scale across cached steps in test_generate.py's CACHE_CASES.

Mistral Large 4 (``mistral_large4``, ``mistral_large4_text``) is tested in test_mistral_large4.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxformer.interop.hf import config_from_hf  # noqa: E402

from family_files import (as_transformers_writes_it, generates_as_transformers, matches_transformers,  # noqa: E402
                          qlora_loss_falls, read, rewritten)

# Mistral4Config's keys as it writes them for mistralai/Mistral-Small-4-119B-2603 (the class's defaults are that
# checkpoint's shape; the hub file itself could not be read here), the rotary settings as its class fills them in,
# sizes and token ids those of the tiny checkpoint: 8 experts in 4 groups (top 3 from 2 groups), 1 dense layer,
# yarn over 4 positions with beta 0.5 (the published: 128 experts, top 4, no dense layer, yarn 128 over 8192, 0.1)
PUBLISHED = {"architectures": ["Mistral4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": 1, "dtype": "bfloat16", "eos_token_id": 2, "first_k_dense_replace": 1,
             "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 48,
             "kv_lora_rank": 12, "max_position_embeddings": 64, "model_type": "mistral4", "moe_intermediate_size": 16,
             "n_group": 4, "n_routed_experts": 8, "n_shared_experts": 1, "norm_topk_prob": True,
             "num_attention_heads": 4, "num_experts_per_tok": 3, "num_hidden_layers": 3, "num_key_value_heads": 4,
             "pad_token_id": 0, "pretraining_tp": 1, "q_lora_rank": 20, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
             "rms_norm_eps": 1e-06, "rope_interleave": True,
             "rope_parameters": {"type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                                 "original_max_position_embeddings": 4, "max_position_embeddings": 64,
                                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                                 "llama_4_scaling_beta": 0.5},
             "routed_scaling_factor": 1.5, "tie_word_embeddings": False, "topk_group": 2,
             "transformers_version": "5.3.0", "use_cache": True, "v_head_dim": 12, "vocab_size": 97}


def test_the_file_reads_as_its_transformers_5_form_and_matches_transformers(checkpoints, tmp_path):
    cfg = read(PUBLISHED)
    assert read(as_transformers_writes_it(PUBLISHED)).replace(name=cfg.name) == cfg
    assert (cfg.scores.position_scale, cfg.scores.position_span) == (0.5, 4)
    experts = cfg.experts
    assert (experts.router_score, experts.group_score, experts.router_bias, experts.router_groups) == \
        ("softmax", "best_two", False, 4)
    assert read({**PUBLISHED, "rope_parameters": {**PUBLISHED["rope_parameters"], "llama_4_scaling_beta": 0.25}}) \
        .scores.position_scale == 0.25  # (the key test changes no key inside rope_parameters)
    # 9 tokens: positions 0..8 fall in three spans of 4, each scaled by its own factor
    matches_transformers(rewritten(checkpoints("mistral4"), tmp_path / "published", PUBLISHED))


_ROPE = PUBLISHED["rope_parameters"]


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "llama_4_scaling_beta": 0.1,
                          "original_max_position_embeddings": 4}}, "rope_type 'default' is not supported"),
    ({"rope_parameters": {k: v for k, v in _ROPE.items() if k != "llama_4_scaling_beta"}},
     "needs llama_4_scaling_beta and original_max_position_embeddings"),
    ({"rope_parameters": {**_ROPE, "partial_rotary_factor": 1.0}}, "partial_rotary_factor=1.0 rotates 16 numbers"),
    ({"num_key_value_heads": 2}, "num_key_value_heads=2 differs from num_attention_heads=4"),
    ({"attention_bias": True}, "attention_bias=true is not supported"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED, **changes})


def test_generation_is_token_identical_to_transformers(checkpoints):
    generates_as_transformers(checkpoints("mistral4"))


def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(checkpoints, tmp_path):
    qlora_loss_falls(checkpoints("mistral4"), tmp_path)
