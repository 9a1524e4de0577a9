"""FastAPI dependencies, written once: the core, readiness, model choice, client disconnects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request

from service.core import Capability, Core, Model
from service.pipelines.common import wait_for_disconnect


# async on purpose: FastAPI runs a plain `def` dependency on a worker thread, a hop that cost
# ~0.2 ms a request (measured with bench.compare at one client).
async def get_core(request: Request) -> Core:
    return request.app.state.core


AnyCore = Annotated[Core, Depends(get_core)]


async def ready_core(core: AnyCore) -> Core:
    core.require_ready()
    return core


ReadyCore = Annotated[Core, Depends(ready_core)]


async def client_gone(request: Request) -> AsyncIterator[asyncio.Future]:
    """A future that completes if the client disconnects while the request is handled."""
    task = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        yield task
    finally:
        task.cancel()


ClientGone = Annotated[asyncio.Future, Depends(client_gone)]


def use_model(request: Request, core: Core, name: str | None, capability: Capability) -> Model:
    """Pick the model and label the request's metrics with it."""
    model = core.pick(name, capability)
    request.state.model = model.name
    return model
