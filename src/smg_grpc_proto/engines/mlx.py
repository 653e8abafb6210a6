"""MLX (``mlx.grpc.engine``): text only — the contract carries no media.

:func:`generate_request` builds a tokenized ``GenerateRequest`` and refuses media with
:class:`~smg_grpc_proto.errors.MultimodalNotSupportedError` (a ``MultimodalError`` and a
``NotImplementedError``) rather than dropping it. :func:`fill_mm_inputs` and
:func:`decode_mm_inputs` exist so that code handling every engine alike can call them: the first
accepts no media (and refuses any the same way), the second always returns ``()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy.typing as npt

from smg_grpc_proto.engines._media import PreparedMedia, put_prompt
from smg_grpc_proto.engines._tensors import TensorSource
from smg_grpc_proto.errors import MultimodalNotSupportedError
from smg_grpc_proto.generated import mlx_engine_pb2 as pb
from smg_grpc_proto.tensors import TensorMessage

__all__ = ["decode_mm_inputs", "fill_mm_inputs", "generate_request"]


def generate_request(
    request_id: str,
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: PreparedMedia | Sequence[PreparedMedia] = (),
    *,
    sampling_params: pb.SamplingParams | None = None,
    stream: bool = False,
) -> TensorMessage[pb.GenerateRequest]:
    """A tokenized ``GenerateRequest``; any ``media`` raises
    :class:`~smg_grpc_proto.errors.MultimodalNotSupportedError` (MLX's contract has no field
    for it, and a silently text-only answer to an image question is wrong)."""
    _refuse(media)
    request = pb.GenerateRequest(request_id=request_id, stream=stream)
    put_prompt(request.tokenized, "input_ids", input_ids, [])
    if sampling_params is not None:
        request.sampling_params.CopyFrom(sampling_params)
    return TensorMessage(request)


def fill_mm_inputs(
    message: TensorMessage[pb.GenerateRequest],
    media: PreparedMedia | Sequence[PreparedMedia],
) -> None:
    """Nothing to fill: no media is accepted (empty ``media`` leaves the request as it is;
    any media raises :class:`~smg_grpc_proto.errors.MultimodalNotSupportedError`)."""
    _refuse(media)


def decode_mm_inputs(request: TensorSource[pb.GenerateRequest]) -> tuple[()]:
    """Always ``()``: MLX requests carry no multimodal input."""
    return ()


def _refuse(media: PreparedMedia | Sequence[PreparedMedia]) -> None:
    given = [media] if isinstance(media, PreparedMedia) else list(media)
    if given:
        raise MultimodalNotSupportedError(
            f"MLX's contract carries no media; got {len(given)} PreparedMedia "
            "(send text only, or use an engine with multimodal input)",
            field="media",
            actual=len(given),
        )
