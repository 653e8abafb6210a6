"""Protobuf and gRPC stubs generated from ``protos/`` by ``scripts/gen_stubs.py``.

Do not edit: every file in this folder is rewritten by the generator.
"""

PROTO_FILES: tuple[str, ...] = ('common.proto', 'mlx_engine.proto', 'sglang_encoder.proto', 'sglang_scheduler.proto', 'tokenspeed_encoder.proto', 'tokenspeed_scheduler.proto', 'trtllm_service.proto', 'vllm_engine.proto')
"""The ``.proto`` files these stubs were generated from (descriptor file names)."""

MODULES: tuple[str, ...] = ('common_pb2', 'common_pb2_grpc', 'mlx_engine_pb2', 'mlx_engine_pb2_grpc', 'sglang_encoder_pb2', 'sglang_encoder_pb2_grpc', 'sglang_scheduler_pb2', 'sglang_scheduler_pb2_grpc', 'tokenspeed_encoder_pb2', 'tokenspeed_encoder_pb2_grpc', 'tokenspeed_scheduler_pb2', 'tokenspeed_scheduler_pb2_grpc', 'trtllm_service_pb2', 'trtllm_service_pb2_grpc', 'vllm_engine_pb2', 'vllm_engine_pb2_grpc')
"""Every importable stub module in this folder."""
