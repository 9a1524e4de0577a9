"""`make soak` runs end to end (tiny bundle, seconds instead of minutes): it must not rot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_soak_runs_and_reports_memory_latency_and_statuses(tiny_bundle, tmp_path):
    pytest.importorskip("matplotlib", reason="the soak's curves need the bench extra")
    done = subprocess.run(
        [
            sys.executable, "-m", "bench.soak", "--bundle", str(tiny_bundle), "--seconds", "6",
            "--idle", "1", "--bench-seconds", "1", "--out", str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "soak.json").read_text())
    assert results["rss_peak_mb"] >= results["rss_warm_mb"] > 0
    assert results["memory_bound_mb"] > 0
    assert set(results["latency"]) == {"warmup", "no_attention", "attention"}
    assert results["statuses"]["/health"] == {"200": sum(results["statuses"]["/health"].values())}
    assert results["encode_2048x200"]["status"] in (200, 413)
    assert (tmp_path / "soak.png").stat().st_size > 0
    assert "RSS after idle vs warm" in (tmp_path / "soak.md").read_text()
