"""Connections that cannot lock anyone out: uvicorn's httptools protocol with the limits it lacks.

- Headers must arrive within `header_timeout_s` of the connection opening (or of the first byte
  of the next request on a kept-alive one): a socket that sends nothing, or trickles header
  bytes (slowloris), is closed then. The body has its own deadline (the middleware's).
- Headers are bounded: a request whose header bytes pass `max_header_bytes` is answered 431 and
  its connection closed before the bytes reach the parser, so memory stays bounded too.
- Idle connections do not count against the concurrency limit (uvicorn counts them): only
  requests in flight do (`max_requests`); over it a request is marked for the middleware, which
  answers 503 with Retry-After in the route's dialect.
- Open connections are bounded (`max_connections`): a new one past the bound closes the
  connection that has been idle longest (none of its requests in flight), so idle sockets
  cannot crowd out real clients; when every connection is busy, the new one's requests are
  marked for 503 as above. Liveness (`/health`) is answered whatever the marks say: an
  orchestrator must not kill a healthy pod for other people's sockets.
- A response's head and body leave in one write (`Coalescing`): uvicorn writes them apart, two
  TCP segments on a no-delay socket, and the client is woken for a head without its body.

uvicorn's internals are not a stable API: this subclass is pinned to the versions tested
(pyproject.toml) and `tests/service/http/test_protocol.py` drives it with real sockets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

OVERLOADED = "overloaded"  # scope["state"] key: why the request is to be refused (503)


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    max_requests: int = 1024
    max_connections: int = 2048
    # Answered whatever the marks say (liveness).
    always: frozenset[str] = frozenset()


def _plain_response(status: int, reason: str, message: str) -> bytes:
    body = (
        b'{"error":{"message":"' + message.encode() + b'","type":"' + reason.encode()
        + b'","param":null,"code":' + str(status).encode() + b"}}"
    )  # fmt: skip
    return (
        f"HTTP/1.1 {status} {reason.replace('_', ' ')}\r\n".encode()
        + b"content-type: application/json\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: close\r\n\r\n"
        + body
    )


class Coalescing:
    """A transport whose writes in one turn of the loop leave together.

    A write is held until the next write (both then go as one) or the end of the loop's turn,
    whichever is first; closing sends what is held first. At most one write is held, so a
    stream that writes without yielding still meets the transport's flow control. A large next
    write (a body past JOIN_BYTES) follows the held one apart, not copied to join it: its
    segments are full anyway. Everything else is the transport's own."""

    JOIN_BYTES = 64 * 1024

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._held is None:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        held, self._held = self._held, None
        if len(data) > self.JOIN_BYTES:
            self._transport.write(held)
            self._transport.write(data)
        else:
            self._transport.write(held + data)

    def flush(self) -> None:
        if self._held is not None:
            data, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedProtocol(HttpToolsProtocol):
    limits: ClassVar[Limits] = Limits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # ours, below: requests in flight only
        self._header_bytes = 0
        self._tail = b""  # the last bytes seen before the headers' end (its marker may straddle)
        self._in_headers = False
        self._header_timer: asyncio.TimerHandle | None = None
        self.idle_since: float | None = None  # monotonic; None while a request is in flight

    # --- connection life ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(Coalescing(transport, self.loop))  # type: ignore[arg-type]
        self.idle_since = time.monotonic()
        self._arm_header_timer()
        if len(self.connections) > self.limits.max_connections:
            self._evict_idlest()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _evict_idlest(self) -> None:
        idle = [
            c
            for c in self.connections
            if isinstance(c, GuardedProtocol) and c is not self and c.idle_since is not None
        ]
        if idle:
            oldest = min(idle, key=lambda c: c.idle_since or 0.0)
            oldest.transport.close()
            self.connections.discard(oldest)  # gone now, not when the loop reports it lost

    # --- header deadline and size ---------------------------------------------------------

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._header_timeout
            )

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._in_headers:  # some of a request arrived, never all of its headers
            self.transport.write(
                _plain_response(
                    408,
                    "request_timeout",
                    f"request headers did not arrive within {self.limits.header_timeout_s:g} s",
                )
            )
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._in_headers or self.idle_since is not None:
            # Only the bytes up to the end of the headers count (a body may share the read).
            joined = self._tail + data
            end = joined.find(b"\r\n\r\n")
            self._header_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._tail))
            self._tail = joined[-3:]
            if self._header_bytes > self.limits.max_header_bytes:
                self._disarm_header_timer()
                self.transport.write(
                    _plain_response(
                        431,
                        "request_header_fields_too_large",
                        f"request headers are larger than the limit of "
                        f"{self.limits.max_header_bytes} bytes",
                    )
                )
                self.transport.close()
                return
        super().data_received(data)

    # --- parser callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self.idle_since = None
        self._arm_header_timer()  # a kept-alive connection's next request has its own deadline

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._header_bytes = 0
        self._tail = b""
        self._disarm_header_timer()
        busy = len(self.tasks) >= self.limits.max_requests
        crowded = len(self.connections) > self.limits.max_connections
        super().on_headers_complete()  # builds the scope; its task runs on the next loop turn
        if (busy or crowded) and self.scope.get("path") not in self.limits.always:
            self.scope["state"][OVERLOADED] = (
                f"{len(self.tasks) - 1} requests in flight, the limit is {self.limits.max_requests}"
                if busy
                else f"{len(self.connections)} connections open, the limit is "
                f"{self.limits.max_connections}"
            )

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._header_bytes = 0
        self._tail = b""
        self.idle_since = time.monotonic()


def guarded(limits: Limits) -> type[GuardedProtocol]:
    """The protocol class uvicorn instantiates, carrying these limits."""
    return type("Guarded", (GuardedProtocol,), {"limits": limits})
