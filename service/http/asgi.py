"""ASGI's types, and the two body helpers the middleware and the lane share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """The buffered body first, then the server's own messages (to notice a disconnect)."""
    delivered = False

    async def replayed() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def content_type(scope: Scope) -> bytes | None:
    """The request's media type, lower-cased, without parameters; None when not sent."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            kind: bytes = value.partition(b";")[0].strip().lower()
            return kind
    return None


def is_json(kind: bytes) -> bool:
    """application/json or application/*+json."""
    return kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))
