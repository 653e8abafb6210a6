"""Writing (and reading back) named tensors: safetensors without the ``safetensors`` package, npz.

The safetensors layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
length ``N``, ``N`` bytes of JSON
``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}``
padded with spaces to a multiple of 8, then every tensor's raw little-endian C-order bytes
(offsets relative to the end of the header), back to back with no gaps (the reference reader
rejects holes). As the ``safetensors`` package does, tensors are laid out by decreasing item
size, then by name, so every tensor starts at a multiple of its item size.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
import numpy.typing as npt

__all__ = ["FORMATS", "ExportFormat", "read_safetensors", "write_safetensors", "write_tensors"]

ExportFormat = Literal["safetensors", "npz"]
FORMATS: tuple[ExportFormat, ...] = ("safetensors", "npz")

# numpy dtype (little-endian) <-> safetensors dtype name
_DTYPES: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}
_NUMPY: dict[str, str] = {v: k for k, v in _DTYPES.items()}

_MAX_HEADER = 100 * 1024 * 1024  # the safetensors package's own limit


def _le_contiguous(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``array`` as C-contiguous little-endian (a copy only when needed)."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array)


def _header(
    tensors: Mapping[str, npt.NDArray[Any]], metadata: Mapping[str, str] | None
) -> tuple[bytes, list[npt.NDArray[Any]]]:
    entries: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("safetensors metadata must map str to str")
        entries["__metadata__"] = dict(metadata)
    arrays: list[npt.NDArray[Any]] = []
    offset = 0
    prepared: list[tuple[str, npt.NDArray[Any]]] = []
    for name, tensor in tensors.items():
        if name == "__metadata__":
            raise ValueError("'__metadata__' is reserved and cannot name a tensor")
        array = _le_contiguous(np.asarray(tensor))
        if array.dtype.name not in _DTYPES:
            raise TypeError(f"tensor {name!r}: dtype {array.dtype} has no safetensors name")
        prepared.append((name, array))
    prepared.sort(key=lambda item: (-item[1].dtype.itemsize, item[0]))
    for name, array in prepared:
        dtype = _DTYPES[array.dtype.name]
        entries[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
        arrays.append(array)
    header = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    header += b" " * (-len(header) % 8)
    return header, arrays


def _write_safetensors_to(
    f: BinaryIO, tensors: Mapping[str, npt.NDArray[Any]], metadata: Mapping[str, str] | None
) -> None:
    header, arrays = _header(tensors, metadata)
    f.write(len(header).to_bytes(8, "little"))
    f.write(header)
    for array in arrays:
        f.write(array.data)  # C-contiguous little-endian: the raw bytes, no copy


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, npt.NDArray[Any]],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write ``tensors`` to ``path`` in the safetensors format (atomically: a temporary file in
    the same directory, then a rename)."""
    _atomic(path, lambda f: _write_safetensors_to(f, tensors, metadata))


def read_safetensors(
    path: str | os.PathLike[str],
) -> tuple[dict[str, npt.NDArray[Any]], dict[str, str]]:
    """``(tensors, metadata)`` of a safetensors file (copies; no dependency)."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ValueError(f"{os.fspath(path)}: not a safetensors file (too short)")
    n = int.from_bytes(data[:8], "little")
    if n > _MAX_HEADER or 8 + n > len(data):
        raise ValueError(f"{os.fspath(path)}: header length {n} exceeds the file")
    header = json.loads(data[8 : 8 + n])
    if not isinstance(header, dict):
        raise ValueError(f"{os.fspath(path)}: the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    body = memoryview(data)[8 + n :]
    tensors: dict[str, npt.NDArray[Any]] = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = np.dtype(_NUMPY[info["dtype"]]).newbyteorder("<")
        shape = tuple(int(d) for d in info["shape"])
        if not 0 <= begin <= end <= len(body):
            raise ValueError(f"{os.fspath(path)}: tensor {name!r} lies outside the file")
        array = np.frombuffer(body[begin:end], dtype=dtype).reshape(shape)
        tensors[name] = array.astype(dtype.newbyteorder("="), copy=True)
    return tensors, dict(metadata)


def write_tensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, npt.NDArray[Any]],
    format: ExportFormat = "safetensors",
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write ``tensors`` as ``format``: ``safetensors`` (with ``metadata``) or ``npz``
    (``numpy.savez``, uncompressed; to exactly ``path``, no suffix added)."""
    if format == "safetensors":
        write_safetensors(path, tensors, metadata)
    elif format == "npz":
        arrays = {name: np.asarray(t) for name, t in tensors.items()}
        _atomic(path, lambda f: np.savez(f, allow_pickle=False, **arrays))
    else:
        raise ValueError(f"unknown format {format!r}: expected one of {', '.join(FORMATS)}")


def _atomic(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
