"""DynamicBatcher: budget, size, deadline, grouping, splitting, overload, failures, cancellation,
and a queue-depth gauge that is true on every path. Tests wait on events, never on time."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from service.engine.batch_policy import BatchPolicy, Item, select_batch
from service.engine.batcher import DynamicBatcher
from service.engine.cost import CostModel, Sample
from service.errors import InferenceFailed, Overloaded, Unavailable
from service.tensors import Batch


class Recorder:
    """A fake backend: each row's result is the sum of its ids; records every batch's shape.

    `entered` is set when a batch reaches it; it waits there until `gate` is set.
    """

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[tuple[int, int]] = []
        self.rows: list[int] = []
        self.fail_on = fail_on
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, batch: Batch):
        self.entered.set()
        assert self.gate.wait(10)
        self.batches.append(batch.input_ids.shape)
        self.rows.extend(int(m.sum()) for m in batch.attention_mask)
        if self.fail_on is not None and len(self.batches) == self.fail_on:
            raise RuntimeError("boom: secret internals")
        return (batch.input_ids * batch.attention_mask).sum(1)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 10), "no batch reached the backend"


class Depths:
    """A batch observer that records every queue depth the batcher reports."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def batch(self, size, padded, real, seconds) -> None:
        pass

    def queue_depth(self, texts: int) -> None:
        self.seen.append(texts)

    def rejected(self, reason: str) -> None:
        pass

    def capacity(self, cost, policy) -> None:
        pass

    def predicted(self, predicted_s: float, actual_s: float, pace: float) -> None:
        pass

    @property
    def last(self) -> int:
        return self.seen[-1]


def soon(seconds: float) -> float:
    """A deadline this many seconds from now (negative: already passed)."""
    return time.monotonic() + seconds


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def seqs(*lengths: int, start: int = 1) -> list[list[int]]:
    return [[start + i] * n for i, n in enumerate(lengths)]


async def started(recorder: Recorder, observer=None, cost=None, **policy) -> DynamicBatcher:
    """cost: the batcher's CostModel (default: not measured yet)."""
    b = DynamicBatcher(recorder, BatchPolicy(**policy), observer, cost=cost)
    b.start()
    return b


async def held(rec: Recorder, b: DynamicBatcher) -> list[Item]:
    """One text sent and held in the backend: everything submitted next waits in the queue."""
    rec.gate.clear()
    rec.entered.clear()
    blocker = b.submit(seqs(1), soon(5))
    await rec.wait_entered()
    return blocker


def test_results_go_back_to_their_own_callers_in_order():
    async def main():
        rec = Recorder()
        b = await started(rec, max_wait_s=0.0)
        items = b.submit(seqs(3, 1, 4, 2), soon(5))
        results = await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return results

    assert [int(r) for r in run(main())] == [3, 2, 12, 8]


def test_token_budget_closes_a_batch():
    async def main():
        rec = Recorder()
        b = await started(rec, max_batch_tokens=40, max_wait_s=0.0, max_padding_ratio=1.0)
        first = await held(rec, b)
        rest = b.submit(seqs(*[10] * 8), soon(5))
        rec.gate.set()
        await asyncio.gather(*(it.future for it in first + rest))
        await b.stop()
        return rec.batches

    batches = run(main())
    assert batches[0] == (1, 1)
    assert all(n * length <= 40 for n, length in batches)
    assert [n for n, _ in batches[1:]] == [4, 4]


def test_max_batch_size_closes_a_batch():
    async def main():
        rec = Recorder()
        b = await started(rec, max_batch_size=3, max_wait_s=0.0)
        first = await held(rec, b)
        items = b.submit(seqs(*[5] * 7), soon(5))
        rec.gate.set()
        await asyncio.gather(*(it.future for it in first + items))
        await b.stop()
        return rec.batches

    assert [n for n, _ in run(main())] == [1, 3, 3, 1]


def test_an_idle_batcher_runs_a_lone_text_without_waiting_for_company():
    async def main():
        rec = Recorder()
        b = await started(rec, max_wait_s=3600)  # would never finish if it waited
        result = await b.submit(seqs(3), soon(5))[0].future
        await b.stop()
        return int(result)

    assert run(main()) == 3


