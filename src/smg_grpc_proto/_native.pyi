"""Type stub of the private Rust extension; checked against the binary by mypy stubtest."""

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.build import BuildInfo

__all__ = [
    "__version__",
    "build_info",
    "convert",
    "convert_into",
    "decode_frames",
    "dtype_itemsize",
    "encode_frames",
]
__version__: str

# Where TensorData messages sit in a message type: a tuple of (field_number, child) pairs, child
# being another plan; or an int, meaning "this message is a TensorData whose payload bytes are
# this field" (1 for SGLang ``data`` and vLLM ``inline``, 3 for TokenSpeed ``inline``). Map
# fields are messages with key = 1 and value = 2. Nested at most 100 levels deep.
_Plan: TypeAlias = int | tuple[tuple[int, "_Plan"], ...]

def build_info() -> BuildInfo: ...
def dtype_itemsize(name: str) -> int:
    """Bytes per element of a wire dtype (``float32`` 4, ``bfloat16`` 2, ``float16`` 2,
    ``int64`` 8, ``uint32`` 4, ``uint8`` 1).

    Raises ``ValueError`` for a name outside that vocabulary.
    """

def convert(src: npt.NDArray[Any], wire_dtype: str) -> bytes:
    """The bytes of ``src`` on the wire as ``wire_dtype``, in a new ``bytes`` object.

    ``src`` must be a C-contiguous numpy array of dtype ``<f4``, ``<f2``, ``<i8``, ``<u4``,
    ``|u1`` or ``<u2`` (bfloat16 bits). Same dtype: a copy. ``float32`` to ``bfloat16`` or
    ``float16``: round to nearest even, overflow to ±Inf, NaN stays a (quiet) NaN with its
    sign. Inputs of 1 MiB or more are converted on several threads; the GIL is released.

    Raises ``TypeError`` if ``src`` is not a numpy array, ``ValueError`` for an unknown or
    unsupported dtype, a conversion not offered, or a non-contiguous array.
    """

def convert_into(src: npt.NDArray[Any], dst: npt.NDArray[np.uint8], wire_dtype: str) -> None:
    """Like :func:`convert`, written into ``dst`` (e.g. a shared-memory mapping).

    ``dst`` must be a writable, C-contiguous ``uint8`` array of exactly the converted size and
    must not overlap ``src``; ``ValueError`` names both sizes otherwise.
    """

def decode_frames(data: bytes, plan: _Plan, nonce: bytes) -> tuple[bytes, list[tuple[int, int]]]:
    """Split a serialized message into a small header and its tensor payload spans.

    Walks ``data`` as a message of type ``plan``: every TensorData payload record is replaced
    by the 20-byte token ``nonce + u32_le(i)`` (``i`` counts payloads in encounter order) and
    enclosing length prefixes are re-encoded; everything else is copied verbatim. Returns the
    header (a valid serialization of the same message with tokens as payloads) and, per token,
    ``(offset, length)`` of the original payload within ``data``.

    ``nonce`` must be 16 bytes. Raises ``ValueError`` naming the byte offset for malformed wire
    data (truncation, invalid wire type or field number, groups), for a malformed plan, and for
    a ``data`` beyond the 2 GiB protobuf limit; ``TypeError`` for a plan of the wrong shape.
    """

def encode_frames(
    header: bytes,
    plan: _Plan,
    nonce: bytes,
    sources: Sequence[tuple[npt.NDArray[Any], str]],
) -> bytes:
    """The inverse of :func:`decode_frames`: write the tensors into the header.

    Every TensorData payload of ``header`` that is a token ``nonce + u32_le(i)`` is replaced by
    ``sources[i]`` = ``(array, wire_dtype)`` converted as by :func:`convert`, written straight
    into the output (one pass over each tensor's bytes, in parallel for tensors of 1 MiB or
    more, GIL released); enclosing lengths are re-encoded. Other payloads are kept verbatim.

    Raises ``ValueError`` for a token index without a source, an output beyond the 2 GiB
    protobuf limit, malformed wire data or plan, or an unusable source array (message prefixed
    ``sources[i]``); ``TypeError`` for arguments of the wrong type.
    """
