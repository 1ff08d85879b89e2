"""What the command line answers a new user (issue 46): generate's text as transformers' pipeline cuts it, an
assistant with another tokenizer refused, the CLI's own flag named past max_positions, a bytes training run to
text (generate RUN_DIR and its convert --to-hf export, whose tokenizer transformers loads), and compare and viz
naming what to do instead of a traceback."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import jaxformer as jf
from jaxformer.cli import main
from jaxformer.interop.tokenizer import load_tokenizer
from jaxformer.train import data
from jaxformer.train.evaluate import byte_special_tokens, run_tokenizer
from jaxformer.train.run import main as train_main

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_factory import save_checkpoint  # noqa: E402

# a causal LM run on the default bytes data, a few steps of a one-layer model
TINY_RUN = ["train.steps=4", "train.batch_size=2", "train.seq_len=16", "train.log_every=2", "eval.every=4",
            "eval.batches=1", "optim.warmup_steps=1", "train.sample_tokens=0", "model.overrides.d_model=32",
            "model.overrides.decoder_layers=1"]


def _metaspace_words(folder, vocab_size=97):
    """A SentencePiece-style tokenizer: every token is a word starting with '▁', which the Metaspace decoder
    turns into the space before it, except at the start of the text (so a row's first token loses its space)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = [f"▁w{i}" for i in range(vocab_size)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="▁w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.save(str(folder / "tokenizer.json"))


def _byte_level_bpe(folder):
    """GPT-2's kind of tokenizer: the 256 byte characters, one merge ('Ġw', a space and w) and <|endoftext|>."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocabulary = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocabulary["Ġw"] = len(vocabulary)
    tokenizer = Tokenizer(models.BPE(vocabulary, [("Ġ", "w")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tokenizer.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    # no EOS: every generation runs its max_new_tokens, so counting words checks the spaces
    folder = save_checkpoint("llama", tmp_path_factory.mktemp("llama"), changes=dict(eos_token_id=None))
    _metaspace_words(folder)
    return folder


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    folder = save_checkpoint("gpt2", tmp_path_factory.mktemp("gpt2"),
                             changes=dict(vocab_size=258, bos_token_id=257, eos_token_id=257))
    _byte_level_bpe(folder)
    return folder


@pytest.fixture(scope="module")
def bytes_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("bytes_run")
    assert train_main(TINY_RUN + [f"run.dir={run_dir}"]) == 0
    return run_dir


def _generated(argv, capsys) -> str:
    """What ``jaxformer generate`` printed: one line per prompt (generated text may hold line breaks too)."""
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.mark.parametrize("folder", ["llama_dir", "gpt2_dir"])
def test_generate_prints_the_whole_row_decoded(folder, request, capsys):
    """Each printed line is the prompt and the decoded row past the decoded prompt, as transformers'
    text-generation pipeline prints it; for the Metaspace tokenizer that keeps the space before the first new
    word (decoding the new ids alone glued it to the prompt), and left padding in a batch changes nothing."""
    path = request.getfixturevalue(folder)
    prompts = ["w1 w2 w3", "w4"]
    printed = _generated(["generate", str(path), *[a for p in prompts for a in ("--prompt", p)],
                          "--max-new-tokens", "4"], capsys)
    model, tokenizer = jf.from_pretrained(path), load_tokenizer(path)
    expected = ""
    for prompt in prompts:
        ids = tokenizer([prompt])["input_ids"]
        assert tokenizer.decode(ids[0]) == prompt
        expected += tokenizer.decode(np.asarray(model.generate(ids, max_new_tokens=4))[0]) + "\n"
    assert printed == expected
    if folder == "llama_dir":  # every word is '▁'-prefixed: the first new one follows a space
        for prompt, line in zip(prompts, printed.splitlines()):
            assert line.startswith(prompt + " ") and len(line.split()) == len(prompt.split()) + 4


def test_an_assistant_with_another_tokenizer_is_refused(llama_dir, tmp_path, capsys):
    other = tmp_path / "assistant"
    shutil.copytree(llama_dir, other)
    _metaspace_words(other, vocab_size=90)  # the same words up to ▁w89, fewer of them
    assert main(["generate", str(llama_dir), "--prompt", "w1", "--assistant-model", str(other)]) == 2
    err = capsys.readouterr().err
    assert "another tokenizer" in err and "'▁w90' is absent there, id 90 here" in err
    assert "universal assisted decoding" in err and err.count("\n") == 1


def test_past_max_positions_the_cli_names_its_own_flag(llama_dir, capsys):
    assert main(["generate", str(llama_dir), "--prompt", "w1", "--max-new-tokens", "1000000000"]) == 2
    err = capsys.readouterr().err
    assert "--allow-beyond-max-positions" in err and "lower max_new_tokens to at most 63" in err
    positions = jf.from_pretrained(llama_dir).config.max_positions
    printed = _generated(["generate", str(llama_dir), "--prompt", "w1", "--max-new-tokens", str(positions + 6),
                          "--allow-beyond-max-positions"], capsys)
    assert len(printed.split()) == positions + 7


def test_a_bytes_run_generates_from_its_folder_and_from_its_export(bytes_run, tmp_path, capsys):
    from transformers import AutoTokenizer

    export = tmp_path / "hf"
    assert main(["convert", str(bytes_run), "--to-hf", str(export)]) == 0
    capsys.readouterr()
    prompts = ["The héllo", "x"]
    flags = [a for p in prompts for a in ("--prompt", p)] + ["--max-new-tokens", "12"]
    from_run = _generated(["generate", str(bytes_run), *flags], capsys)
    assert _generated(["generate", str(bytes_run), "--step", "4", *flags], capsys) == from_run
    assert _generated(["generate", str(export), *flags], capsys) == from_run
    # transformers' tokenizer of the export encodes the bytes and decodes the generated row into the same text
    hf = AutoTokenizer.from_pretrained(str(export))
    model = jf.from_pretrained(export)
    expected = ""
    for prompt in prompts:
        ids = hf(prompt)["input_ids"]
        assert ids == list(prompt.encode("utf-8"))
        expected += hf.decode(np.asarray(model.generate(np.asarray([ids]), max_new_tokens=12))[0].tolist()) + "\n"
    assert from_run == expected
    assert main(["generate", str(bytes_run), "--step", "3", "--prompt", "x"]) == 2
    assert "no checkpoint of step 3" in capsys.readouterr().err
    assert main(["generate", str(export), "--step", "4", "--prompt", "x"]) == 2
    assert "not a run folder" in capsys.readouterr().err


@pytest.mark.parametrize("vocab_size", [256, data.ByteTokenizer.vocab_size])
def test_the_bytes_tokenizer_json_round_trips_as_the_byte_tokenizer_does(vocab_size, tmp_path):
    """With the specials too (an MLM or T5 bytes run embeds them): their text in the input stays bytes (the
    tokenizer_config's split_special_tokens, which transformers and load_tokenizer honour), they decode to
    nothing, and data.HFTokenizer finds each at ByteTokenizer's id."""
    from transformers import AutoTokenizer

    from jaxformer.interop.tokenizer import write_byte_level_tokenizer
    from jaxformer.train.evaluate import BYTE_TOKEN_ROLES

    write_byte_level_tokenizer(tmp_path, byte_special_tokens(vocab_size), BYTE_TOKEN_ROLES)
    ours, hf, byte = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path)), data.ByteTokenizer()
    assert ours.vocab_size == vocab_size
    text = "a <s>[MASK]</s><pad><extra_id_0> é€🙂\n\t\x00"
    assert ours.encode(text) == hf(text)["input_ids"] == byte.encode(text).tolist()
    rng = np.random.default_rng(0)
    for ids in [rng.integers(0, vocab_size, 40) for _ in range(20)] + [list(b"\xe2\x82a\xff\xed\xa0\x80\xf0\x9f")]:
        expected = byte.decode(ids)  # invalid UTF-8 replaced the same way
        assert ours.decode(ids) == hf.decode([int(i) for i in ids], skip_special_tokens=True) == expected
    if vocab_size > 256:
        found = data.HFTokenizer(str(tmp_path / "tokenizer.json"))
        for role in ("pad", "bos", "eos", "mask", "sentinel"):
            assert found.special(role) == byte.special(role), role
        assert found.sentinel_count == byte.sentinel_count
        assert hf.eos_token_id == byte.special("eos") and hf.pad_token_id == byte.special("pad")


