"""The package without its native core (the pure-Python wheel's situation), in one process.

A copy of the package without ``_native.*.so`` is imported in a subprocess: every module imports,
the tensors run on the numpy kernels, ``build_info()`` says ``"pure"`` and the vision entry
points raise ``NativeCoreUnavailableError``. The pure wheel itself is built and tested in
tests/release/test_pure_wheel.py.
"""

from __future__ import annotations

import json
import pickle
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import smg_grpc_proto
from smg_grpc_proto import _core, errors
from smg_grpc_proto.engines import _media
from smg_grpc_proto.vision import _decode

PKG = Path(smg_grpc_proto.__file__).parent

# Runs with the copy first on sys.path; prints what a pure installation does.
PROBE = r"""
import importlib, json, pkgutil, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import smg_grpc_proto
from smg_grpc_proto import errors

failed = {}
for m in pkgutil.walk_packages(smg_grpc_proto.__path__, "smg_grpc_proto."):
    if ".dataclasses" in m.name:
        continue  # optional extra (betterproto2), imported by its own tests
    try:
        importlib.import_module(m.name)
    except Exception as e:
        failed[m.name] = repr(e)

from smg_grpc_proto import tensors, vision
from smg_grpc_proto.tensors import _backend

array = np.arange(6, dtype=np.float32).reshape(2, 3)
calls = {}
for name, call in {
    "decode": lambda: vision.decode(b"\x89PNG\r\n\x1a\n"),
    "ImageProcessor": lambda: vision.ImageProcessor("qwen2_vl"),
}.items():
    try:
        call()
        calls[name] = None
    except errors.NativeCoreUnavailableError as e:
        calls[name] = [str(e), e.field, isinstance(e, ImportError)]

import contextlib, io
from pathlib import Path
from smg_grpc_proto import cli
commands = {}
for name, argv in {
    "preprocess": ["preprocess", "--family", "qwen2_vl", "--out", "x.npz", "--format", "npz",
                   str(Path(smg_grpc_proto.__file__).parent / "data" / "grace_hopper.jpg")],
    "demo": ["demo", "--repeat", "1"],
}.items():
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        commands[name] = [cli.main(argv), stdout.getvalue(), stderr.getvalue()]

# TensorRT-LLM carries the encoded files: built and decoded without the native core.
from smg_grpc_proto.engines import trtllm
photo = (Path(smg_grpc_proto.__file__).parent / "data" / "grace_hopper.jpg").read_bytes()
request = trtllm.generate_request("r1", [1, 9, 2], [photo], max_tokens=4, image_token_id=9)
files = trtllm.decode_mm_inputs(request.to_message(), image_token_id=9)
try:
    trtllm.generate_request("r2", [1, 9, 2], [b"not an image"], max_tokens=4)
    refused = None
except errors.MultimodalError as e:
    refused = str(e)

print(json.dumps({
    "trtllm": [files == (photo,), refused],
    "commands": commands,
    "file": smg_grpc_proto.__file__,
    "failed": failed,
    "backend": _backend.backend,
    "build_info": smg_grpc_proto.build_info(),
    "calls": calls,
}))
"""


@pytest.fixture(scope="module")
def pure_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("pure") / "site"
    shutil.copytree(
        PKG,
        root / "smg_grpc_proto",
        ignore=shutil.ignore_patterns("_native.*.so", "_native.*.pyd", "__pycache__"),
    )
    assert not list((root / "smg_grpc_proto").glob("_native.*.so"))
    result = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, str(root)],
        cwd=root.parent,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["file"].startswith(str(root)), out["file"]
    return out


@pytest.mark.parametrize("command", ["preprocess", "demo"])
def test_cli_commands_needing_the_core_fail_with_the_message(pure_run, command):
    status, out, err = pure_run["commands"][command]
    assert status == 2
    assert err.startswith(f"smg-proto {command}: error: smg_grpc_proto._native.")
    assert "Traceback" not in err
    assert "pure-Python wheel (py3-none-any)" in err
    if command == "demo":
        assert "pure-Python wheel (no native core" in out


