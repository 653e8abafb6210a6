#!/usr/bin/env python3
"""Cut a release whose version follows the schema diff. Dry run unless ``--execute``.

    python scripts/release.py                       # dry run: the required bump, all checks
    python scripts/release.py --bump major          # dry run of a chosen bump
    python scripts/release.py --execute --repository-url https://upload.pypi.org/legacy/

Steps (all of them run in a dry run too, on a temporary copy of the repository):

1. compare ``protos/`` with the latest snapshot in ``protos/releases/`` at level ``wire``: a wire
   break requires a major release, additions a minor one, anything else a patch; a smaller
   ``--bump`` or ``--version`` than required is refused;
2. set the new version in pyproject.toml, rust/Cargo.toml, rust/Cargo.lock and
   src/smg_grpc_proto/_version.py;
3. move the changelog's Unreleased notes under ``## [X.Y.Z] - YYYY-MM-DD`` (an empty Unreleased
   section is refused);
4. write the snapshot ``protos/releases/X.Y.Z.binpb`` (a copy of the generated descriptors.binpb);
5. build the sdist with maturin, then from the unpacked sdist the native abi3 wheel (maturin
   with zig as the C compiler and linker, against glibc 2.28: ``NATIVE_WHEEL_FLAGS``) and the
   pure-Python wheel (``py3-none-any``, scripts/build_pure_wheel.py: the same files but
   the extension, the same METADATA);
6. check both wheels' contents (the pure one: the native one's files but the extension, its
   METADATA and entry points, tag and RECORD; the native one's platform tags are those the
   "native core unavailable" message names, and ``auditwheel show`` finds it consistent with
   its tag and with glibc 2.28) and run ``twine check --strict`` on all three;
7. check that the wheels' protobuf floor is not below any gencode stamp of their ``_pb2.py``;
8. prove which wheel pip picks where, with ``pip download --platform ... --only-binary=:all:``
   from the three artifacts: the native wheel on its own platform tags, the pure wheel on
   Linux x86_64 below them, Linux aarch64, macOS and Windows;
9. upload the three with twine (``--execute`` only), and with ``--index-url`` (the index's
   simple API) repeat step 8 against the index. Only after a successful upload are the edits of
   steps 2-4 written to the repository and the artifacts copied to ``dist/``.

A dry run writes nothing in the repository except its build cache: the cargo target directory
(``--cargo-target-dir``, default ``.cache/release-target``, git-ignored), kept so that the next
release compiles only this crate. Exit status: 0 on success, 1 when a check fails, 2 on a usage
error.
"""

from __future__ import annotations

import argparse
import ast
import base64
import datetime as dt
import difflib
import email
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from types import ModuleType
from typing import NamedTuple, Protocol

from google.protobuf import descriptor_pb2
from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename
from packaging.version import Version

if __name__ == "__main__":
    sys.dont_write_bytecode = True  # a dry run leaves no trace, not even __pycache__ folders
