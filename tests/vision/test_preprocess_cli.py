"""``smg-proto preprocess``: the written tensors equal ``ImageProcessor`` output, byte for byte.

The CLI runs in-process (``cli.main``) and as a subprocess (``python -m smg_grpc_proto.cli``);
safetensors files are read back with our own reader and, when installed, with the
``safetensors`` package (the format's reference implementation).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

PIL = pytest.importorskip("PIL", reason="the test images are written with Pillow")

from PIL import Image  # noqa: E402

from smg_grpc_proto import cli  # noqa: E402
from smg_grpc_proto.vision import ImageProcessor  # noqa: E402
from smg_grpc_proto.vision._export import (  # noqa: E402
    read_safetensors,
    write_safetensors,
    write_tensors,
)

try:
    from safetensors.numpy import load_file as st_load_file
except ImportError:  # pragma: no cover - safetensors is in the test dependency group
    st_load_file = None


def _photo(height: int, width: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width, 1), y * 255 / max(height, 1), (x + y) % 256], axis=-1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five small images of different sizes and formats (JPEG, PNG, PNG with alpha, gray)."""
    d = tmp_path_factory.mktemp("images")
    Image.fromarray(_photo(120, 160, 0)).save(d / "a.jpg", quality=90)
    Image.fromarray(_photo(97, 61, 1)).save(d / "b.png")
    rgba = np.dstack([_photo(50, 300, 2), np.full((50, 300), 128, np.uint8)])
    Image.fromarray(rgba, "RGBA").save(d / "c.png")
    Image.fromarray(_photo(64, 64, 3)[..., 0], "L").save(d / "d.png")
    Image.fromarray(_photo(333, 222, 4)).save(d / "e.jpg", quality=75)
    (d / "notes.txt").write_text("not an image")  # skipped when the directory expands
    return d


@pytest.fixture(scope="module")
def many_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eleven images: more than the progress bar's threshold of 8, in two chunks."""
    d = tmp_path_factory.mktemp("many")
    for i in range(11):
        Image.fromarray(_photo(40 + 9 * i, 70 + 13 * (i % 4), 10 + i)).save(d / f"img{i:02d}.png")
    return d


def _images(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.suffix in (".jpg", ".png"))


def _expected(processor: ImageProcessor, paths: list[Path]) -> dict[str, np.ndarray]:
    out = processor(paths)
    expected = dict(out.tensors())
    if out.num_image_tokens is not None:
        expected["num_image_tokens"] = np.asarray(out.num_image_tokens, dtype=np.int64)
    return expected


