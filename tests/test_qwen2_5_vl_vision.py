"""Qwen2.5-VL's vision tower (and Qwen2-VL's, by the same code) against transformers: tiny towers saved by
transformers, two images of different sizes through jaxformer.vision's Qwen2-VL processor; every hidden state (in
transformers' window order), the last state and the merged features within 1e-5, on video frames, all-full layers and
other window sizes and spellings too; the export byte-exact and read back by transformers; bad inputs refused by
name."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

import jaxformer as jf
from jaxformer.interop.hf import config_from_hf
from jaxformer.vision import ImageProcessor

TOLERANCE = 1e-5
# Qwen2.5-VL-7B-Instruct's vision_config as benchmarks/held_out_configs.py holds it (loaded by path: benchmarks/ is no
# package, and its train.py, data.py must not shadow other imports)
_SPEC = importlib.util.spec_from_file_location("held_out_configs",
                                               Path(__file__).resolve().parents[1] / "benchmarks/held_out_configs.py")
_HELD_OUT = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_HELD_OUT)
QWEN2_5_VL_7B_VISION = _HELD_OUT.QWEN2_5_VL_7B_VISION
# patches of 4 pixels merged 2 x 2; windows of 16 pixels: 2 x 2 merged blocks, so both images hold several windows,
# some cut by the image's edge
PROCESSOR = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 4, "merge_size": 2,
             "temporal_patch_size": 2, "min_pixels": 64, "max_pixels": 64 * 64}
SHARED = dict(depth=4, num_heads=2, patch_size=4, spatial_merge_size=2, temporal_patch_size=2)
TOWERS = {
    "qwen2_5_vl": (Qwen2_5_VLVisionConfig, Qwen2_5_VisionTransformerPretrainedModel,
                   dict(hidden_size=32, intermediate_size=48, window_size=16, out_hidden_size=24,
                        fullatt_block_indexes=[1, 3])),
    "qwen2_vl": (Qwen2VLVisionConfig, Qwen2VisionTransformerPretrainedModel,
                 dict(embed_dim=32, mlp_ratio=2, hidden_size=24)),
}


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    pictures = [rng.integers(0, 256, (40, 56, 3), dtype=np.uint8), rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)]
    batch = ImageProcessor.from_dict(PROCESSOR)(pictures)
    return batch["pixel_values"], batch["image_grid_thw"]


@pytest.fixture(scope="module", params=list(TOWERS))
def tower(request, tmp_path_factory):
    """(folder, transformers' tower) of a tiny random checkpoint saved by transformers."""
    config_class, model_class, sizes = TOWERS[request.param]
    torch.manual_seed(0)
    hf = model_class(config_class(**SHARED, **sizes)).eval()
    with torch.no_grad():
        for weight in hf.parameters():  # (norm scales and biases away from 1 and 0, so that each one counts)
            weight.normal_(0.0, 0.2)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return folder, hf


def test_every_state_and_the_merged_features_equal_transformers(tower, images):
    folder, hf = tower
    pixel_values, grid = images
    assert grid.tolist() == [[1, 10, 14], [1, 6, 8]]  # 5 x 7 and 3 x 4 merged blocks: 12 and 4 windows
    with torch.no_grad():
        ref = hf(torch.tensor(pixel_values), grid_thw=torch.tensor(grid), output_hidden_states=True)
    out = jf.from_pretrained(folder)(pixel_values=pixel_values, image_grid_thw=grid, output_hidden_states=True)
    assert len(out.hidden_states) == len(ref.hidden_states) == 5
    for ours, theirs in zip(out.hidden_states, ref.hidden_states):
        np.testing.assert_allclose(np.asarray(ours)[0], theirs.numpy(), rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(np.asarray(out.last_hidden_state)[0], ref.last_hidden_state.numpy(), rtol=0,
                               atol=TOLERANCE)
    assert out.pooler_output.shape == (47, 24)  # (140 + 48) patches / 4
    np.testing.assert_allclose(np.asarray(out.pooler_output), ref.pooler_output.numpy(), rtol=0, atol=TOLERANCE)


def test_each_image_alone_gives_its_own_features(tower, images):
    """Attention never crosses images: the batch's features are each image's alone, in order."""
    model = jf.from_pretrained(tower[0])
    pixel_values, grid = images
    both = np.asarray(model(pixel_values=pixel_values, image_grid_thw=grid).pooler_output)
    first = np.asarray(model(pixel_values=pixel_values[:140], image_grid_thw=grid[:1]).pooler_output)
    np.testing.assert_allclose(both[:35], first, rtol=0, atol=TOLERANCE)


# Qwen2.5-VL's tower on inputs the two images above leave out: (the tower's changes, image_grid_thw)
VARIANTS = {"video frames": ({}, [[2, 6, 8], [3, 4, 4]]),  # windows per frame, no attention across frames
            "every layer full": ({"fullatt_block_indexes": [0, 1, 2, 3]}, [[1, 10, 14]]),
            "windows of 3 blocks": ({"window_size": 24}, [[2, 10, 14]]),  # windows cut by each frame's edge
            # (other spellings of num_heads and depth, legacy rope_scaling and an exact-gelu gate, as transformers
            # reads them)
            "other spellings": ({"num_attention_heads": 4, "num_hidden_layers": 3, "hidden_act": "gelu",
                                 "rope_scaling": {"rope_type": "axial", "rope_theta": 50.0}}, [[1, 6, 8]])}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_video_and_other_layouts_equal_transformers(variant, tmp_path):
    changes, grid = VARIANTS[variant]
    config_class, model_class, sizes = TOWERS["qwen2_5_vl"]
    torch.manual_seed(0)
    hf = model_class(config_class(**{**SHARED, **sizes, **changes})).eval()
    with torch.no_grad():
        for weight in hf.parameters():
            weight.normal_(0.0, 0.2)
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(changes)  # (as a file would spell them: transformers writes its own names back)
    (tmp_path / "config.json").write_text(json.dumps(config))
    grid = np.array(grid)
    pixel_values = np.random.default_rng(1).uniform(-1, 1, (int(grid.prod(-1).sum()), 3 * 2 * 4 * 4))
    pixel_values = pixel_values.astype(np.float32)
    with torch.no_grad():
        ref = hf(torch.tensor(pixel_values), grid_thw=torch.tensor(grid), output_hidden_states=True)
    out = jf.from_pretrained(tmp_path)(pixel_values=pixel_values, image_grid_thw=grid, output_hidden_states=True)
    assert len(out.hidden_states) == len(ref.hidden_states)
    for ours, theirs in zip(out.hidden_states, ref.hidden_states):
        np.testing.assert_allclose(np.asarray(ours)[0], theirs.numpy(), rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(np.asarray(out.pooler_output), ref.pooler_output.numpy(), rtol=0, atol=TOLERANCE)


def test_export_is_byte_exact_and_transformers_reads_it(tower, images, tmp_path):
    folder, hf = tower
    jf.from_pretrained(folder).save_pretrained(tmp_path)
    source, written = load_file(folder / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert source.keys() == written.keys()
    for name, tensor in source.items():
        assert written[name].dtype == tensor.dtype and written[name].tobytes() == tensor.tobytes(), name
    original, export = (json.loads((path / "config.json").read_text()) for path in (folder, tmp_path))
    drop = ("transformers_version", "dtype", "architectures", "tokens_per_second", "initializer_range")
    assert {k: v for k, v in export.items() if k not in drop} == {k: v for k, v in original.items() if k not in drop}
    reread = type(hf).from_pretrained(tmp_path).eval()
    pixel_values, grid = images
    with torch.no_grad():
        a = hf(torch.tensor(pixel_values), grid_thw=torch.tensor(grid)).pooler_output
        b = reread(torch.tensor(pixel_values), grid_thw=torch.tensor(grid)).pooler_output
    assert torch.equal(a, b)


def test_bad_inputs_and_settings_are_refused(tower, images, tmp_path):
    folder, _ = tower
    model = jf.from_pretrained(folder)
    pixel_values, grid = images
    with pytest.raises(ValueError, match="gives 188 patches but pixel_values holds 140"):
        model(pixel_values=pixel_values[:140], image_grid_thw=grid)
    with pytest.raises(ValueError, match="image_grid_thw is missing"):
        model(pixel_values=pixel_values)
    with pytest.raises(ValueError, match=r"pixel_values has shape \(188, 48\)"):
        model(pixel_values=pixel_values[:, :48], image_grid_thw=grid)
    with pytest.raises(ValueError, match="multiples of patch_merge_size=2"):
        model(pixel_values=pixel_values, image_grid_thw=np.array([[1, 9, 14], [1, 7, 8]]))
    with pytest.raises(ValueError, match="not input_ids"):
        model(np.ones((1, 3), np.int32), pixel_values=pixel_values, image_grid_thw=grid)
    hf = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf, "rope_parameters": {"rope_type": "yarn",
                                                                                "rope_theta": 1e4}}))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(ValueError, match="rope_parameters"):
        jf.from_pretrained(tmp_path)


def test_the_published_7b_tower_reads_and_counts_as_transformers():
    cfg = config_from_hf({**QWEN2_5_VL_7B_VISION, "model_type": "qwen2_5_vl_vision",
                          "architectures": ["Qwen2_5_VisionTransformerPretrainedModel"]})
    assert (cfg.d_model, cfg.encoder_layers, cfg.patches.window, cfg.patches.merged_width) == (1280, 32, 112, 3584)
    assert [i for i, kind in enumerate(cfg.layer_types) if kind == "full"] == [7, 15, 23, 31]
    with torch.device("meta"):
        reference = Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**QWEN2_5_VL_7B_VISION))
    assert jf.param_count(cfg) == sum(p.numel() for p in reference.parameters())  # 676,550,144
