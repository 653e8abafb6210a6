"""The remote transport against hostile input: descriptors naming peers the engine must not
dial, sizes it must not allocate, a metadata listener flooded, stalled or lied to, an exporter
answering garbage, stale slots."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smg_grpc_proto.errors import (
    RemoteDescriptorError,
    RemotePeerRefusedError,
    RemoteStampError,
    RemoteTimeoutError,
    RemoteTransferError,
)
from smg_grpc_proto.remote import (
    DEFAULT_ALLOWED_PEERS,
    MAX_PULL_BYTES,
    RemoteDescriptor,
    RemoteExporter,
    RemotePuller,
    decode_descriptor,
    encode_descriptor,
    nixl_available,
    read_stamps,
)
from smg_grpc_proto.remote._nixl import MAX_METADATA_BYTES
from smg_grpc_proto.remote._peers import PeerPolicy

needs_nixl = pytest.mark.skipif(
    not nixl_available(),
    reason="NIXL cannot be imported here "
    '(pip install --no-deps nixl-cu12, or "smg-grpc-proto[nixl]")',
)
MiB = 1 << 20


# -- the peer policy (no NIXL) -----------------------------------------------------------------


@pytest.mark.parametrize(
    "ip",
    ["127.0.0.1", "127.9.9.9", "::1", "10.1.2.3", "172.31.0.1", "192.168.7.7", "fd00::5"],
)
def test_default_policy_allows_loopback_and_private(ip):
    PeerPolicy.of(None).check(ip, 5000)


@pytest.mark.parametrize(
    ("ip", "why"),
    [
        ("8.8.8.8", "allowed_peers"),
        ("169.254.169.254", "allowed_peers"),  # cloud metadata service
        ("::ffff:169.254.169.254", "allowed_peers"),  # the same, IPv4-mapped
        ("fe80::1%lo", "allowed_peers"),
        ("100.64.0.1", "allowed_peers"),
        ("2001:db8::1", "allowed_peers"),
        ("0.0.0.0", "unicast"),
        ("::", "unicast"),
        ("224.0.0.1", "unicast"),
        ("255.255.255.255", "unicast"),
        ("localhost", "hostnames are never resolved"),
        ("127.1", "hostnames are never resolved"),
    ],
)
def test_default_policy_refuses_the_rest(ip, why):
    with pytest.raises(RemotePeerRefusedError, match=why) as info:
        PeerPolicy.of(None).check(ip, 5000)
    assert info.value.field == "ip"
    assert isinstance(info.value, RemoteDescriptorError)  # existing handlers still catch it


def test_explicit_policy_ports_and_any():
    policy = PeerPolicy.of(["10.0.0.7:6000", "[fd00::7]:6001", "192.0.2.0/24"])
    policy.check("10.0.0.7", 6000)
    policy.check("fd00::7", 6001)
    policy.check("192.0.2.200", 1)
    with pytest.raises(RemotePeerRefusedError) as port:
        policy.check("10.0.0.7", 6001)
    assert (port.value.field, port.value.actual) == ("port", 6001)
    with pytest.raises(RemotePeerRefusedError):
        policy.check("127.0.0.1", 6000)  # not in an explicit list
    anything = PeerPolicy.of("any")
    anything.check("8.8.8.8", 1)
    anything.check("169.254.169.254", 80)
    with pytest.raises(RemotePeerRefusedError, match="unicast"):
        anything.check("0.0.0.0", 80)  # never, even with "any"
    PeerPolicy.of([ipaddress.ip_network("203.0.113.0/24"), ipaddress.ip_address("::1")]).check(
        "203.0.113.9", 9
    )
    assert len(PeerPolicy.of(None).rules) == len(DEFAULT_ALLOWED_PEERS)


@pytest.mark.parametrize("spec", ["10.0.0.0/33", "example.com", "10.0.0.1:0", "10.0.0.0/8:80"])
def test_bad_policy_entries_are_refused_up_front(spec):
    with pytest.raises(ValueError, match="allowed_peers entry"):
        PeerPolicy.of([spec])


# -- descriptor strictness (no NIXL) -----------------------------------------------------------


@pytest.mark.parametrize(
    "ip",
    ["localhost", "127.1", "0x7f.0.0.1", "127.000.0.1", " 127.0.0.1", "127.0.0.1\x00", "::1 "],
)
def test_descriptor_ip_is_a_literal_address_never_a_name(ip):
    raw = b"SMGRDMA1" + bytes(26) + ip.encode()
    raw = raw[:32] + (5000).to_bytes(2, "little") + raw[34:]
    with pytest.raises(RemoteDescriptorError) as info:
        decode_descriptor(raw)
    assert info.value.field == "ip"


def test_ipv6_descriptors_round_trip():
    for ip in ("::1", "fd00::1", "fe80::1%eth0"):
        desc = RemoteDescriptor(1, 2, 3, 4, ip)
        assert decode_descriptor(encode_descriptor(desc)) == desc


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=400), st.one_of(st.none(), st.integers(-(1 << 70), 1 << 70)))
def test_decoder_raises_only_its_own_error(data, key):
    with contextlib.suppress(RemoteDescriptorError):
        decode_descriptor(data, slot_key=key)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=64), st.integers(0, 64))
def test_read_stamps_raises_only_its_own_error(data, nbytes):
    with contextlib.suppress(RemoteDescriptorError):
        read_stamps(data, nbytes)


# -- the puller: checks before any connection --------------------------------------------------


class _Server:
    """A TCP listener on 127.0.0.1 that records connections and answers with ``reply``."""

    def __init__(self, reply: Any = None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self.reply = reply
        self._stop = threading.Event()
        self.sock.settimeout(0.1)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            with conn:
                if self.reply is not None:
                    with contextlib.suppress(OSError):
                        self.reply(conn, self._stop)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def server() -> Iterator[Any]:
    made: list[_Server] = []

    def make(reply: Any = None) -> _Server:
        made.append(_Server(reply))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _desc(port: int, ip: str = "127.0.0.1") -> bytes:
    return encode_descriptor(RemoteDescriptor(1 << 20, 1, 42, port, ip))


@needs_nixl
def test_refused_peer_is_never_dialled(server):
    srv = server()
    with RemotePuller(timeout=2, allowed_peers=["127.0.0.1:1"]) as puller:
        with pytest.raises(RemotePeerRefusedError) as info:
            puller.pull(_desc(srv.port), 8)
        assert info.value.field == "port"
    with RemotePuller(timeout=2) as puller:
        with pytest.raises(RemotePeerRefusedError) as info:
            puller.pull(_desc(80, "169.254.169.254"), 8)
        assert (info.value.field, info.value.actual) == ("ip", "169.254.169.254")
    time.sleep(0.3)
    assert srv.accepted == 0


@needs_nixl
def test_oversized_nbytes_is_refused_before_allocating_or_dialling(server):
    srv = server()
    assert MAX_PULL_BYTES == 1 << 30
    with RemotePuller(timeout=2) as puller:
        assert puller.max_nbytes == MAX_PULL_BYTES
        with pytest.raises(RemoteDescriptorError) as info:
            puller.pull(_desc(srv.port), MAX_PULL_BYTES + 1)
        assert (info.value.field, info.value.expected) == ("nbytes", MAX_PULL_BYTES)
    # A limit raised past what the machine can hold: a clear error, not a crash.
    with RemotePuller(timeout=2, max_nbytes=1 << 62) as puller:
        with pytest.raises(RemoteTransferError, match="cannot allocate") as alloc:
            puller.pull(_desc(srv.port), 1 << 61)
        assert alloc.value.field == "nbytes"
    with pytest.raises(ValueError, match="max_nbytes"):
        RemotePuller(max_nbytes=0)
    time.sleep(0.3)
    assert srv.accepted == 0


def _huge_prefix(conn: socket.socket, stop: threading.Event) -> None:
    conn.recv(1024)
    conn.sendall((1 << 62).to_bytes(8, "little"))
    stop.wait(3)


def _garbage_metadata(conn: socket.socket, stop: threading.Event) -> None:
    conn.recv(1024)
    body = (
        b"NIXLCOMM:LOAD"
        + b"nixlSerDes|Agent"
        + (5).to_bytes(8, "little")
        + b"evil!"
        + b"\xff" * 300
    )
    conn.sendall(len(body).to_bytes(8, "little") + body)
    stop.wait(3)


def _chatter(conn: socket.socket, stop: threading.Event) -> None:
    conn.recv(1024)
    body = b"NIXLCOMM:XXXX"
    while not stop.is_set():
        conn.sendall(len(body).to_bytes(8, "little") + body)
        time.sleep(0.01)


@needs_nixl
def test_hostile_exporter_metadata_is_a_clear_error(server):
    with RemotePuller(timeout=1.5) as puller:
        big = server(_huge_prefix)
        with pytest.raises(RemoteTransferError, match=str(MAX_METADATA_BYTES)) as info:
            puller.pull(_desc(big.port), 8)
        assert info.value.field == "metadata"
        bad = server(_garbage_metadata)
        with pytest.raises(RemoteTransferError, match="rejected the metadata"):
            puller.pull(_desc(bad.port), 8)
        chatty = server(_chatter)
        start = time.monotonic()
        with pytest.raises(RemoteTimeoutError):
            puller.pull(_desc(chatty.port), 8)
        assert time.monotonic() - start < 3
    assert MAX_METADATA_BYTES == 1 << 20


# -- the exporter's metadata listener ----------------------------------------------------------


def _ask_metadata(port: int, timeout: float = 3) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        body = b"NIXLCOMM:SEND"
        s.sendall(len(body).to_bytes(8, "little") + body)
        size = int.from_bytes(_recv(s, 8), "little")
        assert size <= MAX_METADATA_BYTES
        return _recv(s, size)


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


def _closed_by_peer(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        while True:
            if not s.recv(4096):
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@needs_nixl
def test_length_prefix_above_the_cap_closes_at_once():
    with RemoteExporter(slots=1, slot_bytes=4096) as exporter:
        for claim in (MAX_METADATA_BYTES + 1, 1 << 40, (1 << 64) - 1):
            with socket.create_connection(("127.0.0.1", exporter.port), timeout=2) as s:
                s.sendall(claim.to_bytes(8, "little") + b"NIXLCOMM:SEND")
                assert _closed_by_peer(s, 2)
        assert _ask_metadata(exporter.port).startswith(b"NIXLCOMM:LOAD")


@needs_nixl
def test_slow_peers_are_dropped_after_peer_timeout():
    with RemoteExporter(slots=1, slot_bytes=4096, peer_timeout=0.5) as exporter:
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=2) as drip:
            start = time.monotonic()
            closed = False
            # One byte every 0.1 s never completes a message: the deadline is per message.
            for byte in (200).to_bytes(8, "little") + b"NIXLCOMM:" + b"x" * 30:
                try:
                    drip.send(bytes([byte]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.1)
            assert closed or _closed_by_peer(drip, 1)
            assert time.monotonic() - start < 3
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=2) as silent:
            assert _closed_by_peer(silent, 2)


@needs_nixl
def test_connection_cap_refuses_extra_peers_and_recovers():
    with RemoteExporter(slots=1, slot_bytes=4096, max_connections=3) as exporter:
        held = [socket.create_connection(("127.0.0.1", exporter.port)) for _ in range(3)]
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=2) as extra:
            assert _closed_by_peer(extra, 2)
        for s in held:
            s.close()
        time.sleep(0.3)
        assert _ask_metadata(exporter.port).startswith(b"NIXLCOMM:LOAD")


@needs_nixl
def test_a_peer_that_never_reads_its_answers_is_dropped_without_stalling_others():
    with RemoteExporter(slots=1, slot_bytes=4096) as exporter:
        greedy = socket.create_connection(("127.0.0.1", exporter.port))
        greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = b"NIXLCOMM:SEND"
        msg = (len(body).to_bytes(8, "little") + body) * 64
        dropped = False
        try:
            for _ in range(400):
                greedy.sendall(msg)
                start = time.monotonic()
                assert _ask_metadata(exporter.port, timeout=2)  # others still served
                assert time.monotonic() - start < 1.5
        except (BrokenPipeError, ConnectionResetError):
            dropped = True
        finally:
            greedy.close()
        assert dropped


@needs_nixl
def test_unknown_commands_bogus_load_and_foreign_invl_change_nothing():
    puller_name = "smg-test-victim-reader"
    with (
        RemoteExporter(slots=2, slot_bytes=MiB) as exporter,
        RemotePuller(timeout=5, agent_name=puller_name) as puller,
    ):
        _, desc, n = exporter.export(b"before")
        assert bytes(puller.pull(desc, n)) == b"before"
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=2) as s:
            for body in (
                b"NIXLCOMM:ZZZZ",
                b"no prefix at all",
                b"NIXLCOMM:LOAD" + b"\x00" * 500,
                b"NIXLCOMM:LOADnixlSerDes|Agent" + (1 << 60).to_bytes(8, "little"),
                b"NIXLCOMM:INVL" + exporter.agent_name.encode(),
                b"NIXLCOMM:INVL" + puller_name.encode(),
                b"NIXLCOMM:SEND",
            ):
                s.sendall(len(body).to_bytes(8, "little") + body)
            size = int.from_bytes(_recv(s, 8), "little")
            assert _recv(s, size).startswith(b"NIXLCOMM:LOAD")  # same connection still served
        _, desc, n = exporter.export(b"after")
        assert bytes(puller.pull(desc, n)) == b"after"


@needs_nixl
def test_bogus_load_does_not_crash_an_exporter_that_accepts_peer_metadata():
    with (
        RemoteExporter(slots=1, slot_bytes=MiB, accept_peer_metadata=True) as exporter,
        RemotePuller(timeout=5) as puller,
    ):
        rng = np.random.default_rng(7)
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=2) as s:
            for size in (0, 1, 16, 24, 400, 4000):
                body = (
                    b"NIXLCOMM:LOADnixlSerDes|Agent"
                    + (5).to_bytes(8, "little")
                    + b"bogus"
                    + rng.integers(0, 256, size, dtype=np.uint8).tobytes()
                )
                s.sendall(len(body).to_bytes(8, "little") + body)
        _, desc, n = exporter.export(b"alive")
        assert bytes(puller.pull(desc, n)) == b"alive"


# -- stamps ------------------------------------------------------------------------------------


@needs_nixl
def test_a_freed_slot_refuses_its_stale_descriptor_before_reuse():
    with RemoteExporter(slots=1, slot_bytes=MiB, ttl=60) as exporter, RemotePuller() as puller:
        _, desc, n = exporter.export(np.full(3000, 9, np.uint8))
        a = decode_descriptor(desc)
        assert exporter.release(a.slot_key)
        # Not reused yet: the stamps were zeroed when the lease ended.
        with pytest.raises(RemoteStampError) as info:
            puller.pull(desc, n)
        assert info.value.actual == (0, 0)


@needs_nixl
def test_stamps_written_last_and_scrub_on_free():
    with RemoteExporter(slots=1, slot_bytes=8192, scrub_freed=True) as exporter:
        arena = exporter._arena
        _, desc, n = exporter.export(np.full(1000, 7, np.uint8))
        a = decode_descriptor(desc)
        assert read_stamps(arena[: n + 16], n) == (a.gen, a.gen)
        exporter.release(a.slot_key)
        assert not arena.any()  # payload and stamps wiped
    with RemoteExporter(slots=1, slot_bytes=8192) as exporter:
        arena = exporter._arena
        _, desc, n = exporter.export(np.full(1000, 7, np.uint8))
        exporter.release(decode_descriptor(desc).slot_key)
        assert read_stamps(arena[: n + 16], n) == (0, 0)
        assert (arena[16:1000] == 7).all()  # kept unless scrub_freed (see docs/security.md)


class _Recorder(np.ndarray):  # type: ignore[type-arg]
    """An arena view that logs every write (slice, bytes) the exporter makes."""

    log: ClassVar[list[tuple[Any, Any]]] = []

    def __setitem__(self, key: Any, value: Any) -> None:
        _Recorder.log.append((key, np.array(value, dtype=np.uint8, copy=True)))
        super().__setitem__(key, value)


@needs_nixl
@pytest.mark.parametrize("n_new", [600, 1000, 1500])
def test_a_read_torn_by_reuse_never_passes_both_stamps(n_new):
    """Replay, write by write, a lease ending and the slot's next lease, and read the old
    descriptor's header, payload and trailer at any three moments in address order (low to high
    or high to low, as a one-piece transfer goes): whenever both stamps show the old gen, the
    payload is the old one."""
    n_old = 1000
    with RemoteExporter(slots=1, slot_bytes=4096, ttl=60) as exporter:
        old = np.arange(n_old, dtype=np.uint32).astype(np.uint8)
        _, desc, _ = exporter.export(old)
        a = decode_descriptor(desc)
        start = exporter._arena.copy()
        exporter._arena = exporter._arena.view(_Recorder)
        _Recorder.log = []
        exporter.release(a.slot_key)
        exporter.export(np.full(n_new, 0xEE, np.uint8))
        ops = list(_Recorder.log)
    assert len(ops) >= 4  # stamps zeroed, payload, trailer, header
    states = [start]
    for key, value in ops:
        nxt = states[-1].copy()
        nxt[key] = value
        states.append(nxt)
    stamp = np.frombuffer(a.gen.to_bytes(8, "little"), np.uint8)
    accepted = 0
    k = len(states)
    for i in range(k):
        for j in range(k):
            for m in range(k):
                if not (i <= j <= m or i >= j >= m):
                    continue
                header = states[i][:8]
                body = states[j][8 : 8 + n_old]
                trailer = states[m][8 + n_old : 16 + n_old]
                if np.array_equal(header, stamp) and np.array_equal(trailer, stamp):
                    accepted += 1
                    assert np.array_equal(body, old), (i, j, m, ops)
    assert accepted  # reads finished before the lease ended still pass
