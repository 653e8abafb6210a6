"""The native core (``smg_grpc_proto._native``), imported once, or a stand-in where it is absent.

The pure-Python wheel (``py3-none-any``) ships no extension module. Every module that needs the
native core imports ``native`` from here instead of ``_native`` itself, so importing it never
fails: without the extension, ``native`` is a stand-in whose every attribute raises
:class:`~smg_grpc_proto.errors.NativeCoreUnavailableError`, naming the function that was needed,
the platforms the native wheel is published for and how to build one elsewhere.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, NoReturn

from smg_grpc_proto.errors import NativeCoreUnavailableError

__all__ = ["AVAILABLE", "LOAD_ERROR", "NATIVE_WHEEL_TAGS", "native", "unavailable"]

#: The platform tags of the native wheels a release publishes (scripts/release.py refuses a
#: native wheel tagged otherwise, so that the message below stays true).
NATIVE_WHEEL_TAGS: tuple[str, ...] = ("manylinux_2_28_x86_64",)
_PLATFORMS = "Linux x86_64 with glibc >= 2.28 (manylinux_2_28_x86_64), CPython >= 3.10"
_ELSEWHERE = (
    "elsewhere, build it from the sdist (needs Rust >= 1.89, cmake and nasm): "
    "pip install --no-binary smg-grpc-proto smg-grpc-proto"
)


def unavailable(what: str, load_error: BaseException | None = None) -> NativeCoreUnavailableError:
    """The error raised when ``what`` (a function) needs the native core and it is absent (or
    failed to load with ``load_error``)."""
    if load_error is None:
        why = (
            "this installation has no native core (smg_grpc_proto._native): it is the "
            "pure-Python wheel (py3-none-any), which pip picks where no native wheel fits"
        )
    else:
        why = f"the native core (smg_grpc_proto._native) failed to load: {load_error}"
    message = (
        f"{what} needs the native core of smg-grpc-proto (vision preprocessing, image decoding "
        f"and media hashing are compiled code), but {why}. The native wheel is published for "
        f"{_PLATFORMS}; {_ELSEWHERE}. The stubs, tensors, shared memory and the engine "
        "builders and decoders work without it; smg_grpc_proto.build_info() says which "
        "flavour is installed."
    )
    return NativeCoreUnavailableError(message, field=what)


class _Absent:
    """Stands in for the extension module: every attribute access raises."""

    __slots__ = ("_load_error",)

    def __init__(self, load_error: BaseException | None) -> None:
        self._load_error = load_error

    def __getattr__(self, name: str) -> NoReturn:
        raise unavailable(f"smg_grpc_proto._native.{name}", self._load_error)

    def __repr__(self) -> str:
        return "<smg_grpc_proto._native: absent>"


def _shipped() -> bool:
    """Whether this installation has an extension module file (absent in the pure wheel)."""
    return importlib.util.find_spec("smg_grpc_proto._native") is not None


#: The import error of an extension module that is present but did not load (else ``None``).
LOAD_ERROR: ImportError | None = None

if TYPE_CHECKING:
    from smg_grpc_proto import _native as native
else:
    try:
        from smg_grpc_proto import _native as native
    except ImportError as error:
        LOAD_ERROR = error if _shipped() else None
        native = _Absent(LOAD_ERROR)

#: Whether the native core loaded.
AVAILABLE: bool = not isinstance(native, _Absent)
