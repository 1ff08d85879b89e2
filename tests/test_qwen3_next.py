"""Qwen3-Next and Qwen3.5 (``qwen3_next``, ``qwen3_5_text``, ``qwen3_5_moe_text`` and the multimodal ``qwen3_5``
files) as transformers computes them: Gated DeltaNet layers beside gated attention. The published files read as
their transformers-5 forms and match transformers over several chunks of the parallel form; the multimodal file's
text model loads with a note and exports; greedy and beam generation with left padding are token-identical (the
decode steps run the recurrent form); the linear layers' cached state does not grow with the length; what cannot
be honoured is refused by name; a QLoRA fine-tune starts from the file and learns. Parity of every layer and the
round trip of the tiny checkpoints are in test_hf_parity.py, every key changed one at a time in
test_config_keys.py, cache == no cache in test_generate.py, the presets' counts in test_presets.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.cache import HybridCache, linear_state_bytes  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402

from family_files import (TINY, as_transformers_writes_it, generates_as_transformers,  # noqa: E402
                          matches_transformers, qlora_loss_falls, read, rewritten)

_LINEAR = dict(linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
               linear_value_head_dim=6)
# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json, every key kept, sizes those of the tiny checkpoint: 5 layers (the
# default interval of 4 makes layer 3 the full one), 4 experts (the published: 48 layers, 512 experts, top 10)
PUBLISHED = {"architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": 1, "decoder_sparse_step": 1, "eos_token_id": 2, "full_attention_interval": 4,
             "head_dim": 8, "hidden_act": "silu", "initializer_range": 0.02, "mlp_only_layers": [],
             "model_type": "qwen3_next", "moe_intermediate_size": 16, "norm_topk_prob": True, "num_experts": 4,
             "num_experts_per_tok": 2, "output_router_logits": False, "partial_rotary_factor": 0.25,
             "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
             "shared_expert_intermediate_size": 16, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
             "transformers_version": "4.57.0.dev0", "use_cache": True, "use_sliding_window": False,
             **TINY, **_LINEAR, "num_hidden_layers": 5, "pad_token_id": 0}


def test_the_published_file_reads_as_its_transformers_5_form_and_matches_transformers_over_chunks(checkpoints,
                                                                                                tmp_path):
    """150 tokens: three chunks of 64 for the parallel form, the second row right-padded."""
    cfg = read(PUBLISHED)
    assert read(as_transformers_writes_it(PUBLISHED)).replace(name=cfg.name) == cfg
    linear = cfg.linear_attention
    assert (linear.layers, linear.key_heads, linear.value_heads, cfg.rope_dim, cfg.scores.output_gate,
            cfg.norms.scale_offset, cfg.experts.shared, cfg.experts.shared_gate) == ((0, 1, 2, 4), 2, 4, 2, True,
                                                                                     1.0, 1, True)
    matches_transformers(rewritten(checkpoints("qwen3_next"), tmp_path / "published", PUBLISHED), length=150)


def test_qwen3_5_multimodal_file_loads_its_text_model_and_exports_it(tmp_path):
    """A Qwen3.5 file as published (Qwen3_5ForConditionalGeneration: the text model under model.language_model,
    a vision tower, M-RoPE's sections in the rotary dict): the text model loads with a note, its logits on text
    equal transformers', and it exports as qwen3_5_text, which transformers reads back to the same logits."""
    text = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                num_hidden_layers=4, vocab_size=97, max_position_embeddings=64, initializer_range=0.05,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.5,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True},
                **_LINEAR)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4,
                  temporal_patch_size=2, num_position_embeddings=16)
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    reference = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    reference.save_pretrained(tmp_path / "vlm")
    with pytest.warns(UserWarning, match="tensors of the vision tower are not used"):
        model = jf.from_pretrained(tmp_path / "vlm")
    ids = np.random.default_rng(0).integers(3, 97, (2, 11))
    with torch.no_grad():
        theirs = reference(input_ids=torch.as_tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(ids).logits), theirs, atol=1e-5, rtol=0)
    jf.save_pretrained(model, tmp_path / "text")
    written = json.loads((tmp_path / "text" / "config.json").read_text())
    assert (written["model_type"], written["architectures"]) == ("qwen3_5_text", ["Qwen3_5ForCausalLM"])
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "text").eval()
    with torch.no_grad():
        np.testing.assert_allclose(again(input_ids=torch.as_tensor(ids)).logits.numpy(), theirs, atol=1e-5, rtol=0)


