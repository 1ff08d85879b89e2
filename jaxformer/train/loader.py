"""The training loop's batches: a Grain pipeline over step indices that builds this process's rows of each
step's batch (``Objective.batch_rows``) on ``data.loader_threads`` threads, ``data.prefetch`` batches ahead of
the step that runs, and whose iterator state the checkpoint keeps.

Each row is a pure function of (seed, step, row), so the state Grain saves is where the loop stands (its
next step) and a resume from it is bit-exact whatever the number of processes; a state that disagrees with
the checkpoint's step is refused rather than trained on.
"""

from __future__ import annotations

import grain


def batches(objective, batch_size: int, steps: int, rows: range, threads: int, prefetch: int):
    """The iterable of step batches [0, steps): this process's ``rows`` of each."""
    steps_dataset = grain.MapDataset.range(steps).map(lambda step: objective.batch_rows(step, batch_size, rows))
    return steps_dataset.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch))


def start(dataset, step: int, state: dict | None = None):
    """An iterator over ``dataset`` whose next batch is step ``step``'s: at ``state`` (a checkpoint's, which
    must say the same step), else positioned there."""
    state = {"next_index": step} if state is None else state
    if state.get("next_index") != step:
        raise ValueError(f"the checkpoint of step {step} holds a data loader positioned at {state!r}: it is "
                         "inconsistent; move that step aside to resume from an earlier one")
    iterator = iter(dataset)
    iterator.set_state(state)
    return iterator
