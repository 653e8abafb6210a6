"""Differential fuzzing: mutated files of every format decode exactly as Pillow 13.0.0 decodes them.

Each seed (``support.decode_cases.seeds`` plus the extra ones here) is mutated thousands of times
with a seeded RNG; each mutant goes through Pillow (``reference``, the transformers way, with
``ImageFile.LOAD_TRUNCATED_IMAGES = False``) and through ``vision.decode``. The promise checked:
both raise (we raise an ``ImageDecodeError``), or both succeed with identical arrays.

The pixel limit is the same on both sides (``max_pixels=LIMIT`` here, ``Image.MAX_IMAGE_PIXELS =
LIMIT // 2`` there: Pillow refuses above twice that), so mutated headers declaring huge images
are refused by both without allocating them.

Documented differences (counted, reported, bounded): a mutant we refuse because of a limit we
document and Pillow lacks (``MAX_JPEG_SCANS``).
"""

from __future__ import annotations

import io
import random
import struct
import subprocess
import sys
import textwrap
import time
import typing
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

PIL = pytest.importorskip("PIL", reason="the reference decoder is Pillow")
from PIL import Image, ImageCms, ImageFile  # noqa: E402
from PIL.PngImagePlugin import PngInfo  # noqa: E402
from support.decode_cases import (  # noqa: E402
    NO_SUCH_CODE,
    STRAY_COM,
    STRAY_RST,
    best_cpu_seconds,
    damage_jpeg_scan,
    damaged_in_scan,
    encode,
    mutate,
    photo,
    png_chunk,
    reference,
    seeds,
)

from smg_grpc_proto import _native, vision  # noqa: E402
from smg_grpc_proto.errors import (  # noqa: E402
    CorruptImageError,
    ImageDecodeError,
    TruncatedImageError,
)

pytestmark = pytest.mark.skipif(
    PIL.__version__ != "13.0.0", reason=f"the reference is Pillow 13.0.0, found {PIL.__version__}"
)

LIMIT = 1 << 22
MUTANTS = 150_000
FORMATS = {b"\xff\xd8": "JPEG", b"\x89P": "PNG", b"GI": "GIF", b"BM": "BMP", b"RI": "WEBP"}


def _split_idat(data: bytes, size: int) -> bytes:
    """`data` (a PNG with one IDAT) with its image data spread over IDAT chunks of `size` bytes."""
    start = data.index(b"IDAT") - 4
    (length,) = struct.unpack(">I", data[start : start + 4])
    body = data[start + 8 : start + 8 + length]
    chunks = b"".join(png_chunk(b"IDAT", body[i : i + size]) for i in range(0, len(body), size))
    return data[:start] + chunks + data[start + 12 + length :]


