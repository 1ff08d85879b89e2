"""The benchmarks' one timing rule: the sides are called in turn (A, B, A, B, ...), so each sees the machine as
loaded as the other, and each is reported by its median call."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def interleaved(sides: dict[str, Callable[[], Any]], repeats: int
                ) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
    """(each side's first output, each side's median seconds over ``repeats`` calls, each side's first call's
    seconds). The first call of each side is not in the median: it warms caches and compiles."""
    outputs, first = {}, {}
    for name, run in sides.items():
        start = time.perf_counter()
        outputs[name] = run()
        first[name] = time.perf_counter() - start
    times = {name: [] for name in sides}
    for _ in range(repeats):
        for name, run in sides.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return outputs, {name: statistics.median(t) for name, t in times.items()}, first