def test_a_text_arriving_while_others_are_tokenised_waits_for_them_and_they_share_a_batch():
    async def main():
        rec = Recorder()
        b = await started(rec, max_wait_s=3600)
        b.arriving = 1  # another request is being tokenised
        first = b.submit(seqs(4), soon(5))
        for _ in range(5):  # let the worker run: it must keep waiting
            await asyncio.sleep(0)
        assert not rec.entered.is_set()
        b.arriving = 0  # the other request is submitted as its tokenisation ends
        second = b.submit(seqs(4, start=9), soon(5))
        await asyncio.gather(*(it.future for it in first + second))
        await b.stop()
        return rec.batches

    assert run(main()) == [(2, 4)]


def test_the_wait_for_company_ends_at_max_wait():
    async def main():
        rec = Recorder()
        b = await started(rec, max_wait_s=0.01)
        b.arriving = 1  # nobody ever comes
        result = await b.submit(seqs(2), soon(5))[0].future
        await b.stop()
        return int(result)

    assert run(main()) == 2


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
        b = await started(rec, max_batch_size=4, max_wait_s=0.0, max_padding_ratio=1.0)
        first = await held(rec, b)
        sequences = seqs(*range(1, 12))
        items = b.submit(sequences, soon(5))
        rec.gate.set()
        out = await asyncio.gather(*(it.future for it in items))
        await first[0].future
        await b.stop()
        return sequences, out, rec.batches

    sequences, out, batches = run(main())
    assert len(batches) >= 4
    assert [int(o) for o in out] == [sum(s) for s in sequences]


def test_token_types_travel_with_their_texts():
    seen = []

    def infer(batch: Batch):
        seen.extend(zip(batch.input_ids.tolist(), batch.token_type_ids.tolist(), strict=True))
        return list(range(len(batch)))

    async def main():
        b = DynamicBatcher(infer, BatchPolicy(max_wait_s=0.0))
        b.start()
        items = b.submit([[5, 6, 7], [8, 9]], soon(5), types=[[0, 1, 1], [0, 0]])
        await asyncio.gather(*(it.future for it in items))
        await b.stop()

    run(main())
    assert sorted(seen) == [([5, 6, 7], [0, 1, 1]), ([8, 9, 0], [0, 0, 0])]


def test_full_queue_refuses_at_once_and_keeps_what_it_had():
    async def main():
        rec = Recorder()
        b = await started(rec, max_queue=4, max_wait_s=0.0)
        running = await held(rec, b)
        queued = b.submit(seqs(2, 2, 2), soon(5))
        with pytest.raises(Overloaded) as err:
            b.submit(seqs(2, 2), soon(5))
        assert err.value.retry_after and err.value.status == 429
        assert b.depth == 3
        rec.gate.set()
        await asyncio.gather(*(it.future for it in running + queued))
        await b.stop()

    run(main())


def test_a_failed_batch_fails_all_its_requests_and_the_worker_carries_on():
    async def main():
        rec = Recorder(fail_on=1)
        b = await started(rec, max_wait_s=0.0, max_padding_ratio=1.0)
        doomed = b.submit(seqs(3, 3, 3), soon(5))
        errors = await asyncio.gather(*(it.future for it in doomed), return_exceptions=True)
        later = await b.submit(seqs(2), soon(5))[0].future
        await b.stop()
        return errors, later

    errors, later = run(main())
    assert all(isinstance(e, InferenceFailed) for e in errors)
    assert int(later) == 2


def test_cancelled_texts_cost_no_compute():
    async def main():
        rec = Recorder()
        b = await started(rec, max_wait_s=0.0)
        blocker = await held(rec, b)
        gone = b.submit(seqs(7, 7), soon(5))
        kept = b.submit(seqs(3), soon(5))
        for it in gone:
            it.future.cancel()
        rec.gate.set()
        await asyncio.gather(*(it.future for it in blocker + kept))
        await b.stop()
        return rec.rows

    assert 7 not in run(main())


def test_texts_past_their_deadline_are_answered_unavailable_not_computed():
    async def main():
        rec = Recorder()
        b = await started(rec, max_wait_s=0.0)
        blocker = await held(rec, b)
        late = b.submit(seqs(2), soon(-1.0))  # its deadline has already passed
        rec.gate.set()
        await blocker[0].future
        with pytest.raises(Unavailable, match="deadline"):
            await late[0].future
        await b.stop()
        return rec.rows

    assert run(main()) == [1]


