"""The published smg-grpc-proto 0.4.28 wheel: downloaded once (by the package's own downloader,
into its wheel cache), unpacked into .cache/, never imported."""

from __future__ import annotations

import zipfile
from pathlib import Path

from smg_grpc_proto.compat.sources import download_wheel

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_VERSION = "0.4.28"
CACHE = ROOT / ".cache" / "upstream" / UPSTREAM_VERSION


def upstream_wheel() -> Path:
    return download_wheel(f"smg-grpc-proto=={UPSTREAM_VERSION}")


def upstream_package() -> Path:
    """Path to the unpacked ``smg_grpc_proto`` folder of the upstream wheel."""
    unpacked = CACHE / "unpacked"
    if not (unpacked / "smg_grpc_proto").is_dir():
        with zipfile.ZipFile(upstream_wheel()) as zf:
            zf.extractall(unpacked)
    return unpacked / "smg_grpc_proto"
