"""Pretraining objectives that rewrite a batch on the host: BERT's masked LM and T5's span corruption.

Both take a numpy ``Generator`` so a batch is a pure function of (seed, step), like the data.
"""

from __future__ import annotations

import numpy as np

IGNORE = -100  # label of positions that carry no loss


def mask_tokens(ids: np.ndarray, rng: np.random.Generator, *, vocab_size: int, mask_id: int,
                special_ids: tuple[int, ...] = (), select: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masking: ``select`` of the non-special tokens are predicted; of those 80% become
    ``mask_id``, 10% a random token and 10% stay. Returns (inputs, labels with IGNORE elsewhere)."""
    if not 0 < select < 1:
        raise ValueError(f"select={select} must lie in (0, 1)")
    candidates = ~np.isin(ids, np.asarray(special_ids, ids.dtype)) if special_ids else np.ones(ids.shape, bool)
    chosen = candidates & (rng.random(ids.shape) < select)
    labels = np.where(chosen, ids, IGNORE)
    action = rng.random(ids.shape)
    inputs = np.where(chosen & (action < 0.8), mask_id, ids)
    random_tokens = rng.integers(0, vocab_size, ids.shape)
    inputs = np.where(chosen & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs.astype(ids.dtype), labels


def random_spans_noise_mask(length: int, rng: np.random.Generator, noise_density: float = 0.15,
                            mean_span_length: float = 3.0) -> np.ndarray:
    """T5's noise mask: about ``noise_density`` of ``length`` tokens in spans of mean length
    ``mean_span_length``, alternating with kept spans and starting with a kept one."""
    noise = int(round(length * noise_density))
    noise = min(max(noise, 1), length - 1)
    spans = max(int(round(noise / mean_span_length)), 1)
    kept = length - noise

    def partition(total: int) -> np.ndarray:  # `spans` positive parts summing to total, uniformly
        cuts = np.sort(rng.choice(np.arange(1, total), spans - 1, replace=False)) if spans > 1 else np.array([], int)
        return np.diff(np.concatenate([[0], cuts, [total]]))

    noise_lengths, kept_lengths = partition(noise), partition(kept)
    mask = np.zeros(length, bool)
    start = 0
    for keep, drop in zip(kept_lengths, noise_lengths):
        start += keep
        mask[start:start + drop] = True
        start += drop
    return mask


def span_corrupt(ids: np.ndarray, rng: np.random.Generator, *, sentinel_start: int, noise_density: float = 0.15,
                 mean_span_length: float = 3.0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """T5's span corruption of each row: noise spans become one sentinel each in the input
    (``sentinel_start``, then ``sentinel_start - 1``, ... as T5's <extra_id_0>, <extra_id_1>, ...);
    the target lists each sentinel followed by the span it hides, and ends with the next sentinel."""
    inputs, targets = [], []
    for row in ids:
        mask = random_spans_noise_mask(len(row), rng, noise_density, mean_span_length)
        starts = mask & ~np.concatenate([[False], mask[:-1]])
        sentinels = sentinel_start - (np.cumsum(starts) - 1)
        if sentinels.min() < 0:
            raise ValueError("more noise spans than sentinel ids below sentinel_start")
        inputs.append(np.where(starts, sentinels, row)[~mask | starts].astype(ids.dtype))
        pieces = [np.concatenate([[sentinels[i]], row[i:i + _run_length(mask, i)]]) for i in np.flatnonzero(starts)]
        closing = sentinel_start - int(starts.sum())
        targets.append(np.concatenate(pieces + [[closing]]).astype(ids.dtype))
    return inputs, targets


def _run_length(mask: np.ndarray, start: int) -> int:
    end = start
    while end < len(mask) and mask[end]:
        end += 1
    return end - start
