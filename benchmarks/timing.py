"""Wall-clock timing shared by the benchmark scripts (they run as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def wall_times(fn: Callable[[], object], repeat: int) -> list[float]:
    """Wall time in seconds of each of ``repeat`` calls of ``fn()``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Smallest wall time in seconds over ``repeat`` calls."""
    return min(wall_times(fn, repeat))


def median_time(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time in seconds over ``repeat`` calls."""
    return statistics.median(wall_times(fn, repeat))
