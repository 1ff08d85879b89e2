"""MLM masking statistics and T5 span corruption that reassembles to the original text."""

from __future__ import annotations

import numpy as np
import pytest

from jaxformer.train.objectives import IGNORE, mask_tokens, random_spans_noise_mask, span_corrupt


def test_mlm_masking_statistics():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, size=(64, 512))
    ids[:, 0], ids[:, -1] = 1, 2  # [CLS] ... [SEP] are never selected
    inputs, labels = mask_tokens(ids, np.random.default_rng(1), vocab_size=1000, mask_id=3, special_ids=(1, 2))
    chosen = labels != IGNORE
    assert not chosen[:, 0].any() and not chosen[:, -1].any()
    assert abs(chosen[:, 1:-1].mean() - 0.15) < 0.005
    np.testing.assert_array_equal(labels[chosen], ids[chosen])
    masked = (inputs == 3) & chosen
    unchanged = (inputs == ids) & chosen
    replaced = chosen & ~masked & ~unchanged
    total = chosen.sum()
    # Within a few percent of 80/10/10 (a random replacement can hit the original token: ~0.1% here).
    assert abs(masked.sum() / total - 0.8) < 0.02
    assert abs(replaced.sum() / total - 0.1) < 0.02
    assert abs(unchanged.sum() / total - 0.1) < 0.02
    np.testing.assert_array_equal(inputs[~chosen], ids[~chosen])


@pytest.mark.parametrize("length", [20, 64, 512])
def test_noise_mask_density_and_spans(length):
    rng = np.random.default_rng(length)
    masks = np.stack([random_spans_noise_mask(length, rng) for _ in range(200)])
    assert abs(masks.mean() - 0.15) < 0.03
    assert not masks[:, 0].any()  # spans alternate starting with kept tokens
    starts = masks & ~np.concatenate([np.zeros((200, 1), bool), masks[:, :-1]], axis=1)
    assert abs(masks.sum() / starts.sum() - 3.0) < 0.6  # mean span length


def test_span_corruption_reassembles_to_the_original():
    rng = np.random.default_rng(7)
    ids = rng.integers(5, 32000, size=(16, 100))
    inputs, targets = span_corrupt(ids, np.random.default_rng(8), sentinel_start=32099)
    for original, source, target in zip(ids, inputs, targets):
        assert len(source) < len(original)
        spans, current = {}, None
        for token in target[:-1]:
            if token >= 32000:
                current = int(token)
                spans[current] = []
            else:
                spans[current].append(int(token))
        assert int(target[-1]) == 32099 - len(spans)  # the closing sentinel
        rebuilt = []
        for token in source:
            rebuilt += spans.pop(int(token)) if token >= 32000 else [int(token)]
        assert not spans
        np.testing.assert_array_equal(rebuilt, original)
