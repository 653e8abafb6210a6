# expect: comparison-overlap Non-overlapping equality check
"""WhichOneof returns a Literal of the member names: comparing it to a misspelled member is caught."""

from smg_grpc_proto import vllm_engine_pb2


def is_chunk(response: vllm_engine_pb2.GenerateResponse) -> bool:
    return response.WhichOneof("response") == "chunck"  # <-- error
