"""Tiny random Hugging Face checkpoints, built from configs (no hub) and saved in the real format.

Every supported model_type and head has an entry; the variants cover GQA, MQA, rope scaling, an
explicit head_dim, a sliding window shorter than the test sequences, Qwen2's QKV bias, Mixtral's
top-2 routing, T5 v1.0 and v1.1, BART and BERT token types, Gemma 2/3 and T5Gemma with soft-capping. The init std is raised (0.2 instead of
0.02) so that layer outputs are far from zero and differences cannot hide in tiny activations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

STD = 0.2
_BERT = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=40, type_vocab_size=2, initializer_range=STD, pad_token_id=0)
_ROBERTA = {**_BERT, "max_position_embeddings": 42, "type_vocab_size": 1, "pad_token_id": 1, "bos_token_id": 0,
            "eos_token_id": 2, "layer_norm_eps": 1e-5}
# Longformer: RoBERTa's layout whose layers see 2 tokens either side (attention_window 4, shorter than the test
# sequences) and global tokens through their own projections (the classifier's first token, the span head's question)
_LONGFORMER = {**_ROBERTA, "attention_window": 4, "sep_token_id": 2}
# BigBird: BERT's layout with blocks of 1 token and 1 random block, so the 9-token test inputs (longer than the
# (5 + 2 * 1) * 1 tokens of transformers' dense fallback) run block-sparse; sep_token_id away from the test ids
_BIG_BIRD = {**_BERT, "block_size": 1, "num_random_blocks": 1, "sep_token_id": 2, "hidden_act": "gelu_new"}
_DISTILBERT = dict(vocab_size=97, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_position_embeddings=40,
                   initializer_range=STD, pad_token_id=0)
# ALBERT: 3 layers sharing one set of weights, embeddings 16 wide projected to 32; ELECTRA's generator as
# published (embeddings wider than its layers) and its discriminator with a projection too
_ALBERT = dict(vocab_size=97, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
               intermediate_size=48, max_position_embeddings=40, initializer_range=STD, pad_token_id=0,
               hidden_act="gelu_new")
_ELECTRA = dict(vocab_size=97, embedding_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=48, max_position_embeddings=40, initializer_range=STD, pad_token_id=0)
_ELECTRA_GENERATOR = {**_ELECTRA, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 24}
# ModernBERT: 4 layers (global, local, local, global) with a local window of 2 either side, shorter than the
# test sequences; its own two rotary bases; mean pooling for the sequence classifier
_MODERNBERT = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                   max_position_embeddings=64, initializer_range=STD, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                   cls_token_id=1, sep_token_id=2, local_attention=4, global_attn_every_n_layers=3,
                   attn_implementation="eager")
# DeBERTa: v1 with exact distances clamped at 6 (shorter than the test sequences); v2 as v3 publishes it (log
# buckets: 4 exact distances either side, the rest bucketed up to 8; positions projected by the layers' own q
# and k; a normed table) and as v2-xlarge (a gelu convolution beside the first layer, its own position
# projections), with absolute positions and token types where the published ones have none
_DEBERTA = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                max_position_embeddings=40, initializer_range=STD, pad_token_id=0, relative_attention=True,
                pos_att_type="c2p|p2c", max_relative_positions=6, position_biased_input=False)
_DEBERTA_V3 = {**_DEBERTA, "pos_att_type": ["p2c", "c2p"], "position_buckets": 8, "max_relative_positions": -1,
               "share_att_key": True, "norm_rel_ebd": "layer_norm"}
_DEBERTA_V2_CONV = {**_DEBERTA_V3, "num_hidden_layers": 3, "share_att_key": False, "conv_kernel_size": 3,
                    "conv_act": "gelu", "position_biased_input": True, "type_vocab_size": 2}
_M2M100 = dict(vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=40,
               init_std=STD, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
_GPT2 = dict(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=40, initializer_range=STD,
             bos_token_id=1, eos_token_id=2)
_LLAMA = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, initializer_range=STD, bos_token_id=1,
              eos_token_id=2, rms_norm_eps=1e-6)
_T5 = dict(vocab_size=97, d_model=32, d_ff=48, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4,
           relative_attention_num_buckets=8, relative_attention_max_distance=20, initializer_factor=1.0,
           pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
# MPNet: RoBERTa's layout (positions from pad id 1) with its fixed 32-bucket relative bias
_MPNET = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
              max_position_embeddings=66, initializer_range=STD, pad_token_id=1, bos_token_id=0, eos_token_id=2,
              layer_norm_eps=1e-5)
_BART = dict(vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=40,
             init_std=STD, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
             forced_eos_token_id=2)

# Marian (OPUS-MT): post-norm, swish, scaled embeddings, generating from its pad id; Pegasus: pre-norm, relu
_MARIAN = dict(_M2M100, activation_function="swish", scale_embedding=True, pad_token_id=1, eos_token_id=0,
               bos_token_id=None, decoder_start_token_id=1, forced_eos_token_id=0)
_PEGASUS = dict(_M2M100, activation_function="relu", scale_embedding=True, pad_token_id=0, eos_token_id=1,
                bos_token_id=None, decoder_start_token_id=0, forced_eos_token_id=1)
# BigBird-Pegasus: Pegasus' pre-norm layers, learned positions, blocks of one token and one random block in the
# encoder (block-sparse on the 9-token test inputs), attention without biases (use_bias false, as published)
_BIGBIRD_PEGASUS = dict(vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=40,
                        init_std=STD, pad_token_id=0, eos_token_id=1, bos_token_id=2, decoder_start_token_id=0,
                        block_size=1, num_random_blocks=1)
# Whisper: 8 mel bins, 12 source positions (24 frames: AUDIO_SHAPES), pre-norm layers whose keys have no bias, proj_out
# tied; its generation suppress lists cleared (the class's default ids lie past the 97 tokens)
_WHISPER = dict(vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, num_mel_bins=8,
                max_source_positions=12, max_target_positions=40, init_std=STD, pad_token_id=1, bos_token_id=0,
                eos_token_id=2, decoder_start_token_id=3, begin_suppress_tokens=None)

_DEEPSEEK = dict(vocab_size=97, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=12, q_lora_rank=20, qk_rope_head_dim=8, qk_nope_head_dim=8,
                 v_head_dim=12, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2, first_k_dense_replace=1,
                 max_position_embeddings=64, initializer_range=STD, bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6)
_DEEPSEEK_V2 = {**_DEEPSEEK, "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                "routed_scaling_factor": 1.5}
_XLNET = dict(vocab_size=97, d_model=32, n_layer=2, n_head=4, d_inner=48, initializer_range=STD, mem_len=6,
              dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_type="uni", ff_activation="gelu")
# Gemma: 3 layers (sliding, full, sliding) with a window of 4, shorter than the test sequences; small soft caps
# so tanh bends scores and logits; Gemma 3 with its own local rotary base and a linearly scaled global one.
_GEMMA2 = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=12, max_position_embeddings=64,
               initializer_range=STD, pad_token_id=0, bos_token_id=1, eos_token_id=2, sliding_window=4,
               layer_types=["sliding_attention", "full_attention", "sliding_attention"],
               attn_logit_softcapping=2.0, final_logit_softcapping=3.0, attn_implementation="eager")
_GEMMA3 = {**_GEMMA2, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
           "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}}
_T5GEMMA_HALF = {k: v for k, v in _GEMMA2.items() if k != "attn_implementation"}
# Gemma 4: sliding and full layers (the last full, as transformers forces), the full layers with heads of their own
# (16 wide, 2 kv heads: global_head_dim, num_global_key_value_heads) whose values are their keys (attention_k_eq_v),
# their proportional rotary turning half the head; the last two layers reading layers 0 and 1's keys and values
# (num_kv_shared_layers) with a double-wide MLP; per-layer inputs, soft-capped logits. Kept well-conditioned, so
# that transformers' own float32 stays within ~8e-6 of its float64 (what 1e-5 parity needs): 4 layers (6 left it
# 1.4e-5 away), per-layer inputs 32 wide (a norm over 4 numbers left it 2e-5 away), eps 1e-3 and MHA sliding layers
# (the 8-wide head norms; GQA there left layer 3 at 1.5e-5)
_GEMMA4 = {**{k: v for k, v in _GEMMA2.items() if k not in ("query_pre_attn_scalar", "attn_logit_softcapping")},
           "num_hidden_layers": 4, "global_head_dim": 16, "hidden_size_per_layer_input": 32, "rms_norm_eps": 1e-3,
           "num_key_value_heads": 4, "attention_k_eq_v": True, "num_global_key_value_heads": 2,
           "num_kv_shared_layers": 2, "use_double_wide_mlp": True,
           "vocab_size_per_layer_input": 97, "layer_types": ["sliding_attention", "full_attention"] * 2,
           "rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                                  "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}}
_STARCODER2 = {**{k: v for k, v in _LLAMA.items() if k != "rms_norm_eps"}, "norm_epsilon": 1e-6}
_GRANITE = {**_LLAMA, "embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.0625,
            "logits_scaling": 4.0, "pad_token_id": 0}
_GLM4_MOE = {**_LLAMA, "head_dim": 12, "attention_bias": True, "moe_intermediate_size": 16, "n_routed_experts": 4,
             "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "pad_token_id": 0,
             "partial_rotary_factor": 0.5}
_OLMOE = {**_LLAMA, "num_experts": 4, "num_experts_per_tok": 2, "pad_token_id": 0}
_SMOLLM3 = {**_LLAMA, "no_rope_layer_interval": 2, "pad_token_id": 0}
_COHERE = {**{k: v for k, v in _LLAMA.items() if k != "rms_norm_eps"}, "layer_norm_eps": 1e-5, "pad_token_id": 0,
           "logit_scale": 0.8333333333333334}
_STABLELM = {**{k: v for k, v in _LLAMA.items() if k != "rms_norm_eps"}, "layer_norm_eps": 1e-5,
             "num_key_value_heads": 4, "use_qkv_bias": True, "partial_rotary_factor": 0.5}
_OPT = dict(vocab_size=97, hidden_size=32, ffn_dim=48, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=40, init_std=STD, pad_token_id=1, bos_token_id=2, eos_token_id=2)
_FALCON = dict(vocab_size=97, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, ffn_hidden_size=48,
               max_position_embeddings=64, initializer_range=STD, bos_token_id=1, eos_token_id=2)
_DEEPSEEK_V3 = {**_DEEPSEEK, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "n_shared_experts": 1}
# Phi-3.5-MoE: LayerNorms, q/k/v/o and head biases, a window of 4, the sparse mixer over 4 experts (a wide jitter
# eps, so that its softmax holds several), longrope's short factors past a pretraining length of 4 (and one mscale)
_PHIMOE = {**_LLAMA, "num_local_experts": 4, "attention_bias": True, "lm_head_bias": True, "sliding_window": 4,
           "router_jitter_noise": 0.15, "pad_token_id": 0,
           "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.05, 1.2, 1.6],
                               "long_factor": [1.0, 1.8, 3.5, 9.0], "short_mscale": 1.2, "long_mscale": 1.2,
                               "original_max_position_embeddings": 4}}
# Qwen3-Next and Qwen3.5: three Gated DeltaNet layers (2 key heads serving 4 value heads, widths 8 and 6) then one
# gated attention layer with a quarter of each head rotating, then a fifth linear layer past the period
_QWEN3_NEXT = {**_LLAMA, "initializer_range": 0.05, "num_hidden_layers": 5, "head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
               "linear_key_head_dim": 8, "linear_value_head_dim": 6, "pad_token_id": 0}
_QWEN3_NEXT_MOE = {**_QWEN3_NEXT, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                   "shared_expert_intermediate_size": 16}
# Kimi Linear: Kimi Delta Attention (3 heads of 8: per-channel decays) in layers 0, 1 and 3, NoPE latent attention in
# layers 2 and 4, a dense first layer then DeepSeek-V3's experts (top 3 of 8 in 4 groups, 2 picked, a shared one).
# Drawn at std 0.05, as Qwen3-Next's: at 0.1 the RMSNorm of each head's small output lifts both sides' float32
# rounding past 1e-5 over 150 tokens (the core outputs agree to 2e-8 there); its embeddings 4x (build_reference)
_KIMI_LINEAR = dict(vocab_size=97, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=5,
                    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=12, qk_rope_head_dim=8,
                    qk_nope_head_dim=8, v_head_dim=12, num_experts=8, num_experts_per_token=3, num_expert_group=4,
                    topk_group=2, linear_head_dim=8, linear_num_heads=3, initializer_range=0.05, pad_token_id=0,
                    bos_token_id=1, eos_token_id=2, model_max_length=64,
                    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention",
                                 "full_attention"])

# name -> (config class, model class, config kwargs)
# image towers: 30x30 images cut into nine 10x10 patches
_IMAGE_TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, image_size=30,
                    patch_size=10, initializer_range=STD)
_VIT = {**_IMAGE_TOWER, "layer_norm_eps": 1e-6}
_CLIP_TEXT = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=40, initializer_range=STD, pad_token_id=1, bos_token_id=0, eos_token_id=2)
_SIGLIP_TEXT = {**_CLIP_TEXT, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6}
# SigLIP2 NaFlex: 4x4 patches of 3 channels (48 numbers each), a 4x4 grid of learned positions (naflex_images)
_SIGLIP2_VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                       patch_size=4, num_patches=16, initializer_range=STD)
# LLaVA: a CLIP tower of three layers read at its second-to-last without the class token (9 image tokens of a 30x30
# image), the projector, a LLaMA decoder; its image placeholder is the vocabulary's last id (tests/test_llava.py feeds
# images; the shared tests text alone)
_LLAVA = dict(vision_config={**_IMAGE_TOWER, "model_type": "clip_vision_model", "num_hidden_layers": 3},
              text_config={**_LLAMA, "model_type": "llama"}, image_token_index=96, image_seq_length=9,
              initializer_range=STD)
# Llama 3.2 Vision's text model: cross layers 1 and 3 of 4 (their gates zero as transformers makes them; the shared
# tests feed text alone, which skips them; tests/test_mllama.py feeds images and sets the gates)
_MLLAMA_TEXT = {**_LLAMA, "num_hidden_layers": 4, "cross_attention_layers": [1, 3], "pad_token_id": 0}
_DEEPSEEK_V4 = dict(vocab_size=97, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=4, num_attention_heads=4,
                    head_dim=16, q_lora_rank=24, partial_rotary_factor=0.5, num_experts_per_tok=2, n_routed_experts=4,
                    layer_types=["heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention",
                                 "compressed_sparse_attention"], mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
                    compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
                    hc_mult=3, hc_sinkhorn_iters=6, sliding_window=4, o_groups=2, o_lora_rank=8, index_n_heads=8,
                    index_head_dim=12, index_topk=2, swiglu_limit=1.0, routed_scaling_factor=1.5,
                    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
                    max_position_embeddings=64, initializer_range=STD, bos_token_id=1, eos_token_id=2,
                    attn_implementation="eager")

CHECKPOINTS: dict[str, tuple[str, str, dict]] = {
    "bert": ("BertConfig", "BertModel", _BERT),
    "bert-mlm": ("BertConfig", "BertForMaskedLM", _BERT),
    "bert-pretraining": ("BertConfig", "BertForPreTraining", _BERT),
    "bert-seqcls": ("BertConfig", "BertForSequenceClassification", {**_BERT, "num_labels": 3}),
    "bert-tokcls": ("BertConfig", "BertForTokenClassification", {**_BERT, "num_labels": 5}),
    "bert-qa": ("BertConfig", "BertForQuestionAnswering", _BERT),
    "roberta": ("RobertaConfig", "RobertaModel", _ROBERTA),
    "roberta-mlm": ("RobertaConfig", "RobertaForMaskedLM", _ROBERTA),
    # RoBERTa's classification head (dense, tanh, out_proj) is BERT's pooler and classifier; QA as BERT's
    "roberta-seqcls": ("RobertaConfig", "RobertaForSequenceClassification", {**_ROBERTA, "num_labels": 3}),
    "roberta-qa": ("RobertaConfig", "RobertaForQuestionAnswering", _ROBERTA),
    # XLM-R: RoBERTa under its own model_type
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", _ROBERTA),
    "xlm-roberta-mlm": ("XLMRobertaConfig", "XLMRobertaForMaskedLM", _ROBERTA),
    "xlm-roberta-tokcls": ("XLMRobertaConfig", "XLMRobertaForTokenClassification", {**_ROBERTA, "num_labels": 5}),
    # DistilBERT: no token types, its own names, a ReLU pre_classifier
    "distilbert": ("DistilBertConfig", "DistilBertModel", _DISTILBERT),
    "distilbert-mlm": ("DistilBertConfig", "DistilBertForMaskedLM", _DISTILBERT),
    "distilbert-seqcls": ("DistilBertConfig", "DistilBertForSequenceClassification", {**_DISTILBERT, "num_labels": 3}),
    "distilbert-qa": ("DistilBertConfig", "DistilBertForQuestionAnswering", _DISTILBERT),
    "albert": ("AlbertConfig", "AlbertModel", _ALBERT),
    "albert-pretraining": ("AlbertConfig", "AlbertForPreTraining", _ALBERT),
    "albert-mlm": ("AlbertConfig", "AlbertForMaskedLM", _ALBERT),
    "albert-seqcls": ("AlbertConfig", "AlbertForSequenceClassification", {**_ALBERT, "num_labels": 3}),
    "albert-tokcls": ("AlbertConfig", "AlbertForTokenClassification", {**_ALBERT, "num_labels": 5}),
    "albert-qa": ("AlbertConfig", "AlbertForQuestionAnswering", _ALBERT),
    "electra": ("ElectraConfig", "ElectraModel", _ELECTRA),
    "electra-discriminator": ("ElectraConfig", "ElectraForPreTraining", _ELECTRA),
    # the base and large discriminators: embeddings as wide as the layers, no projection
    "electra-discriminator-unprojected": ("ElectraConfig", "ElectraForPreTraining", {**_ELECTRA, "embedding_size": 32}),
    "electra-generator": ("ElectraConfig", "ElectraForMaskedLM", _ELECTRA_GENERATOR),
    "electra-seqcls": ("ElectraConfig", "ElectraForSequenceClassification", {**_ELECTRA, "num_labels": 3}),
    "electra-tokcls": ("ElectraConfig", "ElectraForTokenClassification", {**_ELECTRA, "num_labels": 5}),
    "electra-qa": ("ElectraConfig", "ElectraForQuestionAnswering", _ELECTRA),
    "longformer": ("LongformerConfig", "LongformerModel", _LONGFORMER),
    "longformer-mlm": ("LongformerConfig", "LongformerForMaskedLM", _LONGFORMER),
    "longformer-seqcls": ("LongformerConfig", "LongformerForSequenceClassification", {**_LONGFORMER, "num_labels": 3}),
    "longformer-tokcls": ("LongformerConfig", "LongformerForTokenClassification", {**_LONGFORMER, "num_labels": 5}),
    "longformer-qa": ("LongformerConfig", "LongformerForQuestionAnswering", _LONGFORMER),
    "big_bird": ("BigBirdConfig", "BigBirdModel", _BIG_BIRD),
    "big_bird-mlm": ("BigBirdConfig", "BigBirdForMaskedLM", _BIG_BIRD),
    "big_bird-pretraining": ("BigBirdConfig", "BigBirdForPreTraining", _BIG_BIRD),
    "big_bird-seqcls": ("BigBirdConfig", "BigBirdForSequenceClassification", {**_BIG_BIRD, "num_labels": 3}),
    "big_bird-tokcls": ("BigBirdConfig", "BigBirdForTokenClassification", {**_BIG_BIRD, "num_labels": 5}),
    "big_bird-qa": ("BigBirdConfig", "BigBirdForQuestionAnswering", _BIG_BIRD),
    "modernbert": ("ModernBertConfig", "ModernBertModel", _MODERNBERT),
    "modernbert-mlm": ("ModernBertConfig", "ModernBertForMaskedLM", _MODERNBERT),
    "modernbert-seqcls": ("ModernBertConfig", "ModernBertForSequenceClassification",
                          {**_MODERNBERT, "num_labels": 3, "classifier_pooling": "mean"}),
    "modernbert-seqcls-cls": ("ModernBertConfig", "ModernBertForSequenceClassification",
                              {**_MODERNBERT, "num_labels": 3, "classifier_pooling": "cls", "classifier_bias": True,
                               "norm_bias": True}),
    "modernbert-tokcls": ("ModernBertConfig", "ModernBertForTokenClassification", {**_MODERNBERT, "num_labels": 5}),
    "modernbert-qa": ("ModernBertConfig", "ModernBertForQuestionAnswering", _MODERNBERT),
    "deberta": ("DebertaConfig", "DebertaModel", _DEBERTA),
    "deberta-mlm": ("DebertaConfig", "DebertaForMaskedLM", {**_DEBERTA, "position_biased_input": True,
                                                            "type_vocab_size": 2}),
    "deberta-seqcls": ("DebertaConfig", "DebertaForSequenceClassification", {**_DEBERTA, "num_labels": 3}),
    "deberta-v2": ("DebertaV2Config", "DebertaV2Model", _DEBERTA_V3),
    # the enhanced mask decoder's head (legacy=False); a legacy head is v1's (BERT's names)
    "deberta-v2-mlm": ("DebertaV2Config", "DebertaV2ForMaskedLM", {**_DEBERTA_V3, "legacy": False}),
    "deberta-v2-seqcls": ("DebertaV2Config", "DebertaV2ForSequenceClassification", {**_DEBERTA_V3, "num_labels": 3}),
    "deberta-v2-tokcls": ("DebertaV2Config", "DebertaV2ForTokenClassification", {**_DEBERTA_V3, "num_labels": 5}),
    "deberta-v2-qa": ("DebertaV2Config", "DebertaV2ForQuestionAnswering", _DEBERTA_V3),
    "deberta-v2-conv": ("DebertaV2Config", "DebertaV2ForMaskedLM", _DEBERTA_V2_CONV),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", _GPT2),
    "gpt2-base": ("GPT2Config", "GPT2Model", _GPT2),
    # GPT-1: post-norm blocks, no final norm, its own "gelu" (the tanh form)
    "openai-gpt": ("OpenAIGPTConfig", "OpenAIGPTLMHeadModel",
                   dict(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=40, initializer_range=STD,
                        bos_token_id=1, eos_token_id=2)),
    # GPT-Neo: global and local layers (window 4, shorter than the test sequences), unscaled scores
    "gpt-neo": ("GPTNeoConfig", "GPTNeoForCausalLM",
                dict(vocab_size=97, hidden_size=32, num_layers=3, num_heads=4, max_position_embeddings=40,
                     attention_types=[[["global", "local"], 1], [["local"], 1]], window_size=4,
                     initializer_range=STD, bos_token_id=1, eos_token_id=2)),
    # GPT-NeoX (Pythia): a quarter of each head rotates, attention and MLP side by side; one in turn;
    # GPT-J: half of each head rotates in adjacent pairs, one norm for both branches, a biased head
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
                      max_position_embeddings=64, initializer_range=STD, bos_token_id=1, eos_token_id=2,
                      attn_implementation="eager")),
    "gpt-neox-sequential": ("GPTNeoXConfig", "GPTNeoXModel",
                            dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=48, max_position_embeddings=64, initializer_range=STD,
                                 use_parallel_residual=False, rope_parameters={"rope_type": "default",
                                                                               "rope_theta": 500.0,
                                                                               "partial_rotary_factor": 0.5})),
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             dict(vocab_size=97, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, initializer_range=STD,
                  bos_token_id=1, eos_token_id=2)),
    # GPT-2-family files that divide layer i's scores by i + 1 (and compute them upcast, reordered)
    "gpt2-inverse-layer-scale": ("GPT2Config", "GPT2LMHeadModel",
                                 {**_GPT2, "n_layer": 3, "scale_attn_by_inverse_layer_idx": True,
                                  "reorder_and_upcast_attn": True, "attn_implementation": "eager"}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", _LLAMA),
    "llama-base": ("LlamaConfig", "LlamaModel", _LLAMA),
    "llama-mqa-headdim": ("LlamaConfig", "LlamaForCausalLM", {**_LLAMA, "num_key_value_heads": 1, "head_dim": 12}),
    "llama-rope-linear": ("LlamaConfig", "LlamaForCausalLM",
                          {**_LLAMA, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
    "llama-rope-llama3": ("LlamaConfig", "LlamaForCausalLM",
                          {**_LLAMA, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0,
                                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 16}}),
    # Context extension as published, each with a small pretraining length so a test runs past it: Qwen2.5's
    # yarn block (legacy rope_scaling), dynamic NTK past max_position_embeddings, Phi-3's longrope.
    "qwen2-rope-yarn": ("Qwen2Config", "Qwen2ForCausalLM",
                        {**_LLAMA, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 16}}),
    "llama-rope-dynamic": ("LlamaConfig", "LlamaForCausalLM",
                           {**_LLAMA, "max_position_embeddings": 16,
                            "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}),
    "llama-rope-longrope": ("LlamaConfig", "LlamaForCausalLM",
                            {**_LLAMA, "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                           "short_factor": [1.0, 1.05, 1.2, 1.6],
                                                           "long_factor": [1.0, 1.8, 3.5, 9.0],
                                                           "original_max_position_embeddings": 16}}),
    # Phi-3: fused qkv and gate/up tensors, a window shorter than the test sequences; Phi-3.5's longrope
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**_LLAMA, "sliding_window": 4, "pad_token_id": 0}),
    "phi3-longrope": ("Phi3Config", "Phi3ForCausalLM",
                      {**_LLAMA, "pad_token_id": 0, "original_max_position_embeddings": 16,
                       "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                           "short_factor": [1.0, 1.05, 1.2, 1.6],
                                           "long_factor": [1.0, 1.8, 3.5, 9.0]}}),
    # GLM: half of each head rotating in adjacent pairs, q/k/v biases, fused gate/up; GLM-4 adds output norms
    "glm": ("GlmConfig", "GlmForCausalLM", {**_LLAMA, "head_dim": 8, "pad_token_id": 0}),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {**_LLAMA, "head_dim": 16, "pad_token_id": 0,
                                               "partial_rotary_factor": 0.75}),
    "llama-attn-bias-tied": ("LlamaConfig", "LlamaForCausalLM",
                             {**_LLAMA, "attention_bias": True, "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {**_LLAMA, "sliding_window": 4}),
    # Qwen3: RMSNorm over each query and key head, an explicit head_dim wider than hidden / heads, biases
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**_LLAMA, "head_dim": 12, "attention_bias": True}),
    "qwen3-base": ("Qwen3Config", "Qwen3Model", {**_LLAMA, "head_dim": 12}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _LLAMA),
    # Qwen MoEs: experts narrower than the dense MLP, the first layer dense; Qwen3's renormalised and with
    # q/k norms, Qwen2's not renormalised, with q/k/v biases and a shared expert behind its sigmoid gate
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {**_LLAMA, "num_hidden_layers": 3, "head_dim": 12, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 16, "norm_topk_prob": True, "mlp_only_layers": [0]}),
    "qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  {**_LLAMA, "num_hidden_layers": 3, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 16, "shared_expert_intermediate_size": 32, "mlp_only_layers": [0]}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {**_LLAMA, "num_local_experts": 4, "num_experts_per_tok": 2}),
    # Llama 4: chunks of 4 on the rotary layers, the fourth layer global without rotary positions and with its
    # temperature (floor scale 4, so it grows inside the test sequences), the weightless q/k norm, llama3 rope,
    # sigmoid top-2 experts on their inputs beside the shared one, the first layer dense
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM",
               {**_LLAMA, "num_hidden_layers": 4, "intermediate_size": 16, "intermediate_size_mlp": 48, "head_dim": 8,
                "attention_chunk_size": 4, "floor_scale": 4, "attn_scale": 0.5, "num_local_experts": 4,
                "num_experts_per_tok": 2, "moe_layers": [1, 2, 3], "attn_implementation": "eager",
                "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 16}}),
    # Maverick's layout: dense and MoE layers in turn (interleave_moe_layer_step 2), no q/k norm, plain rope
    "llama4-interleaved": ("Llama4TextConfig", "Llama4ForCausalLM",
                           {**_LLAMA, "num_hidden_layers": 4, "intermediate_size": 16, "intermediate_size_mlp": 48,
                            "head_dim": 8, "attention_chunk_size": 4, "floor_scale": 4, "num_local_experts": 4,
                            "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "use_qk_norm": False,
                            "attn_implementation": "eager"}),
    # gpt-oss: sinks, biased experts and router, the clamped SwiGLU (a limit low enough to clamp here), sliding
    # and full layers (window 4), an explicit head_dim, its class's default yarn
    "gpt-oss": ("GptOssConfig", "GptOssForCausalLM",
                {**_LLAMA, "num_hidden_layers": 3, "intermediate_size": 16, "head_dim": 12, "num_local_experts": 4,
                 "num_experts_per_tok": 2, "sliding_window": 4, "swiglu_limit": 1.0, "max_position_embeddings": 131072,
                 "attn_implementation": "eager"}),
    # DeepSeek: with and without query compression, grouped and ungrouped routing, both rope layouts
    "deepseek-v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", _DEEPSEEK_V2),
    "deepseek-v2-plain": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                          {**_DEEPSEEK_V2, "q_lora_rank": None, "topk_method": "greedy", "first_k_dense_replace": 0}),
    "deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", _DEEPSEEK_V3),
    "deepseek-v3-plain": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                          {**_DEEPSEEK_V3, "q_lora_rank": None, "n_group": 1, "topk_group": 1, "rope_interleave": False,
                           "norm_topk_prob": False, "first_k_dense_replace": 2}),
    # DeepSeek-V2-Lite's and V3's published yarn (factor 40, mscale 0.707 / 1.0), pretraining length 16
    "deepseek-v2-lite-yarn": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                              {**_DEEPSEEK_V2, "q_lora_rank": None, "topk_method": "greedy",
                               "max_position_embeddings": 640,
                               "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                                "mscale": 0.707, "mscale_all_dim": 0.707,
                                                "original_max_position_embeddings": 16}}),
    "deepseek-v3-yarn": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                         {**_DEEPSEEK_V3, "max_position_embeddings": 640,
                          "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                           "mscale": 1.0, "mscale_all_dim": 1.0,
                                           "original_max_position_embeddings": 16}}),
    "deepseek-v3-base": ("DeepseekV3Config", "DeepseekV3Model", _DEEPSEEK_V3),
    # DeepSeek-V3.2: V3 with the lightning indexer keeping 4 keys per query, fewer than the test sequences hold
    "deepseek-v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM",
                     {**_DEEPSEEK_V3, "index_n_heads": 4, "index_head_dim": 12, "index_topk": 4,
                      "attn_implementation": "eager"}),
    # GLM-5: V3.2's layers (top 4 keys per query, fewer than the test sequences hold) whose indexer rotates
    # adjacent pairs of its 8 rotary numbers out of 12, two expert groups, the 1e6 rotary base. 8 indexer heads:
    # a key every head scores below zero scores exactly 0 (ReLU), and with 4 heads such ties fell where the top 4
    # are cut, which torch and XLA break differently (transformers' own cached and full passes disagreed there)
    "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM",
                    {**_DEEPSEEK_V3, "index_n_heads": 8, "index_head_dim": 12, "index_topk": 4,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                     "attn_implementation": "eager"}),
    # Mistral Small 4: V3's layers with queries scaled by their position past every 4 positions (beta 0.5, so the
    # 9-token inputs see three spans), yarn over those 4, a softmax router scoring 4 groups of 2 by their best two
    "mistral4": ("Mistral4Config", "Mistral4ForCausalLM",
                 {**_DEEPSEEK_V3, "routed_scaling_factor": 1.5, "pad_token_id": 0,
                  "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                                      "original_max_position_embeddings": 4, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5}}),
    # Mistral Large 4's text model: a plain query, the indexer's from its input (8 heads of 12 keeping 4 keys, fewer
    # than the test sequences hold), a dense layer then 4 expert layers, the fourth layer NoPE, the latent's norm at
    # the model's eps (1e-5, not DeepSeek's 1e-6), yarn over 4 positions
    # with no magnitude scaling, a softmax router scoring 4 groups of 2 by their best two; LeRoPE's alpha and the
    # per-head log-position query scales drawn below
    "mistral_large4": ("MistralLarge4TextConfig", "MistralLarge4TextModel",
                       {**_DEEPSEEK_V3, "q_lora_rank": None, "num_hidden_layers": 5, "routed_scaling_factor": 1.5,
                        "rms_norm_eps": 1e-5,
                        "pad_token_id": 0, "index_n_heads": 8, "index_head_dim": 12, "index_topk": 4,
                        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                                            "original_max_position_embeddings": 4, "beta_fast": 32.0,
                                            "beta_slow": 1.0, "attention_factor": 1.0},
                        "attn_implementation": "eager"}),
    # DeepSeek-V4: an HCA, a CSA, a window-only and a CSA layer (blocks of 4 and 2 tokens, a window of 4, the indexer
    # keeping 2 entries: the 9-token inputs pass 4 CSA blocks, so it selects), 3 residual copies, the first layer's
    # experts by token id, yarn on the compressed layers only, a SwiGLU clamp low enough to clamp. 8 indexer heads
    # keep exact ReLU ties (every head below zero) away from the top-k cut, where torch's choice depends on length
    "deepseek-v4": ("DeepseekV4Config", "DeepseekV4ForCausalLM", _DEEPSEEK_V4),
    "deepseek-v4-base": ("DeepseekV4Config", "DeepseekV4Model", _DEEPSEEK_V4),
    "t5": ("T5Config", "T5ForConditionalGeneration", _T5),
    "t5-v1_1": ("T5Config", "T5ForConditionalGeneration",
                {**_T5, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}),
    "t5-encoder": ("T5Config", "T5EncoderModel", _T5),
    # mT5: T5 v1.1's gated gelu and untied head under its own model_type, never scaling the decoder output
    "mt5": ("MT5Config", "MT5ForConditionalGeneration", {**_T5, "feed_forward_proj": "gated-gelu",
                                                         "tie_word_embeddings": False}),
    "mt5-encoder": ("MT5Config", "MT5EncoderModel", {**_T5, "feed_forward_proj": "gated-gelu"}),
    # UMT5: mT5 with a relative-bias table in every self-attention layer of both stacks
    "umt5": ("UMT5Config", "UMT5ForConditionalGeneration", {**_T5, "feed_forward_proj": "gated-gelu",
                                                           "tie_word_embeddings": False}),
    "umt5-encoder": ("UMT5Config", "UMT5EncoderModel", {**_T5, "feed_forward_proj": "gated-gelu"}),
    "mpnet": ("MPNetConfig", "MPNetModel", _MPNET),
    "mpnet-mlm": ("MPNetConfig", "MPNetForMaskedLM", _MPNET),
    "mpnet-seqcls": ("MPNetConfig", "MPNetForSequenceClassification", {**_MPNET, "num_labels": 3}),
    "mpnet-tokcls": ("MPNetConfig", "MPNetForTokenClassification", {**_MPNET, "num_labels": 5}),
    "mpnet-qa": ("MPNetConfig", "MPNetForQuestionAnswering", _MPNET),
    "bart": ("BartConfig", "BartForConditionalGeneration", _BART),
    # mBART (mBART-50's layout): BART's tensors pre-norm with final norms, scaled embeddings
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", {**_BART, "scale_embedding": True}),
    "mbart-base": ("MBartConfig", "MBartModel", _BART),
    # M2M-100 / NLLB: pre-norm with final norms, scaled embeddings, fairseq's sinusoids counted from the pad id
    "m2m100": ("M2M100Config", "M2M100ForConditionalGeneration", _M2M100),
    "m2m100-base": ("M2M100Config", "M2M100Model", {**_M2M100, "activation_function": "gelu", "scale_embedding": False}),
    "bart-base": ("BartConfig", "BartModel", _BART),
    # Marian's sinusoid tables: left out of MarianMTModel's files, written in MarianModel's and Pegasus'
    "marian": ("MarianConfig", "MarianMTModel", _MARIAN),
    "marian-base": ("MarianConfig", "MarianModel", _MARIAN),
    "marian-separate": ("MarianConfig", "MarianMTModel", {**_MARIAN, "share_encoder_decoder_embeddings": False}),
    "pegasus": ("PegasusConfig", "PegasusForConditionalGeneration", _PEGASUS),
    "pegasus-base": ("PegasusConfig", "PegasusModel", {**_PEGASUS, "activation_function": "gelu"}),
    "bigbird_pegasus": ("BigBirdPegasusConfig", "BigBirdPegasusForConditionalGeneration", _BIGBIRD_PEGASUS),
    "bigbird_pegasus-base": ("BigBirdPegasusConfig", "BigBirdPegasusModel", {**_BIGBIRD_PEGASUS, "use_bias": True}),
    # XLNet's content stream = Transformer-XL: causal and bidirectional, gelu and relu, per-layer and shared
    # u/v biases (untie_r=False: every layer holds the same pair), clamped distances
    "xlnet": ("XLNetConfig", "XLNetLMHeadModel", _XLNET),
    "xlnet-bi-relu": ("XLNetConfig", "XLNetModel", {**_XLNET, "attn_type": "bi", "ff_activation": "relu"}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", _GEMMA2),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {**_GEMMA3, "attn_logit_softcapping": None}),
    "gemma3-base": ("Gemma3TextConfig", "Gemma3TextModel", {**_GEMMA3, "attn_logit_softcapping": None}),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", _GEMMA4),
    # Gemma 4's experts beside every layer's MLP (the 26B A4B's enable_moe_block): 4 experts 8 wide, the best 2 kept,
    # the router's own scales and each expert's perturbed (below), on the layout above
    "gemma4-moe": ("Gemma4TextConfig", "Gemma4ForCausalLM", {**_GEMMA4, "enable_moe_block": True, "num_experts": 4,
                                                             "top_k_experts": 2, "moe_intermediate_size": 8}),
    # EmbeddingGemma's shape: a bidirectional Gemma 3 (sliding layers see |t - s| <= 6 // 2 = 3, as the file's
    # window 6 means there)
    "embeddinggemma": ("Gemma3TextConfig", "Gemma3TextModel",
                       {**_GEMMA3, "attn_logit_softcapping": None, "sliding_window": 6,
                        "use_bidirectional_attention": True}),
    "t5gemma": ("T5GemmaConfig", "T5GemmaForConditionalGeneration",
                dict(encoder=_T5GEMMA_HALF, decoder=_T5GEMMA_HALF, vocab_size=97, attn_implementation="eager")),
    "xlnet-tied-clamped": ("XLNetConfig", "XLNetLMHeadModel", {**_XLNET, "untie_r": False, "clamp_len": 3}),
    # StarCoder2: LayerNorms, biases everywhere, a plain tanh-GELU MLP, GQA, a window of 4 shorter than the test
    # sequences, tied head; the base model without biases or window, its own head_dim and a linearly scaled rope
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {**_STARCODER2, "sliding_window": 4}),
    "starcoder2-base": ("Starcoder2Config", "Starcoder2Model",
                        {**_STARCODER2, "use_bias": False, "head_dim": 12, "tie_word_embeddings": False,
                         "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}}),
    # OLMo-2: x + norm(f(x)) with no input norms, q/k norms over the whole projection, GQA; the base model with
    # attention biases, its own head_dim and llama3 rope
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {**_LLAMA, "pad_token_id": 0}),
    "olmo2-base": ("Olmo2Config", "Olmo2Model",
                   {**_LLAMA, "pad_token_id": 0, "attention_bias": True, "head_dim": 12,
                    "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 16}}),
    # Granite: LLaMA's layers under muP's multipliers (embeddings, residual branches, the attention scale, the
    # logits); the base model with attention biases and its own head_dim
    "granite": ("GraniteConfig", "GraniteForCausalLM", _GRANITE),
    "granite-base": ("GraniteConfig", "GraniteModel", {**_GRANITE, "attention_bias": True, "head_dim": 12,
                                                        "tie_word_embeddings": True}),
    # SmolLM3: every second layer without rotary positions; the base model's unrotated layer sliding (a window
    # of 4 shorter than the test sequences)
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", _SMOLLM3),
    "smollm3-sliding": ("SmolLM3Config", "SmolLM3Model", {**_SMOLLM3, "use_sliding_window": True,
                                                           "sliding_window": 4, "attention_bias": True}),
    # ERNIE 4.5: LLaMA's layers with adjacent rotary pairs over the whole head, its own head_dim, tied head
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", {**_LLAMA, "head_dim": 12, "pad_token_id": 0}),
    "ernie4_5-base": ("Ernie4_5Config", "Ernie4_5Model", {**_LLAMA, "pad_token_id": 0, "head_dim": 8,
                                                          "rope_parameters": {"rope_type": "default",
                                                                              "rope_theta": 10000.0}}),
    # GLM-4.5: half of each head rotating (LLaMA's halves), q/k/v biases, per-head q/k norms, one dense layer then
    # DeepSeek-V3's experts (sigmoid scores, a selection bias, two groups, a shared expert, scaled weights); the
    # base model (GLM-4.5-Air's choices) without q/k norms or groups
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", {**_GLM4_MOE, "use_qk_norm": True, "n_group": 2,
                                                          "topk_group": 1, "routed_scaling_factor": 2.5}),
    "glm4_moe-base": ("Glm4MoeConfig", "Glm4MoeModel", {**_GLM4_MOE, "attention_bias": False}),
    # Qwen3-Next: experts (softmax top-2 of 4, renormalised) with a sigmoid-gated shared expert in every layer; the
    # base model not renormalised, with a 1-in-2 full layer pattern; Qwen3.5 dense and Qwen3.5-MoE
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", _QWEN3_NEXT_MOE),
    "qwen3_next-base": ("Qwen3NextConfig", "Qwen3NextModel",
                        {**_QWEN3_NEXT_MOE, "norm_topk_prob": False, "num_hidden_layers": 4,
                         "layer_types": ["linear_attention", "full_attention"] * 2}),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", _QWEN3_NEXT),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", _QWEN3_NEXT_MOE),
    # Kimi Linear; the base model with a low-rank query, no groups, two shared experts and the class's own layer
    # pattern (every fourth past the first full: layer 4)
    "kimi_linear": ("KimiLinearConfig", "KimiLinearForCausalLM", _KIMI_LINEAR),
    "kimi_linear-base": ("KimiLinearConfig", "KimiLinearModel",
                         {**_KIMI_LINEAR, "layer_types": None, "q_lora_rank": 20, "num_expert_group": 1,
                          "topk_group": 1, "num_shared_experts": 2, "moe_renormalize": False}),
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", _PHIMOE),
    # the base model with plain rotary positions, no attention biases or window, the published jitter eps
    "phimoe-base": ("PhimoeConfig", "PhimoeModel", {**_PHIMOE, "attention_bias": False, "sliding_window": None,
                                                     "router_jitter_noise": 0.01, "rope_parameters": None}),
    # OLMoE: OLMo-2's q/k norms over the whole projection in pre-norm layers, softmax top-2 of 4 experts not
    # renormalised; the base model renormalised, with attention biases
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", _OLMOE),
    "olmoe-base": ("OlmoeConfig", "OlmoeModel", {**_OLMOE, "norm_topk_prob": True, "attention_bias": True}),
    # Granite MoE: Granite's multipliers over softmaxed top-2 of 4 experts with fused gate and up projections
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", {**_GRANITE, "num_local_experts": 4,
                                                                  "num_experts_per_tok": 2}),
    # StableLM: LayerNorms with biases, rotary positions on half of each head, q/k/v biases (StableLM 2 1.6B);
    # StableLM 2 12B's per-head q/k LayerNorms and parallel residual, with GQA and the default quarter rotated
    # OPT: pre-norm with a final LayerNorm, ReLU, biases, positions two rows into their table counted from the
    # attention mask, tied head; the base model post-norm without a final norm (OPT-350m's blocks), no biases
    "opt": ("OPTConfig", "OPTForCausalLM", _OPT),
    "opt-base": ("OPTConfig", "OPTModel", {**_OPT, "do_layer_norm_before": False, "enable_bias": False}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", _STABLELM),
    "stablelm-12b": ("StableLmConfig", "StableLmForCausalLM",
                     {**_STABLELM, "use_qkv_bias": False, "qk_layernorm": True, "use_parallel_residual": True,
                      "num_key_value_heads": 2, "partial_rotary_factor": 0.25}),
    # Command R: one LayerNorm without bias before attention and MLP side by side, adjacent rotary pairs, GQA, a
    # tied head times Command R+'s logit_scale; R+'s per-head q/k norms with an untied head; the base model with
    # attention biases, its own head_dim and a linearly scaled rope; Command R7B: three sliding layers (window 4,
    # shorter than the test sequences) and a fourth in full without rotary positions
    "cohere": ("CohereConfig", "CohereForCausalLM", _COHERE),
    "cohere-qk-norm": ("CohereConfig", "CohereForCausalLM", {**_COHERE, "use_qk_norm": True,
                                                              "tie_word_embeddings": False, "logit_scale": 0.0625}),
    "cohere-base": ("CohereConfig", "CohereModel",
                    {**_COHERE, "attention_bias": True, "head_dim": 12,
                     "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}}),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", {**_COHERE, "num_hidden_layers": 4, "sliding_window": 4,
                                                        "logit_scale": 0.25}),
    # Falcon: 7B's layout (one kv head, attention and MLP side by side through one norm, tied head); 40B's (the new
    # decoder architecture: 2 kv heads, ln_attn and ln_mlp) with biases, an untied head and its own rotary base;
    # the base models in 11B's layout (new architecture, one shared norm) and in the sequential multi-head one
    "falcon": ("FalconConfig", "FalconForCausalLM", _FALCON),
    "falcon-40b": ("FalconConfig", "FalconForCausalLM",
                   {**_FALCON, "new_decoder_architecture": True, "num_kv_heads": 2, "bias": True,
                    "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}),
    "falcon-11b-base": ("FalconConfig", "FalconModel", {**_FALCON, "new_decoder_architecture": True, "num_kv_heads": 2,
                                                         "num_ln_in_parallel_attn": 1}),
    "falcon-sequential-base": ("FalconConfig", "FalconModel", {**_FALCON, "multi_query": False, "parallel_attn": False,
                                                                "bias": True}),
    # image towers (fed pixel_values: IMAGE_SIZES): ViT with its pooler and with its classifier (named labels),
    # CLIP's (no patch bias, pre-layernorm, the first token normed as pooler_output) and SigLIP's (no class token,
    # the attention-pooling head)
    "vit": ("ViTConfig", "ViTModel", _VIT),
    "vit-imgcls": ("ViTConfig", "ViTForImageClassification",
                   {**_VIT, "id2label": {"0": "circle", "1": "square", "2": "triangle"}}),
    "clip_vision_model": ("CLIPVisionConfig", "CLIPVisionModel", _IMAGE_TOWER),
    "siglip_vision_model": ("SiglipVisionConfig", "SiglipVisionModel", _IMAGE_TOWER),
    # dual encoders and their text towers: CLIP's causal text model pooled at its largest id (eos_token_id 2, the
    # legacy rule; tests/test_contrastive.py pools at a real EOS), SigLIP's pooled at the last token through its head
    "clip_text_model": ("CLIPTextConfig", "CLIPTextModel", _CLIP_TEXT),
    "clip_text_model-projection": ("CLIPTextConfig", "CLIPTextModelWithProjection",
                                   {**_CLIP_TEXT, "projection_dim": 24}),
    "clip": ("CLIPConfig", "CLIPModel", dict(text_config=_CLIP_TEXT, vision_config=_IMAGE_TOWER, projection_dim=24)),
    "siglip_text_model": ("SiglipTextConfig", "SiglipTextModel", {**_SIGLIP_TEXT, "projection_size": 24}),
    "siglip": ("SiglipConfig", "SiglipModel", dict(text_config=_SIGLIP_TEXT, vision_config=_IMAGE_TOWER)),
    # SigLIP2 NaFlex: SigLIP's towers, the image one fed patched images of other grids than its positions'
    "siglip2_vision_model": ("Siglip2VisionConfig", "Siglip2VisionModel", _SIGLIP2_VISION),
    "siglip2_text_model": ("Siglip2TextConfig", "Siglip2TextModel", {**_SIGLIP_TEXT, "projection_size": 24}),
    "siglip2": ("Siglip2Config", "Siglip2Model", dict(text_config=_SIGLIP_TEXT, vision_config=_SIGLIP2_VISION)),
    "llava": ("LlavaConfig", "LlavaForConditionalGeneration", _LLAVA),
    # Gemma 3 reading images: a SigLIP tower's 3x3 patches pooled to one token an image (id 96), the Gemma 3 text model
    # (the shared tests feed text alone; tests/test_gemma3_vision.py feeds images)
    "gemma3-vision": ("Gemma3Config", "Gemma3ForConditionalGeneration", dict(
        vision_config={**_IMAGE_TOWER, "model_type": "siglip_vision_model", "vision_use_head": False},
        text_config={**_GEMMA3, "attn_logit_softcapping": None, "model_type": "gemma3_text"}, mm_tokens_per_image=1,
        image_token_index=96, boi_token_index=94, eoi_token_index=95, initializer_range=STD)),
    # Qwen2.5-VL: a two-layer tower (windows of 2x2 merged blocks but at its layer 1) merging to the text width, a Qwen2
    # text model with M-RoPE over 8-wide heads, its image placeholder id 96 (the shared tests feed text alone;
    # tests/test_qwen2_5_vl.py feeds images)
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", dict(
        text_config={**_LLAMA, "model_type": "qwen2_5_vl_text",
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}},
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=32,
                           window_size=56, fullatt_block_indexes=[1], initializer_range=STD),
        image_token_id=96, initializer_range=STD)),
    # an encoder-decoder reading audio (fed input_features: AUDIO_SHAPES)
    "whisper": ("WhisperConfig", "WhisperForConditionalGeneration", _WHISPER),
    "whisper-model": ("WhisperConfig", "WhisperModel", _WHISPER),
}
# the log-mel features a checkpoint reading audio takes: (mel bins, frames = 2 * max_source_positions)
AUDIO_SHAPES = {name: (entry[2]["num_mel_bins"], 2 * entry[2]["max_source_positions"])
                for name, entry in CHECKPOINTS.items() if "num_mel_bins" in entry[2]}
# the image a checkpoint of an image tower reads: (channels, height and width)
IMAGE_SIZES = {name: (3, entry[2]["image_size"], entry[2]["image_size"])
               for name, entry in CHECKPOINTS.items() if "image_size" in entry[2]}
# dual encoders read ids and images: their image tower's
DUAL_ENCODERS = {name for name, entry in CHECKPOINTS.items()
                 if entry[1] in ("CLIPModel", "SiglipModel", "Siglip2Model")}
# NaFlex image towers (SigLIP2) read patched images with their mask and grids: naflex_images
NAFLEX = {name for name, entry in CHECKPOINTS.items() if "Siglip2" in entry[1] and "Text" not in entry[1]}
IMAGE_SIZES.update({name: (3, CHECKPOINTS[name][2]["vision_config"]["image_size"],
                           CHECKPOINTS[name][2]["vision_config"]["image_size"]) for name in DUAL_ENCODERS - NAFLEX})


def naflex_images(name: str, rng: np.random.Generator, grids=((3, 5), (6, 2)), length: int = 24) -> dict:
    """A NaFlex checkpoint's image inputs, as Siglip2ImageProcessor lays them out: one image per grid of patches
    (rows, columns; the defaults shrink the 4x4 position grid on one axis and grow it on the other), each patch
    flattened, padded to ``length`` patches, with the mask of the real ones (numpy arrays)."""
    tower = CHECKPOINTS[name][2].get("vision_config", CHECKPOINTS[name][2])
    width = 3 * tower["patch_size"] ** 2
    shapes = np.array(grids, dtype=np.int64)
    mask = (np.arange(length)[None] < shapes.prod(-1)[:, None]).astype(np.int32)
    pixels = rng.uniform(-1, 1, (len(grids), length, width)).astype(np.float32) * mask[..., None]
    return dict(pixel_values=pixels, pixel_attention_mask=mask, spatial_shapes=shapes)
# Llama 3.2 Vision's tiled tower, apart from CHECKPOINTS (the shared parity tests' compare() reads no per-layer states
# of it: MllamaVisionModel returns none); tests/test_mllama_vision.py runs it on tiled_images and its processor's
TILED_TOWERS: dict[str, tuple[str, str, dict]] = {
    "mllama_vision_model": ("MllamaVisionConfig", "MllamaVisionModel", dict(
        hidden_size=32, num_hidden_layers=2, num_global_layers=1, attention_heads=4, intermediate_size=48,
        vision_output_dim=96, image_size=28, patch_size=14, max_num_tiles=2, intermediate_layers_indices=[0, 1],
        supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]])),
}


def tiled_images(rng: np.random.Generator) -> dict:
    """A tiled tower's inputs as MllamaImageProcessor lays them out (numpy): two prompts of two image slots of two
    tiles (28 x 28): a wide image (1 x 2 tiles, id 2) and a square one (id 1); a tall one (2 x 1, id 3) and no image
    (id 0, its first tile unmasked as the processor leaves it); unused tiles zero."""
    ids = np.array([[2, 1], [3, 0]], dtype=np.int64)
    mask = np.array([[[1, 1], [1, 0]], [[1, 1], [1, 0]]], dtype=np.int64)
    real = mask * (ids > 0)[..., None]  # (the processor's pixels: zero on unused tiles and missing images)
    pixels = rng.uniform(-1, 1, (2, 2, 2, 3, 28, 28)).astype(np.float32) * real[..., None, None, None]
    return dict(pixel_values=pixels, aspect_ratio_ids=ids, aspect_ratio_mask=mask)


# Qwen2.5-VL's and Qwen2-VL's image towers alone (fed merged_images; tests/test_qwen2_5_vl_vision.py runs its own)
MERGED_TOWERS: dict[str, tuple[str, str, dict]] = {
    "qwen2_5_vl_vision": ("Qwen2_5_VLVisionConfig", "Qwen2_5_VisionTransformerPretrainedModel", dict(
        depth=2, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=24, patch_size=4,
        window_size=16, fullatt_block_indexes=[1])),
    "qwen2_vl_vision": ("Qwen2VLVisionConfig", "Qwen2VisionTransformerPretrainedModel", dict(
        depth=2, embed_dim=32, mlp_ratio=2, num_heads=4, hidden_size=24, patch_size=4)),
}


def merged_images(rng: np.random.Generator) -> dict:
    """A merged tower's inputs as Qwen2VLImageProcessor lays them out (numpy; named as the tower's forward names
    them: pixel_values is its hidden_states): one image of 4 x 8 patches of 4 pixels and 2 frames (2 x 4 merged
    blocks, two windows of 16 pixels)."""
    return dict(hidden_states=rng.uniform(-1, 1, (32, 3 * 2 * 4 * 4)).astype(np.float32),
                grid_thw=np.array([[1, 4, 8]], dtype=np.int64))


# classes transformers keeps out of its top-level namespace, with the module that holds them
UNEXPORTED = {"Qwen2VisionTransformerPretrainedModel": "transformers.models.qwen2_vl.modeling_qwen2_vl"}


def transformers_class(name: str):
    """transformers' class ``name``: from its top level, else from the module UNEXPORTED names."""
    import importlib

    import transformers

    if name in UNEXPORTED:
        return getattr(importlib.import_module(UNEXPORTED[name]), name)
    return getattr(transformers, name)