def test_stop_finishes_accepted_work_then_refuses_new():
    async def main():
        rec = Recorder()
        b = await started(rec, max_batch_size=2, max_wait_s=0.0)
        items = b.submit(seqs(2, 2, 2, 2, 2), soon(5))
        await b.stop()
        assert all(it.future.done() and not it.future.exception() for it in items)
        with pytest.raises(Unavailable, match="shutting down"):
            b.submit(seqs(1), soon(5))

    run(main())


# The queue-depth gauge (autoscalers scale on it) is updated on every path that changes it.


def test_depth_counts_texts_on_enqueue_and_drops_when_a_batch_is_taken():
    async def main():
        rec, depths = Recorder(), Depths()
        b = await started(rec, depths, max_wait_s=0.0, max_batch_size=2)
        blocker = await held(rec, b)
        assert depths.last == 0  # the blocker left the queue for the backend
        queued = b.submit(seqs(2, 2, 2), soon(5))
        assert depths.last == 3
        rec.gate.set()
        await asyncio.gather(*(it.future for it in blocker + queued))
        await b.stop()
        return depths

    assert run(main()).last == 0


def test_depth_drops_at_once_when_queued_texts_are_cancelled():
    async def main():
        rec, depths = Recorder(), Depths()
        b = await started(rec, depths, max_wait_s=0.0)
        blocker = await held(rec, b)
        gone = b.submit(seqs(4, 4, 4), soon(5))
        assert depths.last == 3
        for it in gone:
            it.future.cancel()
        for _ in range(2):  # loop ticks, not time: the done-callbacks, then the prune they schedule
            await asyncio.sleep(0)
        depth_while_backend_busy = depths.last
        rec.gate.set()
        await blocker[0].future
        await b.stop()
        return depth_while_backend_busy

    assert run(main()) == 0


def test_depth_drops_when_queued_texts_expire():
    async def main():
        rec, depths = Recorder(), Depths()
        b = await started(rec, depths, max_wait_s=0.0)
        blocker = await held(rec, b)
        late = b.submit(seqs(2, 2), soon(-1.0))
        assert depths.last == 2
        rec.gate.set()
        await blocker[0].future
        await asyncio.gather(*(it.future for it in late), return_exceptions=True)
        await b.stop()
        return depths.last

    assert run(main()) == 0


def test_depth_is_zero_after_a_drain_on_shutdown():
    async def main():
        rec, depths = Recorder(), Depths()
        b = await started(rec, depths, max_wait_s=0.0, max_batch_size=1)
        items = b.submit(seqs(1, 1, 1, 1), soon(5))
        await b.stop()
        assert all(it.future.done() for it in items)
        return depths.last

    assert run(main()) == 0


class Threads:
    """An infer that records which thread ran each batch."""

    def __init__(self) -> None:
        self.ran_on: list[threading.Thread] = []

    def __call__(self, batch: Batch):
        self.ran_on.append(threading.current_thread())
        return batch.input_ids.sum(1)


def test_a_small_batch_on_an_idle_batcher_runs_on_the_event_loop():
    async def go():
        infer = Threads()
        b = DynamicBatcher(infer, BatchPolicy(inline_max_tokens=8))
        b.start()
        (item,) = b.submit(seqs(3), soon(5))
        assert await item.future == 3
        await b.stop()
        return infer.ran_on

    assert run(go()) == [threading.current_thread()]


async def enqueue(b: DynamicBatcher, sequences: list[list[int]], deadline: float) -> list[Item]:
    """What the pipelines do: one turn when the request could run alone, then submit."""
    await b.yield_if_alone(sequences)
    return b.submit(sequences, deadline, at_once=True)


def test_a_small_request_alone_is_computed_by_submit_itself():
    """No turn of the loop to the worker and back: its futures are done when enqueue returns,
    and the worker never woke (its batch counted, the queue never held it)."""

    async def go():
        infer, depths = Threads(), Depths()
        b = DynamicBatcher(infer, BatchPolicy(inline_max_tokens=8), depths)
        b.start()
        items = await enqueue(b, seqs(3), soon(5))
        done = [it.future.done() for it in items]
        await b.stop()
        return done, items[0].future.result(), infer.ran_on, depths.seen, b.batches

    done, result, ran_on, depths, batches = run(go())
    assert done == [True] and result == 3 and batches == 1
    assert ran_on == [threading.current_thread()]
    assert depths == []  # never queued


