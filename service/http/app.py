"""create_app(settings): the FastAPI app; its lifespan owns the models, batchers and threads.

The routes come from the declaration (`service/api/routes.py`): FastAPI's, the hot lane's, the
middleware's open paths and labels, and each path's error dialect are all derived from it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from service import __version__
from service.api.declaration import RouteTable
from service.api.routes import TABLE
from service.bundle import load_bundle
from service.engine.preparing import workers
from service.engine.runtime import Backend, OnnxBackend
from service.engine.trimmer import Trimmer
from service.http.errors import Answers
from service.http.lane import Lane
from service.http.middleware import HeadwiseMiddleware
from service.http.rehearsal import Rehearsal
from service.http.routing import mount
from service.http.tracing import Tracing
from service.http.workers import Peers
from service.metrics import Metrics
from service.registry import Loader, ModelSpec, Registry
from service.settings import Settings

log = logging.getLogger(__name__)


def onnx_loader(spec: ModelSpec, settings: Settings) -> Backend:
    bundle = load_bundle(spec.path, verify=settings.verify_bundle)
    return OnnxBackend(bundle, settings)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    st = app.state
    settings: Settings = st.settings
    table: RouteTable = st.table
    # Tokenising runs on the loop's default executor (Call.tokenize), one worker a core, each
    # tokenizer call on the thread that makes it (as TEI's tokenization workers): its CPU time
    # is then what the request's tokenising cost, which admission prices (engine/preparing.py).
    # Python's default (CPUs + 4) with the tokenizer's own threads under each call only made
    # them contend, and tokenised a flood's admitted requests all at once rather than in turn
    # (bench.hostile's flood on 2 cores: of ~320 admitted, 161 answered in time against 39-81).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(workers(), thread_name_prefix="prepare")
    )
    specs = [ModelSpec.parse(text) for text in settings.bundle_specs()]
    registry = Registry.load(specs, st.loader, settings, st.metrics, table.paths_for)
    st.registry = registry
    if st.peers is not None:
        registry.came_up, registry.peers_up = st.peers.came_up, st.peers.all_up
    for model in registry:
        runtime = model.backend.info
        st.metrics.info.labels(
            model.name,
            runtime.runtime,
            runtime.providers[0],
            runtime.device,
            runtime.precision,
            __version__,
        ).set(1)
    registry.start()
    rpc = None
    if settings.grpc_port is not None:
        from service.rpc.server import RpcServer  # grpcio loads only when gRPC is asked for

        rpc = RpcServer(registry, st.metrics, st.tracing)
        await rpc.start()
        st.grpc_port = rpc.port
    api_key = settings.api_key.get_secret_value() if settings.api_key else None
    rehearsal = Rehearsal(app, table, api_key)
    warm = asyncio.create_task(registry.warm(settings.warmup, rehearsal))
    if st.listen_when_ready:  # uvicorn listens once the startup is over: after the warm-up
        await warm
    trimmer = asyncio.create_task(Trimmer(registry.activity).run())
    try:
        yield
    finally:
        trimmer.cancel()
        warm.cancel()
        if rpc is not None:
            await rpc.stop()
        await registry.stop()
        if st.tracing is not None:
            await asyncio.to_thread(st.tracing.shutdown)  # the last spans exported
        log.info("stopped; all accepted requests answered")


def create_app(
    settings: Settings | None = None,
    loader: Loader | None = None,
    lane: bool = True,
    table: RouteTable = TABLE,
    listen_when_ready: bool = False,
    peers: Peers | None = None,
) -> FastAPI:
    """lane=False leaves every route to FastAPI (tests compare the two). listen_when_ready: the
    startup (after which uvicorn listens) awaits the warm-up (a worker that replaces one).
    peers: HEADWISE_WORKERS' (probes say ready once every worker came up)."""
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
    if not settings.attention_enabled:
        table = RouteTable([r for r in table if r.feature != "attention"], table.default)
    st = app.state
    st.settings = settings
    st.loader = loader or onnx_loader
    st.metrics = Metrics()
    st.table = table
    st.listen_when_ready = listen_when_ready
    st.peers = peers
    answers = Answers(table)
    answers.install(app)
    mount(app, table)
    if lane:  # innermost of ours: CORS and HeadwiseMiddleware wrap its answers too
        app.add_middleware(Lane, routes=table.lane(), answers=answers)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["x-request-id", "x-queue-time", "x-inference-time", "x-total-time"],
        )
    api_key = settings.api_key.get_secret_value() if settings.api_key else None
    st.tracing = Tracing(settings.otlp_endpoint) if settings.otlp_endpoint else None
    app.add_middleware(
        HeadwiseMiddleware,
        table=table,
        answers=answers,
        metrics=st.metrics,
        max_body_bytes=settings.max_body_bytes,
        api_key=api_key,
        body_timeout_s=settings.body_timeout_s,
        access_log=settings.access_log,
        tracing=st.tracing,
        saturated=lambda: st.registry.saturated() if hasattr(st, "registry") else None,
    )
    return app
