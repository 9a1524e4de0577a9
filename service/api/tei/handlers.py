"""TEI's routes, same shapes and status codes as text-embeddings-inference: a client written for
TEI works against headwise unmodified.

Each route is a function that computes its answer (`embedded`, `reranked`, ...: what TEI
answers, as Python values, and the stage timings) and a one-line HTTP handler that writes it
as JSON. TEI's gRPC services (service/api/tei/grpc.py) call the same functions and write
protobuf."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import numpy as np
from starlette.responses import Response
from tokenizers import Encoding

from service.api.context import Context
from service.api.tei.schemas import (
    DecodeRequest,
    EmbedAllRequest,
    EmbedRequest,
    EmbedSparseRequest,
    PredictRequest,
    RerankRequest,
    SimilarityRequest,
    TokenizeRequest,
    TruncationOptions,
)
from service.errors import EmptyBatch, InvalidInput
from service.pipelines.base import as_list, check_ids, check_texts
from service.pipelines.call import Timings
from service.pipelines.embed import Tokenizing
from service.pipelines.outputs import sparse_entries
from service.pipelines.score import ranked


def _nonempty(values: object, name: str) -> None:
    """TEI answers an empty batch 400 with its own error type, Empty."""
    if isinstance(values, list) and not values:
        raise EmptyBatch(f"`{name}` cannot be empty", param=name)


def _how(options: TruncationOptions) -> Tokenizing:
    return Tokenizing(truncate=options.cut, side=options.side, prompt_name=options.prompt_name)


async def embedded(ctx: Context, body: EmbedRequest) -> tuple[np.ndarray, Timings]:
    _nonempty(body.inputs, "inputs")
    pipe = ctx.model().embed
    assert pipe is not None
    inputs = pipe.validate(body.inputs, "inputs", body.dimensions)
    how = replace(_how(body), instruction=body.instruction)
    out = await pipe.embed(ctx.call, inputs, how, body.normalize, body.dimensions)
    return out.vectors, out.timings


async def embed(ctx: Context, body: EmbedRequest) -> Response:
    return ctx.respond(*await embedded(ctx, body))


async def all_embedded(ctx: Context, body: EmbedAllRequest) -> list[np.ndarray]:
    _nonempty(body.inputs, "inputs")
    pipe = ctx.model().embed
    assert pipe is not None
    inputs = pipe.validate(body.inputs, "inputs")
    return await pipe.token_embeddings(ctx.call, inputs, _how(body))


async def embed_all(ctx: Context, body: EmbedAllRequest) -> Response:
    return ctx.respond(await all_embedded(ctx, body))


async def similarity(ctx: Context, body: SimilarityRequest) -> Response:
    pipe = ctx.model().embed
    assert pipe is not None
    opts = body.parameters or TruncationOptions()
    texts = pipe.validate([body.inputs.source_sentence, *body.inputs.sentences], "inputs")
    out = await pipe.embed(ctx.call, texts, _how(opts), normalize=True)
    scores = out.vectors[1:] @ out.vectors[0]
    return ctx.respond(scores.astype(float), out.timings)


async def reranked(ctx: Context, body: RerankRequest) -> tuple[list[dict[str, Any]], Timings]:
    _nonempty(body.texts, "texts")
    pipe = ctx.model(body.model, "rerank").score
    assert pipe is not None
    pipe.check(body.texts, "texts", ctx.settings.rerank_max_documents)
    pairs = [(body.query, t) for t in body.texts]
    out = await pipe.score(ctx.call, pairs, body.cut, body.instruction)
    scores = pipe.relevance(out.logits, body.raw_scores)
    results = [
        {"index": i, "score": float(scores[i]), **({"text": body.texts[i]} if body.return_text else {})}
        for i in ranked(scores)
    ]
    return results, out.timings


async def rerank(ctx: Context, body: RerankRequest) -> Response:
    return ctx.respond(*await reranked(ctx, body))


async def predicted(
    ctx: Context, body: PredictRequest
) -> tuple[list[list[dict[str, Any]]], bool, Timings]:
    """Per input, its labels by score; and whether the request sent a single input."""
    items, single = body.batch()
    _nonempty(items, "inputs")
    pipe = ctx.model(body.model, "classify").score
    assert pipe is not None
    pipe.check(items, "inputs")
    out = await pipe.score(ctx.call, items, body.cut)
    probs = pipe.probabilities(out.logits, body.raw_scores)
    labels = pipe.labels
    answers = [
        [{"label": labels[j], "score": float(row[j])} for j in ranked(row)] for row in probs
    ]
    return answers, single, out.timings


async def predict(ctx: Context, body: PredictRequest) -> Response:
    answers, single, timings = await predicted(ctx, body)
    return ctx.respond(answers[0] if single else answers, timings)


# POST / answers as the first model's own route does, with that route's body.
RootBody = EmbedRequest | RerankRequest | PredictRequest
ROOT: dict[str, tuple[type[RootBody], Callable[[Context, Any], Awaitable[Response]]]] = {
    "embed": (EmbedRequest, embed),
    "rerank": (RerankRequest, rerank),
    "classify": (PredictRequest, predict),
}


async def root(ctx: Context, body: RootBody) -> Response:
    """huggingface_hub's InferenceClient(model=URL) posts to the base URL, as TEI answers it:
    the body is read as the first model's own route reads it."""
    task = ctx.registry.first.task
    request_type, handler = ROOT[task]
    ctx.capability = task  # type: ignore[assignment]
    if not isinstance(body, request_type):
        body = await ctx.parse(request_type)
    return await handler(ctx, body)


