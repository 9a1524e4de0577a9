"""The hot lane: the POST routes that run a model (clients call them once per text or per
query), answered without FastAPI's request machinery (route matching, dependency solving, exit
stacks, exception middleware).

That machinery is ~60 µs a request on a warm CPU, but a request arrives right after inference
has swept the caches, and there it measured ~250 µs against ~30 µs for a plain ASGI call
(`python -m bench.framework`). The lane's table is derived from the route declaration (routes
marked `lane`), and it calls the same `dispatch` as FastAPI's endpoints, so each route's
behaviour is written once. Whatever is outside the plain case (another content type, a body that
does not validate) goes on to FastAPI unchanged, so validation errors have one renderer; errors
raised by the handler are answered by the same `Answers` as FastAPI's exception handlers.
`tests/service/http/test_lane.py` sends the same requests through both and compares the answers.
"""

from __future__ import annotations

from pydantic import ValidationError
from starlette.requests import Request

from service.api.declaration import Route
from service.http.asgi import (
    ASGIApp,
    Receive,
    Scope,
    Send,
    content_type,
    is_json,
    read_body,
    replay,
)
from service.http.errors import Answers
from service.http.routing import dispatch


class Lane:
    """ASGI middleware in front of FastAPI for the routes in `routes` (path -> route)."""

    def __init__(self, app: ASGIApp, routes: dict[str, Route], answers: Answers) -> None:
        self.app = app
        self.routes = routes
        self.answers = answers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            self.routes.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        kind = content_type(scope) if route is not None else None
        if route is None or kind is None or not is_json(kind):  # the rest is FastAPI's
            await self.app(scope, receive, send)
            return
        raw = await read_body(receive)
        try:
            body = route.adapter.validate_json(raw)
        except ValidationError:
            await self.app(scope, replay(raw, receive), send)
            return
        request = Request(scope, receive)
        try:
            response = await dispatch(route, body, request)
        except Exception as exc:  # noqa: BLE001 - every error is answered, as FastAPI's handlers do
            response = self.answers.answer(request, exc)
        await response(scope, receive, send)
