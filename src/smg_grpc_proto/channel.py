"""Recommended grpcio options for gateway ↔ engine connections, and constructors using them.

gRPC's defaults are tuned for small RPCs between services, not for multimodal inference:

* A receiver refuses messages above **4 MiB** (``RESOURCE_EXHAUSTED: Received message larger
  than max``). One Qwen2-VL image of 1000 x 1000 pixels is ~24 MB of float32 patches, so every
  engine server must raise the limit, and so must a client that reads large responses.
  :data:`MAX_MESSAGE_BYTES` (256 MiB) is what the SGLang, MLX and TokenSpeed servers use.
* Keepalive is off on the client and the server punishes frequent pings: a client pinging every
  30 s against a server left at its defaults (pings allowed every 5 min, 2 strikes) gets its
  connection closed with ``GOAWAY too_many_pings`` — killing long requests (a minutes-long
  prefill) in flight. The client options here ping every 30 s; the server options accept that
  and never count strikes.

Both sides of the contract use the same option names, so :func:`channel_options` and
:func:`server_options` return plain ``(name, value)`` lists to pass to any grpcio constructor;
:func:`insecure_channel`, :func:`aio_insecure_channel`, :func:`server` and :func:`aio_server`
are thin wrappers that apply them.

A message above the limit is refused by gRPC itself with ``RESOURCE_EXHAUSTED`` on the side
that would send or receive it; it never hangs. Independently of gRPC, protobuf cannot encode a
message of 2 GiB or more: larger tensors must travel through shared memory
(``transport="shm"``), which is why :data:`MAX_MESSAGE_LIMIT` is the ceiling accepted here.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures
from typing import Any, TypeAlias

import grpc
import grpc.aio

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MAX_MESSAGE_LIMIT",
    "Options",
    "aio_insecure_channel",
    "aio_server",
    "channel_options",
    "insecure_channel",
    "server",
    "server_options",
]

Options: TypeAlias = list[tuple[str, int | str]]
"""grpcio channel arguments: ``(name, value)`` pairs."""

#: Default send and receive limit, both directions: 256 MiB. Above the largest multimodal
#: request the gateway builds inline (many high-resolution images as float32 patches), equal to
#: the SGLang, MLX and TokenSpeed servers' own setting.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

#: The largest limit accepted: gRPC's integer options are 32-bit, and protobuf refuses to
#: serialize a message of 2 GiB or more anyway.
MAX_MESSAGE_LIMIT = 2**31 - 1

_INT_MAX = 2**31 - 1


def _check_int(name: str, value: object, low: int, high: int = _INT_MAX) -> int:
    """``value`` as an int in ``[low, high]``; ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} = {value} is outside [{low}, {high}]")
    return value


def _check_message_bytes(value: object) -> int:
    try:
        return _check_int("max_message_bytes", value, 1, MAX_MESSAGE_LIMIT)
    except ValueError:
        raise ValueError(
            f"max_message_bytes = {value} is outside [1, {MAX_MESSAGE_LIMIT}]: gRPC limits are "
            "32-bit and protobuf cannot encode a message of 2 GiB or more; send larger tensors "
            "through shared memory (transport='shm')"
        ) from None


def _merge(base: Options, extra: Sequence[tuple[str, Any]]) -> Options:
    """``base`` with every option named in ``extra`` replaced (the last value of a name wins
    in grpc core, but a single entry per name is easier to read and to test)."""
    names = {name for name, _ in extra}
    merged: Options = [(name, value) for name, value in base if name not in names]
    merged.extend((str(name), value) for name, value in extra)
    return merged


