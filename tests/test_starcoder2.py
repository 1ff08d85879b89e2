"""StarCoder2 (``starcoder2``) as transformers computes it: files as published (StarCoder2-15B's keys, legacy rope
keys) read as their transformers-5 form and match transformers' numbers; settings jaxformer cannot honour are
refused by name; greedy and beam generation are token-identical; a QLoRA fine-tune starts from the file and
learns; the presets have transformers' parameter counts and export as StarCoder2. Parity of every layer and the
bit-exact round trip of the tiny checkpoints (``starcoder2``: biases, window of 4; ``starcoder2-base``: no biases,
explicit head_dim, linear rope) are in test_hf_parity.py, every key changed one at a time in test_config_keys.py."""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.interop.registry import hf_target  # noqa: E402

from family_files import (generates_as_transformers, matches_transformers, qlora_loss_falls, read,  # noqa: E402
                          rewritten)
from hf_reference import hf_param_count  # noqa: E402

# bigcode/starcoder2-15b's config.json, every key kept (its rms_norm_eps and layer_norm keys, which transformers'
# Starcoder2 never reads for its LayerNorms), sizes those of the tiny checkpoint, token ids inside its vocabulary
PUBLISHED_15B = {"_name_or_path": "/aot/checkpoints/15b/config.json", "architectures": ["Starcoder2ForCausalLM"],
                 "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu_pytorch_tanh",
                 "hidden_size": 32, "initializer_range": 0.01275, "intermediate_size": 48,
                 "max_position_embeddings": 64, "mlp_type": "default", "model_type": "starcoder2",
                 "norm_epsilon": 1e-05, "norm_type": "layer_norm", "num_attention_heads": 4, "num_hidden_layers": 2,
                 "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "rope_theta": 100000, "sliding_window": 4,
                 "tie_word_embeddings": True, "torch_dtype": "float32", "transformers_version": "4.37.0.dev0",
                 "use_bias": True, "use_cache": True, "vocab_size": 97}


def _as_transformers_writes_it(hf: dict) -> dict:
    return json.loads(transformers.Starcoder2Config.from_dict(copy.deepcopy(hf)).to_json_string(use_diff=False))


def test_the_published_file_reads_as_its_transformers_5_form_andmatches_transformers(checkpoints, tmp_path):
    cfg = read(PUBLISHED_15B)
    assert (cfg.norms.kind, cfg.norms.eps, cfg.activation, cfg.attention, cfg.window_size) == \
        ("layernorm", 1e-5, "gelu_tanh", "sliding", 4)
    assert (cfg.rotary.theta, cfg.num_kv_heads, cfg.biases.qkv, cfg.biases.out, cfg.biases.mlp) == \
        (1e5, 2, True, True, True)
    assert read(_as_transformers_writes_it(PUBLISHED_15B)).replace(name=cfg.name) == cfg
    matches_transformers(rewritten(checkpoints("starcoder2"), tmp_path / "published", PUBLISHED_15B))


def test_legacy_rope_keys_read_as_rope_parameters(checkpoints, tmp_path):
    """rope_theta beside a rope_scaling of the older spelling ('type'), as transformers 4 wrote them."""
    source = checkpoints("starcoder2-base")
    modern = json.loads((source / "config.json").read_text())
    legacy = {key: value for key, value in modern.items() if key != "rope_parameters"}
    rope = modern["rope_parameters"]
    legacy.update(rope_theta=rope["rope_theta"], rope_scaling={"type": "linear", "factor": rope["factor"]})
    assert read(legacy) == read(modern) and read(legacy).rotary.scaling.factor == 2.0
    matches_transformers(rewritten(source, tmp_path / "legacy", legacy), length=20)


def test_no_window_is_causal_and_keys_left_out_take_the_class_defaults():
    sizes = dict(model_type="starcoder2", vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4)
    cfg = read(sizes)
    assert (cfg.attention, cfg.window_size, cfg.num_kv_heads, cfg.max_positions, cfg.embeddings.tie) == \
        ("causal", None, 2, 4096, True)
    assert (cfg.rotary.theta, cfg.init_std, cfg.activation) == (10000.0, 0.018042, "gelu_tanh")


@pytest.mark.parametrize("changes, message", [
    ({"hidden_act": "mish"}, "activation 'mish' is not supported"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5"),
    ({"rope_parameters": {"rope_type": "su", "rope_theta": 1e4}}, "rope type 'su' is not supported"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED_15B, **changes})


def test_keys_transformers_never_reads_load_at_any_value():
    """LLaMA's attention_bias and mlp_bias (Starcoder2 reads use_bias), the published norm_type: nothing of
    transformers' Starcoder2 reads them, so no value of theirs changes a number."""
    changed = {**PUBLISHED_15B, "attention_bias": False, "mlp_bias": True, "norm_type": "rms_norm",
               "rms_norm_eps": 0.5}
    assert read(changed) == read(PUBLISHED_15B)


def test_generation_is_token_identical_to_transformers(checkpoints):
    """Left-padded prompts of 7 and 10 new tokens: past the window of 4, so the ring cache is what decodes."""
    generates_as_transformers(checkpoints("starcoder2"))


PRESETS = ["starcoder2-3b", "starcoder2-7b", "starcoder2-15b"]


@pytest.mark.parametrize("name", PRESETS)
def test_presets_count_as_transformers_and_export_as_starcoder2(name):
    assert jf.param_count(name) == hf_param_count(name)
    assert hf_target(jf.config(name)) == ("starcoder2", "Starcoder2ForCausalLM")


def test_the_published_counts():
    """3.03B, 7.17B (heads tied to the embeddings) and 15.96B (its own head), as the model cards give them."""
    assert [jf.param_count(name) for name in PRESETS] == [3_030_371_328, 7_173_923_840, 15_957_889_024]



def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(checkpoints, tmp_path):
    qlora_loss_falls(checkpoints('starcoder2'), tmp_path)
