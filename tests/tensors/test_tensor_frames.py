"""The whole-request fast path: TensorMessage, serialize, deserializer — and its fuzzing."""

from __future__ import annotations

import asyncio
import random
from concurrent import futures

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.populate import populate

from smg_grpc_proto import (
    sglang_scheduler_pb2,
    tensors,
    tokenspeed_scheduler_pb2,
    vllm_engine_pb2,
)
from smg_grpc_proto.errors import SmgProtoError, TensorError
from smg_grpc_proto.tensors import _fallback


def native():
    from smg_grpc_proto import _native

    return _native


def vllm_request():
    tm = tensors.TensorMessage(vllm_engine_pb2.GenerateRequest(request_id="r-1"))
    tm.message.tokenized.input_ids.extend([1, 2, 3])
    pixels = np.random.default_rng(0).standard_normal((64, 1176)).astype(np.float32)
    grid = np.array([[1, 8, 8]], dtype=np.int64)
    tm.attach("mm_inputs.pixel_values", pixels)
    tm.attach("mm_inputs.model_specific_tensors[image_grid_thw]", grid)
    tm.message.mm_inputs.mm_hashes.append("abc")
    tm.message.extra_mm_inputs.add().mm_hashes.append("v")
    tm.attach("extra_mm_inputs[0].pixel_values", pixels[:4], dtype="bfloat16")
    return tm, pixels, grid


def test_serialized_bytes_parse_with_plain_stubs():
    tm, pixels, grid = vllm_request()
    data = tensors.serialize(tm)
    plain = vllm_engine_pb2.GenerateRequest.FromString(data)
    assert tensors.unpack(plain.mm_inputs.pixel_values).tolist() == pixels.tolist()
    assert tensors.unpack(plain.mm_inputs.model_specific_tensors["image_grid_thw"]).tolist() == (
        grid.tolist()
    )
    assert plain.extra_mm_inputs[0].pixel_values.dtype == "bfloat16"
    assert plain.mm_inputs.mm_hashes == ["abc"]
    assert list(plain.tokenized.input_ids) == [1, 2, 3]
    # Identical to what plain protobuf produces for the same content.
    assert plain.SerializeToString() == data
    assert tm.to_message() == plain


def test_deserializer_reads_plain_bytes_without_copying():
    tm, pixels, grid = vllm_request()
    plain_bytes = tm.to_message().SerializeToString()
    got = tensors.deserializer(vllm_engine_pb2.GenerateRequest)(plain_bytes)
    assert set(got) == {
        "mm_inputs.pixel_values",
        "mm_inputs.model_specific_tensors[image_grid_thw]",
        "extra_mm_inputs[0].pixel_values",
    }
    view = got["mm_inputs.pixel_values"]
    assert view.tolist() == pixels.tolist()
    assert not view.flags.writeable
    assert not view.flags.owndata
    # The view points into the received buffer itself: zero copies.
    base = view
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    assert base is plain_bytes
    assert got["mm_inputs.model_specific_tensors[image_grid_thw]"].tolist() == grid.tolist()
    assert got.message.request_id == "r-1"
    assert got.message.mm_inputs.mm_hashes == ["abc"]
    assert got.to_message() == tm.to_message()


