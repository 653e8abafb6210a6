"""The remote transport over real NIXL on loopback: our exporter and puller, the gateway's
exporter layout, smg-grpc-servicer 0.14.1's real puller, slots released by notification and by
TTL, recycled slots refused, killed peers never hanging the other side."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.remote_peers import digest, payload

import smg_grpc_proto
from smg_grpc_proto.errors import (
    RemoteArenaFullError,
    RemoteExportRefusedError,
    RemotePayloadTooLargeError,
    RemoteStampError,
    RemoteTransferError,
)
from smg_grpc_proto.remote import (
    TRANSPORT,
    RemoteDescriptor,
    RemoteExporter,
    RemotePuller,
    decode_descriptor,
    nixl_available,
)

pytestmark = pytest.mark.skipif(
    not nixl_available(),
    reason="NIXL cannot be imported here "
    '(pip install --no-deps nixl-cu12, or "smg-grpc-proto[nixl]")',
)

PEERS = Path(__file__).resolve().parents[1] / "support" / "remote_peers.py"
MiB = 1 << 20


class Peer:
    """A NIXL peer process (tests/support/remote_peers.py) answering one ``@@ json`` line per
    command."""

    def __init__(self, *args: str, python: str = sys.executable, path: list[str] | None = None):
        env = dict(os.environ)
        # The smg_grpc_proto these tests imported (the installed wheel in CI) before the rest of
        # sys.path, where another test may have put the source tree (no compiled core).
        installed = str(Path(smg_grpc_proto.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([*(path or []), installed, *sys.path])
        self.proc = subprocess.Popen(
            [python, str(PEERS), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.hello = self.answer(timeout=60)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                self.lines.put(json.loads(line[3:]))

    def answer(self, timeout: float = 30) -> dict[str, Any]:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"peer {self.proc.args} gave no answer in {timeout} s") from None

    def ask(self, *words: object, timeout: float = 30) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def peers():
    started: list[Peer] = []

    def start(*args: str, **kw: Any) -> Peer:
        peer = Peer(*args, **kw)
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.close()


@pytest.fixture(scope="module")
def puller():
    with RemotePuller(timeout=20) as p:
        yield p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def _listening_addresses(pid: int) -> set[str]:
    """Local addresses of every TCP socket process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                found.add(cols[1].split(":")[0])
    return found


SIZES = [1, 7, 8, 9, 4095, 4096, 65_537, MiB, 7 * MiB, 28 * MiB, 32 * MiB - 16]


@pytest.mark.slow
def test_our_exporter_to_our_puller_every_byte(peers, puller):
    exporter = peers("exporter", "4", str(32 * MiB), "60")
    for seed, nbytes in enumerate(SIZES):
        got = exporter.ask("export", nbytes, seed)
        assert (got["transport"], got["nbytes"]) == (TRANSPORT, nbytes)
        desc = bytes.fromhex(got["descriptor"])
        assert desc.startswith(b"SMGRDMA1")
        assert decode_descriptor(desc).port == exporter.hello["port"]
        out = puller.pull(desc, nbytes)
        assert out.dtype == np.uint8
        assert out.shape == (nbytes,)
        assert np.array_equal(out, payload(nbytes, seed))
        # The slot comes back on the puller's notification before the next export (4 slots for
        # 11 exports: without this wait a slow notification would fill the arena).
        assert _wait(lambda: exporter.ask("leased")["leased"] == 0, 20)
    stats = exporter.ask("leased")["stats"]
    assert stats["released_by_notification"] == len(SIZES)
    assert stats["released_by_ttl"] == 0


@pytest.mark.slow
def test_every_listener_of_the_exporter_is_on_loopback(peers):
    exporter = peers("exporter", "1", str(MiB), "60")
    addresses = _listening_addresses(exporter.hello["pid"])
    # 0100007F is 127.0.0.1 in /proc/net/tcp's byte order.
    assert addresses, "no listening socket found"
    assert addresses <= {"0100007F"}, addresses


