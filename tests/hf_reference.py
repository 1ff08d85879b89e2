"""Reference architecture configs of published Hugging Face checkpoints.

``HF_REFERENCE`` maps a jaxformer preset name to ``(transformers model class
name, config kwargs)``. The kwargs are the architecture-relevant fields of the
published ``config.json`` (written with argument names accepted by
transformers 5.x, e.g. ``rope_parameters`` instead of ``rope_theta``).

``hf_param_count(name)`` builds the PyTorch model on the meta device (no memory
is allocated) and returns its parameter count, tied weights counted once.

torch and transformers are imported lazily, so importing this module does not
require them.
"""

from __future__ import annotations

__all__ = ["HF_REFERENCE", "hf_param_count"]


def _bert(hidden: int, layers: int, heads: int, intermediate: int) -> dict:
    return dict(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        hidden_act="gelu",
        max_position_embeddings=512,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        pad_token_id=0,
    )


def _gpt2(n_embd: int, n_layer: int, n_head: int, n_positions: int = 1024) -> dict:
    return dict(
        vocab_size=50257,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_inner=None,  # 4 * n_embd
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
    )


def _t5(d_model: int, d_ff: int, d_kv: int, layers: int, heads: int) -> dict:
    # T5 v1.0: relu FFN, lm_head tied to the shared embedding (and decoder
    # output rescaled by d_model**-0.5 before the lm_head).
    return dict(
        vocab_size=32128,
        d_model=d_model,
        d_ff=d_ff,
        d_kv=d_kv,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=heads,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="relu",
        layer_norm_epsilon=1e-6,
        tie_word_embeddings=True,
    )


# Phi-3.5-mini-instruct's published longrope factors (config.json, rope_scaling)
PHI35_SHORT = (
    1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842, 1.0499999523162842,
    1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0699999332427979, 1.0999999046325684,
    1.1099998950958252, 1.1599998474121094, 1.1599998474121094, 1.1699998378753662, 1.2899998426437378,
    1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083, 1.8499997854232788,
    1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745, 2.0199997425079346,
    2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0799996852874756,
    2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533, 2.729999542236328,
    2.749999523162842, 2.8399994373321533,
)
PHI35_LONG = (
    1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601, 1.5899999141693115,
    1.600000023841858, 1.6200000047683716, 2.620000123977661, 3.2300000190734863, 3.2300000190734863,
    4.789999961853027, 7.400000095367432, 7.700000286102295, 9.09000015258789, 12.199999809265137,
    17.670000076293945, 24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
    32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992, 50.340003967285156,
    50.45000457763672, 57.55000305175781, 57.93000411987305, 58.21000289916992, 60.1400032043457,
    62.61000442504883, 62.62000274658203, 62.71000289916992, 63.1400032043457, 63.1400032043457,
    63.77000427246094, 63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
    64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938, 64.4800033569336,
    64.51000213623047, 64.52999877929688, 64.83999633789062,
)
# Phi-4-mini-instruct's published long factors (config.json, rope_scaling; its 48 short factors are all 1.0)
PHI4_MINI_LONG = (
    1.0, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649, 2.446418898,
    2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533, 5.984965424,
    6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
    16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23, 32.6,
    32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77,
)

def _rope(theta: float) -> dict:
    return {"rope_type": "default", "rope_theta": theta}


def _gpt_oss(layers: int, experts: int) -> dict:
    return dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=layers,
                num_attention_heads=64, num_key_value_heads=8, head_dim=64, hidden_act="silu",
                max_position_embeddings=131072, rms_norm_eps=1e-5, num_local_experts=experts, num_experts_per_tok=4,
                sliding_window=128, layer_types=["sliding_attention", "full_attention"] * (layers // 2),
                rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
                attention_bias=True, swiglu_limit=7.0, router_aux_loss_coef=0.9, tie_word_embeddings=False,
                pad_token_id=199999, eos_token_id=200002)


def _olmo2(hidden: int, layers: int, heads: int, intermediate: int) -> dict:
    # OLMo-2-0425-1B's and OLMo-2-1124-7B's config.json
    return dict(vocab_size=100352, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=heads, hidden_act="silu", max_position_embeddings=4096,
                rms_norm_eps=1e-6, rope_parameters=_rope(500000.0), attention_bias=False, tie_word_embeddings=False,
                pad_token_id=100277, eos_token_id=100257, bos_token_id=None)


def _starcoder2(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, theta: float,
                init: float, **kw) -> dict:
    # bigcode/starcoder2-{3b,7b,15b}'s config.json (the class's tied head unless the file unties it: 15B)
    return dict(vocab_size=49152, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, hidden_act="gelu_pytorch_tanh",
                max_position_embeddings=16384, norm_epsilon=1e-5, rope_parameters=_rope(theta), sliding_window=4096,
                use_bias=True, initializer_range=init, bos_token_id=0, eos_token_id=0, **kw)


def _granite(hidden: int, intermediate: int, attention: float, logits: float) -> dict:
    # ibm-granite/granite-3.0-{2b,8b}-base's config.json
    return dict(vocab_size=49155, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=40,
                num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", max_position_embeddings=4096,
                rms_norm_eps=1e-5, rope_parameters=_rope(10000.0), attention_bias=False, mlp_bias=False,
                embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=attention,
                logits_scaling=logits, attention_dropout=0.1, tie_word_embeddings=True, bos_token_id=0,
                eos_token_id=0, pad_token_id=0)


def _granite_moe(hidden: int, layers: int, heads: int, experts: int) -> dict:
    # ibm-granite/granite-3.0-{1b-a400m,3b-a800m}-base's config.json
    dense = {k: v for k, v in _granite(hidden, 512, 0.015625, 6.0).items() if k != "mlp_bias"}
    return {**dense, "num_hidden_layers": layers, "num_attention_heads": heads, "num_local_experts": experts,
            "num_experts_per_tok": 8, "router_aux_loss_coef": 0.001}


def _opt(hidden: int, layers: int, heads: int) -> dict:
    # facebook/opt-{125m,1.3b,6.7b}'s config.json
    return dict(vocab_size=50272, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                ffn_dim=4 * hidden, max_position_embeddings=2048, do_layer_norm_before=True,
                word_embed_proj_dim=hidden, activation_function="relu", dropout=0.1, attention_dropout=0.0,
                layerdrop=0.0, pad_token_id=1, bos_token_id=2, eos_token_id=2)


def _glm45(hidden: int, layers: int, intermediate: int, moe: int, experts: int, dense: int, scaling: float,
           qk_norm: bool) -> dict:
    # zai-org/GLM-4.5's and GLM-4.5-Air's config.json (their multi-token-prediction layer is not part of the model)
    return dict(vocab_size=151552, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=96, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                max_position_embeddings=131072, rms_norm_eps=1e-5, partial_rotary_factor=0.5,
                rope_parameters=_rope(1000000.0), attention_bias=True, use_qk_norm=qk_norm,
                moe_intermediate_size=moe, num_experts_per_tok=8, n_shared_experts=1, n_routed_experts=experts,
                routed_scaling_factor=scaling, n_group=1, topk_group=1, first_k_dense_replace=dense,
                norm_topk_prob=True, num_nextn_predict_layers=1, tie_word_embeddings=False, pad_token_id=151329,
                eos_token_id=[151329, 151336, 151338])


