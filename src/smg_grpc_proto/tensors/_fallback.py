"""Pure-numpy implementations of the native tensor kernels.

Used when the Rust extension is unavailable or disabled (``SMG_GRPC_PROTO_NATIVE=0``). Every
function produces exactly the bytes its native twin produces (tests compare them), just slower:
conversions go through numpy and the frame codec walks the wire format in Python (it only visits
record headers, never payload bytes, so it stays cheap for small headers). Its errors are the
native ones: the same class, message, ``field``, ``expected``, ``actual`` and ``offset`` (tests
compare them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from smg_grpc_proto.errors import TensorError
from smg_grpc_proto.tensors._layout import Plan

MAX_DEPTH = 100
MAX_FIELD_NUMBER = 2**29 - 1
TOKEN_LEN = 20  # 16-byte nonce + u32 little-endian index
_U64 = 2**64 - 1


def _bf16_bits(src: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """float32 -> bfloat16 bits, round to nearest even; NaN keeps sign and payload, made quiet."""
    u = src.view("<u4").astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    out = np.where(nan, (u >> 16) | 0x0040, rounded)
    return out.astype("<u2")


def _f16_bits(src: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """float32 -> float16 bits (IEEE round to nearest even); NaN made quiet like F16C does."""
    with np.errstate(over="ignore"):  # overflow to +-Inf is the IEEE result we want
        out: np.ndarray[Any, Any] = src.astype("<f2").view("<u2").copy()
    u = src.view("<u4")
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    if nan.any():
        quiet = ((u >> 16) & 0x8000) | 0x7E00 | ((u & 0x007FFFFF) >> 13)
        out[nan] = quiet[nan].astype("<u2")
    return out


def _converted(src: np.ndarray[Any, Any], wire_dtype: str) -> np.ndarray[Any, Any]:
    flat: np.ndarray[Any, Any] = src.reshape(-1)
    if src.dtype == np.dtype("<f4") and wire_dtype == "bfloat16":
        return _bf16_bits(flat)
    if src.dtype == np.dtype("<f4") and wire_dtype == "float16":
        return _f16_bits(flat)
    return flat


def convert(src: np.ndarray[Any, Any], wire_dtype: str) -> bytes:
    return _converted(src, wire_dtype).tobytes()


def convert_into(src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any], wire_dtype: str) -> None:
    data = _converted(src, wire_dtype).view(np.uint8)
    if data.nbytes != dst.nbytes:
        raise TensorError(
            f"dst: holds {dst.nbytes} bytes, the converted tensor needs exactly {data.nbytes}",
            field="dst",
            expected=data.nbytes,
            actual=dst.nbytes,
        )
    dst[...] = data


def _varint(buf: bytes, pos: int, end: int, input: str) -> tuple[int, int]:
    """The varint at ``pos`` (bits beyond 64 dropped, as the native codec and upb do) and the
    position after it; ``input`` names the argument in errors."""
    start = pos
    value = shift = 0
    while True:
        if pos >= end:
            raise TensorError(
                f"{input}: truncated varint at byte {start}", field=input, offset=start
            )
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & _U64, pos
        shift += 7
        if shift >= 70:
            raise TensorError(
                f"{input}: varint longer than 10 bytes at byte {start}", field=input, offset=start
            )


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Walker:
    """One pass over a message along a plan, rewriting TensorData payload records."""

    def __init__(self, data: bytes, input: str, nonce: bytes, replace: Any) -> None:
        self.data = data
        self.input = input  # the argument's name, for errors
        self.nonce = nonce
        self.replace = replace  # callable(body_start, body_len) -> bytes | None (None = keep)

    def walk(self, start: int, end: int, plan: Plan, depth: int) -> list[bytes]:
        if depth > MAX_DEPTH:
            raise TensorError(
                f"plan: nested deeper than {MAX_DEPTH} levels", field="plan", expected=MAX_DEPTH
            )
        data, input = self.data, self.input
        children = dict(plan) if isinstance(plan, tuple) else {}
        payload = plan if isinstance(plan, int) else None
        out: list[bytes] = []
        pos = start
        while pos < end:
            rec = pos
            key, pos = _varint(data, pos, end, input)
            number, wire_type = key >> 3, key & 7
            if number == 0:
                raise TensorError(
                    f"{input}: field number 0 in the record at byte {rec}",
                    field=input,
                    actual=0,
                    offset=rec,
                )
            if number > MAX_FIELD_NUMBER:
                raise TensorError(
                    f"{input}: field number {number} in the record at byte {rec} exceeds "
                    f"{MAX_FIELD_NUMBER}",
                    field=input,
                    expected=MAX_FIELD_NUMBER,
                    actual=number,
                    offset=rec,
                )
            if wire_type == 0:
                _, pos = _varint(data, pos, end, input)
            elif wire_type in (1, 5):
                needed, available = (8 if wire_type == 1 else 4), end - pos
                if available < needed:
                    raise TensorError(
                        f"{input}: field {number} at byte {rec} needs {needed} bytes, only "
                        f"{available} remain",
                        field=input,
                        expected=needed,
                        actual=available,
                        offset=rec,
                    )
                pos += needed
            elif wire_type == 2:
                length, body = _varint(data, pos, end, input)
                pos = body + length
                if pos > end:
                    raise TensorError(
                        f"{input}: field {number} at byte {rec} claims {length} bytes, "
                        f"only {end - body} remain",
                        field=input,
                        expected=length,
                        actual=end - body,
                        offset=rec,
                    )
                tag = data[rec : _tag_end(data, rec)]
                if payload is not None and number == payload:
                    new = self.replace(body, length)
                    if new is not None:
                        out += [tag, _encode_varint(len(new)), new]
                        continue
                elif number in children:
                    inner = self.walk(body, pos, children[number], depth + 1)
                    size = sum(len(p) for p in inner)
                    out += [tag, _encode_varint(size), *inner]
                    continue
            else:
                message = (
                    f"group wire type {wire_type} (field {number}) at byte {rec} is not supported"
                    if wire_type in (3, 4)
                    else f"invalid wire type {wire_type} (field {number}) at byte {rec}"
                )
                raise TensorError(f"{input}: {message}", field=input, actual=wire_type, offset=rec)
            out.append(data[rec:pos])
        return out


def _tag_end(data: bytes, pos: int) -> int:
    while data[pos] >= 0x80:
        pos += 1
    return pos + 1


def decode_frames(data: bytes, plan: Plan, nonce: bytes) -> tuple[bytes, list[tuple[int, int]]]:
    spans: list[tuple[int, int]] = []

    def replace(body: int, length: int) -> bytes:
        spans.append((body, length))
        return nonce + (len(spans) - 1).to_bytes(4, "little")

    pieces = _Walker(data, "data", nonce, replace).walk(0, len(data), plan, 0)
    return b"".join(pieces), spans


def encode_frames(
    header: bytes, plan: Plan, nonce: bytes, sources: list[tuple[np.ndarray[Any, Any], str]]
) -> bytes:
    def replace(body: int, length: int) -> bytes | None:
        if length != TOKEN_LEN or header[body : body + 16] != nonce:
            return None
        index = int.from_bytes(header[body + 16 : body + 20], "little")
        if index >= len(sources):
            raise TensorError(
                f"header: token at byte {body} names tensor {index}, but only {len(sources)} "
                "sources are attached",
                field="header",
                expected=len(sources),
                actual=index,
                offset=body,
            )
        array, wire_dtype = sources[index]
        return convert(array, wire_dtype)

    return b"".join(_Walker(header, "header", nonce, replace).walk(0, len(header), plan, 0))
