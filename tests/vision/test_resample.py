"""smg_grpc_proto.vision.resize against Pillow, live, byte for byte.

Pillow 13.0.0 (pinned in the test dependencies) is the reference: every case compares
``resize(x, (w, h), resample=f)`` with ``np.array(Image.fromarray(x).resize((w, h), f,
reducing_gap=None))`` on real photographs (``support/images.py``) and synthetic images, for every
filter and for modes L, RGB and RGBX (4 raw channels; Pillow's RGBA would be premultiplied). The
Pillow <= 12.2 pass order is checked against a real Pillow 12.2.0 in a separate environment
(slow).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import PIL
import pytest
from PIL import Image
from support.images import grace_hopper, pillow_test_images

from smg_grpc_proto.vision import resize

FILTERS = ["nearest", "box", "bilinear", "hamming", "bicubic", "lanczos"]
PIL_ID = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


def pillow_resize(x: np.ndarray, size: tuple[int, int], f: str, box=None) -> np.ndarray:
    if x.ndim == 3 and x.shape[2] == 4:
        im = Image.frombytes("RGBX", (x.shape[1], x.shape[0]), x.tobytes())
    else:
        im = Image.fromarray(x)
    return np.array(im.resize(size, PIL_ID[f], box=box, reducing_gap=None))


def vertical_first(in_wh: tuple[int, int], out_wh: tuple[int, int]) -> bool:
    """Pillow 13.0.0's rule (ImagingResampleInner)."""
    dh = in_wh[1] - out_wh[1]
    return dh > 0 and dh > 2 * (in_wh[0] - out_wh[0])