def differential_seeds() -> list[bytes]:
    """The fuzz seeds plus variants that reach more of each decoder."""
    small = photo(23, 17, "RGBA")
    rgb = small.convert("RGB")
    info = PngInfo()
    info.add_text("comment", "hello")
    tail = encode(rgb, "PNG", pnginfo=info, exif=b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x00")
    frames = [photo(12, 9, "RGBA", seed=s) for s in range(2)]
    gif_anim, webp_anim, apng = (
        encode(frames[0], fmt, save_all=True, append_images=frames[1:], **params)
        for fmt, params in (("GIF", {}), ("WEBP", {"lossless": True}), ("PNG", {}))
    )
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    extra = [
        encode(rgb.quantize(16), "PNG", bits=4),
        encode(rgb.convert("1"), "PNG"),
        encode(rgb.convert("L"), "PNG", interlace=1),
        encode(rgb, "PNG", interlace=1),
        _split_idat(encode(small, "PNG"), 97),
        _split_idat(encode(rgb.convert("L"), "PNG", compress_level=0), 64),
        # One IDAT over 64 KiB: Pillow feeds it to zlib in two pieces.
        encode(photo(160, 140), "PNG", compress_level=0),
        tail,
        encode(rgb.convert("L").point(lambda v: v // 4), "PNG", transparency=7),
        gif_anim,
        encode(rgb.quantize(200), "GIF"),
        encode(rgb.convert("1"), "BMP"),
        encode(rgb.convert("L"), "BMP"),
        encode(small, "BMP"),
        webp_anim,
        apng,
        encode(rgb, "JPEG", icc_profile=icc, dpi=(72, 72)),
        encode(rgb, "WEBP", quality=80),
        encode(rgb, "JPEG", quality=60, subsampling=2, restart_marker_blocks=2),
        # Restart intervals in every layout the Rust Huffman decoder takes over (gray, 4:4:4,
        # 4:2:2, 4:2:0, CMYK), some at high quality (long codes, large values).
        encode(rgb.convert("L"), "JPEG", quality=95, restart_marker_blocks=3),
        encode(rgb, "JPEG", quality=100, subsampling=0, restart_marker_blocks=1),
        encode(rgb, "JPEG", quality=90, subsampling=1, restart_marker_rows=1),
        encode(rgb.convert("CMYK"), "JPEG", quality=85, restart_marker_blocks=5),
    ]
    return seeds() + extra


def _documented(exc: ImageDecodeError) -> str | None:
    """The documented limit a refusal is due to, if any."""
    if exc.kind == "corrupt" and "more than 500 scans" in str(exc):
        return "MAX_JPEG_SCANS"
    return None


def _outcomes(total: int, rng_seed: int) -> Iterator[tuple[str, str, int, bytes]]:
    """(format, outcome, index, data) for `total` mutants; outcome is "agree", a documented
    limit's name, or a disagreement class."""
    rng = random.Random(rng_seed)
    files = differential_seeds()
    for n in range(total):
        seed = files[n % len(files)]
        fmt = FORMATS[seed[:2]]
        data = mutate(rng, seed)
        try:
            ref: np.ndarray | None = reference(data)
            ref_error: Exception | None = None
        except Exception as exc:  # whatever Pillow raises counts as a refusal
            ref, ref_error = None, exc
        try:
            ours: np.ndarray | None = vision.decode(data, max_pixels=LIMIT)
            our_error: ImageDecodeError | None = None
        except ImageDecodeError as exc:
            ours, our_error = None, exc
        if our_error is not None and ref_error is not None:
            yield fmt, "agree", n, data
        elif our_error is not None:
            outcome = _documented(our_error) or f"we raise {our_error.kind}, Pillow decodes"
            yield fmt, outcome, n, data
        elif ref_error is not None:
            yield fmt, f"Pillow raises {type(ref_error).__name__}, we decode", n, data
        elif ours is None or ref is None or ours.shape != ref.shape:
            yield fmt, "shapes differ", n, data
        elif not np.array_equal(ours, ref):
            yield fmt, "pixels differ", n, data
        else:
            yield fmt, "agree", n, data


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_mutants_agree_with_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", LIMIT // 2)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    start = time.monotonic()
    counts: Counter[tuple[str, str]] = Counter()
    examples: dict[tuple[str, str], list[int]] = {}
    for fmt, outcome, n, _ in _outcomes(MUTANTS, 20261202):
        counts[fmt, outcome] += 1
        if outcome != "agree":
            examples.setdefault((fmt, outcome), []).append(n)
    elapsed = time.monotonic() - start
    documented = {k: v for k, v in counts.items() if k[1] == "MAX_JPEG_SCANS"}
    disagreements = {k: v for k, v in counts.items() if k[1] not in ("agree", "MAX_JPEG_SCANS")}
    report = "\n".join(
        f"{fmt} {outcome}: {count} (mutants {examples[fmt, outcome][:8]})"
        for (fmt, outcome), count in sorted(disagreements.items())
    )
    assert not disagreements, f"disagreements with Pillow:\n{report}"
    # Every format was exercised, with both outcomes well represented.
    for fmt in FORMATS.values():
        assert counts[fmt, "agree"] > MUTANTS // 20, (fmt, counts)
    assert sum(documented.values()) <= MUTANTS // 1000, documented
    assert elapsed < 90, f"{MUTANTS} mutants took {elapsed:.0f} s"


def _png(ihdr: bytes, idat_bodies: list[bytes], after: bytes = b"") -> bytes:
    out = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
    for body in idat_bodies:
        out += png_chunk(b"IDAT", body)
    return out + after + png_chunk(b"IEND", b"")


def _zlib_with_bad_adler(raw: bytes) -> bytes:
    good = zlib.compress(raw)
    return good[:-4] + struct.pack(">I", struct.unpack(">I", good[-4:])[0] ^ 0x5A5A5A5A)


def _agree(data: bytes, threads: int = 0) -> str:
    """ "both raise", or "same pixels"; fails the test on a disagreement."""
    try:
        ref: np.ndarray | None = reference(data)
    except Exception:  # whatever Pillow raises counts as a refusal
        ref = None
    if ref is None:
        with pytest.raises(ImageDecodeError) as info:
            vision.decode(data, threads=threads)
        assert info.value.kind in ("corrupt", "truncated"), info.value
        return "both raise"
    ours = vision.decode(data, threads=threads)
    assert ours.shape == ref.shape
    assert np.array_equal(ours, ref)
    return "same pixels"


# ---------------------------------------------------------------------------------------------
# Regression tests: one file per disagreement class the differential run found. Each asserts
# Pillow's outcome first (the premise), then ours.

GRAY_8x4 = bytes(range(0, 256, 8))  # 4 rows of 8 gray pixels


def _gray_ihdr(width: int = 8, height: int = 4) -> bytes:
    """The IHDR body of an 8-bit gray image."""
    return struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)


def _filtered(rows: bytes, width: int = 8) -> bytes:
    return b"".join(b"\x00" + rows[i : i + width] for i in range(0, len(rows), width))


def _pillow_raises(data: bytes) -> Exception:
    with pytest.raises((OSError, SyntaxError, ValueError)) as info:
        reference(data)
    return info.value


def test_png_bad_idat_crc_and_adler_is_corrupt() -> None:
    """The reported bug: Pillow's zlib checks the adler32 (it is in the piece holding the last
    row) and raises "broken data stream"; the IDAT CRC is not checked by either."""
    body = _zlib_with_bad_adler(_filtered(GRAY_8x4))
    good = _png(_gray_ihdr(), [body])
    idat = good.index(b"IDAT")
    crc_at = idat + 4 + len(body)
    data = good[:crc_at] + bytes(b ^ 0xFF for b in good[crc_at : crc_at + 4]) + good[crc_at + 4 :]
    assert "broken data stream" in str(_pillow_raises(data))
    with pytest.raises(CorruptImageError, match="broken data stream"):
        vision.decode(data)


def test_png_adler_out_of_reach_is_not_checked() -> None:
    """The adler32 in the next IDAT chunk is never reached (the last row completes first):
    Pillow decodes, and so do we."""
    body = _zlib_with_bad_adler(_filtered(GRAY_8x4))
    data = _png(_gray_ihdr(), [body[:-4], body[-4:]])
    assert _agree(data) == "same pixels"


def test_png_stream_ending_at_a_row_boundary_leaves_zero_rows() -> None:
    """A complete zlib stream holding 2 of 4 rows: Pillow stops there and keeps the rest black."""
    data = _png(_gray_ihdr(), [zlib.compress(_filtered(GRAY_8x4[:16]))])
    assert _agree(data) == "same pixels"
    out = vision.decode(data)
    assert out[2:].max() == 0
    assert out[:2].any()


def test_png_stream_ending_mid_row_is_truncated() -> None:
    data = _png(_gray_ihdr(), [zlib.compress(_filtered(GRAY_8x4)[:20])])
    _pillow_raises(data)
    with pytest.raises(TruncatedImageError):
        vision.decode(data)


def test_png_zlib_window_size_as_zlib_reads_it() -> None:
    """zlib keeps its 32 KiB window whatever smaller size the header declares (Pillow decodes
    matches reaching 1 010 bytes back under a "256-byte" header), and refuses a header
    declaring more than 32 KiB."""
    rng = np.random.default_rng(5)
    block = b"".join(b"\x00" + bytes(rng.integers(0, 256, 100, dtype=np.uint8)) for _ in range(10))
    stream = zlib.compress(block * 3, 9)[2:]
    ihdr = _gray_ihdr(100, 30)
    small = _png(ihdr, [b"\x08\x1d" + stream])  # CINFO 0, FCHECK valid
    assert _agree(small) == "same pixels"
    large = _png(ihdr, [b"\x88\x1c" + stream])  # CINFO 8: a 64 KiB window
    assert "broken data stream" in str(_pillow_raises(large))
    with pytest.raises(CorruptImageError, match="window size"):
        vision.decode(large)


@pytest.mark.parametrize(
    ("name", "after"),
    [
        ("digit-in-chunk-type", png_chunk(b"tE5t", b"x")),
        ("underscore-in-chunk-type", png_chunk(b"t_Xt", b"x")),
    ],
)
def test_png_chunk_types_are_word_characters(name: str, after: bytes) -> None:
    """Pillow's chunk type check is ``\\w{4}``: digits and ``_`` are fine before IDAT."""
    ihdr = _gray_ihdr()
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + after
    data += png_chunk(b"IDAT", zlib.compress(_filtered(GRAY_8x4))) + png_chunk(b"IEND", b"")
    assert _agree(data) == "same pixels"


def test_png_chunks_after_the_image_data() -> None:
    idat = [zlib.compress(_filtered(GRAY_8x4))]
    ihdr = _gray_ihdr()
    # A text chunk whose body runs past the end of the file: "Truncated File Read".
    cut = _png(ihdr, idat, png_chunk(b"tEXt", b"comment\x00hello"))[:-20]
    _pillow_raises(cut)
    with pytest.raises(TruncatedImageError):
        vision.decode(cut)
    # zTXt with compression method 1: "Unknown compression method".
    ztxt = _png(ihdr, idat, png_chunk(b"zTXt", b"comment\x00\x01xx"))
    _pillow_raises(ztxt)
    with pytest.raises(CorruptImageError, match="compression method"):
        vision.decode(ztxt)
    # A bad CRC after the image data is not checked; a broken type ends the walk quietly.
    crc = bytearray(_png(ihdr, idat, png_chunk(b"tEXt", b"a\x00b")))
    crc[-16] ^= 0xFF
    assert _agree(bytes(crc)) == "same pixels"
    broken = _png(ihdr, idat, b"\x00\x00\x00\x01!!!!x\x00\x00\x00\x00")
    assert _agree(broken) == "same pixels"


def test_a_broken_stream_declaring_a_huge_image_touches_none_of_it() -> None:
    """A 62-byte PNG declaring 13 000 x 13 000 RGBA 16-bit pixels, with a broken stream: the
    decoder used to clear the whole 1.35 GB row buffer before its row-by-row retry (0.5 s,
    +1.3 GB of resident memory; Pillow fails in milliseconds). Now the retry writes rows as it
    inflates them and fails after the first bytes: the child's peak memory barely moves."""
    ihdr = struct.pack(">IIBBBBB", 13_000, 13_000, 16, 6, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
    data += png_chunk(b"IDAT", b"\x78\x9c\xff\xff\xff") + png_chunk(b"IEND", b"")
    assert len(data) == 62
    _pillow_raises(data)
    child = textwrap.dedent(
        """
        import sys
        from smg_grpc_proto import vision
        from smg_grpc_proto.errors import CorruptImageError

        def peak_kib():
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])

        data = sys.stdin.buffer.read()
        before = peak_kib()
        try:
            vision.decode(data)
        except CorruptImageError:
            print(peak_kib() - before)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", child], input=data, capture_output=True, check=True, timeout=60
    )
    grown_kib = int(out.stdout)
    assert grown_kib < 64 * 1024, f"peak memory grew by {grown_kib} KiB"


def test_rows_past_a_stream_that_ends_early_are_zero_in_a_recycled_buffer() -> None:
    """A stream that ends cleanly after two of its rows: Pillow keeps the image, the other rows
    zero. The row buffer may be a recycled one holding an earlier image's bytes (it is no longer
    cleared up front), so those rows must be zeroed on the way out."""
    rng = np.random.default_rng(7)

    def rgb_png(pixels: np.ndarray, rows: int) -> bytes:
        height, width, _ = pixels.shape
        ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        head = _filtered(pixels[:rows].tobytes(), 3 * width)
        return _png(ihdr, [zlib.compress(head)])

    # The first image's pixels (360 000 bytes), freed, are kept for the next decode, and fit
    # the second's row buffer (241 x 961 bytes).
    big = rng.integers(1, 256, size=(300, 400, 3), dtype=np.uint8)
    small = rng.integers(1, 256, size=(240, 320, 3), dtype=np.uint8)
    for _ in range(3):
        assert _agree(rgb_png(big, 300)) == "same pixels"
        assert _agree(rgb_png(small, 2)) == "same pixels"
    ours = vision.decode(rgb_png(small, 2))
    assert not ours[2:].any()
    assert (ours[:2] == small[:2]).all()


def test_a_jpeg_frame_far_larger_than_its_scan_decodes_like_pillow() -> None:
    """A 16 x 16 scan under a frame patched to 2048 x 2048: libjpeg decodes the rest on zeros,
    as Pillow shows it. Our Huffman decoder used to decode all 16 384 MCUs on zeros before
    finding the segment short and handing the image to libjpeg, which decoded it all again
    (a 13 000 x 13 000 frame: 0.9 s against Pillow's 0.5 s); then it handed the image back at
    the first MCU past the data, and libjpeg decoded it all again from the start; now libjpeg
    takes the scan over at that MCU, decoding nothing twice. The pixels are the same."""
    small = encode(photo(16, 16, "L"), "JPEG", quality=90)
    at = 2
    while small[at + 1] not in (0xC0, 0xC1):
        at += 2 + struct.unpack(">H", small[at + 2 : at + 4])[0]
    data = small[: at + 5] + struct.pack(">HH", 2048, 2048) + small[at + 9 :]
    before = _native.jpeg_huffman_stats()
    assert _agree(data, threads=1) == "same pixels"
    after = _native.jpeg_huffman_stats()
    assert after["resumed"] == before["resumed"] + 1
    assert after["retried"] == before["retried"]


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_exif_entry_cut_short_ends_the_directory(fmt: str) -> None:
    """Pillow reads each 12-byte IFD entry whole: when the block ends inside the Orientation
    entry, past the two bytes its SHORT value needs, the directory ends there (a warning) and
    the image is not rotated."""
    im = photo(12, 5)
    block = _exif_block(b"MM\x00*\x00\x00\x00\x08")  # orientation 6, then a 4-byte next offset
    # Without the next-IFD offset the entry is whole: rotated (the premise's control).
    whole = encode(im, fmt, exif=block[:-4])
    assert reference(whole).shape == (12, 5, 3)
    assert _agree(whole) == "same pixels"
    for cut in (5, 6):  # the entry's last 1 or 2 bytes missing
        data = encode(im, fmt, exif=block[:-cut])
        assert reference(data).shape == (5, 12, 3)
        assert _agree(data) == "same pixels"
    if fmt == "JPEG":
        # No Orientation tag read: Pillow falls back to the XMP's.
        xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="8"/></x:xmpmeta>'
        data = encode(im, fmt, exif=block[:-6], xmp=xmp)
        assert reference(data).shape == (12, 5, 3)
        assert _agree(data) == "same pixels"
        assert vision.decode(data).shape == (12, 5, 3)


def test_bmp_rle_on_a_black_and_white_palette_decodes_as_mode_1() -> None:
    """RLE codes under a black/white (or one-entry black) palette: Pillow 13 opens mode "1" and
    sets the decoded indices with raw mode "L", unpacked one byte per pixel, non-zero white."""
    bilevel = encode(photo(23, 17).convert("1"), "BMP")  # 62 bytes of headers and palette
    # Per row: 5 of index 0, 6 of index 1, 12 of index `row` (0 on the first row, >1 after), EOL.
    codes = b"".join(bytes([5, 0, 6, 1, 12, row, 0, 0]) for row in range(17)) + b"\x00\x01"
    rle8 = _set(bilevel[:62], 30, struct.pack("<I", 1)) + codes
    im = Image.open(io.BytesIO(rle8))
    assert (im.mode, im.info["compression"]) == ("1", 1)
    assert _agree(rle8) == "same pixels"
    # RLE4 codes, and a one-entry black palette (also mode "1").
    assert _agree(_set(rle8, 30, struct.pack("<I", 2))) == "same pixels"
    assert _agree(_set(rle8, 46, struct.pack("<I", 1))) == "same pixels"


def test_png_rows_zlib_holds_after_the_last_byte_are_never_written() -> None:
    """Pillow calls inflate only while its piece has input left. Four identical rows compress to
    the first row and one match copying the other three: with the data cut right after that
    match, zlib could write every row, but Pillow's call that reads the last byte fills one row
    and then there is no input for another call: "image file is truncated". With more data after
    the cut (one more byte, or the rest of the stream in another IDAT), the next call writes the
    held rows; there the last row's call also reads on through the adler32."""
    raw = _filtered(bytes(range(10, 18)) * 4)
    stream = zlib.compress(raw, 9)
    # The shortest prefix that inflates to every row: its last byte completes the match.
    inflated = [len(zlib.decompressobj().decompress(stream[:n])) for n in range(len(stream))]
    cut = inflated.index(len(raw))
    held = _png(_gray_ihdr(), [stream[:cut]])
    assert "truncated" in str(_pillow_raises(held))
    with pytest.raises(TruncatedImageError):
        vision.decode(held)
    # The same, the IDAT chunk cut short by the end of the file (the fuzzer's mutant).
    start = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", _gray_ihdr())
    cut_short = start + struct.pack(">I", len(stream)) + b"IDAT" + stream[:cut]
    assert "truncated" in str(_pillow_raises(cut_short))
    with pytest.raises(TruncatedImageError):
        vision.decode(cut_short)
    # One more byte of input: the next call writes the held rows.
    assert _agree(_png(_gray_ihdr(), [stream[: cut + 1]])) == "same pixels"
    # The rest of the stream in a second IDAT: decoded, and a bad adler32 there is checked.
    assert _agree(_png(_gray_ihdr(), [stream[:cut], stream[cut:]])) == "same pixels"
    bad = stream[:-4] + bytes(b ^ 0x5A for b in stream[-4:])
    split_bad = _png(_gray_ihdr(), [bad[:cut], bad[cut:]])
    assert "broken data stream" in str(_pillow_raises(split_bad))
    with pytest.raises(CorruptImageError, match="broken data stream"):
        vision.decode(split_bad)


def test_jpegs_cut_inside_their_scan_go_to_libjpeg_at_once() -> None:
    """Real photos cut inside their scan (a truncated upload), with and without restart markers,
    and with the last bytes of the EOI missing: Pillow's outcome (it raises), and the scan that
    runs into the end of the file is declined by our Huffman decoder before it starts, so
    libjpeg decodes it once. Before, our decoder decoded it to the end, found the data short
    and handed the image back to libjpeg, which decoded it all again: 1.5-1.9x Pillow's time
    to the same error. A file with bytes after its EOI is still ours."""
    from support.images import pillow_test_images, real_photos

    photos = [
        real_photos()["rocket.jpg"].read_bytes(),
        real_photos()["hubble_deep_field.jpg"].read_bytes(),
        (pillow_test_images() / "xmp_test.jpg").read_bytes(),  # restart markers
    ]
    for data in photos:
        assert data.endswith(b"\xff\xd9")
        for cut in (data[: len(data) // 2], data[: len(data) * 9 // 10], data[:-2], data[:-1]):
            for threads in (1, 2):
                before = _native.jpeg_huffman_stats()
                assert _agree(cut, threads=threads) == "both raise"
                after = _native.jpeg_huffman_stats()
                assert after["retried"] == before["retried"], (len(cut), threads)
                assert after["inline"] == before["inline"]
                assert after["helper"] == before["helper"]
        before = _native.jpeg_huffman_stats()
        assert _agree(data + b"trailing bytes", threads=1) == "same pixels"
        assert _native.jpeg_huffman_stats()["inline"] == before["inline"] + 1


def test_a_jpeg_damaged_in_its_scan_is_handed_to_libjpeg_where_our_decoder_stops() -> None:
    """A stray marker or a code no table holds inside a sequential scan: libjpeg recovers in its
    own way (zeros to the end of the segment, or a zero coefficient), so our Huffman decoder
    stops there. It used to hand the whole image back, decoded again by libjpeg from the start
    (up to ~1.3x Pillow's time on a file damaged late); it now says where libjpeg's decoder
    stands at the start of the MCU it stopped in, and libjpeg decodes only the rest of the scan.
    Pixels: Pillow's, with and without restart markers, on one thread and with the helper
    thread; nothing decoded twice; and faster than Pillow on the file damaged late."""
    from support.images import pillow_test_images, real_photos

    rocket = real_photos()["rocket.jpg"].read_bytes()
    photos = {
        "rocket": rocket,
        "xmp_test (restart markers)": (pillow_test_images() / "xmp_test.jpg").read_bytes(),
        "rocket, gray": encode(Image.open(io.BytesIO(rocket)).convert("L"), "JPEG", quality=92),
    }
    damages = {
        "stray RST": STRAY_RST,
        "stray COM": STRAY_COM,
        "code no table holds": NO_SUCH_CODE,
    }
    for name, data in photos.items():
        for what, insert in damages.items():
            for fraction in (0.5, 0.9):
                blob = damaged_in_scan(data, fraction, insert)
                for threads in (1, 2):
                    before = _native.jpeg_huffman_stats()
                    assert _agree(blob, threads=threads) == "same pixels"
                    after = _native.jpeg_huffman_stats()
                    case = (name, what, fraction, threads)
                    assert after["resumed"] == before["resumed"] + 1, case
                    assert after["retried"] == before["retried"], case

    def best(call: typing.Callable[[], object]) -> float:
        return best_cpu_seconds(call, 5)

    late = damaged_in_scan(rocket, 0.9, STRAY_RST)
    ours = best(lambda: vision.decode(late, threads=1))
    pillow = best(lambda: reference(late))
    assert ours < pillow, f"ours {ours * 1e3:.2f} ms, Pillow {pillow * 1e3:.2f} ms"


def test_thousands_of_tiny_compressed_chunks_cost_what_they_hold() -> None:
    """Each compressed text or ICC chunk used to inflate into a cleared buffer of Pillow's whole
    1 MiB limit: this 150 KB file of 6 000 tiny chunks cost us ~6x Pillow's time (a megabyte
    cleared per 25-byte chunk). The buffer now grows with the text, so such a file decodes as
    Pillow decodes it, and faster (CPU time, best of 3 each, same process: ~8x faster here)."""
    tiny = zlib.compress(b"x")
    before = png_chunk(b"iCCP", b"p\x00\x00" + tiny) * 2000
    before += png_chunk(b"zTXt", b"k\x00\x00" + tiny) * 2000
    before += png_chunk(b"iTXt", b"k\x00\x01\x00\x00\x00" + tiny) * 2000
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", _gray_ihdr()) + before
    data += png_chunk(b"IDAT", zlib.compress(_filtered(GRAY_8x4))) + png_chunk(b"IEND", b"")
    assert _agree(data) == "same pixels"

    def best(call: typing.Callable[[], object]) -> float:
        return best_cpu_seconds(call, 3)

    ours = best(lambda: vision.decode(data))
    pillow = best(lambda: reference(data))
    assert ours < pillow, f"ours {ours * 1e3:.1f} ms, Pillow {pillow * 1e3:.1f} ms"


def _pack(row: np.ndarray, bits: int) -> bytes:
    """One row of samples (the last axis: channels) as PNG packs them."""
    if bits == 16:
        return row.astype(">u2").tobytes()
    if bits == 8:
        return row.astype(np.uint8).tobytes()
    flat = row.reshape(-1).astype(np.uint8)
    per = 8 // bits
    flat = np.concatenate([flat, np.zeros(-len(flat) % per, np.uint8)]).reshape(-1, per)
    shifts = np.arange(per - 1, -1, -1) * bits
    return (flat << shifts).sum(axis=1).astype(np.uint8).tobytes()


def _adam7(arr: np.ndarray, bits: int = 8) -> bytes:
    """The Adam7 passes of an image, every row unfiltered (Pillow cannot write Adam7)."""
    passes = [(0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2)]
    passes.append((1, 0, 2, 1))
    out = b""
    for y0, x0, dy, dx in passes:
        sub = arr[y0::dy, x0::dx]
        if sub.size:
            out += b"".join(b"\x00" + _pack(row, bits) for row in sub)
    return out


@pytest.mark.parametrize(
    ("bits", "color", "channels"),
    [(1, 0, 1), (2, 0, 1), (4, 0, 1), (8, 0, 1), (4, 3, 1), (16, 2, 3), (16, 6, 4), (8, 4, 2)],
)
def test_png_adam7_every_depth(bits: int, color: int, channels: int) -> None:
    """Hand-written Adam7 files decode like Pillow decodes them and like the same pixels written
    without interlacing; any non-zero interlace byte means Adam7 (Pillow: ``if s[12]``)."""
    rng = np.random.default_rng(bits * 10 + color)
    arr = rng.integers(0, 1 << bits, size=(11, 13, channels), dtype=np.uint32)
    palette = bytes(rng.integers(0, 256, 48, dtype=np.uint8))
    plte = png_chunk(b"PLTE", palette) if color == 3 else b""
    plain_rows = b"".join(b"\x00" + _pack(row, bits) for row in arr)
    results = []
    for method, raw in ((0, plain_rows), (1, _adam7(arr, bits)), (2, _adam7(arr, bits))):
        ihdr = struct.pack(">IIBBBBB", 13, 11, bits, color, 0, 0, method)
        data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + plte
        data += png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b"")
        assert _agree(data) == "same pixels"
        results.append(vision.decode(data))
    assert np.array_equal(results[0], results[1])
    assert np.array_equal(results[0], results[2])


def test_jpeg_marker_pillow_does_not_know_is_refused() -> None:
    """0xFF01 (TEM) is standalone for libjpeg, but Pillow's marker walk stops: "no marker
    found"."""
    jpeg = encode(photo(16, 8), "JPEG")
    app0_end = 4 + struct.unpack(">H", jpeg[4:6])[0]
    data = jpeg[:app0_end] + b"\xff\x01" + jpeg[app0_end:]
    _pillow_raises(data)
    with pytest.raises(CorruptImageError, match="no marker found"):
        vision.decode(data)


def _gif_2x2(codes: list[tuple[int, int]]) -> bytes:
    """A 2x2 GIF with a 4-entry palette whose LZW data is `codes` ((code, width) pairs)."""
    head = b"GIF89a\x02\x00\x02\x00\x81\x00\x00" + bytes([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255])
    bits, n = 0, 0
    for code, width in codes:
        bits |= code << n
        n += width
    lzw = bits.to_bytes((n + 7) // 8, "little")
    return head + b",\x00\x00\x00\x00\x02\x00\x02\x00\x00\x02" + bytes([len(lzw)]) + lzw + b"\x00;"


def test_gif_end_code_before_the_last_row_is_truncated() -> None:
    """Pillow's decoder returns at the end code; with the whole file already read, that is
    "image file is truncated" even though codes for the remaining pixels follow."""
    complete = _gif_2x2([(4, 3), (0, 3), (1, 3), (0, 3), (1, 4), (5, 4)])
    assert _agree(complete) == "same pixels"
    early_end = _gif_2x2([(4, 3), (0, 3), (1, 3), (5, 3), (0, 3), (1, 4)])
    assert "truncated" in str(_pillow_raises(early_end))
    with pytest.raises(TruncatedImageError):
        vision.decode(early_end)


def _set(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value) :]


def test_bmp_palettes_as_pillow_reads_them() -> None:
    rgb = photo(23, 17)
    pal = encode(rgb.quantize(16), "BMP")
    # 300 colours declared, fewer than 257 entries in the rest of the file: Pillow decodes.
    assert _agree(_set(pal, 46, struct.pack("<I", 300))) == "same pixels"
    # A pixel data offset of 0: the pixels follow the palette.
    assert _agree(_set(pal, 10, b"\x00" * 4)) == "same pixels"
    # A 1-bit image with a one-entry black palette opens as mode "1".
    bilevel = encode(rgb.convert("1"), "BMP")
    assert _agree(_set(bilevel, 46, struct.pack("<I", 1))) == "same pixels"


def test_bare_dib_decodes() -> None:
    """Without its 14-byte file header a BMP is a DIB, which Pillow opens."""
    for im in (photo(23, 17), photo(23, 17).quantize(16)):
        dib = encode(im, "BMP")[14:]
        assert _agree(dib) == "same pixels"


def test_max_pixels_out_of_range_is_a_clear_error() -> None:
    data = encode(photo(4, 4), "PNG")
    for value in (2**64, 2**70):
        with pytest.raises(ValueError, match=r"max_pixels must be between 0 and .*got \d+") as info:
            vision.decode(data, max_pixels=value)
        assert not isinstance(info.value, ImageDecodeError)
        assert str(value) in str(info.value)
    assert vision.decode(data, max_pixels=2**64 - 1).shape == (4, 4, 3)
    with pytest.raises(ValueError, match="max_pixels"):
        _native.decode_image(data, True, -1, "white")
    with pytest.raises(TypeError):
        _native.decode_image(data, True, 1.5, "white")


def test_gif_extension_starting_with_a_terminator() -> None:
    """Pillow reads an extension's first sub-block, then skips sub-blocks up to a terminator:
    when the first is already a terminator, one more run is skipped (here: the descriptor)."""
    good = _gif_2x2([(4, 3), (0, 3), (1, 3), (0, 3), (1, 4), (5, 4)])
    at = good.index(b",")
    swallowed = good[:at] + b"!\xf9\x00" + good[at:]
    assert _agree(swallowed) == "both raise"
    two_terminators = good[:at] + b"!\xf9\x00\x00" + good[at:]
    assert _agree(two_terminators) == "same pixels"


def test_bmp_gray_palettes_and_rle_as_pillow_unpacks_them() -> None:
    rgb = photo(23, 17)
    # 8-bit pixels with a one-entry black palette: mode "1", unpacked 1 bit per pixel.
    gray8 = encode(rgb.convert("L"), "BMP")
    one_entry = _set(gray8, 46, struct.pack("<I", 1))
    assert _agree(one_entry) == "same pixels"
    # RLE4 declared on 8-bit pixels: Pillow runs its RLE4 decoder anyway.
    pal = encode(rgb.quantize(16), "BMP")
    codes = b"".join(bytes([23, 0x12 + row, 0, 0]) for row in range(17)) + b"\x00\x01"
    rle4 = _set(pal[:118], 30, struct.pack("<I", 2)) + codes
    assert _agree(rle4) == "same pixels"


def _exif_block(header: bytes, orientation: int = 6) -> bytes:
    big = header.startswith(b"MM")
    entry = struct.pack(">HHIHH" if big else "<HHIHH", 0x0112, 3, 1, orientation, 0)
    count = struct.pack(">H" if big else "<H", 1)
    return b"Exif\x00\x00" + header + count + entry + b"\x00" * 4


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_exif_as_pillow_reads_it(fmt: str) -> None:
    im = photo(12, 5)
    # "MM\0+" (big-endian BigTIFF's mark) is read as plain big-endian TIFF: rotated.
    bigtiff_be = encode(im, fmt, exif=_exif_block(b"MM\x00+\x00\x00\x00\x08"))
    assert _agree(bigtiff_be) == "same pixels"
    assert vision.decode(bigtiff_be).shape == (12, 5, 3)
    # Blocks Pillow's TIFF reader refuses: exif_transpose raises for PNG and WebP; a JPEG's
    # block was already read (and the error swallowed) while opening.
    for bad in (
        b"Exif\x00\x00XX*\x00\x08\x00\x00\x00",
        b"Exif\x00\x00II*\x00\x08",
        _exif_block(b"II+\x00\x08\x00\x00\x00"),
    ):
        data = encode(im, fmt, exif=bad)
        assert _agree(data) == ("same pixels" if fmt == "JPEG" else "both raise")
        assert vision.decode(data, apply_exif=False).shape == (5, 12, 3)


def test_jpeg_unreadable_exif_depends_on_jfif_dpi() -> None:
    """With a JFIF resolution Pillow skips the EXIF while opening, so exif_transpose reads it
    and raises; without one the swallowed error leaves no orientation, not even the XMP's."""
    bad = b"Exif\x00\x00XX*\x00\x08\x00\x00\x00"
    im = photo(12, 5)
    assert _agree(encode(im, "JPEG", exif=bad, dpi=(72, 72))) == "both raise"
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    data = encode(im, "JPEG", exif=bad, xmp=xmp)
    assert _agree(data) == "same pixels"
    assert vision.decode(data).shape == (5, 12, 3)
    assert vision.decode(encode(im, "JPEG", xmp=xmp)).shape == (12, 5, 3)


def test_png_raw_profile_exif_must_be_hex() -> None:
    """``bytes.fromhex`` of a ``Raw profile type exif`` text raises on anything but hex pairs."""
    im = photo(12, 5)
    for text, outcome in (
        ("\nexif\n 6\n457869660000\n", "same pixels"),
        ("\nexif\n1\nzz\n", "both raise"),
    ):
        info = PngInfo()
        info.add_text("Raw profile type exif", text)
        assert _agree(encode(im, "PNG", pnginfo=info)) == outcome


# ---------------------------------------------------------------------------------------------
# Deflate streams zlib refuses and a more lenient inflate (libdeflate) accepts. Each is built
# bit by bit so that the lenient reading fills the image exactly and ends with a valid adler32;
# Pillow (zlib) refuses it, so must we. Each has a twin, one or two bits apart, that both decode.


class _Bits:
    """A deflate bit writer: fields least significant bit first, Huffman codes most first."""

    def __init__(self) -> None:
        self.acc = 0
        self.count = 0
        self.out = bytearray()

    def put(self, value: int, bits: int) -> None:
        self.acc |= value << self.count
        self.count += bits
        while self.count >= 8:
            self.out.append(self.acc & 0xFF)
            self.acc >>= 8
            self.count -= 8

    def code(self, code: int, bits: int) -> None:
        self.put(int(format(code, f"0{bits}b")[::-1], 2), bits)

    def done(self) -> bytes:
        if self.count:
            self.out.append(self.acc & 0xFF)
            self.acc, self.count = 0, 0
        return bytes(self.out)


def _canonical(lengths: list[int]) -> dict[int, tuple[int, int]]:
    """symbol -> (code, bits) of the canonical Huffman code with these lengths (RFC 1951 3.2.2)."""
    counts = Counter(length for length in lengths if length)
    code, first = 0, {}
    for bits in range(1, 16):
        code = (code + counts[bits - 1]) << 1 if bits > 1 else 0
        first[bits] = code
    codes = {}
    for symbol, bits in enumerate(lengths):
        if bits:
            codes[symbol] = (first[bits], bits)
            first[bits] += 1
    return codes


def _dynamic_header(w: _Bits, final: bool, lit: list[int], dist: list[int]) -> None:
    """A dynamic block header; the code lengths go through a precode giving 0..15 four bits."""
    w.put(int(final), 1)
    w.put(2, 2)
    w.put(len(lit) - 257, 5)
    w.put(len(dist) - 1, 5)
    w.put(15, 4)  # all 19 precode lengths
    for symbol in (16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15):
        w.put(4 if symbol < 16 else 0, 3)
    for length in lit + dist:
        w.code(length, 4)


def _fixed_literal(w: _Bits, byte: int) -> None:
    if byte < 144:
        w.code(0x30 + byte, 8)
    else:
        w.code(0x190 + byte - 144, 9)


def _zlib_wrap(deflate: bytes, raw: bytes) -> bytes:
    return b"\x78\x01" + deflate + struct.pack(">I", zlib.adler32(raw))


def _lenient_case(name: str, valid: bool) -> tuple[bytes, bytes]:
    """(IHDR body, IDAT body) of a zero gray image whose stream is refused by zlib for `name`,
    or, with `valid`, the decodable twin."""
    w = _Bits()
    if name == "litlen-symbol-286":
        # Fixed block: 12 literals, then symbol 286 (libdeflate: length 258) at distance 1.
        width, height = 8, 30
        w.put(1, 1)
        w.put(1, 2)
        for _ in range(12):
            _fixed_literal(w, 0)
        w.code(0xC0 + (285 if valid else 286) - 280, 8)  # 285 is length 258 too
        w.code(0, 5)
        w.code(0, 7)
    elif name == "distance-symbol-30":
        # A stored block of 24 997 zeros, then a fixed block: length 3 at distance code 30
        # (libdeflate: 24 577 + 13 extra bits) or 29 (the same distance, valid).
        width, height = 99, 250
        stored = 24997
        w.put(0, 1)
        w.put(0, 2)
        w.done()
        w.out += struct.pack("<HH", stored, stored ^ 0xFFFF) + bytes(stored)
        w.put(1, 1)
        w.put(1, 2)
        w.code(1, 7)  # symbol 257: length 3
        w.code(29 if valid else 30, 5)
        w.put(0, 12 if valid else 13)
        w.code(0, 7)
    elif name in ("hlit-287", "hdist-31"):
        # 287 litlen or 32 distance code lengths (zlib: "too many length or distance symbols").
        width, height = 8, 4
        lit = [1] + [0] * 255 + [1]
        dist = [1, 1]
        if name == "hlit-287" and not valid:
            lit += [0] * 30
        if name == "hdist-31" and not valid:
            dist += [0] * 30
        _dynamic_header(w, True, lit, dist)
        for _ in range(36):
            w.code(0, 1)
        w.code(1, 1)
    elif name == "lone-end-of-block-coded-1":
        # A block whose litlen code has one codeword (end of block, length 1), sent as "1"
        # (zlib uses "0"; libdeflate takes both), then a fixed block with the image.
        width, height = 8, 4
        _dynamic_header(w, False, [0] * 256 + [1], [0])
        w.put(0 if valid else 1, 1)
        w.put(1, 1)
        w.put(1, 2)
        for _ in range(36):
            _fixed_literal(w, 0)
        w.code(0, 7)
    else:
        # A match whose distance code is "1" in a one-codeword distance code, or any code in
        # an empty one (libdeflate: distance 1 either way).
        width, height = 8, 4
        lit = [1] + [0] * 255 + [2, 2]
        one = name == "distance-code-unused-1"
        _dynamic_header(w, True, lit, [1] if one or valid else [0])
        for _ in range(33):
            w.code(0, 1)
        w.code(3, 2)  # symbol 257: length 3
        w.put(0 if valid else 1, 1)
        w.code(2, 2)  # end of block
    raw = bytes(height * (width + 1))
    return _gray_ihdr(width, height), _zlib_wrap(w.done(), raw)


LENIENT = [
    "litlen-symbol-286",
    "distance-symbol-30",
    "hlit-287",
    "hdist-31",
    "lone-end-of-block-coded-1",
    "distance-code-unused-1",
    "distance-code-empty",
]


@pytest.mark.parametrize("name", LENIENT)
def test_png_streams_only_a_lenient_inflate_accepts(name: str) -> None:
    ihdr, body = _lenient_case(name, valid=True)
    assert _agree(_png(ihdr, [body])) == "same pixels"
    ihdr, body = _lenient_case(name, valid=False)
    data = _png(ihdr, [body])
    _pillow_raises(data)
    with pytest.raises(CorruptImageError, match="broken data stream"):
        vision.decode(data)
    # Spread over 5-byte chunks: the same outcome.
    assert _agree(_split_idat(data, 5)) == "both raise"


def test_png_stream_tail_in_a_chunk_cut_short() -> None:
    """The image is complete in the first IDAT; the adler32 is in a second IDAT that the file
    cuts short. Pillow finishes the image in the first chunk, then fails reading the second
    (``Truncated File Read``): so must we, though inflate read into the second chunk."""
    body = zlib.compress(_filtered(GRAY_8x4))
    whole = _png(_gray_ihdr(), [body[:-4], body[-4:]])
    assert _agree(whole) == "same pixels"
    second = whole.index(b"IDAT", whole.index(b"IDAT") + 4) - 4
    cut = whole[:second] + struct.pack(">I", 10) + b"IDAT" + body[-4:]
    _pillow_raises(cut)
    with pytest.raises(TruncatedImageError):
        vision.decode(cut)
    # The same with a bad adler32: never checked by Pillow, which still fails on the chunk.
    bad = _zlib_with_bad_adler(_filtered(GRAY_8x4))
    cut = whole[:second] + struct.pack(">I", 10) + b"IDAT" + bad[-4:]
    _pillow_raises(cut)
    with pytest.raises(TruncatedImageError):
        vision.decode(cut)


@pytest.mark.parametrize("size", [1, 7, 64, 8192])
def test_png_many_idat_chunks_with_data_after_the_stream(size: int) -> None:
    """Image data over many chunks, then IDAT chunks of junk: Pillow stops after the chunk
    where the image fills and skips the rest; the joined inflate must read the same."""
    rng = np.random.default_rng(size)
    rows = bytes(rng.integers(0, 256, 64 * 40, dtype=np.uint8))
    filtered = _filtered(rows, 64)
    body = zlib.compress(filtered, 6)
    ihdr = _gray_ihdr(64, 40)
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    for tail in ([], [b"junk"], [b"\x00" * 9, b"more"]):
        data = _png(ihdr, chunks + tail)
        assert _agree(data) == "same pixels"
    # A bad adler32 split off into its own chunk (unchecked by Pillow) and into the last
    # data chunk (checked).
    bad = _zlib_with_bad_adler(filtered)
    assert _agree(_png(ihdr, [bad[:-4], bad[-4:]])) == "same pixels"
    assert _agree(_png(ihdr, [bad[: len(bad) // 2], bad[len(bad) // 2 :]])) == "both raise"


def _rechunked(data: bytes, size: int, adler_apart: bool) -> bytes:
    """A PNG with all its image data joined and split again into IDAT chunks of `size` bytes,
    the adler32 in a chunk of its own when `adler_apart` (where Pillow never checks it)."""
    pos, before, body, after = 8, b"", b"", b""
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        chunk = data[pos : pos + 12 + length]
        if chunk[4:8] == b"IDAT":
            body += chunk[8:-4]
        elif body:
            after += chunk
        else:
            before += chunk
        pos += 12 + length
    tail = b""
    if adler_apart:
        body, tail = body[:-4], png_chunk(b"IDAT", body[-4:])
    chunks = b"".join(png_chunk(b"IDAT", body[i : i + size]) for i in range(0, len(body), size))
    return data[:8] + before + chunks + tail + after


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_png_bit_flips_agree_with_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    """One or two flipped bits in the image data of real PNGs, over many chunks: the stream
    often still inflates (to other pixels, its adler32 out of Pillow's reach) or fails anywhere,
    and the joined inflate must give Pillow's outcome every time."""
    from support.images import real_photos

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    photos = real_photos()
    files = [
        _rechunked(photos[name].read_bytes(), size, apart)
        for name in ("page.png", "text.png")
        for size, apart in ((1000, True), (8192, True), (1000, False), (1 << 20, True))
    ]
    rng = random.Random(20261204)
    counts: Counter[str] = Counter()
    for n in range(4000):
        data = bytearray(files[n % len(files)])
        start = data.index(b"IDAT") + 4
        for _ in range(rng.choice((1, 1, 2))):
            data[rng.randrange(start, len(data) - 40)] ^= 1 << rng.randrange(8)
        counts[_agree(bytes(data))] += 1
    # Both outcomes well represented.
    assert counts["same pixels"] > 400, counts
    assert counts["both raise"] > 400, counts


def _scan_start(data: bytes) -> int:
    """The offset of the first byte after the first SOS segment."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + struct.unpack(">H", data[sos + 2 : sos + 4])[0]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_jpeg_bit_flips_agree_with_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flipped bits, dropped and doubled bytes in the entropy-coded data of real JPEGs, with and
    without restart markers: the Rust Huffman decoder takes what libjpeg-turbo decodes without
    recovering and gives the rest back to it, so every outcome must still be Pillow's."""
    from support.images import pillow_test_images, real_photos

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    photos = real_photos()
    originals = [photos[name].read_bytes() for name in ("grace_hopper.jpg", "flower2.jpg")]
    # Gray with restart markers, and bad Huffman codes of its own in some intervals.
    originals.append((pillow_test_images() / "hopper_bad_exif.jpg").read_bytes())
    im = Image.open(photos["rocket.jpg"]).crop((0, 0, 160, 120))
    originals += [
        encode(im, "JPEG", quality=q, subsampling=sub, **restart)
        for q, sub, restart in (
            (97, 0, {"restart_marker_blocks": 4}),
            (80, 2, {"restart_marker_rows": 1}),
            (90, 1, {}),
        )
    ]
    originals.append(encode(im.convert("L"), "JPEG", quality=92, restart_marker_blocks=7))
    rng = random.Random(20261205)
    counts: Counter[str] = Counter()
    for n in range(1500):
        counts[_agree(damage_jpeg_scan(rng, originals[n % len(originals)]))] += 1
    assert counts["same pixels"] > 500, counts


@pytest.mark.parametrize("threads", [1, 2])
def test_jpeg_markers_after_the_data_are_read_as_far_as_pillows_piece(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """Pillow hands libjpeg a file 65 536 bytes at a time (``ImageFile.MAXBLOCK``), and after the
    last scanline ``jpeg_finish_decompress`` reads the markers only as far as the piece at hand: a
    bad marker there is an error, one beyond it is never read and the image decodes. A JPEG whose
    EOI is replaced by filler and an unknown marker (JPG0) must give Pillow's outcome on either
    side of the boundary, with libjpeg's Huffman decoding and ours, on one thread or two. Found
    by a differential run of 20 000 damaged files over 64 KiB (14 disagreements before)."""
    from support.images import real_photos

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    assert ImageFile.MAXBLOCK == 65536  # the piece size the positions below assume
    data = real_photos()["rocket.jpg"].read_bytes()
    assert data.endswith(b"\xff\xd9")
    assert 65536 < len(data) < 131072 - 64
    body = data[:-2]
    outcomes = set()
    for at in (len(body) + 40, 131072 - 2, 131072 - 1, 131072 + 1, 131072 + 3000):
        damaged = body + b"\x00" * (at - len(body)) + b"\xff\xf0" + b"\x00" * 8
        try:
            reference(damaged)
            pillow = "decodes"
        except Exception:  # whatever Pillow raises counts as a refusal
            pillow = "raises"
        outcomes.add(pillow)
        if pillow == "raises":
            with pytest.raises(ImageDecodeError):
                vision.decode(damaged, threads=threads)
        else:
            assert np.array_equal(vision.decode(damaged, threads=threads), reference(damaged))
    # The marker inside the piece at hand is an error, beyond it the image decodes.
    assert outcomes == {"raises", "decodes"}


@pytest.mark.parametrize("threads", [1, 2])
def test_jpeg_scan_ending_at_a_piece_boundary_decodes_as_pillow(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """The same, with the scan's data ending within a few bytes of Pillow's 131 072-byte mark (a
    comment segment after SOI moves it there) and the unknown marker right after it, 6 or 30 bytes
    later: whether
    libjpeg under Pillow is handed the next piece depends on how far its own bit reader reads,
    which the Rust Huffman decoder's does not mirror, so there it gives the image back to
    libjpeg. Every position must give Pillow's outcome."""
    from support.images import real_photos

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    body = real_photos()["rocket.jpg"].read_bytes()[:-2]
    outcomes: Counter[str] = Counter()
    for filler in (0, 6, 30):
        for shift in range(-24, 25):
            pad = 131072 + shift - len(body) - 4
            comment = b"\xff\xfe" + struct.pack(">H", pad + 2) + b"c" * pad
            marker = b"\x00" * filler + b"\xff\xf0" + b"\x00" * 8
            outcomes[_agree(body[:2] + comment + body[2:] + marker, threads=threads)] += 1
    assert outcomes["both raise"] > 0, outcomes
    assert outcomes["same pixels"] > 0, outcomes


def test_jpeg_fill_bytes_inside_the_data_decode_as_pillow() -> None:
    """`FF FF 00` inside the entropy-coded data: libjpeg-turbo's slow path reads a data byte
    0xFF, its fast path a marker; the fast path's coefficients of that MCU then stay under the
    slow path's (libjpeg does not clear the blocks in between), and Pillow shows them. The Rust
    decoder gives such files back to libjpeg: the pixels must be Pillow's."""
    from support.images import real_photos

    im = Image.open(real_photos()["rocket.jpg"]).crop((0, 0, 96, 72))
    tried = 0
    for subsampling in (0, 1, 2):
        data = encode(im, "JPEG", quality=100, subsampling=subsampling)
        start = _scan_start(data)
        stuffed = [i for i in range(start, len(data) - 2) if data[i : i + 2] == b"\xff\x00"]
        for i in stuffed[:: max(1, len(stuffed) // 12)]:
            assert _agree(data[:i] + b"\xff" + data[i:]) in ("same pixels", "both raise")
            tried += 1
    assert tried >= 20, tried


def test_our_inflate_takes_whole_valid_streams_and_leaves_the_rest_to_zlib() -> None:
    """Our PNG inflate takes the real photos' image data; zlib-rs gets what ours refuses (a
    stream with more data than the image, a bad adler32, under 2 KiB of compressed data), and every
    outcome is Pillow's."""
    from support.images import real_photos

    def taken(data: bytes) -> tuple[int, int]:
        before = _native.png_inflate_stats()
        assert _agree(data, threads=1) in ("same pixels", "both raise")
        after = _native.png_inflate_stats()
        return after["ours"] - before["ours"], after["zlib"] - before["zlib"]

    photos = [p.read_bytes() for n, p in sorted(real_photos().items()) if n.endswith(".png")]
    assert len(photos) >= 15
    for data in photos:
        assert taken(data) == (1, 0)
    rng = np.random.default_rng(7)
    rows = 60
    raw = b"".join(b"\x01" + rng.integers(0, 8, 180, dtype=np.uint8).tobytes() for _ in range(rows))
    ihdr = struct.pack(">IIBBBBB", 60, rows, 8, 2, 0, 0, 0)  # 60 x 60 RGB, 10 860 bytes of data
    assert taken(_png(ihdr, [zlib.compress(raw)])) == (1, 0)
    assert taken(_png(ihdr, [zlib.compress(raw + b"\0" * 181)])) == (0, 1)  # a row too many
    assert taken(_png(ihdr, [_zlib_with_bad_adler(raw)])) == (0, 1)
    small = struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0)
    assert taken(_png(small, [zlib.compress(raw[:25] * 8)])) == (0, 1)  # 200 bytes of data


def test_fast_inflate_and_zlib_inflate_give_the_same_results() -> None:
    """`SMG_GRPC_PROTO_PNG_ZLIB_INFLATE=1` inflates PNG image data with zlib-rs alone: a process
    with it gives the same pixels, or the same error, as the default (our inflate, zlib-rs when
    it gives up) on every PNG of Pillow's test images (broken ones included) and every real
    photo."""
    import os
    import re
    import subprocess
    import sys

    from support.images import pillow_test_images, real_photos

    files = sorted(str(p) for p in pillow_test_images().rglob("*.png"))
    files += sorted(str(p) for n, p in real_photos().items() if n.endswith(".png"))
    script = (
        "import hashlib, sys\n"
        "from smg_grpc_proto import vision\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        pixels = vision.decode(open(path, 'rb').read())\n"
        "        print(hashlib.sha256(pixels.tobytes()).hexdigest(), pixels.shape)\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, str(exc).replace('\\n', ' '))\n"
    )

    def run(**extra: str) -> list[str]:
        env = dict(os.environ, **extra)
        return subprocess.run(
            [sys.executable, "-c", script, *files],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()

    fast, zlib_only = run(), run(SMG_GRPC_PROTO_PNG_ZLIB_INFLATE="1")
    assert len(files) >= 100
    assert len(fast) == len(files)
    assert fast == zlib_only
    # The corpus has broken files: both report the same errors, not only the same pixels.
    errors = [line for line in fast if not re.match(r"[0-9a-f]{64} ", line)]
    assert len(errors) >= 3, errors


def test_rust_huffman_and_libjpeg_huffman_give_the_same_pixels() -> None:
    """`SMG_GRPC_PROTO_JPEG_STOCK_HUFFMAN=1` leaves all Huffman decoding to libjpeg-turbo: a
    process with it decodes every real JPEG to the same bytes as the default (Rust) path."""
    import hashlib
    import os
    import subprocess
    import sys

    from support.images import real_photos

    names = sorted(n for n in real_photos() if n.endswith(".jpg"))
    script = (
        "import hashlib, sys\n"
        "from support.images import real_photos\n"
        "from smg_grpc_proto import vision\n"
        "photos = real_photos()\n"
        "for name in sys.argv[1:]:\n"
        "    pixels = vision.decode(photos[name].read_bytes())\n"
        "    print(hashlib.sha256(pixels.tobytes()).hexdigest())\n"
    )
    env = dict(os.environ, SMG_GRPC_PROTO_JPEG_STOCK_HUFFMAN="1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    stock = subprocess.run(
        [sys.executable, "-c", script, *names], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    photos = real_photos()
    ours = [
        hashlib.sha256(vision.decode(photos[n].read_bytes()).tobytes()).hexdigest() for n in names
    ]
    assert len(names) >= 10
    assert ours == stock
