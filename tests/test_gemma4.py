"""Gemma 4's text model (``gemma4_text``, and the text model of a multimodal ``gemma4`` file) as transformers
computes it: what a file says reads as the settings it means, what jaxformer cannot honour yet is refused by name,
the 26B A4B's multimodal file loads its text model with the experts beside each MLP (its towers skipped with a note
naming them), greedy and beam generation with left padding are token-identical, and a QLoRA fine-tune starts from
the file and learns (both on the tiny checkpoint with experts, which has every other setting of the dense one too).
Parity of every layer and the bit-exact round trip of the tiny checkpoints ('gemma4', 'gemma4-moe') are in
test_hf_parity.py, every key changed one at a time in test_config_keys.py ('gemma4-moe'), cache == no cache
(per-layer inputs, value norms, layer scalars, proportional rotary, shared keys and values, the experts) in
test_generate.py."""

from __future__ import annotations

import copy
import json
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402

import numpy as np  # noqa: E402
from family_files import as_transformers_writes_it, generates_as_transformers, qlora_loss_falls, read  # noqa: E402
from jaxformer.compare import compare, format_table  # noqa: E402

# The text_config of google/gemma-4-E2B's config.json as third-party code copies it (not checked against the hub),
# sizes made tiny (two periods of its four sliding layers and a full one, the last five sharing keys and values)
TEXT = {"model_type": "gemma4_text", "hidden_size": 32, "num_hidden_layers": 10, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 8, "global_head_dim": 16, "num_global_key_value_heads": None,
        "attention_k_eq_v": False, "sliding_window": 4, "vocab_size": 97, "vocab_size_per_layer_input": 97,
        "hidden_size_per_layer_input": 16, "num_kv_shared_layers": 5, "use_double_wide_mlp": True,
        "intermediate_size": 48, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0, "pad_token_id": 0,
        "bos_token_id": 2, "eos_token_id": 1, "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 2,
        "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                               "rope_type": "proportional"},
                            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        "architectures": ["Gemma4ForCausalLM"]}


def test_what_a_file_says():
    cfg = read(TEXT)
    assert cfg.layer_types == (("sliding",) * 4 + ("full",)) * 2 and cfg.window_size == 4
    s = cfg.scores  # the full layers' own 16-wide heads; layers 5-9 read layers 3 and 4, their MLP twice as wide
    assert (s.full_head_dim, s.full_kv_heads, s.full_keys_as_values, s.kv_shared_layers, s.kv_shared_d_ff) == \
        (16, None, False, 5, 96)
    # the 31B's form: full layers' values are their keys, with kv heads of their own; transformers 5's form
    assert read({**TEXT, "attention_k_eq_v": True, "num_global_key_value_heads": 2}).scores.full_kv_heads == 2
    five = read({k: v for k, v in {**TEXT, "per_layer_config": {"4": {"head_dim": 32}, "9": {"head_dim": 32}},
                                   "global_head_dim": 64}.items()})
    assert five.scores.full_head_dim == 32  # (per_layer_config wins over global_head_dim, as in transformers)
    assert read({k: v for k, v in TEXT.items() if k != "global_head_dim"}).scores.full_head_dim == 512
    assert (cfg.rotary.theta, cfg.rotary.proportion, cfg.rotary.local_theta) == (1e6, 0.25, 1e4)
    assert (cfg.norms.scale_offset, cfg.scale, cfg.query_key_norm.values, cfg.layer_output_scale) == \
        (0.0, 1.0, True, True)
    assert (cfg.embeddings.per_layer_width, cfg.embeddings.per_layer_vocab, cfg.logits.softcap) == (16, 0, 30.0)
    # the class's own layout: every sixth layer full, the last forced to full as transformers forces it
    assert read({**TEXT, "layer_types": None, "num_hidden_layers": 4, "num_kv_shared_layers": 0}).layer_types == \
        ("sliding",) * 3 + ("full",)
    # third-party copies carry a sliding_window_pattern, which Gemma4TextConfig never reads (its period is six)
    assert read({**TEXT, "layer_types": None, "sliding_window_pattern": 5, "num_kv_shared_layers": 0}).layer_types == \
        ("sliding",) * 5 + ("full",) + ("sliding",) * 3 + ("full",)
    # no per-layer inputs (the 31B's hidden_size_per_layer_input 0); 'vision' bidirectionality reads text causally
    plain = read({**TEXT, "hidden_size_per_layer_input": 0, "use_bidirectional_attention": "vision"})
    assert plain.embeddings.per_layer_width == 0 and plain.attention == "alternating"


