"""The demo (``smg-proto demo``, ``make demo``): a photo through the whole contract, timed.

1. Starts the reference vLLM servicer (:mod:`smg_grpc_proto.testing`) on 127.0.0.1.
2. Preprocesses the bundled photo for Qwen2-VL in Rust (:class:`~smg_grpc_proto.engines.
   VisionModel`), builds the vLLM ``GenerateRequest`` (:mod:`smg_grpc_proto.engines.vllm`) and
   sends it over real gRPC, inline and through shared memory.
3. Prints what the engine decoded — shapes, dtypes, checksums, placeholder ranges, hashes — and
   the toy model's answer, checked against what the request must produce.
4. Times every stage next to the plain-Python path: transformers' Qwen2-VL processor (PIL
   backend) and a naive protobuf encode/decode (``inline = array.tobytes()``, then a copy out
   of ``FromString``), and checks that both paths give the same bytes.
5. Calls every other engine's reference servicer once (health, model info, a short answer).

The plain-Python path needs transformers and Pillow (``make demo`` installs them); without them
it is skipped. :func:`plain_preprocess`, :func:`plain_encode` and :func:`plain_decode` are also
the reference of ``scripts/bench_engines.py``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

import smg_grpc_proto
from smg_grpc_proto import channel, loopback, tensors
from smg_grpc_proto.engines import DecodedBatch, PreparedMedia, VisionModel
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.tensors import Transport
from smg_grpc_proto.testing import ReferenceServer, ToyModel, mm_digest

__all__ = ["bundled_photo", "main", "plain_decode", "plain_encode", "plain_preprocess"]

GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
#: ``<|vision_start|> <|image_pad|> <|vision_end|>`` around one anchor per image, as Qwen2-VL's
#: chat template writes them, inside a short prompt.
VISION_START, IMAGE_PAD, VISION_END = 151652, 151655, 151653


def bundled_photo() -> bytes:
    """The JPEG shipped with the package (``smg_grpc_proto/data/grace_hopper.jpg``)."""
    return resources.files("smg_grpc_proto").joinpath("data/grace_hopper.jpg").read_bytes()


def prompt_for(n_images: int) -> list[int]:
    ids = [151644, 872, 198]  # <|im_start|>user\n
    for _ in range(n_images):
        ids += [VISION_START, IMAGE_PAD, VISION_END]
    return [*ids, 3838, 374, 304, 279, 2168, 30, 151645, 198, 151644, 77091, 198]


# -- the plain-Python path ------------------------------------------------------------------
def plain_preprocess(files: Sequence[bytes]) -> dict[str, npt.NDArray[Any]]:
    """transformers' Qwen2-VL processor (PIL backend) on the decoded files, as a server would
    run it: ``Image.open`` + ``convert("RGB")`` + ``Qwen2VLImageProcessorPil``."""
    from PIL import Image
    from transformers import Qwen2VLImageProcessorPil

    processor = _plain_processor(Qwen2VLImageProcessorPil)
    images = [Image.open(io.BytesIO(data)).convert("RGB") for data in files]
    out = processor(images=images, return_tensors="np")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


@functools.cache
def _plain_processor(cls: type) -> Any:
    return cls()


def plain_encode(
    request_id: str,
    ids: Sequence[int],
    arrays: dict[str, Any],
    metadata: pb.MultimodalInputs | None = None,
) -> bytes:
    """The naive protobuf encode: ``inline = array.tobytes()`` per tensor, then
    ``SerializeToString()`` (two copies of every tensor). ``metadata`` supplies the non-tensor
    fields (placeholders, layout keys, hashes, token id)."""
    request = pb.GenerateRequest(request_id=request_id)
    request.tokenized.input_ids.extend(ids)
    mm = request.mm_inputs
    if metadata is not None:
        mm.CopyFrom(metadata)
        mm.ClearField("pixel_values")
        mm.model_specific_tensors.clear()
    for name, array in arrays.items():
        td = mm.pixel_values if name == "pixel_values" else mm.model_specific_tensors[name]
        td.shape.extend(array.shape)
        td.dtype = str(array.dtype)
        td.inline = np.ascontiguousarray(array).tobytes()
    return request.SerializeToString()


def plain_decode(data: bytes) -> dict[str, npt.NDArray[Any]]:
    """The naive decode: ``FromString`` and a writable copy of each payload (what the 0.14.1
    servicer does with ``bytearray`` + ``torch.frombuffer``)."""
    request = pb.GenerateRequest.FromString(data)
    mm = request.mm_inputs
    items = [("pixel_values", mm.pixel_values), *mm.model_specific_tensors.items()]
    return {
        name: np.frombuffer(bytearray(td.inline), dtype=td.dtype).reshape(tuple(td.shape))
        for name, td in items
    }


# -- timing ---------------------------------------------------------------------------------
def median_ms(fn: Callable[[], Any], repeat: int, min_seconds: float = 0.05) -> float:
    """Median milliseconds of at least ``repeat`` calls of ``fn`` after a warm-up call; a fast
    ``fn`` is called until ``min_seconds`` of calls have passed (at most 500 calls), so that a
    sub-millisecond stage is not left to two samples on a busy machine."""
    fn()  # warm-up: page faults, lazy imports, caches
    times: list[float] = []
    while len(times) < repeat or (sum(times) < min_seconds and len(times) < 500):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def interleaved_ms(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Median milliseconds of each of ``fns``, called in turn (one call of each per round after
    a warm-up round), so that a busy moment on the machine hits every one of them alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def _checksum(array: npt.NDArray[Any]) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


class _Recorder:
    """The servicer's ``on_decoded`` observer: what the engine decoded, per request id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, tuple[tuple[DecodedBatch, ...], float]] = {}

    def __call__(self, request_id: str, decoded: Any, seconds: float) -> None:
        with self.lock:
            self.seen[request_id] = (decoded, seconds)