sys.path.insert(0, str(Path(__file__).resolve().parent))
from snapshot_release import (
    CHANGELOG,
    DESCRIPTORS,
    RELEASES,
    current_snapshot,
    snapshot_path,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "smg_grpc_proto"
BUMPS = ("patch", "minor", "major")
LEVEL = "wire"
SHOW = 20  # findings and additions listed before "... and N more"


class ReleaseError(Exception):
    """A check failed; the message says which and what to do."""


# --- versions ------------------------------------------------------------------------------------


class SemVer(NamedTuple):
    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> SemVer:
        match = re.fullmatch(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)", text)
        if not match:
            raise ReleaseError(f"{text!r} is not a release version X.Y.Z")
        return cls(*(int(part) for part in match.groups()))

    def bump(self, kind: str) -> SemVer:
        if kind == "major":
            return SemVer(self.major + 1, 0, 0)
        if kind == "minor":
            return SemVer(self.major, self.minor + 1, 0)
        return SemVer(self.major, self.minor, self.patch + 1)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def bump_between(old: SemVer, new: SemVer) -> str:
    """The kind of release that goes from ``old`` to ``new`` (a well-formed successor)."""
    if new <= old:
        raise ReleaseError(f"version {new} is not greater than the current {old}")
    for kind in reversed(BUMPS):
        if new == old.bump(kind):
            return kind
    raise ReleaseError(
        f"version {new} does not follow {old}: the next versions are "
        + ", ".join(f"{old.bump(k)} ({k})" for k in reversed(BUMPS))
    )


# --- the schema diff -----------------------------------------------------------------------------


class Finding(Protocol):
    """What ``smg_grpc_proto.compat.check`` reports (only the attributes used here)."""

    rule: str
    file: str
    line: int | None
    column: int | None
    message: str


def format_finding(finding: Finding) -> str:
    where = finding.file
    if finding.line is not None:
        where += f":{finding.line}" + (f":{finding.column}" if finding.column is not None else "")
    return f"{where}: {finding.rule}: {finding.message}"


def _listing(lines: Sequence[str], indent: str = "    ") -> list[str]:
    shown = [indent + line for line in lines[:SHOW]]
    if len(lines) > SHOW:
        shown.append(f"{indent}... and {len(lines) - SHOW} more")
    return shown


@dataclass
class SchemaDiff:
    """The schema against the last release: wire breaks and additions."""

    against: str
    breaking: list[Finding] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    api_notes: list[Finding] = field(default_factory=list)

    @property
    def required(self) -> str:
        if self.breaking:
            return "major"
        if self.added:
            return "minor"
        return "patch"

    def describe(self) -> list[str]:
        lines = [f"against {self.against} (level {LEVEL}):"]
        if self.breaking:
            lines.append(f"  {len(self.breaking)} wire break(s), so a major release:")
            lines += _listing([format_finding(f) for f in self.breaking])
        if self.added:
            lines.append(f"  {len(self.added)} addition(s), so at least a minor release:")
            lines += _listing(self.added)
        if not self.breaking and not self.added:
            lines.append("  no wire break and no addition, so a patch release suffices")
        if self.api_notes:
            lines.append(
                f"  {len(self.api_notes)} source-level change(s) that keep the wire "
                "(generated code may break; consider a major release):"
            )
            lines += _listing([format_finding(f) for f in self.api_notes])
        return lines


def compat_api() -> ModuleType:
    """``smg_grpc_proto.compat`` (the repository's own copy, see ``main``)."""
    try:
        return importlib.import_module(f"{PACKAGE}.compat")
    except ImportError as error:
        raise ReleaseError(f"the schema checker {PACKAGE}.compat is unavailable: {error}") from None


def _where(finding: Finding) -> tuple[str, object, object]:
    """Where a finding points; without source info, its message stands in for the line."""
    if finding.line is None:
        return (finding.file, finding.message, None)
    return (finding.file, finding.line, finding.column)


def diff_schemas(
    current: descriptor_pb2.FileDescriptorSet,
    against: descriptor_pb2.FileDescriptorSet,
    label: str,
) -> SchemaDiff:
    compat = compat_api()
    breaking = list(compat.check(current, against, level=LEVEL))
    # Package-level findings at places the wire findings already point to are the same change.
    seen = {_where(f) for f in breaking}
    package = compat.check(current, against, level="package")
    return SchemaDiff(
        against=label,
        breaking=breaking,
        added=list(compat.additions(current, against)),
        api_notes=[f for f in package if _where(f) not in seen],
    )


def choose_version(
    current: SemVer, diff: SchemaDiff, *, bump: str | None = None, version: str | None = None
) -> tuple[SemVer, str]:
    """The release version and its kind; refuses a smaller bump than the schema diff requires."""
    if version is not None:
        target = SemVer.parse(version)
        kind = bump_between(current, target)
    else:
        kind = bump or diff.required
        target = current.bump(kind)
    if BUMPS.index(kind) < BUMPS.index(diff.required):
        raise ReleaseError(
            "\n".join(
                [
                    f"refusing a {kind} release ({current} -> {target}): "
                    f"the schema diff requires {diff.required}",
                    *diff.describe(),
                ]
            )
        )
    return target, kind


# --- the repository: versions, changelog, snapshots ----------------------------------------------


@dataclass(frozen=True)
class VersionSpot:
    """Where a file states the version: ``pattern`` has groups (before, version, after)."""

    path: Path
    pattern: str

    def _match(self, text: str) -> re.Match[str]:
        matches = list(re.finditer(self.pattern, text, flags=re.MULTILINE))
        if len(matches) != 1:
            raise ReleaseError(f"{self.path}: expected one version, found {len(matches)}")
        return matches[0]

    def read(self, text: str) -> str:
        return self._match(text).group(2)

    def write(self, text: str, version: str) -> str:
        match = self._match(text)
        return text[: match.start(2)] + version + text[match.end(2) :]


_TABLE_BODY = r"(?:(?!\[).*\n)*?"  # the lines of a TOML table up to the key (no new header)
VERSION_SPOTS = (
    VersionSpot(Path("pyproject.toml"), rf'(^\[project\]\n{_TABLE_BODY}version = ")([^"]+)(")'),
    VersionSpot(Path("rust/Cargo.toml"), rf'(^\[package\]\n{_TABLE_BODY}version = ")([^"]+)(")'),
    VersionSpot(
        Path("rust/Cargo.lock"),
        r'(^\[\[package\]\]\nname = "smg-grpc-proto"\nversion = ")([^"]+)(")',
    ),
    VersionSpot(Path(f"src/{PACKAGE}/_version.py"), r'(^__version__ = ")([^"]+)(")'),
)


def current_version(repo: Path) -> SemVer:
    """The version every file agrees on (a disagreement is an error)."""
    found = {str(s.path): s.read((repo / s.path).read_text()) for s in VERSION_SPOTS}
    if len(set(found.values())) != 1:
        raise ReleaseError(
            "the version differs between files: " + ", ".join(f"{p} {v}" for p, v in found.items())
        )
    return SemVer.parse(next(iter(found.values())))


def version_edits(repo: Path, version: SemVer) -> dict[Path, str]:
    return {s.path: s.write((repo / s.path).read_text(), str(version)) for s in VERSION_SPOTS}


_UNRELEASED = re.compile(r"^## \[Unreleased\][^\n]*\n(.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL)


def move_unreleased(text: str, version: SemVer, date: dt.date) -> str:
    """The changelog with its Unreleased notes under a new version heading."""
    if re.search(rf"^## \[{re.escape(str(version))}\]", text, flags=re.MULTILINE):
        raise ReleaseError(f"{CHANGELOG} already has a section for {version}")
    match = _UNRELEASED.search(text)
    if not match:
        raise ReleaseError(f"{CHANGELOG} has no '## [Unreleased]' section")
    notes = match.group(1).strip()
    if not notes:
        raise ReleaseError(
            f"the Unreleased section of {CHANGELOG} is empty: describe the release there first"
        )
    rest = text[match.end() :]
    section = f"## [Unreleased]\n\n## [{version}] - {date.isoformat()}\n\n{notes}\n"
    return text[: match.start()] + section + ("\n" + rest if rest else "")


def latest_snapshot(repo: Path) -> tuple[SemVer, Path]:
    snapshots = []
    for path in (repo / RELEASES).glob("*.binpb"):
        try:
            snapshots.append((SemVer.parse(path.stem), path))
        except ReleaseError:
            continue
    if not snapshots:
        raise ReleaseError(f"no release snapshot <X.Y.Z>.binpb in {repo / RELEASES}")
    return max(snapshots)


def check_generated_in_sync(repo: Path) -> None:
    """The shipped .proto copies equal protos/ (else run scripts/gen_stubs.py)."""
    shipped = repo / "src" / PACKAGE / "proto"
    sources = {p.name: p.read_bytes() for p in (repo / "protos").glob("*.proto")}
    copies = {p.name: p.read_bytes() for p in shipped.glob("*.proto")}
    if sources != copies:
        stale = sorted(n for n in sources.keys() | copies.keys() if sources.get(n) != copies.get(n))
        raise ReleaseError(
            f"{shipped} is stale ({', '.join(stale)}): run `python scripts/gen_stubs.py`"
        )


def load_descriptor_set(path: Path) -> descriptor_pb2.FileDescriptorSet:
    return descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())


def planned_edits(repo: Path, version: SemVer, date: dt.date) -> dict[Path, bytes]:
    """Every file the release writes (repository-relative path -> new content)."""
    snapshot = snapshot_path(repo, str(version)).relative_to(repo)
    if (repo / snapshot).exists():
        raise ReleaseError(f"{snapshot} already exists: version {version} was released")
    edits = {path: text.encode() for path, text in version_edits(repo, version).items()}
    edits[CHANGELOG] = move_unreleased((repo / CHANGELOG).read_text(), version, date).encode()
    edits[snapshot] = current_snapshot(repo)
    return edits


def show_diff(repo: Path, path: Path, new: bytes) -> list[str]:
    old = (repo / path).read_text().splitlines() if (repo / path).exists() else []
    diff = difflib.unified_diff(
        old, new.decode().splitlines(), f"a/{path}", f"b/{path}", lineterm="", n=1
    )
    return ["    " + line for line in diff]


def write_edits(root: Path, edits: dict[Path, bytes]) -> None:
    for path, content in edits.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(content)


# --- staging and building ------------------------------------------------------------------------

_NOT_SOURCES = (
    *(".git", ".cache", "target", "dist", ".venv", "__pycache__", "*.so", "*.pyd"),
    *(".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"),
)


def _git_files(repo: Path) -> list[str] | None:
    """Tracked and untracked-but-not-ignored files, or None outside a git work tree."""
    if not (repo / ".git").exists() or shutil.which("git") is None:
        return None
    result = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        return None
    return [name for name in result.stdout.decode().split("\0") if name]


def stage(repo: Path, dest: Path) -> None:
    """Copy the repository's sources (no build outputs, caches or VCS data) to ``dest``."""
    names = _git_files(repo)
    if names is None:
        shutil.copytree(repo, dest, ignore=shutil.ignore_patterns(*_NOT_SOURCES), symlinks=True)
        return
    for name in names:
        source = repo / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def run(cmd: Sequence[str], *, cwd: Path, env: dict[str, str] | None = None, what: str) -> str:
    result = subprocess.run(
        list(cmd), cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip().splitlines()
        raise ReleaseError(f"{what} failed (exit {result.returncode}):\n" + "\n".join(output[-40:]))
    return result.stdout


def _single(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    if len(found) != 1:
        raise ReleaseError(f"expected one {pattern} in {directory}, found {len(found)}")
    return found[0]


def _touch_all(root: Path) -> None:
    """Give every source a fresh mtime, so that cargo recompiles our crate.

    cargo names a cdylib without a hash, so builds of other versions or features in the same
    target directory overwrite it, while the fingerprint of this version can still look fresh;
    cargo would then hand maturin a stale library. New mtimes make the fingerprint stale.
    """
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path)


#: maturin's flags for the native wheel: zig compiles the bundled C libraries (through the cc
#: and cmake wrappers maturin hands their build scripts) and links the extension against glibc
#: 2.28's symbol versions, so that one wheel serves RHEL 8 and every newer Linux x86_64. The
#: sdist does not set them: ``pip install`` from source links against the builder's own glibc.
NATIVE_WHEEL_FLAGS = ("--zig", "--compatibility", "manylinux_2_28")
#: The newest glibc the native wheel may need (auditwheel's verdict, step 6).
NATIVE_GLIBC = (2, 28)


def native_wheel_env(target_dir: Path) -> dict[str, str]:
    """The environment of the native build: maturin runs ``python -m ziglang`` (the ``ziglang``
    package of the test dependency group) with this interpreter, not the first python3 on PATH."""
    return dict(
        os.environ, CARGO_TARGET_DIR=str(target_dir), CARGO_ZIGBUILD_PYTHON_PATH=sys.executable
    )


class Artifacts(NamedTuple):
    sdist: Path
    wheel: Path
    """The native (abi3) wheel."""
    pure: Path
    """The pure-Python (``py3-none-any``) wheel."""


def build(staging: Path, dist: Path, target_dir: Path) -> Artifacts:
    """The sdist of ``staging``, then both wheels built from that sdist (proving it complete)."""
    env = native_wheel_env(target_dir)
    maturin = [sys.executable, "-m", "maturin"]
    run([*maturin, "sdist", "--out", str(dist)], cwd=staging, env=env, what="maturin sdist")
    sdist = _single(dist, "*.tar.gz")
    unpacked = staging.parent / "sdist"
    with tarfile.open(sdist) as tar:
        tar.extractall(unpacked, filter="data")
    (source,) = unpacked.iterdir()
    _touch_all(source)
    run(
        [*maturin, "build", "--release", "--quiet", *NATIVE_WHEEL_FLAGS, "--out", str(dist)],
        cwd=source,
        env=env,
        what="maturin build (wheel from the sdist)",
    )
    wheel = _single(dist, "*.whl")
    pure_builder = source / "scripts" / "build_pure_wheel.py"
    run(
        [sys.executable, str(pure_builder), "--source", str(source), "--out", str(dist)],
        cwd=source,
        what="build_pure_wheel.py (pure wheel from the sdist)",
    )
    return Artifacts(sdist, wheel, _single(dist, f"*-{PURE_TAG}.whl"))


# --- checks on the artifacts ---------------------------------------------------------------------

STUB_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
_NATIVE = re.compile(rf"{PACKAGE}/_native\.[\w.-]*\.(so|pyd)")


def expected_wheel_files(stems: Sequence[str]) -> set[str]:
    names = {
        f"{PACKAGE}/py.typed",
        f"{PACKAGE}/_version.py",
        f"{PACKAGE}/proto/descriptors.binpb",
        f"{PACKAGE}/dataclasses/__init__.py",
        f"{PACKAGE}/dataclasses/py.typed",
    }
    for stem in stems:
        names.add(f"{PACKAGE}/proto/{stem}.proto")
        names.update(f"{PACKAGE}/generated/{stem}{suffix}" for suffix in STUB_SUFFIXES)
    return names


def wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(zf.read(name))


def check_wheel_contents(wheel: Path, stems: Sequence[str], version: SemVer) -> list[str]:
    """Problems with the wheel's file list, tag, metadata and stated version."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        version_py = (
            zf.read(f"{PACKAGE}/_version.py").decode() if f"{PACKAGE}/_version.py" in names else ""
        )
    problems = [f"missing {name}" for name in sorted(expected_wheel_files(stems) - names)]
    if not any(_NATIVE.fullmatch(n) for n in names):
        problems.append(f"missing the native extension {PACKAGE}/_native.*.so")
    if "-abi3-" not in wheel.name:
        problems.append(f"{wheel.name} is not an abi3 wheel")
    problems += [
        f"stray build file {n}" for n in sorted(names) if "__pycache__" in n or n.endswith(".pyc")
    ]
    if wheel_metadata(wheel)["Version"] != str(version):
        problems.append(f"METADATA Version {wheel_metadata(wheel)['Version']} != {version}")
    if f'__version__ = "{version}"' not in version_py:
        problems.append(f"{PACKAGE}/_version.py does not say {version}")
    return problems


PURE_TAG = "py3-none-any"


def _zip_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist() if not name.endswith("/")}


def _dist_info(files: dict[str, bytes], name: str) -> bytes | None:
    found = [data for path, data in files.items() if path.endswith(f".dist-info/{name}")]
    return found[0] if len(found) == 1 else None


def _package_files(files: dict[str, bytes]) -> dict[str, bytes]:
    return {path: data for path, data in files.items() if ".dist-info/" not in path}


def _record_problems(files: dict[str, bytes]) -> list[str]:
    """RECORD must list every file of the wheel once, with its sha256 and size."""
    record = _dist_info(files, "RECORD")
    if record is None:
        return ["no .dist-info/RECORD"]
    rows = {}
    for line in record.decode().splitlines():
        path, digest, size = line.rsplit(",", 2)
        rows[path] = (digest, size)
    problems = [f"RECORD does not list {n}" for n in sorted(files.keys() - rows.keys())]
    problems += [
        f"RECORD lists {n}, which is not in the wheel" for n in sorted(rows - files.keys())
    ]
    for path, (digest, size) in sorted(rows.items()):
        if path.endswith(".dist-info/RECORD") or path not in files:
            continue
        data = files[path]
        want = hashlib.sha256(data).digest()
        if digest != "sha256=" + base64.urlsafe_b64encode(want).rstrip(b"=").decode():
            problems.append(f"RECORD: wrong hash for {path}")
        if size != str(len(data)):
            problems.append(f"RECORD: wrong size for {path}")
    return problems


def check_pure_wheel(pure: Path, native: Path) -> list[str]:
    """The pure wheel is the native one without the extension: same package files (byte for
    byte), METADATA and entry points; tagged ``py3-none-any``; a complete RECORD."""
    problems = []
    if not pure.name.endswith(f"-{PURE_TAG}.whl"):
        problems.append(f"{pure.name} is not tagged {PURE_TAG}")
    files, native_files = _zip_files(pure), _zip_files(native)
    wheel_file = (_dist_info(files, "WHEEL") or b"").decode()
    for line in ("Root-Is-Purelib: true", f"Tag: {PURE_TAG}"):
        if line not in wheel_file.splitlines():
            problems.append(f"its WHEEL file does not say {line!r}")
    ours, theirs = _package_files(files), _package_files(native_files)
    extension = {n for n in theirs if _NATIVE.fullmatch(n)}
    problems += [f"holds the extension {n}" for n in sorted(ours) if _NATIVE.fullmatch(n)]
    problems += [f"missing {n}" for n in sorted(theirs.keys() - ours.keys() - extension)]
    problems += [
        f"{n} is not in the native wheel"
        for n in sorted(ours.keys() - theirs.keys())
        if not _NATIVE.fullmatch(n)
    ]
    problems += [
        f"{n} differs from the native wheel's"
        for n in sorted(ours.keys() & theirs.keys())
        if ours[n] != theirs[n] and not _NATIVE.fullmatch(n)
    ]
    for name in ("METADATA", "entry_points.txt"):
        if _dist_info(files, name) != _dist_info(native_files, name):
            problems.append(f".dist-info/{name} differs from the native wheel's")
    problems += _record_problems(files)
    return [f"pure wheel: {problem}" for problem in problems]


def native_core_tags(staging: Path) -> tuple[str, ...]:
    """``NATIVE_WHEEL_TAGS`` of the staged ``_core.py``: the platforms the error message of a pure
    installation names."""
    path = staging / "src" / PACKAGE / "_core.py"
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "NATIVE_WHEEL_TAGS":
            assert node.value is not None  # type: ignore[union-attr]
            return tuple(ast.literal_eval(node.value))  # type: ignore[union-attr]
    raise ReleaseError(f"{path} defines no NATIVE_WHEEL_TAGS")


def wheel_platforms(wheel: Path) -> set[str]:
    _, _, _, tags = parse_wheel_filename(wheel.name)
    return {tag.platform for tag in tags}


def check_native_platforms(wheel: Path, named: Sequence[str]) -> list[str]:
    """The native wheel's platform tags are all named by NATIVE_WHEEL_TAGS."""
    return [
        f"{wheel.name} is tagged {platform}, which NATIVE_WHEEL_TAGS in src/{PACKAGE}/_core.py "
        f"({', '.join(named)}) does not name: update it (and its message) for this release"
        for platform in sorted(wheel_platforms(wheel) - set(named))
    ]


_AUDITWHEEL_TAG = re.compile(r'consistent with the following platform tag: "([^"]+)"')


def auditwheel_platform(wheel: Path) -> str:
    """The most compatible platform tag ``auditwheel show`` finds the wheel consistent with
    (from the symbol versions its extension needs)."""
    out = run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)],
        cwd=wheel.parent,
        what="auditwheel show",
    )
    match = _AUDITWHEEL_TAG.search(" ".join(out.split()))
    if match is None:
        raise ReleaseError(f"auditwheel show names no platform tag for {wheel.name}:\n{out}")
    return match.group(1)


