"""DynamicBatcher: budget, size, deadline, grouping, splitting, overload, failures, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from service.batcher import BatchPolicy, DynamicBatcher, Item, select_batch
from service.errors import InferenceFailed, Overloaded, Unavailable


class Recorder:
    """A fake backend: each row's result is the sum of its ids; records every batch's shape."""

    def __init__(self, delay: float = 0.0, fail_on: int | None = None) -> None:
        self.batches: list[tuple[int, int]] = []
        self.rows: list[list[int]] = []
        self.delay = delay
        self.fail_on = fail_on
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.gate.wait(5)
        self.batches.append(ids.shape)
        self.rows.extend(int(m.sum()) for m in mask)
        if self.fail_on is not None and len(self.batches) == self.fail_on:
            raise RuntimeError("boom: secret internals")
        time.sleep(self.delay)
        return (ids * mask).sum(1)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def seqs(*lengths: int, start: int = 1) -> list[list[int]]:
    return [[start + i] * n for i, n in enumerate(lengths)]


async def started(recorder: Recorder, **policy) -> DynamicBatcher:
    b = DynamicBatcher(recorder, BatchPolicy(**policy))
    b.start()
    return b


def test_results_go_back_to_their_own_callers_in_order():
    async def main():
        rec = Recorder()
        b = await started(rec, max_wait_s=0.0)
        items = b.submit(seqs(3, 1, 4, 2), 5)
        results = await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return results

    assert [int(r) for r in run(main())] == [3, 2, 12, 8]


def test_token_budget_closes_a_batch():
    async def main():
        rec = Recorder()
        rec.gate.clear()
        b = await started(rec, max_batch_tokens=40, max_wait_s=0.0, max_padding_ratio=1.0)
        first = b.submit(seqs(10), 5)  # runs alone, blocked on the gate
        await asyncio.sleep(0.05)
        rest = b.submit(seqs(*[10] * 8), 5)
        rec.gate.set()
        await asyncio.gather(*(it.future for it in first + rest))
        await b.stop()
        return rec.batches

    batches = run(main())
    assert batches[0] == (1, 10)
    assert all(n * length <= 40 for n, length in batches)
    assert [n for n, _ in batches[1:]] == [4, 4]


def test_max_batch_size_closes_a_batch():
    async def main():
        rec = Recorder()
        rec.gate.clear()
        b = await started(rec, max_batch_size=3, max_wait_s=0.0)
        items = b.submit(seqs(*[5] * 7), 5)
        rec.gate.set()
        await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return rec.batches

    assert [n for n, _ in run(main())] == [3, 3, 1]


def test_waits_up_to_max_wait_only_while_texts_are_arriving():
    async def main():
        rec = Recorder()
        b = await started(rec, max_wait_s=0.2)
        t0 = time.monotonic()
        await b.submit(seqs(3), 5)[0].future
        idle = time.monotonic() - t0  # nobody else coming: no wait
        b.arriving = 1
        t0 = time.monotonic()
        await b.submit(seqs(3), 5)[0].future
        waited = time.monotonic() - t0
        b.arriving = 0
        await b.stop()
        return idle, waited

    idle, waited = run(main())
    assert idle < 0.15
    assert waited >= 0.19


def test_a_late_arrival_joins_the_waiting_batch():
    async def main():
        rec = Recorder()
        b = await started(rec, max_wait_s=0.5)
        b.arriving = 1
        first = b.submit(seqs(4), 5)
        await asyncio.sleep(0.05)
        second = b.submit(seqs(4, start=9), 5)
        b.arriving = 0
        await asyncio.gather(*(it.future for it in first + second))
        await b.stop()
        return rec.batches

    assert run(main()) == [(2, 4)]


def test_similar_lengths_are_grouped_to_limit_padding():
    q = [Item([1] * n, None, 0.0, 1e9) for n in (5, 50, 6, 52, 5, 49)]
    batch = select_batch(q, BatchPolicy(max_padding_ratio=0.1))
    assert sorted(it.length for it in batch) == [5, 5, 6]  # the oldest (5) and its neighbours


def test_oldest_text_is_always_in_the_next_batch():
    q = [Item([1] * n, None, float(i), 1e9) for i, n in enumerate((40, 5, 5, 5, 5))]
    batch = select_batch(q, BatchPolicy(max_padding_ratio=0.1))
    assert q[0] in batch


def test_a_large_request_is_split_across_batches_and_reassembled():
    async def main():
        rec = Recorder()
        rec.gate.clear()
        b = await started(rec, max_batch_size=4, max_wait_s=0.0, max_padding_ratio=1.0)
        sequences = seqs(*range(1, 12))
        items = b.submit(sequences, 5)
        rec.gate.set()
        out = await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return sequences, out, rec.batches

    sequences, out, batches = run(main())
    assert len(batches) >= 3
    assert [int(o) for o in out] == [sum(s) for s in sequences]


def test_full_queue_refuses_at_once_and_keeps_what_it_had():
    async def main():
        rec = Recorder()
        rec.gate.clear()
        b = await started(rec, max_queue=4, max_wait_s=0.0)
        running = b.submit(seqs(2), 5)
        await asyncio.sleep(0.05)  # that one is now in the (blocked) backend
        queued = b.submit(seqs(2, 2, 2), 5)
        with pytest.raises(Overloaded) as err:
            b.submit(seqs(2, 2), 5)
        assert err.value.retry_after and err.value.status == 429
        assert b.depth == 3
        rec.gate.set()
        await asyncio.gather(*(it.future for it in running + queued))
        await b.stop()

    run(main())


def test_a_failed_batch_fails_all_its_requests_and_the_worker_carries_on():
    async def main():
        rec = Recorder(fail_on=1)
        rec.gate.clear()
        b = await started(rec, max_wait_s=0.0, max_padding_ratio=1.0)
        doomed = b.submit(seqs(3, 3, 3), 5)
        rec.gate.set()
        errors = await asyncio.gather(*(it.future for it in doomed), return_exceptions=True)
        later = await b.submit(seqs(2), 5)[0].future
        await b.stop()
        return errors, later

    errors, later = run(main())
    assert all(isinstance(e, InferenceFailed) for e in errors)
    assert int(later) == 2


def test_cancelled_texts_cost_no_compute():
    async def main():
        rec = Recorder()
        rec.gate.clear()
        b = await started(rec, max_wait_s=0.0)
        blocker = b.submit(seqs(1), 5)
        await asyncio.sleep(0.05)
        gone = b.submit(seqs(7, 7), 5)
        kept = b.submit(seqs(3), 5)
        for it in gone:
            it.future.cancel()
        rec.gate.set()
        await asyncio.gather(*(it.future for it in blocker + kept))
        await b.stop()
        return rec.rows

    assert 7 not in run(main())


def test_texts_past_their_deadline_are_answered_unavailable():
    async def main():
        rec = Recorder()
        rec.gate.clear()
        b = await started(rec, max_wait_s=0.0)
        blocker = b.submit(seqs(1), 5)
        await asyncio.sleep(0.05)
        late = b.submit(seqs(2), 0.01)
        await asyncio.sleep(0.05)
        rec.gate.set()
        await blocker[0].future
        with pytest.raises(Unavailable, match="deadline"):
            await late[0].future
        await b.stop()
        return rec.rows

    assert run(main()) == [1]


def test_stop_finishes_accepted_work_then_refuses_new():
    async def main():
        rec = Recorder(delay=0.02)
        b = await started(rec, max_batch_size=2, max_wait_s=0.0)
        items = b.submit(seqs(2, 2, 2, 2, 2), 5)
        await b.stop()
        assert all(it.future.done() and not it.future.exception() for it in items)
        with pytest.raises(Unavailable, match="shutting down"):
            b.submit(seqs(1), 5)

    run(main())
