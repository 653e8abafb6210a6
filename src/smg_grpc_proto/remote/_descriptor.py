"""The remote descriptor and the slot framing, in pure Python (no NIXL needed).

Wire format, as the SMG gateway's exporter writes it and ``smg-grpc-servicer``'s puller reads it::

    b"SMGRDMA1" | slot_addr u64 LE | gen u64 LE | slot_key i64 LE | port u16 LE | ip (UTF-8)

The older form, which the puller still accepts, has no magic and no slot key (the request
carries the key instead)::

    slot_addr u64 LE | gen u64 LE | port u16 LE | ip (UTF-8)

The slot at ``slot_addr`` holds ``[gen u64 LE][payload][gen u64 LE]``: a reader reads
``nbytes + 16`` bytes from ``slot_addr`` and accepts the payload only if both stamps equal the
descriptor's ``gen``.
"""

from __future__ import annotations

import ipaddress
import math
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.errors import RemoteDescriptorError, RemoteStampError

__all__ = [
    "DESCRIPTOR_MAGIC",
    "FRAME_BYTES",
    "GEN_BYTES",
    "MAX_IP_BYTES",
    "RemoteDescriptor",
    "check_nbytes",
    "decode_descriptor",
    "encode_descriptor",
    "frame_stamps",
    "read_stamps",
    "verify_stamps",
]

DESCRIPTOR_MAGIC = b"SMGRDMA1"
"""The first 8 bytes of the current descriptor form (the gateway's ``DESCRIPTOR_MAGIC``)."""
GEN_BYTES = 8
"""Width of one generation stamp."""
FRAME_BYTES = 2 * GEN_BYTES
"""The two stamps around a payload: a reader reads ``nbytes + FRAME_BYTES``."""
MAX_IP_BYTES = 255
"""Longest ip text accepted (an IPv6 address with a zone fits many times over)."""

_U64_MAX = (1 << 64) - 1
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
_HEAD = struct.Struct("<QQqH")  # slot_addr, gen, slot_key, port (after the magic)
_LEGACY_HEAD = struct.Struct("<QQH")  # slot_addr, gen, port
_STAMP = struct.Struct("<Q")

Framed = bytes | bytearray | memoryview | npt.NDArray[np.uint8]
"""A framed slot read: ``[gen][payload][gen]``."""


@dataclass(frozen=True)
class RemoteDescriptor:
    """Where a staged tensor lives: the exporter's slot address and generation, the slot key the
    reader notifies with (``str(slot_key)``), and the exporter's listener ``ip``:``port``."""

    slot_addr: int
    gen: int
    slot_key: int
    port: int
    ip: str
    legacy: bool = False
    """True when decoded from the older form (no magic; the key came from the request)."""

    def __post_init__(self) -> None:
        _check_range("slot_addr", self.slot_addr, 0, _U64_MAX)
        _check_range("gen", self.gen, 0, _U64_MAX)
        _check_range("slot_key", self.slot_key, _I64_MIN, _I64_MAX)
        _check_port(self.port)
        _check_ip(self.ip)

    @property
    def notification(self) -> bytes:
        """The tag the reader sends when its READ completes: ``str(slot_key)``."""
        return str(self.slot_key).encode()


