"""TensorRT-LLM (``trtllm``): the encoded image files, which the engine preprocesses itself.

Gateway side, :func:`generate_request` puts the prompt — one anchor token per image, *not*
expanded: TensorRT-LLM's input processor expands, hashes and encodes — in
``tokenized.input_token_ids`` and the encoded files, in prompt order, in
``multimodal_input.image_data`` (:func:`fill_mm_inputs` adds the files to a request built
elsewhere). Images come as bytes, paths or a :class:`PreparedMedia` made from encoded inputs;
decoded pixels cannot be sent (the contract carries no tensors:
:class:`~smg_grpc_proto.errors.MultimodalNotSupportedError`).

Engine side, :func:`decode_mm_inputs` returns the files after checking that each is a
non-empty JPEG, PNG, GIF, BMP or WebP file and, given ``image_token_id``, that the prompt holds
one anchor per file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.engines._media import (
    PreparedMedia,
    image_format,
    put_prompt,
)
from smg_grpc_proto.engines._tensors import TensorSource, refuse_cross_attention
from smg_grpc_proto.errors import MultimodalError, MultimodalNotSupportedError, PlaceholderError
from smg_grpc_proto.generated import trtllm_service_pb2 as pb
from smg_grpc_proto.tensors import TensorMessage
from smg_grpc_proto.vision._inputs import read_file

__all__ = ["decode_mm_inputs", "fill_mm_inputs", "generate_request"]


def _files(media: PreparedMedia | Sequence[Any]) -> list[bytes]:
    if isinstance(media, PreparedMedia):
        refuse_cross_attention(media, "TensorRT-LLM", "media.family")
        if media.modality != "image":
            raise MultimodalNotSupportedError(
                f"TensorRT-LLM's contract carries image files only, got {media.modality}",
                field="media.modality",
                expected="image",
                actual=media.modality,
            )
        if not media.encoded or any(e is None for e in media.encoded):
            raise MultimodalNotSupportedError(
                "TensorRT-LLM needs the encoded files; this PreparedMedia was made from decoded "
                "pixels (prepare it from bytes or paths)",
                field="media",
            )
        return [e for e in media.encoded if e is not None]
    files = []
    for i, image in enumerate(media):
        if isinstance(image, (bytes, bytearray, memoryview)):
            files.append(bytes(image))
        elif isinstance(image, (str, os.PathLike)):
            files.append(read_file(image, f"media[{i}]"))
        else:
            raise MultimodalError(
                f"media[{i}] is a {type(image).__name__}; TensorRT-LLM takes encoded files "
                "(bytes or paths)",
                field=f"media[{i}]",
                actual=type(image).__name__,
            )
    return files


def _check_files(files: Sequence[bytes], field: str) -> None:
    for i, data in enumerate(files):
        if not data:
            raise MultimodalError(f"{field}[{i}] is empty", field=f"{field}[{i}]", actual=0)
        if image_format(data) is None:
            raise MultimodalError(
                f"{field}[{i}]: not a JPEG, PNG, GIF, BMP or WebP file (starts with "
                f"{bytes(data[:8]).hex()}, {len(data)} bytes)",
                field=f"{field}[{i}]",
                actual=bytes(data[:8]).hex(),
            )


def _check_anchors(ids: npt.NDArray[Any], token: int | None, n: int, field: str) -> None:
    if token is None:
        return
    anchors = int(np.count_nonzero(ids == token))
    if anchors != n:
        raise PlaceholderError(
            f"{field} holds {anchors} image anchor token(s) ({token}) for {n} image file(s); "
            "the prompt needs exactly one anchor per image",
            field=field,
            expected=n,
            actual=anchors,
        )


def generate_request(
    request_id: str,
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: PreparedMedia | Sequence[Any] = (),
    *,
    max_tokens: int,
    streaming: bool = False,
    sampling_config: pb.SamplingConfig | None = None,
    image_token_id: int | None = None,
) -> TensorMessage[pb.GenerateRequest]:
    """A ``GenerateRequest`` with the prompt as given and the images' encoded files (``media``:
    a :class:`PreparedMedia` made from encoded inputs, or the files as bytes or paths).
    ``image_token_id`` (taken from a :class:`PreparedMedia` when not given) checks one anchor
    per image. TensorRT-LLM requires ``request_id`` and ``max_tokens``."""
    if not request_id:
        raise MultimodalError("request_id is empty; TensorRT-LLM requires one", field="request_id")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise MultimodalError(
            f"max_tokens = {max_tokens!r}: must be an int >= 1",
            field="max_tokens",
            actual=max_tokens,
        )
    request = pb.GenerateRequest(request_id=request_id, max_tokens=max_tokens, streaming=streaming)
    put_prompt(request.tokenized, "input_token_ids", input_ids, [])
    ids = np.asarray(request.tokenized.input_token_ids, dtype=np.int64)
    files = _checked_files(media, ids, image_token_id, "input_ids")
    if sampling_config is not None:
        request.sampling_config.CopyFrom(sampling_config)
    if files:
        request.multimodal_input.image_data.extend(files)
    return TensorMessage(request)


def fill_mm_inputs(
    message: TensorMessage[pb.GenerateRequest],
    media: PreparedMedia | Sequence[Any],
    *,
    image_token_id: int | None = None,
) -> None:
    """Fill ``multimodal_input.image_data`` of a request whose ``tokenized.input_token_ids``
    hold the prompt with one anchor per image (TensorRT-LLM expands it itself); files and
    anchors are checked as in :func:`generate_request`."""
    request = message.message
    ids = np.asarray(request.tokenized.input_token_ids, dtype=np.int64)
    files = _checked_files(media, ids, image_token_id, "tokenized.input_token_ids")
    if not files:
        return
    if request.HasField("multimodal_input"):
        raise MultimodalError(
            "the request's multimodal_input is filled already", field="multimodal_input"
        )
    request.multimodal_input.image_data.extend(files)


def _checked_files(
    media: PreparedMedia | Sequence[Any],
    ids: npt.NDArray[Any],
    image_token_id: int | None,
    ids_field: str,
) -> list[bytes]:
    files = _files(media)
    _check_files(files, "media")
    if image_token_id is None and isinstance(media, PreparedMedia):
        image_token_id = media.token_id
    if files:
        _check_anchors(ids, image_token_id, len(files), ids_field)
    return files


def decode_mm_inputs(
    request: TensorSource[pb.GenerateRequest], *, image_token_id: int | None = None
) -> tuple[bytes, ...]:
    """The encoded image files of ``multimodal_input`` (empty without it), checked."""
    message: pb.GenerateRequest = request.message if isinstance(request, TensorMessage) else request
    if not message.HasField("multimodal_input"):
        return ()
    files = tuple(message.multimodal_input.image_data)
    if not files:
        raise MultimodalError(
            "multimodal_input.image_data is empty: a present multimodal_input needs a file",
            field="multimodal_input.image_data",
        )
    _check_files(files, "multimodal_input.image_data")
    ids = np.asarray(message.tokenized.input_token_ids, dtype=np.int64)
    _check_anchors(ids, image_token_id, len(files), "tokenized.input_token_ids")
    return files