def check_auditwheel(wheel: Path, audited: str) -> list[str]:
    """The wheel's tags promise no older glibc than auditwheel's verdict ``audited`` needs, and
    that verdict is glibc 2.28 or older."""
    problems = [
        f"{wheel.name} is tagged {platform}, but auditwheel show finds it needs {audited}"
        for platform in sorted(wheel_platforms(wheel))
        if not accepts(platform, audited)
    ]
    glibc = _manylinux(audited)
    if glibc is None or glibc[:2] > NATIVE_GLIBC:
        floor = "manylinux_{}_{}".format(*NATIVE_GLIBC)
        problems.append(
            f"auditwheel show: {wheel.name} is consistent with {audited} only, not {floor} "
            "or older: was it built without zig (NATIVE_WHEEL_FLAGS)?"
        )
    return problems


# Loads the extension by path, in an isolated interpreter: nothing else of any installed copy.
_PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("smg_grpc_proto._native", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(module.build_info()))
"""


def native_build_info(wheel: Path) -> dict[str, object]:
    """``build_info()`` of the wheel's extension, loaded by this interpreter from the wheel."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if _NATIVE.fullmatch(n)]
        if len(names) != 1:
            raise ReleaseError(f"loading _native failed: {len(names)} extension files in the wheel")
        with tempfile.TemporaryDirectory(prefix="smg-wheel-") as tmp:
            path = Path(zf.extract(names[0], tmp))
            cmd = [sys.executable, "-I", "-S", "-c", _PROBE, str(path)]
            out = run(cmd, cwd=Path(tmp), what="loading _native")
    info: dict[str, object] = json.loads(out)
    return info


