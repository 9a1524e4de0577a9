"""A batch's cost, measured: the fit, the calibration that feeds it, the batches that refine it,
and what the server shows of it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from service.engine.batch_policy import BatchPolicy
from service.engine.batcher import DynamicBatcher
from service.engine.calibrate import measure, shapes
from service.engine.cost import MIN_REFIT_GAP_S, REFIT, CostModel, Device, Fit, Sample, fit
from tests.service.engine.test_batcher import Recorder, held, run, seqs, soon, started

RESULTS = Path(__file__).resolve().parents[3] / "bench/results"
RECORDED = RESULTS / "calibration.json"  # AVX2, 2026-12-03
RECORDINGS = [RECORDED, RESULTS / "calibration-bf16.json"]  # and a Zen 4 with bf16, 2026-12-04
TRUE = Fit(0.002, 2e-4, 3e-7)


def samples_of(f: Fit, plan) -> list[Sample]:
    return [Sample(r, n, f.seconds(r, n)) for r, n in plan]


def test_the_fit_recovers_a_batchs_fixed_token_and_length_costs():
    got = fit(samples_of(TRUE, shapes(512, 64)))
    assert got.batch_s == pytest.approx(TRUE.batch_s, rel=1e-6)
    assert got.token_s == pytest.approx(TRUE.token_s, rel=1e-6)
    assert got.pair_s == pytest.approx(TRUE.pair_s, rel=1e-6)


def test_the_fit_never_has_a_negative_cost():
    """Noisy short runs would pull an unconstrained fixed cost below zero."""
    noisy = [Sample(1, n, 1e-4 * n * (1.3 if n < 32 else 1.0)) for n in (8, 16, 32, 64, 128)]
    got = fit(noisy)
    assert min(got.batch_s, got.token_s, got.pair_s) >= 0
    assert all(got.seconds(s.rows, s.n) > 0 for s in noisy)


def test_unmeasured_costs_nothing_and_refuses_nothing_until_calibrated():
    cost = CostModel()
    assert not cost.measured and cost.seconds(64, 256) == 0.0
    cost.calibrate(samples_of(TRUE, shapes(256, 64)), 1.5)
    assert cost.measured and cost.source == "measured"
    assert cost.seconds(64, 256) == pytest.approx(TRUE.seconds(64, 256), rel=1e-6)
    assert cost.describe()["calibration_s"] == 1.5


def test_batches_served_refine_the_fit_toward_what_they_take(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("service.engine.cost.time.monotonic", lambda: clock[0])
    cost = CostModel()
    cost.calibrate(samples_of(TRUE, shapes(256, 64)))
    slower = Fit(TRUE.batch_s * 2, TRUE.token_s * 2, TRUE.pair_s * 2)
    for _ in range(64):
        for rows, n in ((8, 32), (32, 64), (1, 128)):
            clock[0] += MIN_REFIT_GAP_S / 4  # a batch every quarter of the gap
            cost.observe(rows, n, slower.seconds(rows, n))
    for rows, n in ((8, 32), (32, 64), (1, 128)):
        assert cost.seconds(rows, n) / slower.seconds(rows, n) > 0.8  # was 0.5


def test_mispredicted_batches_refit_at_most_once_a_gap_and_deferred_refits_wait_for_the_caller(
    monkeypatch,
):
    """On a shared VM every short batch can be a quarter off: refitting on each (a few hundred
    µs) was a tenth of a short text's time over HTTP. A deferred refit is left to the caller."""
    clock = [100.0]
    monkeypatch.setattr("service.engine.cost.time.monotonic", lambda: clock[0])
    cost = CostModel()
    cost.calibrate(samples_of(TRUE, shapes(256, 64)))
    off = TRUE.seconds(1, 16) * 2  # every observation a half off
    due = [cost.observe(1, 16, off, defer=True) for _ in range(REFIT - 1)]
    assert due == [True] + [False] * (REFIT - 2)  # the first at once, the rest within the gap
    assert cost.seconds(1, 16) == pytest.approx(TRUE.seconds(1, 16), rel=1e-6)  # deferred
    cost.refit()
    assert cost.seconds(1, 16) > TRUE.seconds(1, 16) * 1.2  # what the caller's refit learned
    clock[0] += MIN_REFIT_GAP_S
    assert not cost.observe(1, 16, off)  # what it learned: no longer off, and only 7 since
    assert cost.observe(1, 16, off * 2)  # past the gap and off again: refitted, here at once


