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
from dataclasses import dataclass
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
            self._leases[key] = _Lease(slot, gen, time.monotonic())
            self._counts["exported"] += 1
        offset = slot * self._slot_bytes
        stamp = np.frombuffer(frame_stamps(gen), dtype=np.uint8)
        arena = self._arena
        # Header first, trailer last: a reader racing a reuse sees a mismatch at one end.
        arena[offset : offset + GEN_BYTES] = stamp
        arena[offset + GEN_BYTES : offset + GEN_BYTES + nbytes] = payload
        end = offset + GEN_BYTES + nbytes
        arena[end : end + GEN_BYTES] = stamp
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
        connection non-blocking with its own receive buffer, so a slow or silent peer delays
        nobody."""
        sel = selectors.DefaultSelector()
        self._listener.setblocking(False)
        sel.register(self._listener, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.1):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        try:
                            conn, _addr = self._listener.accept()
                        except OSError:
                            continue
                        conn.setblocking(False)
                        sel.register(conn, selectors.EVENT_READ, bytearray())
                        continue
                    if not self._receive(sock, key.data):
                        sel.unregister(sock)
                        sock.close()
        finally:
            for key in list(sel.get_map().values()):
                sock = key.fileobj
                if isinstance(sock, socket.socket) and sock is not self._listener:
                    sock.close()
            sel.close()

    def _receive(self, conn: socket.socket, buffer: bytearray) -> bool:
        """Read what ``conn`` has and answer each complete message; False when it is done."""
        try:
            chunk = conn.recv(1 << 16)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not chunk:
            return False
        buffer += chunk
        while len(buffer) >= 8:
            size = int.from_bytes(buffer[:8], "little")
            if size > _nixl.MAX_METADATA_BYTES:
                return False
            if len(buffer) < 8 + size:
                break
            body = bytes(buffer[8 : 8 + size])
            del buffer[: 8 + size]
            if not self._answer(conn, body):
                return False
        return True

    def _answer(self, conn: socket.socket, body: bytes) -> bool:
        """Handle one message from a peer; False when the connection must close."""
        for header, payload in _nixl.split_commands(body):
            try:
                if header == b"SEND":
                    reply = b"NIXLCOMM:LOAD" + self._agent.get_agent_metadata()
                    conn.settimeout(5.0)  # the answer is small; a peer not reading is dropped
                    try:
                        _nixl.send_message(conn, reply)
                    finally:
                        conn.setblocking(False)
                elif header == b"LOAD":
                    self._load_peer(payload)
                elif header == b"INVL":
                    self._agent.remove_remote_agent(payload.decode("utf-8", "replace"))
            except OSError:
                return False
            except Exception:  # a peer's bad metadata must not stop the listener
                logger.warning(
                    "remote exporter: NIXLCOMM:%s from a peer failed", header, exc_info=True
                )
        return True

    def _load_peer(self, metadata: bytes) -> None:
        """Load a reader's metadata, as NIXL's listener does (the exporter does not need it
        to serve READs or receive notifications); a restarted reader's replaces its old one."""
        try:
            self._agent.add_remote_agent(metadata)
        except Exception:
            name = _nixl.metadata_agent_name(metadata)
            if not name or name == self._agent_name:
                raise
            self._agent.remove_remote_agent(name)
            self._agent.add_remote_agent(metadata)

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
