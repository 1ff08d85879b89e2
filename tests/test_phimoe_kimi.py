"""Phi-3.5-MoE (``phimoe``: the sparse mixer's routing, LayerNorms, every bias, transformers' longrope) and Kimi
K2.5 (``kimi_k25``: a DeepSeek-V3 text model inside a multimodal file) as transformers computes them: the
published files read as their transformers-5 form and match transformers' numbers; the sparse mixer's picks and
weights (and their gradients) are transformers'; settings jaxformer cannot honour are refused by name; greedy and
beam generation with left padding are token-identical; a QLoRA fine-tune starts from the file and learns; Kimi's
vision tower and projector are skipped with a note and its text model exports as deepseek_v3. Parity of every
layer and the bit-exact round trip of the tiny Phi-3.5-MoE checkpoints are in test_hf_parity.py, every key changed
one at a time in test_config_keys.py, the presets' counts in test_presets.py, cache == no cache in test_generate.py."""

from __future__ import annotations

import copy
import json
import shutil
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

import jaxformer as jf  # noqa: E402
from jaxformer.interop.files import TensorFiles  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.layers.feedforward import sparsemixer  # noqa: E402

from family_files import (TINY, as_transformers_writes_it, generates_as_transformers,  # noqa: E402
                          matches_transformers, qlora_loss_falls, read, rewritten)
from hf_factory import STD  # noqa: E402

# microsoft/Phi-3.5-MoE-instruct's config.json, every key kept, sizes (and token ids) those of the tiny checkpoint:
# 4 experts (16 published), 4 longrope factors per list (64), a pretraining length of 4 (4096), so the test
# sequences pass it
PUBLISHED_PHIMOE = {
    "_name_or_path": "Phi-3.5-MoE-instruct", "architectures": ["PhiMoEForCausalLM"], "attention_bias": True,
    "attention_dropout": 0.0, "auto_map": {"AutoConfig": "configuration_phimoe.PhiMoEConfig",
                                           "AutoModelForCausalLM": "modeling_phimoe.PhiMoEForCausalLM"},
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_dropout": 0.0, "input_jitter_noise": 0.01,
    "lm_head_bias": True, "model_type": "phimoe", "num_experts_per_tok": 2, "num_local_experts": 4,
    "original_max_position_embeddings": 4, "output_router_logits": False, "rms_norm_eps": 1e-05,
    "rope_scaling": {"long_factor": [1.0, 1.8, 3.5, 9.0], "long_mscale": 1.243163121016122,
                     "original_max_position_embeddings": 4, "short_factor": [1.0, 1.05, 1.2, 1.6],
                     "short_mscale": 1.243163121016122, "type": "longrope"},
    "rope_theta": 10000.0, "router_aux_loss_coef": 0.0, "router_jitter_noise": 0.01, "sliding_window": 131072,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": True,
    **TINY}
# moonshotai/Kimi-K2.5's config.json as published (its remote code's keys, a kimi_k2 text model, the vision tower's
# own keys), sizes made tiny, without the int4 quantization_config of its experts (a bfloat16 conversion)
_KIMI_TEXT = {"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "aux_loss_alpha": 0.001, "bos_token_id": 1, "eos_token_id": 2, "ep_size": 1, "first_k_dense_replace": 1,
              "hidden_act": "silu", "hidden_size": 32, "initializer_range": STD, "intermediate_size": 48,
              "kv_lora_rank": 12, "max_position_embeddings": 64, "model_type": "kimi_k2", "moe_intermediate_size": 16,
              "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 8, "n_shared_experts": 1, "norm_topk_prob": True,
              "num_attention_heads": 4, "num_experts_per_tok": 3, "num_hidden_layers": 3, "num_key_value_heads": 4,
              "num_nextn_predict_layers": 0, "pad_token_id": 0, "pretraining_tp": 1, "q_lora_rank": 20,
              "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-05,
              "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                               "original_max_position_embeddings": 16, "type": "yarn"},
              "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "seq_aux": True,
              "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc", "use_cache": True,
              "v_head_dim": 12, "vocab_size": 97}
