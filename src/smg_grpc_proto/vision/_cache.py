"""The cache of large buffers that vision calls recycle.

A batch's ``pixel_values`` can be 100 MB or more, a decoded 12-megapixel photo 36 MB. Fresh
memory costs a page fault and a kernel-side clear per page before the first write, which on a VM
can take as long as computing the values. So buffers of 1 MiB or more are kept when they are
done with — an output tensor or :func:`decode` result once every numpy view of it is gone, a
batch's resized images at the end of the call — and the next call of a similar size writes into
them. The cache holds at most ``limit`` bytes (256 MiB by default; the oldest buffers go first);
``SMG_GRPC_PROTO_BUFFER_CACHE_MIB`` in the environment sets another limit at start-up and
:func:`buffer_cache` at any time (``0`` turns recycling off and frees what is kept). Results
never depend on it: every recycled value is overwritten before it is handed out.
"""

from __future__ import annotations

from typing import NamedTuple

from smg_grpc_proto._core import native as _native


class BufferCache(NamedTuple):
    """The cache's limit and the bytes it holds, both in bytes."""

    limit: int
    held: int


def buffer_cache(limit: int | None = None) -> BufferCache:
    """Return the buffer cache's state; with ``limit`` (bytes, 0 = off), set it first.

    The returned ``limit`` is the one in force before the call, so that
    ``previous = buffer_cache(0).limit`` ... ``buffer_cache(previous)`` restores it; ``held`` is
    what the cache holds after the call.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"buffer_cache: limit must be a non-negative int of bytes, got {limit!r}")
    previous, held = _native.buffer_cache(limit)
    return BufferCache(previous, held)
