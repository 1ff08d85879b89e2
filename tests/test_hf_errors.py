"""Bad checkpoints get one clear ValueError, and nothing partial is ever loaded."""

from __future__ import annotations

import json
import shutil
import struct
import warnings

import numpy as np
import pytest
import safetensors.numpy

import jaxformer as jf
from jaxformer.interop.files import TensorFiles

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_factory import save_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return save_checkpoint("gpt2", tmp_path_factory.mktemp("gpt2"))


@pytest.fixture
def copy(gpt2_dir, tmp_path):
    target = tmp_path / "ckpt"
    shutil.copytree(gpt2_dir, target)
    return target


def _tensors(folder):
    files = TensorFiles(folder)
    return {n: np.array(files.get(n)) for n in files.names}


def _rewrite(folder, tensors):
    (folder / "model.safetensors").unlink()
    safetensors.numpy.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_missing_unexpected_and_misshaped_are_listed_together(copy):
    tensors = _tensors(copy)
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    tensors["transformer.h.0.attn.extra.weight"] = np.zeros((2, 2), np.float32)
    tensors["transformer.ln_f.weight"] = np.zeros((31,), np.float32)
    _rewrite(copy, tensors)
    with pytest.raises(ValueError) as err:
        jf.from_pretrained(copy)
    text = str(err.value)
    assert "nothing was loaded" in text
    assert "missing" in text and "transformer.h.1.mlp.c_fc.bias" in text
    assert "unexpected" in text and "transformer.h.0.attn.extra.weight" in text
    assert "mis-shaped" in text and "transformer.ln_f.weight" in text and "(31,)" in text


def test_tied_copy_that_differs_is_refused(copy):
    tensors = _tensors(copy)
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + 1.0
    _rewrite(copy, tensors)
    with pytest.raises(ValueError, match="should be tied"):
        jf.from_pretrained(copy)


def test_old_buffers_are_ignored(copy):
    """Pre-v4 GPT-2 files carry attn.bias / attn.masked_bias buffers; they are not parameters."""
    tensors = _tensors(copy)
    tensors["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, 40, 40), np.float32))
    tensors["transformer.h.0.attn.masked_bias"] = np.array(-1e4, np.float32)
    _rewrite(copy, tensors)
    jf.from_pretrained(copy)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "mamba"}, "model_type 'mamba' is not supported; supported: "),
    ({"architectures": ["GPT2ForTokenClassification"]}, "architecture 'GPT2ForTokenClassification' is not supported"),
    ({"add_cross_attention": True}, "add_cross_attention"),
    ({"activation_function": "mish"}, "activation 'mish'"),
])
def test_unsupported_configs_name_what_is_supported(copy, change, message):
    config = json.loads((copy / "config.json").read_text())
    config.update(change)
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        jf.from_pretrained(copy)