def test_metadata_agent_name_reads_real_metadata():
    from smg_grpc_proto.remote._nixl import metadata_agent_name

    with RemotePuller(agent_name="reader-7") as reader:
        assert metadata_agent_name(reader._agent.get_agent_metadata()) == "reader-7"
    assert metadata_agent_name(b"not metadata") == ""


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("float32", (3, 224, 224)), ("uint8", (1,)), ("int64", (2, 3, 5)), ("float16", (7, 1000))],
)
def test_in_process_pull_with_shape_and_dtype(puller, dtype, shape):
    array = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    with RemoteExporter(slots=2, slot_bytes=4 * MiB) as exporter:
        transport, desc, nbytes = exporter.export(array)
        assert (transport, nbytes) == ("nixl", array.nbytes)
        out = puller.pull(desc, nbytes, shape=shape, dtype=dtype)
        assert out.dtype == np.dtype(dtype)
        assert out.shape == shape
        assert np.array_equal(out, array)
        key = decode_descriptor(desc).slot_key
        assert _wait(lambda: not exporter.is_leased(key), 5)


def test_slot_released_by_ttl_when_nobody_reads(puller):
    with RemoteExporter(slots=1, slot_bytes=MiB, ttl=0.3) as exporter:
        _, desc, _ = exporter.export(b"x" * 1000)
        key = decode_descriptor(desc).slot_key
        assert exporter.is_leased(key)
        with pytest.raises(RemoteArenaFullError):
            exporter.export(b"y")
        assert _wait(lambda: not exporter.is_leased(key), 3)
        stats = exporter.stats()
        assert (stats.released_by_ttl, stats.released_by_notification, stats.leased) == (1, 0, 0)
        exporter.export(b"z")  # the slot is free again


def test_reused_slot_is_refused_by_its_stamp(puller):
    with RemoteExporter(slots=1, slot_bytes=MiB, ttl=60) as exporter:
        first = np.full(5000, 1, dtype=np.uint8)
        second = np.full(5000, 2, dtype=np.uint8)
        _, desc_a, n = exporter.export(first)
        a = decode_descriptor(desc_a)
        assert exporter.release(a.slot_key)  # lease over (as a TTL would end it)
        _, desc_b, _ = exporter.export(second)
        b = decode_descriptor(desc_b)
        assert b.slot_addr == a.slot_addr  # same memory...
        assert b.gen > a.gen  # ...new generation
        with pytest.raises(RemoteStampError) as info:
            puller.pull(desc_a, n)
        assert info.value.expected == a.gen
        assert info.value.actual == (b.gen, b.gen)
        assert exporter.is_leased(b.slot_key)  # the stale reader's notification freed nothing
        assert np.array_equal(puller.pull(desc_b, n), second)


def test_export_refusals_are_distinct_and_catchable(puller):
    with RemoteExporter(slots=2, slot_bytes=4096) as exporter:
        assert exporter.max_payload == 4080
        with pytest.raises(RemotePayloadTooLargeError) as big:
            exporter.export(np.zeros(4081, np.uint8))
        assert (big.value.expected, big.value.actual) == (4096, 4097)
        exporter.export(np.zeros(4080, np.uint8))
        exporter.export(np.zeros(1, np.uint8))
        with pytest.raises(RemoteArenaFullError) as full:
            exporter.export(np.zeros(1, np.uint8))
        assert full.value.expected == 2
        for exc in (big.value, full.value):
            assert isinstance(exc, RemoteExportRefusedError)
        with pytest.raises(RemoteExportRefusedError, match="empty"):
            exporter.export(b"")
    with pytest.raises(RemoteExportRefusedError, match="closed"):
        exporter.export(b"x")


def test_listener_survives_garbage(puller):
    with RemoteExporter(slots=3, slot_bytes=MiB) as exporter:
        for junk in (b"", b"\x01", (1 << 40).to_bytes(8, "little"), b"\x05" + b"\0" * 7 + b"NIXLC"):
            with socket.create_connection(("127.0.0.1", exporter.port), timeout=2) as s:
                s.sendall(junk)
        _, desc, n = exporter.export(b"still fine")
        assert bytes(puller.pull(desc, n)) == b"still fine"
        # A peer that sends half a message and goes silent delays nobody.
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=2) as stuck:
            stuck.sendall((100).to_bytes(8, "little") + b"NIXLCOMM:")
            _, desc, n = exporter.export(b"not delayed")
            with RemotePuller(timeout=3) as fresh:  # fetches the metadata now
                start = time.monotonic()
                assert bytes(fresh.pull(desc, n)) == b"not delayed"
                assert time.monotonic() - start < 2


