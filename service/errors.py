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


def tei_error_type(status: int) -> str:
    """TEI's ErrorType for a status code."""
    if status == 429:
        return "Overloaded"
    if status == 503:
        return "Unhealthy"
    if status >= 500:
        return "Backend"
    return "Validation"


def public_message(exc: HeadwiseError) -> str:
    """A 500 never echoes internals: the detail goes to the log with the request id."""
    if exc.status < 500 or exc.status == 503:
        return exc.message
    return "internal error during inference"


def error_response(exc: HeadwiseError, dialect: str | None = None) -> Response:
    """The one rendering of an error: OpenAI's shape, or TEI's on TEI's routes."""
    headers = {}
    if exc.retry_after is not None:
        headers["retry-after"] = str(max(1, round(exc.retry_after)))
    if exc.status == 401:
        headers["www-authenticate"] = "Bearer"
    message = public_message(exc)
    if dialect == "tei":
        body = orjson.dumps({"error": message, "error_type": tei_error_type(exc.status)})
    else:
        body = error_body(exc.status, exc.kind, message, exc.param, exc.code)
    return Response(body, status_code=exc.status, media_type="application/json", headers=headers)


def log_error(state: dict, route: str, exc: HeadwiseError) -> None:
    """Every 4xx/5xx, once: request id, route, status, model and the message."""
    level = logging.ERROR if exc.status >= 500 and exc.status != 503 else logging.INFO
    fields = {
        "request_id": state.get("request_id", ""),
        "route": route,
        "status": exc.status,
        "model": state.get("model", ""),
    }
    log.log(
        level,
        "request %s %s -> %d%s: %s",
        fields["request_id"],
        route,
        exc.status,
        f" (model {fields['model']})" if fields["model"] else "",
        exc.message,
        extra=fields,
        exc_info=exc.__cause__ if level == logging.ERROR else None,
    )


def _status_error(status: int, kind: str, message: str) -> HeadwiseError:
    err = HeadwiseError(message)
    err.status, err.kind = status, kind
    return err


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


def _answer(request: Request, exc: HeadwiseError) -> Response:
    state = request.scope.get("state", {})
    log_error(state, f"{request.method} {request.url.path}", exc)
    return error_response(exc, state.get("dialect"))


def answer(request: Request, exc: Exception) -> Response:
    """Any exception a request raised, as its response: the one mapping, used by FastAPI's
    exception handlers and by the hot lane (service/lane.py) alike."""
    if isinstance(exc, ClientGone):
        return Response(status_code=CLIENT_CLOSED)
    if isinstance(exc, HeadwiseError):
        return _answer(request, exc)
    if isinstance(exc, RequestValidationError):
        message, status = describe_validation(exc)
        return _answer(request, _status_error(status, "invalid_request_error", message))
    if isinstance(exc, StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 400 and message == "There was an error parsing the body":
            message = "request body could not be parsed as JSON (malformed, nested too deep, or not UTF-8)"
        elif exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return _answer(request, _status_error(exc.status_code, "http_error", message))
    err = _status_error(500, "internal_error", f"unhandled {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return _answer(request, err)


async def _handler(request: Request, exc: Exception) -> Response:
    return answer(request, exc)


def install(app: FastAPI) -> None:
    for kind in (HeadwiseError, ClientGone, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, _handler)
