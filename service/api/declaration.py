"""What a route is, written once: its path and method, its request and response types, its
dialect (which decides the shape of its errors), the capability a model needs to answer it,
whether it is open (no API key) and whether the hot lane takes it, and its handler.

`service/api/routes.py` lists every route as one of these. Everything that must agree on the
routes is derived from that list (`RouteTable`): FastAPI's routes and the OpenAPI document, the
hot lane's table, the open paths, the metrics' endpoint labels, each path's error dialect, and
which routes a model serves.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Discriminator, RootModel, Tag, TypeAdapter, create_model
from starlette.responses import Response
from starlette.routing import compile_path

from service.registry import Capability

Handler = Callable[[Any, Any], Awaitable[Response]]  # (context, body or None) -> response
Method = Literal["GET", "POST"]

# Refusals every route may answer, and those of routes that run a model.
BASE_ERRORS = (400, 405, 408, 413, 415, 422, 431, 500)
MODEL_ERRORS = (404, 429, 503)


@dataclass(frozen=True)
class ErrorInfo:
    """An error as every dialect needs it, before it takes the dialect's shape."""

    status: int
    kind: str
    message: str
    param: str | None = None
    code: str | None = None


@dataclass(frozen=True)
class Dialect:
    """An API's conventions: its name, its OpenAPI tag, and the body of its errors."""

    name: str
    tag: str
    error_body: Callable[[ErrorInfo], object]  # -> a JSON-able body
    error_schema: type[BaseModel]  # that body, for the OpenAPI document


def merged(name: str, tag: str, *dialects: Dialect) -> Dialect:
    """The dialect of a path two vendors share: an error carries both vendors' fields, so that
    either SDK finds what it reads (Cohere's `message` and Voyage's `detail`, say)."""

    def error_body(e: ErrorInfo) -> dict[str, object]:
        body: dict[str, object] = {}
        for d in dialects:
            part = d.error_body(e)
            assert isinstance(part, dict)
            body.update(part)
        return body

    fields: dict[str, Any] = {
        f: (info.annotation, info) for d in dialects for f, info in d.error_schema.model_fields.items()
    }
    schema = create_model(f"{''.join(d.error_schema.__name__ for d in dialects)}", **fields)
    return Dialect(name, tag, error_body, schema)


@dataclass(frozen=True)
class Variant:
    """One request shape a route takes, with its handler and what it answers."""

    request: Any  # the body's type (a pydantic model), or None: no body
    handler: Handler
    response: Any  # the 200 body's type, for the OpenAPI document (None: not JSON)
    dialect: Dialect | None = None  # whose shape it is, when a route takes several


@dataclass(frozen=True)
class Route:
    path: str
    dialect: Dialect  # the shape of every error this route answers
    variants: tuple[Variant, ...]
    method: Method = "POST"
    capability: Capability | None = None  # what the answering model must do; None: no model
    open: bool = False  # answered without the API key
    lane: bool = False  # the hot lane answers its plain cases
    summary: str = ""
    # Several variants on one path (two vendors' shapes): picks a variant's index from the
    # raw JSON body (a dict); the union is documented as oneOf.
    discriminator: Callable[[Any], int] | None = None
    media_type: str = "application/json"
    documented: bool = True  # in the OpenAPI document
    errors: tuple[int, ...] = ()  # refusals beyond the defaults
    ready: bool | None = None  # needs the models loaded and warm; default: when it runs one
    feature: Literal["attention"] | None = None  # served only while this feature is enabled
    # A body (without `model`) each model with the capability answers before ready, so that
    # its first requests find the request path warm (service/http/rehearsal.py).
    rehearsal: dict[str, object] | None = None

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError(f"{self.path}: a route needs at least one variant")
        if len(self.variants) > 1 and self.discriminator is None:
            raise ValueError(f"{self.path}: several variants need a discriminator")

    @property
    def key(self) -> tuple[str, str]:
        return (self.method, self.path)

    @property
    def needs_ready(self) -> bool:
        """Its answer needs the models loaded and warm (tokenising does not)."""
        if self.ready is not None:
            return self.ready
        return self.capability is not None and self.capability != "tokenize"

    @cached_property
    def request(self) -> Any:
        """The body's type: one model, or a discriminated union of the variants' bodies."""
        if len(self.variants) == 1:
            return self.variants[0].request
        pick = self.discriminator
        assert pick is not None
        types = [v.request for v in self.variants]

        def tag(raw: Any) -> str:
            if isinstance(raw, BaseModel):  # serialising: its own type decides
                return str(next(i for i, t in enumerate(types) if isinstance(raw, t)))
            return str(pick(raw) if isinstance(raw, dict) else 0)

        tagged = tuple(Annotated[t, Tag(str(i))] for i, t in enumerate(types))
        # A root model, not a bare Annotated union: FastAPI drops a parameter's Discriminator.
        return RootModel[Annotated[Union[tagged], Discriminator(tag)]]  # type: ignore[valid-type]  # noqa: UP007

    @cached_property
    def response(self) -> Any:
        kinds = [v.response for v in self.variants if v.response is not None]
        if not kinds:
            return None
        return kinds[0] if len(kinds) == 1 else Union[tuple(kinds)]  # noqa: UP007

    @cached_property
    def adapter(self) -> TypeAdapter[Any]:
        """Validates a raw JSON body into the route's request (built once)."""
        return TypeAdapter(self.request)

    def variant_of(self, body: Any) -> tuple[Variant, Any]:
        """The variant a validated body belongs to, and the body itself (unwrapped)."""
        if isinstance(body, RootModel):
            body = body.root
        for v in self.variants:
            if isinstance(v.request, type) and isinstance(body, v.request):
                return v, body
        return self.variants[0], body

    def error_statuses(self) -> tuple[int, ...]:
        statuses = set(BASE_ERRORS) | set(self.errors)
        if not self.open:
            statuses.add(401)
        if self.capability is not None or self.needs_ready:
            statuses |= set(MODEL_ERRORS)
        return tuple(sorted(statuses))


