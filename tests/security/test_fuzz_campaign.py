"""The fuzz campaign (docs/security.md): hostile requests and images, bounded in time.

* Two child processes under an address-space limit mutate real requests (differential against
  protobuf's parser) and real images (decoders and four processors): zero crashes, zero
  hangs, zero non-library exceptions. A crash or hang names the case, whose bytes the child
  wrote to ``current.bin`` before running it.
* Over real gRPC on loopback, the reference servicers answer every mutated request with OK or
  ``INVALID_ARGUMENT`` — never ``UNKNOWN`` (an unexpected exception) — and keep serving valid
  requests at normal latency meanwhile, also under the placeholder flood that used to take
  seconds per request.

``SMG_FUZZ_SECONDS`` sets each child's budget (default 40 s); the seed is fixed per run of CI
and printed, so any failure can be replayed.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
from support import fuzz_wire
from support.mutate import mutate_bytes

from smg_grpc_proto import channel, shm
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sgl_pb
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as ts_pb
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from smg_grpc_proto.testing import ReferenceServer, ToyModel

TESTS = Path(__file__).resolve().parents[1]
SECONDS = float(os.environ.get("SMG_FUZZ_SECONDS", "40"))
SEED = int(os.environ.get("SMG_FUZZ_SEED", "20261202"))

pytestmark = pytest.mark.slow  # each test runs for tens of seconds (SMG_FUZZ_SECONDS)


def _campaign(worker: str, tmp_path: Path, headroom_mib: int) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        f"support.{worker}",
        str(SEED),
        str(SECONDS),
        str(tmp_path),
        str(headroom_mib),
    ]
    try:
        result = subprocess.run(
            command, cwd=TESTS, capture_output=True, text=True, timeout=SECONDS + 180
        )
    except subprocess.TimeoutExpired:
        case = (tmp_path / "current.bin").read_bytes()
        pytest.fail(f"{worker} hung (seed {SEED}) on a case of {len(case)} bytes: {case[:200]!r}")
    if result.returncode != 0:
        case = (tmp_path / "current.bin").read_bytes()
        pytest.fail(
            f"{worker} died with {result.returncode} (seed {SEED}) on {case[:300]!r}:\n"
            f"{result.stderr[-3000:]}"
        )
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"{worker}: {summary['cases']} cases, {summary['outcomes']}")
    assert summary["failures"] == [], json.dumps(summary["failures"], indent=1)[:6000]
    assert result.stderr.strip() == "", result.stderr[-3000:]
    return summary


@pytest.mark.timeout(600)
def test_wire_campaign(tmp_path: Path) -> None:
    summary = _campaign("fuzz_wire", tmp_path, headroom_mib=1024)
    outcomes = summary["outcomes"]
    assert summary["cases"] >= 2_000
    # the mutations reach every stage: refused by protobuf, refused by the decoders, decoded
    assert min(outcomes.get(k, 0) for k in ("wire refused", "decode refused", "decoded")) > 50
    assert list(tmp_path.iterdir()) == [tmp_path / "current.bin"]  # every segment consumed


@pytest.mark.timeout(600)
def test_image_campaign(tmp_path: Path) -> None:
    summary = _campaign("fuzz_images", tmp_path, headroom_mib=512)
    outcomes = summary["outcomes"]
    assert summary["cases"] >= 500
    assert outcomes.get("decode: ok", 0) > 50
    assert outcomes.get("llama4: ok", 0) > 50
    assert sum(v for k, v in outcomes.items() if k.startswith("decode: ") and "ok" not in k) > 50


# -- over real gRPC ---------------------------------------------------------------------------

METHODS = {
    "vllm": ("/vllm.grpc.engine.VllmEngine/Generate", vllm_pb.GenerateResponse),
    "sglang": ("/sglang.grpc.scheduler.SglangScheduler/Generate", sgl_pb.GenerateResponse),
    "tokenspeed": (
        "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/Generate",
        ts_pb.GenerateResponse,
    ),
}


_IDS = itertools.count()  # in-flight request ids must be unique (the probes run concurrently)


def _valid(engine: str) -> bytes:
    pb = {"vllm": vllm_pb, "sglang": sgl_pb, "tokenspeed": ts_pb}[engine]
    params = (
        pb.SamplingParams(max_tokens=4) if engine == "vllm" else pb.SamplingParams(max_new_tokens=4)
    )
    request = pb.GenerateRequest(
        request_id=f"ok-{next(_IDS)}",
        tokenized={"input_ids": [101, 7, 102]},
        sampling_params=params,
    )
    return request.SerializeToString()


def _call(ch: grpc.Channel, engine: str, data: bytes) -> grpc.StatusCode:
    method, response = METHODS[engine]
    call = ch.unary_stream(
        method, request_serializer=lambda b: b, response_deserializer=response.FromString
    )
    try:
        for _ in call(data, timeout=30):
            pass
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _flood(n: int) -> bytes:
    """A vLLM request with ``n`` one-token placeholder ranges, the last overlapping the first:
    the case the quadratic check spent 20+ s on at n = 20 000."""
    request = vllm_pb.GenerateRequest(request_id="flood", tokenized={"input_ids": [5] * n})
    mm = request.mm_inputs
    mm.pixel_values.shape.extend([n, 1])
    mm.pixel_values.dtype = "uint8"
    mm.pixel_values.inline = bytes(n)
    mm.batched_keys.append("pixel_values")
    for i in range(n):
        mm.mm_placeholders.add(offset=i, length=1)
    mm.mm_placeholders[n - 1].offset = 0
    mm.modality = common_pb2.IMAGE
    return request.SerializeToString()


@pytest.mark.timeout(300)
def test_servers_answer_hostile_requests_and_keep_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shm, "DEFAULT_DIR", tmp_path)  # names in mutated requests resolve here
    model = ToyModel(token_delay_s=0.0)
    servers = {e: ReferenceServer(e, model=model) for e in METHODS}
    for server in servers.values():
        server.start()
    channels = {e: channel.insecure_channel(s.target) for e, s in servers.items()}
    try:
        for e in METHODS:  # warm up
            assert _call(channels[e], e, _valid(e)) == grpc.StatusCode.OK

        def latencies(engine: str, count: int) -> list[float]:
            out = []
            for _ in range(count):
                start = time.perf_counter()
                assert _call(channels[engine], engine, _valid(engine)) == grpc.StatusCode.OK
                out.append(time.perf_counter() - start)
                time.sleep(0.01)
            return out

        baseline = statistics.median(latencies("vllm", 20))
        cases = fuzz_wire.seeds()
        rng = random.Random(SEED)
        codes: Counter[str] = Counter()
        unexpected: list[tuple[str, str]] = []
        stop = threading.Event()
        during: list[float] = []

        def probe() -> None:
            while not stop.is_set():
                during.extend(latencies("vllm", 1))

        prober = threading.Thread(target=probe)
        prober.start()
        deadline = time.monotonic() + min(SECONDS, 30)
        n = 0
        try:
            while time.monotonic() < deadline:
                engine, data = cases[n % len(cases)]
                n += 1
                if rng.random() < 0.4:
                    case = mutate_bytes(rng, data)
                else:
                    case = fuzz_wire.mutate_fields(rng, engine, data)
                code = _call(channels[engine], engine, case)
                codes[code.name] += 1
                if code not in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT):
                    unexpected.append((code.name, case.hex()[:400]))
            # the placeholder flood: eight at once, as in the report
            floods = [
                threading.Thread(target=_call, args=(channels["vllm"], "vllm", _flood(20_000)))
                for _ in range(8)
            ]
            flood_start = time.perf_counter()
            for t in floods:
                t.start()
            flooded = latencies("vllm", 5)
            for t in floods:
                t.join()
            flood_time = time.perf_counter() - flood_start
        finally:
            stop.set()
            prober.join()
        print(
            f"{n} hostile requests (vLLM, SGLang, TokenSpeed): {dict(codes)}; valid request "
            f"median {baseline * 1e3:.1f} ms before, "
            f"{statistics.median(during) * 1e3:.1f} ms during (p90 "
            f"{sorted(during)[int(len(during) * 0.9)] * 1e3:.1f} ms, {len(during)} probes); "
            f"8 floods of 20 000 ranges answered in {flood_time:.2f} s, valid requests meanwhile "
            f"max {max(flooded) * 1e3:.1f} ms"
        )
        assert unexpected == [], unexpected[:5]
        assert codes["INVALID_ARGUMENT"] > n // 4
        assert statistics.median(during) < max(5 * baseline, 0.1)
        assert max(flooded) < 1.0
        assert flood_time < 5.0
        assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind
    finally:
        for ch in channels.values():
            ch.close()
        for server in servers.values():
            server.stop(grace=0)
