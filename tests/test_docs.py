"""The README and the manual are part of the contract: the README is the front door with the two
commands, the manual's settings and routes tables are generated from the code, and the site
builds in strict mode (tests/docs/test_examples.py runs their examples)."""

from __future__ import annotations

import re
from pathlib import Path

from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_setting_is_on_the_configuration_page_with_its_meaning():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert "<!-- generated: settings -->" in page  # the table is made from the settings
    table = _hooks().settings_table()
    documented = set(re.findall(r"^\| `HEADWISE_([A-Z0-9_]+)` \|", table, flags=re.M))
    assert documented == {name.upper() for name in Settings.model_fields}
    for name, field in Settings.model_fields.items():
        assert field.description, f"HEADWISE_{name.upper()} has no description for the manual"


def test_every_declared_route_is_in_the_api_reference():
    from service.api.routes import TABLE

    assert "<!-- generated: routes -->" in (ROOT / "docs" / "api.md").read_text()
    table = _hooks().routes_table()
    for route in TABLE:
        assert f"| {route.method} | `{route.path}` |" in table


def test_the_readme_is_a_front_door():
    assert len(README.splitlines()) < 200
    for link in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / link).exists(), link


def test_the_site_builds_in_strict_mode(tmp_path):
    """No warning (a broken link or anchor, a page left out of the navigation) passes."""
    import subprocess
    import sys

    mkdocs = Path(sys.executable).parent / "mkdocs"
    env = {"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)}
    run = subprocess.run(
        [str(mkdocs), "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "site" / "configuration" / "index.html").exists()
    assert "HEADWISE_GRPC_PORT" in (tmp_path / "site" / "configuration" / "index.html").read_text()
    assert "/v2/models/{name:path}/infer" in (tmp_path / "site" / "api" / "index.html").read_text()


def test_the_two_commands_and_ci_use_the_same_test_command():
    assert "make serve" in README and "make test" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, flags=re.M)
    makefile = (ROOT / "Makefile").read_text()
    for target in ("setup:", "serve:", "test:", "bench:", "system-deps:"):
        assert f"\n{target}" in makefile
