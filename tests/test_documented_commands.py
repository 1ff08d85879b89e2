"""Every command the documentation shows works as shown, on tiny stand-ins for its placeholders.

The commands are read from the fenced blocks of README.md and docs/*.md (continuation lines joined,
comments dropped, ``[optional]`` parts written out), and from the configs' own comments that tell how
to start them from a checkpoint (``model.init_from=hf:PATH ...``). A training command is carried up to
its first step: its config is read as train.py reads it and the run is built (mesh, data and
objective, the model created or loaded from ``hf:PATH``, adapters and int8 kernels), which is where a
file's settings and a checkpoint disagree; the steps themselves are trained by test_train.py and the
task tests. ``hf:PATH`` is a tiny checkpoint saved by transformers with a real position table and a
tokenizer.json, of the family the run's objective trains. Every other ``jaxformer`` command must
parse with the command line's own parser (a renamed flag or subcommand fails here).
"""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path

import pytest

from jaxformer.cli import parse
from jaxformer.train.run import Run, command_line_config

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"^\s*(\$\s+)?(python3? train\.py|jaxformer)(\s|$)")  # "$ " in console blocks
# Placeholders of jaxformer's flags that must be numbers: --layer L, --head H
NUMBERS = {"L": "0", "H": "0"}


def _fenced_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        fenced, lines = False, page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if line.startswith("```"):
                fenced = not fenced
                continue
            if not fenced or not COMMAND.match(line):
                continue
            text, end = line.strip().removeprefix("$").strip(), number
            while text.rstrip().endswith("\\"):
                text = text.rstrip()[:-1] + " " + lines[end].strip()
                end += 1
            text = re.sub(r"\[([^\]]*)\]", r"\1", text)  # [--step 200]: the optional part, written out
            words = [NUMBERS.get(word, word) for word in shlex.split(text, comments=True)]
            found.append((f"{page.relative_to(ROOT)}:{number}", words))
    return found


def _config_comment_commands() -> list[tuple[str, list[str]]]:
    """A config whose comments say to fine-tune a checkpoint with ``model.init_from=hf:PATH``, with the
    other settings the comments name for it (data.tokenizer=auto; base_dtype=int8 for QLoRA)."""
    found = []
    for config in sorted((ROOT / "configs").glob("*.yaml")):
        comments = " ".join(line for line in config.read_text(encoding="utf-8").splitlines() if line.startswith("#"))
        if "model.init_from=hf:PATH" not in comments:
            continue
        command = ["python", "train.py", str(config.relative_to(ROOT)), "model.init_from=hf:PATH"]
        command += ["data.tokenizer=auto"] if "data.tokenizer=auto" in comments else []
        found.append((f"{config.relative_to(ROOT)} (comment)", command))
        if "finetune.lora.base_dtype=int8" in comments:
            found.append((f"{config.relative_to(ROOT)} (comment, int8)", command + ["finetune.lora.base_dtype=int8"]))
    return found


def _unique(commands):
    """Each command once, at the first place it is shown (the README's tour repeats some)."""
    seen, unique = set(), []
    for where, words in commands:
        if tuple(words) not in seen:
            seen.add(tuple(words))
            unique.append((where, words))
    return unique


COMMANDS = _unique(_fenced_commands() + _config_comment_commands())
TRAINING = [(where, words) for where, words in COMMANDS if words[:2] in (["python", "train.py"], ["python3", "train.py"])
            or words[:2] == ["jaxformer", "train"]]
OTHERS = [(where, words) for where, words in COMMANDS if (where, words) not in TRAINING]


def test_the_documentation_shows_commands_to_check():
    # The pages this reads exist and hold the commands the README's tour and each topic page show.
    assert len(TRAINING) >= 10 and len(OTHERS) >= 15, (len(TRAINING), len(OTHERS))


@pytest.mark.parametrize("where, words", OTHERS, ids=[where for where, _ in OTHERS])
def test_a_documented_jaxformer_command_parses(where, words):
    try:
        parse(words[1:])
    except SystemExit:
        pytest.fail(f"{where}: `{shlex.join(words)}` does not parse (see the usage message above)")


# --------------------------------------------------------------------------------------------------
# Training commands, built up to their first step


def _tokenizer(folder: Path, size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<extra_id_0>"]
    words = special + [f"w{i}" for i in range(size - len(special))]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))


# The family each objective trains, and a tiny checkpoint of it as a user would download one: real
# position tables (train.seq_len of the configs fits), widths of a test model, and a tokenizer.json.
FAMILY = {"causal_lm": "decoder", "prefix_lm": "decoder", "mlm": "encoder", "classification": "encoder",
          "token_classification": "encoder", "question_answering": "encoder", "seq2seq": "encoder_decoder",
          "span_corruption": "encoder_decoder", "ul2": "encoder_decoder"}
STAND_INS = {
    "decoder": ("LlamaConfig", "LlamaForCausalLM", dict(vocab_size=128, hidden_size=32, intermediate_size=48,
                                                        num_hidden_layers=2, num_attention_heads=4,
                                                        num_key_value_heads=2, max_position_embeddings=2048)),
    "encoder": ("BertConfig", "BertForPreTraining", dict(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                                                         num_attention_heads=4, intermediate_size=48,
                                                         max_position_embeddings=512)),
    "encoder_decoder": ("T5Config", "T5ForConditionalGeneration", dict(vocab_size=128, d_model=32, d_ff=48, d_kv=8,
                                                                       num_layers=2, num_heads=4,
                                                                       decoder_start_token_id=0)),
}


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    made: dict[str, Path] = {}

    def folder(family: str) -> Path:
        if family not in made:
            import torch
            import transformers

            config_class, model_class, kwargs = STAND_INS[family]
            torch.manual_seed(0)
            model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs))
            made[family] = tmp_path_factory.mktemp(family)
            model.save_pretrained(made[family])
            _tokenizer(made[family], 100)
        return made[family]

    return folder


def _documented_run_dirs() -> set[str]:
    dirs = set()
    for _, words in TRAINING:
        argv = words[2:]
        if "hf:PATH" not in " ".join(argv):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dirs.add(command_line_config(argv).run.dir)
    return dirs


@pytest.mark.parametrize("where, words", TRAINING, ids=[where for where, _ in TRAINING])
def test_a_documented_training_command_builds_its_run(where, words, stand_ins, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the documentation's paths are relative to the checkout
    argv = words[2:] + [f"run.dir={tmp_path / 'run'}"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a note such as "these overrides are not applied" is fine here
        cfg = command_line_config([a.replace("hf:PATH", "hf:?") for a in argv])
    if cfg.model.init_from == "hf:?":
        folder = stand_ins(FAMILY[cfg.train.objective])
        cfg = command_line_config([a.replace("hf:PATH", f"hf:{folder}") for a in argv])
    elif cfg.model.init_from.startswith("jaxformer:"):
        # A chain (default -> t5gemma_adapt -> t5gemma_numbers): the run it starts from must be one the
        # documentation trains; test_train.py trains the chain itself.
        source = cfg.model.init_from.removeprefix("jaxformer:")
        assert source in _documented_run_dirs(), f"{where}: model.init_from={cfg.model.init_from} names no " \
                                                 "run a documented command trains"
        return
    try:
        Run.build(cfg)
    except ValueError as err:
        pytest.fail(f"{where}: `{shlex.join(words)}` fails before its first step: {err}")
