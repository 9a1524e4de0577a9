"""`/v1/embeddings` (always L2-normalised, floats or base64) and the model list."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from starlette.responses import Response

from service.api.context import Context
from service.api.openai.schemas import EmbeddingsRequest
from service.api.openai.tokens import texts_from_token_ids
from service.errors import ModelNotFound
from service.pipelines.embed import Tokenizing
from service.registry import Model


def b64(vector: np.ndarray) -> str:
    """Little-endian float32 bytes, base64: what OpenAI's SDK decodes."""
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")


async def embeddings(ctx: Context, body: EmbeddingsRequest) -> Response:
    model = ctx.model(body.model)
    pipe = model.embed
    assert pipe is not None
    inputs: str | Sequence[str] = body.input  # type: ignore[assignment]  # text, unless ids:
    if (arrays := body.token_arrays()) is not None:
        inputs = await texts_from_token_ids(arrays, ctx.settings.openai_token_ids)
    texts = pipe.validate(inputs, "input", body.dimensions)
    how = Tokenizing(
        truncate=body.truncate != "NONE",
        side="left" if body.truncate == "START" else "right",
        prompt_name=body.prompt_name,
    )
    if body.input_type is not None and body.prompt_name is None:
        role = "document" if body.input_type == "passage" else body.input_type
        how = replace(how, prompt_name=pipe.prompt_for(role))
    out = await pipe.embed(ctx.call, texts, how, normalize=True, dimensions=body.dimensions)
    encode = b64 if body.encoding_format == "base64" else (lambda v: v)
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
    return ctx.respond(payload, out.timings)


def card(model: Model) -> dict[str, object]:
    return {"id": model.name, "object": "model", "created": model.created, "owned_by": "headwise"}


async def models(ctx: Context, body: None = None) -> Response:
    return ctx.respond({"object": "list", "data": [card(m) for m in ctx.registry]})


async def model(ctx: Context, body: None = None) -> Response:
    model_id = ctx.http.path_params["model_id"]
    found = ctx.registry.models.get(model_id)
    if found is None:
        raise ModelNotFound(
            f"model {model_id!r} is not served here; served: {', '.join(ctx.registry.models)}",
            param="model",
        )
    return ctx.respond(card(found))
