"""Allocation failures under an address-space limit: a clean ``MemoryError`` naming the bytes.

Each case runs in a child process that builds its inputs, then caps its own address space
(``RLIMIT_AS``) at its current size plus some headroom smaller than the buffer the call needs,
and makes the call. Before the fix these calls aborted the interpreter (a Rust allocation
failure), raised a bare ``MemoryError()`` after CPython printed "SystemError: deallocated
bytearray object has exported buffers", or reported an allocation failure as a size limit
(``ProcessingLimitError``). Now each raises a ``MemoryError`` whose message gives the byte count
and what it was for, prints nothing, and the process exits normally: ``TensorMemoryError`` for
the tensor codec, ``ProcessingMemoryError`` for vision, both ``smg_grpc_proto.errors`` classes
with ``field`` (what the buffer was for) and ``actual`` (its size in bytes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's"
)

_CHILD = """
import json, resource, sys
import numpy as np

def _vm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")

{setup}

# The soft limit only: an unprivileged process cannot raise its hard limit back.
_soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + {headroom_mib} * 2**20, _hard))
try:
    {call}
except BaseException as exc:
    result = {{
        "type": type(exc).__name__,
        "mro": [c.__name__ for c in type(exc).__mro__],
        "message": str(exc),
        "field": getattr(exc, "field", None),
        "actual": getattr(exc, "actual", None),
    }}
else:
    result = {{"type": None}}