def _generate(ch: grpc.Channel, request: Any, serializer: Callable[[Any], bytes]) -> list[Any]:
    call = ch.unary_stream(
        GENERATE,
        request_serializer=serializer,
        response_deserializer=pb.GenerateResponse.FromString,
    )
    return list(call(request, timeout=60))


def run(files: Sequence[bytes], *, repeat: int = 5, out: Callable[[str], None] = print) -> int:
    """The demo on ``files`` (encoded images); returns the exit code."""
    info = smg_grpc_proto.build_info()
    if info["flavour"] == "native":
        core = (
            f"native core {info['version']} "
            f"({info['profile']}, cpu: {', '.join(info['cpu_features']) or '-'})"
        )
    else:
        core = "pure-Python wheel (no native core: the demo's preprocessing needs it)"
    out(f"smg-grpc-proto {smg_grpc_proto.__version__}, {core}")
    model = VisionModel.for_family("qwen2_vl")
    prompt = prompt_for(len(files))
    toy = ToyModel(max_length=12)
    recorder = _Recorder()
    timings: list[tuple[str, float, float | None]] = []
    ok = True
    stack = contextlib.ExitStack()
    exporter, puller = _remote_peers(stack, out)
    servicer_kwargs: dict[str, Any] = {"on_decoded": recorder, "puller": puller}
    with stack, ReferenceServer("vllm", model=toy, servicer_kwargs=servicer_kwargs) as server:
        out(f"\nreference vLLM servicer listening on {server.target} (grpc.aio, toy model)")
        with channel.insecure_channel(server.target) as ch:
            t_pre = median_ms(lambda: model.prepare(list(files), threads=1), repeat)
            media = model.prepare(list(files), threads=1)
            t_build = median_ms(lambda: vllm_adapter.generate_request("b", prompt, media), repeat)
            probe = vllm_adapter.generate_request("probe", prompt, media)
            t_encode = median_ms(lambda: tensors.serialize(probe), repeat)
            data = tensors.serialize(probe)
            t_decode = median_ms(
                lambda: vllm_adapter.decode_mm_inputs(
                    tensors.parse(data, pb.GenerateRequest), merge_size=2
                ),
                repeat,
            )
            twin = vllm_adapter.decode_mm_inputs(tensors.parse(data, pb.GenerateRequest))
            expected = toy.generate(list(probe.message.tokenized.input_ids), mm_digest(twin))
            out(
                f"\n{len(files)} photo(s), {sum(map(len, files)) / 1024:.0f} KiB of JPEG -> "
                f"Qwen2-VL request of {len(data) / 2**20:.2f} MiB inline"
            )
            calls: dict[str, Callable[[], Any]] = {}
            transports: tuple[Transport, ...] = ("inline", "shm")
            if exporter is not None:
                transports += ("remote",)
            for transport in transports:
                rid = f"demo-{transport}"
                request = vllm_adapter.generate_request(
                    rid, prompt, media, transport=transport, exporter=exporter
                )
                segments = request.shm_segments
                (response,) = _generate(ch, request, tensors.serialize)
                decoded, seconds = recorder.seen[rid]
                ok &= _report(out, transport, request, media, decoded, seconds, segments)
                answer = list(response.complete.output_ids)
                match = answer == list(expected.token_ids)
                ok &= match
                out(
                    f"  engine answered {len(answer)} tokens {answer[:4]}... "
                    f"finish={response.complete.finish_reason!r}: "
                    f"{'as the request must produce' if match else 'WRONG'}"
                )

                def call(transport: Transport = transport) -> None:
                    # all the work per call, as the plain path does: decode + preprocess,
                    # build, send; the engine decodes and answers
                    fresh = model.prepare(list(files), threads=1)
                    again = vllm_adapter.generate_request(
                        "t", prompt, fresh, transport=transport, exporter=exporter
                    )
                    _generate(ch, again, tensors.serialize)

                calls[transport] = call
            ok &= _llama4(files, ch, recorder, toy, out)
            plain, plain_call = _plain_path(files, prompt, probe, media, ch, repeat, out)
            if plain_call is not None:
                calls["plain"] = plain_call
                (plain_response,) = plain_call()
                plain_answer = list(plain_response.complete.output_ids)
                match = plain_answer == list(expected.token_ids)
                ok &= match
                out(
                    "  plain request over the same gRPC: engine answered "
                    f"{'the same tokens as ours' if match else 'DIFFERENT tokens'}"
                )
            rounds = interleaved_ms(calls, repeat)
        grpc_s, tcp_s = _transport_probe(data, repeat)
    timings += [
        ("preprocess (JPEG -> pixel_values) +", t_pre, plain.get("preprocess")),
        ("build + encode the request +", t_build + t_encode, plain.get("encode")),
        ("engine: wire bytes -> tensors", t_decode, plain.get("decode")),
    ]
    ours_total = t_pre + t_build + t_encode + t_decode
    plain_total = sum(plain[k] for k in ("preprocess", "encode", "decode")) if plain else None
    timings += [
        ("image bytes -> engine tensors", ours_total, plain_total),
        ("image bytes -> engine answer, gRPC inline *", rounds["inline"], rounds.get("plain")),
        ("image bytes -> engine answer, gRPC shm *~", rounds["shm"], rounds.get("plain")),
    ]
    if "remote" in rounds:
        timings.append(
            ("image bytes -> engine answer, NIXL remote *~", rounds["remote"], rounds.get("plain"))
        )
    out(f"\nstage (one thread, median of {repeat}+)                ours    plain Python   speed-up")
    for label, ours, ref in timings:
        ref_text = f"{ref:10.2f} ms" if ref is not None else "            -"
        ratio = f"{ref / ours:8.1f}x" if ref is not None and ours > 0 else ""
        out(f"  {label:<45}{ours:8.2f} ms {ref_text}{ratio}")
    out(
        "  + ours writes pixel_values while encoding, straight into the request bytes; "
        "the plain path in preprocess"
    )
    out(
        "  * every call does all its work: decode + preprocess the JPEG, build and send the "
        "request, the engine decodes it and answers (the toy engine hashes every decoded byte); "
        "both paths talk to the same servicer, so the plain path is not charged its naive "
        "decode, and reuses our placeholders and hashes"
    )
    out(
        "  ~ shared memory has no plain counterpart: compared with the plain inline path. "
        "Each request writes a fresh segment (fallocate + first touch of every page, then the "
        "engine maps it): it skips grpcio's transport of the payload but pays those page faults, "
        "so on loopback it gains less than the transport figure below suggests"
    )
    if "remote" in rounds:
        out(
            "  ~ remote (NIXL) has no plain counterpart either: each request copies "
            "pixel_values into the exporter's registered arena, the engine READs it over UCX "
            "(loopback here; the transport is for engines on other hosts) and notifies the "
            "exporter, which frees the slot"
        )
    size = len(data)
    out(
        f"\nloopback transport of the {size / 2**20:.2f} MiB request, this run (median of "
        f"{3 * repeat}, alternating): grpcio {size / grpc_s / 1e9:.2f} GB/s "
        f"({grpc_s * 1e3:.2f} ms), raw TCP socket {size / tcp_s / 1e9:.2f} GB/s "
        f"({tcp_s * 1e3:.2f} ms)"
        + (
            f": gRPC takes {grpc_s / tcp_s:.1f}x the socket's time (HTTP/2 framing and flow "
            "control, grpcio's copies into Python bytes); inline round trips above pay it, "
            "scripts/bench_grpc.py compares channel options"
            if grpc_s > tcp_s
            else ""
        )
    )
    ok &= _other_engines(out)
    out("\ndemo " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


def _llama4(
    files: Sequence[bytes],
    ch: grpc.Channel,
    recorder: _Recorder,
    toy: ToyModel,
    out: Callable[[str], None],
) -> bool:
    """The same photos as a Llama 4 request: tiles mapped to items, each ``<|image|>`` expanded
    as ``Llama4Processor`` writes it, sent to the same engine; the engine's tiles must be ours."""
    model = VisionModel.for_family("llama4")
    media = model.prepare(list(files), threads=1)
    ids = [200000, 17]  # <|begin_of_text|>, then one <|image|> anchor per photo
    for k in range(media.count):
        ids += [media.anchor, 30 + k]
    request = vllm_adapter.generate_request("demo-llama4", ids, media)
    expanded = list(request.message.tokenized.input_ids)
    (response,) = _generate(ch, request, tensors.serialize)
    (decoded,), _ = recorder.seen["demo-llama4"]
    twin = vllm_adapter.decode_mm_inputs(
        tensors.parse(tensors.serialize(request), pb.GenerateRequest)
    )
    expected = toy.generate(expanded, mm_digest(twin))
    same = all(
        np.array_equal(item.tensors["pixel_values"], media.item_tensors(i)["pixel_values"])
        for i, item in enumerate(decoded.items)
    )
    answer = list(response.complete.output_ids)
    ratios = media.output.aspect_ratios
    tiles = ", ".join(f"{h}x{w}" for h, w in (ratios.tolist() if ratios is not None else []))
    out(
        f"\nLlama 4: {media.count} photo(s) -> tiles {tiles} (+ a global tile each when split), "
        f"pixel_values {list(media.tensors()['pixel_values'].shape)} bfloat16; prompt of "
        f"{len(ids)} ids expanded to {len(expanded)} (<|image_start|> ... <|image_end|>, "
        f"{sum(media.token_counts)} <|patch|> positions)"
    )
    match = answer == list(expected.token_ids)
    out(
        f"  engine decoded {'the same tiles' if same else 'DIFFERENT tiles'} and answered "
        f"{len(answer)} tokens: {'as the request must produce' if match else 'WRONG'}"
    )
    return same and match


def _report(
    out: Callable[[str], None],
    transport: str,
    request: tensors.TensorMessage[pb.GenerateRequest],
    media: PreparedMedia,
    decoded: tuple[DecodedBatch, ...],
    seconds: float,
    segments: list[str],
) -> bool:
    (batch,) = decoded
    mm = request.message.mm_inputs
    out(f"\n[{transport}] the engine decoded in {seconds * 1e3:.2f} ms:")
    ok = True
    for name, array in batch.tensors.items():
        original = media.tensors().get(name)
        if original is None:
            original = np.asarray(media.flat_sizes(), dtype=np.int64)
        same = np.ascontiguousarray(array).tobytes() == np.ascontiguousarray(original).tobytes()
        ok &= same
        out(
            f"  {name:<18} {array.dtype!s:<8} {list(array.shape)!s:<14} {batch.layout[name]:<8}"
            f" sha256 {_checksum(array)} {'= sent' if same else '!= sent'}"
        )
    out(f"  placeholders (offset, length) {list(batch.placeholders)} of token {batch.im_token_id}")
    out(f"  mm_hashes {[h[:16] + '...' for h in mm.mm_hashes]}")
    if transport == "remote":
        handle = mm.pixel_values.remote
        pulled = mm.pixel_values.WhichOneof("payload") == "remote"
        out(
            f"  remote: pixel_values staged as a {handle.transport!r} handle of {handle.nbytes} "
            f"bytes, pulled by the engine with a NIXL READ"
            if pulled
            else "  remote: the exporter refused pixel_values, sent inline (fallback)"
        )
        ok &= pulled
    if transport == "shm":
        left = [s for s in segments if Path(f"/dev/shm/{s}").exists()]
        out(f"  shared memory: {len(segments)} segment(s) written, {len(left)} left after read")
        ok &= not left
    return ok


def _remote_peers(stack: contextlib.ExitStack, out: Callable[[str], None]) -> tuple[Any, Any]:
    """A NIXL exporter (the gateway's side) and puller (the engine's) on loopback, closed with
    ``stack``; ``(None, None)`` where NIXL does not import (the remote row is skipped)."""
    from smg_grpc_proto.remote import RemoteExporter, RemotePuller, nixl_available

    if not nixl_available():
        out('\nremote (NIXL) row skipped: pip install "smg-grpc-proto[nixl]"')
        return None, None
    # loopback only: UCX would otherwise listen on every network device
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    exporter = stack.enter_context(RemoteExporter(slots=4, slot_bytes=16 << 20, ttl=60.0))
    puller = stack.enter_context(RemotePuller(timeout=30.0))
    return exporter, puller


def _plain_path(
    files: Sequence[bytes],
    prompt: list[int],
    probe: tensors.TensorMessage[pb.GenerateRequest],
    media: PreparedMedia,
    ch: grpc.Channel,
    repeat: int,
    out: Callable[[str], None],
) -> tuple[dict[str, float], Callable[[], list[Any]] | None]:
    """The plain path's stage timings, and its whole round trip (image bytes -> the engine's
    answer) as a function to time; ``({}, None)`` without transformers."""
    try:
        import transformers
    except ImportError:
        out("\nplain-Python path skipped: pip install transformers pillow")
        return {}, None
    ids = list(probe.message.tokenized.input_ids)
    t_pre = median_ms(lambda: plain_preprocess(files), repeat)
    arrays = plain_preprocess(files)
    arrays["patches_per_image"] = np.asarray(media.flat_sizes(), dtype=np.int64)
    meta = probe.message.mm_inputs
    t_encode = median_ms(lambda: plain_encode("p", ids, arrays, meta), repeat)
    data = plain_encode("p", ids, arrays, meta)
    t_decode = median_ms(lambda: plain_decode(data), repeat)
    same = all(
        np.ascontiguousarray(arrays[k]).tobytes() == np.ascontiguousarray(v).tobytes()
        for k, v in media.tensors().items()
    )
    out(
        f"\ntransformers {transformers.__version__} (PIL backend) gives "
        f"{'the same bytes' if same else 'DIFFERENT bytes'} as ours for every tensor"
    )
    counts = arrays["patches_per_image"]

    def call() -> list[Any]:
        # all the work per call, as ours does: decode + preprocess, encode, send
        fresh = plain_preprocess(files)
        fresh["patches_per_image"] = counts
        return _generate(ch, plain_encode("p", ids, fresh, meta), lambda b: b)

    return {"preprocess": t_pre, "encode": t_encode, "decode": t_decode}, call


def _transport_probe(data: bytes, repeat: int) -> tuple[float, float]:
    """Median seconds of one round trip of ``data`` through grpcio (the shipped channel and
    server options) and through a raw loopback TCP socket, the two alternating call by call
    (``3 * repeat`` each: a round trip takes milliseconds)."""
    with loopback.GrpcSink() as sink, loopback.TcpSink(len(data)) as sock:
        ms = interleaved_ms(
            {"grpc": lambda: sink.send(data), "tcp": lambda: sock.send(data)}, 3 * repeat
        )
    return ms["grpc"] / 1e3, ms["tcp"] / 1e3


def _other_engines(out: Callable[[str], None]) -> bool:
    from smg_grpc_proto.engines import mlx, sglang, tokenspeed, trtllm
    from smg_grpc_proto.generated import (
        mlx_engine_pb2,
        sglang_scheduler_pb2,
        tokenspeed_scheduler_pb2,
        trtllm_service_pb2,
    )

    out("\nthe other engines' reference servicers, a short answer each:")
    cases: list[tuple[str, str, Any, Any]] = [
        (
            "sglang",
            "SglangScheduler",
            sglang.generate_request("s", [1, 2, 3]),
            sglang_scheduler_pb2,
        ),
        (
            "tokenspeed",
            "TokenSpeedScheduler",
            tokenspeed.generate_request("t", [1, 2, 3]),
            tokenspeed_scheduler_pb2,
        ),
        (
            "trtllm",
            "TrtllmService",
            trtllm.generate_request("r", [1, 2, 3], max_tokens=6),
            trtllm_service_pb2,
        ),
        ("mlx", "MlxEngine", mlx.generate_request("m", [1, 2, 3]), mlx_engine_pb2),
    ]
    ok = True
    for engine, service, request, module in cases:
        with ReferenceServer(engine) as server, channel.insecure_channel(server.target) as ch:
            health = ch.unary_unary(
                f"/{module.DESCRIPTOR.package}.{service}/HealthCheck",
                request_serializer=module.HealthCheckRequest.SerializeToString,
                response_deserializer=module.HealthCheckResponse.FromString,
            )(module.HealthCheckRequest(), timeout=10)
            call = ch.unary_stream(
                f"/{module.DESCRIPTOR.package}.{service}/Generate",
                request_serializer=tensors.serialize,
                response_deserializer=module.GenerateResponse.FromString,
            )
            responses = list(call(request, timeout=30))
            final = responses[-1].complete
            tokens = list(getattr(final, "output_ids", None) or final.output_token_ids)
            # TensorRT-LLM answers a status string, the others a healthy flag
            healthy = health.status == "OK" if engine == "trtllm" else health.healthy
            ok &= healthy and bool(tokens)
            out(
                f"  {engine:<11} {server.target:<16} healthy={healthy} "
                f"answer={tokens[:4]}... finish={final.finish_reason!r}"
            )
    return ok


def main(images: Sequence[str | Path] = (), *, repeat: int = 5) -> int:
    files = [Path(p).read_bytes() for p in images] or [bundled_photo()]
    return run(files, repeat=repeat)
