"""``smg_grpc_proto.vision.decode`` against Pillow 13.0.0 + transformers' ``convert_to_rgb``.

The reference is what transformers' loader gets: ``Image.open(BytesIO(data))``, then
``ImageOps.exif_transpose``, then ``convert_to_rgb`` (alpha composited onto white) and
``np.array``. Every comparison is byte for byte.
"""

from __future__ import annotations

import io
import pickle
import random
import struct
import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

PIL = pytest.importorskip("PIL", reason="the reference decoder is Pillow")
from PIL import Image, features  # noqa: E402
from PIL.PngImagePlugin import PngInfo  # noqa: E402
from support import images  # noqa: E402
from support.decode_cases import (  # noqa: E402
    encode,
    exif,
    mutate,
    photo,
    png16,
    reference,
    seeds,
    with_scans,
)

from smg_grpc_proto import _native, vision  # noqa: E402
from smg_grpc_proto.errors import (  # noqa: E402
    IMAGE_DECODE_ERRORS,
    CorruptImageError,
    EmptyImageError,
    ImageDecodeError,
    ImageTooLargeError,
    SmgProtoError,
    TruncatedImageError,
    UnknownImageFormatError,
    UnsupportedImageError,
)

pytestmark = pytest.mark.skipif(
    PIL.__version__ != "13.0.0", reason=f"goldens are Pillow 13.0.0, found {PIL.__version__}"
)

FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".gif": "GIF", ".bmp": "BMP"}
FORMATS[".webp"] = "WEBP"

# Files of Pillow's Tests/images that Pillow itself cannot open or load: we must raise
# ImageDecodeError for them too (of the kind given).
PILLOW_FAILS = {
    "apng/chunk_no_fctl.png": "corrupt",  # "APNG contains frame sequence errors"
    "apng/syntax_num_frames_zero.png": "corrupt",  # no IDAT: "cannot load this image"
    "bmp/b/badbitcount.bmp": "unsupported",
    "bmp/b/badheadersize.bmp": "unsupported",
    "bmp/b/badpalettesize.bmp": "unsupported",
    "bmp/b/badwidth.bmp": "too_many_pixels",
    "bmp/b/reallybig.bmp": "too_many_pixels",
    "bmp/b/shortfile.bmp": "truncated",
    "bmp/g/rgb32bf.bmp": "unsupported",  # bitfields layout Pillow does not know
    "bmp/q/pal2.bmp": "unsupported",  # 2-bit pixels
    "bmp/q/pal8os2v2-16.bmp": "unsupported",  # 16-byte OS/2 v2 header
    "bmp/q/pal8oversizepal.bmp": "unsupported",  # 300-entry palette: "invalid palette size"
    "bmp/q/rgb16-231.bmp": "unsupported",
    "bmp/q/rgb24jpeg.bmp": "unsupported",  # JPEG-compressed BMP
    "bmp/q/rgb24png.bmp": "unsupported",  # PNG-compressed BMP
    "bmp/q/rgb32-111110.bmp": "unsupported",
    "bmp/q/rgba16-4444.bmp": "unsupported",
    "bmp/q/rgba32abf.bmp": "unsupported",  # compression 6 (ALPHABITFIELDS)
    "broken.png": "corrupt",
    "broken_data_stream.png": "corrupt",
    "decompression_bomb.gif": "too_many_pixels",
    "l2rgb_read.bmp": "truncated",  # 1-entry gray palette on 4-bit pixels, unpacked as 1-bit
    "png_decompression_dos.png": "corrupt",  # zTXt inflating past MAX_TEXT_CHUNK (1 MiB)
    "truncated_end_chunk.png": "truncated",
    "truncated_image.png": "truncated",
    "truncated_jpeg.jpg": "truncated",
    "ultrahdr.jpg": "truncated",  # gain map JPEG cut after the primary image's headers
    "unknown_compression_method.png": "corrupt",  # Pillow: unknown zTXt method; here a bad CRC
    "zero_width.gif": "zero_size",
}

# Files Pillow refuses that we decode, with the reason: none (Pillow's APNG sequence check and
# its text size limit are followed too).
WE_DECODE_PILLOW_FAILS: dict[str, str] = {}


