"""Pillow vs smg_grpc_proto.vision.resize, side by side in one run.

Usage: python scripts/bench_resample.py [--repeat N] [--filters bicubic,bilinear,lanczos]

Cases are the resizes vision models actually do (Qwen2-VL sizes): 512x600 -> 504x588, 1280x960
-> 1288x952 (slight upscale), 1920x1080 -> 1316x728 and 4032x3024 -> 1148x840 (downscales),
on RGB photographs (grace_hopper, upscaled with Pillow for the larger inputs; speed does not depend
on content). Columns, in milliseconds (median of --repeat runs):

* ``pillow``: ``Image.resize(..., reducing_gap=None)`` on a ready ``PIL.Image`` (single thread);
* ``pil+np``: the transformers PIL-backend path, ``np.array(Image.fromarray(x).resize(...))``;
* ``ours 1t`` / ``ours Nt``: ``resize(x, ...)`` on one thread / on every core.

Ratios are ``pil+np / ours``. Every output is also checked to be byte-identical to Pillow's.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.images import grace_hopper

from smg_grpc_proto.vision import resize

CASES = [
    ((512, 600), (504, 588)),
    ((1280, 960), (1288, 952)),
    ((1920, 1080), (1316, 728)),
    ((4032, 3024), (1148, 840)),
]
PIL_IDS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


def timed(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm up (page faults, caches, thread start-up paths)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def pil_backend(x: np.ndarray, size: tuple[int, int], f: int) -> np.ndarray:
    """transformers' PIL backend: array -> PIL image -> resize -> array."""
    return np.array(Image.fromarray(x).resize(size, f, reducing_gap=None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--filters", default="bicubic,bilinear,lanczos")
    args = parser.parse_args()
    cores = os.cpu_count() or 1

    with Image.open(io.BytesIO(grace_hopper())) as im:
        base = im.convert("RGB")
    print(f"Pillow {Image.__version__}, {cores} cores, median of {args.repeat} runs, ms")
    header = (
        f"{'case':26} {'filter':9} {'pillow':>8} {'pil+np':>8} {'ours 1t':>8} "
        f"{f'ours {cores}t':>8} {'x 1t':>6} {f'x {cores}t':>6}"
    )
    print(header)
    print("-" * len(header))
    for (w, h), (ow, oh) in CASES:
        img = base if (w, h) == base.size else base.resize((w, h), Image.Resampling.LANCZOS)
        x = np.array(img)
        for name in args.filters.split(","):
            f = PIL_IDS[name]
            want = np.array(img.resize((ow, oh), f, reducing_gap=None))
            assert np.array_equal(resize(x, (ow, oh), resample=name), want), (w, h, name)
            size = (ow, oh)
            pillow = timed(functools.partial(img.resize, size, f, reducing_gap=None), args.repeat)
            pil_np = timed(functools.partial(pil_backend, x, size, f), args.repeat)
            one = timed(functools.partial(resize, x, size, resample=name, threads=1), args.repeat)
            every = timed(
                functools.partial(resize, x, size, resample=name, threads=cores), args.repeat
            )
            print(
                f"{f'{w}x{h} -> {ow}x{oh}':26} {name:9} {pillow:8.2f} {pil_np:8.2f} {one:8.3f} "
                f"{every:8.3f} {pil_np / one:6.1f} {pil_np / every:6.1f}"
            )


if __name__ == "__main__":
    main()
