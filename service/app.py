"""create_app(settings): the FastAPI app; its lifespan owns the models, batchers and threads."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from service import __version__, errors
from service.bundle import load_bundle
from service.core import Core, Loader, ModelSpec
from service.lane import Lane
from service.metrics import Metrics
from service.middleware import HeadwiseMiddleware
from service.routes import attention, embeddings, meta, rerank, tei
from service.runtime import Backend, OnnxBackend
from service.settings import Settings
from service.trimmer import Trimmer

log = logging.getLogger(__name__)


def onnx_loader(spec: ModelSpec, settings: Settings) -> Backend:
    bundle = load_bundle(spec.path, verify=settings.verify_bundle)
    return OnnxBackend(bundle, settings)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    st = app.state
    settings: Settings = st.settings
    specs = [ModelSpec.parse(text) for text in settings.bundle_specs()]
    core = Core.load(specs, st.loader, settings, st.metrics)
    st.core = core
    for model in core:
        runtime = model.backend.info
        st.metrics.info.labels(
            model.name, runtime.providers[0], runtime.device, runtime.precision, __version__
        ).set(1)
    core.start()
    warm = asyncio.create_task(core.warm(settings.warmup))
    trimmer = asyncio.create_task(Trimmer(core.activity).run())
    try:
        yield
    finally:
        trimmer.cancel()
        warm.cancel()
        await core.stop()
        log.info("stopped; all accepted requests answered")


def create_app(
    settings: Settings | None = None, loader: Loader | None = None, lane: bool = True
) -> FastAPI:
    """lane=False leaves every route to FastAPI (tests compare the two)."""
    settings = settings or Settings()
    app = FastAPI(
        title="headwise",
        version=__version__,
        description="Embeddings, and what every attention head looks at.",
        lifespan=lifespan,
        # Prometheus is our telemetry; FastAPI's built-in OpenTelemetry hooks cost ~60 µs a
        # request even with no exporter configured.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    st = app.state
    st.settings = settings
    st.loader = loader or onnx_loader
    st.metrics = Metrics()
    errors.install(app)
    app.include_router(meta.router)
    app.include_router(embeddings.router)
    app.include_router(tei.router)
    app.include_router(rerank.tei)
    app.include_router(rerank.cohere)
    if settings.attention_enabled:
        app.include_router(attention.router)
    if lane:  # innermost of ours: CORS and HeadwiseMiddleware wrap its answers too
        app.add_middleware(Lane)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["x-request-id", "x-queue-time", "x-inference-time", "x-total-time"],
        )
    api_key = settings.api_key.get_secret_value() if settings.api_key else None
    app.add_middleware(
        HeadwiseMiddleware,
        metrics=st.metrics,
        max_body_bytes=settings.max_body_bytes,
        api_key=api_key,
        body_timeout_s=settings.body_timeout_s,
        access_log=settings.access_log,
    )
    return app
