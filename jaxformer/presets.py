"""Named configurations: the published architectures, and tiny ones for tests and demos.

Each published preset equals the architecture of its checkpoint (sizes from the paper or the
released config.json); its parameter count matches Hugging Face's exactly (tests/test_presets.py).
"""

from __future__ import annotations

from jaxformer.model_config import ModelConfig, Vision


def _transformer_2017(d_model: int, heads: int, d_ff: int, dropout: float) -> dict:
    # Vaswani et al. 2017: post-norm, ReLU, sinusoids, embeddings * sqrt(d_model), one 37000-token
    # vocabulary shared by source, target and the pre-softmax projection; no final norms.
    return dict(family="encoder_decoder", vocab_size=37000, d_model=d_model, num_heads=heads, d_ff=d_ff,
                encoder_layers=6, decoder_layers=6, norm="layernorm", norm_position="post", norm_eps=1e-6,
                final_norm=False, activation="relu", position="sinusoidal", max_positions=1024,
                scale_embeddings=True, tie_embeddings=True, dropout_rate=dropout)


def _bert(d_model: int, layers: int, heads: int, vocab: int = 30522, **kw) -> dict:
    # Post-norm, GELU, learned positions, token types, a LayerNorm on the embeddings, pooler.
    base = dict(family="encoder", vocab_size=vocab, d_model=d_model, num_heads=heads, d_ff=4 * d_model,
                encoder_layers=layers, decoder_layers=0, norm_position="post", norm_eps=1e-12,
                embedding_norm=True, final_norm=False, activation="gelu", position="learned",
                max_positions=512, type_vocab_size=2, attention="bidirectional", head="none", pooler=True,
                dropout_rate=0.1, attention_dropout_rate=0.1)
    return {**base, **kw}


def _roberta(d_model: int, layers: int, heads: int, vocab: int) -> dict:
    # BERT's block with one token type, positions counted from the pad id (1) on, rows 0 and 1 unused
    return _bert(d_model, layers, heads, vocab=vocab, type_vocab_size=1, position_offset=2, pad_aware_positions=True,
                 norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2)


def _longformer(d_model: int, layers: int, heads: int) -> dict:
    # RoBERTa's model whose layers see 256 tokens either side (attention_window 512) plus the global tokens a call
    # names, through their own projections; positions extended to 4096 (4098 rows: pad offset 2)
    return {**_roberta(d_model, layers, heads, 50265), "max_positions": 4096, "attention": "alternating",
            "window_size": 256, "layer_types": ("sliding",) * layers, "global_tokens": True, "sep_token_id": 2}


def _big_bird(d_model: int, layers: int, heads: int) -> dict:
    # BERT's model over 4096 positions (a 50358-token vocabulary, the tanh GELU) whose attention is block-sparse on
    # inputs past 704 tokens: blocks of 64, the first and last global, 3 random blocks (block 0 in evaluation)
    return _bert(d_model, layers, heads, vocab=50358, max_positions=4096, activation="gelu_tanh", pad_token_id=0,
                 bos_token_id=1, eos_token_id=2, sep_token_id=66, sparse_block_size=64, sparse_random_blocks=3)


def _albert(d_model: int, layers: int, heads: int) -> dict:
    # BERT's block with 128-wide embeddings projected to d_model and one layer's weights shared by all layers;
    # the v2 models train without dropout and use the tanh form of GELU
    return _bert(d_model, layers, heads, vocab=30000, embedding_size=128, shared_layers=True, activation="gelu_tanh",
                 dropout_rate=0.0, attention_dropout_rate=0.0, pad_token_id=0, bos_token_id=2, eos_token_id=3)


def _electra(d_model: int, layers: int, heads: int, d_ff: int, embedding_size: int, head: str) -> dict:
    # BERT's block without a pooler; embeddings of their own width (projected when it differs from d_model). The
    # discriminator (head 'discriminator') is the model fine-tuned downstream, the generator ('mlm') a smaller MLM
    # trained beside it; both read the same embeddings in pretraining. The classifier's dense layer uses gelu.
    return _bert(d_model, layers, heads, d_ff=d_ff, embedding_size=None if embedding_size == d_model else embedding_size,
                 head=head, pooler=False, pooler_activation="gelu", pad_token_id=0)


def _modernbert(d_model: int, layers: int, heads: int, d_ff: int) -> dict:
    # Pre-norm, no biases, rotary positions (base 160000 on the global layers, 10000 on the local ones), every
    # third layer global from layer 0 and the others within 64 tokens either side, GeGLU with the exact gelu, an
    # 8192-token context; the first layer's attention reads the embedding norm's output as it is
    kinds = tuple("sliding" if i % 3 else "full" for i in range(layers))
    return dict(family="encoder", vocab_size=50368, d_model=d_model, num_heads=heads, d_ff=d_ff, encoder_layers=layers,
                decoder_layers=0, norm_position="pre", norm_eps=1e-5, norm_bias=False, embedding_norm=True,
                final_norm=True, first_attn_norm=False, activation="geglu_erf", position="rope", rope_theta=160000.0,
                local_rope_theta=10000.0, max_positions=8192, type_vocab_size=0, attention="alternating",
                window_size=64, layer_types=kinds, qkv_bias=False, out_bias=False, mlp_bias=False, head="none",
                pooler=False, head_bias=False, dropout_rate=0.0, attention_dropout_rate=0.0, pad_token_id=50283,
                bos_token_id=50281, eos_token_id=50282)


def _deberta(d_model: int, layers: int, heads: int, v3: bool = False) -> dict:
    # BERT's post-norm block whose attention adds disentangled relative-position terms (no absolute positions,
    # no token types). v1: exact distances up to 512, position projections of their own, keys without bias;
    # v3: 256 log buckets, positions projected by each layer's own q and k, the table layer-normed, a 128K
    # vocabulary (and RTD pretraining)
    relative = (dict(vocab_size=128100, disentangled_terms=("p2c", "c2p"), position_buckets=256,
                     share_attention_key=True, relative_embedding_norm=True) if v3 else
                dict(vocab_size=50265, disentangled_terms=("c2p", "p2c"), key_bias=False))
    return dict(family="encoder", d_model=d_model, num_heads=heads, d_ff=4 * d_model, encoder_layers=layers,
                decoder_layers=0, norm_position="post", norm_eps=1e-7, embedding_norm=True, final_norm=False,
                activation="gelu", position="disentangled", max_positions=512, type_vocab_size=0,
                attention="bidirectional", head="none", pooler=False, pooler_activation="gelu", dropout_rate=0.1,
                attention_dropout_rate=0.1, pad_token_id=0, **relative)


def _neox(d_model: int, layers: int, heads: int, d_ff: int, vocab: int, **kw) -> dict:
    # GPT-NeoX / Pythia: pre-norm LayerNorm blocks with attention and MLP side by side, a quarter of each head
    # rotating, biases everywhere, exact GELU, an untied head
    base = dict(family="decoder", vocab_size=vocab, d_model=d_model, num_heads=heads, d_ff=d_ff, decoder_layers=layers,
                norm_eps=1e-5, activation="gelu", position="rope", rope_theta=10000.0,
                rotary_dim=d_model // heads // 4, max_positions=2048, attention="causal", parallel_residual=True, tie_embeddings=False,
                dropout_rate=0.0, attention_dropout_rate=0.0)
    return {**base, **kw}


_GPT_NEO = dict(attention="alternating", window_size=256, attention_scale=1.0, qkv_bias=False, dropout_rate=0.0,
                attention_dropout_rate=0.0, bos_token_id=50256, eos_token_id=50256)


def _gpt2(d_model: int, layers: int, heads: int, max_positions: int = 1024, **kw) -> dict:
    # Pre-norm with a final LayerNorm, tanh-GELU, learned positions, LM head tied to the embedding.
    base = dict(family="decoder", vocab_size=50257, d_model=d_model, num_heads=heads, d_ff=4 * d_model,
                decoder_layers=layers, norm_eps=1e-5, activation="gelu_tanh", position="learned",
                max_positions=max_positions, attention="causal", dropout_rate=0.1, attention_dropout_rate=0.1)
    return {**base, **kw}


def _t5(d_model: int, d_ff: int, layers: int, heads: int, head_dim: int = 64, v1_1: bool = False,
        vocab: int = 32128) -> dict:
    # Pre-norm RMSNorm without bias, no biases anywhere, relative position bias shared across layers,
    # unscaled attention logits. v1.0: ReLU and a tied LM head on d_model**-0.5-scaled outputs;
    # v1.1 (and mT5, over 250K tokens): gated GELU and a separate LM head.
    return dict(family="encoder_decoder", vocab_size=vocab, d_model=d_model, num_heads=heads, head_dim=head_dim,
                d_ff=d_ff, encoder_layers=layers, decoder_layers=layers, norm="rmsnorm", norm_eps=1e-6,
                norm_bias=False, activation="geglu" if v1_1 else "relu", position="relative",
                max_positions=512, relative_buckets=32, relative_max_distance=128, attention_scale=1.0,
                qkv_bias=False, out_bias=False, mlp_bias=False, tie_embeddings=not v1_1,
                scale_tied_logits=not v1_1, clamp_float16=True, dropout_rate=0.1)


def _llama(d_model: int, layers: int, heads: int, kv_heads: int, d_ff: int, vocab: int, theta: float,
           max_positions: int, **kw) -> dict:
    # Pre-norm RMSNorm, SwiGLU, rotary positions, grouped-query attention, no biases, untied head.
    base = dict(family="decoder", vocab_size=vocab, d_model=d_model, num_heads=heads, num_kv_heads=kv_heads,
                d_ff=d_ff, decoder_layers=layers, norm="rmsnorm", norm_eps=1e-5, norm_bias=False,
                activation="swiglu", position="rope", rope_theta=theta, max_positions=max_positions,
                attention="causal", qkv_bias=False, out_bias=False, mlp_bias=False, tie_embeddings=False)
    return {**base, **kw}