def test_greedy_and_beam_generation_are_token_identical_with_left_padding(checkpoints):
    generates_as_transformers(checkpoints("qwen3_next"))


def test_the_linear_layers_state_does_not_grow_with_the_length():
    """A cached step carries keys and values for the attention layers only; the linear layers' state matrices and
    convolution windows are the same size at 16 slots and at 4,096."""
    cfg = jf.config("tiny-mixtral").replace(decoder_layers=4, linear_layers=(0, 1, 2), linear_key_heads=2,
                                            linear_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6)
    model = jf.build(cfg)
    short, long = (model.init_cache(2, slots).kv for slots in (16, 4096))
    assert isinstance(short, HybridCache) and short.full.k.shape[0] == 1
    assert short.linear.state.shape == long.linear.state.shape == (3, 2, 4, 8, 6)
    assert short.linear.conv.shape == long.linear.conv.shape == (3, 2, 3, 2 * 2 * 8 + 4 * 6)
    assert linear_state_bytes(cfg) == 3 * (4 * 8 * 6 * 4 + 3 * (2 * 2 * 8 + 4 * 6) * 4)


def test_drafting_is_refused(checkpoints):
    """A recurrent state cannot be rewound past the drafts a target rejected: refused before anything runs."""
    model = jf.from_pretrained(checkpoints("qwen3_next"))
    with pytest.raises(ValueError, match="linear-attention layers, whose recurrent state cannot be rewound"):
        model.generate(np.arange(3, 10)[None], max_new_tokens=4, prompt_lookup_num_tokens=2)


def test_packed_documents_each_start_from_a_zero_state():
    """Two documents packed into one row (chunks of 4, so each crosses chunk boundaries and the second starts
    inside a chunk) give each document's logits alone: the convolution and the state restart at each."""
    cfg = jf.config("tiny-mixtral").replace(decoder_layers=4, linear_layers=(0, 1, 2), linear_key_heads=2,
                                            linear_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
                                            linear_chunk=4, attention_gate=True, init_std=0.05)
    model = jf.build(cfg, seed=0)
    rng = np.random.default_rng(0)
    first, second = rng.integers(3, 90, 6), rng.integers(3, 90, 7)
    row = np.concatenate([first, second, [0, 0, 0]])[None]
    segments = np.array([[1] * 6 + [2] * 7 + [0] * 3])
    positions = np.array([[*range(6), *range(7), 0, 0, 0]])
    packed = np.asarray(model(row, segment_ids=segments, position_ids=positions).logits)[0]
    for document, at in ((first, slice(0, 6)), (second, slice(6, 13))):
        np.testing.assert_allclose(packed[at], np.asarray(model(document[None]).logits)[0], atol=1e-5, rtol=0)


def test_a_wrapper_whose_text_config_ties_otherwise_is_refused():
    """transformers ties a wrapper's head by the file's own tie_word_embeddings: a text_config saying otherwise
    is refused (rules.text_model_from_hf, shared by the Llama 4, Gemma 4 and Qwen3.5 wrappers)."""
    text = {**PUBLISHED, "model_type": "qwen3_5_text", "tie_word_embeddings": True}
    wrapper = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
               "tie_word_embeddings": False, "text_config": text}
    with pytest.raises(ValueError, match="qwen3_5: tie_word_embeddings differs between the file and its text_config"):
        config_from_hf(wrapper)


@pytest.mark.parametrize("changes, message", [
    ({"attention_bias": True}, "qwen3_next: attention_bias=true is not supported"),
    ({"mlp_only_layers": [0]}, r"dense layers \[0\] .* beside linear-attention layers are not supported"),
    ({"layer_types": ["linear_attention"] * 4 + ["sliding_attention"]}, "must give each of the 5 layers one of"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED, **changes})


def test_a_qlora_fine_tune_from_the_file_learns(checkpoints, tmp_path):
    # (its tiny file is drawn at std 0.05, a quarter of the others: a larger step moves it as far in 8 steps)
    qlora_loss_falls(checkpoints("qwen3_next"), tmp_path / "run", "optim.lr=6e-2")
