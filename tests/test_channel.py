"""smg_grpc_proto.channel: the recommended options, and message limits enforced over loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import grpc.aio
import pytest

from smg_grpc_proto import channel

pytestmark = pytest.mark.timeout(60)

SERVICE = "smg.test.Echo"
ECHO = f"/{SERVICE}/Echo"
BIG = f"/{SERVICE}/Big"


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def _big(request: bytes, context: grpc.ServicerContext) -> bytes:
    """A response of ``int(request)`` bytes."""
    return b"r" * int(request)


def _handlers() -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "Big": grpc.unary_unary_rpc_method_handler(_big),
        },
    )


def _start(server: grpc.Server) -> int:
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    server.start()
    return port


@pytest.fixture
def small_server() -> Iterator[int]:
    """A sync server with 1 KiB limits built by channel.server()."""
    pool = futures.ThreadPoolExecutor(4)
    server = channel.server(pool, max_message_bytes=1024)
    port = _start(server)
    yield port
    server.stop(None)
    pool.shutdown()


@pytest.fixture
def default_limits_server() -> Iterator[int]:
    """A server built by channel.server() with the default (256 MiB) limits."""
    pool = futures.ThreadPoolExecutor(4)
    server = channel.server(pool)
    port = _start(server)
    yield port
    server.stop(None)
    pool.shutdown()


@pytest.fixture
def plain_server() -> Iterator[int]:
    """A sync server with grpc's own defaults (4 MiB receive limit)."""
    pool = futures.ThreadPoolExecutor(4)
    server = grpc.server(pool)
    port = _start(server)
    yield port
    server.stop(None)
    pool.shutdown()


# -- option lists ---------------------------------------------------------------------------
def test_channel_options_values() -> None:
    options = dict(channel.channel_options())
    assert options == {
        "grpc.max_send_message_length": 256 * 1024 * 1024,
        "grpc.max_receive_message_length": 256 * 1024 * 1024,
        "grpc.keepalive_time_ms": 30_000,
        "grpc.keepalive_timeout_ms": 10_000,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0,
    }
    assert channel.MAX_MESSAGE_BYTES == 256 * 1024 * 1024
    assert channel.MAX_MESSAGE_LIMIT == 2**31 - 1


def test_server_options_values() -> None:
    options = channel.server_options()
    assert len(options) == len(dict(options)), "one entry per option name"
    assert dict(options) == {
        "grpc.max_send_message_length": 256 * 1024 * 1024,
        "grpc.max_receive_message_length": 256 * 1024 * 1024,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.min_ping_interval_without_data_ms": 10_000,
        "grpc.http2.max_ping_strikes": 0,
        "grpc.http2.max_pings_without_data": 0,
        "grpc.keepalive_timeout_ms": 10_000,
        "grpc.so_reuseport": 0,
    }
    with_keepalive = dict(channel.server_options(keepalive_time_ms=60_000, reuse_port=True))
    assert with_keepalive["grpc.keepalive_time_ms"] == 60_000
    assert with_keepalive["grpc.so_reuseport"] == 1


def test_extra_options_override_by_name() -> None:
    options = channel.channel_options(
        max_message_bytes=2048,
        extra=[("grpc.keepalive_time_ms", 5_000), ("grpc.primary_user_agent", "smg-test")],
    )
    assert len(options) == len(dict(options))
    merged = dict(options)
    assert merged["grpc.keepalive_time_ms"] == 5_000
    assert merged["grpc.primary_user_agent"] == "smg-test"
    assert merged["grpc.max_receive_message_length"] == 2048


@pytest.mark.parametrize("value", [0, -1, 2**31, 3 * 2**30])
def test_message_limit_out_of_range(value: int) -> None:
    with pytest.raises(
        ValueError, match=rf"max_message_bytes = {value} is outside \[1, 2147483647\]"
    ):
        channel.channel_options(max_message_bytes=value)
    with pytest.raises(ValueError, match="max_message_bytes"):
        channel.server_options(max_message_bytes=value)