PUBLISHED_KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "bos_token_id": 1, "eos_token_id": 2,
                  "ignore_index": -100, "media_placeholder_token_id": 163605, "model_type": "kimi_k25",
                  "pad_token_id": 0, "text_config": _KIMI_TEXT, "tie_word_embeddings": False,
                  "use_unified_vision_chunk": True, "video_placeholder": "<|kimi_k25_video_placeholder|>",
                  "vision_config": {"init_pos_emb_height": 4, "init_pos_emb_time": 2, "init_pos_emb_width": 4,
                                    "merge_kernel_size": [2, 2], "merge_type": "sd2_tpool", "mm_hidden_size": 16,
                                    "mm_projector_type": "patchmerger", "patch_size": 14,
                                    "projector_hidden_act": "gelu",
                                    "projector_ln_eps": 1e-05, "text_hidden_size": 32, "vt_hidden_size": 16,
                                    "vt_intermediate_size": 24, "vt_num_attention_heads": 2,
                                    "vt_num_hidden_layers": 1}}


# --------------------------------------------------------------------------------------------------
# Phi-3.5-MoE


def test_the_published_phimoe_file_reads_as_its_transformers_5_form_and_matches_transformers(checkpoints, tmp_path):
    cfg = read(PUBLISHED_PHIMOE)
    assert read(as_transformers_writes_it(PUBLISHED_PHIMOE)).replace(name=cfg.name) == cfg
    s = cfg.rotary.scaling  # transformers uses the short factors at every length, times the one mscale
    assert (s.kind, s.long_factor, s.attention_factor) == ("longrope", s.short_factor, 1.243163121016122)
    assert (cfg.norms.kind, cfg.biases.qkv, cfg.biases.out, cfg.logits.trained_bias) == ("layernorm", True, True, True)
    assert (cfg.experts.router_score, cfg.experts.jitter_eps, cfg.experts.normalize_weights) == \
        ("sparsemixer", 0.01, False)
    # (transformers builds the remote code's class name as its own PhimoeForCausalLM, by model_type)
    hf = {**PUBLISHED_PHIMOE, "architectures": ["PhimoeForCausalLM"]}
    matches_transformers(rewritten(checkpoints("phimoe"), tmp_path / "published", hf), length=12)


@pytest.mark.parametrize("eps", [0.0, 0.01, 0.15, 2.0])
def test_the_sparse_mixer_picks_and_weighs_as_transformers_and_its_gradient_is_theirs(eps):
    """Eval-time routing on logits with near-ties, negative bests and exact ties, and the gradient of the weights
    (transformers' eval path is plain autograd, as ours is)."""
    from transformers.models.phimoe.modeling_phimoe import sparsemixer as reference

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 6)).astype(np.float32)
    logits[:8] -= 3.0  # every logit negative
    logits[8:16, 1] = logits[8:16, 0] * (1 - 0.5 * eps)  # within the eps band of the best
    logits[16, 2] = logits[16, 3]
    cotangent = rng.normal(size=(64, 2)).astype(np.float32)
    scores = torch.tensor(logits, requires_grad=True)
    weights, experts = reference(scores, jitter_eps=eps, training=False)
    (weights * torch.tensor(cotangent)).sum().backward()
    ours, our_weights = sparsemixer(jnp.asarray(logits), eps)
    np.testing.assert_array_equal(np.asarray(ours), experts.numpy())
    np.testing.assert_allclose(np.asarray(our_weights), weights.detach().numpy(), rtol=0, atol=1e-7)
    grad = jax.grad(lambda x: jnp.sum(sparsemixer(x, eps)[1] * cotangent))(jnp.asarray(logits))
    np.testing.assert_allclose(np.asarray(grad), scores.grad.numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("changes, message", [
    ({"num_experts_per_tok": 1}, "phimoe: num_experts_per_tok=1 is not supported"),
    ({"rope_scaling": {**PUBLISHED_PHIMOE["rope_scaling"], "long_mscale": 1.5}}, "short_mscale=1.243163121016122 and "
     "long_mscale=1.5 differ"),
    ({"rope_scaling": {**PUBLISHED_PHIMOE["rope_scaling"], "short_mscale": None}}, "longrope needs numbers"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "phimoe: rope type 'linear' is not supported"),
    ({"num_local_experts": 0}, "phimoe: num_local_experts=0"),
])
def test_a_phimoe_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED_PHIMOE, **changes})


def test_the_sparse_mixer_is_checked_where_it_is_set():
    base = jf.config("tiny-mixtral")
    with pytest.raises(ValueError, match="router_jitter_eps=0.1 belongs to router_score='sparsemixer'"):
        base.replace(router_jitter_eps=0.1)
    with pytest.raises(ValueError, match="not experts_per_token=3, normalize_router_weights=True"):
        base.replace(router_score="sparsemixer", experts_per_token=3)


