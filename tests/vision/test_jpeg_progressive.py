"""Progressive JPEGs: the Rust decoder of progressive scans (``jpeg_progressive.rs``) against
Pillow.

libjpeg-turbo's ``jpegtran`` (Debian's ``libjpeg-turbo-progs``, installed by ``make
system-deps``) rewrites real photos losslessly into progressive files with any scan script:
libjpeg's default progression, spectral selection alone, deep successive approximation, DC
scans per component, bands split and refined separately, a mozjpeg-like script, an incomplete
progression (so that libjpeg's block smoothing runs), with and without restart markers. Every
file must decode to Pillow's pixels with the hook taking its scans, and damaged ones must give
Pillow's outcome (the hook hands anything libjpeg would recover from back to libjpeg).
"""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess
import time
import typing
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile
from support.decode_cases import (
    NO_SUCH_CODE,
    STRAY_COM,
    STRAY_RST,
    best_cpu_seconds,
    damage_jpeg_scan,
    damaged_in_scan,
    encode,
    reference,
    scan_per_coefficient,
    with_scans,
)

from smg_grpc_proto import _native, vision
from smg_grpc_proto.errors import ImageDecodeError

#: Scan scripts in jpegtran's ``-scans`` format (libjpeg's ``wizard.txt``): components, band
#: ``Ss-Se``, ``Ah``, ``Al``.
SCRIPTS = {
    # Spectral selection only: every coefficient whole in one scan.
    "spectral": """
        0,1,2: 0-0, 0, 0;
        0: 1-9, 0, 0;
        0: 10-63, 0, 0;
        1: 1-63, 0, 0;
        2: 1-63, 0, 0;
    """,
    # Three bits of successive approximation, DC refined in interleaved scans.
    "deep-approximation": """
        0,1,2: 0-0, 0, 3;
        0: 1-63, 0, 3;
        1: 1-63, 0, 2;
        2: 1-63, 0, 2;
        0,1,2: 0-0, 3, 2;
        0,1,2: 0-0, 2, 1;
        0,1,2: 0-0, 1, 0;
        0: 1-63, 3, 2;
        0: 1-63, 2, 1;
        0: 1-63, 1, 0;
        1: 1-63, 2, 1;
        1: 1-63, 1, 0;
        2: 1-63, 2, 1;
        2: 1-63, 1, 0;
    """,
    # DC per component, bands split and refined band by band, one chroma band never refined.
    "split-bands": """
        0: 0-0, 0, 1;
        1: 0-0, 0, 1;
        2: 0-0, 0, 1;
        0: 1-5, 0, 1;
        0: 6-63, 0, 1;
        1: 1-2, 0, 0;
        1: 3-63, 0, 0;
        2: 1-63, 0, 1;
        0: 0-0, 1, 0;
        1,2: 0-0, 1, 0;
        0: 1-5, 1, 0;
        0: 6-63, 1, 0;
        2: 1-63, 1, 0;
    """,
    # The shape of mozjpeg's scripts: luma DC alone, chroma DC together, low bands first.
    "mozjpeg-like": """
        0: 0-0, 0, 0;
        1,2: 0-0, 0, 0;
        0: 1-8, 0, 2;
        1: 1-8, 0, 0;
        2: 1-8, 0, 0;
        0: 9-63, 0, 2;
        0: 1-63, 2, 1;
        0: 1-63, 1, 0;
        1: 9-63, 0, 0;
        2: 9-63, 0, 0;
    """,
    # Single coefficients and narrow bands, each refined on its own: end-of-band runs over
    # many blocks whose band is zero (passed over a run at a time) or not (correction bits).
    "per-coefficient": """
        0,1,2: 0-0, 0, 1;
        0: 1-1, 0, 2;
        0: 2-2, 0, 2;
        0: 3-3, 0, 1;
        0: 4-9, 0, 2;
        0: 10-63, 0, 2;
        1: 1-1, 0, 1;
        1: 2-63, 0, 1;
        2: 1-63, 0, 1;
        0,1,2: 0-0, 1, 0;
        0: 1-1, 2, 1;
        0: 1-1, 1, 0;
        0: 2-2, 2, 1;
        0: 2-2, 1, 0;
        0: 3-3, 1, 0;
        0: 4-9, 2, 1;
        0: 4-9, 1, 0;
        0: 10-63, 2, 1;
        0: 10-63, 1, 0;
        1: 1-1, 1, 0;
        1: 2-63, 1, 0;
        2: 1-63, 1, 0;
    """,
}
#: Gray only: large shifts and a progression that stops before the last bits (block smoothing).
GRAY_SCRIPTS = {
    "gray-incomplete": """
        0: 0-0, 0, 2;
        0: 1-63, 0, 10;
        0: 0-0, 2, 1;
        0: 1-63, 10, 9;
        0: 0-0, 1, 0;
        0: 1-63, 9, 8;
    """,
}
RESTARTS: tuple[tuple[str, ...], ...] = ((), ("-restart", "1"), ("-restart", "3B"))


