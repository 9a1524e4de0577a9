"""Responses every route sends: orjson bodies with the timing headers."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response

from service.pipelines.common import Timings


def respond(request: Request, payload: Any, timings: Timings | None = None) -> Response:
    if timings is not None:
        request.state.timing_headers = timings.headers()
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, media_type="application/json")
