"""The middleware counts a request once, before its answer's last byte leaves: a client that holds
its answer finds it in /metrics, whichever worker the scrape reaches."""

from __future__ import annotations

import asyncio

import pytest

from service.api.routes import TABLE
from service.http.errors import Answers
from service.http.middleware import HeadwiseMiddleware
from service.metrics import Metrics


def counted(metrics: Metrics, status: str) -> float:
    value = metrics.registry.get_sample_value(
        "headwise_requests_total", {"endpoint": "/encode", "model": "", "status": status}
    )
    return value or 0.0


def run(app, metrics: Metrics) -> list[tuple[str, bool, float]]:
    """Each message the client is sent: its type, whether more follows, the count as it left."""
    middleware = HeadwiseMiddleware(app, TABLE, Answers(TABLE), metrics, 1 << 20, None)
    seen: list[tuple[str, bool, float]] = []
    bodies = [{"type": "http.request", "body": b'{"inputs": "a"}', "more_body": False}]

    async def receive():
        return bodies.pop(0) if bodies else {"type": "http.disconnect"}

    async def send(message):
        seen.append((message["type"], message.get("more_body", False), counted(metrics, "200")))

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/encode",
        "headers": [(b"content-type", b"application/json")],
        "query_string": b"",
    }
    asyncio.run(middleware(scope, receive, send))
    return seen


def test_a_streamed_answer_is_counted_as_its_last_part_leaves_and_once():
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"[1,", "more_body": True})
        await send({"type": "http.response.body", "body": b"2]", "more_body": False})

    metrics = Metrics()
    seen = run(app, metrics)
    assert seen == [
        ("http.response.start", False, 0.0),
        ("http.response.body", True, 0.0),
        ("http.response.body", False, 1.0),
    ]
    assert counted(metrics, "200") == 1.0


def test_a_request_that_sends_no_answer_is_still_counted_once():
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("gone before its body")

    metrics = Metrics()
    with pytest.raises(RuntimeError):
        run(app, metrics)
    assert counted(metrics, "200") == 1.0
    assert (
        metrics.registry.get_sample_value(
            "headwise_request_duration_seconds_count", {"endpoint": "/encode", "model": ""}
        )
        == 1.0
    )
