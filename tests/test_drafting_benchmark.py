"""benchmarks/drafting.py's pieces on tiny models: the distillation data (continuations batched and padded
as one greedy call per row would make them, labels on the continuation only), the training that makes an
assistant agree with its target, and the accounting of target steps and acceptance its table reports."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import numpy as np
from flax import nnx

import jaxformer as jf
from jaxformer import generate as gen
from jaxformer.train.data import IGNORE

_SPEC = importlib.util.spec_from_file_location(
    "benchmarks_drafting", Path(__file__).resolve().parents[1] / "benchmarks" / "drafting.py")
drafting = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(drafting)

TINY = jf.config("tiny-gpt")  # GPT-2's architecture, 256 tokens, 128 positions


def test_continuations_batched_and_padded_are_each_rows_own_greedy_output():
    target = jf.build(TINY.replace(init_std=0.2), seed=0)
    prompts = drafting.random_prompts(5, 6, TINY.vocab_size, seed=0)
    sequences = drafting.greedy_continuations(target, prompts, new_tokens=7, rows_per_call=2)  # 3 calls, 1 row padded
    assert sequences.shape == (5, 13)
    for row, prompt in zip(sequences, prompts):
        np.testing.assert_array_equal(row, gen.generate(target, prompt[None], max_new_tokens=7, eos_token_id=None)[0])


def test_the_loss_reads_the_continuation_only():
    sequences = np.arange(20).reshape(2, 10)
    batch = drafting.continuation_batch(sequences, prompt=4)
    np.testing.assert_array_equal(batch["input_ids"], sequences[:, :-1])
    assert (batch["labels"][:, :3] == IGNORE).all()  # the prompt's own next tokens
    np.testing.assert_array_equal(batch["labels"][:, 3:], sequences[:, 4:])  # every continuation token


def test_the_distillation_recipe_trains_the_layers_on_the_targets_geometry():
    """The benchmark's recipe: the assistant's tables are the target's projected (inner products kept on
    average), frozen; its layers learn the target's continuations, so it agrees with the target more."""
    target = jf.build(TINY.replace(init_std=0.2), seed=0)
    sequences = drafting.greedy_continuations(
        target, drafting.random_prompts(16, 6, TINY.vocab_size, seed=1), new_tokens=12, rows_per_call=16)
    assistant = jf.build(TINY.replace(decoder_layers=1, d_model=32, num_heads=2, d_ff=64), seed=1)
    drafting.projected_embeddings(assistant, target)
    tables = nnx.state(assistant, drafting.embedding_tables)
    wide, narrow = np.asarray(target.embed.table[...]), np.asarray(assistant.embed.table[...])
    assert narrow.shape == (TINY.vocab_size, 32)
    assert np.corrcoef((wide @ wide.T).ravel(), (narrow @ narrow.T).ravel())[0, 1] > 0.4  # 0.62 here
    before = drafting.agreement(assistant, sequences, prompt=6)
    losses = drafting.train_assistant(assistant, sequences, prompt=6, epochs=20, batch_size=8, lr=1e-2,
                                      freeze_embeddings=True)
    after = drafting.agreement(assistant, sequences, prompt=6)
    jax.tree.map(np.testing.assert_array_equal, nnx.state(assistant, drafting.embedding_tables), tables)
    assert losses[-1] < losses[0] - 1, losses  # 6.9 -> 3.5 here
    assert after > before + 0.1, (before, after)  # 0.12 -> 0.34 here


def test_an_assistant_that_is_the_target_has_every_draft_accepted():
    """Drafts the target always keeps: 1 + (K + 1) * rounds tokens, acceptance 1, the table's counts exact."""
    target = jf.build(TINY.replace(init_std=0.2), seed=0)
    ids = drafting.random_prompts(1, 6, TINY.vocab_size, seed=2)
    plain, steps, accepted, proposed = drafting.jaxformer_runners(target, [ids], 9)[0]()
    assert (steps, accepted, proposed) == (9, 0, 0)
    out, steps, accepted, proposed = drafting.jaxformer_runners(
        target, [ids], 9, assistant_model=target, num_assistant_tokens=3, num_assistant_tokens_schedule="constant")[0]()
    np.testing.assert_array_equal(out, plain)
    assert (steps, accepted, proposed) == (3, 6, 6)  # the prefill's token, then 2 rounds of 3 drafts + 1


def test_the_table_rows_count_tokens_per_target_step_and_acceptance_over_every_call():
    same, other = np.zeros((1, 4)), np.ones((1, 4))
    runners = {"plain": [lambda: (same, 8, 0, 0)] * 2,
               "K=3": [lambda: (same, 2, 5, 6), lambda: (same, 4, 3, 9)],
               "heuristic": [lambda: (same, 3, 4, None)] * 2,
               "transformers assisted": [lambda: (other, None, 0, 0)] * 2}
    rows = drafting.timed(runners, batch=1, new_tokens=8, repeats=1, log=lambda message: None)
    assert list(rows) == ["b1 plain", "b1 K=3", "b1 heuristic", "b1 transformers assisted"]
    assert rows["b1 plain"]["tokens_per_target_step"] == 1 and rows["b1 plain"]["acceptance"] is None
    per_step = round(16 / 6, 2)  # 2 calls of 8 new tokens over 6 target steps
    assert rows["b1 K=3"]["tokens_per_target_step"] == per_step and rows["b1 K=3"]["acceptance"] == round(8 / 15, 3)
    assert rows["b1 heuristic"]["acceptance"] is None and rows["b1 heuristic"]["tokens_per_target_step"] == per_step
    assert rows["b1 transformers assisted"]["tokens_per_target_step"] is None
    assert [row["identical"] for row in rows.values()] == [True, True, True, False]
    assert all(row["vs_plain"] > 0 for row in rows.values()) and rows["b1 plain"]["vs_plain"] == 1
