"""OLMo-2 (``olmo2``) as transformers computes it: files as published (OLMo-2-1124-7B's keys, legacy rope keys) read
as their transformers-5 form and match transformers' numbers; settings jaxformer cannot honour are refused by
name; greedy and beam generation are token-identical; a QLoRA fine-tune starts from the file and learns; the
presets have transformers' parameter counts and export as OLMo-2. Parity of every layer and the bit-exact round
trip of the tiny checkpoints (``olmo2``: GQA; ``olmo2-base``: attention biases, explicit head_dim, llama3 rope)
are in test_hf_parity.py, every key changed one at a time in test_config_keys.py."""

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

# allenai/OLMo-2-1124-7B's config.json, every key kept (the legacy rope_theta beside a null rope_scaling), sizes
# those of the tiny checkpoint, token ids inside its vocabulary
PUBLISHED_7B = {"architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
                "intermediate_size": 48, "max_position_embeddings": 64, "model_type": "olmo2",
                "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": 0,
                "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False,
                "torch_dtype": "float32", "transformers_version": "4.47.0.dev0", "use_cache": True, "vocab_size": 97}


def _as_transformers_writes_it(hf: dict) -> dict:
    return json.loads(transformers.Olmo2Config.from_dict(copy.deepcopy(hf)).to_json_string(use_diff=False))


def test_the_published_file_reads_as_its_transformers_5_form_andmatches_transformers(checkpoints, tmp_path):
    cfg = read(PUBLISHED_7B)
    assert (cfg.norms.kind, cfg.norms.position, cfg.query_key_norm.span, cfg.activation) == \
        ("rmsnorm", "output", "projection", "swiglu")
    assert (cfg.rotary.theta, cfg.rotary.scaling, cfg.norms.eps, cfg.biases.qkv, cfg.embeddings.tie) == \
        (500000.0, None, 1e-6, False, False)
    assert read(_as_transformers_writes_it(PUBLISHED_7B)).replace(name=cfg.name) == cfg
    matches_transformers(rewritten(checkpoints("olmo2"), tmp_path / "published", PUBLISHED_7B))


def test_legacy_rope_keys_read_as_rope_parameters(checkpoints, tmp_path):
    """rope_theta beside a rope_scaling dict, as transformers 4 wrote them, on a llama3-extended model."""
    source = checkpoints("olmo2-base")
    modern = json.loads((source / "config.json").read_text())
    legacy = {key: value for key, value in modern.items() if key != "rope_parameters"}
    rope = dict(modern["rope_parameters"])
    legacy.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope)
    assert read(legacy) == read(modern) and read(legacy).rotary.scaling.kind == "llama3"
    matches_transformers(rewritten(source, tmp_path / "legacy", legacy), length=20)


def test_keys_left_out_take_the_class_defaults():
    sizes = dict(model_type="olmo2", vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4)
    cfg = read(sizes)
    assert (cfg.num_kv_heads, cfg.max_positions, cfg.norms.eps, cfg.rotary.theta, cfg.embeddings.tie) == \
        (4, 2048, 1e-5, 10000.0, False)


@pytest.mark.parametrize("changes, message", [
    ({"hidden_act": "gelu"}, "activation 'gelu' \\(gated\\) is not supported"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5"),
    ({"rope_scaling": {"rope_type": "su"}}, "rope type 'su' is not supported"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED_7B, **changes})


def test_keys_transformers_never_reads_load_at_any_value():
    """OLMo's clip_qkv and a use_bias: nothing of transformers' Olmo2 reads them, so no value changes a number."""
    assert read({**PUBLISHED_7B, "clip_qkv": 8.0, "use_bias": True}) == read(PUBLISHED_7B)


def test_generation_is_token_identical_to_transformers(checkpoints):
    generates_as_transformers(checkpoints("olmo2"))


@pytest.mark.parametrize("name", ["olmo-2-1b", "olmo-2-7b"])
def test_presets_count_as_transformers_and_export_as_olmo2(name):
    assert jf.param_count(name) == hf_param_count(name)
    assert hf_target(jf.config(name)) == ("olmo2", "Olmo2ForCausalLM")



def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(checkpoints, tmp_path):
    qlora_loss_falls(checkpoints('olmo2'), tmp_path)
