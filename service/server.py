"""`headwise serve`: settings from flags and HEADWISE_* variables, then uvicorn."""

from __future__ import annotations

import argparse
import logging

import onnxruntime as ort
import uvicorn

from service.bundle import BundleError, load_bundle
from service.runtime import DeviceUnavailable, choose_providers
from service.settings import Settings

log = logging.getLogger("headwise")


class DrainingServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process dies "by signal"
    (exit -15). After a completed drain we exit 0 instead: every accepted request was answered."""

    async def _serve(self, sockets=None) -> None:  # type: ignore[override]
        await super()._serve(sockets)
        if self.started:
            self._captured_signals.clear()


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def serve_command(args: argparse.Namespace) -> int:
    overrides = {
        k: v for k in ("bundle", "host", "port", "device") if (v := getattr(args, k)) is not None
    }
    settings = Settings(**overrides)
    configure_logging(settings.log_level)
    try:
        bundle = load_bundle(settings.bundle, verify=settings.verify_bundle)
        if settings.device == "cuda":  # fail before binding the port when the GPU is missing
            choose_providers(settings.device, ort.get_available_providers())
    except (BundleError, DeviceUnavailable) as exc:
        log.error("cannot serve: %s", exc)
        return 1
    from service.app import create_app

    app = create_app(settings, bundle=bundle)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.drain_timeout_s),
        limit_concurrency=settings.max_concurrency,
        timeout_keep_alive=settings.keep_alive_s,
        access_log=False,
        lifespan="on",
    )
    server = DrainingServer(config)
    server.run()
    # uvicorn reports a failed startup (lifespan error) by leaving started False.
    return 0 if server.started else 1
