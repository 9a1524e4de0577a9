"""Every gauge is true on every path that changes it, seen through HTTP: enqueue, batch taken,
deadline expiry, shutdown (a client disconnect: test_overload.py), and /attention's budget."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx

from service.http.app import create_app
from service.settings import Settings
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest
from tests.waiting import until


def gauge(app, name: str, **labels: str) -> float | None:
    return app.state.metrics.registry.get_sample_value(name, labels)


def depth(app, path: str = "encode") -> float | None:
    return gauge(app, "headwise_queue_depth", path=path, model="fake")


def in_background(c, body: dict, path: str = "/encode") -> tuple[threading.Thread, list]:
    answers: list = []
    t = threading.Thread(target=lambda: answers.append(c.post(path, json=body)))
    t.start()
    return t, answers


def held_with_one_queued(c, backend: FakeBackend, path: str = "/encode", key: str = "inputs"):
    backend.release.clear()
    blocker = in_background(c, {key: "the cat"}, path)
    assert backend.entered.wait(10), "the blocker never reached the backend"
    queued = in_background(c, {key: "the dog"}, path)
    until(lambda: depth(c.app, path.strip("/")) == 1, "the second request to be queued")
    return blocker, queued


def test_depth_counts_the_enqueued_text_and_drops_when_its_batch_is_taken():
    backend = FakeBackend(fake_manifest("fake"))
    with client_for(Path("fake"), fake_loader(backend)) as c:
        (t1, a1), (t2, a2) = held_with_one_queued(c, backend)
        backend.release.set()
        t1.join(10), t2.join(10)
        assert [a1[0].status_code, a2[0].status_code] == [200, 200]
        assert depth(c.app) == 0
        assert gauge(c.app, "headwise_inflight_requests") == 0


def test_depth_drops_when_a_queued_request_passes_its_deadline():
    backend = FakeBackend(fake_manifest("fake"))
    # 2 s: long enough for the queued text to be seen in the gauge on a busy machine (at 0.5 s
    # it once expired between two looks), short enough to wait out.
    with client_for(Path("fake"), fake_loader(backend), request_timeout_s=2.0) as c:
        (t1, _), (t2, a2) = held_with_one_queued(c, backend)
        t2.join(10)
        assert a2[0].status_code == 503
        until(lambda: depth(c.app) == 0, "the expired text to leave the gauge")
        backend.release.set()
        t1.join(10)
        until(lambda: backend.seen, "the blocker's batch to finish")
        dog = backend.tokenizer.token_to_id("dog")
        assert not any(dog in row for row in backend.seen), "the expired text was computed"


def test_depth_is_zero_after_shutdown_drains_the_queue():
    backend = FakeBackend(fake_manifest("fake"))
    app = create_app(Settings(bundle=Path("fake")), loader=fake_loader(backend))

    async def main():
        lifespan = app.router.lifespan_context(app)
        await lifespan.__aenter__()
        await app.state.registry.wait_ready()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            backend.release.clear()
            first = asyncio.create_task(c.post("/encode", json={"inputs": "the cat"}))
            assert await asyncio.to_thread(backend.entered.wait, 10)
            second = asyncio.create_task(c.post("/encode", json={"inputs": "the dog"}))
            while depth(app) != 1:  # yield to the loop until the second is queued
                await asyncio.sleep(0)
            stopping = asyncio.create_task(lifespan.__aexit__(None, None, None))
            while app.state.registry.ready:
                await asyncio.sleep(0)
            backend.release.set()
            await stopping
            return [(await first).status_code, (await second).status_code]

    assert asyncio.run(asyncio.wait_for(main(), 20)) == [200, 200]  # drained, not dropped
    assert depth(app) == 0 and gauge(app, "headwise_ready") == 0


def test_attention_budget_gauge_counts_calls_waiting_their_turn_and_returns_to_zero():
    backend = FakeBackend(fake_manifest("fake"))
    with client_for(Path("fake"), fake_loader(backend), attention_cpu_share=1.0) as c:
        budget = lambda: gauge(c.app, "headwise_attention_inflight_numbers", model="fake")  # noqa: E731
        backend.release.clear()
        t1, a1 = in_background(c, {"input": "the cat"}, "/attention")
        assert backend.entered.wait(10), "the first call never reached the backend"
        one = budget()
        t2, a2 = in_background(c, {"input": "the dog"}, "/attention")
        until(lambda: budget() == 2 * one, "the second call to hold its share of the budget")
        backend.release.set()
        t1.join(10), t2.join(10)
        assert [a1[0].status_code, a2[0].status_code] == [200, 200]
        assert depth(c.app, "attention") == 0 and budget() == 0
