"""Rerankers and classifiers: TEI's /rerank and /predict, Cohere's/Jina's /v1/rerank, Cohere's
/v2/rerank. Each answered by the model named in the request or the first of that task."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from service.core import Core, Model
from service.deps import ClientGone, ReadyCore, use_model
from service.rerank_schemas import (
    CohereV1RerankRequest,
    CohereV2RerankRequest,
    PredictRequest,
    TeiRerankRequest,
)
from service.routes.common import respond
from service.routes.tei import parsed, tei_dialect

tei = APIRouter(tags=["rerank"], dependencies=[Depends(tei_dialect)])
cohere = APIRouter(tags=["rerank"])


def ranked(scores, top_n: int | None = None) -> list[int]:
    """Indices, best score first (stable for ties), at most top_n."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order[:top_n] if top_n else order


@tei.post("/rerank", summary="TEI: score each text against the query, best first")
async def rerank(
    body: TeiRerankRequest, request: Request, core: ReadyCore, gone: ClientGone
) -> Response:
    pipe = use_model(request, core, body.model, "rerank").score
    pipe.check(body.texts, "texts", core.settings.rerank_max_documents)
    out = await pipe.score([(body.query, t) for t in body.texts], body.cut, gone)
    scores = pipe.relevance(out.logits, body.raw_scores)
    results = [
        {"index": i, "score": float(scores[i]), **({"text": body.texts[i]} if body.return_text else {})}
        for i in ranked(scores)
    ]
    return respond(request, results, out.timings)


@tei.post("/predict", summary="TEI: every label's score for each text or pair")
async def predict(
    body: PredictRequest, request: Request, core: ReadyCore, gone: ClientGone
) -> Response:
    pipe = use_model(request, core, body.model, "classify").score
    items, single = body.batch()
    pipe.check(items, "inputs")
    out = await pipe.score(items, body.cut, gone)
    probs = pipe.probabilities(out.logits, body.raw_scores)
    labels = pipe.labels
    answers = [
        [{"label": labels[j], "score": float(row[j])} for j in ranked(row)] for row in probs
    ]
    return respond(request, answers[0] if single else answers, out.timings)


async def dispatch_root(first: Model, request: Request, core: Core, gone) -> Response:
    """TEI's POST / for a reranker or classifier: its own route, same body."""
    if first.task == "rerank":
        return await rerank(await parsed(request, TeiRerankRequest), request, core, gone)
    return await predict(await parsed(request, PredictRequest), request, core, gone)


def _usage(tokens: list[int]) -> dict:
    return {"total_tokens": sum(tokens)}


@cohere.post("/v1/rerank", summary="Cohere (v1) and Jina rerank")
async def rerank_v1(
    body: CohereV1RerankRequest, request: Request, core: ReadyCore, gone: ClientGone
) -> Response:
    model = use_model(request, core, body.model, "rerank")
    pipe = model.score
    documents = body.texts()
    pipe.check(documents, "documents", core.settings.rerank_max_documents)
    out = await pipe.score([(body.query, d) for d in documents], True, gone)
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
        "usage": _usage(out.tokens),
        "meta": {"api_version": {"version": "1"}, "billed_units": {"search_units": 1}},
    }
    return respond(request, payload, out.timings)


@cohere.post("/v2/rerank", summary="Cohere rerank (v2)")
async def rerank_v2(
    body: CohereV2RerankRequest, request: Request, core: ReadyCore, gone: ClientGone
) -> Response:
    pipe = use_model(request, core, body.model, "rerank").score
    pipe.check(body.documents, "documents", core.settings.rerank_max_documents)
    documents = await pipe.cut_documents(body.documents, body.max_tokens_per_doc)
    out = await pipe.score([(body.query, d) for d in documents], True, gone)
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
    return respond(request, payload, out.timings)
