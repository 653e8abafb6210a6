# expect: arg-type Argument 1 to "__call__" of "UnaryStreamMultiCallable" has incompatible type "HealthCheckRequest"; expected "GenerateRequest"
"""Calling a stub method with another RPC's request message."""

import grpc

from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc


def call(channel: grpc.Channel) -> None:
    stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
    for _ in stub.Generate(vllm_engine_pb2.HealthCheckRequest()):  # <-- error
        pass
