"""What every RPC goes through, as every HTTP request goes through the middleware and dispatch:
the API key, readiness, a deadline, the request's metrics and trace span, and its errors as
gRPC statuses.

A call's deadline is the server's (HEADWISE_REQUEST_TIMEOUT_S) from the moment the message
arrived, or the client's own gRPC deadline when that is sooner; a drain pulls it in as it does
for HTTP. A client that cancels its call stops its request at the next stage, its queued work
dropped. The handler gets the same `Context` an HTTP handler gets (with no HTTP request), so
the pipelines, batchers and admission are the HTTP routes' own.

Errors: each HeadwiseError's status maps to the gRPC code TEI and Triton use for it (a refusal
by admission, 413 or 429 over HTTP, is RESOURCE_EXHAUSTED at once), with the same message; a
Retry-After goes out as the `retry-after` trailing metadata. The request metrics label a call
with its method's path (`/tei.v1.Embed/Embed`) and the HTTP status of the same outcome, so that
one dashboard and one alert on 5xx cover both.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import math
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NoReturn, TypeVar

import grpc

from service.api.context import Context
from service.errors import Disconnected, HeadwiseError, Unauthorized
from service.http.tracing import Tracing, wall_ns
from service.metrics import Metrics
from service.pipelines.call import Call
from service.registry import Capability, Registry

log = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M")

CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
}
# A stream's messages computed at once (each its own request: admission prices each); more wait
# for the first answers to go out, so a client streaming fast holds bounded memory.
STREAM_PARALLEL = 64


@dataclass
class Failed(Exception):
    """A call's outcome as a gRPC status."""

    status: int  # the HTTP status of the same outcome (metrics)
    code: grpc.StatusCode
    message: str
    retry_after: float | None = None

    @classmethod
    def of(cls, exc: HeadwiseError) -> Failed:
        code = CODES.get(exc.status, grpc.StatusCode.INTERNAL)
        return cls(exc.status, code, exc.message, exc.retry_after)

    async def abort(self, context: grpc.aio.ServicerContext) -> NoReturn:
        if self.retry_after is not None:
            context.set_trailing_metadata((("retry-after", str(math.ceil(self.retry_after))),))
        await context.abort(self.code, self.message)
        raise AssertionError("abort returns by raising")  # pragma: no cover


def _cancelled(context: grpc.aio.ServicerContext) -> Callable[[], Awaitable[dict[str, Any]]]:
    """A `receive` for Call's disconnect watch: it answers once the RPC is done (cancelled by its
    client; a finished RPC's watch is closed before that)."""
    done = asyncio.Event()
    context.add_done_callback(lambda _: done.set())

    async def receive() -> dict[str, Any]:
        await done.wait()
        return {"type": "http.disconnect"}

    return receive


def _with(fn: Callable[[Context, M], Awaitable[T]], message: M, ctx: Context) -> Awaitable[T]:
    return fn(ctx, message)


class Rpcs:
    def __init__(
        self,
        registry: Registry,
        metrics: Metrics,
        tracing: Tracing | None = None,
        api_key: str | None = None,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.tracing = tracing
        self.api_key = api_key.encode() if api_key else None

    def authorise(self, context: grpc.aio.ServicerContext) -> None:
        """TEI's gRPC key check: `authorization: Bearer <key>` in the call's metadata."""
        if self.api_key is None:
            return
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                raw = value.encode() if isinstance(value, str) else value
                scheme, _, token = raw.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key):
                    return
        raise Unauthorized("missing or invalid API key: send 'authorization: Bearer <key>'")

    def _call(self, context: grpc.aio.ServicerContext) -> Call:
        timeout_s = self.registry.settings.request_timeout_s
        remaining = context.time_remaining()
        within = timeout_s if remaining is None else min(timeout_s, max(0.0, remaining))
        # The call's own span: admission keeps its headroom as a share of it (a client's 1 s
        # deadline must not be held to the 20 % of the server's 30 s that HTTP keeps free).
        return Call(_cancelled(context), time.monotonic() + within, self.registry.drain, within)

    async def run(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        fn: Callable[[Context], Awaitable[T]],
        capability: Capability | None = None,
        ready: bool = True,
    ) -> T:
        """fn(ctx) as one request (Failed when it fails)."""
        started = time.monotonic()
        state = SimpleNamespace(model="", request_id=uuid.uuid4().hex)
        status = 200
        span = None
        if self.tracing is not None:
            headers = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
            span = self.tracing.start_rpc(method, headers)
        self.metrics.inflight.inc()
        self.metrics.active += 1
        call: Call | None = None
        try:
            self.authorise(context)
            if ready:
                self.registry.require_ready()
            call = self._call(context)
            return await fn(Context(None, self.registry, call, capability, state))
        except HeadwiseError as exc:
            status = exc.status
            raise Failed.of(exc) from None
        except Disconnected:
            status = 499
            raise Failed(499, grpc.StatusCode.CANCELLED, "the client cancelled the call") from None
        except Exception:
            status = 500
            log.exception("%s failed (request id %s)", method, state.request_id)
            raise Failed(
                500, grpc.StatusCode.INTERNAL, f"internal error (request id {state.request_id})"
            ) from None
        finally:
            if call is not None:
                call.close()
            self.metrics.inflight.dec()
            self.metrics.active -= 1
            self.metrics.finished += 1
            seconds = time.monotonic() - started
            self.metrics.requests.labels(method, state.model, str(status)).inc()
            self.metrics.request_duration.labels(method, state.model).observe(seconds)
            if span is not None and self.tracing is not None:
                self.tracing.finish(span, status, vars(state), wall_ns(started))

    async def unary(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        fn: Callable[[Context], Awaitable[T]],
        capability: Capability | None = None,
        ready: bool = True,
    ) -> T:
        try:
            return await self.run(context, method, fn, capability, ready)
        except Failed as failed:
            await failed.abort(context)

    async def stream(
        self,
        requests: AsyncIterable[M],
        context: grpc.aio.ServicerContext,
        method: str,
        fn: Callable[[Context, M], Awaitable[T]],
        capability: Capability | None = None,
    ) -> AsyncIterator[T]:
        """A bidirectional stream as TEI serves it: each message its own request (deadline,
        admission, metrics), computed at once with the ones before it (so they batch together),
        answered in the order sent; the first error ends the stream with its status."""
        try:
            self.authorise(context)
        except HeadwiseError as exc:
            await Failed.of(exc).abort(context)
        pending: asyncio.Queue[asyncio.Future[T] | None] = asyncio.Queue(STREAM_PARALLEL)

        async def read() -> None:
            async for message in requests:
                work = self.run(context, method, functools.partial(_with, fn, message), capability)
                await pending.put(asyncio.ensure_future(work))
            await pending.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                getting = asyncio.ensure_future(pending.get())
                if not reader.done():
                    await asyncio.wait({getting, reader}, return_when=asyncio.FIRST_COMPLETED)
                if reader.done() and not getting.done() and reader.exception() is not None:
                    getting.cancel()  # reading the client's messages failed (it went away)
                    raise reader.exception()  # type: ignore[misc]
                future = await getting
                if future is None:
                    return
                try:
                    yield await future
                except Failed as failed:
                    await failed.abort(context)
        finally:
            reader.cancel()
            while not pending.empty():
                left = pending.get_nowait()
                if left is not None:
                    left.cancel()
