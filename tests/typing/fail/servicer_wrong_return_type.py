# expect: override Return type "AbortResponse" of "HealthCheck" incompatible with return type
"""A servicer method declared to return another RPC's response message."""

import grpc

from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc


class Servicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    def HealthCheck(  # <-- error
        self,
        request: vllm_engine_pb2.HealthCheckRequest,
        context: grpc.ServicerContext,
    ) -> vllm_engine_pb2.AbortResponse:
        return vllm_engine_pb2.AbortResponse()
