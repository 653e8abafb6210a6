"""The exporting side: stage tensors in a NIXL-registered arena for peers to READ.

Wire-compatible with the SMG gateway's exporter (``mm_rdma`` in the ``smg`` sdist): the same
descriptor, the same ``[gen][payload][gen]`` slot framing, the same free-on-notification
(tag ``str(slot_key)``) and TTL reclaim, so ``smg-grpc-servicer``'s ``RdmaPixelPuller`` and
:class:`~smg_grpc_proto.remote.RemotePuller` both read from it.
"""

from __future__ import annotations

import collections
import logging
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.errors import (
    RemoteArenaFullError,
    RemoteDescriptorError,
    RemoteExportRefusedError,
    RemotePayloadTooLargeError,
    RemoteTransferError,
)
from smg_grpc_proto.remote import _nixl
from smg_grpc_proto.remote._descriptor import (
    FRAME_BYTES,
    GEN_BYTES,
    RemoteDescriptor,
    encode_descriptor,
    frame_stamps,
)

__all__ = [
    "DEFAULT_AGENT_NAME",
    "TRANSPORT",
    "ExporterStats",
    "RemoteExporter",
]

logger = logging.getLogger(__name__)

DEFAULT_AGENT_NAME = "smg-gateway-encode"
"""The gateway's fixed NIXL agent name, which ``smg-grpc-servicer``'s puller expects."""
TRANSPORT = "nixl"
"""``RemoteTensorHandle.transport`` of what this exporter stages (the gateway writes ``"nixl"``)."""

_I64_MAX = (1 << 63) - 1
_MAX_OUTBOX = 1 << 16  # unsent replies a peer may leave queued before it is dropped


@dataclass(frozen=True)
class ExporterStats:
    """A snapshot of an exporter's slots and what released them."""

    slots: int
    leased: int
    exported: int
    released_by_notification: int
    released_by_ttl: int
    released_by_caller: int


@dataclass
class _Lease:
    slot: int
    gen: int
    at: float
    nbytes: int


@dataclass
class _Conn:
    """One metadata-listener connection: what it sent, what it has yet to be sent, and when
    it must have finished its next message."""

    sock: socket.socket
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)


