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
        body.input,
        body.layers,
        body.heads,
        body.truncate,
        body.format,
        pair=body.pair,
        encoding=body.encoding_format,
    )
    out = await pipe.run(query, gone)
    request.state.timing_headers = out.timings.headers()
    size = sum(map(len, out.body))
    if size <= 1 << 20:
        return Response(b"".join(out.body), media_type=out.media_type)
    # Tens of MB written at once would hold the event loop while they are copied: in pieces,
    # each waits for the socket, and health checks are answered in between.
    return StreamingResponse(
        _pieces(out.body), media_type=out.media_type, headers={"content-length": str(size)}
    )


async def _pieces(body: list[bytes]) -> AsyncIterator[bytes]:
    for piece in body:
        yield piece


@router.get("/attention/view", summary="A page to look at the maps", response_class=HTMLResponse)
async def view() -> HTMLResponse:
    page = resources.files("service").joinpath("static/attention.html").read_text(encoding="utf-8")
    return HTMLResponse(page)
