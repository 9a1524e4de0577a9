"""POST /attention: per-layer, per-head attention maps of one text; GET /attention/view."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import resources

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, Response, StreamingResponse

from service.deps import ClientGone, ReadyCore, use_model
from service.schemas import AttentionRequest

router = APIRouter(tags=["attention"])


@router.post("/attention", summary="Attention maps, head statistics and token importance")
async def attention(
    body: AttentionRequest,
    request: Request,
    core: ReadyCore,
    gone: ClientGone,
) -> Response:
    pipe = use_model(request, core, body.model, "attention").attention
    query = pipe.query(
        body.input, body.layers, body.heads, body.truncate, body.format, body.encoding_format
    )
    out = await pipe.run(query, gone)
    request.state.timing_headers = out.timings.headers()
    if len(out.body) <= CHUNK:
        return Response(out.body, media_type=out.media_type)
    # Tens of MB written at once would hold the event loop while the server copies them into
    # its send buffer: in pieces, each waits for the socket (health checks go in between).
    return StreamingResponse(
        _pieces(out.body), media_type=out.media_type, headers={"content-length": str(len(out.body))}
    )


CHUNK = 1 << 20


async def _pieces(body: bytes) -> AsyncIterator[bytes]:
    view = memoryview(body)
    for i in range(0, len(view), CHUNK):
        yield bytes(view[i : i + CHUNK])


@router.get("/attention/view", summary="A page to look at the maps", response_class=HTMLResponse)
async def view() -> HTMLResponse:
    page = resources.files("service").joinpath("static/attention.html").read_text(encoding="utf-8")
    return HTMLResponse(page)
