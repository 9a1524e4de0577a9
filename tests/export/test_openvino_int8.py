"""OpenVINO's own int8 graph (export/openvino_int8.py): NNCF's post-training quantisation of the
fused graph, written as OpenVINO IR beside ONNX Runtime's int8 graph by `--int8`, judged by the
same retrieval gate, served with HEADWISE_RUNTIME=openvino HEADWISE_PRECISION=int8 (and judged
again at start), refused with the reason where the bundle lacks it.

The model is all-MiniLM-L6-v2's real weights (random weights have no retrieval to keep)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from export import verify
from service.engine.openvino_session import OpenVinoSession
from service.engine.sessions import build_session
from service.manifest import Manifest
from tests.service.conftest import client_for

TEXTS = ["The cat sat on a warm mat.", "a", "Return the list of all running tasks, in order."]


@pytest.fixture(scope="module")
def int8_bundle(default_loaded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.bundle import ExportOptions, build_bundle

    out = tmp_path_factory.mktemp("ov-int8") / "bundle"
    build_bundle(default_loaded, out, ExportOptions(int8=True, int8_pairs=300))
    return out


def test_int8_writes_openvinos_own_graph_gated_on_retrieval(int8_bundle: Path):
    manifest = Manifest.model_validate_json((int8_bundle / "manifest.json").read_text())
    entry = manifest.graphs["encoder_int8_openvino"]
    assert entry.file == "encoder.int8.openvino.xml" and entry.precision == "int8"
    assert [d.file for d in entry.data] == ["encoder.int8.openvino.bin"]  # listed, hashed
    assert entry.quantised and entry.op_counts["FakeQuantize"] == entry.quantised
    q = entry.quality
    assert q is not None and q.pairs == 300
    assert q.fp32_recall_at_10 - q.recall_at_10 <= q.max_drop_allowed
    assert q.fp32_mrr - q.mrr <= q.max_drop_allowed
    # Its vectors on the probe texts, run here, near fp32's (and the manifest says so).
    tok = Tokenizer.from_file(str(int8_bundle / "tokenizer.json"))
    feeds = verify.encode(tok, TEXTS, manifest.inputs, manifest.special_tokens.pad)
    fp32 = build_session(int8_bundle / "encoder.onnx").run(["sentence_embedding"], feeds)[0]
    ov = OpenVinoSession(int8_bundle / entry.file, "int8")
    got = ov.run(["sentence_embedding"], feeds)[0]
    cos = (got * fp32).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(fp32, axis=1)
    assert cos.min() >= verify.INT8_MIN_COSINE and cos.min() < 0.99999  # int8, not fp32


def test_a_server_asked_for_openvino_int8_serves_it_and_says_so(int8_bundle: Path):
    with client_for(int8_bundle, runtime="openvino", precision="int8", calibration_s=0.5) as c:
        info = c.get("/info").json()
        vectors = c.post("/encode", json={"inputs": TEXTS}).json()["embeddings"]
        metrics = c.get("/metrics").text
    assert (info["runtime"], info["precision"]) == ("openvino", "int8"), info["runtime_reason"]
    assert "NNCF" in info["runtime_reason"]
    judged = info["runtime_quality"]  # judged again at start, on this machine
    assert judged["fp32_recall_at_10"] - judged["recall_at_10"] <= 0.5
    assert 'runtime="openvino"' in metrics and 'precision="int8"' in metrics
    with client_for(int8_bundle, runtime="onnxruntime", precision="fp32") as c:
        fp32 = c.post("/encode", json={"inputs": TEXTS}).json()["embeddings"]
    a, b = np.array(vectors), np.array(fp32)
    assert ((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min() >= 0.95


def test_openvino_int8_from_a_bundle_without_it_is_refused_naming_the_export(default_bundle):
    from service.engine.runtime import DeviceUnavailable

    with (
        pytest.raises(DeviceUnavailable, match="export with --int8"),
        client_for(default_bundle, runtime="openvino", precision="int8"),
    ):
        pass


@pytest.mark.parametrize("held_out", [1043, 1040, 900, 41, 12])
def test_calibration_has_texts_whatever_the_standard_library_holds(
    held_out: int, family_tokenizers, monkeypatch
):
    """A slim image's Python has fewer held-out docstring pairs than the first 1,000 that
    bench.runtimes measures (CI's image build failed on NNCF's "Subset size must be positive"):
    calibration then takes the last pairs it has, and never none."""
    from export import openvino_int8
    from service.engine import quality

    pairs = quality.Pairs(
        [f"query {i}" for i in range(held_out)], [f"doc {i}" for i in range(held_out)]
    )
    monkeypatch.setattr(quality, "docstring_pairs", lambda split="gate", limit=None: pairs)
    tok = Tokenizer.from_file(str(family_tokenizers["wordpiece"]))
    feeds = openvino_int8.calibration_feeds(tok, ["input_ids", "attention_mask"], 0)
    calibrated = sum(len(f["input_ids"]) for f in feeds)
    start = openvino_int8.calibration_start(held_out)
    assert calibrated == 2 * (held_out - start) > 0
    if held_out - openvino_int8.CALIBRATION_FROM >= openvino_int8.CALIBRATION_PAIRS:
        assert start == openvino_int8.CALIBRATION_FROM  # bench.runtimes's check left alone
    else:
        assert held_out - start == min(held_out, openvino_int8.CALIBRATION_PAIRS)
