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
from service.http.asgi import ASGIApp, Receive, Scope, Send, read_body, replay
from service.http.errors import Answers
from service.http.routing import dispatch


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
        if route is None or not is_json(scope):
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
