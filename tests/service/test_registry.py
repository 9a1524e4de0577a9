"""Several models in one server: lookup by name, defaults, errors, lists, metrics, readiness.

On fake backends: no exported graph, no torch, seconds to run.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.http.app import create_app
from service.metrics import Metrics
from service.registry import ModelSpec, build_model, unique_names
from service.settings import Settings
from service.tensors import Batch, l2_normalize
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest


def two_models(**overrides):
    small = FakeBackend(fake_manifest("small", d=8))
    large = FakeBackend(fake_manifest("org/large", d=16, layers=3, heads=4))
    client = client_for(["a", "b"], loader=fake_loader(small, large), **overrides)
    return small, large, client


def expected(backend: FakeBackend, text: str) -> np.ndarray:
    (enc,) = backend.tokenize([text])
    return l2_normalize(backend.vectors(Batch.of([enc.ids])))[0]


def test_each_model_answers_with_its_own_vectors():
    small, large, client = two_models()
    with client as c:
        for name, backend, d in (("small", small, 8), ("org/large", large, 16)):
            body = c.post("/encode", json={"inputs": "the cat", "model": name}).json()
            assert body["model"] == name and body["dimensions"] == d
            np.testing.assert_allclose(body["embeddings"][0], expected(backend, "the cat"), atol=1e-6)
            oa = c.post("/v1/embeddings", json={"input": "the cat", "model": name}).json()
            np.testing.assert_allclose(oa["data"][0]["embedding"], expected(backend, "the cat"), atol=1e-6)


def test_without_a_model_the_first_answers_and_the_response_names_it():
    _, _, client = two_models()
    with client as c:
        assert c.post("/encode", json={"inputs": "x"}).json()["model"] == "small"
        assert c.post("/tokenize/details", json={"inputs": "x"}).json()["model"] == "small"
        assert c.post("/attention", json={"input": "the dog"}).json()["model"] == "small"


def test_an_unknown_name_among_several_is_404_listing_the_served_names():
    _, _, client = two_models()
    with client as c:
        r = c.post("/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"})
        assert r.status_code == 404
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
        assert "small" in err["message"] and "org/large" in err["message"]


def test_with_one_model_any_name_is_accepted():
    backend = FakeBackend(fake_manifest("only"))
    with client_for(Path("x"), loader=fake_loader(backend)) as c:
        r = c.post("/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"})
        assert r.status_code == 200 and r.json()["model"] == "text-embedding-3-small"
        assert c.post("/encode", json={"inputs": "x", "model": "whatever"}).json()["model"] == "only"


def test_a_model_of_another_task_is_400_naming_its_task_and_routes():
    embedder = FakeBackend(fake_manifest("embedder"))
    ranker = FakeBackend(fake_manifest("ranker", task="rerank", labels=["score"]))
    with client_for(["a", "b"], loader=fake_loader(embedder, ranker)) as c:
        r = c.post("/encode", json={"inputs": "x", "model": "ranker"})
        assert r.status_code == 400
        msg = r.json()["error"]["message"]
        assert "rerank model" in msg and "/encode" in msg
        assert c.post("/encode", json={"inputs": "x"}).json()["model"] == "embedder"


def test_openai_model_list_and_retrieve_by_an_id_with_a_slash():
    _, _, client = two_models()
    with client as c:
        listed = c.get("/v1/models").json()
        assert [m["id"] for m in listed["data"]] == ["small", "org/large"]
        assert all(isinstance(m["created"], int) and m["created"] > 0 for m in listed["data"])
        one = c.get("/v1/models/org%2Flarge").json()
        assert one["id"] == "org/large" and one["object"] == "model"
        assert c.get("/v1/models/org/large").json()["id"] == "org/large"
        missing = c.get("/v1/models/nope")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_info_lists_every_model():
    _, _, client = two_models()
    with client as c:
        info = c.get("/info").json()
        assert info["model"] == "small"  # the first, at the top, as with one model
        large = info["models"][1]
        assert (large["name"], large["task"], large["dimensions"]) == ("org/large", "embed", 16)
        assert (large["num_layers"], large["num_heads"]) == (3, 4)
        assert large["device"] == "cpu" and large["graph"] == "encoder"
        assert "/encode" in large["routes"] and "graph_bytes" in large


def test_metrics_carry_each_models_series():
    _, _, client = two_models()
    with client as c:
        c.post("/encode", json={"inputs": "x", "model": "small"})
        c.post("/encode", json={"inputs": "x", "model": "org/large"})
        families = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
        batches = {s.labels["model"] for s in families["headwise_batch_size"].samples}
        assert batches == {"small", "org/large"}
        requests = {
            s.labels["model"]
            for s in families["headwise_requests"].samples
            if s.labels["endpoint"] == "/encode"
        }
        assert requests == {"small", "org/large"}
        depth = {s.labels["model"]: s.value for s in families["headwise_queue_depth"].samples}
        assert depth == {"small": 0, "org/large": 0}


def test_ready_only_when_every_model_is_warm():
    gate = threading.Event()
    fast = FakeBackend(fake_manifest("fast"))
    slow = FakeBackend(fake_manifest("slow"))
    slow.warmup = lambda: gate.wait(10)
    with client_for(["a", "b"], loader=fake_loader(fast, slow), wait_ready=False) as c:
        assert c.get("/ready").status_code == 503
        assert c.post("/encode", json={"inputs": "x", "model": "fast"}).status_code == 503
        gate.set()
        c.portal.call(c.app.state.registry.wait_ready)
        assert c.get("/ready").status_code == 200


def test_probes_say_ready_once_every_worker_came_up_while_this_one_serves():
    """HEADWISE_WORKERS: a worker ready says so in the flags it shares with the others; its
    readiness probes (/ready, the Open Inference Protocol's) answer 503 loading until every
    flag is set, while it already serves requests."""
    from fastapi.testclient import TestClient

    from service.http.workers import Peers

    flags = [0, 0]
    app = create_app(
        Settings(bundles=["a"]), loader=fake_loader(FakeBackend(fake_manifest("a"))),
        peers=Peers(flags, 1),
    )  # fmt: skip
    with TestClient(app) as c:
        c.portal.call(app.state.registry.wait_ready)
        assert flags == [0, 1]
        r = c.get("/ready")
        assert (r.status_code, r.json()["status"]) == (503, "loading")
        assert c.get("/v2/health/ready").status_code == 503
        assert c.post("/encode", json={"inputs": "x"}).status_code == 200
        flags[0] = 1
        assert c.get("/ready").status_code == 200
        assert c.get("/v2/health/ready").status_code == 200


def test_concurrent_requests_mixing_models_each_get_their_own_vectors():
    small, large, _ = two_models()

    async def main():
        app = create_app(Settings(bundles=["a", "b"]), loader=fake_loader(small, large))
        async with app.router.lifespan_context(app):
            await app.state.registry.wait_ready()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                names = ["small", "org/large"] * 40
                texts = [f"the {w} cat" for w in ("one", "two", "three", "dog") * 20]
                rs = await asyncio.gather(
                    *(
                        c.post("/encode", json={"inputs": t, "model": n})
                        for t, n in zip(texts, names, strict=True)
                    )
                )
            return list(zip(texts, names, rs, strict=True))

    for text, name, r in asyncio.run(main()):
        assert r.status_code == 200
        backend = small if name == "small" else large
        np.testing.assert_allclose(r.json()["embeddings"][0], expected(backend, text), atol=1e-6)


def test_bundle_specs_parse_names_and_paths():
    assert ModelSpec.parse("bundles/a") == ModelSpec(Path("bundles/a"))
    assert ModelSpec.parse("ranker=/srv/r") == ModelSpec(Path("/srv/r"), "ranker")
    with pytest.raises(ValueError, match="NAME=DIR"):
        ModelSpec.parse("=/srv/r")


def test_bundles_come_from_one_comma_separated_variable(monkeypatch):
    monkeypatch.setenv("HEADWISE_BUNDLES", "a=/x, /y")
    assert Settings().bundle_specs() == ["a=/x", "/y"]
    monkeypatch.delenv("HEADWISE_BUNDLES")
    monkeypatch.setenv("HEADWISE_BUNDLE", "/z")
    assert Settings().bundle_specs() == ["/z"]


def test_duplicate_names_stop_the_start_naming_both_folders():
    specs = [ModelSpec(Path("/one")), ModelSpec(Path("/two"))]
    with pytest.raises(ValueError, match="two bundles are named 'm'.*/one.*/two"):
        unique_names(specs, ["m", "m"])
    assert unique_names([ModelSpec(Path("/one"), "x"), specs[1]], ["m", "m"]) == ["x", "m"]


@pytest.mark.parametrize("inline", [True, False])
def test_only_a_backend_that_allows_it_gets_inline_runs(inline):
    backend = FakeBackend(fake_manifest("m"))
    backend.inline = inline
    settings = Settings(bundle=Path("m"), inline_max_tokens=48)
    model = build_model("m", backend, settings, Metrics())
    assert {b.policy.inline_max_tokens for b in model.serving_batchers} == ({48} if inline else {0})
