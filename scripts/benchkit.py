"""Timing and memory helpers shared by the benchmark scripts (``bench_*.py``)."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def time_op(
    fn: Callable[[], Any],
    repeat: int,
    min_seconds: float = 0.25,
    max_calls: int = 2000,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median seconds of at least ``repeat`` calls of ``fn`` after one warm-up call (page
    faults); fast operations are called until ``min_seconds`` of timed calls have passed (up to
    ``max_calls``), so that a millisecond operation's median is not left to a handful of samples
    on a noisy machine. ``clock`` is wall time by default; ``CLOCKS["cpu"]`` (process CPU time,
    user + system) leaves out the time spent waiting for a core on a loaded machine, which
    otherwise hits the slower side of a comparison harder (its calls span more preemptions)."""
    fn()
    times: list[float] = []
    while len(times) < repeat or (sum(times) < min_seconds and len(times) < max_calls):
        start = clock()
        result = fn()
        times.append(clock() - start)
        del result
    return statistics.median(times)


#: ``--clock`` choices of the benchmark scripts: wall time, or the process's CPU time (only
#: meaningful for single-threaded operations).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def measure_peak(fn: Callable[[], Any]) -> float:
    """Extra peak resident memory (MiB) of one call of ``fn``; run it in a fresh process.

    Resets the kernel's high-water mark (``/proc/self/clear_refs`` = 5) just before the call and
    returns ``VmHWM`` after it minus ``VmRSS`` before it.
    """
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kib("VmRSS")
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    return (peak - base) / 1024


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


#: The real-photo cases of the family benchmarks: (case name, file names of the parity corpus,
#: ``tests/support/images.real_photos()``: Grace Hopper, Pillow's and scikit-image's photos).
REAL_PHOTO_CASES: dict[str, list[str]] = {
    "512x600 JPEG (grace_hopper)": ["grace_hopper.jpg"],
    "1000x872 JPEG (hubble_deep_field)": ["hubble_deep_field.jpg"],
    "2000x1072 JPEG (xmp_test)": ["xmp_test.jpg"],
    "741x500 PNG (motorcycle_left)": ["motorcycle_left.png"],
    "batch of 8": [
        "grace_hopper.jpg",
        "hubble_deep_field.jpg",
        "rocket.jpg",
        "junk_jpeg_header.jpg",
        "retina.jpg",
        "coffee.png",
        "chelsea.png",
        "motorcycle_left.png",
    ],
}


def real_photo_cases() -> dict[str, list[Path]]:
    """``REAL_PHOTO_CASES`` as paths (the photos are fetched into the test cache once)."""
    import sys

    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from support.images import real_photos

    photos = real_photos()
    return {case: [photos[name] for name in names] for case, names in REAL_PHOTO_CASES.items()}


def decoding_cells(rounds: list[dict[str, float]], case: str, inp: str, theirs_ms: float) -> str:
    """The "decode alone (ms) reference / ours | ceiling" cells of a family benchmark row: for
    the bytes rows, each side's decoding alone (the ``<case>|<side>|decode`` timings of the
    rounds) and the ceiling, the reference's time over our decoder's (the speed-up if everything
    after our decoder cost nothing); empty cells for the decoded rows."""
    if inp != "bytes":
        return " | "
    theirs, ours = (
        statistics.median(r[f"{case}|{side}|decode"] for r in rounds) * 1e3
        for side in ("theirs", "ours")
    )
    return f"{theirs:.2f} / {ours:.2f} | {theirs_ms / ours:.1f}x"