def test_every_module_imports_without_the_native_core(pure_run):
    assert pure_run["failed"] == {}


def test_tensors_use_the_numpy_kernels(pure_run):
    assert pure_run["backend"] == "numpy"


def test_build_info_says_pure(pure_run):
    assert pure_run["build_info"] == {
        "flavour": "pure",
        "version": smg_grpc_proto.__version__,
        "profile": "",
        "target": "",
        "rustc": "",
        "cpu_features": [],
    }


@pytest.mark.parametrize("call", ["decode", "ImageProcessor"])
def test_vision_calls_raise_the_documented_error(pure_run, call):
    message, field, is_import_error = pure_run["calls"][call]
    assert is_import_error
    assert field.startswith("smg_grpc_proto._native.")
    assert field in message
    assert "pure-Python wheel (py3-none-any)" in message
    for tag in _core.NATIVE_WHEEL_TAGS:
        assert tag in message
    assert "pip install --no-binary smg-grpc-proto smg-grpc-proto" in message
    assert "build_info()" in message


def test_the_stand_in_raises_on_every_attribute():
    absent = _core._Absent(None)
    with pytest.raises(errors.NativeCoreUnavailableError) as info:
        absent.media_digest  # noqa: B018
    assert info.value.field == "smg_grpc_proto._native.media_digest"
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value, errors.SmgProtoError)
    again = pickle.loads(pickle.dumps(info.value))
    assert (type(again), str(again), again.field) == (
        errors.NativeCoreUnavailableError,
        str(info.value),
        info.value.field,
    )


def test_a_native_core_that_fails_to_load_is_named_with_its_error():
    error = _core.unavailable("x.y", ImportError("GLIBC_2.34 not found"))
    assert "failed to load: GLIBC_2.34 not found" in str(error)
    assert "pure-Python wheel" not in str(error)


def test_native_build_info_says_native():
    info = smg_grpc_proto.build_info()
    assert info["flavour"] == "native"
    assert _core.AVAILABLE
    assert _core.LOAD_ERROR is None


def test_decode_limit_written_out_equals_the_native_one():
    assert _decode.DEFAULT_MAX_PIXELS == _core.native.DEFAULT_MAX_PIXELS


def test_trtllm_files_are_built_and_decoded_without_the_native_core(pure_run):
    same, refused = pure_run["trtllm"]
    assert same
    assert "media[0]: not a JPEG, PNG, GIF, BMP or WebP file" in refused


# The Python twin of the native signature check (engines.image_format without the core).
SIGNATURES = [
    b"\xff\xd8\xff\xe0",
    b"\x89PNG\r\n\x1a\n",
    b"GIF87a",
    b"GIF89a",
    b"BM",
    *(b"RIFF\0\0\0\0WEBP" + chunk for chunk in (b"VP8 ", b"VP8L", b"VP8X", b"VP8x", b"ALPH")),
    *(struct.pack("<I", size) for size in (11, 12, 13, 40, 52, 56, 64, 108, 124, 125, 2**31)),
    b"II*\x00",
    b"%PDF",
    b"",
]


@pytest.mark.parametrize("signature", SIGNATURES)
def test_sniff_twin_agrees_with_the_native_check_on_every_prefix(signature):
    data = signature + bytes(range(16))
    for end in range(len(data) + 1):
        head = data[:end][:16]
        assert _media._sniff(head) == _core.native.image_format(head), head


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=16),
        st.sampled_from(SIGNATURES).flatmap(
            lambda s: st.binary(max_size=16).map(lambda tail: (s + tail)[:16])
        ),
    )
)
def test_sniff_twin_agrees_with_the_native_check_on_random_heads(head):
    assert _media._sniff(head) == _core.native.image_format(head)
