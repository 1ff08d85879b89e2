"""`jaxformer viz`: the mask pictures are the models' own masks, the attention picture of a saved
checkpoint, the training plot, and the bad-input errors."""

from __future__ import annotations

import argparse

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_model
from PIL import Image

import jaxformer as jf
from jaxformer import viz
from jaxformer.cache import Memory
from jaxformer.cli import main
from jaxformer.layers.attention import memory_visibility_mask, visibility_mask
from jaxformer.train.report import plot_losses

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LENGTH = 8
TEXT = "w1 w2 w3"  # one input shape for every attention test: one compilation


def assert_png(path, size=None) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as image:
        image.load()
        assert image.width > 100 and image.height > 100
        if size is not None:
            assert image.size == size


@pytest.fixture(scope="module")
def pictures():
    return {picture.name: picture for picture in viz.mask_pictures(LENGTH)}


def matrix(pictures, name, panel=0):
    return pictures[name].panels[panel].visible


def test_masks_command_writes_a_png_per_pattern_and_the_overview(tmp_path, pictures, capsys):
    assert main(["viz", "masks", "--out", str(tmp_path / "masks"), "--length", str(LENGTH)]) == 0
    written = {line.rsplit("/", 1)[-1] for line in capsys.readouterr().out.split()}
    assert written == {f"{name}.png" for name in pictures} | {"masks.png"}
    for name, picture in pictures.items():
        width, height = viz.picture_size(picture)
        pixels = (round(width * viz.PICTURE_DPI), round(height * viz.PICTURE_DPI))
        assert_png(tmp_path / "masks" / f"{name}.png", pixels)
    assert_png(tmp_path / "masks" / "masks.png")


def test_every_pattern_is_drawn(pictures):
    assert set(pictures) == {"encoder_bidirectional", "decoder_causal", "prefix_lm", "cross_attention",
                             "sliding_window", "alternating", "chunked", "bidirectional_sliding", "left_padding",
                             "packed_documents", "transformer_xl_memory"}
    for picture in pictures.values():
        for panel in picture.panels:
            T, S = panel.visible.shape
            assert panel.visible.dtype == bool and len(panel.query_labels) == T and len(panel.key_labels) == S


