"""Chooses the kernels: the Rust extension when it loads, else the pure-numpy fallback.

Set ``SMG_GRPC_PROTO_NATIVE=0`` to force the fallback (both produce identical bytes).
Errors from either side surface as :class:`~smg_grpc_proto.errors.TensorError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal, TypeVar

import numpy as np

from smg_grpc_proto.errors import SmgProtoError, TensorError
from smg_grpc_proto.tensors import _fallback
from smg_grpc_proto.tensors._layout import Plan

_KERNELS = ("convert", "convert_into", "decode_frames", "encode_frames")


def _load_native() -> ModuleType | None:
    if os.environ.get("SMG_GRPC_PROTO_NATIVE", "1").strip().lower() in {"0", "false", "no", "off"}:
        return None
    try:
        from smg_grpc_proto import _native
    except ImportError:
        return None
    if not all(hasattr(_native, name) for name in _KERNELS):
        return None
    return _native


_NATIVE = _load_native()

#: Which kernels are active: ``"native"`` (Rust) or ``"numpy"`` (the pure-Python fallback).
backend: Literal["native", "numpy"] = "native" if _NATIVE is not None else "numpy"

_T = TypeVar("_T")


def _call(name: str, *args: Any) -> Any:
    if _NATIVE is None:
        return getattr(_fallback, name)(*args)
    try:
        return getattr(_NATIVE, name)(*args)
    except SmgProtoError:
        raise
    except ValueError as exc:
        raise TensorError(str(exc), field=name) from None


def convert(src: np.ndarray[Any, Any], wire_dtype: str) -> bytes:
    """Bytes of ``src`` (C-contiguous little-endian storage) converted to ``wire_dtype``."""
    out: bytes = _call("convert", src, wire_dtype)
    return out


def convert_into(src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any], wire_dtype: str) -> None:
    """Like :func:`convert`, written into the writable uint8 array ``dst`` of exact size."""
    _call("convert_into", src, dst, wire_dtype)


def decode_frames(data: bytes, plan: Plan, nonce: bytes) -> tuple[bytes, list[tuple[int, int]]]:
    """Split ``data`` into a small header (payloads replaced by tokens) and payload spans."""
    header, spans = _call("decode_frames", data, plan, nonce)
    return header, [(int(a), int(b)) for a, b in spans]


def encode_frames(
    header: bytes, plan: Plan, nonce: bytes, sources: list[tuple[np.ndarray[Any, Any], str]]
) -> bytes:
    """Replace the tokens in ``header`` by the converted ``sources``: one pass per tensor."""
    out: bytes = _call("encode_frames", header, plan, nonce, sources)
    return out


def kernels() -> dict[str, Callable[..., Any]]:
    """The active implementations by name (for tests and benchmarks)."""
    impl: Any = _NATIVE if _NATIVE is not None else _fallback
    return {name: getattr(impl, name) for name in _KERNELS}
