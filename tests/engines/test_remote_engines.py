"""The remote (NIXL) tensor transport end to end: the engine builders export ``pixel_values`` /
``encoder_input`` (``transport="remote"``), the request crosses real gRPC on 127.0.0.1 to a
reference servicer whose decoder pulls the payload, and every byte is compared with what was
sent. Inline fallback, 32 concurrent requests for >= 10 s, killed peers. Loopback only: UCX is
kept to ``lo`` (set before any NIXL agent of this process starts)."""

from __future__ import annotations

import os

os.environ.setdefault("UCX_NET_DEVICES", "lo")

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

import smg_grpc_proto
from smg_grpc_proto import tensors
from smg_grpc_proto.engines import VisionModel
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import RemoteTransportUnavailableError, TensorError
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sgl_pb
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as ts_pb
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from smg_grpc_proto.remote import RemoteExporter, RemotePuller, nixl_available
from smg_grpc_proto.tensors import _remote
from smg_grpc_proto.testing import ReferenceServer, ToyModel, mm_digest

NIXL = nixl_available()
needs_nixl = pytest.mark.skipif(
    not NIXL,
    reason="NIXL cannot be imported here "
    '(pip install --no-deps nixl-cu12, or "smg-grpc-proto[nixl]")',
)
pytestmark = pytest.mark.timeout(180)

VISION = VisionModel.for_family("qwen2_vl")
QWEN_IMAGE = 151655
VLLM_GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
TS_GENERATE = "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/Generate"
MiB = 1 << 20