# Llama 3.2 Vision: its text model, and joined to the tiled tower (image token: the vocabulary's size, a row past it)
CHECKPOINTS.update({
    "mllama_text_model": ("MllamaTextConfig", "MllamaForCausalLM", _MLLAMA_TEXT),
    "mllama": ("MllamaConfig", "MllamaForConditionalGeneration", dict(
        text_config=_MLLAMA_TEXT, vision_config=TILED_TOWERS["mllama_vision_model"][2], image_token_index=97,
        initializer_range=STD)),
})


# Encoder-decoders' classification and span heads: apart from CHECKPOINTS (whose shared tests feed inputs without
# the EOS tokens a classifier pools at); tests/test_seq2seq_heads.py runs them. T5 v1.1's gated layers for mT5.
SEQ2SEQ_HEADS: dict[str, tuple[str, str, dict]] = {
    "bart-seqcls": ("BartConfig", "BartForSequenceClassification", _BART),  # BartConfig's 3 labels
    "bart-qa": ("BartConfig", "BartForQuestionAnswering", _BART),
    "mbart-seqcls": ("MBartConfig", "MBartForSequenceClassification", {**_BART, "scale_embedding": True,
                                                                        "num_labels": 4}),
    "mbart-qa": ("MBartConfig", "MBartForQuestionAnswering", _BART),
    "t5-seqcls": ("T5Config", "T5ForSequenceClassification", {**_T5, "num_labels": 3}),
    "t5-qa": ("T5Config", "T5ForQuestionAnswering", _T5),
    "mt5-seqcls": ("MT5Config", "MT5ForSequenceClassification", {**_T5, "feed_forward_proj": "gated-gelu"}),
    "mt5-qa": ("MT5Config", "MT5ForQuestionAnswering", {**_T5, "feed_forward_proj": "gated-gelu"}),
    "umt5-seqcls": ("UMT5Config", "UMT5ForSequenceClassification", {**_T5, "feed_forward_proj": "gated-gelu"}),
    "umt5-qa": ("UMT5Config", "UMT5ForQuestionAnswering", {**_T5, "feed_forward_proj": "gated-gelu"}),
}