def _assert_same(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, want in expected.items():
        got = actual[name]
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name


def _read(path: Path) -> dict[str, np.ndarray]:
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    ours, _ = read_safetensors(path)
    if st_load_file is not None:
        _assert_same(st_load_file(str(path)), ours)
    return ours


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
@pytest.mark.parametrize("family", ["qwen2_vl", "clip", "llava_next"])
def test_in_process_equals_processor(image_dir: Path, tmp_path: Path, family: str, fmt: str):
    out = tmp_path / f"out.{fmt}"
    code = cli.main(
        ["preprocess", str(image_dir), "--family", family, "--out", str(out), "--format", fmt]
    )
    assert code == 0
    expected = _expected(ImageProcessor.for_family(family), _images(image_dir))  # type: ignore[arg-type]
    if family == "qwen2_vl":
        assert {"pixel_values", "image_grid_thw", "num_image_tokens"} <= set(expected)
    if family == "llava_next":
        assert "image_sizes" in expected
    _assert_same(_read(out), expected)


def test_safetensors_metadata_and_layout(image_dir: Path, tmp_path: Path):
    out = tmp_path / "out.safetensors"
    assert cli.main(["preprocess", str(image_dir / "a.jpg"), "--family", "qwen2_vl",
                     "--out", str(out)]) == 0  # fmt: skip
    raw = out.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header["pixel_values"]["dtype"] == "F32"
    assert header["image_grid_thw"]["dtype"] == "I64"
    assert header["num_image_tokens"]["dtype"] == "I64"
    spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
    assert spans[0][0] == 0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # back to back
    assert spans[-1][1] == len(raw) - 8 - n
    _, meta = read_safetensors(out)
    assert meta["family"] == "qwen2_vl"
    assert json.loads(meta["images"]) == [str(image_dir / "a.jpg")]
    if st_load_file is not None:
        from safetensors import safe_open

        with safe_open(str(out), "np") as f:
            assert f.metadata() == meta


def test_format_from_suffix(image_dir: Path, tmp_path: Path):
    out = tmp_path / "x.npz"
    assert cli.main(["preprocess", str(image_dir / "b.png"), "--family", "siglip",
                     "--out", str(out)]) == 0  # fmt: skip
    assert out.read_bytes()[:2] == b"PK"  # a zip: npz


def test_config_and_model_dir(image_dir: Path, tmp_path: Path):
    config = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "min_pixels": 3136,
        "max_pixels": 12845,
        "patch_size": 14,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    model = tmp_path / "model"
    model.mkdir()
    (model / "preprocessor_config.json").write_text(json.dumps(config))
    expected = _expected(ImageProcessor.from_pretrained(config), _images(image_dir))
    for flag, value in (("--config", model / "preprocessor_config.json"), ("--model-dir", model)):
        out = tmp_path / "out.safetensors"
        assert cli.main(["preprocess", str(image_dir), flag, str(value), "--out", str(out),
                         "--threads", "1"]) == 0  # fmt: skip
        _assert_same(_read(out), expected)


def test_progress_bar(many_images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "out.npz"
    paths = _images(many_images)
    assert cli.main(["preprocess", *map(str, paths), "--family", "qwen2_vl",
                     "--out", str(out), "--progress"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    frames = [f for f in err.split("\r") if f]
    assert frames[0].startswith("preprocess [")
    assert "8/11 images" in frames[0]
    assert "11/11 images 100%" in frames[-1]
    assert err.endswith("\n")
    # chunked processing changes nothing
    _assert_same(_read(out), _expected(ImageProcessor.for_family("qwen2_vl"), paths))


def test_progress_chunks_llava_next_tiles(many_images: Path, tmp_path: Path):
    """LLaVA-NeXT pads tiles to the batch maximum: chunks are padded to the overall maximum."""
    out = tmp_path / "out.safetensors"
    paths = _images(many_images)
    stderr = io.StringIO()
    from smg_grpc_proto.vision import _cli

    _cli.run(paths, out=out, family="llava_next", progress=True, stderr=stderr)
    assert "11/11" in stderr.getvalue()
    _assert_same(_read(out), _expected(ImageProcessor.for_family("llava_next"), paths))


def test_no_progress_without_tty_or_flag(many_images, tmp_path, capsys):
    out = tmp_path / "out.npz"
    assert cli.main(["preprocess", str(many_images), "--family", "clip", "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""


def test_no_progress_for_small_batches(image_dir, tmp_path, capsys):
    out = tmp_path / "out.npz"
    assert cli.main(["preprocess", str(image_dir), "--family", "clip", "--out", str(out),
                     "--progress"]) == 0  # fmt: skip
    assert capsys.readouterr().err == ""


def test_grace_hopper(tmp_path: Path):
    from support import images

    try:
        data = images.grace_hopper()
    except RuntimeError as exc:  # no package index
        pytest.skip(str(exc))
    photo = tmp_path / "grace_hopper.jpg"
    photo.write_bytes(data)
    out = tmp_path / "gh.safetensors"
    assert cli.main(["preprocess", str(photo), "--family", "qwen2_vl", "--out", str(out)]) == 0
    expected = _expected(ImageProcessor.for_family("qwen2_vl"), [photo])
    _assert_same(_read(out), expected)
    assert expected["image_grid_thw"].tolist() == [[1, 42, 36]]


def test_subprocess(image_dir: Path, tmp_path: Path):
    out = tmp_path / "sub.safetensors"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "smg_grpc_proto.cli",
            "preprocess",
            str(image_dir),
            "--family",
            "qwen2_vl",
            "--out",
            str(out),
            "--progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # five images: no bar
    _assert_same(_read(out), _expected(ImageProcessor.for_family("qwen2_vl"), _images(image_dir)))


def test_subprocess_error_has_no_traceback(image_dir: Path, tmp_path: Path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes((image_dir / "a.jpg").read_bytes()[:200])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "smg_grpc_proto.cli",
            "preprocess",
            str(image_dir / "a.jpg"),
            str(bad),
            "--family",
            "qwen2_vl",
            "--out",
            str(tmp_path / "o.npz"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"smg-proto preprocess: error: {bad}: ")
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda d, t: [str(t / "missing.jpg"), "--family", "clip"], "no such file or directory"),
        (lambda d, t: [str(t / "empty"), "--family", "clip"], "holds no image files"),
        (lambda d, t: [str(d / "notes.txt"), "--family", "clip"], "notes.txt: "),
        (lambda d, t: [str(d / "a.jpg"), "--family", "gpt"], "unknown family 'gpt'"),
        (lambda d, t: [str(d / "a.jpg"), "--config", str(t / "nope.json")], "--config"),
        (lambda d, t: [str(d / "a.jpg"), "--config", str(t / "bad.json")], "--config"),
        (lambda d, t: [str(d / "a.jpg"), "--config", str(t / "badval.json")], "patch_size"),
        (lambda d, t: [str(d / "a.jpg"), "--model-dir", str(t / "empty")], "--model-dir"),
        (lambda d, t: [str(d / "a.jpg"), "--family", "clip", "--threads", "0"], "--threads"),
        (
            lambda d, t: [str(d / "a.jpg"), str(t / "wide.png"), "--family", "qwen2_vl"],
            "wide.png: absolute aspect ratio must be smaller than 200",
        ),
    ],
)
def test_input_errors(image_dir, tmp_path, capsys, make_args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "badval.json").write_text(
        json.dumps({"image_processor_type": "Qwen2VLImageProcessor", "patch_size": -1})
    )
    Image.fromarray(np.zeros((1, 300, 3), np.uint8)).save(tmp_path / "wide.png")  # 300:1
    out = tmp_path / "out.npz"
    code = cli.main(["preprocess", *make_args(image_dir, tmp_path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("smg-proto preprocess: error: ") or err.startswith("usage:"), err
    assert message in err
    assert "Traceback" not in err
    assert not out.exists()


def test_usage_errors(image_dir, tmp_path, capsys):
    a = str(image_dir / "a.jpg")
    out = str(tmp_path / "o.npz")
    assert cli.main(["preprocess", a, "--out", out]) == 2  # no source
    assert cli.main(["preprocess", a, "--family", "clip", "--config", "x", "--out", out]) == 2
    assert cli.main(["preprocess", a, "--family", "clip"]) == 2  # no --out
    assert cli.main(["preprocess", a, "--family", "clip", "--out", out, "--format", "h5"]) == 2
    missing_dir = str(tmp_path / "nowhere" / "o.npz")
    assert cli.main(["preprocess", a, "--family", "clip", "--out", missing_dir]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_writer_roundtrip_dtypes(tmp_path: Path):
    tensors = {
        "f32": np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4),
        "f64": np.array([np.pi], dtype=np.float64),
        "f16": np.array([[1.5, -2]], dtype=np.float16),
        "i64": np.array([[1, 2, 3]], dtype=np.int64),
        "i32": np.array([-7], dtype=np.int32),
        "u8": np.arange(5, dtype=np.uint8),
        "b": np.array([True, False]),
        "big_endian": np.arange(3, dtype=">i4"),
        "strided": np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],
        "empty": np.zeros((0, 4), np.float32),
        "scalar": np.array(3.0, np.float32),
    }
    path = tmp_path / "t.safetensors"
    write_safetensors(path, tensors, {"k": "v"})
    ours, meta = read_safetensors(path)
    assert meta == {"k": "v"}
    for name, want in tensors.items():
        np.testing.assert_array_equal(ours[name], want)
        assert ours[name].dtype == want.dtype.newbyteorder("="), name
    if st_load_file is not None:
        for name, got in st_load_file(str(path)).items():
            np.testing.assert_array_equal(got, tensors[name])
    with pytest.raises(TypeError, match="no safetensors name"):
        write_safetensors(tmp_path / "c.safetensors", {"c": np.array([1j])})
    assert not (tmp_path / "c.safetensors").exists()
    with pytest.raises(ValueError, match="unknown format"):
        write_tensors(tmp_path / "x", tensors, "h5")  # type: ignore[arg-type]
    assert [p.name for p in tmp_path.iterdir()] == ["t.safetensors"]  # no temporary files left


def test_module_entry_point_help():
    result = subprocess.run(
        [sys.executable, "-m", "smg_grpc_proto.cli", "preprocess", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert result.returncode == 0
    assert "--model-dir" in result.stdout
    assert "--progress" in result.stdout


def test_cli_choices_mirror_the_library():
    from smg_grpc_proto.vision._config import FAMILIES
    from smg_grpc_proto.vision._export import FORMATS

    assert cli.PREPROCESS_FAMILIES == FAMILIES
    assert cli.EXPORT_FORMATS == FORMATS


def test_compat_does_not_load_vision():
    code = "import sys, smg_grpc_proto.cli; print('smg_grpc_proto.vision' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_safetensors_package_missing_is_a_usage_error(image_dir: Path, tmp_path: Path):
    """Without the optional safetensors package: exit 2 with the install hint, before any image
    is processed; npz still works."""
    code = (
        "import sys; sys.modules['safetensors'] = None; sys.modules['safetensors.numpy'] = None\n"
        "from smg_grpc_proto import cli\n"
        f"sys.exit(cli.main(['preprocess', {str(image_dir)!r}, '--family', 'qwen2_vl', "
        "'--out', sys.argv[1]]))"
    )
    out = tmp_path / "x.safetensors"
    run = subprocess.run(
        [sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2, run.stderr
    assert "pip install 'smg-grpc-proto[safetensors]'" in run.stderr
    assert "--format npz" in run.stderr
    assert not out.exists()
    npz = tmp_path / "x.npz"
    run = subprocess.run(
        [sys.executable, "-c", code, str(npz)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert npz.exists()
