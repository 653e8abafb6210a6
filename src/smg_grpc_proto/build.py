"""Which flavour is installed and what its native core was built with: attach ``build_info()``
to bug reports."""

from __future__ import annotations

from typing import Literal, TypedDict

from smg_grpc_proto._version import __version__


class NativeBuildInfo(TypedDict):
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


class BuildInfo(NativeBuildInfo):
    """The installed flavour, and its native core's build facts."""

    flavour: Literal["native", "pure"]
    """``"native"``: the wheel with the compiled core (vision, image decoding, Rust tensor
    kernels). ``"pure"``: the pure-Python wheel (``py3-none-any``), with no native core: the
    other fields are then ``version`` and empty values, the tensors use the numpy kernels and
    vision calls raise :class:`~smg_grpc_proto.errors.NativeCoreUnavailableError`."""


def build_info() -> BuildInfo:
    """Return the installed flavour and the native module's build facts (imports the extension
    on first call). Raises :class:`~smg_grpc_proto.errors.NativeCoreUnavailableError` when the
    extension is installed but fails to load (the message says why)."""
    from smg_grpc_proto import _core

    if _core.AVAILABLE:
        info = _core.native.build_info()
        return BuildInfo(
            flavour="native",
            version=info["version"],
            profile=info["profile"],
            target=info["target"],
            rustc=info["rustc"],
            cpu_features=info["cpu_features"],
        )
    if _core.LOAD_ERROR is not None:
        raise _core.unavailable("smg_grpc_proto.build_info", _core.LOAD_ERROR)
    return BuildInfo(
        flavour="pure", version=__version__, profile="", target="", rustc="", cpu_features=[]
    )
