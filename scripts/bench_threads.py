#!/usr/bin/env python3
"""Multi-core scaling of a batch: ``threads=0`` (the automatic count) against ``threads=1``.

    SMG_TEST_CACHE=... python scripts/bench_threads.py [--families qwen2_vl,llava_next]
        [--case "batch of 8"] [--repeat 7] [--runs 3]

For each family, one call = image bytes -> the vLLM request's wire bytes:
``VisionModel.prepare(files, threads=t)`` (decode, resize, tokens) + ``generate_request`` +
``tensors.serialize`` (where deferred families write their pixel values), on the real photos of
``benchkit.REAL_PHOTO_CASES[case]``. The two thread settings alternate call by call, so a busy
moment on a shared machine hits both alike. Each run reports the median wall time of each and
the wall scaling ``t(threads=1) / t(threads=0)`` — meaningful on a quiet machine only — and a
CPU-time scaling that holds on a busy one: the CPU time of a ``threads=1`` call over the
critical path of a ``threads=0`` call, ``max(calling thread's CPU time, the other workers' CPU
time)`` (``time.thread_time`` / ``time.process_time``; exact for 2 cores, where the batch runs
on the calling thread and one worker). Serial sections stay on the calling thread and show up
as a CPU-time scaling below 2. Unpinned, of course.

``--small SIDES`` (e.g. ``128,192,256,384,512``) times batches of ``--count`` copies of a real
photo (``hubble_deep_field.jpg``) resized to each side and encoded as JPEG (quality 90), the same
call with ``threads=1`` and ``threads=0`` alternating ``--repeat`` times: where an automatic thread
count pays for a second thread and where it does not (medians of wall and process CPU time).

``--keep-freed-memory`` calls :func:`smg_grpc_proto.tensors.keep_freed_memory` first (256 MiB):
the 94 MB request of the batch is then written into the previous request's pages instead of
fresh ones that the kernel must fault in and clear (as a server that opts in would run).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from benchkit import REAL_PHOTO_CASES, cpu_model, real_photo_cases

import smg_grpc_proto
from smg_grpc_proto import tensors
from smg_grpc_proto.engines import VisionModel
from smg_grpc_proto.engines import vllm as vllm_adapter


def one_run(model: VisionModel, files: list[bytes], repeat: int) -> dict[str, float]:
    def call(threads: int) -> tuple[float, float, float]:
        wall, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
        media = model.prepare(files, threads=threads)
        ids = [1, *([media.anchor] * media.count), 2]
        tensors.serialize(vllm_adapter.generate_request("b", ids, media))
        return (
            time.perf_counter() - wall,
            time.process_time() - cpu,
            time.thread_time() - own,
        )

    call(1)
    call(0)
    walls: dict[int, list[float]] = {1: [], 0: []}
    cpus: dict[int, list[float]] = {1: [], 0: []}
    paths: list[float] = []
    for _ in range(repeat):
        for threads in (1, 0):
            wall, cpu, own = call(threads)
            walls[threads].append(wall)
            cpus[threads].append(cpu)
            if threads == 0:
                # the calling thread's CPU time vs the other workers' (the rest of the process)
                paths.append(max(own, cpu - own))
    one, many = statistics.median(walls[1]), statistics.median(walls[0])
    cpu_one = statistics.median(cpus[1])
    return {
        "one": one,
        "many": many,
        "scaling": one / many,
        "cpu_one": cpu_one,
        "cpu_many": statistics.median(cpus[0]),
        "estimate": cpu_one / statistics.median(paths),
    }


def small_batches(family: str, sides: list[int], count: int, repeat: int) -> None:
    """The ``--small`` table: per side, the medians of ``repeat`` alternating calls."""
    import io

    from PIL import Image

    photo = next(p for p in real_photo_cases()["batch of 8"] if p.name == "hubble_deep_field.jpg")
    source = Image.open(photo).convert("RGB")
    model = VisionModel.for_family(family)
    print(f"| {family}: images | threads=1 / 0 µs | wall scaling | CPU µs threads=1 / 0 |")
    print("|---|---|---|---|")
    for side in sides:
        buffer = io.BytesIO()
        source.resize((side, side), Image.Resampling.BICUBIC).save(buffer, "JPEG", quality=90)
        files = [buffer.getvalue()] * count
        walls: dict[int, list[float]] = {1: [], 0: []}
        cpus: dict[int, list[float]] = {1: [], 0: []}

        def call(threads: int, files: list[bytes] = files) -> None:
            media = model.prepare(files, threads=threads)
            ids = [1, *([media.anchor] * media.count), 2]
            tensors.serialize(vllm_adapter.generate_request("b", ids, media))

        call(1)  # warm-up
        call(0)
        for _ in range(repeat):
            for threads in (1, 0):
                wall, cpu = time.perf_counter(), time.process_time()
                call(threads)
                walls[threads].append(time.perf_counter() - wall)
                cpus[threads].append(time.process_time() - cpu)
        one, many = statistics.median(walls[1]), statistics.median(walls[0])
        print(
            f"| {count} x {side}x{side} | {one * 1e6:.0f} / {many * 1e6:.0f} | {one / many:.2f}x | "
            f"{statistics.median(cpus[1]) * 1e6:.0f} / {statistics.median(cpus[0]) * 1e6:.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="qwen2_vl,llava_next,gemma3")
    parser.add_argument("--case", default="batch of 8", choices=list(REAL_PHOTO_CASES))
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep-freed-memory", action="store_true")
    parser.add_argument(
        "--small",
        metavar="SIDES",
        help="e.g. 128,192,256: small batches instead (--case, --runs, --keep-freed-memory unused)",
    )
    parser.add_argument("--count", type=int, default=2, help="images per small batch")
    args = parser.parse_args()
    if args.small:
        sides = [int(x) for x in args.small.split(",")]
        info = smg_grpc_proto.build_info()
        print(
            f"# {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"native core {info['version']} ({info['profile']}); {args.count} images per batch, "
            f"{args.repeat} calls each; load average {os.getloadavg()[0]:.1f}"
        )
        for family in args.families.split(","):
            small_batches(family, sides, args.count, args.repeat)
        return
    if args.keep_freed_memory and not tensors.keep_freed_memory(256 << 20):
        raise SystemExit("keep_freed_memory is not available here (glibc only)")
    files = [p.read_bytes() for p in real_photo_cases()[args.case]]
    info = smg_grpc_proto.build_info()
    print(
        f"# {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"native core {info['version']} ({info['profile']}); {args.case}; "
        f"load average {os.getloadavg()[0]:.1f}"
        + ("; keep_freed_memory(256 MiB)" if args.keep_freed_memory else "")
    )
    print(
        "| family | run | threads=1 ms | threads=0 ms | wall scaling | CPU ms threads=1 / 0 "
        "| CPU-time scaling |"
    )
    print("|---|---|---|---|---|---|---|")
    for family in args.families.split(","):
        model = VisionModel.for_family(family)
        runs = [one_run(model, files, args.repeat) for _ in range(args.runs)]
        for i, r in enumerate(runs, 1):
            print(
                f"| {family} | {i} | {r['one'] * 1e3:.1f} | {r['many'] * 1e3:.1f} | "
                f"{r['scaling']:.2f}x | {r['cpu_one'] * 1e3:.1f} / {r['cpu_many'] * 1e3:.1f} | "
                f"{r['estimate']:.2f}x |"
            )
        wall = statistics.median(r["scaling"] for r in runs)
        estimate = statistics.median(r["estimate"] for r in runs)
        print(f"| {family} | median | | | {wall:.2f}x | | {estimate:.2f}x |")


if __name__ == "__main__":
    main()
