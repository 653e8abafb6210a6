"""The pure-Python wheel (``py3-none-any``, scripts/build_pure_wheel.py): its contents and
metadata, and the non-vision suite run against it installed in a clean virtual environment.

The wheel is built from a fresh ``maturin sdist`` of the working tree (no compilation: a few
seconds); the slow test installs it with uv into a venv that has no other copy of the package,
and runs there the tests that need no native core (the ``make pytest-fallback`` set plus the
stubs, channel and wire-compat tests: 115 tests, about 40 s with the build and the venv).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import build_pure_wheel  # noqa: E402
import release  # noqa: E402

PACKAGE = ROOT / "src" / "smg_grpc_proto"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The tests that need no native core, run against the installed pure wheel.
PURE_SUITE = [
    "tests/tensors/test_tensors.py",
    "tests/tensors/test_tensor_frames.py",
    "tests/test_shm.py",
    "tests/test_channel.py",
    "tests/compat/test_wire_compat.py",
    "tests/stubs/test_stubs.py",
]
# As `make pytest-fallback`: the native-versus-fallback comparisons and GIL checks need the core.
DESELECT = ["-k", "not native and not gil"]
# What the suite needs besides the wheel and its dependencies.
SUITE_DEPS = ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100", "ml_dtypes>=0.4"]


@pytest.fixture(scope="module")
def sdist_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sdist")
    sdist = build_pure_wheel.make_sdist(ROOT, tmp / "out")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", filter="data")
    (tree,) = (tmp / "unpacked").iterdir()
    return tree


@pytest.fixture(scope="module")
def pure_wheel(sdist_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_pure_wheel.build(tmp_path_factory.mktemp("pure"), source=sdist_tree)


def _names(wheel: Path) -> set[str]:
    return set(zipfile.ZipFile(wheel).namelist())


def _read(wheel: Path, suffix: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(suffix)]
        return zf.read(name)


@pytest.mark.slow
def test_name_and_tag(pure_wheel: Path):
    assert pure_wheel.name == f"smg_grpc_proto-{PYPROJECT['project']['version']}-py3-none-any.whl"
    wheel_file = _read(pure_wheel, ".dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: true\n" in wheel_file
    assert "Tag: py3-none-any\n" in wheel_file
    assert "Wheel-Version: 1.0\n" in wheel_file


@pytest.mark.slow
def test_contents_are_the_package_without_the_extension(pure_wheel: Path, sdist_tree: Path):
    names = _names(pure_wheel)
    package = {n for n in names if not n.startswith("smg_grpc_proto-")}
    sources = {
        p.relative_to(sdist_tree / "src").as_posix()
        for p in (sdist_tree / "src" / "smg_grpc_proto").rglob("*")
        if p.is_file()
    }
    assert package == sources
    assert not [n for n in names if "_native." in n and n.endswith((".so", ".pyd"))]
    assert "smg_grpc_proto/_native.pyi" in names  # the stand-in is typed as the module
    assert "smg_grpc_proto/_core.py" in names
    stems = sorted(p.stem for p in (ROOT / "protos").glob("*.proto"))
    assert release.expected_wheel_files(stems) <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


@pytest.mark.slow
def test_metadata_is_the_sdist_metadata(pure_wheel: Path, sdist_tree: Path):
    """maturin writes the same bytes into PKG-INFO and the native wheel's METADATA."""
    metadata = _read(pure_wheel, ".dist-info/METADATA")
    assert metadata == (sdist_tree / "PKG-INFO").read_bytes()
    meta = release.wheel_metadata(pure_wheel)
    assert meta["Version"] == PYPROJECT["project"]["version"]
    assert meta["Requires-Python"] == ">=3.10"
    requires = meta.get_all("Requires-Dist")
    assert "protobuf>=5.26.1,<8" in requires or "protobuf<8,>=5.26.1" in requires, requires
    assert "grpcio>=1.63.2" in requires
    assert "numpy>=1.22" in requires
    assert any("betterproto2" in r and "extra == 'dataclasses'" in r for r in requires), requires


