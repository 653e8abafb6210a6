# expect: attr-defined Module has no attribute "NoSuchMessage"
"""The lazy top-level attribute `smg_grpc_proto.vllm_engine_pb2` is the typed module, not Any."""

import smg_grpc_proto

message = smg_grpc_proto.vllm_engine_pb2.NoSuchMessage()  # <-- error
