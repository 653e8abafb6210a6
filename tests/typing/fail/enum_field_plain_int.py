# expect: arg-type Argument "modality" to "MediaRef" has incompatible type "int"; expected "ValueType"
"""Enum fields take the enum's ValueType (e.g. common_pb2.IMAGE), not a bare int."""

from smg_grpc_proto import vllm_engine_pb2

ref = vllm_engine_pb2.MediaRef(modality=1, url="https://example.invalid/cat.png")  # <-- error
