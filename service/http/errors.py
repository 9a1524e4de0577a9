"""The ONE place where exceptions become HTTP responses, in the shape of the route's dialect.

Whoever raises (the middleware, the hot lane, FastAPI's validation, a pipeline), the answer is
built here: the status and message from the exception, the body from the dialect of the path's
route (TEI's on TEI's routes, Cohere's on Cohere's, OpenAI's on headwise's and OpenAI's, and
headwise's on paths no route declares). A 500 never carries internals: the detail goes to the
log with the request id. Every 4xx/5xx is logged once.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from service.api.declaration import Dialect, ErrorInfo, RouteTable
from service.errors import Disconnected, HeadwiseError

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # nginx's code: the client went away before the answer
BODY_PARSE_ERROR = "There was an error parsing the body"  # Starlette's words


def public_message(exc: HeadwiseError) -> str:
    """A 500 never echoes internals: the detail goes to the log with the request id."""
    if exc.status < 500 or exc.status == 503:
        return exc.message
    return "internal error during inference"


def render(exc: HeadwiseError, dialect: Dialect) -> Response:
    """The one rendering of an error, in `dialect`'s shape, with its headers."""
    headers = dict(exc.headers)
    if exc.retry_after is not None:
        headers["retry-after"] = str(max(1, round(exc.retry_after)))
    if exc.status == 401:
        headers["www-authenticate"] = "Bearer"
    info = ErrorInfo(exc.status, exc.kind, public_message(exc), exc.param, exc.code)
    body = orjson.dumps(dialect.error_body(info))
    return Response(body, status_code=exc.status, media_type="application/json", headers=headers)


def log_error(state: MutableMapping[str, Any], route: str, exc: HeadwiseError) -> None:
    """Every 4xx/5xx, once: request id, route, status, model and the message."""
    if state.get("logged"):
        return
    state["logged"] = True
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


def _location(loc: tuple[Any, ...]) -> str:
    """Where in the body: field names and list indices; not "body", nor the tag of the
    variant a two-vendor route chose (a digit string: no field is named so)."""
    parts = [str(p) for p in loc if p != "body" and not (isinstance(p, str) and p.isdigit())]
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


def as_headwise(request: Request, exc: Exception) -> HeadwiseError:
    """Any exception a request raised, as a HeadwiseError with its status and message."""
    if isinstance(exc, HeadwiseError):
        return exc
    if isinstance(exc, RequestValidationError):
        message, status = describe_validation(exc)
        return HeadwiseError.of_status(status, "invalid_request_error", message)
    if isinstance(exc, StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        headers = dict(exc.headers or {})
        if exc.status_code == 400 and message == BODY_PARSE_ERROR:
            message = "request body could not be parsed as JSON (malformed, nested too deep, or not UTF-8)"
        elif exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return HeadwiseError.of_status(exc.status_code, "http_error", message, headers=headers)
    err = HeadwiseError.of_status(500, "internal_error", f"unhandled {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


class Answers:
    """Exceptions -> responses, for one app's route table (each path's dialect)."""

    def __init__(self, table: RouteTable) -> None:
        self.table = table

    def refuse(self, scope: MutableMapping[str, Any], exc: HeadwiseError) -> Response:
        """A HeadwiseError raised before or after routing, logged once, in the path's dialect."""
        state = scope.setdefault("state", {})
        log_error(state, f"{scope['method']} {scope['path']}", exc)
        return render(exc, self.table.dialect(scope["path"]))

    def answer(self, request: Request, exc: Exception) -> Response:
        """Any exception a request raised, as its response: used by FastAPI's exception
        handlers and by the hot lane alike."""
        if isinstance(exc, Disconnected):
            return Response(status_code=CLIENT_CLOSED)
        return self.refuse(request.scope, as_headwise(request, exc))

    def install(self, app: FastAPI) -> None:
        async def handler(request: Request, exc: Exception) -> Response:
            return self.answer(request, exc)

        kinds = (HeadwiseError, Disconnected, RequestValidationError, StarletteHTTPException)
        for kind in (*kinds, Exception):
            app.add_exception_handler(kind, handler)
