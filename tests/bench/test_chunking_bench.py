"""bench.chunking runs end to end on the tiny bundle (48 tokens): it must not rot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_chunking_bench_measures_late_separate_and_truncated(tiny_bundle, tmp_path):
    cmd = [sys.executable, "-m", "bench.chunking", "--tiny", "--bundle", str(tiny_bundle),
           "--sizes", "8", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "chunking.json").read_text())
    cases = result["cases"]
    assert set(cases) == {"truncated", "late 8", "separate 8"}
    assert result["tokens_per_doc"] > result["max_length"] == 48  # longer than the model
    assert cases["truncated"]["chunks_per_doc"] == 1
    # the same chunks either way, several a document
    assert cases["late 8"]["chunks_per_doc"] == cases["separate 8"]["chunks_per_doc"] > 2
    assert all(c["docs_per_s"] > 0 for c in cases.values())
    assert "| late 8 |" in done.stdout
