"""Fuzz worker for engine requests, run in a child process by tests/security/test_fuzz_campaign.py.

``python -m support.fuzz_wire SEED SECONDS WORKDIR HEADROOM_MIB``: builds valid vLLM, TokenSpeed
and SGLang requests with the real builders (Qwen2-VL media, inline and shared-memory handles),
then, under an address-space limit of its current size plus ``HEADROOM_MIB``, mutates them —
bytes (flips, interesting values, cuts, insertions, copies) and fields (placeholders, shapes,
dtypes, shm handles, layout keys, sizes) — and for each case:

* differential against protobuf's parser: where ``FromString`` refuses the bytes, our
  ``tensors.parse`` must refuse them with a library error; where protobuf parses them, ours
  parses them to an equal message (``to_message()``) or refuses them with a library error;
* the engine's ``decode_mm_inputs`` on our parse and on protobuf's: library errors only, and
  where both succeed, the same tensors.

Each case's bytes are written to ``WORKDIR/current.bin`` first, so a crash can be replayed. The
last line on stdout is a JSON summary: counts per outcome and the failures (non-library
exceptions and differential mismatches). Shared-memory names point into ``WORKDIR`` (the
module's ``DEFAULT_DIR`` is redirected there), so nothing outside it can be touched.
"""

from __future__ import annotations

import json
import random
import time
import traceback
from collections import Counter
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from smg_grpc_proto import shm, tensors
from smg_grpc_proto.engines import VisionModel
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import SmgProtoError
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sgl_pb
from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as ts_pb
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from support.mutate import limit_address_space, mutate_bytes, worker_args

ENGINES: dict[str, tuple[Any, Any]] = {
    "vllm": (vllm_pb.GenerateRequest, vllm_adapter),
    "tokenspeed": (ts_pb.GenerateRequest, ts_adapter),
    "sglang": (sgl_pb.GenerateRequest, sglang_adapter),
}
INTERESTING = (0, 1, 2, 3, 7, 8, 63, 64, 127, 128, 255, 256, 2**31 - 1, 2**32 - 1)  # uint32


def seeds() -> list[tuple[str, bytes]]:
    """Valid requests of every engine, as the builders write them."""
    model = VisionModel.for_family("qwen2_vl")
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((56, 84), (40, 30))]
    media = model.prepare(images)
    ids = [101, media.token_id, 7, media.token_id, 102]
    out = []
    for transport in ("inline", "shm"):
        request = vllm_adapter.generate_request("r", ids, media, transport=transport)
        out.append(("vllm", tensors.serialize(request)))
        request.discard_shm()
        request = ts_adapter.generate_request("r", ids, media, transport=transport, shm_min_bytes=0)
        out.append(("tokenspeed", tensors.serialize(request)))
        request.discard_shm()
    out.append(("sglang", tensors.serialize(sglang_adapter.generate_request("r", ids, media))))
    return out


def _tensor_datas(message: Any) -> list[Any]:
    """Every TensorData of a request (plain protobuf walk of the multimodal fields)."""
    out = []
    mm_list = []
    if message.HasField("mm_inputs"):
        mm_list.append(message.mm_inputs)
    mm_list.extend(getattr(message, "extra_mm_inputs", ()))
    for mm in mm_list:
        if hasattr(mm, "items"):  # TokenSpeed
            for item in mm.items:
                out.append(item.encoder_input)
                out.extend(item.model_specific_tensors.values())
        else:
            out.append(mm.pixel_values)
            out.extend(mm.model_specific_tensors.values())
    return out


def _number(rng: random.Random) -> int:
    return rng.choice((*INTERESTING, rng.randrange(0, 2**32)))


