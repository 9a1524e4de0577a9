"""create_app(settings): the FastAPI app; its lifespan owns the sessions, batchers and threads."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from service import __version__, errors
from service.batcher import BatchPolicy, DynamicBatcher
from service.bundle import Bundle, load_bundle
from service.embedder import Embedder
from service.metrics import Metrics
from service.routes import embeddings, meta
from service.runtime import Backend, OnnxEncoder
from service.settings import Settings

log = logging.getLogger(__name__)

BackendFactory = Callable[[Bundle, Settings], Backend]


def encoder_policy(s: Settings) -> BatchPolicy:
    return BatchPolicy(
        max_batch_tokens=s.max_batch_tokens,
        max_batch_size=s.max_batch_size,
        max_wait_s=s.max_wait_ms / 1e3,
        max_padding_ratio=s.max_padding_ratio,
        max_queue=s.max_queue_texts,
        padding_slack=s.padding_slack_tokens,
    )


async def _warm(app: FastAPI) -> None:
    st = app.state
    try:
        if st.settings.warmup and hasattr(st.backend, "warmup"):
            await asyncio.get_running_loop().run_in_executor(None, st.backend.warmup)
        st.ready = True
        st.metrics.ready.set(1)
        log.info("ready: %s", st.bundle.manifest.name)
    except Exception as exc:  # stay alive but not ready; /ready says "failed"
        st.load_error = str(exc)
        log.exception("warmup failed")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    st = app.state
    settings: Settings = st.settings
    bundle = st.bundle or load_bundle(settings.bundle, verify=settings.verify_bundle)
    st.bundle = bundle
    st.backend = st.backend_factory(bundle, settings)
    pad_id = bundle.manifest.special_tokens.pad
    st.batcher = DynamicBatcher(
        st.backend.embed, encoder_policy(settings), st.metrics.observer("encode"), "encode", pad_id
    )
    st.batcher.start()
    st.embedder = Embedder(st.backend, st.batcher, settings, st.metrics, bundle.manifest.max_length)
    st.attention_batcher = None
    if settings.attention_enabled:
        from service.routes.attention import attention_batcher

        st.attention_batcher = attention_batcher(st.backend, settings, st.metrics, pad_id)
        st.attention_batcher.start()
    runtime = st.backend.info
    st.metrics.info.labels(
        bundle.manifest.name, runtime.providers[0], runtime.device, runtime.precision, __version__
    ).set(1)
    warm = asyncio.create_task(_warm(app))
    try:
        yield
    finally:
        st.ready = False
        st.metrics.ready.set(0)
        warm.cancel()
        # Drain: everything accepted is answered before the threads go.
        await st.batcher.stop()
        if st.attention_batcher is not None:
            await st.attention_batcher.stop()
        log.info("stopped; all accepted requests answered")


def create_app(
    settings: Settings | None = None,
    bundle: Bundle | None = None,
    backend_factory: BackendFactory | None = None,
) -> FastAPI:
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
    st.bundle = bundle
    st.backend_factory = backend_factory or OnnxEncoder
    st.metrics = Metrics()
    st.ready = False
    st.load_error = None
    errors.install(app)
    app.include_router(meta.router)
    app.include_router(embeddings.router)
    if settings.attention_enabled:
        from service.routes import attention

        app.include_router(attention.router)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["x-request-id", "x-queue-time", "x-inference-time", "x-total-time"],
        )
    from service.middleware import HeadwiseMiddleware

    api_key = settings.api_key.get_secret_value() if settings.api_key else None
    app.add_middleware(
        HeadwiseMiddleware,
        metrics=st.metrics,
        max_body_bytes=settings.max_body_bytes,
        api_key=api_key,
        body_timeout_s=settings.body_timeout_s,
    )
    return app
