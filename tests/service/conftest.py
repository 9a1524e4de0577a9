"""Service fixtures: an app on the tiny bundle (or on fake backends), driven in-process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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


@pytest.fixture(scope="module")
def client(tiny_bundle: Path) -> Iterator[TestClient]:
    with client_for(tiny_bundle) as c:
        yield c
