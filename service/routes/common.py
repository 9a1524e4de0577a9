"""Helpers every route uses: orjson responses with timing headers, the client-gone watcher."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response

from service.embedder import Timings, wait_for_disconnect

CLIENT_CLOSED = 499  # nginx's code: the client went away before the answer


def respond(request: Request, payload: Any, timings: Timings | None = None) -> Response:
    if timings is not None:
        request.state.timing_headers = timings.headers()
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, media_type="application/json")


@asynccontextmanager
async def disconnect_watch(request: Request) -> AsyncIterator[asyncio.Future]:
    """A future that completes if the client disconnects while the request is handled."""
    task = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        yield task
    finally:
        task.cancel()


def state(request: Request) -> Any:
    return request.app.state
