"""TensorRT-LLM (``trtllm``): the encoded image files, which the engine preprocesses itself.

Gateway side, :func:`generate_request` puts the prompt — one anchor token per image, *not*
expanded: TensorRT-LLM's input processor expands, hashes and encodes — in
``tokenized.input_token_ids`` and the encoded files, in prompt order, in
``multimodal_input.image_data``. Images come as bytes, paths or a :class:`PreparedMedia` made
from encoded inputs; decoded pixels cannot be sent (the contract carries no tensors).

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

from smg_grpc_proto.engines._media import PreparedMedia, expand_placeholders
from smg_grpc_proto.engines._tensors import TensorSource
from smg_grpc_proto.errors import MultimodalError, PlaceholderError
from smg_grpc_proto.generated import trtllm_service_pb2 as pb
from smg_grpc_proto.tensors import TensorMessage
from smg_grpc_proto.vision._inputs import read_file

__all__ = ["decode_mm_inputs", "generate_request", "image_format"]

_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)


def image_format(data: bytes) -> str | None:
    """``"jpeg"``, ``"png"``, ``"gif"``, ``"bmp"`` or ``"webp"`` from the file's signature;
    ``None`` for anything else."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((name for magic, name in _MAGIC if data.startswith(magic)), None)


def _files(images: PreparedMedia | Sequence[Any]) -> list[bytes]:
    if isinstance(images, PreparedMedia):
        if images.modality != "image":
            raise MultimodalError(
                f"TensorRT-LLM takes images, got {images.modality}", field="images.modality"
            )
        if not images.encoded or any(e is None for e in images.encoded):
            raise MultimodalError(
                "TensorRT-LLM needs the encoded files; this PreparedMedia was made from decoded "
                "pixels (prepare it from bytes or paths)",
                field="images",
            )
        return [e for e in images.encoded if e is not None]
    files = []
    for i, image in enumerate(images):
        if isinstance(image, (bytes, bytearray, memoryview)):
            files.append(bytes(image))
        elif isinstance(image, (str, os.PathLike)):
            files.append(read_file(image, f"images[{i}]"))
        else:
            raise MultimodalError(
                f"images[{i}] is a {type(image).__name__}; TensorRT-LLM takes encoded files "
                "(bytes or paths)",
                field=f"images[{i}]",
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
    images: PreparedMedia | Sequence[Any] = (),
    *,
    max_tokens: int,
    streaming: bool = False,
    sampling_config: pb.SamplingConfig | None = None,
    image_token_id: int | None = None,
) -> TensorMessage[pb.GenerateRequest]:
    """A ``GenerateRequest`` with the prompt as given and the images' encoded files.
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
    ids = expand_placeholders(input_ids, [])[0]
    files = _files(images)
    _check_files(files, "images")
    if image_token_id is None and isinstance(images, PreparedMedia):
        image_token_id = images.token_id
    if files:
        _check_anchors(ids, image_token_id, len(files), "input_ids")
    request = pb.GenerateRequest(request_id=request_id, max_tokens=max_tokens, streaming=streaming)
    request.tokenized.input_token_ids.extend(ids.tolist())
    if sampling_config is not None:
        request.sampling_config.CopyFrom(sampling_config)
    if files:
        request.multimodal_input.image_data.extend(files)
    return TensorMessage(request)


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
