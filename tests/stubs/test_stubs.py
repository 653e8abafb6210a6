"""The generated stubs: fresh, stamped for the runtime floor, importable both ways, lazy."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import smg_grpc_proto
from smg_grpc_proto import generated

ROOT = Path(__file__).resolve().parents[2]
PKG = Path(smg_grpc_proto.__file__).parent
GEN = PKG / "generated"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirement_floor(name: str) -> str:
    for dep in PYPROJECT["project"]["dependencies"]:
        m = re.fullmatch(rf"{name}>=([\d.]+)(,.*)?", dep)
        if m:
            return m.group(1)
    raise AssertionError(f"no {name}>= floor in pyproject dependencies")


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


@pytest.mark.slow
def test_generated_files_are_fresh():
    """Regenerating from protos/ with the pinned generators reproduces the committed files."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_stubs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-5000:]


def test_gencode_stamp_equals_declared_protobuf_floor():
    """Each _pb2.py states its gencode version; a runtime check must not exceed the floor."""
    floor = _requirement_floor("protobuf")
    stamps = set()
    for path in sorted(GEN.glob("*_pb2.py")):
        text = path.read_text()
        m = re.search(r"^# Protobuf Python Version: ([\d.]+)$", text, flags=re.MULTILINE)
        assert m, f"{path.name}: no gencode stamp"
        stamps.add(m.group(1))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == (
                "ValidateProtobufRuntimeVersion"
            ):
                major, minor, patch = (a.value for a in node.args[1:4])  # type: ignore[attr-defined]
                assert _version_tuple(floor) >= (major, minor, patch), path.name
    assert stamps == {floor}, f"gencode stamps {stamps} != declared protobuf floor {floor}"


def test_grpc_generated_version_equals_declared_grpcio_floor():
    floor = _requirement_floor("grpcio")
    for path in sorted(GEN.glob("*_pb2_grpc.py")):
        m = re.search(
            r"^GRPC_GENERATED_VERSION = '([\d.]+)'$", path.read_text(), flags=re.MULTILINE
        )
        assert m, path.name
        assert m.group(1) == floor, f"{path.name}: generated for grpcio {m.group(1)}, floor {floor}"


def test_every_module_importable_both_ways():
    assert set(generated.MODULES) == {p.stem for p in GEN.glob("*.py") if p.stem != "__init__"}
    assert len(generated.MODULES) == 16
    for name in generated.MODULES:
        top = getattr(smg_grpc_proto, name)
        deep = __import__(f"smg_grpc_proto.generated.{name}", fromlist=["_"])
        assert top is deep
        assert name in dir(smg_grpc_proto)
        assert name in smg_grpc_proto.__all__
    with pytest.raises(AttributeError, match="no attribute 'vllm_engine_pb3'"):
        smg_grpc_proto.vllm_engine_pb3  # noqa: B018


def test_type_checking_imports_match_generated_modules():
    """__init__.py names every stub module for type checkers; the list must not drift."""
    tree = ast.parse((PKG / "__init__.py").read_text())
    names = {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "smg_grpc_proto.generated"
        for alias in node.names
        if alias.asname and not alias.asname.startswith("_")
    }
    assert names == set(generated.MODULES)


def test_stub_py_files_use_relative_imports_and_pyi_resolve():
    for path in sorted(GEN.glob("*_pb2*.py*")):
        for line in path.read_text().splitlines():
            m = re.match(r"^import (\w+_pb2(?:_grpc)?)\b", line)
            assert not m, f"{path.name}: absolute sibling import {line!r} does not resolve"


def _fresh_python(code: str, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_imports_are_lazy():
    out = _fresh_python(
        "import sys, smg_grpc_proto\n"
        "print(sorted(m for m in sys.modules if m.endswith(('_pb2', '_pb2_grpc'))))\n"
        "from smg_grpc_proto import vllm_engine_pb2_grpc\n"
        "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules\n"
        "             if m.endswith(('_pb2', '_pb2_grpc'))))\n"
        "print('smg_grpc_proto._native' in sys.modules)\n"
    )
    before, after, native = out.splitlines()
    assert before == "[]"
    assert after == "['common_pb2', 'vllm_engine_pb2', 'vllm_engine_pb2_grpc']"
    assert native == "False"


def test_version_is_static_and_consistent():
    cargo = tomllib.loads((ROOT / "rust" / "Cargo.toml").read_text())
    assert smg_grpc_proto.__version__ == PYPROJECT["project"]["version"]
    assert smg_grpc_proto.__version__ == cargo["package"]["version"]
    # No dist-info lookup: works even when the metadata is missing.
    src = (PKG / "_version.py").read_text() + (PKG / "__init__.py").read_text()
    assert "importlib.metadata" not in src


def test_native_module_is_the_built_crate():
    info = smg_grpc_proto.build_info()
    assert info["flavour"] == "native"
    assert info["version"] == smg_grpc_proto.__version__
    assert info["profile"] in {"release", "debug"}
    assert info["rustc"].startswith("rustc ")
    assert isinstance(info["cpu_features"], list)


def test_shipped_protos_equal_sources():
    shipped = {p.name: p.read_bytes() for p in (PKG / "proto").glob("*.proto")}
    sources = {p.name: p.read_bytes() for p in (ROOT / "protos").glob("*.proto")}
    assert shipped == sources
    assert (PKG / "py.typed").is_file()


def test_method_paths_match_the_wire_contract():
    from smg_grpc_proto import trtllm_service_pb2, vllm_engine_pb2

    vllm = vllm_engine_pb2.DESCRIPTOR.services_by_name["VllmEngine"]
    trt = trtllm_service_pb2.DESCRIPTOR.services_by_name["TrtllmService"]
    assert f"/{vllm.full_name}/{vllm.methods_by_name['Generate'].name}" == (
        "/vllm.grpc.engine.VllmEngine/Generate"
    )
    assert f"/{trt.full_name}/Generate" == "/trtllm.TrtllmService/Generate"
    counts = {
        "sglang_scheduler_pb2": 15,
        "vllm_engine_pb2": 12,
        "trtllm_service_pb2": 8,
        "tokenspeed_scheduler_pb2": 11,
        "mlx_engine_pb2": 6,
    }
    for module, n in counts.items():
        (svc,) = getattr(smg_grpc_proto, module).DESCRIPTOR.services_by_name.values()
        assert len(svc.methods) == n, module
