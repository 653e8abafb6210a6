"""Versioned schemas and the release pipeline (scripts/snapshot_release.py, scripts/release.py).

* The committed snapshots under protos/releases/ are what the snapshot script derives: 0.4.28 from
  the published wheel, the current version from the generated descriptors.
* The required bump follows the schema diff (wire break -> major, additions -> minor, else patch),
  computed on real descriptor sets mutated in memory; a smaller bump is refused.
* The edits a release makes (version in four files, changelog, snapshot), checked on scratch copies.
* The wheel checks (contents, protobuf floor against gencode stamps) on synthetic wheels.
* Slow: a dry run changes nothing; a full release uploads to a local pypiserver on loopback, and
  the published package, installed from that index into a fresh venv, passes the smoke test.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from google.protobuf import descriptor_pb2, descriptor_pool
from support.descriptors import file_descriptors
from support.upstream import upstream_package, upstream_wheel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import release  # noqa: E402
import snapshot_release  # noqa: E402

RELEASES = ROOT / "protos" / "releases"
DESCRIPTORS = ROOT / "src" / "smg_grpc_proto" / "proto" / "descriptors.binpb"
SMOKE = ROOT / "tests" / "support" / "runtime_smoke.py"
VERSION_FILES = ("pyproject.toml", "rust/Cargo.toml", "rust/Cargo.lock")
VERSION_FILES += ("src/smg_grpc_proto/_version.py", "CHANGELOG.md")


def _finding(rule="FIELD_NO_DELETE", message="Previously present field 2 was deleted."):
    return SimpleNamespace(rule=rule, file="vllm_engine.proto", line=7, column=3, message=message)


# --- snapshots -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def baseline_wheel() -> Path:
    return upstream_wheel()  # downloaded into the shared wheel cache on first use


def test_baseline_snapshot_is_derived_from_the_published_wheel(baseline_wheel):
    committed = (RELEASES / "0.4.28.binpb").read_bytes()
    assert committed == snapshot_release.baseline_snapshot(baseline_wheel)


def test_baseline_snapshot_holds_the_upstream_descriptors_and_is_self_contained():
    fds = descriptor_pb2.FileDescriptorSet.FromString((RELEASES / "0.4.28.binpb").read_bytes())
    # Independent reader (tests/support) of the same wheel: the eight files, unchanged.
    upstream = file_descriptors(upstream_package() / "generated")
    by_name = {f.name: f for f in fds.file}
    assert {n: by_name[n] for n in upstream} == upstream
    assert set(by_name) - set(upstream) == {
        "google/protobuf/timestamp.proto",
        "google/protobuf/struct.proto",
    }
    pool = descriptor_pool.DescriptorPool()
    for fdp in fds.file:  # dependencies first, or Add() fails
        pool.Add(fdp)
    assert pool.FindMessageTypeByName("vllm.grpc.engine.TensorData").fields_by_name["shape"]


def test_snapshot_of_the_current_version_is_the_current_schema():
    """Equal bytes, unless schema changes are pending in the changelog's Unreleased section."""
    version = snapshot_release.project_version(ROOT)
    snapshot = RELEASES / f"{version}.binpb"
    assert snapshot.is_file(), f"no snapshot for the current version {version}"
    if snapshot.read_bytes() != DESCRIPTORS.read_bytes():
        assert snapshot_release.unreleased_notes(ROOT), (
            f"{DESCRIPTORS.name} differs from {snapshot.name} but CHANGELOG.md's Unreleased "
            "section is empty: a schema change must be described there"
        )


def test_snapshot_check_passes_on_the_repository(baseline_wheel):
    assert snapshot_release.check(ROOT, baseline_wheel) == []


def test_releases_readme_explains_the_files():
    readme = (RELEASES / "README.md").read_text()
    assert "`0.4.28.binpb`" in readme
    assert "scripts/snapshot_release.py" in readme


# --- the required bump, from real descriptor sets ------------------------------------------------


@pytest.fixture
def schema() -> descriptor_pb2.FileDescriptorSet:
    return descriptor_pb2.FileDescriptorSet.FromString((RELEASES / "0.5.0.binpb").read_bytes())


