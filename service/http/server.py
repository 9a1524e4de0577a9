"""`headwise serve`: settings from flags and HEADWISE_* variables, then uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event
from types import FrameType
from typing import Any

import onnxruntime as ort
import uvicorn
from fastapi import FastAPI

from service.bundle import Bundle, BundleError, load_bundle
from service.engine.runtime import Backend, DeviceUnavailable, OnnxBackend, choose_providers
from service.http.protocol import Limits, guarded
from service.http.workers import Peers
from service.registry import ModelSpec, load_backends, streams_for_memory, unique_names
from service.settings import Settings

log = logging.getLogger("headwise")


def raise_open_files(wanted: int) -> None:
    """Let the process hold `wanted` sockets: the soft limit is often 1,024, under which a
    thousand idle sockets would stop the server accepting (its liveness probe included)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        log.info("open files limit raised from %d to %d", soft, target)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        log.warning(
            "open files hard limit %d is under the %d sockets HEADWISE_MAX_CONNECTIONS needs",
            hard,
            wanted,
        )


def margin_s(grace_s: float) -> float:
    """Of the grace, what is kept to send the last answers once requests stop waiting."""
    return min(1.0, 0.25 * grace_s)


class DrainingServer(uvicorn.Server):
    """A drain that answers everything it accepted, within the grace.

    On SIGTERM (or SIGINT) the listener stays open while the models drain: new requests are
    answered 503 with Retry-After at once (the load balancer moves them elsewhere), and every
    request already accepted is given until the end of the grace, less a margin, to finish; one
    that cannot is answered 503 with Retry-After then, never cut off. Once nothing is in flight
    (or the grace is spent), uvicorn's own shutdown closes the listener and the connections.
    A second signal stops at once.

    uvicorn re-raises SIGTERM after its graceful shutdown, so the process dies "by signal"
    (exit -15). After a completed drain we exit 0 instead: every accepted request was answered.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        app: FastAPI,
        grace_s: float,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.app = app
        self.grace_s = grace_s
        self.on_started = on_started
        self._drain: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self._loop = asyncio.get_running_loop()
        await super()._serve(sockets)
        if self.started:
            self._captured_signals.clear()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started()  # listening: a worker tells its supervisor it came up

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self._loop
        if self._drain is not None or loop is None or not self.started:
            super().handle_exit(sig, frame)  # a second signal, or not serving yet: stop now
            return
        self._captured_signals.append(sig)
        loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        self._drain = asyncio.ensure_future(self.drain())

    async def drain(self) -> None:
        started = time.monotonic()
        end = started + self.grace_s
        st = self.app.state
        log.info(
            "draining: %.1f s to answer %d requests in flight", self.grace_s, st.metrics.active
        )
        st.registry.begin_drain(self.grace_s - margin_s(self.grace_s))
        while st.metrics.active > 0 and time.monotonic() < end - 0.05:
            await asyncio.sleep(0.02)  # the server's own loop; nothing waits on this but exit
        self.config.timeout_graceful_shutdown = max(1, round(end - time.monotonic()))
        self.should_exit = True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and the request's fields."""

    FIELDS = ("request_id", "route", "status", "model", "ms")

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **{k: getattr(record, k) for k in self.FIELDS if hasattr(record, k)},
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: str, fmt: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def check_bundles(settings: Settings) -> dict[ModelSpec, Bundle]:
    """Every bundle readable (hashes checked once) and uniquely named, before the port is bound."""
    specs = [ModelSpec.parse(text) for text in settings.bundle_specs()]
    loaded = [load_bundle(spec.path, verify=settings.verify_bundle) for spec in specs]
    unique_names(specs, [b.manifest.name for b in loaded])
    return dict(zip(specs, loaded, strict=True))