def check_native(wheel: Path, version: SemVer) -> list[str]:
    """The extension loads and was built, in release mode, from this version's crate."""
    try:
        info = native_build_info(wheel)
    except ReleaseError as error:
        return [str(error)]
    problems = []
    if info.get("version") != str(version):
        problems.append(f"_native reports version {info.get('version')}, not {version}")
    if info.get("profile") != "release":
        problems.append(f"_native was built with profile {info.get('profile')}, not release")
    return problems


# --- which wheel pip picks where ----------------------------------------------------------------

# Systems besides the native wheel's own tags: a newer glibc (must get the native wheel too), an
# older one than the native wheel needs, and systems no native wheel is built for (the pure
# wheel).
FOREIGN_PLATFORMS = (
    "manylinux_2_34_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux2014_x86_64",
    "manylinux2014_aarch64",
    "macosx_14_0_arm64",
    "macosx_13_0_x86_64",
    "win_amd64",
)
RESOLUTION_PYTHONS = ("3.10", "3.13")  # the floor, and the newest the classifiers name
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def _manylinux(platform: str) -> tuple[int, int, str] | None:
    """(glibc major, minor, arch) of a manylinux platform tag, else None."""
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if match:
        return int(match.group(1)), int(match.group(2)), match.group(3)
    match = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", platform)
    if match:
        return (*_LEGACY_MANYLINUX[match.group(1)], match.group(2))
    return None