def _copy(fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pb2.FileDescriptorSet:
    out = descriptor_pb2.FileDescriptorSet()
    out.CopyFrom(fds)
    return out


def _message(fds: descriptor_pb2.FileDescriptorSet, file: str, name: str):
    fdp = next(f for f in fds.file if f.name == file)
    return next(m for m in fdp.message_type if m.name == name)


def _required(current, against) -> release.SchemaDiff:
    return release.diff_schemas(current, against, "0.5.0.binpb")


def test_identical_schemas_need_a_patch(schema):
    diff = _required(_copy(schema), schema)
    assert (diff.breaking, diff.added, diff.required) == ([], [], "patch")


def test_deleted_field_needs_a_major(schema):
    current = _copy(schema)
    tensor = _message(current, "vllm_engine.proto", "TensorData")
    shape = next(f for f in tensor.field if f.name == "shape")
    tensor.field.remove(shape)
    diff = _required(current, schema)
    assert diff.required == "major"
    assert any(f.file == "vllm_engine.proto" for f in diff.breaking), diff.breaking


def test_renumbered_field_needs_a_major(schema):
    current = _copy(schema)
    tensor = _message(current, "vllm_engine.proto", "TensorData")
    next(f for f in tensor.field if f.name == "shape").number = 6
    assert _required(current, schema).required == "major"


def test_added_field_needs_a_minor(schema):
    current = _copy(schema)
    request = _message(current, "vllm_engine.proto", "GenerateRequest")
    used = [f.number for f in request.field] + [r.end for r in request.reserved_range]
    request.field.add(
        name="priority_hint",
        number=max(used) + 1,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
        json_name="priorityHint",
    )
    diff = _required(current, schema)
    assert diff.breaking == []
    assert diff.added, "an added field must be reported as an addition"
    assert diff.required == "minor"


def test_renamed_field_keeps_the_wire_but_is_noted(schema):
    """A rename is not a wire break (patch), but generated code changes: listed as a note."""
    current = _copy(schema)
    tensor = _message(current, "vllm_engine.proto", "TensorData")
    shape = next(f for f in tensor.field if f.name == "shape")
    shape.name, shape.json_name = "dims", "dims"
    diff = _required(current, schema)
    assert (diff.breaking, diff.added, diff.required) == ([], [], "patch")
    assert any("shape" in f.message for f in diff.api_notes), diff.api_notes
    assert any("api" in line or "source-level" in line for line in diff.describe())


def test_comment_only_change_needs_a_patch(schema):
    current = _copy(schema)
    fdp = next(f for f in current.file if f.name == "vllm_engine.proto")
    commented = [loc for loc in fdp.source_code_info.location if loc.leading_comments]
    assert commented
    for loc in commented:
        loc.leading_comments = " Reworded.\n"
    assert _required(current, schema).required == "patch"


# --- choosing the version ------------------------------------------------------------------------

V = release.SemVer.parse


def test_semver_bumps_and_ordering():
    assert str(V("0.5.0").bump("major")) == "1.0.0"
    assert str(V("0.5.3").bump("minor")) == "0.6.0"
    assert str(V("0.5.3").bump("patch")) == "0.5.4"
    assert V("0.10.0") > V("0.9.9")
    with pytest.raises(release.ReleaseError):
        V("1.0")
    with pytest.raises(release.ReleaseError):
        V("01.0.0")


@pytest.mark.parametrize(
    ("breaking", "added", "required"),
    [
        ([], [], "patch"),
        ([], ["vllm_engine.proto: field X.y"], "minor"),
        ([_finding()], [], "major"),
    ],
)
def test_required_bump_from_the_diff(breaking, added, required):
    diff = release.SchemaDiff("0.5.0.binpb", breaking=breaking, added=added)
    assert diff.required == required
    assert release.choose_version(V("0.5.0"), diff) == (V("0.5.0").bump(required), required)


def test_findings_are_formatted_with_their_location():
    assert release.format_finding(_finding()) == (
        "vllm_engine.proto:7:3: FIELD_NO_DELETE: Previously present field 2 was deleted."
    )
    unlocated = SimpleNamespace(rule="R", file="a.proto", line=None, column=None, message="m")
    assert release.format_finding(unlocated) == "a.proto: R: m"


def test_a_larger_bump_than_required_is_accepted():
    diff = release.SchemaDiff("0.5.0.binpb")
    assert release.choose_version(V("0.5.0"), diff, bump="major") == (V("1.0.0"), "major")
    assert release.choose_version(V("0.5.0"), diff, version="0.6.0") == (V("0.6.0"), "minor")


def test_a_smaller_bump_is_refused_naming_the_findings():
    diff = release.SchemaDiff("protos/releases/0.5.0.binpb", breaking=[_finding()])
    with pytest.raises(release.ReleaseError) as refused:
        release.choose_version(V("0.5.0"), diff, bump="minor")
    message = str(refused.value)
    assert "refusing a minor release (0.5.0 -> 0.6.0)" in message
    assert "requires major" in message
    assert "vllm_engine.proto:7:3: FIELD_NO_DELETE: Previously present field 2" in message
    with pytest.raises(release.ReleaseError, match="requires minor"):
        release.choose_version(V("0.5.0"), release.SchemaDiff("x", added=["a"]), version="0.5.1")


@pytest.mark.parametrize("version", ["0.5.0", "0.4.9", "0.7.0", "0.6.1", "1.1.0", "0.6"])
def test_a_version_that_is_not_a_successor_is_refused(version):
    with pytest.raises(release.ReleaseError):
        release.choose_version(V("0.5.0"), release.SchemaDiff("x"), version=version)


# --- the edits, on scratch copies ----------------------------------------------------------------


@pytest.fixture
def scratch(tmp_path) -> Path:
    """The files a release edits, plus protos/, the shipped copies and the snapshots."""
    for name in VERSION_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("protos", "src/smg_grpc_proto/proto"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    return tmp_path


def _changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    return [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]


def test_version_is_rewritten_in_every_file_and_nowhere_else(scratch):
    old = release.current_version(scratch)
    before = {n: (scratch / n).read_text() for n in VERSION_FILES}
    release.write_edits(
        scratch, {p: t.encode() for p, t in release.version_edits(scratch, V("7.8.9")).items()}
    )
    assert release.current_version(scratch) == V("7.8.9")
    for spot in release.VERSION_SPOTS:
        after = (scratch / spot.path).read_text()
        assert len(after.splitlines()) == len(before[str(spot.path)].splitlines())
        # exactly one line changed, from the old version to the new one
        ((was, now),) = _changed_lines(before[str(spot.path)], after)
        assert was.replace(str(old), "7.8.9") == now, spot.path
    lock = (scratch / "rust/Cargo.lock").read_text()
    assert 'name = "heck"\nversion = "0.5.0"' in lock  # another crate at 0.5.0 stays as it was


def test_inconsistent_versions_are_refused(scratch):
    path = scratch / "src/smg_grpc_proto/_version.py"
    path.write_text(path.read_text().replace(str(release.current_version(scratch)), "9.9.9"))
    with pytest.raises(release.ReleaseError, match="differs between files"):
        release.current_version(scratch)


CHANGELOG = """\
# Changelog

Intro.

## [Unreleased]

### Added
- A field.

## [0.5.0] - 2026-11-30

### Added
- Everything.
"""


def test_changelog_unreleased_notes_move_under_the_new_version():
    moved = release.move_unreleased(CHANGELOG, V("0.6.0"), dt.date(2027, 1, 2))
    assert moved == CHANGELOG.replace(
        "## [Unreleased]\n\n", "## [Unreleased]\n\n## [0.6.0] - 2027-01-02\n\n"
    )


def test_changelog_unreleased_as_last_section():
    text = "# Changelog\n\n## [Unreleased]\n\n- Fixed a thing.\n"
    moved = release.move_unreleased(text, V("0.1.0"), dt.date(2027, 1, 2))
    assert (
        moved == "# Changelog\n\n## [Unreleased]\n\n## [0.1.0] - 2027-01-02\n\n- Fixed a thing.\n"
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (CHANGELOG.replace("### Added\n- A field.\n", ""), "Unreleased section .* is empty"),
        (CHANGELOG.replace("## [Unreleased]\n", ""), "no '## \\[Unreleased\\]' section"),
        (CHANGELOG.replace("0.5.0", "0.6.0"), "already has a section for 0.6.0"),
    ],
)
def test_changelog_refusals(text, error):
    with pytest.raises(release.ReleaseError, match=error):
        release.move_unreleased(text, V("0.6.0"), dt.date(2027, 1, 2))


def test_planned_edits_cover_versions_changelog_and_snapshot(scratch):
    changelog = scratch / "CHANGELOG.md"
    changelog.write_text(
        changelog.read_text().replace("## [Unreleased]\n", "## [Unreleased]\n\n- New.\n")
    )
    edits = release.planned_edits(scratch, V("0.6.0"), dt.date(2027, 1, 2))
    assert set(edits) == {
        *(s.path for s in release.VERSION_SPOTS),
        Path("CHANGELOG.md"),
        Path("protos/releases/0.6.0.binpb"),
    }
    assert edits[Path("protos/releases/0.6.0.binpb")] == DESCRIPTORS.read_bytes()
    assert not (scratch / "protos/releases/0.6.0.binpb").exists()  # planning writes nothing
    (scratch / "protos/releases/0.6.0.binpb").write_bytes(b"")
    with pytest.raises(release.ReleaseError, match="already exists"):
        release.planned_edits(scratch, V("0.6.0"), dt.date(2027, 1, 2))


def test_latest_snapshot_is_the_highest_version(tmp_path):
    folder = tmp_path / "protos" / "releases"
    folder.mkdir(parents=True)
    for name in ("0.4.28.binpb", "0.9.0.binpb", "0.10.0.binpb", "README.md", "draft.binpb"):
        (folder / name).write_bytes(b"")
    assert release.latest_snapshot(tmp_path) == (V("0.10.0"), folder / "0.10.0.binpb")
    assert release.latest_snapshot(ROOT)[0] == release.current_version(ROOT)


def test_stale_shipped_protos_are_refused(scratch):
    release.check_generated_in_sync(scratch)
    (scratch / "protos" / "common.proto").write_text("// edited\n")
    with pytest.raises(release.ReleaseError, match=r"common\.proto.*gen_stubs"):
        release.check_generated_in_sync(scratch)


def test_stage_copies_sources_but_no_build_outputs(tmp_path):
    repo = tmp_path / "repo"
    for name in ("src/a.py", "rust/target/x.o", ".cache/y", "dist/z.whl", "src/__pycache__/a.pyc"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(name)
    release.stage(repo, tmp_path / "staged")
    staged = sorted(
        str(p.relative_to(tmp_path / "staged"))
        for p in (tmp_path / "staged").rglob("*")
        if p.is_file()
    )
    assert staged == ["src/a.py"]


# --- the wheel checks, on synthetic wheels -------------------------------------------------------

STEMS = ["common", "vllm_engine"]


def _wheel(
    tmp_path: Path,
    names: set[str],
    requires: str = "protobuf<8,>=5.26.1",
    stamp="5.26.1",
    version="0.6.0",
    tag="cp310-abi3-linux_x86_64",
) -> Path:
    path = tmp_path / f"smg_grpc_proto-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name in sorted(names):
            if name.endswith("_pb2.py"):
                zf.writestr(name, f"# Protobuf Python Version: {stamp}\n")
            elif name.endswith("_version.py"):
                zf.writestr(name, f'__version__ = "{version}"\n')
            else:
                zf.writestr(name, "")
        meta = (
            f"Metadata-Version: 2.4\nName: smg-grpc-proto\nVersion: {version}\n"
            f"Requires-Dist: {requires}\nRequires-Dist: grpcio>=1.63.2\n"
        )
        zf.writestr(f"smg_grpc_proto-{version}.dist-info/METADATA", meta)
    return path


def _complete() -> set[str]:
    return release.expected_wheel_files(STEMS) | {"smg_grpc_proto/_native.abi3.so"}


def test_complete_wheel_passes(tmp_path):
    wheel = _wheel(tmp_path, _complete())
    assert release.check_wheel_contents(wheel, STEMS, V("0.6.0")) == []
    floor, stamps, problems = release.check_protobuf_floor(wheel)
    assert (str(floor), {str(s) for s in stamps}, problems) == ("5.26.1", {"5.26.1"}, [])


def test_expected_wheel_files_cover_stubs_protos_and_markers():
    names = release.expected_wheel_files(["vllm_engine"])
    assert {
        "smg_grpc_proto/generated/vllm_engine_pb2.py",
        "smg_grpc_proto/generated/vllm_engine_pb2.pyi",
        "smg_grpc_proto/generated/vllm_engine_pb2_grpc.py",
        "smg_grpc_proto/generated/vllm_engine_pb2_grpc.pyi",
        "smg_grpc_proto/proto/vllm_engine.proto",
        "smg_grpc_proto/proto/descriptors.binpb",
        "smg_grpc_proto/py.typed",
        "smg_grpc_proto/dataclasses/__init__.py",
    } <= names


def test_incomplete_wheel_is_reported(tmp_path):
    names = _complete() - {
        "smg_grpc_proto/generated/vllm_engine_pb2_grpc.pyi",
        "smg_grpc_proto/py.typed",
        "smg_grpc_proto/_native.abi3.so",
    }
    wheel = _wheel(
        tmp_path, names | {"smg_grpc_proto/__pycache__/x.pyc"}, tag="cp311-cp311-linux_x86_64"
    )
    problems = release.check_wheel_contents(wheel, STEMS, V("0.7.0"))
    assert problems == [
        "missing smg_grpc_proto/generated/vllm_engine_pb2_grpc.pyi",
        "missing smg_grpc_proto/py.typed",
        "missing the native extension smg_grpc_proto/_native.*.so",
        f"{wheel.name} is not an abi3 wheel",
        "stray build file smg_grpc_proto/__pycache__/x.pyc",
        "METADATA Version 0.6.0 != 0.7.0",
        "smg_grpc_proto/_version.py does not say 0.7.0",
    ]


def test_a_wheel_whose_extension_does_not_load_is_reported(tmp_path):
    wheel = _wheel(tmp_path, _complete())  # the .so is an empty file
    (problem,) = release.check_native(wheel, V("0.6.0"))
    assert problem.startswith("loading _native failed")


def test_floor_below_a_gencode_stamp_is_reported(tmp_path):
    wheel = _wheel(tmp_path, _complete(), stamp="6.33.5")
    _, _, problems = release.check_protobuf_floor(wheel)
    assert problems
    assert all("gencode 6.33.5 is above the declared floor protobuf>=5.26.1" in p for p in problems)
    (tmp_path / "unbounded").mkdir()
    no_floor = _wheel(tmp_path / "unbounded", _complete(), requires="protobuf")
    assert release.check_protobuf_floor(no_floor)[2] == ["METADATA declares no protobuf>= floor"]


def test_gencode_stamps_read_the_runtime_version_check():
    """0.4.28's gencode carries ValidateProtobufRuntimeVersion(..., 6, 33, 5, ...)."""
    source = (upstream_package() / "generated" / "vllm_engine_pb2.py").read_text()
    assert {str(v) for v in release.gencode_stamps(source)} == {"6.33.5"}


# --- repository plumbing: pre-commit hook, Makefile ----------------------------------------------


def test_pre_commit_hook_definition():
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "smg-proto-compat"
    assert hook["entry"] == "smg-proto compat"
    assert hook["language"] == "python"
    assert hook["pass_filenames"] is False
    assert hook["files"] == r"\.proto$"
    assert hook["args"][0] == "--against"
    assert "smg-proto-compat" in (ROOT / "docs" / "release.md").read_text()


def test_make_compat_checks_against_the_highest_release(tmp_path):
    for name in ("0.4.28.binpb", "0.9.0.binpb", "0.10.0.binpb", "README.md"):
        (tmp_path / name).write_bytes(b"")
    out = subprocess.run(
        ["make", "-n", "compat", f"RELEASES={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"compat --against {tmp_path}/0.10.0.binpb --protos protos" in out
    out = subprocess.run(
        ["make", "-n", "compat"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    latest = release.latest_snapshot(ROOT)[1].relative_to(ROOT)
    assert f"--against {latest} " in out


# --- slow: dry run, and a full release to a local index ------------------------------------------


def _copy_repository(dest: Path) -> Path:
    """The working tree's sources (tracked and untracked, not ignored), without .git."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, names.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def _add_unreleased_note(repo: Path, note: str) -> None:
    changelog = repo / "CHANGELOG.md"
    text = changelog.read_text()
    changelog.write_text(
        text.replace("## [Unreleased]\n", f"## [Unreleased]\n\n### Added\n- {note}\n", 1)
    )


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _release(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # The copy has no .cache/: share the release build cache of this checkout, so that only our
    # crate is compiled again.
    target = ROOT / ".cache" / "release-target"
    script = repo / "scripts" / "release.py"
    return subprocess.run(
        [
            sys.executable,
            str(script),
            "--repo",
            str(repo),
            "--cargo-target-dir",
            str(target),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )


# The two release runs build the crate in the release profile (thin LTO, one codegen unit) from
# a cold target: about 13 minutes on a 2-core machine with 22 vision families, past pytest's
# 10-minute default. _release itself gives up after 25.
RELEASE_BUILD = pytest.mark.timeout(1800)


@pytest.mark.slow
@RELEASE_BUILD
def test_dry_run_checks_everything_and_changes_nothing(tmp_path):
    repo = _copy_repository(tmp_path / "repo")
    _add_unreleased_note(repo, "Dry-run entry.")
    before = _tree_digest(repo)
    result = _release(repo, "--bump", "minor")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for n in range(1, 10):
        assert f"[{n}/9]" in result.stdout, result.stdout
    assert "-py3-none-any.whl" in result.stdout
    assert "auditwheel show: consistent with manylinux_2_28_x86_64: ok" in result.stdout
    assert "manylinux_2_28_x86_64 (CPython 3.10, 3.13): the native wheel: ok" in result.stdout
    assert "manylinux_2_34_x86_64 (CPython 3.10, 3.13): the native wheel: ok" in result.stdout
    assert "manylinux2014_aarch64 (CPython 3.10, 3.13): the pure wheel: ok" in result.stdout
    assert "would set 0.6.0" in result.stdout
    assert '+version = "0.6.0"' in result.stdout
    assert "would upload" in result.stdout
    assert _tree_digest(repo) == before


USER, PASSWORD = "releaser", "s3cret-for-loopback"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def package_index(tmp_path) -> Iterator[tuple[str, Path]]:
    """A pypiserver on loopback; uploads need USER/PASSWORD (htpasswd, {SHA} scheme)."""
    packages = tmp_path / "index"
    packages.mkdir()
    htpasswd = tmp_path / "htpasswd"
    digest = base64.b64encode(hashlib.sha1(PASSWORD.encode()).digest()).decode()
    htpasswd.write_text(f"{USER}:{{SHA}}{digest}\n")
    port = _free_port()
    log = (tmp_path / "pypiserver.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pypiserver",
            "run",
            "-i",
            "127.0.0.1",
            "-p",
            str(port),
            "-a",
            "update",
            "-P",
            str(htpasswd),
            "--disable-fallback",
            str(packages),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp_path / "pypiserver.log").read_text()) from None
                time.sleep(0.2)
        yield url, packages
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.mark.slow
@RELEASE_BUILD
def test_full_release_to_a_local_index_installs_and_runs(tmp_path, package_index):
    url, packages = package_index
    repo = _copy_repository(tmp_path / "repo")
    _add_unreleased_note(repo, "Release pipeline acceptance entry.")

    result = _release(
        repo,
        "--execute",
        "--bump",
        "minor",
        "--repository-url",
        f"{url}/",
        "--index-url",
        f"{url}/simple/",
        "--username",
        USER,
        "--password",
        PASSWORD,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    # The repository now says 0.6.0 everywhere, with its snapshot and changelog section.
    assert release.current_version(repo) == V("0.6.0")
    assert (repo / "protos/releases/0.6.0.binpb").read_bytes() == DESCRIPTORS.read_bytes()
    changelog = (repo / "CHANGELOG.md").read_text()
    today = dt.date.today().isoformat()
    assert f"## [Unreleased]\n\n## [0.6.0] - {today}\n\n### Added\n- Release pipeline" in changelog
    published = sorted(p.name for p in packages.iterdir())
    assert published == sorted(p.name for p in (repo / "dist").iterdir())
    assert any(n.endswith(".tar.gz") for n in published)
    assert any(n.endswith(".whl") and "-abi3-" in n for n in published)
    assert "smg_grpc_proto-0.6.0-py3-none-any.whl" in published
    # Step 9 checked, against the index, which wheel pip picks on each platform.
    resolved = (
        f"[9/9] resolution: pip download --platform ... --only-binary=:all: from {url}/simple/"
    )
    assert resolved in result.stdout
    assert "macosx_14_0_arm64 (CPython 3.10, 3.13): the pure wheel: ok" in result.stdout

    # A fresh venv installs 0.6.0 from the local index (dependencies from PyPI).
    venv = tmp_path / "venv"
    uv = [sys.executable, "-m", "uv"]
    subprocess.run(
        [*uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=300
    )
    python = venv / "bin" / "python"
    # uv gives --extra-index-url precedence over --index-url and takes each package from the first
    # index that has it, so the local index goes first and PyPI serves protobuf and grpcio.
    install = subprocess.run(
        [
            *uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(python),
            "--extra-index-url",
            f"{url}/simple/",
            "--index-url",
            "https://pypi.org/simple",
            "--refresh-package",
            "smg-grpc-proto",
            "smg-grpc-proto==0.6.0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["GRPC_VERBOSITY"] = "ERROR"
    smoke = subprocess.run(
        [str(python), "-W", "error", str(SMOKE), "upb"],
        cwd=SMOKE.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    summary = json.loads(smoke.stdout)
    assert summary["loopback"] == "ok"
    assert summary["messages"] >= 185

    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import json, smg_grpc_proto as p; "
            "i = p.build_info(); print(json.dumps([p.__version__, i['version'], i['flavour'],"
            " p.__file__]))",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    version, native, flavour, location = json.loads(probe.stdout)
    assert (version, native, flavour) == ("0.6.0", "0.6.0", "native")
    assert str(venv) in location

    # The wheel an aarch64 pip downloads from the index is the pure one; it installs and imports
    # here too (py3-none-any), says its flavour, and a vision call raises the documented error.
    downloads = tmp_path / "aarch64"
    pip = [sys.executable, "-m", "pip", "--isolated", "download", "--quiet", "--no-deps"]
    pip += ["--only-binary=:all:", "--platform", "manylinux2014_aarch64", "--dest", str(downloads)]
    pip += ["--index-url", f"{url}/simple/", "smg-grpc-proto==0.6.0"]
    subprocess.run(pip, check=True, timeout=300)
    (pure,) = downloads.iterdir()
    assert pure.name == "smg_grpc_proto-0.6.0-py3-none-any.whl"
    pure_venv = tmp_path / "pure-venv"
    subprocess.run(
        [*uv, "venv", "--quiet", "--python", sys.executable, str(pure_venv)],
        check=True,
        timeout=300,
    )
    subprocess.run(
        [
            *uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(pure_venv / "bin" / "python"),
            str(pure),
        ],
        check=True,
        timeout=600,
    )
    pure_probe = subprocess.run(
        [
            str(pure_venv / "bin" / "python"),
            "-c",
            "import json, smg_grpc_proto as p\n"
            "from smg_grpc_proto import errors, vision\n"
            "try:\n    vision.decode(b'')\nexcept errors.NativeCoreUnavailableError as e:\n"
            "    print(json.dumps([p.build_info()['flavour'], p.__file__, str(e)]))",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pure_probe.returncode == 0, pure_probe.stderr[-3000:]
    flavour, location, message = json.loads(pure_probe.stdout)
    assert flavour == "pure"
    assert str(pure_venv) in location
    assert "needs the native core" in message
