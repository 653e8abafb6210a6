"""Fixtures of the vision tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every parity test image as a file (``support.parity.build_corpus``), built once."""
    from support.parity import build_corpus

    return build_corpus(tmp_path_factory.mktemp("vision"))
