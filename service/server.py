"""`headwise serve`: settings from flags and HEADWISE_* variables, then uvicorn."""

from __future__ import annotations

import argparse
import json
import logging

import onnxruntime as ort
import uvicorn

from service.bundle import Bundle, BundleError, load_bundle
from service.core import ModelSpec, load_backends, unique_names
from service.runtime import Backend, DeviceUnavailable, OnnxBackend, choose_providers
from service.settings import Settings

log = logging.getLogger("headwise")


class DrainingServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process dies "by signal"
    (exit -15). After a completed drain we exit 0 instead: every accepted request was answered."""

    async def _serve(self, sockets=None) -> None:  # type: ignore[override]
        await super()._serve(sockets)
        if self.started:
            self._captured_signals.clear()


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
    overrides = {k: v for k in ("host", "port", "device") if (v := getattr(args, k)) is not None}
    if args.bundle:
        overrides["bundles"] = args.bundle
    settings = Settings(**overrides)
    configure_logging(settings.log_level, settings.log_format)
    try:
        bundles = check_bundles(settings)
        if settings.device == "cuda":  # fail before binding the port when the GPU is missing
            choose_providers(settings.device, ort.get_available_providers())
        # The sessions start before the port is bound: a GPU that onnxruntime-gpu lists but
        # cannot use (no driver) refuses here, with a message and exit 1, not at first request.
        specs = list(bundles)
        backends = load_backends(specs, lambda spec, s: OnnxBackend(bundles[spec], s), settings)
    except (BundleError, DeviceUnavailable, ValueError, RuntimeError) as exc:
        log.error("cannot serve: %s", exc)
        return 1
    from service.app import create_app

    loaded = dict(zip(specs, backends, strict=True))

    def preloaded(spec: ModelSpec, s: Settings) -> Backend:
        return loaded[spec]

    app = create_app(settings, loader=preloaded)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.drain_timeout_s),
        limit_concurrency=settings.max_concurrency,
        timeout_keep_alive=settings.keep_alive_s,
        access_log=False,  # ours is the middleware's (HEADWISE_ACCESS_LOG), with the model
        log_config=None,  # keep the handlers configured above (JSON or text) for uvicorn too
        lifespan="on",
    )
    server = DrainingServer(config)
    server.run()
    # uvicorn reports a failed startup (lifespan error) by leaving started False.
    return 0 if server.started else 1
