"""Reusing the memory of freed requests instead of faulting in fresh pages for each one."""

from __future__ import annotations

from smg_grpc_proto.tensors import _backend


def keep_freed_memory(max_bytes: int) -> bool:
    """Let the C allocator (glibc) keep freed blocks of up to ``max_bytes`` for reuse.

    A serialized request is a ``bytes`` object; beyond 32 MiB glibc maps fresh memory for each
    one and unmaps it when it is freed, so every request pays a page fault and a kernel-side
    clear of each page before the first byte is written — as much CPU time as writing the
    request (a Qwen2-VL batch of 8 real photos, 94 MB: about half of ``serialize``). After this
    call allocations of up to ``max_bytes`` come from the allocator's heap and freed memory stays
    there, so the next request of a similar size is written into pages already mapped. (Without
    it, such fresh pages are mapped in one system call per writing thread before the request is
    written, which already takes much of that cost away: ``SMG_GRPC_PROTO_PREFAULT``.)

    Process-wide and for the rest of the process (it sets glibc's ``M_MMAP_THRESHOLD`` to
    ``max_bytes`` and ``M_TRIM_THRESHOLD`` to twice that, as ``GLIBC_TUNABLES=
    glibc.malloc.mmap_threshold=...`` would at start-up): the process keeps up to its largest
    freed blocks. Returns ``False``, changing nothing, where the allocator is not glibc's, the
    native extension is not loaded, or glibc refuses the value; ``ValueError`` for a
    ``max_bytes`` that is not a positive int.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(
            f"keep_freed_memory: max_bytes must be a positive int of bytes, got {max_bytes!r}"
        )
    native = _backend._NATIVE
    if native is None or not hasattr(native, "keep_freed_memory"):
        return False
    return bool(native.keep_freed_memory(max_bytes))
