"""FastAPI dependencies, written once: the core, readiness, model choice, client disconnects."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.core import Capability, Core, Model
from service.pipelines.common import Disconnect


# async on purpose: FastAPI runs a plain `def` dependency on a worker thread, a hop that cost
# ~0.2 ms a request (measured with bench.compare at one client).
async def get_core(request: Request) -> Core:
    return request.app.state.core


AnyCore = Annotated[Core, Depends(get_core)]


async def ready_core(request: Request) -> Core:
    """The core once every model is loaded and warm (503 before). One dependency, not one on
    top of get_core: each resolution costs the hot path a few µs."""
    core: Core = request.app.state.core
    core.require_ready()
    return core


ReadyCore = Annotated[Core, Depends(ready_core)]


async def client_gone(request: Request) -> Disconnect:
    """The client's disconnect, for pipelines to watch while they wait for queued work."""
    return Disconnect(request.receive)


ClientGone = Annotated[Disconnect, Depends(client_gone)]


def use_model(request: Request, core: Core, name: str | None, capability: Capability) -> Model:
    """Pick the model and label the request's metrics with it."""
    model = core.pick(name, capability)
    request.state.model = model.name
    return model
