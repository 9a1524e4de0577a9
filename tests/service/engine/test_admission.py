"""Admission sized to capacity: what cannot finish by its deadline is refused at once, counting
the work queued and running on every serving batcher of the model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service.engine.admission import Admission
from service.engine.cost import CostModel, Sample
from service.engine.preparing import PrepareCost
from service.errors import Overloaded, PayloadTooLarge
from tests.service.conftest import client_for
from tests.service.engine.test_batcher import Recorder, held, run, seqs, soon, started
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest


class Stub:
    """A batcher as admission sees it: a cost per token and seconds of work ahead."""

    def __init__(self, tokens_per_s: float, backlog_s: float = 0.0) -> None:
        self.cost = CostModel(fixed_tokens_per_s=tokens_per_s)
        self.backlog = backlog_s
        self.reasons: list[str] = []

    def backlog_s(self) -> float:
        return self.backlog

    def predict(self, lengths) -> float:
        return sum(self.cost.seconds(1, n) for n in lengths)

    def rejected(self, reason: str) -> None:
        self.reasons.append(reason)


class Measured(Stub):
    """A batcher whose cost was measured (1 ms a token): the device's pace applies to it."""

    def __init__(self, backlog_s: float = 0.0) -> None:
        super().__init__(1000, backlog_s)
        self.cost = CostModel()
        self.cost.calibrate([Sample(r, n, 1e-3 * r * n) for r in (1, 4) for n in (100, 400)])


def slowed(device, monkeypatch, rate: float) -> None:
    """The device measured working off `rate` predicted seconds a second of computing."""
    now = [0.0]
    monkeypatch.setattr("service.engine.cost.time.monotonic", lambda: now[0])
    for _ in range(200):
        t = device.enter(rate * 0.5)
        now[0] += 0.5
        device.leave(t)
    assert device.pace == pytest.approx(rate, abs=0.01)


def test_the_work_ahead_and_its_own_take_their_predictions_over_the_measured_pace(monkeypatch):
    """Under load the runs overlap and work off their predictions slower than alone (the
    device's pace, engine/cost.py): admission divides the seconds it sums by it."""
    admission = Admission(timeout_s=10.0, headroom=1.0)
    b = Measured(backlog_s=4.5)
    admission.batchers.append(b)
    assert b.predict([1000]) == pytest.approx(1.0, rel=1e-3)
    admission.release(admission.admit(b, [1000], 10.0))  # 4.5 + 1 s: fits at the predictions
    slowed(admission.device, monkeypatch, 0.5)
    with pytest.raises(Overloaded) as err:
        admission.admit(b, [1000], 10.0)  # (4.5 + 1) / 0.5 = 11 s
    assert "9.0 s" in err.value.message and "0.50x under load" in err.value.message
    b.backlog = 0.0
    place = admission.admit(b, [1000], 10.0)
    assert admission.promised_at(place) == pytest.approx(1.0, rel=1e-3)  # promised as predicted
    admission.release(place)
    with pytest.raises(PayloadTooLarge) as err:  # 6 s alone, 12 s at the pace: past 10
        admission.admit(b, [1000] * 6, 10.0)
    fit = int(err.value.message.split("send at most about ")[1].split()[0])
    assert fit == 5
    admission.release(admission.admit(b, [1000] * fit, 10.0))  # what it names does fit
    # One sequence with nothing ahead runs alone, as calibrated: 9 s, not 18.
    admission.release(admission.admit(b, [9000], 10.0))
    b.backlog = 0.5  # beside other work it overlaps it: (0.5 + 9) / 0.5
    with pytest.raises(Overloaded):
        admission.admit(b, [9000], 10.0)
    b.backlog = 0.0
    assert admission.saturated() is None
    b.backlog = 5.5  # 11 s at the pace: nothing more is admitted
    assert admission.saturated() is not None


def test_a_stated_rate_is_not_divided_by_the_pace(monkeypatch):
    """HEADWISE_CAPACITY_TOKENS_PER_S states what the machine does: taken as it is."""
    admission = Admission(timeout_s=10.0, headroom=1.0)
    b = Stub(1000, backlog_s=4.5)
    admission.batchers.append(b)
    slowed(admission.device, monkeypatch, 0.5)
    admission.release(admission.admit(b, [1000], 10.0))


