# expect: arg-type Argument 1 to "append" of "RepeatedScalarFieldContainer" has incompatible type "str"; expected "int"
"""Appending a str to a `repeated uint32` field."""

from smg_grpc_proto import vllm_engine_pb2

tokenized = vllm_engine_pb2.TokenizedInput()
tokenized.input_ids.append("17")  # <-- error