@pytest.mark.parametrize(
    ("lengths", "why"), [((9,), "over inline_max_tokens"), ((3, 3, 3), "3 x 3 padded > 8")]
)
def test_a_request_too_large_to_run_inline_is_queued(lengths, why):
    async def go():
        infer = Threads()
        b = DynamicBatcher(infer, BatchPolicy(inline_max_tokens=8))
        b.start()
        items = await enqueue(b, seqs(*lengths), soon(5))
        done = any(it.future.done() for it in items)
        await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return done, infer.ran_on

    done, (thread,) = run(go())
    assert not done, why
    assert thread is not threading.current_thread(), why


def test_requests_read_together_share_a_batch_though_each_alone_would_run_at_once():
    """A burst read in one turn of the loop (each request's handler reaching enqueue before
    the others') is batched, not computed one request at a time: the first lets the loop turn
    once, announced as arriving, so the others queue; it then queues behind them."""

    async def go():
        rec = Recorder()
        b = await started(rec, inline_max_tokens=64)
        got = await asyncio.gather(*(enqueue(b, seqs(3, start=k), soon(5)) for k in range(4)))
        results = await asyncio.gather(*(items[0].future for items in got))
        await b.stop()
        return rec.batches, results

    batches, results = run(go())
    assert batches == [(4, 3)]
    assert results == [3 * k for k in range(4)]


@pytest.mark.parametrize("concurrency", [1, 2])
@pytest.mark.parametrize("inline_max_tokens", [0, 8])
def test_every_thread_that_will_call_the_session_runs_it_before_ready(
    inline_max_tokens, concurrency
):
    """ONNX Runtime's first runs on a thread new to a session took 3x the steady time, and
    OpenVINO warms a new thread's infer request at every short length (0.4 s on 2 cores): the
    loop's thread, which runs small batches inline, and each of `concurrency` inference threads
    (OpenVINO's streams) run it before ready; batches served later run on no other thread.
    Calibration's thread is not spun up twice."""

    async def go():
        infer = Threads()
        b = DynamicBatcher(
            infer, BatchPolicy(inline_max_tokens=inline_max_tokens, max_batch_size=1),
            concurrency=concurrency,
        )  # fmt: skip
        await b.calibrate(16, 5, 0.5)
        calibrated = len(infer.ran_on)
        await b.spin_up((1, 8), 5)
        spun = set(infer.ran_on)
        again = len(infer.ran_on)
        await b.spin_up((1, 8), 5)  # every thread has: nothing runs
        assert len(infer.ran_on) == again
        b.start()
        served = len(infer.ran_on)
        await asyncio.gather(*(it.future for it in b.submit(seqs(*[9] * 8), soon(5))))
        await b.stop()
        return (
            spun,
            set(infer.ran_on[served:]),
            infer.ran_on[0],
            set(infer.ran_on[calibrated:again]),
        )

    spun, serving, calibration, spin = run(go())
    here = threading.current_thread()
    assert (here in spun) is bool(inline_max_tokens)
    assert len(spun - {here}) == concurrency
    assert serving <= spun, "a batch ran on a thread that had not run the session"
    assert calibration not in spin, "calibration's thread was spun up again"
    assert spin | {calibration} == spun


@pytest.mark.parametrize(
    ("inline_max_tokens", "lengths", "why"),
    [(0, (3,), "inline runs off"), (8, (9,), "batch over the limit"), (8, (3, 3, 3), "3x3 > 8")],
)
def test_a_batch_runs_on_the_inference_thread_unless_small_and_alone(inline_max_tokens, lengths, why):
    async def go():
        infer = Threads()
        b = DynamicBatcher(infer, BatchPolicy(inline_max_tokens=inline_max_tokens))
        b.start()
        await asyncio.gather(*(it.future for it in b.submit(seqs(*lengths), soon(5))))
        await b.stop()
        return infer.ran_on

    (thread,) = run(go())
    assert thread is not threading.current_thread(), why


