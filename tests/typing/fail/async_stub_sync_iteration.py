# expect: attr-defined "UnaryStreamCall[GenerateRequest, GenerateResponse]" has no attribute "__iter__"
"""The grpc.aio stub's streaming call must be consumed with `async for`, not `for`."""

from grpc import aio

from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc


async def call(channel: aio.Channel) -> None:
    stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
    for _ in stub.Generate(vllm_engine_pb2.GenerateRequest()):  # <-- error
        pass
