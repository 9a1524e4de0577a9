"""Service fixtures: an app on the tiny bundle (or on fake backends), driven in-process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from service.http.app import create_app
from service.settings import Settings


@contextmanager
def client_for(
    bundle: Path | list[str], loader=None, wait_ready: bool = True, lane: bool = True, **overrides
) -> Iterator[TestClient]:
    """A TestClient on one bundle (a path) or several (["NAME=DIR", ...]); waits until warm."""
    if isinstance(bundle, list):
        overrides["bundles"] = bundle
    else:
        overrides["bundle"] = bundle
    app = create_app(Settings(**overrides), loader=loader, lane=lane)
    with TestClient(app) as client:
        if wait_ready:
            client.portal.call(app.state.registry.wait_ready)
        yield client


class _Through(httpx.BaseTransport):
    """An httpx transport that hands each request to a TestClient."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self.client.request(
            request.method, str(request.url), headers=request.headers.multi_items(),
            content=request.read(),
        )  # fmt: skip
        # the body as decoded: no content-encoding for httpx to undo again
        drop = {"content-encoding", "content-length"}
        headers = [(k, v) for k, v in r.headers.multi_items() if k.lower() not in drop]
        return httpx.Response(r.status_code, headers=headers, content=r.content)


def httpx_client(client: TestClient) -> httpx.Client:
    """An `httpx.Client` over the in-process app, for SDKs that take one: Starlette's TestClient
    is built on httpx2, whose request options (timeouts' sentinels) httpx's SDKs do not share."""
    return httpx.Client(transport=_Through(client), base_url=str(client.base_url))


@pytest.fixture(scope="module")
def client(tiny_bundle: Path) -> Iterator[TestClient]:
    with client_for(tiny_bundle) as c:
        yield c
