"""The declaration is the one source of truth: the app serves exactly the declared routes, every
path is written once (in the declaration), and what is derived from it agrees with it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from fastapi.routing import APIRoute

from service.api.declaration import Route, RouteTable, Variant
from service.api.routes import ROUTES, TABLE
from service.http.app import create_app
from service.settings import Settings

SERVICE = Path(__file__).resolve().parents[3] / "service"


def served(app) -> list[tuple[str, str]]:
    return [
        (method, route.path)
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    ]


def test_the_app_serves_exactly_the_declared_routes_each_once():
    app = create_app(Settings())
    got = served(app)
    assert len(got) == len(set(got)), "a route is served twice"
    assert sorted(got) == sorted((r.method, r.path) for r in ROUTES)


def test_fastapi_documentation_routes_are_the_only_undeclared_ones():
    app = create_app(Settings())
    others = {r.path for r in app.routes if not isinstance(r, APIRoute)}
    assert others == {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def test_a_route_declared_twice_is_refused():
    dup = Route(ROUTES[0].path, ROUTES[0].dialect, ROUTES[0].variants)
    with pytest.raises(ValueError, match="declared twice"):
        RouteTable([*ROUTES, dup], TABLE.default)


def test_two_variants_on_one_path_need_a_discriminator():
    v = ROUTES[0].variants[0]
    with pytest.raises(ValueError, match="discriminator"):
        Route("/x", TABLE.default, (v, Variant(v.request, v.handler, v.response)))


def test_with_attention_off_its_routes_are_not_served():
    app = create_app(Settings(attention_enabled=False))
    paths = {p for _, p in served(app)}
    assert all(r.path not in paths for r in ROUTES if r.feature == "attention")
    assert paths  # the rest still are


def _string_literals(tree: ast.AST) -> list[str]:
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_every_path_is_written_once_in_the_declaration_and_nowhere_else_in_the_service():
    paths = {r.path for r in ROUTES}
    where: dict[str, list[str]] = {p: [] for p in paths}
    for file in SERVICE.rglob("*.py"):
        for literal in _string_literals(ast.parse(file.read_text(), str(file))):
            if literal in where:
                where[literal].append(file.relative_to(SERVICE).as_posix())
    for path, files in where.items():
        if path == "/":  # the root is also every split("/")'s separator
            assert "api/routes.py" in files, path
            continue
        assert files == ["api/routes.py"], (path, files)


def test_the_derived_lists_come_from_the_declaration():
    assert TABLE.paths_for("embed") == [r.path for r in ROUTES if r.capability == "embed" and r.documented]
    assert all(TABLE.is_open(r.path) for r in ROUTES if r.open)
    assert not any(TABLE.is_open(r.path) for r in ROUTES if not r.open)
    assert TABLE.label("/no/such/path") == "other"
    assert TABLE.label("/v1/models/some/model") == "/v1/models/{model_id:path}"
    assert {TABLE.dialect(r.path).name for r in ROUTES} >= {"headwise", "openai", "tei", "cohere"}
    assert TABLE.dialect("/no/such/path") is TABLE.default
