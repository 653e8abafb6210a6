"""The wire vocabulary: dtypes, the three ``TensorData`` layouts, and where tensors sit in messages.

Facts only — no copies, no conversions. Everything here is validated with exact integer math
before any memory is touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, TypeAlias

import numpy as np
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from smg_grpc_proto.errors import TensorError, TensorTypeError

#: Wire dtype name -> item size in bytes (the vocabulary of every engine's ``TensorData.dtype``).
ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "int64": 8,
    "uint32": 4,
    "uint8": 1,
}

#: Wire dtype -> the little-endian numpy dtype holding its bytes (bfloat16 as raw uint16 bits).
NUMPY_STORAGE: dict[str, np.dtype[Any]] = {
    "float32": np.dtype("<f4"),
    "bfloat16": np.dtype("<u2"),
    "float16": np.dtype("<f2"),
    "int64": np.dtype("<i8"),
    "uint32": np.dtype("<u4"),
    "uint8": np.dtype("|u1"),
}

#: numpy dtype kind+size -> the wire dtype it is sent as when no dtype is requested.
_FROM_NUMPY: dict[tuple[str, int], str] = {
    ("f", 4): "float32",
    ("f", 2): "float16",
    ("i", 8): "int64",
    ("u", 4): "uint32",
    ("u", 1): "uint8",
}

#: Conversions done on the way out (source wire dtype -> allowed target wire dtypes).
CONVERSIONS: dict[str, frozenset[str]] = {
    "float32": frozenset({"float32", "bfloat16", "float16"}),
    **{d: frozenset({d}) for d in ITEMSIZE if d != "float32"},
}

# The uint32 shape field caps every dimension; protobuf caps a message at 2 GiB - 1.
MAX_DIM = 2**32 - 1
MAX_INLINE_BYTES = 2**31 - 1
# What numpy can represent: its dimension limit (64 from numpy 2, 32 before) and, for the
# product of the non-zero dimensions times the item size, a signed pointer-sized integer (numpy
# refuses such shapes even when a zero dimension makes the array empty).
MAX_NDIM = 64 if int(np.__version__.split(".")[0]) >= 2 else 32
MAX_ARRAY_BYTES = int(np.iinfo(np.intp).max)


def check_dtype(name: str, *, field: str = "dtype") -> int:
    """Item size of a wire dtype, or a :class:`TensorError` listing the vocabulary."""
    try:
        return ITEMSIZE[name]
    except (KeyError, TypeError):
        raise TensorError(
            f"{field}: unknown dtype {name!r}; expected one of {', '.join(ITEMSIZE)}",
            field=field,
            expected=sorted(ITEMSIZE),
            actual=name,
        ) from None


#: numpy dtype -> wire dtype, filled as dtypes are seen (``dtype.name`` alone costs microseconds).
_WIRE_OF_DTYPE: dict[np.dtype[Any], str] = {}


def wire_dtype_of(array: np.ndarray[Any, Any]) -> str:
    """The wire dtype an array is sent as by default (``ml_dtypes.bfloat16`` -> ``bfloat16``)."""
    dt = array.dtype
    name = _WIRE_OF_DTYPE.get(dt)
    if name is not None:
        return name
    name = "bfloat16" if dt.name == "bfloat16" else _FROM_NUMPY.get((dt.kind, dt.itemsize))
    if name is None:
        raise TensorError(
            f"array dtype {dt} has no wire dtype; expected one of float32, float16, "
            f"bfloat16 (ml_dtypes), int64, uint32, uint8",
            field="array.dtype",
            expected=sorted(ITEMSIZE),
            actual=str(dt),
        )
    if len(_WIRE_OF_DTYPE) < 64:  # a handful in practice (types x byte orders); stay bounded
        _WIRE_OF_DTYPE[dt] = name
    return name


def byte_length(shape: tuple[int, ...] | list[int], dtype: str, *, field: str = "shape") -> int:
    """``product(shape) * itemsize`` with every dimension range-checked and the shape one numpy
    can hold (at most :data:`MAX_NDIM` dimensions, :data:`MAX_ARRAY_BYTES` without the zeros)."""
    itemsize = check_dtype(dtype)
    if len(shape) > MAX_NDIM:
        raise TensorError(
            f"{field} has {len(shape)} dimensions; at most {MAX_NDIM} are supported",
            field=field,
            expected=MAX_NDIM,
            actual=len(shape),
        )
    span = total = itemsize  # without and with the zero dimensions
    for i, dim in enumerate(shape):
        if not 0 <= dim <= MAX_DIM:
            raise TensorError(
                f"{field}[{i}] = {dim} is outside the uint32 range 0..{MAX_DIM}",
                field=f"{field}[{i}]",
                expected=f"0..{MAX_DIM}",
                actual=dim,
            )
        total *= dim
        if dim:
            span *= dim
    if span > MAX_ARRAY_BYTES:
        raise TensorError(
            f"{field} {list(shape)}: its non-zero dimensions span {span} bytes of {dtype}, more "
            f"than an array can address ({MAX_ARRAY_BYTES})",
            field=field,
            expected=MAX_ARRAY_BYTES,
            actual=span,
        )
    return total


@dataclass(frozen=True)
class Layout:
    """How one engine's ``TensorData`` message is laid out."""

    full_name: str
    payload_field: str  # name of the inline bytes field
    payload_number: int  # its field number
    oneof: str | None  # the payload oneof ("payload") or None (SGLang: inline only)
    supports_shm: bool
    supports_remote: bool = False  # has RemoteTensorHandle remote (vLLM, TokenSpeed)


