# expect: return-value Incompatible return value type (got "AbortResponse", expected "HealthCheckResponse")
"""A correctly declared servicer method whose body returns the wrong message."""

import grpc

from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc


class Servicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    def HealthCheck(
        self,
        request: vllm_engine_pb2.HealthCheckRequest,
        context: grpc.ServicerContext,
    ) -> vllm_engine_pb2.HealthCheckResponse:
        return vllm_engine_pb2.AbortResponse()  # <-- error