@pytest.mark.slow
def test_gateway_format_exporter_to_our_puller(peers):
    port = _free_port()
    gateway = peers("gateway", "2", str(32 * MiB), "60", str(port))
    with RemotePuller(timeout=20) as puller:
        for seed, nbytes in enumerate([1, 4096, 3 * MiB + 5, 28 * MiB]):
            got = gateway.ask("export", nbytes, seed)
            out = puller.pull(bytes.fromhex(got["descriptor"]), nbytes)
            assert np.array_equal(out, payload(nbytes, seed))
            # The gateway's reaper freed the slot on our notification (str(slot_key)).
            assert _wait(lambda: gateway.ask("leased")["leased"] == [], 5)


def _torch_python() -> str | None:
    # `make deps` creates the torch venv in the test cache; SMG_TORCH_PYTHON overrides it.
    from support.images import CACHE

    candidate = os.environ.get("SMG_TORCH_PYTHON", str(CACHE / "torch-venv" / "bin" / "python"))
    if not os.path.exists(candidate):
        return None
    probe = subprocess.run([candidate, "-c", "import torch"], capture_output=True, check=False)
    return candidate if probe.returncode == 0 else None


@pytest.mark.slow
def test_our_exporter_to_the_servicers_real_puller(peers, monkeypatch):
    torch_python = _torch_python()
    if torch_python is None:
        pytest.skip(
            "smg-grpc-servicer's RdmaPixelPuller needs torch: run `make deps` (it creates "
            "<test cache>/torch-venv) or set SMG_TORCH_PYTHON"
        )
    import importlib.util

    from support.servicer import _package

    spec = importlib.util.find_spec("nixl_cu12")
    assert spec is not None
    assert spec.submodule_search_locations
    nixl_site = str(Path(next(iter(spec.submodule_search_locations))).parent)
    monkeypatch.setenv("SMG_RDMA_LANDING_SLOTS", "2")  # its landing ring: 2 x 32 MiB
    exporter = peers("exporter", "2", str(32 * MiB), "60")
    reader = peers(
        "servicer-puller",
        python=torch_python,
        path=[str(_package().parent), nixl_site],
    )
    assert reader.hello["ready"], "RdmaPixelPuller did not bring NIXL up"
    for seed, nbytes in enumerate([1, 4096, 7 * MiB, 28 * MiB]):
        got = exporter.ask("export", nbytes, seed)
        answer = reader.ask("pull", got["transport"], got["descriptor"], nbytes, timeout=60)
        assert answer == {"digest": digest(payload(nbytes, seed)), "nbytes": nbytes}
        # 2 slots for 4 exports: the slot comes back on the notification before the next one.
        assert _wait(lambda: exporter.ask("leased")["leased"] == 0, 20)
    assert exporter.ask("leased")["stats"]["released_by_notification"] == 4


@pytest.mark.slow
def test_killed_exporter_fails_the_puller_within_its_timeout(peers):
    exporter = peers("exporter", "2", str(8 * MiB), "60")
    with RemotePuller(timeout=5) as puller:
        got = exporter.ask("export", MiB, 1)
        assert np.array_equal(puller.pull(bytes.fromhex(got["descriptor"]), MiB), payload(MiB, 1))
        pending = exporter.ask("export", MiB, 2)
        exporter.kill()
        start = time.monotonic()
        with pytest.raises(RemoteTransferError):  # cached metadata, dead peer
            puller.pull(bytes.fromhex(pending["descriptor"]), MiB)
        assert time.monotonic() - start < 5 + 2
    with RemotePuller(timeout=5) as fresh:
        start = time.monotonic()
        with pytest.raises(RemoteTransferError, match="cannot fetch NIXL metadata"):
            fresh.pull(bytes.fromhex(pending["descriptor"]), MiB)
        assert time.monotonic() - start < 5 + 2