def _jpegtran() -> str:
    found = shutil.which("jpegtran")
    if found is None:
        pytest.fail("jpegtran not found: `make system-deps` installs libjpeg-turbo-progs")
    return found


def _rewrite(data: bytes, script: str | None, restart: tuple[str, ...], tmp: Path) -> bytes:
    """``data`` rewritten losslessly by jpegtran: progressive with ``script`` (None: libjpeg's
    default progression)."""
    args = [_jpegtran()]
    if script is None:
        args.append("-progressive")
    else:
        path = tmp / f"scans-{hashlib.sha256(script.encode()).hexdigest()[:12]}.txt"
        path.write_text(script)
        args += ["-scans", str(path)]
    args += list(restart)
    return subprocess.run(args, input=data, capture_output=True, check=True).stdout


def _scans(data: bytes) -> int:
    return data.count(b"\xff\xda")


def _photo() -> Image.Image:
    from support.images import real_photos

    return Image.open(real_photos()["rocket.jpg"]).convert("RGB")


def test_every_scan_script_decodes_to_pillows_pixels(tmp_path: Path) -> None:
    photo = _photo()
    cases: dict[str, bytes] = {}
    for size in (None, (1, 1), (17, 33), (300, 7), (9, 200)):
        im = photo if size is None else photo.resize(size)
        for label, mode, subsampling in (
            ("444", "RGB", 0),
            ("422", "RGB", 1),
            ("420", "RGB", 2),
            ("gray", "L", 0),
            ("cmyk", "CMYK", 0),
        ):
            base = encode(im.convert(mode), "JPEG", quality=88, subsampling=subsampling)
            scripts: dict[str, str | None] = {"default": None}
            if mode == "RGB":
                scripts.update(SCRIPTS)
            if mode == "L":
                scripts.update(GRAY_SCRIPTS)
            for name, script in scripts.items():
                for restart in RESTARTS:
                    key = f"{size} {label} {name} {' '.join(restart)}"
                    cases[key] = _rewrite(base, script, restart, tmp_path)
    assert len(cases) >= 200
    before = _native.jpeg_huffman_stats()
    scans = 0
    for key, data in cases.items():
        want = reference(data)
        got = vision.decode(data, threads=1)
        assert got.shape == want.shape, key
        assert np.array_equal(got, want), key
        scans += _scans(data)
    after = _native.jpeg_huffman_stats()
    # The hook took every scan of every file. It gives a file back only where a scan ends within
    # a few bytes of one of Pillow's 64 KiB pieces (how far libjpeg under Pillow would have read
    # then depends on its own bit reader): one of these files, 65 547 bytes long, does.
    assert after["progressive"] - before["progressive"] == scans
    assert after["retried"] - before["retried"] <= 2
    # The scans of one component were decoded a block row per call wherever a row has more
    # than one block left (the 1 x 1 images have none).
    assert after["progressive_rows"] > before["progressive_rows"]


@pytest.mark.parametrize("restart", [(), ("-restart", "7B")], ids=["plain", "restarts"])
def test_a_scan_per_coefficient_decodes_to_pillows_pixels(
    tmp_path: Path, restart: tuple[str, ...]
) -> None:
    """``scan_per_coefficient``'s 99 scans over a 2048 x 1536 gray image: flat areas (each scan one
    end-of-band run over most of the image, passed over a run at a time) beside a real photo
    (runs broken by coefficients that take correction bits). Pillow's pixels, with the hook
    taking every scan, a block row per call."""
    photo = _photo().convert("L").resize((1024, 768))
    canvas = Image.new("L", (2048, 1536), 128)
    canvas.paste(photo, (512, 384))
    base = encode(canvas, "JPEG", quality=92)
    data = _rewrite(base, scan_per_coefficient(32), restart, tmp_path)
    assert _scans(data) == 99
    before = _native.jpeg_huffman_stats()
    assert np.array_equal(vision.decode(data, threads=1), reference(data))
    after = _native.jpeg_huffman_stats()
    assert after["progressive"] - before["progressive"] == 99
    assert after["retried"] == before["retried"]
    assert after["progressive_rows"] - before["progressive_rows"] > 98 * 1536 // 8 // 2


