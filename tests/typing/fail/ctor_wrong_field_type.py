# expect: arg-type Argument "request_id" to "GenerateRequest" has incompatible type "int"; expected "str"
"""A constructor keyword with a value of the wrong type."""

from smg_grpc_proto import vllm_engine_pb2

request = vllm_engine_pb2.GenerateRequest(request_id=5)  # <-- error
