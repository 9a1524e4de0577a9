"""Every string field of every route is safe: a lone surrogate or an invalid UTF-8 byte in it is
a 4xx that names the field, a NUL is text like any other character, and nothing is a 5xx.

Valid bodies come from each route's own OpenAPI schema (schemathesis' positive cases); then
each string in them, one at a time, is replaced by a hostile one and sent as raw bytes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from pydantic import TypeAdapter

from service.api.routes import TABLE
from service.api.tei.handlers import ROOT
from service.manifest import MultiVectorOutput, SparseOutput
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest

MARK = "HOSTILE-MARK-7f3a"
HOSTILE = {
    "surrogate": b'"a\\ud800b"',
    "invalid utf-8": b'"a\xff\xfeb"',
    "nul": b'"a\\u0000b"',
}


@pytest.fixture(scope="module")
def served():
    backends = [
        FakeBackend(fake_manifest("embedder")),
        FakeBackend(fake_manifest("ranker", d=1, task="rerank", labels=["score"])),
        FakeBackend(fake_manifest("nli", d=3, task="classify", labels=["a", "b", "c"])),
        FakeBackend(
            fake_manifest(
                "lexical",
                outputs=["dense", "sparse", "multi_vector"],
                sparse=SparseOutput(kind="token_weights", graph_output="w"),
                multi_vector=MultiVectorOutput(graph_output="v", dim=4, skip_first=True),
            )
        ),
    ]
    with client_for(["a", "b", "c", "d"], loader=fake_loader(*backends)) as c:
        yield c


def strings(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every string in a JSON value (dict keys excluded)."""
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from strings(v, (*path, i))


def replaced(value: Any, path: tuple[Any, ...]) -> Any:
    if not path:
        return MARK
    out = dict(value) if isinstance(value, dict) else list(value)
    out[path[0]] = replaced(value[path[0]], path[1:])  # type: ignore[index,call-overload]
    return out


def read(adapter, body: Any) -> bool:
    """Whether the route reads the marked string (its validated body still holds it)."""
    try:
        value = adapter.validate_python(body)
    except Exception:  # noqa: BLE001 - a body the mark makes invalid: the route reads it
        return True
    return MARK in repr(value)


def valid_bodies(client, path: str, n: int) -> list[Any]:
    """Up to n bodies the route accepts (200), from its own schema."""
    schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())
    operation = schema[path]["POST"]
    found: list[Any] = []

    @settings(
        max_examples=60, deadline=None, database=None, derandomize=True,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(case=operation.as_strategy())
    def collect(case):
        if len(found) >= n or not isinstance(case.body, dict):
            return
        r = client.post(path, json=case.body)
        if r.status_code == 200 and any(True for _ in strings(case.body)):
            found.append(case.body)

    collect()
    return found


def posted_routes(client) -> list[str]:
    spec = client.get("/openapi.json").json()
    return sorted(p for p, ops in spec["paths"].items() if "post" in ops and "requestBody" in ops["post"])


def test_every_string_field_of_every_route_is_safe(served, caplog):
    caplog.set_level(logging.ERROR)
    tried, failures = 0, []
    routes = posted_routes(served)
    assert len(routes) >= 15
    for route in routes:
        adapter = TABLE.match("POST", route).adapter
        if route == "/":  # read as the first model's own route (an embedder's here)
            adapter = TypeAdapter(ROOT["embed"][0])
        for body in valid_bodies(served, route, 2):
            for where in strings(body):
                if not read(adapter, replaced(body, where)):
                    continue  # a field the route ignores (compatibility routes ignore unknowns)
                template = json.dumps(replaced(body, where)).encode()
                needle = json.dumps(MARK).encode()
                for kind, value in HOSTILE.items():
                    raw = template.replace(needle, value)
                    r = served.post(route, content=raw, headers={"content-type": "application/json"})
                    tried += 1
                    field = next((str(p) for p in reversed(where) if isinstance(p, str)), route)
                    if r.status_code >= 500:
                        failures.append(f"{route} {where} {kind}: {r.status_code} {r.text[:200]}")
                    elif kind != "nul" and not 400 <= r.status_code < 500:
                        failures.append(f"{route} {where} {kind}: accepted ({r.status_code})")
                    elif kind != "nul" and r.status_code == 422 and field not in r.text:
                        failures.append(f"{route} {where} {kind}: 422 without {field!r}: {r.text[:200]}")
    assert tried >= 100, tried
    print(f"{tried} hostile strings over {len(routes)} routes")
    assert not failures, "\n".join(failures[:20])
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_500_is_logged_once(served, caplog, monkeypatch):
    backend = served.app.state.registry.models["embedder"].backend
    caplog.set_level(logging.INFO)
    backend.fail_next = True
    r = served.post("/encode", json={"inputs": "the cat"}, headers={"x-request-id": "once-1"})
    assert r.status_code == 500 and "secret" not in r.text
    lines = [rec for rec in caplog.records if "once-1" in rec.getMessage()]
    assert len(lines) == 1, [rec.getMessage() for rec in lines]
