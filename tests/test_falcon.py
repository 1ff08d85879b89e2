"""TII's Falcon (``falcon``: q, k and v in one tensor grouped by kv head; attention and MLP side by side through
one norm or two, or one after the other) as transformers computes it: files as published read as their
transformers-5 form and match transformers' numbers; the three fused layouts are one grouping; settings
jaxformer or transformers cannot run are refused by name; greedy and beam generation with left padding are
token-identical; a QLoRA fine-tune starts from each layout's file and learns; a PEFT adapter on the fused tensor
loads and goes back. Parity of every layer and the
bit-exact round trip of the tiny checkpoints are in test_hf_parity.py, every key changed one at a time in
test_config_keys.py, the presets' counts against transformers' in test_presets.py."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.interop.hf import config_from_hf, config_to_hf  # noqa: E402

from family_files import generates_as_transformers, matches_transformers, qlora_loss_falls, read  # noqa: E402
from hf_factory import build_reference, save_checkpoint  # noqa: E402

_TINY = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=97)
_AUTO_MAP = {"AutoConfig": "configuration_falcon.FalconConfig", "AutoModel": "modeling_falcon.FalconModel",
             "AutoModelForCausalLM": "modeling_falcon.FalconForCausalLM",
             "AutoModelForQuestionAnswering": "modeling_falcon.FalconForQuestionAnswering",
             "AutoModelForSequenceClassification": "modeling_falcon.FalconForSequenceClassification",
             "AutoModelForTokenClassification": "modeling_falcon.FalconForTokenClassification"}
# The published config.json files, every key kept, sizes those of the tiny checkpoints (40B's 8 kv heads: 2).
# Both keep the original RW code's apply_residual_connection_post_layernorm and auto_map, which transformers'
# Falcon never reads.
PUBLISHED = {
    # tiiuae/falcon-7b: one kv head, one norm for attention and MLP side by side
    "falcon-7b": {"alibi": False, "apply_residual_connection_post_layernorm": False,
                  "architectures": ["FalconForCausalLM"], "attention_dropout": 0.0, "auto_map": _AUTO_MAP,
                  "bias": False, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
                  "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon", "multi_query": True,
                  "new_decoder_architecture": False, "parallel_attn": True, "torch_dtype": "bfloat16",
                  "transformers_version": "4.27.4", "use_cache": True, **_TINY},
    # tiiuae/falcon-40b: the new decoder architecture (grouped kv heads, ln_attn and ln_mlp)
    "falcon-40b": {"alibi": False, "apply_residual_connection_post_layernorm": False,
                   "architectures": ["FalconForCausalLM"], "attention_dropout": 0.0, "auto_map": _AUTO_MAP,
                   "bias": False, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
                   "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
                   "new_decoder_architecture": True, "num_kv_heads": 2, "parallel_attn": True,
                   "torch_dtype": "bfloat16", "transformers_version": "4.27.4", "use_cache": True, **_TINY},
}
# The tiny checkpoint of each published file's layout, changed to what the file leaves to the class (a 4x MLP,
# no biases, a tied head, the default rotary base)
TENSORS = {"falcon-7b": ("falcon", {"ffn_hidden_size": None}),
           "falcon-40b": ("falcon-40b", {"ffn_hidden_size": None, "bias": False, "tie_word_embeddings": True,
                                         "rope_parameters": None})}


def _as_transformers_writes_it(hf: dict) -> dict:
    return json.loads(transformers.FalconConfig.from_dict(copy.deepcopy(hf)).to_json_string(use_diff=False))


def _published_checkpoint(name: str, folder):
    tiny, changes = TENSORS[name]
    save_checkpoint(tiny, folder, changes=changes)
    (folder / "config.json").write_text(json.dumps(PUBLISHED[name]))
    return folder


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_published_file_reads_as_its_transformers_5_form_and_matches_transformers(name, tmp_path):
    cfg = read(PUBLISHED[name])
    assert read(_as_transformers_writes_it(PUBLISHED[name])).replace(name=cfg.name) == cfg
    matches_transformers(_published_checkpoint(name, tmp_path / name))


def test_what_the_published_files_say():
    seven, forty = read(PUBLISHED["falcon-7b"]), read(PUBLISHED["falcon-40b"])
    assert (seven.kv_heads, seven.parallel.shared_norm, seven.d_ff, seven.embeddings.tie) == (1, True, 128, True)
    assert (forty.kv_heads, forty.parallel.shared_norm) == (2, False)
    for cfg in (seven, forty):
        assert (cfg.norms.kind, cfg.activation, cfg.rotary.theta, cfg.rope_dim, cfg.max_positions) == \
            ("layernorm", "gelu", 10000.0, 8, 2048)
        assert not (cfg.biases.qkv or cfg.biases.out or cfg.biases.mlp)
        assert (cfg.tokens.bos, cfg.tokens.eos, cfg.dropout_rate, cfg.attention_dropout_rate) == (11, 11, 0.0, 0.0)
    # keys transformers' Falcon never reads load at any value; n_embed, FalconConfig's older name, is hidden_size
    assert read({**PUBLISHED["falcon-7b"], "apply_residual_connection_post_layernorm": True}) == seven
    legacy = {k: v for k, v in PUBLISHED["falcon-7b"].items() if k != "hidden_size"}
    assert read({**legacy, "n_embed": 32}).replace(name=seven.name) == seven
    assert transformers.FalconConfig.from_dict({**legacy, "n_embed": 32}).hidden_size == 32


@pytest.mark.parametrize("layout", [
    {"multi_query": False, "parallel_attn": True},  # [N, 3, H]: N groups of one query, one norm for both branches
    {"new_decoder_architecture": True, "parallel_attn": True, "num_kv_heads": 4,  # the same, grouped
     "num_ln_in_parallel_attn": 1},
    {"multi_query": True, "parallel_attn": False},  # [N + 2, H]: one group, the sublayers one after the other
])
def test_the_three_fused_layouts_are_one_grouping_by_kv_head(layout, tmp_path):
    matches_transformers(save_checkpoint("falcon-sequential-base", tmp_path / "layout", changes=layout))


def test_an_export_keeps_the_layout_its_file_said_and_writes_the_published_ones_otherwise(checkpoints):
    """A model read from a file writes the file's layout keys back when they say the same model; one built here
    writes them as the published files do (7B: multi_query; 40B and 11B: the new decoder architecture)."""
    source = json.loads((checkpoints("falcon-sequential-base") / "config.json").read_text())
    as_new = {**source, "parallel_attn": True, "new_decoder_architecture": True, "num_kv_heads": 4,
              "num_ln_in_parallel_attn": 1}
    kept = config_to_hf(read(as_new), as_new)
    assert (kept["new_decoder_architecture"], kept["num_ln_in_parallel_attn"], kept["num_kv_heads"]) == (True, 1, 4)
    written = config_to_hf(read(as_new))
    assert (written["new_decoder_architecture"], written["multi_query"], written["parallel_attn"]) == \
        (False, False, True)
    keys = ("new_decoder_architecture", "multi_query", "parallel_attn", "num_ln_in_parallel_attn")
    seven, forty = (config_to_hf(read(PUBLISHED[name])) for name in ("falcon-7b", "falcon-40b"))
    assert [seven[k] for k in keys] == [False, True, True, None]
    assert [forty[k] for k in keys] + [forty["num_kv_heads"]] == [True, True, True, 2, 2]
    assert read(forty) == read(PUBLISHED["falcon-40b"]) and read(seven) == read(PUBLISHED["falcon-7b"])


@pytest.mark.parametrize("changes, message", [
    ({"alibi": True}, "falcon: alibi=True .* jaxformer has no ALiBi"),
    ({"activation": "tanh"}, "falcon: activation 'tanh' is not supported"),
    ({"hidden_size": 30}, "falcon: hidden_size=30 is not a multiple of num_attention_heads=4"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "rope settings partial_rotary_factor=0.5 are not supported"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED["falcon-7b"], **changes})


@pytest.mark.parametrize("changes, message", [
    ({"new_decoder_architecture": True, "parallel_attn": False}, "new_decoder_architecture=True with parallel_attn"),
    ({"new_decoder_architecture": True, "num_ln_in_parallel_attn": 3}, "num_ln_in_parallel_attn=3 is not supported"),
    ({"num_ln_in_parallel_attn": 2}, "num_ln_in_parallel_attn=2 needs new_decoder_architecture=True"),
    ({"multi_query": False, "num_kv_heads": 2}, "num_kv_heads=2 with multi_query=False"),
])
def test_a_layout_transformers_cannot_run_is_refused_by_name(changes, message):
    """Each of these builds in transformers and fails in its forward (or cannot build); refused before anything runs."""
    hf = {**PUBLISHED["falcon-7b"], **changes}
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf)
    with pytest.raises(Exception):
        model = transformers.FalconForCausalLM(transformers.FalconConfig.from_dict(copy.deepcopy(hf))).eval()
        with torch.no_grad():
            model(torch.tensor([[3, 4, 5]]))


@pytest.mark.parametrize("name", ["falcon", "falcon-40b"])
def test_generation_is_token_identical_to_transformers(name, checkpoints):
    """7B's layout (one kv head in the cache) and 40B's (two): left-padded prompts of 7, 10 new tokens."""
    generates_as_transformers(checkpoints(name))


@pytest.mark.parametrize("name", ["falcon", "falcon-40b"])
def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(name, checkpoints, tmp_path):
    """Adapters on q, v and the MLP input, which the fused query_key_value splits into."""
    qlora_loss_falls(checkpoints(name), tmp_path)


def test_a_peft_adapter_on_the_fused_query_key_value_loads_and_goes_back(checkpoints, tmp_path):
    """PEFT's LoRA on 40B's grouped query_key_value (one A for q, k and v; B split by kv group), dense and
    dense_h_to_4h: PEFT's logits on load, and the adapter written back loads in PEFT with the same logits."""
    peft = pytest.importorskip("peft")
    ids = np.random.default_rng(0).integers(3, 97, (2, 7))

    def logits(model):
        with torch.no_grad():
            return model(input_ids=torch.as_tensor(ids)).logits.numpy()

    torch.manual_seed(1)
    lora = peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                           target_modules=["query_key_value", "dense", "dense_h_to_4h"])
    reference = peft.get_peft_model(build_reference("falcon-40b"), lora).eval()
    reference.save_pretrained(str(tmp_path / "adapter"))
    want = logits(reference)
    ours = jf.from_pretrained(checkpoints("falcon-40b"), adapter=tmp_path / "adapter")
    got = np.asarray(ours(ids).logits)
    assert np.abs(got - want).max() < 1e-5
    ours.save_adapter(tmp_path / "again")
    again = peft.PeftModel.from_pretrained(build_reference("falcon-40b"), str(tmp_path / "again")).eval()
    assert np.abs(logits(again) - got).max() < 1e-5
