"""DeepSeek-V4 (``deepseek_v4``: compressed sparse and heavily compressed attention, hyper-connections, hash-routed
experts) as transformers computes it: a file as published (the older keys its config class folds in) reads as its
transformers-5 form and matches transformers' numbers on a sequence long enough that the compressors close blocks
and the indexer narrows them (16 tokens: 8 CSA blocks of 2, top 2 kept; 4 HCA blocks of 4; a window of 4); settings
jaxformer cannot honour are refused by name; a QLoRA fine-tune starts from the file and learns. The hidden states
compared are what transformers returns for each layer: the residual's copies [B, T, hc_mult, D], the last one after
the hyper-head and the final norm. Parity of every layer on the 9-token batch and the bit-exact round trip are in
test_hf_parity.py, every key changed one at a time in test_config_keys.py, the presets' counts in test_presets.py,
a cached step's logits equal a full pass's in test_generate.py (CACHE_CASES' "deepseek-v4")."""

from __future__ import annotations

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402

from jaxformer.cache import CompressedCache, compressed_footprint  # noqa: E402
from jaxformer.compare import compare, format_table, reference_model  # noqa: E402

from family_files import (TOLERANCE, as_transformers_writes_it, generates_as_transformers,  # noqa: E402
                          matches_transformers, qlora_loss_falls, read, rewritten)

