"""Overload, deadlines and disconnects: answered quickly, nothing lost, nothing computed twice."""

from __future__ import annotations

import asyncio
import socket
import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from bench.loadgen import answers, build_requests
from bench.server import free_port
from service.http.app import create_app
from service.settings import Settings
from tests.live import serve
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest
from tests.waiting import until


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@pytest.mark.slow
def test_storm_is_answered_429_quickly_and_accepted_requests_complete(default_bundle, tmp_path):
    total, concurrency = 3000, 300
    env = {"HEADWISE_MAX_QUEUE_TEXTS": "64", "HEADWISE_ATTENTION_ENABLED": "false"}
    with serve(default_bundle, tmp_path, env=env) as server:
        rss_before = peak_rss_mb(server.process.pid)
        text = "overload is answered with 429 and a Retry-After header " * 3
        requests = build_requests(server.url, "/encode", [f"{i} {text}" for i in range(total)])
        t0 = time.monotonic()
        # Raw asyncio streams (bench/loadgen.py): httpx's pool paced the storm it was to be.
        results = asyncio.run(asyncio.wait_for(answers(server.url, requests, concurrency), 300))
        elapsed = time.monotonic() - t0
        failures = [type(r).__name__ for r, _ in results if isinstance(r, Exception)]
        assert not failures, (
            f"{len(failures)} transport errors: {set(failures)}\n{server.output()[-3000:]}"
        )
        codes = [r.status_code for r, _ in results]
        ok = [(r, s) for r, s in results if r.status_code == 200]
        refused = [(r, s) for r, s in results if r.status_code == 429]
        assert len(ok) + len(refused) == total, {c: codes.count(c) for c in set(codes)}
        assert refused, "the storm never filled the queue"
        assert all(r.headers.get("retry-after") for r, _ in refused)
        assert all(len(r.json()["embeddings"][0]) == 384 for r, _ in ok)
        # A refusal costs less than being served: it never waits for the model.
        assert statistics.median(s for _, s in refused) < statistics.median(s for _, s in ok)
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert httpx.post(f"{server.url}/encode", json={"inputs": "after"}).status_code == 200
        peak = peak_rss_mb(server.process.pid)
        print(
            f"\nstorm: {total} requests at {concurrency} connections in {elapsed:.1f}s: "
            f"{len(ok)} x 200, {len(refused)} x 429; peak RSS {rss_before:.0f} -> {peak:.0f} MB"
        )
        assert peak < rss_before + 500  # bounded queue, bounded memory


def fake_client(**overrides):
    backend = FakeBackend(fake_manifest("fake"))
    return backend, client_for(Path("fake"), loader=fake_loader(backend), **overrides)


def test_deadline_answers_503_and_frees_the_slot():
    backend, client = fake_client(request_timeout_s=0.5)
    with client as c:
        backend.release.clear()
        r = c.post("/encode", json={"inputs": "stuck behind a slow batch"})
        assert r.status_code == 503 and r.headers["retry-after"]
        assert "did not finish within 0.5 s" in r.json()["error"]["message"]
        backend.release.set()
        assert c.post("/encode", json={"inputs": "next"}).status_code == 200
        assert c.app.state.registry.models["fake"].embed.batcher.depth == 0


def queue_depth(url: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        if family.name == "headwise_queue_depth":
            return sum(s.value for s in family.samples if s.labels["path"] == "encode")
    return 0.0


def test_a_client_that_disconnects_mid_queue_costs_no_compute_and_leaves_the_gauge():
    backend = FakeBackend(fake_manifest("fake"))
    settings = Settings(bundle=Path("fake"), port=free_port())
    app = create_app(settings, loader=fake_loader(backend))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"
    try:
        until(lambda: server.started, "the server to start")
        backend.release.clear()
        blocker = threading.Thread(
            target=lambda: httpx.post(f"{url}/encode", json={"inputs": "hello"}, timeout=30)
        )
        blocker.start()
        assert backend.entered.wait(10), "the blocker never reached the backend"
        body = b'{"inputs": "zebra zebra zebra zebra"}'
        with socket.create_connection(("127.0.0.1", settings.port)) as s:
            s.sendall(
                b"POST /encode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            until(lambda: queue_depth(url) == 1, "the request to be queued behind the blocker")
        until(lambda: queue_depth(url) == 0, "the gauge to drop when the client went away")
        backend.release.set()
        blocker.join(10)
        assert httpx.post(f"{url}/encode", json={"inputs": "one"}).status_code == 200
        zebra = backend.tokenizer.token_to_id("zebra")
        assert not any(zebra in row for row in backend.seen), "the disconnected request was computed"
        assert len(backend.seen) == 2
    finally:
        backend.release.set()
        server.should_exit = True
        thread.join(10)


SCORE_ROUTES = {
    "/rerank": lambda docs: {"query": "the cat", "texts": docs},
    "/v1/rerank": lambda docs: {"query": "the cat", "documents": docs},
    "/v2/rerank": lambda docs: {"model": "ranker", "query": "the cat", "documents": docs},
    "/predict": lambda docs: {"inputs": [["the cat", d] for d in docs]},
}


@pytest.mark.parametrize("path", SCORE_ROUTES)
def test_score_work_that_cannot_finish_behind_the_running_batch_is_refused_at_once(path):
    """A big request to a busy reranker or classifier is answered 429 with Retry-After at once,
    before any of it is queued, not 503 after waiting out its deadline."""
    task = "classify" if path == "/predict" else "rerank"
    labels = ["a", "b"] if task == "classify" else ["score"]
    backend = FakeBackend(fake_manifest("ranker", d=len(labels), task=task, labels=labels))
    # 12.5 s at the default headroom (0.8): admission plans to fill 10 s of it.
    settings = {"capacity_tokens_per_s": 100, "request_timeout_s": 12.5}
    with client_for(Path("r"), fake_loader(backend), **settings) as c:
        batcher = c.app.state.registry.models["ranker"].score.batcher
        backend.release.clear()
        backend.entered.clear()
        busy = threading.Thread(
            target=lambda: c.post(path, json=SCORE_ROUTES[path](["a dog and a cat"] * 12))
        )
        busy.start()  # ~12 x 9 tokens: about 1 s of work at 100 tokens/s, now running
        try:
            assert backend.entered.wait(10)
            seen, depth = len(backend.seen), batcher.depth
            r = c.post(path, json=SCORE_ROUTES[path](["the cat sat on a warm mat"] * 75))  # ~9 s alone
            # 429 comes only from admission (a missed deadline is 503): nothing was queued.
            assert r.status_code == 429, r.text
            assert int(r.headers["retry-after"]) >= 1
            assert batcher.depth == depth and len(backend.seen) == seen
        finally:
            backend.release.set()
            busy.join(20)
