"""OLMo-2 (``olmo2``) as transformers computes it: files as published (OLMo-2-1124-7B's keys, legacy rope keys) read
as their transformers-5 form and match transformers' numbers; settings jaxformer cannot honour are refused by
name; greedy and beam generation are token-identical; a QLoRA fine-tune starts from the file and learns; the
presets have transformers' parameter counts and export as OLMo-2. Parity of every layer and the bit-exact round
trip of the tiny checkpoints (``olmo2``: GQA; ``olmo2-base``: attention biases, explicit head_dim, llama3 rope)
are in test_hf_parity.py, every key changed one at a time in test_config_keys.py."""

from __future__ import annotations

import copy
import json
import shutil
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table, reference_model  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.interop.registry import hf_target  # noqa: E402

from jaxformer.train import run_config  # noqa: E402
from jaxformer.train.run import train  # noqa: E402

from hf_reference import hf_param_count  # noqa: E402

TOLERANCE = 1e-5
# allenai/OLMo-2-1124-7B's config.json, every key kept (the legacy rope_theta beside a null rope_scaling), sizes
# those of the tiny checkpoint, token ids inside its vocabulary
PUBLISHED_7B = {"architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
                "intermediate_size": 48, "max_position_embeddings": 64, "model_type": "olmo2",
                "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": 0,
                "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False,
                "torch_dtype": "float32", "transformers_version": "4.47.0.dev0", "use_cache": True, "vocab_size": 97}


def _rewritten(source, folder, hf: dict):
    """A copy of the checkpoint ``source`` with ``hf`` as its config.json."""
    shutil.copytree(source, folder)
    (folder / "config.json").write_text(json.dumps(hf))
    return folder


def _matches_transformers(folder, length=9):
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 97, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, length - 3:] = 0
    rows = compare(folder, ids, mask)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


def _read(hf: dict) -> jf.ModelConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config_from_hf(copy.deepcopy(hf))


def _as_transformers_writes_it(hf: dict) -> dict:
    return json.loads(transformers.Olmo2Config.from_dict(copy.deepcopy(hf)).to_json_string(use_diff=False))


def test_the_published_file_reads_as_its_transformers_5_form_and_matches_transformers(checkpoints, tmp_path):
    cfg = _read(PUBLISHED_7B)
    assert (cfg.norms.kind, cfg.norms.position, cfg.query_key_norm.span, cfg.activation) == \
        ("rmsnorm", "output", "projection", "swiglu")
    assert (cfg.rotary.theta, cfg.rotary.scaling, cfg.norms.eps, cfg.biases.qkv, cfg.embeddings.tie) == \
        (500000.0, None, 1e-6, False, False)
    assert _read(_as_transformers_writes_it(PUBLISHED_7B)).replace(name=cfg.name) == cfg
    _matches_transformers(_rewritten(checkpoints("olmo2"), tmp_path / "published", PUBLISHED_7B))


def test_legacy_rope_keys_read_as_rope_parameters(checkpoints, tmp_path):
    """rope_theta beside a rope_scaling dict, as transformers 4 wrote them, on a llama3-extended model."""
    source = checkpoints("olmo2-base")
    modern = json.loads((source / "config.json").read_text())
    legacy = {key: value for key, value in modern.items() if key != "rope_parameters"}
    rope = dict(modern["rope_parameters"])
    legacy.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope)
    assert _read(legacy) == _read(modern) and _read(legacy).rotary.scaling.kind == "llama3"
    _matches_transformers(_rewritten(source, tmp_path / "legacy", legacy), length=20)


def test_keys_left_out_take_the_class_defaults():
    sizes = dict(model_type="olmo2", vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4)
    cfg = _read(sizes)
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
    assert _read({**PUBLISHED_7B, "clip_qkv": 8.0, "use_bias": True}) == _read(PUBLISHED_7B)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_is_token_identical_to_transformers(num_beams, checkpoints):
    folder = checkpoints("olmo2")
    model, reference = jf.from_pretrained(folder), reference_model(folder)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 97, (3, 7))
    mask = np.ones_like(ids)
    mask[1, :2], mask[2, :4] = 0, 0
    ids = ids * mask
    kwargs = dict(max_new_tokens=10, num_beams=num_beams, do_sample=False, length_penalty=1.0)
    kwargs["eos_token_id"] = int(model.generate(ids, mask, **kwargs)[0, 7 + 2])  # so stopping is exercised
    ours = model.generate(ids, mask, **kwargs)
    with torch.no_grad():
        theirs = reference.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), **kwargs).numpy()
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("name", ["olmo-2-1b", "olmo-2-7b"])
def test_presets_count_as_transformers_and_export_as_olmo2(name):
    assert jf.param_count(name) == hf_param_count(name)
    assert hf_target(jf.config(name)) == ("olmo2", "Olmo2ForCausalLM")


# test_family_tree.py's QLoRA run: an int8 base with adapters on q, v and the MLP input, 8 steps on the bytes tokenizer
QLORA = ["train.steps=8", "train.batch_size=8", "train.seq_len=32", "train.log_every=2", "eval.every=8",
         "eval.batches=1", "optim.warmup_steps=1", "train.sample_tokens=0", "checkpoint.every=0", "optim.lr=2e-2",
         "finetune.lora.rank=4", "finetune.lora.targets=q,v,wi", "finetune.lora.base_dtype=int8",
         "model.overrides.vocab_size=227"]  # the bytes tokenizer's ids; the tiny file holds 97 rows


def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(checkpoints, tmp_path):
    cfg = run_config.load(None, QLORA + [f"model.init_from=hf:{checkpoints('olmo2')}", f"run.dir={tmp_path}"])
    losses = [record["loss"] for record in train(cfg, progress=False)["history"]]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.2, losses
