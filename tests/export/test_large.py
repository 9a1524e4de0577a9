"""A checkpoint past 2 GiB exports through the CLI within 2.5x its size in RAM, verifies (every
file's sha256, its external data included) and serves: /encode equals transformers, /info
shows the graph's files and sizes. Its files (about 9 GB at the peak) are removed at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bench.children import run_measured
from service.bundle import load_bundle
from tests.export.large import TEXTS
from tests.service.conftest import client_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
GB = 1e9


@pytest.fixture(scope="module")
def large(family_tokenizers, tmp_path_factory):
    root = tmp_path_factory.mktemp("large")
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.export.large",
                str(root / "model"),
                str(family_tokenizers["wordpiece"]),
            ],
            check=True,
            timeout=600,
        )
        checkpoint = (root / "model" / "model.safetensors").stat().st_size
        assert checkpoint > 2**31
        export = run_measured(
            [
                sys.executable,
                "-m",
                "export.cli",
                "--model",
                str(root / "model"),
                "--out",
                str(root / "bundle"),
            ],
            env={**os.environ, "PYTHONPATH": os.getcwd()},
            timeout=1000,
        )
        assert export.returncode == 0, export.stderr[-3000:]
        yield root, checkpoint, export
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_export_keeps_the_weights_beside_each_graph_within_2_5x_the_checkpoint_in_ram(large):
    root, checkpoint, export = large
    print(
        f"\ncheckpoint {checkpoint / GB:.2f} GB: export {export.seconds:.0f} s, "
        f"peak RSS {export.peak_rss_bytes / GB:.2f} GB ({export.peak_rss_bytes / checkpoint:.2f}x)"
    )
    assert export.peak_rss_bytes < 2.5 * checkpoint
    manifest = load_bundle(root / "bundle").manifest  # every sha256, data files included
    for key in ("encoder", "attention"):
        graph = manifest.graphs[key]
        assert graph.bytes < 10e6 and [d.file for d in graph.data] == [graph.file + ".data"]
        assert graph.total_bytes > checkpoint * 0.99
        assert graph.parity.min_cosine > 0.99999
    assert manifest.graphs["encoder"].fused


def test_the_bundle_serves_transformers_embeddings_and_info_shows_its_files(large):
    root, _, _ = large
    want = np.load(root / "reference.npy")
    with client_for(root / "bundle", attention_enabled=False) as c:
        r = c.post("/encode", json={"inputs": TEXTS, "normalize": False})
        info = c.get("/info").json()
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["embeddings"]), want, atol=1e-4)
    files = info["graph_files"]["encoder"]
    assert set(files) == {"encoder.onnx", "encoder.onnx.data"}
    assert files["encoder.onnx.data"] == (root / "bundle" / "encoder.onnx.data").stat().st_size
    assert info["memory"]["models_bytes"] == sum(files.values())