def test_tokenspeed_and_sglang_layouts():
    ts = tensors.TensorMessage(tokenspeed_scheduler_pb2.GenerateRequest(request_id="t"))
    ts.message.mm_inputs.items.add(modality=1).placeholders.add(offset=3, length=4)
    enc = np.arange(12, dtype=np.float32).reshape(3, 4)
    ts.attach("mm_inputs.items[0].encoder_input", enc, dtype="bfloat16")
    data = tensors.serialize(ts)
    plain = tokenspeed_scheduler_pb2.GenerateRequest.FromString(data)
    assert plain.mm_inputs.items[0].encoder_input.dtype == "bfloat16"
    back = tensors.parse(data, tokenspeed_scheduler_pb2.GenerateRequest, bf16="float32")
    assert back["mm_inputs.items[0].encoder_input"].tolist() == enc.tolist()

    sg = tensors.TensorMessage(sglang_scheduler_pb2.GenerateRequest(request_id="s"))
    sg.attach("mm_inputs.pixel_values", enc)
    plain = sglang_scheduler_pb2.GenerateRequest.FromString(tensors.serialize(sg))
    assert tensors.unpack(plain.mm_inputs.pixel_values).tolist() == enc.tolist()


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("mm_inputs.nothing", "'nothing' is not a message field"),
        ("request_id", "'request_id' is not a message field"),
        ("mm_inputs", "names a vllm.grpc.engine.MultimodalInputs, not a TensorData"),
        ("extra_mm_inputs[5].pixel_values", "has 0 elements, no \\[5\\]"),
        ("mm_inputs.model_specific_tensors", "needs \\[key\\]"),
        ("extra_mm_inputs[x].pixel_values", "indexed by integers, not \\[x\\]"),
        ("mm_inputs[0].pixel_values", "mm_inputs is a single message, not a list"),
        ("mm_inputs.pixel_values.shape", "'shape' is not a message field"),
        ("mm_inputs.flat_keys[a]", "the values of map field 'flat_keys' are not messages"),
        ("sampling_params.logit_bias[x]", "'logit_bias' has integer keys, not \\[x\\]"),
    ],
)
def test_bad_paths(path, match):
    tm = tensors.TensorMessage(vllm_engine_pb2.GenerateRequest())
    with pytest.raises(TensorError, match=match):
        tm.attach(path, np.zeros(2, np.float32))


def test_length_mismatch_in_frames_is_an_error():
    msg = vllm_engine_pb2.GenerateRequest()
    msg.mm_inputs.pixel_values.shape.extend([3])
    msg.mm_inputs.pixel_values.dtype = "float32"
    msg.mm_inputs.pixel_values.inline = b"\0" * 11
    with pytest.raises(TensorError, match="11 bytes, but shape \\[3\\] of float32 needs 12"):
        tensors.parse(msg.SerializeToString(), vllm_engine_pb2.GenerateRequest)


# ---------------------------------------------------------------- property tests
def random_request(rng: random.Random):
    """A vLLM request with populated non-tensor fields and random tensors in random places."""
    msg = populate(vllm_engine_pb2.GenerateRequest(), rng.randrange(3), max_depth=2)
    msg.ClearField("extra_mm_inputs")
    msg.mm_inputs.ClearField("pixel_values")
    msg.mm_inputs.ClearField("model_specific_tensors")
    tm = tensors.TensorMessage(msg)
    arrays = {}
    n_extra = rng.randrange(3)
    for _ in range(n_extra):
        msg.extra_mm_inputs.add().mm_hashes.append("h")
    paths = [
        "mm_inputs.pixel_values",
        "mm_inputs.model_specific_tensors[a]",
        "mm_inputs.model_specific_tensors[b]",
    ] + [f"extra_mm_inputs[{i}].pixel_values" for i in range(n_extra)]
    for path in rng.sample(paths, rng.randrange(1, len(paths) + 1)):
        shape = tuple(rng.randrange(0, 5) for _ in range(rng.randrange(0, 4)))
        dtype = rng.choice(["<f4", ">f4", "<i8", "<u4", "|u1", "<f2"])
        array = np.random.default_rng(rng.randrange(2**32)).integers(0, 100, shape).astype(dtype)
        wire = "bfloat16" if dtype.endswith("f4") and rng.random() < 0.3 else None
        tm.attach(path, array, dtype=wire)
        arrays[path] = (array, wire)
    return tm, arrays


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_fast_path_round_trips_and_agrees_with_plain_protobuf(seed):
    tm, arrays = random_request(random.Random(seed))
    data = tensors.serialize(tm)
    plain = vllm_engine_pb2.GenerateRequest.FromString(data)
    assert plain == tm.to_message()
    got = tensors.parse(data, vllm_engine_pb2.GenerateRequest, bf16="float32")
    reparsed = tensors.parse(
        plain.SerializeToString(), vllm_engine_pb2.GenerateRequest, bf16="float32"
    )
    for path, (array, wire) in arrays.items():
        expected = array.astype(array.dtype.newbyteorder("<"))
        if wire == "bfloat16":
            expected = tensors.unpack(
                tensors.pack(array, vllm_engine_pb2.TensorData, dtype=wire), bf16="float32"
            )
        assert got[path].tolist() == expected.tolist(), path
        assert reparsed[path].tobytes() == got[path].tobytes()
    assert got.to_message() == plain


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_native_and_fallback_frames_are_byte_identical(seed):
    tm, _ = random_request(random.Random(seed))
    header = tm.message.SerializeToString()
    plan = tensors.plan_for(vllm_engine_pb2.GenerateRequest.DESCRIPTOR)
    ours = native().encode_frames(header, plan, tm._nonce, tm._sources)
    theirs = _fallback.encode_frames(header, plan, tm._nonce, tm._sources)
    assert ours == theirs
    nonce = bytes(range(16))
    n_header, n_spans = native().decode_frames(ours, plan, nonce)
    f_header, f_spans = _fallback.decode_frames(ours, plan, nonce)
    assert n_header == f_header
    assert [tuple(s) for s in n_spans] == [tuple(s) for s in f_spans]


