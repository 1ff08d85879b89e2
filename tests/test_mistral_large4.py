"""Mistral Large 4 (``mistral_large4_text``, and the text model of ``mistral_large4`` files) as transformers computes
it: the text file as published (its NoPE layers from ``no_rope_layer_interval``) reads as its transformers-5 form and
matches transformers' numbers; the wrapper, saved by transformers with a tiny Pixtral tower in Mistral's own tensor
names (as published and as transformers writes it by default) and in its modules' names, loads its text model with a
note and matches transformers' every layer and softcapped logits; the settings jaxformer cannot honour are refused by
name, and an LM-headed model is not written (only the wrapper has a head, and a wrapper is never written); greedy and
beam generation with left padding are token-identical; a QLoRA fine-tune starts from the wrapper and learns. Parity
of every layer and the bit-exact round trip of the tiny text checkpoint are in test_hf_parity.py, every key changed
one at a time in test_config_keys.py, the preset's count against transformers' in test_presets.py, the log-position
query scales across cached steps in test_generate.py's CACHE_CASES."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.interop.files import TensorFiles  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402

from family_files import (as_transformers_writes_it, generates_as_transformers, matches_transformers,  # noqa: E402
                          qlora_loss_falls, read, rewritten)
from hf_factory import CHECKPOINTS, build_reference  # noqa: E402

# MistralLarge4TextConfig's keys as mistralai/Mistral-Large-4-1T-A52B's text_config gives them (transformers' class
# defaults, which its docs name as that checkpoint's; the hub file itself could not be read here), sizes and token
# ids those of the tiny checkpoint: 5 layers of 32 (the fourth NoPE, by the interval of 4), 8 experts in 4 groups (top
# 3 of 2 groups), 8 indexer heads of 12 keeping 4 keys, yarn 16 over 4 positions (the published: 72 layers of 6144,
# 128 experts, top 4, 32 indexer heads of 128 keeping 2048, yarn 2048 over 512)
PUBLISHED = {"architectures": ["MistralLarge4TextModel"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": 1, "eos_token_id": 2, "final_logit_softcapping": 30.0, "first_k_dense_replace": 1,
             "head_dim": 8, "hidden_act": "silu", "hidden_size": 32, "index_head_dim": 12, "index_n_heads": 8,
             "index_topk": 4, "initializer_range": 0.02, "intermediate_size": 48, "kv_lora_rank": 12,
             "max_position_embeddings": 64, "model_type": "mistral_large4_text", "moe_intermediate_size": 16,
             "n_group": 4, "n_routed_experts": 8, "n_shared_experts": 1, "no_rope_layer_interval": 4,
             "num_attention_heads": 4, "num_experts_per_tok": 3, "num_hidden_layers": 5, "num_key_value_heads": 4,
             "pad_token_id": 0, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-05,
             "rope_parameters": {"attention_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0,
                                 "original_max_position_embeddings": 4, "rope_theta": 10000.0, "rope_type": "yarn"},
             "routed_scaling_factor": 1.5, "tie_word_embeddings": False, "topk_group": 2,
             "transformers_version": "5.20.0", "v_head_dim": 12, "vocab_size": 97}
VISION = dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              head_dim=8, image_size=32, patch_size=4)
NOTE = "tensors of the vision tower, its projector or the draft head are not used by jaxformer"


def test_the_published_text_file_reads_as_its_transformers_5_form_and_matches_transformers(checkpoints, tmp_path):
    cfg = read(PUBLISHED)
    assert read(as_transformers_writes_it(PUBLISHED)).replace(name=cfg.name) == cfg
    assert cfg.nope.layers == (3,) and cfg.latent.q_rank is None and cfg.latent.query_log_position_scale
    assert (cfg.indexer.query_from_input, cfg.indexer.rope_interleave, cfg.rotary.learned_frequencies) == \
        (True, True, True)
    assert (cfg.experts.router_score, cfg.experts.group_score, cfg.experts.dense_layers, cfg.logits.softcap) == \
        ("softmax", "best_two", 1, 30.0)
    # 9 tokens against a top-4 choice, positions past yarn's 4, a NoPE layer between rotary ones
    matches_transformers(rewritten(checkpoints("mistral_large4"), tmp_path / "published", PUBLISHED))


@pytest.mark.parametrize("changes, message", [
    ({"kv_source_layers": [0, 0, 2, 3, 4]}, r"kv_source_layers make layers \[1\] read an earlier layer's"),
    ({"indexer_types": ["full", "full", "shared", "full", "full"]}, r"indexer_types make layers \[2\] 'shared'"),
    ({"index_topk_freq": 2}, r"indexer_types make layers \[2, 4\] 'shared'"),
    ({"no_rope_layers": [0, 1, 1, 1, 1]}, r"no_rope_layers make dense layers \[0\] NoPE layers"),
    ({"num_key_value_heads": 2}, "num_key_value_heads=2 differs from num_attention_heads=4"),
    ({"mlp_layer_types": ["sparse", "dense", "sparse", "sparse", "sparse"]}, "dense layers first"),
    ({"kv_source_layers": [0, 1, 2]}, "kv_source_layers has 3 entries for 5 layers"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED, **changes})


@pytest.mark.parametrize("changes", [
    {"no_rope_layers": [1, 1, 1, 0, 1], "no_rope_layer_interval": 2},  # the list wins; the interval is unread
    {"num_experts": 8},  # the config class's old spelling of n_routed_experts, beside it
    {"norm_topk_prob": False, "mlp_bias": True},  # removed from its class; its modeling code reads neither
    {"rope_parameters": None, "rope_scaling": PUBLISHED["rope_parameters"]},  # the legacy spelling beside a null
])
def test_a_key_that_changes_nothing_loads(changes):
    assert read({**PUBLISHED, **changes}).replace(name="x") == read(PUBLISHED).replace(name="x")


@pytest.fixture(scope="module")
def wrappers(tmp_path_factory):
    """The tiny text checkpoint's weights in MistralLarge4ForConditionalGeneration with a tiny Pixtral tower and its
    own head, saved as transformers saves it by default (Mistral's names) and in its modules' names."""
    root = tmp_path_factory.mktemp("mistral_large4")
    text = build_reference("mistral_large4")
    kwargs = {k: v for k, v in CHECKPOINTS["mistral_large4"][2].items() if k != "attn_implementation"}
    config = transformers.MistralLarge4Config(text_config=kwargs, vision_config=VISION)
    torch.manual_seed(1)
    model = transformers.MistralLarge4ForConditionalGeneration(config).eval()
    model.model.language_model.load_state_dict(text.state_dict())
    with torch.no_grad():  # logits of a few units: the softcap of 30 bends them visibly
        model.lm_head.weight.normal_(0, 0.5)
    out = {}
    for layout, original in (("published", True), ("modules", False)):
        model.save_pretrained(root / layout, save_original_format=original)
        out[layout] = root / layout
    return out


@pytest.mark.parametrize("layout", ["published", "modules"])
def test_the_wrappers_text_model_loads_with_a_note_and_matches_transformers(layout, wrappers, tmp_path):
    folder = wrappers[layout]
    mistral_names = {"tok_embeddings.weight", "lerope.alpha", "output.weight", "layers.3.attention.wo.weight",
                     "layers.1.experts.0.w1.weight"}  # as the published file has them
    assert (mistral_names <= set(TensorFiles(folder).names)) == (layout == "published")
    with pytest.warns(UserWarning, match=NOTE):
        model = jf.from_pretrained(folder)
    assert model.config.head == "lm" and model.config.logits.softcap == 30.0
    # every layer and the softcapped logits; 3e-5, not 1e-5: the head's weights (std 0.5) give logits of ten and more
    # units so that the softcap bends them, where float32 keeps 1e-6, and the two libraries' reduction orders through
    # five layers reach 1.4e-5 on an AVX-512 Xeon (under 1e-5 on the machine this test was written on)
    matches_transformers(folder, tolerance=3e-5)
    with pytest.raises(ValueError, match="has no Hugging Face architecture"):
        jf.save_pretrained(model, tmp_path / "out")


def test_generation_is_token_identical_to_transformers(wrappers):
    generates_as_transformers(wrappers["published"])


def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(wrappers, tmp_path):
    qlora_loss_falls(wrappers["published"], tmp_path)
