"""POST /encode (native) and POST /v1/embeddings (OpenAI-compatible)."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from service.embedder import ClientGone, Encoded, as_list, check_texts, postprocess
from service.errors import InvalidInput, Unavailable
from service.routes.common import CLIENT_CLOSED, disconnect_watch, respond, state
from service.schemas import EncodeRequest, OpenAIEmbeddingsRequest

router = APIRouter(tags=["embeddings"])


def _check_dimensions(dimensions: int | None, d_model: int, param: str = "dimensions") -> None:
    if dimensions is not None and not 1 <= dimensions <= d_model:
        raise InvalidInput(
            f"{param} must be between 1 and {d_model}, got {dimensions}", param=param
        )


async def _encode(
    request: Request, inputs: str | list[str], name: str, truncate: bool, dimensions: int | None
) -> Encoded | Response:
    """Validate, embed, and handle a client that went away (nothing to answer then)."""
    app = state(request)
    texts = as_list(inputs, name)
    check_texts(texts, app.settings, name)
    _check_dimensions(dimensions, app.bundle.manifest.d_model)
    if not app.ready:
        raise Unavailable("model is loading", retry_after=2)
    async with disconnect_watch(request) as gone:
        try:
            return await app.embedder.encode(texts, truncate, gone)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)


@router.post("/encode", summary="Embed one text or a list of texts")
async def encode(body: EncodeRequest, request: Request) -> Response:
    app = state(request)
    result = await _encode(request, body.inputs, "inputs", body.truncate, body.dimensions)
    if isinstance(result, Response):
        return result
    vectors = postprocess(result.vectors, body.normalize, body.dimensions)
    payload = {
        "embeddings": vectors,
        "model": app.bundle.manifest.name,
        "dimensions": int(vectors.shape[1]),
        "tokens": result.tokens,
    }
    return respond(request, payload, result.timings)


def _b64(vector: np.ndarray) -> str:
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")


@router.post("/v1/embeddings", summary="OpenAI-compatible embeddings")
async def openai_embeddings(body: OpenAIEmbeddingsRequest, request: Request) -> Response:
    app = state(request)
    result = await _encode(request, body.input, "input", True, body.dimensions)
    if isinstance(result, Response):
        return result
    vectors = postprocess(result.vectors, True, body.dimensions)
    if body.encoding_format == "base64":
        data = [
            {"object": "embedding", "index": i, "embedding": _b64(v)} for i, v in enumerate(vectors)
        ]
    else:
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    total = sum(result.tokens)
    payload = {
        "object": "list",
        "data": data,
        "model": body.model or app.bundle.manifest.name,
        "usage": {"prompt_tokens": total, "total_tokens": total},
    }
    return respond(request, payload, result.timings)
