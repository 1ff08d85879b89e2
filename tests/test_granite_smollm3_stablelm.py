"""Granite (``granite``: muP's multipliers), SmolLM3 (``smollm3``: NoPE layers, optional windows) and StableLM
(``stablelm``: partial rotary, per-head q/k LayerNorms, parallel residual) as transformers computes them: files as
published read as their transformers-5 form and match transformers' numbers; settings jaxformer cannot honour are
refused by name; greedy and beam generation with left padding are token-identical; a QLoRA fine-tune starts from
each file and learns. Parity of every layer and the bit-exact round trip of the tiny checkpoints are in
test_hf_parity.py, every key changed one at a time in test_config_keys.py, the presets' counts against
transformers' in test_presets.py, cache == no cache in test_generate.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxformer.interop.hf import config_from_hf  # noqa: E402

from family_files import (TINY, as_transformers_writes_it, generates_as_transformers,  # noqa: E402
                          matches_transformers, qlora_loss_falls, read, rewritten)
# The published config.json files, every key kept, sizes (and token ids) those of the tiny checkpoints. Granite's
# head is untied here as the tiny file's is (ibm-granite/granite-3.0-2b-base ties it).
PUBLISHED = {
    # ibm-granite/granite-3.0-2b-base
    "granite": {"architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_dropout": 0.1,
                "attention_multiplier": 0.015625, "bos_token_id": 1, "embedding_multiplier": 12.0, "eos_token_id": 2,
                "hidden_act": "silu", "logits_scaling": 8.0, "mlp_bias": False, "model_type": "granite",
                "pad_token_id": 0, "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None,
                "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "transformers_version": "4.46.0.dev0", "use_cache": True, **TINY},
    # HuggingFaceTB/SmolLM3-3B: Qwen2-era keys it never reads (max_window_layers), LLaMA's pretraining_tp
    "smollm3": {"architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                "bos_token_id": None, "eos_token_id": 2, "hidden_act": "silu",
                "layer_types": ["full_attention", "full_attention"], "max_window_layers": 28, "mlp_bias": False,
                "model_type": "smollm3", "no_rope_layer_interval": 4, "no_rope_layers": [1, 0], "pad_token_id": 0,
                "pretraining_tp": 2, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 5000000.0,
                "sliding_window": None, "torch_dtype": "bfloat16", "transformers_version": "4.54.0.dev0",
                "use_cache": False, "use_sliding_window": False, **TINY},
    # stabilityai/stablelm-2-12b: per-head q/k LayerNorms, parallel residual, the top-level partial_rotary_factor
    "stablelm-12b": {"architectures": ["StableLmForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
                     "eos_token_id": 2, "hidden_act": "silu", "hidden_dropout": 0.0, "layer_norm_eps": 1e-05,
                     "model_type": "stablelm", "partial_rotary_factor": 0.25, "qk_layernorm": True,
                     "rope_scaling": None, "rope_theta": 10000, "tie_word_embeddings": False,
                     "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0", "use_cache": True,
                     "use_parallel_residual": True, "use_qkv_bias": False, **TINY},
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_published_file_reads_as_its_transformers_5_form_andmatches_transformers(name, checkpoints, tmp_path):
    cfg = read(PUBLISHED[name])
    assert read(as_transformers_writes_it(PUBLISHED[name])).replace(name=cfg.name) == cfg
    matches_transformers(rewritten(checkpoints(name), tmp_path / "published", PUBLISHED[name]))


def test_what_the_published_files_say():
    granite, smollm3, stablelm = (read(PUBLISHED[name]) for name in ("granite", "smollm3", "stablelm-12b"))
    assert (granite.embeddings.multiplier, granite.residual_multiplier, granite.scale, granite.logits.divisor) == \
        (12.0, 0.22, 0.015625, 8.0)
    assert (smollm3.nope.layers, smollm3.attention, smollm3.rotary.theta) == ((1,), "causal", 5e6)
    assert (stablelm.norms.kind, stablelm.rope_dim, stablelm.query_key_norm.span, stablelm.biases.qkv) == \
        ("layernorm", 2, "each_head", False)
    assert stablelm.parallel.shared_norm and not stablelm.biases.out


def test_smollm3_windows_follow_layer_types_and_use_sliding_window(checkpoints, tmp_path):
    """A window on the NoPE layers by default when use_sliding_window says so; on the layers layer_types names
    whatever use_sliding_window says (transformers' masks follow layer_types)."""
    published = {**PUBLISHED["smollm3"], "layer_types": None, "sliding_window": 4}
    assert read(published).attention == "causal"
    by_default = read({**published, "use_sliding_window": True})
    assert (by_default.attention, by_default.layer_types, by_default.window_size) == \
        ("alternating", ("full", "sliding"), 4)
    named = {**published, "layer_types": ["sliding_attention", "full_attention"]}
    assert read(named).layer_types == ("sliding", "full")
    matches_transformers(rewritten(checkpoints("smollm3"), tmp_path / "named", named), length=12)


@pytest.mark.parametrize("name, changes, message", [
    ("granite", {"mlp_bias": True}, "granite: mlp_bias=True"),
    ("granite", {"logits_scaling": 0.0}, "logits_divisor=0.0 must be a finite number > 0"),
    ("smollm3", {"mlp_bias": True}, "smollm3: mlp_bias=True"),
    ("smollm3", {"layer_types": ["sliding_attention", "full_attention"]}, "sliding_window is null"),
    ("smollm3", {"no_rope_layers": [1, 0, 1]}, "no_rope_layers has 3 entries for 2 layers"),
    ("stablelm-12b", {"head_dim": 16}, "stablelm: head_dim=16 is not supported"),
    ("stablelm-12b", {"partial_rotary_factor": 0.375}, "partial_rotary_factor=0.375 gives 3 rotating numbers"),
    ("stablelm-12b", {"partial_rotary_factor": 0.1}, "they must be even and > 0"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(name, changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED[name], **changes})


@pytest.mark.parametrize("name, window", [("granite", None), ("smollm3", 4), ("stablelm-12b", None)])
def test_generation_is_token_identical_to_transformers(name, window, checkpoints, tmp_path):
    """Left-padded prompts of 7 and 10 new tokens; SmolLM3's NoPE layer slides over a window of 4."""
    folder = checkpoints(name)
    if window is not None:
        folder = rewritten(folder, tmp_path / "windowed", {**PUBLISHED[name], "use_sliding_window": True,
                                                           "sliding_window": window, "layer_types": None})
    generates_as_transformers(folder)


# Granite's tiny file divides its logits by 4 and halves each residual branch: its adapters move the loss
# more slowly, so they learn at a higher rate
@pytest.mark.parametrize("name, lr", [("granite", 8e-2), ("smollm3", 2e-2), ("stablelm-12b", 2e-2)])
def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(name, lr, checkpoints, tmp_path):
    qlora_loss_falls(checkpoints(name), tmp_path, f"optim.lr={lr}")
