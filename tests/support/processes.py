"""A Python child process for tests that need a fresh process (environment switches read once,
per-process counters such as page faults or peak memory)."""

from __future__ import annotations

import os
import subprocess
import sys


def python_child(code: str, **env: str) -> str:
    """The standard output of ``code`` run by this interpreter in a new process, with ``env``
    added to this process's environment (a failure raises ``CalledProcessError``)."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    return out.stdout