@pytest.mark.slow
def test_puller_recovers_when_the_exporter_restarts(peers):
    port = _free_port()
    with RemotePuller(timeout=10) as puller:
        first = peers("exporter", "2", str(8 * MiB), "60", str(port))
        got = first.ask("export", 5000, 1)
        assert np.array_equal(puller.pull(bytes.fromhex(got["descriptor"]), 5000), payload(5000, 1))
        first.kill()
        second = peers("exporter", "2", str(8 * MiB), "60", str(port))
        got = second.ask("export", 6000, 2)
        assert np.array_equal(puller.pull(bytes.fromhex(got["descriptor"]), 6000), payload(6000, 2))


@pytest.mark.slow
def test_killed_puller_leaves_the_slot_to_the_ttl(peers):
    reader = peers("puller", "5")  # started first: its start-up is slower than the TTL
    with RemoteExporter(slots=1, slot_bytes=MiB, ttl=3.0) as exporter:
        _, desc, n = exporter.export(b"q" * 777)
        key = decode_descriptor(desc).slot_key
        assert reader.ask("connect", desc.hex())["connected"] == exporter.agent_name
        reader.kill()
        assert exporter.is_leased(key)
        assert _wait(lambda: not exporter.is_leased(key), 8)
        assert exporter.stats().released_by_ttl == 1
        # The exporter still serves other readers.
        _, desc, n = exporter.export(b"r" * 99)
        with RemotePuller(timeout=10) as other:
            assert bytes(other.pull(desc, n)) == b"r" * 99


@pytest.mark.slow
def test_two_exporters_with_the_gateways_name_take_turns(peers):
    """NIXL keys remote agents by name and every gateway is ``smg-gateway-encode``: the puller
    swaps the loaded metadata when the endpoint changes, never reading from the wrong one."""
    # A slot per export: the exporters free slots when their reaper (every 20 ms) reads the
    # notification, which a loaded machine may delay past the next export to the same peer.
    first = peers("exporter", "3", str(4 * MiB), "60")
    second = peers("exporter", "3", str(4 * MiB), "60")
    assert first.hello["port"] != second.hello["port"]
    with RemotePuller(timeout=20) as puller:
        for seed in range(6):
            exporter = (first, second)[seed % 2]
            got = exporter.ask("export", 10_000 + seed, seed)
            assert "descriptor" in got, (seed, got)
            out = puller.pull(bytes.fromhex(got["descriptor"]), got["nbytes"])
            assert np.array_equal(out, payload(10_000 + seed, seed))
    # Swapping the agent after a READ loses no notification: every slot comes back by one.
    for exporter in (first, second):
        assert _wait(lambda e=exporter: e.ask("leased")["leased"] == 0, 10)
        assert exporter.ask("leased")["stats"]["released_by_notification"] == 3


@pytest.mark.slow
def test_32_concurrent_pulls_every_result_checked(peers):
    exporter = peers("exporter", "40", str(2 * MiB), "60")
    staged = []
    for seed in range(40):
        nbytes = 1000 + seed * 37_000
        got = exporter.ask("export", nbytes, seed)
        staged.append((bytes.fromhex(got["descriptor"]), nbytes, seed))
    results: dict[int, bool] = {}
    errors: list[BaseException] = []
    with RemotePuller(timeout=60) as puller:

        def pull(desc: bytes, nbytes: int, seed: int) -> None:
            try:
                results[seed] = bool(
                    np.array_equal(puller.pull(desc, nbytes), payload(nbytes, seed))
                )
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=pull, args=item) for item in staged[:32]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert not errors, errors
    assert len(results) == 32
    assert all(results.values())
    assert _wait(lambda: exporter.ask("leased")["leased"] == 40 - 32, 5)


def test_a_descriptor_outside_the_arena_is_refused_by_nixl(puller):
    with RemoteExporter(slots=1, slot_bytes=MiB) as exporter:
        _, raw, n = exporter.export(b"a" * 100)
        desc = decode_descriptor(raw)
        for addr, nbytes in ((desc.slot_addr - 4096, n), (desc.slot_addr, MiB)):
            forged = RemoteDescriptor(addr, desc.gen, desc.slot_key, desc.port, desc.ip)
            with pytest.raises(RemoteTransferError, match="could not start"):
                puller.pull(forged, nbytes)
        assert bytes(puller.pull(raw, n)) == b"a" * 100
