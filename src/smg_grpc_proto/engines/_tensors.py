"""The adapters' thin use of :mod:`smg_grpc_proto.tensors`: attach on send, read on receive."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeAlias, TypeVar

import numpy.typing as npt
from google.protobuf.message import Message

from smg_grpc_proto import shm
from smg_grpc_proto.engines._media import PreparedMedia
from smg_grpc_proto.errors import MultimodalError, SmgProtoError, TensorError
from smg_grpc_proto.tensors import ShmRead, TensorMessage, Transport, shm_payloads, unpack

M = TypeVar("M", bound=Message)
TensorSource: TypeAlias = "TensorMessage[M] | M"
"""A request as received: a :class:`TensorMessage` (zero-copy frames) or a plain message."""


def as_media_list(media: PreparedMedia | Sequence[PreparedMedia]) -> list[PreparedMedia]:
    items = [media] if isinstance(media, PreparedMedia) else list(media)
    for i, item in enumerate(items):
        if not isinstance(item, PreparedMedia):
            raise MultimodalError(
                f"media[{i}] is a {type(item).__name__}, not PreparedMedia (use "
                "VisionModel.prepare or PreparedMedia.from_output)",
                field=f"media[{i}]",
                actual=type(item).__name__,
            )
    modalities = [m.modality for m in items]
    if len(set(modalities)) != len(modalities):
        raise MultimodalError(
            f"one PreparedMedia per modality, got {modalities}", field="media", actual=modalities
        )
    return items


@contextmanager
def unlink_on_failure(message: TensorMessage[Any]) -> Iterator[None]:
    """Unlink the shared-memory segments written inside the block if it fails (segments the
    message held before are left alone)."""
    before = len(message.shm_segments)
    try:
        yield
    except BaseException:
        for name in message.shm_segments[before:]:
            shm.unlink(name, directory=shm.DEFAULT_DIR)
        raise


def attach(
    message: TensorMessage[Any],
    path: str,
    array: Any,
    dtype: str | None,
    transport: Transport,
    shm_min_bytes: int,
) -> None:
    """Attach ``array`` at ``path``; a refusal names the path."""
    try:
        message.attach(path, array, dtype=dtype, transport=transport, shm_min_bytes=shm_min_bytes)
    except TensorError as exc:
        if exc.field.startswith(path):
            raise
        raise type(exc)(
            f"{path}: {exc}", field=path, expected=exc.expected, actual=exc.actual
        ) from None


def release_shm(message: Message, unlink: bool | None, shm_read: ShmRead | None) -> int:
    """Consume the shared-memory segments of a refused request, as a successful read would have
    (unless segments are kept or refused): contract names only, never raising. Returns how many
    files were removed."""
    keep = not (shm.unlink_after_read_default() if unlink is None else unlink)
    if keep or shm_read == "refuse":
        return 0
    return sum(shm.release(td.shm.name) for _, td in shm_payloads(message))


def read_tensor(
    request: TensorSource[Any],
    path: str,
    td: Any,
    unlink: bool | None,
    shm_read: ShmRead | None = None,
) -> npt.NDArray[Any]:
    """The tensor at ``path``: the received frame's view, else the payload unpacked; errors
    re-raised with the request path in front."""
    try:
        if isinstance(request, TensorMessage) and path in request:
            return request[path]
        return unpack(td, unlink=unlink, shm_read=shm_read)
    except SmgProtoError as exc:
        if isinstance(exc, TensorError) or not exc.field.startswith(path):
            cls = type(exc)
            raise cls(
                f"{path}: {exc}",
                # "<TensorData type>.shape[0]" or "shm.name" -> "<path>.shape[0]", "<path>.shm.name"
                field=f"{path}.{exc.field.removeprefix(td.DESCRIPTOR.full_name + '.')}"
                if exc.field
                else path,
                expected=exc.expected,
                actual=exc.actual,
            ) from None
        raise
