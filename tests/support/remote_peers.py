"""NIXL peers run in their own processes (one NIXL agent each), driven over stdin/stdout.

Roles (``python remote_peers.py ROLE ...``):

- ``exporter SLOTS SLOT_BYTES TTL``: our :class:`RemoteExporter`.
- ``gateway SLOTS SLOT_BYTES TTL PORT``: an exporter written to the SMG gateway's layout
  (``crates/mm_rdma`` in the ``smg`` 1.13.0 sdist): a NIXL agent named ``smg-gateway-encode``
  with NIXL's own listener thread on PORT, one arena registered with the UCX backend, FIFO
  slots framed ``[gen][payload][gen]`` with a process-wide gen starting at 1, descriptors
  ``SMGRDMA1|addr|gen|key|port|ip``, a reaper every 20 ms freeing a slot on a notification
  whose tag parses as its key, or after the TTL.
- ``puller``: our :class:`RemotePuller`.
- ``servicer-puller``: smg-grpc-servicer 0.14.1's real ``RdmaPixelPuller`` (needs torch; run
  under a torch interpreter with the unpacked wheel and NIXL on ``sys.path``).

Commands are one line each; every answer is one line ``@@ <json>`` (NIXL logs to stdout too).
Payloads are generated from a seed on both sides (:func:`payload`), so only digests travel.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np


def payload(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def digest(data: Any) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(data)).cast("B")).hexdigest()


def reply(obj: Any) -> None:
    sys.stdout.write("@@ " + json.dumps(obj) + "\n")
    sys.stdout.flush()


class GatewayFormatExporter:
    """The gateway's exporter, as a small Python twin (see the module docstring)."""

    def __init__(self, slots: int, slot_bytes: int, ttl: float, port: int) -> None:
        from smg_grpc_proto.remote import load_nixl

        api = load_nixl()
        self.agent = api.nixl_agent(
            "smg-gateway-encode",
            api.nixl_agent_config(enable_listen_thread=True, listen_port=port, backends=["UCX"]),
        )
        self.arena = np.zeros(slots * slot_bytes, dtype=np.uint8)
        self.agent.register_memory(
            [(self.arena.ctypes.data, self.arena.nbytes, 0, "")], "DRAM", backends=["UCX"]
        )
        self.slot_bytes, self.ttl, self.port = slot_bytes, ttl, port
        self.free = collections.deque(range(slots))
        self.occupied: dict[int, tuple[int, float]] = {}
        self.gen = 1
        self.lock = threading.Lock()
        threading.Thread(target=self._reaper, daemon=True).start()

    def export(self, key: int, data: np.ndarray) -> bytes | None:
        if data.size + 16 > self.slot_bytes:
            return None
        with self.lock:
            if not self.free:
                return None
            slot = self.free.popleft()
            gen = self.gen
            self.gen += 1
        base = slot * self.slot_bytes
        stamp = np.frombuffer(gen.to_bytes(8, "little"), dtype=np.uint8)
        self.arena[base : base + 8] = stamp
        self.arena[base + 8 : base + 8 + data.size] = data
        self.arena[base + 8 + data.size : base + 16 + data.size] = stamp
        with self.lock:
            self.occupied[key] = (slot, time.monotonic())
        addr = self.arena.ctypes.data + base
        return (
            b"SMGRDMA1"
            + addr.to_bytes(8, "little")
            + gen.to_bytes(8, "little")
            + key.to_bytes(8, "little", signed=True)
            + self.port.to_bytes(2, "little")
            + b"127.0.0.1"
        )

    def free_key(self, key: int) -> None:
        with self.lock:
            occ = self.occupied.pop(key, None)
            if occ is not None:
                self.free.append(occ[0])

    def _reaper(self) -> None:
        while True:
            time.sleep(0.02)
            for tags in self.agent.get_new_notifs().values():
                for tag in tags:
                    with contextlib.suppress(ValueError):
                        self.free_key(int(tag.decode()))
            now = time.monotonic()
            with self.lock:
                stale = [k for k, (_, at) in self.occupied.items() if now - at >= self.ttl]
            for key in stale:
                self.free_key(key)

    def leased(self) -> list[int]:
        with self.lock:
            return sorted(self.occupied)


