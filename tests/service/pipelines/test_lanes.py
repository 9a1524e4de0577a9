"""The long lane: sequences longer than HEADWISE_LONG_TOKENS run in their own session and batcher
(one thread, the lowest CPU priority), so that a long input cannot hold short ones back; a
request's sequences go each to its lane and come back in order, equal to one lane's answer."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest

SHORT = "the cat"
LONG = " ".join(["the cat and the dog"] * 6)  # 30 words: past a long lane of 8 tokens


@pytest.fixture
def laned():
    backend = FakeBackend(fake_manifest("fake", max_length=64))
    backend.long_tokens = 8
    with client_for(Path("fake"), fake_loader(backend)) as c:
        yield c, backend


def test_long_sequences_take_the_long_lane_and_answers_keep_their_order(laned):
    c, backend = laned
    texts = [SHORT, LONG, "a dog", LONG + " one"]
    got = np.array(c.post("/encode", json={"inputs": texts}).json()["embeddings"])
    assert len(backend.long_seen) == 2 and all(len(s) > 8 for s in backend.long_seen)
    backend.long_tokens = 0  # the same request, one lane: the same vectors, in the same order
    model = c.app.state.registry.models["fake"]
    model.embed.intake.long_tokens = 10_000
    want = np.array(c.post("/encode", json={"inputs": texts}).json()["embeddings"])
    assert np.allclose(got, want)


def test_short_requests_are_answered_while_a_long_one_runs(laned):
    c, backend = laned
    backend.long_release.clear()
    backend.long_entered.clear()
    status: list[int] = []
    t = threading.Thread(target=lambda: status.append(c.post("/encode", json={"inputs": LONG}).status_code))
    t.start()
    try:
        assert backend.long_entered.wait(10)
        for _ in range(5):  # the long one is held in its lane: these do not wait for it
            assert c.post("/encode", json={"inputs": SHORT}).status_code == 200
    finally:
        backend.long_release.set()
        t.join(20)
    assert status == [200]


def test_the_long_lane_runs_one_sequence_a_batch_at_the_lowest_priority(laned):
    c, _ = laned
    model = c.app.state.registry.models["fake"]
    lane = model.embed.intake.long
    assert lane is not None and lane.policy.max_batch_size == 1 and lane in model.admission.batchers
    assert lane.policy.inline_max_tokens == 0
