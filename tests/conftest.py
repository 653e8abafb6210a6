"""Session fixtures shared by the slow, packaging-level tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel once per test session, from the working tree, with maturin."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "maturin",
            "build",
            "--release",
            "--quiet",
            "--out",
            str(out),
            "--manifest-path",
            str(ROOT / "rust" / "Cargo.toml"),
        ],
        cwd=ROOT,
        check=True,
        timeout=1200,
    )
    (wheel,) = out.glob("*.whl")
    return wheel
