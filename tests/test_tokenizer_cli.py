"""Tokenizer loading and the compare / convert commands."""

from __future__ import annotations

import json

import numpy as np
import pytest

import jaxformer as jf
from jaxformer.cli import main
from jaxformer.interop.files import TensorFiles

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_factory import save_checkpoint  # noqa: E402


def _word_level_tokenizer(folder, vocab_size=97):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<unk>", "<eos>"] + [f"w{i}" for i in range(vocab_size - 3)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"pad_token": "<pad>"}')


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    folder = save_checkpoint("llama", tmp_path_factory.mktemp("llama"))
    _word_level_tokenizer(folder)
    return folder


def test_tokenizer_pads_and_masks(llama_dir):
    tokenizer = jf.load_tokenizer(llama_dir)
    assert tokenizer.pad_token_id == 0 and tokenizer.vocab_size == 97
    batch = tokenizer(["w1 w2 w3", "w4"])
    np.testing.assert_array_equal(batch["input_ids"], [[4, 5, 6], [7, 0, 0]])
    np.testing.assert_array_equal(batch["attention_mask"], [[1, 1, 1], [1, 0, 0]])
    left = tokenizer(["w1 w2 w3", "w4"], padding_side="left")
    np.testing.assert_array_equal(left["input_ids"], [[4, 5, 6], [0, 0, 7]])
    assert tokenizer.decode([4, 5, 0]) in ("w1 w2", "w1 w2 <pad>")
    with pytest.raises(ValueError, match="max_length"):
        tokenizer(["w1 w2 w3"], max_length=2)
    out = jf.from_pretrained(llama_dir)(batch["input_ids"], batch["attention_mask"])
    assert out.logits.shape == (2, 3, 97)


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="tokenizer.json"):
        jf.load_tokenizer(tmp_path)


def test_compare_command_prints_every_layer(llama_dir, capsys):
    assert main(["compare", str(llama_dir), "--text", "w1 w2 w3 w4 w5"]) == 0
    table = capsys.readouterr().out
    for row in ("embeddings", "layer 1", "layer 2", "logits", "worst row"):
        assert row in table
    assert main(["compare", str(llama_dir), "--input-ids", "5,6,7"]) == 0
    capsys.readouterr()
    # A tolerance no float computation meets makes the command fail, so CI can gate on it.
    assert main(["compare", str(llama_dir), "--input-ids", "5,6,7", "--tolerance", "1e-30"]) == 1
    assert main(["compare", str(llama_dir), "--input-ids", "5,x"]) == 2


def test_convert_both_directions(llama_dir, tmp_path, capsys):
    native, back = tmp_path / "native", tmp_path / "back"
    assert main(["convert", str(llama_dir), str(native)]) == 0
    assert (native / "jaxformer.json").exists()
    assert main(["convert", str(native), str(back)]) == 0
    before, after = TensorFiles(llama_dir), TensorFiles(back)
    assert before.names == after.names
    for name in before.names:
        assert before.get(name).tobytes() == after.get(name).tobytes(), name
    assert main(["convert", str(llama_dir), str(native)]) == 2  # refuses to overwrite


def test_generate_command(llama_dir, capsys):
    assert main(["generate", str(llama_dir), "--prompt", "w1 w2 w3", "--prompt", "w4", "--max-new-tokens", "5"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("w1 w2 w3") and lines[1].startswith("w4")
    assert "tokens/s" in captured.err and "compile" in captured.err
    assert main(["generate", str(llama_dir), "--prompt", "w1", "--num-beams", "2", "--max-new-tokens", "3"]) == 0
    capsys.readouterr()
    # drafting changes how many tokens a step emits, not which: the model as its own assistant accepts every draft
    for drafting in (["--assistant-model", str(llama_dir), "--num-assistant-tokens", "3"],
                     ["--prompt-lookup-num-tokens", "3"]):
        assert main(["generate", str(llama_dir), "--prompt", "w1 w2 w3", "--prompt", "w4", "--max-new-tokens", "5",
                     *drafting]) == 0
        captured = capsys.readouterr()
        assert captured.out.strip().splitlines() == lines and "tokens per target step" in captured.err
    assert main(["generate", str(llama_dir), "--prompt", "w1", "--max-matching-ngram-size", "3"]) == 2  # no lookup
    assert main(["generate", str(llama_dir), "--prompt", "w1", "--do-sample", "--top-p", "1.5"]) == 2


def test_convert_into_a_used_folder_refuses_then_replaces_exactly_the_checkpoint(llama_dir, tmp_path, capsys):
    """A stale index or generation config left in OUT would shadow or change the new model."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "generation_config.json").write_text('{"forced_bos_token_id": 3}')
    (out / "model.safetensors.index.json").write_text('{"weight_map": {"x": "model-00001-of-00002.safetensors"}}')
    (out / "model-00001-of-00002.safetensors").write_bytes(b"old shard")
    (out / "notes.txt").write_text("mine")
    assert main(["convert", str(llama_dir), "--to-hf", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err and not (out / "config.json").exists()
    assert main(["convert", str(llama_dir), "--to-hf", str(out), "--overwrite"]) == 0
    # the source's generation_config.json, not the stale one
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                    "notes.txt"]
    assert json.loads((out / "generation_config.json").read_text()) == \
        json.loads((llama_dir / "generation_config.json").read_text())
    source, written = TensorFiles(llama_dir), TensorFiles(out)
    assert source.names == written.names
    assert all(source.get(n).tobytes() == written.get(n).tobytes() for n in source.names)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no staging folder left behind
    capsys.readouterr()
    (tmp_path / "a_file").write_text("x")
    assert main(["convert", str(llama_dir), "--to-hf", str(tmp_path / "a_file")]) == 2
    assert "is a file" in capsys.readouterr().err