# Phi-3.5-mini's published longrope factors, one per rotated frequency pair
_PHI35_SHORT = (
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
_PHI35_LONG = (
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
# Phi-4-mini-instruct's published long factors (its short ones are all 1), one per rotated pair of 96
_PHI4_MINI_LONG = (
    1.0, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649, 2.446418898,
    2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533, 5.984965424,
    6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
    16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23, 32.6,
    32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77,
)


def _gpt_oss(layers: int, experts: int) -> dict:
    return _llama(2880, layers, 64, 8, 2880, 201088, 150000.0, 131072, head_dim=64, qkv_bias=True, out_bias=True,
                  attention="alternating", window_size=128,
                  layer_types=tuple("sliding" if i % 2 == 0 else "full" for i in range(layers)),
                  rope_scaling=dict(kind="yarn", factor=32.0, original_max_positions=4096, beta_fast=32.0,
                                    beta_slow=1.0, truncate=False),
                  attention_sinks=True, num_experts=experts, experts_per_token=4, expert_bias=True,
                  router_logit_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702, router_aux_loss_coef=0.9,
                  pad_token_id=199999, eos_token_id=200002)


def _olmo2(d_model: int, layers: int, heads: int, d_ff: int) -> dict:
    # OLMo-2: LLaMA's parts with each sublayer's output normed before the residual add (no input norms) and
    # q/k norms over the whole projection; full multi-head attention, 100K vocabulary, 4096 positions
    return _llama(d_model, layers, heads, heads, d_ff, 100352, 500000.0, 4096, norm_eps=1e-6, norm_position="output",
                  qk_norm=True, qk_norm_span="projection", pad_token_id=100277, eos_token_id=100257)


def _starcoder2(d_model: int, layers: int, heads: int, kv_heads: int, theta: float, tied: bool,
                init_std: float) -> dict:
    # StarCoder2: pre-norm LayerNorms, biases everywhere, a plain tanh-GELU MLP 4x wide, GQA with rotary positions,
    # a 4096-token window over 16384 positions
    return dict(family="decoder", vocab_size=49152, d_model=d_model, num_heads=heads, num_kv_heads=kv_heads,
                d_ff=4 * d_model, decoder_layers=layers, norm="layernorm", norm_eps=1e-5, activation="gelu_tanh",
                position="rope", rope_theta=theta, max_positions=16384, attention="sliding", window_size=4096,
                tie_embeddings=tied, init_std=init_std, bos_token_id=0, eos_token_id=0)


def _granite(d_model: int, d_ff: int, head_dim: int, logits_divisor: float) -> dict:
    # Granite 3.0: LLaMA's layers, 40 deep with GQA 32/8, under muP's multipliers (attention 1 / head_dim),
    # 49155-token vocabulary, tied head, 4096 positions
    return _llama(d_model, 40, 32, 8, d_ff, 49155, 10000.0, 4096, tie_embeddings=True, embedding_multiplier=12.0,
                  residual_multiplier=0.22, attention_scale=1 / head_dim, logits_divisor=logits_divisor,
                  bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _granite_moe(d_model: int, layers: int, heads: int, experts: int) -> dict:
    # Granite 3.0 MoE: Granite's multipliers (logits / 6) over 512-wide SwiGLU experts, the top 8 softmaxed
    return {**_granite(d_model, 512, 64, 6.0), "decoder_layers": layers, "num_heads": heads, "num_experts": experts,
            "experts_per_token": 8, "router_aux_loss_coef": 0.001}


def _opt(d_model: int, layers: int, heads: int) -> dict:
    # OPT (Zhang et al. 2022): GPT-2's pre-norm layout with a final LayerNorm, a ReLU MLP 4x wide, biases, 2048
    # learned positions two rows into their table and counted from the attention mask, a head tied to the
    # 50272-token embeddings
    return dict(family="decoder", vocab_size=50272, d_model=d_model, num_heads=heads, d_ff=4 * d_model,
                decoder_layers=layers, norm_eps=1e-5, activation="relu", position="learned", max_positions=2048,
                position_offset=2, positions_from_mask=True, attention="causal", dropout_rate=0.1, pad_token_id=1,
                bos_token_id=2, eos_token_id=2)


def _glm45(d_model: int, layers: int, d_ff: int, expert_d_ff: int, experts: int, dense: int, scaling: float,
           qk_norm: bool) -> dict:
    # GLM-4.5: GQA 96/8 over 128-wide heads rotating their first half, q/k/v biases, DeepSeek-V3's sigmoid-routed
    # top-8 experts with a shared one after the first dense layers
    return _llama(d_model, layers, 96, 8, d_ff, 151552, 1e6, 131072, head_dim=128, rotary_dim=64, qkv_bias=True,
                  qk_norm=qk_norm, num_experts=experts, experts_per_token=8, expert_d_ff=expert_d_ff,
                  shared_experts=1, dense_layers=dense, router_score="sigmoid", router_bias=True,
                  normalize_router_weights=True, routed_scaling=scaling, pad_token_id=151329,
                  eos_token_id=(151329, 151336, 151338))


def _qwen3_next(vocab: int, d_model: int, layers: int, kv_heads: int, d_ff: int, max_positions: int, theta: float,
                **kw) -> dict:
    # Qwen3-Next and Qwen3.5: three Gated DeltaNet layers (16 key heads serving 32 value heads, 128 wide, a
    # 4-wide convolution) to one gated attention layer (16 heads of 256, a quarter of each rotating, q/k norms),
    # norms scaling by (1 + w)
    return _llama(d_model, layers, 16, kv_heads, d_ff, vocab, theta, max_positions, head_dim=256, rotary_dim=64,
                  norm_eps=1e-6, norm_scale_offset=1.0, qk_norm=True, attention_gate=True,
                  linear_layers=tuple(i for i in range(layers) if (i + 1) % 4), linear_key_heads=16,
                  linear_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel=4, **kw)


def _stablelm(vocab: int, d_model: int, d_ff: int, layers: int, kv_heads: int, **kw) -> dict:
    # StableLM: LayerNorms with biases, SwiGLU without biases, 32 heads rotating a quarter of each, 4096 positions
    return _llama(d_model, layers, 32, kv_heads, d_ff, vocab, 10000.0, 4096, norm="layernorm", norm_bias=True,
                  rotary_dim=d_model // 32 // 4, **kw)


def _falcon(d_model: int, layers: int, heads: int, kv_heads: int, shared_norm: bool) -> dict:
    # Falcon: LayerNorm blocks with attention and MLP side by side, rotary positions on whole heads, an exact-GELU
    # MLP 4x wide, no biases, a head tied to the 65024-token vocabulary, 2048 positions
    return dict(family="decoder", vocab_size=65024, d_model=d_model, num_heads=heads, num_kv_heads=kv_heads,
                d_ff=4 * d_model, decoder_layers=layers, norm="layernorm", norm_eps=1e-5, norm_bias=True,
                activation="gelu", position="rope", rope_theta=10000.0, max_positions=2048, attention="causal",
                parallel_residual=True, parallel_shared_norm=shared_norm, qkv_bias=False, out_bias=False,
                mlp_bias=False, tie_embeddings=True, dropout_rate=0.0, attention_dropout_rate=0.0, bos_token_id=11,
                eos_token_id=11)


def _cohere(d_model: int, layers: int, heads: int, kv_heads: int, d_ff: int, theta: float, logit_scale: float,
            max_positions: int = 8192, **kw) -> dict:
    # Command R: one LayerNorm without bias before attention and MLP side by side, adjacent rotary pairs over the
    # whole head, SwiGLU, a tied head whose logits are scaled, a 256K vocabulary
    return _llama(d_model, layers, heads, kv_heads, d_ff, 256000, theta, max_positions, norm="layernorm",
                  norm_bias=False, rope_interleave=True, parallel_residual=True, parallel_shared_norm=True,
                  tie_embeddings=True, logits_multiplier=logit_scale, pad_token_id=0, bos_token_id=5,
                  eos_token_id=255001, **kw)


def _deepseek(d_model: int, layers: int, heads: int, d_ff: int, expert_d_ff: int, experts: int, k: int, shared: int,
              dense: int, vocab: int, *, v3: bool, q_lora_rank: int | None, **kw) -> dict:
    # Multi-head latent attention (latent 512, rotary 64, no-position 128, values 128), DeepSeekMoE
    # (fine-grained routed experts + shared ones, the first layers dense). V2 routes by softmax without
    # renormalising; V3 by sigmoid with a selection bias, in groups, renormalised and scaled. The
    # released files extend the 4096 pre-trained positions 40-fold to 163840 with yarn (``mscale`` 0.707
    # for V2, 1.0 for V3; the softmax scale corrected by the same ``mscale_all_dim``).
    base = dict(family="decoder", vocab_size=vocab, d_model=d_model, num_heads=heads, head_dim=128, rope_head_dim=64,
                v_head_dim=128, kv_lora_rank=512, q_lora_rank=q_lora_rank, rope_interleave=True, d_ff=d_ff,
                decoder_layers=layers, norm="rmsnorm", norm_eps=1e-6, norm_bias=False, activation="swiglu",
                position="rope", rope_theta=10000.0, max_positions=163840, attention="causal", qkv_bias=False,
                rope_scaling=dict(kind="yarn", factor=40.0, original_max_positions=4096, beta_fast=32.0, beta_slow=1.0,
                                  mscale=1.0 if v3 else 0.707, mscale_all_dim=1.0 if v3 else 0.707),
                out_bias=False, mlp_bias=False, tie_embeddings=False, num_experts=experts, experts_per_token=k,
                expert_d_ff=expert_d_ff, shared_experts=shared, dense_layers=dense,
                router_score="sigmoid" if v3 else "softmax", router_bias=v3, normalize_router_weights=v3)
    return {**base, **kw}


def _deepseek_v4(d_model: int, layers: int, heads: int, expert_d_ff: int, experts: int, q_rank: int, out_groups: int,
                 routed_scaling: float, kinds: list[str]) -> dict:
    # DeepSeek-V4: one shared key-value head of 512 (its last 64 rotated in adjacent pairs) over a window of 128
    # with sinks, plus compressed entries (CSA: blocks of 4 narrowed to 512 per query by an indexer of 64 x 128
    # heads; HCA: blocks of 128); queries through a low rank, a grouped output projection (groups x 1024); a residual
    # of 4 copies mixed by hyper-connections (20 Sinkhorn rounds); 6 of the experts by sqrt(softplus) plus one shared,
    # SwiGLU clamped at 10, the first 3 layers' experts by token id; yarn (16 x 65536) on the compressed layers only
    yarn = dict(kind="yarn", factor=16.0, original_max_positions=65536, beta_fast=32.0, beta_slow=1.0,
                attention_factor=1.0)
    return dict(family="decoder", vocab_size=129280, d_model=d_model, num_heads=heads, num_kv_heads=1, head_dim=512,
                d_ff=expert_d_ff, decoder_layers=layers, norm="rmsnorm", norm_eps=1e-6, norm_bias=False,
                activation="swiglu", swiglu_limit=10.0, swiglu_offset=0.0, position="rope", rope_theta=10000.0,
                rotary_dim=64, rope_interleave=True, max_positions=1048576, attention="sliding", window_size=128,
                attention_sinks=True, qkv_bias=False, out_bias=False, mlp_bias=False, tie_embeddings=False,
                num_experts=experts, experts_per_token=6, expert_d_ff=expert_d_ff, shared_experts=1,
                router_score="sqrtsoftplus", router_bias=True, hash_layers=3, routed_scaling=routed_scaling,
                router_aux_loss_coef=0.001, hc_streams=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
                compressed_layers=kinds, compressed_q_rank=q_rank, compressed_sparse_rate=4,
                compressed_heavy_rate=128, compressed_rope_theta=160000.0, compressed_rope_scaling=yarn,
                compressed_index_heads=64, compressed_index_head_dim=128, compressed_index_topk=512,
                compressed_out_groups=out_groups, compressed_out_rank=1024, bos_token_id=0, eos_token_id=1)


def _transformer_xl(d_model: int, layers: int, heads: int, d_ff: int, memory_len: int, dropout: float,
                    attention_dropout: float, **kw) -> dict:
    # Dai et al. 2019, WikiText-103: post-norm, ReLU, relative attention with one u/v pair shared by all
    # layers, embeddings * sqrt(d_model), memory of the previous segments. The paper's adaptive input and
    # softmax (cutoffs 20000, 40000, 200000) are not modelled: here one tied [267735, d_model] table.
    base = dict(family="decoder", vocab_size=267735, d_model=d_model, num_heads=heads, d_ff=d_ff,
                decoder_layers=layers, norm="layernorm", norm_position="post", norm_eps=1e-5, final_norm=False,
                activation="relu", position="xl", attention="causal", memory_len=memory_len,
                shared_relative_biases=True, qkv_bias=False, out_bias=False, mlp_bias=True, scale_embeddings=True,
                tie_embeddings=True, dropout_rate=dropout, attention_dropout_rate=attention_dropout)
    return {**base, **kw}


def _xlnet(d_model: int, layers: int, heads: int, **kw) -> dict:
    # Yang et al. 2019, as transformers loads it: Transformer-XL's relative attention with per-layer u/v
    # biases and relative segment encodings, bidirectional (the content stream), GELU, a biased tied LM head.
    base = dict(family="decoder", vocab_size=32000, d_model=d_model, num_heads=heads, d_ff=4 * d_model,
                decoder_layers=layers, norm="layernorm", norm_position="post", norm_eps=1e-12, final_norm=False,
                activation="gelu", position="xl", attention="bidirectional", relative_segments=True,
                qkv_bias=False, out_bias=False, mlp_bias=True, tie_embeddings=True, lm_head_bias=True,
                dropout_rate=0.1, attention_dropout_rate=0.1, pad_token_id=5, bos_token_id=1, eos_token_id=2)
    return {**base, **kw}


def _gemma(d_model: int, layers: int, heads: int, kv_heads: int, d_ff: int, vocab: int, window: int, every: int,
           max_positions: int, *, gemma3: bool, **kw) -> dict:
    # Gemma 2 (Gemma Team 2024) and Gemma 3 text (2025): RMSNorm scaled by (1 + w) before and after each
    # sublayer, GeGLU (tanh GELU), head_dim 256 with query_pre_attn_scalar 256, embeddings * sqrt(d_model),
    # tied head, sliding-window layers with a full one every ``every`` layers (Gemma 2: 1 in 2, 3: 1 in 6).
    # Gemma 2 soft-caps scores (50) and logits (30); Gemma 3 normalises queries and keys instead, and its
    # sliding layers rotate with base 10^4 while the full ones use 10^6.
    base = dict(family="decoder", vocab_size=vocab, d_model=d_model, num_heads=heads, num_kv_heads=kv_heads,
                head_dim=256, d_ff=d_ff, decoder_layers=layers, norm="rmsnorm", norm_eps=1e-6, norm_bias=False,
                norm_scale_offset=1.0, sandwich_norm=True, activation="geglu", position="rope",
                rope_theta=1e6 if gemma3 else 10000.0, local_rope_theta=10000.0 if gemma3 else None,
                max_positions=max_positions, attention="alternating", window_size=window,
                layer_types=tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(layers)),
                attention_scale=256 ** -0.5, attention_softcap=None if gemma3 else 50.0,
                logits_softcap=None if gemma3 else 30.0, qk_norm=gemma3, qkv_bias=False, out_bias=False,
                mlp_bias=False, scale_embeddings=True, tie_embeddings=True, pad_token_id=0, eos_token_id=1,
                bos_token_id=2)
    return {**base, **kw}


def _gemma4(d_model: int, layers: int, heads: int, kv_heads: int, d_ff: int, window: int, every: int,
            max_positions: int, *, per_layer: int = 256, shared: int = 0, **kw) -> dict:
    # Gemma 4 text: Gemma 3's sandwiched layers with RMSNorm scaled by w (not 1 + w), unscaled scores (query, key and
    # value heads normed), a stored scalar per layer; sliding layers of 256-wide heads (base 10^4) and a full one
    # every ``every`` layers with 512-wide heads whose rotary turns a quarter (base 10^6); per-layer inputs
    # ``per_layer`` wide (E2B, E4B); the last ``shared`` layers reading earlier layers' keys and values
    base = _gemma(d_model, layers, heads, kv_heads, d_ff, 262144, window, every, max_positions, gemma3=True,
                  norm_scale_offset=0.0, attention_scale=1.0, v_norm=True, layer_output_scale=True,
                  rope_proportion=0.25, full_head_dim=512, logits_softcap=30.0, per_layer_input_size=per_layer,
                  kv_shared_layers=shared)
    return {**base, **kw}


def _t5gemma(gemma: dict, **kw) -> dict:
    # T5Gemma (Zhang et al. 2025): a Gemma 2 block on both sides, one token table each, the decoder starting
    # from <bos>; the encoder's sliding layers see the window on both sides.
    return {**gemma, "family": "encoder_decoder", "encoder_layers": gemma["decoder_layers"], "shared_embeddings": False,
            "decoder_start_token_id": gemma["bos_token_id"], **kw}


def _vit(d_model: int, layers: int, heads: int) -> dict:
    # ViT (Dosovitskiy et al. 2021) as google/vit-*-patch16-224 publish it: a pre-norm encoder over a class token and
    # the 196 16x16 patches of a 224x224 image, exact GELU, a final LayerNorm, the ImageNet-1k classifier on the
    # first token
    return dict(family="encoder", vocab_size=0, d_model=d_model, num_heads=heads, d_ff=4 * d_model,
                encoder_layers=layers, decoder_layers=0, norm_position="pre", norm_eps=1e-12,
                final_norm_in_hidden_states=False, activation="gelu", position="learned", max_positions=197,
                attention="bidirectional", head="sequence_classification", num_labels=1000, image_size=224,
                patch_size=16)


def _image_tower(d_model: int, layers: int, heads: int, patch: int, **kw) -> ModelConfig:
    # CLIP's and SigLIP's vision models: pre-norm encoders over the 224 / patch squared patches of a 224x224 image
    return ModelConfig.from_dict(dict(
        family="encoder", vocab_size=0, d_model=d_model, num_heads=heads, d_ff=4 * d_model, encoder_layers=layers,
        decoder_layers=0, norm_position="pre", final_norm_in_hidden_states=False, position="learned",
        attention="bidirectional", head="none", image_size=224, patch_size=patch, **kw))


def _clip_vit_base_patch32() -> dict:
    # CLIP (Radford et al. 2021) as openai/clip-vit-base-patch32 publishes it: a causal text encoder pooled at its
    # EOS (the file's eos_token_id 2: the legacy largest-id rule) and a ViT-B/32 with a class token, both projected
    # to 512 numbers, quick_gelu throughout
    tower = _image_tower(768, 12, 12, 32, max_positions=50, activation="quick_gelu", norm_eps=1e-5,
                         patch_bias=False, embedding_norm=True, final_norm=False, image_pooler="norm")
    return dict(family="dual_encoder", vocab_size=49408, d_model=512, num_heads=8, d_ff=2048, encoder_layers=12,
                decoder_layers=0, norm_position="pre", norm_eps=1e-5, final_norm_in_hidden_states=False,
                activation="quick_gelu", position="learned", max_positions=77, type_vocab_size=0, attention="causal",
                head="contrastive", pooled_token="eos", dropout_rate=0.0, pad_token_id=1, bos_token_id=0,
                eos_token_id=2, vision=Vision(tower, projection=512, logit_scale_init=2.6592))


def _siglip_base_patch16_224() -> dict:
    # SigLIP (Zhai et al. 2023) as google/siglip-base-patch16-224 publishes it: a bidirectional text encoder pooled
    # at its last token through its head, a ViT-B/16 without class token pooled by attention, tanh-form GELU, the
    # sigmoid loss's learned logit bias
    tower = _image_tower(768, 12, 12, 16, max_positions=196, activation="gelu_tanh", norm_eps=1e-6, class_token=False,
                         image_pooler="attention")
    return dict(family="dual_encoder", vocab_size=32000, d_model=768, num_heads=12, d_ff=3072, encoder_layers=12,
                decoder_layers=0, norm_position="pre", norm_eps=1e-6, final_norm_in_hidden_states=False,
                activation="gelu_tanh", position="learned", max_positions=64, type_vocab_size=0,
                attention="bidirectional", head="contrastive", pooled_token="last", pooled_projection=768,
                dropout_rate=0.0, pad_token_id=1, vision=Vision(tower, logit_scale_init=0.0, logit_bias=True))


def _siglip2_base_patch16(naflex: bool) -> dict:
    # SigLIP2 (Tschannen et al. 2025) as google/siglip2-base-patch16-naflex and -224 publish it: SigLIP's towers with
    # Gemma's 256000-token vocabulary (whose ids hold the text config's default bos and eos); NaFlex's image tower
    # reads up to 256 patches of any aspect ratio, its 16x16 grid of positions resized to each image's (a siglip2
    # file), the fixed-resolution one 224x224 images (a siglip file)
    siglip = _siglip_base_patch16_224()
    tokens = dict(vocab_size=256000, bos_token_id=49406, eos_token_id=49407)
    if not naflex:
        return {**siglip, **tokens}
    tower = siglip["vision"].tower.replace(image_size=256, max_positions=256, flexible_patches=True)
    return {**siglip, **tokens, "vision": Vision(tower, logit_scale_init=0.0, logit_bias=True)}


def _llava_15_7b() -> dict:
    # LLaVA-1.5 (Liu et al. 2023) as llava-hf/llava-1.5-7b-hf publishes it: CLIP ViT-L/14 at 336 pixels read at its
    # second-to-last layer without the class token (576 image tokens), a two-layer GELU projector, Vicuna-7B v1.5
    # (LLaMA 2's layout, its vocabulary grown to 32064 with the <image> token 32000 and the pad 32001)
    tower = ModelConfig.from_dict(dict(
        family="encoder", vocab_size=0, d_model=1024, num_heads=16, d_ff=4096, encoder_layers=24, decoder_layers=0,
        norm_position="pre", norm_eps=1e-5, final_norm_in_hidden_states=False, activation="quick_gelu",
        position="learned", max_positions=577, attention="bidirectional", head="none", image_size=336, patch_size=14,
        patch_bias=False, embedding_norm=True, final_norm=False, image_pooler="norm"))
    vision = Vision(tower, feature_layers=(-2,), drop_first_token=True, projector_activation="gelu",
                    image_token_id=32000)
    return _llama(4096, 32, 32, 32, 11008, 32064, 10000.0, 4096, vision=vision, pad_token_id=32001, bos_token_id=1,
                  eos_token_id=2)


def _gemma_3_4b_vision() -> dict:
    # Gemma 3 4B (Gemma Team 2025) as google/gemma-3-4b-it publishes it: the gemma-3-4b text model reading 896x896
    # images through SigLIP So400m/14 without its pooling head (27 layers 1152 wide; 64x64 patches), whose final-normed
    # states are average-pooled to 256 tokens an image, RMS-normed and projected; each image's tokens see each other
    tower = ModelConfig.from_dict(dict(
        family="encoder", vocab_size=0, d_model=1152, num_heads=16, d_ff=4304, encoder_layers=27, decoder_layers=0,
        norm_position="pre", norm_eps=1e-6, final_norm_in_hidden_states=False, activation="gelu_tanh",
        position="learned", max_positions=4096, attention="bidirectional", head="none", image_size=896, patch_size=14,
        class_token=False))
    vision = Vision(tower, pooled_tokens=256, bidirectional_images=True, image_token_id=262144)
    return _gemma(2560, 34, 8, 4, 10240, 262208, 1024, 6, 131072, gemma3=True,
                  rope_scaling={"kind": "linear", "factor": 8.0}, vision=vision)


def _llama_32_11b_vision() -> dict:
    # Llama 3.2 11B Vision (Meta 2024) as meta-llama/Llama-3.2-11B-Vision publishes it: a 32-layer ViT-H/14 over up to 4
    # tiles of 560x560 (1601 tokens a tile) with 8 gated global layers after it, its last state beside layers 3, 7,
    # 15, 23 and 30 projected to the 40-layer Llama 3.1 text model, whose 8 cross layers (3, 8, ..., 38) attend to it
    tower = ModelConfig.from_dict(dict(
        family="encoder", vocab_size=0, d_model=1280, num_heads=16, d_ff=5120, encoder_layers=32, decoder_layers=0,
        norm_position="pre", norm_eps=1e-5, position="learned", max_positions=1601, attention="bidirectional",
        head="none", activation="gelu", image_size=560, patch_size=14, class_token=True, patch_bias=False,
        embedding_norm=True, final_norm=True, final_norm_in_hidden_states=False, qkv_bias=False, out_bias=False,
        mlp_bias=True, max_tiles=4, aspect_ratios=((1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (3, 1), (4, 1)),
        global_layers=8, intermediate_layers=(3, 7, 15, 23, 30)))
    vision = Vision(tower, cross_attention=True, image_token_id=128256)
    return _llama(4096, 40, 32, 8, 14336, 128256, 500000.0, 131072, vision=vision, embedding_extra_rows=8,
                  cross_attention_layers=tuple(range(3, 40, 5)), pad_token_id=128004, bos_token_id=128000,
                  eos_token_id=128001, rope_scaling=dict(kind="llama3", factor=8.0, low_freq_factor=1.0,
                                                         high_freq_factor=4.0, original_max_positions=8192))


def _qwen25_vl_7b() -> dict:
    # Qwen2.5-VL 7B (Qwen Team 2025) as Qwen/Qwen2.5-VL-7B-Instruct publishes it: a 32-layer 1280-wide tower over
    # 14x14 patches of two frames (RMSNorm, SwiGLU, 2-D rotary), attending within 112-pixel windows but at layers 7,
    # 15, 23 and 31, its 2x2 blocks merged to the text width; Qwen2-7B's text model with M-RoPE (sections 16, 24, 24)
    tower = ModelConfig.from_dict(dict(
        family="encoder", vocab_size=0, d_model=1280, num_heads=16, d_ff=3420, encoder_layers=32, decoder_layers=0,
        norm="rmsnorm", norm_position="pre", norm_eps=1e-6, activation="swiglu", position="rope", rope_axial=True,
        head="none", final_norm=False, qkv_bias=True, key_bias=True, out_bias=True, mlp_bias=True, image_size=0,
        patch_size=14, class_token=False, patch_bias=False, temporal_patch_size=2, patch_merge_size=2,
        merged_width=3584, image_window=112, attention="alternating",
        layer_types=tuple("full" if i % 8 == 7 else "window" for i in range(32))))
    return _llama(3584, 28, 28, 4, 18944, 152064, 1e6, 128000, qkv_bias=True, norm_eps=1e-6, rope_sections=(16, 24, 24),
                  vision=Vision(tower, image_token_id=151655), bos_token_id=151643, eos_token_id=151645)


_PRESETS: dict[str, dict] = {
    "transformer-base": _transformer_2017(512, 8, 2048, 0.1),
    "transformer-big": _transformer_2017(1024, 16, 4096, 0.3),
    "bert-base-uncased": _bert(768, 12, 12),
    "bert-large-uncased": _bert(1024, 24, 16),
    # RoBERTa: BERT's architecture, byte-level BPE vocabulary, one token type, positions offset by 2.
    "roberta-base": _roberta(768, 12, 12, 50265),
    # MPNet (Song et al. 2020): RoBERTa's layout without token types, plus one relative bias over 32 buckets
    "mpnet-base": {**_roberta(768, 12, 12, 30527), "type_vocab_size": 0, "index_relative_bias": True},
    # DistilBERT: BERT-base halved in depth, no token types, no pooler (its classifier has its own ReLU layer)
    "distilbert-base-uncased": _bert(768, 6, 12, type_vocab_size=0, pooler=False, pooler_activation="relu",
                                     pad_token_id=0),
    # XLM-RoBERTa: RoBERTa's model with a 250K-token vocabulary over 100 languages
    "xlm-roberta-base": _roberta(768, 12, 12, 250002),
    "xlm-roberta-large": _roberta(1024, 24, 16, 250002),
    # Longformer (Beltagy et al. 2020): RoBERTa with windowed attention plus global tokens over 4096 tokens
    "longformer-base-4096": _longformer(768, 12, 12),
    "longformer-large-4096": _longformer(1024, 24, 16),
    # BigBird (Zaheer et al. 2020): BERT with block-sparse attention (global, window and random blocks) over 4096
    # tokens, warm-started from RoBERTa
    "bigbird-roberta-base": _big_bird(768, 12, 12),
    "bigbird-roberta-large": _big_bird(1024, 24, 16),
    # ALBERT v2: factorised embeddings (E = 128) and shared layers
    "albert-base-v2": _albert(768, 12, 12),
    "albert-large-v2": _albert(1024, 24, 16),
    "albert-xxlarge-v2": _albert(4096, 12, 64),
    # ELECTRA: each discriminator and the generator it was pretrained with (a quarter of its width at base/large)
    "electra-small-discriminator": _electra(256, 12, 4, 1024, 128, "discriminator"),
    "electra-small-generator": _electra(256, 12, 4, 1024, 128, "mlm"),
    "electra-base-discriminator": _electra(768, 12, 12, 3072, 768, "discriminator"),
    "electra-base-generator": _electra(256, 12, 4, 1024, 768, "mlm"),
    "electra-large-discriminator": _electra(1024, 24, 16, 4096, 1024, "discriminator"),
    "electra-large-generator": _electra(256, 24, 4, 1024, 1024, "mlm"),
    # ModernBERT (Warner et al. 2024): alternating global and local attention over 8192 tokens
    "modernbert-base": _modernbert(768, 22, 12, 1152),
    "modernbert-large": _modernbert(1024, 28, 16, 2624),
    # DeBERTa (He et al. 2021): disentangled attention; v3 (2023) pretrained with replaced-token detection
    "deberta-base": _deberta(768, 12, 12),
    "deberta-v3-small": _deberta(768, 6, 12, v3=True),
    "deberta-v3-base": _deberta(768, 12, 12, v3=True),
    "deberta-v3-large": _deberta(1024, 24, 16, v3=True),
    "gpt2": _gpt2(768, 12, 12),
    "gpt2-medium": _gpt2(1024, 24, 16),
    "gpt2-large": _gpt2(1280, 36, 20),
    "gpt2-xl": _gpt2(1600, 48, 25),
    # GPT-3 175B (Brown et al. 2020, table 2.1): GPT-2's architecture at 96 x 12288 with 2048 positions,
    # alternating dense and locally banded attention. The paper does not give the band width; 256 is
    # the local window of GPT-Neo, the open replication.
    # GPT-1 (Radford et al. 2018): post-norm blocks without a final norm, tanh-GELU, 512 learned positions
    "openai-gpt": _gpt2(768, 12, 12, max_positions=512, vocab_size=40478, norm_position="post", final_norm=False),
    # GPT-Neo (EleutherAI's replication of GPT-3's pattern): global and 256-token local layers in turn,
    # unscaled scores, no q/k/v biases
    "gpt-neo-125m": _gpt2(768, 12, 12, max_positions=2048, **_GPT_NEO),
    "gpt-neo-1.3b": _gpt2(2048, 24, 16, max_positions=2048, **_GPT_NEO),
    # EleutherAI's rotary GPTs
    "pythia-160m": _neox(768, 12, 12, 3072, 50304, bos_token_id=0, eos_token_id=0),
    "pythia-1b": _neox(2048, 16, 8, 8192, 50304, bos_token_id=0, eos_token_id=0),
    "gpt-neox-20b": _neox(6144, 44, 64, 24576, 50432, bos_token_id=0, eos_token_id=0),
    # GPT-J: half of each 256-wide head rotates in adjacent pairs, one norm for both branches, a biased head
    "gpt-j-6b": _neox(4096, 28, 16, 16384, 50400, activation="gelu_tanh", rotary_dim=64, rope_interleave=True,
                      parallel_shared_norm=True, qkv_bias=False, out_bias=False, lm_head_bias=True,
                      bos_token_id=50256, eos_token_id=50256),
    "gpt3-175b": _gpt2(12288, 96, 96, max_positions=2048, attention="alternating", window_size=256),
    "t5-small": _t5(512, 2048, 6, 8),
    "t5-base": _t5(768, 3072, 12, 12),
    "t5-large": _t5(1024, 4096, 24, 16),
    "t5-3b": _t5(1024, 16384, 24, 32, head_dim=128),
    "t5-11b": _t5(1024, 65536, 24, 128, head_dim=128),
    "t5-v1_1-base": _t5(768, 2048, 12, 12, v1_1=True),
    # mT5 (Xue et al. 2021): T5 v1.1 over 101 languages
    "mt5-small": _t5(512, 1024, 8, 6, v1_1=True, vocab=250112),
    "mt5-base": _t5(768, 2048, 12, 12, v1_1=True, vocab=250112),
    # UMT5 (Chung et al. 2023): mT5 over a 256K vocabulary, every self-attention layer with its own relative bias
    **{name: {**_t5(d_model, d_ff, layers, heads, v1_1=True, vocab=256384), "relative_bias_per_layer": True}
       for name, d_model, d_ff, layers, heads in (("umt5-small", 512, 1024, 8, 6), ("umt5-base", 768, 2048, 12, 12))},
    # BART: post-norm, GELU, learned positions offset by 2 in separate encoder and decoder tables, a
    # LayerNorm on each side's embeddings, one embedding shared by encoder, decoder and LM head.
    "bart-base": dict(family="encoder_decoder", vocab_size=50265, d_model=768, num_heads=12, d_ff=3072,
                      encoder_layers=6, decoder_layers=6, norm_position="post", norm_eps=1e-5, embedding_norm=True,
                      final_norm=False, activation="gelu", position="learned", max_positions=1024,
                      position_offset=2, tie_embeddings=True, dropout_rate=0.1),
    # mBART-50 (Tang et al. 2020): BART's tensors pre-norm with a final norm per stack, embeddings scaled by
    # sqrt(d_model), 50 languages' tokens in a 250K vocabulary; translation forces the target language's token
    "mbart-large-50": dict(family="encoder_decoder", vocab_size=250054, d_model=1024, num_heads=16, d_ff=4096,
                           encoder_layers=12, decoder_layers=12, norm_position="pre", norm_eps=1e-5,
                           embedding_norm=True, final_norm=True, activation="gelu", position="learned",
                           max_positions=1024, position_offset=2, scale_embeddings=True, tie_embeddings=True,
                           logits_bias=True, dropout_rate=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                           decoder_start_token_id=2),
    # M2M-100 (Fan et al. 2020) and NLLB-200 (NLLB team 2022): many-to-many translation; pre-norm with a final
    # norm per stack, ReLU, embeddings scaled by sqrt(d_model), fairseq's sinusoids counted from the pad id
    **{name: dict(family="encoder_decoder", vocab_size=vocab, d_model=1024, num_heads=16, d_ff=4096,
                  encoder_layers=12, decoder_layers=12, norm_position="pre", norm_eps=1e-5, embedding_norm=False,
                  final_norm=True, activation="relu", position="sinusoidal", sinusoids="fairseq",
                  pad_aware_positions=True, position_offset=2, max_positions=1024, scale_embeddings=True,
                  tie_embeddings=True, dropout_rate=0.1, attention_dropout_rate=0.1, pad_token_id=1, bos_token_id=0,
                  eos_token_id=2, decoder_start_token_id=2)
       for name, vocab in (("m2m100-418m", 128112), ("nllb-200-distilled-600m", 256206))},
    # Whisper (Radford et al. 2022): speech recognition and translation; the encoder reads 30 s of log-mel frames
    # (80 bins, 128 from large-v3) through two convolutions, both stacks pre-norm with final norms, keys without a
    # bias, proj_out tied; large-v3-turbo keeps 4 decoder layers, distil-large-v3 2 (a distilled decoder)
    **{name: dict(family="encoder_decoder", vocab_size=vocab, d_model=width, num_heads=width // 64, d_ff=4 * width,
                  encoder_layers=encoder, decoder_layers=decoder, norm_position="pre", norm_eps=1e-5,
                  embedding_norm=False, final_norm=True, activation="gelu", position="learned", max_positions=448,
                  key_bias=False, num_mel_bins=mels, max_source_positions=1500, tie_embeddings=True,
                  pad_token_id=pad, bos_token_id=50257, eos_token_id=50257, decoder_start_token_id=50258)
       for name, (vocab, width, encoder, decoder, mels, pad) in {
           "whisper-tiny": (51865, 384, 4, 4, 80, 50257), "whisper-base": (51865, 512, 6, 6, 80, 50257),
           "whisper-small": (51865, 768, 12, 12, 80, 50257), "whisper-medium": (51865, 1024, 24, 24, 80, 50257),
           "whisper-large-v3": (51866, 1280, 32, 32, 128, 50256),
           "whisper-large-v3-turbo": (51866, 1280, 32, 4, 128, 50257),
           "distil-large-v3": (51866, 1280, 32, 2, 128, 50256)}.items()},
    # OPUS-MT (Tiedemann & Thottingal 2020), Marian NMT models converted: post-norm, swish, embeddings scaled by
    # sqrt(d_model), Marian's [sin | cos] sinusoids from 0; generation starts from the pad id, which is never chosen
    "opus-mt-en-de": dict(family="encoder_decoder", vocab_size=58101, d_model=512, num_heads=8, d_ff=2048,
                          encoder_layers=6, decoder_layers=6, norm_position="post", norm_eps=1e-5, embedding_norm=False,
                          final_norm=False, activation="silu", position="sinusoidal", sinusoids="marian",
                          max_positions=512, position_offset=0, scale_embeddings=True, tie_embeddings=True,
                          logits_bias=True, dropout_rate=0.1, pad_token_id=58100, bos_token_id=0, eos_token_id=0,
                          decoder_start_token_id=58100),
    # PEGASUS (Zhang et al. 2020), gap-sentence pretraining for summarisation: pre-norm with a final norm per stack,
    # ReLU, Marian's sinusoids, embeddings scaled by sqrt(d_model)
    "pegasus-large": dict(family="encoder_decoder", vocab_size=96103, d_model=1024, num_heads=16, d_ff=4096,
                          encoder_layers=16, decoder_layers=16, norm_position="pre", norm_eps=1e-5,
                          embedding_norm=False, final_norm=True, activation="relu", position="sinusoidal",
                          sinusoids="marian", max_positions=1024, position_offset=0, scale_embeddings=True,
                          tie_embeddings=True, logits_bias=True, dropout_rate=0.1, attention_dropout_rate=0.1,
                          pad_token_id=0, bos_token_id=0, eos_token_id=1, decoder_start_token_id=0),
    # BigBird-Pegasus (Zaheer et al. 2020): Pegasus' layers with learned positions over 4096 tokens, no attention
    # biases, the encoder's attention block-sparse past 704 tokens (blocks of 64, 3 random blocks); arXiv summaries
    "bigbird-pegasus-large-arxiv": dict(family="encoder_decoder", vocab_size=96103, d_model=1024, num_heads=16,
                                        d_ff=4096, encoder_layers=16, decoder_layers=16, norm_position="pre",
                                        norm_eps=1e-5, embedding_norm=False, final_norm=True, activation="gelu_tanh",
                                        position="learned", max_positions=4096, position_offset=0,
                                        scale_embeddings=True, tie_embeddings=True, logits_bias=True, qkv_bias=False,
                                        out_bias=False, sparse_block_size=64, sparse_random_blocks=3,
                                        dropout_rate=0.1, attention_dropout_rate=0.1, pad_token_id=0, bos_token_id=2,
                                        eos_token_id=1, decoder_start_token_id=0),
    "llama-3-8b": _llama(4096, 32, 32, 8, 14336, 128256, 500000.0, 8192),
    "llama-3-70b": _llama(8192, 80, 64, 8, 28672, 128256, 500000.0, 8192),
    "mistral-7b": _llama(4096, 32, 32, 8, 14336, 32000, 10000.0, 32768, attention="sliding", window_size=4096),
    # Mistral Small 3.1 (mistralai/Mistral-Small-3.1-24B-Instruct-2503's text model, 2025; 3.2's is the same shape):
    # 40 layers of 5120 with 32 heads of 128 (8 kv heads), no window, rotary base 1e9; its published text_config
    "mistral-small-3.1-24b": _llama(5120, 40, 32, 8, 32768, 131072, 1e9, 131072, head_dim=128),
    "mixtral-8x7b": _llama(4096, 32, 32, 8, 14336, 32000, 1e6, 32768, num_experts=8, experts_per_token=2,
                           router_aux_loss_coef=0.02),
    "qwen2-7b": _llama(3584, 28, 28, 4, 18944, 152064, 1e6, 131072, qkv_bias=True, norm_eps=1e-6),
    # GLM-4-9B (its transformers-format release): half of each head rotating in adjacent pairs, q/k/v biases
    "glm-4-9b": _llama(4096, 40, 32, 2, 13696, 151552, 10000.0, 131072, head_dim=128, rotary_dim=64,
                       rope_interleave=True, qkv_bias=True, norm_eps=1.5625e-07, pad_token_id=151329),
    # Phi-3-mini-4k: LLaMA's block (fused tensors in its files) with a 2047-token window
    "phi-3-mini-4k": _llama(3072, 32, 32, 32, 8192, 32064, 10000.0, 4096, attention="sliding", window_size=2047,
                            pad_token_id=32000, bos_token_id=1, eos_token_id=32000),
    # Phi-3.5-mini: Phi-3-mini's block at 128K positions by longrope (4096 pretrained, its 48 published short
    # and long factors; the window of 262144 never bites)
    "phi-3.5-mini": _llama(3072, 32, 32, 32, 8192, 32064, 10000.0, 131072, attention="sliding", window_size=262144,
                           rope_scaling=dict(kind="longrope", factor=32.0, original_max_positions=4096,
                                             short_factor=_PHI35_SHORT, long_factor=_PHI35_LONG),
                           pad_token_id=32000, bos_token_id=1, eos_token_id=32000),
    # Phi-3.5-MoE: 16 experts of Phi-3-mini's width under LayerNorms, biases on q, k, v, o and the head, the sparse
    # mixer's top 2 (jitter eps 0.01), a window as long as the context. (Its published longrope factors, 64 short
    # and 64 long, are not written here: rotary positions without scaling.)
    "phi-3.5-moe": _llama(4096, 32, 32, 8, 6400, 32064, 10000.0, 131072, norm="layernorm", norm_bias=True,
                          qkv_bias=True, out_bias=True, lm_head_bias=True, attention="sliding", window_size=131072,
                          num_experts=16, experts_per_token=2, router_score="sparsemixer",
                          normalize_router_weights=False, router_jitter_eps=0.01, bos_token_id=1, eos_token_id=32000),
    # Phi-4-mini: Phi-3.5-mini's recipe with GQA (24 heads, 8 kv), a 200K vocabulary tied to the head, and
    # three quarters of each head rotating (96 of 128, longrope sized for them)
    "phi-4-mini": _llama(3072, 32, 24, 8, 8192, 200064, 10000.0, 131072, attention="sliding", window_size=262144,
                         rotary_dim=96, tie_embeddings=True,
                         rope_scaling=dict(kind="longrope", factor=32.0, original_max_positions=4096,
                                           short_factor=(1.0,) * 48, long_factor=_PHI4_MINI_LONG),
                         pad_token_id=199999, bos_token_id=199999, eos_token_id=199999),
    # gpt-oss: attention sinks, alternating 128-token windows (the first layer sliding), experts with biases
    # behind a biased router, the clamped SwiGLU (limit 7, gain 1.702), yarn from 4096 to 131072 positions
    # Llama 4 Scout (text): chunks of 8192 on three layers in four, every fourth global without rotary
    # positions and temperature-tuned, a weightless q/k norm, 16 sigmoid top-1 experts on their inputs beside one
    # shared expert in every layer, llama3 rope (x8 over 8192)
    "llama-4-scout-17b-16e": _llama(
        5120, 48, 40, 8, 16384, 202048, 500000.0, 262144, head_dim=128, rope_interleave=True,
        rope_scaling=dict(kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_positions=8192),
        attention="alternating", layer_types=tuple("full" if (i + 1) % 4 == 0 else "chunked" for i in range(48)),
        attention_chunk_size=8192, nope_layers=tuple(i for i in range(48) if (i + 1) % 4 == 0),
        temperature_floor_scale=8192, temperature_scale=0.1, qk_norm=True, qk_norm_scale=False, num_experts=16,
        experts_per_token=1, expert_d_ff=8192, shared_experts=1, router_score="sigmoid",
        normalize_router_weights=False, router_weights_on_input=True, router_aux_loss_coef=0.001,
        bos_token_id=200000, eos_token_id=(200001, 200007, 200008), pad_token_id=200018),
    # Llama 4 Maverick (text): Scout's block with 128 experts in every second layer (the others a dense MLP of
    # 16384), no q/k norm, plain rope
    "llama-4-maverick-17b-128e": _llama(
        5120, 48, 40, 8, 16384, 202048, 500000.0, 1048576, head_dim=128, rope_interleave=True,
        attention="alternating", layer_types=tuple("full" if (i + 1) % 4 == 0 else "chunked" for i in range(48)),
        attention_chunk_size=8192, nope_layers=tuple(i for i in range(48) if (i + 1) % 4 == 0),
        temperature_floor_scale=8192, temperature_scale=0.1, num_experts=128, experts_per_token=1, expert_d_ff=8192,
        shared_experts=1, moe_layer_step=2, router_score="sigmoid", normalize_router_weights=False,
        router_weights_on_input=True, router_aux_loss_coef=0.001, bos_token_id=200000,
        eos_token_id=(200001, 200007, 200008), pad_token_id=200018),
    "gpt-oss-20b": _gpt_oss(24, 32),
    "gpt-oss-120b": _gpt_oss(36, 128),
    # Qwen3: RMSNorm over each query and key head before rotary positions, head_dim 128 whatever the width
    "qwen3-0.6b": _llama(1024, 28, 16, 8, 3072, 151936, 1e6, 40960, head_dim=128, qk_norm=True, norm_eps=1e-6,
                         tie_embeddings=True),
    # The Qwen MoEs: softmax top-k over narrow experts; Qwen3's renormalised, Qwen1.5's with a gated shared
    # expert four experts wide and q/k/v biases
    "qwen3-30b-a3b": _llama(2048, 48, 32, 4, 6144, 151936, 1e6, 40960, head_dim=128, qk_norm=True, norm_eps=1e-6,
                            num_experts=128, experts_per_token=8, expert_d_ff=768, normalize_router_weights=True,
                            router_aux_loss_coef=0.001),
    "qwen1.5-moe-a2.7b": _llama(2048, 24, 16, 16, 5632, 151936, 1e6, 8192, qkv_bias=True, norm_eps=1e-6,
                                num_experts=60, experts_per_token=4, expert_d_ff=1408, normalize_router_weights=False,
                                shared_experts=4, shared_expert_gate=True, router_aux_loss_coef=0.001),
    "qwen3-8b": _llama(4096, 36, 32, 8, 12288, 151936, 1e6, 40960, head_dim=128, qk_norm=True, norm_eps=1e-6),
    "granite-3.0-2b": _granite(2048, 8192, 64, 8.0),
    "granite-3.0-8b": _granite(4096, 12800, 128, 16.0),
    "granite-3.0-1b-a400m": _granite_moe(1024, 24, 16, 32),
    "granite-3.0-3b-a800m": _granite_moe(1536, 32, 24, 40),
    # ERNIE-4.5-0.3B: adjacent rotary pairs over 128-wide heads, GQA 16/2, tied head, 131072 positions
    "ernie-4.5-0.3b": _llama(1024, 18, 16, 2, 3072, 103424, 500000.0, 131072, head_dim=128, rope_interleave=True,
                             tie_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "glm-4.5": _glm45(5120, 92, 12288, 1536, 160, 3, 2.5, True),
    "glm-4.5-air": _glm45(4096, 46, 10944, 1408, 128, 1, 1.0, False),
    # Qwen3-Next-80B-A3B: 512 experts 512 wide, 10 per token, one sigmoid-gated shared expert, in every layer
    "qwen3-next-80b-a3b": _qwen3_next(151936, 2048, 48, 2, 5120, 262144, 1e7, num_experts=512, experts_per_token=10,
                                      expert_d_ff=512, shared_experts=1, shared_expert_gate=True,
                                      router_aux_loss_coef=0.001, eos_token_id=151645),
    # Qwen3.5's text models as transformers' config classes describe them ("Qwen3.5-9B style", "Qwen3.5-35B-A3B
    # style"): dense, and 256 experts (8 per token, renormalised) with a gated shared one
    "qwen3.5-9b": _qwen3_next(248320, 4096, 32, 4, 12288, 32768, 1e4),
    "qwen3.5-35b-a3b": _qwen3_next(248320, 2048, 40, 2, 512, 32768, 1e4, num_experts=256, experts_per_token=8,
                                   expert_d_ff=512, shared_experts=1, shared_expert_gate=True,
                                   router_aux_loss_coef=0.001),
    # OLMoE-1B-7B-0924: OLMo-2's q/k norms in pre-norm layers, 64 experts 1024 wide, the top 8 not renormalised
    "olmoe-1b-7b": _llama(2048, 16, 16, 16, 1024, 50304, 10000.0, 4096, qk_norm=True, qk_norm_span="projection",
                          num_experts=64, experts_per_token=8, normalize_router_weights=False,
                          router_aux_loss_coef=0.01, pad_token_id=1, eos_token_id=50279),
    # SmolLM3-3B: every fourth layer without rotary positions, tied head, 64K positions
    "smollm3-3b": _llama(2048, 36, 16, 4, 11008, 128256, 5e6, 65536, norm_eps=1e-6, tie_embeddings=True,
                         nope_layers=tuple(range(3, 36, 4)), pad_token_id=128004, eos_token_id=128012),
    "stablelm-3b-4e1t": _stablelm(50304, 2560, 6912, 32, 32, bos_token_id=0, eos_token_id=0),
    # StableLM 2: q/k/v biases (1.6B); per-head q/k LayerNorms, GQA and a parallel residual (12B)
    "stablelm-2-1.6b": _stablelm(100352, 2048, 5632, 24, 32, qkv_bias=True, bos_token_id=100257,
                                 eos_token_id=100257),
    "stablelm-2-12b": _stablelm(100352, 5120, 13824, 40, 8, qk_norm=True, qk_norm_span="each_head",
                                parallel_residual=True, parallel_shared_norm=True, bos_token_id=100257,
                                eos_token_id=100257),
    # Falcon: 7B with one kv head and one norm for both branches; 40B and 180B in the new decoder architecture
    # (8 kv heads, ln_attn and ln_mlp)
    "falcon-7b": _falcon(4544, 32, 71, 1, True),
    "falcon-40b": _falcon(8192, 60, 128, 8, False),
    "falcon-180b": _falcon(14848, 80, 232, 8, False),
    # Command R (35B, full multi-head attention) and R+ (104B: GQA, each head's own q/k LayerNorm); Command R7B's
    # layers slide over 4096 keys three in four, the fourth attends in full without rotary positions
    "c4ai-command-r-v01": _cohere(8192, 40, 64, 64, 22528, 8e6, 0.0625),
    "c4ai-command-r-plus": _cohere(12288, 64, 96, 8, 33792, 7.5e7, 0.8333333333333334, qk_norm=True,
                                   qk_norm_span="each_head"),
    "c4ai-command-r7b-12-2024": _cohere(4096, 32, 32, 8, 14336, 50000.0, 0.25, 132096, attention="alternating",
                                        window_size=4096, layer_types=("sliding", "sliding", "sliding", "full") * 8,
                                        nope_layers=tuple(range(3, 32, 4))),
    # OPT-350m (post-norm, a 512-wide table projected in and out) is refused by interop/opt.py
    "opt-125m": _opt(768, 12, 12),
    "opt-1.3b": _opt(2048, 24, 32),
    "opt-6.7b": _opt(4096, 32, 32),
    "olmo-2-1b": _olmo2(2048, 16, 16, 8192),  # OLMo-2-0425-1B
    "olmo-2-7b": _olmo2(4096, 32, 32, 11008),  # OLMo-2-1124-7B
    # StarCoder2 3B and 7B tie their head to the embeddings, 15B has its own
    "starcoder2-3b": _starcoder2(3072, 30, 24, 2, 999999.4420358813, True, 0.018042),
    "starcoder2-7b": _starcoder2(4608, 32, 36, 4, 1e6, True, 0.018042),
    "starcoder2-15b": _starcoder2(6144, 40, 48, 4, 1e5, False, 0.01275),
    "deepseek-v2-lite": _deepseek(2048, 27, 16, 10944, 1408, 64, 6, 2, 1, 102400, v3=False, q_lora_rank=None,
                                  bos_token_id=100000, eos_token_id=100001),
    "deepseek-v3": _deepseek(7168, 61, 128, 18432, 2048, 256, 8, 1, 3, 129280, v3=True, q_lora_rank=1536,
                             router_groups=8, router_topk_groups=4, routed_scaling=2.5, bos_token_id=0, eos_token_id=1),
    # Kimi K2.5's text model (moonshotai/Kimi-K2.5's text_config): DeepSeek-V3's shape with 384 experts (8 per
    # token, one shared, one dense layer, no groups), 64 heads, a 160K vocabulary, 256K positions by yarn
    "kimi-k2.5": _deepseek(7168, 61, 64, 18432, 2048, 384, 8, 1, 1, 163840, v3=True, q_lora_rank=1536,
                           routed_scaling=2.827, rope_theta=50000.0, max_positions=262144,
                           rope_scaling=dict(kind="yarn", factor=64.0, original_max_positions=4096, beta_fast=1.0,
                                             beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
                           bos_token_id=163584, eos_token_id=163585),
    # moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json: Kimi Delta Attention (32 heads of 128, one decay per
    # channel, a 4-wide convolution) in 20 of the 27 layers, NoPE latent attention (32 heads; latent 512, "rotary"
    # 64 unrotated, 128 + 128) in layers 3, 7, ..., 23 and 26 (its full_attn_layers, 1-based), one dense layer then
    # 256 experts (8 per token by sigmoid scores, renormalised and scaled 2.446, one shared); 1M positions
    "kimi-linear-48b-a3b": dict(
        family="decoder", vocab_size=163840, d_model=2304, num_heads=32, head_dim=128, rope_head_dim=64,
        v_head_dim=128, kv_lora_rank=512, q_lora_rank=None, d_ff=9216, decoder_layers=27, norm="rmsnorm",
        norm_eps=1e-5, norm_bias=False, activation="swiglu", position="none", max_positions=1048576,
        attention="causal", qkv_bias=False, out_bias=False, mlp_bias=False, tie_embeddings=False,
        linear_layers=tuple(i for i in range(27) if i not in (3, 7, 11, 15, 19, 23, 26)), linear_key_heads=32,
        linear_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel=4,
        linear_decay="channel", num_experts=256, experts_per_token=8, expert_d_ff=1024, shared_experts=1,
        dense_layers=1, router_score="sigmoid", router_bias=True, normalize_router_weights=True, routed_scaling=2.446,
        bos_token_id=163584, eos_token_id=163586, pad_token_id=163839),
    # DeepSeek-V3.2: V3's model with DeepSeek sparse attention, the lightning indexer keeping 2048 keys per query
    # DeepSeek-V4-Flash: two window-only layers, then CSA and HCA in turn (the published compress_ratios 0, 0, 4,
    # 128, 4, ...); V4-Pro: its config class's default schedule (two HCA layers, then HCA and CSA in turn)
    "deepseek-v4-flash": _deepseek_v4(4096, 43, 64, 2048, 256, 1024, 8, 1.5,
                                      ["sliding"] * 2 + ["sparse" if i % 2 == 0 else "heavy" for i in range(41)]),
    "deepseek-v4-pro": _deepseek_v4(7168, 61, 128, 3072, 384, 1536, 16, 2.5,
                                    ["heavy"] * 2 + ["sparse" if i % 2 else "heavy" for i in range(59)]),
    "deepseek-v3.2": _deepseek(7168, 61, 128, 18432, 2048, 256, 8, 1, 3, 129280, v3=True, q_lora_rank=1536,
                               router_groups=8, router_topk_groups=4, routed_scaling=2.5, bos_token_id=0,
                               eos_token_id=1, index_heads=64, index_head_dim=128, index_topk=2048),
    # GLM-5 (zai-org, 2026): V3.2's layers, 64 heads (192 + 64 rotary query/key, 256 values), 32 indexer heads
    # rotating adjacent pairs, 256 experts after 3 dense layers; sizes from GlmMoeDsaConfig's defaults (its docstring's
    # zai-org/GLM-5), the rotary base (1e6) and token ids as public copies of its config.json give them (not checked
    # against the hub file)
    "glm-5": _deepseek(6144, 78, 64, 12288, 2048, 256, 8, 1, 3, 154880, v3=True, q_lora_rank=2048, head_dim=192,
                       v_head_dim=256, norm_eps=1e-5, rope_theta=1e6, rope_scaling=None, max_positions=202752,
                       routed_scaling=2.5, index_heads=32, index_head_dim=128, index_topk=2048,
                       index_rope_interleave=True, bos_token_id=0, pad_token_id=154820,
                       eos_token_id=(154820, 154827, 154829)),
    # Mistral Small 4 (mistralai/Mistral-Small-4-119B-2603's text model, 2026): V3's latent attention (64 + 64 rotary
    # query/key, 128 values, a 256-wide latent, 1024-wide query) with every layer's queries scaled by their position
    # (beta 0.1 per 8192), 128 experts (4 a token, one shared, no dense layer) under a softmax router; sizes from
    # Mistral4Config's defaults, whose docstring names that checkpoint (not checked against the hub file)
    "mistral-small-4-119b": _deepseek(4096, 36, 32, 12288, 2048, 128, 4, 1, 0, 131072, v3=False, q_lora_rank=1024,
                                      head_dim=64, kv_lora_rank=256, max_positions=1048576,
                                      rope_scaling=dict(kind="yarn", factor=128.0, original_max_positions=8192,
                                                        beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
                                      router_group_score="best_two", normalize_router_weights=True,
                                      query_position_scale=0.1, query_position_span=8192, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=11),
    # Mistral Large 4 (mistralai/Mistral-Large-4-1T-A52B's text model, 2026): latent attention (64 + 64 rotary
    # query/key, 128 values, a 512-wide latent, a plain query) narrowed by an indexer of 32 x 128 reading the layer's
    # input, every fourth layer NoPE, LeRoPE's learned frequencies, learned log-position query scales, 128 experts
    # (4 a token, one shared) after one dense layer under a softmax router, logits softcapped at 30; sizes from
    # MistralLarge4Config's defaults, whose docstring names that checkpoint, and pad id 11 as Mistral Small 4's
    # files give it (the class says None; not checked against the hub file)
    "mistral-large-4": _deepseek(6144, 72, 64, 24576, 6144, 128, 4, 1, 1, 204800, v3=False, q_lora_rank=None,
                                 head_dim=64, norm_eps=1e-5, latent_norm_eps=1e-5, max_positions=1048576,
                                 rope_scaling=dict(kind="yarn", factor=2048.0, original_max_positions=512,
                                                   beta_fast=32.0, beta_slow=1.0, attention_factor=1.0),
                                 rope_learned_frequencies=True, nope_layers=tuple(range(3, 72, 4)),
                                 router_group_score="best_two", normalize_router_weights=True, index_heads=32,
                                 index_head_dim=128, index_topk=2048, index_rope_interleave=True,
                                 index_query_from_input=True, query_log_position_scale=True, logits_softcap=30.0,
                                 bos_token_id=1, eos_token_id=2, pad_token_id=11),
    "gemma-2-2b": _gemma(2304, 26, 8, 4, 9216, 256000, 4096, 2, 8192, gemma3=False),
    "gemma-2-9b": _gemma(3584, 42, 16, 8, 14336, 256000, 4096, 2, 8192, gemma3=False),
    "gemma-3-1b": _gemma(1152, 26, 4, 1, 6912, 262144, 512, 6, 32768, gemma3=True),
    "gemma-3-4b": _gemma(2560, 34, 8, 4, 10240, 262208, 1024, 6, 131072, gemma3=True,
                         rope_scaling={"kind": "linear", "factor": 8.0}),
    # Gemma 4's text models, from third-party copies of google/gemma-4-{E2B,E4B,31B}'s config.json (not checked
    # against the hub)
    "gemma-4-e2b": _gemma4(1536, 35, 8, 1, 6144, 512, 5, 131072, shared=20, kv_shared_d_ff=12288),
    "gemma-4-e4b": _gemma4(2560, 42, 8, 2, 10240, 512, 6, 131072, shared=18),
    "gemma-4-31b": _gemma4(5376, 60, 32, 16, 21504, 1024, 6, 262144, per_layer=0, full_kv_heads=4,
                           full_keys_as_values=True),
    # the 26B A4B (third-party copies of google/gemma-4-26B-A4B-it's text_config: MaxText's gemma4-26b.yml and
    # re-releases' config.json agree): the 31B's attention layout at 2816 wide, 30 layers, and beside each layer's
    # 2112-wide MLP 128 experts 704 wide, 8 a token
    "gemma-4-26b-a4b": _gemma4(2816, 30, 16, 8, 2112, 1024, 6, 262144, per_layer=0, full_kv_heads=2,
                               full_keys_as_values=True, num_experts=128, experts_per_token=8, expert_d_ff=704,
                               router_norm=True, router_expert_scale=True, experts_beside_dense=True),
    "t5gemma-2b-2b": _t5gemma(_gemma(2304, 26, 8, 4, 9216, 256000, 4096, 2, 8192, gemma3=False)),
    # EmbeddingGemma (Google 2025): a Gemma 3 encoder; its file's sliding_window 512 spans both sides, so each
    # sliding layer sees the keys within 256 either way. Pooling, Dense and Normalize live in the ST folder.
    "embeddinggemma-300m": _gemma(768, 24, 3, 1, 1152, 262144, 256, 6, 2048, gemma3=True, family="encoder",
                                  encoder_layers=24, decoder_layers=0, head="none"),
    # Transformer-XL's WikiText-103 models (paper: 151M and 257M with the adaptive softmax; see _transformer_xl)
    "transformer-xl": _transformer_xl(410, 16, 10, 2100, 150, 0.1, 0.0),
    "transformer-xl-large": _transformer_xl(1024, 18, 16, 4096, 384, 0.2, 0.2),
    "xlnet-base-cased": _xlnet(768, 12, 12),
    "xlnet-large-cased": _xlnet(1024, 24, 16),
    # Tiny configs: same component choices as their families, small enough to run in a second on CPU.
    "tiny-bert": _bert(64, 2, 4, vocab=256, d_ff=128, max_positions=128, dropout_rate=0.0,
                       attention_dropout_rate=0.0),
    "tiny-gpt": _gpt2(64, 2, 4, vocab_size=256, d_ff=128, max_positions=128, dropout_rate=0.0,
                      attention_dropout_rate=0.0),
    "tiny-llama": _llama(64, 2, 4, 2, 128, 256, 10000.0, 128),
    "tiny-qwen3": _llama(64, 2, 4, 2, 128, 256, 1e6, 128, head_dim=24, qk_norm=True, norm_eps=1e-6),
    "tiny-mixtral": _llama(64, 2, 4, 2, 128, 256, 1e6, 128, num_experts=4, experts_per_token=2,
                           router_aux_loss_coef=0.02),
    "tiny-deepseek": _deepseek(64, 3, 4, 128, 32, 8, 2, 1, 1, 256, v3=True, q_lora_rank=48, head_dim=16,
                               rope_head_dim=8, v_head_dim=16, kv_lora_rank=32, max_positions=128, router_groups=4,
                               router_topk_groups=2, routed_scaling=2.5, rope_scaling=None),
    "tiny-transformer-xl": _transformer_xl(64, 2, 4, 128, 32, 0.0, 0.0, vocab_size=256),
    "tiny-gemma": _gemma(64, 3, 4, 2, 128, 256, 8, 2, 128, gemma3=False, head_dim=16, attention_scale=16 ** -0.5),
    "tiny-gemma3": _gemma(64, 3, 4, 2, 128, 256, 8, 3, 128, gemma3=True, head_dim=16, attention_scale=16 ** -0.5),
    "tiny-t5gemma": _t5gemma(_gemma(64, 2, 4, 2, 128, 256, 8, 2, 128, gemma3=False, head_dim=16,
                                    attention_scale=16 ** -0.5)),
    "tiny-t5": {**_t5(64, 128, 2, 4, head_dim=16), "vocab_size": 256, "dropout_rate": 0.0},
    "tiny-transformer": {**_transformer_2017(64, 4, 128, 0.0), "vocab_size": 256, "max_positions": 128,
                         "encoder_layers": 2, "decoder_layers": 2},
    "vit-base-patch16-224": _vit(768, 12, 12),
    "vit-large-patch16-224": _vit(1024, 24, 16),
    "clip-vit-base-patch32": _clip_vit_base_patch32(),
    "siglip-base-patch16-224": _siglip_base_patch16_224(),
    "siglip2-base-patch16-naflex": _siglip2_base_patch16(naflex=True),
    "siglip2-base-patch16-224": _siglip2_base_patch16(naflex=False),
    "llava-1.5-7b": _llava_15_7b(),
    "qwen2.5-vl-7b": _qwen25_vl_7b(),
    "gemma-3-4b-vision": _gemma_3_4b_vision(),
    "llama-3.2-11b-vision": _llama_32_11b_vision(),
}


def presets() -> list[str]:
    """Names of every preset, in a stable order (published models first, then tiny ones)."""
    return list(_PRESETS)


def config(name: str) -> ModelConfig:
    """The frozen ModelConfig of a preset; ``.replace(...)`` derives variants."""
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(_PRESETS)}")
    return ModelConfig.from_dict({"name": name, **_PRESETS[name]})
