# expect: attr-defined "GenerateStreamChunk" has no attribute "tokens"
"""Reading a field that the message does not have (it is `token_ids`)."""

from smg_grpc_proto import vllm_engine_pb2


def tokens(response: vllm_engine_pb2.GenerateResponse) -> list[int]:
    return list(response.chunk.tokens)  # <-- error
