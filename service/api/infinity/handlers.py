"""Infinity's embeddings, rerank and model list, on the same pipelines."""

from __future__ import annotations

import base64
import time
import uuid

import numpy as np
from starlette.responses import Response

from service.api.context import Context
from service.api.infinity.schemas import EmbeddingsRequest, RerankRequest
from service.api.pieces import Image
from service.api.pieces import embed as embed_pieces
from service.pipelines.base import as_list
from service.pipelines.score import ranked
from service.registry import Model

# Infinity's capability names for ours.
CAPABILITIES = {"embed": "embed", "rerank": "rerank", "classify": "classify", "images": "image_embed"}


def _usage(tokens: list[int]) -> dict[str, int]:
    return {"prompt_tokens": sum(tokens), "total_tokens": sum(tokens)}


def _stamp() -> dict[str, object]:
    return {"id": f"infinity-{uuid.uuid4()}", "created": int(time.time())}


async def embeddings(ctx: Context, body: EmbeddingsRequest) -> Response:
    """Texts, or with `modality: "image"` images (URLs or data URIs), one vector each."""
    items = as_list(body.input, "input")
    if body.modality == "image":
        model = ctx.model(body.model, "images")
        images = [Image(ref) for ref in items]
        out = await embed_pieces(ctx.call, model, images, None, body.dimensions, "input")
        vectors, tokens, timings = out.vectors, out.tokens, out.timings
    else:
        model = ctx.model(body.model, "embed")
        pipe = model.embed
        assert pipe is not None
        texts = pipe.validate(items, "input", body.dimensions)
        done = await pipe.embed(ctx.call, texts, normalize=True, dimensions=body.dimensions)
        vectors, tokens, timings = done.vectors, done.tokens, done.timings

    def encode(v: np.ndarray) -> np.ndarray | str:
        if body.encoding_format == "base64":
            return base64.b64encode(v.astype("<f4", copy=False).tobytes()).decode("ascii")
        return v

    payload = {
        "object": "list",
        "data": [{"object": "embedding", "embedding": encode(v), "index": i} for i, v in enumerate(vectors)],
        "model": model.name,
        "usage": _usage(tokens),
        **_stamp(),
    }
    return ctx.respond(payload, timings)


async def rerank(ctx: Context, body: RerankRequest) -> Response:
    model = ctx.model(body.model, "rerank")
    pipe = model.score
    assert pipe is not None
    pipe.check(body.documents, "documents", ctx.settings.rerank_max_documents)
    pairs = [(body.query, d) for d in body.documents]
    out = await pipe.score(ctx.call, pairs, instruction=body.instruction)
    scores = pipe.relevance(out.logits, body.raw_scores)
    results = [
        {
            "relevance_score": float(scores[i]),
            "index": i,
            "document": body.documents[i] if body.return_documents else None,
        }
        for i in ranked(scores, body.top_n)
    ]
    payload = {
        "object": "rerank",
        "results": results,
        "model": model.name,
        "usage": _usage(out.tokens),
        **_stamp(),
    }
    return ctx.respond(payload, out.timings)


def _info(model: Model) -> dict[str, object]:
    pipe = model.embed or model.score
    batcher = pipe.batcher if pipe is not None else None
    depth = batcher.depth if batcher is not None else 0
    limit = batcher.policy.max_queue if batcher is not None else 1
    return {
        "id": model.name,
        "stats": {
            "queue_fraction": depth / limit,
            "queue_absolute": depth,
            "results_pending": depth,
            "batch_size": batcher.policy.max_batch_size if batcher is not None else 0,
        },
        "object": "model",
        "owned_by": "infinity",
        "created": model.created,
        "backend": "onnxruntime",
        "capabilities": sorted(CAPABILITIES[c] for c in model.capabilities if c in CAPABILITIES),
    }


async def models(ctx: Context, body: None = None) -> Response:
    return ctx.respond({"data": [_info(m) for m in ctx.registry], "object": "list"})
