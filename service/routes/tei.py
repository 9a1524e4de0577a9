"""TEI's API (text-embeddings-inference), same paths, shapes and status codes: a client written
for TEI works against headwise unmodified. Errors on these routes take TEI's shape."""

from __future__ import annotations

from typing import TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from service import __version__
from service.core import Model
from service.deps import AnyCore, ClientGone, ReadyCore, use_model
from service.errors import InvalidInput, WrongTask
from service.pipelines.common import as_list, check_ids, check_texts, tokenized
from service.routes.common import respond
from service.tei_schemas import (
    DecodeRequest,
    EmbedAllRequest,
    EmbedRequest,
    SimilarityRequest,
    TokenizeRequest,
    TruncationOptions,
)

M = TypeVar("M", bound=BaseModel)


async def tei_dialect(request: Request) -> None:
    """Errors raised while handling this request are rendered in TEI's shape."""
    request.state.dialect = "tei"


router = APIRouter(tags=["TEI-compatible"], dependencies=[Depends(tei_dialect)])


@router.post("/embed", summary="TEI: embed text(s) -> [[float]]")
async def embed(body: EmbedRequest, request: Request, core: ReadyCore, gone: ClientGone) -> Response:
    pipe = use_model(request, core, None, "embed").embed
    inputs = pipe.validate(body.inputs, "inputs", body.dimensions)
    out = await pipe.embed(
        inputs,
        truncate=body.cut,
        normalize=body.normalize,
        dimensions=body.dimensions,
        prompt_name=body.prompt_name,
        direction=body.direction,
        disconnect=gone,
    )
    return respond(request, out.vectors, out.timings)


@router.post("/", summary="TEI: the first model's own route (/embed, /rerank or /predict)")
async def root(request: Request, core: ReadyCore, gone: ClientGone) -> Response:
    """huggingface_hub's InferenceClient(model=URL) posts to the base URL, as TEI answers it."""
    first: Model = next(iter(core))
    if first.task != "embed":
        from service.routes import rerank  # the rerank/predict routes, same shapes as TEI

        return await rerank.dispatch_root(first, request, core, gone)
    return await embed(await parsed(request, EmbedRequest), request, core, gone)


async def parsed(request: Request, model: type[M]) -> M:
    """The JSON body as `model`, with FastAPI's validation errors (one place renders them)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None


@router.post("/embed_all", summary="TEI: token embeddings, unpooled -> [[[float]]]")
async def embed_all(
    body: EmbedAllRequest, request: Request, core: ReadyCore, gone: ClientGone
) -> Response:
    pipe = use_model(request, core, None, "embed").embed
    inputs = pipe.validate(body.inputs, "inputs")
    tokens = await pipe.token_embeddings(
        inputs,
        truncate=body.cut,
        prompt_name=body.prompt_name,
        direction=body.direction,
        disconnect=gone,
    )
    return respond(request, tokens)


@router.post("/similarity", summary="TEI: cosine of a source sentence to each sentence")
async def similarity(
    body: SimilarityRequest, request: Request, core: ReadyCore, gone: ClientGone
) -> Response:
    pipe = use_model(request, core, None, "embed").embed
    opts = body.parameters or TruncationOptions()
    texts = pipe.validate([body.inputs.source_sentence, *body.inputs.sentences], "inputs")
    out = await pipe.embed(
        texts,
        truncate=opts.cut,
        normalize=True,
        prompt_name=opts.prompt_name,
        direction=opts.direction,
        disconnect=gone,
    )
    scores = out.vectors[1:] @ out.vectors[0]
    return respond(request, scores.astype(float), out.timings)


@router.post("/decode", summary="TEI: token ids -> text")
async def decode(body: DecodeRequest, request: Request, core: AnyCore) -> Response:
    backend = use_model(request, core, None, "tokenize").backend
    arrays = body.arrays()
    if len(arrays) > core.settings.max_inputs:
        raise InvalidInput(f"ids has {len(arrays)} arrays; the limit is {core.settings.max_inputs}")
    check_ids(arrays, backend.manifest.vocab_size, "ids")
    return respond(request, [backend.decode(ids, body.skip_special_tokens) for ids in arrays])


@router.post("/tokenize", summary="TEI: tokens with ids, text and character spans")
async def tokenize(body: TokenizeRequest, request: Request, core: AnyCore) -> Response:
    model = use_model(request, core, None, "tokenize")
    texts = as_list(body.inputs, "inputs")
    check_texts(texts, core.settings, "inputs")
    if model.embed is not None:
        texts = model.embed.prompted(texts, body.prompt_name)
    encodings, _ = await tokenized(
        model.backend.tokenize, texts, sum(map(len, texts)), body.add_special_tokens
    )
    return respond(
        request,
        [
            [
                {"id": i, "text": tok, "special": bool(sp), "start": s, "stop": e}
                for i, tok, sp, (s, e) in zip(
                    enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets, strict=True
                )
            ]
            for enc in encodings
        ],
    )


@router.post("/embed_sparse", summary="TEI: sparse embeddings (needs a sparse model)")
async def embed_sparse(request: Request, core: AnyCore) -> Response:
    served = ", ".join(f"{m.name} ({m.task})" for m in core)
    raise WrongTask(
        f"/embed_sparse needs a sparse (SPLADE-style) model; none is served here ({served}). "
        "Dense embeddings: /embed"
    )


def tei_info(core: AnyCore) -> dict:
    """TEI's Info fields, for the first model."""
    first: Model = next(iter(core))
    m, s = first.backend.manifest, core.settings
    labels = {
        "id2label": {str(i): label for i, label in enumerate(m.labels)},
        "label2id": {label: i for i, label in enumerate(m.labels)},
    }
    model_type = {
        "embed": {"embedding": {"pooling": m.pooling}},
        "rerank": {"reranker": labels},
        "classify": {"classifier": labels},
    }[m.task]
    dtype = {"fp32": "float32", "fp16": "float16", "int8": "int8"}[first.backend.info.precision]
    return {
        "model_id": m.source.id if m.source.kind == "hub" else first.name,
        "model_sha": m.source.revision,
        "model_dtype": dtype,
        "served_model_name": first.name,
        "model_type": model_type,
        "max_concurrent_requests": s.max_concurrency,
        "max_input_length": m.max_length,
        "max_batch_tokens": s.max_batch_tokens,
        "max_batch_requests": s.max_batch_size,
        "max_client_batch_size": s.max_inputs,
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": __version__,
        "sha": None,
        "docker_label": None,
    }

