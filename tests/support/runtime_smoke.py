"""Smoke test run inside the runtime-matrix virtual environments (see test_runtime_matrix.py).

Imports every stub module of the installed wheel with warnings as errors, round-trips a populated
instance of every message (every oneof member at least once), serves and calls a real gRPC service
on loopback, and prints a JSON summary including a digest of all serialized bytes, so that the
caller can prove every runtime produced the very same wire bytes.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import warnings
from concurrent import futures

warnings.simplefilter("error")

import grpc  # noqa: E402
from google.protobuf import __version__ as protobuf_version  # noqa: E402
from google.protobuf import message_factory  # noqa: E402
from google.protobuf.internal import api_implementation  # noqa: E402
from populate import all_messages, oneof_width, populate  # noqa: E402

import smg_grpc_proto  # noqa: E402
from smg_grpc_proto import generated  # noqa: E402


def roundtrip_all() -> tuple[int, int, str]:
    digest = hashlib.sha256()
    n_messages = n_roundtrips = 0
    for name in generated.MODULES:
        module = importlib.import_module(f"smg_grpc_proto.generated.{name}")
        assert getattr(smg_grpc_proto, name) is module
        if not name.endswith("_pb2"):
            continue
        for desc in all_messages(module):
            cls = message_factory.GetMessageClass(desc)
            n_messages += 1
            for variant in range(oneof_width(desc)):
                msg = populate(cls(), variant)
                data = msg.SerializeToString(deterministic=True)
                back = cls.FromString(data)
                assert back == msg, desc.full_name
                assert back.SerializeToString(deterministic=True) == data, desc.full_name
                digest.update(desc.full_name.encode() + b"\0" + data)
                n_roundtrips += 1
    return n_messages, n_roundtrips, digest.hexdigest()


def loopback_call() -> str:
    from smg_grpc_proto import vllm_engine_pb2 as pb
    from smg_grpc_proto import vllm_engine_pb2_grpc as pb_grpc

    class Engine(pb_grpc.VllmEngineServicer):
        def HealthCheck(self, request, context):
            return pb.HealthCheckResponse(healthy=True, message="ok")

        def Generate(self, request, context):
            for i, token in enumerate(request.tokenized.input_ids):
                yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[token + i]))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_VllmEngineServicer_to_server(Engine(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.VllmEngineStub(channel)
            health = stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)
            assert health.healthy
            assert health.message == "ok"
            request = pb.GenerateRequest(
                request_id="r1", tokenized=pb.TokenizedInput(input_ids=[10, 20, 30])
            )
            got = [r.chunk.token_ids[0] for r in stub.Generate(request, timeout=10)]
            assert got == [10, 21, 32], got
    finally:
        server.stop(None)
    return "ok"


def tensors_round_trip() -> str:
    """The tensor API on this runtime: pack/unpack and the one-copy frame codec."""
    import numpy as np

    from smg_grpc_proto import tensors, vllm_engine_pb2

    array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    td = vllm_engine_pb2.TensorData.FromString(
        tensors.pack(array, vllm_engine_pb2.TensorData).SerializeToString()
    )
    assert tensors.unpack(td).tolist() == array.tolist()
    request = tensors.TensorMessage(vllm_engine_pb2.GenerateRequest(request_id="t"))
    request.attach("mm_inputs.pixel_values", array, dtype="bfloat16")
    data = tensors.serialize(request)
    plain = vllm_engine_pb2.GenerateRequest.FromString(data)
    back = tensors.parse(data, vllm_engine_pb2.GenerateRequest, bf16="float32")
    assert back["mm_inputs.pixel_values"].tolist() == array.tolist()
    assert plain.mm_inputs.pixel_values.dtype == "bfloat16"
    return tensors.backend


def main() -> None:
    expected_impl = sys.argv[1]
    actual = api_implementation.Type()
    assert actual == expected_impl, f"protobuf implementation {actual}, expected {expected_impl}"
    n_messages, n_roundtrips, digest = roundtrip_all()
    summary = {
        "protobuf": protobuf_version,
        "grpcio": grpc.__version__,
        "implementation": actual,
        "messages": n_messages,
        "roundtrips": n_roundtrips,
        "digest": digest,
        "loopback": loopback_call(),
        "tensors": tensors_round_trip(),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
