"""TokenSpeed (``tokenspeed.grpc.scheduler``): one ``MultimodalItem`` per image or video.

Gateway side, :func:`generate_request` expands the prompt and splits every batch into items, in
prompt order: ``modality``, ``content_hash`` (32 bytes: BLAKE3 of the item's hex digest, the
gateway's derivation, over our digest of content and preprocessing parameters),
``encoder_input`` — the item's slice of the pixels in the engine's dtype, ``bfloat16`` unless
told otherwise — the item's side tensors (Qwen ``image_grid_thw`` ``[1, 3]``), one placeholder
range and ``placeholder_token_id``. Tensors travel inline, through shared memory, or through
shared memory from ``shm_min_bytes`` on (``"auto"``). :func:`fill_mm_inputs` fills the same
items into a request built elsewhere whose ``input_ids`` are expanded already.

Engine side, :func:`decode_mm_inputs` validates every item as TokenSpeed's servicer does
(modality set; IMAGE without ``video_grid_thw``; VIDEO with ``video_grid_thw`` and without
``image_grid_thw``; AUDIO with neither; placeholders present, non-empty, inside ``input_ids`` and
disjoint; one ``placeholder_token_id`` per modality; 32-byte hashes; grids matching the rows)
and returns one :class:`DecodedBatch` per item.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.engines import _decoded
from smg_grpc_proto.engines._decoded import DecodedBatch, DecodedItem, Modality
from smg_grpc_proto.engines._media import (
    PreparedMedia,
    content_hash,
    placeholder_ranges,
    put_prompt,
)
from smg_grpc_proto.engines._tensors import (
    TensorSource,
    as_media_list,
    attach,
    read_tensor,
    release_shm,
    unlink_on_failure,
)
from smg_grpc_proto.errors import MultimodalError, MultimodalLayoutError
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as pb
from smg_grpc_proto.tensors import (
    SHM_MIN_BYTES,
    ShmRead,
    TensorMessage,
    Transport,
    remote_context,
)

if TYPE_CHECKING:
    from smg_grpc_proto.remote import RemoteExporter, RemotePuller

__all__ = ["DEFAULT_DTYPE", "decode_mm_inputs", "fill_mm_inputs", "generate_request"]

#: The encoder-input dtype TokenSpeed's gateway uses when nothing else is configured.
DEFAULT_DTYPE = "bfloat16"

_MODALITY = {"image": common_pb2.IMAGE, "video": common_pb2.VIDEO}
_NAMES: dict[int, tuple[Modality, str]] = {
    common_pb2.IMAGE: ("image", "pixel_values"),
    common_pb2.VIDEO: ("video", "pixel_values_videos"),
    common_pb2.AUDIO: ("audio", "input_features"),
}


def generate_request(
    request_id: str,
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: PreparedMedia | Sequence[PreparedMedia] = (),
    *,
    sampling_params: pb.SamplingParams | None = None,
    stream: bool = False,
    transport: Transport = "inline",
    dtype: str | None = DEFAULT_DTYPE,
    shm_min_bytes: int = SHM_MIN_BYTES,
    exporter: RemoteExporter | None = None,
) -> TensorMessage[pb.GenerateRequest]:
    """A ``GenerateRequest`` for ``input_ids`` holding one anchor token per item; ``media`` is
    one :class:`PreparedMedia` per modality. ``dtype=None`` keeps the processor's float32.
    Side tensors go inline unless ``transport="shm"``. Shared-memory segments written before a
    failure are unlinked. ``transport="remote"`` stages each ``encoder_input`` for a NIXL READ
    with ``exporter`` (else the process default; inline when the exporter refuses it or NIXL is
    missing, counted by :func:`smg_grpc_proto.tensors.remote_stats`)."""
    batches = as_media_list(media, "TokenSpeed")
    request = pb.GenerateRequest(request_id=request_id, stream=stream)
    ranges = put_prompt(request.tokenized, "input_ids", input_ids, batches)
    if sampling_params is not None:
        request.sampling_params.CopyFrom(sampling_params)
    message: TensorMessage[pb.GenerateRequest] = TensorMessage(request)
    with remote_context(exporter=exporter):
        _fill(message, batches, ranges, transport, dtype, shm_min_bytes)
    return message


def fill_mm_inputs(
    message: TensorMessage[pb.GenerateRequest],
    media: PreparedMedia | Sequence[PreparedMedia],
    *,
    transport: Transport = "inline",
    dtype: str | None = DEFAULT_DTYPE,
    shm_min_bytes: int = SHM_MIN_BYTES,
    exporter: RemoteExporter | None = None,
) -> None:
    """Fill ``mm_inputs.items`` of a request whose ``tokenized.input_ids`` are expanded
    already (:func:`expand_placeholders`); the placeholder ranges are read from them
    (:func:`placeholder_ranges`). Options as for :func:`generate_request`; segments written
    before a failure are unlinked."""
    batches = as_media_list(media, "TokenSpeed")
    if not batches:
        return
    request = message.message
    if request.HasField("mm_inputs"):
        raise MultimodalError("the request's mm_inputs are filled already", field="mm_inputs")
    ranges = placeholder_ranges(request.tokenized.input_ids, batches)
    with remote_context(exporter=exporter):
        _fill(message, batches, ranges, transport, dtype, shm_min_bytes)


def _fill(
    message: TensorMessage[pb.GenerateRequest],
    batches: list[PreparedMedia],
    ranges: Sequence[Sequence[tuple[int, int]]],
    transport: Transport,
    dtype: str | None,
    shm_min_bytes: int,
) -> None:
    """One ``MultimodalItem`` per item of every batch, in prompt order."""
    order = sorted(
        (item_ranges[i][0], b, i)
        for b, item_ranges in enumerate(ranges)
        for i in range(len(item_ranges))
    )
    side: Transport = "shm" if transport == "shm" else "inline"
    with unlink_on_failure(message):
        for slot, (offset, b, i) in enumerate(order):
            batch = batches[b]
            at = f"mm_inputs.items[{slot}]"
            item = message.message.mm_inputs.items.add(
                modality=_MODALITY[batch.modality],
                content_hash=content_hash(batch.hex_hashes[i]),
                placeholder_token_id=batch.token_id,
            )
            item.placeholders.add(offset=offset, length=ranges[b][i][1])
            tensors = batch.item_tensors(i, _decoded.SIZES_KEY)
            attach(
                message,
                f"{at}.encoder_input",
                tensors.pop(batch.primary_name),
                dtype,
                transport,
                shm_min_bytes,
            )
            for name, array in tensors.items():
                path = f"{at}.model_specific_tensors[{name}]"
                attach(message, path, array, None, side, shm_min_bytes)


def decode_mm_inputs(
    request: TensorSource[pb.GenerateRequest],
    *,
    merge_size: int | None = None,
    unlink: bool | None = None,
    shm_read: ShmRead | None = None,
    puller: RemotePuller | None = None,
) -> tuple[DecodedBatch, ...]:
    """Every item of ``mm_inputs``, validated, as a one-item :class:`DecodedBatch` each (items
    of an EPD prefill request named in ``encode_bootstrap_info`` may lack ``encoder_input``).
    Shared-memory payloads are unlinked on opening unless ``unlink=False``, and mapped
    (``shm_read="copy"``: copied; ``"refuse"``: refused); a refused request's segments are
    consumed all the same. ``remote`` (NIXL) payloads are pulled with ``puller`` (else the
    process default)."""
    message: pb.GenerateRequest = request.message if isinstance(request, TensorMessage) else request
    if not message.HasField("mm_inputs"):
        return ()
    try:
        with remote_context(puller=puller):
            return _decode(request, message, merge_size, unlink, shm_read)
    except BaseException:
        release_shm(message, unlink, shm_read)
        raise


def _decode(
    request: TensorSource[pb.GenerateRequest],
    message: pb.GenerateRequest,
    merge_size: int | None,
    unlink: bool | None,
    shm_read: ShmRead | None,
) -> tuple[DecodedBatch, ...]:
    items = message.mm_inputs.items
    if not items:
        raise MultimodalError(
            "mm_inputs.items is empty: a present mm_inputs needs at least one item",
            field="mm_inputs.items",
        )
    ids = np.asarray(message.tokenized.input_ids, dtype=np.int64)
    _decoded.check_range_count("mm_inputs.items", len(items), ids.shape[0])
    groups: list[tuple[str, list[tuple[int, int]]]] = []
    for i, item in enumerate(items):
        at = f"mm_inputs.items[{i}].placeholders"
        if not item.placeholders:
            raise MultimodalError(
                f"{at} is empty: every item needs at least one range",
                field=at,
            )
        _decoded.check_range_count(at, len(item.placeholders), ids.shape[0])
        groups.append((at, [(p.offset, p.length) for p in item.placeholders]))
    embed = [i.placeholder_token_id for i in items if i.HasField("placeholder_token_id")]
    shared_ok = embed if len(embed) == len(items) else []  # else every position embeds
    _decoded.check_placeholders(groups, ids.shape[0], ids, shared_ok)
    remote = {b.item_index for b in message.encode_bootstrap_info.items}
    tokens: dict[Modality, tuple[int, str]] = {}
    return tuple(
        _decode_item(
            request, i, item, ranges, ids, tokens, i in remote, merge_size, unlink, shm_read
        )
        for i, (item, (_, ranges)) in enumerate(zip(items, groups, strict=True))
    )


def _decode_item(
    request: TensorSource[Any],
    i: int,
    item: pb.MultimodalItem,
    ranges: list[tuple[int, int]],
    ids: npt.NDArray[np.int64],
    tokens: dict[Modality, tuple[int, str]],
    encoded_elsewhere: bool,
    merge_size: int | None,
    unlink: bool | None,
    shm_read: ShmRead | None,
) -> DecodedBatch:
    at = f"mm_inputs.items[{i}]"
    if item.modality not in _NAMES:
        raise MultimodalError(
            f"{at}.modality = {item.modality}: must be IMAGE (1), AUDIO (2) or VIDEO (3)",
            field=f"{at}.modality",
            expected=sorted(_NAMES),
            actual=item.modality,
        )
    modality, primary = _NAMES[item.modality]
    side = set(item.model_specific_tensors)
    if modality == "image" and "video_grid_thw" in side:
        raise MultimodalLayoutError(
            f"{at}: an IMAGE item must not carry video_grid_thw",
            field=f"{at}.model_specific_tensors[video_grid_thw]",
        )
    if modality == "video" and ("video_grid_thw" not in side or "image_grid_thw" in side):
        raise MultimodalLayoutError(
            f"{at}: a VIDEO item must carry video_grid_thw and not image_grid_thw "
            f"(has {sorted(side)})",
            field=f"{at}.model_specific_tensors",
            actual=sorted(side),
        )
    if modality == "audio" and side & {"image_grid_thw", "video_grid_thw"}:
        raise MultimodalLayoutError(
            f"{at}: an AUDIO item carries no grid (has {sorted(side)})",
            field=f"{at}.model_specific_tensors",
            actual=sorted(side),
        )
    token: int | None = None
    if item.HasField("placeholder_token_id"):
        token = item.placeholder_token_id
        first = tokens.setdefault(modality, (token, at))
        if first[0] != token:
            raise MultimodalError(
                f"{at}.placeholder_token_id = {token}, but {first[1]} of the same modality "
                f"uses {first[0]}",
                field=f"{at}.placeholder_token_id",
                expected=first[0],
                actual=token,
            )
    masks = _decoded.embed_masks(ids, ranges, token, f"{at}.placeholders")
    mask = None
    if any(m is not None for m in masks):
        mask = np.concatenate(
            [
                m if m is not None else np.ones(r[1], dtype=bool)
                for m, r in zip(masks, ranges, strict=True)
            ]
        )
    digest: str | None = None
    if item.content_hash:
        if len(item.content_hash) != 32:
            raise MultimodalError(
                f"{at}.content_hash has {len(item.content_hash)} bytes; expected 32 (BLAKE3)",
                field=f"{at}.content_hash",
                expected=32,
                actual=len(item.content_hash),
            )
        digest = item.content_hash.hex()

    tensors: dict[str, npt.NDArray[Any]] = {}
    if item.HasField("encoder_input"):
        path = f"{at}.encoder_input"
        tensors[primary] = read_tensor(request, path, item.encoder_input, unlink, shm_read)
    elif not encoded_elsewhere:
        raise MultimodalError(
            f"{at}.encoder_input is not set, and encode_bootstrap_info names no encode worker "
            "for this item",
            field=f"{at}.encoder_input",
        )
    for key in sorted(side):
        if key == primary:
            raise MultimodalError(
                f"{at}.model_specific_tensors[{key}] repeats the encoder input",
                field=f"{at}.model_specific_tensors[{key}]",
            )
        path = f"{at}.model_specific_tensors[{key}]"
        tensors[key] = read_tensor(
            request, path, item.model_specific_tensors[key], unlink, shm_read
        )
    layout, sizes = _decoded.infer_layout(tensors, primary, 1, at)
    grid_key = "video_grid_thw" if modality == "video" else "image_grid_thw"
    if grid_key in tensors:
        embeds = [int(mask.sum()) if mask is not None else sum(r[1] for r in ranges)]
        _decoded.check_grid(
            tensors[grid_key],
            1,
            f"{at}.model_specific_tensors[{grid_key}]",
            sizes.get(primary),
            embeds,
            merge_size,
        )
    decoded = DecodedItem(0, modality, dict(tensors), tuple(ranges), mask, digest)
    return DecodedBatch(
        modality=modality,
        tensors=tensors,
        layout=layout,
        sizes=sizes,
        items=(decoded,),
        im_token_id=token,
        keep_on_cpu=frozenset(),
        wire_dtypes={
            k: item.encoder_input.dtype if k == primary else item.model_specific_tensors[k].dtype
            for k in tensors
        },
    )
