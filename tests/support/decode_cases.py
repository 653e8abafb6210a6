"""Shared by the decoding tests: the Pillow reference, synthetic images, fuzz seeds and mutator.

``reference`` is what transformers' loader gets from Pillow 13.0.0: ``Image.open(BytesIO(data))``,
``ImageOps.exif_transpose``, then ``convert_to_rgb`` (alpha composited onto white) and
``np.array``, with Pillow's defaults (``ImageFile.LOAD_TRUNCATED_IMAGES = False``).
"""

from __future__ import annotations

import io
import random
import struct
import time
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image, ImageOps


def reference(data: bytes, *, apply_exif: bool = True, alpha: str = "white") -> np.ndarray:
    """What transformers gets: open, exif_transpose, convert_to_rgb, np.array."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        im: Any = Image.open(io.BytesIO(data))
        im = ImageOps.exif_transpose(im) if apply_exif else im
        im.load()
        has_alpha = "A" in im.getbands() or im.info.get("transparency") is not None
        if alpha == "white" and has_alpha:
            im = im.convert("RGBA")
            white = Image.new("RGBA", im.size, (255, 255, 255, 255))
            im = Image.alpha_composite(white, im).convert("RGB")
        else:
            im = im.convert("RGB")
        return np.array(im)


def encode(im: Image.Image, fmt: str, **params: Any) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **params)
    return buf.getvalue()


def scan_per_coefficient(bands: int) -> str:
    """A jpegtran ``-scans`` script for a gray image, the shape of file that makes a progressive
    decoder walk every block once per scan for a few bytes each: DC, then each of the first
    ``bands`` AC coefficients alone with two bits of successive approximation (a first scan and
    two refinements each), then the rest of the block in a first scan and one refinement:
    ``3 * bands + 3`` scans."""
    lines = ["0: 0-0, 0, 0;"]
    for k in range(1, bands + 1):
        lines += [f"0: {k}-{k}, 0, 2;", f"0: {k}-{k}, 2, 1;", f"0: {k}-{k}, 1, 0;"]
    rest = bands + 1
    lines += [f"0: {rest}-63, 0, 1;", f"0: {rest}-63, 1, 0;"]
    return "\n".join(lines) + "\n"


def with_scans(progressive: bytes, n: int) -> bytes:
    """The last scan of a progressive JPEG repeated until there are `n` scans (libjpeg only warns
    about the bogus progression and decodes each copy again)."""
    last = progressive.rindex(b"\xff\xda")
    scan = progressive[last:-2]
    return progressive[:-2] + scan * (n - progressive.count(b"\xff\xda")) + b"\xff\xd9"


def best_cpu_seconds(call: Callable[[], object], rounds: int) -> float:
    """The least process CPU time of `rounds` calls (timing tests compare two decoders this
    way, side by side in one process)."""
    times = []
    for _ in range(rounds):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return min(times)


#: What `damaged_in_scan` inserts: a stray restart marker, a stray comment marker, and six bytes
#: reading as 48 one bits (no Huffman table holds a code of sixteen ones).
STRAY_RST = b"\xff\xd3"
STRAY_COM = b"\xff\xfe"
NO_SUCH_CODE = b"\xff\x00\xff\x00\xff\x00"


def damaged_in_scan(data: bytes, fraction: float, insert: bytes) -> bytes:
    """`insert` placed inside the (last) scan's data, `fraction` of the way from its SOS to the
    EOI, at a byte that neither is nor follows an 0xFF (no stuffed pair or marker is split)."""
    sos, eoi = data.rindex(b"\xff\xda"), data.rindex(b"\xff\xd9")
    at = sos + int((eoi - sos) * fraction)
    while data[at] == 0xFF or data[at - 1] == 0xFF:
        at += 1
    return data[:at] + insert + data[at:]


def photo(w: int = 97, h: int = 61, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """A smooth gradient with noise: exercises chroma upsampling and IDCT rounding."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], axis=-1)
    noise = rng.integers(-20, 21, size=base.shape)
    rgb = np.clip(base + noise, 0, 255).astype(np.uint8)
    alpha = ((x * 7 + y * 3) % 256).astype(np.uint8)[..., None]
    im = Image.fromarray(np.concatenate([rgb, alpha], axis=-1), "RGBA")
    return im if mode == "RGBA" else im.convert(mode)