def mutate_fields(rng: random.Random, engine: str, data: bytes) -> bytes:
    message_type, _ = ENGINES[engine]
    message = message_type.FromString(data)
    for _ in range(rng.choice((1, 1, 2, 3))):
        tds = _tensor_datas(message)
        op = rng.randrange(9)
        ids = message.tokenized.input_ids
        if op == 0 and ids:  # a token id
            ids[rng.randrange(len(ids))] = rng.choice((*INTERESTING, ids[0]))
        elif op == 1:  # drop or add prompt tokens
            if ids and rng.random() < 0.5:
                del ids[rng.randrange(len(ids)) :]
            else:
                ids.extend([ids[-1] if ids else 0] * rng.randrange(1, 40))
        elif op == 2 and tds:  # a shape
            td = rng.choice(tds)
            if td.shape and rng.random() < 0.7:
                td.shape[rng.randrange(len(td.shape))] = _number(rng)
            else:
                td.shape.extend([_number(rng)] * rng.choice((1, 1, 2, 70)))
        elif op == 3 and tds:  # a dtype
            rng.choice(tds).dtype = rng.choice(
                ("float32", "bfloat16", "uint8", "int64", "uint32", "float64", "", "f\0")
            )
        elif op == 4 and tds and engine != "sglang":  # a shared-memory handle
            td = rng.choice(tds)
            td.shm.name = rng.choice(
                (
                    "smg-tokenspeed-1-2-3",
                    "/smg-tokenspeed-1-2-3",
                    "../etc/passwd",
                    "victim",
                    "smg-tokenspeed-probe-1",
                    "",
                    "\0",
                    "x" * 300,
                )
            )
            td.shm.nbytes = rng.choice((_number(rng), 2**32, 2**63, 2**64 - 1))
            td.shm.offset = rng.choice((0, 0, 1, 2**63))
        elif op == 5:  # placeholder ranges
            ranges = _ranges(message)
            if ranges:
                r = rng.choice(ranges)
                if rng.random() < 0.5:
                    r.offset = _number(rng)
                else:
                    r.length = _number(rng)
        elif op == 6:  # many ranges (the quadratic check)
            ranges_parent = _ranges_parent(message)
            if ranges_parent is not None:
                field = (
                    "placeholders" if hasattr(ranges_parent, "placeholders") else "mm_placeholders"
                )
                container = getattr(ranges_parent, field)
                for i in range(rng.choice((10, 1000, 5000))):
                    container.add(offset=i, length=1)
        elif op == 7 and engine == "vllm" and message.HasField("mm_inputs"):  # layout keys
            mm = message.mm_inputs
            choice = rng.randrange(4)
            if choice == 0:
                mm.flat_keys.clear()
            elif choice == 1:
                mm.batched_keys.append(rng.choice(("pixel_values", "image_grid_thw", "nope")))
            elif choice == 2:
                mm.flat_keys["pixel_values"] = rng.choice(("image_grid_thw", "nope"))
            else:
                mm.keep_on_cpu_keys.append("nope")
        elif op == 8 and tds:  # a sizes or grid tensor with extreme values
            td = rng.choice(tds)
            if td.WhichOneof("payload") if td.DESCRIPTOR.oneofs_by_name else True:
                values = np.array(
                    [rng.choice((0, 1, 2, 3, 2**31, 2**63 - 1, -1)) for _ in range(3)], "<i8"
                )
                td.Clear()
                td.shape.extend([1, 3] if rng.random() < 0.5 else [3])
                td.dtype = "int64"
                layout = tensors.LAYOUTS[td.DESCRIPTOR.full_name]
                setattr(td, layout.payload_field, values.tobytes())
    return message.SerializeToString()


def _ranges_parent(message: Any) -> Any:
    if not message.HasField("mm_inputs"):
        return None
    mm = message.mm_inputs
    if hasattr(mm, "items"):
        return mm.items[0] if mm.items else None
    return mm


def _ranges(message: Any) -> list[Any]:
    if not message.HasField("mm_inputs"):
        return []
    mm = message.mm_inputs
    if hasattr(mm, "items"):
        return [p for item in mm.items for p in item.placeholders]
    return list(mm.mm_placeholders)


def _same_batches(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if set(x.tensors) != set(y.tensors) or x.placeholders != y.placeholders:
            return False
        for name in x.tensors:
            u, v = np.asarray(x.tensors[name]), np.asarray(y.tensors[name])
            if u.shape != v.shape or u.dtype != v.dtype or u.tobytes() != v.tobytes():
                return False
    return True


def run_case(
    engine: str, data: bytes, outcomes: Counter[str], failures: list[dict[str, Any]]
) -> None:
    message_type, adapter = ENGINES[engine]

    def fail(what: str, exc: BaseException | None = None) -> None:
        outcomes["failure"] += 1
        if len(failures) < 20:
            failures.append(
                {
                    "engine": engine,
                    "what": what,
                    "error": "".join(traceback.format_exception_only(exc)).strip() if exc else "",
                    "bytes": data.hex() if len(data) < 4096 else f"{len(data)} bytes",
                }
            )

    try:
        reference = message_type.FromString(data)
    except DecodeError:
        reference = None
    try:
        ours = tensors.parse(data, message_type)
    except SmgProtoError:
        ours = None
    except Exception as exc:
        fail("parse raised a non-library exception", exc)
        return
    if reference is None:
        if ours is not None:
            fail("parse accepted bytes protobuf refuses")
        outcomes["wire refused"] += 1
        return
    if ours is not None and ours.to_message() != reference:
        fail("parse disagrees with protobuf")
        return
    results = []
    for source in ((ours,) if ours is not None else ()) + (reference,):
        try:
            results.append(adapter.decode_mm_inputs(source))
        except SmgProtoError:
            results.append(None)
        except Exception as exc:
            fail("decode_mm_inputs raised a non-library exception", exc)
            return
    if len(results) == 2 and (results[0] is None) != (results[1] is None):
        fail("the zero-copy and plain decodes disagree on acceptance")
        return
    if len(results) == 2 and results[0] is not None and not _same_batches(results[0], results[1]):
        fail("the zero-copy and plain decodes give different tensors")
        return
    outcomes["decoded" if results[-1] is not None else "decode refused"] += 1


def main() -> None:
    seed, seconds, workdir, headroom = worker_args()
    # Segments the builders write and every name a mutated request gives resolve in the workdir.
    shm.DEFAULT_DIR = workdir
    cases = seeds()
    limit = limit_address_space(headroom)
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    current = workdir / "current.bin"
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        engine, data = cases[n % len(cases)]
        n += 1
        case = mutate_bytes(rng, data) if rng.random() < 0.4 else mutate_fields(rng, engine, data)
        current.write_bytes(engine.encode() + b"\n" + case)
        run_case(engine, case, outcomes, failures)
    print(
        json.dumps(
            {"cases": n, "outcomes": dict(outcomes), "failures": failures, "as_limit": limit}
        )
    )


if __name__ == "__main__":
    main()
