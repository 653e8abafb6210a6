#!/usr/bin/env python3
"""Tensor transports side by side: a Qwen2-VL request inline, through shared memory and over NIXL.

    python scripts/bench_transport.py [--sizes 7,28] [--rounds 15] [--rss-rounds 3]
                                      [--transports inline,shm,remote] [--json out.json]

For each size (MiB of float32 ``pixel_values``) the bundled photo (``grace_hopper.jpg``,
512 x 600) is resized with Pillow (keeping its aspect ratio) so that Qwen2-VL's processor turns it
into about that many bytes, preprocessed once (``VisionModel.for_family("qwen2_vl")``) and its
tensors written out once. Every round then sends it to a server in **another process** over real
gRPC on 127.0.0.1, once per transport, in a shuffled order per round (drift on a shared machine
hits every transport alike):

* ``inline`` / ``shm`` / ``remote``: ``vllm.generate_request(..., transport=...)``, sent with
  ``tensors.serialize``; the server receives it with ``tensors.deserializer`` and decodes it
  with ``vllm.decode_mm_inputs`` (shared memory: mapped read-only and unlinked).
* ``remote`` in particular: the client (the gateway's role) builds with ``transport="remote"``
  and its own :class:`~smg_grpc_proto.remote.RemoteExporter` (NIXL over UCX, metadata listener
  bound to 127.0.0.1), which copies ``pixel_values`` into a slot and sends it as a
  ``RemoteTensorHandle`` (the side tensors stay inline); the server decodes with
  ``decode_mm_inputs(..., puller=...)``, whose :class:`~smg_grpc_proto.remote.RemotePuller`
  READs the slot (stamps checked, slot released by its notification). A request the exporter
  refuses goes inline: the client counts those fallbacks with ``tensors.remote_stats()`` and
  prints them, and the server reports which payload it received, which must be ``remote``
  unless that request fell back. Skipped, with the reason printed, when
  ``smg_grpc_proto.remote`` or NIXL cannot be imported.
* ``raw TCP socket``: the same number of bytes through a plain loopback socket
  (:class:`~smg_grpc_proto.loopback.TcpSink`, receiver in this process): the floor of copying
  the bytes once through the kernel.

A round trip is timed from building the request (the copy into the request bytes, the segment or
the slot is part of each transport) to the server's answer, which comes after the server has
decoded the request and checked the tensors: the payload kind of ``pixel_values`` (``inline``,
``shm`` or ``remote``, as asked), its shape, dtype and BLAKE3 digest of
every byte, and ``image_grid_thw``, must equal what the client sent, and the decoded batch must
account for the image's placeholder tokens. A mismatch stops the benchmark (exit status 1).
Throughput = tensor bytes / median round-trip time (GB/s, 1e9 bytes); "without the check" takes
the server's check time off each round trip first (for shared memory that check is also where
the server's mapping first touches every page). The server reports how long it spent pulling
(remote: the puller's READs inside ``decode_mm_inputs``), decoding (the rest of it) and checking.

The remote row runs UCX with its own choice of transports, or what ``UCX_TLS`` /
``UCX_NET_DEVICES`` say (recorded in the header): between two processes of one host UCX may use
shared memory or cross-memory attach instead of the network, so set ``UCX_TLS=tcp
UCX_NET_DEVICES=lo`` to measure the TCP path two hosts would take without RDMA hardware.

Then, per transport alone, ``--rss-rounds`` round trips with the kernel's high-water mark of
both processes reset before them (``/proc/<pid>/clear_refs`` = 5): the peak resident memory of
client and server (MiB), and the part of it above the resident memory at the reset.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import io
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import numpy.typing as npt

import smg_grpc_proto
from smg_grpc_proto import _native, channel, tensors
from smg_grpc_proto.demo import bundled_photo, prompt_for
from smg_grpc_proto.engines import VisionModel
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.loopback import TcpSink
from smg_grpc_proto.tensors import Transport

if TYPE_CHECKING:
    from smg_grpc_proto.remote import RemoteExporter, RemotePuller

MIB = 1 << 20
SERVICE = "smg.bench.TransportBench"
PUT = f"/{SERVICE}/Put"
MEMORY = f"/{SERVICE}/Memory"
TCP = "raw TCP socket"
#: The transports of the builders this benchmark compares.
TRANSPORTS: dict[str, Transport] = {"inline": "inline", "shm": "shm", "remote": "remote"}
#: Qwen2-VL: every 14 x 14 patch of the resized image is 2 x 3 x 14 x 14 float32 values, so
#: ``pixel_values`` takes 24 bytes per pixel of the resized image (multiples of 28 per side).
QWEN2_VL_BYTES_PER_PIXEL = 2 * 3 * 4


def digest(array: npt.NDArray[Any]) -> str:
    """BLAKE3 of every byte of ``array`` (the native core's hash, GIL released), hex."""
    return _native.media_digest([np.ascontiguousarray(array)]).hex()


def status_kib(pid: int | str = "self") -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (KiB) of a process, from ``/proc/<pid>/status``."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def reset_peak() -> dict[str, int]:
    """Reset this process's resident high-water mark; its memory right after."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    return status_kib()


# -- the server (another process) ---------------------------------------------------------------
def remote_reason() -> str | None:
    """Why the remote transport cannot run here, or ``None`` when it can."""
    try:
        from smg_grpc_proto.remote import _nixl
    except ImportError as exc:
        return f"smg_grpc_proto.remote is not importable ({exc})"
    try:
        _nixl.load_nixl()
    except ImportError as exc:  # RemoteUnavailableError: says what to install
        return str(exc)
    return None


def timed_puller() -> RemotePuller:
    """A :class:`~smg_grpc_proto.remote.RemotePuller` that adds the seconds each of its pulls
    takes to a total of the calling thread; ``take()`` returns that total and resets it (the
    servicer calls it around ``decode_mm_inputs`` to split pulling from decoding)."""
    from smg_grpc_proto.remote import RemotePuller

    class TimedPuller(RemotePuller):
        def __init__(self) -> None:
            super().__init__()
            self.local = threading.local()

        def take(self) -> float:
            """Seconds pulled by this thread since the last call."""
            seconds: float = getattr(self.local, "seconds", 0.0)
            self.local.seconds = 0.0
            return seconds

        def pull(self, *args: Any, **kwargs: Any) -> npt.NDArray[Any]:
            start = time.perf_counter()
            try:
                return super().pull(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                self.local.seconds = getattr(self.local, "seconds", 0.0) + spent

    return TimedPuller()


class BenchServicer:
    """Decodes each request as an engine would, checks it, answers what it found."""

    def __init__(self) -> None:
        self._puller: Any = None  # a timed_puller(), made for the first remote request
        self._lock = threading.Lock()

    def puller(self) -> Any:
        with self._lock:
            if self._puller is None:
                self._puller = timed_puller()
            return self._puller

    def put(self, received: tensors.TensorMessage[pb.GenerateRequest], context: Any) -> bytes:
        del context
        payload = received.message.mm_inputs.pixel_values.WhichOneof("payload")
        puller = self.puller() if payload == "remote" else None
        if puller is not None:
            puller.take()
        start = time.perf_counter()
        (batch,) = vllm_adapter.decode_mm_inputs(received, merge_size=2, puller=puller)
        decoded = time.perf_counter()
        pull_s = puller.take() if puller is not None else 0.0
        pixels = batch.tensors["pixel_values"]
        answer = {
            "payload": payload,
            "shape": list(pixels.shape),
            "dtype": str(pixels.dtype),
            "digest": digest(pixels),
            "grid": batch.tensors["image_grid_thw"].tolist(),
            "placeholders": [list(p) for item in batch.items for p in item.placeholders],
            "pull_s": pull_s,
            "decode_s": decoded - start - pull_s,
            "check_s": time.perf_counter() - decoded,
        }
        del batch, pixels
        return json.dumps(answer).encode()

    def memory(self, request: bytes, context: Any) -> bytes:
        del context
        state = reset_peak() if request == b"reset" else status_kib()
        return json.dumps(state).encode()

    def close(self) -> None:
        if self._puller is not None:
            self._puller.close()


def serve() -> None:
    """The server process: prints ``PORT <n>`` on stdout, serves until stdin closes."""
    servicer = BenchServicer()
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Put": grpc.unary_unary_rpc_method_handler(
                servicer.put, request_deserializer=tensors.deserializer(pb.GenerateRequest)
            ),
            "Memory": grpc.unary_unary_rpc_method_handler(servicer.memory),
        },
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2), options=channel.server_options()
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"PORT {port}", flush=True)
    sys.stdin.read()  # the client closes our stdin when it is done (or dies)
    server.stop(None)
    servicer.close()


@contextmanager
def server_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The bench server in a child process; yields it and its target."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the bench server did not start (printed {line!r})")
        yield proc, f"127.0.0.1:{int(line.split()[1])}"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the client ----------------------------------------------------------------------------------
@dataclass
class Case:
    """One request size: the photo resized, its prepared media and what the server must find."""

    label: str
    images: int
    width: int
    height: int
    media: Any
    prompt: list[int]
    pixels: npt.NDArray[Any]
    grid: list[list[int]]
    placeholders: list[list[int]]
    digest: str
    payload: bytes  # the same number of bytes, for the raw socket
    times: dict[str, list[float]] = field(default_factory=dict)
    delivered: dict[str, list[float]] = field(default_factory=dict)
    server: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    checked: dict[str, int] = field(default_factory=dict)
    payloads: dict[str, dict[str, int]] = field(default_factory=dict)  # as the server saw them
    fallbacks: int = 0

    @property
    def nbytes(self) -> int:
        return int(self.pixels.nbytes)


def make_case(mib: float, photo: bytes, image_mib: float | None = None) -> Case:
    """A Qwen2-VL request whose ``pixel_values`` is about ``mib`` MiB: the photo resized, keeping
    its aspect ratio; above what one image can give (the processor's ``max_pixels``, about
    23 MiB, or ``image_mib``), several images of equal size, every other one mirrored so their
    content differs."""
    from PIL import Image, ImageOps

    model = VisionModel.for_family("qwen2_vl")
    per_image_max = int(model.processor.config["size"]["longest_edge"]) * QWEN2_VL_BYTES_PER_PIXEL
    if image_mib is not None:
        per_image_max = min(per_image_max, int(image_mib * MIB))
    count = max(1, math.ceil(mib * MIB / per_image_max))
    image = Image.open(io.BytesIO(photo)).convert("RGB")
    area = mib * MIB / count / QWEN2_VL_BYTES_PER_PIXEL
    scale = math.sqrt(area / (image.width * image.height))
    width, height = max(28, round(image.width * scale)), max(28, round(image.height * scale))
    if (width, height) != image.size:
        image = image.resize((width, height), Image.Resampling.LANCZOS)
    files = []
    for i in range(count):
        buffer = io.BytesIO()
        (ImageOps.mirror(image) if i % 2 else image).save(buffer, format="JPEG", quality=95)
        files.append(buffer.getvalue())
    media = model.prepare(files, threads=1)
    arrays = media.tensors()  # written once, here: every round sends the same arrays
    pixels = arrays["pixel_values"]
    prompt = prompt_for(count)
    probe = vllm_adapter.generate_request("probe", prompt, media)
    ranges = [[r.offset, r.length] for r in probe.message.mm_inputs.mm_placeholders]
    return Case(
        label=f"{pixels.nbytes / MIB:.2f} MiB",
        images=count,
        width=width,
        height=height,
        media=media,
        prompt=prompt,
        pixels=pixels,
        grid=arrays["image_grid_thw"].tolist(),
        placeholders=ranges,
        digest=digest(pixels),
        payload=pixels.tobytes(),
    )


class Client:
    """One open channel to the bench server, the remote exporter (when available) and a raw
    socket; :meth:`send` does one checked round trip of a transport."""

    def __init__(self, target: str, max_bytes: int, remote: bool, stack: ExitStack) -> None:
        self.channel = stack.enter_context(channel.insecure_channel(target))
        self._put: Any = self.channel.unary_unary(PUT, request_serializer=tensors.serialize)
        self._memory: Any = self.channel.unary_unary(MEMORY)
        self.tcp = stack.enter_context(TcpSink(max_bytes))
        self.exporter: RemoteExporter | None = None
        if remote:
            from smg_grpc_proto.remote import RemoteExporter

            # 4 slots of the largest tensor (+ the 16-byte stamp frame), rounded up to a MiB.
            slot = -(-(max_bytes + 16) // MIB) * MIB
            self.exporter = stack.enter_context(
                RemoteExporter(slots=4, slot_bytes=slot, listen_ip="127.0.0.1")
            )

    def server_memory(self, reset: bool) -> dict[str, int]:
        answer: dict[str, int] = json.loads(
            self._memory(b"reset" if reset else b"read", timeout=30)
        )
        return answer

    def request(self, case: Case, transport: str, rid: str) -> tuple[Any, str]:
        """The request of ``transport`` (its copy of the pixels included, for ``remote`` into a
        slot of this client's exporter) and the payload kind ``pixel_values`` must arrive as:
        ``inline`` when the exporter refused it (such fallbacks are counted in
        ``case.fallbacks``)."""
        kind = TRANSPORTS[transport]
        if kind != "remote":
            built = vllm_adapter.generate_request(rid, case.prompt, case.media, transport=kind)
            return built, kind
        before = tensors.remote_stats().fallbacks
        built = vllm_adapter.generate_request(
            rid, case.prompt, case.media, transport=kind, exporter=self.exporter
        )
        fell_back = tensors.remote_stats().fallbacks - before
        case.fallbacks += fell_back
        return built, "inline" if fell_back else "remote"

    def send(self, case: Case, transport: str, rid: str) -> tuple[float, dict[str, Any] | None]:
        """One round trip of ``transport``: seconds, and the server's answer (checked)."""
        if transport == TCP:
            start = time.perf_counter()
            self.tcp.send(case.payload)
            return time.perf_counter() - start, None
        start = time.perf_counter()
        request, payload = self.request(case, transport, rid)
        answer = json.loads(self._put(request, timeout=120))
        seconds = time.perf_counter() - start
        if answer["payload"] != payload:
            raise SystemExit(
                f"{case.label} {transport}: pixel_values arrived as {answer['payload']!r}, "
                f"not {payload!r}"
            )
        check(case, transport, answer)
        left = [n for n in getattr(request, "shm_segments", []) if Path(f"/dev/shm/{n}").exists()]
        if left:
            raise SystemExit(f"{transport}: segments left after the server read them: {left}")
        return seconds, answer


def check(case: Case, transport: str, answer: dict[str, Any]) -> None:
    """The server must have decoded exactly what was sent."""
    expected = {
        "shape": list(case.pixels.shape),
        "dtype": str(case.pixels.dtype),
        "digest": case.digest,
        "grid": case.grid,
        "placeholders": case.placeholders,
    }
    wrong = {k: (answer[k], v) for k, v in expected.items() if answer[k] != v}
    if wrong:
        raise SystemExit(f"{case.label} {transport}: the server decoded other tensors: {wrong}")
    case.checked[transport] = case.checked.get(transport, 0) + 1


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [float(s) for s in args.sizes.split(",")]
    wanted = [t.strip() for t in args.transports.split(",")]
    unknown = set(wanted) - {"inline", "shm", "remote"}
    if unknown:
        raise SystemExit(f"--transports: unknown {sorted(unknown)} (inline, shm, remote)")
    skipped: dict[str, str] = {}
    if "remote" in wanted:
        reason = remote_reason()
        if reason is not None:
            skipped["remote"] = reason
            wanted.remove("remote")
    photo = bundled_photo()
    cases = [make_case(mib, photo, args.image_mib) for mib in sizes]
    rows = [*wanted, TCP]
    rng = random.Random(args.seed)
    report: dict[str, Any] = {"skipped": skipped, "cases": [], "load": os.getloadavg()}
    with ExitStack() as stack:
        _, target = stack.enter_context(server_process())
        client = Client(target, max(c.nbytes for c in cases), "remote" in wanted, stack)
        for case in cases:
            case.times = {t: [] for t in rows}
            case.delivered = {t: [] for t in rows}
            case.server = {t: {"pull_s": [], "decode_s": [], "check_s": []} for t in wanted}
            for warm in range(args.warmup):  # connections, NIXL metadata, page faults
                for t in rows:
                    client.send(case, t, f"warm-{warm}")
            case.checked = {}
            for i in range(args.rounds):
                order = rows[:]
                rng.shuffle(order)
                for t in order:
                    seconds, answer = client.send(case, t, f"r{i}-{t}")
                    case.times[t].append(seconds)
                    # the round trip without the server's check (its BLAKE3 of every byte)
                    check_s = answer["check_s"] if answer is not None else 0.0
                    case.delivered[t].append(seconds - check_s)
                    if answer is not None:
                        seen = case.payloads.setdefault(t, {})
                        seen[answer["payload"]] = seen.get(answer["payload"], 0) + 1
                        for key in case.server[t]:
                            case.server[t][key].append(answer[key])
            timed_checked = dict(case.checked)  # the memory probes' answers are checked too
            memory = {}
            for t in rows:
                base = reset_peak()
                server_base = client.server_memory(reset=True)
                for i in range(args.rss_rounds):
                    client.send(case, t, f"rss{i}-{t}")
                gc.collect()
                memory[t] = {
                    "client_peak_mib": status_kib()["VmHWM"] / 1024,
                    "client_above_mib": (status_kib()["VmHWM"] - base["VmRSS"]) / 1024,
                    "server_peak_mib": client.server_memory(reset=False)["VmHWM"] / 1024,
                    "server_above_mib": (
                        client.server_memory(reset=False)["VmHWM"] - server_base["VmRSS"]
                    )
                    / 1024,
                }
            case.checked = timed_checked
            report["cases"].append(summarize(case, rows, memory))
        report["exporter"] = (
            {"slots": client.exporter.slots, "slot_bytes": client.exporter.slot_bytes}
            if client.exporter is not None
            else None
        )
        stats = tensors.remote_stats()
        report["remote_stats"] = {**dataclasses.asdict(stats), "fallbacks": stats.fallbacks}
    return report


def summarize(case: Case, rows: list[str], memory: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "label": case.label,
        "images": case.images,
        "image": f"{case.width}x{case.height}",
        "shape": list(case.pixels.shape),
        "nbytes": case.nbytes,
        "fallbacks": case.fallbacks,
        "rows": {},
    }
    for t in rows:
        times, delivered = case.times[t], case.delivered[t]
        row = {
            "median_ms": statistics.median(times) * 1e3,
            "p90_ms": percentile(times, 0.9) * 1e3,
            "gbps": case.nbytes / statistics.median(times) / 1e9,
            "gbps_without_check": case.nbytes / statistics.median(delivered) / 1e9,
            "rounds": len(times),
            "checked": case.checked.get(t),
            "payloads": case.payloads.get(t),
            **memory[t],
        }
        for key, values in case.server.get(t, {}).items():
            row[f"server_{key[:-2]}_ms"] = statistics.median(values) * 1e3
        out["rows"][t] = row
    return out


def print_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    info = smg_grpc_proto.build_info()
    print(
        f"# {_cpu_model()}, {os.cpu_count()} cores, Linux {platform.release()}, Python "
        f"{platform.python_version()}, grpcio {grpc.__version__}, smg-grpc-proto "
        f"{smg_grpc_proto.__version__} ({info['flavour']}, {info.get('profile', '-')})"
        f"{_nixl_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load "
        f"average {report['load'][0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    ucx = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
    print(f"# UCX settings: {ucx or 'defaults (UCX picks the transports)'}")
    print(
        f"# median / p90 of {args.rounds} round trips per transport, transports in a shuffled "
        f"order per round, after {args.warmup} warm-up round(s); every answer checked"
    )
    for name, reason in report["skipped"].items():
        print(f"# {name}: skipped: {reason}")
    if report.get("exporter"):
        e = report["exporter"]
        print(
            f"# remote arena: {e['slots']} slots x {e['slot_bytes'] / MIB:.0f} MiB = "
            f"{e['slots'] * e['slot_bytes'] / MIB:.0f} MiB registered with NIXL (client)"
        )
        r = report["remote_stats"]
        print(
            f"# remote exports (tensors.remote_stats(), client, warm-up and memory probes "
            f"included): {r['exported']} sent remote, {r['fallbacks']} fell back inline"
        )
    for case in report["cases"]:
        print(
            f"\n{case['label']} of float32 pixel_values {case['shape']}: a Qwen2-VL vLLM request "
            f"of {case['images']} image(s), the photo resized to {case['image']}"
            + (
                f"; {case['fallbacks']} remote export(s) fell back inline"
                if case["fallbacks"]
                else ""
            )
        )
        print(
            "| transport | round trip median / p90 (ms) | GB/s | server pull / decode / check "
            "(ms) | GB/s without the check | checked | peak RSS client / server (MiB) | above "
            "start (MiB) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for t, r in case["rows"].items():
            server = (
                f"{r['server_pull_ms']:.2f} / {r['server_decode_ms']:.2f} / "
                f"{r['server_check_ms']:.2f}"
                if "server_decode_ms" in r
                else "-"
            )
            checked = f"{r['checked']}/{r['rounds']} equal" if r["checked"] is not None else "-"
            print(
                f"| {t} | {r['median_ms']:.2f} / {r['p90_ms']:.2f} | {r['gbps']:.2f} | {server} | "
                f"{r['gbps_without_check']:.2f} | {checked} | {r['client_peak_mib']:.0f} / "
                f"{r['server_peak_mib']:.0f} | {r['client_above_mib']:.0f} / "
                f"{r['server_above_mib']:.0f} |"
            )


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def _nixl_version() -> str:
    from importlib import metadata

    for name in ("nixl-cu13", "nixl-cu12", "nixl"):
        try:
            return f", {name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="7,28", help="pixel_values sizes in MiB")
    parser.add_argument("--rounds", type=int, default=15, help="timed round trips per transport")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--rss-rounds", type=int, default=3, help="round trips per memory probe")
    parser.add_argument("--transports", default="inline,shm,remote")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffled orders")
    parser.add_argument(
        "--image-mib",
        type=float,
        help="largest pixel_values of one image (MiB); larger sizes take several images "
        "(default: what Qwen2-VL's max_pixels allows, about 23 MiB)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return 0
    if args.rounds < 1 or args.rss_rounds < 1 or args.warmup < 0:
        parser.error("--rounds and --rss-rounds must be at least 1, --warmup at least 0")
    report = run(args)
    print_report(report, args)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