LAYOUTS: dict[str, Layout] = {
    "sglang.grpc.scheduler.TensorData": Layout(
        "sglang.grpc.scheduler.TensorData", "data", 1, None, supports_shm=False
    ),
    "vllm.grpc.engine.TensorData": Layout(
        "vllm.grpc.engine.TensorData",
        "inline",
        1,
        "payload",
        supports_shm=True,
        supports_remote=True,
    ),
    "tokenspeed.grpc.scheduler.TensorData": Layout(
        "tokenspeed.grpc.scheduler.TensorData",
        "inline",
        3,
        "payload",
        supports_shm=True,
        supports_remote=True,
    ),
}


def layout_of(message_or_type: Message | type[Message]) -> Layout:
    """The layout of a ``TensorData`` message (instance or class); TypeError for anything else."""
    desc = getattr(message_or_type, "DESCRIPTOR", None)
    layout = LAYOUTS.get(getattr(desc, "full_name", ""))
    if layout is None:
        raise TensorTypeError(
            f"expected an SGLang, vLLM or TokenSpeed TensorData message or class, got "
            f"{getattr(desc, 'full_name', type(message_or_type).__name__)}",
            field="message_type",
            expected=sorted(LAYOUTS),
            actual=getattr(desc, "full_name", type(message_or_type).__name__),
        )
    return layout


# A plan says where TensorData messages can occur inside a message type: a tuple of
# (field number, child) pairs where child is a sub-plan or, for a TensorData field, the field
# number of its payload. The native frame codec walks the wire format with it.
Plan: TypeAlias = "int | tuple[tuple[int, Plan], ...]"


@cache
def plan_for(descriptor: Descriptor) -> Plan:
    """The plan of a message type (an int if the type itself is a TensorData)."""
    if descriptor.full_name in LAYOUTS:
        return LAYOUTS[descriptor.full_name].payload_number
    return _message_plan(descriptor, frozenset())


def _message_plan(descriptor: Descriptor, visiting: frozenset[str]) -> tuple[tuple[int, Plan], ...]:
    visiting = visiting | {descriptor.full_name}
    out: list[tuple[int, Plan]] = []
    for field in descriptor.fields:
        child_type = field.message_type
        if field.type != FieldDescriptor.TYPE_MESSAGE or child_type is None:
            continue
        if child_type.full_name in LAYOUTS:
            out.append((field.number, LAYOUTS[child_type.full_name].payload_number))
        elif child_type.full_name not in visiting:
            child = _message_plan(child_type, visiting)
            if child:
                out.append((field.number, child))
    return tuple(out)
