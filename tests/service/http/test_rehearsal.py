"""Before ready, each model answers its routes' declared rehearsal through the whole app (its
first client then finds the request path warm); the rehearsal is neither counted nor traced."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from service.api.routes import TABLE
from tests.service.conftest import client_for


def test_every_rehearsal_body_is_a_valid_request_of_its_route():
    rehearsed = [r for r in TABLE if r.rehearsal is not None]
    assert {r.capability for r in rehearsed} == {"encode", "rerank", "classify"}
    for route in rehearsed:
        route.adapter.validate_python({**route.rehearsal, "model": "m"})


def test_a_fresh_server_rehearses_each_model_unseen_by_metrics_and_logs(
    tiny_bundle: Path, ranker_bundle: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO)
    bundles = [f"embedder={tiny_bundle}", f"ranker={ranker_bundle}"]
    with client_for(bundles, api_key="s3cret", access_log=True) as c:
        registry = c.app.state.registry
        served = {m.name: sum(b.submitted for b in m.batchers) for m in registry}
        metrics = c.get("/metrics").text
    # Every model answered its rehearsal (ten rounds of one text, or of one pair) ...
    assert served["embedder"] >= 10 and served["ranker"] >= 10
    assert not [r for r in caplog.records if "rehearsal of" in r.getMessage()]  # all 200
    # ... through the API key, and no request of it is counted or logged.
    assert "headwise_requests_total{" not in metrics
    logged = [r.getMessage() for r in caplog.records if r.name.endswith("access")]
    assert logged and not [m for m in logged if m.startswith("POST")]  # /metrics' GET alone


def test_a_rehearsal_that_fails_is_logged_and_the_server_still_becomes_ready(
    tiny_bundle: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("service.http.rehearsal.ROUNDS", 2)
    route = TABLE.match("POST", "/encode")
    assert route is not None and route.rehearsal is not None
    monkeypatch.setitem(route.rehearsal, "inputs", ["a text"] * 100_000)  # over the input limit
    with client_for(tiny_bundle) as c:
        assert c.get("/ready").status_code == 200
    (warning,) = [r for r in caplog.records if "rehearsal of" in r.getMessage()]
    assert "/encode answered 4" in warning.getMessage()
