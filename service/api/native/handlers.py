"""headwise's own routes: embeddings (and sparse, token vectors), tokenisation details,
attention maps and their viewer."""

from __future__ import annotations

from asyncio import gather
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import numpy as np
import orjson
from starlette.responses import HTMLResponse, Response, StreamingResponse

from service.api.context import Context
from service.api.native.schemas import (
    AttentionRequest,
    ChunkingOptions,
    EncodeRequest,
    ExplainRequest,
    TokenizeDetailsRequest,
    ZeroShotRequest,
)
from service.errors import InvalidInput, Unsupported
from service.manifest import Output
from service.pipelines.attention.images import ImageQuery
from service.pipelines.attention.pipeline import select
from service.pipelines.base import as_list, check_texts
from service.pipelines.chunking import Chunking
from service.pipelines.compact import compact, with_pieces
from service.pipelines.embed import Tokenizing
from service.pipelines.explain.heads import HeadsExplained
from service.pipelines.outputs import sparse_entries
from service.pipelines.plan import Encoded, EncodePlan, plan
from service.registry import OUTPUT_CAPABILITIES, Model

# An answer larger than this goes out in pieces, each waiting for the socket, so that health
# checks are answered in between (one large write would hold the event loop while it is copied).
STREAM_BYTES = 1 << 20


async def encode(ctx: Context, body: EncodeRequest) -> Response:
    """One plan from the request (which outputs or chunks, what they cost), run, and the answer
    assembled from the plan and its result."""
    if body.images is not None:
        return await _encode_images(ctx, body)
    model = _encoder(ctx, body)
    p = _plan(model, body)
    out = await p.run(ctx.call)
    if p.kind == "dense":
        assert out.dense is not None
        return ctx.respond({**_dense(model, out.dense), "tokens": out.tokens}, out.timings)
    if p.kind == "chunks":
        payload: dict[str, Any] = {
            "model": model.name,
            "dimensions": p.dimensions or p.embed.dimensions,
            "tokens": out.tokens,
            "chunks": [
                [{"start": c.start, "stop": c.stop, "embedding": v} for c, v in chunks]
                for chunks in out.chunks or []
            ],
        }
        if out.dense is not None:
            payload["embeddings"] = out.dense
        return ctx.respond(payload, out.timings)
    return await _outputs_answer(ctx, body, model, p.outputs, out)


async def _encode_images(ctx: Context, body: EncodeRequest) -> Response:
    """An image-text model's texts and images at once, each on its tower: the texts' vectors
    first, then the images', in one space."""
    model = ctx.model(body.model, "images")
    images, texts = model.images, model.embed
    assert images is not None and texts is not None
    texts.check_dimensions(body.dimensions)
    images.check(body.images or [])
    work = [images.embed(ctx.call, body.images or [], body.normalize, body.dimensions)]
    if body.inputs is not None:
        how = Tokenizing(
            truncate=body.truncate, prompt_name=body.prompt_name, instruction=body.instruction
        )
        inputs = texts.validate(body.inputs, "inputs")
        work.insert(0, texts.embed(ctx.call, inputs, how, body.normalize, body.dimensions))
    done = await gather(*work)
    vectors = np.concatenate([d.vectors for d in done])
    timings = done[0].timings
    for d in done[1:]:
        timings.tokens += d.timings.tokens
    tokens = [n for d in done for n in d.tokens]
    return ctx.respond({**_dense(model, vectors), "tokens": tokens}, timings)


async def zero_shot(ctx: Context, body: ZeroShotRequest) -> Response:
    """Each image's labels by probability, best first (TEI's /predict answer shape)."""
    model = ctx.model(body.model, "images")
    images, texts = model.images, model.embed
    assert images is not None and texts is not None
    refs = [body.image] if isinstance(body.image, str) else body.image
    images.check(refs, "image")
    done = await gather(
        *(images.classify(ctx.call, ref, body.labels, texts, body.template) for ref in refs)
    )
    answers = [
        sorted(
            ({"label": label, "score": p} for label, p in zip(body.labels, d.probabilities, strict=True)),
            key=lambda a: -float(a["score"]),  # type: ignore[arg-type]
        )
        for d in done
    ]
    timings = done[0].timings
    return ctx.respond(answers[0] if isinstance(body.image, str) else answers, timings)


def _plan(model: Model, body: EncodeRequest) -> EncodePlan:
    embed = model.embed
    assert embed is not None
    how = Tokenizing(
        truncate=body.truncate, prompt_name=body.prompt_name, instruction=body.instruction
    )
    chunking = None
    if body.chunking is not None or body.chunks is not None:
        options = body.chunking or ChunkingOptions()
        spans = per_input_spans(body.chunks) if body.chunks is not None else None
        chunking = Chunking(options.strategy, options.size, options.overlap, spans, options.pool)
    return plan(
        embed,
        model.outputs,
        body.inputs if body.inputs is not None else [],
        how,
        body.normalize,
        body.dimensions,
        body.outputs,
        body.input_type,
        chunking,
    )


