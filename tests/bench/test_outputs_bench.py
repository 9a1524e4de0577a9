"""bench.outputs runs end to end on a tiny model (2 layers, d 32): it must not rot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_outputs_bench_measures_every_output_and_both_encodings(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.outputs", "--tiny", "--root", str(tmp_path / "b"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "outputs.json").read_text())
    assert set(result["m3_docs_per_s"]) == {"dense", "sparse", "multi_vector", "all_three"}
    assert all(v > 0 for v in result["m3_docs_per_s"].values())
    assert result["splade_docs_per_s"]["splade"] > 0
    sizes = next(iter(result["multi_vector_bytes"].values()))
    assert sizes["float"] > sizes["base64"] > 0
    assert result["splade_graph"]["vocabulary"] == 30522
    assert "| bge-m3-shaped | all_three |" in done.stdout
