"""GLM-4.5 (``glm4_moe``) as transformers computes it: the published file reads as its transformers-5 form and
matches transformers' numbers; its multi-token-prediction layers are skipped with a note; settings jaxformer
cannot honour are refused by name; greedy and beam generation with left padding are token-identical; a QLoRA
fine-tune starts from the file and learns. Parity of every layer and the bit-exact round trip of the tiny
checkpoints are in test_hf_parity.py, every key changed one at a time in test_config_keys.py, the presets'
counts against transformers' in test_presets.py."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.numpy import save_file  # noqa: E402

import jaxformer as jf  # noqa: E402
from jaxformer.interop.files import TensorFiles  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402

from family_files import (TINY, as_transformers_writes_it, generates_as_transformers,  # noqa: E402
                          matches_transformers, qlora_loss_falls, read, rewritten)

# zai-org/GLM-4.5's config.json, every key kept, sizes (and token ids) those of the tiny checkpoint: 4 experts,
# the top 2 in 2 groups, one dense layer (the published: 160 experts, top 8, 1 group, 3 dense layers)
PUBLISHED = {"architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
             "pad_token_id": 0, "eos_token_id": [1, 2], "head_dim": 12, "hidden_act": "silu",
             "partial_rotary_factor": 0.5, "first_k_dense_replace": 1, "model_type": "glm4_moe",
             "moe_intermediate_size": 16, "n_group": 2, "n_routed_experts": 4, "n_shared_experts": 1,
             "norm_topk_prob": True, "num_experts_per_tok": 2, "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-05,
             "rope_scaling": None, "rope_theta": 1000000, "routed_scaling_factor": 2.5, "tie_word_embeddings": False,
             "topk_group": 1, "torch_dtype": "bfloat16", "transformers_version": "4.54.0", "use_cache": True,
             "use_qk_norm": True, **TINY}


def test_the_published_file_reads_as_its_transformers_5_form_and_matches_transformers(checkpoints, tmp_path):
    cfg = read(PUBLISHED)
    assert read(as_transformers_writes_it(PUBLISHED)).replace(name=cfg.name) == cfg
    assert (cfg.rope_dim, cfg.rotary.interleave, cfg.biases.qkv, cfg.biases.out, cfg.query_key_norm.span) == \
        (6, False, True, False, "head")
    experts = cfg.experts
    assert (experts.router_score, experts.router_bias, experts.router_groups, experts.shared, experts.dense_layers,
            experts.routed_scaling) == ("sigmoid", True, 2, 1, 1, 2.5)
    matches_transformers(rewritten(checkpoints("glm4_moe"), tmp_path / "published", PUBLISHED))


def test_the_multi_token_prediction_layer_is_skipped_with_a_note(checkpoints, tmp_path):
    """The published files hold a layer past num_hidden_layers for multi-token prediction, which next-token
    prediction never reads: its tensors load as nothing, with a warning that says how many."""
    hf = {**PUBLISHED, "torch_dtype": "float32"}
    folder, plain = (rewritten(checkpoints("glm4_moe"), tmp_path / name, hf) for name in ("mtp", "plain"))
    files = TensorFiles(folder)
    extra = {name.replace("layers.1.", "layers.2."): files.get(name) for name in files.names if ".layers.1." in name}
    save_file(extra, str(folder / "mtp.safetensors"))
    index = {"metadata": {}, "weight_map": {**{n: "model.safetensors" for n in files.names},
                                            **{n: "mtp.safetensors" for n in extra}}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.warns(UserWarning, match=f"{len(extra)} tensors of multi-token-prediction layers"):
        model = jf.from_pretrained(folder)
    plain = jf.from_pretrained(plain)
    ids = np.arange(3, 12)[None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(np.asarray(model(ids).logits), np.asarray(plain(ids).logits))


@pytest.mark.parametrize("changes, message", [
    ({"n_routed_experts": 0}, "glm4_moe: n_routed_experts=0"),
    ({"first_k_dense_replace": 3}, "first_k_dense_replace=3 is more than the 2 layers"),
    ({"partial_rotary_factor": 0.25}, "partial_rotary_factor=0.25 gives 3 rotating numbers"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED, **changes})


def test_generation_is_token_identical_to_transformers(checkpoints):
    generates_as_transformers(checkpoints("glm4_moe"))


def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(checkpoints, tmp_path):
    qlora_loss_falls(checkpoints("glm4_moe"), tmp_path)
