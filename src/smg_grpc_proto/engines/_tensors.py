"""The adapters' thin use of :mod:`smg_grpc_proto.tensors`: attach on send, read on receive."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias, TypeVar

import numpy.typing as npt
from google.protobuf.message import Message

from smg_grpc_proto import shm
from smg_grpc_proto.engines._media import PreparedMedia
from smg_grpc_proto.errors import (
    MultimodalError,
    MultimodalNotSupportedError,
    SmgProtoError,
    TensorError,
)
from smg_grpc_proto.tensors import ShmRead, TensorMessage, Transport, shm_payloads, unpack

M = TypeVar("M", bound=Message)
TensorSource: TypeAlias = "TensorMessage[M] | M"
"""A request as received: a :class:`TensorMessage` (zero-copy frames) or a plain message."""


CROSS_ATTENTION: dict[str, str] = {
    "mllama": (
        "Llama 3.2 Vision (mllama) is a cross-attention model: MllamaProcessor keeps each "
        "<|image|> as one prompt token and the image reaches the decoder's cross-attention "
        "layers, not prompt embeddings; no engine contract here carries that (vLLM removed "
        "MllamaForConditionalGeneration in v0.10.2 with its V0 encoder-decoder path; SGLang's "
        "MllamaForConditionalGeneration takes the request's whole processor output as one item "
        "and reserves the encoder length in the prompt itself; TensorRT-LLM runs it only as a "
        "TensorRT encoder-decoder engine, not through its PyTorch multimodal input processors)"
    ),
}
"""Families whose images are not prompt embeddings, and why no builder sends them."""

ENGINE_LAYOUTS: dict[str, tuple[frozenset[str], str]] = {
    "nemotron_h_omni": (
        frozenset({"TokenSpeed", "TensorRT-LLM"}),
        "Nemotron-H-Omni's processor output (pixel_values as 16-px patch rows, image_grid_hw) is "
        "the SMG gateway's packed layout, which only TokenSpeed's model reads (smg 1.13.0 sends "
        "it to TokenSpeed workers alone); vLLM's NemotronH_Nano_VL model reads its own tiler's "
        "pixel_values_flat / imgs_sizes / num_tokens_per_image, and SGLang has no model for it "
        "(TensorRT-LLM takes the encoded files and preprocesses them with its own "
        "NemotronH_Nano_Omni_Reasoning_V3 input processor)",
    ),
}
"""Families only some engines' models read, and why the others' builders refuse them (for
TensorRT-LLM, whose builder sends the encoded files: whether its own input processor serves the
family)."""


def refuse_cross_attention(item: PreparedMedia, engine: str, field: str) -> None:
    """Raise :class:`MultimodalNotSupportedError` for a :data:`CROSS_ATTENTION` family, or for
    a family whose layout ``engine``'s model does not read (:data:`ENGINE_LAYOUTS`)."""
    reason = CROSS_ATTENTION.get(item.family)
    if reason is not None:
        raise MultimodalNotSupportedError(
            f"{engine}: {reason}",
            field=field,
            expected="a prompt-embedding family",
            actual=item.family,
        )
    engines, why = ENGINE_LAYOUTS.get(item.family, (None, ""))
    if engines is not None and engine not in engines:
        raise MultimodalNotSupportedError(
            f"{engine}: {why}",
            field=field,
            expected=f"a family {engine}'s models read",
            actual=item.family,
        )


def as_media_list(
    media: PreparedMedia | Sequence[PreparedMedia], engine: str
) -> list[PreparedMedia]:
    """``media`` as a list of :class:`PreparedMedia`, one per modality, for ``engine``'s
    builder; a :data:`CROSS_ATTENTION` family is refused."""
    items = [media] if isinstance(media, PreparedMedia) else list(media)
    for i, item in enumerate(items):
        if not isinstance(item, PreparedMedia):
            raise MultimodalError(
                f"media[{i}] is a {type(item).__name__}, not PreparedMedia (use "
                "VisionModel.prepare or PreparedMedia.from_output)",
                field=f"media[{i}]",
                actual=type(item).__name__,
            )
        refuse_cross_attention(item, engine, f"media[{i}].family")
    modalities = [m.modality for m in items]
    if len(set(modalities)) != len(modalities):
        raise MultimodalError(
            f"one PreparedMedia per modality, got {modalities}", field="media", actual=modalities
        )
    return items


class unlink_on_failure:
    """Unlink the shared-memory segments written inside the block if it fails (segments the
    message held before are left alone). A class, not a generator: builders enter one on every
    call."""

    __slots__ = ("_before", "_message")

    def __init__(self, message: TensorMessage[Any]) -> None:
        self._message = message
        self._before = 0

    def __enter__(self) -> None:
        self._before = len(self._message._shm)

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:
            for name in self._message.shm_segments[self._before :]:
                shm.unlink(name, directory=shm.DEFAULT_DIR)


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