def chars(n: int) -> tuple[PrepareCost, int]:
    """n characters to tokenise at 1 ms each."""
    cost = PrepareCost()
    cost.calibrated(1e-3)
    return cost, n


def test_work_longer_than_the_deadline_is_413_naming_what_fits():
    admission = Admission(timeout_s=30.0)
    b = Stub(5000)
    admission.batchers.append(b)
    with pytest.raises(PayloadTooLarge) as err:
        admission.admit(b, [200] * 2048, 30.0)
    message = err.value.message
    assert "HEADWISE_REQUEST_TIMEOUT_S" in message and "send at most about" in message
    fit = int(message.split("send at most about ")[1].split()[0])
    admission.admit(b, [200] * fit, 30.0)  # what it names does fit
    assert b.reasons == ["over_capacity"]


def test_work_that_fits_alone_but_not_behind_the_work_ahead_is_429_with_retry_after():
    admission = Admission(timeout_s=1.0)
    b = Stub(1000)
    admission.batchers.append(b)
    admission.admit(b, [100], 1.0)
    b.backlog = 0.95
    with pytest.raises(Overloaded) as err:
        admission.admit(b, [100], 1.0)
    assert err.value.retry_after >= 1 and b.reasons == ["queue_too_long"]


def test_the_work_of_every_batcher_of_the_model_counts():
    """/encode and /embed_all share the model's cores: each waits for both."""
    admission = Admission(timeout_s=10.0)
    encode, tokens = Stub(1000), Stub(1000, backlog_s=9.95)
    admission.batchers += [encode, tokens]
    with pytest.raises(Overloaded):
        admission.admit(encode, [100], 10.0)


def test_time_already_spent_counts_against_the_deadline():
    admission = Admission(timeout_s=10.0)
    b = Stub(1000)
    admission.batchers.append(b)
    admission.admit(b, [100], 10.0)
    with pytest.raises(Overloaded):
        admission.admit(b, [100], 0.05)  # 9.95 s of its deadline spent tokenising


def test_the_batch_being_computed_counts_as_work_ahead():
    async def main():
        rec = Recorder()
        b = await started(rec, cost=CostModel(fixed_tokens_per_s=100))
        before = b.backlog_s()
        await held(rec, b)  # one text computing: nothing queued
        running = b.backlog_s()
        b.submit(seqs(40, 40), soon(5))  # 80 tokens queued behind it
        queued = b.backlog_s()
        rec.gate.set()
        await b.stop()
        return before, running, queued

    before, running, queued = run(main())
    assert before == 0 and running > 0
    assert queued == pytest.approx(running + 0.8, abs=0.05)


def test_the_queued_work_admission_reads_follows_the_queue_and_the_measured_cost():
    """The queue's predicted seconds are kept between changes (admission asks for them twice a
    request): cancelled texts leave them, texts taken into a batch leave them, and a refit of
    the cost moves them."""

    async def main():
        rec = Recorder()
        cost = CostModel()
        cost.calibrate([Sample(r, n, 0.001 * r * n) for r in (1, 4) for n in (8, 40)])
        b = await started(rec, cost=cost, max_wait_s=0.0)
        # A batch predicted to take 0.4 s: the texts behind it are staged (handed to the
        # thread, their prediction kept) only 2 ms before it is predicted to end.
        rec.gate.clear()
        blocker = b.submit(seqs(400), soon(5))
        await rec.wait_entered()
        running = b.backlog_s()
        a = b.submit(seqs(40, 40), soon(5))
        both = b.backlog_s()
        assert b.backlog_s() == pytest.approx(
            both, abs=0.005
        )  # asked again (the running batch ages)
        a[0].future.cancel()
        for _ in range(2):  # the done-callback, then the prune it schedules
            await asyncio.sleep(0)
        one = b.backlog_s()
        cost.calibrate([Sample(r, n, 0.002 * r * n) for r in (1, 4) for n in (8, 40)])
        slower = b.backlog_s()
        rec.gate.set()
        await asyncio.gather(blocker[0].future, a[1].future)
        after = b.backlog_s()
        await b.stop()
        return running, both, one, slower, after

    running, both, one, slower, after = run(main())
    assert both - running == pytest.approx(0.08, rel=0.05)
    assert one - running == pytest.approx(0.04, rel=0.05)
    assert slower - running == pytest.approx(0.08, rel=0.05)
    assert after == 0


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
        batcher = c.app.state.registry.models["fake"].embed.batcher
        assert batcher.cost.measured  # by the operator's stated rate
        assert batcher.depth == 0


