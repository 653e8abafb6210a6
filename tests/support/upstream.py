"""The published smg-grpc-proto 0.4.28 wheel: downloaded once into .cache/, never imported."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_VERSION = "0.4.28"
CACHE = ROOT / ".cache" / "upstream" / UPSTREAM_VERSION


def upstream_package() -> Path:
    """Path to the unpacked ``smg_grpc_proto`` folder of the upstream wheel."""
    unpacked = CACHE / "unpacked"
    if not (unpacked / "smg_grpc_proto").is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        wheels = list(CACHE.glob("smg_grpc_proto-*.whl"))
        if not wheels:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--disable-pip-version-check",
                    "--only-binary=:all:",
                    f"smg-grpc-proto=={UPSTREAM_VERSION}",
                    "-d",
                    str(CACHE),
                ],
                check=True,
            )
            wheels = list(CACHE.glob("smg_grpc_proto-*.whl"))
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(unpacked)
    return unpacked / "smg_grpc_proto"
