"""The ``remote`` transport inside the tensor codec: export with inline fallback, pull on read.

Writers stage a tensor with a :class:`~smg_grpc_proto.remote.RemoteExporter` (the one passed
in, the one of an enclosing :func:`using`, or a process default created on first use) and fill
``RemoteTensorHandle`` (``transport="nixl"``, ``descriptor``, ``nbytes``). When the exporter
refuses (arena full, tensor larger than a slot, exporter closed) or NIXL is not installed, the
tensor goes inline instead: never an error for a well-formed request. Each fallback is counted
(:func:`remote_stats`) and logged on the ``smg_grpc_proto.tensors`` logger.

Readers pull with a :class:`~smg_grpc_proto.remote.RemotePuller` chosen the same way.
Nothing here imports NIXL until a remote payload is written or read.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from smg_grpc_proto.errors import (
    RemoteArenaFullError,
    RemoteError,
    RemoteExportRefusedError,
    RemotePayloadTooLargeError,
    RemoteTransferError,
    RemoteTransportUnavailableError,
    RemoteUnavailableError,
    TensorError,
    TransportNotImplementedError,
)

if TYPE_CHECKING:
    from smg_grpc_proto.remote import RemoteExporter, RemotePuller

__all__ = [
    "NIXL_TRANSPORT",
    "RemoteStats",
    "default_exporter",
    "default_puller",
    "export",
    "pull",
    "remote_stats",
    "reset_defaults",
    "using",
]

logger = logging.getLogger("smg_grpc_proto.tensors")

NIXL_TRANSPORT = "nixl"
"""``RemoteTensorHandle.transport`` of NIXL payloads (what the SMG gateway writes)."""

_exporter: contextvars.ContextVar[RemoteExporter | None] = contextvars.ContextVar(
    "smg_remote_exporter", default=None
)
_puller: contextvars.ContextVar[RemotePuller | None] = contextvars.ContextVar(
    "smg_remote_puller", default=None
)
_lock = threading.Lock()
_defaults: dict[str, Any] = {}
_counts = {
    "exported": 0,
    "pulled": 0,
    "fallback_arena_full": 0,
    "fallback_too_large": 0,
    "fallback_refused": 0,
    "fallback_unavailable": 0,
}
_warned: set[str] = set()


@dataclass(frozen=True)
class RemoteStats:
    """Counters of this process's remote transport use, since start.

    ``exported`` tensors went out as ``remote`` handles and ``pulled`` came in; every
    ``fallback_*`` is a tensor asked to go ``remote`` that went inline instead: every slot was
    leased (``arena_full``), it did not fit a slot (``too_large``), the exporter refused it for
    another reason, e.g. it was closed (``refused``), or NIXL is missing or the default
    exporter could not start (``unavailable``)."""

    exported: int
    pulled: int
    fallback_arena_full: int
    fallback_too_large: int
    fallback_refused: int
    fallback_unavailable: int

    @property
    def fallbacks(self) -> int:
        return (
            self.fallback_arena_full
            + self.fallback_too_large
            + self.fallback_refused
            + self.fallback_unavailable
        )


def remote_stats() -> RemoteStats:
    """A snapshot of the remote transport's counters (exports, pulls, inline fallbacks)."""
    with _lock:
        return RemoteStats(**_counts)


def _count(key: str) -> None:
    with _lock:
        _counts[key] += 1


def _default(key: str, make: Callable[[], object]) -> object:
    """The process default under ``key``, made by ``make()`` on first use."""
    with _lock:
        value = _defaults.get(key)
        if value is None:
            value = _defaults[key] = make()
        return value


def default_exporter() -> RemoteExporter:
    """The process's exporter, created on first use with
    :class:`~smg_grpc_proto.remote.RemoteExporter`'s defaults (16 slots of 32 MiB, 127.0.0.1,
    a free port). Pass your own exporter (or :func:`using`) to listen elsewhere."""
    from smg_grpc_proto.remote import RemoteExporter

    exporter = _default("exporter", RemoteExporter)
    assert isinstance(exporter, RemoteExporter)
    return exporter


def default_puller() -> RemotePuller:
    """The process's puller, created on first use (30 s timeout)."""
    from smg_grpc_proto.remote import RemotePuller

    puller = _default("puller", RemotePuller)
    assert isinstance(puller, RemotePuller)
    return puller


def reset_defaults() -> None:
    """Close and forget the process defaults (the next use creates new ones)."""
    with _lock:
        items = list(_defaults.values())
        _defaults.clear()
    for item in items:
        item.close()