def test_work_admitted_but_not_yet_queued_counts_for_the_requests_after_it():
    """A burst arriving at once: each is admitted against the ones admitted before it (still
    tokenising), not against an empty queue."""
    admission = Admission(timeout_s=10.0)
    b = Stub(100)
    admission.batchers.append(b)
    places = [admission.admit(b, [300], 10.0) for _ in range(3)]  # 3 s each: 9 s
    with pytest.raises(Overloaded):
        admission.admit(b, [300], 10.0)
    assert admission.ahead_s() == pytest.approx(9.0)  # the refused one promised nothing
    for place in places:
        admission.release(place)  # queued (or withdrawn): the batcher counts it, or nobody
    assert admission.ahead_s() == 0.0


def test_a_request_admitted_again_at_its_place_is_behind_only_what_was_promised_before_it():
    """Tokenised, a request is admitted again on its exact sequences: the requests admitted
    after it (still tokenising) are behind it, not ahead; a new request is behind them all."""
    admission = Admission(timeout_s=10.0)
    b = Stub(100)
    admission.batchers.append(b)
    first = admission.admit(
        b, [200], 10.0, tokenising=chars(1000)
    )  # 2 s of batches, 1 s tokenising
    later = [admission.admit(b, [200], 10.0) for _ in range(3)]  # 6 s more: 9 s promised
    assert admission.ahead_s() == pytest.approx(9.0)
    assert admission.ahead_s(first) == pytest.approx(3.0)
    with pytest.raises(Overloaded):
        admission.admit(b, [200], 10.0)  # a new one: 9 + 2 > 10
    admission.clear(first)  # tokenised: its estimate goes, its place stays
    assert admission.ahead_s() == pytest.approx(6.0)
    assert admission.admit(b, [250], 9.0, place=first) == first  # 2.5 s behind nothing
    assert admission.ahead_s(first) == pytest.approx(2.5)
    assert admission.ahead_s(later[0]) == pytest.approx(4.5)
    with pytest.raises(Overloaded):  # 8.5 s promised, and a new request's own 2 s
        admission.admit(b, [200], 10.0)
    for place in [first, *later]:
        admission.release(place)
    assert admission.ahead_s() == 0.0 and admission.promised_s == 0.0


def test_tokenising_is_promised_with_the_batches_and_priced_in_a_413():
    admission = Admission(timeout_s=10.0)
    b = Stub(100)
    admission.batchers.append(b)
    with pytest.raises(PayloadTooLarge) as err:
        admission.admit(b, [100] * 8, 10.0, tokenising=chars(4000))  # 8 s of batches + 4 s
    message = err.value.message
    assert "4.0 s of it tokenising" in message
    fit = int(message.split("send at most about ")[1].split()[0])
    assert fit == 6  # each input 1 s of batches and 0.5 s of tokenising: 6 fit in 10 s
    place = admission.admit(b, [100] * 6, 10.0, tokenising=chars(3000))
    assert admission.ahead_s() == pytest.approx(9.0)
    admission.release(place)


