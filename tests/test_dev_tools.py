"""The contributor tooling: the pre-commit hooks run what CI's `make lint` runs, offline."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / ".pre-commit-config.yaml"


def _hooks() -> list[dict[str, object]]:
    config = yaml.safe_load(CONFIG.read_text())
    return [hook for repo in config["repos"] for hook in repo["hooks"]]


def _lint_recipe() -> list[str]:
    """The commands of the Makefile's `lint` target, with make's variables expanded."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("lint:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        command = line.strip().replace("$(PYTHON)", "python").replace("$(CARGO)", "cargo")
        recipe.append(command)
    return recipe


@pytest.mark.skipif(shutil.which("pre-commit") is None, reason="pre-commit is not installed")
def test_pre_commit_config_is_valid() -> None:
    result = subprocess.run(
        ["pre-commit", "validate-config", str(CONFIG)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hooks_download_nothing() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    assert {hook["language"] for hook in _hooks()} == {"system"}


def test_every_lint_command_has_a_hook() -> None:
    """Drift check: each command of `make lint` is some hook's entry (flags may be added)."""
    entries = [str(hook["entry"]) for hook in _hooks()]
    recipe = _lint_recipe()
    assert len(recipe) == 4, recipe
    for command in recipe:
        # The path argument (".") is what pre-commit passes as file names.
        words = [w for w in re.sub(r"^cd rust && ", "", command).split() if w != "."]
        tokens = [entry.replace("'", " ").split() for entry in entries]
        assert any(all(word in t for word in words) for t in tokens), command


def test_ruff_hook_runs_and_can_fail(tmp_path: Path) -> None:
    """The ruff hook's entry, run as pre-commit runs it, passes a clean file and fails a bad one."""
    entry = next(str(h["entry"]) for h in _hooks() if h["id"] == "ruff-check").split()
    assert entry[:3] == ["python", "-m", "ruff"]
    good = tmp_path / "good.py"
    good.write_text("x = 1\n")
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")  # unused import: F401
    command = [sys.executable, *entry[1:]]
    assert subprocess.run([*command, str(good)], cwd=ROOT, capture_output=True).returncode == 0
    failed = subprocess.run([*command, str(bad)], cwd=ROOT, capture_output=True, text=True)
    assert failed.returncode == 1
    assert "F401" in failed.stdout
