"""numpy arrays <-> every engine's ``TensorData`` message: zero-copy, shared memory, fast.

The wire rules (``protos/README.md``): raw little-endian, C-contiguous row-major bytes, one
``uint32`` per dimension, ``len(payload) == product(shape) * itemsize``, dtypes ``float32``,
``bfloat16``, ``float16``, ``int64``, ``uint32``, ``uint8``. Three layouts exist — SGLang
(``data=1, shape=2, dtype=3``, inline only), vLLM (``inline=1`` in ``oneof payload`` with
``shm=4, remote=5``; ``shape=2, dtype=3``) and TokenSpeed (``shape=1, dtype=2``, ``inline=3``,
``shm=4, remote=5``) — and :func:`pack` / :func:`unpack` speak all three.

* :func:`pack` / :func:`unpack` / :func:`unpack_torch`: one ``TensorData`` at a time;
* :class:`TensorMessage`, :func:`serialize`, :func:`deserializer`, :func:`parse`: whole requests
  whose tensors are written with one copy and read with none (grpcio serializers);
* :func:`keep_freed_memory`: let glibc reuse freed request buffers instead of faulting in
  fresh pages for each large request (opt-in, process-wide);
* :data:`backend`: ``"native"`` (Rust) or ``"numpy"`` (fallback, ``SMG_GRPC_PROTO_NATIVE=0``).

``transport="remote"`` (vLLM and TokenSpeed layouts) stages a tensor in a NIXL exporter's arena
and sends a ``RemoteTensorHandle`` (``transport="nixl"``, wire-compatible with the SMG gateway);
readers pull it. :func:`remote_context` picks the exporter / puller for a block (else a process
default is created on first use); a tensor the exporter refuses (arena full, larger than a slot)
or that finds NIXL missing goes inline, counted by :func:`remote_stats`. NIXL is the ``[nixl]``
extra; reading a ``remote`` payload without it raises
:class:`~smg_grpc_proto.errors.RemoteTransportUnavailableError`.

Bad input raises :class:`~smg_grpc_proto.errors.TensorError` (a ``ValueError``) naming the field
and the numbers.
"""

from smg_grpc_proto.tensors._backend import backend
from smg_grpc_proto.tensors._codec import (
    SHM_MIN_BYTES,
    ShmRead,
    Transport,
    pack,
    unpack,
    unpack_torch,
)
from smg_grpc_proto.tensors._frames import (
    TensorMessage,
    deserializer,
    parse,
    serialize,
    shm_payloads,
)
from smg_grpc_proto.tensors._layout import ITEMSIZE, LAYOUTS, plan_for
from smg_grpc_proto.tensors._memory import keep_freed_memory
from smg_grpc_proto.tensors._remote import RemoteStats, remote_stats
from smg_grpc_proto.tensors._remote import using as remote_context

__all__ = [
    "ITEMSIZE",
    "LAYOUTS",
    "SHM_MIN_BYTES",
    "RemoteStats",
    "ShmRead",
    "TensorMessage",
    "Transport",
    "backend",
    "deserializer",
    "keep_freed_memory",
    "pack",
    "parse",
    "plan_for",
    "remote_context",
    "remote_stats",
    "serialize",
    "shm_payloads",
    "unpack",
    "unpack_torch",
]