def run_exporter(gateway: bool, args: list[str]) -> None:
    slots, slot_bytes, ttl = int(args[0]), int(args[1]), float(args[2])
    if gateway:
        exp: Any = GatewayFormatExporter(slots, slot_bytes, ttl, int(args[3]))
        port = exp.port
    else:
        from smg_grpc_proto.remote import RemoteExporter

        listen_port = int(args[3]) if len(args) > 3 else 0
        exp = RemoteExporter(slots=slots, slot_bytes=slot_bytes, ttl=ttl, listen_port=listen_port)
        port = exp.port
    reply({"port": port, "pid": os.getpid()})
    next_key = 1000
    for line in sys.stdin:
        cmd, *rest = line.split()
        try:
            if cmd == "export":
                nbytes, seed = int(rest[0]), int(rest[1])
                data = payload(nbytes, seed)
                if gateway:
                    next_key += 1
                    desc = exp.export(next_key, data)
                    reply(
                        {
                            "descriptor": desc.hex() if desc else None,
                            "nbytes": nbytes,
                            "key": next_key,
                        }
                    )
                else:
                    transport, desc, n = exp.export(data)
                    reply({"transport": transport, "descriptor": desc.hex(), "nbytes": n})
            elif cmd == "leased":
                if gateway:
                    reply({"leased": exp.leased()})
                else:
                    st = exp.stats()
                    reply({"leased": st.leased, "stats": st.__dict__})
            else:
                reply({"error": f"unknown command {cmd}"})
        except Exception as exc:
            reply({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})


def run_puller(args: list[str]) -> None:
    from smg_grpc_proto.remote import RemotePuller

    puller = RemotePuller(timeout=float(args[0]) if args else 10.0)
    reply({"pid": os.getpid()})
    for line in sys.stdin:
        cmd, *rest = line.split()
        try:
            if cmd == "connect":  # fetch the exporter's metadata only
                from smg_grpc_proto.remote import decode_descriptor

                desc = decode_descriptor(bytes.fromhex(rest[0]))
                name = puller._connect((desc.ip, desc.port), time.monotonic() + 10, 10)
                puller._done(name)
                reply({"connected": name})
            elif cmd == "pull":
                out = puller.pull(bytes.fromhex(rest[0]), int(rest[1]))
                reply({"digest": digest(out), "nbytes": int(out.size)})
        except Exception as exc:
            reply({"error": f"{type(exc).__name__}: {exc}"})


def run_servicer_puller(args: list[str]) -> None:
    """smg-grpc-servicer's RdmaPixelPuller, unmodified. Two environment facts are adapted:
    it imports ``nixl_cu13._api`` or ``nixl._api`` (we have ``nixl_cu12``, the same API), and
    it pins its landing buffer (``pin_memory=True``), which torch refuses without a CUDA
    driver; pinning only speeds GPU copies, it does not change what NIXL reads."""
    import importlib
    import types

    import torch

    api = importlib.import_module("nixl_cu12._api")
    shell = types.ModuleType("nixl")
    shell.__path__ = []  # type: ignore[attr-defined]
    sys.modules["nixl"] = shell
    sys.modules["nixl._api"] = api
    if not torch.cuda.is_available():
        real_empty = torch.empty

        def empty(*a: Any, **kw: Any) -> Any:
            kw.pop("pin_memory", None)
            return real_empty(*a, **kw)

        torch.empty = empty  # type: ignore[assignment]
    os.environ["SMG_MM_PIXEL_RDMA"] = "1"
    from smg_grpc_servicer.mm_rdma import RdmaPixelPuller

    puller = RdmaPixelPuller(agent_name=f"servicer-puller-{os.getpid()}", log_prefix="test")
    reply({"pid": os.getpid(), "ready": puller._nixl_agent is not None})

    class Remote:
        def __init__(self, transport: str, descriptor: bytes, nbytes: int) -> None:
            self.transport, self.descriptor, self.nbytes = transport, descriptor, nbytes

    class TD:
        def __init__(self, remote: Remote, shape: list[int], dtype: str) -> None:
            self.remote, self.shape, self.dtype = remote, shape, dtype

    for line in sys.stdin:
        cmd, *rest = line.split()
        try:
            if cmd == "pull":  # pull TRANSPORT DESC_HEX NBYTES
                td = TD(
                    Remote(rest[0], bytes.fromhex(rest[1]), int(rest[2])), [int(rest[2])], "uint8"
                )
                tensor = puller.feature_from_remote(td, explicit_room=None, cast_to=None)
                reply({"digest": digest(tensor.numpy()), "nbytes": int(tensor.numel())})
        except Exception as exc:
            reply({"error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    if role in ("exporter", "gateway"):
        run_exporter(role == "gateway", rest)
    elif role == "puller":
        run_puller(rest)
    elif role == "servicer-puller":
        run_servicer_puller(rest)
    else:
        raise SystemExit(f"unknown role {role}")
