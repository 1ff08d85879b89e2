"""Prompt lookup in a batch: every row drafts from its own emitted text, so rows that agree take as few
target steps together as one of them alone (rows advance by the fewest drafts any row kept)."""

from __future__ import annotations

import numpy as np

import jaxformer as jf
from jaxformer import generate as gen


def test_every_row_of_a_batch_looks_up_its_own_emitted_text():
    """A vocabulary of 8 makes greedy text repeat, so lookup drafts are kept from the emitted text on: a
    batch of the same prompt twice takes as many target steps as the prompt alone (when only the first row's
    emitted tokens counted as known, the second row found no match and the batch took 23 steps for 11) and
    emits plain greedy's tokens."""
    model = jf.build(jf.config("tiny-llama").replace(vocab_size=8), seed=1)
    prompt = np.asarray([[1, 2, 3, 1, 2]])
    kwargs = dict(max_new_tokens=24, eos_token_id=None)
    plain = model.generate(prompt, **kwargs)
    rounds = {}
    for rows in (1, 2):
        args, gc = gen.prepare(model, np.repeat(prompt, rows, 0), prompt_lookup_num_tokens=3,
                               num_assistant_tokens_schedule="constant", **kwargs)
        tokens, steps, bad, rounds[rows] = gen.drafted_tokens_jit(*args, config=gc)
        np.testing.assert_array_equal(gen.assemble(model, np.repeat(prompt, rows, 0), tokens, steps, bad, gc),
                                      np.repeat(plain, rows, 0))
    assert int(rounds[1]) < 24 // 2, int(rounds[1])  # drafts were kept: the case exercises lookup from emitted text
    assert int(rounds[2]) == int(rounds[1]), (int(rounds[1]), int(rounds[2]))
