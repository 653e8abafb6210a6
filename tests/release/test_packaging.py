"""The wheel: its contents, its metadata, and the protobuf/grpcio runtime matrix it loads on.

The wheel is built once per session (conftest.built_wheel). Each matrix cell is a fresh virtual
environment (uv) holding only the wheel and the pinned protobuf and grpcio, where
``support/runtime_smoke.py`` imports every stub module with warnings as errors, round-trips a
populated instance of every message and serves a real gRPC call on loopback. Every cell must
produce the same wire bytes (same digest).
"""

from __future__ import annotations

import email
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "tests" / "support" / "runtime_smoke.py"
FILES = [
    "common",
    "sglang_scheduler",
    "sglang_encoder",
    "vllm_engine",
    "trtllm_service",
    "mlx_engine",
    "tokenspeed_scheduler",
    "tokenspeed_encoder",
]

# The declared protobuf floor (== gencode stamp), the newest patch of 5.29 and 6.33, the newest 7.x.
PROTOBUF = ["5.26.1", "5.29.6", "6.33.6", "7.36.2"]
# The declared grpcio floor (== GRPC_GENERATED_VERSION of the stubs) and the newest release.
GRPCIO = ["1.63.2", "1.85.3"]


def test_wheel_contents(built_wheel: Path):
    names = set(zipfile.ZipFile(built_wheel).namelist())
    assert "-abi3-" in built_wheel.name, built_wheel.name
    assert "smg_grpc_proto/py.typed" in names
    assert "smg_grpc_proto/_native.pyi" in names
    assert any(
        n.startswith("smg_grpc_proto/_native.") and n.endswith((".so", ".pyd")) for n in names
    ), sorted(names)
    for f in FILES:
        assert f"smg_grpc_proto/proto/{f}.proto" in names
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi"):
            assert f"smg_grpc_proto/generated/{f}{suffix}" in names
    assert "smg_grpc_proto/dataclasses/vllm/grpc/engine/__init__.py" in names
    assert "smg_grpc_proto/dataclasses/py.typed" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_wheel_metadata(built_wheel: Path):
    with zipfile.ZipFile(built_wheel) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(zf.read(meta_name))
    requires = meta.get_all("Requires-Dist")
    assert "protobuf<8,>=5.26.1" in requires or "protobuf>=5.26.1,<8" in requires, requires
    assert "grpcio>=1.63.2" in requires
    assert meta["Requires-Python"] == ">=3.10"
    assert any("betterproto2" in r and "extra == 'dataclasses'" in r for r in requires), requires


def _uv() -> list[str]:
    return [sys.executable, "-m", "uv"]


@pytest.fixture(scope="module")
def matrix_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("matrix")


def _make_env(root: Path, wheel: Path, protobuf: str, grpcio: str) -> Path:
    env = root / f"pb{protobuf}-grpc{grpcio}"
    subprocess.run(
        [*_uv(), "venv", "--quiet", "--python", sys.executable, str(env)], check=True, timeout=300
    )
    python = env / "bin" / "python"
    subprocess.run(
        [
            *_uv(),
            "pip",
            "install",
            "--quiet",
            "--python",
            str(python),
            str(wheel),
            f"protobuf=={protobuf}",
            f"grpcio=={grpcio}",
        ],
        check=True,
        timeout=600,
    )
    return python


def _smoke(python: Path, implementation: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["GRPC_VERBOSITY"] = "ERROR"  # grpc core logs connection teardown at INFO on stderr
    if implementation == "python":
        env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    # Run from the smoke script's folder so only the installed wheel provides smg_grpc_proto.
    result = subprocess.run(
        [str(python), "-W", "error", str(SMOKE), implementation],
        cwd=SMOKE.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stderr == "", result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_runtime_matrix(built_wheel: Path, matrix_root: Path):
    results = {}
    for protobuf in PROTOBUF:
        for grpcio in GRPCIO:
            python = _make_env(matrix_root, built_wheel, protobuf, grpcio)
            for impl in ("upb", "python"):
                summary = _smoke(python, impl)
                assert summary["protobuf"] == protobuf
                assert summary["grpcio"] == grpcio
                assert summary["loopback"] == "ok"
                assert summary["tensors"] == "native"
                results[(protobuf, grpcio, impl)] = summary
    digests = {s["digest"] for s in results.values()}
    counts = {(s["messages"], s["roundtrips"]) for s in results.values()}
    assert len(digests) == 1, {k: v["digest"] for k, v in results.items()}
    assert len(counts) == 1, counts
    ((n_messages, _),) = counts
    assert n_messages >= 185
