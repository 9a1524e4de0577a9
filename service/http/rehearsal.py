"""Before ready, each model answers its routes' rehearsal bodies (declared in
`service/api/routes.py`), sent through the whole app in-process: middleware, the hot lane,
validation, the pipeline, the batcher's inline run on the loop's thread, serialisation.

Calibration leaves the graphs warm, but the first requests after ready still took 1.3-2x the
hundredth: CPython specialises a function's bytecode only after its first runs, and a shape
OpenVINO has not run yet is compiled on its first request. A rehearsal runs each declared route
a few times per model, so that the first client finds it as the hundredth does. Its requests
are answered though the server is not ready yet (`REHEARSING`), and are neither counted in
/metrics nor traced nor logged; a rehearsal that is not answered 200 is logged and the server
still becomes ready (the answer of a real request is what counts).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from service.api.declaration import RouteTable
from service.http.asgi import ASGIApp, Message
from service.registry import REHEARSING, Model

log = logging.getLogger(__name__)

ROUNDS = 10  # CPython 3.11 specialises a function's bytecode after about eight calls


def post_scope(path: str, body: bytes, api_key: str | None = None) -> dict[str, Any]:
    """The ASGI scope of a JSON POST of `body` to `path` from this host."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if api_key:
        headers.append((b"authorization", b"Bearer " + api_key.encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
        "state": {},
    }


async def call(app: ASGIApp, path: str, body: bytes, api_key: str | None) -> int:
    """One POST through `app`; its status."""
    scope = post_scope(path, body, api_key)
    delivered = False
    status = 0

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


class Rehearsal:
    def __init__(self, app: ASGIApp, table: RouteTable, api_key: str | None) -> None:
        self.app = app
        self.routes = [r for r in table if r.rehearsal is not None and r.capability is not None]
        self.api_key = api_key

    async def __call__(self, model: Model) -> None:
        token = REHEARSING.set(True)
        try:
            for route in self.routes:
                if route.capability not in model.capabilities:
                    continue
                body = orjson.dumps({**(route.rehearsal or {}), "model": model.name})
                for _ in range(ROUNDS):
                    status = await call(self.app, route.path, body, self.api_key)
                    if status != 200:
                        log.warning(
                            "%s: rehearsal of %s answered %d", model.name, route.path, status
                        )
                        break
        finally:
            REHEARSING.reset(token)