def _stablelm(vocab: int, hidden: int, intermediate: int, layers: int, kv_heads: int, **kw) -> dict:
    # stabilityai/stablelm-3b-4e1t's, stablelm-2-1_6b's and stablelm-2-12b's config.json
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=32, num_key_value_heads=kv_heads, hidden_act="silu", max_position_embeddings=4096,
                layer_norm_eps=1e-5, rope_parameters={**_rope(10000.0), "partial_rotary_factor": 0.25},
                tie_word_embeddings=False, **kw)


def _falcon(hidden: int, layers: int, heads: int, **kw) -> dict:
    # tiiuae/falcon-7b's, falcon-40b's and falcon-180B's config.json (the class's 2048 positions, rotary base 1e4,
    # 4x MLP, exact GELU and tied head)
    return dict(vocab_size=65024, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                layer_norm_epsilon=1e-5, alibi=False, bias=False, parallel_attn=True, hidden_dropout=0.0,
                attention_dropout=0.0, bos_token_id=11, eos_token_id=11, **kw)


def _cohere(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, theta: float, logit_scale: float,
            **kw) -> dict:
    # CohereForAI/c4ai-command-r-v01's and c4ai-command-r-plus's config.json (and c4ai-command-r7b-12-2024's)
    return {**dict(vocab_size=256000, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                   num_key_value_heads=kv_heads, intermediate_size=intermediate, hidden_act="silu",
                   max_position_embeddings=8192, layer_norm_eps=1e-5, rope_parameters=_rope(theta),
                   logit_scale=logit_scale, attention_bias=False, tie_word_embeddings=True, pad_token_id=0,
                   bos_token_id=5, eos_token_id=255001), **kw}


def _deepseek_yarn(mscale: float) -> dict:
    """DeepSeek-V2's and V3's published context extension: 4096 pre-trained positions, 40-fold by yarn."""
    return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": mscale, "mscale_all_dim": mscale}


def _deepseek_v4(hidden: int, layers: int, heads: int, moe: int, experts: int, q_rank: int, groups: int,
                 scaling: float, ratios: list[int] | None) -> dict:
    kw = {} if ratios is None else {"compress_ratios": ratios}
    return dict(vocab_size=129280, hidden_size=hidden, moe_intermediate_size=moe, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=1, head_dim=512, q_lora_rank=q_rank, qk_rope_head_dim=64,
                num_experts_per_tok=6, n_routed_experts=experts, n_shared_experts=1, scoring_func="sqrtsoftplus",
                routed_scaling_factor=scaling, o_groups=groups, o_lora_rank=1024, index_n_heads=64, index_head_dim=128,
                index_topk=512, num_hash_layers=3, sliding_window=128, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
                swiglu_limit=10.0, rope_theta=10000, compress_rope_theta=160000.0, max_position_embeddings=1048576,
                rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                              "beta_fast": 32, "beta_slow": 1}, tie_word_embeddings=False, **kw)


def _gemma(hidden: int, layers: int, heads: int, kv: int, intermediate: int, vocab: int, **kw) -> dict:
    return dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, head_dim=256, intermediate_size=intermediate, **kw)


def _gemma4(hidden: int, layers: int, heads: int, kv: int, intermediate: int, window: int, every: int, **kw) -> dict:
    kinds = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]
    return dict(_gemma(hidden, layers, heads, kv, intermediate, 262144, sliding_window=window, layer_types=kinds,
                       global_head_dim=512, final_logit_softcapping=30.0), **kw)


def _vit(hidden: int, layers: int, heads: int) -> dict:
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * hidden,
                hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12,
                image_size=224, patch_size=16, num_channels=3, qkv_bias=True,
                id2label={str(i): f"LABEL_{i}" for i in range(1000)})


