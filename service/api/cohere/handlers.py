"""Cohere's rerank, v1 (and Jina's) and v2, on the same pipelines as TEI's."""

from __future__ import annotations

import uuid

from starlette.responses import Response

from service.api.cohere.schemas import RerankV1Request, RerankV2Request
from service.api.context import Context
from service.pipelines.score import ranked


async def rerank_v1(ctx: Context, body: RerankV1Request) -> Response:
    model = ctx.model(body.model)
    pipe = model.score
    assert pipe is not None
    documents = body.texts()
    pipe.check(documents, "documents", ctx.settings.rerank_max_documents)
    out = await pipe.score(ctx.call, [(body.query, d) for d in documents])
    scores = pipe.relevance(out.logits)
    results = [
        {
            "index": i,
            "relevance_score": float(scores[i]),
            **({"document": {"text": documents[i]}} if body.return_documents else {}),
        }
        for i in ranked(scores, body.top_n)
    ]
    payload = {
        "id": str(uuid.uuid4()),
        "results": results,
        "model": body.model or model.name,
        "usage": {"total_tokens": sum(out.tokens)},
        "meta": {"api_version": {"version": "1"}, "billed_units": {"search_units": 1}},
    }
    return ctx.respond(payload, out.timings)


async def rerank_v2(ctx: Context, body: RerankV2Request) -> Response:
    pipe = ctx.model(body.model).score
    assert pipe is not None
    pipe.check(body.documents, "documents", ctx.settings.rerank_max_documents)
    documents = await pipe.cut_documents(ctx.call, body.documents, body.max_tokens_per_doc)
    out = await pipe.score(ctx.call, [(body.query, d) for d in documents])
    scores = pipe.relevance(out.logits)
    payload = {
        "id": str(uuid.uuid4()),
        "results": [
            {"index": i, "relevance_score": float(scores[i])} for i in ranked(scores, body.top_n)
        ],
        "meta": {
            "api_version": {"version": "2"},
            "billed_units": {"search_units": 1},
            "tokens": {"input_tokens": sum(out.tokens), "output_tokens": 0},
        },
    }
    return ctx.respond(payload, out.timings)
