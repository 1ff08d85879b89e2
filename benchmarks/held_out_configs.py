"""The published config.json files of benchmarks/held_out.py's three sets.

Sets 2 and 3 (and the few first-set files tests/published_configs.py lacks) are written here at their published
sizes with every key their files carry, from memory of the hub files and of transformers' own docs (no network here:
none was checked against the hub; keys or values not remembered for sure are marked). ``tiny`` then makes the sizes
small the same way for all of them (widths, heads, layers, vocabularies, experts, windows) and leaves every other key
as published. Token ids past the tiny vocabulary are moved to its last ids, which the benchmark's inputs never use.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1] / "tests") not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from published_configs import PUBLISHED  # noqa: E402

VOCAB = 97
RESERVED = 12  # the last ids of the tiny vocabulary: the published special ids that did not fit land here
WIDTHS = {"hidden_size": 32, "d_model": 32, "n_embd": 32, "word_embed_proj_dim": 32, "intermediate_size": 48,
          "ffn_dim": 48, "d_ff": 48, "encoder_ffn_dim": 48, "decoder_ffn_dim": 48, "d_inner": 48,
          "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "num_attention_heads": 4, "n_head": 4,
          "num_heads": 4, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "head_dim": 8, "d_head": 8,
          "vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB, "kv_lora_rank": 16, "q_lora_rank": 24,
          "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 8,
          "num_local_experts": 8, "num_experts": 8, "sliding_window": 6, "attention_chunk_size": 6,
          "global_head_dim": 16, "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2,
          "linear_num_value_heads": 4, "index_head_dim": 16, "index_n_heads": 8, "index_topk": 4, "o_lora_rank": 8}
# (8 indexer heads of 16, not fewer: with one or two heads many relu'd scores tie at exactly 0, and which tied keys a
# top-k keeps is left open by both libraries: torch and JAX keep different ones, a difference no published size has)
LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers", "num_decoder_layers",
          "depth")
KV_HEADS = ("num_key_value_heads", "num_global_key_value_heads", "num_kv_heads")
TOP_K = ("num_experts_per_tok", "top_k_experts", "moe_k")
PER_LAYER = ("layer_types", "mlp_layer_types", "no_rope_layers", "attention_window", "compress_ratios",
             "kv_source_layers", "indexer_types")


def _shrink(hf: dict, layers: int) -> dict:
    out = {}
    published_layers = next((hf[k] for k in LAYERS if isinstance(hf.get(k), int)), None)
    published_heads = next((hf[k] for k in ("num_attention_heads", "n_head", "num_heads") if hf.get(k)), None)
    for key, value in hf.items():
        if isinstance(value, dict) and key.endswith("_config"):
            value = _shrink(value, layers)
        if value is None or isinstance(value, bool):
            out[key] = value
        elif key in WIDTHS and isinstance(value, int) and value > 0:
            out[key] = WIDTHS[key]
        elif key in LAYERS and isinstance(value, int):
            out[key] = layers
        elif key in KV_HEADS and isinstance(value, int):
            out[key] = 4 if value == published_heads else 1 if value == 1 else 2
        elif key in TOP_K and isinstance(value, int):
            out[key] = min(value, 4)
        elif key in ("n_group", "topk_group") and isinstance(value, int) and value > 1:
            out[key] = 4 if key == "n_group" else 2
        elif key in PER_LAYER and isinstance(value, list) and len(value) == published_layers:
            out[key] = value[:layers]
        elif key == "mlp_only_layers" and isinstance(value, list):
            out[key] = [i for i in value if i < layers]
        else:
            out[key] = value
    return out


def _move_ids(hf, moved: dict) -> None:
    """Special ids past the tiny vocabulary to its last RESERVED ids, the same id to the same place."""
    for key, value in hf.items():
        if isinstance(value, dict):
            _move_ids(value, moved)
        elif key.endswith(("token_id", "token_index", "token_ids")) and value is not None:
            ids = value if isinstance(value, list) else [value]
            if all(isinstance(i, int) for i in ids):
                new = [i if i < VOCAB - RESERVED else moved.setdefault(i, VOCAB - 1 - len(moved)) for i in ids]
                hf[key] = new if isinstance(value, list) else new[0]


def tiny(published: dict, layers: int = 2, **sizes) -> dict:
    """A published file at tiny sizes: ``_shrink``'s table, then ``sizes`` (a file's own, where the table's do not
    fit it; a dict value updates the sub-dict of that name)."""
    out = _shrink(copy.deepcopy(published), layers)
    for key, value in sizes.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    _move_ids(out, {})
    return out


def _every(n: int, period: int, last: str, other: str) -> list[str]:
    """A layer_types list: every ``period``-th layer ``last``, the others ``other``."""
    return [last if (i + 1) % period == 0 else other for i in range(n)]


_SLIDE, _FULL = "sliding_attention", "full_attention"

# ------------------------------------------------------------------------------------------------ the second set
SECOND = {
    "SmolLM3-3B": tiny({
        "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": None, "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 11008, "layer_types": [_FULL] * 36, "max_position_embeddings":
        65536, "max_window_layers": 28, "mlp_bias": False, "model_type": "smollm3", "no_rope_layer_interval": 4,
        "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(36)], "num_attention_heads": 16,
        "num_hidden_layers": 36, "num_key_value_heads": 4, "pad_token_id": 128004, "pretraining_tp": 2,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 5000000.0, "sliding_window": None,
        "torch_dtype": "bfloat16", "transformers_version": "4.54.0.dev0", "use_cache": False,
        "use_sliding_window": False, "vocab_size": 128256}, layers=4),
    "OLMoE-1B-7B-0924": tiny({
        "architectures": ["OlmoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None,
        "clip_qkv": None, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 1024, "max_position_embeddings": 4096, "model_type": "olmoe", "norm_topk_prob": False,
        "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
        "num_key_value_heads": 16, "output_router_logits": False, "pad_token_id": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 50304}),
    "granite-3.0-3b-a800m-instruct": tiny({
        "architectures": ["GraniteMoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.1,
        "attention_multiplier": 0.015625, "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0,
        "hidden_act": "silu", "hidden_size": 1536, "initializer_range": 0.02, "intermediate_size": 512,
        "logits_scaling": 6.0, "max_position_embeddings": 4096, "model_type": "granitemoe", "num_attention_heads": 24,
        "num_experts_per_tok": 8, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 40,
        "output_router_logits": False, "pad_token_id": 0, "residual_multiplier": 0.22, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 10000, "router_aux_loss_coef": 0.0, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.46.0.dev0", "use_cache": True, "vocab_size": 49155}),
    # the longrope factors: 32 per list as published (head_dim 128 / 2), 4 here (head_dim 8 / 2), values kept in kind
    "Phi-3.5-MoE-instruct": tiny({
        "_name_or_path": "Phi-3.5-moe-instruct", "architectures": ["PhiMoEForCausalLM"], "attention_bias": True,
        "attention_dropout": 0.0, "auto_map": {"AutoConfig": "configuration_phimoe.PhiMoEConfig",
                                               "AutoModelForCausalLM": "modeling_phimoe.PhiMoEForCausalLM"},
        "bos_token_id": 1, "eos_token_id": 32000, "hidden_act": "silu", "hidden_dropout": 0.0, "hidden_size": 4096,
        "initializer_range": 0.02, "input_jitter_noise": 0.01, "intermediate_size": 6400, "lm_head_bias": True,
        "max_position_embeddings": 131072, "model_type": "phimoe", "num_attention_heads": 32,
        "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 16,
        "original_max_position_embeddings": 4096, "output_router_logits": False, "rms_norm_eps": 1e-05,
        "rope_scaling": {"long_factor": [1.0199999809265137, 1.0299999713897705, 1.04, 1.0499999523162842],
                         "long_mscale": 1.243163121016122, "original_max_position_embeddings": 4096,
                         "short_factor": [1.0, 1.0399999618530273, 1.0399999618530273, 1.0399999618530273],
                         "short_mscale": 1.243163121016122, "type": "longrope"},
        "rope_theta": 10000.0, "router_aux_loss_coef": 0.0, "router_jitter_noise": 0.01, "sliding_window": 131072,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": True,
        "vocab_size": 32064}, sliding_window=131072),
    "c4ai-command-r-v01": tiny({
        "architectures": ["CohereForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 5,
        "eos_token_id": 255001, "hidden_act": "silu", "hidden_size": 8192, "initializer_range": 0.02,
        "intermediate_size": 22528, "layer_norm_eps": 1e-05, "logit_scale": 0.0625, "max_position_embeddings": 8192,
        "model_type": "cohere", "num_attention_heads": 64, "num_hidden_layers": 40, "num_key_value_heads": 64,
        "pad_token_id": 0, "rope_theta": 8000000.0, "torch_dtype": "float16", "transformers_version": "4.38.2",
        "use_cache": True, "use_qk_norm": False, "vocab_size": 256000}),
    "ERNIE-4.5-0.3B-PT": tiny({
        "architectures": ["Ernie4_5ForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 131072,
        "model_type": "ernie4_5", "num_attention_heads": 16, "num_hidden_layers": 18, "num_key_value_heads": 2,
        "pad_token_id": 0, "rms_norm_eps": 1e-05, "rope_theta": 500000, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "use_bias": False, "use_cache": False, "vocab_size": 103424}),
    # 4 layers: the fourth is the full-attention one (full_attention_interval 4)
    "Qwen3-Next-80B-A3B-Instruct": tiny({
        "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4,
        "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
        "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next",
        "moe_intermediate_size": 512, "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512,
        "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2, "output_router_logits": False,
        "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000,
        "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.57.0.dev0", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936}, layers=4, head_dim=16),
    "GLM-4.5-Air": tiny({
        "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 4096, "partial_rotary_factor": 0.5, "initializer_range": 0.02, "intermediate_size": 10944,
        "max_position_embeddings": 131072, "model_type": "glm4_moe", "moe_intermediate_size": 1408, "n_group": 1,
        "n_routed_experts": 128, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 96,
        "num_experts_per_tok": 8, "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8,
        "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
        "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1, "torch_dtype": "bfloat16",
        "transformers_version": "4.54.0", "use_cache": True, "use_qk_norm": False, "vocab_size": 151552}, layers=3),
    "Llama-3.2-1B": tiny({
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256}),
    "Llama-3.3-70B-Instruct": tiny({
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 8192, "initializer_range": 0.02, "intermediate_size": 28672, "max_position_embeddings": 131072,
        "mlp_bias": False, "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 80,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.47.0.dev0", "use_cache": True, "vocab_size": 128256}),
    "Qwen2.5-7B-Instruct": tiny({
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
        "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen2",
        "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 152064},
        sliding_window=131072),
    "Qwen3-8B": tiny({
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
        "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}),
    "Mistral-7B-Instruct-v0.3": tiny({
        "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.42.0.dev0", "use_cache": True, "vocab_size": 32768}),
    "Mixtral-8x22B-v0.1": tiny({
        "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 6144, "initializer_range": 0.02, "intermediate_size": 16384,
        "max_position_embeddings": 65536, "model_type": "mixtral", "num_attention_heads": 48,
        "num_experts_per_tok": 2, "num_hidden_layers": 56, "num_key_value_heads": 8, "num_local_experts": 8,
        "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.38.0", "use_cache": True, "vocab_size": 32000}),
    "gemma-2-2b": tiny({
        "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
        "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
        "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
        "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
        "torch_dtype": "float32", "transformers_version": "4.42.4", "use_cache": True, "vocab_size": 256000},
        query_pre_attn_scalar=8),
    # google/gemma-3-270m: layer_types written out (transformers 4.55), no sliding_window_pattern
    "gemma-3-270m": tiny({
        "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1,
        "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 640, "initializer_range": 0.02, "intermediate_size": 2048,
        "layer_types": _every(18, 6, _FULL, _SLIDE), "max_position_embeddings": 32768, "model_type": "gemma3_text",
        "num_attention_heads": 4, "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": 512, "torch_dtype": "bfloat16",
        "transformers_version": "4.55.0.dev0", "use_bidirectional_attention": False, "use_cache": True,
        "vocab_size": 262144}, layers=6, query_pre_attn_scalar=8),
    # the longrope factors: 48 per list as published (a rotary width of 96 / 2), 3 here
    "Phi-4-mini-instruct": tiny({
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                     "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM",
                     "AutoTokenizer": "Xenova/gpt-4o"},
        "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1, "hidden_act": "silu",
        "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192, "interpolate_factor": 1,
        "lm_head_bias": False, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "phi3",
        "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "original_max_position_embeddings": 4096, "pad_token_id": 199999, "partial_rotary_factor": 0.75,
        "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"long_factor": [1, 1.118320672, 1.250641126], "short_factor": [1.0, 1.0, 1.0],
                         "type": "longrope"},
        "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0", "use_cache": True, "vocab_size": 200064}, sliding_window=262144),
    "phi-4": tiny({
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 100257, "embd_pdrop": 0.0, "eos_token_id": 100265, "hidden_act": "silu", "hidden_size": 5120,
        "initializer_range": 0.02, "intermediate_size": 17920, "max_position_embeddings": 16384,
        "model_type": "phi3", "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 10,
        "original_max_position_embeddings": 16384, "pad_token_id": 100349, "resid_pdrop": 0.0,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 250000, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.47.0",
        "use_cache": True, "vocab_size": 100352}),
    # 16 experts in 4 groups of 4 (256 in 8 published): the group-limited routing still chooses
    "DeepSeek-V3": tiny({
        "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                     "AutoModel": "modeling_deepseek.DeepseekV3Model",
                     "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
        "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
        "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
        "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
        "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
        "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
        "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "pretraining_tp": 1,
        "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]},
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
        "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
        "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280},
        layers=3, first_k_dense_replace=1, n_routed_experts=16),
    "OLMo-2-1124-7B": tiny({
        "architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": None, "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "olmo2",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "pad_token_id": 100277,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False,
        "torch_dtype": "float32", "transformers_version": "4.47.0.dev0", "use_cache": True, "vocab_size": 100352}),
    "starcoder2-7b": tiny({
        "architectures": ["Starcoder2ForCausalLM"], "attention_dropout": 0.1, "bos_token_id": 0, "embedding_dropout":
        0.1, "eos_token_id": 0, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 4608, "initializer_range": 0.018042,
        "intermediate_size": 18432, "layer_norm_epsilon": 1e-05, "max_position_embeddings": 16384, "mlp_type":
        "default", "model_type": "starcoder2", "norm_epsilon": 1e-05, "norm_type": "layer_norm",
        "num_attention_heads": 36, "num_hidden_layers": 32, "num_key_value_heads": 4, "residual_dropout": 0.1,
        "rope_theta": 1000000, "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.37.0.dev0",
        "use_bias": True, "use_cache": True, "vocab_size": 49152}),
    "granite-3.1-8b-instruct": tiny({
        "architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_dropout": 0.1,
        "attention_multiplier": 0.0078125, "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12800,
        "logits_scaling": 16.0, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "granite",
        "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0,
        "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000000.0,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.47.0", "use_cache": True,
        "vocab_size": 49155}),
    "falcon-7b": tiny({
        "alibi": False, "apply_residual_connection_post_layernorm": False, "architectures": ["FalconForCausalLM"],
        "attention_dropout": 0.0, "auto_map": {"AutoConfig": "configuration_falcon.FalconConfig",
                                               "AutoModel": "modeling_falcon.FalconModel",
                                               "AutoModelForCausalLM": "modeling_falcon.FalconForCausalLM"},
        "bias": False, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0, "hidden_size": 4544,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon", "multi_query": True,
        "new_decoder_architecture": False, "num_attention_heads": 71, "num_hidden_layers": 32,
        "parallel_attn": True, "torch_dtype": "bfloat16", "transformers_version": "4.27.4", "use_cache": True,
        "vocab_size": 65024}),
    "falcon-40b": tiny({
        "alibi": False, "apply_residual_connection_post_layernorm": False, "architectures": ["FalconForCausalLM"],
        "attention_dropout": 0.0, "bias": False, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
        "hidden_size": 8192, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
        "new_decoder_architecture": True, "num_attention_heads": 128, "num_hidden_layers": 60, "num_kv_heads": 8,
        "parallel_attn": True, "torch_dtype": "bfloat16", "transformers_version": "4.27.4", "use_cache": True,
        "vocab_size": 65024}),
    "opt-1.3b": tiny({
        "_name_or_path": "facebook/opt-1.3b", "_remove_final_layer_norm": False, "activation_dropout": 0.0,
        "activation_function": "relu", "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": 2, "do_layer_norm_before": True, "dropout": 0.1, "eos_token_id": 2, "ffn_dim": 8192,
        "hidden_size": 2048, "init_std": 0.02, "layerdrop": 0.0, "max_position_embeddings": 2048,
        "model_type": "opt", "num_attention_heads": 32, "num_hidden_layers": 24, "pad_token_id": 1, "prefix": "</s>",
        "torch_dtype": "float16", "transformers_version": "4.21.0.dev0", "use_cache": True, "vocab_size": 50272,
        "word_embed_proj_dim": 2048}),
    "stablelm-2-1_6b": tiny({
        "architectures": ["StableLmForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 100257,
        "eos_token_id": 100257, "hidden_act": "silu", "hidden_dropout": 0.0, "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 5632, "layer_norm_eps": 1e-05, "max_position_embeddings":
        4096, "model_type": "stablelm", "num_attention_heads": 32, "num_hidden_layers": 24, "num_key_value_heads": 32,
        "partial_rotary_factor": 0.25, "qk_layernorm": False, "rope_scaling": None, "rope_theta": 10000,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
        "use_cache": True, "use_parallel_residual": False, "use_qkv_bias": True, "vocab_size": 100352}),
    # the published file keeps the original release's experts_per_token and initial_context_length; MXFP4
    # quantization_config left out (a bfloat16 conversion, the experts stored dequantized)
    "gpt-oss-120b": tiny({
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
        "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
        "layer_types": [_SLIDE, _FULL] * 18, "max_position_embeddings": 131072, "model_type": "gpt_oss",
        "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 8,
        "num_local_experts": 128, "output_router_logits": False, "pad_token_id": 199999, "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings":
                         4096, "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
        "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True,
        "vocab_size": 201088}),
    # the wrapper file: text model under language_model, a vision tower (made tiny too); 4 layers so that one is the
    # NoPE global layer (every fourth) and the chunked ones see a chunk of 6
    "Llama-4-Scout-17B-16E-Instruct": tiny({
        "architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080, "eoi_token_index": 200081,
        "image_token_index": 200092, "model_type": "llama4",
        "text_config": {
            "_attn_implementation_autoset": True, "attention_bias": False, "attention_chunk_size": 8192,
            "attention_dropout": 0.0, "attn_scale": 0.1, "attn_temperature_tuning": True, "bos_token_id": 200000,
            "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192, "for_llm_compressor": False,
            "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
            "interleave_moe_layer_step": 1, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "max_position_embeddings": 10485760, "model_type": "llama4_text", "moe_layers": list(range(48)),
            "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(48)], "num_attention_heads": 40,
            "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16,
            "output_router_logits": False, "pad_token_id": 200018, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
            "torch_dtype": "bfloat16", "use_cache": True, "use_qk_norm": True, "vocab_size": 202048},
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0.dev0",
        "vision_config": {
            "_attn_implementation_autoset": True, "attention_dropout": 0.0, "hidden_act": "gelu", "hidden_size": 1408,
            "image_size": 336, "initializer_range": 0.02, "intermediate_size": 5632,
            "model_type": "llama4_vision_model",
            "multi_modal_projector_bias": False, "norm_eps": 1e-05, "num_attention_heads": 16, "num_channels": 3,
            "num_hidden_layers": 34, "patch_size": 14, "pixel_shuffle_ratio": 0.5, "projector_dropout": 0.0,
            "projector_input_dim": 4096, "projector_output_dim": 4096, "rope_theta": 10000,
            "vision_feature_layer": -1, "vision_feature_select_strategy": "default", "vision_output_dim": 4096}},
        layers=4, text_config={"moe_layers": [0, 1, 2, 3], "intermediate_size_mlp": 48},
        vision_config={"projector_input_dim": 16, "projector_output_dim": 32, "vision_output_dim": 16,
                       "image_size": 28}),
    "GLM-4-9B-0414": tiny({
        "architectures": ["Glm4ForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 13696, "max_position_embeddings": 32768, "model_type": "glm4",
        "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
        "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 10000, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.52.0.dev0", "use_cache": True, "vocab_size": 151552}),
    "Qwen1.5-MoE-A2.7B": tiny({
        "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
        "model_type": "qwen2_moe", "moe_intermediate_size": 1408, "norm_topk_prob": False, "num_attention_heads": 16,
        "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
        "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 5632, "sliding_window": 32768, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936}, sliding_window=32768),
    # layer_types as transformers 4.50 wrote it (three sliding, one full)
    "c4ai-command-r7b-12-2024": tiny({
        "architectures": ["Cohere2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 5, "cache_implementation": "hybrid", "eos_token_id": 255001, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "layer_norm_eps": 1e-05, "layer_types": _every(32, 4, _FULL, _SLIDE), "logit_scale": 0.25,
        "max_position_embeddings": 8192, "model_type": "cohere2", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "order_of_interleaved_layers": "local_attn_first",
        "pad_token_id": 0, "position_embedding_type": "rope_gptj", "rope_scaling": None, "rope_theta": 50000,
        "rotary_pct": 1.0, "sliding_window": 4096, "sliding_window_pattern": 4, "torch_dtype": "bfloat16",
        "transformers_version": "4.48.0.dev0", "use_cache": True, "use_embedding_sharing": True,
        "use_gated_activation": True, "use_parallel_block": True, "use_parallel_embedding": True,
        "vocab_size": 256000}, layers=4),
}
assert len(SECOND) == 31, len(SECOND)

# ------------------------------------------------------------------------------------------------- the third set
# DeepSeek-V4-Flash's file in the form transformers 5's class notes call legacy (compress_ratios per layer,
# num_hash_layers, qk_rope_head_dim): the values are the class defaults its docstring names, not the hub file
_V4_LAYERS = [0, 0] + [4 if i % 2 else 128 for i in range(41)]
THIRD = {
    "DeepSeek-V4-Flash": tiny({
        "architectures": ["DeepseekV4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 0, "compress_ratios": _V4_LAYERS, "compress_rope_theta": 160000, "eos_token_id": 1,
        "hc_eps": 1e-06, "hc_mult": 4, "hc_sinkhorn_iters": 20, "head_dim": 512, "hidden_act": "silu",
        "hidden_size": 4096, "index_head_dim": 128, "index_n_heads": 64, "index_topk": 512,
        "initializer_range": 0.02, "max_position_embeddings": 1048576, "model_type": "deepseek_v4",
        "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": 64, "num_experts_per_tok": 6, "num_hash_layers": 3, "num_hidden_layers": 43,
        "num_key_value_heads": 1, "num_nextn_predict_layers": 1, "o_groups": 8, "o_lora_rank": 1024,
        "q_lora_rank": 1024, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536,
                         "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "sliding_window": 128,
        "swiglu_limit": 10.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1", "vocab_size": 129280},
        layers=4, head_dim=16, o_groups=2, compress_ratios=[0, 0, 128, 4], num_hash_layers=1),
    # Qwen/Qwen3.5-27B: the wrapper (text model under language_model, a vision tower), M-RoPE's sections in its rotary
    # dict; the published sizes beyond the class defaults (64 layers, 5120 wide, 24 heads) are from memory
    "Qwen3.5-27B": tiny({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "image_token_id": 248056, "model_type": "qwen3_5",
        "text_config": {
            "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": 248044,
            "dtype": "bfloat16", "eos_token_id": 248044, "full_attention_interval": 4, "head_dim": 256,
            "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17408,
            "layer_types": _every(64, 4, _FULL, "linear_attention"), "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
            "linear_value_head_dim": 128, "max_position_embeddings": 262144, "model_type": "qwen3_5_text",
            "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False, "num_attention_heads": 24,
            "num_hidden_layers": 64, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
            "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor":
                                0.25, "rope_theta": 10000000, "rope_type": "default"},
            "tie_word_embeddings": False, "use_cache": True, "vocab_size": 248320},
        "tie_word_embeddings": False, "transformers_version": "4.57.0.dev0", "video_token_id": 248057,
        "vision_config": {
            "deepstack_visual_indexes": [], "depth": 27, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152,
            "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4304, "model_type": "qwen3_5",
            "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 5120, "patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2},
        "vision_end_token_id": 248054, "vision_start_token_id": 248053},
        layers=4, text_config={"head_dim": 16, "rope_parameters": {
            "mrope_interleaved": True, "mrope_section": [1, 1, 0], "partial_rotary_factor": 0.25,
            "rope_theta": 10000000, "rope_type": "default"}},
        vision_config={"out_hidden_size": 32, "num_position_embeddings": 16}),
    "Qwen3.5-35B-A3B": tiny({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "image_token_id": 248056, "model_type": "qwen3_5_moe",
        "text_config": {
            "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": 248044,
            "dtype": "bfloat16", "eos_token_id": 248044, "full_attention_interval": 4, "head_dim": 256,
            "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
            "layer_types": _every(40, 4, _FULL, "linear_attention"), "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "linear_value_head_dim": 128, "max_position_embeddings": 262144, "model_type": "qwen3_5_moe_text",
            "moe_intermediate_size": 512, "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
            "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8, "num_hidden_layers": 40,
            "num_key_value_heads": 2, "output_router_logits": False, "rms_norm_eps": 1e-06,
            "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor":
                                0.25, "rope_theta": 10000000, "rope_type": "default"},
            "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
            "use_cache": True, "vocab_size": 248320},
        "tie_word_embeddings": False, "transformers_version": "4.57.0.dev0", "video_token_id": 248057,
        "vision_config": {
            "deepstack_visual_indexes": [], "depth": 27, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152,
            "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4304, "model_type": "qwen3_5_moe",
            "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 2048, "patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2},
        "vision_end_token_id": 248054, "vision_start_token_id": 248053},
        layers=4, text_config={"head_dim": 16, "rope_parameters": {
            "mrope_interleaved": True, "mrope_section": [1, 1, 0], "partial_rotary_factor": 0.25,
            "rope_theta": 10000000, "rope_type": "default"}},
        vision_config={"out_hidden_size": 32, "num_position_embeddings": 16}),
    # google/gemma-4-31B-it as public code copies it (jaxformer's preset's source): full layers with keys as values,
    # their own head size and kv heads, no per-layer inputs; 6 layers, the sixth full
    "gemma-4-31B-it": tiny({
        "architectures": ["Gemma4ForConditionalGeneration"], "audio_config": None, "boi_token_id": 255999,
        "eoi_token_id": 258882, "image_token_id": 258880, "initializer_range": 0.02, "model_type": "gemma4",
        "text_config": {
            "attention_bias": False, "attention_dropout": 0.0, "attention_k_eq_v": True, "bos_token_id": 2,
            "enable_moe_block": False, "eos_token_id": 1, "final_logit_softcapping": 30.0, "global_head_dim": 512,
            "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 5376,
            "hidden_size_per_layer_input": 0, "initializer_range": 0.02, "intermediate_size": 21504,
            "layer_types": _every(60, 6, _FULL, _SLIDE), "max_position_embeddings": 262144,
            "model_type": "gemma4_text", "moe_intermediate_size": None, "num_attention_heads": 32, "num_experts": None,
            "num_global_key_value_heads": 4, "num_hidden_layers": 60, "num_key_value_heads": 16,
            "num_kv_shared_layers": 0, "pad_token_id": 0, "rms_norm_eps": 1e-06,
            "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                                   "rope_type": "proportional"},
                                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
            "sliding_window": 1024, "tie_word_embeddings": True, "top_k_experts": None,
            "use_bidirectional_attention": "vision", "use_cache": True, "use_double_wide_mlp": False,
            "vocab_size": 262144, "vocab_size_per_layer_input": 262144},
        "tie_word_embeddings": True, "transformers_version": "5.5.0.dev0", "video_token_id": 258884,
        "vision_config": {
            "attention_bias": False, "attention_dropout": 0.0, "head_dim": 72, "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 4304, "max_position_embeddings":
            131072, "model_type": "gemma4_vision", "num_attention_heads": 16, "num_hidden_layers": 27,
            "num_key_value_heads": 16, "patch_size": 16, "pooling_kernel_size": 3, "position_embedding_size": 10240,
            "rms_norm_eps": 1e-06, "standardize": False, "use_clipped_linears": False},
        "vision_soft_tokens_per_image": 280},
        layers=6, vision_config={"position_embedding_size": 64}),
    # google/gemma-4-26B-A4B-it: the 31B's layout with experts beside each MLP (128, top 8) (sizes from memory)
    "gemma-4-26B-A4B-it": tiny({
        "architectures": ["Gemma4ForConditionalGeneration"], "audio_config": None, "boi_token_id": 255999,
        "eoi_token_id": 258882, "image_token_id": 258880, "initializer_range": 0.02, "model_type": "gemma4",
        "text_config": {
            "attention_bias": False, "attention_dropout": 0.0, "attention_k_eq_v": True, "bos_token_id": 2,
            "enable_moe_block": True, "eos_token_id": 1, "final_logit_softcapping": 30.0, "global_head_dim": 512,
            "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2816,
            "hidden_size_per_layer_input": 0, "initializer_range": 0.02, "intermediate_size": 2112,
            "layer_types": _every(30, 6, _FULL, _SLIDE), "max_position_embeddings": 262144,
            "model_type": "gemma4_text", "moe_intermediate_size": 704, "num_attention_heads": 16, "num_experts": 128,
            "num_global_key_value_heads": 2, "num_hidden_layers": 30, "num_key_value_heads": 8,
            "num_kv_shared_layers": 0, "pad_token_id": 0, "rms_norm_eps": 1e-06,
            "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                                   "rope_type": "proportional"},
                                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
            "sliding_window": 1024, "tie_word_embeddings": True, "top_k_experts": 8,
            "use_bidirectional_attention": "vision", "use_cache": True, "use_double_wide_mlp": False,
            "vocab_size": 262144, "vocab_size_per_layer_input": 262144},
        "tie_word_embeddings": True, "transformers_version": "5.5.0.dev0", "video_token_id": 258884,
        "vision_config": {
            "attention_bias": False, "attention_dropout": 0.0, "head_dim": 72, "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 4304, "max_position_embeddings":
            131072, "model_type": "gemma4_vision", "num_attention_heads": 16, "num_hidden_layers": 27,
            "num_key_value_heads": 16, "patch_size": 16, "pooling_kernel_size": 3, "position_embedding_size": 10240,
            "rms_norm_eps": 1e-06, "standardize": False, "use_clipped_linears": False},
        "vision_soft_tokens_per_image": 280},
        layers=6, vision_config={"position_embedding_size": 64}),
    # mistralai/Mistral-Large-4-1T-A52B: the values are transformers' class defaults, which its docs name as that
    # checkpoint's (not the hub file); the pixtral vision tower made tiny by hand
    "Mistral-Large-4-1T-A52B": tiny({
        "architectures": ["MistralLarge4ForConditionalGeneration"], "image_token_index": 10,
        "model_type": "mistral_large4", "multimodal_projector_bias": False, "projector_hidden_act": "gelu",
        "spatial_merge_size": 2,
        "text_config": {
            "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
            "final_logit_softcapping": 30.0, "first_k_dense_replace": 1, "head_dim": 64, "hidden_act": "silu",
            "hidden_size": 6144, "index_head_dim": 128, "index_n_heads": 32, "index_topk": 2048,
            "initializer_range": 0.02, "intermediate_size": 24576, "kv_lora_rank": 512,
            "max_position_embeddings": 1048576, "model_type": "mistral_large4_text", "moe_intermediate_size": 6144,
            "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "num_attention_heads": 64,
            "num_experts_per_tok": 4, "num_hidden_layers": 72, "num_key_value_heads": 64,
            "no_rope_layer_interval": 4, "pad_token_id": 11, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64,
            "rms_norm_eps": 1e-05, "rope_parameters": {"attention_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                                       "factor": 2048.0, "original_max_position_embeddings": 512,
                                                       "rope_theta": 10000.0, "rope_type": "yarn"},
            "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1, "v_head_dim": 128,
            "vocab_size": 204800},
        "tie_word_embeddings": False, "transformers_version": "5.20.0", "vision_feature_layer": -1,
        "vision_config": {"head_dim": 8, "hidden_act": "silu", "hidden_size": 32, "image_size": 56,
                          "intermediate_size": 48, "model_type": "pixtral", "num_attention_heads": 4,
                          "num_hidden_layers": 2, "patch_size": 14, "rope_theta": 10000.0}},
        layers=4, text_config={"index_topk": 4}),
    # mistralai/Mistral-Small-4-119B-2603: the text model's class defaults as its docs name them (not the hub file,
    # which may be a multimodal wrapper around this text model)
    "Mistral-Small-4-119B-2603": tiny({
        "architectures": ["Mistral4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "first_k_dense_replace": 0, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 12288, "kv_lora_rank": 256,
        "max_position_embeddings": 1048576, "model_type": "mistral4", "moe_intermediate_size": 2048, "n_group": 1,
        "n_routed_experts": 128, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 32,
        "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 32, "pad_token_id": 11,
        "pretraining_tp": 1, "q_lora_rank": 1024, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06, "rope_interleave": True,
        "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 128.0, "llama_4_scaling_beta": 0.1,
                            "max_position_embeddings": 1048576, "mscale": 1.0, "mscale_all_dim": 1.0,
                            "original_max_position_embeddings": 8192, "partial_rotary_factor": 0.5,
                            "rope_theta": 10000.0, "type": "yarn"},
        "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1,
        "transformers_version": "5.3.0", "use_cache": True, "v_head_dim": 128, "vocab_size": 131072}),
    # zai-org/GLM-5: DeepSeek-V3.2's layers under GLM's name (sizes from memory)
    "GLM-5": tiny({
        "architectures": ["GlmMoeDsaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "dtype": "bfloat16", "eos_token_id": [154820, 154827, 154829], "ep_size": 1, "first_k_dense_replace": 3,
        "hidden_act": "silu", "head_dim": 64, "hidden_size": 6144, "index_head_dim": 128, "index_n_heads": 32,
        "index_topk": 2048, "indexer_rope_interleave": True, "initializer_range": 0.02, "intermediate_size": 12288,
        "kv_lora_rank": 512, "max_position_embeddings": 202752, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
        "model_type": "glm_moe_dsa", "n_group": 1, "n_routed_experts": 256, "n_shared_experts": 1,
        "norm_topk_prob": True, "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 78,
        "num_key_value_heads": 64, "num_nextn_predict_layers": 1, "pad_token_id": 154820, "pretraining_tp": 1,
        "q_lora_rank": 2048, "qk_head_dim": 256, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-05, "rope_interleave": True, "rope_parameters": {"rope_theta": 1000000,
                                                                             "rope_type": "default"},
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False, "topk_group": 1,
        "topk_method": "noaux_tc", "transformers_version": "5.0.2.dev0", "use_cache": True, "v_head_dim": 256,
        "vocab_size": 154880}, layers=3, first_k_dense_replace=1, qk_head_dim=16),
    "longformer-base-4096": tiny({
        "attention_mode": "longformer", "attention_probs_dropout_prob": 0.1, "attention_window": [512] * 12,
        "bos_token_id": 0, "eos_token_id": 2, "gradient_checkpointing": False, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "hidden_size": 768, "ignore_attention_mask": False, "initializer_range": 0.02,
        "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 4098,
        "model_type": "longformer", "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
        "sep_token_id": 2, "type_vocab_size": 1, "vocab_size": 50265}, attention_window=[4, 4]),
    "bigbird-roberta-base": tiny({
        "architectures": ["BigBirdForPreTraining"], "attention_probs_dropout_prob": 0.1, "attention_type":
        "block_sparse", "block_size": 64, "bos_token_id": 1, "eos_token_id": 2, "gradient_checkpointing": False,
        "hidden_act": "gelu_new", "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
        "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 4096,
        "model_type": "big_bird", "num_attention_heads": 12, "num_hidden_layers": 12, "num_random_blocks": 3,
        "pad_token_id": 0, "position_embedding_type": "absolute", "rescale_embeddings": False, "sep_token_id": 66,
        "type_vocab_size": 2, "use_bias": True, "use_cache": True, "vocab_size": 50358}, block_size=1,
        num_random_blocks=1),
    "bigbird-pegasus-large-arxiv": tiny({
        "activation_dropout": 0.1, "activation_function": "gelu_new", "architectures":
        ["BigBirdPegasusForConditionalGeneration"], "attention_dropout": 0.1, "attention_type": "block_sparse",
        "block_size": 64, "bos_token_id": 2, "classifier_dropout": 0.0, "d_model": 1024,
        "decoder_attention_heads": 16, "decoder_ffn_dim": 4096, "decoder_layerdrop": 0.0, "decoder_layers": 16,
        "decoder_start_token_id": 0, "dropout": 0.1, "encoder_attention_heads": 16, "encoder_ffn_dim": 4096,
        "encoder_layerdrop": 0.0, "encoder_layers": 16, "eos_token_id": 1, "gradient_checkpointing": False,
        "init_std": 0.02, "is_encoder_decoder": True, "length_penalty": 0.8, "max_length": 256,
        "max_position_embeddings": 4096, "model_type": "bigbird_pegasus", "num_beams": 5, "num_hidden_layers": 16,
        "num_random_blocks": 3, "pad_token_id": 0, "scale_embedding": True, "torch_dtype": "float32",
        "transformers_version": "4.10.0.dev0", "use_bias": False, "use_cache": True, "vocab_size": 96103},
        block_size=1, num_random_blocks=1),
}
assert len(THIRD) == 11, len(THIRD)

# ------------------------------------------------------------------------------------------------- the fourth set
# issue 51's image models. A vision_config is shrunk like a text one; its image sizes are made small by hand (a
# published 336 or 896 pixel image would be hundreds of patches at width 32), keeping the published patch sizes.
# transformers 4's PretrainedConfig keys that openai's CLIP files spell out in each sub-config, at their values
_CLIP_LEGACY = dict(add_cross_attention=False, architectures=None, attention_dropout=0.0, bad_words_ids=None,
                    chunk_size_feed_forward=0, decoder_start_token_id=None, diversity_penalty=0.0, do_sample=False,
                    dropout=0.0, early_stopping=False, encoder_no_repeat_ngram_size=0, finetuning_task=None,
                    forced_bos_token_id=None, forced_eos_token_id=None, hidden_act="quick_gelu",
                    id2label={"0": "LABEL_0", "1": "LABEL_1"}, initializer_factor=1.0, initializer_range=0.02,
                    is_decoder=False, is_encoder_decoder=False, label2id={"LABEL_0": 0, "LABEL_1": 1},
                    layer_norm_eps=1e-05, length_penalty=1.0, max_length=20, min_length=0, no_repeat_ngram_size=0,
                    num_beam_groups=1, num_beams=1, num_return_sequences=1, output_attentions=False,
                    output_hidden_states=False, output_scores=False, prefix=None, problem_type=None, pruned_heads={},
                    remove_invalid_values=False, repetition_penalty=1.0, return_dict=True,
                    return_dict_in_generate=False, sep_token_id=None, task_specific_params=None, temperature=1.0,
                    tie_encoder_decoder=False, tie_word_embeddings=True, tokenizer_class=None, top_k=50, top_p=1.0,
                    torch_dtype=None, torchscript=False, transformers_version="4.16.0.dev0", use_bfloat16=False)
_TINY_TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
# Qwen2.5-VL-7B-Instruct's vision_config at its published sizes (tests/test_qwen2_5_vl_vision.py counts it too)
QWEN2_5_VL_7B_VISION = {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                        "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                        "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                        "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2}
FOURTH = {
    "clip-vit-base-patch32": tiny({
        "_name_or_path": "openai/clip-vit-base-patch32", "architectures": ["CLIPModel"], "initializer_factor": 1.0,
        "logit_scale_init_value": 2.6592, "model_type": "clip", "projection_dim": 512,
        "text_config": {**_CLIP_LEGACY, "bos_token_id": 0, "eos_token_id": 2, "hidden_size": 512,
                        "intermediate_size": 2048, "max_position_embeddings": 77, "model_type": "clip_text_model",
                        "num_attention_heads": 8, "num_hidden_layers": 12, "pad_token_id": 1, "projection_dim": 512,
                        "vocab_size": 49408},
        "text_config_dict": None, "torch_dtype": "float32", "transformers_version": None,
        "vision_config": {**_CLIP_LEGACY, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
                          "hidden_size": 768, "image_size": 224, "intermediate_size": 3072,
                          "model_type": "clip_vision_model", "num_attention_heads": 12, "num_hidden_layers": 12,
                          "patch_size": 32, "projection_dim": 512},
        "vision_config_dict": None}),
    # SigLIP base's file names the model types alone: every size is SiglipTextConfig's and SiglipVisionConfig's default
    "siglip-base-patch16-224": tiny({
        "architectures": ["SiglipModel"], "initializer_factor": 1.0, "model_type": "siglip",
        "text_config": {"model_type": "siglip_text_model"}, "torch_dtype": "float32",
        "transformers_version": "4.37.0.dev0", "vision_config": {"model_type": "siglip_vision_model"}},
        text_config={**_TINY_TEXT, "vocab_size": VOCAB, "max_position_embeddings": 16},
        vision_config={**_TINY_TEXT, "image_size": 64}),
    "llava-1.5-7b-hf": tiny({
        "architectures": ["LlavaForConditionalGeneration"], "ignore_index": -100, "image_token_index": 32000,
        "model_type": "llava", "pad_token_id": 32001, "projector_hidden_act": "gelu",
        "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"],
                        "max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05,
                        "torch_dtype": "float16", "vocab_size": 32064},
        "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.36.0.dev0",
        "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                          "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
                          "patch_size": 14, "projection_dim": 768, "vocab_size": 32000},
        "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "vocab_size": 32064},
        text_config=_TINY_TEXT, vision_config={"image_size": 42}),
    # transformers 4.45 wrote the legacy keys into both sub-configs; the text model has 8 cross-attention layers
    "Llama-3.2-11B-Vision-Instruct": tiny({
        "architectures": ["MllamaForConditionalGeneration"], "image_token_index": 128256, "model_type": "mllama",
        "text_config": {
            **_CLIP_LEGACY, "hidden_act": "silu", "bos_token_id": 128000,
            "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38], "dropout": 0, "eos_token_id": [128001, 128008,
                                                                                                     128009],
            "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
            "model_type": "mllama_text_model", "num_attention_heads": 32, "num_hidden_layers": 40,
            "num_key_value_heads": 8, "pad_token_id": 128004, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
            "vocab_size": 128256},
        "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
        "vision_config": {
            **_CLIP_LEGACY, "hidden_act": "gelu", "attention_heads": 16, "hidden_size": 1280, "image_size": 560,
            "intermediate_layers_indices": [3, 7, 15, 23, 30], "intermediate_size": 5120, "max_num_tiles": 4,
            "model_type": "mllama_vision_model", "norm_eps": 1e-05, "num_channels": 3, "num_global_layers": 8,
            "num_hidden_layers": 32, "patch_size": 14,
            "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]],
            "torch_dtype": "bfloat16", "vision_output_dim": 7680}},
        text_config={"num_hidden_layers": 4, "cross_attention_layers": [1, 3]},
        vision_config={"image_size": 28, "attention_heads": 4, "num_global_layers": 1,
                       "intermediate_layers_indices": [0, 1], "vision_output_dim": 96}),
    # Qwen's file as published: the text model's keys at the top level (transformers 5 writes a text_config)
    "Qwen2.5-VL-7B-Instruct": tiny({
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
        "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
        "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 128000,
        "max_window_layers": 28, "model_type": "qwen2_5_vl", "num_attention_heads": 28, "num_hidden_layers": 28,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": True,
        "use_sliding_window": False,
        "vision_config": QWEN2_5_VL_7B_VISION,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064},
        rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]},
        vision_config={"fullatt_block_indexes": [1], "out_hidden_size": 32}),
    # Gemma 3 4B's text_config leaves its heads, head width and vocabulary to Gemma3TextConfig's defaults
    "gemma-3-4b-it": tiny({
        "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
        "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
        "model_type": "gemma3",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                        "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                          "patch_size": 14, "vision_use_head": False}},
        mm_tokens_per_image=4, text_config={"num_hidden_layers": 6, "num_attention_heads": 4,
                                            "num_key_value_heads": 2, "head_dim": 8, "vocab_size": VOCAB},
        vision_config={"image_size": 56}),
}

# -------------------------------------------------------------------------------------------------- the fifth set
# issue 52's Whisper files: the encoder reads 2 x max_source_positions frames of num_mel_bins (made 60 frames here)
_WHISPER_SUPPRESS = [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93, 359, 503,
                     522, 542, 873, 893, 902, 918, 922, 931, 1350, 1853, 1982, 2460, 2627, 3246, 3253, 3268, 3536,
                     3846, 3961, 4183, 4667, 6585, 6647, 7273, 9061, 9383, 10428, 10929, 11938, 12033, 12331, 12562,
                     13793, 14157, 14635, 15265, 15618, 16553, 16604, 18362, 18956, 20075, 21675, 22520, 26130, 26161,
                     26435, 28279, 29464, 31650, 32302, 32470, 36865, 42863, 47425, 49870, 50254, 50258, 50358, 50359,
                     50360, 50361, 50362]
_WHISPER = {"activation_dropout": 0.0, "activation_function": "gelu", "architectures": ["WhisperForConditionalGeneration"],
            "attention_dropout": 0.0, "begin_suppress_tokens": [220, 50257], "bos_token_id": 50257,
            "decoder_layerdrop": 0.0, "decoder_start_token_id": 50258, "dropout": 0.0, "encoder_layerdrop": 0.0,
            "eos_token_id": 50257, "init_std": 0.02, "is_encoder_decoder": True, "max_length": 448,
            "max_source_positions": 1500, "max_target_positions": 448, "model_type": "whisper",
            "scale_embedding": False, "use_cache": True}
# large-v3's and its descendants' keys beside those (SpecAugment's settings, off at inference)
_WHISPER_V3 = {**_WHISPER, "apply_spec_augment": False, "classifier_proj_size": 256, "d_model": 1280,
               "decoder_attention_heads": 20, "decoder_ffn_dim": 5120, "encoder_attention_heads": 20,
               "encoder_ffn_dim": 5120, "encoder_layers": 32, "mask_feature_length": 10, "mask_feature_min_masks": 0,
               "mask_feature_prob": 0.0, "mask_time_length": 10, "mask_time_min_masks": 2, "mask_time_prob": 0.05,
               "median_filter_width": 7, "num_mel_bins": 128, "pad_token_id": 50256, "torch_dtype": "float16",
               "use_weighted_layer_sum": False, "vocab_size": 51866}
FIFTH = {
    "whisper-tiny": tiny({
        **_WHISPER, "_name_or_path": "openai/whisper-tiny", "d_model": 384, "decoder_attention_heads": 6,
        "decoder_ffn_dim": 1536, "decoder_layers": 4, "encoder_attention_heads": 6, "encoder_ffn_dim": 1536,
        "encoder_layers": 4, "forced_decoder_ids": [[1, 50259], [2, 50359], [3, 50363]], "num_hidden_layers": 4,
        "num_mel_bins": 80, "pad_token_id": 50257, "suppress_tokens": _WHISPER_SUPPRESS, "torch_dtype": "float32",
        "transformers_version": "4.27.0.dev0", "vocab_size": 51865}, max_source_positions=30),
    "whisper-large-v3": tiny({**_WHISPER_V3, "_name_or_path": "openai/whisper-large-v3", "decoder_layers": 32,
                              "num_hidden_layers": 32, "transformers_version": "4.36.0.dev0"}, max_source_positions=30),
    "whisper-large-v3-turbo": tiny({**_WHISPER_V3, "_name_or_path": "openai/whisper-large-v3-turbo",
                                    "decoder_layers": 4, "num_hidden_layers": 32,
                                    "transformers_version": "4.46.0.dev0"}, max_source_positions=30),
    # distil-whisper keeps large-v3's encoder whole and two of its decoder layers
    "distil-large-v3": tiny({**_WHISPER_V3, "_name_or_path": "distil-whisper/distil-large-v3", "decoder_layers": 2,
                             "num_hidden_layers": 32, "transformers_version": "4.40.0.dev0"},
                            max_source_positions=30),
}

# ------------------------------------------------------------ the first set's files for the types PUBLISHED lacks
MORE = {
    "roberta-base": tiny({
        "architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1, "bos_token_id": 0,
        "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
        "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 514,
        "model_type": "roberta", "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
        "type_vocab_size": 1, "vocab_size": 50265}),
    "all-mpnet-base-v2": tiny({
        "_name_or_path": "microsoft/mpnet-base", "architectures": ["MPNetForMaskedLM"],
        "attention_probs_dropout_prob": 0.1, "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
        "layer_norm_eps": 1e-05, "max_position_embeddings": 514, "model_type": "mpnet", "num_attention_heads": 12,
        "num_hidden_layers": 12, "pad_token_id": 1, "relative_attention_num_buckets": 32,
        "transformers_version": "4.8.2", "vocab_size": 30527}),
    "xlnet-base-cased": tiny({
        "architectures": ["XLNetLMHeadModel"], "attn_type": "bi", "bi_data": False, "bos_token_id": 1,
        "clamp_len": -1, "d_head": 64, "d_inner": 3072, "d_model": 768, "dropout": 0.1, "end_n_top": 5,
        "eos_token_id": 2, "ff_activation": "gelu", "initializer_range": 0.02, "layer_norm_eps": 1e-12,
        "mem_len": None, "model_type": "xlnet", "n_head": 12, "n_layer": 12, "pad_token_id": 5, "reuse_len": None,
        "same_length": False, "start_n_top": 5, "summary_activation": "tanh", "summary_last_dropout": 0.1,
        "summary_type": "last", "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 250}}, "untie_r": True,
        "vocab_size": 32000}),
    "umt5-small": tiny({
        "architectures": ["UMT5ForConditionalGeneration"], "d_ff": 1024, "d_kv": 64, "d_model": 512,
        "decoder_start_token_id": 0, "dense_act_fn": "gelu_new", "dropout_rate": 0.1, "eos_token_id": 1,
        "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0, "is_encoder_decoder": True,
        "is_gated_act": True, "layer_norm_epsilon": 1e-06, "model_type": "umt5", "num_decoder_layers": 8,
        "num_heads": 6, "num_layers": 8, "pad_token_id": 0, "relative_attention_max_distance": 128,
        "relative_attention_num_buckets": 32, "scalable_attention": True, "tie_word_embeddings": False,
        "tokenizer_class": "T5Tokenizer", "transformers_version": "4.31.0.dev0", "use_cache": True,
        "vocab_size": 256384}, d_kv=8),
    # google/t5gemma-2b-2b-ul2: Gemma 2's layers as encoder and decoder (sizes from memory)
    "t5gemma-2b-2b-ul2": tiny({
        "architectures": ["T5GemmaForConditionalGeneration"], "classifier_dropout_rate": 0.0,
        "decoder": {"attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": 50.0,
                    "cross_attention_hidden_size": 2304, "dropout_rate": 0.0, "final_logit_softcapping": 30.0,
                    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
                    "initializer_range": 0.02, "intermediate_size": 9216, "is_decoder": True,
                    "layer_types": [_SLIDE, _FULL] * 13, "max_position_embeddings": 8192, "model_type":
                    "t5_gemma_module", "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4,
                    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
                    "sliding_window": 4096, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 256000},
        "dropout_rate": 0.0, "encoder": {"attention_bias": False, "attention_dropout": 0.0,
                                         "attn_logit_softcapping": 50.0, "dropout_rate": 0.0,
                                         "final_logit_softcapping": 30.0, "head_dim": 256,
                                         "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
                                         "initializer_range": 0.02, "intermediate_size": 9216,
                                         "layer_types": [_SLIDE, _FULL] * 13, "max_position_embeddings": 8192,
                                         "model_type": "t5_gemma_module", "num_attention_heads": 8,
                                         "num_hidden_layers": 26, "num_key_value_heads": 4,
                                         "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
                                         "sliding_window": 4096, "torch_dtype": "bfloat16", "use_cache": True,
                                         "vocab_size": 256000},
        "eos_token_id": [1, 107], "initializer_range": 0.02, "is_encoder_decoder": True, "model_type": "t5gemma",
        "pad_token_id": 0, "torch_dtype": "bfloat16", "transformers_version": "4.53.0.dev0", "use_cache": True,
        "vocab_size": 256000},
        decoder={"cross_attention_hidden_size": 32, "query_pre_attn_scalar": 8, "hidden_size": 32, "head_dim": 8,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48, "num_hidden_layers": 2,
                 "layer_types": [_SLIDE, _FULL], "sliding_window": 6, "vocab_size": VOCAB},
        encoder={"query_pre_attn_scalar": 8, "hidden_size": 32, "head_dim": 8, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "intermediate_size": 48, "num_hidden_layers": 2,
                 "layer_types": [_SLIDE, _FULL], "sliding_window": 6, "vocab_size": VOCAB}),
    # deepseek-ai/DeepSeek-V3.2-Exp: V3's file with the indexer's keys, without the FP8 quantization_config (a
    # bfloat16 conversion; V3's row keeps it)
    "DeepSeek-V3.2-Exp": tiny({
        **{k: v for k, v in SECOND["DeepSeek-V3"].items() if k not in ("auto_map", "quantization_config")},
        "architectures": ["DeepseekV32ForCausalLM"], "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048,
        "model_type": "deepseek_v32", "transformers_version": "4.44.2"}, layers=3),
    "Kimi-K2.5": tiny({
        "architectures": ["KimiK25ForConditionalGeneration"], "auto_map": {
            "AutoConfig": "configuration_kimi_k25.KimiK25Config",
            "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
        "bos_token_id": 163584, "eos_token_id": 163585, "ignore_index": -100, "media_placeholder_token_id": 163605,
        "model_type": "kimi_k25", "pad_token_id": 163839,
        "text_config": {
            "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "aux_loss_alpha": 0.001, "bos_token_id": 163584, "eos_token_id": 163585, "ep_size": 1,
            "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
            "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 262144,
            "model_type": "kimi_k2", "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 1,
            "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 64,
            "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 64,
            "num_nextn_predict_layers": 0, "pad_token_id": 163839, "pretraining_tp": 1, "q_lora_rank": 1536,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
            "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                             "original_max_position_embeddings": 4096, "type": "yarn"},
            "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "seq_aux": True,
            "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc", "use_cache": True,
            "v_head_dim": 128, "vocab_size": 163840},
        "tie_word_embeddings": False, "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "vision_config": {"init_pos_emb_height": 64, "init_pos_emb_time": 4, "init_pos_emb_width": 64,
                          "merge_kernel_size": [2, 2], "merge_type": "sd2_tpool", "mm_hidden_size": 1152,
                          "mm_projector_type": "patchmerger", "patch_size": 14, "projector_hidden_act": "gelu",
                          "projector_ln_eps": 1e-05, "text_hidden_size": 7168, "vt_hidden_size": 1152,
                          "vt_intermediate_size": 4304, "vt_num_attention_heads": 16, "vt_num_hidden_layers": 27}},
        layers=3, vision_config={"init_pos_emb_height": 4, "init_pos_emb_time": 2, "init_pos_emb_width": 4,
                                 "mm_hidden_size": 16, "text_hidden_size": 32, "vt_hidden_size": 16,
                                 "vt_intermediate_size": 24, "vt_num_attention_heads": 2, "vt_num_hidden_layers": 1,
                                 # transformers' class reads the tower's sizes under its own names (the published
                                 # vt_* are remote code's): those added, tiny, or its default tower has 400M weights
                                 # (and projection_hidden_size below, its projector's width, likewise added)
                                 "hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 2,
                                 "num_hidden_layers": 1, "pos_emb_height": 4, "pos_emb_width": 4, "pos_emb_time": 2},
        projection_hidden_size=16),
    # mistralai/Mistral-Small-3.1-24B-Instruct-2503: a Mistral text model under a Pixtral tower (from memory)
    "Mistral-Small-3.1-24B-Instruct-2503": tiny({
        "architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10, "model_type": "mistral3",
        "multimodal_projector_bias": False, "projector_hidden_act": "gelu", "spatial_merge_size": 2,
        "text_config": {"attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
                        "initializer_range": 0.02, "intermediate_size": 32768, "max_position_embeddings": 131072,
                        "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 40,
                        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0,
                        "sliding_window": None, "use_cache": True, "vocab_size": 131072},
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
        "vision_config": {"attention_dropout": 0.0, "head_dim": 64, "hidden_act": "silu", "hidden_size": 1024,
                          "image_size": 1540, "initializer_range": 0.02, "intermediate_size": 4096,
                          "model_type": "pixtral", "num_attention_heads": 16, "num_channels": 3,
                          "num_hidden_layers": 24, "patch_size": 14, "rope_theta": 10000.0},
        "vision_feature_layer": -1}),
    # moonshotai/Kimi-Linear-48B-A3B-Instruct (remote code's keys, which transformers maps: num_experts,
    # num_experts_per_token, linear_attn_config with 1-indexed layer lists), from memory; 4 layers, the fourth full
    "Kimi-Linear-48B-A3B-Instruct": tiny({
        "architectures": ["KimiLinearForCausalLM"], "auto_map": {
            "AutoConfig": "configuration_kimi.KimiLinearConfig", "AutoModel": "modeling_kimi.KimiLinearModel",
            "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM"},
        "bos_token_id": 163584, "eos_token_id": 163586, "first_k_dense_replace": 1, "hidden_act": "silu",
        "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216, "kv_lora_rank": 512,
        "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128,
                               "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)],
                               "num_heads": 32, "short_conv_kernel_size": 4},
        "mla_use_nope": True, "model_max_length": 1048576, "model_type": "kimi_linear", "moe_intermediate_size": 1024,
        "moe_layer_freq": 1, "moe_renormalize": True, "moe_router_activation_func": "sigmoid",
        "num_attention_heads": 32, "num_expert_group": 1, "num_experts": 256, "num_experts_per_token": 8,
        "num_hidden_layers": 27, "num_key_value_heads": 32, "num_nextn_predict_layers": 0, "num_shared_experts": 1,
        "pad_token_id": 163839, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "routed_scaling_factor": 2.446,
        "tie_word_embeddings": False, "topk_group": 1, "torch_dtype": "bfloat16", "transformers_version": "4.56.2",
        "use_cache": True, "use_grouped_topk": True, "v_head_dim": 128, "vocab_size": 163840},
        layers=4, num_experts_per_token=4,
        linear_attn_config={"full_attn_layers": [4], "kda_layers": [1, 2, 3]}),
}


def _text_model(wrapper: dict, architecture: str) -> dict:
    """A wrapper's text_config as a file of its own (the *_text types: a text model saved alone)."""
    return {**wrapper["text_config"], "architectures": [architecture]}


