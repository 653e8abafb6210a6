"""How a check's time grows with its input, for tests that guard against quadratic validation.

An absolute time limit fails on a loaded machine, or when a cyclic garbage collection of a long
test session's heap lands inside the timed call (CI saw a 0.12 s check take 0.54 s). The ratio of
two sizes' times does not depend on the machine's speed: linear work gives about ``factor``, a
quadratic check ``factor`` squared. Each size takes its best of ``repeats`` runs with the
collector paused, so one stall does not decide the result."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def best_time(check: Callable[[T], object], subject: T, repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``check(subject)``, garbage collection paused."""
    best = float("inf")
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            check(subject)
            best = min(best, time.perf_counter() - start)
    finally:
        if enabled:
            gc.enable()
    return best


def growth(
    build: Callable[[int], T],
    check: Callable[[T], object],
    n: int,
    *,
    factor: int = 4,
    repeats: int = 3,
) -> tuple[float, float, float]:
    """``(ratio, small, large)``: the best time of ``check`` on ``build(factor * n)`` over its
    best time on ``build(n)``, and the two times."""
    small = best_time(check, build(n), repeats)
    large = best_time(check, build(factor * n), repeats)
    return large / small, small, large
