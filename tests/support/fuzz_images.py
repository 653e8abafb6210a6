"""Fuzz worker for hostile images, run in a child process by tests/security/test_fuzz_campaign.py.

``python -m support.fuzz_images SEED SECONDS WORKDIR HEADROOM_MIB``: encodes small photos in every
format (and headers declaring huge images: decompression bombs), then, under an address-space limit
of its current size plus ``HEADROOM_MIB``, mutates them and runs each case through ``vision.decode``
and four processors (Qwen2-VL, Gemma 3 on the Pillow path, Llama 4 on the torch path, Inkling2
decoding with transparency kept): every failure must be a library error (``SmgProtoError``). Each
case is written to ``WORKDIR/current.bin`` first, so a crash can be replayed. The last stdout line
is a JSON summary with counts per outcome and the failures.
"""

from __future__ import annotations

import io
import json
import random
import struct
import time
import traceback
import zlib
from collections import Counter
from typing import Any

import numpy as np
from PIL import Image

from smg_grpc_proto import vision
from smg_grpc_proto.errors import SmgProtoError
from smg_grpc_proto.vision import ImageProcessor
from support.mutate import limit_address_space, mutate_bytes, worker_args


def _photo(width: int, height: int) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(width * 1000 + height)
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) % 256], -1)
    noise = rng.integers(-20, 21, base.shape)
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB")


def _encode(image: Image.Image, fmt: str, **params: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png_bomb(width: int, height: int) -> bytes:
    """A valid PNG header declaring ``width x height`` with a tiny, short image stream."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 1024)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")
    )


def _bmp_bomb(width: int, height: int) -> bytes:
    header = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, 0, 2835, 2835, 0, 0)
    body = bytes(64)
    return b"BM" + struct.pack("<IHHI", 14 + len(header) + len(body), 0, 0, 54) + header + body


def seeds() -> list[bytes]:
    small = _photo(37, 23)
    rgba = small.convert("RGBA")
    rgba.putalpha(Image.fromarray((np.arange(37 * 23) % 256).astype(np.uint8).reshape(23, 37)))
    out = [
        _encode(small, "JPEG", quality=90),
        _encode(small, "JPEG", progressive=True, subsampling=0),
        _encode(small.convert("CMYK"), "JPEG"),
        _encode(small, "PNG"),
        _encode(rgba, "PNG"),
        _encode(small.quantize(16), "PNG", transparency=3),
        _encode(small.convert("LA"), "PNG", interlace=1),
        _encode(small.quantize(16), "GIF", transparency=1),
        _encode(small, "BMP"),
        _encode(rgba, "WEBP", quality=60),
        _encode(small, "WEBP", lossless=True),
        _png_bomb(12_000, 12_000),  # 144 M pixels: under the pixel limit, over the memory limit
        _png_bomb(1, 100_000_000),  # a strip under the pixel limit
        _png_bomb(70_000, 70_000),  # over the pixel limit
        _bmp_bomb(12_000, 12_000),
        _encode(_photo(1, 300), "PNG"),  # a 1-pixel-wide strip
        _encode(_photo(300, 1), "JPEG"),
    ]
    return out


def main() -> None:
    seed, seconds, workdir, headroom = worker_args()
    cases = seeds()
    processors = {
        name: ImageProcessor(name, threads=1) for name in ("qwen2_vl", "gemma3", "llama4")
    }
    # Inkling2 with alpha="white" decodes through its own entry point, keeping transparency (its
    # checkerboard composite): it runs on every case, before decode's refusal ends the case
    keeping_alpha = ImageProcessor("inkling2", threads=1, alpha="white")
    for processor in [*processors.values(), keeping_alpha]:  # warm up (torch allocates pools)
        processor([cases[0]])
    limit = limit_address_space(headroom)
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    current = workdir / "current.bin"
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        data = cases[n % len(cases)]
        n += 1
        if rng.random() < 0.9:
            data = mutate_bytes(rng, data)
        current.write_bytes(data)
        steps: list[tuple[str, Any]] = [("inkling2", lambda d: keeping_alpha([d]))]
        steps.append(("decode", vision.decode))
        steps += [(name, lambda d, p=p: p([d])) for name, p in processors.items()]
        for name, step in steps:
            try:
                step(data)
            except SmgProtoError as exc:
                outcomes[f"{name}: {type(exc).__name__}"] += 1
                if name == "decode":
                    break  # the processors would refuse it the same way
            except Exception as exc:
                outcomes["failure"] += 1
                if len(failures) < 20:
                    failures.append(
                        {
                            "step": name,
                            "error": "".join(traceback.format_exception_only(exc)).strip(),
                            "bytes": data.hex() if len(data) < 4096 else f"{len(data)} bytes",
                        }
                    )
            else:
                outcomes[f"{name}: ok"] += 1
    print(
        json.dumps(
            {"cases": n, "outcomes": dict(outcomes), "failures": failures, "as_limit": limit}
        )
    )


if __name__ == "__main__":
    main()
