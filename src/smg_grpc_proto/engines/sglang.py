"""SGLang (``sglang.grpc.scheduler``): preprocessed images in ``MultimodalInputs``, both ways.

Gateway side, :func:`generate_request` and :func:`embed_request` fill ``mm_inputs`` as SGLang's
servicer reads it: expanded ``input_ids``, ``pixel_values`` (float32 unless ``dtype`` says
otherwise), the side tensors in ``model_specific_tensors`` (Qwen ``image_grid_thw``, LLaVA-NeXT
``image_sizes``), ``im_token_id``, one ``mm_placeholders`` range per image, and — as the SMG
gateway does — the encoded files in ``image_data`` when the images came as bytes, with
``modalities = ["image"]``; :func:`fill_mm_inputs` fills the same fields of a request built
elsewhere whose ``input_ids`` are expanded already. SGLang's ``TensorData`` has no shared-memory
handle: tensors travel inline. Video raises
:class:`~smg_grpc_proto.errors.MultimodalNotSupportedError`.

Engine side, :func:`decode_mm_inputs` returns one :class:`DecodedBatch`. The contract carries no
layout keys, so the split into items follows the tensors: ``pixel_values`` is flat when the
batch has a grid (rows per image ``t * h * w``) and batched when its dim 0 has one entry per
image; side tensors with one entry per image are batched, others shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.engines import _decoded
from smg_grpc_proto.engines._decoded import DecodedBatch, DecodedItem
from smg_grpc_proto.engines._media import (
    PreparedMedia,
    placeholder_ranges,
    put_prompt,
)
from smg_grpc_proto.engines._tensors import TensorSource, as_media_list, attach, read_tensor
from smg_grpc_proto.errors import MultimodalError, MultimodalNotSupportedError
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.tensors import TensorMessage

__all__ = ["decode_mm_inputs", "embed_request", "fill_mm_inputs", "generate_request"]


def generate_request(
    request_id: str,
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: PreparedMedia | Sequence[PreparedMedia] = (),
    *,
    sampling_params: pb.SamplingParams | None = None,
    stream: bool = False,
    dtype: str | None = None,
    image_data: bool = True,
) -> TensorMessage[pb.GenerateRequest]:
    """A ``GenerateRequest`` for ``input_ids`` holding one anchor token per image.

    ``dtype`` converts ``pixel_values`` (SGLang casts floats to the model dtype on arrival, so
    ``"bfloat16"`` halves the bytes). ``image_data=False`` leaves out the encoded files that
    SGLang's preprocessed path does not read. Send with :func:`smg_grpc_proto.tensors.serialize`.
    """
    request = pb.GenerateRequest(request_id=request_id, stream=stream)
    if sampling_params is not None:
        request.sampling_params.CopyFrom(sampling_params)
    message: TensorMessage[pb.GenerateRequest] = TensorMessage(request)
    _build(message, input_ids, media, dtype, image_data)
    return message


def embed_request(
    request_id: str,
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: PreparedMedia | Sequence[PreparedMedia] = (),
    *,
    dtype: str | None = None,
    image_data: bool = True,
) -> TensorMessage[pb.EmbedRequest]:
    """An ``EmbedRequest`` with the same multimodal input as :func:`generate_request`."""
    message: TensorMessage[pb.EmbedRequest] = TensorMessage(pb.EmbedRequest(request_id=request_id))
    _build(message, input_ids, media, dtype, image_data)
    return message


def _images(media: PreparedMedia | Sequence[PreparedMedia]) -> list[PreparedMedia]:
    items = as_media_list(media, "SGLang")
    for i, item in enumerate(items):
        if item.modality != "image":
            raise MultimodalNotSupportedError(
                f"media[{i}] is {item.modality}: SGLang's preprocessed input carries images only",
                field=f"media[{i}].modality",
                expected="image",
                actual=item.modality,
            )
    return items


def _build(
    message: TensorMessage[Any],
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: PreparedMedia | Sequence[PreparedMedia],
    dtype: str | None,
    image_data: bool,
) -> None:
    items = _images(media)
    ranges = put_prompt(message.message.tokenized, "input_ids", input_ids, items)
    if items:
        _fill(message, items[0], ranges[0], dtype, image_data)


def fill_mm_inputs(
    message: TensorMessage[pb.GenerateRequest] | TensorMessage[pb.EmbedRequest],
    media: PreparedMedia | Sequence[PreparedMedia],
    *,
    dtype: str | None = None,
    image_data: bool = True,
) -> None:
    """Fill ``mm_inputs`` of a ``GenerateRequest`` or ``EmbedRequest`` whose
    ``tokenized.input_ids`` are expanded already (:func:`expand_placeholders`); the placeholder
    ranges are read from them (:func:`placeholder_ranges`). Options as for
    :func:`generate_request`."""
    items = _images(media)
    if not items:
        return
    request = message.message
    if request.HasField("mm_inputs"):
        raise MultimodalError("the request's mm_inputs are filled already", field="mm_inputs")
    (ranges,) = placeholder_ranges(request.tokenized.input_ids, items)
    _fill(message, items[0], ranges, dtype, image_data)


def _fill(
    message: TensorMessage[Any],
    media: PreparedMedia,
    ranges: Sequence[tuple[int, int]],
    dtype: str | None,
    image_data: bool,
) -> None:
    """Fill ``message.mm_inputs`` with one batch of images placed at ``ranges``."""
    mm: Any = message.message.mm_inputs
    tensors = media.wire_tensors(_decoded.SIZES_KEY)
    attach(message, "mm_inputs.pixel_values", tensors.pop(media.primary_name), dtype, "inline", 0)
    for name, array in tensors.items():
        attach(message, f"mm_inputs.model_specific_tensors[{name}]", array, None, "inline", 0)
    mm.im_token_id = media.token_id
    for offset, length in ranges:
        mm.mm_placeholders.add(offset=offset, length=length)
    if image_data and media.encoded and all(e is not None for e in media.encoded):
        mm.image_data.extend(e for e in media.encoded if e is not None)
    mm.modalities.append("image")


def decode_mm_inputs(
    request: TensorSource[pb.GenerateRequest] | TensorSource[pb.EmbedRequest],
    *,
    merge_size: int | None = None,
) -> tuple[DecodedBatch, ...]:
    """The preprocessed images of a ``GenerateRequest`` or ``EmbedRequest``, validated: one
    :class:`DecodedBatch` (none without ``mm_inputs``). ``merge_size`` (Qwen's
    ``spatial_merge_size``) also checks each image's placeholder count against its grid."""
    message: Any = request.message if isinstance(request, TensorMessage) else request
    if not message.HasField("mm_inputs"):
        return ()
    mm: pb.MultimodalInputs = message.mm_inputs
    at = "mm_inputs"
    others = [m for m in mm.modalities if m != "image"]
    if others:
        raise MultimodalError(
            f"{at}.modalities = {list(mm.modalities)}: the preprocessed path carries images only",
            field=f"{at}.modalities",
            expected="image",
            actual=others[0],
        )
    if not mm.HasField("pixel_values"):
        raise MultimodalError(
            f"{at}.pixel_values is not set: this decoder reads preprocessed images (URLs and "
            "image_data alone are the engine's own preprocessing path)",
            field=f"{at}.pixel_values",
        )
    ids = np.asarray(message.tokenized.input_ids, dtype=np.int64)
    ranges = [(p.offset, p.length) for p in mm.mm_placeholders]
    n = len(ranges)
    if n == 0:
        raise MultimodalError(
            f"{at}.mm_placeholders is empty: a batch needs one range per image",
            field=f"{at}.mm_placeholders",
        )
    token = mm.im_token_id if mm.HasField("im_token_id") else None
    shared_ok = [token] if token is not None else []
    _decoded.check_placeholders([(f"{at}.mm_placeholders", ranges)], ids.shape[0], ids, shared_ok)
    masks = _decoded.embed_masks(ids, ranges, token, f"{at}.mm_placeholders")
    if mm.image_data and len(mm.image_data) != n:
        raise MultimodalError(
            f"{at}.image_data holds {len(mm.image_data)} files for {n} placeholder ranges",
            field=f"{at}.image_data",
            expected=n,
            actual=len(mm.image_data),
        )
    tensors: dict[str, npt.NDArray[Any]] = {
        "pixel_values": read_tensor(request, f"{at}.pixel_values", mm.pixel_values, None)
    }
    for key in sorted(mm.model_specific_tensors):
        if key == "pixel_values":
            raise MultimodalError(
                f"{at}.model_specific_tensors[pixel_values] repeats the encoder input",
                field=f"{at}.model_specific_tensors[pixel_values]",
            )
        path = f"{at}.model_specific_tensors[{key}]"
        tensors[key] = read_tensor(request, path, mm.model_specific_tensors[key], None)
    layout, sizes = _decoded.infer_layout(tensors, "pixel_values", n, at)
    embeds = [int(m.sum()) if m is not None else r[1] for m, r in zip(masks, ranges, strict=True)]
    if "image_grid_thw" in tensors:
        _decoded.check_grid(
            tensors["image_grid_thw"],
            n,
            f"{at}.model_specific_tensors[image_grid_thw]",
            sizes.get("pixel_values"),
            embeds,
            merge_size,
        )
    per_item = _decoded.split(tensors, layout, sizes, n)
    items = tuple(
        DecodedItem(i, "image", per_item[i], (ranges[i],), masks[i], None) for i in range(n)
    )
    return (
        DecodedBatch(
            modality="image",
            tensors=tensors,
            layout=layout,
            sizes=sizes,
            items=items,
            im_token_id=token,
            keep_on_cpu=frozenset(),
            wire_dtypes={
                k: mm.pixel_values.dtype
                if k == "pixel_values"
                else mm.model_specific_tensors[k].dtype
                for k in tensors
            },
        ),
    )
