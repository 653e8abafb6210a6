"""smg-grpc-proto: the gRPC contract between LLM gateways and inference engines.

Drop-in for the published ``smg-grpc-proto`` 0.4.x: every generated stub module is reachable both
as ``smg_grpc_proto.<module>`` and ``smg_grpc_proto.generated.<module>``, e.g.::

    from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc

Stub modules are imported lazily (PEP 562): importing one engine's stubs loads no other engine's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from smg_grpc_proto._version import __version__
from smg_grpc_proto.build import BuildInfo, build_info
from smg_grpc_proto.generated import MODULES as _STUB_MODULES

if TYPE_CHECKING:
    from smg_grpc_proto.generated import common_pb2 as common_pb2
    from smg_grpc_proto.generated import common_pb2_grpc as common_pb2_grpc
    from smg_grpc_proto.generated import mlx_engine_pb2 as mlx_engine_pb2
    from smg_grpc_proto.generated import mlx_engine_pb2_grpc as mlx_engine_pb2_grpc
    from smg_grpc_proto.generated import sglang_encoder_pb2 as sglang_encoder_pb2
    from smg_grpc_proto.generated import sglang_encoder_pb2_grpc as sglang_encoder_pb2_grpc
    from smg_grpc_proto.generated import sglang_scheduler_pb2 as sglang_scheduler_pb2
    from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sglang_scheduler_pb2_grpc
    from smg_grpc_proto.generated import tokenspeed_encoder_pb2 as tokenspeed_encoder_pb2
    from smg_grpc_proto.generated import tokenspeed_encoder_pb2_grpc as tokenspeed_encoder_pb2_grpc
    from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as tokenspeed_scheduler_pb2
    from smg_grpc_proto.generated import (
        tokenspeed_scheduler_pb2_grpc as tokenspeed_scheduler_pb2_grpc,
    )
    from smg_grpc_proto.generated import trtllm_service_pb2 as trtllm_service_pb2
    from smg_grpc_proto.generated import trtllm_service_pb2_grpc as trtllm_service_pb2_grpc
    from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_engine_pb2
    from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vllm_engine_pb2_grpc

__all__ = [
    "BuildInfo",
    "__version__",
    "build_info",
    "common_pb2",
    "common_pb2_grpc",
    "mlx_engine_pb2",
    "mlx_engine_pb2_grpc",
    "sglang_encoder_pb2",
    "sglang_encoder_pb2_grpc",
    "sglang_scheduler_pb2",
    "sglang_scheduler_pb2_grpc",
    "tokenspeed_encoder_pb2",
    "tokenspeed_encoder_pb2_grpc",
    "tokenspeed_scheduler_pb2",
    "tokenspeed_scheduler_pb2_grpc",
    "trtllm_service_pb2",
    "trtllm_service_pb2_grpc",
    "vllm_engine_pb2",
    "vllm_engine_pb2_grpc",
]

_LAZY = frozenset(_STUB_MODULES)


if not TYPE_CHECKING:
    # Hidden from type checkers: with a visible `__getattr__ -> Any`, mypy would accept any
    # misspelled module name; the TYPE_CHECKING imports above declare the real ones.
    def __getattr__(name: str) -> Any:
        if name in _LAZY:
            module = importlib.import_module(f"smg_grpc_proto.generated.{name}")
            globals()[name] = module
            return module
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
