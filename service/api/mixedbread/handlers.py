"""Mixedbread's rerank, on the same pipeline as every other rerank route."""

from __future__ import annotations

from starlette.responses import Response

from service.api.context import Context
from service.api.mixedbread.schemas import RerankRequest
from service.errors import InvalidInput
from service.pipelines.score import ranked


async def rerank(ctx: Context, body: RerankRequest) -> Response:
    model = ctx.model(body.model, "rerank")
    pipe = model.score
    assert pipe is not None
    try:
        documents = body.texts()
    except ValueError as exc:
        raise InvalidInput(str(exc), param="rank_fields") from None
    pipe.check(documents, "input", ctx.settings.rerank_max_documents)
    pairs = [(body.query, d) for d in documents]
    out = await pipe.score(ctx.call, pairs, instruction=body.instruction)
    scores = pipe.relevance(out.logits)
    top_k = body.top_k or len(documents)
    data = [
        {"index": i, "score": float(scores[i]), **({"input": body.input[i]} if body.return_input else {})}
        for i in ranked(scores, top_k)
    ]
    total = sum(out.tokens)
    payload = {
        "usage": {"prompt_tokens": total, "total_tokens": total, "completion_tokens": 0},
        "model": body.model or model.name,
        "data": data,
        "object": "list",
        "top_k": top_k,
        "return_input": body.return_input,
    }
    return ctx.respond(payload, out.timings)