def build_reference(name: str, seed: int = 0, changes: dict | None = None):
    """The transformers model of a CHECKPOINTS entry (its config ``changes`` applied), freshly initialised
    with a fixed seed."""
    import torch
    import transformers

    config_class, model_class, kwargs = {**CHECKPOINTS, **SEQ2SEQ_HEADS, **TILED_TOWERS, **MERGED_TOWERS}[name]
    kwargs = {**kwargs, **(changes or {})}
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**kwargs)
    model = transformers_class(model_class)(config).eval()
    # T5's own init (initializer_factor=1.0) already gives O(1) activations: embeddings have std 1.
    # Its untied v1.1 head starts at std 1 too, which puts logits near 30 where float32 rounding alone
    # reaches 1e-5; a quarter of that keeps logits O(5) and the 1e-5 standard meaningful.
    if name == "t5-v1_1":
        with torch.no_grad():
            model.lm_head.weight.mul_(0.25)
    if name in ("mt5", "umt5"):  # (U)MT5Config ties whatever it is told; the published files hold their own head
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight) * 0.25)
    # final_logits_bias starts at zero; give it values so the test sees it
    if name.startswith(("bart", "mbart", "marian", "pegasus", "bigbird_pegasus")):
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0, STD)
    if name == "gemma3-vision":  # transformers starts Gemma 3's projector at zero: random values let images count
        with torch.no_grad():
            model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, STD)
    with torch.no_grad():  # V3's selection bias starts at zero; random values make it change the choice
        for n, buffer in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn_like(buffer) * 0.1)
    if getattr(config, "untie_r", True) is False:  # XLNet with one u/v pair: every layer holds layer 0's
        with torch.no_grad():
            for layer in model.transformer.layer[1:]:
                layer.rel_attn.r_w_bias.copy_(model.transformer.layer[0].rel_attn.r_w_bias)
                layer.rel_attn.r_r_bias.copy_(model.transformer.layer[0].rel_attn.r_r_bias)
    with torch.no_grad():  # norms start at exactly 1 and 0; perturb them so their mapping is tested
        for n, p in model.named_parameters():
            if (p.dim() == 1 and ("norm" in n.lower() or n.endswith((".bias", ".q_bias", ".v_bias")))
                    or n.endswith((".q_norm.weight", ".k_norm.weight"))  # (Cohere's [heads, head_dim])
                    or n.endswith("_proj_bias")):  # (DeBERTa v1's query and value biases start at zero)
                p.add_(torch.randn_like(p) * 0.1)
    with torch.no_grad():  # CLIP's logit scale starts at its config's value, SigLIP's scale and bias at zero
        for n, p in model.named_parameters():
            if n in ("logit_scale", "logit_bias"):
                p.add_(torch.randn_like(p) * 0.5)
    with torch.no_grad():  # Gemma 4's layer_scalar buffers start at 1; give them values so the test sees them
        for n, buffer in model.named_buffers():
            if n.endswith(".layer_scalar"):
                buffer.copy_(1 + torch.randn_like(buffer) * 0.1)
    with torch.no_grad():  # Llama 3.2 Vision's tile-embedding gates start at 0 (hiding their tables), its layers' at pi / 4
        for n, p in model.named_parameters():
            if n.endswith((".gate", ".gate_attn", ".gate_ffn")):
                p.copy_(torch.randn_like(p))
    with torch.no_grad():  # Llama 3.2 Vision's cross layers' gates start at 0, which leaves the layers adding nothing
        for n, p in model.named_parameters():
            if n.endswith(("cross_attn_attn_gate", "cross_attn_mlp_gate")):
                p.copy_(torch.randn_like(p))
    with torch.no_grad():  # Gemma 4's router scales start at 1 too
        for n, p in model.named_parameters():
            if n.endswith((".router.scale", ".router.per_expert_scale")):
                p.add_(torch.randn_like(p) * 0.1)
    if name.startswith("deepseek-v4"):  # V4's sinks, compressor biases and hyper-connection biases and scales start at
        with torch.no_grad():  # 0 or 1, its token-to-expert table at expert 0: values so the test sees them
            for n, p in model.named_parameters():
                if n.endswith(("sinks", "position_bias", "_hc.base", "_hc.scale", "hc_base", "hc_scale")):
                    p.add_(torch.randn_like(p) * 0.5)
            for n, buffer in model.named_buffers():
                if n.endswith("tid2eid"):
                    rows = [torch.randperm(config.n_routed_experts)[:config.num_experts_per_tok] for _ in buffer]
                    buffer.copy_(torch.stack(rows))
    if name.startswith("mistral_large4"):  # LeRoPE's alpha and the query scales' slopes start at 0
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith(("rotary_emb.alpha", "softmax_scaling.scale")):
                    p.add_(torch.randn_like(p) * 0.1)
    if name.startswith("kimi_linear"):  # a residual stream 4x its std-0.05 draw: the final norm then lifts both
        with torch.no_grad():           # sides' rounding 4x less (last row 2e-6 over 150 tokens, not 2e-5)
            getattr(model, "model", model).embed_tokens.weight.mul_(4.0)
    with torch.no_grad():  # an image tower's patch projection reads C * p * p = 300 numbers: at std 0.2 it puts ViT's
        for n, p in model.named_parameters():  # states near 13, where float32's rounding of the convolution against
            if n.endswith(("patch_embedding.weight", "patch_embeddings.projection.weight")):  # a matmul nears 1e-5;
                p.mul_(0.25)  # a quarter keeps them O(1)
    if name.startswith("falcon"):  # Falcon's ln_attn, ln_mlp and ln_f have no "norm" in their names
        with torch.no_grad():
            for n, p in model.named_parameters():
                if ".ln_" in n and n.endswith(".weight"):
                    p.add_(torch.randn_like(p) * 0.1)
    return model


def save_checkpoint(name: str, folder: Path, seed: int = 0, dtype=None, changes: dict | None = None) -> Path:
    model = build_reference(name, seed, changes)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(str(folder))
    return folder
