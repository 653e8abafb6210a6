# expect: override Argument 1 of "HealthCheck" is incompatible with supertype
"""A servicer method whose request parameter does not accept the RPC's request message."""

import grpc

from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc


class Servicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    def HealthCheck(
        self,
        request: int,  # <-- error
        context: grpc.ServicerContext,
    ) -> vllm_engine_pb2.HealthCheckResponse:
        return vllm_engine_pb2.HealthCheckResponse(healthy=True)
