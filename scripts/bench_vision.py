#!/usr/bin/env python3
"""Vision preprocessing benchmark: transformers' backends and ours, side by side in one run.

    python scripts/bench_vision.py [--repeat 7] [--rounds 3] [--markdown]
                                   [--svg docs/vision_bench.svg] [--json FILE]
                                   [--torch-venv DIR | --no-torchvision] [--no-memory]
                                   [--cases "512x600 JPEG (grace_hopper),batch of 8"]
                                   [--inputs decoded,bytes] [--synthetic]

Qwen2-VL with transformers' class defaults, on the same images in one run:

* **PIL backend** — ``transformers.Qwen2VLImageProcessorPil`` (transformers 5.24.0, Pillow 13);
* **torchvision backend** — ``transformers.Qwen2VLImageProcessor`` with torch's intra-op threads
  set to 1, run in a separate virtual environment (torch is large; ``--torch-venv``, created
  with uv when missing: torch 2.15.0 + torchvision + transformers 5.24.0 + Pillow 13.0.0);
* **ours, 1 thread** and **ours, all cores** — ``ImageProcessor.for_family("qwen2_vl")``, with
  the default buffer recycling (``vision.buffer_cache``: a dropped output's memory is reused by
  the next call); **ours, 1 thread, no recycling** — the same with recycling off
  (``SMG_GRPC_PROTO_BUFFER_CACHE_MIB=0``): every call writes into fresh memory.

Two inputs: **decoded** (ours: numpy ``HxWx3`` arrays; transformers: PIL images) and
**bytes** (JPEG bytes; transformers: ``Image.open`` + ``convert("RGB")`` + the backend — what it
does for a file; ours: the bytes straight in, decoded in Rust). Images: the real photos of
``benchkit.REAL_PHOTO_CASES`` (Grace Hopper 512 x 600 JPEG, scikit-image's hubble_deep_field
1000 x 872 JPEG, Pillow's xmp_test 2000 x 1072 JPEG, scikit-image's motorcycle_left 741 x 500
PNG, and a batch of 8 JPEG/PNG photos; fetched into the test cache by
``tests/support/images.py``). ``--synthetic`` measures the earlier images instead, as a labelled
extra: Grace Hopper and synthetic photos (smooth gradients, shapes and noise, JPEG quality 90)
of 1280 x 960, 1920 x 1080 and 4032 x 3024, plus a batch of all eight (two of each); synthetic
JPEGs decode faster than camera photos, so their "bytes" ratios flatter us. Each process times
every operation at
least ``--repeat`` times and for at least 0.25 s (after a warm-up call) and reports the median;
each figure is the median of those over ``--rounds`` fresh processes. Peak memory is the extra
resident memory of a fresh process doing the operation once (``VmHWM`` reset through
``/proc/self/clear_refs``, minus ``VmRSS`` before), as in ``scripts/bench_tensors.py``.
``OPENBLAS_NUM_THREADS=1`` (and OMP/MKL) are set before numpy loads.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from benchkit import (  # noqa: E402
    CLOCKS,
    REAL_PHOTO_CASES,
    cpu_model,
    measure_peak,
    real_photo_cases,
    time_op,
)

X, NA = "\u00d7", "\u2013"  # the multiplication sign and the en dash of the tables
ROOT = Path(__file__).resolve().parents[1]
SIZES = [(1280, 960), (1920, 1080), (4032, 3024)]  # (width, height)
#: The default cases: real photos (``benchkit.REAL_PHOTO_CASES``).
CASES = list(REAL_PHOTO_CASES)
#: The cases of ``--synthetic`` (a labelled extra: Grace Hopper and synthetic JPEGs).
SYNTHETIC_CASES = ["512x600", "1280x960", "1920x1080", "4032x3024", "batch of 8"]
INPUTS = ["decoded", "bytes"]
IMPLS = ["pil", "torchvision", "ours-1", "ours-1-fresh", "ours-all"]
LABELS = {
    "pil": "PIL backend",
    "torchvision": "torchvision backend",
    "ours-1": "ours, 1 thread",
    "ours-1-fresh": "ours, 1 thread, no recycling",
    "ours-all": "ours, all cores",
}
# Runs ``ours-1-fresh`` in: buffer recycling off, every call on fresh memory.
NO_RECYCLING = {"SMG_GRPC_PROTO_BUFFER_CACHE_MIB": "0"}
TORCH_REQS = ["torch==2.15.0", "torchvision", "transformers==5.24.0", "pillow==13.0.0", "numpy"]


# ---------------------------------------------------------------- images


def synthetic_photo(width: int, height: int, seed: int) -> np.ndarray:
    """A photo-like RGB image: smooth gradients, soft blobs and sensor noise (JPEG sizes of real
    photos, unlike flat colour or white noise)."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    channels = []
    for c in range(3):
        a, b, f = rng.uniform(0.5, 3.0, 3)
        chan = 120 + 70 * np.sin(a * x * 3.1 + c) * np.cos(b * y * 2.7 + f) + 40 * (x - y)
        for _ in range(6):  # soft blobs
            cx, cy, r, amp = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3), 60
            chan = chan + amp * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (r * r)) * rng.choice(
                [-1, 1]
            )
        channels.append(chan)
    img = np.stack(channels, axis=-1)
    img += rng.normal(0.0, 6.0, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def grace_hopper() -> bytes:
    sys.path.insert(0, str(ROOT / "tests"))
    from support.images import grace_hopper as fetch

    return fetch()


def real_images() -> dict[str, list[Path]]:
    """The real photos of every default case (name -> paths, from the test cache)."""
    return real_photo_cases()


def write_images(directory: Path) -> dict[str, list[Path]]:
    """The JPEG files of every ``--synthetic`` case (name -> paths), written to ``directory``."""
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    single: dict[str, Path] = {}
    gh = directory / "grace_hopper.jpg"
    gh.write_bytes(grace_hopper())
    single["512x600"] = gh
    for seed, (w, h) in enumerate(SIZES):
        for k in range(2):
            path = directory / f"photo_{w}x{h}_{k}.jpg"
            if not path.exists():
                Image.fromarray(synthetic_photo(w, h, 10 * seed + k)).save(path, quality=90)
            if k == 0:
                single[f"{w}x{h}"] = path
    cases = {name: [path] for name, path in single.items()}
    cases["batch of 8"] = [
        gh,
        gh,
        *(directory / f"photo_{w}x{h}_{k}.jpg" for w, h in SIZES for k in range(2)),
    ]
    return cases


# ---------------------------------------------------------------- operations


def make_op(impl: str, inp: str, paths: list[Path]) -> Callable[[], Any]:
    """A zero-argument callable doing one preprocessing call on the case's images."""
    from PIL import Image

    blobs = [p.read_bytes() for p in paths]
    if impl in ("pil", "torchvision"):
        if impl == "pil":
            from transformers import Qwen2VLImageProcessorPil

            proc: Any = Qwen2VLImageProcessorPil()
            tensors = "np"
        else:
            import torch
            from transformers import Qwen2VLImageProcessor

            torch.set_num_threads(1)
            proc = Qwen2VLImageProcessor()
            tensors = "pt"
        if inp == "decoded":
            pil_images = [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]
            return lambda: proc(images=pil_images, return_tensors=tensors)
        return lambda: proc(
            images=[Image.open(io.BytesIO(b)).convert("RGB") for b in blobs],
            return_tensors=tensors,
        )
    from smg_grpc_proto.vision import ImageProcessor, decode

    ours = ImageProcessor.for_family("qwen2_vl", threads=None if impl == "ours-all" else 1)
    if inp == "decoded":
        arrays = [decode(b) for b in blobs]
        return lambda: ours(arrays)
    return lambda: ours(blobs)


def run_child(spec: dict[str, Any]) -> None:
    """Child mode: time (and/or measure) the operations of ``spec``, print JSON."""
    out: dict[str, Any] = {}
    for key in spec["ops"]:
        impl, inp, case = key.split("|")
        fn = make_op(impl, inp, [Path(p) for p in spec["cases"][case]])
        if spec["mode"] == "memory":
            out[key] = measure_peak(fn)
        else:
            # CPU time sums the threads, so "all cores" is always timed by the wall clock
            clock = CLOCKS["wall" if impl == "ours-all" else spec.get("clock", "wall")]
            out[key] = time_op(fn, spec["repeat"], clock=clock)
    print(json.dumps(out))


def child(
    python: str, spec: dict[str, Any], env: dict[str, str] | None = None, timeout: float = 3600
) -> dict[str, float]:
    result = subprocess.run(
        [python, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    if result.returncode != 0:
        raise RuntimeError(f"child failed:\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def torch_python(venv: Path) -> str | None:
    """The venv's python with torch + torchvision + transformers, created with uv if missing."""
    python = venv / "bin" / "python"
    probe = "import torch, torchvision, transformers; print(torchvision.__version__)"
    if (
        python.exists()
        and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0
    ):
        return str(python)
    uv = [sys.executable, "-m", "uv"]
    try:
        subprocess.run([*uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
        subprocess.run(
            [*uv, "pip", "install", "--quiet", "--python", str(python), *TORCH_REQS],
            check=True,
            timeout=900,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"torchvision backend skipped: cannot install it ({exc})", file=sys.stderr)
        return None
    return str(python)


# ---------------------------------------------------------------- report


def machine(tv_versions: str | None) -> str:
    cpu = cpu_model()
    import PIL
    import transformers

    mem = _meminfo_gib()
    text = (
        f"{cpu}, {os.cpu_count()} cores, {mem} GiB, Linux {platform.release()}, Python "
        f"{platform.python_version()}, numpy {np.__version__}, Pillow {PIL.__version__}, "
        f"transformers {transformers.__version__}"
    )
    if tv_versions:
        text += f", {tv_versions} (torchvision backend, its own venv)"
    return text


def _meminfo_gib() -> str:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return f"{int(line.split()[1]) / 1024 / 1024:.0f}"
    return "?"


def table(
    times: dict[str, float],
    mem: dict[str, float],
    markdown: bool,
    has_tv: bool,
    cases: list[str],
) -> list[str]:
    impls = [i for i in IMPLS if has_tv or i != "torchvision"]
    head = ["input", "images"] + [f"{LABELS[i]} (ms)" for i in impls]
    head += ["ours 1T vs PIL", "ours 1T no recycling vs PIL", "ours all vs PIL"]
    if has_tv:
        head += ["ours 1T vs torchvision"]
    if mem:
        head += ["peak MiB PIL / ours 1T / ours all"]
    rows = []
    for inp in INPUTS:
        for case in cases:
            t = {i: times.get(f"{i}|{inp}|{case}") for i in impls}
            if all(v is None for v in t.values()):
                continue  # not measured (--cases / --inputs)
            cells = [inp, case]
            cells += [f"{t[i] * 1e3:.2f}" if t[i] is not None else NA for i in impls]
            pil, one, allc = t["pil"], t["ours-1"], t["ours-all"]
            fresh = t["ours-1-fresh"]
            cells += [f"**{pil / one:.1f}{X}**" if pil and one else NA]
            cells += [f"{pil / fresh:.1f}{X}" if pil and fresh else NA]
            cells += [f"{pil / allc:.1f}{X}" if pil and allc else NA]
            if has_tv:
                tv = t["torchvision"]
                cells += [f"**{tv / one:.1f}{X}**" if tv and one else NA]
            if mem:
                peaks = [mem.get(f"{i}|{inp}|{case}") for i in ("pil", "ours-1", "ours-all")]
                cells += [" / ".join(f"{p:.0f}" if p is not None else NA for p in peaks)]
            rows.append(cells)
    if markdown:
        lines = ["| " + " | ".join(head) + " |"]
        lines.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|")
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return lines
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows]
    ]


def svg_chart(times: dict[str, float], has_tv: bool, cases: list[str]) -> str:
    """A grouped bar chart (hand-written SVG): speed-up over the PIL backend, per case."""
    impls = [i for i in IMPLS if i != "pil" and (has_tv or i != "torchvision")]
    colours = {
        "torchvision": "#e8a33d",
        "ours-1": "#3b7dd8",
        "ours-1-fresh": "#8fb6ea",
        "ours-all": "#1b4f9c",
    }
    groups = [(inp, case) for inp in INPUTS for case in cases]
    ratios = {
        (inp, case, i): times[f"pil|{inp}|{case}"] / times[f"{i}|{inp}|{case}"]
        for inp, case in groups
        for i in impls
        if f"{i}|{inp}|{case}" in times and f"pil|{inp}|{case}" in times
    }
    top = max([*ratios.values(), 1.0])
    step = 5 if top <= 40 else 10
    ymax = step * (int(top // step) + 1)
    left, right, chart_top, chart_h, bar_w = 60, 20, 50, 300, 14
    group_w = bar_w * len(impls) + 18
    width = left + right + group_w * len(groups) + 20
    height = chart_top + chart_h + 90
    y0 = chart_top + chart_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">'
        "Qwen2-VL preprocessing: speed-up over transformers' PIL backend (higher is better)"
        "</text>",
    ]
    for v in range(0, ymax + 1, step):
        y = y0 - chart_h * v / ymax
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{v}{X}</text>')
    y1 = y0 - chart_h / ymax
    out.append(
        f'<line x1="{left}" y1="{y1:.1f}" x2="{width - right}" y2="{y1:.1f}" stroke="#c33" '
        'stroke-dasharray="4 3"/>'
    )
    for g, (inp, case) in enumerate(groups):
        gx = left + 10 + g * group_w
        for k, impl in enumerate(impls):
            r = ratios.get((inp, case, impl))
            if r is None:
                continue
            h = chart_h * r / ymax
            x = gx + k * bar_w
            out.append(
                f'<rect x="{x}" y="{y0 - h:.1f}" width="{bar_w - 2}" height="{h:.1f}" '
                f'fill="{colours[impl]}"><title>{LABELS[impl]}, {inp}, {case}: {r:.1f}{X}</title>'
                "</rect>"
            )
        cx = gx + bar_w * len(impls) / 2
        # a real photo's case name on two lines: "1000x872 JPEG" over "(hubble_deep_field)"
        head, _, tail = case.partition(" (")
        out.append(f'<text x="{cx:.1f}" y="{y0 + 15}" text-anchor="middle">{head}</text>')
        if tail:
            out.append(
                f'<text x="{cx:.1f}" y="{y0 + 27}" text-anchor="middle" font-size="9">'
                f"({tail}</text>"
            )
    for n, inp in enumerate(INPUTS):
        cx = left + 10 + group_w * len(cases) * (n + 0.5)
        out.append(
            f'<text x="{cx:.1f}" y="{y0 + 45}" text-anchor="middle" font-weight="bold">'
            f"{inp} input</text>"
        )
    lx = left
    for impl in impls:
        out.append(
            f'<rect x="{lx}" y="{height - 28}" width="12" height="12" fill="{colours[impl]}"/>'
        )
        out.append(f'<text x="{lx + 16}" y="{height - 18}">{LABELS[impl]}</text>')
        lx += 30 + 6 * len(LABELS[impl])
    out.append(
        f'<line x1="{lx}" y1="{height - 22}" x2="{lx + 20}" y2="{height - 22}" stroke="#c33" '
        'stroke-dasharray="4 3"/>'
    )
    out.append(f'<text x="{lx + 24}" y="{height - 18}">PIL backend (1{X})</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed calls per process (at least)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per figure")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--svg", metavar="FILE", help="write the bar chart (SVG) to FILE")
    parser.add_argument("--json", metavar="FILE", help="write the raw medians to FILE")
    parser.add_argument(
        "--torch-venv",
        type=Path,
        default=ROOT / ".cache" / "bench-vision-torch",
        help="venv for the torchvision backend (created with uv if missing)",
    )
    parser.add_argument("--no-torchvision", action="store_true")
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="wall time, or process CPU time for the one-thread columns (steadier on a loaded "
        "machine; 'all cores' stays on the wall clock)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument(
        "--synthetic",
        action="store_true",
        help="measure Grace Hopper and synthetic JPEGs instead of the real photos (an extra)",
    )
    parser.add_argument(
        "--images", type=Path, help="with --synthetic: where to write the JPEGs (default: temp)"
    )
    parser.add_argument(
        "--cases",
        type=lambda v: v.split(","),
        default=None,
        help=f"comma-separated subset of: {','.join(CASES)} (with --synthetic: "
        f"{','.join(SYNTHETIC_CASES)})",
    )
    parser.add_argument(
        "--inputs",
        type=lambda v: v.split(","),
        default=INPUTS,
        help=f"comma-separated subset of: {','.join(INPUTS)}",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(json.loads(args.child))
        return
    all_cases = SYNTHETIC_CASES if args.synthetic else CASES
    if args.cases is None:
        args.cases = all_cases
    for what, chosen, known in (("case", args.cases, all_cases), ("input", args.inputs, INPUTS)):
        unknown = sorted(set(chosen) - set(known))
        if unknown:
            parser.error(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(known)}")

    with tempfile.TemporaryDirectory() as tmp:
        cases = write_images(args.images or Path(tmp)) if args.synthetic else real_images()
        paths = {name: [str(p) for p in ps] for name, ps in cases.items()}
        tv_python = None if args.no_torchvision else torch_python(args.torch_venv)
        tv_versions = None
        if tv_python:
            probe = "import torch, torchvision; print(f'torch {torch.__version__}, "
            probe += "torchvision {torchvision.__version__}')"
            tv_versions = subprocess.run(
                [tv_python, "-c", probe], capture_output=True, text=True, check=True
            ).stdout.strip()

        samples: dict[str, list[float]] = {}
        # Interleave the implementations per case so machine noise hits all of them alike, and
        # repeat the whole round in fresh processes (a process's speed varies by tens of percent
        # on a shared VM): each figure is the median over rounds of per-process medians.
        for round_ in range(args.rounds):
            for case in args.cases:
                for inp in args.inputs:
                    ops = [f"{i}|{inp}|{case}" for i in ("pil", "ours-1", "ours-all")]
                    spec = {
                        "mode": "time",
                        "ops": ops,
                        "cases": paths,
                        "repeat": args.repeat,
                        "clock": args.clock,
                    }
                    runs = [child(sys.executable, spec)]
                    key = f"ours-1-fresh|{inp}|{case}"
                    spec = {**spec, "ops": [key]}
                    runs.append(child(sys.executable, spec, env=NO_RECYCLING))
                    if tv_python:
                        key = f"torchvision|{inp}|{case}"
                        spec = {**spec, "ops": [key]}
                        runs.append(child(tv_python, spec))
                    for run in runs:
                        for key, value in run.items():
                            samples.setdefault(key, []).append(value)
                    print(f"done: round {round_ + 1}, {case}, {inp}", file=sys.stderr)
        times = {key: statistics.median(values) for key, values in samples.items()}
        mem: dict[str, float] = {}
        if not args.no_memory:
            for case in args.cases:
                for inp in args.inputs:
                    for impl in ("pil", "ours-1", "ours-all"):
                        key = f"{impl}|{inp}|{case}"
                        spec = {"mode": "memory", "ops": [key], "cases": paths}
                        mem.update(child(sys.executable, spec))

    print(f"machine: {machine(tv_versions)}")
    print(f"clock: {args.clock} (ours, all cores: wall)")
    print(
        "images: "
        + ("SYNTHETIC (an extra, not photos)" if args.synthetic else "real photos")
        + "\n"
    )
    if not tv_python:
        print("torchvision backend: not measured\n")
    print("\n".join(table(times, mem, args.markdown, bool(tv_python), args.cases)))
    if args.svg:
        Path(args.svg).write_text(svg_chart(times, bool(tv_python), args.cases), encoding="utf-8")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"times": times, "samples": samples, "memory": mem}, indent=1)
        )


if __name__ == "__main__":
    main()
