"""Kimi Linear (``kimi_linear``) as transformers computes it: Kimi Delta Attention (a decay per key channel) beside
NoPE latent attention, DeepSeek-V3's experts after a dense layer. The published file (its layer lists in
linear_attn_config, its dense layer's MLP under ``mlp.``) reads as its transformers-5 form and matches transformers
over several chunks of the parallel form, and under decays strong enough that a chunk's cumulative decay would
overflow exp() taken whole; greedy and beam generation with left padding are token-identical (the decode steps run
the recurrent form); what cannot be honoured is refused by name; a QLoRA fine-tune starts from the file and learns.
Parity of every layer and the round trip of the tiny checkpoints are in test_hf_parity.py, every key changed one at
a time in test_config_keys.py, cache == no cache in test_generate.py, the preset's count in test_presets.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.numpy import load_file, save_file  # noqa: E402

import jaxformer as jf  # noqa: E402
from jaxformer.interop.hf import config_from_hf, to_hf_tensors  # noqa: E402

from family_files import (as_transformers_writes_it, generates_as_transformers, matches_transformers,  # noqa: E402
                          qlora_loss_falls, read, rewritten)

# moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json, every key kept, sizes and token ids those of the tiny
# checkpoint: 5 layers, full attention in the third and fifth (1-based, as published), 8 experts in 4 groups, 2 of
# them picked (the published: 27 layers, full at 4, 8, ..., 24 and 27; 256 experts, 1 group)
PUBLISHED = {"architectures": ["KimiLinearForCausalLM"],
             "auto_map": {"AutoConfig": "configuration_kimi.KimiLinearConfig",
                          "AutoModel": "modeling_kimi.KimiLinearModel",
                          "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM"},
             "bos_token_id": 1, "dtype": "bfloat16", "eos_token_id": 2, "first_k_dense_replace": 1, "head_dim": 72,
             "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 48,
             "kv_lora_rank": 12,
             "linear_attn_config": {"full_attn_layers": [3, 5], "head_dim": 8, "kda_layers": [1, 2, 4],
                                    "num_heads": 3, "short_conv_kernel_size": 4},
             "mla_use_nope": True, "model_max_length": 64, "model_type": "kimi_linear", "moe_intermediate_size": 16,
             "moe_layer_freq": 1, "moe_renormalize": True, "moe_router_activation_func": "sigmoid",
             "num_attention_heads": 4, "num_expert_group": 4, "num_experts": 8, "num_experts_per_token": 3,
             "num_hidden_layers": 5, "num_key_value_heads": 4, "num_nextn_predict_layers": 0, "num_shared_experts": 1,
             "pad_token_id": 0, "q_lora_rank": None, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
             "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "routed_scaling_factor": 2.446,
             "tie_word_embeddings": False,
             "topk_group": 2, "transformers_version": "4.57.1", "use_cache": True, "use_grouped_topk": True,
             "v_head_dim": 12, "vocab_size": 97}
DENSE_MLP = ("gate_proj", "up_proj", "down_proj")


def _edited(folder, edit) -> None:
    """``edit(tensors)`` applied to the checkpoint's safetensors file in place."""
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _published_names(tensors: dict) -> None:
    """The dense layer's MLP where the published files keep it (transformers writes it beside the experts)."""
    for name in DENSE_MLP:
        tensors[f"model.layers.0.mlp.{name}.weight"] = tensors.pop(f"model.layers.0.block_sparse_moe.{name}.weight")


def test_the_published_file_reads_as_its_transformers_5_form_and_matches_transformers_over_chunks(checkpoints,
                                                                                                tmp_path):
    """150 tokens: three chunks of 64 for the parallel form (each cut in sub-chunks of 16), the second row
    right-padded; the dense layer's tensors named as published. Written back, they are named as transformers writes
    them, and the file's linear_attn_config is kept in step with the layer_types written beside it."""
    cfg = read(PUBLISHED)
    assert read(as_transformers_writes_it(PUBLISHED)).replace(name=cfg.name) == cfg
    linear = cfg.linear_attention
    assert (linear.layers, linear.key_heads, linear.key_head_dim, linear.decay, cfg.position, cfg.rotary,
            cfg.experts.dense_layers, cfg.experts.router_groups) == ((0, 1, 3), 3, 8, "channel", "none", None, 1, 4)
    folder = rewritten(checkpoints("kimi_linear"), tmp_path / "published", PUBLISHED)
    _edited(folder, _published_names)
    matches_transformers(folder, length=150)
    tensors, hf = to_hf_tensors(jf.from_pretrained(folder))
    assert {f"model.layers.0.block_sparse_moe.{n}.weight" for n in DENSE_MLP} <= set(tensors)
    assert not [n for n in tensors if ".mlp." in n]
    assert hf["linear_attn_config"] == PUBLISHED["linear_attn_config"] and read(hf).replace(name=cfg.name) == cfg


def test_strong_decays_stay_finite_and_match_transformers(checkpoints, tmp_path):
    """Decay rates A = 2000 (the class draws 1 to 16): each token's log decay near -20 per channel, over a chunk of
    64 near -1300, whose exp() taken whole would overflow float32; the chunked form takes no exp of a positive
    number (between sub-chunks the decay goes through the boundary's) and stays within the tolerance."""
    folder = rewritten(checkpoints("kimi_linear"), tmp_path / "strong", as_transformers_writes_it(PUBLISHED))

    def strong(tensors):
        for name in [n for n in tensors if n.endswith(".A_log")]:
            tensors[name] = np.full_like(tensors[name], np.log(2000.0))

    _edited(folder, strong)
    matches_transformers(folder, length=150)


def test_greedy_and_beam_generation_are_token_identical_with_left_padding(checkpoints):
    generates_as_transformers(checkpoints("kimi_linear"))


@pytest.mark.parametrize("changes, message", [
    ({"attention_bias": True}, "kimi_linear: attention_bias=true is not supported"),
    ({"num_key_value_heads": 2}, "num_key_value_heads=2 differs from num_attention_heads=4"),
    ({"linear_attn_config": {**PUBLISHED["linear_attn_config"], "kda_layers": [1, 2]}},
     "must give each of the 5 layers one of"),
    ({"mlp_layer_types": ["sparse", "dense", "sparse", "sparse", "sparse"]}, "dense layers first, then sparse ones"),
    ({"first_k_dense_replace": 3}, r"the dense layers \[0, 1, 2\] mix linear and full attention"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED, **changes})


def test_tie_word_embeddings_changes_nothing_and_loads_at_any_value():
    # KimiLinearForCausalLM never ties its head (_tied_weights_keys is empty), so the key changes no number
    assert config_from_hf({**PUBLISHED, "tie_word_embeddings": True}) == config_from_hf(PUBLISHED)


def test_a_qlora_fine_tune_from_the_file_learns(checkpoints, tmp_path):
    # (its tiny file is drawn at std 0.05, as Qwen3-Next's: a larger step moves it as far in 8 steps)
    qlora_loss_falls(checkpoints("kimi_linear"), tmp_path / "run", "optim.lr=6e-2")