# ---------------------------------------------------------------- fuzzing
DOCUMENTED = (SmgProtoError,)  # TensorError, ShmError, TransportNotImplementedError, ...


def mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(5)
        if op == 0 and buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op == 1 and buf:
            del buf[rng.randrange(len(buf)) :]
        elif op == 2:
            pos = rng.randrange(len(buf) + 1)
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
        elif op == 3 and len(buf) > 2:
            a = rng.randrange(len(buf))
            del buf[a : a + rng.randrange(1, 8)]
        elif buf:
            pos = rng.randrange(len(buf))
            buf[pos] ^= 1 << rng.randrange(8)
    return bytes(buf)


def seeds():
    tm, _, _ = vllm_request()
    small = tensors.TensorMessage(vllm_engine_pb2.GenerateRequest(request_id="s"))
    small.attach("mm_inputs.pixel_values", np.arange(6, dtype=np.float32).reshape(2, 3))
    small.attach("mm_inputs.model_specific_tensors[g]", np.arange(3, dtype=np.int64))
    shm_msg = vllm_engine_pb2.GenerateRequest()
    shm_msg.mm_inputs.pixel_values.CopyFrom(
        vllm_engine_pb2.TensorData(shape=[4], dtype="uint8", shm={"name": "nope", "nbytes": 4})
    )
    return [tensors.serialize(small), shm_msg.SerializeToString(), tensors.serialize(tm)[:2000]]


@pytest.mark.slow
def test_fuzz_unpack_and_deserializer_raise_only_documented_errors(tmp_path):
    rng = random.Random(1234)
    corpus = seeds()
    deserialize = tensors.deserializer(vllm_engine_pb2.GenerateRequest)
    td_seeds = [
        vllm_engine_pb2.GenerateRequest.FromString(s).mm_inputs.pixel_values.SerializeToString()
        for s in corpus[:2]
    ]
    counts = {"ok": 0, "error": 0, "decode": 0}
    for i in range(100_000):
        if i % 2:
            data = mutate(rng.choice(td_seeds), rng)
            try:
                td = vllm_engine_pb2.TensorData.FromString(data)
            except Exception:  # the protobuf parser rejects it before we see it
                counts["decode"] += 1
                continue
            try:
                tensors.unpack(td, shm_dir=tmp_path)
                counts["ok"] += 1
            except DOCUMENTED:
                counts["error"] += 1
        else:
            data = mutate(rng.choice(corpus), rng)
            try:
                deserialize(data)
                counts["ok"] += 1
            except DOCUMENTED:
                counts["error"] += 1
    assert sum(counts.values()) == 100_000
    assert counts["ok"] > 1000
    assert counts["error"] > 1000