def accepts(system: str, wheel_platform: str) -> bool:
    """Whether a system of platform tag ``system`` installs a wheel tagged ``wheel_platform``
    (manylinux: same architecture, the wheel's glibc no newer than the system's)."""
    if system == wheel_platform:
        return True
    ours, theirs = _manylinux(system), _manylinux(wheel_platform)
    return ours is not None and theirs is not None and ours[2] == theirs[2] and theirs <= ours


def resolution_plan(native_platforms: set[str]) -> list[tuple[str, str]]:
    """(target platform, ``"native"`` or ``"pure"``): the wheel each target must get."""
    targets = sorted(native_platforms) + [p for p in FOREIGN_PLATFORMS if p not in native_platforms]
    return [
        (target, "native" if any(accepts(target, n) for n in native_platforms) else "pure")
        for target in targets
    ]


_LEGACY_ALIAS = {minor: name for name, (_, minor) in _LEGACY_MANYLINUX.items()}


def system_platforms(platform: str) -> list[str]:
    """The platform tags pip accepts on a system of tag ``platform``, most specific first: for
    manylinux, every glibc 2.x from the system's down to 2.5 (and the legacy aliases), as pip does
    on a real system; ``pip --platform manylinux_2_34_x86_64`` alone takes that tag only."""
    glibc = _manylinux(platform)
    if glibc is None:
        return [platform]
    major, minor, arch = glibc
    if major != 2:
        return [platform]
    tags = []
    for m in range(minor, 4, -1):
        tags.append(f"manylinux_2_{m}_{arch}")
        if m in _LEGACY_ALIAS:
            tags.append(f"{_LEGACY_ALIAS[m]}_{arch}")
    return tags


