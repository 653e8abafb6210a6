# expect: arg-type Argument 1 to "HasField" of "SamplingParams" has incompatible type "Literal['top_p']"
"""HasField on a plain proto3 scalar (no presence tracking) raises ValueError at runtime."""

from smg_grpc_proto import vllm_engine_pb2


def has_top_p(params: vllm_engine_pb2.SamplingParams) -> bool:
    return params.HasField("top_p")  # <-- error
