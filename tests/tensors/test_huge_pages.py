"""SMG_GRPC_PROTO_HUGE_PAGES=0: fresh output buffers are not advised to transparent huge pages.

A 48 MiB request serialized into fresh memory takes a few dozen page faults with the advice
(2 MiB pages) and over ten thousand without it (4 KiB pages). Only meaningful where THP is in
``madvise`` mode: with ``always`` every large mapping gets huge pages anyway, with ``never`` none.
"""

from __future__ import annotations

import platform
import textwrap
from pathlib import Path

import pytest
from support.processes import python_child

from smg_grpc_proto import tensors

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MADVISE = THP.exists() and "[madvise]" in THP.read_text()

CHILD = textwrap.dedent(
    """
    import resource
    import numpy as np
    from smg_grpc_proto import tensors
    from smg_grpc_proto.generated import vllm_engine_pb2 as pb
    message = tensors.TensorMessage(pb.GenerateRequest(request_id="r"))
    message.attach("mm_inputs.pixel_values", np.ones((12 << 20,), dtype=np.float32))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    data = tensors.serialize(message)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(**env: str) -> int:
    return int(python_child(CHILD, **env).strip().splitlines()[-1])


@pytest.mark.skipif(
    not (MADVISE and platform.system() == "Linux" and tensors.backend == "native"),
    reason="transparent huge pages in madvise mode, Linux, the native extension",
)
def test_the_switch_turns_the_advice_off() -> None:
    advised = _faults()
    plain = _faults(SMG_GRPC_PROTO_HUGE_PAGES="0")
    # 48 MiB: 12 288 pages of 4 KiB; with huge pages 24 of 2 MiB (a fault may still fall back
    # to small pages when the kernel has no free huge page at hand, hence the margins).
    assert plain >= 10_000, plain
    assert advised < plain / 4, (advised, plain)
