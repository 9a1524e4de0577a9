"""MkDocs hooks: the pages' generated parts, from the code they describe, at build time.

- `<!-- generated: settings -->`: every HEADWISE_* setting, its default and its meaning, from
  the settings model (service/settings.py): a setting added there is on the page.
- `<!-- generated: routes -->`: every declared route (service/api/routes.py), its method,
  dialect, what a model must do to answer it, and its summary.
- The benchmarks' plots (bench/results/*.png, written by `make bench`) join the site where the
  Benchmarks page links them, without a copy in docs/.

tests/docs/ calls the same functions, so the checks and the site read one source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined or field.default is None:
        return "unset"
    else:
        value = field.default
    if hasattr(value, "get_secret_value"):
        return "unset"
    return f"`{value}`"


def settings_table() -> str:
    from service.settings import Settings

    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        meaning = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `HEADWISE_{name.upper()}` | {_default(field)} | {meaning} |")
    return "\n".join(rows) + "\n"


def routes_table() -> str:
    from service.api.routes import TABLE

    rows = [
        "| method | path | dialect | model that answers | key | summary |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for route in TABLE:
        needs = route.capability or "none"
        key = "open" if route.open else "API key"
        summary = route.summary.replace("|", "\\|") or "-"
        rows.append(
            f"| {route.method} | `{route.path}` | {route.dialect.tag} | {needs} | {key} | {summary} |"
        )
    return "\n".join(rows) + "\n"


GENERATED = {
    "<!-- generated: settings -->": settings_table,
    "<!-- generated: routes -->": routes_table,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    for marker, make in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


def on_files(files: Any, config: Any, **_: Any) -> Any:
    from mkdocs.structure.files import File

    for png in sorted((ROOT / "bench" / "results").glob("*.png")):
        rel = png.relative_to(ROOT).as_posix()
        files.append(File(rel, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
