"""Decoding real PNGs and JPEGs: ours vs Pillow (and torchvision), side by side (issue 23).

Usage: python scripts/bench_decode.py [--only NAME,...] [--rounds N] [--threads N]

Every file runs in a fresh process pinned to one core (``taskset -c 0`` when available), which
first checks that ``vision.decode(b, apply_exif=False, alpha="drop")`` gives exactly the pixels of
Pillow's ``np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))`` (it stops with an error if
not), then measures each decoder's extra peak memory (one call, after a warm-up call) and times
the decoders in alternating rounds (``--rounds``, each a median of at least 5 calls and 0.1 s);
the figure is the median of the round medians. ``torchvision.io.decode_image(...,
ImageReadMode.RGB)`` with ``torch.set_num_threads(1)`` is timed too when torch imports (run with
the torch venv's python and this worktree's ``src`` on ``PYTHONPATH``); its ``same`` column says
whether its pixels equal Pillow's.

``--threads N`` (N = 0 or >= 2) also times ``vision.decode(..., threads=N)`` in the same rounds
(the JPEG Huffman helper thread): the child is then pinned to the first two cores instead of
one, the clock is the wall clock, and the ``threads`` columns give that call's wall time, its
ratio to Pillow's, its CPU time and its speed-up over our one-thread call.

Files: every PNG and JPEG of ``tests/support/images.real_photos()`` and Pillow's test PNGs of
other kinds (palette, palette + tRNS interlaced, RGBA, RGBA interlaced, LA, 1-bit, L, large RGB),
and, when ``jpegtran`` is installed (``make system-deps``), each real JPEG made progressive by
``jpegtran -progressive`` (lossless: the photo's own coefficients in libjpeg's default ten
scans), named ``NAME (progressive)``, and one hostile extra (not a photo): a flat 4000 x 4000
gray JPEG of 36 KB rewritten with ``decode_cases.scan_per_coefficient``'s 99 scans, which make a
progressive decoder walk all 250 000 blocks once per scan (``hostile:flat-99-scans.jpg``);
``--no-progressive`` leaves them out. Damaged extras: four real JPEGs (and their progressive
rewrites) with a stray restart marker, then with a code no Huffman table holds, at nine tenths
of the last scan (``damaged:NAME + RST at 9/10``): libjpeg's recoveries, which our Huffman
decoder leaves to libjpeg where it stops.
Columns: milliseconds, ``x`` = Pillow / ours, peak MiB (ours / Pillow).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

#: Pillow test PNGs of the kinds real photos do not cover (Pillow 13.0.0's Tests/images).
PILLOW_PNGS = (
    "a_fli.png",  # P, 320x200
    "hopper_wal.png",  # P, 128x128
    "pil123p.png",  # P with tRNS, Adam7
    "pil123rgba.png",  # RGBA, Adam7
    "transparent.png",  # RGBA
    "argb-32bpp_MipMaps-1.png",  # RGBA, 256x256
    "uncompressed_rgb.png",  # RGBA 800x600, stored deflate blocks
    "uncompressed_la.png",  # LA
    "hopper_bw_500.png",  # 1-bit
    "radial_gradients.png",  # L 512x512
    "test-card.png",  # RGB 640x480, drawing
    "itxt_chunks.png",  # RGB 2400x2000, flat drawing
    "old-style-jpeg-compression.png",  # RGB 4160x870 photo-like
)


def files(progressive: bool = True) -> list[tuple[str, Path]]:
    from support.images import pillow_test_images, real_photos

    photos = [
        (name, path)
        for name, path in sorted(real_photos().items(), key=lambda kv: kv[0].rsplit(".", 1)[::-1])
        if name.endswith((".png", ".jpg"))
    ]
    pillow = pillow_test_images()
    out = photos + [(f"pillow:{name}", pillow / name) for name in PILLOW_PNGS]
    if not progressive:
        return out + damaged(photos, [])
    rewrites = progressive_rewrites(photos)
    return out + rewrites + hostile_progressive() + damaged(photos, rewrites)


def damaged(
    photos: list[tuple[str, Path]], rewrites: list[tuple[str, Path]]
) -> list[tuple[str, Path]]:
    """The damaged extras: four real JPEGs (one with restart markers) and their progressive
    rewrites, each with a stray restart marker, then with a code no Huffman table holds, at nine
    tenths of its (last) scan: our Huffman decoder stops there and libjpeg decodes the rest."""
    import tempfile

    from support.decode_cases import NO_SUCH_CODE, STRAY_RST, damaged_in_scan

    chosen = ("grace_hopper.jpg", "rocket.jpg", "hubble_deep_field.jpg", "xmp_test.jpg")
    directory = Path(tempfile.mkdtemp(prefix="bench-damaged-"))
    out = []
    for name, path in photos + rewrites:
        if name.removesuffix(" (progressive)") not in chosen:
            continue
        for what, insert in (("RST", STRAY_RST), ("bad code", NO_SUCH_CODE)):
            target = directory / f"{len(out)}.jpg"
            target.write_bytes(damaged_in_scan(path.read_bytes(), 0.9, insert))
            out.append((f"damaged:{name} + {what} at 9/10", target))
    return out


def progressive_rewrites(photos: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """Each real JPEG rewritten progressive by jpegtran (into a temporary directory); none
    without jpegtran, and none of the files jpegtran refuses (it stops on libjpeg's warnings)."""
    import tempfile

    jpegtran = shutil.which("jpegtran")
    if jpegtran is None:
        print("jpegtran not found: no progressive rows (`make system-deps` installs it)\n")
        return []
    directory = Path(tempfile.mkdtemp(prefix="bench-progressive-"))
    out = []
    for name, path in photos:
        if not name.endswith(".jpg"):
            continue
        target = directory / name
        run = subprocess.run(
            [jpegtran, "-progressive", "-outfile", str(target), str(path)],
            capture_output=True,
            check=False,
        )
        if run.returncode == 0:
            out.append((f"{name} (progressive)", target))
    return out


def hostile_progressive() -> list[tuple[str, Path]]:
    """The hostile extra: a flat gray 4000 x 4000 JPEG in a scan per coefficient (none without
    jpegtran)."""
    import tempfile

    from PIL import Image
    from support.decode_cases import encode, scan_per_coefficient

    jpegtran = shutil.which("jpegtran")
    if jpegtran is None:
        return []
    directory = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    script = directory / "scans.txt"
    script.write_text(scan_per_coefficient(32))
    target = directory / "flat-99-scans.jpg"
    flat = encode(Image.new("L", (4000, 4000), 128), "JPEG", quality=90)
    subprocess.run(
        [jpegtran, "-scans", str(script), "-outfile", str(target)],
        input=flat,
        capture_output=True,
        check=True,
    )
    return [("hostile:flat-99-scans.jpg", target)]


def decoders(data: bytes, torch_too: bool = True, threads: int = 1) -> dict[str, Callable[[], Any]]:
    """The decoders of ``data``: ours (one thread, and with ``threads`` when not 1), Pillow's, and
    torchvision's when torch imports."""
    import numpy as np
    from PIL import Image

    from smg_grpc_proto import vision

    def ours() -> Any:
        return vision.decode(data, apply_exif=False, alpha="drop", threads=1)

    def pil() -> Any:
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    def ours_threads() -> Any:
        return vision.decode(data, apply_exif=False, alpha="drop", threads=threads)

    ops: dict[str, Callable[[], Any]] = {"ours": ours, "pillow": pil}
    if threads != 1:
        ops["threads"] = ours_threads
    if not torch_too:
        return ops
    try:
        import torch
        from torchvision.io import ImageReadMode, decode_image
    except ImportError:
        return ops
    torch.set_num_threads(1)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def tv() -> Any:
        return decode_image(buf, mode=ImageReadMode.RGB).permute(1, 2, 0).numpy()

    ops["torchvision"] = tv
    return ops


def peak_child(path: Path, decoder: str) -> float:
    """Runs in a fresh process: the extra peak memory of one decoder's first call on the file,
    after a call on an 8x8 image of the same format (the decoder's code and tables loaded)."""
    from benchkit import measure_peak
    from PIL import Image

    data = path.read_bytes()
    fmt = "PNG" if data.startswith(b"\x89PNG") else "JPEG"
    small = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(small, fmt)
    torch_too = decoder == "torchvision"
    decoders(small.getvalue(), torch_too)[decoder]()
    return measure_peak(decoders(data, torch_too)[decoder])


def child(path: Path, rounds: int, clock: str = "wall", threads: int = 1) -> dict[str, Any]:
    """Runs in the fresh process: the pixel check and the timings of one file."""
    import time

    import numpy as np
    from benchkit import CLOCKS, time_op
    from PIL import Image

    data = path.read_bytes()
    ops = decoders(data, threads=threads)
    ours, pil = ops["ours"], ops["pillow"]
    a, ref = ours(), pil()
    if a.shape != ref.shape or not np.array_equal(a, ref):
        raise SystemExit(f"{path.name}: our pixels differ from Pillow's")
    if "threads" in ops and not np.array_equal(ops["threads"](), ref):
        raise SystemExit(f"{path.name}: our pixels with threads={threads} differ from Pillow's")
    out: dict[str, Any] = {"shape": list(ref.shape), "mode": Image.open(io.BytesIO(data)).mode}
    if "torchvision" in ops:
        try:
            t = ops["torchvision"]()
            out["tv_same"] = bool(t.shape == ref.shape and np.array_equal(t, ref))
        except Exception as exc:  # torchvision refusing the file
            out["tv_error"] = type(exc).__name__
            del ops["torchvision"]
    medians: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(rounds):
        for name, fn in ops.items():
            medians[name].append(time_op(fn, 5, min_seconds=0.1, clock=CLOCKS[clock]))
    out["ms"] = {name: statistics.median(v) * 1e3 for name, v in medians.items()}
    if "threads" in ops:
        # The CPU time of one call with threads (every thread of the process).
        fn, calls = ops["threads"], 0
        start = time.process_time()
        while time.process_time() - start < 0.2 or calls < 5:
            fn()
            calls += 1
        out["threads_cpu_ms"] = (time.process_time() - start) / calls * 1e3
    return out


def versions() -> str:
    import numpy as np
    import PIL
    from benchkit import cpu_model

    import smg_grpc_proto

    parts = [
        cpu_model(),
        f"Python {platform.python_version()}",
        f"numpy {np.__version__}",
        f"Pillow {PIL.__version__}",
        f"smg_grpc_proto {getattr(smg_grpc_proto, '__version__', '?')}"
        f" ({Path(smg_grpc_proto.__file__).parent})",
    ]
    try:
        import torch
        import torchvision

        parts.append(f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    except ImportError:
        parts.append("no torch")
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated file names")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or process CPU time (steadier on a loaded machine)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="also time vision.decode(..., threads=N) on two cores (wall clock)",
    )
    parser.add_argument(
        "--no-progressive",
        action="store_true",
        help="leave out the real JPEGs made progressive by jpegtran",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--peak", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child and args.peak:
        print(json.dumps(peak_child(Path(args.child), args.peak)))
        return
    if args.child:
        print(json.dumps(child(Path(args.child), args.rounds, args.clock, args.threads)))
        return
    only = {n for n in args.only.split(",") if n}
    threaded = args.threads != 1
    if threaded:
        args.clock = "wall"
    cores = "0,1" if threaded else "0"
    pin = ["taskset", "-c", cores] if shutil.which("taskset") else []
    print(versions())
    print(f"clock: {args.clock}; {args.rounds} rounds; pinned to cores {cores}\n")
    extra = f" threads={args.threads}: ms / x Pillow / CPU ms / x ours |" if threaded else ""
    print(
        "| file | size | mode | ours ms | Pillow ms | x | torchvision ms (same) "
        f"| peak MiB ours / Pillow |{extra}"
    )
    print("|---|---|---|---|---|---|---|---|" + ("---|" if threaded else ""))
    env = dict(os.environ)
    for name, path in files(progressive=not args.no_progressive):
        if only and name not in only and name.removeprefix("pillow:") not in only:
            continue
        cmd = [*pin, sys.executable, __file__, "--child", str(path), "--rounds", str(args.rounds)]
        cmd += ["--clock", args.clock, "--threads", str(args.threads)]
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if run.returncode != 0:
            print(f"| {name} | failed: {run.stderr.strip().splitlines()[-1:]} |")
            continue
        r = json.loads(run.stdout.strip().splitlines()[-1])
        peak = {}
        for decoder in ("ours", "pillow"):
            cmd = [sys.executable, __file__, "--child", str(path), "--peak", decoder]
            run = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            peak[decoder] = float(run.stdout.strip().splitlines()[-1])
        ms = r["ms"]
        h, w = r["shape"][:2]
        tv = (
            f"{ms['torchvision']:.2f} ({'yes' if r['tv_same'] else 'no'})"
            if "torchvision" in ms
            else r.get("tv_error", "-")
        )
        cells = ""
        if threaded:
            t = ms["threads"]
            cells = (
                f" {t:.2f} / {ms['pillow'] / t:.2f} / {r['threads_cpu_ms']:.2f} / "
                f"{ms['ours'] / t:.2f} |"
            )
        print(
            f"| {name} | {w}x{h} | {r['mode']} | {ms['ours']:.2f} | {ms['pillow']:.2f} | "
            f"{ms['pillow'] / ms['ours']:.2f} | {tv} | {peak['ours']:.1f} / {peak['pillow']:.1f} |"
            f"{cells}",
            flush=True,
        )


if __name__ == "__main__":
    main()
