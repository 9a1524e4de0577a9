"""What a handler gets besides its body: the request, the served models, the call (deadline and
client), and the two things every handler does with them (pick a model, answer in JSON)."""

from __future__ import annotations

from dataclasses import dataclass
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
    request: Request
    registry: Registry
    call: Call
    capability: Capability | None = None  # the route's

    @property
    def settings(self) -> Settings:
        return self.registry.settings

    def model(self, name: str | None = None, capability: Capability | None = None) -> Model:
        """The model that answers (named, or the first that can), and the request's metrics
        labelled with it."""
        wanted = capability or self.capability or "tokenize"
        model = self.registry.pick(name, wanted)
        self.request.state.model = model.name
        return model

    async def parse(self, kind: type[M]) -> M:
        """The JSON body as `kind`, for a route whose body type is known only at run time;
        a body that does not validate is refused as any other (one renderer)."""
        try:
            return kind.model_validate_json(await self.request.body())
        except ValidationError as exc:
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
            ) from None

    def timed(self, timings: Timings) -> None:
        """The request's stage times: its timing headers, and its trace's child spans."""
        self.request.state.timing_headers = timings.headers()
        self.request.state.timings = timings

    def respond(self, payload: Any, timings: Timings | None = None, status: int = 200) -> Response:
        """orjson for the body (numpy arrays included); timing headers when there were any.
        A client that went away gets nothing written (serialising a large answer costs)."""
        if self.call.gone:
            raise Disconnected()
        if timings is not None:
            self.timed(timings)
        body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
        return Response(body, status_code=status, media_type="application/json")
