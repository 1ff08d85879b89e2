"""gpt-oss's published MXFP4 experts: decoded on load exactly as transformers decodes them, the model
then matching transformers' own load of the same folder, and written back as float tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table  # noqa: E402
from jaxformer.interop.files import TensorFiles, write_safetensors  # noqa: E402
from jaxformer.interop.mxfp4 import decode  # noqa: E402

from hf_factory import save_checkpoint  # noqa: E402

PUBLISHED_QUANTIZATION = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                     "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}


def _packed(rng: np.random.Generator, out: int, inputs: int, experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Random MXFP4 blocks [E, out, in / 32, 16] and scales [E, out, in / 32]: every nibble, scales 2 ** -7 to
    2 ** -5 so the decoded weights (std about 0.08) keep activations as small as the other tiny files'."""
    blocks = rng.integers(0, 256, (experts, out, inputs // 32, 16), dtype=np.uint8)
    scales = rng.integers(120, 123, (experts, out, inputs // 32), dtype=np.uint8)
    return blocks, scales


def test_decoding_equals_transformers_dequantizer():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(0)
    blocks, scales = _packed(rng, 6, 64, 3)
    blocks[0, 0, 0] = np.arange(0, 256, 16, dtype=np.uint8)  # every high nibble with low nibble 0, and
    blocks[0, 0, 1] = np.arange(16, dtype=np.uint8)  # every low nibble
    scales[1, 2] = [1, 250]  # far exponents decode exactly too
    theirs = convert_moe_packed_tensors(torch.as_tensor(blocks), torch.as_tensor(scales), dtype=torch.float32)
    ours = decode(blocks, scales)
    assert ours.shape == (3, 64, 6) and ours.dtype == np.float32
    np.testing.assert_array_equal(ours, theirs.numpy())


def test_decoding_refuses_mismatched_pairs():
    with pytest.raises(ValueError, match="do not pair"):
        decode(np.zeros((2, 4, 1, 16), np.uint8), np.zeros((2, 4, 2), np.uint8))


@pytest.fixture(scope="module")
def mxfp4_folder(tmp_path_factory):
    """The tiny gpt-oss file with its experts as published: MXFP4 blocks and scales, the published
    quantization_config, every other tensor float (experts 32 wide: MXFP4 blocks hold 32 inputs)."""
    folder = save_checkpoint("gpt-oss", tmp_path_factory.mktemp("gpt-oss-mxfp4"), changes={"intermediate_size": 32})
    files = TensorFiles(folder)
    hf = json.loads((folder / "config.json").read_text())
    D, F, E = hf["hidden_size"], hf["intermediate_size"], hf["num_local_experts"]
    rng = np.random.default_rng(1)
    tensors = {}
    for name in files.names:
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out, inputs = (2 * F, D) if name.endswith("gate_up_proj") else (D, F)
            tensors[name + "_blocks"], tensors[name + "_scales"] = _packed(rng, out, inputs, E)
        else:
            tensors[name] = np.array(files.get(name))
    write_safetensors(tensors, folder / "model.safetensors")
    hf["quantization_config"] = PUBLISHED_QUANTIZATION
    (folder / "config.json").write_text(json.dumps(hf))
    return folder


def test_an_mxfp4_file_matches_transformers_reading_the_same_file(mxfp4_folder):
    """transformers dequantizes the folder itself (on CPU it always does); every layer and the logits agree."""
    rng = np.random.default_rng(2)
    ids = rng.integers(3, 97, (2, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    rows = compare(mxfp4_folder, ids, mask)
    assert all(r.max_abs <= 1e-5 for r in rows), format_table(rows, 1e-5)


def test_an_mxfp4_file_exports_as_float_tensors_transformers_reloads(mxfp4_folder, tmp_path):
    model = jf.from_pretrained(mxfp4_folder)
    jf.save_pretrained(model, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert "quantization_config" not in hf
    names = TensorFiles(tmp_path).names
    assert "model.layers.0.mlp.experts.gate_up_proj" in names and not any(n.endswith("_blocks") for n in names)
    reloaded = jf.from_pretrained(tmp_path)
    ids = np.random.default_rng(3).integers(3, 97, (1, 7))
    np.testing.assert_array_equal(np.asarray(model(ids).logits), np.asarray(reloaded(ids).logits))
    rows = compare(tmp_path, ids, model=reloaded)
    assert all(r.max_abs <= 1e-5 for r in rows), format_table(rows, 1e-5)


def test_another_quantization_method_is_refused(mxfp4_folder, tmp_path):
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((mxfp4_folder / name).read_bytes())
    hf = json.loads((tmp_path / "config.json").read_text())
    hf["quantization_config"] = {"quant_method": "fp8"}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="quant_method='fp8' is not supported"):
        jf.from_pretrained(tmp_path)
