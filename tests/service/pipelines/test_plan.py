"""/encode as one plan (service/pipelines/plan.py): the request decides the plan's kind before any
work runs; the first thing admission prices is the plan's own figure, through the plan's intake;
and a plan refused on its price tokenises nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import InvalidInput
from service.pipelines.base import Intake
from service.pipelines.chunking import Chunking
from service.pipelines.embed import Tokenizing
from service.pipelines.plan import plan
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest

DOC = " ".join(["the cat and the dog is in it"] * 5)  # 40 words


@pytest.fixture
def served():
    backend = FakeBackend(
        fake_manifest("fake", d=384, max_length=16, prompts={"query": "hello world "})
    )
    with client_for(Path("fake"), fake_loader(backend)) as c:
        yield c, c.app.state.registry.models["fake"], backend


@pytest.fixture
def admitted(monkeypatch):
    """Every call of Intake.admit: (intake, lengths, unit)."""
    calls: list[tuple[Intake, list[int], str]] = []
    real = Intake.admit

    def spy(self, lengths, call, unit="inputs", *args, **kwargs):
        calls.append((self, list(lengths), unit))
        return real(self, lengths, call, unit, *args, **kwargs)

    monkeypatch.setattr(Intake, "admit", spy)
    return calls


def test_the_request_decides_the_kind_and_its_unit_before_anything_runs(served):
    _, model, backend = served
    plain = plan(model.embed, model.outputs, ["the cat"], Tokenizing())
    assert (plain.kind, plain.unit, plain.outputs) == ("dense", "inputs", ["dense"])
    role = plan(model.embed, model.outputs, ["the cat"], Tokenizing(), input_type="query")
    assert role.kind == "outputs" and role.how.prompt_name == "query"  # the role's prompt
    late = plan(model.embed, None, [DOC], Tokenizing(), chunking=Chunking("late", 4))
    assert (late.kind, late.unit, late.intake) == ("chunks", "windows", model.embed.tokens)
    separate = plan(model.embed, None, [DOC], Tokenizing(), chunking=Chunking("separate", 4))
    assert (separate.unit, separate.intake) == ("chunks", model.embed.intake)
    assert sum(separate.priced) >= 40 and len(separate.priced) == 10  # 40 words, 4 a chunk
    with pytest.raises(InvalidInput, match="chunking answers a model's dense vectors"):
        plan(
            model.embed, None, [DOC], Tokenizing(), outputs=["dense"], chunking=Chunking("late", 4)
        )
    assert backend.seen == []  # planning ran nothing


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({"inputs": ["the cat", DOC]}, "dense"),
        ({"inputs": ["the cat", DOC], "prompt_name": "query"}, "dense"),
        ({"inputs": ["the cat", DOC], "input_type": "query"}, "outputs"),
        ({"inputs": [DOC], "chunking": {"strategy": "late", "size": 4}}, "chunks"),
        ({"inputs": [DOC], "chunking": {"strategy": "separate", "size": 4}}, "chunks"),
    ],
)
def test_admission_first_prices_the_plan_the_pipeline_runs(served, admitted, body, kind):
    c, model, _ = served
    how = Tokenizing(prompt_name=body.get("prompt_name"))
    options = body.get("chunking")
    chunking = Chunking(options["strategy"], options["size"]) if options else None
    p = plan(
        model.embed,
        model.outputs,
        body["inputs"],
        how,
        input_type=body.get("input_type"),
        chunking=chunking,
    )
    assert p.kind == kind
    r = c.post("/encode", json=body)
    assert r.status_code == 200, r.text[:300]
    intake, lengths, unit = admitted[0]
    assert (intake, lengths, unit) == (p.intake, p.priced, p.unit)
    # A lower bound: what ran was never less (the prompt's words counted too).
    ran = r.json()["tokens"]
    assert sum(ran) >= sum(p.priced)
    if body.get("prompt_name"):
        assert p.priced[0] == 2 + 2  # "hello world " before "the cat"


def test_a_plan_refused_on_its_price_tokenises_nothing(served, monkeypatch):
    c, model, backend = served
    tokenised: list[int] = []
    real = backend.tokenize_whole
    monkeypatch.setattr(
        backend, "tokenize_whole", lambda texts: tokenised.append(len(texts)) or real(texts)
    )
    # Any window costs more than the deadline (the fake's cost is not measured).
    monkeypatch.setattr(model.embed.tokens.batcher, "predict", lambda lengths: 1e3 * len(lengths))
    r = c.post("/encode", json={"inputs": [DOC], "chunking": {"strategy": "late", "size": 4}})
    assert r.status_code == 413, r.text[:300]
    assert "10 windows" in r.text or "windows of" in r.text
    assert tokenised == [] and backend.seen == []
