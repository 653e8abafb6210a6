"""vLLM (``vllm.grpc.engine``): preprocessed media in ``MultimodalInputs``, both directions.

Gateway side, :func:`generate_request` fills a ``GenerateRequest``: expanded ``input_ids``,
``mm_inputs`` (and ``extra_mm_inputs`` for a second modality) with ``pixel_values``, the side
tensors in ``model_specific_tensors``, ``mm_placeholders`` covering only each placeholder run,
``mm_hashes`` (blake3 hex), ``batched_keys``, ``flat_keys`` (Qwen and Llama 4: ``pixel_values`` ->
``patches_per_image``), ``keep_on_cpu_keys``, ``modality`` and ``im_token_id``;
:func:`fill_mm_inputs` fills the same fields of a request built elsewhere whose ``input_ids``
are expanded already.

Engine side, :func:`decode_mm_inputs` reads every batch back into :class:`DecodedBatch` objects
following the servicer's rules (batched / flat / shared per key; VIDEO renames ``pixel_values``
to ``pixel_values_videos``), zero-copy for inline payloads of a received
:class:`~smg_grpc_proto.tensors.TensorMessage`, and validates shapes, sizes, grids, placeholder
ranges and hashes — a bad request raises a :class:`~smg_grpc_proto.errors.MultimodalError` (or
:class:`~smg_grpc_proto.errors.TensorError`) naming the field and the numbers.

Disaggregated prefill/decode: the decode side receives ``mm_inputs`` without ``pixel_values``
(hashes, placeholders and the side tensors, e.g. the grid) together with KV transfer params.
``generate_request(..., pixels=False, kv_transfer_params=...)`` builds it;
:func:`decode_mm_inputs` accepts it exactly when vLLM's servicer (``smg-grpc-servicer``) does
— a batch with side tensors but no ``pixel_values`` only when the request carries
``kv_transfer_params_json`` or ``kv_transfer_params`` (:func:`kv_transfer_params`), a batch
with neither (hashes only) always — and marks such batches ``DecodedBatch.pixels = False``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.engines import _decoded
from smg_grpc_proto.engines._decoded import DecodedBatch, DecodedItem, Layout
from smg_grpc_proto.engines._media import (
    PreparedMedia,
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
from smg_grpc_proto.errors import DisaggregationError, MultimodalError, MultimodalLayoutError
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.tensors import (
    SHM_MIN_BYTES,
    ShmRead,
    TensorMessage,
    Transport,
    remote_context,
)

if TYPE_CHECKING:
    from smg_grpc_proto.remote import RemoteExporter, RemotePuller

__all__ = [
    "MODEL_TENSOR_NAMES",
    "decode_mm_inputs",
    "fill_mm_inputs",
    "generate_request",
    "kv_transfer_params",
]

_MODALITY = {"image": common_pb2.IMAGE, "video": common_pb2.VIDEO}

#: Per family, the image tensors vLLM's model takes under another name than transformers'
#: processor returns them (``None``: vLLM's model does not take it, so it is not sent). Gemma 4:
#: vLLM's ``Gemma4MultiModalProcessor`` renames ``image_position_ids`` to
#: ``pixel_position_ids`` (its ``_get_mm_fields_config``: ``pixel_values`` and
#: ``pixel_position_ids``, batched) and drops ``num_soft_tokens_per_image``, as the SMG gateway
#: sends them. Kimi-K2.5: ``KimiK25ForConditionalGeneration`` reads ``pixel_values`` (flat,
#: ``(Σ t·h·w, 3, 14, 14)``, split by the grid) and ``grid_thws`` (batched), transformers'
#: ``image_grid_thw`` (its ``_get_mm_fields_config`` and ``_parse_and_validate_media_input``).
#: Inkling: the SMG gateway (1.13, its ``inkling`` spec) sends ``pixel_values`` flat
#: by ``tokens_per_item`` (batched) and nothing else; ``num_patches`` (the same counts) stays
#: home.
MODEL_TENSOR_NAMES: Mapping[str, Mapping[str, str | None]] = {
    "gemma4": {"image_position_ids": "pixel_position_ids", "num_soft_tokens_per_image": None},
    "inkling": {"num_patches": None},
    # Gemma4UnifiedForConditionalGeneration reuses Gemma 4's multimodal processor and fields.
    "gemma4_unified": {
        "image_position_ids": "pixel_position_ids",
        "num_soft_tokens_per_image": None,
    },
    "kimi_k25": {"image_grid_thw": "grid_thws"},
}


def generate_request(
    request_id: str,
    input_ids: Sequence[int] | npt.NDArray[Any],
    media: PreparedMedia | Sequence[PreparedMedia] = (),
    *,
    sampling_params: pb.SamplingParams | None = None,
    stream: bool = False,
    transport: Transport = "inline",
    dtype: str | None = None,
    shm_min_bytes: int = SHM_MIN_BYTES,
    exporter: RemoteExporter | None = None,
    pixels: bool = True,
    kv_transfer_params: Mapping[str, Any] | pb.KvTransferParams | None = None,
) -> TensorMessage[pb.GenerateRequest]:
    """A ``GenerateRequest`` for ``input_ids`` holding one anchor token per media item.

    ``media`` is one :class:`PreparedMedia` per modality (the first goes to ``mm_inputs``, any
    further to ``extra_mm_inputs``). ``dtype`` converts ``pixel_values`` (e.g.
    ``"bfloat16"``: vLLM casts them to the model's dtype, so a bfloat16 model sees the same
    values in half the bytes; a deferred ``pixel_values`` (the Qwen, tiled and Gemma 4
    families) is then written as bfloat16 straight into the request); ``transport`` sends it
    ``"inline"``, through shared memory (``"shm"``), through shared memory from
    ``shm_min_bytes`` on (``"auto"``) or staged for a NIXL READ (``"remote"``: with
    ``exporter``, else that of an enclosing
    :func:`smg_grpc_proto.tensors.remote_context`, else the process default; inline when the
    exporter refuses it or NIXL is missing, counted by
    :func:`smg_grpc_proto.tensors.remote_stats`; side tensors stay inline; slots staged before a
    failure are reclaimed by the exporter's TTL).
    Send the result with
    :func:`smg_grpc_proto.tensors.serialize` as the request serializer (or ``.to_message()``).

    ``kv_transfer_params`` (KV connector params from the prefill worker) goes to
    ``kv_transfer_params_json`` as JSON when a mapping, to the legacy ``kv_transfer_params``
    message when a :class:`KvTransferParams`. ``pixels=False`` builds the decode side of a
    disaggregated request: every batch without ``pixel_values`` (placeholders, hashes, modality,
    ``im_token_id`` and the side tensors, all inline whatever ``transport``, so no shared memory
    is used), which requires ``kv_transfer_params`` — without it
    :class:`~smg_grpc_proto.errors.DisaggregationError` is raised.
    """
    batches = as_media_list(media, "vLLM")
    request = pb.GenerateRequest(request_id=request_id, stream=stream)
    ranges = put_prompt(request.tokenized, "input_ids", input_ids, batches)
    if sampling_params is not None:
        request.sampling_params.CopyFrom(sampling_params)
    if isinstance(kv_transfer_params, pb.KvTransferParams):
        request.kv_transfer_params.CopyFrom(kv_transfer_params)
    elif kv_transfer_params is not None:
        try:
            request.kv_transfer_params_json = json.dumps(dict(kv_transfer_params))
        except (TypeError, ValueError) as exc:
            raise DisaggregationError(
                f"kv_transfer_params is not JSON-serializable: {exc}",
                field="kv_transfer_params_json",
            ) from exc
    if not pixels and batches:
        _require_kv(request)
    message: TensorMessage[pb.GenerateRequest] = TensorMessage(request)
    with remote_context(exporter=exporter):
        _fill(message, batches, ranges, transport, dtype, shm_min_bytes, pixels)
    return message


def kv_transfer_params(request: TensorSource[pb.GenerateRequest]) -> dict[str, Any] | None:
    """The request's KV transfer params as vLLM's servicer reads them (``params_from_request``
    of ``smg_grpc_servicer.vllm.kv_transfer``): ``kv_transfer_params_json`` when set (it must
    parse to a JSON object; the legacy field is then not read), else the legacy
    ``kv_transfer_params`` message as ``{"remote_host", "remote_port"}`` (the host must be set
    and the port in 1..65535), else ``None``. Malformed params raise
    :class:`~smg_grpc_proto.errors.DisaggregationError` naming the field."""
    message: pb.GenerateRequest = request.message if isinstance(request, TensorMessage) else request
    if message.HasField("kv_transfer_params_json"):
        try:
            params = json.loads(message.kv_transfer_params_json)
        except ValueError as exc:
            raise DisaggregationError(
                f"kv_transfer_params_json is not valid JSON: {exc}",
                field="kv_transfer_params_json",
            ) from exc
        if not isinstance(params, dict):
            raise DisaggregationError(
                f"kv_transfer_params_json must be a JSON object (got {type(params).__name__})",
                field="kv_transfer_params_json",
                actual=type(params).__name__,
            )
        return params
    if message.HasField("kv_transfer_params"):
        host = message.kv_transfer_params.remote_host
        port = message.kv_transfer_params.remote_port
        if not host or not 1 <= port <= 65535:
            raise DisaggregationError(
                "kv_transfer_params: remote_host must be set and remote_port must be in "
                f"[1, 65535] (got {host!r}, {port})",
                field="kv_transfer_params",
                actual=(host, port),
            )
        return {"remote_host": host, "remote_port": port}
    return None


def _require_kv(request: pb.GenerateRequest) -> None:
    if kv_transfer_params(request) is None:
        raise DisaggregationError(
            "pixels=False builds the decode side of a disaggregated request, which needs the "
            "prefill worker's KV: pass kv_transfer_params (kv_transfer_params_json or "
            "kv_transfer_params is not set)",
            field="kv_transfer_params_json",
        )


def fill_mm_inputs(
    message: TensorMessage[pb.GenerateRequest],
    media: PreparedMedia | Sequence[PreparedMedia],
    *,
    transport: Transport = "inline",
    dtype: str | None = None,
    shm_min_bytes: int = SHM_MIN_BYTES,
    exporter: RemoteExporter | None = None,
    pixels: bool = True,
) -> None:
    """Fill ``mm_inputs`` (and ``extra_mm_inputs`` for each further modality) of a request
    whose ``tokenized.input_ids`` are expanded already (:func:`expand_placeholders`); the
    placeholder ranges are read from them (:func:`placeholder_ranges`). Options as for
    :func:`generate_request` (``pixels=False`` needs the request's KV transfer params set
    already); segments written before a failure are unlinked."""
    batches = as_media_list(media, "vLLM")
    if not batches:
        return
    request = message.message
    if request.HasField("mm_inputs") or request.extra_mm_inputs:
        raise MultimodalError("the request's mm_inputs are filled already", field="mm_inputs")
    if not pixels:
        _require_kv(request)
    ranges = placeholder_ranges(request.tokenized.input_ids, batches)
    with remote_context(exporter=exporter):
        _fill(message, batches, ranges, transport, dtype, shm_min_bytes, pixels)


def _fill(
    message: TensorMessage[pb.GenerateRequest],
    batches: list[PreparedMedia],
    ranges: Sequence[Sequence[tuple[int, int]]],
    transport: Transport,
    dtype: str | None,
    shm_min_bytes: int,
    pixels: bool = True,
) -> None:
    with unlink_on_failure(message):
        for i, (item, item_ranges) in enumerate(zip(batches, ranges, strict=True)):
            at = "mm_inputs" if i == 0 else f"extra_mm_inputs[{i - 1}]"
            if i > 0:
                message.message.extra_mm_inputs.add()
            _fill_batch(message, at, item, item_ranges, transport, dtype, shm_min_bytes, pixels)


def _fill_batch(
    message: TensorMessage[pb.GenerateRequest],
    at: str,
    media: PreparedMedia,
    ranges: Sequence[tuple[int, int]],
    transport: Transport,
    dtype: str | None,
    shm_min_bytes: int,
    pixels: bool = True,
) -> None:
    """Fill the ``MultimodalInputs`` at path ``at`` of ``message`` with one batch; without
    ``pixels`` everything but the encoder input (``pixel_values``, and the layout naming it),
    inline."""
    mm: Any = message.message
    for step in at.replace("]", "").split("."):
        name, _, index = step.partition("[")
        mm = getattr(mm, name)[int(index)] if index else getattr(mm, name)
    tensors = media.wire_tensors()
    layout = media.layout_of(tensors)
    primary = media.primary_name
    names = MODEL_TENSOR_NAMES.get(media.family, {}) if media.modality == "image" else {}
    if names:
        renamed = {k: names.get(k, k) for k in tensors}
        tensors = {n: tensors[k] for k, n in renamed.items() if n is not None}
        layout = {n: layout[k] for k, n in renamed.items() if n is not None}
    pixel_values = tensors.pop(primary)
    if pixels:
        attach(message, f"{at}.pixel_values", pixel_values, dtype, transport, shm_min_bytes)
    # Side tensors: shared memory from a size on when the pixels use it; otherwise inline (a
    # remote request stages only its encoder input, as the SMG gateway does).
    side: Transport = "auto" if transport in ("shm", "auto") and pixels else "inline"
    for name, array in tensors.items():
        attach(message, f"{at}.model_specific_tensors[{name}]", array, None, side, shm_min_bytes)
    # The primary travels in the pixel_values field. Under the modality's own name (image
    # pixel_values; video pixel_values_videos, which VIDEO renames from pixel_values) the layout
    # keys call it pixel_values; under any other name (Phi-4-multimodal image_pixel_values) that
    # name goes to encoder_input_key, and the layout keys use it, as vLLM's servicer registers it.
    if primary == ("pixel_values_videos" if media.modality == "video" else "pixel_values"):
        wire = {primary: "pixel_values"}
    else:
        wire = {primary: primary}
        mm.encoder_input_key = primary
    sizes_key = media.sizes_name
    sized = sizes_key in layout  # the media carries its sizes tensor (the tiled families)
    if layout[primary] == "flat" and not sized:
        sizes = np.asarray(media.flat_sizes(), dtype=np.int64)
        attach(message, f"{at}.model_specific_tensors[{sizes_key}]", sizes, None, "inline", 0)
    for name, kind in layout.items():
        if kind == "flat" and (pixels or name != primary):
            mm.flat_keys[wire.get(name, name)] = sizes_key
    mm.batched_keys.extend(
        wire.get(k, k)
        for k, kind in layout.items()
        if kind == "batched" and (pixels or k != primary)
    )
    if layout[primary] == "flat" and not sized:
        # one size per item: batched, as the SMG gateway marks it (vLLM then slices it per item
        # like the grid instead of handing every item the whole tensor)
        mm.batched_keys.append(sizes_key)
    grid_name = media.grid_name
    if grid_name is not None:
        mm.keep_on_cpu_keys.append(names.get(grid_name) or grid_name)
    mm.im_token_id = media.token_id
    for offset, length in ranges:
        mm.mm_placeholders.add(offset=offset, length=length)
    mm.mm_hashes.extend(media.hex_hashes)
    mm.modality = _MODALITY[media.modality]


def decode_mm_inputs(
    request: TensorSource[pb.GenerateRequest],
    *,
    merge_size: int | None = None,
    unlink: bool | None = None,
    shm_read: ShmRead | None = None,
    puller: RemotePuller | None = None,
) -> tuple[DecodedBatch, ...]:
    """Every preprocessed batch of a ``GenerateRequest`` (``mm_inputs`` then
    ``extra_mm_inputs``), validated, as the engine's model consumes it.

    ``merge_size`` (Qwen's ``spatial_merge_size``) also checks each item's grid against it and
    each item's placeholder count against its grid. Shared-memory payloads are unlinked on
    opening unless ``unlink=False``, and mapped read-only (``shm_read="copy"``: copied;
    ``"refuse"``: refused). A refused request's segments are consumed all the same, so a bad
    request leaves nothing behind in ``/dev/shm``. ``remote`` (NIXL) payloads are pulled with
    ``puller`` (else the process default); a refused request's remote slots are left to the
    exporter's TTL.

    A batch without ``pixel_values`` (disaggregated decode side) comes back with
    ``pixels=False``; one that carries side tensors needs the request's KV transfer params
    (:func:`kv_transfer_params`), as vLLM's servicer requires, else
    :class:`~smg_grpc_proto.errors.DisaggregationError` naming its ``pixel_values``.
    """
    message: pb.GenerateRequest = request.message if isinstance(request, TensorMessage) else request
    batches: list[tuple[str, pb.MultimodalInputs]] = []
    if message.HasField("mm_inputs"):
        batches.append(("mm_inputs", message.mm_inputs))
    batches.extend((f"extra_mm_inputs[{i}]", b) for i, b in enumerate(message.extra_mm_inputs))
    if not batches:
        return ()
    try:
        with remote_context(puller=puller):
            return _decode(request, message, batches, merge_size, unlink, shm_read)
    except BaseException:
        release_shm(message, unlink, shm_read)
        raise


def _decode(
    request: TensorSource[pb.GenerateRequest],
    message: pb.GenerateRequest,
    batches: list[tuple[str, pb.MultimodalInputs]],
    merge_size: int | None,
    unlink: bool | None,
    shm_read: ShmRead | None,
) -> tuple[DecodedBatch, ...]:
    if message.HasField("media_refs"):
        raise MultimodalError("media_refs and mm_inputs are mutually exclusive", field="media_refs")
    if message.WhichOneof("input") != "tokenized":
        raise MultimodalError(
            "multimodal input needs tokenized input_ids (got "
            f"{message.WhichOneof('input') or 'no input'})",
            field="tokenized",
        )
    ids = np.asarray(message.tokenized.input_ids, dtype=np.int64)
    groups: list[tuple[str, list[tuple[int, int]]]] = []
    for at, mm in batches:
        placeholders = mm.mm_placeholders
        if not placeholders:
            raise MultimodalError(
                f"{at}.mm_placeholders is empty: a batch needs one range per item",
                field=f"{at}.mm_placeholders",
            )
        field = f"{at}.mm_placeholders"
        _decoded.check_range_count(field, len(placeholders), ids.shape[0])
        groups.append((field, [(p.offset, p.length) for p in placeholders]))
    embed = [mm.im_token_id for _, mm in batches if mm.HasField("im_token_id")]
    shared_ok = embed if len(embed) == len(batches) else []  # else every position embeds
    _decoded.check_placeholders(groups, ids.shape[0], ids, shared_ok)
    # vLLM's servicer (smg-grpc-servicer 0.14.1, VllmEngineServicer.Generate): a batch with side
    # tensors but no pixels is the PD decode side's form and is only decodable with remote KV (a
    # local recompute would run the encoder with nothing to encode); a batch with neither
    # (hashes only) takes its cache-salt path and needs none.
    for at, mm in batches:
        if not mm.HasField("pixel_values") and mm.model_specific_tensors:
            if kv_transfer_params(message) is None:
                raise DisaggregationError(
                    f"{at}.pixel_values is not set and the request has no kv_transfer_params_json "
                    "or kv_transfer_params: a batch without its encoder input is the decode side "
                    "of a disaggregated request and needs the prefill worker's KV",
                    field=f"{at}.pixel_values",
                )
            break
    keys_seen: dict[str, str] = {}
    return tuple(
        _decode_batch(request, at, mm, ranges, ids, keys_seen, merge_size, unlink, shm_read)
        for (at, mm), (_, ranges) in zip(batches, groups, strict=True)
    )


_V = TypeVar("_V")


def _video_names(values: dict[str, _V]) -> dict[str, _V]:
    """``values`` with the key ``pixel_values`` renamed ``pixel_values_videos``."""
    return {("pixel_values_videos" if k == "pixel_values" else k): v for k, v in values.items()}


def _decode_batch(
    request: TensorSource[Any],
    at: str,
    mm: pb.MultimodalInputs,
    ranges: list[tuple[int, int]],
    ids: npt.NDArray[np.int64],
    keys_seen: dict[str, str],
    merge_size: int | None,
    unlink: bool | None,
    shm_read: ShmRead | None,
) -> DecodedBatch:
    # Each field of the (upb) message is read once: every access builds a Python object.
    wire_modality = mm.modality
    if wire_modality in (common_pb2.MODALITY_UNSPECIFIED, common_pb2.IMAGE):
        modality: _decoded.Modality = "image"
    elif wire_modality == common_pb2.VIDEO:
        modality = "video"
    else:
        raise MultimodalError(
            f"{at}.modality = {wire_modality}: vLLM batches carry IMAGE or VIDEO",
            field=f"{at}.modality",
            expected=[common_pb2.IMAGE, common_pb2.VIDEO],
            actual=wire_modality,
        )
    n = len(ranges)
    token = mm.im_token_id if mm.HasField("im_token_id") else None
    masks = _decoded.embed_masks(ids, ranges, token, f"{at}.mm_placeholders")
    hashes = _decoded.check_hashes(list(mm.mm_hashes), n, f"{at}.mm_hashes")

    primary = mm.encoder_input_key if mm.HasField("encoder_input_key") else "pixel_values"
    if not primary:
        raise MultimodalError(f"{at}.encoder_input_key is empty", field=f"{at}.encoder_input_key")
    pixels = mm.HasField("pixel_values")
    wire: dict[str, npt.NDArray[Any]] = {}
    wire_dtypes: dict[str, str] = {}
    if pixels:
        td = mm.pixel_values
        wire[primary] = read_tensor(request, f"{at}.pixel_values", td, unlink, shm_read)
        wire_dtypes[primary] = td.dtype
    side = mm.model_specific_tensors
    for key in sorted(side):
        if key == primary:
            raise MultimodalError(
                f"{at}.model_specific_tensors[{key}] repeats the encoder input key",
                field=f"{at}.model_specific_tensors[{key}]",
            )
        path = f"{at}.model_specific_tensors[{key}]"
        td = side[key]
        wire[key] = read_tensor(request, path, td, unlink, shm_read)
        wire_dtypes[key] = td.dtype
    for key in wire:
        name = "pixel_values_videos" if modality == "video" and key == "pixel_values" else key
        if name in keys_seen:
            raise MultimodalError(
                f"{at}: tensor {name!r} also appears in {keys_seen[name]}; a key may appear in "
                "only one batch",
                field=f"{at}.{key}",
            )
        keys_seen[name] = at

    batched_keys = list(mm.batched_keys)
    batched = set(batched_keys)
    flat = dict(mm.flat_keys)
    if not pixels:
        # a router that strips the pixels may leave their layout behind (the servicer reads
        # only the tensors present)
        batched.discard(primary)
        flat.pop(primary, None)
    # keep_on_cpu_keys may name tensors of another modality: smg 1.13.0 sends its model-wide
    # list (Qwen3-VL: image_grid_thw and video_grid_thw) with every batch, and vLLM's servicer
    # consults it only for the tensors present. Its GLM-5.3-Flash / GLM-5-next spec does the
    # same with batched_keys (an image batch also names video_grid_thw, patches_per_video and
    # video_second_per_grid), which vLLM's servicer also reads only for the tensors present: a
    # batched name of the other modality without a tensor is ignored. Any other layout key
    # naming no tensor is refused.
    other = "video" if modality == "image" else "image"
    for kind, keys in (
        (
            "batched_keys",
            [k for k in batched_keys if k in batched and (k in wire or other not in k)],
        ),
        ("flat_keys", list(flat)),
    ):
        for key in keys:
            if key not in wire:
                raise MultimodalLayoutError(
                    f"{at}.{kind} names {key!r}, which is not a tensor of the batch "
                    f"(tensors: {sorted(wire)})",
                    field=f"{at}.{kind}",
                    actual=key,
                )
    layout: dict[str, Layout] = {}
    sizes: dict[str, tuple[int, ...]] = {}
    for key, array in wire.items():
        if key in batched:
            if key in flat:
                raise MultimodalLayoutError(
                    f"{at}: {key!r} is in both batched_keys and flat_keys",
                    field=f"{at}.flat_keys[{key}]",
                )
            rows = _decoded.first_dim(array, key, f"{at}.{key}")
            if rows != n:
                raise MultimodalLayoutError(
                    f"{at}: batched tensor {key!r} has {rows} entries on dim 0 for {n} items",
                    field=f"{at}.{key}",
                    expected=n,
                    actual=rows,
                )
            layout[key] = "batched"
        elif key in flat:
            sizes_key = flat[key]
            if sizes_key not in wire:
                raise MultimodalLayoutError(
                    f"{at}.flat_keys[{key}] = {sizes_key!r}, which is not a tensor of the batch",
                    field=f"{at}.flat_keys[{key}]",
                    actual=sizes_key,
                )
            rows = _decoded.first_dim(array, key, f"{at}.{key}")
            sizes[key] = _decoded.sizes_of(
                wire[sizes_key], n, rows, f"{at}.model_specific_tensors[{sizes_key}]", key
            )
            layout[key] = "flat"
        else:
            layout[key] = "shared"

    embeds = [int(m.sum()) if m is not None else r[1] for m, r in zip(masks, ranges, strict=True)]
    for grid_key in _decoded.GRID_KEYS:
        if grid_key in wire:
            patches = sizes.get(primary)
            if pixels and layout[primary] == "shared":
                # Without flat_keys every item would get all rows: only one item may.
                if n > 1:
                    raise MultimodalLayoutError(
                        f"{at}: {primary!r} would be shared by all {n} items, but the batch has "
                        f"a grid ({grid_key}): name it in flat_keys with its sizes tensor",
                        field=f"{at}.flat_keys",
                        expected="pixel_values",
                        actual=sorted(flat),
                    )
                patches = (_decoded.first_dim(wire[primary], primary, f"{at}.pixel_values"),)
            _decoded.check_grid(
                wire[grid_key],
                n,
                f"{at}.model_specific_tensors[{grid_key}]",
                patches,
                embeds,
                merge_size,
            )

    keep_on_cpu = frozenset(k for k in mm.keep_on_cpu_keys if k in wire)
    if modality == "video" and "pixel_values" in wire:
        # A video's encoder input travels as pixel_values; the model calls it
        # pixel_values_videos.
        wire, layout, sizes = _video_names(wire), _video_names(layout), _video_names(sizes)
        wire_dtypes = _video_names(wire_dtypes)
        keep_on_cpu = frozenset(_video_names(dict.fromkeys(keep_on_cpu)))
    per_item = _decoded.split(wire, layout, sizes, n)
    items = tuple(
        DecodedItem(i, modality, per_item[i], (ranges[i],), masks[i], hashes[i]) for i in range(n)
    )
    return DecodedBatch(
        modality=modality,
        tensors=wire,
        layout=layout,
        sizes=sizes,
        items=items,
        im_token_id=token,
        keep_on_cpu=keep_on_cpu,
        wire_dtypes=wire_dtypes,
        pixels=pixels,
    )
