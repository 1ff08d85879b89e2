"""What the test files of single decoder families share (test_olmo2.py, test_starcoder2.py, test_cohere.py,
test_granite_smollm3_stablelm.py, test_olmoe_granitemoe_ernie.py, ...): a tiny checkpoint under another
config.json, parity with transformers on a padded batch, a config.json read quietly and as transformers writes it,
greedy or beam generation against transformers' with left padding, and the QLoRA run of test_family_tree.py
started from a file."""

from __future__ import annotations

import copy
import json
import shutil
import warnings

import numpy as np
import torch
import transformers

import jaxformer as jf
from jaxformer.compare import compare, format_table, reference_model
from jaxformer.interop.hf import config_from_hf
from jaxformer.train import run_config
from jaxformer.train.run import train

TOLERANCE = 1e-5
# The sizes of the tiny checkpoints (tests/hf_factory.py's LLaMA-like ones), for published files made tiny
TINY = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=2, num_key_value_heads=2,
            vocab_size=97, max_position_embeddings=64, initializer_range=0.2)
# test_family_tree.py's QLoRA run: an int8 base with adapters on q, v and the MLP input, 8 steps on the bytes tokenizer
QLORA = ["train.steps=8", "train.batch_size=8", "train.seq_len=32", "train.log_every=2", "eval.every=8",
         "eval.batches=1", "optim.warmup_steps=1", "train.sample_tokens=0", "checkpoint.every=0", "optim.lr=2e-2",
         "finetune.lora.rank=4", "finetune.lora.targets=q,v,wi", "finetune.lora.base_dtype=int8",
         "model.overrides.vocab_size=227"]  # the bytes tokenizer's ids; the tiny files hold 97 rows


def rewritten(source, folder, hf: dict):
    """A copy of the checkpoint ``source`` with ``hf`` as its config.json."""
    shutil.copytree(source, folder)
    (folder / "config.json").write_text(json.dumps(hf))
    return folder


def matches_transformers(folder, length: int = 9) -> None:
    """Every layer and the logits within TOLERANCE of transformers' on two rows, the second right-padded by 3."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 97, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, length - 3:] = 0
    rows = compare(folder, ids, mask)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


def read(hf: dict) -> jf.ModelConfig:
    """The ModelConfig of a config.json (the tiny files' out-of-vocabulary warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config_from_hf(copy.deepcopy(hf))


def as_transformers_writes_it(hf: dict) -> dict:
    """The config.json transformers' config class writes for ``hf``: its transformers-5 form, every key spelled out."""
    config = transformers.CONFIG_MAPPING[hf["model_type"]].from_dict(copy.deepcopy(hf))
    return json.loads(config.to_json_string(use_diff=False))


def generates_as_transformers(folder, **reference_kwargs) -> None:
    """Three prompts of 7 tokens, two left-padded, 10 new tokens: greedy search and beam search (3 beams)
    token-identical, each with an EOS that the first row writes early, so stopping is exercised (one load of
    each model for both searches). The EOS is read off transformers' search without it: ours then compiles
    once a search (the EOS ids are part of the compiled program), and equal tokens are what is asserted.
    ``reference_kwargs`` go to transformers' generate alone (use_cache=False: where its cached step departs from
    its own full forward)."""
    model, reference = jf.from_pretrained(folder), reference_model(folder)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 97, (3, 7))
    mask = np.ones_like(ids)
    mask[1, :2], mask[2, :4] = 0, 0
    ids = ids * mask

    def theirs(**kwargs):
        with torch.no_grad():
            return reference.generate(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), **reference_kwargs,
                                      **kwargs).numpy()

    for num_beams in (1, 3):
        kwargs = dict(max_new_tokens=10, num_beams=num_beams, do_sample=False, length_penalty=1.0)
        kwargs["eos_token_id"] = int(theirs(**kwargs)[0, 7 + 2])
        np.testing.assert_array_equal(model.generate(ids, mask, **kwargs), theirs(**kwargs),
                                      err_msg=f"num_beams={num_beams}")


def qlora_loss_falls(folder, run_dir, *overrides: str) -> None:
    """The QLoRA run from ``folder`` (``overrides`` after QLORA's) keeps finite losses and lowers them by 0.2."""
    cfg = run_config.load(None, QLORA + list(overrides) + [f"model.init_from=hf:{folder}", f"run.dir={run_dir}"])
    losses = [record["loss"] for record in train(cfg, progress=False)["history"]]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.2, losses