async def tokenize_details(ctx: Context, body: TokenizeDetailsRequest) -> Response:
    model = ctx.model(body.model)
    texts = as_list(body.inputs, "inputs")
    check_texts(texts, ctx.settings, "inputs")
    encodings, _ = await ctx.call.tokenize(model.backend.tokenize, texts, body.add_special_tokens)
    results = [
        {
            "tokens": e.tokens,
            "ids": e.ids,
            "offsets": [list(o) for o in e.offsets],
            "special": [bool(x) for x in e.special_tokens_mask],
            "truncated": bool(e.overflowing),
        }
        for e in encodings
    ]
    return ctx.respond({"model": model.name, "results": results})


async def attention(ctx: Context, body: AttentionRequest) -> Response:
    if body.image is not None:
        return await _image_attention(ctx, body, body.image)
    pipe = ctx.model(body.model).attention
    assert pipe is not None and body.input is not None
    query = pipe.query(
        body.input,
        body.layers,
        body.heads,
        body.truncate,
        body.format,
        pair=body.pair,
        encoding=body.encoding_format,
    )
    out = await pipe.run(ctx.call, query)
    ctx.timed(out.timings)
    return _streamed(out.body, out.media_type)


async def _image_attention(ctx: Context, body: AttentionRequest, image: str) -> Response:
    model = ctx.model(body.model, "images")
    if model.attention is None or model.attention.images is None:
        raise Unsupported(
            f"{model.name} serves no maps of its vision tower: /attention is off "
            "(HEADWISE_ATTENTION_ENABLED) or its bundle has no vision attention graph"
        )
    pipe = model.attention.images
    v = pipe.vision
    query = ImageQuery(
        image,
        select("layers", body.layers, v.num_layers),
        select("heads", body.heads, v.num_heads),
        body.format,
        body.encoding_format,
    )
    pieces, media_type, ran = await pipe.run(ctx.call, query)
    ctx.timed(ran.timings)
    return _streamed(pieces, media_type)


def _streamed(pieces: list[bytes], media_type: str) -> Response:
    size = sum(map(len, pieces))
    if size <= STREAM_BYTES:
        return Response(b"".join(pieces), media_type=media_type)
    return StreamingResponse(
        _pieces(pieces), media_type=media_type, headers={"content-length": str(size)}
    )


async def _pieces(body: list[bytes]) -> AsyncIterator[bytes]:
    for piece in body:
        yield piece


async def explain(ctx: Context, body: ExplainRequest) -> Response:
    if body.image is not None:
        return await _explain_image(ctx, body, body.image)
    name = body.model
    if name is None:  # the first model that explains this form
        takes = (m for m in ctx.registry if m.explain and body.form in m.explain.forms)
        name = next((m.name for m in takes), None)
    model = ctx.model(name)
    pipe = model.explain
    granularity = body.granularity
    assert pipe is not None and granularity != "patch"  # an image's, refused without one
    q = pipe.question(body.form, body.texts, granularity, body.target, body.truncate)
    out = await pipe.explain(ctx.call, q)
    payload: dict[str, object] = {"model": model.name, "granularity": q.granularity}
    if out.score is not None:
        payload["score"] = out.score
    if out.target is not None:
        payload["target"] = out.target
    if out.heads is not None:
        return ctx.respond(payload | _heads(out.heads) | {"truncated": out.truncated}, out.timings)
    parts = [
        [
            {
                "text": text[p.start : p.stop],
                "start": p.start,
                "stop": p.stop,
                "importance": importance,
                "attention": attention[i] if attention is not None else None,
            }
            for i, (p, importance) in enumerate(zip(ps, imps, strict=True))
        ]
        for text, ps, imps, attention in zip(
            out.texts, out.parts, out.importance, out.attention, strict=True
        )
    ]
    payload |= {
        "parts": parts,
        "spearman": out.spearman,
        "truncated": out.truncated,
        "attention_note": out.attention_note,
    }
    return ctx.respond(payload, out.timings)