def test_promised_tokenising_is_priced_at_the_rate_measured_since():
    """A flood is admitted at the rate measured alone; as its tokenising is measured under
    the load, what was promised before is priced at the new rate, for the requests after."""
    admission = Admission(timeout_s=10.0)
    b = Stub(100)
    admission.batchers.append(b)
    cost = PrepareCost()
    cost.calibrated(1e-3)
    places = [admission.admit(b, [100], 10.0, tokenising=(cost, 1000)) for _ in range(4)]
    assert admission.ahead_s() == pytest.approx(8.0)  # 4 x (1 s of batches + 1 s tokenising)
    admission.admit(b, [100], 10.0)  # 9 s: fits
    cost.per_char_s = 2e-3  # measured since: tokenising takes twice as long
    assert admission.ahead_s() == pytest.approx(13.0)
    with pytest.raises(Overloaded):
        admission.admit(b, [100], 10.0)
    admission.clear(places[0])  # tokenised: nothing of it promised any more
    assert admission.ahead_s() == pytest.approx(10.0)


def test_models_on_one_device_share_one_admission():
    backends = [FakeBackend(fake_manifest("a")), FakeBackend(fake_manifest("b", d=4))]
    with client_for(["a", "b"], loader=fake_loader(*backends)) as c:
        models = c.app.state.registry.models
        assert models["a"].admission is models["b"].admission
        assert (
            len(models["a"].admission.batchers)
            == len(models["a"].batchers) + len(models["b"].batchers) - 2
        )  # each model's serving batchers; /attention's are apart


def test_headroom_keeps_a_share_of_the_deadline_free():
    """At 0.8, work that fills 85 % of the deadline is refused (429 behind other work, 413
    alone), 75 % is admitted: the rest absorbs what the measured rate does not see."""
    admission = Admission(timeout_s=10.0, headroom=0.8)
    b = Stub(100)
    admission.batchers.append(b)
    with pytest.raises(PayloadTooLarge) as err:
        admission.admit(b, [850], 10.0)
    assert "80 % of the request deadline" in err.value.message
    place = admission.admit(b, [750], 10.0)
    with pytest.raises(Overloaded) as late:
        admission.admit(b, [100], 10.0)  # 7.5 s promised + 1 s > 8 s
    assert late.value.retry_after == pytest.approx(1.0)
    admission.release(place)
    b.backlog = 7.0
    admission.admit(b, [100], 10.0)  # 7 s queued + 1 s = 8 s: fits exactly


def test_a_saturated_admission_names_the_refusal_every_request_would_get():
    admission = Admission(timeout_s=10.0, headroom=0.8)
    b = Stub(100)
    admission.batchers.append(b)
    assert admission.saturated() is None
    b.backlog = 7.9  # room for 0.1 s more
    assert admission.saturated() is None
    b.backlog = 9.5
    refusal = admission.saturated()
    assert isinstance(refusal, Overloaded) and refusal.retry_after == pytest.approx(1.5)
    assert "past 80 % of the request deadline of 10 s" in refusal.message


def test_a_saturated_server_refuses_model_work_before_reading_the_body():
    """With the work ahead already filling what admission plans to fill, a request for the
    batchers is answered 429 with Retry-After before its body is read (a malformed one too:
    it is never parsed); tokenising, which runs no model, and liveness are answered; once the
    work has run, requests are served again."""
    backend = FakeBackend(fake_manifest("fake"))
    with client_for(
        Path("fake"), fake_loader(backend), capacity_tokens_per_s=50, request_timeout_s=1.0
    ) as c:
        registry = c.app.state.registry
        admission = registry.models["fake"].admission
        busy = Stub(100, backlog_s=0.9)  # a batcher with more work ahead than 80 % of 1 s
        admission.batchers.append(busy)
        bad = c.post("/encode", content=b"{not json", headers={"content-type": "application/json"})
        assert bad.status_code == 429 and float(bad.headers["retry-after"]) >= 1
        assert "nothing more is admitted" in bad.json()["error"]["message"]
        assert c.post("/v1/embeddings", json={"input": "the cat"}).status_code == 429
        assert c.post("/tokenize", json={"inputs": "the cat"}).status_code == 200
        assert c.get("/health").status_code == 200
        busy.backlog = 0.0  # run
        assert c.post("/encode", json={"inputs": "the cat"}).status_code == 200
        assert c.post(
            "/encode", content=b"{not json", headers={"content-type": "application/json"}
        ).status_code in (400, 422)