# deepseek-ai/DeepSeek-V4-Flash's config.json keys (public copies of the file; its fp8 quantization_config left out:
# the tiny weights are float), sizes those of hf_factory's "deepseek-v4": the schedule as compress_ratios with the
# tiny block sizes in the older compress_rate_csa / compress_rate_hca keys, num_hash_layers, qk_rope_head_dim and a
# flat yarn rope_scaling
PUBLISHED = {
    "architectures": ["DeepseekV4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "compress_ratios": [128, 4, 0, 4], "compress_rate_csa": 2, "compress_rate_hca": 4, "compress_rope_theta": 160000.0,
    "eos_token_id": 2, "hc_eps": 1e-06, "hc_mult": 3, "hc_sinkhorn_iters": 6, "head_dim": 16, "hidden_act": "silu",
    "hidden_size": 32, "index_head_dim": 12, "index_n_heads": 8, "index_topk": 2, "initializer_range": 0.2,
    "max_position_embeddings": 64, "model_type": "deepseek_v4", "moe_intermediate_size": 16, "n_routed_experts": 4,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 4, "num_experts_per_tok": 2,
    "num_hidden_layers": 4, "num_hash_layers": 1, "num_key_value_heads": 1, "num_nextn_predict_layers": 1,
    "o_groups": 2, "o_lora_rank": 8, "q_lora_rank": 24, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4, "original_max_position_embeddings": 16,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "sliding_window": 4,
    "swiglu_limit": 1.0, "tie_word_embeddings": False, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.57.1", "use_cache": True, "vocab_size": 97}


def test_the_published_file_reads_as_its_transformers_5_form_and_matches_transformers(checkpoints, tmp_path):
    cfg = read(PUBLISHED)
    assert read(as_transformers_writes_it(PUBLISHED)).replace(name=cfg.name) == cfg
    part = cfg.scores.compressed
    assert (part.layers, part.sparse_rate, part.heavy_rate, cfg.experts.hash_layers, cfg.rope_dim) == \
        (("heavy", "sparse", "sliding", "sparse"), 2, 4, 1, 8)
    # the window-only layers rotate unscaled; the compressed ones by yarn, cos and sin unscaled (attention_factor 1)
    assert cfg.rotary.scaling is None and part.rope_scaling.attention_factor == 1.0
    matches_transformers(rewritten(checkpoints("deepseek-v4"), tmp_path / "published", PUBLISHED), length=16)


@pytest.mark.parametrize("changes, message", [
    ({"scoring_func": "softmax"}, "scoring_func='softmax' is not supported"),
    ({"compress_ratios": [128, 4, 0, 8]}, "compress_ratios .* must each be one of"),
    ({"mlp_layer_types": ["moe", "hash_moe", "moe", "moe"]}, "hash_moe layers first"),
    ({"mlp_bias": True}, "mlp_bias=true is not supported"),
    ({"intermediate_size": 48}, "intermediate_size=48 and moe_intermediate_size=16 differ"),
    ({"rope_parameters": {"main": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
                          "compress": {"rope_type": "default", "rope_theta": 1.6e5, "partial_rotary_factor": 0.25}}},
     "rotary widths of rope_parameters' main \\(8\\) and compress \\(4\\) differ"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED, **changes})


def test_an_input_shorter_than_a_block_or_past_whole_blocks_matches_transformers(checkpoints):
    """1 token (shorter than both blocks, 2 and 4, and the window of 4: no entry at all) and 7 (a whole number of
    neither: each compressor leaves a tail): every layer and the logits as transformers'."""
    folder = checkpoints("deepseek-v4")
    model, reference = jf.from_pretrained(folder), reference_model(folder)
    for length in (1, 7):
        ids = np.random.default_rng(0).integers(3, 97, (2, length))
        rows = compare(folder, ids, model=model, reference=reference)
        assert all(r.max_abs <= TOLERANCE for r in rows), (length, format_table(rows, TOLERANCE))


def test_greedy_and_beam_search_match_transformers_full_forward_with_left_padding(checkpoints):
    """Generation against transformers' use_cache=False: its cached HCA step (one token) reads every entry whose
    block has closed, where its full forward and its prefill hide the entries a left-padded row's position_ids
    have not passed yet (query p reads block w < (p + 1) // rate). Its cached generation departs from its own full
    forward on the padded rows there (masking that step by position_ids makes them agree); ours follows the full
    forward at every step. Unpadded rows are the same either way. (Left pads do count: their states, which no
    real token attends to, are in the compressors' blocks, as there.)"""
    generates_as_transformers(checkpoints("deepseek-v4"), use_cache=False)


def test_the_state_is_what_jaxformer_info_counts_and_drafting_is_refused(checkpoints):
    model = jf.from_pretrained(checkpoints("deepseek-v4"))
    cfg, length = model.config, 8  # (a whole number of both blocks: the entries fill their slots exactly)
    state = model.init_cache(1, length).kv
    assert isinstance(state, CompressedCache)
    per_token, bounded = compressed_footprint(cfg)
    numbers = sum(leaf.size for leaf in jax.tree.leaves(state.by_kind))
    assert numbers == per_token * length + bounded
    with pytest.raises(ValueError, match="compressed-attention layers .* cannot be rewound"):
        model.generate(np.full((1, 5), 3), max_new_tokens=2, prompt_lookup_num_tokens=2)
    # its compressors pool blocks across documents: packed rows are refused before anything runs
    with pytest.raises(ValueError, match="cannot pack documents: DeepSeek-V4's compressors pool blocks"):
        model(np.full((1, 8), 3), segment_ids=np.array([[1] * 4 + [2] * 4]))


@pytest.mark.parametrize("changes, message", [
    (dict(qk_norm=True), r"compressed_layers .* does not take \['qk_norm'\]"),
    (dict(attention_dropout_rate=0.1), r"does not take \['attention_dropout_rate'\]"),
    (dict(sandwich_norm=True), r"hyper-connections.* \['sandwich_norm'\] cannot be combined"),
])
def test_a_setting_the_compressed_layers_would_ignore_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        jf.config("deepseek-v4-flash").replace(**changes)


def test_a_setting_of_an_absent_nested_part_is_refused_not_dropped():
    with pytest.raises(ValueError, match="compressed_q_rank=8 needs compressed_layers"):
        jf.config("tiny-llama").replace(compressed_q_rank=8)
    with pytest.raises(ValueError, match="hc_eps=0.001 needs hc_streams"):
        jf.config("tiny-llama").replace(hc_eps=1e-3)


def test_hash_routing_needs_the_compressed_layer_groups_and_offset_zero_a_clamp():
    with pytest.raises(ValueError, match="hash_layers=3 .* compressed attention's layer groups"):
        jf.config("deepseek-v3").replace(hash_layers=3)
    with pytest.raises(ValueError, match="swiglu_offset=0.0 .* only with a swiglu_limit"):
        jf.config("tiny-llama").replace(swiglu_alpha=1.702, swiglu_offset=0.0)


def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(checkpoints, tmp_path):
    qlora_loss_falls(checkpoints("deepseek-v4"), tmp_path, "finetune.lora.targets=q_up,o,wi")
