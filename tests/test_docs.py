"""The README is part of the contract: its commands and its settings table stay true."""

from __future__ import annotations

import re
from pathlib import Path

from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_setting_is_documented_and_nothing_else():
    documented = set(re.findall(r"^\| `HEADWISE_([A-Z0-9_]+)` \|", README, flags=re.M))
    assert documented == {name.upper() for name in Settings.model_fields}


def test_the_two_commands_and_ci_use_the_same_test_command():
    assert "make serve" in README and "make test" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, flags=re.M)
    makefile = (ROOT / "Makefile").read_text()
    for target in ("setup:", "serve:", "test:", "bench:", "system-deps:"):
        assert f"\n{target}" in makefile
