"""gRPC beside HTTP, in the same process, event loop, batchers and admission
(HEADWISE_GRPC_PORT): the Open Inference Protocol's `inference.GRPCInferenceService`, TEI's
`tei.v1` services, `grpc.health.v1` and server reflection (grpcurl needs no proto file).

The app's lifespan starts it once the models are loaded and stops it last, after the HTTP
server's drain, whose in-flight count includes the RPCs. Health: each service reports SERVING
while the server is ready and some served model can answer it (TEI's Rerank needs a reranker),
NOT_SERVING while loading and from the moment a drain begins; the empty service name is the
server's own readiness.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from service.api.oip import rpc as oip_rpc
from service.api.tei import rpc as tei_rpc
from service.http.tracing import Tracing
from service.metrics import Metrics
from service.registry import Capability, Registry
from service.rpc.calls import Rpcs
from service.rpc.generated import POOL

log = logging.getLogger(__name__)

HEALTH_EVERY_S = 0.25  # how soon health follows readiness (a drain's start, the end of warm-up)


def _describe(*modules: object) -> None:
    """Health's and reflection's own protos in the pool reflection answers from (ours live in a
    pool of their own), so that grpcurl can call them too."""
    for module in modules:
        file = module.DESCRIPTOR  # type: ignore[attr-defined]
        try:
            POOL.FindFileByName(file.name)
        except KeyError:
            POOL.AddSerializedFile(file.serialized_pb)


class RpcServer:
    def __init__(
        self, registry: Registry, metrics: Metrics, tracing: Tracing | None = None
    ) -> None:
        s = registry.settings
        assert s.grpc_port is not None
        self.registry = registry
        api_key = s.api_key.get_secret_value() if s.api_key else None
        self.rpcs = Rpcs(registry, metrics, tracing, api_key)
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", s.max_body_bytes),
                ("grpc.max_send_message_length", -1),
                # Workers (HEADWISE_WORKERS) each bind the port (SO_REUSEPORT: the kernel spreads
                # the connections); one server alone must own it (a second on it fails).
                ("grpc.so_reuseport", int(s.workers > 1)),
            ],
            maximum_concurrent_rpcs=s.max_concurrency,
        )
        self.services: dict[str, Capability | None] = {}
        self.services |= dict.fromkeys(oip_rpc.add(self.server, self.rpcs), None)
        self.services |= tei_rpc.add(self.server, self.rpcs)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [*self.services, health.SERVICE_NAME, reflection.SERVICE_NAME]
        _describe(health_pb2, reflection_pb2)
        reflection.enable_server_reflection(names, self.server, pool=POOL)
        self.port = self.server.add_insecure_port(f"{s.host}:{s.grpc_port}")
        if self.port == 0:
            raise RuntimeError(f"gRPC cannot listen on {s.host}:{s.grpc_port}")
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.server.start()
        await self.report()
        self._watch = asyncio.create_task(self._follow())
        log.info(
            "gRPC on %s:%d: %s", self.registry.settings.host, self.port, ", ".join(self.services)
        )

    def serving(self, capability: Capability | None) -> bool:
        if not self.registry.probed_ready:
            return False
        return capability is None or any(capability in m.capabilities for m in self.registry)

    async def report(self) -> None:
        status = health_pb2.HealthCheckResponse
        for name, capability in self.services.items():
            up = self.serving(capability)
            await self.health.set(name, status.SERVING if up else status.NOT_SERVING)
        await self.health.set("", status.SERVING if self.registry.probed_ready else status.NOT_SERVING)

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_EVERY_S)
            await self.report()

    async def stop(self, grace_s: float = 1.0) -> None:
        """Every service NOT_SERVING, then the listener closed: calls still running get
        grace_s (the HTTP drain already waited for them), new ones are refused."""
        if self._watch is not None:
            self._watch.cancel()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
