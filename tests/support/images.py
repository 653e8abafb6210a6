"""Test images from public packages, fetched once with pip and cached under ``.cache/``.

- Pillow 13.0.0's sdist holds ``Tests/images/`` (about 1 000 files: every mode and format edge case
  Pillow tests); the wheels hold none. ``pip download --no-deps --no-binary pillow pillow==13.0.0``
  fetches the 47 MB tarball without building it.
- matplotlib 3.11.2's wheel holds ``mpl-data/sample_data/grace_hopper.jpg`` (512 x 600 baseline
  4:2:0 JPEG); only that one member is extracted, matplotlib is not installed.

Every fetch goes through a temporary folder and an atomic rename, so concurrent test sessions
never see half-written files. When the package index cannot be reached the tests that need the
images are skipped (``pytest.skip``), never failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SMG_TEST_CACHE", ROOT / ".cache"))

PILLOW_VERSION = "13.0.0"
MATPLOTLIB_VERSION = "3.11.2"
SKIMAGE_VERSION = "0.26.0"

# Real photographs (camera or microscope/telescope captures, no drawings or test patterns):
# Pillow 13.0.0's Tests/images (its sdist) ...
PILLOW_PHOTOS = (
    "flower.jpg",
    "flower2.jpg",
    "sugarshack_bad_mpo_header.jpg",
    "xmp_test.jpg",
    "icc_profile_big.jpg",
    "junk_jpeg_header.jpg",
    "exif_gps_typeerror.jpg",
    "exif-72dpi-int.jpg",
    "app13-multiple.jpg",
    "iptc.jpg",
    "hopper.jpg",
    "xmp_tags_orientation.png",
)
# ... and scikit-image 0.26.0's bundled skimage/data (its wheel; licences in its data README:
# public domain or CC0 / CC-BY for these).
SKIMAGE_PHOTOS = (
    "astronaut.png",
    "brick.png",
    "camera.png",
    "cell.png",
    "chelsea.png",
    "clock_motion.png",
    "coffee.png",
    "coins.png",
    "grass.png",
    "gravel.png",
    "hubble_deep_field.jpg",
    "ihc.png",
    "moon.png",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "retina.jpg",
    "rocket.jpg",
    "page.png",
    "text.png",
)


def _pip_download(spec: str, dest: Path, *, sdist: bool) -> Path:
    """``pip download`` one distribution into ``dest`` (atomically); returns the file."""
    name = spec.split("==")[0]
    existing = sorted(dest.glob(f"{name}-*")) if dest.is_dir() else []
    if existing:
        return existing[0]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, spec]
        if sdist:
            # Only this distribution as an sdist; its build requirements may come as wheels
            # (":all:" would build setuptools, cmake, ... from source just to read metadata).
            cmd[5:5] = ["--no-binary", name]
        result = subprocess.run(cmd, timeout=900, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"cannot download {spec}:\n{result.stderr[-2000:]}")
        (fetched,) = Path(tmp).iterdir()
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / fetched.name
        if not target.exists():
            os.replace(fetched, target)
        return target


def pillow_test_images() -> Path:
    """The ``Tests/images`` folder of the Pillow 13.0.0 sdist."""
    out = CACHE / f"pillow-{PILLOW_VERSION}-test-images"
    if out.is_dir():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / "pillow-sdist" / f"pillow-{PILLOW_VERSION}.tar.gz"
    if not tarball.exists():
        tarball = _pip_download(f"pillow=={PILLOW_VERSION}", CACHE / "pillow-sdist", sdist=True)
    prefix = f"pillow-{PILLOW_VERSION}/Tests/images/"
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp, tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
        for member in members:
            target = Path(tmp) / member.name[len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            with source, open(target, "wb") as f:
                shutil.copyfileobj(source, f)
        try:
            os.rename(tmp, out)
        except OSError:
            if not out.is_dir():  # lost a race with another session: theirs is as good
                raise
        os.makedirs(tmp, exist_ok=True)  # TemporaryDirectory wants to delete it
    return out


def grace_hopper() -> bytes:
    """``grace_hopper.jpg`` from the matplotlib 3.11.2 wheel."""
    out = CACHE / "test-images" / "grace_hopper.jpg"
    if not out.exists():
        wheel = _pip_download(
            f"matplotlib=={MATPLOTLIB_VERSION}", CACHE / "matplotlib-wheel", sdist=False
        )
        with zipfile.ZipFile(wheel) as zf:
            (name,) = [n for n in zf.namelist() if n.endswith("sample_data/grace_hopper.jpg")]
            data = zf.read(name)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out)
    return out.read_bytes()


def real_photos() -> dict[str, Path]:
    """Every real photograph of the parity corpus by name (32: Grace Hopper, 12 of Pillow's
    test images, 19 of scikit-image's data), as files in the cache; downloaded once."""
    out = CACHE / f"real-photos-skimage-{SKIMAGE_VERSION}"
    if not out.is_dir():
        wheel = _pip_download(
            f"scikit-image=={SKIMAGE_VERSION}", CACHE / "skimage-wheel", sdist=False
        )
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp, zipfile.ZipFile(wheel) as zf:
            for name in SKIMAGE_PHOTOS:
                (Path(tmp) / name).write_bytes(zf.read(f"skimage/data/{name}"))
            try:
                os.rename(tmp, out)
            except OSError:
                if not out.is_dir():
                    raise
            os.makedirs(tmp, exist_ok=True)
    grace = CACHE / "test-images" / "grace_hopper.jpg"
    grace_hopper()
    pillow = pillow_test_images()
    photos = {"grace_hopper.jpg": grace}
    photos.update({name: pillow / name for name in PILLOW_PHOTOS})
    photos.update({name: out / name for name in SKIMAGE_PHOTOS})
    return photos
