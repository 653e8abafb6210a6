"""The reading side: pull a staged tensor with a NIXL READ into a numpy buffer."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.errors import (
    RemoteDescriptorError,
    RemoteTimeoutError,
    RemoteTransferError,
)
from smg_grpc_proto.remote import _nixl
from smg_grpc_proto.remote._descriptor import (
    FRAME_BYTES,
    GEN_BYTES,
    RemoteDescriptor,
    check_nbytes,
    decode_descriptor,
    verify_stamps,
)
from smg_grpc_proto.remote._peers import PeerPolicy, PeerSpec

__all__ = ["MAX_PULL_BYTES", "RemotePuller"]

logger = logging.getLogger(__name__)

MAX_PULL_BYTES = 1 << 30
"""Default ceiling on one pull (1 GiB): an ``nbytes`` above it is refused before allocating or
connecting. A descriptor is ~50 bytes but names any size, so this bounds what one request can
make the engine allocate (36x a 28 MiB pixel tensor; the inline codec's own limit is 2 GiB)."""

_Endpoint = tuple[str, int]


class RemotePuller:
    """A NIXL agent that READs tensors staged by a :class:`~smg_grpc_proto.remote.RemoteExporter`
    or the SMG gateway, into plain numpy memory (no pinned memory, no torch).

    :meth:`pull` fetches the exporter's agent metadata from the descriptor's ``ip``:``port`` the
    first time it meets that listener (cached afterwards; refetched once if a READ fails, e.g.
    the exporter restarted), READs ``nbytes + 16`` bytes, checks both generation stamps,
    notifies the exporter with ``str(slot_key)`` so it frees the slot, and returns the payload.
    Every wait is bounded by ``timeout`` seconds. Thread-safe (but :meth:`close` only once no
    pull is running); one instance per process is enough. It runs no metadata listener; UCX
    itself listens on the devices ``UCX_NET_DEVICES`` allows (all by default).

    Security: the descriptor comes from the request, so its ``ip``:``port`` is checked against
    ``allowed_peers`` before any connection (default
    :data:`~smg_grpc_proto.remote.DEFAULT_ALLOWED_PEERS`: loopback and private networks;
    ``"any"`` allows every unicast address, as ``smg-grpc-servicer``'s puller does), and
    ``nbytes`` against ``max_nbytes`` before any allocation
    (:class:`~smg_grpc_proto.errors.RemotePeerRefusedError` /
    :class:`~smg_grpc_proto.errors.RemoteDescriptorError`).
    """

    def __init__(
        self,
        *,
        agent_name: str | None = None,
        timeout: float = 30.0,
        max_nbytes: int = MAX_PULL_BYTES,
        allowed_peers: str | Iterable[PeerSpec] | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if isinstance(max_nbytes, bool) or not isinstance(max_nbytes, int) or max_nbytes < 1:
            raise ValueError(f"max_nbytes must be an int >= 1, got {max_nbytes!r}")
        self._timeout = float(timeout)
        self._max_nbytes = int(max_nbytes)
        self._peers = PeerPolicy.of(allowed_peers)
        name = agent_name or f"smg-proto-puller-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._agent: Any = _nixl.make_agent(name)
        self._name = name
        self._cond = threading.Condition()
        # endpoint -> remote agent name loaded from it; remote agent name -> endpoint.
        self._endpoints: dict[_Endpoint, str] = {}
        self._owners: dict[str, _Endpoint] = {}
        self._inflight: dict[str, int] = {}
        # READs abandoned at their timeout whose cancel failed: their buffers stay referenced
        # so NIXL never writes into freed memory.
        self._abandoned: list[tuple[Any, Any, npt.NDArray[np.uint8]]] = []
        self._closed = False

    @property
    def agent_name(self) -> str:
        return self._name

    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def max_nbytes(self) -> int:
        return self._max_nbytes

    def check_peer(self, ip: str, port: int) -> None:
        """Raise :class:`~smg_grpc_proto.errors.RemotePeerRefusedError` unless ``allowed_peers``
        lets this puller dial ``ip``:``port``."""
        self._peers.check(ip, port)

    def pull(
        self,
        descriptor: bytes | RemoteDescriptor,
        nbytes: int,
        *,
        slot_key: int | None = None,
        shape: tuple[int, ...] | list[int] | None = None,
        dtype: npt.DTypeLike | None = None,
        timeout: float | None = None,
    ) -> npt.NDArray[Any]:
        """READ the ``nbytes``-byte tensor ``descriptor`` points at and return it.

        Without ``shape``/``dtype``, a 1-D ``uint8`` array of ``nbytes``; with both, first
        checks ``nbytes == product(shape) x itemsize`` (before any transfer) and returns the
        array in that dtype and shape. ``slot_key`` is the request's key (needed by the older
        descriptor form; must match the current one's). The returned array owns its memory
        (a view of a buffer only it references).

        Raises :class:`~smg_grpc_proto.errors.RemoteDescriptorError` (bad descriptor or
        nbytes), :class:`~smg_grpc_proto.errors.RemoteStampError` (the slot was recycled: its
        bytes are discarded), :class:`~smg_grpc_proto.errors.RemoteTransferError` (cannot reach
        the exporter, READ failed) and its :class:`~smg_grpc_proto.errors.RemoteTimeoutError`.
        """
        if self._closed:
            raise RemoteTransferError("the puller is closed", field="puller")
        desc = (
            descriptor
            if isinstance(descriptor, RemoteDescriptor)
            else decode_descriptor(descriptor, slot_key=slot_key)
        )
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise RemoteDescriptorError(
                f"remote nbytes must be a non-negative int, got {nbytes!r}",
                field="nbytes",
                actual=nbytes,
            )
        nbytes = int(nbytes)
        np_dtype = None
        if (shape is None) != (dtype is None):
            raise TypeError("pass shape and dtype together, or neither")
        if shape is not None:
            np_dtype = np.dtype(dtype)
            check_nbytes(nbytes, tuple(shape), np_dtype.itemsize)
        if nbytes > self._max_nbytes:
            raise RemoteDescriptorError(
                f"remote nbytes={nbytes} exceeds the puller's limit of {self._max_nbytes}",
                field="nbytes",
                expected=self._max_nbytes,
                actual=nbytes,
            )
        if desc.slot_addr > (1 << 64) - 1 - (nbytes + FRAME_BYTES):
            raise RemoteDescriptorError(
                f"remote slot_addr={desc.slot_addr} + {nbytes + FRAME_BYTES} bytes overflows",
                field="slot_addr",
                actual=desc.slot_addr,
            )
        self._peers.check(desc.ip, desc.port)
        budget = self._timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + budget
        framed = self._read(desc, nbytes, deadline, budget, _landing(nbytes + FRAME_BYTES))
        verify_stamps(framed, nbytes, desc)
        payload = framed[GEN_BYTES : GEN_BYTES + nbytes]
        if np_dtype is None or shape is None:
            return payload
        return payload.view(np_dtype).reshape(tuple(int(d) for d in shape))

    # -- metadata ---------------------------------------------------------------------------

    def _connect(self, endpoint: _Endpoint, deadline: float, budget: float) -> str:
        """The remote agent name for ``endpoint``, loading its metadata if needed. Returns
        with the name's in-flight count raised (the caller must :meth:`_done` it)."""
        with self._cond:
            name = self._endpoints.get(endpoint)
            if name is not None:
                self._inflight[name] = self._inflight.get(name, 0) + 1
                return name
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timeout(endpoint, budget, "before the metadata exchange")
        metadata = _nixl.fetch_metadata(endpoint[0], endpoint[1], remaining)
        with self._cond:
            # NIXL knows one remote agent per name: wait until no READ uses a same-named agent
            # loaded from another endpoint, then replace it.
            while True:
                name = self._endpoints.get(endpoint)
                if name is not None:  # another thread loaded it meanwhile
                    self._inflight[name] = self._inflight.get(name, 0) + 1
                    return name
                try:
                    name = self._load(metadata, endpoint)
                except _Busy as busy:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise _timeout(
                            endpoint, budget, f"waiting for agent {busy.name!r}'s READs elsewhere"
                        ) from None
                    self._cond.wait(left)
                    continue
                self._inflight[name] = self._inflight.get(name, 0) + 1
                return name

    def _load(self, metadata: bytes, endpoint: _Endpoint) -> str:
        # Called with self._cond held.
        name = _nixl.metadata_agent_name(metadata)
        owner = self._owners.get(name) if name else None
        if owner is not None:
            if self._inflight.get(name, 0):
                raise _Busy(name)
            self._drop(owner)
        try:
            loaded = self._agent.add_remote_agent(metadata)
        except Exception as exc:
            raise RemoteTransferError(
                f"NIXL rejected the metadata from {endpoint[0]}:{endpoint[1]}: {exc}",
                field="metadata",
                actual=str(exc),
            ) from exc
        loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        self._endpoints[endpoint] = loaded
        self._owners[loaded] = endpoint
        return loaded

    def _drop(self, endpoint: _Endpoint) -> None:
        # Called with self._cond held.
        name = self._endpoints.pop(endpoint, None)
        if name is None:
            return
        self._owners.pop(name, None)
        try:
            self._agent.remove_remote_agent(name)
        except Exception:
            logger.debug("remote puller: forgetting agent %r failed", name, exc_info=True)

    def _done(self, name: str) -> None:
        with self._cond:
            self._inflight[name] -= 1
            self._cond.notify_all()

    def forget(self, ip: str, port: int) -> None:
        """Drop the cached metadata of the exporter at ``ip``:``port`` (refetched on next use)."""
        with self._cond:
            if not self._inflight.get(self._endpoints.get((ip, port), ""), 0):
                self._drop((ip, port))

    # -- transfer ---------------------------------------------------------------------------

    def _read(
        self,
        desc: RemoteDescriptor,
        nbytes: int,
        deadline: float,
        budget: float,
        landing: npt.NDArray[np.uint8],
    ) -> npt.NDArray[np.uint8]:
        endpoint = (desc.ip, desc.port)
        for attempt in (0, 1):
            fresh = endpoint not in self._endpoints
            name = self._connect(endpoint, deadline, budget)
            if any(kept is landing for _, _, kept in self._abandoned):
                landing = _landing(landing.size)  # a READ that could not be cancelled owns it
            try:
                return self._read_once(desc, nbytes, name, deadline, budget, landing)
            except RemoteTimeoutError:
                raise
            except RemoteTransferError:
                # The exporter may have restarted (new metadata): forget it and retry once,
                # unless the metadata was just fetched.
                with self._cond:
                    self._inflight[name] -= 1
                    if not self._inflight[name] and self._endpoints.get(endpoint) == name:
                        self._drop(endpoint)
                    self._cond.notify_all()
                name = ""
                if fresh or attempt:
                    raise
            finally:
                if name:
                    self._done(name)
        raise AssertionError("unreachable")  # pragma: no cover

    def _read_once(
        self,
        desc: RemoteDescriptor,
        nbytes: int,
        name: str,
        deadline: float,
        budget: float,
        landing: npt.NDArray[np.uint8],
    ) -> npt.NDArray[np.uint8]:
        agent = self._agent
        size = nbytes + FRAME_BYTES
        where = f"{desc.ip}:{desc.port} slot {desc.slot_key}"
        try:
            reg = agent.register_memory(
                [(landing.ctypes.data, size, 0, "")], "DRAM", backends=["UCX"]
            )
        except Exception as exc:
            raise RemoteTransferError(
                f"registering a {size}-byte landing buffer failed: {exc}", field="landing"
            ) from exc
        keep_registered = False
        try:
            local = agent.get_xfer_descs([(landing.ctypes.data, size, 0)], "DRAM")
            remote = agent.get_xfer_descs([(desc.slot_addr, size, 0)], "DRAM")
            try:
                handle = agent.initialize_xfer("READ", local, remote, name, desc.notification)
            except Exception as exc:
                raise RemoteTransferError(
                    f"NIXL READ of {size} bytes from {where} could not start: {exc}",
                    field="slot_addr",
                    actual=desc.slot_addr,
                ) from exc
            try:
                state = agent.transfer(handle)
                spins = 0
                while state == "PROC":
                    if time.monotonic() > deadline:
                        raise _timeout((desc.ip, desc.port), budget, f"during the READ of {where}")
                    spins += 1
                    if spins > 64:
                        time.sleep(0.0002)
                    state = agent.check_xfer_state(handle)
            except Exception as exc:
                # Cancel; if NIXL cannot, keep the buffer registered and alive (it may still
                # be written) rather than free memory under a live transfer.
                try:
                    agent.release_xfer_handle(handle)
                except Exception:
                    keep_registered = True
                    self._abandoned.append((handle, reg, landing))
                if isinstance(exc, RemoteTimeoutError):
                    raise
                raise RemoteTransferError(
                    f"NIXL READ of {size} bytes from {where} failed: {exc!r}",
                    field="transfer",
                    actual=type(exc).__name__,
                ) from exc
            agent.release_xfer_handle(handle)
            if state != "DONE":
                raise RemoteTransferError(
                    f"NIXL READ of {size} bytes from {where} failed (state {state})",
                    field="transfer",
                    actual=state,
                )
            return landing
        finally:
            if not keep_registered:
                try:
                    agent.deregister_memory(reg, backends=["UCX"])
                except Exception:
                    logger.debug(
                        "remote puller: deregistering a landing buffer failed", exc_info=True
                    )

    def close(self) -> None:
        """Forget every exporter and release the agent."""
        if self._closed:
            return
        self._closed = True
        with self._cond:
            for endpoint in list(self._endpoints):
                self._drop(endpoint)
        self._agent = None

    def __enter__(self) -> RemotePuller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _landing(size: int) -> npt.NDArray[np.uint8]:
    """An uninitialised landing buffer; failing to get one is a clear error, not a crash."""
    try:
        return np.empty(size, dtype=np.uint8)
    except (MemoryError, ValueError) as exc:
        raise RemoteTransferError(
            f"cannot allocate a {size}-byte landing buffer for the remote pull: {exc}",
            field="nbytes",
            expected=size,
            actual=type(exc).__name__,
        ) from exc


class _Busy(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _timeout(endpoint: _Endpoint, budget: float, when: str) -> RemoteTimeoutError:
    return RemoteTimeoutError(
        f"remote pull from {endpoint[0]}:{endpoint[1]} timed out after {budget} s {when}",
        field="timeout",
        expected=budget,
    )
