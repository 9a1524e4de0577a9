"""The decoder benchmark runs end to end in tiny mode (its Hub-shape exports left out)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_decoder_bench_measures_graph_and_http_for_both_decoders(tmp_path):
    out = tmp_path / "decoder"
    done = subprocess.run(
        [sys.executable, "-m", "bench.decoder", "--tiny", "--docs", "32", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    for name in ("emb", "rr"):
        serve = result["serve"][name]
        assert serve["graph_direct_docs_per_s"]["fp32"] > 0
        assert serve["http_docs_per_s"]["fp32"] > 0
        assert serve["export"]["peak_rss_bytes"] > 0 and serve["export"]["seconds"] > 0
    assert "export" not in result
    table = out.with_suffix(".md").read_text()
    assert "reranker (yes/no)" in table and table in done.stdout
