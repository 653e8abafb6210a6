# expect: assignment Incompatible types in assignment (expression has type "str", variable has type "int")
"""Assigning a str to a uint32 field."""

from smg_grpc_proto import vllm_engine_pb2

params = vllm_engine_pb2.SamplingParams()
params.top_k = "40"  # <-- error