def test_phimoe_generation_is_token_identical_to_transformers(checkpoints):
    generates_as_transformers(checkpoints("phimoe"))


def test_a_qlora_fine_tune_starts_from_the_phimoe_file_and_its_loss_falls(checkpoints, tmp_path):
    qlora_loss_falls(checkpoints("phimoe"), tmp_path)


# --------------------------------------------------------------------------------------------------
# Kimi K2.5


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """A tiny Kimi_K25ForConditionalGeneration (a one-layer vision tower) saved by transformers, its text model's
    layers renamed to the published layout (transformers 5's save writes language_model.model.blocks.N, its
    reverse of the vision tower's blocks -> layers rename; the published files say layers.N)."""
    text = {**{k: v for k, v in _KIMI_TEXT.items() if k not in ("architectures", "rope_scaling", "rope_theta")},
            "model_type": "deepseek_v3",
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0, "beta_fast": 1.0,
                                "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                "original_max_position_embeddings": 16}}
    vision = dict(pos_emb_height=4, pos_emb_width=4, pos_emb_time=2, num_attention_heads=2, num_hidden_layers=1,
                  hidden_size=16, intermediate_size=24)
    torch.manual_seed(0)
    config = transformers.Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=16,
                                         tie_word_embeddings=False)
    model = transformers.Kimi_K25ForConditionalGeneration(config).eval()
    with torch.no_grad():  # norms at 1 and the selection bias at 0 would hide their mapping
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("layernorm.weight", "norm.weight", "e_score_correction_bias")):
                p.add_(torch.randn_like(p) * 0.1)
    saved, folder = tmp_path_factory.mktemp("kimi-saved"), tmp_path_factory.mktemp("kimi")
    model.save_pretrained(saved)
    files = TensorFiles(saved)
    save_file({n.replace("language_model.model.blocks.", "language_model.model.layers."): files.get(n)
               for n in files.names}, str(folder / "model.safetensors"))
    shutil.copy(saved / "config.json", folder / "config.json")
    return folder


def test_the_kimi_file_loads_its_text_model_skipping_the_vision_tower_with_a_note(kimi):
    with pytest.warns(UserWarning, match=r"tensors of the vision tower and its projector \(mm_projector, "
                                         r".*vision_tower\) .* the vision issue \(51\) will read them"):
        model = jf.from_pretrained(kimi)
    assert (model.config.experts.count, model.config.experts.routed_scaling, model.config.latent.q_rank) == \
        (8, 2.827, 20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        matches_transformers(kimi)  # against the wrapper's text path (input_ids only)


def test_the_kimi_text_model_exports_as_deepseek_v3_and_equals_those_tensors_loaded(kimi, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = jf.from_pretrained(kimi)
        model.save_pretrained(tmp_path)
        again = jf.from_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["model_type"], written["architectures"]) == ("deepseek_v3", ["DeepseekV3ForCausalLM"])
    assert again.config.replace(name=model.config.name) == model.config
    source, out = TensorFiles(kimi), TensorFiles(tmp_path)
    for name in out.names:  # each text tensor as the file holds it, under DeepSeek-V3's names
        theirs = name.replace("model.", "language_model.model.", 1) if name.startswith("model.") else \
            "language_model." + name
        assert source.get(theirs).tobytes() == out.get(name).tobytes(), name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        matches_transformers(tmp_path)


def test_the_published_kimi_file_reads_as_its_transformers_5_form_and_refuses_its_int4_experts():
    cfg = read(PUBLISHED_KIMI)
    assert read(as_transformers_writes_it(PUBLISHED_KIMI)).replace(name=cfg.name) == cfg
    assert (cfg.experts.router_groups, cfg.rotary.theta, cfg.rotary.scaling.factor, cfg.embeddings.tie) == \
        (1, 50000.0, 4.0, False)
    assert read({**PUBLISHED_KIMI, "tie_word_embeddings": True}).embeddings.tie  # the wrapper's key ties the head
    quantized = copy.deepcopy(PUBLISHED_KIMI)
    quantized["text_config"]["quantization_config"] = {"format": "pack-quantized", "quant_method": "compressed-tensors"}
    with pytest.raises(ValueError, match="quantization_config"):
        config_from_hf(quantized)
    with pytest.raises(ValueError, match="kimi_k25: text_config model_type 'llama' is not supported"):
        config_from_hf({**PUBLISHED_KIMI, "text_config": {**_KIMI_TEXT, "model_type": "llama"}})
