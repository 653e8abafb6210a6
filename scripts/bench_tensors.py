#!/usr/bin/env python3
"""Tensor transport benchmark: the naive protobuf path, ours, and one plain copy, side by side.

    python scripts/bench_tensors.py [--sizes 1,25,100] [--repeat 7] [--no-memory]

For float32 tensors of each size (MiB), in one run on the same data:

* encode — a whole vLLM ``GenerateRequest`` carrying the tensor as ``mm_inputs.pixel_values``:
  naive (``inline = array.tobytes()`` then ``SerializeToString()``, what clients do today),
  ours (``TensorMessage.attach`` + ``tensors.serialize``), and one ``bytearray(array)`` copy;
  with and without float32 -> bfloat16 conversion (naive converts with ml_dtypes' astype).
* decode to a usable array — naive (``FromString`` then
  ``np.frombuffer(bytearray(bytes(td.inline)))``, what engines do today) and ours
  (``tensors.deserializer``: zero-copy views).
* shm — ``pack(transport="shm")`` then the reader: ours (read-only mmap; and copy mode, one
  ``pread`` into a new array) and ``os.pread`` of the segment into a new buffer (upstream
  servicers' reader).

Each figure is the median of ``--repeat`` runs; peak memory is the extra resident memory of a
fresh process running that one operation once (its ``VmHWM``, reset just before, minus ``VmRSS``).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from benchkit import cpu_model, measure_peak, time_op

MIB = 1 << 20


def make_array(mib: int) -> np.ndarray[Any, Any]:
    n = mib * MIB // 4
    cols = 1176
    rows = max(1, n // cols)
    return np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)


def ops(mib: int, bf16: bool) -> dict[str, Callable[[], Any]]:
    """name -> zero-arg callable, built on shared inputs so every path does the same work."""
    import ml_dtypes

    from smg_grpc_proto import shm, tensors, vllm_engine_pb2

    arr = make_array(mib)
    wire = "bfloat16" if bf16 else None

    def naive_encode() -> bytes:
        req = vllm_engine_pb2.GenerateRequest(request_id="bench")
        td = req.mm_inputs.pixel_values
        td.shape.extend(arr.shape)
        td.dtype = wire or "float32"
        data = arr.astype(ml_dtypes.bfloat16) if bf16 else arr
        td.inline = data.tobytes()
        return req.SerializeToString()

    def ours_encode() -> bytes:
        tm = tensors.TensorMessage(vllm_engine_pb2.GenerateRequest(request_id="bench"))
        tm.attach("mm_inputs.pixel_values", arr, dtype=wire)
        return tensors.serialize(tm)

    def single_copy() -> bytearray:
        return bytearray(arr)

    wire_bytes = ours_encode()
    storage = "<u2" if bf16 else "<f4"
    deserialize = tensors.deserializer(vllm_engine_pb2.GenerateRequest, bf16="uint16")

    def naive_decode() -> np.ndarray[Any, Any]:
        req = vllm_engine_pb2.GenerateRequest.FromString(wire_bytes)
        td = req.mm_inputs.pixel_values
        return np.frombuffer(bytearray(bytes(td.inline)), storage).reshape(tuple(td.shape))

    def ours_decode() -> np.ndarray[Any, Any]:
        return deserialize(wire_bytes)["mm_inputs.pixel_values"]

    out: dict[str, Callable[[], Any]] = {
        "encode/naive": naive_encode,
        "encode/ours": ours_encode,
        "encode/one-copy": single_copy,
        "decode/naive": naive_decode,
        "decode/ours": ours_decode,
    }
    if not bf16:

        def shm_write() -> Any:
            msg = tensors.pack(arr, vllm_engine_pb2.TensorData, transport="shm")
            shm.unlink(msg.shm.name)
            return msg

        handle = tensors.pack(arr, vllm_engine_pb2.TensorData, transport="shm")
        atexit.register(shm.unlink, handle.shm.name)  # read with unlink=False: ours to remove

        def shm_read_ours() -> np.ndarray[Any, Any]:
            return tensors.unpack(handle, unlink=False)

        def shm_read_copy() -> np.ndarray[Any, Any]:
            return tensors.unpack(handle, unlink=False, shm_read="copy")

        def shm_read_pread() -> np.ndarray[Any, Any]:
            fd = os.open(shm.DEFAULT_DIR / handle.shm.name, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                data = os.pread(fd, handle.shm.nbytes, handle.shm.offset)
            finally:
                os.close(fd)
            return np.frombuffer(bytearray(data), "<f4").reshape(tuple(handle.shape))

        out.update(
            {
                "shm/write-ours": shm_write,
                "shm/read-ours": shm_read_ours,
                "shm/read-copy": shm_read_copy,
                "shm/read-pread": shm_read_pread,
            }
        )
    return out


def child(mib: int, bf16: bool, name: str) -> None:
    """Run one operation once in this fresh process; print its extra peak RSS in MiB."""
    print(json.dumps({"peak_mib": measure_peak(ops(mib, bf16)[name])}))


def peak_memory(mib: int, bf16: bool, name: str) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--child", f"{mib}:{int(bf16)}:{name}"],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(json.loads(out.stdout)["peak_mib"])


def machine() -> str:
    cpu = cpu_model()
    import google.protobuf

    from smg_grpc_proto import tensors

    return (
        f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}, Python "
        f"{platform.python_version()}, numpy {np.__version__}, protobuf "
        f"{google.protobuf.__version__} ({_pb_impl()}), backend {tensors.backend}"
    )


def _pb_impl() -> str:
    from google.protobuf.internal import api_implementation

    return str(api_implementation.Type())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,25,100")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mib, bf16, name = args.child.split(":", 2)
        child(int(mib), bool(int(bf16)), name)
        return

    print(f"machine: {machine()}\n")
    print(
        "| size | conversion | operation | naive / pread (ms) | ours (ms) | one copy (ms) | "
        "speed-up vs naive | ours / one copy | peak MiB naive | peak MiB ours |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for mib in (int(s) for s in args.sizes.split(",")):
        for bf16 in (False, True):
            fns = ops(mib, bf16)
            t = {name: time_op(fn, args.repeat) * 1e3 for name, fn in fns.items()}
            mem = {} if args.no_memory else {n: peak_memory(mib, bf16, n) for n in fns}
            label = f"| {mib} MiB | {'f32->bf16' if bf16 else 'none'} "
            rows = [
                ("encode request", "encode/naive", "encode/ours", "encode/one-copy"),
                ("decode to array", "decode/naive", "decode/ours", None),
            ]
            if not bf16:
                rows.append(("shm read", "shm/read-pread", "shm/read-ours", None))
                rows.append(("shm read, copy mode", "shm/read-pread", "shm/read-copy", None))
            for op, naive, ours, copy in rows:
                print(label + table_row(op, t, mem, naive, ours, copy))
            if not bf16:
                write, one = t["shm/write-ours"], t["encode/one-copy"]
                peak = f"{mem['shm/write-ours']:.0f}" if mem else "-"
                print(
                    f"{label}| shm write (pack) | - | {write:.2f} | {one:.2f} | - | "
                    f"{write / one:.2f}x | - | {peak} |"
                )
            sys.stdout.flush()


def table_row(
    op: str, t: dict[str, float], mem: dict[str, float], naive: str, ours: str, copy: str | None
) -> str:
    """The cells of one comparison row (after size and conversion)."""
    one = f"{t[copy]:.2f}" if copy else "-"
    ratio = f"{t[ours] / t[copy]:.2f}x" if copy else "-"
    peak_naive = f"{mem[naive]:.0f}" if mem else "-"
    peak_ours = f"{mem[ours]:.0f}" if mem else "-"
    return (
        f"| {op} | {t[naive]:.2f} | {t[ours]:.3f} | {one} | **{t[naive] / t[ours]:.1f}x** | "
        f"{ratio} | {peak_naive} | {peak_ours} |"
    )


if __name__ == "__main__":
    main()
