# expect: arg-type Argument 1 to "WhichOneof" of "GenerateResponse" has incompatible type "Literal['respnse']"
"""A typo in the oneof group name passed to WhichOneof."""

from smg_grpc_proto import vllm_engine_pb2


def kind(response: vllm_engine_pb2.GenerateResponse) -> str | None:
    return response.WhichOneof("respnse")  # <-- error
