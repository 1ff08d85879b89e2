"""Meta's OPT (``opt``) as transformers computes it: the published files read as their transformers-5 form and
match transformers' numbers, with right and with left padding (OPT counts a row's positions from its attention
mask); the settings jaxformer cannot honour, OPT-350m's projected embeddings first, are refused by name; greedy
and beam generation with left padding are token-identical; a QLoRA fine-tune starts from the file and learns.
Parity of every layer and the bit-exact round trip of the tiny checkpoints are in test_hf_parity.py, every key
changed one at a time in test_config_keys.py, the presets' counts against transformers' in test_presets.py,
cache == no cache in test_generate.py."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402

from family_files import (TOLERANCE, generates_as_transformers, matches_transformers, qlora_loss_falls,  # noqa: E402
                          read, rewritten)
from hf_factory import save_checkpoint  # noqa: E402

_TINY = dict(hidden_size=32, ffn_dim=48, num_attention_heads=4, num_hidden_layers=2, vocab_size=97,
             max_position_embeddings=40, word_embed_proj_dim=32)
# The published config.json files, every key kept, sizes those of the tiny checkpoints.
_OPT_125M = {"_name_or_path": "facebook/opt-125m", "activation_dropout": 0.0, "activation_function": "relu",
             "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 2,
             "do_layer_norm_before": True, "dropout": 0.1, "eos_token_id": 2, "init_std": 0.02, "layerdrop": 0.0,
             "model_type": "opt", "pad_token_id": 1, "prefix": "</s>", "torch_dtype": "float16",
             "transformers_version": "4.21.0.dev0", "use_cache": True, **_TINY}
PUBLISHED = {
    # facebook/opt-125m
    "opt-125m": _OPT_125M,
    # facebook/opt-6.7b (1.3b's alike): says _remove_final_layer_norm
    "opt-6.7b": {**_OPT_125M, "_name_or_path": "facebook/opt-6.7b", "_remove_final_layer_norm": False,
                 "transformers_version": "4.20.1"},
}
# facebook/opt-350m: post-norm, its 512-wide token table projected to and from the 1024-wide stack (here 16 and 32)
OPT_350M = {**_OPT_125M, "_name_or_path": "facebook/opt-350m", "do_layer_norm_before": False,
            "transformers_version": "4.20.0.dev0", **_TINY, "word_embed_proj_dim": 16}


def _as_transformers_writes_it(hf: dict) -> dict:
    return json.loads(transformers.OPTConfig.from_dict(copy.deepcopy(hf)).to_json_string(use_diff=False))


def _matches_transformers_left_padded(folder, length: int = 9) -> None:
    """Every layer and the logits within TOLERANCE of transformers' on two rows, the second left-padded by 3 (and
    so, in both, at positions counted from its first real token)."""
    ids = np.random.default_rng(1).integers(3, 97, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, :3] = 0
    rows = compare(folder, ids, mask)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_published_file_reads_as_its_transformers_5_form_and_matches_transformers(name, checkpoints, tmp_path):
    cfg = read(PUBLISHED[name])
    assert read(_as_transformers_writes_it(PUBLISHED[name])).replace(name=cfg.name) == cfg
    folder = rewritten(checkpoints("opt"), tmp_path / "published", PUBLISHED[name])
    matches_transformers(folder)
    _matches_transformers_left_padded(folder)


def test_what_the_published_file_says():
    cfg = read(PUBLISHED["opt-125m"])
    assert (cfg.norms.kind, cfg.norms.position, cfg.norms.final, cfg.norms.eps) == ("layernorm", "pre", True, 1e-5)
    assert (cfg.activation, cfg.d_ff, cfg.position, cfg.max_positions) == ("relu", 48, "learned", 40)
    assert cfg.embeddings.position_offset == 2 and cfg.embeddings.positions_from_mask and cfg.embeddings.tie
    assert cfg.biases.qkv and cfg.biases.out and cfg.biases.mlp
    assert (cfg.tokens.pad, cfg.tokens.bos, cfg.tokens.eos) == (1, 2, 2)
    assert read(PUBLISHED["opt-6.7b"]).replace(name=cfg.name) == cfg


@pytest.mark.parametrize("name", ["opt", "opt-base"])
def test_a_left_padded_batch_matches_transformers(name, checkpoints):
    """transformers counts a row's positions from its attention mask; so does jaxformer for OPT (the pre-norm
    LM and the post-norm base model without biases)."""
    _matches_transformers_left_padded(checkpoints(name))


@pytest.mark.parametrize("changes", [
    {"_remove_final_layer_norm": True, "tie_word_embeddings": False},
    {"activation_function": "gelu", "do_layer_norm_before": False, "pad_token_id": 0},
], ids=["no-final-norm-untied", "post-norm-gelu"])
def test_the_other_settings_match_transformers(changes, tmp_path):
    folder = save_checkpoint("opt", tmp_path / "variant", changes=changes)
    assert not read(json.loads((folder / "config.json").read_text())).norms.final  # removed, or post-norm
    matches_transformers(folder)
    _matches_transformers_left_padded(folder)


def test_positions_count_the_real_tokens_so_left_padding_changes_no_real_token():
    """The property behind the parity: a row left-padded by 3 gives its real tokens the logits it gives alone."""
    cfg = jf.config("opt-125m").replace(vocab_size=97, d_model=32, num_heads=4, d_ff=48, decoder_layers=2,
                                        max_positions=40, init_std=0.2, dropout_rate=0.0)
    model = jf.build(cfg, seed=0)
    ids = np.random.default_rng(0).integers(3, 97, size=(1, 6))
    alone = np.asarray(model(ids).logits)
    padded = np.concatenate([np.zeros((1, 3), ids.dtype), ids], axis=1)
    mask = np.concatenate([np.zeros((1, 3)), np.ones((1, 6))], axis=1).astype(np.int32)
    np.testing.assert_allclose(np.asarray(model(padded, mask).logits)[:, 3:], alone, atol=TOLERANCE, rtol=0)
    # without the setting the padded row's tokens sit 3 positions later: other numbers
    shifted = jf.build(cfg.replace(positions_from_mask=False), seed=0)
    assert np.abs(np.asarray(shifted(padded, mask).logits)[:, 3:] - alone).max() > 1e-3


def test_positions_from_mask_belongs_to_decoders():
    with pytest.raises(ValueError, match="positions_from_mask=True counts a decoder's positions"):
        jf.config("tiny-bert").replace(positions_from_mask=True)


@pytest.mark.parametrize("changes, message", [
    ({"word_embed_proj_dim": 16}, "opt: word_embed_proj_dim=16 with hidden_size=32 .OPT-350m's layout"),
    ({"layer_norm_elementwise_affine": False}, "opt: layer_norm_elementwise_affine=False"),
    ({"layerdrop": 0.1}, "opt: layerdrop=0.1"),
    ({"activation_function": "mish"}, "opt: activation 'mish' is not supported"),
    ({"architectures": ["OPTForSequenceClassification"]}, "'OPTForSequenceClassification' is not supported"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED["opt-125m"], **changes})


def test_opt_350m_is_refused_by_name():
    with pytest.raises(ValueError, match="word_embed_proj_dim=16 with hidden_size=32 .OPT-350m's layout"):
        config_from_hf(copy.deepcopy(OPT_350M))


@pytest.mark.parametrize("post_norm", [False, True], ids=["pre-norm", "post-norm"])
def test_generation_is_token_identical_to_transformers(post_norm, checkpoints, tmp_path):
    """Left-padded prompts of 7 and 10 new tokens: transformers numbers each row's positions from its first real
    token, as jaxformer's generation does; the post-norm model is OPT-350m's blocks without its projections."""
    folder = (save_checkpoint("opt", tmp_path / "post", changes={"do_layer_norm_before": False}) if post_norm
              else checkpoints("opt"))
    generates_as_transformers(folder)


def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(checkpoints, tmp_path):
    qlora_loss_falls(checkpoints("opt"), tmp_path)