def test_well_predicted_batches_refit_every_refit_batches_but_at_most_once_a_gap(monkeypatch):
    """Under load (40 batches a second) a refit every REFIT batches emptied the prediction memo
    five times a second, and admission recomputed it shape by shape."""
    clock = [100.0]
    monkeypatch.setattr("service.engine.cost.time.monotonic", lambda: clock[0])
    cost = CostModel()
    cost.calibrate(samples_of(TRUE, shapes(256, 64)))
    right = TRUE.seconds(4, 32)
    assert [cost.observe(4, 32, right) for _ in range(REFIT)] == [False] * (REFIT - 1) + [True]
    # REFIT more within the gap: none; the next one past the gap: due at once
    assert not any(cost.observe(4, 32, right) for _ in range(REFIT))
    clock[0] += MIN_REFIT_GAP_S
    assert cost.observe(4, 32, right)
    # Past the gap but fewer than REFIT since: not due
    clock[0] += MIN_REFIT_GAP_S
    assert not cost.observe(4, 32, right)


def test_a_stated_rate_or_a_fake_backends_time_is_never_learned():
    stated = CostModel(fixed_tokens_per_s=1000)
    assert stated.seconds(2, 50) == pytest.approx(0.1) and stated.source.startswith("set")
    assert not stated.observe(2, 50, 99.0) and stated.seconds(2, 50) == pytest.approx(0.1)
    gated = CostModel(learns=False)
    assert not gated.observe(2, 50, 99.0) and not gated.measured


def test_a_run_is_its_own_only_when_nothing_else_ran_at_any_moment_of_it():
    device = Device()
    a = device.enter()
    assert device.leave(a)  # alone
    a = device.enter()
    b = device.enter()  # b starts while a runs
    assert not device.leave(a)
    c = device.enter()  # c starts while b runs
    assert not device.leave(b)
    assert not device.leave(c)
    assert device.leave(device.enter())