_PARAM = re.compile(r"{[^}]+}")


def _stem(path: str) -> str:
    """A templated path's fixed start: /v2/models/ of /v2/models/{name:path}/infer."""
    return path[: path.index("{")]


class RouteTable:
    """The declaration, indexed: by path (exact or templated), by capability."""

    def __init__(self, routes: Sequence[Route], default: Dialect) -> None:
        seen: set[tuple[str, str]] = set()
        for r in routes:
            if r.key in seen:
                raise ValueError(f"{r.method} {r.path} is declared twice")
            seen.add(r.key)
        self.routes = tuple(routes)
        self.default = default  # the dialect of paths no route declares
        self._exact: dict[str, list[Route]] = {}
        self._templates: list[tuple[re.Pattern[str], list[Route]]] = []
        for r in routes:
            if _PARAM.search(r.path):
                regex, _, _ = compile_path(r.path)
                for pattern, found in self._templates:
                    if pattern.pattern == regex.pattern:
                        found.append(r)
                        break
                else:
                    self._templates.append((regex, [r]))
            else:
                self._exact.setdefault(r.path, []).append(r)

    def __iter__(self) -> Iterator[Route]:
        return iter(self.routes)

    def at(self, path: str) -> list[Route]:
        """The routes declared on this path (any method); [] for an unknown path."""
        found = self._exact.get(path)
        if found is not None:
            return found
        for pattern, routes in self._templates:
            if pattern.match(path):
                return routes
        return []

    def match(self, method: str, path: str) -> Route | None:
        return next((r for r in self.at(path) if r.method == method), None)

    def dialect(self, path: str) -> Dialect:
        """The dialect of the route at this path; for a path no route matches, that of the
        templated route whose fixed start it shares (a model name no template takes, under
        /v2/models/, is still answered in the protocol's shape), else the default."""
        routes = self.at(path)
        if routes:
            return routes[0].dialect
        under = [r for r in self.routes if _PARAM.search(r.path) and path.startswith(_stem(r.path))]
        return max(under, key=lambda r: len(_stem(r.path))).dialect if under else self.default

    def is_open(self, path: str) -> bool:
        routes = self.at(path)
        return bool(routes) and all(r.open for r in routes)

    def label(self, path: str) -> str:
        """The metrics' endpoint label of a path: its declared path (a template for ids), or
        "other": bounded, whatever the client sends."""
        routes = self.at(path)
        return routes[0].path if routes else "other"

    def liveness(self) -> frozenset[str]:
        """Paths answered however crowded the server is: the open GET routes (health,
        readiness, metrics: cheap, and what orchestrators and scrapers rely on)."""
        return frozenset(r.path for r in self.routes if r.open and r.method == "GET")

    def lane(self) -> dict[str, Route]:
        return {r.path: r for r in self.routes if r.lane and r.method == "POST"}

    def paths_for(self, capability: Capability) -> list[str]:
        """The documented routes that need this capability, in declaration order."""
        out = [r.path for r in self.routes if r.capability == capability and r.documented]
        return list(dict.fromkeys(out))
