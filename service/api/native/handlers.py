"""headwise's own routes: embeddings, tokenisation details, attention maps and their viewer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import resources

from starlette.responses import HTMLResponse, Response, StreamingResponse

from service.api.context import Context
from service.api.native.schemas import AttentionRequest, EncodeRequest, TokenizeDetailsRequest
from service.pipelines.base import as_list, check_texts
from service.pipelines.embed import Tokenizing

# An answer larger than this goes out in pieces, each waiting for the socket, so that health
# checks are answered in between (one large write would hold the event loop while it is copied).
STREAM_BYTES = 1 << 20


async def encode(ctx: Context, body: EncodeRequest) -> Response:
    model = ctx.model(body.model)
    pipe = model.embed
    assert pipe is not None
    texts = pipe.validate(body.inputs, "inputs", body.dimensions)
    how = Tokenizing(
        truncate=body.truncate, prompt_name=body.prompt_name, instruction=body.instruction
    )
    out = await pipe.embed(ctx.call, texts, how, body.normalize, body.dimensions)
    payload = {
        "embeddings": out.vectors,
        "model": model.name,
        "dimensions": int(out.vectors.shape[1]),
        "tokens": out.tokens,
    }
    return ctx.respond(payload, out.timings)


async def tokenize_details(ctx: Context, body: TokenizeDetailsRequest) -> Response:
    model = ctx.model(body.model)
    texts = as_list(body.inputs, "inputs")
    check_texts(texts, ctx.settings, "inputs")
    encodings, _ = await ctx.call.tokenize(model.backend.tokenize, texts, body.add_special_tokens)
    results = [
        {
            "tokens": e.tokens,
            "ids": e.ids,
            "offsets": [list(o) for o in e.offsets],
            "special": [bool(x) for x in e.special_tokens_mask],
            "truncated": bool(e.overflowing),
        }
        for e in encodings
    ]
    return ctx.respond({"model": model.name, "results": results})


async def attention(ctx: Context, body: AttentionRequest) -> Response:
    pipe = ctx.model(body.model).attention
    assert pipe is not None
    query = pipe.query(
        body.input,
        body.layers,
        body.heads,
        body.truncate,
        body.format,
        pair=body.pair,
        encoding=body.encoding_format,
    )
    out = await pipe.run(ctx.call, query)
    ctx.request.state.timing_headers = out.timings.headers()
    size = sum(map(len, out.body))
    if size <= STREAM_BYTES:
        return Response(b"".join(out.body), media_type=out.media_type)
    return StreamingResponse(
        _pieces(out.body), media_type=out.media_type, headers={"content-length": str(size)}
    )


async def _pieces(body: list[bytes]) -> AsyncIterator[bytes]:
    for piece in body:
        yield piece


async def attention_view(ctx: Context, body: None = None) -> Response:
    page = resources.files("service").joinpath("static/attention.html").read_text(encoding="utf-8")
    return HTMLResponse(page)
