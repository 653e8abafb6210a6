"""How a check's time grows with its input, for tests that guard against quadratic validation.

An absolute time limit fails on a loaded machine, or when a cyclic garbage collection of a long
test session's heap lands inside the timed call (CI saw a 0.12 s check take 0.54 s). The ratio of
two sizes' times does not depend on the machine's speed: linear work gives about ``factor``, a
quadratic check ``factor`` squared. Each size takes its best of ``repeats`` runs with the
collector paused, so one stall does not decide the result; the runs of the two sizes alternate,
so a change of load between them moves both. Repeats reuse one subject (warm caches), which
a linear check and a quadratic one share alike."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def growth(
    build: Callable[[int], T],
    check: Callable[[T], object],
    n: int,
    *,
    factor: int = 4,
    repeats: int = 3,
    limit: float = float("inf"),
) -> tuple[float, float, float]:
    """``(ratio, small, large)``: the best time of ``check`` on ``build(factor * n)`` over its
    best time on ``build(n)``, and the two times. The runs alternate between the sizes; a run
    of the large size slower than ``limit`` seconds ends the measurement at once (a quadratic
    regression fails in one run, not three)."""
    subjects = (build(n), build(factor * n))
    best = [float("inf"), float("inf")]
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            for i, subject in enumerate(subjects):
                start = time.perf_counter()
                check(subject)
                best[i] = min(best[i], time.perf_counter() - start)
            if best[1] > limit:
                break
    finally:
        if enabled:
            gc.enable()
    return best[1] / best[0], best[0], best[1]
