"""Chooses the kernels: the Rust extension when it loads, else the pure-numpy fallback.

Set ``SMG_GRPC_PROTO_NATIVE=0`` to force the fallback (both produce identical bytes).
Either side raises :class:`~smg_grpc_proto.errors.TensorError` itself, with the same ``field``,
``expected``, ``actual`` and ``offset``; nothing here re-wraps an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal, TypeVar

import numpy as np

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
    impl = _fallback if _NATIVE is None else _NATIVE
    return getattr(impl, name)(*args)


def _pending_type() -> type | None:
    try:
        from smg_grpc_proto._native import PendingTensor
    except ImportError:
        return None
    return PendingTensor


_PENDING = _pending_type()


def is_pending(obj: object) -> bool:
    """Whether ``obj`` is a tensor not written yet (``_native.PendingTensor``), which the native
    kernels write straight into their destination."""
    return _PENDING is not None and isinstance(obj, _PENDING)


def pending_wire_dtypes(pending: Any) -> tuple[str | None, ...]:
    """The ``dtype`` arguments under which a pending tensor is written straight into place
    (``None``: its own dtype): ``float32`` values as ``float32`` or ``bfloat16``, a constant
    ``int64`` tensor as ``int64``."""
    if pending.dtype == "int64":
        return (None, "int64")
    return (None, "float32", "bfloat16")


def _written(src: Any) -> Any:
    """``src``, a pending tensor written into an array for the numpy fallback."""
    return np.asarray(src.materialize()) if _NATIVE is None and is_pending(src) else src


def convert(src: np.ndarray[Any, Any], wire_dtype: str) -> bytes:
    """Bytes of ``src`` (C-contiguous little-endian storage) converted to ``wire_dtype``."""
    out: bytes = _call("convert", src, wire_dtype)
    return out


def convert_into(src: Any, dst: np.ndarray[Any, Any], wire_dtype: str) -> None:
    """Like :func:`convert`, written into the writable uint8 array ``dst`` of exact size (a
    pending tensor is written there directly)."""
    _call("convert_into", _written(src), dst, wire_dtype)


def decode_frames(data: bytes, plan: Plan, nonce: bytes) -> tuple[bytes, list[tuple[int, int]]]:
    """Split ``data`` into a small header (payloads replaced by tokens) and payload spans."""
    header, spans = _call("decode_frames", data, plan, nonce)
    return header, [(int(a), int(b)) for a, b in spans]


def encode_frames(header: bytes, plan: Plan, nonce: bytes, sources: list[tuple[Any, str]]) -> bytes:
    """Replace the tokens in ``header`` by the converted ``sources`` (arrays, or pending tensors
    written in place): one pass per tensor."""
    if _NATIVE is None:
        sources = [(_written(src), dtype) for src, dtype in sources]
    out: bytes = _call("encode_frames", header, plan, nonce, sources)
    return out


def kernels() -> dict[str, Callable[..., Any]]:
    """The active implementations by name (for tests and benchmarks)."""
    impl: Any = _NATIVE if _NATIVE is not None else _fallback
    return {name: getattr(impl, name) for name in _KERNELS}
