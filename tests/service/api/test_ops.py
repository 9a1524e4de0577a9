"""/info on a server with several models: TEI's Info fields for the model that answers the
route a TEI client is about to call (?route=) or the one it names (?model=), and which model
answers each route (served_by)."""

from __future__ import annotations

import pytest

from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest


@pytest.fixture(scope="module")
def three():
    backends = [
        FakeBackend(fake_manifest("embedder")),
        FakeBackend(fake_manifest("ranker", d=1, task="rerank", labels=["score"])),
        FakeBackend(fake_manifest("nli", d=3, task="classify", labels=["a", "b", "c"])),
    ]
    with client_for(["a", "b", "c"], loader=fake_loader(*backends)) as c:
        yield c


def test_info_describes_the_first_model_by_default(three):
    info = three.get("/info").json()
    assert info["model_id"] == "embedder" and info["model_type"] == {"embedding": {"pooling": "mean"}}


def test_info_for_a_route_gives_teis_fields_of_the_model_that_answers_it(three):
    info = three.get("/info", params={"route": "/rerank"}).json()
    assert info["served_model_name"] == "ranker"
    assert info["model_type"] == {"reranker": {"id2label": {"0": "score"}, "label2id": {"score": 0}}}
    assert three.get("/info", params={"route": "/predict"}).json()["model_type"]["classifier"]


def test_info_for_a_named_model(three):
    assert three.get("/info", params={"model": "nli"}).json()["served_model_name"] == "nli"
    r = three.get("/info", params={"model": "nope"})
    assert r.status_code == 422 and "embedder, ranker, nli" in r.json()["error"]["message"]


def test_served_by_names_the_model_for_every_route_that_runs_one(three):
    served = three.get("/info").json()["served_by"]
    assert served["/encode"] == served["/v1/embeddings"] == served["/embed"] == "embedder"
    assert served["/rerank"] == served["/v1/rerank"] == served["/v2/rerank"] == "ranker"
    assert served["/predict"] == "nli"


def test_every_model_carries_its_own_tei_info(three):
    models = {m["name"]: m for m in three.get("/info").json()["models"]}
    assert models["ranker"]["tei"]["model_type"] == {"reranker": {"id2label": {"0": "score"}, "label2id": {"score": 0}}}
    assert "/rerank" in models["ranker"]["routes"]
