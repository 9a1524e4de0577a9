"""Admission sized to capacity: what cannot finish within its deadline is refused at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.admission import Throughput, admit
from service.errors import Overloaded, PayloadTooLarge
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest
from tests.service.test_batcher import Recorder, held, run, seqs, started


def test_throughput_is_assumed_until_measured_then_token_weighted():
    rate = Throughput(assumed=1000)
    assert rate.tokens_per_s == 1000 and not rate.measured
    rate.observe(100, 1.0)
    rate.observe(900, 1.0)
    assert rate.measured and rate.tokens_per_s == pytest.approx((100 * 0.9 + 900) / 1.9)


def test_work_longer_than_the_deadline_is_413_naming_what_fits():
    with pytest.raises(PayloadTooLarge) as err:
        admit([200] * 2048, 0, Throughput(5000), 30.0, 0.1)
    message = err.value.message
    assert "HEADWISE_REQUEST_TIMEOUT_S" in message and "send at most about" in message
    fit = int(message.split("send at most about ")[1].split()[0])
    admit([200] * fit, 0, Throughput(5000), 30.0, 0.1)  # what it names does fit


def test_work_that_fits_alone_but_not_behind_the_queue_is_429_with_retry_after():
    admit([100], 0, Throughput(1000), 1.0, 0.0)
    with pytest.raises(Overloaded) as err:
        admit([100], 950, Throughput(1000), 1.0, 0.0)
    assert err.value.retry_after >= 1


def test_the_batcher_admits_against_its_own_queue():
    async def main():
        rec = Recorder()
        b = await started(rec, assumed_tokens_per_s=100)
        await held(rec, b)
        b.admit([40], 1.0)
        b.submit(seqs(40, 40), 5)  # 80 tokens ahead
        with pytest.raises(Overloaded):
            b.admit([30], 1.0)
        rec.gate.set()
        await b.stop()

    run(main())


def test_an_oversized_request_is_refused_before_any_batch_is_computed():
    backend = FakeBackend(fake_manifest("fake"))
    with client_for(
        Path("fake"), fake_loader(backend), capacity_tokens_per_s=50, request_timeout_s=1.0
    ) as c:
        r = c.post("/encode", json={"inputs": ["the cat and the dog"] * 20})
        assert r.status_code == 413
        assert "HEADWISE_REQUEST_TIMEOUT_S" in r.json()["error"]["message"]
        assert backend.seen == []
        assert c.post("/encode", json={"inputs": "the cat"}).status_code == 200
        batcher = c.app.state.core.models["fake"].embed.batcher
        assert batcher.throughput.measured  # the batch it ran was measured
        assert batcher.depth == 0