@pytest.mark.slow
def test_entry_points_are_the_project_scripts(pure_wheel: Path):
    text = _read(pure_wheel, ".dist-info/entry_points.txt").decode()
    assert text == "[console_scripts]\nsmg-proto=smg_grpc_proto.cli:main\n"
    assert PYPROJECT["project"]["scripts"] == {"smg-proto": "smg_grpc_proto.cli:main"}


@pytest.mark.slow
def test_record_lists_every_file_with_its_hash(pure_wheel: Path):
    with zipfile.ZipFile(pure_wheel) as zf:
        (record_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
        assert sorted(r[0] for r in rows) == sorted(zf.namelist())
        for path, digest, size in rows:
            if path == record_name:
                assert (digest, size) == ("", "")
                continue
            data = zf.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expected.decode(), path
            assert int(size) == len(data), path
        assert zf.namelist()[-1] == record_name


@pytest.mark.slow
def test_build_is_reproducible(pure_wheel: Path, sdist_tree: Path, tmp_path: Path):
    again = build_pure_wheel.build(tmp_path, source=sdist_tree)
    assert again.read_bytes() == pure_wheel.read_bytes()


def test_a_tree_that_is_not_an_sdist_is_refused(tmp_path: Path):
    with pytest.raises(build_pure_wheel.PureWheelError, match="not an unpacked sdist"):
        build_pure_wheel.build(tmp_path / "out", source=tmp_path)


@pytest.mark.slow
def test_twine_check_passes(pure_wheel: Path):
    release.twine(["check", "--strict", str(pure_wheel)], what="twine check")


# Runs in the pure venv: where the package comes from, its flavour, text-only requests through
# every engine adapter (built, serialized, decoded back), and what a vision call raises.
PROBE = r"""
import importlib, json
import smg_grpc_proto
from smg_grpc_proto import errors, vision
from smg_grpc_proto.tensors import _backend

engines = {}
for name in ("vllm", "sglang", "tokenspeed", "trtllm", "mlx"):
    engine = importlib.import_module(f"smg_grpc_proto.engines.{name}")
    kwargs = {"max_tokens": 4} if name == "trtllm" else {}
    request = engine.generate_request("r1", [1, 2, 3], **kwargs).to_message()
    again = type(request).FromString(request.SerializeToString())
    engines[name] = [again == request, list(engine.decode_mm_inputs(again))]
try:
    vision.decode(b"\x89PNG\r\n\x1a\n")
    raised = None
except errors.NativeCoreUnavailableError as e:
    raised = [str(e), isinstance(e, ImportError)]
print(json.dumps({
    "file": smg_grpc_proto.__file__,
    "build_info": smg_grpc_proto.build_info(),
    "backend": _backend.backend,
    "engines": engines,
    "raised": raised,
}))
"""


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.pop("SMG_GRPC_PROTO_NATIVE", None)
    env["GRPC_VERBOSITY"] = "ERROR"
    return env


def pure_venv(root: Path, wheel: Path, *extra: str) -> Path:
    """A clean venv (no system site-packages) holding ``wheel``, its dependencies and ``extra``."""
    uv = [sys.executable, "-m", "uv"]
    subprocess.run(
        [*uv, "venv", "--quiet", "--python", sys.executable, str(root)], check=True, timeout=300
    )
    python = root / "bin" / "python"
    subprocess.run(
        [*uv, "pip", "install", "--quiet", "--python", str(python), str(wheel), *extra],
        check=True,
        timeout=600,
    )
    return python


@pytest.mark.slow
def test_pure_wheel_installed_runs_the_non_vision_suite(pure_wheel: Path, tmp_path: Path):
    python = pure_venv(tmp_path / "venv", pure_wheel, *SUITE_DEPS)
    probe = subprocess.run(
        [str(python), "-W", "error", "-c", PROBE],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    out = json.loads(probe.stdout)
    assert out["file"].startswith(str(tmp_path / "venv")), out["file"]
    assert out["build_info"]["flavour"] == "pure"
    assert out["backend"] == "numpy"
    assert out["engines"] == {name: [True, []] for name in out["engines"]}
    assert len(out["engines"]) == 5
    message, is_import_error = out["raised"]
    assert is_import_error
    assert "smg_grpc_proto._native.decode_image needs the native core" in message
    assert "manylinux_2_28_x86_64" in message

    # The suite from the working tree's tests/ against the installed wheel: src/ is not on the
    # path (the package is under src/, the cwd holds none), so only the venv provides it.
    suite = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *PURE_SUITE, *DESELECT],
        cwd=ROOT,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert suite.returncode == 0, suite.stdout[-4000:] + suite.stderr[-2000:]
    summary = suite.stdout.strip().splitlines()[-1]
    assert " passed" in summary, summary
    assert "failed" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 100, summary


# --- scripts/release.py on the pure wheel: checks and resolution, with a stand-in native wheel --


def _native_stand_in(pure: Path, out: Path, platform: str = "manylinux_2_28_x86_64") -> Path:
    """The pure wheel's files plus an extension file, tagged as the native wheel is (pip looks at
    the file name; the release's own run checks the real native wheel)."""
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / pure.name.replace("py3-none-any", f"cp310-abi3-{platform}")
    with zipfile.ZipFile(pure) as src, zipfile.ZipFile(wheel, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name.endswith(".dist-info/WHEEL"):
                data = data.replace(b"Root-Is-Purelib: true", b"Root-Is-Purelib: false")
                data = data.replace(b"py3-none-any", f"cp310-abi3-{platform}".encode())
            dst.writestr(name, data)
        dst.writestr("smg_grpc_proto/_native.abi3.so", b"\x7fELF")
    return wheel


def _rewrite(wheel: Path, out: Path, change: dict[str, bytes | None]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out / wheel.name, "w") as dst:
        for name in src.namelist():
            if name in change:
                if change[name] is not None:
                    dst.writestr(name, change[name])
                continue
            dst.writestr(name, src.read(name))
        for name, data in change.items():
            if name not in src.namelist() and data is not None:
                dst.writestr(name, data)
    return out / wheel.name


@pytest.mark.slow
def test_release_accepts_the_pure_wheel_of_the_native_one(pure_wheel: Path, tmp_path: Path):
    native = _native_stand_in(pure_wheel, tmp_path)
    assert release.check_pure_wheel(pure_wheel, native) == []
    assert release.check_native_platforms(native, release.native_core_tags(ROOT)) == []


@pytest.mark.slow
def test_release_reports_a_pure_wheel_that_differs(pure_wheel: Path, tmp_path: Path):
    native = _native_stand_in(pure_wheel, tmp_path / "native")
    info = f"smg_grpc_proto-{PYPROJECT['project']['version']}.dist-info"
    bad = _rewrite(
        pure_wheel,
        tmp_path / "bad",
        {
            "smg_grpc_proto/shm.py": b"# edited\n",
            "smg_grpc_proto/py.typed": None,
            "smg_grpc_proto/_native.abi3.so": b"",
            f"{info}/METADATA": b"Metadata-Version: 2.4\nName: smg-grpc-proto\n",
        },
    )
    problems = release.check_pure_wheel(bad, native)
    assert problems[:4] == [
        "pure wheel: holds the extension smg_grpc_proto/_native.abi3.so",
        "pure wheel: missing smg_grpc_proto/py.typed",
        "pure wheel: smg_grpc_proto/shm.py differs from the native wheel's",
        "pure wheel: .dist-info/METADATA differs from the native wheel's",
    ]
    assert "pure wheel: RECORD: wrong hash for smg_grpc_proto/shm.py" in problems
    assert "pure wheel: RECORD lists smg_grpc_proto/py.typed, which is not in the wheel" in problems
    assert "pure wheel: RECORD does not list smg_grpc_proto/_native.abi3.so" in problems


def test_native_tags_outside_the_message_are_refused(tmp_path: Path):
    wheel = tmp_path / "smg_grpc_proto-0.6.0-cp310-abi3-manylinux_2_34_x86_64.whl"
    (problem,) = release.check_native_platforms(wheel, ("manylinux_2_28_x86_64",))
    assert "tagged manylinux_2_34_x86_64" in problem
    assert release.native_core_tags(ROOT) == ("manylinux_2_28_x86_64",)


def test_auditwheel_verdicts_are_checked_against_the_tag_and_glibc_2_28(tmp_path: Path):
    wheel = tmp_path / "smg_grpc_proto-0.6.0-cp310-abi3-manylinux_2_28_x86_64.whl"
    assert release.check_auditwheel(wheel, "manylinux_2_28_x86_64") == []
    assert release.check_auditwheel(wheel, "manylinux_2_17_x86_64") == []
    # A wheel linked against a newer glibc than its tag says, or than 2.28, is refused.
    tagged, too_new = release.check_auditwheel(wheel, "manylinux_2_34_x86_64")
    assert "is tagged manylinux_2_28_x86_64, but auditwheel show finds it needs" in tagged
    assert "manylinux_2_34_x86_64 only, not manylinux_2_28 or older" in too_new
    native = tmp_path / "smg_grpc_proto-0.6.0-cp310-abi3-manylinux_2_34_x86_64.whl"
    assert release.check_auditwheel(native, "manylinux_2_34_x86_64") == [
        too_new.replace(wheel.name, native.name)
    ]


def test_make_wheel_builds_with_the_release_flags():
    """`make wheel` (what CI installs and tests) and the release build the same wheel."""
    makefile = (ROOT / "Makefile").read_text()
    assert f"NATIVE_WHEEL_FLAGS := {' '.join(release.NATIVE_WHEEL_FLAGS)}\n" in makefile
    recipe = makefile.split("\nwheel:", 1)[1].split("\n\n", 1)[0]
    assert "maturin build --release --quiet $(NATIVE_WHEEL_FLAGS)" in recipe
    assert "CARGO_ZIGBUILD_PYTHON_PATH=" in recipe
    groups = PYPROJECT["dependency-groups"]["test"]
    assert any(g.startswith("ziglang") for g in groups)
    assert any(g.startswith("auditwheel") for g in groups)


def test_resolution_plan():
    # The native wheel for glibc 2.28 serves the x86_64 systems with 2.28 and newer.
    assert release.resolution_plan({"manylinux_2_28_x86_64"}) == [
        ("manylinux_2_28_x86_64", "native"),
        ("manylinux_2_34_x86_64", "native"),
        ("manylinux2014_x86_64", "pure"),
        ("manylinux2014_aarch64", "pure"),
        ("macosx_14_0_arm64", "pure"),
        ("macosx_13_0_x86_64", "pure"),
        ("win_amd64", "pure"),
    ]
    # pip --platform takes the one tag given; a real system takes every older glibc too.
    assert release.system_platforms("manylinux_2_34_x86_64")[:2] == [
        "manylinux_2_34_x86_64",
        "manylinux_2_33_x86_64",
    ]
    assert "manylinux_2_28_x86_64" in release.system_platforms("manylinux_2_34_x86_64")
    assert release.system_platforms("manylinux2014_aarch64")[:2] == [
        "manylinux_2_17_aarch64",
        "manylinux2014_aarch64",
    ]
    assert "manylinux_2_28_x86_64" not in release.system_platforms("manylinux2014_x86_64")
    assert release.system_platforms("macosx_14_0_arm64") == ["macosx_14_0_arm64"]
    plan = dict(release.resolution_plan({"manylinux_2_34_x86_64"}))
    assert plan["manylinux_2_28_x86_64"] == "pure"
    assert release.accepts("manylinux_2_39_x86_64", "manylinux_2_28_x86_64")
    assert not release.accepts("manylinux_2_39_aarch64", "manylinux_2_28_x86_64")
    assert release.accepts("manylinux_2_17_aarch64", "manylinux2014_aarch64")


@pytest.mark.slow
def test_pip_picks_the_native_wheel_on_its_platform_and_the_pure_one_elsewhere(
    pure_wheel: Path, tmp_path: Path
):
    folder = tmp_path / "index"
    native = _native_stand_in(pure_wheel, folder)
    pure = folder / pure_wheel.name
    pure.write_bytes(pure_wheel.read_bytes())
    version = release.SemVer.parse(PYPROJECT["project"]["version"])
    artifacts = release.Artifacts(folder / "none.tar.gz", native, pure)
    lines = release.check_resolution(
        ["--no-index", "--find-links", str(folder)], version, artifacts
    )
    assert lines[0] == "manylinux_2_28_x86_64 (CPython 3.10, 3.13): the native wheel"
    assert lines[1] == "manylinux_2_34_x86_64 (CPython 3.10, 3.13): the native wheel"
    assert lines[2] == "manylinux2014_x86_64 (CPython 3.10, 3.13): the pure wheel"
    assert len(lines) == 7
    # Without the native wheel, its platform gets the pure one.
    native.unlink()
    source = ["--no-index", "--find-links", str(folder)]
    assert release.pip_download(source, "manylinux_2_28_x86_64", "3.10", str(version)) == pure.name


def test_a_wrong_pick_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    native = tmp_path / "smg_grpc_proto-0.6.0-cp310-abi3-manylinux_2_34_x86_64.whl"
    pure = tmp_path / "smg_grpc_proto-0.6.0-py3-none-any.whl"
    monkeypatch.setattr(release, "pip_download", lambda *args: pure.name)
    artifacts = release.Artifacts(tmp_path / "s.tar.gz", native, pure)
    with pytest.raises(release.ReleaseError) as info:
        release.check_resolution([], release.SemVer.parse("0.6.0"), artifacts)
    assert str(info.value).splitlines()[1:] == [
        f"    manylinux_2_34_x86_64, CPython {python}: pip picked {pure.name}, not the native wheel"
        for python in ("3.10", "3.13")
    ]


@pytest.mark.slow
def test_release_dry_run_wiring_with_a_stand_in_native_build(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
):
    """Steps 1-9 of a dry run on this checkout, the native wheel's compilation replaced by the
    stand-in (the real one is test_release.py's slow dry run, a 13-minute release build)."""
    real_run = release.run

    def run(cmd, *, cwd, env=None, what):
        if "maturin" in cmd and "build" in cmd:
            out = Path(cmd[cmd.index("--out") + 1])
            pure = build_pure_wheel.build(tmp_path / "for-stand-in", source=cwd)
            _native_stand_in(pure, out)
            return ""
        return real_run(cmd, cwd=cwd, env=env, what=what)

    monkeypatch.setattr(release, "run", run)
    monkeypatch.setattr(release, "check_native", lambda wheel, version: [])
    monkeypatch.setattr(release, "auditwheel_platform", lambda wheel: "manylinux_2_28_x86_64")
    status = release.main(["--repo", str(ROOT), "--bump", "minor"])
    out = capsys.readouterr()
    assert status == 0, out.out[-3000:] + out.err[-3000:]
    for n in range(1, 10):
        assert f"[{n}/9]" in out.out, out.out
    assert "smg_grpc_proto-0.6.0-py3-none-any.whl: the same files but the extension" in out.out
    assert "twine check --strict: ok (sdist and both wheels)" in out.out
    assert "manylinux_2_28_x86_64 (CPython 3.10, 3.13): the native wheel: ok" in out.out
    assert "manylinux2014_x86_64 (CPython 3.10, 3.13): the pure wheel: ok" in out.out
    assert "win_amd64 (CPython 3.10, 3.13): the pure wheel: ok" in out.out
    assert "would upload smg_grpc_proto-0.6.0.tar.gz, smg_grpc_proto-0.6.0-cp310-abi3" in out.out


def test_the_hosted_wheel_workflow_covers_the_platforms_built_elsewhere():
    """.github/workflows/wheels.yml (GitHub-hosted runners; not run on this project's CI machine)
    builds and tests the native wheels for Linux aarch64 and macOS arm64 and x86_64."""
    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "wheels.yml").read_text())
    builds = workflow["jobs"]["build"]["strategy"]["matrix"]["include"]
    assert {b["target"] for b in builds} == {
        "aarch64-unknown-linux-gnu",
        "aarch64-apple-darwin",
        "x86_64-apple-darwin",
    }
    assert [b["manylinux"] for b in builds if "linux" in b["target"]] == ["2_28"]
    test = workflow["jobs"]["test"]
    assert test["needs"] == "build"
    assert set(test["strategy"]["matrix"]["name"]) == {b["name"] for b in builds}
    commands = "\n".join(step.get("run", "") for step in test["steps"])
    assert 'python -m pytest -m "not slow"' in commands
    assert "python -m smg_grpc_proto.cli demo" in commands
    assert "auditwheel show" in commands
