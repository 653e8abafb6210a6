#!/usr/bin/env python3
"""Engine adapter benchmark: image bytes -> engine-ready tensors, ours and the plain-Python path
side by side in one run.

Qwen2-VL (transformers' class defaults) into a vLLM ``GenerateRequest`` and back out on the
engine side, one thread:

* **ours** — ``VisionModel.prepare`` (Rust: decode, resize, normalise, patch, BLAKE3 hashes),
  ``engines.vllm.generate_request`` + ``tensors.serialize`` (one copy of the pixels), then
  ``tensors.parse`` + ``engines.vllm.decode_mm_inputs`` (zero-copy views, every field checked);
* **plain** — ``Image.open`` + ``convert("RGB")`` + ``Qwen2VLImageProcessorPil`` (transformers
  5.24.0, Pillow 13), ``inline = array.tobytes()`` + ``SerializeToString()``, then
  ``FromString`` + a writable copy per tensor (``smg_grpc_proto.demo.plain_*``, what servers
  and gateways written in Python do today).

Each round is a fresh process timing both implementations on the same images (stages and the
whole pipeline, median of ``--repeat`` calls); figures are medians over ``--rounds`` rounds.
Peak memory is measured in a fresh process per implementation and case. Both paths are checked
to produce the same bytes before anything is timed.

    python scripts/bench_engines.py --rounds 3   # prints a Markdown table
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_vision import write_images  # noqa: E402
from benchkit import cpu_model, measure_peak, time_op  # noqa: E402

STAGES = ("preprocess", "encode", "decode", "total")
CASES = ("512x600", "1280x960", "1920x1080", "4032x3024", "batch of 8")


def pipeline(impl: str, files: list[bytes]) -> dict[str, Callable[[], Any]]:
    """Zero-argument callables for each stage of ``impl`` on ``files`` (and the whole path)."""
    import numpy as np

    from smg_grpc_proto import demo, tensors
    from smg_grpc_proto.engines import VisionModel
    from smg_grpc_proto.engines import vllm as adapter
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb

    prompt = demo.prompt_for(len(files))
    if impl == "ours":
        model = VisionModel.for_family("qwen2_vl")

        def prepare() -> Any:
            return model.prepare(files, threads=1)

        media = prepare()
        request = adapter.generate_request("b", prompt, media)
        data = tensors.serialize(request)

        def encode() -> bytes:
            return tensors.serialize(adapter.generate_request("b", prompt, media))

        def decode() -> Any:
            return adapter.decode_mm_inputs(tensors.parse(data, pb.GenerateRequest), merge_size=2)

        def total() -> Any:
            m = model.prepare(files, threads=1)
            wire = tensors.serialize(adapter.generate_request("b", prompt, m))
            return adapter.decode_mm_inputs(tensors.parse(wire, pb.GenerateRequest), merge_size=2)

        return {"preprocess": prepare, "encode": encode, "decode": decode, "total": total}

    model = VisionModel.for_family("qwen2_vl")
    media = model.prepare(files)
    meta = adapter.generate_request("m", prompt, media).message
    ids = list(meta.tokenized.input_ids)
    sizes = np.asarray(media.flat_sizes(), dtype=np.int64)

    def arrays_of(out: dict[str, Any]) -> dict[str, Any]:
        return {**out, "patches_per_image": sizes}

    arrays = arrays_of(demo.plain_preprocess(files))
    data = demo.plain_encode("b", ids, arrays, meta.mm_inputs)
    return {
        "preprocess": lambda: demo.plain_preprocess(files),
        "encode": lambda: demo.plain_encode("b", ids, arrays, meta.mm_inputs),
        "decode": lambda: demo.plain_decode(data),
        "total": lambda: demo.plain_decode(
            demo.plain_encode("b", ids, arrays_of(demo.plain_preprocess(files)), meta.mm_inputs)
        ),
    }


def check_same(files: list[bytes]) -> None:
    """Both paths must hand the engine the same bytes (else the comparison is meaningless)."""
    import numpy as np

    ours = pipeline("ours", files)["total"]()[0].tensors
    plain = pipeline("plain", files)["total"]()
    for name in ("pixel_values", "image_grid_thw", "patches_per_image"):
        a, b = np.ascontiguousarray(ours[name]), np.ascontiguousarray(plain[name])
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            raise SystemExit(
                f"ours and plain differ on {name}: {a.dtype}{a.shape} {b.dtype}{b.shape}"
            )


def child(spec: dict[str, Any]) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core: every thread shares it
    files = [Path(p).read_bytes() for p in spec["paths"]]
    if spec["mode"] == "time":
        check_same(files)
        result = {}
        for impl in ("ours", "plain"):
            ops = pipeline(impl, files)
            result[impl] = {stage: time_op(ops[stage], spec["repeat"]) for stage in STAGES}
    else:
        total = pipeline(spec["impl"], files)["total"]
        total()
        result = {"peak": measure_peak(total)}
    print(json.dumps(result))


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> str:
    import numpy as np
    import PIL
    import transformers

    import smg_grpc_proto

    mem = next(
        (line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
         if line.startswith("MemTotal")),
        "0",
    )  # fmt: skip
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, {int(mem) / 2**20:.0f} GiB; Linux "
        f"{platform.release()}; Python {platform.python_version()}, numpy {np.__version__}, "
        f"Pillow {PIL.__version__}, transformers {transformers.__version__}, smg-grpc-proto "
        f"{smg_grpc_proto.__version__} (native {smg_grpc_proto.build_info()['profile']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per stage (at least)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per figure")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=CASES)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--json", metavar="FILE", help="write the raw figures to FILE")
    parser.add_argument("--images", type=Path, help="where to write the JPEGs (default: temp)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    directory = args.images or Path(tempfile.mkdtemp(prefix="bench-engines-"))
    cases = write_images(directory)
    results: dict[str, Any] = {}
    for name in args.cases:
        paths = [str(p) for p in cases[name]]
        rounds = [
            run_child({"mode": "time", "paths": paths, "repeat": args.repeat})
            for _ in range(args.rounds)
        ]
        figures: dict[str, Any] = {
            impl: {s: statistics.median(r[impl][s] for r in rounds) for s in STAGES}
            for impl in ("ours", "plain")
        }
        figures["ratios"] = [r["plain"]["total"] / r["ours"]["total"] for r in rounds]
        if not args.no_memory:
            for impl in ("ours", "plain"):
                figures[impl]["peak"] = run_child({"mode": "peak", "impl": impl, "paths": paths})[
                    "peak"
                ]
        results[name] = figures
        print(f"{name}: done", file=sys.stderr)
    print(f"machine: {machine()}")
    print(f"rounds: {args.rounds} fresh processes, median of >= {args.repeat} calls each\n")
    memory = not args.no_memory
    header = "| case | stage | plain Python (ms) | ours (ms) | speed-up |"
    header += " peak MiB plain | peak MiB ours |" if memory else ""
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name, fig in results.items():
        for stage in STAGES:
            plain, ours = fig["plain"][stage] * 1e3, fig["ours"][stage] * 1e3
            label = "**image bytes -> engine tensors**" if stage == "total" else stage
            row = f"| {name} | {label} | {plain:.2f} | {ours:.2f} | **{plain / ours:.1f}x** |"
            if memory:
                peaks = (fig["plain"]["peak"], fig["ours"]["peak"])
                row += f" {peaks[0]:.0f} | {peaks[1]:.0f} |" if stage == "total" else " | |"
            print(row)
    print("\nper-round speed-up of the whole path:")
    for name, fig in results.items():
        print(f"- {name}: " + ", ".join(f"{r:.1f}x" for r in fig["ratios"]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