def test_a_run_reads_its_own_tokenizer_file_else_bytes(bytes_run, llama_dir, tmp_path):
    tokenizer = run_tokenizer(bytes_run, 256)
    assert tokenizer.vocab_size == 256 and tokenizer.pad_token_id is None
    assert tokenizer.encode("über") == list("über".encode()) and tokenizer.decode(tokenizer.encode("über")) == "über"
    shutil.copy(llama_dir / "tokenizer.json", tmp_path / "tokenizer.json")  # a run that read its data with it
    assert run_tokenizer(tmp_path, 256).vocabulary() == load_tokenizer(llama_dir).vocabulary()


def test_compare_names_a_run_folder_and_out_of_vocabulary_ids(bytes_run, llama_dir, capsys):
    assert main(["compare", str(bytes_run), "--input-ids", "1,2"]) == 2
    err = capsys.readouterr().err
    assert "training run folder" in err and f"jaxformer convert {bytes_run} --to-hf OUT" in err
    assert main(["compare", str(llama_dir), "--input-ids", "1,2,500"]) == 2
    assert "token id 500; valid ids lie in [0, 97)" in capsys.readouterr().err


def test_viz_writes_into_a_missing_folder_and_refuses_a_folder_as_the_file(llama_dir, tmp_path, capsys):
    out = tmp_path / "missing" / "deeper" / "attention.png"
    assert main(["viz", "attention", str(llama_dir), "--text", "w1 w2", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["viz", "attention", str(llama_dir), "--text", "w1 w2", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert main(["viz", "masks", "--out", str(out)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_split_special_tokens_in_tokenizer_config_is_honoured(llama_dir, tmp_path):
    shutil.copytree(llama_dir, tmp_path, dirs_exist_ok=True)
    from tokenizers import Tokenizer

    plain = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    plain.add_special_tokens(["<sep>"])
    plain.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path).encode("w1<sep>", add_special_tokens=False) == [1, 97]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"split_special_tokens": True}))
    assert load_tokenizer(tmp_path).encode("w1<sep>", add_special_tokens=False) == [0]  # one unknown word
