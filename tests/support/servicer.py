"""The published smg-grpc-servicer 0.14.1 wheel (what ``vllm serve --grpc`` runs): downloaded once
by the package's own downloader into its wheel cache, unpacked into .cache/, and only its
engine-free vLLM modules loaded (``mm_keys``, ``mm_salt``, ``kv_transfer``: no vLLM, no torch).

:func:`servicer_refusal` is ``VllmEngineServicer.Generate``'s decision on a request's multimodal
payload, composed from those real functions the way ``smg_grpc_servicer/vllm/servicer.py``
composes them; :func:`vllm_servicer` checks that file still reads that way, so a new release
that changes the rule fails the tests instead of drifting from them.
"""

from __future__ import annotations

import importlib
import sys
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smg_grpc_proto.compat.sources import download_wheel
from smg_grpc_proto.generated import vllm_engine_pb2

ROOT = Path(__file__).resolve().parents[2]
SERVICER_VERSION = "0.14.1"
CACHE = ROOT / ".cache" / "servicer" / SERVICER_VERSION

# The lines of VllmEngineServicer.Generate that servicer_refusal mirrors.
GENERATE_RULE = (
    "kv_transfer_params = params_from_request(request)",
    "batch for batch in mm_batches(request) if has_preprocessed_mm_payload(batch)",
    'elif has_preprocessed_mm and input_type == "tokenized":',
    "if batches_missing_pixels(preprocessed_batches) and kv_transfer_params is None:",
)


@dataclass(frozen=True)
class VllmServicer:
    mm_keys: Any
    mm_salt: Any
    kv_transfer: Any
    source: str


def _package() -> Path:
    unpacked = CACHE / "unpacked"
    if not (unpacked / "smg_grpc_servicer").is_dir():
        with zipfile.ZipFile(download_wheel(f"smg-grpc-servicer=={SERVICER_VERSION}")) as zf:
            zf.extractall(unpacked)
    return unpacked / "smg_grpc_servicer"


def vllm_servicer() -> VllmServicer:
    """The real modules, loaded without running the packages' ``__init__`` (which would reach
    for vLLM); the servicer imports the vLLM stub as ``smg_grpc_proto.vllm_engine_pb2``, which
    is this package's ``generated.vllm_engine_pb2`` (the same proto)."""
    package = _package()
    source = (package / "vllm" / "servicer.py").read_text()
    for line in GENERATE_RULE:
        assert line in source, f"smg-grpc-servicer {SERVICER_VERSION} changed: {line!r} is gone"
    saved = {k: v for k, v in sys.modules.items() if k.startswith("smg_grpc_servicer")}
    for name in [k for k in sys.modules if k.startswith("smg_grpc_servicer")]:
        del sys.modules[name]
    shells = {"smg_grpc_servicer": package, "smg_grpc_servicer.vllm": package / "vllm"}
    alias = "smg_grpc_proto.vllm_engine_pb2"
    had_alias = alias in sys.modules
    try:
        for name, path in shells.items():
            shell = types.ModuleType(name)
            shell.__path__ = [str(path)]
            sys.modules[name] = shell
        sys.modules.setdefault(alias, vllm_engine_pb2)
        loaded = {
            m: importlib.import_module(f"smg_grpc_servicer.vllm.{m}")
            for m in ("mm_keys", "mm_salt", "kv_transfer")
        }
    finally:
        for name in [k for k in sys.modules if k.startswith("smg_grpc_servicer")]:
            del sys.modules[name]
        sys.modules.update(saved)
        if not had_alias:
            sys.modules.pop(alias, None)
    return VllmServicer(source=source, **loaded)


def servicer_refusal(
    servicer: VllmServicer, request: vllm_engine_pb2.GenerateRequest
) -> str | None:
    """What the servicer says before it hands the request's multimodal payload to the engine:
    ``None`` when it accepts it, else its ``ValueError`` message (only the tokenized, no
    ``media_refs`` path: the one these requests take)."""
    try:
        kv = servicer.kv_transfer.params_from_request(request)
    except ValueError as exc:
        return str(exc)
    preprocessed = [
        batch
        for batch in servicer.mm_keys.mm_batches(request)
        if servicer.mm_salt.has_preprocessed_mm_payload(batch)
    ]
    missing = servicer.mm_keys.batches_missing_pixels(preprocessed)
    if request.WhichOneof("input") == "tokenized" and missing and kv is None:
        return (
            "multimodal payload carries grid tensors but no pixel_values and "
            "no kv_transfer_params; a pixel-less leg requires remote KV"
        )
    return None