def pip_download(source: Sequence[str], platform: str, python: str, version: str) -> str:
    """The file name of the wheel ``pip download`` picks for that platform and Python."""
    with tempfile.TemporaryDirectory(prefix="smg-resolve-") as tmp:
        cmd = [sys.executable, "-m", "pip", "--isolated", "download", "--quiet", "--no-deps"]
        cmd += ["--only-binary=:all:", "--python-version", python]
        for tag in system_platforms(platform):
            cmd += ["--platform", tag]
        cmd += ["--implementation", "cp", "--dest", tmp, *source, f"smg-grpc-proto=={version}"]
        run(cmd, cwd=Path(tmp), what=f"pip download --platform {platform}")
        return _single(Path(tmp), "*.whl").name


def check_resolution(source: Sequence[str], version: SemVer, artifacts: Artifacts) -> list[str]:
    """Which wheel pip picks on each platform of the plan, from ``source`` (pip's arguments
    naming the index or folder); the lines to show. Raises ReleaseError on a wrong pick."""
    wanted = {"native": artifacts.wheel.name, "pure": artifacts.pure.name}
    lines, problems = [], []
    for platform, kind in resolution_plan(wheel_platforms(artifacts.wheel)):
        for python in RESOLUTION_PYTHONS:
            try:
                got = pip_download(source, platform, python, str(version))
            except ReleaseError as error:
                problems.append(f"{platform}, CPython {python}: {error}")
                continue
            if got != wanted[kind]:
                problems.append(
                    f"{platform}, CPython {python}: pip picked {got}, not the {kind} wheel"
                )
        lines.append(f"{platform} (CPython {', '.join(RESOLUTION_PYTHONS)}): the {kind} wheel")
    if problems:
        raise ReleaseError("wheel resolution check failed:\n" + "\n".join(_listing(problems)))
    return lines


