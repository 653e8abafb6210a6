# expect: override Return type "GenerateResponse" of "Generate" incompatible with return type
"""A server-streaming servicer method that returns a single message instead of an iterator."""

import grpc

from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc


class Servicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    def Generate(  # <-- error
        self,
        request: vllm_engine_pb2.GenerateRequest,
        context: grpc.ServicerContext,
    ) -> vllm_engine_pb2.GenerateResponse:
        return vllm_engine_pb2.GenerateResponse()