resource.setrlimit(resource.RLIMIT_AS, (_soft, _hard))
print(json.dumps(result))
"""


def run_limited(setup: str, call: str, headroom_mib: int) -> dict[str, Any]:
    """Runs `call` in a child under RLIMIT_AS = its size after `setup` + `headroom_mib`; returns
    what it raised, after checking the child exited normally and printed nothing to stderr."""
    code = _CHILD.format(setup=textwrap.dedent(setup), call=call.strip(), headroom_mib=headroom_mib)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, f"child died ({proc.returncode}): {proc.stderr[-2000:]}"
    assert proc.stderr == "", proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["type"] is not None, "the call succeeded: the limit did not bite"
    return result


def assert_out_of_memory(result: dict[str, Any], nbytes: int, what: str) -> None:
    assert "MemoryError" in result["mro"], result
    assert f"cannot allocate {nbytes} bytes" in result["message"], result
    assert what in result["message"], result


def test_interpolate_bicubic_large_output() -> None:
    # 3 x 16000 x 11020 float32 values: 2 115 840 000 bytes (within the 2**31 - 1 limit).
    result = run_limited(
        """
        from smg_grpc_proto import vision
        planes = np.zeros((3, 8, 8), np.float32)
        """,
        "vision.interpolate_bicubic(planes, (16000, 11020))",
        headroom_mib=300,
    )
    assert result["type"] == "ProcessingMemoryError"
    assert_out_of_memory(result, 3 * 16000 * 11020 * 4, "interpolated planes")
    assert (result["field"], result["actual"]) == ("interpolated planes", 3 * 16000 * 11020 * 4)


@pytest.mark.slow
@pytest.mark.parametrize("function", ["resize", "resize_torch"])
def test_resize_large_output(function: str) -> None:
    result = run_limited(
        """
        from smg_grpc_proto import vision
        image = np.zeros((8, 8, 3), np.uint8)
        """,
        f"vision.{function}(image, (20000, 20000))",
        headroom_mib=300,
    )
    assert result["type"] == "ProcessingMemoryError"
    assert_out_of_memory(result, 20000 * 20000 * 3, "output bytearray")
    assert (result["field"], result["actual"]) == ("output bytearray", 20000 * 20000 * 3)


_TENSOR_SETUP = """
from smg_grpc_proto import tensors, vllm_engine_pb2
array = np.ones(50_000_000, np.float32)  # 200 MB
request = tensors.TensorMessage(vllm_engine_pb2.GenerateRequest(request_id="r"))
request.attach("mm_inputs.pixel_values", array)
tensors.pack(array[:10], vllm_engine_pb2.TensorData)  # warm up the code paths
tensors.serialize(tensors.TensorMessage(vllm_engine_pb2.GenerateRequest(request_id="r")))
"""


@pytest.mark.slow
def test_pack_large_tensor() -> None:
    result = run_limited(
        _TENSOR_SETUP, "tensors.pack(array, vllm_engine_pb2.TensorData)", headroom_mib=100
    )
    assert result["type"] == "TensorMemoryError"
    assert "TensorError" in result["mro"], result
    assert_out_of_memory(result, 200_000_000, "output bytes")
    assert (result["field"], result["actual"]) == ("output bytes", 200_000_000)


@pytest.mark.slow
def test_serialize_large_request() -> None:
    result = run_limited(_TENSOR_SETUP, "tensors.serialize(request)", headroom_mib=100)
    assert result["type"] == "TensorMemoryError"
    assert "output bytes" in result["message"], result
    # The whole request: the 200 MB payload plus a few bytes of header.
    nbytes = int(result["message"].split("cannot allocate ")[1].split()[0])
    assert 200_000_000 < nbytes < 200_000_100, result


_QWEN = """
from smg_grpc_proto.vision import ImageProcessor
processor = ImageProcessor("qwen2_vl", {"max_pixels": 10**12, "min_pixels": 1})
processor(np.zeros((64, 64, 3), np.uint8))
"""


@pytest.mark.slow
def test_qwen2_vl_large_image_names_the_allocation() -> None:
    # 8000 x 8000 becomes 8008 x 8008 (multiples of 28); pixel_values holds each patch twice
    # (temporal_patch_size 2): 8008 * 8008 * 3 * 2 float32 values. Before the fix this said
    # "pixel_values is too large: 1539073536 (at most 17179869184)", a limit it is under.
    result = run_limited(
        _QWEN + "image = np.full((8000, 8000, 3), 128, np.uint8)\n",
        "processor(image)",
        headroom_mib=300,
    )
    assert result["type"] == "ProcessingMemoryError"
    assert "ImageProcessingError" in result["mro"]
    nbytes = 8008 * 8008 * 3 * 2 * 4
    assert_out_of_memory(result, nbytes, "pixel_values")
    assert (result["field"], result["actual"]) == ("pixel_values", nbytes)


def test_qwen2_vl_deferred_copies_its_input_fallibly() -> None:
    # 7980 = 285 * 28: the image is used unresized, so the deferred batch copies the caller's
    # array to own it (191 MB); before the fix a failed copy aborted the process.
    result = run_limited(
        _QWEN + "image = np.full((7980, 7980, 3), 128, np.uint8)\n",
        "processor.deferred(image)",
        headroom_mib=100,
    )
    assert result["type"] == "ProcessingMemoryError"
    assert_out_of_memory(result, 7980 * 7980 * 3, "copy of an image")


def test_clip_large_grayscale_image() -> None:
    # A 2-D (grayscale) array is converted to RGB first: 300 MB, more than the headroom.
    result = run_limited(
        """
        from smg_grpc_proto.vision import ImageProcessor
        processor = ImageProcessor.for_family("clip")
        processor(np.zeros((64, 64), np.uint8))
        image = np.full((10000, 10000), 7, np.uint8)
        """,
        "processor(image)",
        headroom_mib=200,
    )
    assert result["type"] == "ProcessingMemoryError"
    assert_out_of_memory(result, 10000 * 10000 * 3, "image converted to RGB")


@pytest.mark.slow
def test_llama4_large_rgba_image() -> None:
    # Torch backend; a 4-channel array is composited onto white into an RGB copy (192 MB).
    result = run_limited(
        """
        from smg_grpc_proto.vision import ImageProcessor
        processor = ImageProcessor.for_family("llama4")
        processor(np.zeros((64, 64, 4), np.uint8))
        image = np.full((8000, 8000, 4), 200, np.uint8)
        """,
        "processor(image)",
        headroom_mib=120,
    )
    assert result["type"] == "ProcessingMemoryError"
    assert_out_of_memory(result, 8000 * 8000 * 3, "image converted to RGB")


@pytest.mark.slow
def test_phi3_v_large_hd_image() -> None:
    # num_crops 1000: the HD image is 31 tiles of 336 wide, 10416 x 10416 x 3 bytes once
    # resized; before the fix its failed allocation was reported as "too large".
    result = run_limited(
        """
        from smg_grpc_proto.vision import ImageProcessor
        processor = ImageProcessor("phi3_v", {"num_crops": 1000})
        processor(np.zeros((64, 64, 3), np.uint8))
        image = np.full((1000, 1000, 3), 90, np.uint8)
        """,
        "processor(image)",
        headroom_mib=300,
    )
    assert result["type"] == "ProcessingMemoryError"
    assert_out_of_memory(result, 10416 * 10416 * 3, "resized image")