def test_a_batch_with_others_still_queued_runs_on_the_inference_thread():
    """Two texts, one per batch: the first leaves the second waiting (thread); the second is
    then alone (loop)."""

    async def go():
        infer = Threads()
        b = DynamicBatcher(infer, BatchPolicy(inline_max_tokens=8, max_batch_size=1))
        b.start()
        await asyncio.gather(*(it.future for it in b.submit(seqs(2, 2), soon(5))))
        await b.stop()
        return infer.ran_on

    first, second = run(go())
    assert first is not threading.current_thread()
    assert second is threading.current_thread()


def test_a_batch_holds_at_most_max_batch_s_of_work_at_its_cost():
    async def main():
        rec = Recorder()
        rate = CostModel(fixed_tokens_per_s=80)
        b = await started(rec, max_wait_s=0.0, max_padding_ratio=1.0, max_batch_s=0.5, cost=rate)
        items = b.submit(seqs(*[10] * 12), soon(5))  # 120 tokens: 1.5 s at 80 tokens/s
        await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return rec.batches

    batches = run(main())
    # 0.5 s at a stated 80 tokens/s is 40 padded tokens.
    assert batches[0] == (4, 10), batches
    assert sum(n for n, _ in batches) == 12


def test_a_sequences_own_mask_reaches_the_backend_and_same_length_variants_share_a_batch():
    async def main():
        rec = Recorder()
        b = await started(rec, max_wait_s=0.0)
        first = await held(rec, b)
        masks = [[1, 1, 1], [0, 1, 1], [1, 0, 1], [1, 1, 0]]
        items = b.submit([[2, 3, 4]] * 4, soon(5), masks=masks)
        rec.gate.set()
        out = await asyncio.gather(*(it.future for it in first + items))
        await b.stop()
        return [int(x) for x in out[1:]], rec.batches

    sums, batches = run(main())
    assert sums == [9, 7, 6, 5]  # each variant's sum of the ids its mask keeps
    assert batches == [(1, 1), (4, 3)]  # the four variants: one batch, no padding


# Several streams (OpenVINO's): `concurrency` batches computed at once, each on its own thread.


class Streams:
    """A fake session of several streams: every batch waits at a barrier of `parties`, so the
    test passes only when that many batches are computed at the same time."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=10)
        self.threads: set[int] = set()
        self.batches = 0

    def __call__(self, batch: Batch):
        self.threads.add(threading.get_ident())
        self.batches += 1
        self.barrier.wait()  # BrokenBarrierError (a failed batch) unless `parties` run at once
        return (batch.input_ids * batch.attention_mask).sum(1)


def test_a_batcher_of_two_streams_computes_two_batches_at_once_on_two_threads():
    async def main():
        infer = Streams(2)
        b = DynamicBatcher(infer, BatchPolicy(max_batch_size=1, max_wait_s=0.0), concurrency=2)
        b.start()
        items = b.submit(seqs(3, 3, 3, 3), soon(5))
        results = await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return infer, results

    infer, results = run(main())
    assert [int(r) for r in results] == [3, 6, 9, 12]  # each its own caller's
    assert infer.batches == 4 and len(infer.threads) == 2


def test_one_stream_computes_one_batch_at_a_time():
    """The same fake with one stream: the second batch never starts beside the first, so the
    barrier of two breaks and the batch fails (the worker carries on)."""

    async def main():
        infer = Streams(2)
        infer.barrier = threading.Barrier(2, timeout=0.5)
        b = DynamicBatcher(infer, BatchPolicy(max_batch_size=1, max_wait_s=0.0))
        b.start()
        items = b.submit(seqs(3, 3), soon(5))
        await asyncio.gather(*(it.future for it in items), return_exceptions=True)
        await b.stop()
        return items

    items = run(main())
    assert all(isinstance(it.future.exception(), InferenceFailed) for it in items)


def test_no_more_batches_run_at_once_than_the_streams():
    async def main():
        rec = Recorder()
        rec.gate.clear()  # every batch that reaches the backend is held there
        b = DynamicBatcher(rec, BatchPolicy(max_batch_size=1, max_wait_s=0.0), concurrency=2)
        b.start()
        items = b.submit(seqs(2, 2, 2), soon(5))
        await rec.wait_entered()
        for _ in range(20):  # the loop's turns: a third batch would be taken now
            await asyncio.sleep(0)
        taken = b.depth
        rec.gate.set()
        await asyncio.gather(*(it.future for it in items))
        await b.stop()
        return taken

    assert run(main()) == 1  # two batches taken (running), the third still queued


def test_stop_waits_for_every_stream_s_batch():
    async def main():
        infer = Streams(2)
        b = DynamicBatcher(infer, BatchPolicy(max_batch_size=1, max_wait_s=0.0), concurrency=2)
        b.start()
        items = b.submit(seqs(2, 2), soon(5))
        await b.stop()
        return items

    assert all(it.future.done() and not it.future.exception() for it in run(main()))


def test_predictions_on_streams_stay_one_batch_after_another():
    """A stated rate of 100 tokens/s: a 10-token batch costs 0.1 s. Four batches cost 0.4 s on
    two streams as on one (two at once drain faster, by how much the cores decide: admission
    keeps to the safe side), and the backlog counts each running batch's own remaining time."""

    async def main():
        rate = CostModel(fixed_tokens_per_s=100)
        policy = BatchPolicy(max_batch_size=1, max_wait_s=0.0)
        one = DynamicBatcher(Recorder(), policy, cost=rate)
        rec = Recorder()
        rec.gate.clear()
        two = DynamicBatcher(rec, policy, cost=rate, concurrency=2)
        two.start()
        items = two.submit(seqs(10, 10, 10), soon(5))
        await rec.wait_entered()
        for _ in range(20):  # two batches taken, the third queued
            await asyncio.sleep(0)
        backlog = two.backlog_s()
        rec.gate.set()
        await asyncio.gather(*(it.future for it in items))
        await two.stop()
        return one.predict([10] * 4), two.predict([10] * 4), backlog

    one, two, backlog = run(main())
    assert one == pytest.approx(0.4) and two == pytest.approx(0.4)
    assert 0.2 < backlog <= 0.3  # the queued 0.1 s and what is left of the two running


