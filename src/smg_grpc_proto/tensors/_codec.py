"""numpy array <-> one engine's ``TensorData`` message (inline or shared memory)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
from google.protobuf.message import Message

from smg_grpc_proto import shm
from smg_grpc_proto.errors import (
    ShmError,
    TensorError,
    TensorTypeError,
)
from smg_grpc_proto.tensors import _backend, _remote
from smg_grpc_proto.tensors._layout import (
    CONVERSIONS,
    MAX_INLINE_BYTES,
    NUMPY_STORAGE,
    Layout,
    byte_length,
    check_dtype,
    layout_of,
    wire_dtype_of,
)

if TYPE_CHECKING:
    from smg_grpc_proto.remote import RemoteExporter, RemotePuller

M = TypeVar("M", bound=Message)
Transport = Literal["inline", "shm", "auto", "remote"]
"""How a tensor is sent: in the message, in a shared-memory segment (``"shm"``, or ``"auto"``
from a size on), or staged for a NIXL READ (``"remote"``, falling back to inline)."""
Placement = Literal["inline", "shm", "remote"]
Bf16Mode = Literal["auto", "ml_dtypes", "float32", "uint16"]
ShmRead = Literal["map", "copy", "refuse"]
"""How a reader takes shared-memory payloads: map them, copy them (:data:`shm.ReadMode`), or
refuse every one without opening anything (a server whose ``shm_namespace_id`` is empty)."""

#: Tensors at least this large go to shared memory with ``transport="auto"`` (upstream default).
SHM_MIN_BYTES = 65536


@dataclass(frozen=True)
class Source:
    """A validated array about to be sent: nothing has been copied yet."""

    array: np.ndarray[Any, Any]
    source_dtype: str
    wire_dtype: str
    shape: tuple[int, ...]
    nbytes: int  # on the wire, after conversion

    def contiguous(self) -> np.ndarray[Any, Any]:
        """C-contiguous little-endian storage (a view when the input already is, else a copy);
        ``bfloat16`` as its raw uint16 bits."""
        array = self.array.view(np.uint16) if self.source_dtype == "bfloat16" else self.array
        return np.ascontiguousarray(array, dtype=NUMPY_STORAGE[self.source_dtype])


def inspect(array: Any, dtype: str | None) -> Source:
    """Validate an array and the requested wire dtype, without copying anything."""
    if not isinstance(array, np.ndarray):
        if isinstance(array, (str, bytes, dict)) or array is None:
            raise TensorTypeError(
                f"array must be a numpy array or array-like, got {type(array).__name__}",
                field="array",
                actual=type(array).__name__,
            )
        array = np.asarray(array)
    source = wire_dtype_of(array)
    target = source if dtype is None else dtype
    check_dtype(target, field="dtype")
    if target not in CONVERSIONS[source]:
        raise TensorError(
            f"dtype: cannot send a {source} array as {target}; conversions exist only from "
            f"float32 to bfloat16 and float16",
            field="dtype",
            expected=sorted(CONVERSIONS[source]),
            actual=target,
        )
    shape = array.shape  # a tuple of Python ints
    return Source(array, source, target, shape, byte_length(shape, target, field="array.shape"))


def check_inline(nbytes: int, field: str) -> None:
    """An inline payload must fit a protobuf message (2 GiB - 1)."""
    if nbytes > MAX_INLINE_BYTES:
        raise TensorError(
            f"{field}: {nbytes} bytes do not fit an inline protobuf field "
            f"(max {MAX_INLINE_BYTES}); use transport='shm'",
            field=field,
            expected=MAX_INLINE_BYTES,
            actual=nbytes,
        )


def pack(
    array: Any,
    message_type: type[M],
    *,
    dtype: str | None = None,
    transport: Transport = "inline",
    shm_min_bytes: int = SHM_MIN_BYTES,
    shm_dir: Path | None = None,
    exporter: RemoteExporter | None = None,
) -> M:
    """A filled ``TensorData`` of ``message_type`` (SGLang, vLLM or TokenSpeed) for ``array``.

    ``dtype`` converts float32 to ``"bfloat16"`` or ``"float16"`` (round to nearest even; NaN and
    Inf preserved) in the same pass that copies the bytes. ``transport="shm"`` writes the bytes to
    a new shared-memory segment and sends its handle; ``"auto"`` does so from ``shm_min_bytes`` on
    when the engine's layout has a shared-memory handle. ``transport="remote"`` (vLLM and
    TokenSpeed layouts) stages the bytes with ``exporter`` (default: the enclosing
    :func:`~smg_grpc_proto.tensors.remote_context`'s, else a process default created on first
    use) and sends a ``RemoteTensorHandle`` (``transport="nixl"``); when the exporter refuses
    (arena full, larger than a slot) or NIXL is not installed the bytes go inline instead,
    counted in :func:`~smg_grpc_proto.tensors.remote_stats`.
    """
    layout = layout_of(message_type)
    source = inspect(array, dtype)
    placement = choose_transport(
        layout, source.nbytes, transport, shm_min_bytes, layout.payload_field
    )
    src = source.contiguous()
    message = message_type()
    message.shape.extend(source.shape)  # type: ignore[attr-defined]
    message.dtype = source.wire_dtype  # type: ignore[attr-defined]
    if placement == "shm":
        write_shm(message, src, source.wire_dtype, source.nbytes, shm_dir or shm.DEFAULT_DIR)
        return message
    if placement == "remote":
        payload = wire_bytes(src, source.source_dtype, source.wire_dtype)
        if write_remote(message, payload, source.nbytes, layout.payload_field, exporter):
            return message
    setattr(message, layout.payload_field, _backend.convert(src, source.wire_dtype))
    return message


def wire_bytes(src: np.ndarray[Any, Any], source_dtype: str, wire_dtype: str) -> Any:
    """``src`` (contiguous storage) in wire form: itself when no conversion is asked, else
    the converted bytes."""
    return src if source_dtype == wire_dtype else _backend.convert(src, wire_dtype)


def write_remote(
    message: Any, payload: Any, nbytes: int, field: str, exporter: RemoteExporter | None
) -> bool:
    """Stage ``payload`` (``nbytes`` wire bytes) for a NIXL READ and fill ``message.remote``;
    ``False`` (counted, logged) when it has to go inline instead, which the caller checks
    against the inline limit."""
    handle = _remote.export(payload, field, exporter) if nbytes else None
    if handle is None:
        check_inline(nbytes, field)
        return False
    transport, descriptor, sent = handle
    remote = message.remote
    remote.transport = transport
    remote.descriptor = descriptor
    remote.nbytes = sent
    return True


def choose_transport(
    layout: Layout, nbytes: int, transport: Transport, shm_min_bytes: int, field: str
) -> Placement:
    """Where a tensor of ``nbytes`` goes under ``transport``: ``"inline"``, ``"shm"`` or
    ``"remote"`` (which may still fall back to inline when exported); checks the transport
    name, that the layout has the handle, and, for inline payloads, the size limit."""
    if transport not in ("inline", "shm", "auto", "remote"):
        raise TensorError(
            f"transport must be 'inline', 'shm', 'auto' or 'remote', got {transport!r}",
            field="transport",
            expected=["inline", "shm", "auto", "remote"],
            actual=transport,
        )
    if transport == "remote":
        if not layout.supports_remote:
            raise TensorError(
                f"transport: {field} is a {layout.full_name}, which has no remote handle "
                "(inline only); only the vLLM and TokenSpeed layouts carry RemoteTensorHandle",
                field="transport",
                expected="inline",
                actual=transport,
            )
        return "remote"
    use_shm = transport == "shm" or (
        transport == "auto" and layout.supports_shm and nbytes >= shm_min_bytes
    )
    if use_shm and not layout.supports_shm:
        raise TensorError(
            f"transport: {layout.full_name} has no shared-memory handle (inline only)",
            field="transport",
            expected="inline",
            actual=transport,
        )
    if not use_shm:
        check_inline(nbytes, field)
    return "shm" if use_shm else "inline"


def choose_shm(
    layout: Layout, nbytes: int, transport: Transport, shm_min_bytes: int, field: str
) -> bool:
    """Whether a tensor of ``nbytes`` goes to shared memory under ``transport``
    (:func:`choose_transport` without the remote case)."""
    return choose_transport(layout, nbytes, transport, shm_min_bytes, field) == "shm"


def write_shm(message: Any, src: np.ndarray[Any, Any], target: str, nbytes: int, d: Path) -> None:
    """Write ``src`` (converted to ``target``) to a new segment and point ``message.shm`` at it."""
    segment = shm.create(nbytes, directory=d)
    try:
        if nbytes:
            _backend.convert_into(src, segment.buffer, target)
    except BaseException:
        segment.close()
        shm.unlink(segment.name, directory=d)
        raise
    segment.close()
    handle = message.shm
    handle.name = segment.name
    handle.offset = 0
    handle.nbytes = nbytes
    handle.owner_id = segment.owner_id


def _payload_kind(message: Any, layout: Layout) -> str | None:
    if layout.oneof is None:
        return layout.payload_field
    kind: str | None = message.WhichOneof(layout.oneof)
    return kind


def unpack(
    message: Message,
    *,
    bf16: Bf16Mode = "auto",
    unlink: bool | None = None,
    shm_dir: Path | None = None,
    shm_read: ShmRead | None = None,
    puller: RemotePuller | None = None,
) -> np.ndarray[Any, Any]:
    """The tensor of a ``TensorData`` message as a read-only numpy array, without copying.

    Inline payloads are viewed in place (the array keeps the bytes alive); shared-memory payloads
    are unlinked on opening (unless ``unlink=False`` or upstream's
    ``TOKENSPEED_UNLINK_MM_SHM_AFTER_READ=0``) and mapped read-only, or copied into private
    memory with ``shm_read="copy"`` (see :func:`smg_grpc_proto.shm.open_readonly`);
    ``shm_read="refuse"`` refuses them without opening anything. ``bfloat16`` comes back as
    ``ml_dtypes.bfloat16`` when ml_dtypes is installed (``bf16="auto"``); otherwise as float32
    (an exact widening, the one case that copies), or as the raw ``uint16`` bits with
    ``bf16="uint16"``.

    ``remote`` payloads (``transport="nixl"``) are pulled with ``puller`` (default: the
    enclosing :func:`~smg_grpc_proto.tensors.remote_context`'s, else a process default created on
    first use) into private memory, after checking ``nbytes`` against the shape and dtype;
    without NIXL they raise :class:`~smg_grpc_proto.errors.RemoteTransportUnavailableError`
    (saying what to install), another transport name
    :class:`~smg_grpc_proto.errors.TransportNotImplementedError`.
    """
    layout = layout_of(message)
    name = layout.full_name
    td: Any = message
    dtype = td.dtype
    check_dtype(dtype, field=f"{name}.dtype")
    shape = tuple(td.shape)
    nbytes = byte_length(shape, dtype, field=f"{name}.shape")
    kind = _payload_kind(td, layout)
    if kind == layout.payload_field:
        raw: Any = getattr(td, layout.payload_field)
        if len(raw) != nbytes:
            raise TensorError(
                f"{name}.{layout.payload_field}: {len(raw)} bytes, but shape {list(shape)} of "
                f"{dtype} needs {nbytes}",
                field=f"{name}.{layout.payload_field}",
                expected=nbytes,
                actual=len(raw),
            )
    elif kind == "shm":
        handle = td.shm
        if shm_read == "refuse":
            raise ShmError(
                f"{name}.shm: this server takes no shared-memory payloads (no shared /dev/shm "
                "namespace); send inline",
                field=f"{name}.shm",
                expected="inline",
                actual="shm",
            )
        if handle.nbytes != nbytes:
            raise TensorError(
                f"{name}.shm.nbytes = {handle.nbytes}, but shape {list(shape)} of {dtype} "
                f"needs {nbytes}",
                field=f"{name}.shm.nbytes",
                expected=nbytes,
                actual=handle.nbytes,
            )
        raw = shm.open_readonly(
            handle.name,
            offset=handle.offset,
            nbytes=handle.nbytes,
            directory=shm_dir or shm.DEFAULT_DIR,
            unlink_after=unlink,
            read=shm_read,
        )
    elif kind == "remote":
        raw = _remote.pull(td.remote, name, nbytes, puller)
    else:
        raise TensorError(
            f"{name}: no payload (none of inline, shm, remote is set)",
            field=f"{name}.payload",
            expected=["inline", "shm", "remote"],
            actual=None,
        )
    return view(raw, dtype, shape, bf16=bf16)


def view(
    raw: Any, dtype: str, shape: tuple[int, ...], *, bf16: Bf16Mode = "auto", offset: int = 0
) -> np.ndarray[Any, Any]:
    """A read-only array over ``raw`` (bytes or uint8 array) at ``offset``; sizes pre-checked."""
    storage = NUMPY_STORAGE[dtype]
    array = np.frombuffer(raw, dtype=storage, count=math.prod(shape), offset=offset).reshape(shape)
    if array.flags.writeable:  # never for bytes or read-only mappings; kept as a guarantee
        array.flags.writeable = False
    if dtype == "bfloat16":
        return _bf16(array, bf16)
    return array


def _bf16(bits: np.ndarray[Any, Any], mode: Bf16Mode) -> np.ndarray[Any, Any]:
    if mode == "uint16":
        return bits
    if mode in ("auto", "ml_dtypes"):
        try:
            import ml_dtypes
        except ImportError:
            if mode == "ml_dtypes":
                raise
        else:
            return bits.view(ml_dtypes.bfloat16)
    widened = bits.astype(np.uint32)
    widened <<= 16  # in place: keeps 0-d arrays arrays
    widened = widened.view(np.float32)
    widened.flags.writeable = False
    return widened


def unpack_torch(
    message: Message,
    *,
    unlink: bool | None = None,
    shm_dir: Path | None = None,
    shm_read: ShmRead | None = None,
    puller: RemotePuller | None = None,
) -> Any:
    """The tensor as a ``torch.Tensor`` sharing the payload memory (native bfloat16).

    torch has no read-only tensors: the returned tensor aliases immutable bytes or a read-only
    mapping, so ``clone()`` it before writing to it.
    """
    import torch

    bits = unpack(
        message, bf16="uint16", unlink=unlink, shm_dir=shm_dir, shm_read=shm_read, puller=puller
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
        tensor = torch.from_numpy(bits)
    if message.dtype == "bfloat16":  # type: ignore[attr-defined]
        tensor = tensor.view(torch.bfloat16)
    return tensor