def assert_same(data: bytes, **kwargs: Any) -> np.ndarray:
    ours = vision.decode(data, **kwargs)
    ref = reference(data, **kwargs)
    assert ours.shape == ref.shape
    diff = np.count_nonzero(ours != ref)
    assert diff == 0, f"{diff} bytes differ"
    return ours


# ---------------------------------------------------------------------------------------------
# Pillow's own test images


@pytest.fixture(scope="module")
def pillow_images() -> Path:
    return images.pillow_test_images()


def _files(root: Path, fmt: str) -> list[Path]:
    return sorted(
        p for p in root.rglob("*") if p.is_file() and FORMATS.get(p.suffix.lower()) == fmt
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP", "WEBP"])
def test_pillow_test_images(pillow_images: Path, fmt: str) -> None:
    checked, problems = Counter[str](), []
    for path in _files(pillow_images, fmt):
        name = path.relative_to(pillow_images).as_posix()
        data = path.read_bytes()
        try:
            ref = reference(data)
        except Exception as exc:
            ref_error: Exception | None = exc
        else:
            ref_error = None
        try:
            ours = vision.decode(data)
        except ImageDecodeError as exc:
            if ref_error is None:
                problems.append(f"{name}: we raise {exc!r}, Pillow decodes")
            elif PILLOW_FAILS.get(name) != exc.kind:
                problems.append(f"{name}: {exc.kind} not listed (Pillow: {ref_error!r})")
            checked["both fail"] += 1
            continue
        if ref_error is not None:
            if name not in WE_DECODE_PILLOW_FAILS:
                problems.append(f"{name}: Pillow raises {ref_error!r}, we decode")
            checked["Pillow fails"] += 1
            continue
        if ours.shape != ref.shape:
            problems.append(f"{name}: shape {ours.shape} != {ref.shape}")
        elif (diff := int(np.count_nonzero(ours != ref))) != 0:
            problems.append(f"{name}: {diff} bytes differ")
        else:
            checked["identical"] += 1
    assert not problems, "\n".join(problems)
    assert checked["identical"] >= {"JPEG": 50, "PNG": 400, "GIF": 35, "BMP": 50, "WEBP": 12}[fmt]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pillow_test_images_alpha_drop_and_no_exif(pillow_images: Path) -> None:
    """``alpha="drop"`` is ``convert("RGB")``; ``apply_exif=False`` skips the transpose."""
    count = 0
    for fmt in FORMATS.values():
        for path in _files(pillow_images, fmt):
            name = path.relative_to(pillow_images).as_posix()
            if name in PILLOW_FAILS or name in WE_DECODE_PILLOW_FAILS:
                continue
            data = path.read_bytes()
            for kwargs in ({"alpha": "drop"}, {"apply_exif": False}):
                ours = vision.decode(data, **kwargs)  # type: ignore[arg-type]
                ref = reference(data, **kwargs)
                assert ours.shape == ref.shape, (name, kwargs)
                assert np.array_equal(ours, ref), (name, kwargs)
                count += 1
    assert count > 1000


@pytest.mark.timeout(120)
def test_grace_hopper() -> None:
    data = images.grace_hopper()
    out = assert_same(data)
    assert out.shape == (600, 512, 3)


def test_libjpeg_turbo_version() -> None:
    # We link libjpeg-turbo 3.1.0 (turbojpeg-sys 1.2); Pillow 13.0.0 wheels bundle 3.2.0. The
    # decoding arithmetic (ISLOW IDCT, fancy upsampling, colour conversion) is the same in both;
    # the byte-for-byte tests here are what proves it.
    assert features.version("libjpeg_turbo") == "3.2.0"


# ---------------------------------------------------------------------------------------------
# Synthetic images, encoded with Pillow


def _jpeg_cases() -> dict[str, bytes]:
    rgb = photo(203, 117)
    cases = {
        f"baseline-{name}": encode(rgb, "JPEG", quality=q, subsampling=s)
        for name, q, s in [("444", 90, 0), ("422", 85, 1), ("420", 75, 2), ("q100-420", 100, 2)]
    }
    cases["progressive-420"] = encode(rgb, "JPEG", progressive=True, quality=80)
    cases["progressive-444"] = encode(rgb, "JPEG", progressive=True, subsampling=0)
    cases["optimized"] = encode(rgb, "JPEG", optimize=True)
    cases["restart-markers"] = encode(rgb, "JPEG", restart_marker_blocks=3)
    cases["grayscale"] = encode(rgb.convert("L"), "JPEG")
    cases["grayscale-progressive"] = encode(rgb.convert("L"), "JPEG", progressive=True)
    cases["cmyk"] = encode(rgb.convert("CMYK"), "JPEG")
    cases["odd-1x1"] = encode(photo(1, 1), "JPEG")
    cases["odd-10x10"] = encode(photo(10, 10), "JPEG", subsampling=2)
    cases["odd-17x3"] = encode(photo(17, 3), "JPEG", subsampling=1)
    return cases


@pytest.mark.parametrize(("name", "data"), sorted(_jpeg_cases().items()))
def test_synthetic_jpeg(name: str, data: bytes) -> None:
    assert_same(data)


@pytest.mark.slow
def test_recycled_buffers_hold_no_stale_pixels() -> None:
    """Large decoded images go back to the buffer cache when dropped and the JPEG decoder writes
    the next image into them: each result must still be exactly Pillow's, whatever was there."""
    files = [
        encode(photo(900, 700, seed=1), "JPEG", quality=90),
        encode(photo(900, 700, seed=2), "JPEG", progressive=True, quality=70),
        encode(photo(900, 700, seed=3).convert("L"), "JPEG"),
        encode(photo(880, 700, seed=4), "JPEG", subsampling=0),
    ]
    previous = vision.buffer_cache(256 << 20).limit
    try:
        for _ in range(2):
            for data in files:
                assert_same(data)  # decoded, compared, dropped: its buffer is kept
                assert vision.buffer_cache().held >= 880 * 700 * 3
    finally:
        vision.buffer_cache(previous)


def _png_cases() -> dict[str, bytes]:
    base = photo(45, 29, "RGBA")
    cases: dict[str, bytes] = {}
    for mode in ("RGBA", "RGB", "LA", "L", "1", "P", "I;16"):
        im = base.convert(mode) if mode not in ("I;16",) else None
        if mode == "I;16":
            arr = (np.arange(45 * 29, dtype=np.uint32).reshape(29, 45) * 97) % 65536
            arr[0, :10] = np.arange(250, 260)
            im = Image.fromarray(arr.astype("<u2"))
        assert im is not None
        cases[mode] = encode(im, "PNG")
        cases[f"{mode}-interlaced"] = encode(im, "PNG", interlace=1) if mode != "I;16" else b""
    cases = {k: v for k, v in cases.items() if v}
    rgb = base.convert("RGB")
    cases["RGB-tRNS"] = encode(rgb, "PNG", transparency=tuple(int(v) for v in rgb.getpixel((3, 3))))
    cases["L-tRNS"] = encode(
        base.convert("L"), "PNG", transparency=int(base.convert("L").getpixel((0, 0)))
    )
    p = base.convert("RGB").quantize(16)
    cases["P-tRNS-index"] = encode(p, "PNG", transparency=3)
    cases["P-tRNS-bytes"] = encode(p, "PNG", transparency=bytes(range(0, 256, 16)))
    cases["P-4bit"] = encode(p, "PNG", bits=4)
    cases["P-2bit"] = encode(base.convert("RGB").quantize(4), "PNG", bits=2)
    cases["1x1-RGBA"] = encode(photo(1, 1, "RGBA"), "PNG")
    cases["10x10-RGBA"] = encode(photo(10, 10, "RGBA"), "PNG")
    # 16-bit RGB / RGBA / LA: written by hand (Pillow cannot write them).
    rng = np.random.default_rng(3)
    for name, color, channels in (("RGB16", 2, 3), ("RGBA16", 6, 4), ("LA16", 4, 2)):
        arr = rng.integers(0, 65536, size=(7, 5, channels), dtype=np.uint16)
        cases[name] = png16(arr, color)
    gray16 = rng.integers(0, 400, size=(6, 9, 1), dtype=np.uint16)
    cases["gray16-tRNS"] = png16(gray16, 0, trns=struct.pack(">H", int(gray16[0, 0, 0])))
    return cases


@pytest.mark.parametrize(("name", "data"), sorted(_png_cases().items()))
def test_synthetic_png(name: str, data: bytes) -> None:
    assert_same(data)
    assert_same(data, alpha="drop")


def _other_cases() -> dict[str, bytes]:
    rgba = photo(37, 23, "RGBA")
    rgb = rgba.convert("RGB")
    cases = {
        "webp-lossy": encode(rgb, "WEBP", quality=80),
        "webp-lossy-alpha": encode(rgba, "WEBP", quality=70),
        "webp-lossless": encode(rgb, "WEBP", lossless=True),
        "webp-lossless-alpha": encode(rgba, "WEBP", lossless=True),
        "webp-1x1": encode(photo(1, 1), "WEBP"),
        "gif": encode(rgb.quantize(64), "GIF"),
        "gif-transparency": encode(rgb.quantize(64), "GIF", transparency=5),
        "gif-gray": encode(rgb.convert("L"), "GIF"),
        "gif-interlaced": encode(rgb.quantize(64), "GIF", interlace=True),
        "bmp-24": encode(rgb, "BMP"),
        "bmp-8-palette": encode(rgb.quantize(200), "BMP"),
        "bmp-8-gray": encode(rgb.convert("L"), "BMP"),
        "bmp-1": encode(rgb.convert("1"), "BMP"),
        "bmp-32-rgba": encode(rgba, "BMP"),
    }
    frames = [photo(20, 20, "RGBA", seed=s) for s in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    cases["webp-animated"] = buf.getvalue()
    buf = io.BytesIO()
    frames[0].convert("RGB").save(buf, "GIF", save_all=True, append_images=frames[1:])
    cases["gif-animated"] = buf.getvalue()
    return cases


@pytest.mark.parametrize(("name", "data"), sorted(_other_cases().items()))
def test_synthetic_webp_gif_bmp(name: str, data: bytes) -> None:
    assert_same(data)
    assert_same(data, alpha="drop")


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_exif_orientation(fmt: str, orientation: int) -> None:
    im = photo(31, 18)
    params: dict[str, Any] = {"exif": exif(orientation)}
    if fmt == "WEBP":
        params["lossless"] = True
    data = encode(im, fmt, **params)
    out = assert_same(data)
    assert out.shape[:2] == ((31, 18) if orientation >= 5 else (18, 31))
    assert_same(data, apply_exif=False)


def test_xmp_orientation() -> None:
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    data = encode(photo(20, 9), "JPEG", xmp=xmp)
    assert assert_same(data).shape == (20, 9, 3)
    for compressed in (False, True):
        info = PngInfo()
        info.add_itxt("XML:com.adobe.xmp", xmp.decode(), zip=compressed)
        data = encode(photo(20, 9), "PNG", pnginfo=info)
        assert assert_same(data).shape == (20, 9, 3)
    info = PngInfo()
    info.add_text("XML:com.adobe.xmp", xmp.decode().replace('"6"', '"8"'))
    data = encode(photo(20, 9), "PNG", pnginfo=info)
    assert assert_same(data).shape == (20, 9, 3)
    data = encode(photo(20, 9), "WEBP", xmp=xmp.replace(b'"6"', b'"3"'))
    assert assert_same(data).shape == (9, 20, 3)


def test_exif_orientation_with_other_types() -> None:
    # Orientation stored as LONG, and a malformed EXIF block (ignored by both).
    block = Image.Exif()
    block[0x0112] = 8
    good = encode(photo(12, 5), "JPEG", exif=block.tobytes())
    assert_same(good)
    bad = encode(photo(12, 5), "JPEG", exif=b"Exif\x00\x00XX*\x00\x08\x00\x00\x00")
    assert_same(bad)


# ---------------------------------------------------------------------------------------------
# Return type, arguments, errors


def test_array_properties_and_inputs(tmp_path: Path) -> None:
    data = encode(photo(8, 4), "PNG")
    out = vision.decode(data)
    assert out.dtype == np.uint8
    assert out.shape == (4, 8, 3)
    assert out.flags.c_contiguous
    assert out.flags.writeable
    assert not out.flags.owndata
    out[0, 0] = 7  # the buffer belongs to this array (through its base) alone
    assert not np.array_equal(vision.decode(data), out)
    del out
    out = vision.decode(data)
    for source in (bytearray(data), memoryview(data)):
        assert np.array_equal(vision.decode(source), out)
    path = tmp_path / "x.png"
    path.write_bytes(data)
    assert np.array_equal(vision.decode(path), out)
    assert np.array_equal(vision.decode(str(path)), out)
    with pytest.raises(TypeError):
        vision.decode(12)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha"):
        vision.decode(data, alpha="black")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        vision.decode(data, max_pixels=-1)


def test_error_kinds_match_rust() -> None:
    rust = _native.decode_error_kinds()
    assert rust == list(IMAGE_DECODE_ERRORS), (
        f"paste into errors.py: {rust} (one ImageDecodeError subclass per kind)"
    )
    for kind, cls in IMAGE_DECODE_ERRORS.items():
        assert issubclass(cls, ImageDecodeError)
        assert issubclass(cls, ValueError)
        assert issubclass(cls, SmgProtoError)
        assert cls.kind == kind


def test_errors_pickle() -> None:
    with pytest.raises(ImageTooLargeError) as info:
        vision.decode(encode(photo(10, 10), "PNG"), max_pixels=99)
    err = info.value
    assert (err.field, err.expected, err.actual, err.format) == ("max_pixels", 99, 100, "PNG")
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is ImageTooLargeError
    assert (clone.field, clone.expected, clone.actual, clone.format) == (
        "max_pixels",
        99,
        100,
        "PNG",
    )
    assert str(clone) == str(err)
    assert "10x10" in str(err)


def test_pixel_limit_before_allocation() -> None:
    # A 60000 x 60000 PNG header (3.6 G pixels) with no image data: rejected from the header.
    ihdr = struct.pack(">IIBBBBB", 60000, 60000, 8, 6, 0, 0, 0)
    body = b"IHDR" + ihdr
    data = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + body + struct.pack(">I", zlib.crc32(body))
    with pytest.raises(ImageTooLargeError, match="3600000000 pixels"):
        vision.decode(data)
    # Exactly at the limit passes the check (and then fails for lack of data).
    with pytest.raises(TruncatedImageError):
        vision.decode(data, max_pixels=3_600_000_000)
    assert vision.DEFAULT_MAX_PIXELS == 2 * Image.MAX_IMAGE_PIXELS


def _truncations(data: bytes) -> list[bytes]:
    cuts = {1, 2, 3, 4, 8, 12, 16, 20, 30, 50, len(data) // 3, len(data) // 2, len(data) - 20}
    return [data[:c] for c in sorted(cuts) if 0 < c < len(data) - 2]


def test_scan_limit() -> None:
    prog = encode(photo(64, 48), "JPEG", progressive=True)
    assert_same(with_scans(prog, 500))  # at the limit: decodes, as in Pillow
    with pytest.raises(CorruptImageError, match="more than 500 scans"):
        vision.decode(with_scans(prog, 501))


def _bad_inputs() -> list[tuple[str, bytes, type[ImageDecodeError]]]:
    jpeg = encode(photo(64, 48), "JPEG")
    prog = encode(photo(64, 48), "JPEG", progressive=True)
    png = encode(photo(64, 48, "RGBA"), "PNG")
    gif = encode(photo(64, 48).quantize(32), "GIF")
    bmp = encode(photo(64, 48), "BMP")
    webp = encode(photo(64, 48), "WEBP")
    sof = jpeg.index(b"\xff\xc0")
    dht = jpeg.index(b"\xff\xc4")
    desc = gif.index(b",\x00\x00\x00\x00")
    cases: list[tuple[str, bytes, type[ImageDecodeError]]] = [
        ("empty", b"", UnknownImageFormatError),
        ("text", b"hello, world", UnknownImageFormatError),
        ("tiff", encode(photo(4, 4), "TIFF"), UnknownImageFormatError),
        ("ico", encode(photo(16, 16), "ICO"), UnknownImageFormatError),
        ("jpeg-12-bit", jpeg[: sof + 4] + b"\x0c" + jpeg[sof + 5 :], UnsupportedImageError),
        ("jpeg-2-components", jpeg[: sof + 9] + b"\x02" + jpeg[sof + 10 :], UnsupportedImageError),
        ("jpeg-zero-height", jpeg[: sof + 5] + b"\x00\x00" + jpeg[sof + 7 :], EmptyImageError),
        ("jpeg-bad-huffman", jpeg[: dht + 5] + b"\xff" * 16 + jpeg[dht + 21 :], CorruptImageError),
        ("png-zero-width", png[:16] + b"\x00\x00\x00\x00" + png[20:], EmptyImageError),
        ("png-bad-ihdr-crc", png[:29] + b"\x00\x00\x00\x00" + png[33:], CorruptImageError),
        ("png-bad-depth", png[:24] + b"\x03" + png[25:], UnsupportedImageError),
        (
            "gif-zero-size",
            gif[:6] + bytes(4) + gif[10:desc] + gif[desc : desc + 5] + bytes(4) + gif[desc + 9 :],
            EmptyImageError,
        ),
        ("gif-lzw-code-size-13", gif[: desc + 10] + b"\x0d" + gif[desc + 11 :], CorruptImageError),
        ("bmp-zero-height", bmp[:22] + b"\x00\x00\x00\x00" + bmp[26:], EmptyImageError),
        ("bmp-bad-depth", bmp[:28] + b"\x07\x00" + bmp[30:], UnsupportedImageError),
        ("bmp-bad-compression", bmp[:30] + b"\x09" + bmp[31:], UnsupportedImageError),
        ("webp-garbage", webp[:20] + bytes(len(webp) - 20), CorruptImageError),
        ("over-limit", encode(photo(300, 300), "GIF"), ImageTooLargeError),
        ("jpeg-600-scans", with_scans(prog, 600), CorruptImageError),
    ]
    for name, data in (("jpeg", jpeg), ("jpeg-prog", prog), ("gif", gif)):
        cases += [(f"{name}-cut-{len(t)}", t, ImageDecodeError) for t in _truncations(data)]
    # A PNG cut inside its last 24 bytes (adler32, IDAT CRC, IEND) still has every row: Pillow
    # decodes it, and so do we (test_decode_differential.py checks that).
    cases += [
        (f"png-cut-{len(t)}", t, ImageDecodeError)
        for t in _truncations(png)
        if len(t) < len(png) - 24
    ]
    cases += [(f"bmp-cut-{len(t)}", t, ImageDecodeError) for t in _truncations(bmp)]
    cases += [(f"webp-cut-{len(t)}", t, ImageDecodeError) for t in _truncations(webp)]
    return cases


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("name", "data", "error"), _bad_inputs(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_bad_input(name: str, data: bytes, error: type[ImageDecodeError]) -> None:
    with pytest.raises(error) as info:
        vision.decode(data, max_pixels=80_000)
    assert isinstance(info.value, ValueError)
    assert str(info.value)
    if info.value.kind != "unknown_format":
        assert info.value.format is not None
        assert info.value.format in str(info.value)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP", "WEBP"])
def test_truncated_is_truncated(fmt: str) -> None:
    data = encode(photo(64, 48), fmt)
    with pytest.raises(TruncatedImageError, match=f"^{fmt}: image file is truncated"):
        vision.decode(data[: len(data) * 2 // 3])


def test_concurrent_decoding_releases_the_gil() -> None:
    data = encode(photo(640, 480), "JPEG")
    want = vision.decode(data)
    with ThreadPoolExecutor(4) as pool:
        for out in pool.map(vision.decode, [data] * 16):
            assert np.array_equal(out, want)


# ---------------------------------------------------------------------------------------------
# Fuzzing: mutated files never crash, hang or raise anything but ImageDecodeError


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fuzz_mutated_files() -> None:
    rng = random.Random(20261130)
    files = seeds()
    outcomes: Counter[str] = Counter()
    start = time.monotonic()
    total = 50_000
    for n in range(total):
        data = mutate(rng, files[n % len(files)])
        # Most runs with a small limit (realistic and fast); every 50th with the default one.
        limit = vision.DEFAULT_MAX_PIXELS if n % 50 == 0 else 1 << 22
        try:
            out = vision.decode(data, max_pixels=limit)
        except ImageDecodeError as exc:
            outcomes[exc.kind] += 1
        else:
            assert out.ndim == 3
            assert out.shape[2] == 3
            outcomes["decoded"] += 1
    elapsed = time.monotonic() - start
    assert sum(outcomes.values()) == total
    assert outcomes["decoded"] > total // 10, outcomes
    assert len(outcomes) >= 4, outcomes
    assert elapsed < 200, f"{total} mutated files took {elapsed:.0f} s"