def _check_range(field: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RemoteDescriptorError(
            f"remote descriptor {field} must be an int, got {type(value).__name__}",
            field=field,
            expected="int",
            actual=type(value).__name__,
        )
    if not low <= value <= high:
        raise RemoteDescriptorError(
            f"remote descriptor {field}={value} is outside [{low}, {high}]",
            field=field,
            expected=(low, high),
            actual=value,
        )


def _check_port(port: int) -> None:
    _check_range("port", port, 0, 0xFFFF)
    if port == 0:
        raise RemoteDescriptorError(
            "remote descriptor port=0: the exporter's listener port must be 1..65535",
            field="port",
            expected=(1, 0xFFFF),
            actual=0,
        )


def _check_ip(ip: str) -> None:
    if not isinstance(ip, str):
        raise RemoteDescriptorError(
            f"remote descriptor ip must be a str, got {type(ip).__name__}",
            field="ip",
            expected="str",
            actual=type(ip).__name__,
        )
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        raise RemoteDescriptorError(
            f"remote descriptor ip {ip!r} is not an IPv4 or IPv6 address",
            field="ip",
            expected="an IP address",
            actual=ip,
        ) from None
    if len(ip.encode()) > MAX_IP_BYTES:  # pragma: no cover - no valid address is this long
        raise RemoteDescriptorError(
            f"remote descriptor ip is {len(ip.encode())} bytes, at most {MAX_IP_BYTES}",
            field="ip",
            expected=MAX_IP_BYTES,
            actual=len(ip.encode()),
        )


def encode_descriptor(descriptor: RemoteDescriptor) -> bytes:
    """The current (``SMGRDMA1``) wire form of ``descriptor``."""
    head = _HEAD.pack(descriptor.slot_addr, descriptor.gen, descriptor.slot_key, descriptor.port)
    return DESCRIPTOR_MAGIC + head + descriptor.ip.encode()


def decode_descriptor(data: bytes, *, slot_key: int | None = None) -> RemoteDescriptor:
    """Parse a descriptor in either form.

    ``slot_key`` is the key the request carries, if any: the older form (no magic) needs it,
    and for the current form it must equal the descriptor's own key. Raises
    :class:`~smg_grpc_proto.errors.RemoteDescriptorError` naming the field at fault.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RemoteDescriptorError(
            f"remote descriptor must be bytes, got {type(data).__name__}",
            field="descriptor",
            expected="bytes",
            actual=type(data).__name__,
        )
    raw = bytes(data)
    if raw.startswith(DESCRIPTOR_MAGIC):
        need = len(DESCRIPTOR_MAGIC) + _HEAD.size
        _check_length(raw, need, "SMGRDMA1")
        addr, gen, key, port = _HEAD.unpack_from(raw, len(DESCRIPTOR_MAGIC))
        ip = _decode_ip(raw[need:])
        if slot_key is not None and int(slot_key) != key:
            raise RemoteDescriptorError(
                f"remote descriptor slot_key={key} disagrees with the request's {int(slot_key)}",
                field="slot_key",
                expected=int(slot_key),
                actual=key,
            )
        return RemoteDescriptor(addr, gen, key, port, ip)
    if slot_key is None:
        raise RemoteDescriptorError(
            f"remote descriptor has no {DESCRIPTOR_MAGIC!r} magic (first bytes {raw[:8]!r}) and "
            "no slot key was given: the older form needs the request's key",
            field="descriptor",
            expected=DESCRIPTOR_MAGIC,
            actual=raw[:8],
        )
    _check_length(raw, _LEGACY_HEAD.size, "legacy")
    addr, gen, port = _LEGACY_HEAD.unpack_from(raw, 0)
    ip = _decode_ip(raw[_LEGACY_HEAD.size :])
    return RemoteDescriptor(addr, gen, int(slot_key), port, ip, legacy=True)


def _check_length(raw: bytes, need: int, form: str) -> None:
    # At least one byte of ip follows the fixed part.
    if len(raw) < need + 1:
        raise RemoteDescriptorError(
            f"remote descriptor ({form} form) is {len(raw)} bytes; it needs {need} fixed bytes "
            "and an ip",
            field="descriptor",
            expected=need + 1,
            actual=len(raw),
        )
    if len(raw) > need + MAX_IP_BYTES:
        raise RemoteDescriptorError(
            f"remote descriptor ({form} form) is {len(raw)} bytes, more than {need} fixed "
            f"bytes and a {MAX_IP_BYTES}-byte ip",
            field="descriptor",
            expected=need + MAX_IP_BYTES,
            actual=len(raw),
        )


def _decode_ip(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteDescriptorError(
            f"remote descriptor ip {raw!r} is not UTF-8",
            field="ip",
            expected="UTF-8 text",
            actual=raw,
        ) from None


def check_nbytes(nbytes: int, shape: tuple[int, ...] | list[int], itemsize: int) -> int:
    """Check that ``nbytes`` equals ``product(shape) x itemsize`` (the proto's rule) and return
    it; raises :class:`~smg_grpc_proto.errors.RemoteDescriptorError` (``field="nbytes"``)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise RemoteDescriptorError(
            f"remote nbytes must be a non-negative int, got {nbytes!r}",
            field="nbytes",
            expected="int >= 0",
            actual=nbytes,
        )
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims) or itemsize <= 0:
        raise RemoteDescriptorError(
            f"remote tensor shape {dims} / itemsize {itemsize} is invalid",
            field="shape",
            expected="dims >= 0, itemsize > 0",
            actual=(dims, itemsize),
        )
    expected = math.prod(dims) * itemsize
    if nbytes != expected:
        raise RemoteDescriptorError(
            f"remote nbytes={nbytes} but shape {dims} x itemsize {itemsize} = {expected}",
            field="nbytes",
            expected=expected,
            actual=nbytes,
        )
    return nbytes


def frame_stamps(gen: int) -> bytes:
    """The 8-byte stamp written before and after a payload."""
    _check_range("gen", gen, 0, _U64_MAX)
    return _STAMP.pack(gen)


def read_stamps(framed: Framed, nbytes: int) -> tuple[int, int]:
    """The ``(header, trailer)`` stamps of a framed slot read of ``nbytes + FRAME_BYTES``."""
    view = (
        framed.reshape(-1).view(np.uint8)
        if isinstance(framed, np.ndarray)
        else np.frombuffer(framed, dtype=np.uint8)
    )
    if len(view) < nbytes + FRAME_BYTES:
        raise RemoteDescriptorError(
            f"framed slot is {len(view)} bytes, less than nbytes={nbytes} + {FRAME_BYTES}",
            field="nbytes",
            expected=nbytes + FRAME_BYTES,
            actual=len(view),
        )
    (header,) = _STAMP.unpack(view[:GEN_BYTES].tobytes())
    (trailer,) = _STAMP.unpack(view[GEN_BYTES + nbytes : FRAME_BYTES + nbytes].tobytes())
    return header, trailer


def verify_stamps(framed: Framed, nbytes: int, descriptor: RemoteDescriptor) -> None:
    """Raise :class:`~smg_grpc_proto.errors.RemoteStampError` unless both stamps of ``framed``
    equal ``descriptor.gen`` (a recycled or torn slot otherwise)."""
    header, trailer = read_stamps(framed, nbytes)
    if header != descriptor.gen or trailer != descriptor.gen:
        raise RemoteStampError(
            f"remote slot {descriptor.slot_key} at {descriptor.ip}:{descriptor.port} has stamps "
            f"header={header} trailer={trailer}, expected gen={descriptor.gen}: the exporter "
            "recycled the slot (lease ended) or the read was torn; data discarded",
            field="gen",
            expected=descriptor.gen,
            actual=(header, trailer),
        )
