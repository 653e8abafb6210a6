"""Shared by the fuzz workers: a byte-level mutator and the address-space limit."""

from __future__ import annotations

import random
import resource
import sys
from pathlib import Path


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4))):
        op = rng.randrange(6)
        if op == 0 and buf:
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[rng.randrange(len(buf))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF))
        elif op == 2:
            del buf[rng.randrange(len(buf) + 1) :]
        elif op == 3:
            i = rng.randrange(len(buf) + 1)
            buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif op == 4 and buf:
            i = rng.randrange(len(buf))
            del buf[i : i + rng.randrange(1, 17)]
        elif buf:
            i = rng.randrange(len(buf))
            buf[i:i] = buf[i : i + rng.randrange(1, 65)]
    return bytes(buf)


def limit_address_space(headroom_mib: int) -> int:
    """Limit this process's address space (``RLIMIT_AS``, what ``prlimit --as`` sets) to its
    current size plus ``headroom_mib``; set after the imports, whose reservations (numpy's
    thread pools, torch) vary by machine. Returns the limit in bytes."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limit = vm + headroom_mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return limit


def worker_args() -> tuple[int, float, Path, int]:
    """A fuzz worker's command line: ``SEED SECONDS WORKDIR HEADROOM_MIB``."""
    return int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
