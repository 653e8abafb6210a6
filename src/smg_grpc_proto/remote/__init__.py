"""Tensors across machines over NIXL: the ``remote`` transport of ``RemoteTensorHandle``.

Wire-compatible with the SMG gateway's exporter (``mm_rdma``) and ``smg-grpc-servicer``'s
``RdmaPixelPuller``. The descriptor codec needs nothing; :class:`RemoteExporter` and
:class:`RemotePuller` need NIXL (``pip install "smg-grpc-proto[nixl]"``), imported on first
use, and raise :class:`~smg_grpc_proto.errors.RemoteUnavailableError` without it.

Exporter (gateway side)::

    exporter = RemoteExporter(slots=16, slot_bytes=32 << 20, ttl=210.0)  # 127.0.0.1, free port
    transport, descriptor, nbytes = exporter.export(pixel_values)  # RemoteExportRefusedError
                                                                   # -> send inline instead
Puller (engine side)::

    puller = RemotePuller(timeout=30.0)  # dials loopback/private exporters only by default
    array = puller.pull(descriptor, nbytes, shape=shape, dtype=np.float32)
"""

from __future__ import annotations

from smg_grpc_proto.remote._descriptor import (
    DESCRIPTOR_MAGIC,
    FRAME_BYTES,
    GEN_BYTES,
    RemoteDescriptor,
    check_nbytes,
    decode_descriptor,
    encode_descriptor,
    frame_stamps,
    read_stamps,
    verify_stamps,
)
from smg_grpc_proto.remote._nixl import NIXL_MODULES, load_nixl
from smg_grpc_proto.remote._peers import ALLOW_ANY, DEFAULT_ALLOWED_PEERS, PeerSpec
from smg_grpc_proto.remote.exporter import (
    DEFAULT_AGENT_NAME,
    TRANSPORT,
    ExporterStats,
    RemoteExporter,
)
from smg_grpc_proto.remote.puller import MAX_PULL_BYTES, RemotePuller

__all__ = [
    "ALLOW_ANY",
    "DEFAULT_AGENT_NAME",
    "DEFAULT_ALLOWED_PEERS",
    "DESCRIPTOR_MAGIC",
    "FRAME_BYTES",
    "GEN_BYTES",
    "MAX_PULL_BYTES",
    "NIXL_MODULES",
    "TRANSPORT",
    "ExporterStats",
    "PeerSpec",
    "RemoteDescriptor",
    "RemoteExporter",
    "RemotePuller",
    "check_nbytes",
    "decode_descriptor",
    "encode_descriptor",
    "frame_stamps",
    "load_nixl",
    "nixl_available",
    "read_stamps",
    "verify_stamps",
]


def nixl_available() -> bool:
    """Whether NIXL imports here (the remote transport can run)."""
    try:
        load_nixl()
    except ImportError:
        return False
    return True