def png_chunk(cid: bytes, body: bytes) -> bytes:
    """One PNG chunk with its length and CRC."""
    return struct.pack(">I", len(body)) + cid + body + struct.pack(">I", zlib.crc32(cid + body))


def png16(arr: np.ndarray, color: int, trns: bytes | None = None) -> bytes:
    """A 16-bit PNG of colour type `color` written by hand (Pillow cannot write most of them)."""
    h, w, _ = arr.shape
    raw = b"".join(b"\x00" + arr[y].astype(">u2").tobytes() for y in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 16, color, 0, 0, 0)
    out = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
    if trns is not None:
        out += png_chunk(b"tRNS", trns)
    return out + png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b"")


def exif(orientation: int) -> Image.Exif:
    out = Image.Exif()
    out[0x0112] = orientation
    return out


def seeds() -> list[bytes]:
    """Small files of every format and the main variants, for mutation fuzzing."""
    small = photo(23, 17, "RGBA")
    rgb = small.convert("RGB")
    return [
        encode(rgb, "JPEG"),
        encode(rgb, "JPEG", progressive=True, subsampling=0),
        encode(rgb.convert("L"), "JPEG"),
        encode(rgb.convert("CMYK"), "JPEG"),
        encode(small, "PNG"),
        encode(rgb.quantize(8), "PNG", transparency=2),
        encode(rgb.convert("LA"), "PNG", interlace=1),
        png16(np.arange(4 * 5 * 3, dtype=np.uint16).reshape(4, 5, 3) * 999, 2),
        encode(rgb.quantize(16), "GIF", transparency=1),
        encode(rgb.convert("L"), "GIF", interlace=True),
        encode(rgb, "BMP"),
        encode(rgb.quantize(16), "BMP"),
        encode(small, "WEBP", quality=50),
        encode(small, "WEBP", lossless=True),
        encode(rgb, "JPEG", exif=exif(6)),
    ]


#: How :func:`damage_jpeg_scan` damages a place, drawn with equal weight per entry.
JPEG_DAMAGE = ("flip", "flip", "flip", "drop", "double", "insert")


def damage_jpeg_scan(
    rng: random.Random, data: bytes, places: int = 1, actions: tuple[str, ...] = JPEG_DAMAGE
) -> bytes:
    """``data`` with ``places`` random places in its entropy-coded data (after the first SOS
    segment) damaged: a bit flipped, the byte dropped or doubled, or a 0xFF or 0x00 inserted."""
    out = bytearray(data)
    sos = out.index(b"\xff\xda")
    start = sos + 2 + struct.unpack(">H", out[sos + 2 : sos + 4])[0]
    for _ in range(places):
        pos = rng.randrange(start, len(out) - 2)
        action = rng.choice(actions)
        if action == "flip":
            out[pos] ^= 1 << rng.randrange(8)
        elif action == "drop":
            del out[pos]
        elif action == "double":
            out.insert(pos, out[pos])
        else:
            out.insert(pos, rng.choice((0xFF, 0x00)))
    return bytes(out)


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to eight random edits: bit flips, interesting bytes, truncation, insertions,
    deletions and duplicated ranges."""
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3, 8))):
        op = rng.randrange(6)
        if op == 0 and buf:  # flip a bit
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:  # set a byte to an interesting value
            buf[rng.randrange(len(buf))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == 2:  # truncate
            del buf[rng.randrange(len(buf) + 1) :]
        elif op == 3:  # insert bytes
            i = rng.randrange(len(buf) + 1)
            buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif op == 4 and len(buf) > 8:  # delete a range
            i = rng.randrange(len(buf))
            del buf[i : i + rng.randrange(1, 17)]
        elif buf:  # duplicate a range
            i = rng.randrange(len(buf))
            buf[i:i] = buf[i : i + rng.randrange(1, 65)]
    return bytes(buf)
