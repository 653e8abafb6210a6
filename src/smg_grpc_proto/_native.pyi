"""Type stub of the private Rust extension; checked against the binary by mypy stubtest."""

from smg_grpc_proto.build import BuildInfo

__all__ = ["__version__", "build_info"]
__version__: str

def build_info() -> BuildInfo: ...
