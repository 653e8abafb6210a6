"""Fresh output buffers are faulted in before they are written, split over the writing threads.

``memory/prefault.rs`` asks the kernel (``MADV_POPULATE_WRITE``) to map a fresh request buffer of
4 MiB or more before the writers fill it, one part per writing thread. The Rust tests check that
the pages are mapped and their contents untouched; here, whole requests: a Qwen2-VL request of
30 MB written by one thread and by one per core is the same message with prefaulting on (the
default) and off (``SMG_GRPC_PROTO_PREFAULT=0``).
"""

from __future__ import annotations

import textwrap

import pytest
from support.processes import python_child

from smg_grpc_proto import tensors

CHILD = textwrap.dedent(
    """
    import hashlib
    import numpy as np
    from smg_grpc_proto import tensors
    from smg_grpc_proto.engines import VisionModel
    from smg_grpc_proto.engines import vllm
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb

    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (700, 900, 3), dtype=np.uint8) for _ in range(2)]
    model = VisionModel.for_family("qwen2_vl")
    for threads in (1, 0):
        media = model.prepare(images, threads=threads)
        ids = [1, *([media.anchor] * media.count), 2]
        data = tensors.serialize(vllm.generate_request("r", ids, media))
        # Map fields (the side tensors) serialize in an order that varies between processes:
        # the message is compared in protobuf's deterministic encoding.
        same = pb.GenerateRequest.FromString(data).SerializeToString(deterministic=True)
        print(threads, len(data), hashlib.sha256(same).hexdigest())
    """
)


def _digests(**env: str) -> list[str]:
    return python_child(CHILD, **env).strip().splitlines()[-2:]


@pytest.mark.skipif(tensors.backend != "native", reason="the native extension")
def test_requests_are_the_same_with_and_without_prefaulting() -> None:
    on = _digests()
    off = _digests(SMG_GRPC_PROTO_PREFAULT="0")
    assert on == off
    (one, length, digest), (many, length_many, digest_many) = (line.split() for line in on)
    assert (one, many) == ("1", "0")
    # Two 700 x 900 images: 2 x 50 x 64 patches of 1176 float32 values, plus the rest.
    assert int(length) > 2 * 50 * 64 * 1176 * 4 > 4 << 20
    assert (length, digest) == (length_many, digest_many)