class _Using:
    """The block of :func:`using`: sets the context variables on entry, resets them on exit."""

    __slots__ = ("_exporter", "_puller", "_tokens")

    def __init__(self, exporter: RemoteExporter | None, puller: RemotePuller | None) -> None:
        self._exporter, self._puller = exporter, puller
        self._tokens: list[tuple[contextvars.ContextVar[Any], contextvars.Token[Any]]] = []

    def __enter__(self) -> None:
        if self._exporter is not None:
            self._tokens.append((_exporter, _exporter.set(self._exporter)))
        if self._puller is not None:
            self._tokens.append((_puller, _puller.set(self._puller)))

    def __exit__(self, *exc: object) -> None:
        while self._tokens:
            var, token = self._tokens.pop()
            var.reset(token)


def using(
    *, exporter: RemoteExporter | None = None, puller: RemotePuller | None = None
) -> AbstractContextManager[None]:
    """Within the block (this thread or task), remote payloads are exported with ``exporter``
    and pulled with ``puller`` (``None`` keeps the enclosing choice).

    With neither given the block changes nothing (the builders and readers enter one on every
    call), and no object is made for it."""
    if exporter is None and puller is None:
        return _NO_CHANGE
    return _Using(exporter, puller)


_NO_CHANGE: AbstractContextManager[None] = nullcontext()


def _warn_once(key: str, message: str) -> None:
    with _lock:
        first = key not in _warned
        _warned.add(key)
    if first:
        logger.warning(message)
    else:
        logger.info(message)


def export(
    payload: np.ndarray[Any, Any] | bytes, field: str, exporter: RemoteExporter | None = None
) -> tuple[str, bytes, int] | None:
    """Stage ``payload`` (wire bytes, or a contiguous array of them) and return
    ``(transport, descriptor, nbytes)``, or ``None`` when it must go inline (counted, logged)."""
    chosen = exporter if exporter is not None else _exporter.get()
    try:
        if chosen is None:
            chosen = default_exporter()
        handle = chosen.export(payload)
    except RemoteArenaFullError as exc:
        _count("fallback_arena_full")
        logger.info("%s: sent inline, the remote arena is full (%s)", field, exc)
        return None
    except RemotePayloadTooLargeError as exc:
        _count("fallback_too_large")
        logger.info("%s: sent inline, too large for a remote slot (%s)", field, exc)
        return None
    except RemoteExportRefusedError as exc:
        _count("fallback_refused")
        logger.info("%s: sent inline, the remote exporter refused it (%s)", field, exc)
        return None
    except (RemoteUnavailableError, RemoteTransferError) as exc:
        _count("fallback_unavailable")
        _warn_once(
            "unavailable", f"{field}: sent inline, the remote transport is unavailable: {exc}"
        )
        return None
    _count("exported")
    return handle


def pull(
    handle: Any, name: str, nbytes: int, puller: RemotePuller | None = None
) -> np.ndarray[Any, Any]:
    """The ``nbytes`` payload bytes ``handle`` (a ``RemoteTensorHandle`` of the ``TensorData``
    named ``name``) points at, as a 1-D uint8 array; ``nbytes`` is what the shape and dtype
    need, checked against ``handle.nbytes`` before anything is pulled."""
    field = f"{name}.remote"
    if handle.transport != NIXL_TRANSPORT:
        raise TransportNotImplementedError(
            f"{field}.transport = {handle.transport!r}: only the {NIXL_TRANSPORT!r} remote "
            "transport is implemented; send inline, shm or nixl",
            field=f"{field}.transport",
            expected=NIXL_TRANSPORT,
            actual=handle.transport,
        )
    if handle.nbytes != nbytes:
        raise TensorError(
            f"{field}.nbytes = {handle.nbytes}, but the shape and dtype need {nbytes}",
            field=f"{field}.nbytes",
            expected=nbytes,
            actual=handle.nbytes,
        )
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    chosen = puller if puller is not None else _puller.get()
    if chosen is None:
        try:
            chosen = default_puller()
        except RemoteUnavailableError as exc:
            raise RemoteTransportUnavailableError(
                f"{field}: cannot read a NIXL payload here: {exc}",
                field=field,
                expected=exc.expected,
                actual=NIXL_TRANSPORT,
            ) from None
    try:
        out = chosen.pull(bytes(handle.descriptor), nbytes)
    except RemoteError as exc:
        raise type(exc)(
            f"{field}: {exc}",
            field=f"{field}.{exc.field}" if exc.field else field,
            expected=exc.expected,
            actual=exc.actual,
        ) from exc
    _count("pulled")
    return out
