"""The whole-request fast path: messages carrying big tensors with one copy of each tensor.

Protobuf cannot hold a tensor without copying it (a ``bytes`` field takes only ``bytes``, and the
runtime copies again into its arena and once more when serializing). Here the big payloads never
enter a protobuf message:

* Sending, each tensor payload is a 20-byte *token* inside an otherwise normal message; the small
  message is serialized by protobuf and the native codec replaces each token by the tensor's
  bytes (converted, e.g. to bfloat16, on the fly), fixing the enclosing length prefixes — one
  pass over each tensor.
* Receiving, the codec swaps every ``TensorData`` payload for a token, protobuf parses the small
  rest (so merge semantics are protobuf's own), and each token becomes a read-only numpy view of
  the received bytes — no copy at all.

The bytes on the wire are ordinary protobuf: plain stubs parse them, and these functions read
bytes written by plain stubs. Use them as grpcio serializers (sync and ``grpc.aio``)::

    call = channel.unary_stream(
        "/vllm.grpc.engine.VllmEngine/Generate",
        request_serializer=tensors.serialize,
        response_deserializer=vllm_engine_pb2.GenerateResponse.FromString,
    )
    request = tensors.TensorMessage(vllm_engine_pb2.GenerateRequest(request_id="r1"))
    request.attach("mm_inputs.pixel_values", pixels, dtype="bfloat16")
    for response in call(request): ...

and on the server ``request_deserializer=tensors.deserializer(vllm_engine_pb2.GenerateRequest)``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message

from smg_grpc_proto import shm
from smg_grpc_proto.errors import TensorError, TensorTypeError
from smg_grpc_proto.tensors import _backend
from smg_grpc_proto.tensors._codec import (
    SHM_MIN_BYTES,
    Bf16Mode,
    Transport,
    choose_transport,
    inspect,
    unpack,
    view,
    wire_bytes,
    write_remote,
    write_shm,
)
from smg_grpc_proto.tensors._layout import (
    LAYOUTS,
    Layout,
    Plan,
    byte_length,
    check_dtype,
    layout_of,
    plan_for,
)

if TYPE_CHECKING:
    from smg_grpc_proto.remote import RemoteExporter

M = TypeVar("M", bound=Message)
_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[([^\]]*)\])?$")
_TOKEN_LEN = 20


class TensorMessage(Generic[M]):
    """A protobuf message plus the tensors that travel in its ``TensorData`` payloads.

    Paths name a ``TensorData`` inside the message: dotted field names, ``[i]`` for a repeated
    element and ``[key]`` for a map value, e.g. ``"mm_inputs.pixel_values"``,
    ``"mm_inputs.model_specific_tensors[image_grid_thw]"``, ``"mm_inputs.items[0].encoder_input"``.
    """

    def __init__(self, message: M) -> None:
        if not isinstance(message, Message):
            raise TensorTypeError(
                f"TensorMessage wraps a protobuf message, got {type(message).__name__}",
                field="message",
                actual=type(message).__name__,
            )
        self.message: M = message
        self._nonce = os.urandom(16)
        self._sources: list[tuple[Any, str]] = []  # (array or pending tensor, wire dtype)
        self._arrays: dict[str, np.ndarray[Any, Any]] = {}
        self._pending: dict[str, Any] = {}  # attached tensors not written yet, by path
        self._data: bytes | None = None
        self._spans: dict[str, tuple[int, int]] = {}
        self._shm: list[tuple[str, Path]] = []

    # -- sending ---------------------------------------------------------------------------
    def attach(
        self,
        path: str,
        array: Any,
        *,
        dtype: str | None = None,
        transport: Transport = "inline",
        shm_min_bytes: int = SHM_MIN_BYTES,
        shm_dir: Path | None = None,
        exporter: RemoteExporter | None = None,
    ) -> None:
        """Make ``array`` the payload of the ``TensorData`` at ``path`` (sets shape and dtype).

        Inline, the bytes are written once, by :func:`serialize`; only a non-contiguous or
        big-endian input is copied now, to bring it into wire order. ``transport="shm"`` (or
        ``"auto"`` from ``shm_min_bytes`` on, where the layout has a handle) writes them to a new
        shared-memory segment now, as :func:`pack` does; :meth:`discard_shm` unlinks such
        segments if the message is never delivered. ``transport="remote"`` stages them for a
        NIXL READ now, as :func:`pack` does (``exporter``, or the enclosing
        :func:`~smg_grpc_proto.tensors.remote_context`'s, or the process default), falling back
        to inline when the exporter refuses or NIXL is missing.

        ``array`` may also be a tensor not written yet (``_native.PendingTensor``, from
        :meth:`~smg_grpc_proto.vision.ImageProcessor.deferred`): its values are then computed
        straight into the serialized request or the shared-memory segment, never copied —
        as ``float32``, or as ``bfloat16`` with ``dtype="bfloat16"`` (half the bytes: each
        value rounded to nearest even, the bits a ``float32`` array converted to ``bfloat16``
        would have); an ``int64`` one (a constant mask) as ``int64``; another ``dtype`` writes
        them into an array first.
        """
        pending = _backend.is_pending(array) and dtype in _backend.pending_wire_dtypes(array)
        if pending:
            # Not written yet: `serialize` (or `write_shm`, now) computes the values in place.
            source_dtype = str(array.dtype)
            wire_dtype = dtype or source_dtype
            payload = array
            shape = tuple(map(int, array.shape))
            nbytes = int(array.nbytes) // (2 if wire_dtype == "bfloat16" else 1)
        else:
            if _backend.is_pending(array):
                array = np.asarray(array.materialize())  # converted below, from the written array
            source = inspect(array, dtype)
            payload, wire_dtype = source.contiguous(), source.wire_dtype
            source_dtype = source.source_dtype
            shape, nbytes = source.shape, source.nbytes
        td: Any = _resolve(self.message, path, create=True)
        layout = layout_of(td)
        placement = choose_transport(layout, nbytes, transport, shm_min_bytes, path)
        if placement == "remote" and pending:
            # The exporter copies from an array: write the pending tensor into one first.
            array = payload = np.asarray(array.materialize())
            pending = False
        td.Clear()
        td.shape.extend(shape)
        td.dtype = wire_dtype
        if placement == "shm":
            directory = shm_dir or shm.DEFAULT_DIR
            write_shm(td, payload, wire_dtype, nbytes, directory)
            self._shm.append((td.shm.name, directory))
        elif placement == "remote" and write_remote(
            td, wire_bytes(payload, source_dtype, wire_dtype), nbytes, path, exporter
        ):
            pass
        else:
            index = len(self._sources)
            setattr(td, layout.payload_field, self._nonce + index.to_bytes(4, "little"))
            self._sources.append((payload, wire_dtype))
        if pending:
            self._arrays.pop(path, None)
            self._pending[path] = array
        else:
            self._pending.pop(path, None)
            self._arrays[path] = np.asarray(array)

    @property
    def shm_segments(self) -> list[str]:
        """Names of the shared-memory segments written by :meth:`attach` (the reader unlinks
        them after reading)."""
        return [name for name, _ in self._shm]

    def discard_shm(self) -> int:
        """Unlink the segments written by :meth:`attach` that still exist — for a message that
        was never delivered (failed send, cancelled call). Returns how many were removed."""
        removed = sum(shm.unlink(name, directory=d) for name, d in self._shm)
        self._shm.clear()
        return removed

    # -- receiving -------------------------------------------------------------------------
    def __getitem__(self, path: str) -> np.ndarray[Any, Any]:
        """The tensor at ``path``: a zero-copy view for received frames, else :func:`unpack`
        (an attached tensor not written yet is written into an array, once)."""
        self._write_pending(path)
        if path in self._arrays:
            return self._arrays[path]
        return unpack(_resolve(self.message, path, create=False))

    def __contains__(self, path: object) -> bool:
        return path in self._arrays or path in self._pending

    def __iter__(self) -> Iterator[str]:
        return iter([*self._arrays, *self._pending])

    def __len__(self) -> int:
        return len(self._arrays) + len(self._pending)

    @property
    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        """Every tensor carried in the frames, by path (attached arrays when sending)."""
        for path in list(self._pending):
            self._write_pending(path)
        return dict(self._arrays)

    def _write_pending(self, path: str) -> None:
        pending = self._pending.pop(path, None)
        if pending is not None:
            self._arrays[path] = np.asarray(pending.materialize())

    def to_message(self) -> M:
        """A self-contained copy of the message with every payload filled in (copies bytes)."""
        if self._data is None:
            return type(self.message).FromString(serialize(self))
        message = type(self.message)()
        message.CopyFrom(self.message)
        # Walk the copy as parsing walked the original (paths are built, never parsed, so map
        # keys holding '.', '[' or ']' are found too).
        left = len(self._spans)
        for path, td in _tensor_data(message, plan_for(message.DESCRIPTOR), ""):
            span = self._spans.get(path)
            if span is not None:
                offset, length = span
                setattr(td, layout_of(td).payload_field, self._data[offset : offset + length])
                left -= 1
                if left == 0:
                    break
        return message

    def __repr__(self) -> str:
        tensors = [*self._arrays.items(), *self._pending.items()]
        shapes = ", ".join(f"{p}: {a.dtype}{list(a.shape)}" for p, a in tensors)
        return f"TensorMessage({type(self.message).__name__}, {{{shapes}}})"


# One step of a resolved path: (field name, _SINGLE / _REPEATED / _MAP, index or key).
_PathSteps = tuple[tuple[str, int, Any], ...]


def _integer(key: str, path: str, what: str) -> int:
    """``key`` of a path segment as an int, or a TensorError ending in ``what``."""
    try:
        return int(key)
    except ValueError:
        raise TensorError(f"path {path!r}: {what}, not [{key}]", field=path, actual=key) from None


@lru_cache(maxsize=4096)  # bounded: paths with indices ("items[17]") can be many
def _path_steps(descriptor: Descriptor, path: str) -> _PathSteps:
    """``path`` checked against ``descriptor`` once (errors are raised, not cached)."""
    steps = []
    node = descriptor
    for segment in path.split("."):
        m = _SEGMENT.match(segment)
        field = node.fields_by_name.get(m.group(1)) if m else None
        if m is None or field is None or field.message_type is None:
            raise TensorError(
                f"path {path!r}: {segment!r} is not a message field of {node.full_name}",
                field=path,
                actual=segment,
            )
        name, key = m.group(1), m.group(2)
        if field.message_type.GetOptions().map_entry:
            if key is None:
                raise TensorError(f"path {path!r}: map field {name!r} needs [key]", field=path)
            key_field = field.message_type.fields_by_name["key"]
            if key_field.cpp_type != key_field.CPPTYPE_STRING:
                key = _integer(key, path, f"map field {name!r} has integer keys")
            steps.append((name, _MAP, key))
            value_type = field.message_type.fields_by_name["value"].message_type
            if value_type is None:
                raise TensorError(
                    f"path {path!r}: the values of map field {name!r} are not messages",
                    field=path,
                )
            node = value_type
        elif key is not None:
            if not _is_repeated(field):
                raise TensorError(
                    f"path {path!r}: {name} is a single message, not a list to index by [{key}]",
                    field=path,
                    actual=key,
                )
            steps.append(
                (name, _REPEATED, _integer(key, path, f"{name} is a list, indexed by integers"))
            )
            node = field.message_type
        else:
            steps.append((name, _SINGLE, None))
            node = field.message_type
    if node.full_name not in LAYOUTS:
        raise TensorError(f"path {path!r} names a {node.full_name}, not a TensorData", field=path)
    return tuple(steps)


def _resolve(message: Message, path: str, *, create: bool) -> Message:
    node: Any = message
    for name, kind, key in _path_steps(message.DESCRIPTOR, path):
        value = getattr(node, name)
        if kind == _SINGLE:
            node = value
        elif kind == _REPEATED:
            try:
                node = value[key]
            except IndexError:
                raise TensorError(
                    f"path {path!r}: {name} has {len(value)} elements, no [{key}]",
                    field=path,
                    expected=len(value),
                    actual=str(key),
                ) from None
        else:
            if not create and key not in value:
                raise TensorError(f"path {path!r}: no map entry {key!r}", field=path)
            node = value[key]
    return node  # type: ignore[no-any-return]


def serialize(message: Message | TensorMessage[Any]) -> bytes:
    """Wire bytes of a message; tensors attached to a :class:`TensorMessage` copied exactly once."""
    if isinstance(message, TensorMessage):
        header: bytes = message.message.SerializeToString()
        if not message._sources:
            return header
        plan = plan_for(message.message.DESCRIPTOR)
        return _backend.encode_frames(header, plan, message._nonce, message._sources)
    if isinstance(message, Message):
        return message.SerializeToString()
    raise TensorTypeError(
        f"serialize() takes a protobuf message or TensorMessage, got {type(message).__name__}",
        field="message",
        actual=type(message).__name__,
    )


def deserializer(
    message_type: type[M], *, bf16: Bf16Mode = "auto"
) -> Callable[[bytes], TensorMessage[M]]:
    """A grpcio deserializer: ``bytes`` -> :class:`TensorMessage` with zero-copy tensor views."""
    plan = plan_for(message_type.DESCRIPTOR)

    def deserialize(data: bytes) -> TensorMessage[M]:
        return _decode(message_type, plan, bytes(data), bf16)

    deserialize.__qualname__ = f"deserializer({message_type.DESCRIPTOR.full_name})"
    return deserialize


def parse(data: bytes, message_type: type[M], *, bf16: Bf16Mode = "auto") -> TensorMessage[M]:
    """Parse wire bytes into a :class:`TensorMessage` (see :func:`deserializer`)."""
    return _decode(message_type, plan_for(message_type.DESCRIPTOR), data, bf16)


def _decode(message_type: type[M], plan: Plan, data: bytes, bf16: Bf16Mode) -> TensorMessage[M]:
    if not isinstance(data, bytes):
        raise TensorTypeError(
            f"expected bytes, got {type(data).__name__}", field="data", actual=type(data).__name__
        )
    nonce = os.urandom(16)
    header, spans = _backend.decode_frames(data, plan, nonce)
    try:
        message = message_type.FromString(header)
    except DecodeError as exc:
        raise TensorError(
            f"{message_type.DESCRIPTOR.full_name}: invalid wire bytes: {exc}", field="wire"
        ) from None
    result: TensorMessage[M] = TensorMessage(message)
    result._data = data
    if not spans:
        return result
    left = len(spans)  # tokens not yet found (fewer may survive protobuf's merging)
    layouts: dict[type, Layout] = {}  # one TensorData type per engine: looked up once
    for path, td in _tensor_data(message, plan, ""):
        layout = layouts.get(type(td)) or layouts.setdefault(type(td), layout_of(td))
        payload = getattr(td, layout.payload_field)
        if len(payload) != _TOKEN_LEN or payload[:16] != nonce:
            continue
        offset, length = spans[int.from_bytes(payload[16:], "little")]
        left -= 1
        dtype: str = td.dtype
        shape = tuple(td.shape)
        try:
            nbytes = byte_length(shape, dtype)
        except TensorError:
            # The error again, naming the field (a top-level TensorData has no path: its errors
            # name the message type instead); the names are built only when needed.
            at = path or layout.full_name
            check_dtype(dtype, field=f"{at}.dtype")
            byte_length(shape, dtype, field=f"{at}.shape")
            raise
        if length != nbytes:
            name = f"{path} ({layout.full_name})" if path else layout.full_name
            raise TensorError(
                f"{name}.{layout.payload_field}: {length} bytes, but shape {list(shape)} of "
                f"{dtype} needs {nbytes}",
                field=f"{path or layout.full_name}.{layout.payload_field}",
                expected=nbytes,
                actual=length,
            )
        result._arrays[path] = view(data, dtype, shape, bf16=bf16, offset=offset)
        result._spans[path] = (offset, length)
        if left == 0:
            break  # every token found: the rest of the walk can only find payloads without one
    if left and message.SerializeToString().count(nonce) > len(result._spans):
        # A token did not surface as a tensor payload but survives in the message: protobuf kept
        # its record as an unknown field (upb keeps a map entry holding a field other than key
        # and value whole, as an unknown field of the map's message). The message would carry
        # the token where the peer sent bytes, so it is parsed from the original bytes instead
        # (same structure, payloads inline; the arrays found above stay views of `data`). Only
        # malformed input gets here: tokens that protobuf merged away leave no trace.
        result.message = message_type.FromString(data)
    return result


_SINGLE, _REPEATED, _MAP = 0, 1, 2
# One step of a walk: (field name, kind, child steps — or None when the child is a TensorData).
_Steps = tuple[tuple[str, int, "_Steps | None"], ...]


@cache
def _steps(descriptor: Descriptor, plan: Plan) -> _Steps:
    """``plan`` resolved against ``descriptor`` once: field names and kinds instead of numbers."""
    assert isinstance(plan, tuple)
    out = []
    for number, child in plan:
        field = descriptor.fields_by_number[number]
        child_type = field.message_type
        assert child_type is not None  # plans only name message fields
        if child_type.GetOptions().map_entry:
            value_plan = dict(child)[2] if isinstance(child, tuple) else child
            value_type = child_type.fields_by_name["value"].message_type
            steps = None if isinstance(value_plan, int) else _steps(value_type, value_plan)
            out.append((field.name, _MAP, steps))
        else:
            kind = _REPEATED if _is_repeated(field) else _SINGLE
            out.append(
                (field.name, kind, None if isinstance(child, int) else _steps(child_type, child))
            )
    return tuple(out)


def shm_payloads(message: Message) -> Iterator[tuple[str, Any]]:
    """Every ``TensorData`` of ``message`` whose payload is a shared-memory handle, with its
    path: what a refused request's segments are found by (see :func:`smg_grpc_proto.shm.release`).
    """
    for path, td in _tensor_data(message, plan_for(message.DESCRIPTOR), ""):
        if td.DESCRIPTOR.oneofs_by_name and td.WhichOneof("payload") == "shm":
            yield path, td


def _tensor_data(node: Any, plan: Plan, prefix: str) -> Iterator[tuple[str, Any]]:
    """Every set TensorData along ``plan``, with its path."""
    if isinstance(plan, int):
        yield prefix, node
        return
    yield from _walk(node, _steps(node.DESCRIPTOR, plan), prefix)


def _walk(node: Any, steps: _Steps, prefix: str) -> Iterator[tuple[str, Any]]:
    for name, kind, child in steps:
        path = f"{prefix}.{name}" if prefix else name
        if kind == _SINGLE:
            if node.HasField(name):
                value = getattr(node, name)
                if child is None:
                    yield path, value
                else:
                    yield from _walk(value, child, path)
            continue
        container = getattr(node, name)
        if kind == _MAP:
            items: Any = ((f"{path}[{key}]", container[key]) for key in container)
        else:
            items = ((f"{path}[{i}]", item) for i, item in enumerate(container))
        for item_path, item in items:
            if child is None:
                yield item_path, item
            else:
                yield from _walk(item, child, item_path)


def _is_repeated(field: Any) -> bool:
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return bool(field.label == field.LABEL_REPEATED)
