"""What a handler gets besides its body: the request, the served models, the call (deadline and
client), and the two things every handler does with them (pick a model, answer in JSON).

The same context serves gRPC (service/rpc): there is no HTTP request then, and what the
handler records for the request's metrics and trace (`state`: the model, the stage timings)
goes to the RPC's own state. Only HTTP routes read `http` (path and query parameters, the
raw body)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypeVar

import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from service.errors import Disconnected
from service.pipelines.call import Call, Timings
from service.registry import Capability, Model, Registry
from service.settings import Settings

M = TypeVar("M", bound=BaseModel)


@dataclass
class Context:
    request: Request | None  # None: a gRPC call
    registry: Registry
    call: Call
    capability: Capability | None = None  # the route's
    state: Any = None  # the request's state: the HTTP request's, or the RPC's

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = self.request.state if self.request is not None else SimpleNamespace()

    @property
    def http(self) -> Request:
        """The HTTP request (only HTTP routes' handlers ask)."""
        if self.request is None:
            raise RuntimeError("an HTTP handler was called without its HTTP request")
        return self.request

    @property
    def settings(self) -> Settings:
        return self.registry.settings

    def model(self, name: str | None = None, capability: Capability | None = None) -> Model:
        """The model that answers (named, or the first that can), and the request's metrics
        labelled with it."""
        wanted = capability or self.capability or "tokenize"
        model = self.registry.pick(name, wanted)
        self.state.model = model.name
        return model

    async def parse(self, kind: type[M]) -> M:
        """The JSON body as `kind`, for a route whose body type is known only at run time;
        a body that does not validate is refused as any other (one renderer)."""
        try:
            return kind.model_validate_json(await self.http.body())
        except ValidationError as exc:
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
            ) from None

    def timed(self, timings: Timings) -> None:
        """The request's stage times: its timing headers, and its trace's child spans."""
        self.state.timing_headers = timings.headers()
        self.state.timings = timings

    def respond(self, payload: Any, timings: Timings | None = None, status: int = 200) -> Response:
        """orjson for the body (numpy arrays included); timing headers when there were any.
        A client that went away gets nothing written (serialising a large answer costs)."""
        if self.call.gone:
            raise Disconnected()
        if timings is not None:
            self.timed(timings)
        body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
        return Response(body, status_code=status, media_type="application/json")
