"""Voyage's rerank, embed and multimodal embed, on the same pipelines as every other dialect's."""

from __future__ import annotations

import base64

import numpy as np
from starlette.responses import Response

from service.api.context import Context
from service.api.pieces import Image, Piece, model_for, one_piece
from service.api.pieces import embed as embed_pieces
from service.api.voyage.schemas import (
    EmbeddingsRequest,
    ImageBase64Piece,
    ImageUrlPiece,
    MultimodalRequest,
    OutputDtype,
    RerankRequest,
    TextPiece,
)
from service.pipelines import quantize
from service.pipelines.base import as_list
from service.pipelines.embed import Tokenizing
from service.pipelines.score import ranked


async def rerank(ctx: Context, body: RerankRequest) -> Response:
    model = ctx.model(body.model, "rerank")
    pipe = model.score
    assert pipe is not None
    pipe.check(body.documents, "documents", ctx.settings.rerank_max_documents)
    pairs = [(body.query, d) for d in body.documents]
    out = await pipe.score(ctx.call, pairs, body.truncation, body.instruction)
    scores = pipe.relevance(out.logits)
    data = [
        {
            "relevance_score": float(scores[i]),
            "index": i,
            **({"document": body.documents[i]} if body.return_documents else {}),
        }
        for i in ranked(scores, body.top_k)
    ]
    payload = {
        "object": "list",
        "data": data,
        "model": body.model or model.name,
        "usage": {"total_tokens": sum(out.tokens)},
    }
    return ctx.respond(payload, out.timings)


def _b64(row: np.ndarray) -> str:
    """The row's bytes (float32 little-endian, or the 8-bit forms), base64."""
    data = row.astype("<f4", copy=False) if row.dtype.kind == "f" else row
    return base64.b64encode(data.tobytes()).decode("ascii")


def _data(vectors: np.ndarray, dtype: OutputDtype, base64: bool) -> list[dict[str, object]]:
    rows = quantize.encode(vectors, dtype)
    assert isinstance(rows, np.ndarray)
    return [
        {"object": "embedding", "embedding": _b64(row) if base64 else row, "index": i}
        for i, row in enumerate(rows)
    ]


async def embeddings(ctx: Context, body: EmbeddingsRequest) -> Response:
    model = ctx.model(body.model, "embed")
    pipe = model.embed
    assert pipe is not None
    texts = pipe.validate(as_list(body.input, "input"), "input", body.output_dimension)
    how = Tokenizing(truncate=body.truncation, prompt_name=pipe.prompt_for(body.input_type))
    out = await pipe.embed(ctx.call, texts, how, normalize=True, dimensions=body.output_dimension)
    payload = {
        "object": "list",
        "data": _data(out.vectors, body.output_dtype, body.encoding_format == "base64"),
        "model": body.model or model.name,
        "usage": {"total_tokens": sum(out.tokens)},
    }
    return ctx.respond(payload, out.timings)


def _piece(p: TextPiece | ImageUrlPiece | ImageBase64Piece) -> Piece:
    if isinstance(p, TextPiece):
        return p.text
    return Image(p.image_url if isinstance(p, ImageUrlPiece) else p.image_base64)


async def multimodal_embeddings(ctx: Context, body: MultimodalRequest) -> Response:
    """One vector per input, as Voyage's; each input one piece (see MultimodalRequest). Usage
    counts the texts' tokens, the pixels the vision tower took in (its input size, whatever the
    image's), and their sum with the images' tower tokens as `total_tokens`."""
    pieces = [
        one_piece([_piece(p) for p in i.content], f"inputs[{n}].content", "inputs")
        for n, i in enumerate(body.inputs)
    ]
    model = model_for(ctx, body.model, pieces)
    pipe = model.embed
    assert pipe is not None
    how = Tokenizing(truncate=body.truncation, prompt_name=pipe.prompt_for(body.input_type))
    out = await embed_pieces(ctx.call, model, pieces, how, body.output_dimension)
    payload = {
        "object": "list",
        "data": _data(out.vectors, body.output_dtype, body.base64),
        "model": body.model or model.name,
        "usage": {
            "text_tokens": out.text_tokens,
            "image_pixels": out.image_pixels,
            "video_pixels": 0,
            "total_tokens": out.text_tokens + out.image_tokens,
        },
    }
    return ctx.respond(payload, out.timings)
