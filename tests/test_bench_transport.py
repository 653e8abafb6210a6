"""scripts/bench_transport.py in a quick mode, so the benchmark cannot rot: real gRPC to a server
in another process, every transport's tensors checked equal by the server, and the check itself
catches a tensor that differs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_transport.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_transport", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_quick_run_checks_every_transport(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    command = [
        sys.executable,
        str(SCRIPT),
        "--sizes",
        "0.05,0.3",
        "--image-mib",
        "0.12",  # the larger request takes 3 images
        "--rounds",
        "2",
        "--warmup",
        "1",
        "--rss-rounds",
        "1",
        "--json",
        str(out),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    remote = _script().remote_reason() is None
    expected = {"inline", "shm", "raw TCP socket"} | ({"remote"} if remote else set())
    if not remote:
        assert "remote: skipped: " in run.stdout
    assert len(report["cases"]) == 2
    small, large = report["cases"]
    assert small["nbytes"] < large["nbytes"]
    assert (small["images"], large["images"]) == (1, 3)
    assert len(large["shape"]) == 2
    for case in report["cases"]:
        assert case["fallbacks"] == 0
        assert set(case["rows"]) == expected
        for name, row in case["rows"].items():
            assert row["rounds"] == 2
            assert row["median_ms"] > 0
            assert row["gbps"] > 0
            assert row["client_peak_mib"] > 0
            assert row["server_peak_mib"] > 0
            # every answer of the server matched what was sent (shape, dtype, digest, grid,
            # placeholders); the raw socket carries bytes only
            assert row["checked"] == (None if name == "raw TCP socket" else 2), (name, row)
            # the server saw pixel_values arrive as the transport asked: remote really went
            # remote (a fallback would arrive inline)
            expected_payloads = None if name == "raw TCP socket" else {name: 2}
            assert row["payloads"] == expected_payloads, (name, row)
        assert "| inline | " in run.stdout
    assert run.stdout.count("2/2 equal") == 2 * (len(expected) - 1)
    stats = report["remote_stats"]
    if remote:
        # every remote request of the run (warm-up, timed, memory probes) went out remote
        assert stats["fallbacks"] == 0, stats
        assert stats["exported"] == 2 * (1 + 2 + 1), stats
        assert "remote: skipped" not in run.stdout
    else:
        assert stats["exported"] == 0, stats


def test_the_check_refuses_other_tensors() -> None:
    bench = _script()
    case = bench.make_case(0.05, bench.bundled_photo())
    answer = {
        "shape": list(case.pixels.shape),
        "dtype": str(case.pixels.dtype),
        "digest": bench.digest(case.pixels),
        "grid": case.grid,
        "placeholders": case.placeholders,
    }
    bench.check(case, "inline", answer)
    assert case.checked == {"inline": 1}
    changed = case.pixels.copy()
    changed.reshape(-1)[-1] = np.nextafter(changed.reshape(-1)[-1], np.float32(np.inf))
    with pytest.raises(SystemExit, match=r"the server decoded other tensors: .*digest"):
        bench.check(case, "inline", {**answer, "digest": bench.digest(changed)})
    with pytest.raises(SystemExit, match="grid"):
        bench.check(case, "shm", {**answer, "grid": [[1, 2, 2]]})
    assert case.checked == {"inline": 1}
