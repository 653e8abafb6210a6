#!/usr/bin/env python3
"""Engine adapter benchmark: image bytes -> engine-ready tensors, ours and the plain-Python path
side by side in one run, on real photos.

Qwen2-VL (transformers' class defaults) into a vLLM ``GenerateRequest`` and back out on the
engine side, one thread:

* **ours** — ``VisionModel.prepare`` (Rust: decode, resize, lay out, BLAKE3 hashes; the values
  of ``pixel_values`` not written yet), ``engines.vllm.generate_request``, ``tensors.serialize``
  (the normalised patches computed straight into the request bytes, once), then
  ``tensors.parse`` + ``engines.vllm.decode_mm_inputs`` (zero-copy views, every field checked);
* **plain** — ``Image.open`` + ``convert("RGB")`` + ``Qwen2VLImageProcessorPil`` (transformers
  5.24.0, Pillow 13), ``inline = array.tobytes()`` + ``SerializeToString()``, then
  ``FromString`` + a writable copy per tensor (``smg_grpc_proto.demo.plain_*``, what servers
  and gateways written in Python do today).

The cases are the real photos of the parity corpus (``benchkit.REAL_PHOTO_CASES`` and more
JPEG and PNG photos of ``tests/support/images.py real_photos()``: set ``SMG_TEST_CACHE`` to
reuse a cache), among them the corpus's two progressive JPEGs (as published); a synthetic JPEG
(``bench_vision.write_images``, the figure the earlier tables quoted) and real JPEGs made
progressive by ``jpegtran -progressive`` (lossless; only when jpegtran is installed) are kept
as clearly labelled extra cases that the summary leaves out. The summary gives the median and
worst over all real photos, and over the eleven baseline/PNG photos of earlier sessions.

Per case, besides the whole path, every stage of both sides is timed: **our decode alone**
(``vision.decode`` of each file), which the whole path is compared with ("ours / decode" and
the "ceiling", plain / our decode: the speed-up if everything after our decoder were free), and
ours: processor (``prepare``: decode + resize + hash), build (``generate_request``), serialize
(the pixel values written), parse (``parse`` + ``decode_mm_inputs``); plain: decode, processor
(decode included), encode, parse.

Each round is a fresh process pinned to one core timing both implementations on the same images
(median of ``--repeat`` calls, at least 0.25 s of calls per figure); figures are medians over
``--rounds`` rounds, the speed-up the median of the rounds' own ratios. ``--clock cpu`` times
the process's CPU time instead of the wall clock (steadier on a shared machine: time the
process waits for the core is not counted). Peak memory is measured in a fresh process per
implementation and case. Both paths are checked to produce the same bytes before anything is
timed.

    python scripts/bench_engines.py --rounds 3   # prints Markdown tables
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import REAL_PHOTO_CASES, cpu_model, measure_peak, real_photo_cases  # noqa: E402

#: Our stages (``bench_before_after.py`` times these of ``pipeline("ours", ...)``).
STAGES = ("decode", "processor", "build", "serialize", "parse", "total")
PLAIN_STAGES = ("decode", "processor", "encode", "parse", "total")

#: Real photos beyond ``REAL_PHOTO_CASES`` (file names of ``real_photos()``).
MORE_PHOTOS: dict[str, list[str]] = {
    "640x427 JPEG (rocket)": ["rocket.jpg"],
    "1024x768 JPEG (junk_jpeg_header)": ["junk_jpeg_header.jpg"],
    "1411x1411 JPEG (retina)": ["retina.jpg"],
    "451x300 PNG (chelsea)": ["chelsea.png"],
    "600x400 PNG (coffee)": ["coffee.png"],
    "512x512 PNG (astronaut)": ["astronaut.png"],
    "425x250 progressive JPEG (icc_profile_big)": ["icc_profile_big.jpg"],
    "256x160 progressive JPEG (app13-multiple)": ["app13-multiple.jpg"],
}
#: The progressive photos above (not in the earlier sessions' set of eleven).
PROGRESSIVE_PHOTOS = (
    "425x250 progressive JPEG (icc_profile_big)",
    "256x160 progressive JPEG (app13-multiple)",
)
#: Extra cases: real JPEGs made progressive by jpegtran (case name -> photo).
REWRITTEN = {
    "1000x872 JPEG (hubble_deep_field) made progressive (extra)": "hubble_deep_field.jpg",
    "640x427 JPEG (rocket) made progressive (extra)": "rocket.jpg",
}
#: The synthetic extra case (not a photo; left out of the summary).
SYNTHETIC = "1280x960 synthetic JPEG (extra, not a photo)"
CASES = (*REAL_PHOTO_CASES, *MORE_PHOTOS, SYNTHETIC, *REWRITTEN)
#: Cases the summary leaves out.
EXTRAS = (SYNTHETIC, *REWRITTEN)

#: The whole path must stay within this multiple of our decode time from this size on.
DECODE_RULE = (1.5, 0.5e6)


def case_paths(names: list[str], directory: Path) -> dict[str, list[Path]]:
    """The files of each case named."""
    out: dict[str, list[Path]] = {}
    real = real_photo_cases()
    if any(name in MORE_PHOTOS or name in REWRITTEN for name in names):
        from support.images import real_photos  # on sys.path after real_photo_cases()

        photos = real_photos()
        real.update({case: [photos[f] for f in files] for case, files in MORE_PHOTOS.items()})
    for name in names:
        if name in REWRITTEN:
            target = directory / f"progressive-{REWRITTEN[name]}"
            source = photos[REWRITTEN[name]]
            cmd = ["jpegtran", "-progressive", "-outfile", str(target), str(source)]
            subprocess.run(cmd, check=True, capture_output=True)
            out[name] = [target]
        elif name == SYNTHETIC:
            from bench_vision import write_images

            out[name] = write_images(directory)["1280x960"]
        else:
            out[name] = real[name]
    return out


def pipeline(impl: str, files: list[bytes], dtype: str = "float32") -> dict[str, Callable[[], Any]]:
    """Zero-argument callables for each stage of ``impl`` on ``files`` (and the whole path), the
    pixel values sent as ``dtype`` (``bfloat16``: ours writes them as such straight into the
    request; the plain path converts its float32 array with ``ml_dtypes``, as a client sending
    bfloat16 with numpy would)."""
    import io

    import numpy as np

    from smg_grpc_proto import demo, tensors, vision
    from smg_grpc_proto.engines import VisionModel
    from smg_grpc_proto.engines import vllm as adapter
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb

    prompt = demo.prompt_for(len(files))
    model = VisionModel.for_family("qwen2_vl")
    if impl == "ours":

        def decode() -> Any:
            return [vision.decode(data) for data in files]

        def processor() -> Any:
            return model.prepare(files, threads=1)

        media = processor()
        wire_dtype = None if dtype == "float32" else dtype
        request = adapter.generate_request("b", prompt, media, dtype=wire_dtype)
        data = tensors.serialize(request)

        def build() -> Any:
            return adapter.generate_request("b", prompt, media, dtype=wire_dtype)

        def serialize() -> bytes:
            return tensors.serialize(request)

        def parse() -> Any:
            return adapter.decode_mm_inputs(tensors.parse(data, pb.GenerateRequest), merge_size=2)

        def total() -> Any:
            m = model.prepare(files, threads=1)
            wire = tensors.serialize(adapter.generate_request("b", prompt, m, dtype=wire_dtype))
            return adapter.decode_mm_inputs(tensors.parse(wire, pb.GenerateRequest), merge_size=2)

        return {
            "decode": decode,
            "processor": processor,
            "build": build,
            "serialize": serialize,
            "parse": parse,
            "total": total,
        }

    from PIL import Image

    media = model.prepare(files)
    meta = adapter.generate_request("m", prompt, media).message
    ids = list(meta.tokenized.input_ids)
    sizes = np.asarray(media.flat_sizes(), dtype=np.int64)

    def arrays_of(out: dict[str, Any]) -> dict[str, Any]:
        if dtype != "float32":
            import ml_dtypes

            out = {**out, "pixel_values": out["pixel_values"].astype(getattr(ml_dtypes, dtype))}
        return {**out, "patches_per_image": sizes}

    arrays = arrays_of(demo.plain_preprocess(files))
    data = demo.plain_encode("b", ids, arrays, meta.mm_inputs)
    return {
        "decode": lambda: [Image.open(io.BytesIO(d)).convert("RGB") for d in files],
        "processor": lambda: arrays_of(demo.plain_preprocess(files)),
        "encode": lambda: demo.plain_encode("b", ids, arrays, meta.mm_inputs),
        "parse": lambda: demo.plain_decode(data),
        "total": lambda: demo.plain_decode(
            demo.plain_encode("b", ids, arrays_of(demo.plain_preprocess(files)), meta.mm_inputs)
        ),
    }


def check_same(files: list[bytes], dtype: str = "float32") -> None:
    """Both paths must hand the engine the same bytes (else the comparison is meaningless)."""
    import numpy as np

    ours = pipeline("ours", files, dtype)["total"]()[0].tensors
    plain = pipeline("plain", files, dtype)["total"]()
    for name in ("pixel_values", "image_grid_thw", "patches_per_image"):
        a, b = np.ascontiguousarray(ours[name]), np.ascontiguousarray(plain[name])
        if a.shape != b.shape or a.tobytes() != b.tobytes() or str(a.dtype) != str(b.dtype):
            raise SystemExit(
                f"ours and plain differ on {name}: {a.dtype}{a.shape} {b.dtype}{b.shape}"
            )


def time_op(fn: Callable[[], Any], repeat: int, clock: Callable[[], float]) -> float:
    """Median seconds (by ``clock``) of at least ``repeat`` calls of ``fn`` after a warm-up
    call, called until 0.25 s of calls have been timed (up to 2000 calls)."""
    fn()
    times: list[float] = []
    while len(times) < repeat or (sum(times) < 0.25 and len(times) < 2000):
        start = clock()
        result = fn()
        times.append(clock() - start)
        del result
    return statistics.median(times)


def child(spec: dict[str, Any]) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core: every thread shares it
    files = [Path(p).read_bytes() for p in spec["paths"]]
    dtype = spec.get("dtype", "float32")
    if spec["mode"] == "time":
        check_same(files, dtype)
        clock = time.process_time if spec["clock"] == "cpu" else time.perf_counter
        result = {}
        for impl, stages in (("ours", STAGES), ("plain", PLAIN_STAGES)):
            ops = pipeline(impl, files, dtype)
            result[impl] = {stage: time_op(ops[stage], spec["repeat"], clock) for stage in stages}
    else:
        total = pipeline(spec["impl"], files, dtype)["total"]
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


def megapixels(paths: list[Path]) -> float:
    """The largest input of the case, in megapixels."""
    from PIL import Image

    def size(path: Path) -> int:
        with Image.open(path) as image:
            return image.width * image.height

    return max(size(p) for p in paths) / 1e6


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    memory = not args.no_memory
    print(f"machine: {machine()}")
    print(
        f"rounds: {args.rounds} fresh processes, median of >= {args.repeat} calls each; "
        f"clock: {'process CPU time' if args.clock == 'cpu' else 'wall'}; "
        f"pixel values sent as {args.dtype}\n"
    )
    header = (
        "| case | MP | plain Python (ms) | ours (ms) | speed-up | our decode (ms) |"
        " ours / our decode | ceiling |"
    )
    header += " peak MiB plain | peak MiB ours |" if memory else ""
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name, fig in results.items():
        plain, ours, dec = (fig[k] * 1e3 for k in ("plain_total", "ours_total", "ours_decode"))
        row = (
            f"| {name} | {fig['mp']:.2f} | {plain:.2f} | {ours:.2f} | **{fig['speedup']:.1f}x** |"
            f" {dec:.2f} | {ours / dec:.2f}x | {plain / dec:.1f}x |"
        )
        if memory:
            row += f" {fig['plain']['peak']:.0f} | {fig['ours']['peak']:.0f} |"
        print(row)
    print("\nours per stage (ms; processor = decode + resize + hash, the values not written yet;")
    print("serialize = the normalised patches written into the request bytes):\n")
    print("| case | decode | processor | build | serialize | parse + decode_mm_inputs | total |")
    print("|---|---|---|---|---|---|---|")
    for name, fig in results.items():
        cells = " | ".join(f"{fig['ours'][s] * 1e3:.2f}" for s in STAGES)
        print(f"| {name} | {cells} |")
    print("\nplain Python per stage (ms; processor includes the decode):\n")
    print("| case | decode | processor | encode | parse | total |")
    print("|---|---|---|---|---|---|")
    for name, fig in results.items():
        cells = " | ".join(f"{fig['plain'][s] * 1e3:.2f}" for s in PLAIN_STAGES)
        print(f"| {name} | {cells} |")
    print("\nper-round speed-up of the whole path:")
    for name, fig in results.items():
        print(f"- {name}: " + ", ".join(f"{r:.1f}x" for r in fig["ratios"]))
    photos = {n: f for n, f in results.items() if n not in EXTRAS}
    if photos:
        ups = [f["speedup"] for f in photos.values()]
        print(
            f"\nreal photos ({len(ups)} cases): median speed-up {statistics.median(ups):.1f}x, "
            f"worst {min(ups):.1f}x ({min(photos, key=lambda n: photos[n]['speedup'])})"
        )
        earlier = {n: f for n, f in photos.items() if n not in PROGRESSIVE_PHOTOS}
        if len(earlier) < len(photos):
            ups = [f["speedup"] for f in earlier.values()]
            print(
                f"without the progressive photos ({len(ups)} cases, the earlier sessions' set): "
                f"median {statistics.median(ups):.1f}x, worst {min(ups):.1f}x "
                f"({min(earlier, key=lambda n: earlier[n]['speedup'])})"
            )
        ceilings = [f["plain_total"] / f["ours_decode"] for f in photos.values()]
        print(
            f"ceiling (plain / our decode: the speed-up if everything after our decoder were "
            f"free): median {statistics.median(ceilings):.1f}x, worst {min(ceilings):.1f}x"
        )
        limit, pixels = DECODE_RULE
        big = {n: f["ours_total"] / f["ours_decode"] for n, f in photos.items()}
        big = {n: r for n, r in big.items() if photos[n]["mp"] * 1e6 >= pixels}
        if big:
            worst = max(big, key=lambda n: big[n])
            print(
                f"ours / our decode on photos >= {pixels / 1e6:.1f} MP: worst {big[worst]:.2f}x "
                f"({worst}; the rule is <= {limit}x)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per stage (at least)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per figure")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=CASES)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the pixel values' wire dtype, on both sides (bfloat16 needs ml_dtypes)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--json", metavar="FILE", help="write the raw figures to FILE")
    parser.add_argument("--images", type=Path, help="where to write the synthetic JPEGs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    if shutil.which("jpegtran") is None and any(n in REWRITTEN for n in args.cases):
        print("jpegtran not found: no progressive extras (`make system-deps`)", file=sys.stderr)
        args.cases = [n for n in args.cases if n not in REWRITTEN]
    directory = args.images or Path(tempfile.mkdtemp(prefix="bench-engines-"))
    cases = case_paths(args.cases, directory)
    results: dict[str, Any] = {}
    for name in args.cases:
        paths = [str(p) for p in cases[name]]
        spec = {
            "mode": "time",
            "paths": paths,
            "repeat": args.repeat,
            "clock": args.clock,
            "dtype": args.dtype,
        }
        rounds = [run_child(spec) for _ in range(args.rounds)]
        figures: dict[str, Any] = {
            impl: {s: statistics.median(r[impl][s] for r in rounds) for s in stages}
            for impl, stages in (("ours", STAGES), ("plain", PLAIN_STAGES))
        }
        figures["ratios"] = [r["plain"]["total"] / r["ours"]["total"] for r in rounds]
        figures["speedup"] = statistics.median(figures["ratios"])
        figures["ours_total"] = figures["ours"]["total"]
        figures["plain_total"] = figures["plain"]["total"]
        figures["ours_decode"] = figures["ours"]["decode"]
        figures["mp"] = megapixels(cases[name])
        if not args.no_memory:
            for impl in ("ours", "plain"):
                peak = {"mode": "peak", "impl": impl, "paths": paths, "dtype": args.dtype}
                figures[impl]["peak"] = run_child(peak)["peak"]
        results[name] = figures
        print(f"{name}: done", file=sys.stderr)
    report(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
