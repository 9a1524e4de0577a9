"""bench.transports runs end to end (small loads on the tiny bundle): it must not rot, and every
transport's row must come from calls that were answered."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_transports_bench_measures_http_and_grpc_on_one_server(tiny_bundle, tmp_path):
    done = subprocess.run(
        [
            sys.executable, "-m", "bench.transports", "--bundle", str(tiny_bundle),
            "--rounds", "1", "--texts", "32", "--scale", "0.05", "--out", str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "transports.json").read_text())
    assert set(result["runs"]) == {"http /embed", "grpc tei.v1.Embed", "grpc ModelInfer"}
    for kind, by_clients in result["runs"].items():
        assert set(by_clients) == {"1", "32"}, kind
        for row in by_clients.values():
            assert row["errors"] == 0 and row["texts_per_s"] > 0 and row["p50_ms"] > 0, (kind, row)
    assert result["graph_texts_per_s"] > 0
    assert "| grpc tei.v1.Embed | 32 |" in done.stdout