class Lone:
    """A session of two streams with a lone compile: records, per batch, whether it ran alone
    (engine/alone.py) and how many batches were running when it began."""

    def __init__(self, hold_s: float = 0.05) -> None:
        self.hold_s = hold_s
        self.lock = threading.Lock()
        self.running = 0
        self.seen: list[tuple[bool, int]] = []  # (alone, batches running beside it)

    def __call__(self, batch: Batch):
        from service.engine.alone import ALONE

        with self.lock:
            self.seen.append((ALONE.get(), self.running))
            self.running += 1
        time.sleep(self.hold_s)
        with self.lock:
            self.running -= 1
        return (batch.input_ids * batch.attention_mask).sum(1)


def test_on_streams_a_batch_alone_runs_with_every_thread_and_the_next_waits_for_it():
    """Two streams with a lone compile: a batch formed with nothing queued behind it and
    nothing running runs alone (every thread), and a batch queued while it runs waits for it
    rather than start beside it (three threads on two cores); batches queued together run on
    the streams, two at once. Without lone, nothing runs alone and the two overlap."""

    async def main(lone: bool):
        infer = Lone()
        policy = BatchPolicy(max_batch_size=1, max_wait_s=0.0)  # inline_max_tokens 0: no loop
        b = DynamicBatcher(infer, policy, concurrency=2, lone=lone)
        b.start()
        first = b.submit(seqs(3), soon(5))
        await asyncio.sleep(0.01)  # the first is running alone
        second = b.submit(seqs(3), soon(5))
        await asyncio.gather(*(it.future for it in first + second))
        together = b.submit(seqs(3, 3), soon(5))  # queued at once: the streams' work
        results = await asyncio.gather(*(it.future for it in together))
        await b.stop()
        return infer.seen, [int(r) for r in results]

    seen, results = run(main(True))
    assert results == [3, 6]
    assert seen[:2] == [(True, 0), (True, 0)]  # the second waited, then ran alone too
    assert sorted(seen[2:]) == [(False, 0), (False, 1)]  # together: two at once, on streams
    seen, _ = run(main(False))
    assert [a for a, _ in seen] == [False] * 4 and seen[1] == (False, 1)  # overlapped


def test_calibration_on_streams_times_the_batches_alone():
    """Its thread spun up on the streams' runs first (it serves them too), then every timed
    batch alone."""

    async def main():
        infer = Lone(hold_s=0.0)
        b = DynamicBatcher(infer, BatchPolicy(max_batch_size=4), concurrency=2, lone=True)
        b.start()
        await b.calibrate(16, 5, budget_s=5.0)
        await b.stop()
        return infer.seen

    flags = [alone for alone, _ in run(main())]
    spun = flags.index(True)
    assert spun > 0 and not any(flags[:spun]) and all(flags[spun:]) and len(flags) > spun


