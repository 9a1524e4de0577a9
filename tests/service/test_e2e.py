"""End to end: `headwise serve` as a real process with the default bundle, over real HTTP."""

from __future__ import annotations

import asyncio
import signal
import socket
import time

import httpx
import numpy as np
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REAL_TEXTS
from tests.live import serve
from tests.waiting import until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def live(default_bundle, tmp_path_factory):
    with serve(default_bundle, tmp_path_factory.mktemp("live")) as server:
        yield server


def test_encode_matches_sentence_transformers(live, sentence_transformer):
    r = httpx.post(f"{live.url}/encode", json={"inputs": REAL_TEXTS}, timeout=60)
    assert r.status_code == 200
    got = np.array(r.json()["embeddings"])
    ref = sentence_transformer.encode(REAL_TEXTS, convert_to_numpy=True)
    assert (got * ref).sum(1).min() >= 0.9999


def test_official_openai_sdk_works_unmodified(live, sentence_transformer):
    client = OpenAI(base_url=f"{live.url}/v1", api_key="unused")
    res = client.embeddings.create(
        model="all-MiniLM-L6-v2", input=REAL_TEXTS[:3]
    )  # base64 by default
    got = np.array([d.embedding for d in res.data])
    ref = sentence_transformer.encode(REAL_TEXTS[:3], convert_to_numpy=True)
    assert got.shape == (3, 384)
    assert (got * ref).sum(1).min() >= 0.9999
    assert res.usage.total_tokens > 0
    floats = client.embeddings.create(
        model="m", input="hello", encoding_format="float", dimensions=64
    )
    assert len(floats.data[0].embedding) == 64
    assert client.models.list().data[0].id == "sentence-transformers/all-MiniLM-L6-v2"


def test_concurrent_single_text_requests_are_batched(live):
    async def storm():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as c:

            async def one(i):
                return await c.post(
                    "/encode", json={"inputs": f"sentence number {i} " * (1 + i % 7)}
                )

            return await asyncio.gather(*(one(i) for i in range(200)))

    before = batch_size_counts(live)
    responses = asyncio.run(storm())
    assert all(r.status_code == 200 for r in responses)
    after = batch_size_counts(live)
    batches = after["count"] - before["count"]
    texts = after["sum"] - before["sum"]
    assert texts == 200
    assert batches < 200 / 2, f"{batches} batches for 200 concurrent texts"


def batch_size_counts(live) -> dict[str, float]:
    text = httpx.get(f"{live.url}/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name == "headwise_batch_size":
            for s in family.samples:
                if s.labels.get("path") == "encode" and s.name.endswith(("_count", "_sum")):
                    out[s.name.rsplit("_", 1)[1]] = s.value
    return out


def test_metrics_scrape_parses_with_prometheus_client(live):
    httpx.post(f"{live.url}/encode", json={"inputs": "x"})
    names = {f.name for f in text_string_to_metric_families(httpx.get(f"{live.url}/metrics").text)}
    assert {
        "headwise_requests",
        "headwise_batch_size",
        "headwise_queue_depth",
        "headwise_model_info",
    } <= names


def listener_closed(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


async def wait_until_in_flight(client: httpx.AsyncClient, n: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = (await client.get("/metrics")).text
        for family in text_string_to_metric_families(text):
            # The scrape itself is in flight too.
            if family.name == "headwise_inflight_requests" and family.samples[0].value >= n + 1:
                return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{n} requests never were in flight at once")


def test_sigterm_finishes_in_flight_requests_and_exits_zero(default_bundle, tmp_path):
    # The drain is under test, not deadlines: on a loaded machine 192 long texts can take more
    # than the default 30 s, and a deadline 503 would read as a lost request.
    env = {"HEADWISE_REQUEST_TIMEOUT_S": "120", "HEADWISE_DRAIN_TIMEOUT_S": "120"}
    with serve(default_bundle, tmp_path, env=env) as server:

        async def flood():
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
                text = "a long text to keep the model busy for a while " * 20
                tasks = [
                    asyncio.create_task(c.post("/encode", json={"inputs": [text] * 8}))
                    for _ in range(24)
                ]
                await wait_until_in_flight(c, 24)  # all accepted and queued, none answered yet
                server.process.send_signal(signal.SIGTERM)
                # A new connection after SIGTERM is refused, once the listener has closed.
                await asyncio.to_thread(until, lambda: listener_closed(server.url), "the listener to close")
                return await asyncio.gather(*tasks, return_exceptions=True), "refused"

        t0 = time.monotonic()
        results, late = asyncio.run(flood())
        code = server.process.wait(150)
        elapsed = time.monotonic() - t0
    statuses = [
        r.status_code if isinstance(r, httpx.Response) else type(r).__name__ for r in results
    ]
    assert code == 0, server.output()
    assert late in ("refused", 503)
    assert statuses.count(200) == len(results), statuses
    assert elapsed < 150  # within the drain timeout: the process did not hang
    assert "all accepted requests answered" in server.output()


@pytest.mark.serial  # bounds a refusal or the drain in wall-clock time
def test_sigterm_with_more_work_than_the_grace_answers_every_request_200_or_503(
    default_bundle, tmp_path
):
    """A 2 s grace and about 10 s of accepted work: what can finish does, the rest is answered
    503 with Retry-After before the grace ends; no 500, no connection closed unanswered. New
    requests during the drain get 503 (the listener stays open until the work is answered)."""
    env = {"HEADWISE_REQUEST_TIMEOUT_S": "120", "HEADWISE_DRAIN_TIMEOUT_S": "2"}
    with serve(default_bundle, tmp_path, env=env) as server:

        async def flood():
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as c:
                text = "a long text to keep the model busy for a while " * 20
                tasks = [
                    asyncio.create_task(c.post("/encode", json={"inputs": [text] * 8}))
                    for _ in range(48)
                ]
                await wait_until_in_flight(c, 48)
                server.process.send_signal(signal.SIGTERM)
                t0 = time.monotonic()
                during = await c.post("/encode", json={"inputs": "after the signal"})
                results = await asyncio.gather(*tasks, return_exceptions=True)
                return results, during, time.monotonic() - t0

        results, during, took = asyncio.run(flood())
        code = server.process.wait(30)
    statuses = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in results]
    assert code == 0, server.output()
    assert set(statuses) <= {200, 503}, statuses
    assert 503 in statuses  # there was more work than the grace
    assert all(r.headers["retry-after"] for r in results if r.status_code == 503)
    assert during.status_code == 503 and during.headers["retry-after"]
    assert took < 2.0 + 1.5, took  # every answer within the grace (and a margin for the client)
