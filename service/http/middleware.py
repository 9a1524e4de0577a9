"""One pure-ASGI middleware for what every HTTP request gets: a request id, a bounded body that
must arrive in time, the API key check, timing headers, and the request metrics.

Which paths are open (no key), each path's metrics label and the dialect of its refusals come
from the route table (the declaration), never from lists kept here.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from service.api.declaration import RouteTable
from service.errors import (
    HeadwiseError,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
)
from service.http.asgi import ASGIApp, Message, Receive, Scope, Send, content_type, is_json, replay
from service.http.errors import Answers
from service.http.protocol import OVERLOADED
from service.http.routing import ARRIVED
from service.http.tracing import Tracing, wall_ns
from service.metrics import Metrics
from service.registry import BATCHED, REHEARSING

access = logging.getLogger("headwise.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def utf8_or_escaped(body: bytes) -> bytes:
    """A JSON body as sent when it is UTF-8; otherwise the same JSON with each invalid byte as
    an escaped lone surrogate (\\udcXX), so that validation names the field that holds it (and
    refuses it, 422) instead of the parser refusing the whole body without saying where."""
    try:
        body.decode("utf-8")
        return body
    except UnicodeDecodeError:
        pass
    try:
        return json.dumps(json.loads(body.decode("utf-8", "surrogateescape"))).encode()
    except (ValueError, RecursionError):
        return body  # not JSON either (or nested too deep): the parser's 400 says so


class HeadwiseMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        table: RouteTable,
        answers: Answers,
        metrics: Metrics,
        max_body_bytes: int,
        api_key: str | None,
        body_timeout_s: float = 10.0,
        access_log: bool = False,
        tracing: Tracing | None = None,
        saturated: Callable[[], HeadwiseError | None] | None = None,
    ) -> None:
        """saturated: the refusal a request for the models' batchers would get whatever its
        body (the registry's, once loaded): answered before the body is read."""
        self.app = app
        self.saturated = saturated
        self.tracing = tracing
        self.table = table
        self.answers = answers
        self.access_log = access_log
        self.body_timeout_s = body_timeout_s
        self.metrics = metrics
        self.max_body = max_body_bytes
        self.api_key = api_key.encode() if api_key else None

    def _authorised(self, scope: Scope) -> bool:
        if self.api_key is None or scope["method"] == "OPTIONS" or self.table.is_open(scope["path"]):
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    token.strip(), self.api_key
                )
        return False

    def _full(self, scope: Scope) -> HeadwiseError | None:
        """The refusal of a request for the batchers when the work ahead already fills what
        admission plans to fill: it costs the loop no body to read and parse (a flood of 4,600
        requests of 128 documents took the loop ~20 s to read, refusing most)."""
        if self.saturated is None or scope["method"] != "POST":
            return None
        route = self.table.match("POST", scope["path"])
        if route is None or route.capability not in BATCHED:
            return None
        return self.saturated()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        state = scope.setdefault("state", {})
        sent_id = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), ""
        )
        request_id = sent_id if _REQUEST_ID.match(sent_id) else uuid.uuid4().hex
        state["request_id"] = request_id
        endpoint = self.table.label(scope["path"])
        status_seen = [500]
        span = None
        counted = not REHEARSING.get()  # a server's own rehearsal is not a client's request
        # Recorded once: before the response's last byte goes out, so that a client holding its
        # answer finds it counted by any worker's /metrics; or at the end when no answer went out.
        pending = [counted]
        if self.tracing is not None and counted:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            span = self.tracing.start(scope["method"], endpoint, scope["path"], headers)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_seen[0] = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                for name, value in state.get("timing_headers", {}).items():
                    headers.append((name.encode(), value.encode()))
                total = (time.monotonic() - started) * 1e3
                headers.append((b"x-total-time", f"{total:.3f}".encode()))
                message["headers"] = headers
            elif (
                message["type"] == "http.response.body"
                and not message.get("more_body", False)
                and pending[0]
            ):
                pending[0] = False
                self._record(scope, state, endpoint, status_seen[0], started, span, request_id)
            await send(message)

        async def refuse(exc: HeadwiseError) -> None:
            await self.answers.refuse(scope, exc)(scope, receive, send_with_headers)

        self.metrics.inflight.inc()
        self.metrics.active += 1
        try:
            if (crowded := state.get(OVERLOADED)) is not None:
                await refuse(Unavailable(f"server at capacity: {crowded}", retry_after=1))
                return
            if not self._authorised(scope):
                await refuse(
                    Unauthorized("missing or invalid API key: send 'Authorization: Bearer <key>'")
                )
                return
            if (full := self._full(scope)) is not None:
                await refuse(full)
                return
            try:
                body = None if self._declared_too_large(scope) else await self._read_body(receive)
            except TimeoutError:
                await refuse(
                    RequestTimeout(f"request body did not arrive within {self.body_timeout_s:g} s")
                )
                return
            if body is None:
                await refuse(
                    PayloadTooLarge(f"request body is larger than the limit of {self.max_body} bytes")
                )
                return
            if (kind := self._not_json(scope)) is not None:
                await refuse(
                    UnsupportedMediaType(
                        f"request body must be JSON (Content-Type: application/json), not {kind!r}"
                    )
                )
                return
            state[ARRIVED] = time.monotonic()
            if body and self._takes_json(scope):
                body = utf8_or_escaped(body)
            await self.app(scope, replay(body, receive), send_with_headers)
        finally:
            self.metrics.inflight.dec()
            self.metrics.active -= 1
            self.metrics.finished += 1
            if pending[0]:
                self._record(scope, state, endpoint, status_seen[0], started, span, request_id)

    def _record(
        self,
        scope: Scope,
        state: dict[str, Any],
        endpoint: str,
        status: int,
        started: float,
        span: Any,
        request_id: str,
    ) -> None:
        """The request in /metrics, its span finished, its access-log line."""
        model = state.get("model", "")  # set by the route once it has picked a model
        seconds = time.monotonic() - started
        self.metrics.requests.labels(endpoint, model, str(status)).inc()
        self.metrics.request_duration.labels(endpoint, model).observe(seconds)
        if span is not None and self.tracing is not None:
            arrived = state.get(ARRIVED)
            self.tracing.finish(span, status, state, wall_ns(arrived) if arrived else None)
        if self.access_log:
            access.info(
                "%s %s %d %.1fms%s id=%s",
                scope["method"],
                scope["path"],
                status,
                seconds * 1e3,
                f" model={model}" if model else "",
                request_id,
                extra={
                    "request_id": request_id,
                    "route": f"{scope['method']} {scope['path']}",
                    "status": status,
                    "model": model,
                    "ms": round(seconds * 1e3, 3),
                },
            )

    def _takes_json(self, scope: Scope) -> bool:
        route = self.table.match(scope["method"], scope["path"])
        return route is not None and route.request is not None

    def _not_json(self, scope: Scope) -> str | None:
        """The content type of a body sent to a JSON route as something else (None if fine:
        JSON, or no content type at all, which is read as JSON)."""
        route = self.table.match(scope["method"], scope["path"])
        if route is None or route.request is None:
            return None
        kind = content_type(scope)
        return None if kind is None or is_json(kind) else kind.decode("latin-1")

    def _declared_too_large(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"content-length":
                return value.isdigit() and int(value) > self.max_body
        return False

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None when it passes the limit (checked before and while reading).

        A body that does not arrive in one piece must arrive within body_timeout_s: a client
        trickling bytes (slowloris) would otherwise hold its slot for ever. TimeoutError then.
        """
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            body = message.get("body", b"")
            return None if len(body) > self.max_body else body
        async with asyncio.timeout(self.body_timeout_s):
            chunks: list[bytes] = [message.get("body", b"")]
            size = len(chunks[0])
            while message.get("more_body", False):
                message = await receive()
                if message["type"] == "http.disconnect":
                    break
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body:
                    return None
                chunks.append(chunk)
        return b"".join(chunks)
