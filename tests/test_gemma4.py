"""Gemma 4's text model (``gemma4_text``, and the text model of a multimodal ``gemma4`` file) as transformers
computes it: what a file says reads as the settings it means, what jaxformer cannot honour yet is refused by name,
the multimodal file's towers are skipped with a note naming them, greedy and beam generation with left padding are
token-identical, and a QLoRA fine-tune starts from the file and learns. Parity of every layer and the bit-exact
round trip of both tiny checkpoints are in test_hf_parity.py, every key changed one at a time in
test_config_keys.py, cache == no cache (per-layer inputs, value norms, layer scalars, proportional rotary) in
test_generate.py."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402

import hf_factory  # noqa: E402
import numpy as np  # noqa: E402
from family_files import generates_as_transformers, qlora_loss_falls, read  # noqa: E402
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
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 8},
     "enable_moe_block"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
])
def test_what_jaxformer_cannot_honour_is_refused_by_name(changes, named):
    hf = {**TEXT, **changes}
    with pytest.raises(ValueError, match=named):
        read(hf)


def test_a_multimodal_file_loads_its_text_model_and_names_the_towers_it_skips(tmp_path):
    """Gemma4ForConditionalGeneration: the tiny text model beside a one-layer vision tower."""
    text = {k: v for k, v in hf_factory.CHECKPOINTS["gemma4"][2].items() if k != "attn_implementation"}
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 2, "head_dim": 8}
    torch.manual_seed(0)
    config = transformers.Gemma4Config(text_config=text, vision_config=vision, attn_implementation="eager")
    transformers.Gemma4ForConditionalGeneration(config).eval().save_pretrained(str(tmp_path / "file"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = jf.from_pretrained(tmp_path / "file")
    notes = [str(w.message) for w in caught if "towers" in str(w.message)]
    assert notes and "vision_tower" in notes[0] and "issues 51 and 52" in notes[0], notes
    assert model.config.embeddings.per_layer_width == 32
    # (every layer of the same text model is held to 1e-5 by test_hf_parity.py's 'gemma4'; this file's draw of
    # weights leaves transformers' own float32 about 1e-5 from its float64 inside, so the logits are checked here)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 97, size=(2, 9))
    logits = [r for r in compare(tmp_path / "file", ids, np.ones_like(ids)) if r.name == "logits"]
    assert logits and logits[0].max_abs <= 1e-5, format_table(logits, 1e-5)
    model.save_pretrained(tmp_path / "text")  # written back as the text model alone
    assert transformers.AutoConfig.from_pretrained(tmp_path / "text").model_type == "gemma4_text"


def test_generates_as_transformers(checkpoints):
    generates_as_transformers(checkpoints("gemma4"))


def test_qlora_fine_tune_from_the_file_learns(checkpoints, tmp_path):
    qlora_loss_falls(checkpoints("gemma4"), tmp_path / "run", "optim.lr=6e-2")  # (logits soft-capped at 3: slower)
