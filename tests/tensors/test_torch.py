"""``tensors.unpack_torch`` against a real torch, in a virtual environment of its own.

torch is large (its PyPI wheels bring the CUDA runtime libraries; they load fine without a GPU),
so it is installed once into a uv-managed venv next to the built wheel instead of into the test
environment.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TORCH = "torch==2.15.0"

SCRIPT = textwrap.dedent(
    """
    import tempfile
    from pathlib import Path

    import numpy as np
    import torch

    from smg_grpc_proto import tensors, tokenspeed_scheduler_pb2, vllm_engine_pb2

    values = np.array([[1.5, -2.25, 3.0e38], [np.inf, -0.0, 7.0]], dtype=np.float32)

    # float32: same values, same memory as the numpy view of the payload
    td = vllm_engine_pb2.TensorData.FromString(
        tensors.pack(values, vllm_engine_pb2.TensorData).SerializeToString())
    t = tensors.unpack_torch(td)
    assert t.dtype == torch.float32 and tuple(t.shape) == (2, 3)
    assert t.tolist() == values.tolist()

    # bfloat16 arrives as torch.bfloat16 with exactly torch's own rounding of the values
    td = tensors.pack(values, tokenspeed_scheduler_pb2.TensorData, dtype="bfloat16")
    t = tensors.unpack_torch(td)
    assert t.dtype == torch.bfloat16
    expected = torch.from_numpy(values).to(torch.bfloat16)
    assert torch.equal(t.view(torch.int16), expected.view(torch.int16)), (t, expected)

    # float16 likewise
    td = tensors.pack(values, vllm_engine_pb2.TensorData, dtype="float16")
    assert torch.equal(tensors.unpack_torch(td), torch.from_numpy(values).to(torch.float16))

    # int64 through shared memory: the tensor views the read-only mapping (no copy), and the
    # segment is unlinked once mapped
    ids = np.arange(12, dtype=np.int64).reshape(3, 4)
    with tempfile.TemporaryDirectory() as d:
        td = tensors.pack(ids, vllm_engine_pb2.TensorData, transport="shm", shm_dir=Path(d))
        t = tensors.unpack_torch(td, shm_dir=Path(d))
        assert t.dtype == torch.int64 and t.tolist() == ids.tolist()
        assert list(Path(d).iterdir()) == []

    # the engine adapters' DecodedBatch.torch(): TokenSpeed's bfloat16 encoder input arrives as
    # torch.bfloat16 equal to torch's own rounding of the processor's float32 (no ml_dtypes
    # here), and vLLM's float32 pixels are shared with the received bytes, not copied
    from smg_grpc_proto.engines import VisionModel
    from smg_grpc_proto.engines import tokenspeed, vllm

    rng = np.random.default_rng(0)
    media = VisionModel.for_family("qwen2_vl").prepare(
        [rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)]
    )
    request = tokenspeed.generate_request("r", [1, 151655, 2], media)
    wire = tensors.serialize(request)
    (batch,) = tokenspeed.decode_mm_inputs(
        tensors.parse(wire, tokenspeed_scheduler_pb2.GenerateRequest)
    )
    got = batch.torch()
    want = torch.from_numpy(media.output.pixel_values).to(torch.bfloat16)
    assert got["pixel_values"].dtype == torch.bfloat16
    assert torch.equal(got["pixel_values"].view(torch.int16), want.view(torch.int16))
    assert got["image_grid_thw"].dtype == torch.int64
    request = vllm.generate_request("r", [1, 151655, 2], media)
    (batch,) = vllm.decode_mm_inputs(
        tensors.parse(tensors.serialize(request), vllm_engine_pb2.GenerateRequest)
    )
    pixels = batch.torch()["pixel_values"]
    assert pixels.dtype == torch.float32
    assert pixels.data_ptr() == batch.tensors["pixel_values"].__array_interface__["data"][0]
    assert torch.equal(pixels, torch.from_numpy(media.output.pixel_values))
    print("ok")
    """
)


@pytest.mark.slow
def test_unpack_torch(built_wheel: Path, tmp_path: Path):
    env = tmp_path / "torch-env"
    uv = [sys.executable, "-m", "uv"]
    subprocess.run(
        [*uv, "venv", "--quiet", "--python", sys.executable, str(env)], check=True, timeout=300
    )
    python = env / "bin" / "python"
    subprocess.run(
        [*uv, "pip", "install", "--quiet", "--python", str(python), str(built_wheel), TORCH],
        check=True,
        timeout=1800,
    )
    result = subprocess.run(
        [str(python), "-W", "error::DeprecationWarning", "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("ok")
