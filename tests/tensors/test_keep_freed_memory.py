"""keep_freed_memory: freed request buffers are reused instead of fresh pages (glibc only)."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from smg_grpc_proto import tensors

GLIBC = platform.libc_ver()[0] == "glibc" and tensors.backend == "native"

# Serializes a 48 MiB request a few times and prints the minor page faults of the last call; with
# keep_freed_memory the freed bytes object's pages are reused, so (almost) none are taken.
CHILD = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from smg_grpc_proto import tensors
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb
    if sys.argv[1] == "keep":
        assert tensors.keep_freed_memory(256 << 20) is True
    message = tensors.TensorMessage(pb.GenerateRequest(request_id="r"))
    message.attach("mm_inputs.pixel_values", np.ones((12 << 20,), dtype=np.float32))
    faults = []
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        data = tensors.serialize(message)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        assert len(data) > 48 << 20
        del data
    print(faults[-1])
    """
)


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator and the native extension only")
def test_freed_requests_are_reused_without_page_faults() -> None:
    fresh = _faults("default")
    kept = _faults("keep")
    # 48 MiB of fresh memory is at least 24 huge-page (or 12288 small-page) faults per call.
    assert fresh >= 20
    assert kept < fresh / 4


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1"])
def test_bad_sizes_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="max_bytes must be a positive int"):
        tensors.keep_freed_memory(bad)  # type: ignore[arg-type]
