# expect: call-arg Unexpected keyword argument "max_token" for "SamplingParams"
"""The `smg_grpc_proto.generated.<module>` import path is typed too: a misspelled field keyword."""

from smg_grpc_proto.generated import vllm_engine_pb2

params = vllm_engine_pb2.SamplingParams(max_token=16)  # <-- error
