"""The benchmark harness runs end to end (tiny bundle, few requests): it must not rot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.corpus import sentences
from bench.report import render

pytestmark = pytest.mark.slow


def test_corpus_is_fixed_real_and_mixed_length():
    texts = sentences(64)
    assert texts == sentences(64)
    lengths = [len(t.split()) for t in texts]
    assert min(lengths) >= 6 and max(lengths) <= 45 and len(set(lengths)) > 10


def test_bench_runs_and_reports_ratios(tiny_bundle, tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--bundle",
            str(tiny_bundle),
            "--texts",
            "48",
            "--requests",
            "60",
            "--concurrency",
            "1,4",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["graph_direct"] > 0 and result["gemm_peak_gflops"] > 0
    assert [run["concurrency"] for run in result["http"]] == [1, 4]
    assert all(run["errors"] == 0 and run["texts_per_s"] > 0 for run in result["http"])
    assert 0 < result["int8"]["min_cosine"] <= 1
    table = render(result)
    assert "vs graph direct" in table and "| 4 clients |" in table
    assert table in done.stdout