async def _explain_image(ctx: Context, body: ExplainRequest, image: str) -> Response:
    model = ctx.model(body.model, "images")
    assert model.patches is not None
    out = await model.patches.run(ctx.call, image, body.input)
    v = model.patches.vision
    attention = out.attention
    patches = [
        {
            "row": r,
            "col": c,
            "importance": float(out.importance[r, c]),
            "attention": float(attention[r, c]) if attention is not None else None,
        }
        for r in range(out.grid)
        for c in range(out.grid)
    ]
    payload: dict[str, object] = {
        "model": model.name,
        "granularity": "patch",
        "grid": out.grid,
        "patch_size": v.patch_size,
        "image_size": v.image_size,
        "picture": out.picture,
        "patches": patches,
        "spearman": out.spearman,
        "attention_note": out.attention_note,
    }
    if out.score is not None:
        payload["score"] = out.score
    return ctx.respond(payload, out.timings)


def _heads(out: HeadsExplained) -> dict[str, object]:
    layers, heads = out.importance.shape
    rows = [
        {
            "layer": layer,
            "head": head,
            "importance": float(out.importance[layer, head]),
            **{name: float(v[layer, head]) for name, v in out.stats.items()},
        }
        for layer in range(layers)
        for head in range(heads)
    ]
    return {"heads": rows, "head_spearman": out.spearman}


async def attention_view(ctx: Context, body: None = None) -> Response:
    page = resources.files("service").joinpath("static/attention.html").read_text(encoding="utf-8")
    return HTMLResponse(page)


def per_input_spans(chunks: list[list[int]] | list[list[list[int]]]) -> list[list[tuple[int, int]]]:
    """`chunks` as given (one input's spans, or a list of them per input) -> per input. A span
    has two numbers, so an empty list inside is an input's (empty) list of spans: a 422."""
    nested = any(not item or isinstance(item[0], list) for item in chunks)
    lists = chunks if nested else [chunks]
    out: list[list[tuple[int, int]]] = []
    for i, spans in enumerate(lists):
        if not spans:
            raise InvalidInput(f"chunks[{i}] has no spans: give every input one or more", param="chunks")
        pairs = []
        for span in spans:
            assert isinstance(span, list)
            a, b = span
            assert isinstance(a, int) and isinstance(b, int)
            pairs.append((a, b))
        out.append(pairs)
    return out


# --- /encode's outputs: dense, sparse, multi_vector from one forward pass --------------------

# An answer with more token-vector numbers than this is written on a worker thread.
INLINE_NUMBERS = 1 << 16


def _encoder(ctx: Context, body: EncodeRequest) -> Model:
    """The model that has every output asked for (the rarer ones pick it), else any encoder."""
    wanted = body.outputs or []
    caps = [c for c, out in OUTPUT_CAPABILITIES.items() if out in wanted]
    capability = next((c for c in caps if c != "embed"), caps[0] if caps else "encode")
    return ctx.model(body.model, capability)


async def _outputs_answer(
    ctx: Context, body: EncodeRequest, model: Model, outputs: list[Output], out: Encoded
) -> Response:
    """The outputs asked for; token vectors (tens of MB) written off the event loop."""
    payload: dict[str, Any] = {"outputs": outputs, "model": model.name, "tokens": out.tokens}
    if out.dense is not None:
        payload |= _dense(model, out.dense)
    if out.sparse is not None:
        decode = model.backend.decode if body.sparse_tokens else None
        payload["sparse"] = [
            sparse_entries(s, [decode([i], False) for i in s.indices.tolist()] if decode else None)
            for s in out.sparse
        ]
    vectors = out.multi_vector
    if vectors is None:
        return ctx.respond(payload, out.timings)
    ctx.timed(out.timings)
    if sum(v.size for v in vectors) <= INLINE_NUMBERS:
        body_pieces = _with_vectors(payload, vectors, body.encoding_format)
    else:  # tens of MB of JSON: off the event loop
        body_pieces = await ctx.call.offload(_with_vectors, payload, vectors, body.encoding_format)
    size = sum(map(len, body_pieces))
    if size <= STREAM_BYTES:
        return Response(b"".join(body_pieces), media_type="application/json")
    return StreamingResponse(
        _pieces(body_pieces),
        media_type="application/json",
        headers={"content-length": str(size)},
    )


def _dense(model: Model, vectors: np.ndarray) -> dict[str, Any]:
    return {"embeddings": vectors, "model": model.name, "dimensions": int(vectors.shape[1])}


def _with_vectors(payload: dict[str, Any], vectors: list[np.ndarray], encoding: str) -> list[bytes]:
    """The answer's JSON in pieces, its token vectors as arrays or compact (base64 float32)."""
    pieces: list[bytes] = [b"["]
    for i, v in enumerate(vectors):
        if i:
            pieces.append(b",")
        if encoding == "base64":
            pieces += compact(v, "<f4")
        else:
            pieces.append(orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY))
    pieces.append(b"]")
    return with_pieces(payload, "multi_vector", pieces)
