"""The hot lane: the POST routes that run a model (clients call them once per text or per
query), answered without FastAPI's request machinery (route matching, dependency solving, exit stacks, exception middleware).

That machinery is ~60 µs a request on a warm CPU, but a request arrives right after inference
has swept the caches, and there it measured ~250 µs against ~30 µs for a plain ASGI call
(`python -m bench.framework`): a third of what one short text cost beyond its graph
call. The lane serves the same endpoint functions as FastAPI, with the same dependencies called
directly, so each route's behaviour is written once; FastAPI still routes, documents (OpenAPI)
and answers everything else. Whatever is outside the plain case (another content type, a body
that does not validate) goes on to FastAPI unchanged, so validation errors have one renderer;
errors raised by the endpoint are answered by `errors.answer`, as FastAPI's handlers do.
`tests/service/test_lane.py` sends the same requests through both and compares the answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from service.deps import client_gone, ready_core
from service.errors import answer
from service.middleware import ASGIApp, Receive, Scope, Send, replay
from service.rerank_schemas import (
    CohereV1RerankRequest,
    CohereV2RerankRequest,
    PredictRequest,
    TeiRerankRequest,
)
from service.routes import embeddings, rerank, tei
from service.schemas import EncodeRequest, OpenAIEmbeddingsRequest
from service.tei_schemas import EmbedAllRequest, EmbedRequest, SimilarityRequest

Endpoint = Callable[[Any, Request, Any, Any], Awaitable[Response]]  # (body, request, core, gone)


@dataclass(frozen=True)
class LaneRoute:
    body: type[BaseModel]
    endpoint: Endpoint
    router_dependency: Callable[[Request], Awaitable[None]] | None = None  # e.g. TEI's dialect


ROUTES: dict[str, LaneRoute] = {
    "/encode": LaneRoute(EncodeRequest, embeddings.encode),
    "/v1/embeddings": LaneRoute(OpenAIEmbeddingsRequest, embeddings.openai_embeddings),
    "/embed": LaneRoute(EmbedRequest, tei.embed, tei.tei_dialect),
    "/embed_all": LaneRoute(EmbedAllRequest, tei.embed_all, tei.tei_dialect),
    "/similarity": LaneRoute(SimilarityRequest, tei.similarity, tei.tei_dialect),
    "/rerank": LaneRoute(TeiRerankRequest, rerank.rerank, tei.tei_dialect),
    "/predict": LaneRoute(PredictRequest, rerank.predict, tei.tei_dialect),
    "/v1/rerank": LaneRoute(CohereV1RerankRequest, rerank.rerank_v1),
    "/v2/rerank": LaneRoute(CohereV2RerankRequest, rerank.rerank_v2),
}


def is_json(scope: Scope) -> bool:
    """A JSON content type: application/json or application/*+json. A request without one is
    FastAPI's (which refuses it, naming the content type)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            kind = value.partition(b";")[0].strip().lower()
            return kind == b"application/json" or (
                kind.startswith(b"application/") and kind.endswith(b"+json")
            )
    return False


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return b"".join(chunks)


class Lane:
    """ASGI middleware in front of FastAPI for the paths in `routes`."""

    def __init__(self, app: ASGIApp, routes: dict[str, LaneRoute] | None = None) -> None:
        self.app = app
        self.routes = ROUTES if routes is None else routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            self.routes.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if route is None or not is_json(scope):
            await self.app(scope, receive, send)
            return
        raw = await read_body(receive)
        try:
            body = route.body.model_validate_json(raw)
        except ValidationError:
            await self.app(scope, replay(raw, receive), send)
            return
        request = Request(scope, receive)
        try:
            if route.router_dependency is not None:
                await route.router_dependency(request)
            core = await ready_core(request)
            response = await route.endpoint(body, request, core, await client_gone(request))
        except Exception as exc:  # noqa: BLE001 - every error is answered, as FastAPI's handlers do
            response = answer(request, exc)
        await response(scope, receive, send)
