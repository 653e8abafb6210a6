"""The reference servicers (smg_grpc_proto.testing) over real loopback gRPC: every engine's
RPCs, exact toy outputs, abort, tokenizer transfer, KV events, and the multimodal paths with
inline and shared-memory tensors, malformed inputs and concurrency."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
import grpc.aio
import numpy as np
import pytest
from google.protobuf.message import Message

from smg_grpc_proto import channel, tensors
from smg_grpc_proto.engines import VisionModel
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import mlx_engine_pb2 as mlx_pb
from smg_grpc_proto.generated import mlx_engine_pb2_grpc as mlx_grpc
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sgl_pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sgl_grpc
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as ts_pb
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2_grpc as ts_grpc
from smg_grpc_proto.generated import trtllm_service_pb2 as trt_pb
from smg_grpc_proto.generated import trtllm_service_pb2_grpc as trt_grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vllm_grpc
from smg_grpc_proto.testing import (
    ENGINES,
    ReferenceServer,
    ToyModel,
    images_digest,
    mm_digest,
    toy_embedding,
)

pytestmark = pytest.mark.timeout(120)

QWEN_IMAGE = 151655
PROMPT = [101, 2023, 2003, 1037, 3231, 102]


# -- engine descriptions for the generic tests ----------------------------------------------
@dataclass(frozen=True)
class Engine:
    name: str
    service: str
    stub: Callable[[grpc.Channel], Any]
    pb: Any
    output_field: str  # GenerateComplete field with the token ids
    echoes_id: bool
    cumulative_chunks: bool  # chunk.completion_tokens is a running total (else a delta)
    stream_complete: str  # what complete holds with streaming: "last", "empty" or "all"
    abort: str  # "finish" (finish_reason="abort"), "cancelled" or "silent" (no complete)

    def request(
        self,
        rid: str,
        ids: list[int],
        *,
        max_tokens: int,
        stream: bool,
        ignore_eos: bool = False,
    ) -> Message:
        pb = self.pb
        if self.name == "trtllm":
            return pb.GenerateRequest(  # type: ignore[no-any-return]
                request_id=rid,
                tokenized=pb.TokenizedInput(input_token_ids=ids),
                max_tokens=max_tokens,
                streaming=stream,
                ignore_eos=ignore_eos,
            )
        if self.name in ("sglang", "tokenspeed"):
            params = pb.SamplingParams(max_new_tokens=max_tokens, ignore_eos=ignore_eos)
        else:
            params = pb.SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
        return pb.GenerateRequest(  # type: ignore[no-any-return]
            request_id=rid,
            tokenized=pb.TokenizedInput(input_ids=ids),
            sampling_params=params,
            stream=stream,
        )

    def abort_request(self, rid: str) -> Message:
        if self.name in ("vllm", "mlx"):
            return self.pb.AbortRequest(request_ids=[rid])  # type: ignore[no-any-return]
        return self.pb.AbortRequest(request_id=rid)  # type: ignore[no-any-return]


ENGINE_INFO = {
    "vllm": Engine(
        "vllm",
        "vllm.grpc.engine.VllmEngine",
        vllm_grpc.VllmEngineStub,
        vllm_pb,
        "output_ids",
        False,
        False,
        "last",
        "finish",
    ),
    "sglang": Engine(
        "sglang",
        "sglang.grpc.scheduler.SglangScheduler",
        sgl_grpc.SglangSchedulerStub,
        sgl_pb,
        "output_ids",
        True,
        True,
        "empty",
        "finish",
    ),
    "tokenspeed": Engine(
        "tokenspeed",
        "tokenspeed.grpc.scheduler.TokenSpeedScheduler",
        ts_grpc.TokenSpeedSchedulerStub,
        ts_pb,
        "output_ids",
        True,
        True,
        "last",
        "cancelled",
    ),
    "trtllm": Engine(
        "trtllm",
        "trtllm.TrtllmService",
        trt_grpc.TrtllmServiceStub,
        trt_pb,
        "output_token_ids",
        True,
        True,
        "all",
        "cancelled",
    ),
    "mlx": Engine(
        "mlx",
        "mlx.grpc.engine.MlxEngine",
        mlx_grpc.MlxEngineStub,
        mlx_pb,
        "output_ids",
        False,
        True,
        "empty",
        "silent",
    ),
}
assert set(ENGINE_INFO) == set(ENGINES)
KV_ENGINES = ["vllm", "sglang", "tokenspeed", "trtllm"]
EMBED_ENGINES = ["vllm", "sglang", "trtllm"]


# -- fixtures -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("toy-model")
    vocab = {f"tok{i}": i for i in range(3000)}
    (directory / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    (directory / "chat_template.jinja").write_text("{% for m in messages %}{{ m }}{% endfor %}")
    (directory / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2_vl",
                "architectures": ["Qwen2VLForConditionalGeneration"],
                "vocab_size": 151936,
                "max_position_embeddings": 32768,
                "eos_token_id": 151645,
                "vision_config": {"spatial_merge_size": 2},
            }
        )
    )
    (directory / "model.safetensors").write_bytes(os.urandom(4096))  # not a tokenizer file
    return directory


@pytest.fixture(scope="module")
def model(model_dir: Path) -> ToyModel:
    return ToyModel.from_dir(
        model_dir, token_delay_s=0.02, tokenizer_chunk_bytes=4096, served_model_name="toy"
    )


@pytest.fixture(scope="module")
def servers(model: ToyModel) -> Iterator[dict[str, ReferenceServer]]:
    running: dict[str, ReferenceServer] = {}
    try:
        for name in ENGINES:
            server = ReferenceServer(name, model=model, servicer_kwargs={"kv_interval_s": 0.2})
            server.start()
            running[name] = server
        yield running
    finally:
        for server in running.values():
            server.stop(grace=0)


@pytest.fixture(scope="module")
def channels(servers: dict[str, ReferenceServer]) -> Iterator[dict[str, grpc.Channel]]:
    opened = {name: channel.insecure_channel(s.target) for name, s in servers.items()}
    yield opened
    for ch in opened.values():
        ch.close()


def _stub(engine: str, channels: dict[str, grpc.Channel]) -> Any:
    return ENGINE_INFO[engine].stub(channels[engine])


def _split(responses: list[Any]) -> tuple[list[Any], list[Any]]:
    chunks = [r.chunk for r in responses if r.WhichOneof("response") == "chunk"]
    completes = [r.complete for r in responses if r.WhichOneof("response") == "complete"]
    return chunks, completes


# -- metadata RPCs --------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_health_and_info(engine: str, channels: dict[str, grpc.Channel], model: ToyModel) -> None:
    info = ENGINE_INFO[engine]
    stub = _stub(engine, channels)
    health = stub.HealthCheck(info.pb.HealthCheckRequest(), timeout=5)
    if engine == "trtllm":
        assert health.status == "OK"
    else:
        assert health.healthy
    model_info = stub.GetModelInfo(info.pb.GetModelInfoRequest(), timeout=5)
    server_info = stub.GetServerInfo(info.pb.GetServerInfoRequest(), timeout=5)
    assert model_info.vocab_size == 151936
    if engine == "trtllm":
        assert model_info.model_id == model.model_path
        assert model_info.max_seq_len == 32768
        assert server_info.world_size == 1
        return
    assert model_info.served_model_name == "toy"
    assert model_info.max_context_length == 32768
    assert list(model_info.eos_token_ids) == [151645]
    assert model_info.model_type == "qwen2_vl"
    assert list(model_info.architectures) == ["Qwen2VLForConditionalGeneration"]
    namespace = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    if engine == "vllm":
        assert server_info.server_type == "vllm-grpc"
        assert server_info.shm_namespace_id.startswith(namespace + ":")
        assert server_info.shm_namespace_id.endswith(f":{os.stat('/dev/shm').st_dev}")
    elif engine == "tokenspeed":
        assert server_info.scheduler_info["shm_namespace_id"].startswith(namespace + ":")
        assert model_info.supports_vision
    elif engine == "mlx":
        assert server_info.server_type == "mlx-grpc"
    elif engine == "sglang":
        assert server_info.server_type == "grpc"


@pytest.mark.parametrize("engine", ENGINES)
def test_get_tokenizer_streams_a_verified_zip(
    engine: str, channels: dict[str, grpc.Channel], model_dir: Path
) -> None:
    chunks = list(
        _stub(engine, channels).GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=10)
    )
    assert len(chunks) > 1, "the archive is larger than one 4 KiB chunk"
    assert all(c.sha256 == "" for c in chunks[:-1]), "sha256 rides on the last chunk only"
    assert all(len(c.data) == 4096 for c in chunks[:-1])
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = sorted(archive.namelist())
        assert names == sorted(
            ["chat_template.jinja", "config.json", "tokenizer.json", "tokenizer_config.json"]
        )
        for name in names:
            assert archive.read(name) == (model_dir / name).read_bytes()


# -- Generate -------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("max_tokens", "finish"), [(5, "length"), (1000, "stop")])
def test_generate_not_streamed(
    engine: str, max_tokens: int, finish: str, channels: dict[str, grpc.Channel], model: ToyModel
) -> None:
    info = ENGINE_INFO[engine]
    expected = model.generate(PROMPT, max_tokens=max_tokens)
    assert expected.finish_reason == finish
    request = info.request("r-plain", PROMPT, max_tokens=max_tokens, stream=False)
    responses = list(_stub(engine, channels).Generate(request, timeout=30))
    chunks, completes = _split(responses)
    assert chunks == []
    assert len(completes) == 1
    complete = completes[0]
    assert list(getattr(complete, info.output_field)) == list(expected.token_ids)
    assert complete.finish_reason == finish
    assert complete.prompt_tokens == len(PROMPT)
    assert complete.completion_tokens == len(expected.token_ids)
    if info.echoes_id:
        assert all(r.request_id == "r-plain" for r in responses)


@pytest.mark.parametrize("engine", ENGINES)
def test_generate_streamed(engine: str, channels: dict[str, grpc.Channel], model: ToyModel) -> None:
    info = ENGINE_INFO[engine]
    prompt = [*PROMPT, 7]
    expected = model.generate(prompt, max_tokens=1000)
    request = info.request("r-stream", prompt, max_tokens=1000, stream=True)
    responses = list(_stub(engine, channels).Generate(request, timeout=30))
    chunks, completes = _split(responses)
    assert responses[-1].WhichOneof("response") == "complete"
    assert len(completes) == 1
    tokens = [t for c in chunks for t in c.token_ids]
    assert tokens == list(expected.token_ids)
    assert all(len(c.token_ids) == 1 and c.prompt_tokens == len(prompt) for c in chunks)
    counts = [c.completion_tokens for c in chunks]
    if info.cumulative_chunks:
        assert counts == list(range(1, len(tokens) + 1))
    else:
        assert counts == [1] * len(tokens)
    complete = completes[0]
    assert complete.finish_reason == expected.finish_reason == "stop"
    want = {"last": tokens[-1:], "empty": [], "all": tokens}[info.stream_complete]
    assert list(getattr(complete, info.output_field)) == want
    if engine == "vllm":
        assert complete.completion_tokens == len(want)
    else:
        assert complete.completion_tokens == len(tokens)
    if engine == "sglang":
        assert complete.matched_token_id == 151645
    if engine == "mlx":
        assert complete.matched_stop_token_id == 151645
    if info.echoes_id:
        assert all(r.request_id == "r-stream" for r in responses)


@pytest.mark.parametrize("engine", ENGINES)
def test_abort_mid_stream(engine: str, channels: dict[str, grpc.Channel], model: ToyModel) -> None:
    info = ENGINE_INFO[engine]
    stub = _stub(engine, channels)
    rid = f"r-abort-{engine}"
    request = info.request(rid, PROMPT, max_tokens=5000, stream=True, ignore_eos=True)
    stream = stub.Generate(request, timeout=60)  # 5000 tokens x 20 ms = 100 s unless aborted
    received: list[Any] = []
    for response in stream:
        received.append(response)
        if len(received) == 3:
            break
    aborted_at = time.monotonic()
    stub.Abort(info.abort_request(rid), timeout=5)
    rest: list[Any] = []
    error: grpc.RpcError | None = None
    try:
        rest.extend(stream)
    except grpc.RpcError as exc:
        error = exc
    assert time.monotonic() - aborted_at < 2, "the aborted stream must end promptly"
    chunks, completes = _split(received + rest)
    assert len(chunks) < 100
    if info.abort == "finish":
        assert error is None
        assert len(completes) == 1
        assert completes[0].finish_reason == "abort"
    elif info.abort == "cancelled":
        assert error is not None
        assert error.code() == grpc.StatusCode.CANCELLED
        assert "aborted" in (error.details() or "")
        assert completes == []
    else:
        assert error is None
        assert completes == []
    # the engine keeps serving
    expected = model.generate(PROMPT, max_tokens=3)
    after = list(stub.Generate(info.request(rid, PROMPT, max_tokens=3, stream=False), timeout=30))
    assert list(getattr(_split(after)[1][0], info.output_field)) == list(expected.token_ids)


@pytest.mark.parametrize("engine", ["sglang", "tokenspeed", "trtllm"])
def test_abort_reports_unknown_ids(engine: str, channels: dict[str, grpc.Channel]) -> None:
    reply = _stub(engine, channels).Abort(ENGINE_INFO[engine].abort_request("nope"), timeout=5)
    assert reply.success is False


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_generate_requests(engine: str, channels: dict[str, grpc.Channel]) -> None:
    info = ENGINE_INFO[engine]
    stub = _stub(engine, channels)
    ids_field = "input_token_ids" if engine == "trtllm" else "input_ids"
    with pytest.raises(grpc.RpcError) as empty:
        list(stub.Generate(info.request("e1", [], max_tokens=4, stream=False), timeout=10))
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"tokenized.{ids_field} is empty" in (empty.value.details() or "")
    with pytest.raises(grpc.RpcError) as zero:
        list(stub.Generate(info.request("e2", PROMPT, max_tokens=0, stream=False), timeout=10))
    if engine in ("vllm", "mlx", "trtllm"):
        assert zero.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_tokens = 0" in (zero.value.details() or "")
    else:
        assert "max_new_tokens = 0" in (zero.value.details() or "")


# -- Embed, KV events, loads, admin ---------------------------------------------------------
@pytest.mark.parametrize("engine", EMBED_ENGINES)
def test_embed(engine: str, channels: dict[str, grpc.Channel]) -> None:
    pb = ENGINE_INFO[engine].pb
    ids = [5, 6, 7, 8]
    tokenized = (
        pb.TokenizedInput(input_token_ids=ids)
        if engine == "trtllm"
        else pb.TokenizedInput(input_ids=ids)
    )
    reply = _stub(engine, channels).Embed(
        pb.EmbedRequest(request_id="e", tokenized=tokenized), timeout=5
    )
    want = toy_embedding(ids, 16)
    assert list(reply.embedding) == want
    assert abs(float(np.linalg.norm(want)) - 1.0) < 1e-5
    assert reply.prompt_tokens == 4
    assert toy_embedding([5, 6, 7, 9], 16) != want


@pytest.mark.parametrize("engine", KV_ENGINES)
@pytest.mark.parametrize("opt_in", [False, True])
def test_kv_events_first_message_fast(
    engine: str, opt_in: bool, channels: dict[str, grpc.Channel]
) -> None:
    request = common_pb2.SubscribeKvEventsRequest(load_records_before_first_batch=opt_in)
    start = time.monotonic()
    stream = _stub(engine, channels).SubscribeKvEvents(request, timeout=10)
    first = next(stream)
    assert time.monotonic() - start < 2
    second = next(stream)
    stream.cancel()
    assert first.HasField("load")
    assert second.HasField("load")
    assert second.load.sample == first.load.sample + 1
    assert first.load.load_only is opt_in
    if opt_in:
        assert (first.sequence_number, second.sequence_number) == (0, 0)
    else:
        assert (first.sequence_number, second.sequence_number) == (1, 2)
    assert list(first.events) == []


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tokenspeed"])
def test_loads_flush_and_profile(engine: str, channels: dict[str, grpc.Channel]) -> None:
    pb = ENGINE_INFO[engine].pb
    stub = _stub(engine, channels)
    loads = stub.GetLoads(pb.GetLoadsRequest(), timeout=5)
    assert loads.dp_rank_count == 1
    assert loads.loads[0].dp_rank == 0
    assert stub.GetLoads(pb.GetLoadsRequest(dp_rank=3), timeout=5).dp_rank_count == 0
    assert stub.FlushCache(common_pb2.FlushCacheRequest(), timeout=5).success
    assert stub.StartProfile(common_pb2.StartProfileRequest(), timeout=5).success
    assert not stub.StartProfile(common_pb2.StartProfileRequest(), timeout=5).success
    assert stub.StopProfile(common_pb2.StopProfileRequest(), timeout=5).success
    assert not stub.StopProfile(common_pb2.StopProfileRequest(), timeout=5).success


def test_flush_refused_while_busy(channels: dict[str, grpc.Channel]) -> None:
    info = ENGINE_INFO["vllm"]
    stub = _stub("vllm", channels)
    stream = stub.Generate(
        info.request("busy", PROMPT, max_tokens=500, stream=True, ignore_eos=True), timeout=30
    )
    next(stream)
    reply = stub.FlushCache(common_pb2.FlushCacheRequest(), timeout=5)
    stream.cancel()
    assert not reply.success
    assert "in flight" in reply.message


def test_duplicate_request_id_refused(channels: dict[str, grpc.Channel]) -> None:
    info = ENGINE_INFO["sglang"]
    stub = _stub("sglang", channels)
    first = stub.Generate(
        info.request("dup", PROMPT, max_tokens=500, stream=True, ignore_eos=True), timeout=30
    )
    next(first)
    with pytest.raises(grpc.RpcError) as dup:
        list(stub.Generate(info.request("dup", PROMPT, max_tokens=3, stream=False), timeout=10))
    first.cancel()
    assert dup.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_toy_model_rejects_bad_config() -> None:
    with pytest.raises(ValueError, match=r"eos_token_ids \[1500\] lie inside"):
        ToyModel(eos_token_ids=(1500,))
    with pytest.raises(ValueError, match=r"\[10, 5\) must be non-empty"):
        ToyModel(token_low=10, token_high=5)
    with pytest.raises(ValueError, match="token_delay_s"):
        ToyModel(token_delay_s=-1.0)


# -- vLLM multimodal ------------------------------------------------------------------------
VISION = VisionModel.for_family("qwen2_vl")
GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"


def _images(seed: int, sizes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _mm_prompt(n: int) -> list[int]:
    ids = [101, 2023]
    for _ in range(n):
        ids += [151652, QWEN_IMAGE, 151653]
    return [*ids, 102]


def _vllm_expected(
    model: ToyModel, media: Any, prompt: list[int], *, max_tokens: int, ignore_eos: bool = False
) -> tuple[list[int], tuple[int, ...], str]:
    """Expected (expanded ids, tokens, finish) computed from a locally decoded inline twin."""
    twin = vllm_adapter.generate_request("twin", prompt, media)
    decoded = vllm_adapter.decode_mm_inputs(
        tensors.parse(tensors.serialize(twin), vllm_pb.GenerateRequest), merge_size=2
    )
    ids = list(twin.message.tokenized.input_ids)
    out = model.generate(ids, mm_digest(decoded), max_tokens=max_tokens, ignore_eos=ignore_eos)
    return ids, out.token_ids, out.finish_reason


def _vllm_generate(ch: grpc.Channel, request: Any, timeout: float = 30) -> list[Any]:
    call = ch.unary_stream(
        GENERATE,
        request_serializer=tensors.serialize,
        response_deserializer=vllm_pb.GenerateResponse.FromString,
    )
    return list(call(request, timeout=timeout))


def _segments_left(names: list[str]) -> list[str]:
    return [n for n in names if os.path.exists(f"/dev/shm/{n}")]


@pytest.mark.parametrize("transport", ["inline", "shm"])
@pytest.mark.parametrize("stream", [False, True])
def test_vllm_multimodal(
    transport: Literal["inline", "shm"],
    stream: bool,
    channels: dict[str, grpc.Channel],
    model: ToyModel,
) -> None:
    media = VISION.prepare(_images(1, [(56, 84), (112, 56), (84, 84)]))
    prompt = _mm_prompt(3)
    ids, expected, finish = _vllm_expected(model, media, prompt, max_tokens=1000)
    params = vllm_pb.SamplingParams(max_tokens=1000)
    request = vllm_adapter.generate_request(
        "mm",
        prompt,
        media,
        transport=transport,
        stream=stream,
        sampling_params=params,
    )
    assert list(request.message.tokenized.input_ids) == ids
    segments = request.shm_segments
    assert (len(segments) > 0) == (transport == "shm")
    responses = _vllm_generate(channels["vllm"], request)
    chunks, (complete,) = _split(responses)
    tokens = [t for c in chunks for t in c.token_ids] if stream else list(complete.output_ids)
    assert tokens == list(expected)
    assert complete.finish_reason == finish
    assert complete.prompt_tokens == len(ids)
    assert _segments_left(segments) == [], "the engine must consume (unlink) every segment"
    # a changed pixel changes the output: the digest covers the tensors end to end
    other = VISION.prepare(_images(2, [(56, 84), (112, 56), (84, 84)]))
    assert _vllm_expected(model, other, prompt, max_tokens=1000)[1] != expected


def test_vllm_request_above_4mib(channels: dict[str, grpc.Channel], model: ToyModel) -> None:
    media = VISION.prepare(_images(3, [(1008, 1008)]))
    prompt = _mm_prompt(1)
    _, expected, _ = _vllm_expected(model, media, prompt, max_tokens=6)
    request = vllm_adapter.generate_request(
        "big", prompt, media, sampling_params=vllm_pb.SamplingParams(max_tokens=6)
    )
    size = len(tensors.serialize(request))
    assert size > 20 * 1024 * 1024
    (complete,) = _split(_vllm_generate(channels["vllm"], request))[1]
    assert list(complete.output_ids) == list(expected)
    # the same request against a server left at gRPC's 4 MiB limit is refused, not hung
    with ReferenceServer("vllm", model=model, max_message_bytes=4 * 1024 * 1024) as small:
        ch = grpc.insecure_channel(small.target)
        with pytest.raises(grpc.RpcError) as info:
            _vllm_generate(ch, request, timeout=20)
        ch.close()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "4194304" in (info.value.details() or "")


def _mutate_placeholder_past_end(request: Any) -> Any:
    n = len(request.message.tokenized.input_ids)
    request.message.mm_inputs.mm_placeholders[1].offset = n - 2
    return request


def _mutate_flat_sizes(request: Any) -> Any:
    msg = request.to_message()
    sizes = msg.mm_inputs.model_specific_tensors["patches_per_image"]
    values = np.frombuffer(sizes.inline, dtype="<i8").copy()
    values[0] += 4
    sizes.inline = values.tobytes()
    return msg


def _mutate_dtype(request: Any) -> Any:
    request.message.mm_inputs.pixel_values.dtype = "float64"
    return request


def _mutate_truncate(request: Any) -> Any:
    msg = request.to_message()
    msg.mm_inputs.pixel_values.inline = msg.mm_inputs.pixel_values.inline[:-100]
    return msg


def _mutate_missing_sizes(request: Any) -> Any:
    del request.message.mm_inputs.model_specific_tensors["patches_per_image"]
    return request


def _mutate_grid(request: Any) -> Any:
    msg = request.to_message()
    grid = msg.mm_inputs.model_specific_tensors["image_grid_thw"]
    values = np.frombuffer(grid.inline, dtype="<i8").copy()
    values[1] += 2
    grid.inline = values.tobytes()
    return msg


@pytest.mark.parametrize(
    ("mutate", "field", "numbers"),
    [
        (
            _mutate_placeholder_past_end,
            "mm_inputs.mm_placeholders[1]",
            "reaches past the end of input_ids (19 tokens)",
        ),
        (
            _mutate_flat_sizes,
            "mm_inputs.model_specific_tensors[patches_per_image]",
            "sizes sum to 52, but 'pixel_values' has 48 rows",
        ),
        (_mutate_dtype, "mm_inputs.pixel_values", "unknown dtype 'float64'"),
        (
            _mutate_truncate,
            "mm_inputs.pixel_values",
            "225692 bytes, but shape [48, 1176] of float32 needs 225792",
        ),
        (_mutate_missing_sizes, "mm_inputs.batched_keys", "names 'patches_per_image'"),
        (
            _mutate_grid,
            "mm_inputs.model_specific_tensors[image_grid_thw][0]",
            "means 36 patches, but the item has 24 rows",
        ),
    ],
    ids=["placeholder-past-end", "flat-sizes", "dtype", "truncated", "missing-sizes", "grid"],
)
def test_vllm_malformed_multimodal(
    mutate: Callable[[Any], Any],
    field: str,
    numbers: str,
    channels: dict[str, grpc.Channel],
    model: ToyModel,
) -> None:
    media = VISION.prepare(_images(4, [(56, 84), (84, 56)]))
    prompt = _mm_prompt(2)
    bad = mutate(vllm_adapter.generate_request("bad", prompt, media))
    with pytest.raises(grpc.RpcError) as info:
        _vllm_generate(channels["vllm"], bad, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = info.value.details() or ""
    assert field in details, details
    assert numbers in details, details
    # the server still answers a good request
    _, expected, _ = _vllm_expected(model, media, prompt, max_tokens=4)
    good = vllm_adapter.generate_request(
        "good", prompt, media, sampling_params=vllm_pb.SamplingParams(max_tokens=4)
    )
    (complete,) = _split(_vllm_generate(channels["vllm"], good))[1]
    assert list(complete.output_ids) == list(expected)


@pytest.mark.slow
def test_vllm_concurrent_streams(model: ToyModel) -> None:
    """32 concurrent streaming multimodal requests, half through shared memory, for >= 10 s;
    every output checked against the toy model."""
    slow = model.with_options(token_delay_s=0.25)
    n_tokens = 40
    jobs = []
    for i in range(32):
        media = VISION.prepare(_images(100 + i, [(56 + 28 * (i % 4), 84), (84, 56 + 28 * (i % 3))]))
        prompt = [*_mm_prompt(2), 1000 + i]
        _, expected, finish = _vllm_expected(
            slow, media, prompt, max_tokens=n_tokens, ignore_eos=True
        )
        assert finish == "length"
        request = vllm_adapter.generate_request(
            f"c{i}",
            prompt,
            media,
            stream=True,
            transport="shm" if i % 2 else "inline",
            sampling_params=vllm_pb.SamplingParams(max_tokens=n_tokens, ignore_eos=True),
        )
        jobs.append((request, expected))

    async def one(ch: grpc.aio.Channel, request: Any) -> list[Any]:
        call = ch.unary_stream(
            GENERATE,
            request_serializer=tensors.serialize,
            response_deserializer=vllm_pb.GenerateResponse.FromString,
        )
        return [r async for r in call(request, timeout=60)]

    async def run_all() -> list[list[Any]]:
        async with channel.aio_insecure_channel(server.target) as ch:
            return await asyncio.gather(*(one(ch, req) for req, _ in jobs))

    with ReferenceServer("vllm", model=slow) as server:
        start = time.monotonic()
        results = asyncio.run(run_all())
        elapsed = time.monotonic() - start
    assert elapsed >= 10
    assert elapsed < 30, "the requests must run concurrently"
    for (request, expected), responses in zip(jobs, results, strict=True):
        chunks, (complete,) = _split(responses)
        assert [t for c in chunks for t in c.token_ids] == list(expected)
        assert complete.finish_reason == "length"
        assert list(complete.output_ids) == list(expected[-1:])
        assert _segments_left(request.shm_segments) == []


# -- SGLang, TokenSpeed, TRT-LLM multimodal (adapters from smg_grpc_proto.engines) ----------
def _adapter(name: str) -> Any:
    return pytest.importorskip(f"smg_grpc_proto.engines.{name}")


@pytest.mark.parametrize(
    ("engine", "transport"),
    [("sglang", "inline"), ("tokenspeed", "inline"), ("tokenspeed", "shm")],
)
def test_multimodal_other_engines(
    engine: str, transport: str, channels: dict[str, grpc.Channel], model: ToyModel
) -> None:
    adapter = _adapter(engine)
    info = ENGINE_INFO[engine]
    media = VISION.prepare(_images(7, [(56, 84), (112, 56)]))
    prompt = _mm_prompt(2)
    kwargs: dict[str, Any] = {"transport": transport} if engine == "tokenspeed" else {}
    twin = adapter.generate_request("twin", prompt, media)
    decoded = adapter.decode_mm_inputs(
        tensors.parse(tensors.serialize(twin), info.pb.GenerateRequest)
    )
    ids = list(twin.message.tokenized.input_ids)
    expected = model.generate(ids, mm_digest(decoded), max_tokens=1000)
    request = adapter.generate_request(
        "mm", prompt, media, sampling_params=info.pb.SamplingParams(max_new_tokens=1000), **kwargs
    )
    segments = list(getattr(request, "shm_segments", []))
    assert (len(segments) > 0) == (transport == "shm")
    call = channels[engine].unary_stream(
        f"/{info.service}/Generate",
        request_serializer=tensors.serialize,
        response_deserializer=info.pb.GenerateResponse.FromString,
    )
    (complete,) = _split(list(call(request, timeout=30)))[1]
    assert list(complete.output_ids) == list(expected.token_ids)
    assert _segments_left(segments) == []
    # a placeholder range past the end is refused with the field named
    bad = adapter.generate_request("bad", prompt, media)
    n = len(bad.message.tokenized.input_ids)
    if engine == "sglang":
        bad.message.mm_inputs.mm_placeholders[0].offset = n
        field = "mm_inputs.mm_placeholders[0]"
    else:
        bad.message.mm_inputs.items[0].placeholders[0].offset = n
        field = "mm_inputs.items[0].placeholders[0]"
    with pytest.raises(grpc.RpcError) as err:
        list(call(bad, timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.value.details() or "")


def test_multimodal_trtllm(channels: dict[str, grpc.Channel], model: ToyModel) -> None:
    _adapter("trtllm")
    from PIL import Image

    files = []
    for image in _images(9, [(40, 60), (70, 30)]):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        files.append(buffer.getvalue())
    request = trt_pb.GenerateRequest(
        request_id="trt-mm",
        tokenized=trt_pb.TokenizedInput(input_token_ids=PROMPT),
        max_tokens=1000,
        multimodal_input=trt_pb.MultimodalInput(image_data=files),
    )
    expected = model.generate(PROMPT, images_digest(files), max_tokens=1000)
    assert expected.token_ids != model.generate(PROMPT, max_tokens=1000).token_ids
    (complete,) = _split(list(_stub("trtllm", channels).Generate(request, timeout=30)))[1]
    assert list(complete.output_token_ids) == list(expected.token_ids)


# -- the command line -----------------------------------------------------------------------
def test_cli_serves_until_interrupted(model_dir: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "smg_grpc_proto.testing", "--engine", "mlx", "--port", "0"]
    command += ["--model-dir", str(model_dir)]
    errors = open(tmp_path / "stderr", "w")  # noqa: SIM115 - closed below
    with (
        errors,
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True) as process,
    ):
        try:
            stdout = process.stdout
            assert stdout is not None
            line: list[str] = []
            reader = threading.Thread(target=lambda: line.append(stdout.readline()))
            reader.start()
            reader.join(30)
            assert line, "no output within 30 s"
            assert line[0].startswith("listening on 127.0.0.1:"), (tmp_path / "stderr").read_text()
            port = int(line[0].strip().rsplit(":", 1)[1])
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = mlx_grpc.MlxEngineStub(ch)
                info = stub.GetModelInfo(mlx_pb.GetModelInfoRequest(), timeout=10)
                assert info.model_type == "qwen2_vl"
                assert info.model_path == str(model_dir)
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=15) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_reference_server_errors(servers: dict[str, ReferenceServer]) -> None:
    with pytest.raises(ValueError, match="engine 'llama' is not one of vllm, sglang"):
        ReferenceServer("llama")
    busy = ReferenceServer("mlx", port=servers["mlx"].port)
    with pytest.raises(OSError, match=f"cannot bind 127.0.0.1:{servers['mlx'].port}"):
        busy.start()
    with grpc.insecure_channel(servers["mlx"].target) as ch:  # the first server is unharmed
        assert (
            mlx_grpc.MlxEngineStub(ch).HealthCheck(mlx_pb.HealthCheckRequest(), timeout=5).healthy
        )
