"""bench.explain end to end on the tiny bundle, small numbers: it must not rot."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_explain_bench_runs_and_reports_cost_and_interference(tiny_bundle, tmp_path):
    from bench import explain

    args = ["--bundle", str(tiny_bundle), "--lengths", "16,40", "--load-tokens", "24"]
    args += ["--runs", "1", "--encodes", "3", "--seconds", "1", "--out", str(tmp_path)]
    assert explain.main(args) == 0
    out = json.loads((tmp_path / "explain.json").read_text())
    assert set(out["cost"]) == {"16", "40"}
    for n, r in out["cost"].items():
        assert r["passes"] == int(n) - 1  # every ordinary token left out once, plus the whole
        # Its figures are measured, not asserted (a tiny model's 0.2 ms runs are noise-bound):
        # only that they were taken.
        assert r["explain_ms"] > 0 and r["explain_inference_ms"] > 0 and r["inference_ratio"] > 0
    i = out["interference"]
    assert i["idle"]["requests"] > 0 and i["loaded"]["requests"] > 0
    assert i["idle"]["failed"] == i["loaded"]["failed"] == 0
    assert i["explanations"]["answered"] > 0 and set(i["explanations"]["statuses"]) == {"200"}
    table = (tmp_path / "explain.md").read_text()
    assert "| 40 tokens | 39 |" in table and "p50 loaded / idle" in table
    assert out["cpu"]["cores"] >= 1
