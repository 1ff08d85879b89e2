"""SigLIP2 NaFlex (``siglip2``, ``siglip2_vision_model``): what the shared parity, round-trip, key and export tests
do not cover. Images of different aspect ratios in one batch through jaxformer's processor and model equal
transformers' processor and model on every hidden state of both towers, the pooled features and the logits; the
position grid's resize is torch's antialiased bilinear interpolation; padding patches change no real output; bad
NaFlex inputs and configs are refused by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image, ImageDraw

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402

import jaxformer as jf  # noqa: E402
from jaxformer.layers.patches import resized_grid_positions  # noqa: E402
from jaxformer.vision import ImageProcessor  # noqa: E402

from hf_factory import naflex_images  # noqa: E402

TOLERANCE = 1e-5
# google/siglip2-base-patch16-naflex's preprocessor_config.json, sized for the tiny tower: 4x4 patches, at most 20
PROCESSOR = {"do_convert_rgb": None, "do_normalize": True, "do_rescale": True, "do_resize": True,
             "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Siglip2ImageProcessor",
             "image_std": [0.5, 0.5, 0.5], "max_num_patches": 20, "patch_size": 4,
             "processor_class": "Siglip2Processor", "resample": 2, "rescale_factor": 0.00392156862745098}


def _drawing(width: int, height: int) -> Image.Image:
    """A gradient with noise, a red disc and a green square."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([255 * x / (width - 1), 255 * y / (height - 1), 128 + 100 * np.sin(x / 5 + y / 9)], -1)
    rgb = np.clip(rgb + np.random.default_rng(0).normal(0, 10, rgb.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(rgb)
    draw = ImageDraw.Draw(image)
    draw.ellipse((width * 0.1, height * 0.2, width * 0.5, height * 0.7), fill=(220, 40, 40))
    draw.rectangle((width * 0.55, height * 0.1, width * 0.9, height * 0.45), fill=(30, 160, 60))
    return image


@pytest.fixture(scope="module")
def pair(checkpoints):
    path = checkpoints("siglip2")
    reference = transformers.Siglip2Model.from_pretrained(path, attn_implementation="eager").eval()
    return jf.from_pretrained(path), reference


def test_processor_and_model_equal_transformers_on_images_of_other_aspect_ratios(pair):
    model, reference = pair
    # tall, wide, square and tiny: grids of patches other than the 4x4 position grid, each padded to 20
    images = [_drawing(47, 91), _drawing(130, 40), _drawing(64, 64), _drawing(9, 13)]
    ids = np.random.default_rng(0).integers(3, 97, (3, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    ours = ImageProcessor.from_dict(PROCESSOR)(images)
    theirs = transformers.Siglip2ImageProcessorPil.from_dict(dict(PROCESSOR))(images, return_tensors="pt")
    assert len({tuple(shape) for shape in ours["spatial_shapes"].tolist()}) == 4  # (four different grids)
    assert ours["pixel_attention_mask"].min() == 0  # (padding in the batch)
    with torch.no_grad():
        ref = reference(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                        output_hidden_states=True, output_attentions=True, **theirs)
    out = model(ids, ours["pixel_values"], mask, pixel_attention_mask=ours["pixel_attention_mask"],
                spatial_shapes=ours["spatial_shapes"], output_hidden_states=True, output_attentions=True)
    real_text = mask.astype(bool)
    diffs = {}
    for label, r, o, real in (("text", ref.text_model_output, out.text_model_output, real_text),
                              ("vision", ref.vision_model_output, out.vision_model_output, None)):
        assert len(r.hidden_states) == len(o.hidden_states) == 3
        for i, (a, b) in enumerate(zip(r.hidden_states + (r.last_hidden_state,),
                                       o.hidden_states + (o.last_hidden_state,))):
            gap = np.abs(a.numpy() - np.asarray(b))  # (the text's padded rows aside; every image patch, padding too)
            diffs[f"{label} state {i}"] = (gap[real] if real is not None else gap).max()
        for i, (a, b) in enumerate(zip(r.attentions, o.attentions)):
            diffs[f"{label} attention {i}"] = np.abs(a.numpy() - np.asarray(b)).max(
                where=np.ones(a.shape, bool) if real is None else real[:, None, :, None], initial=0)
        diffs[f"{label} pooler"] = np.abs(r.pooler_output.numpy() - np.asarray(o.pooler_output)).max()
    for name in ("text_embeds", "image_embeds", "logits_per_image", "logits_per_text"):
        diffs[name] = np.abs(getattr(ref, name).numpy() - np.asarray(getattr(out, name))).max()
    assert max(diffs.values()) <= TOLERANCE, diffs
    # get_image_features / get_text_features answer as transformers' (its pooler_output, before normalisation)
    with torch.no_grad():
        image_features = reference.get_image_features(**theirs).pooler_output.numpy()
        text_features = reference.get_text_features(input_ids=torch.as_tensor(ids),
                                                    attention_mask=torch.as_tensor(mask)).pooler_output.numpy()
    got = model.get_image_features(ours["pixel_values"], pixel_attention_mask=ours["pixel_attention_mask"],
                                   spatial_shapes=ours["spatial_shapes"]).pooler_output
    assert np.abs(np.asarray(got) - image_features).max() <= TOLERANCE
    assert np.abs(np.asarray(model.get_text_features(ids, mask).pooler_output) - text_features).max() <= TOLERANCE


@pytest.mark.parametrize("grid", [(4, 4), (2, 3), (7, 5), (1, 9), (16, 1), (3, 1)])
def test_position_grid_resize_is_transformers_antialiased_bilinear(grid):
    """Shrinking with antialias widens the triangle filter (not plain bilinear): equal to transformers' weights,
    and to torch's F.interpolate(bilinear, align_corners=False, antialias=True) but for a one-column grid, where
    torch's CPU kernel gives every row the first row's value (transformers 5 computes the weights itself)."""
    from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings

    table = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    expected = Siglip2VisionEmbeddings.resize_positional_embeddings(torch.as_tensor(table.reshape(4, 4, 8)),
                                                                    torch.as_tensor([grid]), 40)[0].numpy()
    got = np.asarray(resized_grid_positions(jnp.asarray(table), jnp.asarray([grid]), 40))[0]
    assert np.abs(got - expected).max() <= TOLERANCE  # (the padding rows too: the first position's value)
    if grid[1] > 1:
        resized = torch.nn.functional.interpolate(torch.as_tensor(table.reshape(4, 4, 8)).permute(2, 0, 1)[None],
                                                  size=grid, mode="bilinear", align_corners=False, antialias=True)
        assert np.abs(got[:grid[0] * grid[1]] - resized[0].permute(1, 2, 0).reshape(-1, 8).numpy()).max() <= TOLERANCE


def test_padding_patches_change_no_real_output(checkpoints):
    """The same images padded to 24 or to 40 patches: the same real states and pooled output."""
    model = jf.from_pretrained(checkpoints("siglip2_vision_model"))
    short = naflex_images("siglip2_vision_model", np.random.default_rng(0))
    long = {**short, "pixel_values": np.pad(short["pixel_values"], ((0, 0), (0, 16), (0, 0))),
            "pixel_attention_mask": np.pad(short["pixel_attention_mask"], ((0, 0), (0, 16)))}
    a, b = model(**short), model(**long)
    real = short["pixel_attention_mask"].astype(bool)
    # (float32 sums of other lengths may round apart; a padding patch read would move them by far more)
    states = np.asarray(a.last_hidden_state)[real], np.asarray(b.last_hidden_state)[:, :24][real]
    assert np.abs(states[0] - states[1]).max() <= TOLERANCE
    assert np.abs(np.asarray(a.pooler_output) - np.asarray(b.pooler_output)).max() <= TOLERANCE


def test_bad_naflex_inputs_are_refused(checkpoints):
    model = jf.from_pretrained(checkpoints("siglip2_vision_model"))
    good = naflex_images("siglip2_vision_model", np.random.default_rng(0))
    cases = [
        ({**good, "spatial_shapes": None}, "needs spatial_shapes"),
        ({**good, "spatial_shapes": np.array([[5, 5], [6, 2]])}, "at most 24 patches"),
        ({**good, "spatial_shapes": np.array([[0, 5], [6, 2]])}, "rows, columns > 0"),
        ({**good, "spatial_shapes": np.array([3, 5])}, "spatial_shapes has shape"),
        ({**good, "pixel_attention_mask": good["pixel_attention_mask"][:, :10]}, "pixel_attention_mask has shape"),
        ({**good, "pixel_values": good["pixel_values"][..., :40]}, "pixel_values has shape"),
        ({**good, "pixel_values": np.zeros((2, 3, 8, 8), np.float32)}, "pixel_values has shape"),
        ({**good, "pixel_values": None}, "pixel_values is missing"),
        ({**good, "interpolate_pos_encoding": True}, "interpolate_pos_encoding does not apply"),
    ]
    for inputs, message in cases:
        with pytest.raises(ValueError, match=message):
            model(**inputs)
    fixed = jf.from_pretrained(checkpoints("siglip_vision_model"))  # a fixed-size tower takes no NaFlex inputs
    with pytest.raises(ValueError, match="NaFlex inputs"):
        fixed(pixel_values=np.zeros((1, 3, 30, 30), np.float32), spatial_shapes=np.array([[3, 3]]))


def test_a_grid_of_positions_that_is_not_square_is_refused(checkpoints, tmp_path):
    shutil.copytree(checkpoints("siglip2"), tmp_path, dirs_exist_ok=True)
    hf = json.loads((tmp_path / "config.json").read_text())
    hf["vision_config"]["num_patches"] = 15
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="num_patches=15 must be a square number"):
        jf.from_pretrained(tmp_path)


@pytest.mark.parametrize("name, prefix", [("siglip2_vision_model", "vision_model."),
                                          ("siglip2_text_model", "text_model.")])
def test_published_tower_files_with_prefixed_names_load(name, prefix, checkpoints, tmp_path):
    """transformers 4 saved Siglip2VisionModel's and Siglip2TextModel's tensors under vision_model. and
    text_model.; transformers 5 writes them bare."""
    from safetensors.numpy import load_file, save_file

    source = checkpoints(name)
    shutil.copy(source / "config.json", tmp_path / "config.json")
    tensors = load_file(source / "model.safetensors")
    save_file({f"{prefix}{tensor}": value for tensor, value in tensors.items()}, tmp_path / "model.safetensors")
    rng = np.random.default_rng(3)
    inputs = (naflex_images(name, rng) if "vision" in name else dict(input_ids=rng.integers(3, 97, (2, 9))))
    a, b = jf.from_pretrained(source)(**inputs), jf.from_pretrained(tmp_path)(**inputs)
    assert np.array_equal(np.asarray(a.pooler_output), np.asarray(b.pooler_output))


def test_compare_cli_prepares_a_naflex_image(checkpoints, tmp_path, capsys):
    """``jaxformer compare FOLDER --image PNG``: the folder's NaFlex processor gives the mask and grid too."""
    from jaxformer.cli import main

    shutil.copytree(checkpoints("siglip2_vision_model"), tmp_path, dirs_exist_ok=True)
    ImageProcessor.from_dict(PROCESSOR).save_pretrained(tmp_path)
    _drawing(50, 23).save(tmp_path / "wide.png")
    assert main(["compare", str(tmp_path), "--image", str(tmp_path / "wide.png")]) == 0, capsys.readouterr().out


def test_the_image_text_embedder_reads_naflex_images(pair):
    """jf.ImageTextEmbedder's image features (its processor's mask and grids passed on) equal transformers', in one
    call or one an image."""
    model, reference = pair
    images = [_drawing(47, 91), _drawing(130, 40)]
    embedder = jf.ImageTextEmbedder(model, None, ImageProcessor.from_dict(PROCESSOR))
    inputs = transformers.Siglip2ImageProcessorPil.from_dict(dict(PROCESSOR))(images, return_tensors="pt")
    with torch.no_grad():
        expected = reference.get_image_features(**inputs).pooler_output.numpy()
    assert np.abs(embedder.encode_images(images) - expected).max() <= TOLERANCE
    assert np.abs(embedder.encode_images(images, batch_size=1) - expected).max() <= TOLERANCE  # (a call an image)