HF_REFERENCE: dict[str, tuple[str, dict]] = {
    # --- Gemma (tied head) and T5Gemma (one table per side, the head tied to the decoder's) ---
    "gemma-2-2b": ("Gemma2ForCausalLM", _gemma(2304, 26, 8, 4, 9216, 256000)),
    "gemma-2-9b": ("Gemma2ForCausalLM", _gemma(3584, 42, 16, 8, 14336, 256000)),
    "gemma-3-1b": ("Gemma3ForCausalLM", _gemma(1152, 26, 4, 1, 6912, 262144, sliding_window=512,
                                               max_position_embeddings=32768)),
    "gemma-3-4b": ("Gemma3ForCausalLM", _gemma(
        2560, 34, 8, 4, 10240, 262208, sliding_window=1024,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    # EmbeddingGemma: the base model, bidirectional (google/embeddinggemma-300m's config.json)
    "embeddinggemma-300m": ("Gemma3TextModel", _gemma(768, 24, 3, 1, 1152, 262144, sliding_window=512,
                                                      max_position_embeddings=2048, use_bidirectional_attention=True)),
    # Gemma 4's text models: third-party copies of google/gemma-4-{E2B,E4B,31B}'s text_config (not hub-verified)
    "gemma-4-e2b": ("Gemma4ForCausalLM", _gemma4(1536, 35, 8, 1, 6144, 512, 5, num_kv_shared_layers=20,
                                                 use_double_wide_mlp=True)),
    "gemma-4-e4b": ("Gemma4ForCausalLM", _gemma4(2560, 42, 8, 2, 10240, 512, 6, num_kv_shared_layers=18)),
    "gemma-4-31b": ("Gemma4ForCausalLM", _gemma4(5376, 60, 32, 16, 21504, 1024, 6, hidden_size_per_layer_input=0,
                                                 max_position_embeddings=262144, attention_k_eq_v=True,
                                                 num_global_key_value_heads=4)),
    # google/gemma-4-26B-A4B-it's text_config (third-party copies, not hub-verified): the experts beside each MLP
    "gemma-4-26b-a4b": ("Gemma4ForCausalLM", _gemma4(2816, 30, 16, 8, 2112, 1024, 6, hidden_size_per_layer_input=0,
                                                     max_position_embeddings=262144, attention_k_eq_v=True,
                                                     num_global_key_value_heads=2, enable_moe_block=True,
                                                     num_experts=128, top_k_experts=8, moe_intermediate_size=704)),
    "t5gemma-2b-2b": ("T5GemmaForConditionalGeneration",
                      dict(encoder=_gemma(2304, 26, 8, 4, 9216, 256000), decoder=_gemma(2304, 26, 8, 4, 9216, 256000),
                           vocab_size=256000)),
    # --- XLNet (the content stream: Transformer-XL) ------------------------------
    "xlnet-base-cased": ("XLNetLMHeadModel", dict(vocab_size=32000, d_model=768, n_layer=12, n_head=12, d_inner=3072,
                                                  ff_activation="gelu", attn_type="bi")),
    "xlnet-large-cased": ("XLNetLMHeadModel", dict(vocab_size=32000, d_model=1024, n_layer=24, n_head=16,
                                                   d_inner=4096, ff_activation="gelu", attn_type="bi")),
    # --- encoders -------------------------------------------------------------
    "bert-base-uncased": ("BertModel", _bert(768, 12, 12, 3072)),
    "bert-large-uncased": ("BertModel", _bert(1024, 24, 16, 4096)),
    "roberta-base": (
        "RobertaModel",
        dict(
            vocab_size=50265,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            hidden_act="gelu",
            max_position_embeddings=514,
            type_vocab_size=1,
            layer_norm_eps=1e-5,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        ),
    ),
    **{name: ("LongformerModel", dict(vocab_size=50265, hidden_size=hidden, num_hidden_layers=layers,
                                      num_attention_heads=heads, intermediate_size=4 * hidden, hidden_act="gelu",
                                      max_position_embeddings=4098, type_vocab_size=1, layer_norm_eps=1e-5,
                                      attention_window=512, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                      sep_token_id=2))
       for name, hidden, layers, heads in (("longformer-base-4096", 768, 12, 12),
                                           ("longformer-large-4096", 1024, 24, 16))},
    # google/bigbird-roberta-base and -large's config.json (BigBirdConfig's defaults are the base model's)
    **{name: ("BigBirdModel", dict(vocab_size=50358, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, intermediate_size=4 * hidden, hidden_act="gelu_new",
                                   max_position_embeddings=4096, type_vocab_size=2, layer_norm_eps=1e-12,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2, sep_token_id=66,
                                   attention_type="block_sparse", block_size=64, num_random_blocks=3, use_bias=True,
                                   rescale_embeddings=False))
       for name, hidden, layers, heads in (("bigbird-roberta-base", 768, 12, 12),
                                           ("bigbird-roberta-large", 1024, 24, 16))},
    "distilbert-base-uncased": ("DistilBertModel", dict(vocab_size=30522, dim=768, n_layers=6, n_heads=12,
                                                        hidden_dim=3072, max_position_embeddings=512, pad_token_id=0)),
    **{name: ("AlbertModel", dict(vocab_size=30000, embedding_size=128, hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, intermediate_size=4 * hidden, hidden_act="gelu_new",
                                  max_position_embeddings=512, type_vocab_size=2, pad_token_id=0))
       for name, hidden, layers, heads in (("albert-base-v2", 768, 12, 12), ("albert-large-v2", 1024, 24, 16),
                                           ("albert-xxlarge-v2", 4096, 12, 64))},
    **{f"electra-{size}-{role}": ("ElectraForPreTraining" if role == "discriminator" else "ElectraForMaskedLM",
                                  dict(vocab_size=30522, embedding_size=embedding, hidden_size=hidden,
                                       num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ff,
                                       max_position_embeddings=512, type_vocab_size=2, pad_token_id=0))
       for size, role, hidden, layers, heads, ff, embedding in (
           ("small", "discriminator", 256, 12, 4, 1024, 128), ("small", "generator", 256, 12, 4, 1024, 128),
           ("base", "discriminator", 768, 12, 12, 3072, 768), ("base", "generator", 256, 12, 4, 1024, 768),
           ("large", "discriminator", 1024, 24, 16, 4096, 1024), ("large", "generator", 256, 24, 4, 1024, 1024))},
    **{name: ("ModernBertModel", dict(vocab_size=50368, hidden_size=hidden, intermediate_size=ff,
                                      num_hidden_layers=layers, num_attention_heads=heads, max_position_embeddings=8192,
                                      local_attention=128, global_attn_every_n_layers=3, global_rope_theta=160000.0,
                                      local_rope_theta=10000.0, pad_token_id=50283))
       for name, hidden, layers, heads, ff in (("modernbert-base", 768, 22, 12, 1152),
                                               ("modernbert-large", 1024, 28, 16, 2624))},
    "deberta-base": ("DebertaModel", dict(vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                          intermediate_size=3072, max_position_embeddings=512, relative_attention=True,
                                          pos_att_type="c2p|p2c", layer_norm_eps=1e-7, max_relative_positions=-1,
                                          position_biased_input=False, type_vocab_size=0)),
    **{name: ("DebertaV2Model", dict(vocab_size=128100, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=4 * hidden, max_position_embeddings=512,
                                     relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm",
                                     share_att_key=True, pos_att_type="p2c|c2p", layer_norm_eps=1e-7,
                                     max_relative_positions=-1, position_biased_input=False, type_vocab_size=0))
       for name, hidden, layers, heads in (("deberta-v3-small", 768, 6, 12), ("deberta-v3-base", 768, 12, 12),
                                           ("deberta-v3-large", 1024, 24, 16))},
    "xlm-roberta-base": (
        "XLMRobertaModel",
        dict(vocab_size=250002, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
             hidden_act="gelu", max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
             bos_token_id=0, eos_token_id=2),
    ),
    "xlm-roberta-large": (
        "XLMRobertaModel",
        dict(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
             hidden_act="gelu", max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
             bos_token_id=0, eos_token_id=2),
    ),
    # --- GPT-2 family (tied lm_head) -----------------------------------------
    "gpt2": ("GPT2LMHeadModel", _gpt2(768, 12, 12)),
    "gpt2-medium": ("GPT2LMHeadModel", _gpt2(1024, 24, 16)),
    "gpt2-large": ("GPT2LMHeadModel", _gpt2(1280, 36, 20)),
    "gpt2-xl": ("GPT2LMHeadModel", _gpt2(1600, 48, 25)),
    # GPT-3 175B is architecturally GPT-2 at these sizes (dense layers only).
    "gpt3-175b": ("GPT2LMHeadModel", _gpt2(12288, 96, 96, n_positions=2048)),
    # --- T5 v1.0 ---------------------------------------------------------------
    "t5-small": ("T5ForConditionalGeneration", _t5(512, 2048, 64, 6, 8)),
    "t5-base": ("T5ForConditionalGeneration", _t5(768, 3072, 64, 12, 12)),
    "t5-large": ("T5ForConditionalGeneration", _t5(1024, 4096, 64, 24, 16)),
    "t5-3b": ("T5ForConditionalGeneration", _t5(1024, 16384, 128, 24, 32)),
    "t5-11b": ("T5ForConditionalGeneration", _t5(1024, 65536, 128, 24, 128)),
    # --- T5 v1.1 (gated-gelu, untied lm_head, no output rescale) ---------------
    "t5-v1_1-base": (
        "T5ForConditionalGeneration",
        dict(
            vocab_size=32128,
            d_model=768,
            d_ff=2048,
            d_kv=64,
            num_layers=12,
            num_decoder_layers=12,
            num_heads=12,
            relative_attention_num_buckets=32,
            relative_attention_max_distance=128,
            feed_forward_proj="gated-gelu",
            layer_norm_epsilon=1e-6,
            tie_word_embeddings=False,
        ),
    ),
    # --- mT5 (T5 v1.1 over 250K tokens) -----------------------------------------
    **{name: ("MT5ForConditionalGeneration", dict(vocab_size=250112, d_model=d_model, d_ff=d_ff, d_kv=64,
                                                  num_layers=layers, num_decoder_layers=layers, num_heads=heads,
                                                  relative_attention_num_buckets=32,
                                                  relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
                                                  layer_norm_epsilon=1e-6, tie_word_embeddings=False,
                                                  decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
       for name, d_model, d_ff, layers, heads in (("mt5-small", 512, 1024, 8, 6), ("mt5-base", 768, 2048, 12, 12))},
    # --- UMT5 (mT5 with a relative bias in every self-attention layer) ---------
    **{name: ("UMT5ForConditionalGeneration", dict(vocab_size=256384, d_model=d_model, d_ff=d_ff, d_kv=64,
                                                   num_layers=layers, num_decoder_layers=layers, num_heads=heads,
                                                   relative_attention_num_buckets=32,
                                                   relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
                                                   layer_norm_epsilon=1e-6, tie_word_embeddings=False,
                                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
       for name, d_model, d_ff, layers, heads in (("umt5-small", 512, 1024, 8, 6), ("umt5-base", 768, 2048, 12, 12))},
    # --- MPNet (microsoft/mpnet-base's config.json) ------------------------------
    "mpnet-base": ("MPNetModel", dict(vocab_size=30527, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                      intermediate_size=3072, hidden_act="gelu", max_position_embeddings=514,
                                      layer_norm_eps=1e-5, relative_attention_num_buckets=32, pad_token_id=1,
                                      bos_token_id=0, eos_token_id=2)),
    # --- BART ------------------------------------------------------------------
    "bart-base": (
        "BartForConditionalGeneration",
        dict(
            vocab_size=50265,
            d_model=768,
            encoder_layers=6,
            decoder_layers=6,
            encoder_attention_heads=12,
            decoder_attention_heads=12,
            encoder_ffn_dim=3072,
            decoder_ffn_dim=3072,
            max_position_embeddings=1024,
            activation_function="gelu",
            scale_embedding=False,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=2,
            tie_word_embeddings=True,
        ),
    ),
    # --- mBART-50 ------------------------------------------------------------------
    "mbart-large-50": ("MBartForConditionalGeneration", dict(
        vocab_size=250054, d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
        decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, max_position_embeddings=1024,
        activation_function="gelu", scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, dropout=0.1)),
    # --- M2M-100 and NLLB --------------------------------------------------------
    **{name: ("M2M100ForConditionalGeneration", dict(
        vocab_size=vocab, d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
        decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, max_position_embeddings=1024,
        activation_function="relu", scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, dropout=0.1, attention_dropout=0.1))
       for name, vocab in (("m2m100-418m", 128112), ("nllb-200-distilled-600m", 256206))},
    # --- Whisper: openai/whisper-{tiny,base,small,medium,large-v3,large-v3-turbo}, distil-whisper/distil-large-v3 ---
    **{name: ("WhisperForConditionalGeneration", dict(
        vocab_size=vocab, d_model=width, encoder_layers=encoder, decoder_layers=decoder,
        encoder_attention_heads=width // 64, decoder_attention_heads=width // 64, encoder_ffn_dim=4 * width,
        decoder_ffn_dim=4 * width, num_mel_bins=mels, max_source_positions=1500, max_target_positions=448,
        pad_token_id=pad, bos_token_id=50257, eos_token_id=50257, decoder_start_token_id=50258))
       for name, (vocab, width, encoder, decoder, mels, pad) in {
           "whisper-tiny": (51865, 384, 4, 4, 80, 50257), "whisper-base": (51865, 512, 6, 6, 80, 50257),
           "whisper-small": (51865, 768, 12, 12, 80, 50257), "whisper-medium": (51865, 1024, 24, 24, 80, 50257),
           "whisper-large-v3": (51866, 1280, 32, 32, 128, 50256),
           "whisper-large-v3-turbo": (51866, 1280, 32, 4, 128, 50257),
           "distil-large-v3": (51866, 1280, 32, 2, 128, 50256)}.items()},
    # --- Marian (OPUS-MT) and Pegasus ----------------------------------------------
    "opus-mt-en-de": ("MarianMTModel", dict(
        vocab_size=58101, decoder_vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
        max_position_embeddings=512, activation_function="swish", scale_embedding=True, pad_token_id=58100,
        bos_token_id=0, eos_token_id=0, decoder_start_token_id=58100, share_encoder_decoder_embeddings=True,
        dropout=0.1)),
    "pegasus-large": ("PegasusForConditionalGeneration", dict(
        vocab_size=96103, d_model=1024, encoder_layers=16, decoder_layers=16, encoder_attention_heads=16,
        decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, max_position_embeddings=1024,
        activation_function="relu", scale_embedding=True, pad_token_id=0, bos_token_id=0, eos_token_id=1,
        decoder_start_token_id=0, dropout=0.1, attention_dropout=0.1)),
    # google/bigbird-pegasus-large-arxiv's config.json (reconstructed)
    "bigbird-pegasus-large-arxiv": ("BigBirdPegasusForConditionalGeneration", dict(
        vocab_size=96103, d_model=1024, encoder_layers=16, decoder_layers=16, encoder_attention_heads=16,
        decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, max_position_embeddings=4096,
        activation_function="gelu_new", scale_embedding=True, use_bias=False, attention_type="block_sparse",
        block_size=64, num_random_blocks=3, pad_token_id=0, bos_token_id=2, eos_token_id=1, decoder_start_token_id=0,
        dropout=0.1, attention_dropout=0.1)),
    # --- decoder-only LLMs -----------------------------------------------------
    "llama-3-8b": (
        "LlamaForCausalLM",
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            hidden_act="silu",
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_parameters=_rope(500000.0),
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=False,
        ),
    ),
    "llama-3-70b": (
        "LlamaForCausalLM",
        dict(
            vocab_size=128256,
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=128,
            hidden_act="silu",
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_parameters=_rope(500000.0),
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=False,
        ),
    ),
    "mistral-7b": (
        "MistralForCausalLM",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            hidden_act="silu",
            max_position_embeddings=32768,
            rms_norm_eps=1e-5,
            rope_parameters=_rope(10000.0),
            sliding_window=4096,
            tie_word_embeddings=False,
        ),
    ),
    # Mistral Small 3.1's text model: its published file's text_config (Mistral3Config's default one)
    "mistral-small-3.1-24b": (
        "MistralForCausalLM",
        dict(vocab_size=131072, hidden_size=5120, intermediate_size=32768, num_hidden_layers=40,
             num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
             max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters=_rope(1e9), sliding_window=None,
             tie_word_embeddings=False),
    ),
    "mixtral-8x7b": (
        "MixtralForCausalLM",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            hidden_act="silu",
            max_position_embeddings=32768,
            rms_norm_eps=1e-5,
            rope_parameters=_rope(1000000.0),
            sliding_window=None,
            num_local_experts=8,
            num_experts_per_tok=2,
            router_aux_loss_coef=0.02,
            tie_word_embeddings=False,
        ),
    ),
    "openai-gpt": ("OpenAIGPTLMHeadModel", dict(vocab_size=40478, n_embd=768, n_layer=12, n_head=12, n_positions=512,
                                                afn="gelu")),
    "pythia-160m": ("GPTNeoXForCausalLM", dict(vocab_size=50304, hidden_size=768, num_hidden_layers=12,
                                               num_attention_heads=12, intermediate_size=3072, rotary_pct=0.25,
                                               rotary_emb_base=10000, max_position_embeddings=2048)),
    "pythia-1b": ("GPTNeoXForCausalLM", dict(vocab_size=50304, hidden_size=2048, num_hidden_layers=16,
                                             num_attention_heads=8, intermediate_size=8192, rotary_pct=0.25,
                                             rotary_emb_base=10000, max_position_embeddings=2048)),
    "gpt-neox-20b": ("GPTNeoXForCausalLM", dict(vocab_size=50432, hidden_size=6144, num_hidden_layers=44,
                                                num_attention_heads=64, intermediate_size=24576, rotary_pct=0.25,
                                                rotary_emb_base=10000, max_position_embeddings=2048)),
    "gpt-j-6b": ("GPTJForCausalLM", dict(vocab_size=50400, n_embd=4096, n_layer=28, n_head=16, rotary_dim=64,
                                         n_positions=2048, activation_function="gelu_new")),
    "gpt-neo-125m": ("GPTNeoForCausalLM", dict(vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12,
                                               max_position_embeddings=2048, window_size=256,
                                               attention_types=[[["global", "local"], 6]])),
    "gpt-neo-1.3b": ("GPTNeoForCausalLM", dict(vocab_size=50257, hidden_size=2048, num_layers=24, num_heads=16,
                                               max_position_embeddings=2048, window_size=256,
                                               attention_types=[[["global", "local"], 12]])),
    "qwen2-7b": (
        "Qwen2ForCausalLM",
        dict(
            vocab_size=152064,
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            hidden_act="silu",
            max_position_embeddings=131072,
            rms_norm_eps=1e-6,
            rope_parameters=_rope(1000000.0),
            use_sliding_window=False,
            sliding_window=131072,
            max_window_layers=28,
            tie_word_embeddings=False,
        ),
    ),
    "glm-4-9b": ("GlmForCausalLM", dict(vocab_size=151552, hidden_size=4096, intermediate_size=13696,
                                        num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=2,
                                        head_dim=128, max_position_embeddings=131072, rms_norm_eps=1.5625e-07,
                                        rope_parameters=dict(_rope(10000.0), partial_rotary_factor=0.5),
                                        attention_bias=True, tie_word_embeddings=False)),
    "phi-3-mini-4k": (
        "Phi3ForCausalLM",
        dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=32, hidden_act="silu", max_position_embeddings=4096,
             original_max_position_embeddings=4096, rms_norm_eps=1e-5, rope_parameters=_rope(10000.0),
             sliding_window=2047, tie_word_embeddings=False),
    ),
    "phi-3.5-mini": (
        "Phi3ForCausalLM",
        dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=32, hidden_act="silu", max_position_embeddings=131072,
             original_max_position_embeddings=4096, rms_norm_eps=1e-5, sliding_window=262144,
             tie_word_embeddings=False, rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                         "short_factor": list(PHI35_SHORT),
                                                         "long_factor": list(PHI35_LONG)}),
    ),
    "phi-4-mini": (
        "Phi3ForCausalLM",
        dict(vocab_size=200064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=24,
             num_key_value_heads=8, hidden_act="silu", max_position_embeddings=131072,
             original_max_position_embeddings=4096, rms_norm_eps=1e-5, sliding_window=262144,
             tie_word_embeddings=True, pad_token_id=199999, bos_token_id=199999, eos_token_id=199999,
             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                              "short_factor": [1.0] * 48, "long_factor": list(PHI4_MINI_LONG)}),
    ),
    # gpt-oss: sinks, biased experts and router, the clamped SwiGLU, alternating 128-token windows, yarn
    # Llama 4 Scout's text_config (attn_temperature_tuning is published as 4, which the strict config class
    # refuses: True reads the same)
    "llama-4-scout-17b-16e": (
        "Llama4ForCausalLM",
        dict(vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
             num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128, hidden_act="silu",
             max_position_embeddings=262144, rms_norm_eps=1e-5, num_local_experts=16, num_experts_per_tok=1,
             interleave_moe_layer_step=1, use_qk_norm=True, attention_chunk_size=8192, no_rope_layers=[1, 1, 1, 0] * 12,
             attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1, router_aux_loss_coef=0.001,
             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
             tie_word_embeddings=False, bos_token_id=200000, eos_token_id=[200001, 200007, 200008],
             pad_token_id=200018),
    ),
    # Llama 4 Maverick's text_config: 128 experts in every second layer, no q/k norm, no rope scaling
    "llama-4-maverick-17b-128e": (
        "Llama4ForCausalLM",
        dict(vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
             num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128, hidden_act="silu",
             max_position_embeddings=1048576, rms_norm_eps=1e-5, num_local_experts=128, num_experts_per_tok=1,
             interleave_moe_layer_step=2, use_qk_norm=False, attention_chunk_size=8192, router_aux_loss_coef=0.001,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, tie_word_embeddings=False,
             bos_token_id=200000, eos_token_id=[200001, 200007, 200008], pad_token_id=200018),
    ),
    "gpt-oss-20b": ("GptOssForCausalLM", _gpt_oss(24, 32)),
    "gpt-oss-120b": ("GptOssForCausalLM", _gpt_oss(36, 128)),
    # Qwen3: an explicit head_dim of 128 and RMSNorm over each query and key head
    "qwen3-0.6b": (
        "Qwen3ForCausalLM",
        dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
             num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
             max_position_embeddings=40960, rms_norm_eps=1e-6, rope_parameters=_rope(1000000.0),
             attention_bias=False, use_sliding_window=False, max_window_layers=28, tie_word_embeddings=True),
    ),
    "qwen3-8b": (
        "Qwen3ForCausalLM",
        dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
             num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
             max_position_embeddings=40960, rms_norm_eps=1e-6, rope_parameters=_rope(1000000.0),
             attention_bias=False, use_sliding_window=False, max_window_layers=36, tie_word_embeddings=False),
    ),
    "granite-3.0-2b": ("GraniteForCausalLM", _granite(2048, 8192, 0.015625, 8.0)),
    "granite-3.0-8b": ("GraniteForCausalLM", _granite(4096, 12800, 0.0078125, 16.0)),
    "granite-3.0-1b-a400m": ("GraniteMoeForCausalLM", _granite_moe(1024, 24, 16, 32)),
    "granite-3.0-3b-a800m": ("GraniteMoeForCausalLM", _granite_moe(1536, 32, 24, 40)),
    # baidu/ERNIE-4.5-0.3B-PT's config.json
    "ernie-4.5-0.3b": (
        "Ernie4_5ForCausalLM",
        dict(vocab_size=103424, hidden_size=1024, intermediate_size=3072, num_hidden_layers=18, num_attention_heads=16,
             num_key_value_heads=2, head_dim=128, hidden_act="silu", max_position_embeddings=131072,
             rms_norm_eps=1e-5, rope_parameters=_rope(500000.0), use_bias=False, tie_word_embeddings=True,
             pad_token_id=0, bos_token_id=1, eos_token_id=2),
    ),
    "glm-4.5": ("Glm4MoeForCausalLM", _glm45(5120, 92, 12288, 1536, 160, 3, 2.5, True)),
    # microsoft/Phi-3.5-MoE-instruct's config.json, but its longrope (see the preset)
    "phi-3.5-moe": ("PhimoeForCausalLM",
                    dict(vocab_size=32064, hidden_size=4096, intermediate_size=6400, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
                         max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters=_rope(10000.0),
                         sliding_window=131072, attention_bias=True, lm_head_bias=True, num_local_experts=16,
                         num_experts_per_tok=2, router_jitter_noise=0.01, input_jitter_noise=0.01,
                         router_aux_loss_coef=0.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=32000)),
    # moonshotai/Kimi-K2.5's text_config (its DeepseekV3 text model; the vision tower is not counted)
    "kimi-k2.5": ("DeepseekV3ForCausalLM",
                  dict(vocab_size=163840, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                       num_hidden_layers=61, num_attention_heads=64, num_key_value_heads=64, n_shared_experts=1,
                       n_routed_experts=384, num_experts_per_tok=8, routed_scaling_factor=2.827, kv_lora_rank=512,
                       q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=1,
                       topk_group=1, first_k_dense_replace=1, max_position_embeddings=262144, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 64.0,
                                        "original_max_position_embeddings": 4096, "beta_fast": 1.0, "beta_slow": 1.0,
                                        "mscale": 1.0, "mscale_all_dim": 1.0},
                       tie_word_embeddings=False, bos_token_id=163584, eos_token_id=163585)),
    "glm-4.5-air": ("Glm4MoeForCausalLM", _glm45(4096, 46, 10944, 1408, 128, 1, 1.0, False)),
    # moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json (its layer lists in linear_attn_config, 1-based)
    "kimi-linear-48b-a3b": ("KimiLinearForCausalLM",
                            dict(vocab_size=163840, hidden_size=2304, intermediate_size=9216,
                                 moe_intermediate_size=1024, num_hidden_layers=27, num_attention_heads=32,
                                 num_key_value_heads=32, kv_lora_rank=512,
                                 q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                                 num_experts=256, num_experts_per_token=8, num_shared_experts=1, num_expert_group=1,
                                 topk_group=1, moe_renormalize=True, routed_scaling_factor=2.446,
                                 first_k_dense_replace=1, model_max_length=1048576, rms_norm_eps=1e-5,
                                 hidden_act="silu", tie_word_embeddings=False, bos_token_id=163584,
                                 eos_token_id=163586, pad_token_id=163839,
                                 linear_attn_config={"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                                                     "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
                                                     "kda_layers": [i for i in range(1, 28)
                                                                    if i not in (4, 8, 12, 16, 20, 24, 27)]})),
    # Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (its multi-token-prediction module is not part of the model)
    "qwen3-next-80b-a3b": ("Qwen3NextForCausalLM",
                           dict(vocab_size=151936, hidden_size=2048, intermediate_size=5120, num_hidden_layers=48,
                                num_attention_heads=16, num_key_value_heads=2, head_dim=256, hidden_act="silu",
                                max_position_embeddings=262144, rms_norm_eps=1e-6, partial_rotary_factor=0.25,
                                rope_parameters=_rope(10000000.0), attention_bias=False, linear_conv_kernel_dim=4,
                                linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                                linear_num_value_heads=32, full_attention_interval=4, decoder_sparse_step=1,
                                moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts=512,
                                num_experts_per_tok=10, norm_topk_prob=True, router_aux_loss_coef=0.001,
                                mlp_only_layers=[], tie_word_embeddings=False, eos_token_id=151645)),
    # Qwen3.5's text models as transformers' config classes default them (the classes' docstrings name them
    # Qwen3.5-9B and Qwen3.5-35B-A3B style configurations)
    "qwen3.5-9b": ("Qwen3_5ForCausalLM", {}),
    "qwen3.5-35b-a3b": ("Qwen3_5MoeForCausalLM", {}),
    # allenai/OLMoE-1B-7B-0924's config.json
    "olmoe-1b-7b": (
        "OlmoeForCausalLM",
        dict(vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16,
             num_key_value_heads=16, hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5,
             rope_parameters=_rope(10000.0), attention_bias=False, clip_qkv=None, num_experts=64,
             num_experts_per_tok=8, norm_topk_prob=False, router_aux_loss_coef=0.01, tie_word_embeddings=False,
             pad_token_id=1, bos_token_id=None, eos_token_id=50279),
    ),
    # HuggingFaceTB/SmolLM3-3B's config.json: no rotary positions on every fourth layer
    "smollm3-3b": (
        "SmolLM3ForCausalLM",
        dict(vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
             num_attention_heads=16, num_key_value_heads=4, hidden_act="silu", max_position_embeddings=65536,
             rms_norm_eps=1e-6, rope_parameters=_rope(5000000.0), no_rope_layers=[int((i + 1) % 4 != 0) for i in
                                                                                  range(36)],
             use_sliding_window=False, sliding_window=None, tie_word_embeddings=True, bos_token_id=None,
             eos_token_id=128012, pad_token_id=128004),
    ),
    "stablelm-3b-4e1t": ("StableLmForCausalLM", _stablelm(50304, 2560, 6912, 32, 32, bos_token_id=0, eos_token_id=0)),
    "stablelm-2-1.6b": ("StableLmForCausalLM", _stablelm(100352, 2048, 5632, 24, 32, use_qkv_bias=True,
                                                          bos_token_id=100257, eos_token_id=100257)),
    "stablelm-2-12b": ("StableLmForCausalLM", _stablelm(100352, 5120, 13824, 40, 8, qk_layernorm=True,
                                                         use_parallel_residual=True, bos_token_id=100257,
                                                         eos_token_id=100257)),
    "falcon-7b": ("FalconForCausalLM", _falcon(4544, 32, 71, multi_query=True, new_decoder_architecture=False)),
    "falcon-40b": ("FalconForCausalLM", _falcon(8192, 60, 128, new_decoder_architecture=True, num_kv_heads=8)),
    "falcon-180b": ("FalconForCausalLM", _falcon(14848, 80, 232, new_decoder_architecture=True, num_kv_heads=8)),
    "opt-125m": ("OPTForCausalLM", _opt(768, 12, 12)),
    "opt-1.3b": ("OPTForCausalLM", _opt(2048, 24, 32)),
    "opt-6.7b": ("OPTForCausalLM", _opt(4096, 32, 32)),
    "c4ai-command-r-v01": ("CohereForCausalLM", _cohere(8192, 40, 64, 64, 22528, 8000000.0, 0.0625)),
    "c4ai-command-r-plus": ("CohereForCausalLM", _cohere(12288, 64, 96, 8, 33792, 75000000.0, 0.8333333333333334,
                                                          use_qk_norm=True)),
    "c4ai-command-r7b-12-2024": ("Cohere2ForCausalLM", _cohere(4096, 32, 32, 8, 14336, 50000.0, 0.25,
                                                                max_position_embeddings=132096, sliding_window=4096,
                                                                sliding_window_pattern=4)),
    "olmo-2-1b": ("Olmo2ForCausalLM", _olmo2(2048, 16, 16, 8192)),
    "olmo-2-7b": ("Olmo2ForCausalLM", _olmo2(4096, 32, 32, 11008)),
    "starcoder2-3b": ("Starcoder2ForCausalLM", _starcoder2(3072, 12288, 30, 24, 2, 999999.4420358813, 0.018042)),
    "starcoder2-7b": ("Starcoder2ForCausalLM", _starcoder2(4608, 18432, 32, 36, 4, 1000000.0, 0.018042)),
    "starcoder2-15b": ("Starcoder2ForCausalLM", _starcoder2(6144, 24576, 40, 48, 4, 100000.0, 0.01275,
                                                            tie_word_embeddings=False)),
    "qwen3-30b-a3b": (
        "Qwen3MoeForCausalLM",
        dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
             num_key_value_heads=4, head_dim=128, hidden_act="silu", max_position_embeddings=40960, rms_norm_eps=1e-6,
             rope_parameters=_rope(1000000.0), num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001,
             tie_word_embeddings=False),
    ),
    "qwen1.5-moe-a2.7b": (
        "Qwen2MoeForCausalLM",
        dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
             num_key_value_heads=16, hidden_act="silu", max_position_embeddings=8192, rms_norm_eps=1e-6,
             rope_parameters=_rope(1000000.0), num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
             shared_expert_intermediate_size=5632, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
             use_sliding_window=False, max_window_layers=21, router_aux_loss_coef=0.001, tie_word_embeddings=False),
    ),
    "deepseek-v2-lite": (
        "DeepseekV2ForCausalLM",
        dict(
            vocab_size=102400,
            hidden_size=2048,
            intermediate_size=10944,
            moe_intermediate_size=1408,
            num_hidden_layers=27,
            num_attention_heads=16,
            num_key_value_heads=16,
            n_shared_experts=2,
            n_routed_experts=64,
            num_experts_per_tok=6,
            kv_lora_rank=512,
            q_lora_rank=None,
            qk_rope_head_dim=64,
            v_head_dim=128,
            qk_nope_head_dim=128,
            topk_method="greedy",
            first_k_dense_replace=1,
            max_position_embeddings=163840,
            rope_parameters=_deepseek_yarn(0.707),
            tie_word_embeddings=False,
        ),
    ),
    "deepseek-v3": (
        "DeepseekV3ForCausalLM",
        dict(
            vocab_size=129280,
            hidden_size=7168,
            intermediate_size=18432,
            moe_intermediate_size=2048,
            num_hidden_layers=61,
            num_attention_heads=128,
            num_key_value_heads=128,
            n_shared_experts=1,
            n_routed_experts=256,
            num_experts_per_tok=8,
            routed_scaling_factor=2.5,
            kv_lora_rank=512,
            q_lora_rank=1536,
            qk_rope_head_dim=64,
            v_head_dim=128,
            qk_nope_head_dim=128,
            n_group=8,
            topk_group=4,
            first_k_dense_replace=3,
            max_position_embeddings=163840,
            rope_parameters=_deepseek_yarn(1.0),
            tie_word_embeddings=False,
        ),
    ),
    # DeepSeek-V4-Flash and V4-Pro: the published config.json's sizes (public copies of deepseek-ai/DeepSeek-V4-Flash
    # and -Pro, not checked against the hub files); Flash's compress_ratios as its first five layers publish them,
    # continued in turn; Pro's schedule the config class's default
    "deepseek-v4-flash": ("DeepseekV4ForCausalLM", _deepseek_v4(
        4096, 43, 64, 2048, 256, 1024, 8, 1.5, [0, 0] + [4 if i % 2 == 0 else 128 for i in range(41)])),
    "deepseek-v4-pro": ("DeepseekV4ForCausalLM", _deepseek_v4(7168, 61, 128, 3072, 384, 1536, 16, 2.5, None)),
    # DeepSeek-V3.2: V3 plus the lightning indexer (64 heads of 128, 2048 keys per query) in every layer
    "deepseek-v3.2": (
        "DeepseekV32ForCausalLM",
        dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
             num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
             n_routed_experts=256, num_experts_per_tok=8, routed_scaling_factor=2.5, kv_lora_rank=512,
             q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4,
             first_k_dense_replace=3, max_position_embeddings=163840, rope_parameters=_deepseek_yarn(1.0),
             index_n_heads=64, index_head_dim=128, index_topk=2048, tie_word_embeddings=False),
    ),
    # GLM-5: GlmMoeDsaConfig's defaults (its docstring names zai-org/GLM-5), the rotary base and token ids of public
    # copies of zai-org/GLM-5's config.json (not checked against the hub file)
    "glm-5": (
        "GlmMoeDsaForCausalLM",
        dict(vocab_size=154880, hidden_size=6144, intermediate_size=12288, moe_intermediate_size=2048,
             num_hidden_layers=78, num_attention_heads=64, num_key_value_heads=64, n_shared_experts=1,
             n_routed_experts=256, num_experts_per_tok=8, routed_scaling_factor=2.5, kv_lora_rank=512,
             q_lora_rank=2048, qk_rope_head_dim=64, v_head_dim=256, qk_nope_head_dim=192, n_group=1, topk_group=1,
             first_k_dense_replace=3, max_position_embeddings=202752, rms_norm_eps=1e-5,
             rope_parameters=_rope(1000000.0), index_n_heads=32, index_head_dim=128, index_topk=2048,
             tie_word_embeddings=False, pad_token_id=154820, eos_token_id=[154820, 154827, 154829]),
    ),
    # Mistral Large 4: MistralLarge4Config's defaults (its docstring names mistralai/Mistral-Large-4-1T-A52B): the
    # text model and its head (the only class with one is the wrapper; its vision tower is not counted)
    "mistral-large-4": ("MistralLarge4ForConditionalGeneration", dict(text_config=dict(pad_token_id=11))),
    # Mistral Small 4: Mistral4Config's defaults (its docstring names mistralai/Mistral-Small-4-119B-2603)
    "mistral-small-4-119b": (
        "Mistral4ForCausalLM",
        dict(vocab_size=131072, hidden_size=4096, intermediate_size=12288, moe_intermediate_size=2048,
             num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=32, n_shared_experts=1,
             n_routed_experts=128, num_experts_per_tok=4, kv_lora_rank=256, q_lora_rank=1024, qk_rope_head_dim=64,
             v_head_dim=128, qk_nope_head_dim=64, first_k_dense_replace=0, tie_word_embeddings=False),
    ),
    # --- ViT: google/vit-{base,large}-patch16-224's config.json (ImageNet-1k classifiers) ---
    "vit-base-patch16-224": ("ViTForImageClassification", _vit(768, 12, 12)),
    "vit-large-patch16-224": ("ViTForImageClassification", _vit(1024, 24, 16)),
    # --- CLIP and SigLIP: openai/clip-vit-base-patch32's and google/siglip-base-patch16-224's config.json ---
    "clip-vit-base-patch32": ("CLIPModel", dict(
        text_config=dict(vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                         num_attention_heads=8, max_position_embeddings=77, hidden_act="quick_gelu",
                         layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2),
        vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                           image_size=224, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5),
        projection_dim=512, logit_scale_init_value=2.6592)),
    "siglip-base-patch16-224": ("SiglipModel", dict(
        text_config=dict(vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                         num_attention_heads=12, max_position_embeddings=64, hidden_act="gelu_pytorch_tanh",
                         layer_norm_eps=1e-6, pad_token_id=1),
        vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                           image_size=224, patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6))),
    # --- SigLIP2: google/siglip2-base-patch16-naflex's (a siglip2 file) and -224's (a siglip file) config.json ---
    "siglip2-base-patch16-naflex": ("Siglip2Model", dict(
        text_config=dict(model_type="siglip2_text_model", vocab_size=256000),
        vision_config=dict(model_type="siglip2_vision_model", num_patches=256))),
    "siglip2-base-patch16-224": ("SiglipModel", dict(
        text_config=dict(model_type="siglip_text_model", vocab_size=256000),
        vision_config=dict(model_type="siglip_vision_model"))),
    # --- LLaVA: llava-hf/llava-1.5-7b-hf's config.json (CLIP ViT-L/14-336, Vicuna-7B v1.5) ---
    "llava-1.5-7b": ("LlavaForConditionalGeneration", dict(
        text_config=dict(model_type="llama", max_position_embeddings=4096, rms_norm_eps=1e-5, vocab_size=32064),
        vision_config=dict(model_type="clip_vision_model", hidden_size=1024, image_size=336, intermediate_size=4096,
                           num_attention_heads=16, num_hidden_layers=24, patch_size=14, projection_dim=768),
        image_token_index=32000, pad_token_id=32001, projector_hidden_act="gelu", vision_feature_layer=-2,
        vision_feature_select_strategy="default", tie_word_embeddings=False)),
    # --- Qwen2.5-VL: Qwen/Qwen2.5-VL-7B-Instruct's config.json (written from memory, not hub-verified) ---
    "qwen2.5-vl-7b": ("Qwen2_5_VLForConditionalGeneration", dict(
        text_config=dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                         num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=128000,
                         rms_norm_eps=1e-6, rope_parameters=dict(rope_type="default", rope_theta=1e6,
                                                                 mrope_section=[16, 24, 24])),
        vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                           window_size=112, fullatt_block_indexes=[7, 15, 23, 31]),
        image_token_id=151655, tie_word_embeddings=False)),
    # --- Gemma 3 reading images: google/gemma-3-4b-it's config.json (written from memory, not hub-verified) ---
    "gemma-3-4b-vision": ("Gemma3ForConditionalGeneration", dict(
        text_config=dict(model_type="gemma3_text", hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
                         rope_scaling={"factor": 8.0, "rope_type": "linear"}, sliding_window=1024),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=1152, image_size=896, intermediate_size=4304,
                           num_attention_heads=16, num_hidden_layers=27, patch_size=14, vision_use_head=False),
        boi_token_index=255999, eoi_token_index=256000, image_token_index=262144, mm_tokens_per_image=256)),
    # --- Llama 3.2 Vision: meta-llama/Llama-3.2-11B-Vision's config.json (MllamaConfig's defaults but these) ---
    "llama-3.2-11b-vision": ("MllamaForConditionalGeneration", dict(
        text_config=dict(rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                              high_freq_factor=4.0, original_max_position_embeddings=8192)),
        vision_config=dict(image_size=560))),
}


