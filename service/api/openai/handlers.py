"""`/v1/embeddings` (always L2-normalised, floats or base64) and the model list."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from starlette.responses import Response

from service.api.context import Context
from service.api.openai.schemas import (
    ChatEmbeddingsRequest,
    ChatMessage,
    EmbeddingsRequest,
    ImagePart,
    TextPart,
)
from service.api.openai.tokens import texts_from_token_ids
from service.api.pieces import Image, Piece, model_for
from service.api.pieces import embed as embed_pieces
from service.errors import InvalidInput, ModelNotFound
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


def _text(message: ChatMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "\n".join(p.text for p in message.content if isinstance(p, TextPart))


def _prompt(messages: list[ChatMessage]) -> Piece:
    """The one piece the messages make: their text, or their one image (see the request)."""
    texts = [_text(m) for m in messages]
    parts = [p for m in messages if not isinstance(m.content, str) for p in m.content]
    images = [p.image_url.url for p in parts if isinstance(p, ImagePart)]
    if not images:
        return "".join(texts)
    if len(images) > 1 or any(texts):
        raise InvalidInput(
            f"messages hold {len(images)} image(s){' and text' if any(texts) else ''}: an "
            "image-text model (CLIP, SigLIP) embeds text only or one image only, as vLLM serves "
            "it; send one image, or text, per request",
            param="messages",
        )
    return Image(images[0])


async def chat_embeddings(ctx: Context, body: ChatEmbeddingsRequest) -> Response:
    """vLLM's `messages` form: one vector, of the text or of the image."""
    pieces = [_prompt(body.messages)]
    model = model_for(ctx, body.model, pieces)
    out = await embed_pieces(ctx.call, model, pieces, None, body.dimensions, "messages")
    encode = b64 if body.encoding_format == "base64" else (lambda v: v)
    total = sum(out.tokens)
    payload = {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": encode(out.vectors[0])}],
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
