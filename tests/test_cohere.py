"""Cohere's Command R (``cohere``: a parallel block under one bias-free LayerNorm, adjacent rotary pairs, scaled
logits, Command R+'s per-head q/k norms) and Command R7B (``cohere2``: sliding layers that rotate, NoPE layers in
full) as transformers computes them: files as published read as their transformers-5 form and match transformers'
numbers; settings jaxformer cannot honour are refused by name; the logit scale is applied exactly as torch applies
it; greedy and beam generation with left padding are token-identical; a QLoRA fine-tune starts from each file and
learns. Parity of every layer and the bit-exact round trip of the tiny checkpoints are in test_hf_parity.py, every
key changed one at a time in test_config_keys.py, the presets' counts against transformers' in test_presets.py,
cache == no cache in test_generate.py."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402

from family_files import (TINY, as_transformers_writes_it, generates_as_transformers,  # noqa: E402
                          matches_transformers, qlora_loss_falls, read, rewritten)

# The published config.json files, every key kept, sizes those of the tiny checkpoints (token ids as published,
# outside the tiny vocabulary). Command R's and R+'s carry the tokenizer's model_max_length, R7B's the keys of
# Cohere's own code that transformers never reads (order_of_interleaved_layers, position_embedding_type, rotary_pct,
# use_embedding_sharing, use_gated_activation) and no layer_types (sliding_window_pattern says them). R+'s head is
# untied here as the tiny file's is (the published one ties it).
PUBLISHED = {
    # CohereForAI/c4ai-command-r-v01
    "cohere": {"architectures": ["CohereForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
               "bos_token_id": 5, "eos_token_id": 255001, "hidden_act": "silu", "layer_norm_eps": 1e-05,
               "logit_scale": 0.0625, "model_max_length": 131072, "model_type": "cohere", "pad_token_id": 0,
               "rope_theta": 8000000.0, "torch_dtype": "float16", "transformers_version": "4.38.2",
               "use_cache": True, **TINY},
    # CohereForAI/c4ai-command-r-plus
    "cohere-qk-norm": {"architectures": ["CohereForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                       "bos_token_id": 5, "eos_token_id": 255001, "hidden_act": "silu", "layer_norm_eps": 1e-05,
                       "logit_scale": 0.8333333333333334, "model_max_length": 131072, "model_type": "cohere",
                       "pad_token_id": 0, "rope_theta": 75000000.0, "tie_word_embeddings": False,
                       "torch_dtype": "float16", "transformers_version": "4.40.0.dev0", "use_cache": True,
                       "use_qk_norm": True, **TINY},
    # CohereForAI/c4ai-command-r7b-12-2024: its 4 layers here one group of sliding_window_pattern
    "cohere2": {"architectures": ["Cohere2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                "bos_token_id": 5, "cache_implementation": "hybrid", "eos_token_id": 255001, "head_dim": 8,
                "hidden_act": "silu", "layer_norm_eps": 1e-05, "logit_scale": 0.25, "model_type": "cohere2",
                "order_of_interleaved_layers": "local_attn_first", "pad_token_id": 0,
                "position_embedding_type": "rope_gptj", "rope_scaling": None, "rope_theta": 50000, "rotary_pct": 1.0,
                "sliding_window": 4096, "sliding_window_pattern": 4, "torch_dtype": "bfloat16",
                "transformers_version": "4.48.0.dev0", "use_cache": True, "use_embedding_sharing": True,
                "use_gated_activation": True, **TINY, "num_hidden_layers": 4},
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_published_file_reads_as_its_transformers_5_form_and_matches_transformers(name, checkpoints, tmp_path):
    cfg = read(PUBLISHED[name])
    assert read(as_transformers_writes_it(PUBLISHED[name])).replace(name=cfg.name) == cfg
    matches_transformers(rewritten(checkpoints(name), tmp_path / "published", PUBLISHED[name]))


def test_what_the_published_files_say():
    command_r, plus, r7b = (read(PUBLISHED[name]) for name in ("cohere", "cohere-qk-norm", "cohere2"))
    for cfg in (command_r, plus, r7b):
        assert (cfg.norms.kind, cfg.norms.bias, cfg.parallel.shared_norm, cfg.rotary.interleave, cfg.rotary.dim,
                cfg.activation, cfg.biases.qkv, cfg.biases.mlp) == ("layernorm", False, True, True, None, "swiglu",
                                                                    False, False)
    assert (command_r.rotary.theta, command_r.logits.multiplier, command_r.embeddings.tie, command_r.attention,
            command_r.query_key_norm) == (8e6, 0.0625, True, "causal", None)
    assert (plus.rotary.theta, plus.logits.multiplier, plus.query_key_norm.span) == (7.5e7, 5 / 6, "each_head")
    assert (r7b.attention, r7b.layer_types, r7b.window_size, r7b.nope.layers, r7b.rotary.theta,
            r7b.logits.multiplier, r7b.query_key_norm) == ("alternating", ("sliding",) * 3 + ("full",), 4096, (3,),
                                                          50000.0, 0.25, None)


def test_command_r7b_layers_follow_layer_types_else_sliding_window_pattern(checkpoints, tmp_path):
    """As Cohere2Config derives them: every sliding_window_pattern-th layer full (NoPE) when a file has no
    layer_types, and layer_types alone when it has (the pattern then changes nothing)."""
    published = PUBLISHED["cohere2"]
    by_pattern = read({**published, "sliding_window_pattern": 2})
    assert (by_pattern.layer_types, by_pattern.nope.layers) == (("sliding", "full") * 2, (1, 3))
    named = {**published, "sliding_window": 4, "sliding_window_pattern": 2,
             "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]}
    cfg = read(named)
    assert (cfg.layer_types, cfg.nope.layers, cfg.window_size) == (("full", "sliding", "sliding", "full"), (0, 3), 4)
    assert read({**named, "sliding_window_pattern": 3}) == cfg
    matches_transformers(rewritten(checkpoints("cohere2"), tmp_path / "named", named), length=12)
    every_layer = read({**published, "layer_types": ["sliding_attention"] * 4})
    assert (every_layer.attention, every_layer.layer_types, every_layer.nope) == ("sliding", None, None)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_logit_scale_multiplies_as_torch_does_and_is_written_back_as_read(dtype, checkpoints, tmp_path):
    """Command R+'s 5 / 6 is no divisor exactly (1.2 in float32 moves a fifth of the logits by a bit): the logits
    are the unscaled ones times the scale, as torch multiplies a tensor by a Python float (in float32, rounded to
    the logits' dtype), and the file's number comes back out unchanged."""
    source = checkpoints("cohere")
    model = jf.from_pretrained(source, dtype=dtype)
    assert model.config.logits.multiplier == 0.8333333333333334
    unscaled = {**json.loads((source / "config.json").read_text()), "logit_scale": 1.0}
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 97, (2, 9)))
    scaled = np.asarray(model(ids).logits.astype(jnp.float32))
    plain = jf.from_pretrained(rewritten(source, tmp_path / "plain", unscaled), dtype=dtype)(ids).logits
    plain = torch.from_numpy(np.asarray(plain.astype(jnp.float32))).to(getattr(torch, dtype))
    np.testing.assert_array_equal(scaled, (plain * 0.8333333333333334).float().numpy())
    assert not np.array_equal(scaled, (plain / 1.2).float().numpy())
    model.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["logit_scale"] == 0.8333333333333334


@pytest.mark.parametrize("name, changes, message", [
    ("cohere", {"logit_scale": None}, "cohere: logit_scale=None is not supported"),
    ("cohere", {"logit_scale": 0.0}, "cohere: logit_scale=0.0 is not supported"),
    ("cohere", {"hidden_act": "gelu"}, "cohere: activation 'gelu' \\(gated\\) is not supported"),
    ("cohere2", {"layer_types": ["sliding_attention", "full_attention"]}, "must give each of the 4 layers"),
    ("cohere2", {"sliding_window": None}, "cohere2: layer_types has sliding_attention layers but sliding_window is"),
    ("cohere2", {"layer_types": ["chunked_attention"] * 4}, "cohere2: layer_types"),
    ("cohere2", {"sliding_window_pattern": 0}, "cohere2: sliding_window_pattern=0 must be a whole number >= 1"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(name, changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED[name], **changes})


@pytest.mark.parametrize("name", ["cohere", "cohere-qk-norm", "cohere2"])
def test_generation_is_token_identical_to_transformers(name, checkpoints):
    """Left-padded prompts of 7 and 10 new tokens; Command R7B's sliding layers see windows of 4."""
    generates_as_transformers(checkpoints(name))


# Command R7B's tiny file quarters its logits: its adapters move the loss more slowly, so they learn at a higher rate
@pytest.mark.parametrize("name, lr", [("cohere", 2e-2), ("cohere2", 8e-2)])
def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(name, lr, checkpoints, tmp_path):
    qlora_loss_falls(checkpoints(name), tmp_path, f"optim.lr={lr}")
