"""Every refusal speaks the dialect of its route, wherever it is raised: the middleware (401,
413 body, 415), FastAPI's validation (422), the lane, a pipeline (413 work, 429 queue full),
the router (404 path, 405 method). TEI's clients parse TEI's shape, Cohere's Cohere's, OpenAI's
OpenAI's; a path no route declares keeps headwise's."""

from __future__ import annotations

import threading

import pytest

from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest
from tests.waiting import until

KEY = {"authorization": "Bearer k"}


def tei_shaped(body: object) -> bool:
    return isinstance(body, dict) and set(body) == {"error", "error_type"} and isinstance(
        body["error"], str
    )


def cohere_shaped(body: object) -> bool:
    return isinstance(body, dict) and isinstance(body.get("message"), str) and "id" in body


def openai_shaped(body: object) -> bool:
    return isinstance(body, dict) and isinstance(body.get("error"), dict) and body["error"]["message"]


# path -> (the dialect's check, a valid body of one text or pair, which backend serves it)
ROUTES = {
    "/embed": (tei_shaped, {"inputs": "the cat"}, "embedder"),
    "/": (tei_shaped, {"inputs": "the cat"}, "embedder"),  # the first model is an embedder
    "/rerank": (tei_shaped, {"query": "cat", "texts": ["the cat"]}, "ranker"),
    "/predict": (tei_shaped, {"inputs": "the cat"}, "classifier"),
    "/v1/rerank": (cohere_shaped, {"query": "cat", "documents": ["the cat"]}, "ranker"),
    "/v2/rerank": (cohere_shaped, {"model": "ranker", "query": "cat", "documents": ["the cat"]}, "ranker"),
    "/v1/embeddings": (openai_shaped, {"input": "the cat"}, "embedder"),
    "/encode": (openai_shaped, {"inputs": "the cat"}, "embedder"),
}
INVALID = {  # a body each route refuses with 422
    "/embed": {"inputs": 3},
    "/": {"inputs": 3},
    "/rerank": {"query": "cat"},
    "/predict": {"inputs": {"a": 1}},
    "/v1/rerank": {"query": "cat", "documents": "not a list"},
    "/v2/rerank": {"query": "cat", "documents": ["x"]},
    "/v1/embeddings": {"input": 3},
    "/encode": {"inputs": 3},
}


@pytest.fixture(scope="module")
def served():
    backends = {
        "embedder": FakeBackend(fake_manifest("embedder")),
        "ranker": FakeBackend(fake_manifest("ranker", d=1, task="rerank", labels=["score"])),
        "classifier": FakeBackend(
            fake_manifest("classifier", d=3, task="classify", labels=["a", "b", "c"])
        ),
    }
    settings = {"api_key": "k", "max_body_bytes": 2048, "max_queue_texts": 1}
    with client_for(
        ["a", "b", "c"], loader=fake_loader(*backends.values()), **settings
    ) as c:
        yield c, backends


@pytest.mark.parametrize("path", ROUTES)
def test_401_without_the_key(served, path):
    c, _ = served
    shaped, body, _ = ROUTES[path]
    r = c.post(path, json=body)
    assert r.status_code == 401 and shaped(r.json()), r.text
    assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("path", ROUTES)
def test_413_for_a_body_over_the_limit(served, path):
    c, _ = served
    shaped, _, _ = ROUTES[path]
    r = c.post(path, content=b'{"inputs": "' + b"x" * 4096 + b'"}', headers={**KEY, "content-type": "application/json"})
    assert r.status_code == 413 and shaped(r.json()), r.text


@pytest.mark.parametrize("path", ROUTES)
def test_422_for_an_invalid_body(served, path):
    c, _ = served
    shaped, _, _ = ROUTES[path]
    r = c.post(path, json=INVALID[path], headers=KEY)
    assert r.status_code == 422 and shaped(r.json()), r.text


@pytest.mark.parametrize("path", ROUTES)
def test_415_for_a_body_that_is_not_json(served, path):
    c, _ = served
    shaped, _, _ = ROUTES[path]
    r = c.post(path, content=b"inputs=x", headers={**KEY, "content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and shaped(r.json()), r.text


@pytest.mark.parametrize("path", ROUTES)
def test_429_when_the_queue_is_full(served, path):
    """One request held in the backend, one queued (the limit is 1 text), then one more."""
    c, backends = served
    shaped, body, who = ROUTES[path]
    backend = backends[who]
    registry = c.app.state.registry
    model = registry.models[who]
    batcher = (model.embed or model.score).batcher
    backend.release.clear()
    backend.entered.clear()
    results: list[int] = []

    def send() -> None:
        results.append(c.post(path, json=body, headers=KEY).status_code)

    first = threading.Thread(target=send)
    first.start()
    try:
        assert backend.entered.wait(10)
        second = threading.Thread(target=send)
        second.start()
        until(lambda: batcher.depth >= 1, "the second request to queue")
        r = c.post(path, json=body, headers=KEY)
        assert r.status_code == 429 and shaped(r.json()), r.text
        assert int(r.headers["retry-after"]) >= 1
    finally:
        backend.release.set()
        first.join(10)
        second.join(10)
    assert results == [200, 200]


def test_405_carries_allow_in_the_routes_dialect(served):
    c, _ = served
    r = c.get("/embed", headers=KEY)
    assert r.status_code == 405 and tei_shaped(r.json()) and r.headers["allow"] == "POST"
    r = c.get("/v2/rerank", headers=KEY)
    assert r.status_code == 405 and cohere_shaped(r.json()) and "POST" in r.headers["allow"]


def test_a_model_of_another_task_is_400_in_the_routes_dialect(served):
    c, _ = served
    r = c.post("/v2/rerank", json={**ROUTES["/v2/rerank"][1], "model": "embedder"}, headers=KEY)
    assert r.status_code == 400 and cohere_shaped(r.json())
    r = c.post("/encode", json={"inputs": "x", "model": "ranker"}, headers=KEY)
    assert r.status_code == 400 and openai_shaped(r.json())
    r = c.post("/predict", json={"inputs": "x", "model": "ranker"}, headers=KEY)
    assert r.status_code == 400 and tei_shaped(r.json())


def test_an_unknown_path_keeps_headwises_shape(served):
    c, _ = served
    r = c.post("/no/such/route", json={}, headers=KEY)
    assert r.status_code == 404 and openai_shaped(r.json())


def test_voyage_and_cohere_share_v1_rerank_errors_carry_both_vendors_fields(served):
    c, _ = served
    r = c.post("/v1/rerank", json={"query": "q", "documents": [], "top_k": 1}, headers=KEY)
    assert r.status_code == 422
    body = r.json()
    assert cohere_shaped(body) and body["detail"] == body["message"]  # Voyage reads `detail`


def test_infinity_shares_teis_rerank_path_and_its_refusals_are_teis(served):
    c, _ = served
    r = c.post("/rerank", json={"query": "q", "documents": []}, headers=KEY)
    assert r.status_code == 422 and tei_shaped(r.json())
