"""Domain errors, and the ONE place where they become HTTP status codes.

Bodies follow OpenAI's error shape, {"error": {"message", "type", "code"}}, so that SDKs show
the message. A 500 never carries internals: the detail goes to the log with the request id.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

log = logging.getLogger(__name__)


CLIENT_CLOSED = 499  # nginx's code: the client went away before the answer


class ClientGone(Exception):
    """The caller disconnected; its work was dropped from the queue. Answered 499 (unread)."""


class HeadwiseError(Exception):
    status = 500
    kind = "internal_error"
    code: str | None = None  # OpenAI's machine-readable code; the status when None

    def __init__(self, message: str, retry_after: float | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.param = param


class InvalidInput(HeadwiseError):
    status, kind = 422, "invalid_request_error"


class MalformedBody(HeadwiseError):
    status, kind = 400, "invalid_request_error"


class RequestTimeout(HeadwiseError):
    status, kind = 408, "request_timeout"


class PayloadTooLarge(HeadwiseError):
    status, kind = 413, "payload_too_large"


class Unauthorized(HeadwiseError):
    status, kind = 401, "authentication_error"


class NotFound(HeadwiseError):
    status, kind = 404, "not_found"


class ModelNotFound(HeadwiseError):
    status, kind, code = 404, "invalid_request_error", "model_not_found"


class WrongTask(HeadwiseError):
    """The named model exists but does another task than the route asks for."""

    status, kind, code = 400, "invalid_request_error", "model_task_mismatch"


class Overloaded(HeadwiseError):
    status, kind = 429, "overloaded"


class Unavailable(HeadwiseError):
    """Not ready, shutting down, or the request's deadline passed in the queue."""

    status, kind = 503, "unavailable"


class InferenceFailed(HeadwiseError):
    status, kind = 500, "inference_error"


def error_body(
    status: int, kind: str, message: str, param: str | None = None, code: str | None = None
) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": kind, "param": param, "code": code or status}}
    )


def error_response(exc: HeadwiseError) -> Response:
    headers = {}
    if exc.retry_after is not None:
        headers["retry-after"] = str(max(1, round(exc.retry_after)))
    if exc.status == 401:
        headers["www-authenticate"] = "Bearer"
    message = (
        exc.message if exc.status < 500 or exc.status == 503 else "internal error during inference"
    )
    return Response(
        error_body(exc.status, exc.kind, message, exc.param, exc.code),
        status_code=exc.status,
        media_type="application/json",
        headers=headers,
    )


def _location(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


def describe_validation(exc: RequestValidationError) -> tuple[str, int]:
    """One readable sentence per problem; malformed JSON is a 400, the rest 422."""
    messages = []
    status = 422
    for err in exc.errors()[:5]:
        if err.get("type") == "json_invalid":
            status = 400
            ctx = err.get("ctx", {})
            messages.append(f"request body is not valid JSON: {ctx.get('error', 'malformed')}")
            continue
        loc = tuple(err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if loc == ("body",) and err.get("type") == "missing":
            msg = "request body is empty: send a JSON object (Content-Type: application/json)"
        elif loc == ("body",) and err.get("type") in ("model_attributes_type", "dict_type"):
            msg = "request body must be a JSON object (Content-Type: application/json)"
        elif err.get("type") == "extra_forbidden":
            msg = "unknown field"
        elif err.get("type") == "missing":
            msg = "field required"
        messages.append(f"{_location(loc)}: {msg}")
    return "; ".join(messages) or "invalid request", status


def install(app: FastAPI) -> None:
    @app.exception_handler(HeadwiseError)
    async def _domain(request: Request, exc: HeadwiseError) -> Response:
        if exc.status >= 500 and exc.status != 503:
            log.error(
                "request %s failed: %s", request.headers.get("x-request-id"), exc, exc_info=exc
            )
        return error_response(exc)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        message, status = describe_validation(exc)
        kind = "invalid_request_error"
        return Response(
            error_body(status, kind, message), status_code=status, media_type="application/json"
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 400 and message == "There was an error parsing the body":
            message = "request body could not be parsed as JSON (malformed, nested too deep, or not UTF-8)"
        elif exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return Response(
            error_body(exc.status_code, "http_error", message),
            status_code=exc.status_code,
            media_type="application/json",
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        return Response(
            error_body(500, "internal_error", "internal error"),
            status_code=500,
            media_type="application/json",
        )
