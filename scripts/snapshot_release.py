#!/usr/bin/env python3
"""Write (or verify) the schema snapshots under ``protos/releases/``.

    python scripts/snapshot_release.py            # write the missing snapshots
    python scripts/snapshot_release.py --check    # fail if a snapshot differs from its source

Two kinds of snapshot, both a binary ``FileDescriptorSet`` named ``<version>.binpb``:

* the **0.4.28 baseline**: the schema of the published ``smg-grpc-proto==0.4.28`` wheel, rebuilt
  from the serialized ``FileDescriptorProto`` embedded in each of its ``generated/*_pb2.py`` files
  (read as source, never imported), plus the well-known types it imports
  (``google/protobuf/timestamp.proto``, ``struct.proto``, taken from the protobuf runtime), so the
  set is self-contained. Files are ordered dependencies first, serialized deterministically.
* **our releases**: a byte copy of ``src/smg_grpc_proto/proto/descriptors.binpb`` (written by
  ``scripts/gen_stubs.py`` with imports and source info) at the time of the release.
  ``scripts/release.py`` writes the new one; this script writes the current version's snapshot
  only if it is missing, because a released snapshot never changes.

The baseline wheel is downloaded once (``pip download``) into ``.cache/upstream/0.4.28/``, the same
cache the test suite uses.
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path

from google.protobuf import descriptor_pb2, struct_pb2, timestamp_pb2

ROOT = Path(__file__).resolve().parent.parent
# The package's own reader of _pb2.py sources (pure Python; works from a source checkout).
sys.path.insert(0, str(ROOT / "src"))
from smg_grpc_proto.compat._pb2source import serialized_descriptor  # noqa: E402
from smg_grpc_proto.compat.sources import download_wheel  # noqa: E402

RELEASES = Path("protos") / "releases"
DESCRIPTORS = Path("src") / "smg_grpc_proto" / "proto" / "descriptors.binpb"
CHANGELOG = Path("CHANGELOG.md")
PYPROJECT = Path("pyproject.toml")

BASELINE_VERSION = "0.4.28"
BASELINE_PACKAGE = "smg-grpc-proto"
WELL_KNOWN = {
    "google/protobuf/timestamp.proto": timestamp_pb2.DESCRIPTOR.serialized_pb,
    "google/protobuf/struct.proto": struct_pb2.DESCRIPTOR.serialized_pb,
}


# --- the 0.4.28 baseline -------------------------------------------------------------------------


def wheel_descriptors(wheel: Path) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """Every ``FileDescriptorProto`` embedded in the wheel's ``*_pb2.py``, keyed by file name."""
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            if name.endswith("_pb2.py"):
                source = zf.read(name).decode()
                data = serialized_descriptor(source)
                if data is None:
                    raise ValueError(f"{wheel}!{name}: no serialized descriptor found")
                fdp = descriptor_pb2.FileDescriptorProto.FromString(data)
                files[fdp.name] = fdp
    if not files:
        raise ValueError(f"{wheel}: no *_pb2.py files")
    return files


def with_well_known(
    files: dict[str, descriptor_pb2.FileDescriptorProto],
) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """Add the well-known-type files the set imports, so that it is self-contained."""
    out = dict(files)
    for fdp in files.values():
        for dep in fdp.dependency:
            if dep in out:
                continue
            if dep not in WELL_KNOWN:
                raise ValueError(f"{fdp.name} imports {dep}, which is neither in the set nor known")
            out[dep] = descriptor_pb2.FileDescriptorProto.FromString(WELL_KNOWN[dep])
    return out


def dependency_order(
    files: dict[str, descriptor_pb2.FileDescriptorProto], roots: Iterable[str]
) -> list[descriptor_pb2.FileDescriptorProto]:
    """``roots`` sorted by name, each preceded by its imports: the order of ``protoc
    --include_imports`` given the same files (as ``scripts/gen_stubs.py`` does)."""
    ordered: list[descriptor_pb2.FileDescriptorProto] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for dep in files[name].dependency:
            visit(dep)
        ordered.append(files[name])

    for name in sorted(roots):
        visit(name)
    return ordered