async def decoded(ctx: Context, body: DecodeRequest) -> list[str]:
    backend = ctx.model().backend
    arrays = body.arrays()
    if len(arrays) > ctx.settings.max_inputs:
        raise InvalidInput(f"ids has {len(arrays)} arrays; the limit is {ctx.settings.max_inputs}")
    check_ids(arrays, backend.manifest.vocab_size, "ids")
    return [backend.decode(ids, body.skip_special_tokens) for ids in arrays]


async def decode(ctx: Context, body: DecodeRequest) -> Response:
    return ctx.respond(await decoded(ctx, body))


def simple_tokens(text: str, encoding: Encoding) -> list[dict[str, object]]:
    """TEI's SimpleTokens of one input, as TEI's router builds them: a special token has its
    vocabulary string as text and no span; any other token has the input's own characters
    (before normalisation) as text, and its span in UTF-8 bytes, as TEI's offsets are (Python's
    tokenizers give character offsets: converted here)."""
    byte_at = _byte_offsets(text)
    return [
        {"id": i, "text": tok, "special": True, "start": None, "stop": None}
        if special
        else {
            "id": i,
            "text": text[a:b],
            "special": False,
            "start": byte_at[a],
            "stop": byte_at[b],
        }
        for i, tok, special, (a, b) in zip(
            encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets, strict=True
        )
    ]


def _byte_offsets(text: str) -> list[int]:
    """Character index -> UTF-8 byte offset, for every index 0..len(text)."""
    out = [0] * (len(text) + 1)
    for i, ch in enumerate(text):
        out[i + 1] = out[i] + len(ch.encode("utf-8", "surrogatepass"))
    return out


async def tokens(ctx: Context, body: TokenizeRequest) -> list[list[dict[str, object]]]:
    """Each token with its id, text and span, as TEI answers (a list per input, always)."""
    _nonempty(body.inputs, "inputs")
    model = ctx.model()
    texts = as_list(body.inputs, "inputs")
    check_texts(texts, ctx.settings, "inputs")
    if model.embed is not None:
        texts = model.embed.prompted(texts, body.prompt_name)
    encodings, _ = await ctx.call.tokenize(model.backend.tokenize, texts, body.add_special_tokens)
    return [simple_tokens(t, e) for t, e in zip(texts, encodings, strict=True)]


async def tokenize(ctx: Context, body: TokenizeRequest) -> Response:
    return ctx.respond(await tokens(ctx, body))


async def sparse_embedded(
    ctx: Context, body: EmbedSparseRequest
) -> tuple[list[list[dict[str, Any]]], Timings]:
    """Each input's nonzero weights by vocabulary id, sorted by index (SPLADE's vector, or
    bge-m3's lexical weights). A model without a sparse output: 400 naming the outputs."""
    _nonempty(body.inputs, "inputs")
    pipe = ctx.model().outputs
    assert pipe is not None
    inputs = pipe.embed.validate(body.inputs, "inputs")
    out = await pipe.encode(ctx.call, inputs, ["sparse"], _how(body))
    assert out.sparse is not None
    return [sparse_entries(s) for s in out.sparse], out.timings


async def embed_sparse(ctx: Context, body: EmbedSparseRequest) -> Response:
    return ctx.respond(*await sparse_embedded(ctx, body))
