"""POST /encode (native) and POST /v1/embeddings (OpenAI-compatible)."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from service.deps import ClientGone, ReadyCore, use_model
from service.openai_tokens import texts_from_token_ids
from service.routes.common import respond
from service.schemas import EncodeRequest, OpenAIEmbeddingsRequest

router = APIRouter(tags=["embeddings"])


@router.post("/encode", summary="Embed one text or a list of texts")
async def encode(
    body: EncodeRequest,
    request: Request,
    core: ReadyCore,
    gone: ClientGone,
) -> Response:
    model = use_model(request, core, body.model, "embed")
    pipe = model.embed
    texts = pipe.validate(body.inputs, "inputs", body.dimensions)
    out = await pipe.embed(
        texts,
        truncate=body.truncate,
        normalize=body.normalize,
        dimensions=body.dimensions,
        prompt_name=body.prompt_name,
        disconnect=gone,
    )
    payload = {
        "embeddings": out.vectors,
        "model": model.name,
        "dimensions": int(out.vectors.shape[1]),
        "tokens": out.tokens,
    }
    return respond(request, payload, out.timings)


def _b64(vector: np.ndarray) -> str:
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")


@router.post("/v1/embeddings", summary="OpenAI-compatible embeddings")
async def openai_embeddings(
    body: OpenAIEmbeddingsRequest,
    request: Request,
    core: ReadyCore,
    gone: ClientGone,
) -> Response:
    model = use_model(request, core, body.model, "embed")
    pipe = model.embed
    inputs = body.input
    if (arrays := body.token_arrays()) is not None:
        inputs = await texts_from_token_ids(arrays, core.settings.openai_token_ids)
    texts = pipe.validate(inputs, "input", body.dimensions)
    out = await pipe.embed(
        texts,
        normalize=True,
        dimensions=body.dimensions,
        prompt_name=body.prompt_name,
        disconnect=gone,
    )
    encode = _b64 if body.encoding_format == "base64" else (lambda v: v)
    data = [
        {"object": "embedding", "index": i, "embedding": encode(v)}
        for i, v in enumerate(out.vectors)
    ]
    total = sum(out.tokens)
    payload = {
        "object": "list",
        "data": data,
        "model": body.model or model.name,
        "usage": {"prompt_tokens": total, "total_tokens": total},
    }
    return respond(request, payload, out.timings)