class Busy:
    """The device's clock, moved by the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 100.0
        monkeypatch.setattr("service.engine.cost.time.monotonic", lambda: self.now)

    def runs(self, device: Device, predicted: list[float | None], seconds: float) -> None:
        """These runs computed together for `seconds`, then a second of idleness."""
        tickets = [device.enter(p) for p in predicted]
        self.now += seconds
        for t in tickets:
            device.leave(t)
        self.now += 1.0


def test_the_pace_is_predicted_seconds_finished_over_the_seconds_some_run_computed(monkeypatch):
    """Two streams, each run predicted 0.1 s (alone) taking 0.25 s beside the other: 0.2
    predicted seconds a 0.25 s of computing, 0.8; idle seconds between count for nothing."""
    clock, device = Busy(monkeypatch), Device()
    assert device.pace == 1.0  # nothing measured: as predicted
    for _ in range(80):
        clock.runs(device, [0.1, 0.1], 0.25)
    assert device.pace == pytest.approx(0.8, abs=0.01)
    # A run with no prediction (a stated rate's, a fake backend's) is not measured.
    clock.runs(device, [None], 5.0)
    assert device.pace == pytest.approx(0.8, abs=0.01)
    # The recent seconds weigh: a slower stretch moves it down within seconds of computing.
    for _ in range(40):
        clock.runs(device, [0.25], 0.5)
    assert device.pace == pytest.approx(0.5, abs=0.03)
    # Faster than predicted: admission never counts on more than the predictions.
    for _ in range(100):
        clock.runs(device, [0.5], 0.1)
    assert device.pace == 1.0
    assert device.describe()["pace"] == 1.0


def test_overlapping_runs_count_their_union_of_seconds_not_their_sum(monkeypatch):
    clock, device = Busy(monkeypatch), Device()
    a = device.enter(0.5)
    clock.now += 0.5
    b = device.enter(0.5)  # b starts halfway through a
    clock.now += 0.5
    device.leave(a)
    clock.now += 0.5
    device.leave(b)
    figures = device.describe()  # with the prior's 0.5 s at 1, all decayed a little
    assert figures["busy_s"] == pytest.approx(0.5 + 1.5, abs=0.25)  # not 0.5 + 2
    assert figures["done_s"] == pytest.approx(0.5 + 1.0, abs=0.2)
    assert device.pace == pytest.approx(figures["done_s"] / figures["busy_s"], abs=0.002)
    assert device.pace == pytest.approx(0.75, abs=0.03)


def test_warm_ups_probe_measures_the_pace_of_every_stream_computing_at_once():
    """Two streams whose runs each take 4x their predicted 10 ms side by side (sleeping: the
    cores are not the point) work off 0.5 predicted seconds a second; the prior is dropped."""

    def slow(batch):
        time.sleep(0.04)
        return batch.input_ids.sum(1)

    async def main():
        cost = CostModel()
        cost.calibrate([Sample(r, n, 0.01) for r in (1, 8) for n in (16, 64)])  # 10 ms a batch
        b = DynamicBatcher(slow, BatchPolicy(), cost=cost, concurrency=2)
        b.device.forget()
        await b.probe(1, 0.4, threading.Barrier(2))
        stated = DynamicBatcher(slow, BatchPolicy(), cost=CostModel(fixed_tokens_per_s=1e6))
        await stated.probe(1, 0.4, threading.Barrier(1))  # a stated rate: nothing to probe
        return b.device, stated.device

    device, stated = run(main())
    assert device.pace == pytest.approx(0.5, abs=0.1)
    assert device.describe()["busy_s"] == pytest.approx(0.4, abs=0.1)  # the union, not 0.8
    assert stated.describe()["busy_s"] == 0.5 and stated.pace == 1.0  # the prior, untouched


class Clock:
    """A calibration's clock: each run advances it by the true cost of its batch."""

    def __init__(self) -> None:
        self.now = 0.0
        self.runs: list[tuple[int, int]] = []

    def __call__(self) -> float:
        return self.now

    def run(self, batch) -> None:
        rows, n = batch.input_ids.shape
        self.runs.append((rows, n))
        self.now += TRUE.seconds(rows, n)


def test_calibration_times_each_shape_and_skips_what_would_pass_its_budget():
    clock = Clock()
    plan = shapes(8192, 1)
    samples = measure(clock.run, plan, 5, budget_s=3.0, clock=clock)
    longest = max(s.n for s in samples)
    assert 512 <= longest < 8192  # (1, 8192) would take ~20 s: fitted below it, not run
    assert clock.now < 3.0 + TRUE.seconds(1, longest)
    assert all(s.seconds == pytest.approx(TRUE.seconds(s.rows, s.n)) for s in samples)
    assert fit(samples).seconds(1, 8192) == pytest.approx(TRUE.seconds(1, 8192), rel=1e-3)


def test_shapes_go_from_one_short_text_to_a_full_batch_of_the_longest():
    plan = shapes(256, 64)
    assert plan[0] == (1, 8) and (1, 256) in plan and (16, 256) in plan and (64, 8) in plan
    assert (4, 32) in plan and (16, 32) in plan  # the cost a token differs with batch size
    assert all(r * n <= 4096 or r == 1 for r, n in plan)


