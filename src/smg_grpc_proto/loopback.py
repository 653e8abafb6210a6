"""Loopback transport probes: how fast grpcio moves one large message, next to a raw TCP socket.

Used by the demo (``smg-proto demo``) and ``scripts/bench_grpc.py``. Both probes send the same
bytes over 127.0.0.1 to a receiver in this process and wait for a one-byte answer, so a round
trip is "bytes leave the client -> the whole message is in the receiver's memory -> it says so":

* :class:`GrpcSink` — a plain ``grpc.server`` whose unary handler takes the message as
  ``bytes`` (no protobuf parsing: grpcio hands the raw payload over) and answers ``b"k"``; the
  client sends already-serialized bytes on a channel with the options under test.
* :class:`TcpSink` — a socket server thread: a 8-byte length, then ``recv_into`` a
  preallocated buffer, then ``b"k"``; the client ``sendall``s the same bytes.

Throughput is ``len(payload) / median round-trip seconds``.
"""

from __future__ import annotations

import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from types import TracebackType
from typing import Any

import grpc

from smg_grpc_proto import channel

__all__ = ["GrpcSink", "TcpSink", "median_seconds"]

_METHOD = "/smg.loopback.Sink/Put"


def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``repeat`` calls of ``fn`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class GrpcSink:
    """A grpcio server on 127.0.0.1 that swallows one raw message per call; ``send(payload)``
    does one round trip on a channel built with ``options``."""

    def __init__(
        self,
        options: Sequence[tuple[str, Any]] | None = None,
        server_options: Sequence[tuple[str, Any]] | None = None,
    ) -> None:
        self._server_options = list(
            channel.server_options() if server_options is None else server_options
        )
        self._options = list(channel.channel_options() if options is None else options)
        self._server: grpc.Server | None = None
        self._channel: grpc.Channel | None = None
        self._call: Any = None

    def __enter__(self) -> GrpcSink:
        def put(request: bytes, context: grpc.ServicerContext) -> bytes:
            del request, context  # only its arrival matters
            return b"k"

        handler = grpc.method_handlers_generic_handler(
            "smg.loopback.Sink", {"Put": grpc.unary_unary_rpc_method_handler(put)}
        )
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2), options=self._server_options
        )
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=self._options)
        self._call = self._channel.unary_unary(_METHOD)
        return self

    def send(self, payload: bytes) -> None:
        if self._call(payload, timeout=60) != b"k":
            raise RuntimeError("the gRPC sink did not acknowledge the message")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._channel is not None:
            self._channel.close()
        if self._server is not None:
            self._server.stop(None)


class TcpSink:
    """A raw TCP socket on 127.0.0.1 (a receiving thread in this process); ``send(payload)``
    does one round trip: length + payload out, one byte back."""

    def __init__(self, capacity: int) -> None:
        self._buffer = bytearray(capacity)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._client: socket.socket | None = None

    def __enter__(self) -> TcpSink:
        self._thread.start()
        self._client = socket.create_connection(self._listener.getsockname()[:2])
        self._client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        view = memoryview(self._buffer)
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                header = conn.recv(8, socket.MSG_WAITALL)
                if len(header) < 8:
                    return
                (size,) = struct.unpack("<Q", header)
                got = 0
                while got < size:
                    n = conn.recv_into(view[got:size])
                    if n == 0:
                        return
                    got += n
                conn.sendall(b"k")

    def send(self, payload: bytes) -> None:
        if len(payload) > len(self._buffer):
            raise ValueError(f"payload of {len(payload)} bytes > capacity {len(self._buffer)}")
        assert self._client is not None
        self._client.sendall(struct.pack("<Q", len(payload)))
        self._client.sendall(payload)
        if self._client.recv(1, socket.MSG_WAITALL) != b"k":
            raise RuntimeError("the TCP sink did not acknowledge the message")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._client is not None:
            self._client.close()
        self._thread.join(timeout=5)
        self._listener.close()
