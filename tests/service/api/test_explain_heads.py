"""POST /explain with granularity "head" on real exported bundles (an embedder, a BERT reranker,
an XLM-R classifier): each head's importance equals the bundle's attention graph run directly
with onnxruntime, that head's gate 0; the statistics beside it are /attention's; and what cannot
be explained this way is a 4xx naming why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr
from tokenizers import Encoding

from service.engine.sessions import build_session
from tests.service.api import test_explain
from tests.service.api.test_explain import DOC, QUERY, TEXT, Graph, cos, sigmoid, softmax
from tests.service.conftest import client_for

# The explanation tests' bundles and server (module-scoped: built again for this module).
bundles = test_explain.bundles
client = test_explain.client

STATS = ("entropy", "max_weight", "cls_mass", "sep_mass", "mean_distance", "diagonal_mass")


class Gated(Graph):
    """A bundle's attention graph, called directly with head gates."""

    def __init__(self, bundle: Path) -> None:
        super().__init__(bundle)
        self.attention = build_session(bundle / "attention.onnx")
        self.layers, self.heads = self.manifest.num_layers, self.manifest.num_heads

    def gates(self) -> np.ndarray:
        """Whole, then each head left out, layer by layer: (1 + L·h, L, h)."""
        count = self.layers * self.heads
        g = np.ones((1 + count, count), dtype=np.float32)
        g[np.arange(1, 1 + count), np.arange(count)] = 0.0
        return g.reshape(1 + count, self.layers, self.heads)

    def gated(self, enc: Encoding) -> np.ndarray:
        gates = self.gates()
        ids = np.array([enc.ids] * len(gates), dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "head_gates": gates}
        if "token_type_ids" in self.manifest.inputs:
            feeds["token_type_ids"] = np.array([enc.type_ids] * len(gates), dtype=np.int64)
        return self.attention.run(None, feeds)[0].astype(np.float64)


def importance(body: dict) -> np.ndarray:
    rows = body["heads"]
    return np.array(
        [
            [r["importance"] for r in rows if r["layer"] == layer]
            for layer in sorted({r["layer"] for r in rows})
        ]
    )


def test_an_embedders_head_importance_is_one_minus_the_cosine_without_the_head(client, bundles):
    r = client.post("/explain", json={"input": TEXT, "granularity": "head"})
    assert r.status_code == 200, r.text
    body = r.json()
    g = Gated(bundles["embedder"])
    rows = g.gated(g.encode(TEXT))
    want = (1 - cos(rows[:1], rows[1:])).reshape(g.layers, g.heads)
    assert body["granularity"] == "head" and "parts" not in body and "score" not in body
    assert [(h["layer"], h["head"]) for h in body["heads"]] == [
        (layer, head) for layer in range(g.layers) for head in range(g.heads)
    ]
    np.testing.assert_allclose(importance(body), want, atol=1e-4)
    assert want.max() > 1e-3  # some head matters: the check is not of zeros


def test_the_served_whole_equals_encode(client, bundles):
    """The ungated row of the attention graph is the model /encode serves (cosine ~ 1)."""
    g = Gated(bundles["embedder"])
    whole = g.gated(g.encode(TEXT))[0]
    served = np.array(client.post("/encode", json={"inputs": [TEXT]}).json()["embeddings"][0])
    assert cos(whole, served) > 0.99999


def test_similarity_head_importance_is_the_cosine_lost_with_the_head_out_of_both(client, bundles):
    a, b = "a cat sleeps on the mat", "the dog is sleeping outside"
    body = client.post("/explain", json={"similarity": [a, b], "granularity": "head"}).json()
    g = Gated(bundles["embedder"])
    ra, rb = g.gated(g.encode(a)), g.gated(g.encode(b))
    whole = cos(ra[0], rb[0])
    assert body["score"] == pytest.approx(whole, abs=1e-5)
    want = (whole - cos(ra[1:], rb[1:])).reshape(g.layers, g.heads)
    np.testing.assert_allclose(importance(body), want, atol=1e-4)


def test_a_rerankers_head_importance_is_the_relevance_lost(client, bundles):
    body = client.post(
        "/explain", json={"pair": [QUERY, DOC], "model": "ranker", "granularity": "head"}
    ).json()
    g = Gated(bundles["ranker"])
    relevance = sigmoid(g.gated(g.encode(QUERY, DOC))[:, 0])
    assert body["score"] == pytest.approx(relevance[0], abs=1e-5)
    want = (relevance[0] - relevance[1:]).reshape(g.layers, g.heads)
    np.testing.assert_allclose(importance(body), want, atol=1e-4)
    # This random ranker's heads move its relevance by ~1e-5 only: held closer than 1e-4.
    np.testing.assert_allclose(importance(body), want, rtol=1e-2, atol=1e-8)


def test_a_classifiers_head_importance_is_the_targets_probability_lost(client, bundles):
    body = client.post(
        "/explain",
        json={"pair": [QUERY, DOC], "model": "nli", "granularity": "head", "target": "neutral"},
    ).json()
    g = Gated(bundles["nli"])
    p = softmax(g.gated(g.encode(QUERY, DOC)))[:, 2]  # neutral
    assert body["target"] == "neutral"
    np.testing.assert_allclose(
        importance(body), (p[0] - p[1:]).reshape(g.layers, g.heads), atol=1e-4
    )


def test_the_statistics_beside_are_attentions_and_their_spearman_is_scipys(client):
    body = client.post("/explain", json={"input": TEXT, "granularity": "head"}).json()
    maps = client.post("/attention", json={"input": TEXT}).json()
    stats = {(s["layer"], s["head"]): s for s in maps["stats"]}
    for h in body["heads"]:
        for name in STATS:
            assert h[name] == pytest.approx(stats[h["layer"], h["head"]][name], abs=1e-6)
    values = [h["importance"] for h in body["heads"]]
    for name in STATS:
        column = [h[name] for h in body["heads"]]
        want = spearmanr(values, column).statistic
        got = body["head_spearman"][name]
        assert (got is None and np.isnan(want)) or got == pytest.approx(want, abs=1e-9)


def test_over_the_work_budget_is_413_counting_every_heads_pass(bundles):
    with client_for(bundles["embedder"], explain_max_work=116) as c:  # 13 x 9 = 117
        r = c.post("/explain", json={"input": TEXT, "granularity": "head"})
        assert c.post("/explain", json={"input": "the cat", "granularity": "head"}).status_code == 200
    assert r.status_code == 413
    message = r.json()["error"]["message"]
    assert "HEADWISE_EXPLAIN_MAX_WORK" in message and "13 tokens x 9 passes" in message


def test_without_the_attention_graph_head_granularity_is_400_saying_why(bundles):
    with client_for(bundles["embedder"], attention_enabled=False) as c:
        r = c.post("/explain", json={"input": TEXT, "granularity": "head"})
        assert r.status_code == 400
        assert "HEADWISE_ATTENTION_ENABLED" in r.json()["error"]["message"]
        assert c.post("/explain", json={"input": TEXT}).status_code == 200  # tokens still


def test_a_bundle_exported_before_head_gates_is_told_to_export_again(bundles, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(bundles["embedder"], old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["graphs"]["attention"]["gated_parity"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    with client_for(str(old)) as c:
        r = c.post("/explain", json={"input": TEXT, "granularity": "head"})
        assert r.status_code == 400
        assert "export it again" in r.json()["error"]["message"]
        assert c.post("/attention", json={"input": TEXT}).status_code == 200
