"""bench.images end to end on a tiny CLIP tower, small numbers: it must not rot."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_images_bench_measures_three_paths_on_the_same_pictures(tmp_path):
    from bench import images

    args = ["--tiny", "--images", "8", "--batch", "4", "--clients", "2"]
    assert images.main([*args, "--cache", str(tmp_path / "cache"), "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "images.json").read_text())
    for path in ("transformers", "graph", "http"):
        assert out[path]["images_per_s"] > 0  # measured, not asserted: a tiny tower is noise
    for path in ("transformers", "graph"):
        assert 0 < out[path]["preprocessing_share"] < 1
    assert out["http"]["single_p50_ms"] > 0
    table = (tmp_path / "images.md").read_text()
    assert "| headwise over HTTP (2 clients, base64 JSON) |" in table
    assert "preprocessing share" in table
