"""Voyage's rerank and embed, on the same pipelines as every other dialect's."""

from __future__ import annotations

import base64

import numpy as np
from starlette.responses import Response

from service.api.context import Context
from service.api.voyage.schemas import EmbeddingsRequest, RerankRequest
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


async def embeddings(ctx: Context, body: EmbeddingsRequest) -> Response:
    model = ctx.model(body.model, "embed")
    pipe = model.embed
    assert pipe is not None
    texts = pipe.validate(as_list(body.input, "input"), "input", body.output_dimension)
    how = Tokenizing(truncate=body.truncation, prompt_name=pipe.prompt_for(body.input_type))
    out = await pipe.embed(ctx.call, texts, how, normalize=True, dimensions=body.output_dimension)
    rows = quantize.encode(out.vectors, body.output_dtype)
    assert isinstance(rows, np.ndarray)
    data = [
        {
            "object": "embedding",
            "embedding": _b64(row) if body.encoding_format == "base64" else row,
            "index": i,
        }
        for i, row in enumerate(rows)
    ]
    payload = {
        "object": "list",
        "data": data,
        "model": body.model or model.name,
        "usage": {"total_tokens": sum(out.tokens)},
    }
    return ctx.respond(payload, out.timings)
