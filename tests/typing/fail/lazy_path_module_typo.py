# expect: attr-defined Module "smg_grpc_proto" has no attribute "vllm_engnie_pb2"
"""A misspelled stub module name on the lazy top-level path should not silently become Any."""

from smg_grpc_proto import vllm_engnie_pb2  # <-- error

request = vllm_engnie_pb2.GenerateRequest()