def test_a_scan_repeated_hundreds_of_times_decodes_to_pillows_pixels(tmp_path: Path) -> None:
    """The last scan of a flat image (a refinement of the band 33-63) sent 300 more times (a few
    bytes each: one end-of-band run over the whole image; 399 scans in all): every copy is
    decoded again, as by libjpeg, a run at a time, to Pillow's pixels."""
    base = encode(Image.new("L", (1024, 1024), 128), "JPEG", quality=90)
    progressive = _rewrite(base, scan_per_coefficient(32), (), tmp_path)
    data = with_scans(progressive, 399)
    assert _scans(data) == 399
    before = _native.jpeg_huffman_stats()
    assert np.array_equal(vision.decode(data, threads=1), reference(data))
    after = _native.jpeg_huffman_stats()
    assert after["progressive"] - before["progressive"] == 399
    assert after["retried"] == before["retried"]
    # 20 MB after the EOI (Pillow never reads them): the search for the file's last marker,
    # which decides whether a scan runs into the end of the file, goes over them once, not once
    # per scan (searched per scan, this decode took 2.4 to 2.8 s on the Intel VM).
    want, padded = reference(data), data + bytes(20_000_000)
    start = time.perf_counter()
    got = vision.decode(padded, threads=1)
    elapsed = time.perf_counter() - start
    assert np.array_equal(got, want)
    assert elapsed < 1.5, elapsed


