"""Liveness, readiness, model info and lists, metrics, tokenisation."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from service import __version__
from service.core import Model
from service.deps import AnyCore, use_model
from service.errors import ModelNotFound
from service.pipelines.common import as_list, check_texts, tokenized
from service.routes.common import respond
from service.routes.tei import tei_info
from service.schemas import TokenizeRequest
from service.settings import Settings

router = APIRouter()


@router.get("/health", tags=["health"], summary="Liveness: the process answers")
async def health(request: Request) -> Response:
    return respond(request, {"status": "ok"})


@router.get("/ready", tags=["health"], summary="Readiness: 200 once every model is loaded and warm")
async def ready(request: Request, core: AnyCore) -> Response:
    if not core.ready:
        status = "failed" if core.load_error else "loading"
        return Response(
            f'{{"status":"{status}"}}',
            status_code=503,
            media_type="application/json",
            headers={"retry-after": "2"},
        )
    return respond(request, {"status": "ready"})


# Triton's paths, for load balancers configured for it.
router.add_api_route("/v2/health/live", health, methods=["GET"], include_in_schema=False)
router.add_api_route("/v2/health/ready", ready, methods=["GET"], include_in_schema=False)


@router.get("/metrics", tags=["health"], summary="Prometheus metrics (text format)")
async def metrics(core: AnyCore) -> Response:
    return Response(generate_latest(core.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def describe(model: Model) -> dict:
    m, runtime = model.backend.manifest, model.backend.info
    return {
        "name": model.name,
        "task": m.task,
        "architecture": m.architecture,
        "source": m.source.model_dump(exclude_none=True),
        "dimensions": m.dimensions,
        "num_layers": m.num_layers,
        "num_heads": m.num_heads,
        "max_length": m.max_length,
        "pooling": m.pooling,
        "normalize_default": m.normalize,
        "prompts": sorted(m.prompts),
        "labels": m.labels,
        "routes": model.routes(),
        "providers": runtime.providers,
        "device": runtime.device,
        "graph": runtime.graph,
        "precision": runtime.precision,
        "fused": m.graphs[runtime.graph].fused,
        "fused_ops": m.graphs[runtime.graph].op_counts,
        "graph_bytes": {key: g.bytes for key, g in m.graphs.items()},
    }


def limits(s: Settings) -> dict:
    return {
        "max_inputs": s.max_inputs,
        "max_input_chars": s.max_input_chars,
        "max_body_bytes": s.max_body_bytes,
        "max_batch_tokens": s.max_batch_tokens,
        "max_batch_size": s.max_batch_size,
        "max_wait_ms": s.max_wait_ms,
        "max_queue_texts": s.max_queue_texts,
        "request_timeout_s": s.request_timeout_s,
        "attention_max_tokens": s.attention_max_tokens,
        "attention_max_numbers": s.attention_max_numbers,
        "attention_budget_numbers": s.attention_budget_numbers,
        "attention_cpu_share": s.attention_cpu_share,
        "capacity_tokens_per_s": s.capacity_tokens_per_s,
    }


@router.get("/info", tags=["info"], summary="The models, where they run, and the limits")
async def info(request: Request, core: AnyCore) -> Response:
    models = [describe(m) for m in core]
    first = models[0]  # one model's fields at the top, as before several models were served
    payload = {
        **tei_info(core),  # TEI's Info fields: TEI clients read them
        "model": first["name"],
        **{k: v for k, v in first.items() if k != "name"},
        "models": models,
        "attention_enabled": core.settings.attention_enabled,
        "limits": limits(core.settings),
        "memory": {"config": core.settings.memory, **core.memory()},
        "capacity_tokens_per_s": {
            m.name: round(m.embed.batcher.throughput.tokens_per_s, 1)
            for m in core
            if m.embed is not None
        },
        "version": __version__,
    }
    return respond(request, payload)


def openai_model(model: Model) -> dict:
    return {"id": model.name, "object": "model", "created": model.created, "owned_by": "headwise"}


@router.get("/v1/models", tags=["embeddings"], summary="OpenAI-compatible model list")
async def models(request: Request, core: AnyCore) -> Response:
    return respond(request, {"object": "list", "data": [openai_model(m) for m in core]})


@router.get("/v1/models/{model_id:path}", tags=["embeddings"], summary="One model (OpenAI)")
async def model(model_id: str, request: Request, core: AnyCore) -> Response:
    if model_id not in core.models:
        raise ModelNotFound(
            f"model {model_id!r} is not served here; served: {', '.join(core.models)}",
            param="model",
        )
    return respond(request, openai_model(core.models[model_id]))


@router.post(
    "/tokenize/details",
    tags=["tokenize"],
    summary="headwise's tokenisation: tokens, ids, offsets, special flags, truncation, model",
)
async def tokenize(
    body: TokenizeRequest, request: Request, core: AnyCore
) -> Response:
    model = use_model(request, core, body.model, "tokenize")
    texts = as_list(body.inputs, "inputs")
    check_texts(texts, core.settings, "inputs")
    encodings, _ = await tokenized(
        model.backend.tokenize, texts, sum(map(len, texts)), body.add_special_tokens
    )
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
    return respond(request, {"model": model.name, "results": results})
