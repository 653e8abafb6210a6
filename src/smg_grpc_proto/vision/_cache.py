"""The cache of large output buffers that :class:`ImageProcessor` recycles between calls.

A batch's ``pixel_values`` can be 100 MB or more. Fresh memory costs a page fault and a
kernel-side clear per page before the first write, which on a VM can take as long as computing
the values. When every numpy view of an output tensor of 4 MiB or more is gone, its buffer is
kept (up to the limit, oldest dropped first) and the next output of a similar size reuses it.
The default limit is 256 MiB; ``SMG_GRPC_PROTO_OUTPUT_CACHE_MIB`` in the environment sets
another at start-up and :func:`output_cache` at any time. Results never depend on it.
"""

from __future__ import annotations

from typing import NamedTuple

from smg_grpc_proto import _native


class OutputCache(NamedTuple):
    """The cache's limit and the bytes it holds, both in bytes."""

    limit: int
    held: int


def output_cache(limit: int | None = None) -> OutputCache:
    """Return the output-buffer cache's state; with ``limit`` (bytes, 0 = off), set it first.

    The returned ``limit`` is the one in force before the call, so that
    ``previous = output_cache(0).limit`` ... ``output_cache(previous)`` restores it; ``held`` is
    what the cache holds after the call.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"output_cache: limit must be a non-negative int of bytes, got {limit!r}")
    previous, held = _native.output_cache(limit)
    return OutputCache(previous, held)
