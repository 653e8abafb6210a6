"""JPEG Huffman decoding on a helper thread (``vision.decode(..., threads=0 or >= 2)``).

The helper decodes a scan's MCUs into a ring of blocks while the calling thread runs libjpeg's
IDCT, upsampling and colour conversion; the pixels must be exactly Pillow's (and those of the
one-thread path), whatever the file — including damaged ones, where an anomaly on the helper
hands the image back to libjpeg. ``threads=2`` asks for the helper even on a one-core machine.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from PIL import Image, ImageFile
from support.decode_cases import damage_jpeg_scan, encode, reference

from smg_grpc_proto import _native, vision
from smg_grpc_proto.errors import ImageDecodeError


def _stats() -> dict[str, int]:
    return _native.jpeg_huffman_stats()


def _big_jpegs() -> dict[str, bytes]:
    """Real camera JPEGs large enough for the helper (>= 4 096 blocks and 32 KiB of data), and
    re-encodings of one with restart markers (decoded two intervals at a time on the helper)."""
    from support.images import real_photos

    photos = real_photos()
    out = {
        name: photos[name].read_bytes()
        for name in sorted(photos)
        if name.endswith(".jpg") and photos[name].stat().st_size >= 40_000
    }
    rocket = Image.open(photos["rocket.jpg"])
    out["rocket-q95-rst4"] = encode(rocket, "JPEG", quality=95, restart_marker_blocks=4)
    out["rocket-q98-444-rst-row"] = encode(
        rocket, "JPEG", quality=98, subsampling=0, restart_marker_rows=1
    )
    out["rocket-gray-q97"] = encode(rocket.convert("L"), "JPEG", quality=97)
    return out


def test_the_helper_gives_pillows_pixels_on_real_photos() -> None:
    files = _big_jpegs()
    on_helper, shared = [], []
    before = _stats()
    for name, data in files.items():
        want = reference(data)
        one = vision.decode(data, threads=1)
        mid = _stats()
        two = vision.decode(data, threads=2)
        if _stats()["shared"] > mid["shared"]:
            shared.append(name)
        assert one.shape == want.shape, name
        assert np.array_equal(one, want), name
        assert np.array_equal(two, want), name
        if _stats()["helper"] > mid["helper"]:
            on_helper.append(name)
    # Progressive files and those below the thresholds stay with libjpeg or the calling thread;
    # the baseline photos (and the re-encodings) must have gone through the helper, and the
    # dense files with restart markers shared their intervals with the calling thread.
    assert len(on_helper) >= 10, on_helper
    assert {"grace_hopper.jpg", "rocket-q95-rst4", "rocket-gray-q97"} <= set(on_helper)
    assert {"xmp_test.jpg", "rocket-q95-rst4", "rocket-q98-444-rst-row"} <= set(shared), shared
    assert _stats()["retried"] == before["retried"], "a valid photo was handed back to libjpeg"


def test_small_scans_stay_on_the_calling_thread() -> None:
    from support.images import real_photos

    im = Image.open(real_photos()["rocket.jpg"])
    small = encode(im.crop((0, 0, 120, 90)), "JPEG", quality=90)
    before = _stats()
    assert np.array_equal(vision.decode(small, threads=2), reference(small))
    after = _stats()
    assert after["inline"] - before["inline"] == 1
    assert after["helper"] == before["helper"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_damaged_files_on_the_helper_agree_with_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flipped, dropped, doubled and inserted bytes in the entropy-coded data of large JPEGs
    (with and without restart markers), decoded with the helper: every outcome is Pillow's —
    the same pixels, or both refuse."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    files = _big_jpegs()
    originals = [files[n] for n in ("grace_hopper.jpg", "rocket-q95-rst4", "rocket-gray-q97")]
    originals.append(files["rocket-q98-444-rst-row"])
    rng = random.Random(20261205_2)
    counts: Counter[str] = Counter()
    before = _stats()
    for n in range(240):
        places = rng.choice((1, 1, 3))
        actions = ("flip", "flip", "drop", "double", "insert")
        blob = damage_jpeg_scan(rng, originals[n % len(originals)], places, actions)
        try:
            want: np.ndarray | None = reference(blob)
        except Exception:  # whatever Pillow raises counts as a refusal
            want = None
        if want is None:
            with pytest.raises(ImageDecodeError):
                vision.decode(blob, threads=2)
            counts["both raise"] += 1
        else:
            got = vision.decode(blob, threads=2)
            assert got.shape == want.shape, n
            assert np.array_equal(got, want), n
            counts["same pixels"] += 1
    after = _stats()
    assert counts["same pixels"] > 100, counts
    # The helper took the scans (sharing the intervals of two of the four seeds), and handed
    # the damaged ones over to libjpeg at the MCU where it stopped (decoded again from the
    # start only where it could not say where libjpeg would stand).
    assert after["helper"] - before["helper"] >= 200, (before, after)
    assert after["shared"] - before["shared"] >= 100, (before, after)
    assert after["resumed"] - before["resumed"] >= 20, (before, after, counts)


def test_threads_is_checked() -> None:
    from support.images import real_photos

    data = real_photos()["grace_hopper.jpg"].read_bytes()
    with pytest.raises(ValueError, match="threads"):
        vision.decode(data, threads=-1)
    for bad in (True, 1.5, "2"):
        with pytest.raises(TypeError, match="threads"):
            vision.decode(data, threads=bad)  # type: ignore[arg-type]
    assert np.array_equal(vision.decode(data, threads=0), vision.decode(data, threads=7))


def test_one_image_in_a_processor_uses_the_helper() -> None:
    """A batch of one image gets all the batch's threads: its JPEG is Huffman-decoded on a
    helper, and the output is that of the one-thread call."""
    from support.images import real_photos

    from smg_grpc_proto.vision import ImageProcessor

    data = real_photos()["hubble_deep_field.jpg"].read_bytes()
    processor = ImageProcessor.for_family("qwen2_vl")
    one = processor(images=[data], threads=1)
    before = _stats()
    two = processor(images=[data], threads=2)
    after = _stats()
    assert after["helper"] - before["helper"] == 1
    assert one.pixel_values is not None
    assert two.pixel_values is not None
    assert np.array_equal(one.pixel_values, two.pixel_values)
    # Two images on two threads: one thread each, no helper.
    before = _stats()
    processor(images=[data, data], threads=2)
    after = _stats()
    assert after["helper"] == before["helper"]