def protobuf_floor(metadata: Message) -> Version | None:
    """The lowest protobuf the wheel admits (its ``>=``/``==``/``~=`` bound), if any."""
    floors = []
    for line in metadata.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.name.lower() != "protobuf" or req.marker is not None:
            continue
        floors += [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    return max(floors) if floors else None


def gencode_stamps(source: str) -> list[Version]:
    """The protobuf versions a generated ``_pb2.py`` says it was made for."""
    stamps = [
        Version(v) for v in re.findall(r"^# Protobuf Python Version: (\S+)$", source, re.MULTILINE)
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == (
            "ValidateProtobufRuntimeVersion"
        ):
            major, minor, patch = (getattr(arg, "value", None) for arg in node.args[1:4])
            stamps.append(Version(f"{major}.{minor}.{patch}"))
    return stamps


def check_protobuf_floor(wheel: Path) -> tuple[Version | None, set[Version], list[str]]:
    floor = protobuf_floor(wheel_metadata(wheel))
    stamps: set[Version] = set()
    problems = []
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            if not name.endswith("_pb2.py"):
                continue
            found = gencode_stamps(zf.read(name).decode())
            if not found:
                problems.append(f"{name}: no gencode stamp")
            stamps.update(found)
            if floor is not None:
                problems += [
                    f"{name}: gencode {s} is above the declared floor protobuf>={floor}"
                    for s in found
                    if s > floor
                ]
    if floor is None:
        problems.insert(0, "METADATA declares no protobuf>= floor")
    return floor, stamps, problems


def twine(args: Sequence[str], *, env: dict[str, str] | None = None, what: str) -> str:
    return run(
        [sys.executable, "-m", "twine", "--no-color", *args], cwd=Path.cwd(), env=env, what=what
    )


def upload(files: Sequence[Path], url: str, username: str | None, password: str | None) -> None:
    env = dict(os.environ)
    if username is not None:
        env["TWINE_USERNAME"] = username
    if password is not None:
        env["TWINE_PASSWORD"] = password
    twine(
        ["upload", "--non-interactive", "--disable-progress-bar", "--repository-url", url]
        + [str(f) for f in files],
        env=env,
        what="twine upload",
    )


def publish_dist(repo: Path, files: Sequence[Path]) -> Path:
    dist = repo / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir()
    for path in files:
        shutil.copy2(path, dist / path.name)
    return dist


# --- the steps -----------------------------------------------------------------------------------


def say(text: str = "") -> None:
    print(text, flush=True)


STEPS = 9


def step(number: int, text: str) -> None:
    say(f"[{number}/{STEPS}] {text}")


def step_compat(repo: Path, bump: str | None, version: str | None) -> SemVer:
    current = current_version(repo)
    snap_version, snap = latest_snapshot(repo)
    if snap_version != current:
        raise ReleaseError(
            f"the latest snapshot is {snap.name} but the project is at {current}: "
            "versions and snapshots are only ever changed together, by this script"
        )
    check_generated_in_sync(repo)
    step(1, f"schema diff: protos/ against {snap.relative_to(repo)} (level {LEVEL})")
    compat = compat_api()
    try:
        current_schema = compat.load_schema(str(repo / "protos"))
        diff = diff_schemas(current_schema, load_descriptor_set(snap), str(snap.relative_to(repo)))
    except compat.CompatError as error:
        raise ReleaseError(f"the schema check could not run: {error}") from None
    for line in diff.describe():
        say("      " + line)
    target, kind = choose_version(current, diff, bump=bump, version=version)
    say(f"      required: {diff.required}; releasing {current} -> {target} ({kind})")
    return target


def step_edits(repo: Path, version: SemVer, date: dt.date, execute: bool) -> dict[Path, bytes]:
    edits = planned_edits(repo, version, date)
    will = "will (after the upload)" if execute else "would"
    files = ", ".join(str(s.path) for s in VERSION_SPOTS)
    step(2, f"version: {will} set {version} in {files}")
    for spot in VERSION_SPOTS:
        for line in show_diff(repo, spot.path, edits[spot.path]):
            say("  " + line)
    step(3, f"changelog: {will} move the Unreleased notes under ## [{version}] - {date}")
    for line in show_diff(repo, CHANGELOG, edits[CHANGELOG]):
        say("  " + line)
    snapshot = snapshot_path(repo, str(version)).relative_to(repo)
    step(4, f"snapshot: {will} write {snapshot} ({len(edits[snapshot])} bytes, = {DESCRIPTORS})")
    return edits


def step_build(staging: Path, dist: Path, target_dir: Path) -> Artifacts:
    step(
        5,
        "build: sdist, then from it the abi3 wheel (maturin --zig, glibc 2.28; "
        f"CARGO_TARGET_DIR={target_dir}) and the {PURE_TAG} wheel (build_pure_wheel.py)",
    )
    artifacts = build(staging, dist, target_dir)
    for path in artifacts:
        say(f"      {path.name}")
    return artifacts


def step_checks(staging: Path, artifacts: Artifacts, version: SemVer) -> None:
    _, wheel, pure = artifacts
    stems = sorted(p.stem for p in (staging / "protos").glob("*.proto"))
    problems = check_wheel_contents(wheel, stems, version) + check_native(wheel, version)
    problems += check_native_platforms(wheel, native_core_tags(staging))
    audited = auditwheel_platform(wheel)
    problems += check_auditwheel(wheel, audited)
    problems += check_pure_wheel(pure, wheel)
    if problems:
        raise ReleaseError("the wheels are incomplete:\n" + "\n".join(_listing(problems)))
    step(6, f"wheel contents: {len(stems)} schemas, stubs, .pyi, py.typed; _native loads: ok")
    say(f"      auditwheel show: consistent with {audited}: ok")
    say(f"      {pure.name}: the same files but the extension, the same METADATA: ok")
    twine(["check", "--strict", *map(str, artifacts)], what="twine check --strict")
    say("      twine check --strict: ok (sdist and both wheels)")
    for built in (wheel, pure):
        floor, stamps, problems = check_protobuf_floor(built)
        if problems:
            raise ReleaseError(
                f"protobuf floor check failed ({built.name}):\n" + "\n".join(_listing(problems))
            )
    shown = ", ".join(sorted(str(s) for s in stamps))
    step(7, f"protobuf floor: protobuf>={floor} covers the gencode stamps ({shown}): ok")


def step_resolution(
    number: int, source: Sequence[str], where: str, version: SemVer, artifacts: Artifacts
) -> None:
    step(number, f"resolution: pip download --platform ... --only-binary=:all: from {where}")
    for line in check_resolution(source, version, artifacts):
        say(f"      {line}: ok")


@dataclass
class Options:
    repo: Path
    bump: str | None
    version: str | None
    execute: bool
    repository_url: str | None
    index_url: str | None
    username: str | None
    password: str | None
    date: dt.date
    target_dir: Path


def release(opts: Options) -> None:
    repo = opts.repo
    mode = "RELEASE" if opts.execute else "dry run (nothing is changed; --execute to release)"
    say(f"release: {mode} of {repo}")
    version = step_compat(repo, opts.bump, opts.version)
    edits = step_edits(repo, version, opts.date, opts.execute)
    with tempfile.TemporaryDirectory(prefix="smg-release-") as tmp:
        staging, dist = Path(tmp) / "repo", Path(tmp) / "dist"
        stage(repo, staging)
        write_edits(staging, edits)
        artifacts = step_build(staging, dist, opts.target_dir)
        step_checks(staging, artifacts, version)
        local = ["--no-index", "--find-links", str(dist)]
        step_resolution(8, local, "the built artifacts", version, artifacts)
        names = ", ".join(path.name for path in artifacts)
        if not opts.execute:
            target = opts.repository_url or "the index given by --repository-url"
            step(9, f"upload: would upload {names} to {target}")
            say("release: dry run complete; nothing was changed")
            return
        assert opts.repository_url is not None
        step(9, f"upload: {names} to {opts.repository_url}")
        upload(list(artifacts), opts.repository_url, opts.username, opts.password)
        if opts.index_url:
            step_resolution(9, ["--index-url", opts.index_url], opts.index_url, version, artifacts)
        write_edits(repo, edits)
        published = publish_dist(repo, list(artifacts))
    say(f"release: {version} uploaded; edits written, artifacts in {published}")
    say(f"release: next, commit and tag: git commit -am 'Release {version}' && git tag v{version}")


# --- command line --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", type=Path, default=ROOT, help="repository (default: this one)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--bump", choices=BUMPS, help="release kind (default: the required one)")
    which.add_argument("--version", help="exact version X.Y.Z (must be a large enough bump)")
    parser.add_argument("--execute", action="store_true", help="really release (default: dry run)")
    parser.add_argument("--repository-url", help="package index upload URL (twine)")
    parser.add_argument(
        "--index-url",
        help="the index's simple API (e.g. URL/simple/): after the upload, check there which "
        "wheel pip picks on each platform",
    )
    parser.add_argument("--username", help="index user name (default: $TWINE_USERNAME)")
    parser.add_argument("--password", help="index password or token (default: $TWINE_PASSWORD)")
    parser.add_argument(
        "--date", type=dt.date.fromisoformat, default=dt.date.today(), help="changelog date"
    )
    parser.add_argument(
        "--cargo-target-dir",
        type=Path,
        help="cargo target directory for the release build (default: .cache/release-target)",
    )
    args = parser.parse_args(argv)
    if args.execute and not args.repository_url:
        parser.error("--execute needs --repository-url")
    repo = args.repo.resolve()
    target_dir = args.cargo_target_dir or repo / ".cache" / "release-target"
    return Options(
        repo=repo,
        bump=args.bump,
        version=args.version,
        execute=args.execute,
        repository_url=args.repository_url,
        index_url=args.index_url,
        username=args.username,
        password=args.password,
        date=args.date,
        target_dir=target_dir.resolve(),
    )


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    # Check with the checker of the repository being released (pure Python under src/).
    if PACKAGE not in sys.modules:
        sys.path.insert(0, str(opts.repo / "src"))
    try:
        release(opts)
    except ReleaseError as error:
        print(f"release: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