@pytest.mark.parametrize("rope, message", [
    ({"rope_type": "su", "factor": 4.0, "rope_theta": 10000.0}, "rope type 'su' is not supported"),
    ({"rope_type": "dynamic", "rope_theta": 10000.0}, "rope type 'dynamic' needs factor"),
])
def test_unsupported_rope_scaling_is_refused(tmp_path, rope, message):
    save_checkpoint("llama", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"] = rope
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        jf.from_pretrained(tmp_path)


def test_qwen2_mixed_sliding_layers_are_refused(tmp_path):
    save_checkpoint("qwen2", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(use_sliding_window=True, sliding_window=4, layer_types=["full_attention", "sliding_attention"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="mix of sliding and full"):
        jf.from_pretrained(tmp_path)


def _header_file(path, header: dict, data: bytes, declared_len: int | None = None):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if declared_len is None else declared_len) + raw + data)


@pytest.mark.parametrize("case", ["header_too_long", "overlapping", "out_of_range", "wrong_byte_count", "truncated",
                                  "bad_json"])
def test_corrupt_safetensors_raise_cleanly(copy, case):
    target = copy / "model.safetensors"
    f32 = {"dtype": "F32", "shape": [2]}
    if case == "header_too_long":
        _header_file(target, {"a": {**f32, "data_offsets": [0, 8]}}, b"\0" * 8, declared_len=10**9)
    elif case == "overlapping":
        _header_file(target, {"a": {**f32, "data_offsets": [0, 8]}, "b": {**f32, "data_offsets": [4, 12]}}, b"\0" * 12)
    elif case == "out_of_range":
        _header_file(target, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    elif case == "wrong_byte_count":
        _header_file(target, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)
    elif case == "truncated":
        target.write_bytes(target.read_bytes()[:-100])
    else:
        target.write_bytes(struct.pack("<Q", 5) + b"{abc}")
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        jf.from_pretrained(copy)


def test_pickle_is_refused_unless_allowed(gpt2_dir, tmp_path):
    model = jf.from_pretrained(gpt2_dir)
    reference = {n: torch.from_numpy(np.array(a)) for n, a in _tensors(gpt2_dir).items()}
    shutil.copy(gpt2_dir / "config.json", tmp_path / "config.json")
    torch.save(reference, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="pickle"):
        jf.from_pretrained(tmp_path)
    loaded = jf.from_pretrained(tmp_path, allow_pickle=True)
    ids = np.array([[5, 6, 7, 8]])
    np.testing.assert_array_equal(np.asarray(loaded(ids).logits), np.asarray(model(ids).logits))


class _Payload:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickle_with_code_is_refused_even_when_allowed(gpt2_dir, tmp_path):
    shutil.copy(gpt2_dir / "config.json", tmp_path / "config.json")
    torch.save({"x": _Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="weights_only=True"):
        jf.from_pretrained(tmp_path, allow_pickle=True)


def test_auto_map_never_executes_code(copy, tmp_path):
    marker = tmp_path / "executed"
    (copy / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (copy / "configuration_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((copy / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.Evil"}
    (copy / "config.json").write_text(json.dumps(config))
    jf.from_pretrained(copy)
    assert not marker.exists()


def test_sharded_checkpoint_loads(gpt2_dir, tmp_path):
    tensors = _tensors(gpt2_dir)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, members in shards.items():
        safetensors.numpy.save_file({n: tensors[n] for n in members}, str(tmp_path / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in members})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(gpt2_dir / "config.json", tmp_path / "config.json")
    ids = np.array([[5, 6, 7]])
    expected = jf.from_pretrained(gpt2_dir)(ids).logits
    np.testing.assert_array_equal(np.asarray(jf.from_pretrained(tmp_path)(ids).logits), np.asarray(expected))


def test_missing_folder_pieces(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        jf.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10, "n_embd": 8,
                                                      "n_layer": 1, "n_head": 2, "n_positions": 8}))
    with pytest.raises(ValueError, match="holds no model.safetensors"):
        jf.from_pretrained(tmp_path)


@pytest.mark.parametrize("changes", [dict(family="decoder", decoder_layers=2, encoder_layers=0),
                                     dict(family="encoder", encoder_layers=2, decoder_layers=0, position="sinusoidal",
                                          head="none", attention="bidirectional", scale_tied_logits=False)], ids=["relative-decoder", "sinusoidal-encoder"])
def test_configs_no_transformers_architecture_holds_are_refused_on_export(tmp_path, changes):
    """Each architecture file claims only what it can write: a decoder with T5's relative positions is no
    T5, and an encoder with sinusoids is no BERT."""
    cfg = jf.config("tiny-t5").replace(**changes)
    with pytest.raises(ValueError, match="has no Hugging Face architecture"):
        jf.build(cfg).save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


def test_non_float_tensors_where_float_weights_belong_are_refused_by_name(copy):
    tensors = _tensors(copy)
    tensors["transformer.h.0.mlp.c_fc.weight"] = tensors["transformer.h.0.mlp.c_fc.weight"].astype(np.int8)
    tensors["transformer.ln_f.bias"] = tensors["transformer.ln_f.bias"].astype(np.int64)
    tensors["transformer.ln_f.weight"] = tensors["transformer.ln_f.weight"] > 0
    _rewrite(copy, tensors)
    with pytest.raises(ValueError) as err:
        jf.from_pretrained(copy)
    text = str(err.value)
    assert "nothing was loaded" in text and "non-float tensors where float weights belong (3)" in text
    for name, dtype in (("transformer.h.0.mlp.c_fc.weight", "int8"), ("transformer.ln_f.bias", "int64"),
                        ("transformer.ln_f.weight", "bool")):
        assert f"{name} ({dtype})" in text


def test_weights_holding_nan_or_inf_load_with_a_warning_naming_them(copy):
    tensors = _tensors(copy)
    tensors["transformer.h.1.attn.c_proj.weight"][0, 0] = np.nan
    tensors["transformer.wpe.weight"][3, 1] = -np.inf
    _rewrite(copy, tensors)
    with pytest.warns(UserWarning, match=r"NaN or Inf values \(2 tensors\): \['transformer.h.1.attn.c_proj.weight', "
                                         r"'transformer.wpe.weight'\]"):
        model = jf.from_pretrained(copy)
    assert np.isnan(np.asarray(model.decoder.blocks.attn.o[...])[1]).any()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jf.from_pretrained(save_checkpoint("gpt2", copy.parent / "clean"))
    assert not [w for w in caught if "NaN" in str(w.message)]  # a clean file says nothing of it


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("n_embd"), "config.json has no 'n_embd' field, which GPT2LMHeadModel (gpt2) needs"),
    (lambda c: c.update(n_layer="two"), "ModelConfig.decoder_layers must be an integer, not \"two\""),
    (lambda c: c.update(layer_norm_epsilon=[1e-5]), "ModelConfig.norm_eps must be a number, not [1e-05]"),
    (lambda c: c.update(vocab_size=None), "must be an integer, not null"),
], ids=["missing", "string-for-int", "list-for-float", "null-vocab"])
def test_config_json_fields_missing_or_of_the_wrong_type_are_named(copy, edit, message):
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        jf.from_pretrained(copy)
    assert message in str(err.value)