def descriptor_set(files: Iterable[descriptor_pb2.FileDescriptorProto]) -> bytes:
    fds = descriptor_pb2.FileDescriptorSet()
    fds.file.extend(files)
    return fds.SerializeToString(deterministic=True)


def baseline_snapshot(wheel: Path) -> bytes:
    """The self-contained ``FileDescriptorSet`` of a published wheel's generated stubs."""
    own = wheel_descriptors(wheel)
    return descriptor_set(dependency_order(with_well_known(own), own))


def baseline_wheel(root: Path = ROOT) -> Path:
    """The published 0.4.28 wheel (downloaded once into the package's wheel cache)."""
    return download_wheel(f"{BASELINE_PACKAGE}=={BASELINE_VERSION}")


# --- our own releases ----------------------------------------------------------------------------


def project_version(root: Path) -> str:
    """``version`` of the ``[project]`` table in ``pyproject.toml``."""
    text = (root / PYPROJECT).read_text()
    section = re.search(r"^\[project\]\n(.*?)(?=^\[|\Z)", text, flags=re.MULTILINE | re.DOTALL)
    match = section and re.search(r'^version = "([^"]+)"$', section.group(1), flags=re.MULTILINE)
    if not match:
        raise ValueError(f"{root / PYPROJECT}: no version in [project]")
    return match.group(1)


def current_snapshot(root: Path) -> bytes:
    """The snapshot of the schema as it is now: the generated ``descriptors.binpb``."""
    return (root / DESCRIPTORS).read_bytes()


def snapshot_path(root: Path, version: str) -> Path:
    return root / RELEASES / f"{version}.binpb"


def unreleased_notes(root: Path) -> str:
    """The text under ``## [Unreleased]`` in the changelog (stripped; empty if none)."""
    text = (root / CHANGELOG).read_text()
    match = re.search(r"^## \[Unreleased\][^\n]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return match.group(1).strip() if match else ""


# --- check and write -----------------------------------------------------------------------------


def check(root: Path, wheel: Path) -> list[str]:
    """Problems with the committed snapshots (empty when all are as their sources say)."""
    problems = []
    base = snapshot_path(root, BASELINE_VERSION)
    if not base.is_file():
        problems.append(f"missing: {base.relative_to(root)}")
    elif base.read_bytes() != baseline_snapshot(wheel):
        problems.append(f"{base.relative_to(root)} differs from what {wheel.name} yields")
    version = project_version(root)
    mine = snapshot_path(root, version)
    if not mine.is_file():
        problems.append(f"missing: {mine.relative_to(root)} (the snapshot of version {version})")
    elif mine.read_bytes() != current_snapshot(root) and not unreleased_notes(root):
        problems.append(
            f"the schema ({DESCRIPTORS}) differs from the {version} snapshot, but the "
            f"changelog's Unreleased section is empty: describe the schema change there "
            f"(it ships in the next release), or regenerate the stubs"
        )
    return problems


def write(root: Path, wheel: Path) -> list[Path]:
    """Write the missing snapshots; return the paths written."""
    written = []
    base = snapshot_path(root, BASELINE_VERSION)
    if not base.is_file():
        base.parent.mkdir(parents=True, exist_ok=True)
        base.write_bytes(baseline_snapshot(wheel))
        written.append(base)
    mine = snapshot_path(root, project_version(root))
    if not mine.is_file():
        mine.write_bytes(current_snapshot(root))
        written.append(mine)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    parser.add_argument("--repo", type=Path, default=ROOT, help="repository root (default: this)")
    parser.add_argument("--wheel", type=Path, help="the 0.4.28 wheel (default: download it)")
    args = parser.parse_args(argv)
    root = args.repo.resolve()
    wheel = args.wheel or baseline_wheel(root)
    if args.check:
        problems = check(root, wheel)
        for problem in problems:
            print(f"snapshot_release: {problem}", file=sys.stderr)
        if not problems:
            print(f"snapshots in {RELEASES} are up to date")
        return 1 if problems else 0
    for path in write(root, wheel):
        print(f"wrote {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