def serve_command(args: argparse.Namespace) -> int:
    names = ("host", "port", "device", "runtime", "precision", "workers")
    overrides = {k: v for k in names if (v := getattr(args, k, None)) is not None}
    if args.bundle:
        overrides["bundles"] = args.bundle
    settings = Settings(**overrides)
    configure_logging(settings.log_level, settings.log_format)
    if settings.workers > 1:
        try:  # unreadable bundles fail here, once, before any worker starts
            check_bundles(settings)
        except (BundleError, ValueError) as exc:
            log.error("cannot serve: %s", exc)
            return 1
        from service.http.workers import supervise

        return supervise(settings, overrides, run_worker)
    return serve(settings)


def run_worker(
    overrides: dict[str, Any],
    index: int,
    sock: socket.socket,
    started: Event,
    replaces: bool,
    up: Any,
) -> None:
    """One of HEADWISE_WORKERS (spawned by service/http/workers.py): pinned to its CPUs, its
    threads set, then a whole server accepting on `sock` (once ready when it `replaces` one),
    ready to probes once every worker came up (`up`: their flags)."""
    from service.engine.cpu import share
    from service.http.workers import die_with_parent

    # Its own process group: a terminal's Ctrl-C reaches the supervisor, which passes it on
    # once (twice would stop a worker without its drain); and it goes when the supervisor does.
    os.setpgrp()
    die_with_parent()
    settings = Settings(**overrides)
    configure_logging(settings.log_level, settings.log_format)
    part = share(index, settings.workers)
    if part.cpus is not None:
        os.sched_setaffinity(0, part.cpus)
    if not settings.threads:
        settings = settings.model_copy(update={"threads": part.threads})
    log.info(
        "worker %d of %d (pid %d): %d threads%s",
        index + 1,
        settings.workers,
        os.getpid(),
        settings.threads,
        f" on CPUs {part.cpus}" if part.cpus is not None else "",
    )
    peers = Peers(up, index)
    code = serve(
        settings, sockets=[sock], on_started=started.set, listen_when_ready=replaces, peers=peers
    )
    sys.exit(code)


def serve(
    settings: Settings,
    sockets: list[socket.socket] | None = None,
    on_started: Callable[[], None] | None = None,
    listen_when_ready: bool = False,
    peers: Peers | None = None,
) -> int:
    """Load the models, then serve until a signal (on `sockets`: a worker's, else the port).
    listen_when_ready: accept connections only once warmed (a worker replacing one that died:
    its siblings answer meanwhile); else at once, /health answering while it warms. peers: the
    workers on the port (ready to probes once all came up)."""
    try:
        bundles = check_bundles(settings)
        if settings.device == "cuda":  # fail before binding the port when the GPU is missing
            choose_providers(settings.device, ort.get_available_providers())
        # The sessions start before the port is bound: a GPU that onnxruntime-gpu lists but
        # cannot use (no driver) refuses here, with a message and exit 1, not at first request.
        specs = list(bundles)
        settings = streams_for_memory(specs, settings)
        backends = load_backends(specs, lambda spec, s: OnnxBackend(bundles[spec], s), settings)
    except (BundleError, DeviceUnavailable, ValueError, RuntimeError) as exc:
        log.error("cannot serve: %s", exc)
        return 1
    from service.http.app import create_app

    loaded = dict(zip(specs, backends, strict=True))

    def preloaded(spec: ModelSpec, s: Settings) -> Backend:
        return loaded[spec]

    app = create_app(settings, loader=preloaded, listen_when_ready=listen_when_ready, peers=peers)
    limits = Limits(
        header_timeout_s=settings.header_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        max_requests=settings.max_concurrency,
        max_connections=settings.max_connections,
        always=app.state.table.liveness(),
    )
    raise_open_files(settings.max_connections + 256)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=guarded(limits),
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.drain_timeout_s),
        timeout_keep_alive=max(1, round(settings.keep_alive_s)),
        access_log=False,  # ours is the middleware's (HEADWISE_ACCESS_LOG), with the model
        log_config=None,  # keep the handlers configured above (JSON or text) for uvicorn too
        lifespan="on",
    )
    server = DrainingServer(config, app, settings.drain_timeout_s, on_started)
    server.run(sockets=sockets)
    # uvicorn reports a failed startup (lifespan error) by leaving started False.
    return 0 if server.started else 1
