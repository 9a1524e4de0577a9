"""The hot lane answers its routes exactly as FastAPI would, and hands FastAPI the rest."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from service.api import native
from service.api.declaration import Route, Variant
from service.api.native.schemas import EncodeRequest
from service.api.routes import TABLE
from service.http.errors import Answers
from service.http.lane import Lane
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest

JSON = {"content-type": "application/json"}

# (path, raw body, headers): valid requests and every kind of bad one the routes see.
CASES: list[tuple[str, bytes, dict[str, str]]] = [
    ("/encode", b'{"inputs": "the cat"}', JSON),
    ("/encode", b'{"inputs": ["the cat", "a dog and a fox"], "normalize": false}', JSON),
    ("/encode", b'{"inputs": "the cat", "dimensions": 4}', JSON),
    ("/encode", b'{"inputs": "the cat", "dimensions": 4.0}', JSON),
    ("/encode", b'{"inputs": "the cat", "dimensions": "4"}', JSON),
    ("/encode", b'{"inputs": "the cat", "dimensions": 99}', JSON),
    ("/encode", b'{"inputs": "the cat", "truncate": "yes"}', JSON),
    ("/encode", b'{"inputs": "the cat", "unknown": 1}', JSON),
    ("/encode", b'{"inputs": "the cat", "model": "nope"}', JSON),
    ("/encode", b'{"inputs": "the cat", "model": "ranker"}', JSON),
    ("/encode", b'{"inputs": "the cat", "model": "other"}', JSON),
    ("/encode", b'{"inputs": "the cat", "prompt_name": "query"}', JSON),
    ("/encode", b'{"inputs": []}', JSON),
    ("/encode", b'{"inputs": [1, 2]}', JSON),
    ("/encode", b'{"inputs": "\\ud800"}', JSON),
    ("/encode", b'{"inputs": "the cat",}', JSON),
    ("/encode", b"", JSON),
    ("/encode", b'["the cat"]', JSON),
    ("/encode", b"\xff\xfe", JSON),
    ("/encode", b'{"inputs": "the cat"}', {"content-type": "text/plain"}),
    ("/encode", b'{"inputs": "the cat"}', {}),
    ("/encode", b'{"inputs": "the cat"}', {"content-type": "application/vnd.api+json"}),
    ("/encode", b'{"inputs": "the cat"}', {"content-type": "application/json; charset=utf-8"}),
    ("/v1/embeddings", b'{"input": "the cat", "model": "m"}', JSON),
    ("/v1/embeddings", b'{"input": ["the cat"], "encoding_format": "base64", "x": 1}', JSON),
    ("/v1/embeddings", b'{"input": [[5, 6, 7]], "model": "m"}', JSON),
    ("/v1/embeddings", b'{"input": "the cat", "encoding_format": "hex"}', JSON),
    ("/v1/embeddings", b'{"model": "m"}', JSON),
    ("/embed", b'{"inputs": "the cat", "truncate": true}', JSON),
    ("/embed", b'{"inputs": [[5, 6, 7]]}', JSON),
    ("/embed", b'{"inputs": 3}', JSON),
    ("/embed", b'{"inputs": "the cat", "model": "ranker"}', JSON),
    ("/embed_all", b'{"inputs": ["the cat", "a dog and a fox"]}', JSON),
    ("/embed_all", b'{"inputs": "the cat", "truncation_direction": "Sideways"}', JSON),
    ("/similarity", b'{"inputs": {"source_sentence": "cat", "sentences": ["a dog", "cat"]}}', JSON),
    ("/similarity", b'{"inputs": {"source_sentence": "cat", "sentences": []}}', JSON),
    ("/predict", b'{"inputs": "the cat"}', JSON),
    ("/predict", b'{"inputs": [["the cat", "a dog"]], "raw_scores": true}', JSON),
    ("/predict", b'{"inputs": "the cat", "model": "embedder"}', JSON),
    ("/predict", b'{"inputs": {"text": 3}}', JSON),
    ("/rerank", b'{"query": "the cat", "texts": ["a dog", "the cat"], "return_text": true}', JSON),
    ("/rerank", b'{"query": "the cat", "texts": []}', JSON),
    ("/rerank", b'{"query": "the cat"}', JSON),
    ("/v1/rerank", b'{"query": "cat", "documents": ["a dog", {"text": "the cat"}], "top_n": 1}', JSON),
    ("/v2/rerank", b'{"model": "ranker", "query": "cat", "documents": ["a dog", "the cat"]}', JSON),
    ("/v2/rerank", b'{"query": "cat", "documents": "the cat"}', JSON),
]


def _app(lane: bool):
    embedder = FakeBackend(fake_manifest("embedder", prompts={"passage": "a "}))
    other = FakeBackend(fake_manifest("other", d=4))
    ranker = FakeBackend(fake_manifest("ranker", d=1, task="rerank", labels=["score"]))
    labels = ["neg", "neu", "pos"]
    classifier = FakeBackend(fake_manifest("classifier", d=3, task="classify", labels=labels))
    backends = fake_loader(embedder, other, ranker, classifier)
    return client_for(["a", "b", "c", "d"], loader=backends, lane=lane)


@pytest.fixture(scope="module")
def both():
    with _app(True) as laned, _app(False) as plain:
        yield laned, plain


def _answer(client, path: str, body: bytes, headers: dict[str, str]) -> tuple:
    r = client.post(path, content=body, headers=headers)
    payload = r.content
    if r.headers.get("content-type") == "application/json" and payload:
        parsed = orjson.loads(payload)
        if isinstance(parsed, dict):
            parsed.pop("id", None)  # Cohere's answers carry a fresh uuid
        payload = parsed
    kept = {k: r.headers.get(k) for k in ("content-type", "retry-after", "www-authenticate")}
    return r.status_code, kept, payload


@pytest.mark.parametrize(("path", "body", "headers"), CASES, ids=range(len(CASES)))
def test_the_lane_answers_as_fastapi_does(both, path, body, headers):
    laned, plain = both
    assert _answer(laned, path, body, headers) == _answer(plain, path, body, headers)


def test_the_cases_include_successes_and_each_kind_of_failure(both):
    laned, _ = both
    statuses = {_answer(laned, *case)[0] for case in CASES}
    assert {200, 400, 404, 422} <= statuses


def test_the_lane_takes_the_routes_declared_for_it_and_only_posts():
    lane = TABLE.lane()
    assert lane and all(route.lane and route.method == "POST" for route in lane.values())
    assert set(lane) == {r.path for r in TABLE.routes if r.lane}


class Recorder:
    """The ASGI app behind the lane: records what reaches it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send) -> None:
        chunks = [(message := await receive())["body"]]
        while message["more_body"]:
            chunks.append((message := await receive())["body"])
        self.bodies.append(b"".join(chunks))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def _send_through(lane: Lane, body: bytes, content_type: bytes = b"application/json"):
    sent: list[dict] = []
    chunks = [body[: len(body) // 2], body[len(body) // 2 :]]

    async def receive():
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/encode",
        "headers": [(b"content-type", content_type)],
        "state": {},
        "query_string": b"",
    }
    await lane(scope, receive, send)
    return sent[0]["status"]


async def _ok(ctx, body):
    from starlette.responses import Response

    return Response(orjson.dumps({"inputs": body.inputs}), media_type="application/json")


@pytest.mark.parametrize(
    ("body", "content_type", "reaches_fastapi"),
    [
        (b'{"inputs": "the cat"}', b"application/json", False),
        (b'{"inputs": 3}', b"application/json", True),
        (b"not json", b"application/json", True),
        (b'{"inputs": "the cat"}', b"text/plain", True),
    ],
)
def test_the_lane_hands_fastapi_what_it_does_not_take_with_the_body_intact(
    body, content_type, reaches_fastapi, monkeypatch
):
    async def dispatch(route, body, request):
        variant, body = route.variant_of(body)
        return await variant.handler(None, body)

    monkeypatch.setattr("service.http.lane.dispatch", dispatch)
    inner = Recorder()
    route = Route("/encode", native.DIALECT, (Variant(EncodeRequest, _ok, None),), lane=True)
    lane = Lane(inner, {"/encode": route}, Answers(TABLE))
    status = asyncio.run(_send_through(lane, body, content_type))
    assert (status == 299) is reaches_fastapi
    assert inner.bodies == ([body] if reaches_fastapi else [])


def test_a_lane_request_still_gets_the_middleware_headers():
    with _app(True) as c:
        r = c.post("/encode", json={"inputs": "the cat"}, headers={"x-request-id": "abc-1"})
        assert r.status_code == 200
        assert r.headers["x-request-id"] == "abc-1"
        assert float(r.headers["x-inference-time"]) >= 0
        assert float(r.headers["x-total-time"]) >= 0
