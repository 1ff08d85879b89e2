"""Longformer (``longformer``: windowed attention plus global tokens with their own projections) as transformers
computes it: the published file reads as its transformers-5 form and matches transformers' numbers with global
tokens chosen by the call, on lengths transformers pads to a multiple of the window; a long-document question
(about 1,000 context tokens) gets transformers' start and end logits and answer span from the span head's own
choice of global tokens (the question); settings jaxformer cannot honour and bad global masks are refused by name.
Parity of every layer, attention map and head of the tiny checkpoints (with the heads' default global tokens) and
the bit-exact round trip are in test_hf_parity.py, every key changed one at a time in test_config_keys.py, the
presets' counts against transformers' in test_presets.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table, reference_model  # noqa: E402

from family_files import TOLERANCE, as_transformers_writes_it, read, rewritten  # noqa: E402
from hf_factory import save_checkpoint  # noqa: E402

TINY = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=2, vocab_size=97,
            initializer_range=0.2)
# allenai/longformer-base-4096's config.json (no architectures: read as LongformerModel), every key kept, sizes made
# tiny (windows of 4 shorter than the test sequences)
PUBLISHED = {"attention_mode": "longformer", "attention_probs_dropout_prob": 0.1, "attention_window": [4, 4],
             "bos_token_id": 0, "eos_token_id": 2, "gradient_checkpointing": False, "hidden_act": "gelu",
             "hidden_dropout_prob": 0.1, "ignore_attention_mask": False, "layer_norm_eps": 1e-05,
             "max_position_embeddings": 42, "model_type": "longformer", "pad_token_id": 1, "sep_token_id": 2,
             "type_vocab_size": 1, **TINY}


def _batch(length: int, rng: np.random.Generator):
    """Three rows: the second right-padded by 4, global tokens on the first and a middle token of the first
    row, on the first token of the second (whose padding is never global), none in the third."""
    ids = rng.integers(3, 97, size=(3, length))
    mask = np.ones_like(ids)
    mask[1, length - 4:] = 0
    ids[1, length - 4:] = 1
    chosen = np.zeros_like(ids)
    chosen[0, [0, length // 2]] = 1
    chosen[1, [0, length - 2]] = 1  # the second lies in the padding
    return ids, mask, chosen


def test_the_published_file_reads_as_its_transformers_5_form_and_matches_with_global_tokens(checkpoints, tmp_path):
    """13 tokens, padded by transformers to 16 (a multiple of the window): every layer, attention map (its banded
    and global probabilities made [B, N, T, T]) and the pooler to 1e-5."""
    cfg = read(PUBLISHED)
    assert read(as_transformers_writes_it(PUBLISHED)).replace(name=cfg.name) == cfg
    assert (cfg.window_size, cfg.layer_types, cfg.scores.global_tokens, cfg.tokens.sep, cfg.head) == \
        (2, ("sliding", "sliding"), True, 2, "none")
    folder = rewritten(checkpoints("longformer"), tmp_path / "published", PUBLISHED)
    ids, mask, chosen = _batch(13, np.random.default_rng(0))
    rows = compare(folder, ids, mask, global_attention_mask=chosen)
    assert sum(r.name.startswith("attention ") for r in rows) == 2 and any(r.name == "pooler" for r in rows)
    assert all(r.max_abs <= TOLERANCE for r in rows), format_table(rows, TOLERANCE)


def test_a_long_document_question_gets_transformers_answer(tmp_path):
    """A question of 12 tokens and a context of 1,000 (windows of 32 tokens, transformers padding to 1,024): the
    span head puts global attention on the question itself, as transformers' does; start and end logits to 1e-5
    and the same best span."""
    folder = save_checkpoint("longformer-qa", tmp_path / "qa", seed=1,
                             changes={"max_position_embeddings": 1030, "attention_window": 32})
    rng = np.random.default_rng(1)
    question, context = rng.integers(3, 97, 12), rng.integers(3, 97, 1000)
    ids = np.concatenate([[0], question, [2, 2], context, [2]])[None]
    model, reference = jf.from_pretrained(folder), reference_model(folder)
    out = model(ids)
    with torch.no_grad():
        theirs = reference(input_ids=torch.as_tensor(ids))
    start, end = np.asarray(out.start_logits), np.asarray(out.end_logits)
    np.testing.assert_allclose(start, theirs.start_logits.numpy(), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(end, theirs.end_logits.numpy(), atol=TOLERANCE, rtol=0)

    def best_span(s, e, first=15, longest=30):  # over the context only, start <= end < start + longest
        scores = s[first:, None] + e[None, first:]
        allowed = np.triu(np.ones_like(scores, bool)) & ~np.triu(np.ones_like(scores, bool), longest)
        i, j = np.unravel_index(np.argmax(np.where(allowed, scores, -np.inf)), scores.shape)
        return first + i, first + j

    assert best_span(start[0], end[0]) == best_span(theirs.start_logits.numpy()[0], theirs.end_logits.numpy()[0])
    global_tokens = np.asarray(model.global_token_mask(ids))
    assert global_tokens[0, :13].all() and not global_tokens[0, 13:].any()  # <s> and the question


def test_bad_global_masks_are_refused_by_name(checkpoints):
    model = jf.from_pretrained(checkpoints("longformer-qa"))
    ids = np.random.default_rng(2).integers(3, 97, size=(2, 9))
    with pytest.raises(ValueError, match="exactly three separators"):
        model(ids)  # no global_attention_mask and no question to find
    with pytest.raises(ValueError, match="global_attention_mask has shape"):
        model(ids, global_attention_mask=np.zeros((2, 8), np.int32))
    with pytest.raises(ValueError, match="only 0 .local attention. and 1"):
        model(ids, global_attention_mask=np.full((2, 9), 2))
    assert model(ids, global_attention_mask=np.zeros((2, 9), np.int32)).start_logits.shape == (2, 9)
    bert = jf.build(jf.config("tiny-bert"))
    with pytest.raises(ValueError, match="this model has none"):
        bert(ids, global_attention_mask=np.zeros((2, 9), np.int32))


@pytest.mark.parametrize("changes, message", [
    ({"attention_window": [4, 6]}, "differs between layers"),
    ({"attention_window": 5}, "positive even sizes"),
    ({"attention_window": [4, 4, 4]}, "lists 3 windows for num_hidden_layers=2"),
])
def test_settings_jaxformer_cannot_honour_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        read({**PUBLISHED, **changes})