def test_json_files_that_are_not_utf8_or_index_entries_that_are_not_names(copy):
    (copy / "config.json").write_bytes((copy / "config.json").read_bytes().replace(b'"gpt2"', b'"gpt\xe92"'))
    with pytest.raises(ValueError, match=r"config.json is not UTF-8 text \(byte \d+\)"):
        jf.from_pretrained(copy)
    index = {"weight_map": {"transformer.wte.weight": 7, "transformer.wpe.weight": None}}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"weight_map entries must name shard files \(strings\); found "
                                         r"'transformer.wte.weight': 7, 'transformer.wpe.weight': None"):
        TensorFiles(copy)


def test_one_layers_missing_tensor_leaves_the_other_layers_expected(copy):
    tensors = _tensors(copy)
    del tensors["transformer.h.1.mlp.c_fc.weight"]
    _rewrite(copy, tensors)
    with pytest.raises(ValueError) as err:
        jf.from_pretrained(copy)
    assert "missing tensors (1): ['transformer.h.1.mlp.c_fc.weight']" in str(err.value)
    assert "unexpected" not in str(err.value)  # h.0's tensor is the model's, not a stray


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory):
    """A tiny DeepSeek-V3 file written by jaxformer (no reference model needed to test refusals)."""
    folder = tmp_path_factory.mktemp("deepseek")
    jf.build("tiny-deepseek").save_pretrained(folder)
    return folder


@pytest.mark.parametrize("edit, message", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 40.0, "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5"),
    ({"attention_bias": True}, "attention_bias=true is not supported"),
    ({"model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "topk_method": "noaux_tc"},
     "topk_method='noaux_tc' is not supported"),
])
def test_deepseek_options_jaxformer_does_not_model_are_refused_by_name(deepseek_dir, tmp_path, edit, message):
    shutil.copytree(deepseek_dir, tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(ValueError, match=message):
        jf.from_pretrained(tmp_path / "ckpt")


def test_deepseek_v3_multi_token_prediction_layers_are_skipped_with_a_note(deepseek_dir, tmp_path):
    """V3 files carry their MTP module as layer num_hidden_layers; next-token prediction never reads it.
    Any other extra layer is still an unexpected tensor."""
    folder = tmp_path / "ckpt"
    shutil.copytree(deepseek_dir, folder)
    tensors = _tensors(folder)
    layers = jf.config("tiny-deepseek").decoder_layers
    mtp = {k.replace("layers.1.", f"layers.{layers}."): v for k, v in tensors.items() if ".layers.1." in k}
    _rewrite(folder, {**tensors, **mtp})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    with pytest.warns(UserWarning, match=f"{len(mtp)} tensors of multi-token-prediction layers"):
        model = jf.from_pretrained(folder)
    ids = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(np.asarray(model(ids).logits), np.asarray(jf.from_pretrained(deepseek_dir)(ids).logits))
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    with pytest.raises(ValueError, match="unexpected tensors"):
        jf.from_pretrained(folder)