def test_on_streams_a_batch_is_not_alone_while_a_request_is_on_its_way():
    """A request being read (arriving) would be held by a lone batch: the batch runs on a
    stream, and the arriving request's batch starts beside it."""

    async def main():
        infer = Lone()
        b = DynamicBatcher(
            infer, BatchPolicy(max_batch_size=1, max_wait_s=0.0), concurrency=2, lone=True
        )
        b.start()
        b.arriving += 1  # a request is being tokenised
        first = b.submit(seqs(3), soon(5))
        await asyncio.sleep(0.01)  # the first is running
        b.arriving -= 1
        second = b.submit(seqs(3), soon(5))
        await asyncio.gather(*(it.future for it in first + second))
        await b.stop()
        return infer.seen

    assert run(main()) == [(False, 0), (False, 1)]  # on streams, the second beside the first


class Starts(Recorder):
    """A Recorder that notes when each batch began (on its thread's clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: list[float] = []

    def __call__(self, batch: Batch):
        self.starts.append(time.monotonic())
        return super().__call__(batch)


def measured(per_token_s: float = 0.001) -> CostModel:
    cost = CostModel()
    cost.calibrate([Sample(r, n, per_token_s * r * n) for r in (1, 4) for n in (8, 40)])
    return cost


async def staged(deadline_s: float) -> tuple[Starts, DynamicBatcher, list[Item], list[Item]]:
    """A measured batcher with a blocker held in the backend and a text queued behind it (its
    deadline `deadline_s` away), once that text was handed to the inference thread."""
    rec = Starts()
    b = await started(rec, cost=measured(), max_wait_s=0.0)
    blocker = await held(rec, b)
    behind = b.submit(seqs(3), soon(deadline_s))
    for _ in range(1000):
        if not b.depth:
            return rec, b, blocker, behind
        await asyncio.sleep(0.001)
    raise AssertionError("the queued text was never handed to the thread")


def test_one_stream_hands_the_next_batch_over_and_it_starts_while_the_loop_is_busy():
    """With the cost measured, the batch behind the one computing is formed before that one
    ends (here at once: the blocker already ran past its predicted 1 ms) and waits on the
    thread: it starts as the first ends, while the event loop is still busy elsewhere."""

    async def main():
        rec, b, blocker, behind = await staged(5)
        rec.gate.set()
        time.sleep(0.3)  # the loop busy (a long callback): nothing it does starts a batch
        loop_back = time.monotonic()
        results = await asyncio.gather(*(it.future for it in blocker + behind))
        await b.stop()
        return rec.starts, loop_back, results

    starts, loop_back, results = run(main())
    assert [int(r) for r in results] == [1, 3]
    assert len(starts) == 2 and starts[1] < loop_back


def test_unmeasured_one_stream_forms_the_next_batch_once_the_running_one_ends():
    async def main():
        rec = Starts()
        b = await started(rec, max_wait_s=0.0)  # nothing measured: no predicted end
        blocker = await held(rec, b)
        behind = b.submit(seqs(3), soon(5))
        for _ in range(20):
            await asyncio.sleep(0.001)
        depth = b.depth
        rec.gate.set()
        time.sleep(0.1)
        loop_back = time.monotonic()
        await asyncio.gather(*(it.future for it in blocker + behind))
        await b.stop()
        return depth, rec.starts, loop_back

    depth, starts, loop_back = run(main())
    assert depth == 1  # still queued while the first computed
    assert starts[1] > loop_back  # formed by the loop after it ended


def test_a_staged_text_past_its_deadline_before_its_batch_began_is_not_computed():
    async def main():
        rec, b, blocker, behind = await staged(0.05)
        await asyncio.sleep(0.1)  # its deadline passes while it waits on the thread
        rec.gate.set()
        await asyncio.gather(*(it.future for it in blocker))
        with pytest.raises(Unavailable, match="deadline"):
            await behind[0].future
        await b.stop()
        return rec.batches

    assert run(main()) == [(1, 1)]  # the blocker's only
