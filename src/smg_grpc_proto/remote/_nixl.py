"""NIXL, imported lazily, and the small socket protocol NIXL agents exchange metadata with.

NIXL's own listener thread (``enable_listen_thread``) binds ``INADDR_ANY`` with no option to
choose the address (``nixlMetadataStream::setupStream`` in NIXL 1.x), so the exporter leaves it
off and serves the same protocol itself on a socket bound to the address it is given; the puller
speaks it as a client. The protocol: each message is an 8-byte little-endian (x86-64 ``size_t``)
length then the body; bodies are ``NIXLCOMM:SEND`` (asks for the peer's metadata),
``NIXLCOMM:LOAD<metadata>`` (delivers one) and ``NIXLCOMM:INVL<agent name>`` (forget an agent).
NIXL's ``fetch_remote_metadata`` / ``send_local_metadata`` (what ``smg-grpc-servicer``'s puller
calls) and the gateway's NIXL listener speak exactly this.
"""

from __future__ import annotations

import importlib
import socket
import struct
import time
from types import ModuleType
from typing import Any

from smg_grpc_proto.errors import RemoteTimeoutError, RemoteTransferError, RemoteUnavailableError

__all__ = [
    "MAX_METADATA_BYTES",
    "NIXL_MODULES",
    "fetch_metadata",
    "load_nixl",
    "make_agent",
    "metadata_agent_name",
    "recv_message",
    "send_message",
]

NIXL_MODULES = ("nixl_cu13._api", "nixl_cu12._api", "nixl._api")
"""Where NIXL's Python API is looked for, in order."""
INSTALL_HINT = (
    'pip install "smg-grpc-proto[nixl]" (or, on a CPU-only host without torch, '
    "pip install --no-deps nixl-cu12)"
)
MAX_METADATA_BYTES = 1 << 20
"""Largest message accepted from a peer, in either direction (an agent's metadata with one
registered region is ~0.5 KiB; a longer length prefix is refused before anything is
allocated)."""

_LEN = struct.Struct("<Q")
_PREFIX = b"NIXLCOMM:"
_api: ModuleType | None = None


def load_nixl() -> ModuleType:
    """NIXL's ``_api`` module (``nixl_agent``, ``nixl_agent_config``...), imported on first use.

    Raises :class:`~smg_grpc_proto.errors.RemoteUnavailableError` naming what to install."""
    global _api
    if _api is not None:
        return _api
    failures = []
    for name in NIXL_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # includes a missing shared library of the wheel
            failures.append(f"{name}: {exc}")
            continue
        _api = module
        return module
    raise RemoteUnavailableError(
        "the remote (NIXL) tensor transport needs NIXL, which is not importable ("
        + "; ".join(failures)
        + f"); install it: {INSTALL_HINT}",
        field="nixl",
        expected=list(NIXL_MODULES),
        actual=None,
    )


def make_agent(name: str, *, listen: bool = False, listen_port: int = 0) -> Any:
    """A NIXL agent with the UCX backend, safe to call from several threads (strict sync mode:
    NIXL only picks it by itself when its listener thread is on)."""
    api = load_nixl()
    config = api.nixl_agent_config(
        enable_listen_thread=listen,
        listen_port=listen_port,
        backends=["UCX"],
        sync_mode=api.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
    )
    try:
        agent = api.nixl_agent(name, config)
    except Exception as exc:  # nixlBind raises plain exceptions
        raise RemoteTransferError(
            f"NIXL agent {name!r} could not be created: {exc}", field="agent", actual=str(exc)
        ) from exc
    if "UCX" not in agent.backends:
        raise RemoteTransferError(
            f"NIXL agent {name!r} has no UCX backend (plugins found: {agent.plugin_list})",
            field="backend",
            expected="UCX",
            actual=list(agent.plugin_list),
        )
    return agent


def send_message(sock: socket.socket, body: bytes) -> None:
    """Send one length-prefixed message."""
    sock.sendall(_LEN.pack(len(body)) + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(min(n - len(chunks), 1 << 20))
        if not chunk:
            raise EOFError(f"peer closed after {len(chunks)} of {n} bytes")
        chunks += chunk
    return bytes(chunks)


def recv_message(sock: socket.socket) -> bytes:
    """Receive one length-prefixed message (``EOFError`` if the peer closed first)."""
    (size,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if size > MAX_METADATA_BYTES:
        raise RemoteTransferError(
            f"NIXL metadata message of {size} bytes exceeds {MAX_METADATA_BYTES}",
            field="metadata",
            expected=MAX_METADATA_BYTES,
            actual=size,
        )
    return _recv_exact(sock, size)


def split_commands(body: bytes) -> list[tuple[bytes, bytes]]:
    """``(header, payload)`` of each ``NIXLCOMM:`` command in a message."""
    commands = []
    for part in body.split(_PREFIX):
        if len(part) >= 4:
            commands.append((part[:4], part[4:]))
    return commands


def fetch_metadata(ip: str, port: int, timeout: float, *, send_own: bytes | None = None) -> bytes:
    """Ask the NIXL listener at ``ip``:``port`` for its agent's metadata (``NIXLCOMM:SEND``) and
    return it; with ``send_own``, also deliver our own metadata (``NIXLCOMM:LOAD``) first.

    Raises :class:`~smg_grpc_proto.errors.RemoteTransferError` if it cannot connect or the
    answer is malformed, :class:`~smg_grpc_proto.errors.RemoteTimeoutError` after ``timeout``
    seconds."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((ip, port), timeout=timeout) as sock:
            if send_own is not None:
                send_message(sock, _PREFIX + b"LOAD" + send_own)
            send_message(sock, _PREFIX + b"SEND")
            while True:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                for header, payload in split_commands(recv_message(sock)):
                    if header == b"LOAD":
                        return payload
    except RemoteTransferError:
        raise
    except TimeoutError as exc:
        raise RemoteTimeoutError(
            f"NIXL metadata from {ip}:{port} did not arrive within {timeout} s",
            field="metadata",
            expected=timeout,
        ) from exc
    except (OSError, EOFError) as exc:
        raise RemoteTransferError(
            f"cannot fetch NIXL metadata from {ip}:{port}: {exc}",
            field="metadata",
            actual=str(exc),
        ) from exc


def metadata_agent_name(metadata: bytes) -> str:
    """The agent name a NIXL metadata blob announces, or "" if it does not parse (NIXL 1.x
    serialises ``nixlSerDes|`` then the tag ``Agent``, a u64 LE length and the name). Only used
    to find a same-named agent to replace before loading; NIXL itself validates the blob."""
    prefix = b"nixlSerDes|Agent"
    if not metadata.startswith(prefix) or len(metadata) < len(prefix) + 8:
        return ""
    size = int.from_bytes(metadata[len(prefix) : len(prefix) + 8], "little")
    raw = metadata[len(prefix) + 8 : len(prefix) + 8 + size]
    if len(raw) != size:
        return ""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return ""