@pytest.mark.parametrize("value", [True, 1.5, "1024", None])
def test_message_limit_wrong_type(value: object) -> None:
    with pytest.raises(TypeError, match="max_message_bytes must be an int"):
        channel.server_options(max_message_bytes=value)  # type: ignore[arg-type]


def test_keepalive_values_checked() -> None:
    with pytest.raises(ValueError, match=r"keepalive_time_ms = 0 is outside \[1, "):
        channel.channel_options(keepalive_time_ms=0)
    with pytest.raises(ValueError, match=r"keepalive_timeout_ms = -5 is outside"):
        channel.server_options(keepalive_timeout_ms=-5)
    with pytest.raises(ValueError, match=r"min_ping_interval_ms = -1 is outside \[0, "):
        channel.server_options(min_ping_interval_ms=-1)


# -- limits over loopback (sync) ------------------------------------------------------------
def _call(port: int, method: str, payload: bytes, **kwargs: int) -> bytes:
    with channel.insecure_channel(f"127.0.0.1:{port}", **kwargs) as ch:
        result: bytes = ch.unary_unary(method)(payload, timeout=10)
        return result


def test_under_limit_passes(small_server: int) -> None:
    assert _call(small_server, ECHO, b"x" * 900) == b"x" * 900


def test_request_over_server_limit_is_resource_exhausted(small_server: int) -> None:
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        _call(small_server, ECHO, b"x" * 4096)
    assert time.monotonic() - start < 5, "must fail fast, not hang"
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = info.value.details() or ""
    assert "larger than max" in details
    assert "1024" in details, details


def test_request_over_client_send_limit(default_limits_server: int) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _call(default_limits_server, ECHO, b"x" * 4096, max_message_bytes=1024)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in (info.value.details() or "")


def test_response_over_client_receive_limit(default_limits_server: int) -> None:
    assert len(_call(default_limits_server, BIG, b"1000", max_message_bytes=1024)) == 1000
    with pytest.raises(grpc.RpcError) as info:
        _call(default_limits_server, BIG, b"5000", max_message_bytes=1024)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = info.value.details() or ""
    assert "larger than max" in details
    assert "1024" in details, details


def test_default_limit_admits_what_grpc_defaults_refuse(
    default_limits_server: int, plain_server: int
) -> None:
    payload = b"p" * (5 * 1024 * 1024)  # above grpc's 4 MiB default receive limit
    with pytest.raises(grpc.RpcError) as info:
        _call(plain_server, ECHO, payload)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "4194304" in (info.value.details() or "")
    assert _call(default_limits_server, ECHO, payload) == payload
    # and a response above 4 MiB reaches a client using channel_options()
    assert len(_call(default_limits_server, BIG, b"6000000")) == 6_000_000


def test_reuse_port_off_refuses_a_busy_port(default_limits_server: int) -> None:
    pool = futures.ThreadPoolExecutor(1)
    second = channel.server(pool)
    try:
        try:
            bound = second.add_insecure_port(f"127.0.0.1:{default_limits_server}")
        except RuntimeError:
            bound = 0
        assert bound == 0, "a second server must not share the port"
    finally:
        second.stop(None)
        pool.shutdown()


# -- limits over loopback (grpc.aio) --------------------------------------------------------
async def _aio_echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


def test_aio_server_and_channel_limits() -> None:
    async def scenario() -> None:
        server = channel.aio_server(max_message_bytes=2048)
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(_aio_echo)}
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with channel.aio_insecure_channel(f"127.0.0.1:{port}") as ch:
                echo = ch.unary_unary(ECHO)
                assert await echo(b"y" * 2000, timeout=10) == b"y" * 2000
                start = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await echo(b"y" * 3000, timeout=10)
                assert time.monotonic() - start < 5
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "2048" in (info.value.details() or "")
            async with channel.aio_insecure_channel(
                f"127.0.0.1:{port}", max_message_bytes=100
            ) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await ch.unary_unary(ECHO)(b"z" * 500, timeout=10)
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            await server.stop(None)

    asyncio.run(scenario())