def _images(seed: int, sizes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _prompt(n: int) -> list[int]:
    ids = [101, 2023]
    for _ in range(n):
        ids += [151652, QWEN_IMAGE, 151653]
    return [*ids, 102]


def _assert_same(got: Any, want: Any) -> None:
    """Every tensor of every item: same names, dtype, shape and bytes."""
    assert len(got) == len(want)
    for gb, wb in zip(got, want, strict=True):
        assert len(gb.items) == len(wb.items)
        for gi, wi in zip(gb.items, wb.items, strict=True):
            assert sorted(gi.tensors) == sorted(wi.tensors)
            for name in wi.tensors:
                a, b = np.asarray(gi.tensors[name]), np.asarray(wi.tensors[name])
                assert (a.dtype, a.shape) == (b.dtype, b.shape), name
                assert a.tobytes() == b.tobytes(), name


class Capture:
    """``on_decoded`` observer: what the servicer decoded, by request id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decoded: dict[str, Any] = {}

    def __call__(self, request_id: str, decoded: Any, seconds: float) -> None:
        with self.lock:
            self.decoded[request_id] = decoded


def _call(ch: grpc.Channel, method: str, response: Any, request: Any, timeout: float = 60) -> Any:
    call = ch.unary_stream(
        method, request_serializer=tensors.serialize, response_deserializer=response.FromString
    )
    return list(call(request, timeout=timeout))


@pytest.fixture(scope="module")
def exporter() -> Iterator[RemoteExporter]:
    if not NIXL:
        pytest.skip("NIXL cannot be imported here")
    with RemoteExporter(slots=64, slot_bytes=4 * MiB, ttl=60.0) as exp:
        yield exp


@pytest.fixture(scope="module")
def puller() -> Iterator[RemotePuller]:
    if not NIXL:
        pytest.skip("NIXL cannot be imported here")
    with RemotePuller(timeout=20.0) as p:
        yield p


@pytest.fixture(scope="module")
def servers(puller: RemotePuller) -> Iterator[dict[str, tuple[grpc.Channel, Capture]]]:
    out: dict[str, tuple[grpc.Channel, Capture]] = {}
    started = []
    for engine in ("vllm", "tokenspeed"):
        capture = Capture()
        server = ReferenceServer(
            engine,
            model=ToyModel(),
            servicer_kwargs={"on_decoded": capture, "puller": puller},
        )
        server.start()
        started.append(server)
        out[engine] = (grpc.insecure_channel(server.target), capture)
    yield out
    for ch, _ in out.values():
        ch.close()
    for server in started:
        server.stop()


def _vllm(rid: str, media: Any, n: int, **kw: Any) -> Any:
    return vllm_adapter.generate_request(
        rid, _prompt(n), media, sampling_params=vllm_pb.SamplingParams(max_tokens=4), **kw
    )


def _ts(rid: str, media: Any, n: int, **kw: Any) -> Any:
    return ts_adapter.generate_request(
        rid, _prompt(n), media, sampling_params=ts_pb.SamplingParams(max_new_tokens=4), **kw
    )


def _send(servers: Any, engine: str, request: Any) -> tuple[Any, list[Any]]:
    ch, capture = servers[engine]
    if engine == "vllm":
        responses = _call(ch, VLLM_GENERATE, vllm_pb.GenerateResponse, request)
    else:
        responses = _call(ch, TS_GENERATE, ts_pb.GenerateResponse, request)
    rid = request.message.request_id
    return capture.decoded.pop(rid), responses


def _payload_kinds(request: Any, engine: str) -> list[str]:
    m = request.message
    if engine == "vllm":
        return [str(m.mm_inputs.pixel_values.WhichOneof("payload"))]
    return [str(item.encoder_input.WhichOneof("payload")) for item in m.mm_inputs.items]


# -- builder -> gRPC -> decoder, every byte ---------------------------------------------------
@needs_nixl
@pytest.mark.parametrize("engine", ["vllm", "tokenspeed"])
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_remote_request_every_byte(
    engine: str, dtype: str | None, servers: Any, exporter: RemoteExporter
) -> None:
    media = VISION.prepare(_images(11, [(56, 84), (112, 56), (84, 84)]))
    build = _vllm if engine == "vllm" else _ts
    before = exporter.stats()
    remote = build(
        f"r-{engine}-{dtype}", media, 3, transport="remote", dtype=dtype, exporter=exporter
    )
    inline = build(f"i-{engine}-{dtype}", media, 3, transport="inline", dtype=dtype)
    assert set(_payload_kinds(remote, engine)) == {"remote"}
    assert set(_payload_kinds(inline, engine)) == {"inline"}
    td = (
        remote.message.mm_inputs.pixel_values
        if engine == "vllm"
        else remote.message.mm_inputs.items[0].encoder_input
    )
    assert td.remote.transport == "nixl"
    assert td.remote.descriptor.startswith(b"SMGRDMA1")
    assert td.remote.nbytes == int(np.prod(td.shape)) * tensors.ITEMSIZE[td.dtype]
    got, responses = _send(servers, engine, remote)
    want, inline_responses = _send(servers, engine, inline)
    _assert_same(got, want)
    assert mm_digest(got) == mm_digest(want)
    # the toy output folds the decoded bytes in
    assert [list(r.complete.output_ids) for r in responses] == [
        list(r.complete.output_ids) for r in inline_responses
    ]
    # the pixels themselves, against the processor's output (bf16: its wire bits)
    pixels = np.concatenate(
        [np.asarray(item.tensors[media.primary_name]) for b in got for item in b.items]
    )
    primary = media.wire_tensors()[media.primary_name]
    sent = np.asarray(primary.materialize() if hasattr(primary, "materialize") else primary)
    if dtype is not None:  # what the codec makes of it inline
        sent = tensors.unpack(tensors.pack(sent, vllm_pb.TensorData, dtype=dtype))
    assert pixels.dtype == sent.dtype
    assert pixels.tobytes() == sent.tobytes()
    released = lambda: exporter.stats().released_by_notification  # noqa: E731
    n_sent = exporter.stats().exported - before.exported
    assert n_sent == len(_payload_kinds(remote, engine))
    deadline = time.monotonic() + 5
    while released() - before.released_by_notification < n_sent and time.monotonic() < deadline:
        time.sleep(0.02)
    assert released() - before.released_by_notification == n_sent


@needs_nixl
def test_side_tensors_stay_inline(exporter: RemoteExporter, puller: RemotePuller) -> None:
    media = VISION.prepare(_images(12, [(56, 84)]))
    request = _vllm("side", media, 1, transport="remote", exporter=exporter)
    mm = request.message.mm_inputs
    assert mm.pixel_values.WhichOneof("payload") == "remote"
    assert {t.WhichOneof("payload") for t in mm.model_specific_tensors.values()} == {"inline"}
    # leave nothing leased for the other tests
    tensors.unpack(mm.pixel_values, puller=puller)


@needs_nixl
def test_pack_unpack_remote_round_trip(exporter: RemoteExporter, puller: RemotePuller) -> None:
    rng = np.random.default_rng(5)
    for message_type in (vllm_pb.TensorData, ts_pb.TensorData):
        for array, dtype in [
            (rng.standard_normal((3, 1176), dtype=np.float32), None),
            (rng.standard_normal((7, 5), dtype=np.float32), "bfloat16"),
            (rng.integers(0, 2**40, (9,), dtype=np.int64), None),
        ]:
            td = tensors.pack(
                array, message_type, dtype=dtype, transport="remote", exporter=exporter
            )
            assert td.WhichOneof("payload") == "remote"
            inline = tensors.pack(array, message_type, dtype=dtype)
            out = tensors.unpack(td, puller=puller, bf16="uint16")
            assert out.tobytes() == tensors.unpack(inline, bf16="uint16").tobytes()
            assert not out.flags.writeable


def test_layout_without_remote_is_refused_naming_the_field() -> None:
    with pytest.raises(TensorError, match=r"sglang\.grpc\.scheduler\.TensorData.*no remote handle"):
        tensors.pack(np.zeros(4, np.float32), sgl_pb.TensorData, transport="remote")
    message = tensors.TensorMessage(sgl_pb.GenerateRequest())
    with pytest.raises(TensorError, match=r"mm_inputs\.pixel_values.*no remote handle") as info:
        message.attach("mm_inputs.pixel_values", np.zeros(4, np.float32), transport="remote")
    assert info.value.field == "transport"


# -- inline fallback -------------------------------------------------------------------------
@needs_nixl
def test_fallback_to_inline_when_the_arena_is_full(
    servers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    media = VISION.prepare(_images(13, [(56, 84), (84, 84)]))
    with RemoteExporter(slots=1, slot_bytes=4 * MiB, ttl=60.0) as small:
        small.export(b"x" * 100)  # the one slot stays leased: nobody reads it
        before = tensors.remote_stats()
        with caplog.at_level(logging.INFO, logger="smg_grpc_proto.tensors"):
            request = _vllm("full", media, 2, transport="remote", exporter=small)
        after = tensors.remote_stats()
        assert _payload_kinds(request, "vllm") == ["inline"]
        assert after.fallback_arena_full == before.fallback_arena_full + 1
        assert "remote arena is full" in caplog.text
        assert "pixel_values" in caplog.text
        got, _ = _send(servers, "vllm", request)
        want = vllm_adapter.decode_mm_inputs(_vllm("full-i", media, 2).to_message())
        _assert_same(got, want)


@needs_nixl
def test_fallback_to_inline_when_too_large_for_a_slot(servers: Any) -> None:
    media = VISION.prepare(_images(14, [(112, 112)]))
    with RemoteExporter(slots=4, slot_bytes=4096, ttl=60.0) as tiny:
        before = tensors.remote_stats()
        request = _ts("big", media, 1, transport="remote", exporter=tiny)
        assert _payload_kinds(request, "tokenspeed") == ["inline"]
        assert tensors.remote_stats().fallback_too_large == before.fallback_too_large + 1
        got, _ = _send(servers, "tokenspeed", request)
        want, _ = _send(servers, "tokenspeed", _ts("big-i", media, 1))
        _assert_same(got, want)


def test_fallback_to_inline_without_nixl(monkeypatch: pytest.MonkeyPatch) -> None:
    """NIXL missing at export: the process default cannot start, the tensor goes inline."""
    from smg_grpc_proto.errors import RemoteUnavailableError

    def missing() -> Any:
        raise RemoteUnavailableError("NIXL is not importable; install smg-grpc-proto[nixl]")

    monkeypatch.setattr(_remote, "default_exporter", missing)
    before = tensors.remote_stats()
    td = tensors.pack(np.arange(6, dtype=np.float32), vllm_pb.TensorData, transport="remote")
    assert td.WhichOneof("payload") == "inline"
    assert tensors.unpack(td).tolist() == list(range(6))
    assert tensors.remote_stats().fallback_unavailable == before.fallback_unavailable + 1


def test_reading_remote_without_nixl_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from smg_grpc_proto.errors import RemoteUnavailableError, TransportNotImplementedError

    def missing() -> Any:
        raise RemoteUnavailableError(
            'NIXL is not importable; install it: pip install "smg-grpc-proto[nixl]"',
            field="nixl",
        )

    monkeypatch.setattr(_remote, "default_puller", missing)
    td = vllm_pb.TensorData(shape=[2], dtype="float32")
    td.remote.transport, td.remote.descriptor, td.remote.nbytes = "nixl", b"SMGRDMA1", 8
    with pytest.raises(RemoteTransportUnavailableError, match=r"smg-grpc-proto\[nixl\]") as info:
        tensors.unpack(td)
    assert isinstance(info.value, TransportNotImplementedError)
    assert info.value.field == "vllm.grpc.engine.TensorData.remote"


# -- 32 concurrent requests for >= 10 s -------------------------------------------------------
@needs_nixl
@pytest.mark.slow
def test_32_concurrent_remote_requests_for_10_seconds(servers: Any) -> None:
    # 32 workers x 2 tensors (TokenSpeed: one per item), and a slot is freed only when the
    # exporter's poller sees the notification: room for two requests per worker.
    with RemoteExporter(slots=128, slot_bytes=MiB, ttl=60.0) as exporter:
        _concurrent(servers, exporter)


def _concurrent(servers: Any, exporter: RemoteExporter) -> None:
    variants = []
    for v in range(8):
        sizes = [(56 + 28 * (v % 3), 84), (84, 56 + 28 * (v % 4))]
        media = VISION.prepare(_images(200 + v, sizes))
        engine = ("vllm", "tokenspeed")[v % 2]
        build = _vllm if engine == "vllm" else _ts
        want = (vllm_adapter if engine == "vllm" else ts_adapter).decode_mm_inputs(
            build(f"want-{v}", media, 2).to_message()
        )
        variants.append((engine, build, media, mm_digest(want)))
    stats_before = tensors.remote_stats()
    stop_at = time.monotonic() + 10.0
    done: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        n = 0
        try:
            while time.monotonic() < stop_at:
                engine, build, media, want = variants[(w + n) % len(variants)]
                request = build(f"w{w}-{n}", media, 2, transport="remote", exporter=exporter)
                kinds = _payload_kinds(request, engine)
                got, responses = _send(servers, engine, request)
                assert mm_digest(got) == want, (w, n, kinds)
                assert responses
                n += 1
        except BaseException as exc:
            errors.append(exc)
        with lock:
            done.append(n)

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    elapsed = time.monotonic() - start
    assert not errors, errors[:3]
    assert len(done) == 32
    assert all(n > 0 for n in done)
    assert elapsed >= 10.0
    stats = tensors.remote_stats()
    exported = stats.exported - stats_before.exported
    assert exported >= sum(done)  # tokenspeed requests export one tensor per item
    fallbacks = stats.fallbacks - stats_before.fallbacks
    # an arena-full fallback goes inline (and was checked like the rest); it must stay rare
    assert fallbacks <= exported // 20, (fallbacks, exported)
    deadline = time.monotonic() + 5
    while exporter.stats().leased and time.monotonic() < deadline:
        time.sleep(0.02)
    assert exporter.stats().leased == 0
    print(
        f"\n32 workers, {elapsed:.1f} s: {sum(done)} requests, {exported} remote tensors, "
        f"{fallbacks} inline fallbacks"
    )


# -- killed peers ----------------------------------------------------------------------------
_EXPORTING_CLIENT = """
import os, sys
sys.path[:0] = {path!r}
import numpy as np
from smg_grpc_proto import tensors
from smg_grpc_proto.engines import VisionModel
from smg_grpc_proto.engines import vllm as adapter
from smg_grpc_proto.remote import RemoteExporter
exporter = RemoteExporter(slots=2, slot_bytes=4 << 20, ttl=60)
rng = np.random.default_rng(3)
media = VisionModel.for_family("qwen2_vl").prepare([rng.integers(0, 256, (56, 84, 3), np.uint8)])
request = adapter.generate_request("dead", [101, 151652, 151655, 151653, 102], media,
                                   transport="remote", exporter=exporter)
assert request.message.mm_inputs.pixel_values.WhichOneof("payload") == "remote"
sys.stdout.write("REQUEST " + tensors.serialize(request).hex() + "\\n")
sys.stdout.flush()
sys.stdin.read()
"""


def _child_path() -> list[str]:
    """The child's ``sys.path``: the directory of the ``smg_grpc_proto`` these tests imported
    (the installed wheel in CI) first, so that a source tree some other test put on
    ``sys.path`` (it has no compiled core) is never what the child imports."""
    return [str(Path(smg_grpc_proto.__file__).resolve().parents[1]), *sys.path]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["UCX_NET_DEVICES"] = "lo"
    return env


@needs_nixl
@pytest.mark.slow
def test_killed_exporter_never_hangs_the_servicer(tmp_path: Path) -> None:
    data = b""
    log = tmp_path / "client.log"  # a client that cannot start says why in the failure
    with open(log, "wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", _EXPORTING_CLIENT.format(path=_child_path())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=_child_env(),
        )
    try:
        assert child.stdout is not None
        # NIXL and UCX log to stdout too (lines that may start with a hex digit): the request is
        # the one line with its own prefix.
        line = "-"
        while line and not line.startswith("REQUEST "):
            line = child.stdout.readline()
        if line:
            data = bytes.fromhex(line[len("REQUEST ") :].strip())
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()
    assert data, f"the exporting client died before sending its request:\n{log.read_text()[-3000:]}"
    with (
        RemotePuller(timeout=3.0) as short,
        ReferenceServer("vllm", servicer_kwargs={"puller": short}) as server,
        grpc.insecure_channel(server.target) as ch,
    ):
        call = ch.unary_stream(
            VLLM_GENERATE,
            request_serializer=lambda b: b,
            response_deserializer=vllm_pb.GenerateResponse.FromString,
        )
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            list(call(data, timeout=60))
        assert time.monotonic() - start < 3.0 + 5
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        details = info.value.details() or ""
        assert details.startswith("mm_inputs.pixel_values: ")
        assert "TensorData.remote: cannot fetch NIXL metadata" in details
        # the servicer still serves
        media = VISION.prepare(_images(15, [(56, 84)]))
        out = list(call(tensors.serialize(_vllm("alive", media, 1)), timeout=30))
        assert out


@needs_nixl
@pytest.mark.slow
def test_killed_puller_never_hangs_the_exporter() -> None:
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smg_grpc_proto.testing",
            "--engine",
            "vllm",
            "--token-delay",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_child_env(),
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        while line and not line.startswith("listening on"):
            line = server.stdout.readline()
        target = line.split()[-1]
        media = VISION.prepare(_images(16, [(56, 84)]))
        with (
            RemoteExporter(slots=2, slot_bytes=4 * MiB, ttl=3.0) as exp,
            grpc.insecure_channel(target) as ch,
        ):
            call = ch.unary_stream(
                VLLM_GENERATE,
                request_serializer=tensors.serialize,
                response_deserializer=vllm_pb.GenerateResponse.FromString,
            )
            first = _vllm("slow", media, 1, transport="remote", exporter=exp)
            first.message.sampling_params.max_tokens = 50
            future = call(first, timeout=60)
            it = iter(future)
            start = time.monotonic()
            threading.Timer(1.0, lambda: os.kill(server.pid, signal.SIGKILL)).start()
            with pytest.raises(grpc.RpcError) as info:
                list(it)
            assert time.monotonic() - start < 10
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            # a request the dead engine never read: its slot comes back by TTL
            _vllm("orphan", media, 1, transport="remote", exporter=exp)
            deadline = time.monotonic() + 10
            while exp.stats().leased and time.monotonic() < deadline:
                time.sleep(0.05)
            assert exp.stats().leased == 0
            assert exp.stats().released_by_ttl >= 1
            # and the exporter keeps exporting
            again = _vllm("again", media, 1, transport="remote", exporter=exp)
            assert _payload_kinds(again, "vllm") == ["remote"]
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGKILL)
        server.wait(10)
        if server.stdout is not None:
            server.stdout.close()


def test_servicer_without_nixl_answers_unimplemented(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference servicer where NIXL does not import: a remote payload is UNIMPLEMENTED,
    naming the extra; the servicer keeps serving inline requests."""
    from smg_grpc_proto.errors import RemoteUnavailableError

    def missing() -> Any:
        raise RemoteUnavailableError(
            'NIXL is not importable; install it: pip install "smg-grpc-proto[nixl]"',
            field="nixl",
        )

    monkeypatch.setattr(_remote, "default_puller", missing)
    media = VISION.prepare(_images(17, [(56, 84)]))
    message = _vllm("no-nixl", media, 1).to_message()
    pv = message.mm_inputs.pixel_values
    nbytes = len(pv.inline)
    pv.remote.transport, pv.remote.descriptor, pv.remote.nbytes = "nixl", b"SMGRDMA1", nbytes
    assert pv.WhichOneof("payload") == "remote"
    with ReferenceServer("vllm") as server, grpc.insecure_channel(server.target) as ch:
        call = ch.unary_stream(
            VLLM_GENERATE,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=vllm_pb.GenerateResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as info:
            list(call(message, timeout=30))
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        details = info.value.details() or ""
        assert "mm_inputs.pixel_values" in details
        assert "smg-grpc-proto[nixl]" in details
        assert list(call(_vllm("ok", media, 1).to_message(), timeout=30))
