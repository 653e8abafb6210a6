"""What the native core was built with: attach ``build_info()`` to bug reports."""

from __future__ import annotations

from typing import TypedDict


class BuildInfo(TypedDict):
    """Facts about the compiled ``smg_grpc_proto._native`` extension."""

    version: str
    """Crate version; always equals ``smg_grpc_proto.__version__`` in a consistent install."""
    profile: str
    """Cargo profile: ``"release"`` in wheels, ``"debug"`` in ``maturin develop`` builds."""
    target: str
    """Target triple the extension was compiled for, e.g. ``x86_64-unknown-linux-gnu``."""
    rustc: str
    """``rustc --version`` of the compiler that built it."""
    cpu_features: list[str]
    """SIMD features of the running CPU (detected at call time), e.g. ``["sse4.1", "avx2"]``."""


def build_info() -> BuildInfo:
    """Return the native module's build facts (imports the extension on first call)."""
    from smg_grpc_proto import _native

    return _native.build_info()
