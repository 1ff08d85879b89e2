"""Block-wise FP8 checkpoints (quant_method 'fp8', DeepSeek-V3's format): each float8_e4m3fn Linear weight is read
times its block's scale_inv (jaxformer/interop/fp8.py). One tiny DeepSeek-V3 file, its Linear weights quantized here
as the published files are stored (embeddings, head, routers and norms left as they are)."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file
from safetensors.torch import load_file as load_torch, save_file
from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

import hf_factory
import jaxformer as jf
from family_files import TOLERANCE, read
from jaxformer.compare import compare, format_table, reference_model
from jaxformer.interop import fp8

QUANTIZED = ("_proj.weight", "_proj_with_mqa.weight")  # the Linear layers transformers' FP8 loader converts
DYNAMIC = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8"}


def quantized_copy(source, folder, block, dequantized=None, **settings):
    """``source``'s checkpoint with its Linear weights in FP8 blocks of ``block``; with ``dequantized`` (a folder),
    the same weights decoded to float32 beside it (the unquantized file a user would have instead)."""
    tensors = load_file(source / "model.safetensors")
    stored, floats = {}, {}
    for name, value in tensors.items():
        if name.endswith(QUANTIZED):
            weight, scale = fp8.quantize(value, block)
            stored[name] = torch.from_numpy(weight.view(np.uint8)).view(torch.float8_e4m3fn)
            stored[name + fp8.SCALE] = torch.from_numpy(scale)
            # decoded by transformers' FP8Linear arithmetic (partial edge blocks cropped), not by ours
            floats[name] = _dequantize_fp8_weight(stored[name], stored[name + fp8.SCALE], block, torch.float32)
        else:
            stored[name] = floats[name] = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    hf = json.loads((source / "config.json").read_text())
    for where, content, config in ((folder, stored, {**hf, "quantization_config": {
            **DYNAMIC, "weight_block_size": list(block) if block else None, **settings}}), (dequantized, floats, hf)):
        if where is not None:
            where.mkdir()
            save_file({k: torch.as_tensor(v).contiguous() for k, v in content.items()}, where / "model.safetensors",
                      metadata={"format": "pt"})
            (where / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The float checkpoint, its FP8 copy in 8 x 8 blocks (partial edge blocks: 20-wide latent projections) and
    that copy decoded to float32 beside it."""
    root = tmp_path_factory.mktemp("fp8")
    source = hf_factory.save_checkpoint("deepseek-v3", root / "float")
    quantized_copy(source, root / "fp8", (8, 8), dequantized=root / "decoded")
    return root


def batch():
    ids = np.random.default_rng(0).integers(3, 97, size=(2, 9))
    mask = np.ones_like(ids)
    mask[1, -3:] = 0
    return ids, mask


def test_partial_blocks_decode_as_the_dequantized_file_and_match_transformers(files):
    # transformers' dequantizing loader (its only path on CPU) derives each block from the scale grid and refuses
    # a width that is not a multiple of it (20 rows in 3 blocks): the reference reads the decoded float32 file
    model = jf.from_pretrained(files / "fp8", dtype="float32")
    rows = compare(files / "fp8", *batch(), model=model, reference=reference_model(files / "decoded"))
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)
    # export writes the decoded weights as floats, with no quantization_config: the decoded file, byte for byte
    jf.save_pretrained(model, files / "export")
    assert "quantization_config" not in json.loads((files / "export" / "config.json").read_text())
    written, decoded = (load_file(files / where / "model.safetensors") for where in ("export", "decoded"))
    assert written.keys() == decoded.keys() and all(np.array_equal(written[k], decoded[k]) for k in decoded)


def test_whole_blocks_match_transformers_fp8_loader(files, tmp_path):
    # 4 x 4 blocks tile every width of the tiny file: transformers' own FP8 loader (dequantize=True) reads it
    folder = quantized_copy(files / "float", tmp_path / "fp8", (4, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = transformers.DeepseekV3ForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager",
            quantization_config=transformers.FineGrainedFP8Config(weight_block_size=[4, 4], dequantize=True)).eval()
    rows = compare(folder, *batch(), reference=reference)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


def test_settings_that_change_the_numbers_are_refused_by_name(files, tmp_path):
    hf = json.loads((files / "fp8" / "config.json").read_text())
    for key, value in (("fmt", "e5m2"), ("activation_scheme", "static"), ("expert_dtype", "fp6"),
                       ("modules_to_convert", ["embed_tokens"]), ("weight_block_size", [128])):
        with pytest.raises(ValueError, match=f"quantization_config.{key}="):
            read({**hf, "quantization_config": {**hf["quantization_config"], key: value}})
    # what transformers 5 writes (every key of FineGrainedFP8Config), the skip-list and V3.1's scale_fmt all load
    written = transformers.FineGrainedFP8Config(weight_block_size=[8, 8], modules_to_not_convert=["lm_head"]).to_dict()
    read({**hf, "quantization_config": {**written, "quant_method": "fp8", "scale_fmt": "ue8m0", "dequantize": True}})
    # a scale grid that does not tile its weight in the file's blocks
    folder = shutil.copytree(files / "fp8", tmp_path / "bad")
    tensors = load_torch(folder / "model.safetensors")
    name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"
    save_file({**tensors, name: tensors[name][:2].contiguous()}, folder / "model.safetensors")
    with pytest.raises(ValueError, match=f"{name} has shape \\[2, 4\\]"):
        jf.from_pretrained(folder)


def test_decode_reads_ue8m0_scales_and_one_scale_per_tensor():
    weight, _ = fp8.quantize(np.random.default_rng(0).normal(size=(3, 10, 20)), (8, 8))
    exponents = np.arange(3 * 2 * 3, dtype=np.uint8).reshape(3, 2, 3) + 120  # 2 ** -7 ... 2 ** 10
    decoded = fp8.decode(weight, exponents, (8, 8))
    assert decoded[1, 9, 19] == weight[1, 9, 19].astype(np.float32) * 2.0 ** (120 + 3 * 2 + 1 * 3 + 2 - 127)
    assert np.array_equal(fp8.decode(weight, np.float32(0.5), None), weight.astype(np.float32) * 0.5)


@pytest.mark.parametrize("method", ["bitsandbytes", "awq"])
def test_another_quantization_method_is_still_refused_by_its_config(method):
    # asking whether a file is FP8 must not count as reading its quantization_config
    from jaxformer.interop.hf import config_from_hf

    llama = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=32, intermediate_size=48,
                 num_attention_heads=4, num_hidden_layers=2, vocab_size=97)
    with pytest.raises(ValueError, match=f"quantization_config=.*'{method}'"):
        config_from_hf({**llama, "quantization_config": {"quant_method": method}})
