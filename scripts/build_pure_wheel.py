#!/usr/bin/env python3
"""Build the pure-Python wheel (``py3-none-any``): the package without its native core.

    python scripts/build_pure_wheel.py --out dist                  # from this repository
    python scripts/build_pure_wheel.py --source unpacked-sdist --out dist

The wheel holds everything the native wheel holds except the extension module
(``smg_grpc_proto/_native.*.so``/``.pyd``): the stubs, the dataclasses, the numpy tensor codec,
shared memory, the engine builders and decoders, compat and the CLI. Vision calls raise
``NativeCoreUnavailableError`` there (see ``smg_grpc_proto/_core.py``).

It is always built from an sdist: ``--source`` is an unpacked sdist (its ``PKG-INFO`` is the
wheel's ``METADATA``, byte for byte, as in the wheel maturin builds from it); without
``--source``, ``maturin sdist`` makes one from this repository first. So both wheels carry the
same metadata (version, Requires-Dist, extras) by construction: maturin writes it once.

The wheel is written directly as a zip (the wheel format, PEP 427 / the binary distribution
format spec): the package files, then ``*.dist-info/`` with ``METADATA``, ``WHEEL``
(``Root-Is-Purelib: true``, ``Tag: py3-none-any``), ``entry_points.txt`` (from
``[project.scripts]``) and ``RECORD`` (sha256 and size of every file). Entries are sorted and
dated ``SOURCE_DATE_EPOCH`` (default 1980-01-01), so the same sources give the same bytes.
docs/release.md says why this is not a second build backend.
"""

from __future__ import annotations

import argparse
import base64
import email
import email.policy
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project's Python floor
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
TAG = "py3-none-any"
GENERATOR = "smg-grpc-proto build_pure_wheel.py"
# Build outputs that never go into a wheel; the extension module is what makes a wheel native.
_EXCLUDED_DIRS = {"__pycache__"}
_EXCLUDED = re.compile(r".*\.(pyc|pyo)$")
_NATIVE = re.compile(r"_native\.[\w.-]*\.(so|pyd)$|_native\.(so|pyd)$")


class PureWheelError(Exception):
    """The source tree cannot make a pure wheel; the message says why."""


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _date_time() -> tuple[int, int, int, int, int, int]:
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))  # 1980-01-01, zip's first day
    return time.gmtime(max(epoch, 315532800))[:6]


def distribution_name(name: str) -> str:
    """The wheel file name's distribution part (PEP 427 escaping of a normalised name)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def package_files(source: Path) -> dict[str, bytes]:
    """The package's files (wheel path -> content), the native extension excluded."""
    pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    maturin = pyproject.get("tool", {}).get("maturin", {})
    python_source = source / maturin.get("python-source", ".")
    package = maturin.get("module-name", "").split(".")[0]
    if not package or not (python_source / package / "__init__.py").is_file():
        raise PureWheelError(f"no Python package {package!r} under {python_source}")
    files = {}
    for path in sorted((python_source / package).rglob("*")):
        rel = path.relative_to(python_source)
        if not path.is_file() or _EXCLUDED_DIRS & set(rel.parts) or _EXCLUDED.fullmatch(path.name):
            continue
        if _NATIVE.fullmatch(path.name):
            continue
        files[rel.as_posix()] = path.read_bytes()
    return files


def entry_points(pyproject: dict[str, object]) -> bytes | None:
    """``entry_points.txt`` for ``[project.scripts]`` / ``[project.gui-scripts]`` (as maturin)."""
    project = pyproject.get("project", {})
    assert isinstance(project, dict)
    sections = []
    for key, group in (("scripts", "console_scripts"), ("gui-scripts", "gui_scripts")):
        scripts = project.get(key) or {}
        if scripts:
            lines = [f"{name}={target}" for name, target in sorted(scripts.items())]
            sections.append(f"[{group}]\n" + "\n".join(lines) + "\n")
    return "\n".join(sections).encode() if sections else None


def build_from_sdist_tree(source: Path, out: Path) -> Path:
    """Write the pure wheel of the unpacked sdist ``source`` into ``out``; return its path."""
    pkg_info = source / "PKG-INFO"
    if not pkg_info.is_file():
        raise PureWheelError(f"{source} is not an unpacked sdist (no PKG-INFO)")
    metadata = pkg_info.read_bytes()
    meta = email.message_from_bytes(metadata, policy=email.policy.compat32)
    name, version = meta["Name"], meta["Version"]
    if not name or not version:
        raise PureWheelError(f"{pkg_info} has no Name or Version")
    pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    dist = distribution_name(name)
    info = f"{dist}-{version}.dist-info"
    files = package_files(source)
    files[f"{info}/METADATA"] = metadata
    files[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: true\nTag: {TAG}\n"
    ).encode()
    scripts = entry_points(pyproject)
    if scripts is not None:
        files[f"{info}/entry_points.txt"] = scripts
    record = [f"{path},{_record_hash(data)},{len(data)}" for path, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()

    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{dist}-{version}-{TAG}.whl"
    stamp = _date_time()
    # The package first, then the .dist-info folder with RECORD last (the spec's recommendation).
    order = sorted(p for p in files if not p.startswith(info + "/")) + [
        p for p in files if p.startswith(info + "/")
    ]
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in order:
            entry = zipfile.ZipInfo(path, date_time=stamp)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(entry, files[path])
    return wheel


def make_sdist(repo: Path, out: Path) -> Path:
    """``maturin sdist`` of ``repo`` into ``out`` (no compilation: a second or so)."""
    result = subprocess.run(
        [sys.executable, "-m", "maturin", "sdist", "--out", str(out)],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise PureWheelError(f"maturin sdist failed:\n{result.stdout}{result.stderr}")
    (sdist,) = out.glob("*.tar.gz")
    return sdist


def build(out: Path, *, source: Path | None = None, repo: Path = ROOT) -> Path:
    """The pure wheel of the unpacked sdist ``source``, or of a fresh sdist of ``repo``."""
    if source is not None:
        return build_from_sdist_tree(source, out)
    with tempfile.TemporaryDirectory(prefix="smg-pure-") as tmp:
        sdist = make_sdist(repo, Path(tmp) / "sdist")
        with tarfile.open(sdist) as tar:
            tar.extractall(Path(tmp) / "unpacked", filter="data")
        (tree,) = (Path(tmp) / "unpacked").iterdir()
        return build_from_sdist_tree(tree, out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the wheel")
    parser.add_argument("--source", type=Path, help="an unpacked sdist (default: sdist of --repo)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="repository (default: this one)")
    args = parser.parse_args(argv)
    try:
        wheel = build(args.out, source=args.source, repo=args.repo)
    except PureWheelError as error:
        print(f"build_pure_wheel: error: {error}", file=sys.stderr)
        return 1
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
