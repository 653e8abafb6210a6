#!/usr/bin/env python3
"""gRPC loopback transport benchmark: channel/server options side by side, and a raw TCP socket.

    python scripts/bench_grpc.py [--sizes 7,14,28] [--repeat 21] [--runs 3]

For each message size (MiB), one round trip = the client sends that many already-serialized
bytes to a receiver in this process and waits for a one-byte answer
(:mod:`smg_grpc_proto.loopback`): a raw TCP socket, then a grpcio server + channel with
:func:`~smg_grpc_proto.channel.channel_options` / :func:`~smg_grpc_proto.channel.server_options`
(the shipped defaults) and with each candidate change applied to both sides (HTTP/2 frame size,
flow-control window ``lookahead_bytes``, BDP probing off, write buffer size, TCP read chunks,
smaller message limits).

Every configuration has its own open connection, all of them are warmed up, and the round trips
are interleaved in a random order per repetition, so drift on a shared machine hits every
configuration alike. Each ``--runs`` run reports the median per configuration and its ratio to
the defaults in that run; the summary is the median of those ratios. Unpinned (client, server
and grpc's I/O threads may use every core, as a gateway and an engine would).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import random
import statistics
import time
from typing import Any

import grpc
from benchkit import cpu_model

from smg_grpc_proto import channel
from smg_grpc_proto.loopback import GrpcSink, TcpSink

MIB = 1 << 20
FRAME_MAX = 16 * MIB - 1  # HTTP/2's largest SETTINGS_MAX_FRAME_SIZE

#: Candidate options, applied to both the channel and the server on top of the defaults.
CANDIDATES: dict[str, list[tuple[str, Any]]] = {
    "defaults": [],
    "max_frame_size 16 MiB": [("grpc.http2.max_frame_size", FRAME_MAX)],
    "lookahead_bytes 64 MiB": [("grpc.http2.lookahead_bytes", 64 * MIB)],
    "bdp_probe 0": [("grpc.http2.bdp_probe", 0)],
    "bdp_probe 0 + lookahead 64 MiB": [
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", 64 * MIB),
    ],
    "write_buffer_size 8 MiB": [("grpc.http2.write_buffer_size", 8 * MIB)],
    "frame 16 MiB + lookahead 64 MiB": [
        ("grpc.http2.max_frame_size", FRAME_MAX),
        ("grpc.http2.lookahead_bytes", 64 * MIB),
    ],
    "frame + lookahead + write buffer": [
        ("grpc.http2.max_frame_size", FRAME_MAX),
        ("grpc.http2.lookahead_bytes", 64 * MIB),
        ("grpc.http2.write_buffer_size", 8 * MIB),
    ],
    "tcp read chunks 1-16 MiB": [
        ("grpc.experimental.tcp_read_chunk_size", 8 * MIB),
        ("grpc.experimental.tcp_min_read_chunk_size", MIB),
        ("grpc.experimental.tcp_max_read_chunk_size", 16 * MIB),
    ],
    "max message 64 MiB": [
        ("grpc.max_send_message_length", 64 * MIB),
        ("grpc.max_receive_message_length", 64 * MIB),
    ],
}


def one_run(size_mib: int, repeat: int) -> dict[str, float]:
    """Median round-trip seconds per configuration (raw TCP under ``"raw TCP socket"``)."""
    payload = bytes(size_mib * MIB)
    with contextlib.ExitStack() as stack:
        sinks: dict[str, Any] = {"raw TCP socket": stack.enter_context(TcpSink(len(payload)))}
        for name, extra in CANDIDATES.items():
            sinks[name] = stack.enter_context(
                GrpcSink(channel.channel_options(extra=extra), channel.server_options(extra=extra))
            )
        for sink in sinks.values():  # warm-up: connection, BDP ramp-up, page faults
            for _ in range(3):
                sink.send(payload)
        times: dict[str, list[float]] = {name: [] for name in sinks}
        order = list(sinks.items())
        for _ in range(repeat):
            random.shuffle(order)
            for name, sink in order:
                start = time.perf_counter()
                sink.send(payload)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="7,14,28", help="message sizes in MiB")
    parser.add_argument("--repeat", type=int, default=21, help="round trips per configuration")
    parser.add_argument("--runs", type=int, default=3, help="independent runs per size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"# {cpu_model()}, {platform.python_version()}, grpcio {grpc.__version__}; "
        f"median of {args.repeat} interleaved round trips, {args.runs} runs"
    )
    for size in sizes:
        runs = [one_run(size, args.repeat) for _ in range(args.runs)]
        print(f"\n{size} MiB: GB/s per run (speed-up vs defaults in that run)")
        print(f"| options | {' | '.join(f'run {i + 1}' for i in range(args.runs))} | median x |")
        print(f"|---|{'---|' * args.runs}---|")
        for name in runs[0]:
            cells = [
                f"{size * MIB / r[name] / 1e9:.2f} ({r['defaults'] / r[name]:.2f}x)" for r in runs
            ]
            ratio = statistics.median(r["defaults"] / r[name] for r in runs)
            print(f"| {name} | {' | '.join(cells)} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