def test_the_matrices_are_visibility_mask_outputs(pictures):
    T = LENGTH
    at = jnp.arange(T)[None]
    same = lambda pattern, **kw: np.asarray(visibility_mask(pattern, at, at, **kw)[0, 0])
    np.testing.assert_array_equal(matrix(pictures, "encoder_bidirectional"), np.ones((T, T), bool))
    causal = same("causal")
    np.testing.assert_array_equal(matrix(pictures, "decoder_causal"), causal)
    np.testing.assert_array_equal(causal, np.tril(np.ones((T, T), bool)))  # lower-triangular
    window = max(2, T // 4)
    sliding = matrix(pictures, "sliding_window")
    np.testing.assert_array_equal(sliding, same("sliding", window=window))
    assert all(row.sum() == min(t + 1, window) for t, row in enumerate(sliding))  # the band is `window` wide
    prefix = max(1, T // 3)
    prefix_lm = matrix(pictures, "prefix_lm")
    np.testing.assert_array_equal(prefix_lm, same("prefix", prefix_lengths=jnp.array([prefix])))
    assert prefix_lm[:, :prefix].all() and np.array_equal(prefix_lm[prefix:, prefix:], causal[prefix:, prefix:])
    # GPT-3: layer 0 dense, layer 1 banded, as the preset's local layers say
    np.testing.assert_array_equal(matrix(pictures, "alternating", 0), causal)
    np.testing.assert_array_equal(matrix(pictures, "alternating", 1), same("sliding", window=window))
    chunked = matrix(pictures, "chunked")  # Llama 4: causal inside each chunk of `window` positions, nothing across
    np.testing.assert_array_equal(chunked, same("chunked", chunk=window))
    blocks = np.kron(np.eye(-(-T // window), dtype=bool), np.ones((window, window), bool))[:T, :T]
    np.testing.assert_array_equal(chunked, causal & blocks)
    t5gemma = matrix(pictures, "bidirectional_sliding")
    np.testing.assert_array_equal(t5gemma, same("bidirectional_sliding", window=window))
    assert np.array_equal(t5gemma, t5gemma.T) and t5gemma[0, window] and not t5gemma[0, window + 1]  # |t - s| <= w


def test_padding_and_empty_memory_are_masked(pictures):
    cross = pictures["cross_attention"].panels[0]
    pads = np.array([label == "pad" for label in cross.key_labels])
    assert pads.any() and not cross.visible[:, pads].any() and cross.visible[:, ~pads].all()

    row0, row1 = pictures["left_padding"].panels
    np.testing.assert_array_equal(row0.visible, np.tril(np.ones((LENGTH, LENGTH), bool)))
    pads = np.array([label == "pad" for label in row1.key_labels])
    assert pads[:2].all() and not row1.visible[:, pads].any()
    real = ~pads  # real tokens: causal among themselves, numbered from 0
    np.testing.assert_array_equal(row1.visible[np.ix_(real, real)], np.tril(np.ones((real.sum(),) * 2, bool)))

    memory = pictures["transformer_xl_memory"].panels[0]
    M = memory.split
    empty = np.array([label == "empty" for label in memory.key_labels[:M]])
    assert empty.any() and (~empty).any()
    assert not memory.visible[:, :M][:, empty].any() and memory.visible[:, :M][:, ~empty].all()
    np.testing.assert_array_equal(memory.visible[:, M:], np.tril(np.ones((LENGTH, LENGTH), bool)))


def test_memory_mask_composes_like_the_stack():
    """viz's helper against the model: tiny-transformer-xl's attention over a half-empty memory puts
    exactly zero weight where the helper's mask says masked, and only there."""
    model = tiny_model("tiny-transformer-xl")  # shared with the suite's other tests: built once
    cfg = model.config
    memory = Memory.empty(cfg.num_layers, 1, 4, cfg.d_model, jnp.float32).extend(
        {"hidden": jnp.ones((cfg.num_layers, 1, 2, cfg.d_model))}, jnp.ones((1, 2), bool))  # 2 of 4 slots filled
    out = model(jnp.arange(1, 5)[None], memory=memory, output_attentions=True)
    at = jnp.arange(4)[None]
    mask = memory_visibility_mask("causal", at, None, memory.valid)
    weights = np.asarray(out.attentions[0][0])  # [N, T, M + T]
    np.testing.assert_array_equal(weights > 0, np.broadcast_to(np.asarray(mask[0]), weights.shape))


@pytest.mark.parametrize("length", [1, 0, viz.MAX_LENGTH + 1])
def test_bad_length(length, tmp_path):
    with pytest.raises(ValueError, match="--length"):
        viz.masks_command(type("Args", (), {"out": str(tmp_path), "length": length})())


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """A tiny BERT in Hugging Face format with a word-level tokenizer.json (w0, w1, ...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = tmp_path_factory.mktemp("bert")
    jf.build(jf.config("tiny-bert").replace(pad_token_id=0)).save_pretrained(folder)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + [f"w{i}" for i in range(60)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def test_attention_picture_of_a_checkpoint(bert_folder, tmp_path):
    out = tmp_path / "attention.png"
    assert main(["viz", "attention", str(bert_folder), "--text", TEXT, "--out", str(out)]) == 0
    assert_png(out)
    one = tmp_path / "head.png"
    assert main(["viz", "attention", str(bert_folder), "--text", TEXT, "--layer", "0", "--head", "3",
                 "--out", str(one)]) == 0
    assert_png(one)


def test_attention_maps_are_probabilities(bert_folder):
    model, tokenizer = viz.load_checkpoint(bert_folder)
    weights, queries, keys = viz.attention_maps(model, tokenizer, TEXT)
    assert queries == keys == ["w1", "w2", "w3"]
    assert len(weights) == 2 and weights[-1].shape == (4, 3, 3)
    np.testing.assert_allclose(weights[-1].sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("choice, message", [({"layer": 2}, "--layer=2; valid: 0 to 1"),
                                             ({"layer": -1}, "--layer=-1; valid: 0 to 1"),
                                             ({"head": 4}, "--head=4; valid: 0 to 3")])
def test_attention_choice_out_of_range(bert_folder, tmp_path, choice, message):
    out = tmp_path / "x.png"
    args = argparse.Namespace(checkpoint=str(bert_folder), text="w1", layer=None, head=None, out=str(out),
                              stack=None, target=None)
    for name, value in choice.items():
        setattr(args, name, value)
    with pytest.raises(ValueError, match=message):
        viz.attention_command(args)
    flag, value = next(iter(choice.items()))
    assert main(["viz", "attention", str(bert_folder), "--text", "w1", f"--{flag}", str(value), "--out", str(out)]) == 2
    assert not out.exists()


@pytest.mark.parametrize("text", ["", "  \n"], ids=["empty", "whitespace"])
def test_empty_text_is_refused_by_viz_and_predict_alike(bert_folder, tmp_path, capsys, text):
    """Before anything is loaded: a BERT tokenizer would turn '' into [CLS] [SEP] and both commands would
    answer about nothing."""
    out = tmp_path / "x.png"
    assert main(["viz", "attention", str(bert_folder), "--text", text, "--out", str(out)]) == 2
    assert main(["predict", str(tmp_path / "no_run_yet"), "--text", "fine", "--text", text]) == 2
    assert main(["predict", str(tmp_path / "no_run_yet"), "--text", "fine", "--question", text]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert errors == [f"jaxformer: error: --text={text!r} is empty; give some text"] * 2 + [
        f"jaxformer: error: --question={text!r} is empty; give some text"]
    assert not out.exists()


def _history(with_eval: bool) -> list[dict]:
    records = []
    for step in range(10, 110, 10):
        record = {"step": step, "loss": 3.0 / step ** 0.3, "lr": 1e-3 * min(1.0, step / 30), "grad_norm": 1.0}
        if with_eval and step % 50 == 0:
            record |= {"eval_loss": 3.1 / step ** 0.3, "eval_accuracy": step / 200, "eval_f1": step / 250}
        records.append(record)
    return records


@pytest.mark.parametrize("with_eval", [True, False])
def test_training_plot(tmp_path, with_eval):
    path = tmp_path / "loss.png"
    plot_losses(_history(with_eval), path, "causal_lm")
    assert_png(path)
