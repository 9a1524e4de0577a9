"""Liveness, readiness, model info, metrics, tokenisation."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from service import __version__
from service.embedder import as_list, check_texts
from service.routes.common import respond, state
from service.schemas import TokenizeRequest

router = APIRouter()


@router.get("/health", tags=["health"], summary="Liveness: the process answers")
async def health(request: Request) -> Response:
    return respond(request, {"status": "ok"})


@router.get("/ready", tags=["health"], summary="Readiness: 200 once the model is loaded and warm")
async def ready(request: Request) -> Response:
    app = state(request)
    if not app.ready:
        status = "failed" if app.load_error else "loading"
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
async def metrics(request: Request) -> Response:
    return Response(
        generate_latest(state(request).metrics.registry), media_type=CONTENT_TYPE_LATEST
    )


@router.get("/info", tags=["info"], summary="The model, where it runs, and the limits")
async def info(request: Request) -> Response:
    app = state(request)
    s, m = app.settings, app.bundle.manifest
    runtime = app.backend.info
    payload = {
        "model": app.bundle.manifest.name,
        "dimensions": app.bundle.manifest.d_model,
        "num_layers": app.bundle.manifest.num_layers,
        "num_heads": app.bundle.manifest.num_heads,
        "max_length": app.bundle.manifest.max_length,
        "pooling": m.pooling,
        "normalize_default": m.normalize,
        "providers": runtime.providers,
        "device": runtime.device,
        "graph": runtime.graph,
        "precision": runtime.precision,
        "fused_ops": m.graphs[runtime.graph].op_counts,
        "attention_enabled": s.attention_enabled,
        "limits": {
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
        },
        "version": __version__,
    }
    return respond(request, payload)


@router.get("/v1/models", tags=["embeddings"], summary="OpenAI-compatible model list")
async def models(request: Request) -> Response:
    name = state(request).bundle.manifest.name
    return respond(
        request,
        {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "headwise"}]},
    )


@router.post("/tokenize", tags=["tokenize"], summary="Tokens, ids and character offsets")
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    app = state(request)
    texts = as_list(body.inputs, "inputs")
    check_texts(texts, app.settings, "inputs")
    loop = asyncio.get_running_loop()
    encodings = await loop.run_in_executor(
        None, app.backend.tokenize, texts, body.add_special_tokens
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
    return respond(request, {"model": app.bundle.manifest.name, "results": results})
