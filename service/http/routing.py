"""From the declaration to FastAPI: one endpoint per declared route (which FastAPI routes,
validates and documents), and `dispatch`, the one way a declared route's handler is called,
by FastAPI's endpoints and the hot lane alike: readiness, the call (deadline from the body's
arrival, the client watched), the handler, and any unexpected error as a 500 of the dialect."""

from __future__ import annotations

import inspect
import time
from typing import Any

from fastapi import Body, FastAPI, Path
from starlette.requests import Request
from starlette.responses import Response

from service.api.context import Context
from service.api.declaration import Route, RouteTable
from service.errors import Disconnected, HeadwiseError
from service.http.errors import as_headwise
from service.pipelines.call import Call
from service.registry import Registry

ARRIVED = "arrived"  # scope["state"] key: when the request's body had arrived (monotonic)


def call_of(request: Request, registry: Registry) -> Call:
    arrived = request.scope.get("state", {}).get(ARRIVED) or time.monotonic()
    timeout_s = registry.settings.request_timeout_s
    return Call(request.receive, arrived + timeout_s, registry.drain, timeout_s)


async def dispatch(route: Route, body: Any, request: Request) -> Response:
    registry: Registry = request.app.state.registry
    if route.needs_ready:
        registry.require_ready()
    call = call_of(request, registry)
    ctx = Context(request, registry, call, route.capability)
    variant, body = route.variant_of(body)
    try:
        return await variant.handler(ctx, body)
    except (HeadwiseError, Disconnected):
        raise
    except Exception as exc:  # noqa: BLE001 - answered as a 500 of the route's dialect, logged once
        raise as_headwise(request, exc) from exc
    finally:
        call.close()


def _endpoint(route: Route) -> Any:
    """An endpoint whose signature tells FastAPI the body and path parameters to read."""

    async def endpoint(request: Request, body: Any = None, **_: Any) -> Response:
        return await dispatch(route, body, request)

    params = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)]
    if route.request is not None:
        params.append(
            inspect.Parameter(
                "body",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=route.request,
                default=Body(...),
            )
        )
    for name in _path_params(route.path):
        params.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str, default=Path(...))
        )
    endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    endpoint.__name__ = route.variants[0].handler.__name__
    return endpoint


def _path_params(path: str) -> list[str]:
    return [part[1:-1].partition(":")[0] for part in path.split("/") if part.startswith("{")]


def _responses(route: Route) -> dict[int | str, dict[str, Any]]:
    ok: dict[str, Any] = {"description": "OK"}
    if route.response is not None:
        ok["model"] = route.response
    if route.media_type != "application/json":
        ok["content"] = {route.media_type: {}}
    out: dict[int | str, dict[str, Any]] = {200: ok}
    for status in route.error_statuses():
        out[status] = {"model": route.dialect.error_schema, "description": _REASONS.get(status, "error")}
    return out


_REASONS = {
    400: "Malformed body, or a model of another task",
    401: "Missing or invalid API key",
    404: "Model not served",
    405: "Method not allowed",
    408: "The body did not arrive in time",
    413: "Too large: body, inputs, tokens or work",
    415: "Not JSON",
    422: "Invalid request",
    429: "Overloaded: retry after Retry-After",
    431: "Request headers too large",
    500: "Internal error",
    503: "Not ready, shutting down, or the deadline passed: retry after Retry-After",
}


def mount(app: FastAPI, table: RouteTable) -> None:
    """Every declared route as a FastAPI route (one endpoint each; OpenAPI from the declaration)."""
    for route in table:
        app.add_api_route(
            route.path,
            _endpoint(route),
            methods=[route.method],
            summary=route.summary or None,
            tags=[route.dialect.tag],
            responses=_responses(route),
            response_model=None,
            include_in_schema=route.documented,
        )
