"""The loopback transport probes of the demo and scripts/bench_grpc.py: a gRPC sink and a raw TCP
sink that receive whole messages, with the channel options under test applied."""

from __future__ import annotations

import grpc
import pytest

from smg_grpc_proto import channel
from smg_grpc_proto.loopback import GrpcSink, TcpSink, median_seconds


def test_sinks_receive_whole_messages() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    with GrpcSink() as sink:
        sink.send(payload)
        assert median_seconds(lambda: sink.send(payload), 2) > 0
    with TcpSink(len(payload)) as tcp:
        tcp.send(payload)
        tcp.send(payload[:10])
        assert median_seconds(lambda: tcp.send(payload), 2) > 0


def test_grpc_sink_applies_the_options() -> None:
    small = channel.channel_options(max_message_bytes=1024)
    with GrpcSink(options=small) as sink:
        sink.send(bytes(1000))
        with pytest.raises(grpc.RpcError) as info:
            sink.send(bytes(4096))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with GrpcSink(server_options=channel.server_options(max_message_bytes=1024)) as sink:
        with pytest.raises(grpc.RpcError) as info:
            sink.send(bytes(4096))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_tcp_sink_refuses_a_payload_above_its_capacity() -> None:
    with TcpSink(16) as tcp, pytest.raises(ValueError, match="17 bytes > capacity 16"):
        tcp.send(bytes(17))