def test_a_progressive_file_cut_inside_a_scan_hands_only_that_scan_to_libjpeg(
    tmp_path: Path,
) -> None:
    """A progressive photo cut inside its n-th scan (a truncated upload): Pillow's outcome; the
    scans before the cut are ours, the one running into the end of the file goes to libjpeg
    before it starts (it used to be decoded by us to the end, then the whole image again by
    libjpeg), and nothing is retried."""
    from support.images import real_photos

    data = _rewrite(real_photos()["rocket.jpg"].read_bytes(), None, (), tmp_path)
    starts = [i for i in range(len(data) - 1) if data[i : i + 2] == b"\xff\xda"]
    assert len(starts) >= 8
    for n in (2, 5, len(starts) - 1):
        cut = data[: (starts[n] + starts[n + 1]) // 2] if n + 1 < len(starts) else data[:-3]
        before = _native.jpeg_huffman_stats()
        with pytest.raises(OSError, match="truncated"):
            reference(cut)
        with pytest.raises(ImageDecodeError):
            vision.decode(cut, threads=1)
        after = _native.jpeg_huffman_stats()
        assert after["progressive"] - before["progressive"] == n, n  # scans 0 .. n-1
        assert after["retried"] == before["retried"], n


def test_a_progressive_jpeg_damaged_in_a_scan_is_handed_to_libjpeg_where_our_decoder_stops(
    tmp_path: Path,
) -> None:
    """A stray marker or a code no table holds in the middle of a progressive file's DC, AC
    first or refinement scan, with and without restart markers: our decoder stops in that scan,
    says where libjpeg's progressive decoder would stand at the block it stopped in (and takes
    back the coefficients a refinement block had made nonzero), and libjpeg decodes the rest of
    the scan; the scans after it are ours again. Pixels: Pillow's; nothing decoded twice. It used
    to hand the whole image back to libjpeg (up to ~1.3x Pillow's time on damage late in the
    file); the rewrite of `rocket` damaged in its last scan now decodes faster than Pillow."""
    from support.images import real_photos

    rocket = real_photos()["rocket.jpg"].read_bytes()
    files = {
        "rocket": _rewrite(rocket, None, (), tmp_path),
        "rocket, restart every 2 rows": _rewrite(rocket, None, ("-restart", "2"), tmp_path),
        "rocket, deep approximation": _rewrite(rocket, SCRIPTS["deep-approximation"], (), tmp_path),
    }
    damages = {"stray RST": STRAY_RST, "stray COM": STRAY_COM, "code no table holds": NO_SUCH_CODE}
    resumed = 0
    for name, data in files.items():
        starts = [i for i in range(len(data) - 1) if data[i : i + 2] == b"\xff\xda"]
        ends = [*starts[1:], data.rindex(b"\xff\xd9")]
        for n in sorted({1, len(starts) // 2, len(starts) - 1}):
            # The middle of scan n's data (its header is a few bytes long).
            at = (starts[n] + 20 + ends[n]) // 2
            while data[at] == 0xFF or data[at - 1] == 0xFF:
                at += 1
            for what, insert in damages.items():
                blob = data[:at] + insert + data[at:]
                case = (name, n, what)
                before = _native.jpeg_huffman_stats()
                try:
                    want: np.ndarray | None = reference(blob)
                except OSError:  # a stray COM in the last scan: its length runs off the end
                    want = None
                if want is None:
                    with pytest.raises(ImageDecodeError):
                        vision.decode(blob, threads=1)
                else:
                    assert np.array_equal(vision.decode(blob, threads=1), want), case
                after = _native.jpeg_huffman_stats()
                assert after["retried"] == before["retried"], case
                assert after["resumed"] == before["resumed"] + 1, case
                resumed += 1
                # The scans after the damaged one are ours again (a stray COM marker makes
                # libjpeg read a segment length out of the scan's data and skip that far, past
                # some of them, as under Pillow).
                taken = after["progressive"] - before["progressive"]
                assert taken == len(starts) or (what == "stray COM" and taken > n), case
    assert resumed == 27

    def best(call: typing.Callable[[], object]) -> float:
        return best_cpu_seconds(call, 5)

    late = damaged_in_scan(files["rocket"], 0.9, STRAY_RST)
    ours = best(lambda: vision.decode(late, threads=1))
    pillow = best(lambda: reference(late))
    assert ours < pillow, f"ours {ours * 1e3:.2f} ms, Pillow {pillow * 1e3:.2f} ms"


def test_real_photos_made_progressive_decode_to_their_baseline_pixels(tmp_path: Path) -> None:
    """jpegtran's rewrite is lossless (the same quantised coefficients, sent in scans): every
    real camera JPEG of the corpus, made progressive, decodes to exactly the pixels of its
    baseline original and of Pillow, one thread or all cores, with the hook taking its scans."""
    from support.images import real_photos

    photos = {n: p.read_bytes() for n, p in sorted(real_photos().items()) if n.endswith(".jpg")}
    assert len(photos) >= 10
    before = _native.jpeg_huffman_stats()
    scans = 0
    rewritten = 0
    for name, original in photos.items():
        if name == "junk_jpeg_header.jpg":
            continue  # jpegtran stops at its bytes before a marker (libjpeg's warning)
        data = _rewrite(original, None, (), tmp_path)
        rewritten += 1
        assert b"\xff\xc2" in data[: data.index(b"\xff\xda")], name  # SOF2: progressive
        baseline = vision.decode(original, threads=1)
        assert np.array_equal(vision.decode(data, threads=1), baseline), name
        assert np.array_equal(vision.decode(data, threads=0), baseline), name
        assert np.array_equal(reference(data), baseline), name
        scans += 2 * _scans(data)
    assert rewritten >= 10
    after = _native.jpeg_huffman_stats()
    # Every scan was taken (a file given back at a piece's edge counts the scans before it
    # twice); xmp_test's 1.7 MB cross 26 piece edges.
    assert after["progressive"] - before["progressive"] >= scans
    assert after["retried"] - before["retried"] <= 4
    assert after["progressive_rows"] > before["progressive_rows"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_damaged_progressive_jpegs_agree_with_pillow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flipped bits, dropped, doubled and inserted bytes anywhere after the first scan's header
    (later scans' data, their headers, the tables between them) of progressive files with and
    without restart markers: each outcome must be Pillow's, pixels or refusal."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    im = _photo().crop((0, 0, 160, 120))
    originals = []
    for script in (None, *SCRIPTS.values()):
        for restart in ((), ("-restart", "2B"), ("-restart", "1")):
            for subsampling in (0, 2):
                base = encode(im, "JPEG", quality=90, subsampling=subsampling)
                originals.append(_rewrite(base, script, restart, tmp_path))
    gray = encode(im.convert("L"), "JPEG", quality=90)
    originals.append(_rewrite(gray, GRAY_SCRIPTS["gray-incomplete"], ("-restart", "1"), tmp_path))
    rng = random.Random(20261205)
    counts: Counter[str] = Counter()
    for n in range(1500):
        data = damage_jpeg_scan(rng, originals[n % len(originals)], places=rng.choice((1, 2, 4)))
        try:
            want: np.ndarray | None = reference(data)
        except Exception:  # whatever Pillow raises counts as a refusal
            want = None
        if want is None:
            with pytest.raises(ImageDecodeError):
                vision.decode(data, threads=1)
            counts["both raise"] += 1
            continue
        got = vision.decode(data, threads=1)
        assert got.shape == want.shape, n
        assert np.array_equal(got, want), n
        counts["same pixels"] += 1
    assert counts["same pixels"] > 500, counts
    assert counts["both raise"] > 50, counts
