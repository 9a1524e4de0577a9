"""Service fixtures: an app on the tiny bundle, driven in-process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings


@contextmanager
def client_for(
    bundle: Path, backend_factory=None, wait_ready: bool = True, **overrides
) -> Iterator[TestClient]:
    settings = Settings(bundle=bundle, **overrides)
    app = create_app(settings, backend_factory=backend_factory)
    with TestClient(app) as client:
        deadline = time.monotonic() + 30
        while wait_ready and not app.state.ready and time.monotonic() < deadline:
            if app.state.load_error:
                break
            time.sleep(0.01)
        yield client


@pytest.fixture(scope="module")
def client(tiny_bundle: Path) -> Iterator[TestClient]:
    with client_for(tiny_bundle) as c:
        yield c