class RemoteExporter:
    """A NIXL agent with one registered host-memory arena of ``slots`` fixed slots.

    :meth:`export` copies a tensor into a free slot framed by generation stamps and returns
    ``(transport, descriptor, nbytes)`` for a ``RemoteTensorHandle``. The slot stays leased
    until the reader's notification (``str(slot_key)``) arrives or ``ttl`` seconds pass; a
    background thread polls notifications and reclaims expired leases every
    ``poll_interval`` seconds. Every lease gets a new, larger generation, so a descriptor
    outliving its lease is refused by the reader's stamp check instead of returning another
    tensor's bytes.

    The metadata listener (what readers dial first) is bound to ``listen_ip`` (loopback by
    default) on ``listen_port`` (0 picks a free port; see :attr:`port`). Descriptors carry
    ``advertise_ip`` (default: ``listen_ip``), which must be set when listening on a wildcard
    address. Anyone who can reach the listener can READ any slot of the arena while it is
    registered: bind it to an address only trusted peers reach. UCX, under NIXL, opens its
    own sockets on every device ``UCX_NET_DEVICES`` allows (all by default): set it (e.g.
    ``lo`` for loopback, or the RDMA NIC) before the first exporter or puller is created.

    The listener treats every peer as hostile: at most ``max_connections`` at once (more are
    closed on accept), each must complete a message within ``peer_timeout`` seconds of the
    last (slow or silent peers are dropped), a length prefix above 1 MiB closes the
    connection before anything is allocated, replies never block the listener (a peer that
    does not read them is dropped), unknown commands are ignored. Peers' ``LOAD`` and
    ``INVL`` are ignored unless ``accept_peer_metadata=True``: the exporter does not need a
    reader's metadata to serve READs or receive notifications, and loading it would make UCX
    connect wherever that metadata says. A lease's stamps are zeroed when it ends (so a stale
    descriptor is refused even before the slot is reused), and with ``scrub_freed=True`` its
    payload too.

    Thread-safe: :meth:`export` may be called from any thread; it makes no NIXL call.
    """

    transport = TRANSPORT

    def __init__(
        self,
        *,
        slots: int = 16,
        slot_bytes: int = 32 << 20,
        ttl: float = 210.0,
        listen_ip: str = "127.0.0.1",
        listen_port: int = 0,
        advertise_ip: str | None = None,
        agent_name: str = DEFAULT_AGENT_NAME,
        poll_interval: float = 0.02,
        max_connections: int = 32,
        peer_timeout: float = 10.0,
        accept_peer_metadata: bool = False,
        scrub_freed: bool = False,
    ) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an int >= 1, got {slots!r}")
        if isinstance(slot_bytes, bool) or not isinstance(slot_bytes, int):
            raise ValueError(f"slot_bytes must be an int, got {slot_bytes!r}")
        if slot_bytes <= FRAME_BYTES:
            raise ValueError(f"slot_bytes must exceed the {FRAME_BYTES}-byte frame: {slot_bytes}")
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl!r}")
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        if not peer_timeout > 0:
            raise ValueError(f"peer_timeout must be > 0 seconds, got {peer_timeout!r}")
        advertise = advertise_ip if advertise_ip is not None else listen_ip
        if advertise in ("0.0.0.0", "::"):
            raise ValueError(
                f"listen_ip={listen_ip!r} is a wildcard: pass advertise_ip, the address readers "
                "dial (it goes into every descriptor)"
            )
        # Validates the advertised ip and a placeholder port the way readers will.
        RemoteDescriptor(0, 0, 0, 1, advertise)

        self._slots = slots
        self._slot_bytes = slot_bytes
        self._ttl = float(ttl)
        self._poll_interval = float(poll_interval)
        self._agent_name = agent_name
        self._advertise_ip = advertise
        self._max_connections = max_connections
        self._peer_timeout = float(peer_timeout)
        self._accept_peer_metadata = bool(accept_peer_metadata)
        self._scrub_freed = bool(scrub_freed)
        self._peer_agents: set[str] = set()  # names loaded through this listener
        self._lock = threading.Lock()
        self._free: collections.deque[int] = collections.deque(range(slots))
        self._leases: dict[int, _Lease] = {}
        self._next_gen = 1  # 0 is what a never-written (zeroed) slot reads
        self._counts = {"exported": 0, "notification": 0, "ttl": 0, "caller": 0}
        self._stop = threading.Event()
        self._closed = False

        self._listener = socket.socket(
            socket.AF_INET6 if ":" in listen_ip else socket.AF_INET, socket.SOCK_STREAM
        )
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((listen_ip, listen_port))
            self._listener.listen(64)
        except OSError as exc:
            self._listener.close()
            raise RemoteTransferError(
                f"cannot listen on {listen_ip}:{listen_port}: {exc}",
                field="listen_port",
                actual=listen_port,
            ) from exc
        self._port: int = self._listener.getsockname()[1]
        RemoteDescriptor(0, 0, 0, self._port, advertise)

        try:
            self._agent: Any = _nixl.make_agent(agent_name)
            self._arena = np.zeros(slots * slot_bytes, dtype=np.uint8)
            self._reg = self._agent.register_memory(
                [(self._arena.ctypes.data, self._arena.nbytes, 0, "")], "DRAM", backends=["UCX"]
            )
        except BaseException:
            self._listener.close()
            raise
        self._base = int(self._arena.ctypes.data)
        self._threads = [
            threading.Thread(target=self._serve_metadata, name="smg-remote-md", daemon=True),
            threading.Thread(target=self._reap, name="smg-remote-reaper", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # -- properties -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The metadata listener's port (the one chosen when ``listen_port=0``)."""
        return self._port

    @property
    def ip(self) -> str:
        """The address written into descriptors."""
        return self._advertise_ip

    @property
    def agent_name(self) -> str:
        return self._agent_name

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def slot_bytes(self) -> int:
        return self._slot_bytes

    @property
    def max_payload(self) -> int:
        """The largest tensor (bytes) one slot holds: ``slot_bytes - 16``."""
        return self._slot_bytes - FRAME_BYTES

    @property
    def ttl(self) -> float:
        return self._ttl

    def stats(self) -> ExporterStats:
        with self._lock:
            return ExporterStats(
                slots=self._slots,
                leased=len(self._leases),
                exported=self._counts["exported"],
                released_by_notification=self._counts["notification"],
                released_by_ttl=self._counts["ttl"],
                released_by_caller=self._counts["caller"],
            )

    def is_leased(self, slot_key: int) -> bool:
        with self._lock:
            return slot_key in self._leases

    # -- export -----------------------------------------------------------------------------

    def export(
        self, data: npt.ArrayLike | bytes | bytearray | memoryview, *, slot_key: int | None = None
    ) -> tuple[str, bytes, int]:
        """Stage ``data`` (a numpy array of any dtype, or bytes) in a free slot and return
        ``(transport, descriptor, nbytes)`` for a ``RemoteTensorHandle``.

        ``slot_key`` (an ``int64`` the reader notifies with) defaults to a fresh random one;
        an explicit key must not be leased already. Raises
        :class:`~smg_grpc_proto.errors.RemoteExportRefusedError` (send it inline instead):
        :class:`~smg_grpc_proto.errors.RemoteArenaFullError` when every slot is leased,
        :class:`~smg_grpc_proto.errors.RemotePayloadTooLargeError` when it exceeds
        :attr:`max_payload`, the base class for an empty payload or a closed exporter.
        """
        payload = _as_bytes(data)
        nbytes = int(payload.size)
        if self._closed:
            raise RemoteExportRefusedError("the exporter is closed", field="exporter")
        if nbytes == 0:
            raise RemoteExportRefusedError(
                "an empty tensor is not staged remotely", field="nbytes", actual=0
            )
        if nbytes + FRAME_BYTES > self._slot_bytes:
            raise RemotePayloadTooLargeError(
                f"tensor of {nbytes} bytes + {FRAME_BYTES} stamp bytes exceeds the "
                f"{self._slot_bytes}-byte slot",
                field="nbytes",
                expected=self._slot_bytes,
                actual=nbytes + FRAME_BYTES,
            )
        if slot_key is not None and (
            isinstance(slot_key, bool)
            or not isinstance(slot_key, int)
            or not -_I64_MAX - 1 <= slot_key <= _I64_MAX
        ):
            raise RemoteDescriptorError(
                f"slot_key must be an int64, got {slot_key!r}", field="slot_key", actual=slot_key
            )
        with self._lock:
            if not self._free:
                raise RemoteArenaFullError(
                    f"all {self._slots} slots of the remote arena are leased",
                    field="slots",
                    expected=self._slots,
                    actual=len(self._leases),
                )
            if slot_key is None:
                key = secrets.randbelow(_I64_MAX)
                while key in self._leases:
                    key = secrets.randbelow(_I64_MAX)
            elif slot_key in self._leases:
                raise RemoteDescriptorError(
                    f"slot_key={slot_key} is already leased", field="slot_key", actual=slot_key
                )
            else:
                key = slot_key
            slot = self._free.popleft()
            gen = self._next_gen
            self._next_gen += 1
            # Leased before the copy so the reaper's TTL clock covers the write too.
            self._leases[key] = _Lease(slot, gen, time.monotonic(), nbytes)
            self._counts["exported"] += 1
        offset = slot * self._slot_bytes
        stamp = np.frombuffer(frame_stamps(gen), dtype=np.uint8)
        arena = self._arena
        # A free slot's stamps are zero (never written, or zeroed when its last lease ended),
        # so a READ still running on the previous lease fails its check at whichever end it
        # reads last. Payload, then trailer, then header: a reader of this lease that sees
        # the header stamp saw everything written before it.
        arena[offset + GEN_BYTES : offset + GEN_BYTES + nbytes] = payload
        end = offset + GEN_BYTES + nbytes
        arena[end : end + GEN_BYTES] = stamp
        arena[offset : offset + GEN_BYTES] = stamp
        descriptor = RemoteDescriptor(self._base + offset, gen, key, self._port, self._advertise_ip)
        return TRANSPORT, encode_descriptor(descriptor), nbytes

    def release(self, slot_key: int) -> bool:
        """Return ``slot_key``'s slot to the free list now (e.g. the request failed before it
        was sent); True if it was leased."""
        return self._free_key(slot_key, "caller")

    def _free_key(self, slot_key: int, why: str) -> bool:
        with self._lock:
            lease = self._leases.pop(slot_key, None)
            if lease is None:
                return False
        # Neither leased nor free here: nobody else touches the slot while it is invalidated.
        # Both stamps first (a stale descriptor now fails, and so does a READ racing the
        # slot's next lease), then optionally the payload.
        offset = lease.slot * self._slot_bytes
        end = offset + GEN_BYTES + lease.nbytes
        self._arena[offset : offset + GEN_BYTES] = 0
        self._arena[end : end + GEN_BYTES] = 0
        if self._scrub_freed:
            self._arena[offset + GEN_BYTES : end] = 0
        with self._lock:
            self._free.append(lease.slot)  # FIFO: a freed slot is reused last
            self._counts[why] += 1
        return True

    # -- background threads -----------------------------------------------------------------

    def _reap(self) -> None:
        while not self._stop.wait(self._poll_interval):
            try:
                notifs = self._agent.get_new_notifs()
            except Exception:  # the agent is being torn down
                logger.exception("remote exporter: reading NIXL notifications failed")
                notifs = {}
            for tags in notifs.values():
                for tag in tags:
                    try:
                        key = int(bytes(tag).decode("ascii"))
                    except (UnicodeDecodeError, ValueError):
                        continue  # not ours (or garbled): the TTL reclaims the slot
                    self._free_key(key, "notification")
            now = time.monotonic()
            with self._lock:
                expired = [k for k, v in self._leases.items() if now - v.at >= self._ttl]
            for key in expired:
                self._free_key(key, "ttl")

    def _serve_metadata(self) -> None:
        """NIXL's metadata protocol (see ``_nixl``) on the bound listener: one thread, every
        connection non-blocking with its own buffers and deadline, so a slow, silent or
        hostile peer delays nobody and holds at most ~1 MiB."""
        sel = selectors.DefaultSelector()
        self._listener.setblocking(False)
        sel.register(self._listener, selectors.EVENT_READ, None)
        conns: dict[socket.socket, _Conn] = {}

        def drop(conn: _Conn) -> None:
            sel.unregister(conn.sock)
            conns.pop(conn.sock, None)
            conn.sock.close()

        try:
            while not self._stop.is_set():
                for key, events in sel.select(timeout=0.1):
                    if key.fileobj is self._listener:
                        self._accept(sel, conns)
                        continue
                    conn = key.data
                    assert isinstance(conn, _Conn)
                    if events & selectors.EVENT_WRITE and not self._flush(conn):
                        drop(conn)
                        continue
                    if events & selectors.EVENT_READ and not self._receive(conn):
                        drop(conn)
                        continue
                    want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbox else 0)
                    if want != key.events:
                        sel.modify(conn.sock, want, conn)
                now = time.monotonic()
                for conn in [c for c in conns.values() if now > c.deadline]:
                    drop(conn)
        finally:
            for conn in list(conns.values()):
                conn.sock.close()
            sel.close()

    def _accept(self, sel: selectors.BaseSelector, conns: dict[socket.socket, _Conn]) -> None:
        try:
            sock, _addr = self._listener.accept()
        except OSError:
            return
        if len(conns) >= self._max_connections:
            sock.close()  # at the cap: refuse rather than queue
            return
        sock.setblocking(False)
        conn = _Conn(sock, time.monotonic() + self._peer_timeout)
        conns[sock] = conn
        sel.register(sock, selectors.EVENT_READ, conn)

    def _flush(self, conn: _Conn) -> bool:
        try:
            sent = conn.sock.send(conn.outbox)
        except BlockingIOError:
            return True
        except OSError:
            return False
        del conn.outbox[:sent]
        return True

    def _receive(self, conn: _Conn) -> bool:
        """Read what the peer has and answer each complete message; False to drop it."""
        try:
            chunk = conn.sock.recv(1 << 16)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not chunk:
            return False
        buffer = conn.inbox
        buffer += chunk
        while len(buffer) >= 8:
            size = int.from_bytes(buffer[:8], "little")
            if size > _nixl.MAX_METADATA_BYTES:
                return False  # never wait for (or buffer) what a peer merely claims
            if len(buffer) < 8 + size:
                break
            body = bytes(buffer[8 : 8 + size])
            del buffer[: 8 + size]
            if self._answer(conn, body):
                conn.deadline = time.monotonic() + self._peer_timeout
        if len(conn.outbox) > _MAX_OUTBOX:
            return False  # asks without reading the answers
        return self._flush(conn) if conn.outbox else True

    def _answer(self, conn: _Conn, body: bytes) -> bool:
        """Handle one message from a peer; True if it held a command we serve."""
        served = False
        for header, payload in _nixl.split_commands(body):
            try:
                if header == b"SEND":
                    reply = b"NIXLCOMM:LOAD" + self._agent.get_agent_metadata()
                    conn.outbox += len(reply).to_bytes(8, "little") + reply
                    served = True
                elif header == b"LOAD" and self._accept_peer_metadata:
                    self._load_peer(payload)
                    served = True
                elif header == b"INVL" and self._accept_peer_metadata:
                    name = payload.decode("utf-8", "replace")
                    # Only an agent this listener loaded, never our own.
                    if name in self._peer_agents and name != self._agent_name:
                        self._agent.remove_remote_agent(name)
                        self._peer_agents.discard(name)
                    served = True
            except Exception:  # a peer's bad metadata must not stop the listener
                logger.warning(
                    "remote exporter: NIXLCOMM:%r from a peer failed", header, exc_info=True
                )
        return served

    def _load_peer(self, metadata: bytes) -> None:
        """Load a reader's metadata, as NIXL's listener does (only with
        ``accept_peer_metadata``); a restarted reader's replaces its old one."""
        name = _nixl.metadata_agent_name(metadata)
        if not name or name == self._agent_name:
            return
        if name in self._peer_agents:
            self._agent.remove_remote_agent(name)
            self._peer_agents.discard(name)
        loaded = self._agent.add_remote_agent(metadata)
        self._peer_agents.add(loaded.decode() if isinstance(loaded, bytes) else str(loaded))

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the threads, close the listener and deregister the arena. Descriptors already
        handed out become unreadable (readers get an error, never other bytes)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._listener.close()
        try:
            self._agent.deregister_memory(self._reg, backends=["UCX"])
        except Exception:
            logger.warning("remote exporter: deregistering the arena failed", exc_info=True)
        self._agent = None

    def __enter__(self) -> RemoteExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_bytes(data: npt.ArrayLike | bytes | bytearray | memoryview) -> npt.NDArray[np.uint8]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    array = np.ascontiguousarray(data)
    if array.dtype.hasobject:
        raise TypeError(f"cannot export an array of dtype {array.dtype} (Python objects)")
    return array.reshape(-1).view(np.uint8)