@pytest.mark.parametrize("changes, named", [
    ({"per_layer_config": {"0": {"head_dim": 16}}}, "per_layer_config"),  # a sliding layer's own shape
    ({"per_layer_config": {"4": {"head_dim": 16}, "9": {"head_dim": 32}}}, "full layers' attention shapes"),
    ({"per_layer_config": {"4": {"intermediate_size": 16}}}, "per_layer_config"),
    ({"attention_k_eq_v": True, "layer_types": ["full_attention"] * 10}, "attention_k_eq_v"),
    ({"num_kv_shared_layers": 10}, "num_kv_shared_layers"),
    ({"num_kv_shared_layers": 6}, "kv_shared_layers"),  # layer 4, the only earlier full one, shares too
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2}, "moe_intermediate_size"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
])
def test_what_jaxformer_cannot_honour_is_refused_by_name(changes, named):
    hf = {**TEXT, **changes}
    with pytest.raises(ValueError, match=named):
        read(hf)


# google/gemma-4-26B-A4B-it's config.json as a re-release copies it (third-party, not checked against the hub; the
# copy's quantization_config, the re-release's own, left out; its vision_config cut there, a tiny one here), every
# key kept, sizes made tiny: a sliding and a full layer, 4 experts 8 wide beside each 48-wide MLP, 2 a token
MOE_TEXT = {"attention_bias": False, "attention_dropout": 0.0, "attention_k_eq_v": True, "bos_token_id": 2,
            "dtype": "bfloat16", "enable_moe_block": True, "eos_token_id": 1, "final_logit_softcapping": 30.0,
            "global_head_dim": 16, "head_dim": 8, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 32,
            "hidden_size_per_layer_input": 0, "initializer_range": 0.2, "intermediate_size": 48,
            "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 64,
            "model_type": "gemma4_text", "moe_intermediate_size": 8, "num_attention_heads": 4, "num_experts": 4,
            "num_global_key_value_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 4,
            "num_kv_shared_layers": 0, "pad_token_id": 0, "rms_norm_eps": 1e-06,
            "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                                   "rope_type": "proportional"},
                                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
            "sliding_window": 4, "tie_word_embeddings": True, "top_k_experts": 2,
            "use_bidirectional_attention": "vision", "use_cache": True, "use_double_wide_mlp": False,
            "vocab_size": 97, "vocab_size_per_layer_input": 97}
MOE_FILE = {"architectures": ["Gemma4ForConditionalGeneration"], "audio_config": None, "audio_token_id": 258881,
            "boa_token_id": 256000, "boi_token_id": 255999, "dtype": "bfloat16", "eoa_token_id": 258883,
            "eoa_token_index": 258883, "eoi_token_id": 258882, "eos_token_id": [1, 106], "image_token_id": 258880,
            "initializer_range": 0.02, "model_type": "gemma4", "text_config": MOE_TEXT, "tie_word_embeddings": True,
            "transformers_version": "5.5.0", "video_token_id": 258884,
            "vision_config": {"model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 32,
                              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                              "head_dim": 8},
            "vision_soft_tokens_per_image": 280}


def test_the_26b_a4b_file_loads_its_text_model_with_the_experts_and_names_the_towers_it_skips(tmp_path):
    """Gemma4ForConditionalGeneration saved by transformers under the published config.json: the experts beside
    each MLP read as the 26B A4B's settings, the towers skipped with a note, the logits transformers'; the file
    and its transformers-5 form read alike; written back as the text model alone."""
    torch.manual_seed(0)
    config = transformers.Gemma4Config.from_dict(copy.deepcopy(MOE_FILE))
    transformers.Gemma4ForConditionalGeneration(config).eval().save_pretrained(str(tmp_path / "file"))
    (tmp_path / "file" / "config.json").write_text(json.dumps(MOE_FILE))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = jf.from_pretrained(tmp_path / "file")
    notes = [str(w.message) for w in caught if "towers" in str(w.message)]
    assert notes and "vision_tower" in notes[0] and "issues 51 and 52" in notes[0], notes
    e = model.config.experts
    assert (e.count, e.per_token, e.d_ff, e.router_score, e.normalize_weights, e.router_norm, e.expert_scale,
            e.beside_dense, e.shared) == (4, 2, 8, "softmax", True, True, True, True, 0)
    assert (model.config.scores.full_kv_heads, model.config.embeddings.per_layer_width) == (2, 0)
    assert read(as_transformers_writes_it(MOE_FILE)).replace(name=model.config.name) == model.config
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 97, size=(2, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    rows = compare(tmp_path / "file", ids, mask)
    assert all(r.max_abs <= 1e-5 for r in rows), format_table(rows, 1e-5)
    model.save_pretrained(tmp_path / "text")  # written back as the text model alone
    assert transformers.AutoConfig.from_pretrained(tmp_path / "text").model_type == "gemma4_text"


def test_generates_as_transformers(checkpoints):
    generates_as_transformers(checkpoints("gemma4-moe"))


def test_qlora_fine_tune_from_the_file_learns(checkpoints, tmp_path):
    qlora_loss_falls(checkpoints("gemma4-moe"), tmp_path / "run", "optim.lr=6e-2")  # (logits soft-capped at 3: slower)