def hf_param_count(name: str) -> int:
    """Parameter count of the HF PyTorch model for preset ``name``.

    The model is instantiated under ``torch.device("meta")`` so no memory is
    allocated; tied weights are counted once (as ``model.parameters()`` does).
    """
    import torch
    import transformers

    model_cls_name, kwargs = HF_REFERENCE[name]
    model_cls = getattr(transformers, model_cls_name)
    config = model_cls.config_class(**kwargs)
    with torch.device("meta"):
        model = model_cls(config)

        # transformers 5.x quirk: T5Config pops `tie_word_embeddings` (using it
        # only to decide `scale_decoder_outputs`) and forces it back to True,
        # so a freshly built v1.1 model ties lm_head to `shared`. The real
        # v1.1 checkpoints carry a separate lm_head (from_pretrained unties it
        # because both tensors are present and differ), so untie it here.
        if (
            model_cls_name in ("T5ForConditionalGeneration", "MT5ForConditionalGeneration", "UMT5ForConditionalGeneration")
            and kwargs.get("tie_word_embeddings") is False
            and model.lm_head.weight is model.shared.weight
        ):
            model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.shared.weight))

    # XLNet's two-stream query embedding (mask_emb, d_model numbers) serves permutation pretraining only;
    # jaxformer runs the content stream and does not hold it. Marian's and Pegasus' sinusoid tables are frozen
    # parameters (requires_grad False, as M2M-100's are buffers): computed here, not held, so not counted. A
    # multimodal wrapper's vision tower and projector (Mistral Large 4's): jaxformer builds its text model; LLaVA's
    # and Gemma 3's it builds whole.
    text_only = model_cls_name not in ("LlavaForConditionalGeneration", "Gemma3ForConditionalGeneration",
                                       "MllamaForConditionalGeneration")
    return sum(p.numel() for n, p in model.named_parameters()
               if not n.endswith("mask_emb") and (p.requires_grad or not n.endswith("embed_positions.weight"))
               and not (text_only and n.startswith(("model.vision_tower.", "model.multi_modal_projector."))))