@pytest.mark.skipif(not RECORDED.exists(), reason="no recorded calibration (python -m bench.calibration)")
def test_a_recorded_calibration_predicts_the_batches_it_never_ran():
    """bench.calibration's record on a real machine: each session's calibration, fitted again,
    predicts its grid of other shapes (lengths 8 to the model's maximum) within 25 % at p90 (the
    goal) and 10 % at p50, for every model recorded: the default model, the ModernBERT and BERT
    shapes, a reranker, a Qwen3-shaped decoder and a bge-m3 shape, each lane. The recording of
    2026-12-03 meets it (worst p90 18.2 %); one taken during a burst of the shared VM's load may
    not (2026-12-02's: 28-33 %): docs/operations.md, Capacity."""
    recorded = json.loads(RECORDED.read_text())
    for name, model in recorded["models"].items():
        for lane, record in model["lanes"].items():
            cost = CostModel()
            cost.calibrate([Sample(*s) for s in record["calibration"]])
            errors = [abs(cost.seconds(r, n) / t - 1) for r, n, t in record["held_out"]]
            assert float(np.percentile(errors, 50)) <= 0.10, (name, lane, sorted(errors)[-5:])
            assert float(np.percentile(errors, 90)) <= 0.25, (name, lane, sorted(errors)[-5:])


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda p: p.stem)
def test_once_it_has_served_half_a_recorded_grid_it_predicts_the_other_half(recording):
    """On a shared VM a whole session's batches can run 17 % slower a minute after its
    calibration (the bf16 recording's BERT shape: p90 29.4 % from the calibration alone). The
    batches a server runs refine its cost: once every other shape of the grid has been served
    (observed as batches that ran alone), the others are predicted within 25 % at p90, every
    session of both CPUs' recordings (worst 23.3 %: a long lane of 3 predicted shapes; 21.3 % on
    bf16), and within 12 % at p50 (a long lane's 1-3 shapes 11.5 %, the rest 1-8 %)."""
    from bench.calibration import after_serving

    if not recording.exists():
        pytest.skip(f"no {recording.name} (python -m bench.calibration)")
    for name, model in json.loads(recording.read_text())["models"].items():
        for lane, record in model["lanes"].items():
            errors = after_serving(record)
            assert float(np.percentile(errors, 90)) <= 0.25, (name, lane, sorted(errors)[-5:])
            assert float(np.percentile(errors, 50)) <= 0.12, (name, lane, sorted(errors)[-5:])


def test_a_batch_that_ran_alone_refines_its_cost_and_one_beside_another_does_not():
    async def main():
        device = Device()
        one, two = Recorder(), Recorder()
        a = await started(one, max_wait_s=0.0)
        b = await started(two, max_wait_s=0.0)
        a.device = b.device = device
        await asyncio.gather(*(it.future for it in a.submit(seqs(4), soon(5))))
        alone = a.cost.served
        first = await held(one, a)  # a's batch computing ...
        beside = b.submit(seqs(4), soon(5))  # ... while b's runs
        await asyncio.gather(*(it.future for it in beside))
        one.gate.set()
        await asyncio.gather(*(it.future for it in first))
        await a.stop()
        await b.stop()
        return alone, a.cost.served, b.cost.served

    alone, a_after, b_after = run(main())
    assert alone == 1  # the first batch ran alone
    assert a_after == 1 and b_after == 0  # the two that overlapped taught nothing


