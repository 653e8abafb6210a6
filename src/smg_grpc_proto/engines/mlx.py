"""MLX (``mlx.grpc.engine``): text only — the contract carries no media.

:func:`generate_request` builds a tokenized ``GenerateRequest`` and refuses media with a clear
error rather than dropping it; :func:`decode_mm_inputs` exists so that code handling every
engine alike can call it, and always returns ``()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy.typing as npt

from smg_grpc_proto.engines._media import PreparedMedia, expand_placeholders
from smg_grpc_proto.engines._tensors import TensorSource
from smg_grpc_proto.errors import MultimodalError
from smg_grpc_proto.generated import mlx_engine_pb2 as pb
from smg_grpc_proto.tensors import TensorMessage

__all__ = ["decode_mm_inputs", "generate_request"]


def generate_request(
    request_id: str,
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: PreparedMedia | Sequence[PreparedMedia] = (),
    *,
    sampling_params: pb.SamplingParams | None = None,
    stream: bool = False,
) -> TensorMessage[pb.GenerateRequest]:
    """A tokenized ``GenerateRequest``; any ``media`` raises (MLX's contract has no field for
    it, and a silently text-only answer to an image question is wrong)."""
    given = [media] if isinstance(media, PreparedMedia) else list(media)
    if given:
        raise MultimodalError(
            f"MLX's contract carries no media; got {len(given)} PreparedMedia "
            "(send text only, or use an engine with multimodal input)",
            field="media",
            actual=len(given),
        )
    request = pb.GenerateRequest(request_id=request_id, stream=stream)
    request.tokenized.input_ids.extend(expand_placeholders(input_ids, [])[0].tolist())
    if sampling_params is not None:
        request.sampling_params.CopyFrom(sampling_params)
    return TensorMessage(request)


def decode_mm_inputs(request: TensorSource[pb.GenerateRequest]) -> tuple[()]:
    """Always ``()``: MLX requests carry no multimodal input."""
    return ()