# the *_text types: no published file holds one alone; each is its wrapper's text_config saved as its own model
MORE |= {
    "Llama-4-Scout text model": _text_model(SECOND["Llama-4-Scout-17B-16E-Instruct"], "Llama4ForCausalLM"),
    "Qwen3.5-27B text model": _text_model(THIRD["Qwen3.5-27B"], "Qwen3_5ForCausalLM"),
    "Qwen3.5-35B-A3B text model": _text_model(THIRD["Qwen3.5-35B-A3B"], "Qwen3_5MoeForCausalLM"),
    "gemma-4-31B text model": _text_model(THIRD["gemma-4-31B-it"], "Gemma4ForCausalLM"),
}


def _first_set() -> tuple[dict, list[str]]:
    """tests/published_configs.py's files, then for each model type the library claims that they do not hold one
    file of that type from the other sets (sets 2 to 5 in turn, then MORE's); and the claimed types no file
    here holds."""
    from jaxformer.interop.registry import SUPPORTED

    files = dict(PUBLISHED)
    held = {hf["model_type"] for hf in files.values()}
    for name, hf in {**SECOND, **THIRD, **FOURTH, **FIFTH, **MORE}.items():
        if hf["model_type"] in SUPPORTED and hf["model_type"] not in held:
            files[name] = hf
            held.add(hf["model_type"])
    return files, sorted(set(SUPPORTED) - held)


FIRST, UNCOVERED = _first_set()
SETS = {1: FIRST, 2: SECOND, 3: THIRD, 4: FOURTH, 5: FIFTH}