# ---------------------------------------------------------------- grpc, sync and aio
def _handlers():
    def generate(request, context):
        pixels = request["mm_inputs.pixel_values"]
        reply = vllm_engine_pb2.GenerateResponse()
        reply.chunk.token_ids.extend([int(pixels.shape[0]), int(pixels.shape[1])])
        reply.chunk.prompt_tokens = int(np.count_nonzero(pixels))  # reads every byte
        yield reply

    method = grpc.unary_stream_rpc_method_handler(
        generate,
        request_deserializer=tensors.deserializer(vllm_engine_pb2.GenerateRequest),
        response_serializer=tensors.serialize,
    )
    return grpc.method_handlers_generic_handler("vllm.grpc.engine.VllmEngine", {"Generate": method})


def test_grpc_sync_round_trip_over_loopback():
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        options=[("grpc.max_receive_message_length", 64 << 20)],
    )
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream(
                "/vllm.grpc.engine.VllmEngine/Generate",
                request_serializer=tensors.serialize,
                response_deserializer=vllm_engine_pb2.GenerateResponse.FromString,
            )
            tm, pixels, _ = vllm_request()
            replies = list(call(tm, timeout=10))
            # plain stubs' messages go through the same serializer
            plain = list(call(tm.to_message(), timeout=10))
    finally:
        server.stop(None)
    assert [list(r.chunk.token_ids) for r in replies] == [list(pixels.shape)]
    assert [list(r.chunk.token_ids) for r in plain] == [list(pixels.shape)]


def test_grpc_aio_round_trip_over_loopback():
    async def main():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handlers(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_stream(
                    "/vllm.grpc.engine.VllmEngine/Generate",
                    request_serializer=tensors.serialize,
                    response_deserializer=tensors.deserializer(vllm_engine_pb2.GenerateResponse),
                )
                tm, pixels, _ = vllm_request()
                return [r async for r in call(tm, timeout=10)], pixels
        finally:
            await server.stop(None)

    replies, pixels = asyncio.run(main())
    assert [list(r.message.chunk.token_ids) for r in replies] == [list(pixels.shape)]


# -- attach through shared memory ------------------------------------------------------------
def test_attach_shm_round_trip_and_discard(tmp_path) -> None:
    import os

    pixels = np.arange(6 * 1176, dtype=np.float32).reshape(6, 1176)
    grid = np.array([[1, 2, 3]], dtype=np.int64)
    request = tensors.TensorMessage(vllm_engine_pb2.GenerateRequest(request_id="r"))
    request.attach("mm_inputs.pixel_values", pixels, transport="shm", shm_dir=tmp_path)
    request.attach("mm_inputs.model_specific_tensors[g]", grid, transport="auto", shm_dir=tmp_path)
    (name,) = request.shm_segments  # the small grid stays inline under "auto"
    assert os.stat(tmp_path / name).st_mode & 0o777 == 0o600
    td = request.message.mm_inputs.pixel_values
    assert td.WhichOneof("payload") == "shm"
    received = tensors.parse(tensors.serialize(request), vllm_engine_pb2.GenerateRequest)
    grid_back = received["mm_inputs.model_specific_tensors[g]"]
    assert grid_back.tobytes() == grid.tobytes()
    back = tensors.unpack(received.message.mm_inputs.pixel_values, shm_dir=tmp_path, unlink=False)
    assert back.tobytes() == pixels.tobytes()
    assert request.discard_shm() == 1  # never consumed: the sender removes it
    assert not (tmp_path / name).exists()
    assert request.discard_shm() == 0
    big = tensors.TensorMessage(vllm_engine_pb2.GenerateRequest())
    big.attach(
        "mm_inputs.pixel_values", pixels, transport="auto", shm_min_bytes=1, shm_dir=tmp_path
    )
    assert len(big.shm_segments) == 1
    big.discard_shm()


def test_attach_shm_refused_where_the_layout_has_no_handle() -> None:
    request = tensors.TensorMessage(sglang_scheduler_pb2.GenerateRequest())
    with pytest.raises(TensorError, match="has no shared-memory handle"):
        request.attach("mm_inputs.pixel_values", np.zeros(4, np.float32), transport="shm")
    with pytest.raises(TensorError, match="transport must be"):
        request.attach("mm_inputs.pixel_values", np.zeros(4, np.float32), transport="x")  # type: ignore[arg-type]
