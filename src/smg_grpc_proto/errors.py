"""The package's exceptions, in one place.

Every exception derives from :class:`SmgProtoError` and from the builtin that fits the failure, so
callers that catch ``ValueError`` or ``OSError`` keep working. Each carries the offending ``field``
and, where there are numbers involved, ``expected`` and ``actual`` — as attributes and in its
message. They pickle (the attributes survive a round trip), so they can cross process pools.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ShmError",
    "SmgProtoError",
    "TensorError",
    "TensorTypeError",
    "TransportNotImplementedError",
]


class SmgProtoError(Exception):
    """Base class of every exception raised by smg-grpc-proto."""

    def __init__(
        self, message: str, *, field: str = "", expected: Any = None, actual: Any = None
    ) -> None:
        super().__init__(message)
        self.field = field
        self.expected = expected
        self.actual = actual

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild,
            (type(self), str(self), self.field, self.expected, self.actual),
        )


def _rebuild(
    cls: type[SmgProtoError], message: str, field: str, expected: Any, actual: Any
) -> SmgProtoError:
    return cls(message, field=field, expected=expected, actual=actual)


class TensorError(SmgProtoError, ValueError):
    """A tensor or its ``TensorData`` message is invalid: dtype, shape, length, payload."""


class TensorTypeError(SmgProtoError, TypeError):
    """An argument of the wrong Python type was passed to the tensor API."""


class ShmError(TensorError):
    """A shared-memory segment is unusable: bad name, size, owner, file type or symlink."""


class TransportNotImplementedError(SmgProtoError, NotImplementedError):
    """The payload uses a transport this package cannot read (``remote``)."""