def test_a_fresh_server_is_ready_only_once_measured_and_shows_its_costs(tiny_bundle, caplog):
    from tests.service.conftest import client_for

    with caplog.at_level("INFO", logger="service.registry"), client_for(tiny_bundle) as c:
        probed = [r.getMessage() for r in caplog.records if "pace under load" in r.getMessage()]
        assert len(probed) == 1  # warm-up's probe measured it before ready
        pace = float(probed[0].split(": ")[1].split()[0])
        assert c.get("/info").json()["pace"]["pace"] == pytest.approx(pace, abs=0.006)
        capacity = c.get("/info").json()["capacity"]["tiny-random"]
        encode = capacity["encode-tiny-random"]
        assert encode["source"] == "measured" and encode["calibration"]
        assert encode["longest_measured"] == 48  # the model's maximum: cheap enough to run
        assert capacity["attention-tiny-random"]["calibration"]  # its own graph, timed apart
        counted = 'headwise_batch_time_over_predicted_count{model="tiny-random",path="encode"}'
        before, device = c.get("/metrics").text, c.get("/info").json()["pace"]
        assert c.post("/encode", json={"inputs": ["the cat sat"] * 8}).status_code == 200
        metrics, after = c.get("/metrics").text, c.get("/info").json()["pace"]
    # The batches served measure how fast the device works off their predictions.
    assert after["busy_s"] > device["busy_s"] and after["done_s"] > device["done_s"]
    assert 0 < after["pace"] <= 1
    assert sample(metrics, "headwise_device_pace") == pytest.approx(after["pace"], abs=1e-3)
    for term in ("batch", "token", "token_length"):
        assert f'headwise_capacity_cost_seconds{{model="tiny-random",path="encode",term="{term}"}}' in metrics
    # Each batch's time against its prediction (the rehearsal's before ready among them).
    assert sample(metrics, counted) == sample(before, counted) + 1


def sample(metrics: str, name: str) -> float:
    """A sample's value in a /metrics text (0 when absent)."""
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def one_correction(cost: CostModel, rows: int, n: int) -> float:
    """The correction as it was computed one shape at a time: the nearest measured shapes'
    measured over fitted time, inverse-distance weighted (their mean where measured)."""
    distance = np.sqrt(((cost._points - np.log([rows, n])) ** 2).sum(axis=1))
    nearest = np.argsort(distance)[:4]
    if distance[nearest[0]] < 1e-9:
        return float(cost._ratios[distance < 1e-9].mean())
    weights = 1.0 / distance[nearest] ** 2
    return float((weights * cost._ratios[nearest]).sum() / weights.sum())


@pytest.mark.parametrize("recorded", RECORDINGS, ids=lambda p: p.stem)
def test_a_lengths_table_predicts_each_shape_as_one_at_a_time_would(recorded):
    """The predictions of every row count at a length, made in one pass (admission asks for all
    of them for each request), equal the fit times the correction of each shape on its own,
    measured shapes and ones between and past them."""
    record = json.loads(recorded.read_text())["models"]["all-MiniLM-L6-v2"]["lanes"]["main"]
    cost = CostModel()
    cost.calibrate([Sample(*s) for s in record["calibration"]])
    for r, n in [(1, 7), (3, 40), (5, 100)]:  # served shapes, one twice: their mean is used
        cost.observe(r, n, 1.3 * cost.seconds(r, n))
    cost.observe(3, 40, 1.1 * cost.seconds(3, 40))
    cost.refit()
    f = cost.current
    for n in (1, 7, 16, 40, 100, 128, 300, 2048):
        for rows in (1, 2, 3, 5, 17, 64, 65, 200):
            want = f.seconds(rows, n) * one_correction(cost, rows, n)
            assert cost.seconds(rows, n) == pytest.approx(want, rel=1e-12), (rows, n)


def test_the_rows_a_time_bound_allows_stop_at_the_first_batch_past_it():
    cost = CostModel()
    cost.calibrate(samples_of(TRUE, shapes(512, 64)))
    for n in (8, 64, 512):
        limit = cost.seconds(20, n) * 1.0001
        assert cost.rows_within(n, limit, 64) == 20
        assert cost.rows_within(n, limit, 10) == 10  # at most the batch size
        assert cost.rows_within(n, cost.seconds(1, n) / 2, 64) == 0  # one row is past it
    cost.calibrate(samples_of(Fit(0.004, 2e-4, 3e-7), shapes(512, 64)))  # a refit: anew
    assert cost.rows_within(64, cost.seconds(20, 64) * 1.0001, 64) == 20
    assert CostModel().rows_within(64, 1e-9, 64) == 64  # nothing measured: no bound
