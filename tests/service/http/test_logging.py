"""Logs people can use: JSON lines with the request's fields, and an optional access log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from service.http.server import JsonFormatter
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest


def test_json_lines_carry_the_request_fields():
    record = logging.LogRecord("service.errors", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    record.request_id, record.route, record.status, record.model = "r1", "POST /encode", 422, "m"
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "hello x" and line["level"] == "info"
    assert (line["request_id"], line["route"], line["status"], line["model"]) == (
        "r1", "POST /encode", 422, "m",
    )  # fmt: skip


def test_access_log_is_one_line_per_request_when_turned_on(caplog):
    backend = FakeBackend(fake_manifest("m"))
    client = client_for(Path("f"), loader=fake_loader(backend), access_log=True)
    with client as c, caplog.at_level(logging.INFO, logger="headwise.access"):
        c.post("/encode", json={"inputs": "x"}, headers={"x-request-id": "acc-1"})
    lines = [r for r in caplog.records if r.name == "headwise.access"]
    assert len(lines) == 1
    assert (lines[0].request_id, lines[0].status, lines[0].model) == ("acc-1", 200, "m")
    assert lines[0].route == "POST /encode" and lines[0].ms >= 0


def test_access_log_is_off_by_default(caplog):
    backend = FakeBackend(fake_manifest("m"))
    client = client_for(Path("f"), loader=fake_loader(backend))
    with client as c, caplog.at_level(logging.INFO, logger="headwise.access"):
        c.post("/encode", json={"inputs": "x"})
    assert not [r for r in caplog.records if r.name == "headwise.access"]