def channel_options(
    *,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    keepalive_time_ms: int = 30_000,
    keepalive_timeout_ms: int = 10_000,
    keepalive_permit_without_calls: bool = True,
    extra: Sequence[tuple[str, Any]] = (),
) -> Options:
    """Client-side (gateway) channel options.

    * ``grpc.max_send_message_length`` / ``grpc.max_receive_message_length`` =
      ``max_message_bytes``: requests carrying inline tensors and large responses (e.g. logits)
      pass; anything larger fails fast with ``RESOURCE_EXHAUSTED``.
    * ``grpc.keepalive_time_ms`` = 30 s: ping the engine after 30 s without traffic, so a dead
      engine (or a NAT that dropped the flow) is noticed during a long silent prefill instead
      of at the request timeout. Same period as the SMG gateway's Rust client.
    * ``grpc.keepalive_timeout_ms`` = 10 s: how long an unanswered ping may take before the
      connection is declared dead and its calls fail with ``UNAVAILABLE``.
    * ``grpc.keepalive_permit_without_calls`` = 1: keep pinging idle connections too, so the
      next request does not land on a connection that died while idle. The server must allow
      it (:func:`server_options` does).
    * ``grpc.http2.max_pings_without_data`` = 0: grpc core otherwise stops pinging after two
      pings without a data frame — exactly the silent stretch keepalive exists for.

    ``extra`` adds or overrides options by name.
    """
    limit = _check_message_bytes(max_message_bytes)
    time_ms = _check_int("keepalive_time_ms", keepalive_time_ms, 1)
    timeout_ms = _check_int("keepalive_timeout_ms", keepalive_timeout_ms, 1)
    options: Options = [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.keepalive_time_ms", time_ms),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(bool(keepalive_permit_without_calls))),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    return _merge(options, extra)


def server_options(
    *,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    min_ping_interval_ms: int = 10_000,
    keepalive_time_ms: int | None = None,
    keepalive_timeout_ms: int = 10_000,
    reuse_port: bool = False,
    extra: Sequence[tuple[str, Any]] = (),
) -> Options:
    """Server-side (engine) options.

    * ``grpc.max_send_message_length`` / ``grpc.max_receive_message_length`` =
      ``max_message_bytes`` (256 MiB): a multimodal request with inline tensors is accepted;
      one above the limit fails with ``RESOURCE_EXHAUSTED`` naming both sizes.
    * ``grpc.keepalive_permit_without_calls`` = 1: accept client pings on idle connections
      (the gateway keeps its connections checked between requests).
    * ``grpc.http2.min_ping_interval_without_data_ms`` = 10 s: pings closer together than
      this count as "strikes"; 10 s is below the client's 30 s keepalive period.
    * ``grpc.http2.max_ping_strikes`` = 0: never close a connection for pinging too often —
      a GOAWAY would cancel every request in flight on it, including minutes-long ones.
    * ``grpc.http2.max_pings_without_data`` = 0: the server's own keepalive pings (when
      ``keepalive_time_ms`` is set) are not capped either.
    * ``grpc.so_reuseport`` = 0 (``reuse_port=False``): grpc core enables ``SO_REUSEPORT`` by
      default, which lets a second server bind an already-used port silently and steal part of
      its connections; binding a busy port should fail instead.

    ``keepalive_time_ms`` (off by default) makes the server ping clients too; ``extra`` adds or
    overrides options by name.
    """
    limit = _check_message_bytes(max_message_bytes)
    min_ping = _check_int("min_ping_interval_ms", min_ping_interval_ms, 0)
    timeout_ms = _check_int("keepalive_timeout_ms", keepalive_timeout_ms, 1)
    options: Options = [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", min_ping),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        ("grpc.so_reuseport", int(bool(reuse_port))),
    ]
    if keepalive_time_ms is not None:
        options.append(
            ("grpc.keepalive_time_ms", _check_int("keepalive_time_ms", keepalive_time_ms, 1))
        )
    return _merge(options, extra)


def insecure_channel(target: str, **kwargs: Any) -> grpc.Channel:
    """A plaintext synchronous channel to ``target`` (``"host:port"``) with
    :func:`channel_options`; ``kwargs`` are passed to :func:`channel_options`."""
    return grpc.insecure_channel(target, options=channel_options(**kwargs))


def aio_insecure_channel(target: str, **kwargs: Any) -> grpc.aio.Channel:
    """A plaintext ``grpc.aio`` channel to ``target`` with :func:`channel_options`. Create it
    inside the event loop that will use it."""
    return grpc.aio.insecure_channel(target, options=channel_options(**kwargs))


def aio_server(
    *,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    maximum_concurrent_rpcs: int | None = None,
    **kwargs: Any,
) -> grpc.aio.Server:
    """A ``grpc.aio`` server with :func:`server_options`; ``kwargs`` go to
    :func:`server_options`. Create it inside the event loop that will run it."""
    return grpc.aio.server(
        options=server_options(max_message_bytes=max_message_bytes, **kwargs),
        maximum_concurrent_rpcs=maximum_concurrent_rpcs,
    )


def server(
    thread_pool: futures.ThreadPoolExecutor,
    *,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    maximum_concurrent_rpcs: int | None = None,
    **kwargs: Any,
) -> grpc.Server:
    """A synchronous server running handlers on ``thread_pool``, with :func:`server_options`.

    A streaming handler occupies one pool thread for its whole duration, so size the pool for
    the number of concurrent streams (or use :func:`aio_server`).
    """
    return grpc.server(
        thread_pool,
        options=server_options(max_message_bytes=max_message_bytes, **kwargs),
        maximum_concurrent_rpcs=maximum_concurrent_rpcs,
    )