def sizes_for(w: int, h: int) -> list[tuple[int, int]]:
    """Output sizes (width, height) covering every regime for a w x h input."""
    return [
        (w // 2, h // 3),  # downscale
        (2 * w + 1, h * 3 // 2),  # upscale
        (w * 3 // 2, h // 2),  # mixed, vertical first
        (w // 3, h * 5 // 4),  # mixed, horizontal first
        (w, h // 2),  # one axis (height) only
        (w * 2 // 3, h),  # one axis (width) only
        (w - 2, h // 4),  # vertical first, barely shrinking width
        (w // 4, h - 2),  # horizontal first, barely shrinking height
        (w, h),  # identity
        (1, 1),
        (10, 10),
        (1, 2 * h),
        (2 * w, 1),
        (w * 7 // 8, h * 7 // 8),
    ]


PHOTOS = ("grace_hopper.jpg", "hopper.jpg", "flower.jpg", "flower2.jpg")


def photo_array(name: str) -> np.ndarray:
    """A photograph decoded by Pillow: grace_hopper (512x600) from matplotlib's wheel, the
    others (128x128, 480x360, 300x225) from the Pillow sdist's Tests/images."""
    source = (
        io.BytesIO(grace_hopper()) if name == "grace_hopper.jpg" else pillow_test_images() / name
    )
    with Image.open(source) as im:
        return np.array(im.convert("RGB"))


PHOTO_CASES = [
    pytest.param(name, size, id=f"{name}-{size[0]}x{size[1]}")
    for name, (w, h) in [
        ("grace_hopper.jpg", (512, 600)),
        ("hopper.jpg", (128, 128)),
        ("flower.jpg", (480, 360)),
        ("flower2.jpg", (300, 225)),
    ]
    for size in [*sizes_for(w, h), *([(504, 588), (512, 608), (224, 224)] if w == 512 else [])]
]


def test_photo_cases_cover_both_pass_orders():
    assert {name for name, *_ in (c.values for c in PHOTO_CASES)} == set(PHOTOS)
    orders = {vertical_first((512, 600), c.values[1]) for c in PHOTO_CASES}
    assert orders == {True, False}


def test_pillow_is_the_pinned_reference():
    assert PIL.__version__ == "13.0.0"


@pytest.mark.parametrize("f", FILTERS)
@pytest.mark.parametrize(("name", "size"), PHOTO_CASES)
def test_photographs_rgb(name: str, size: tuple[int, int], f: str):
    x = photo_array(name)
    got = resize(x, size, resample=f)
    want = pillow_resize(x, size, f)
    assert got.shape == want.shape
    assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} bytes differ"


@pytest.mark.parametrize("f", FILTERS)
@pytest.mark.parametrize("name", ["grace_hopper.jpg", "flower2.jpg"])
def test_photographs_l_and_rgbx(name: str, f: str):
    rgb = photo_array(name)
    grey = np.array(Image.fromarray(rgb).convert("L"))
    rng = np.random.default_rng(7)
    rgbx = np.concatenate([rgb, rng.integers(0, 256, (*rgb.shape[:2], 1), dtype=np.uint8)], 2)
    h, w = grey.shape
    for size in [*sizes_for(w, h), (504, 588)]:
        for x in (grey, rgbx):
            got, want = resize(x, size, resample=f), pillow_resize(x, size, f)
            assert np.array_equal(got, want), (x.shape, size, np.count_nonzero(got != want))
        # HxWx1 is L too.
        got = resize(grey[:, :, None], size, resample=f)
        assert np.array_equal(got[:, :, 0], pillow_resize(grey, size, f))


def synthetic(kind: str, w: int, h: int, channels: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    if kind == "pattern":  # ((7x + 3y), (5x + 11y), (x + 2y)) mod 256, as smg's goldens use
        planes = [(7 * x + 3 * y) % 256, (5 * x + 11 * y) % 256, (x + 2 * y) % 256, (x * y) % 256]
    elif kind == "noise":
        rng = np.random.default_rng(w * 1000 + h)
        planes = list(rng.integers(0, 256, (4, h, w)))
    else:  # stripes: 0/255 edges, where bicubic and lanczos overshoot and clamp
        planes = [((x // 3 + y // 2 + k) % 2) * 255 for k in range(4)]
    arr = np.stack(planes[:channels], axis=-1).astype(np.uint8)
    return arr[:, :, 0] if channels == 1 else arr


SYNTHETIC_CASES = [
    ((37, 23), (1092 // 26, 1176 // 28)),
    ((259, 194), (252, 196)),
    ((1, 300), (7, 900)),
    ((300, 1), (900, 7)),
    ((2000, 10), (3, 3)),
    ((10, 2000), (3, 3)),
    ((1, 1), (5, 7)),
    ((1, 1), (1, 1)),
    ((7, 5), (1, 1)),
    ((10, 10), (10, 10)),
    ((10, 10), (97, 3)),
    ((64, 48), (64, 47)),
    ((64, 48), (63, 48)),
    ((400, 90), (399, 30)),
    ((90, 400), (30, 399)),
    ((33, 1000), (31, 500)),
    ((1000, 33), (500, 31)),
]


@pytest.mark.parametrize("f", FILTERS)
@pytest.mark.parametrize("kind", ["pattern", "noise", "stripes"])
@pytest.mark.parametrize(
    ("in_wh", "out_wh"),
    SYNTHETIC_CASES,
    ids=[f"{a[0]}x{a[1]}-{b[0]}x{b[1]}" for a, b in SYNTHETIC_CASES],
)
def test_synthetic(in_wh, out_wh, kind: str, f: str):
    for channels in (1, 3, 4):
        x = synthetic(kind, *in_wh, channels)
        got, want = resize(x, out_wh, resample=f), pillow_resize(x, out_wh, f)
        assert np.array_equal(got, want), (channels, np.count_nonzero(got != want))


BOXES = [
    (0, 0, 512, 600),
    (10, 20, 300, 400),
    (0.5, 1.25, 511.5, 599.75),
    (100.3, 50.7, 100.3, 300.1),  # zero width
    (3, 4, 259, 304),  # integral, size == output: Pillow crops
    (1e-3, 0, 1 / 3, 600),
]


@pytest.mark.parametrize("f", FILTERS)
@pytest.mark.parametrize("box", BOXES)
def test_box(box, f: str):
    x = photo_array("grace_hopper.jpg")
    for size in [(256, 300), (504, 588), (31, 700), (700, 31)]:
        got = resize(x, size, resample=f, box=box)
        want = pillow_resize(x, size, f, box=box)
        assert np.array_equal(got, want), (size, np.count_nonzero(got != want))


def test_pil_ids_and_enum_members():
    x = synthetic("pattern", 40, 30, 3)
    for name, pil_id in PIL_ID.items():
        want = resize(x, (17, 45), resample=name)
        assert np.array_equal(resize(x, (17, 45), resample=pil_id), want)
        assert np.array_equal(resize(x, (17, 45), resample=Image.Resampling(pil_id)), want)
    assert np.array_equal(resize(x, (17, 45)), resize(x, (17, 45), resample="bicubic"))


def test_pass_orders_differ_only_when_pillow13_goes_vertical_first():
    x = photo_array("grace_hopper.jpg")
    for size in [(504, 588), (510, 200), (200, 590), (512, 300), (1000, 100)]:
        p13 = resize(x, size, pass_order="pillow13")
        p12 = resize(x, size, pass_order="pillow12")
        assert np.array_equal(p13, pillow_resize(x, size, "bicubic"))
        # Only a resize with both passes can depend on their order.
        two_passes = size[0] != 512 and size[1] != 600
        assert np.array_equal(p13, p12) != (two_passes and vertical_first((512, 600), size))


def test_threads_never_change_a_byte():
    x = photo_array("grace_hopper.jpg")
    for f in ("bicubic", "lanczos", "nearest"):
        for size in [(1288, 952), (504, 588), (100, 1500)]:
            one = resize(x, size, resample=f, threads=1)
            for threads in (None, 2, 7):
                assert np.array_equal(resize(x, size, resample=f, threads=threads), one)


def test_concurrent_calls_from_python_threads():
    x = photo_array("flower.jpg")
    want = resize(x, (1000, 700))
    results: list[bool] = []

    def work():
        results.append(all(np.array_equal(resize(x, (1000, 700)), want) for _ in range(5)))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 4


def test_result_is_a_new_writable_array():
    x = synthetic("pattern", 20, 10, 3)
    x.flags.writeable = False  # read-only input is fine
    out = resize(x, (20, 10))
    assert out.dtype == np.uint8
    assert out.shape == (10, 20, 3)
    assert out.flags.writeable
    assert out.flags.c_contiguous
    assert np.array_equal(out, x)
    assert not np.shares_memory(out, x)
    out[0, 0, 0] ^= 1
    assert resize(synthetic("pattern", 20, 10, 1), (5, 4)).shape == (4, 5)


@pytest.mark.parametrize(
    ("image", "size", "kwargs", "error", "match"),
    [
        (np.zeros((4, 4, 3), np.uint8), (0, 4), {}, ValueError, "width 0, height 4"),
        (np.zeros((4, 4, 3), np.uint8), (4, -2), {}, ValueError, "width 4, height -2"),
        (np.zeros((4, 4, 3), np.uint8), (65537, 4), {}, ValueError, "65537x4x3 is too large"),
        (np.zeros((4, 4, 3), np.uint8), (65536, 65536), {}, ValueError, "too large"),
        (np.zeros((4, 4, 3), np.uint8), (2**70, 4), {}, ValueError, "width 1180591620717411303424"),
        (np.zeros((4, 4, 3), np.uint8), (4, -(2**64)), {}, ValueError, "out of range"),
        (np.zeros((4, 4, 2), np.uint8), (2, 2), {}, ValueError, "2 channels"),
        (np.zeros((4, 4, 5), np.uint8), (2, 2), {}, ValueError, "5 channels"),
        (np.zeros((0, 4, 3), np.uint8), (2, 2), {}, ValueError, r"empty \(4x0\)"),
        (np.zeros((4, 4, 3), np.float32), (2, 2), {}, ValueError, "uint8, got <f4"),
        (np.zeros((4, 4, 3, 1), np.uint8), (2, 2), {}, ValueError, "4 dimensions"),
        (np.zeros((4, 8, 3), np.uint8)[:, ::2], (2, 2), {}, ValueError, "not C-contiguous"),
        (np.zeros((4, 4), np.uint8), (2, 2), {"resample": "cubic"}, ValueError, "'cubic'"),
        (np.zeros((4, 4), np.uint8), (2, 2), {"resample": 6}, ValueError, "id 6"),
        (np.zeros((4, 4), np.uint8), (2, 2), {"resample": True}, TypeError, "PIL id"),
        (np.zeros((4, 4), np.uint8), (2, 2), {"pass_order": "pillow11"}, ValueError, "pillow11"),
        (np.zeros((4, 4), np.uint8), (2, 2), {"threads": 0}, ValueError, "threads"),
        (np.zeros((4, 4), np.uint8), (2, 2), {"box": (-1, 0, 2, 2)}, ValueError, "negative"),
        (np.zeros((4, 4), np.uint8), (2, 2), {"box": (0, 0, 5, 2)}, ValueError, "exceed"),
        (np.zeros((4, 4), np.uint8), (2, 2), {"box": (3, 0, 2, 2)}, ValueError, "empty"),
        (np.zeros((4, 4), np.uint8), (2, 2), {"box": (0, 0, 2)}, ValueError, "box must be"),
        ([[1, 2], [3, 4]], (2, 2), {}, TypeError, "numpy.ndarray, got list"),
    ],
)
def test_errors(image, size, kwargs, error, match):
    with pytest.raises(error, match=match):
        resize(image, size, **kwargs)


# -- Pillow <= 12.2: always horizontal first ------------------------------------------------------

PILLOW12_SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("error")
    import numpy as np
    import PIL
    from PIL import Image
    from smg_grpc_proto.vision import resize

    ids = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
    x = np.load(sys.argv[1])
    report = {"pillow": PIL.__version__, "cases": 0, "differ12": 0, "differ13": []}
    for f, pil_id in ids.items():
        for size in json.loads(sys.argv[2]):
            size = tuple(size)
            want = np.array(Image.fromarray(x).resize(size, pil_id, reducing_gap=None))
            ours12 = resize(x, size, resample=f, pass_order="pillow12")
            ours13 = resize(x, size, resample=f, pass_order="pillow13")
            report["cases"] += 1
            report["differ12"] += int(np.count_nonzero(ours12 != want))
            if np.count_nonzero(ours13 != want):
                report["differ13"].append([f, *size])
    print(json.dumps(report))
    """
)


@pytest.mark.slow
def test_pillow12_pass_order_against_pillow_12_2(built_wheel: Path, tmp_path: Path):
    env_dir = tmp_path / "pillow12"
    uv = [sys.executable, "-m", "uv"]
    subprocess.run(
        [*uv, "venv", "--quiet", "--python", sys.executable, str(env_dir)], check=True, timeout=300
    )
    python = env_dir / "bin" / "python"
    subprocess.run(
        [
            *uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(python),
            "pillow==12.2.0",
            "numpy",
            str(built_wheel),
        ],
        check=True,
        timeout=600,
    )
    image = tmp_path / "grace_hopper.npy"
    np.save(image, photo_array("grace_hopper.jpg"))
    sizes = [(504, 588), (510, 200), (512, 300), (200, 590), (1000, 100), (31, 900), (600, 40)]
    # Sizes where Pillow 13 runs the vertical pass first and both passes run.
    swapped = {s for s in sizes if vertical_first((512, 600), s) and s[0] != 512 and s[1] != 600}
    assert len(swapped) == 3
    script = tmp_path / "compare.py"
    script.write_text(PILLOW12_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    result = subprocess.run(
        [str(python), str(script), str(image), json.dumps(sizes)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout)
    assert report["pillow"] == "12.2.0"
    assert report["cases"] == 6 * len(sizes)
    # Every byte equal in the Pillow 12 order. The Pillow 13 order differs only where Pillow 13
    # goes vertical first with both passes, and does so for every such size: not vacuous.
    assert report["differ12"] == 0
    differ13 = {(f, w, h) for f, w, h in report["differ13"]}
    assert {(w, h) for _, w, h in differ13} == swapped
    assert all(f != "nearest" for f, _, _ in differ13)


_KERNEL_DIGESTS = textwrap.dedent(
    """
    import hashlib, io, json, sys
    import numpy as np
    from PIL import Image
    import smg_grpc_proto
    from smg_grpc_proto import tensors
    from smg_grpc_proto.engines import VisionModel, vllm
    from smg_grpc_proto.generated import vllm_engine_pb2
    from smg_grpc_proto.vision import ImageProcessor, resize

    rng = np.random.default_rng(7)
    digests = {"cpu": smg_grpc_proto.build_info()["cpu_features"]}
    for h, w, c in [(97, 131, 3), (600, 512, 3), (960, 1280, 3), (300, 700, 1), (64, 65, 4)]:
        x = rng.integers(0, 256, (h, w, c), dtype=np.uint8) if c > 1 else (
            rng.integers(0, 256, (h, w), dtype=np.uint8))
        for f in ["box", "bilinear", "hamming", "bicubic", "lanczos"]:
            for size in [(w * 7 // 8, h * 7 // 8), (w // 3 + 1, h // 2 + 1), (w * 2, h + 5)]:
                out = np.asarray(resize(x, size, resample=f, threads=1))
                digests[f"{h}x{w}x{c} {f} {size}"] = hashlib.sha256(out.tobytes()).hexdigest()
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (960, 1280, 3), dtype=np.uint8)).save(buf, "JPEG")
    for family in ["qwen2_vl", "qwen3_vl", "clip", "llava_next"]:
        out = ImageProcessor.for_family(family, threads=1)([buf.getvalue()])
        digests[family] = hashlib.sha256(out.pixel_values.tobytes()).hexdigest()
    media = VisionModel.for_family("qwen2_vl").prepare([buf.getvalue()], threads=1)
    wire = tensors.serialize(vllm.generate_request("r", [1, 151655, 2], media))
    (batch,) = vllm.decode_mm_inputs(tensors.parse(wire, vllm_engine_pb2.GenerateRequest))
    written = batch.tensors["pixel_values"]  # written by the deferred writer into the bytes
    digests["wire"] = hashlib.sha256(written.tobytes()).hexdigest()
    print(json.dumps(digests))
    """
)


@pytest.mark.slow
def test_avx512_and_avx2_kernels_write_the_same_bytes() -> None:
    """On a CPU with AVX-512 the resampler, the processors and the deferred wire writer give the
    same bytes with the AVX-512 kernels turned off (``SMG_GRPC_PROTO_NO_AVX512=1``) as on; each
    run is compared with Pillow and transformers elsewhere, this pins the two kernels together
    on large and odd shapes, every convolving filter, up- and downscales and 1/3/4 channels."""
    runs = []
    for off in ("0", "1"):
        env = dict(os.environ, SMG_GRPC_PROTO_NO_AVX512=off)
        done = subprocess.run(
            [sys.executable, "-c", _KERNEL_DIGESTS], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    on, off = runs
    if "avx512vnni" not in on["cpu"]:
        pytest.skip(f"no AVX-512 VNNI on this CPU ({on['cpu']}): one set of kernels only")
    assert not any(f.startswith("avx512") for f in off["cpu"])
    on.pop("cpu"), off.pop("cpu")
    assert len(on) > 70
    assert on == off
