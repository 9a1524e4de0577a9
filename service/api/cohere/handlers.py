"""Cohere's rerank, v1 (and Jina's) and v2, and embed, v1 and v2 (v2 with images), on the same
pipelines as TEI's."""

from __future__ import annotations

import uuid

from starlette.responses import Response

from service.api.cohere.schemas import (
    EmbedV1Request,
    EmbedV2Request,
    RerankV1Request,
    RerankV2Request,
    TextContent,
)
from service.api.context import Context
from service.api.pieces import Image, Piece, model_for, one_piece
from service.api.pieces import embed as pieces_embed
from service.errors import InvalidInput
from service.pipelines import quantize
from service.pipelines.embed import EmbedPipeline, Role, Tokenizing
from service.pipelines.score import ranked


async def rerank_v1(ctx: Context, body: RerankV1Request) -> Response:
    model = ctx.model(body.model)
    pipe = model.score
    assert pipe is not None
    documents = body.texts()
    pipe.check(documents, "documents", ctx.settings.rerank_max_documents)
    pairs = [(body.query, d) for d in documents]
    out = await pipe.score(ctx.call, pairs, instruction=body.instruction)
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
    pipe.check_instruction(body.instruction)
    pairs = [(body.query, d) for d in body.documents]
    out = await pipe.score(
        ctx.call, pairs, instruction=body.instruction, max_document_tokens=body.max_tokens_per_doc
    )
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


ROLES: dict[str, Role] = {
    "search_query": "query",
    "search_document": "document",
    "classification": "classification",
    "clustering": "clustering",
}


def _tokenizing(pipe: EmbedPipeline, input_type: str | None, truncate: str, max_tokens: int | None = None) -> Tokenizing:
    """Cohere's input_type as the model's own prompt for that role, its truncate as ours."""
    if input_type == "image":
        raise InvalidInput(
            "input_type image embeds `images` (or `inputs`) on an image-text model, not `texts`",
            param="input_type",
        )
    return Tokenizing(
        truncate=truncate != "NONE",
        side="left" if truncate == "START" else "right",
        prompt_name=pipe.prompt_for(ROLES.get(input_type or "")),
        max_tokens=max_tokens,
    )


def _meta(version: str, tokens: int) -> dict[str, object]:
    return {"api_version": {"version": version}, "billed_units": {"input_tokens": tokens}}


async def embed_v1(ctx: Context, body: EmbedV1Request) -> Response:
    pipe = ctx.model(body.model).embed
    assert pipe is not None
    texts = pipe.validate(body.texts, "texts")
    out = await pipe.embed(ctx.call, texts, _tokenizing(pipe, body.input_type, body.truncate), normalize=True)
    common = {"id": str(uuid.uuid4()), "texts": body.texts, "meta": _meta("1", sum(out.tokens))}
    if body.embedding_types is None:
        payload = {"response_type": "embeddings_floats", "embeddings": out.vectors, **common}
    else:
        by_type = {kind: quantize.encode(out.vectors, kind) for kind in body.embedding_types}
        payload = {"response_type": "embeddings_by_type", "embeddings": by_type, **common}
    return ctx.respond(payload, out.timings)


async def embed_v2(ctx: Context, body: EmbedV2Request) -> Response:
    if body.texts is None:
        return await _embed_v2_pieces(ctx, body)
    pipe = ctx.model(body.model).embed
    assert pipe is not None
    texts = pipe.validate(body.texts, "texts", body.output_dimension)
    how = _tokenizing(pipe, body.input_type, body.truncate, body.max_tokens)
    out = await pipe.embed(ctx.call, texts, how, normalize=True, dimensions=body.output_dimension)
    payload = {
        "id": str(uuid.uuid4()),
        "response_type": "embeddings_by_type",
        "embeddings": {kind: quantize.encode(out.vectors, kind) for kind in body.embedding_types},
        "texts": body.texts,
        "meta": _meta("2", sum(out.tokens)),
    }
    return ctx.respond(payload, out.timings)


def _pieces(body: EmbedV2Request) -> tuple[list[Piece], str]:
    """`images` or `inputs` as pieces (one per input), and the field they came in."""
    if body.images is not None:
        return [Image(ref) for ref in body.images], "images"
    assert body.inputs is not None
    pieces = [
        one_piece(
            [c.text if isinstance(c, TextContent) else Image(c.image_url.url) for c in i.content],
            f"inputs[{n}].content",
            "inputs",
        )
        for n, i in enumerate(body.inputs)
    ]
    return pieces, "inputs"


async def _embed_v2_pieces(ctx: Context, body: EmbedV2Request) -> Response:
    """Images (and `inputs`' texts) on an image-text model: an image's vector has no role, its
    tower no prompts, so `input_type` (`image`, or a text role) shapes only the texts."""
    pieces, param = _pieces(body)
    model = model_for(ctx, body.model, pieces)
    pipe = model.embed
    assert pipe is not None
    role = None if body.input_type == "image" else body.input_type
    how = _tokenizing(pipe, role, body.truncate, body.max_tokens)
    out = await pieces_embed(ctx.call, model, pieces, how, body.output_dimension, param)
    meta = _meta("2", out.text_tokens)
    if out.images:
        meta["billed_units"] = {"input_tokens": out.text_tokens, "images": out.images}
    payload = {
        "id": str(uuid.uuid4()),
        "response_type": "embeddings_by_type",
        "embeddings": {kind: quantize.encode(out.vectors, kind) for kind in body.embedding_types},
        "texts": [p for p in pieces if isinstance(p, str)],
        "meta": meta,
    }
    return ctx.respond(payload, out.timings)
