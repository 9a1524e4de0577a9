"""DynamicBatcher: many small requests become few large, length-grouped batches.

A batch closes when its padded tokens (longest x count) would pass the token budget, when it
holds max_batch_size texts, or when the oldest waiting text has waited max_wait (whichever is
first). The wait is only spent while more texts are on their way (being tokenised); an idle
server runs a lone request at once. The oldest text always goes into the next batch (no
starvation); the rest are chosen by nearest length so little compute goes to padding.

One worker forms the batches. It runs inference off the event loop on its own thread (or, for
a session with several streams, `concurrency` batches at once, each on its own thread and
stream of the cores: OpenVINO's streams), except a small batch when
nothing else is queued or arriving (inline_max_tokens): that one runs on the loop, which has
nothing else to do, and saves the two thread hops (~0.3 ms of one short text's ~2.5 ms on a
2-core CPU, measured by bench's short-text latency). A request that is such a batch on its own
is computed by `submit` itself, its futures done when it returns: without the turns of the
loop to the worker and back to the handler (~0.08 ms of a short text on 2 cores; it lets the
loop turn once first, `yield_if_alone`, so that requests already read still share a batch). A failed batch fails every
request in it, and the worker carries on. Texts whose caller went away or whose deadline
passed are dropped before they cost compute. The queue is bounded: a submit that does not fit
is refused at once (429), so nothing waits forever.

Every batch's time is predicted before it runs (its session's CostModel: calibrated at warm-up,
refined by the batches it ran alone on the device) and compared with what it took; admission
prices requests with the same predictions (`predict`, `backlog_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from service.engine.alone import alone
from service.engine.batch_policy import BatchPolicy, Item, Within, packed, select_batch
from service.engine.calibrate import THREAD_SPIN_UP_S, measure, shapes, spin_up
from service.engine.cost import CostModel, Device, Sample
from service.errors import InferenceFailed, Overloaded, Unavailable
from service.tensors import Batch

log = logging.getLogger(__name__)

# Warm-up's pace probe runs full batches of this many tokens a sequence (or the longest the
# session measured, when shorter): a flood's documents are a few sentences.
PROBE_LENGTH = 128

Infer = Callable[[Batch], Sequence[Any] | np.ndarray]  # one output row per sequence


# One stream: the next batch is formed this long before the one computing is predicted to end
# (at once when a full batch is queued) and handed to the inference thread, which starts it as
# the other ends. Formed after it ended, the thread waited for the event loop between the two:
# 1.9 ms median between runs of 39 ms, 5 % of the time, under 32 clients x 32 texts on 2 AMX
# cores, and a larger share of the shorter runs that one-text requests make.
STAGE_AHEAD_S = 0.002


class Expired(Exception):
    """A staged batch's texts were all given up on or past their deadline before it began."""


@dataclass(eq=False)
class Run:
    """A batch handed to a thread: its inputs and predicted seconds; once computed, when it
    began (0: not yet, staged behind the one computing), its seconds, whether it ran alone."""

    padded: Batch
    predicted: float
    started: float = 0.0
    out: Sequence[Any] | np.ndarray = ()
    seconds: float = 0.0
    alone: bool = False


class BatchObserver(Protocol):
    def batch(self, size: int, padded: int, real: int, seconds: float) -> None: ...
    def queue_depth(self, texts: int) -> None: ...
    def rejected(self, reason: str) -> None: ...
    def capacity(self, cost: CostModel, policy: BatchPolicy) -> None: ...
    # A batch's time against its prediction, and the device's pace after it.
    def predicted(self, predicted_s: float, actual_s: float, pace: float) -> None: ...


def lower_priority(nice: int) -> None:
    """This thread's CPU priority (Linux: a thread is a schedulable entity of its own)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (OSError, AttributeError):
        log.warning("could not lower a thread's CPU priority to nice %d", nice)


class DynamicBatcher:
    def __init__(
        self,
        infer: Infer,
        policy: BatchPolicy,
        observer: BatchObserver | None = None,
        name: str = "encoder",
        pad_id: int = 0,
        nice: int = 0,
        cost: CostModel | None = None,
        device: Device | None = None,
        concurrency: int = 1,
        lone: bool = False,
    ) -> None:
        """nice: the CPU priority of its inference thread (19: the lowest; the long lane).
        cost: its session's cost (shared by the batchers that run the same session); device:
        the batchers that share its cores, to tell which batches ran alone. concurrency:
        batches computed at once (its session's streams). lone: the session runs a batch alone
        (engine/alone.py) with every thread: with several streams, a batch formed with nothing
        queued behind it, arriving or running runs so, and the next waits for it (one stream's
        latency when idle, the streams' throughput under load); calibration times such runs."""
        self._infer = infer
        self.policy = policy
        self._observer = observer
        self.name = name
        self._pad_id = pad_id
        self._queue: list[Item] = []
        # The queue's predicted seconds, kept until the queue or the cost changes: admission
        # asks for it twice a request, for every batcher sharing the cores.
        self._changes = 0
        self._queued: tuple[tuple[int, int], float] = ((-1, -1), 0.0)
        self._wakeup = asyncio.Event()
        self.concurrency = max(1, concurrency)
        self.lone = lone and self.concurrency > 1
        self._executor = ThreadPoolExecutor(
            max_workers=self.concurrency,
            thread_name_prefix=f"infer-{name}",
            initializer=functools.partial(lower_priority, nice) if nice else None,
        )
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._prune_scheduled = False
        self._earliest = math.inf  # the earliest deadline in the queue (or before it)
        self.arriving = 0  # requests being tokenised: a batch may wait for them
        self.batches = 0
        self.submitted = 0  # texts ever queued
        self.cost = cost if cost is not None else CostModel()
        self.device = device if device is not None else Device()
        self._running: set[Run] = set()  # handed to a thread: computing, or staged behind
        self._runs: set[asyncio.Task[None]] = set()  # their tasks
        self._spun: set[int] = set()  # the threads that have run its session (spin_up)

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> bool:
        """Texts are queued, or a batch is being computed."""
        return bool(self._queue) or bool(self._running)

    @property
    def queued_tokens(self) -> int:
        return sum(it.length for it in self._queue)

    def batch_s(self, rows: int, n: int) -> float:
        """A batch's predicted time."""
        return self.cost.seconds(rows, n)

    def predict(self, lengths: Sequence[int]) -> float:
        """Seconds these sequences take batched alone (as this batcher's policy packs them), one
        batch after another. On several streams without a lone compile this overstates under
        load (calibration times a batch alone on one stream; two streams at once drain up to
        twice as fast): admission errs towards refusing, never towards a missed deadline. With
        one (lone), calibration times the batches alone with every thread, what an idle server
        runs, and the streams under load drain 1.1-1.2x as fast (2 cores with AMX)."""
        return sum(self.batch_s(r, n) for r, n in packed(lengths, self.policy, self._within()))

    def backlog_s(self) -> float:
        """Seconds of work ahead of a new text: the queue, and what is left of the running
        batches (both as predicted)."""
        key = (self._changes, self.cost.generation)
        if self._queued[0] != key:
            lengths = [it.length for it in self._queue]
            self._queued = (key, self.predict(lengths) if lengths else 0.0)
        queued = self._queued[1]
        now = time.monotonic()
        left = sum(
            max(0.0, r.predicted - (now - r.started)) if r.started else r.predicted
            for r in self._running
        )
        return queued + left

    def _within(self) -> Within | None:
        """A batch holds at most max_batch_s of work at its predicted cost."""
        limit = self.policy.max_batch_s
        if limit <= 0 or not self.cost.measured:
            return None
        most = self.policy.max_batch_size
        return lambda n: self.cost.rows_within(n, limit, most)

    async def calibrate(
        self, longest: int, token_id: int, budget_s: float, shortest: int = 8
    ) -> None:
        """Time this batcher's runs at a few shapes from `shortest` up to `longest` tokens, on
        its own thread (the long lane's at its priority), and fit its cost (before any request
        is queued). A vision tower's sequences all have one length: shortest = longest."""
        plan = shapes(longest, self.policy.max_batch_size, shortest)
        loop = asyncio.get_running_loop()
        started = time.monotonic()

        def timed() -> list[Sample]:
            self._spun.add(threading.get_ident())  # measure spins its thread up first
            if not self.lone:
                return measure(self._infer, plan, token_id, budget_s)
            # A batch alone with every thread; under load the streams' slower runs at once
            # drain about as fast (1.1-1.2x on 2 cores with AMX). This thread serves the
            # streams' runs too: spun up on them here, as spin_up would have.
            spin_up(self._infer, (1, shortest), token_id, seconds=THREAD_SPIN_UP_S)
            return measure(self._infer_alone, plan, token_id, budget_s)

        samples = await loop.run_in_executor(self._executor, timed)
        self.cost.calibrate(samples, time.monotonic() - started)
        if self._observer:
            self._observer.capacity(self.cost, self.policy)

    async def spin_up(self, shape: tuple[int, int], token_id: int) -> None:
        """Every thread that will compute this batcher's batches runs `shape` for a moment
        before ready (calibrate's thread already has): each of its executor's `concurrency`
        threads, and the loop's own where small batches run inline. A thread's first runs of a
        session are slow (ONNX Runtime's took 3x; OpenVINO makes each thread an infer request,
        warmed at every short length, on its first run: 0.4 s on 2 cores): without this, the
        first burst after ready on two OpenVINO streams waited 0.4 s on the second thread."""
        loop = asyncio.get_running_loop()
        gate = threading.Barrier(self.concurrency)

        def one() -> None:
            # Each task holds its thread until every one has a thread: the pool starts them all.
            with contextlib.suppress(threading.BrokenBarrierError):
                gate.wait(timeout=10)
            if threading.get_ident() not in self._spun:
                spin_up(self._infer, shape, token_id, seconds=THREAD_SPIN_UP_S)
                if self.lone:  # and its batches alone, on the lone compile
                    spin_up(self._infer_alone, shape, token_id, seconds=THREAD_SPIN_UP_S)
                self._spun.add(threading.get_ident())

        await asyncio.gather(
            *(loop.run_in_executor(self._executor, one) for _ in range(self.concurrency))
        )
        if self.policy.inline_max_tokens and threading.get_ident() not in self._spun:
            # On the loop itself, as its batches run there (alone): nothing is served yet.
            spin_up(self._infer_alone, shape, token_id, seconds=THREAD_SPIN_UP_S)
            self._spun.add(threading.get_ident())

    async def probe(self, token_id: int, seconds: float, gate: threading.Barrier) -> None:
        """Its streams compute full batches at once for about `seconds`, each run through the
        device as a served batch's (its pace: engine/cost.py, Device), at the longest length
        of 128 tokens or less that calibration measured, as many rows as the policy packs
        (fewer where a run would take more than half of `seconds`). `gate`: shared by every
        batcher probed together, so that all their streams start at once (the registry's
        warm-up probes every serving session of the device together: what a mixed flood
        runs)."""
        if not self.paces:
            return
        n = max(1, min(PROBE_LENGTH, self.cost.longest_measured or PROBE_LENGTH))
        full = max(1, min(self.policy.max_batch_size, self.policy.max_batch_tokens // n))
        rows = max(1, self.cost.rows_within(n, seconds / 2, full))  # a large model's: fewer
        ids = np.full((rows, n), token_id, dtype=np.int64)
        batch = Batch(ids, np.ones_like(ids))
        predicted = self.cost.seconds(rows, n)
        loop = asyncio.get_running_loop()

        def one() -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                gate.wait(timeout=10)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                ticket = self.device.enter(predicted)
                try:
                    self._infer(batch)
                finally:
                    self.device.leave(ticket)

        await asyncio.gather(
            *(loop.run_in_executor(self._executor, one) for _ in range(self.concurrency))
        )

    def rejected(self, reason: str) -> None:
        if self._observer:
            self._observer.rejected(reason)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._worker(), name=f"batcher-{self.name}"
        )

    async def yield_if_alone(self, sequences: Sequence[Sequence[int]]) -> None:
        """Before `submit(..., at_once=True)` of a request that would be a small batch on its own
        while the batcher is idle: one turn of the loop, announced as arriving, so that requests
        already read queue first (and share a batch) rather than each being computed alone."""
        if self._alone(len(sequences), max(map(len, sequences), default=0)):
            self.arriving += 1
            try:
                await asyncio.sleep(0)
            finally:
                self.arriving -= 1

    def submit(
        self,
        sequences: Sequence[Sequence[int]],
        deadline: float,
        types: Sequence[Sequence[int]] | None = None,
        masks: Sequence[Sequence[int]] | None = None,
        gates: Sequence[Any] | None = None,
        pixels: Sequence[Any] | None = None,
        at_once: bool = False,
    ) -> list[Item]:
        """Queue every sequence or none (429 when they don't fit); one item (future) each.
        deadline: the monotonic time by which its request must be answered. masks: each
        sequence's own attention mask (an explanation leaves tokens out), default all ones;
        gates: its head gates (L, h) for the attention graph (an explanation leaves heads out);
        pixels: an image's pixel values (C, H, W), for a vision tower's batcher. at_once: when it
        is a small batch alone on an idle batcher, computed here (after `yield_if_alone`): its
        futures are done on return."""
        if self._closing:
            raise Unavailable("the server is shutting down", retry_after=1)
        if len(self._queue) + len(sequences) > self.policy.max_queue:
            self.rejected("queue_full")
            raise Overloaded(
                f"queue full: {len(self._queue)} texts waiting, limit {self.policy.max_queue}",
                retry_after=1,
            )
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        kinds = types if types is not None else [None] * len(sequences)
        own = masks if masks is not None else [None] * len(sequences)
        gated = gates if gates is not None else [None] * len(sequences)
        images = pixels if pixels is not None else [None] * len(sequences)
        items = [
            Item(seq, loop.create_future(), now, deadline, kind, mask, gate, image)
            for seq, kind, mask, gate, image in zip(
                sequences, kinds, own, gated, images, strict=True
            )
        ]
        self.submitted += len(items)
        if at_once and self._inline(items):
            self._run_now(items)
            return items
        for it in items:
            it.future.add_done_callback(self._on_done)
        self._queue.extend(items)
        self._earliest = min(self._earliest, deadline)
        self._queue_changed()
        self._wakeup.set()
        return items

    def _on_done(self, future: asyncio.Future[Any]) -> None:
        """A cancelled text (client gone, deadline passed) leaves the queue, and the queue-depth
        gauge, at once: one prune per loop tick however many were cancelled together."""
        if future.cancelled() and not self._prune_scheduled:
            self._prune_scheduled = True
            asyncio.get_running_loop().call_soon(self._prune)

    async def stop(self) -> None:
        """Refuse new work, finish everything already accepted, then release the thread."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        if self._runs:
            await asyncio.gather(*self._runs, return_exceptions=True)
        self._executor.shutdown(wait=True)

    def _queue_changed(self) -> None:
        """Every change of the queue ends here: the cached prediction is stale, the gauge not."""
        self._changes += 1
        if self._observer:
            self._observer.queue_depth(len(self._queue))

    def _full(self) -> bool:
        q = self._queue
        if not q or len(q) >= self.policy.max_batch_size:
            return True
        longest = max(it.length for it in q)
        within = self._within()
        full_time = within is not None and len(q) > within(longest)
        return longest * len(q) >= self.policy.max_batch_tokens or full_time

    async def _fill(self) -> None:
        """Wait for a fuller batch, but only while texts are on their way and max_wait allows."""
        deadline = self._queue[0].enqueued + self.policy.max_wait_s
        while self.arriving > 0 and not self._closing and not self._full():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                return

    def _prune_due(self) -> None:
        """_prune when it can drop anything: a text was cancelled (its prune is scheduled) or
        the earliest deadline passed. A pass over the queue three times a batch was a tenth of
        the event loop under a flood (a queue of thousands of texts, py-spy)."""
        if self._prune_scheduled or time.monotonic() > self._earliest:
            self._prune()

    def _prune(self) -> None:
        """Drop texts nobody waits for any more, and fail those whose deadline passed."""
        self._prune_scheduled = False
        now = time.monotonic()
        keep = []
        for it in self._queue:
            if it.future.done():  # cancelled: the client went away or gave up
                continue
            if now > it.deadline:
                it.future.set_exception(
                    Unavailable("request deadline passed while queued", retry_after=1)
                )
                self.rejected("deadline")
                continue
            keep.append(it)
        self._earliest = min((it.deadline for it in keep), default=math.inf)
        if len(keep) != len(self._queue):
            self._queue = keep
            self._queue_changed()

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._prune_due()
            if not self._queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                await self._until_staging()
                self._prune_due()
                if not self._queue:
                    continue
                await self._fill()
                self._prune_due()
                if not self._queue:
                    continue
                batch = select_batch(self._queue, self.policy, self._within())
                chosen = set(map(id, batch))
                self._queue = [it for it in self._queue if id(it) not in chosen]
                self._queue_changed()
            except Exception:  # a bug here must not leave callers waiting: fail the oldest
                log.exception("%s batcher could not form a batch", self.name)
                head = self._queue.pop(0)
                self._queue_changed()
                if not head.future.done():
                    head.future.set_exception(InferenceFailed("could not schedule the request"))
                continue
            if self._inline(batch):
                self._run_now(batch)
                continue
            # Alone (nothing queued behind it or on its way, nothing running): every thread,
            # the rest wait. A request being read would be held by it; on a stream it starts
            # beside it (2 AMX cores, 2-4 clients of one text: 1.04-1.05x the texts/s).
            lone = self.lone and not self._queue and not self._runs and self.arriving == 0
            task = loop.create_task(self._run(loop, batch, self._hand_over(batch), lone))
            self._runs.add(task)
            task.add_done_callback(self._runs.discard)
            # Every stream busy (one stream: one batch computing, the next staged): wait.
            if lone or len(self._runs) >= max(2, self.concurrency):
                await asyncio.wait(set(self._runs), return_when=asyncio.FIRST_COMPLETED)

    async def _until_staging(self) -> None:
        """One stream with a batch computing: the next is formed STAGE_AHEAD_S before that one
        is predicted to end, holding what arrives meanwhile (at once when a full batch is
        queued; after it ends while nothing is measured)."""
        if self.concurrency > 1 or not self._running:
            return
        if not self.cost.measured:
            await asyncio.wait(set(self._runs))
            return
        if self._full():
            return
        now = time.monotonic()
        ends = max((r.started or now) + r.predicted for r in self._running)
        if ends - STAGE_AHEAD_S > now:
            await asyncio.wait(set(self._runs), timeout=ends - STAGE_AHEAD_S - now)

    def _inline(self, batch: list[Item]) -> bool:
        return self._alone(len(batch), max(it.length for it in batch))

    def _alone(self, count: int, longest: int) -> bool:
        """Small (padded), and nobody else waiting for the loop's attention or the backend."""
        limit = self.policy.inline_max_tokens
        return (
            limit > 0
            and count <= self.policy.max_batch_size
            and count * longest <= limit
            and not self._queue
            and self.arriving == 0
            and not self._running
        )

    def _hand_over(self, batch: list[Item]) -> Run:
        """The batch padded, counted as running from now (it may wait behind another)."""
        padded = Batch.of(
            [it.ids for it in batch],
            self._pad_id,
            [it.types for it in batch],
            [it.mask for it in batch],
            [it.gates for it in batch],
            [it.pixels for it in batch],
        )
        run = Run(padded, self.batch_s(*padded.input_ids.shape))
        self._running.add(run)
        return run

    def _compute(self, run: Run, infer: Infer, batch: list[Item]) -> None:
        """On the thread that computes it: `run.out`, its time, whether it ran alone on the
        device, and its row count checked. A staged batch whose every text was given up on, or
        is past its deadline, while it waited is not computed (Expired)."""
        now = time.monotonic()
        if all(it.future.done() or now > it.deadline for it in batch):
            raise Expired
        ticket = self.device.enter(run.predicted if self.paces else None)
        run.started = time.monotonic()
        try:
            run.out = infer(run.padded)
        finally:
            run.seconds = time.monotonic() - run.started
            run.alone = self.device.leave(ticket)
        if len(run.out) != len(batch):
            raise RuntimeError(f"backend returned {len(run.out)} rows for {len(batch)} texts")

    @property
    def paces(self) -> bool:
        """Its runs measure the device's pace: their predictions are the machine's (measured,
        not a stated rate, not a fake backend's)."""
        cost = self.cost
        return cost.learns and cost.fixed_tokens_per_s is None and cost.current is not None

    def _expired(self, batch: list[Item]) -> None:
        """A staged batch nobody waits for any more: answered as the queue's expired texts."""
        for it in batch:
            if not it.future.done():
                it.future.set_exception(
                    Unavailable("request deadline passed while queued", retry_after=1)
                )
                self.rejected("deadline")

    def _failed(self, batch: list[Item], exc: Exception) -> None:
        """One failed batch fails its texts, never the worker."""
        log.exception("%s batch of %d failed", self.name, len(batch))
        for it in batch:
            if not it.future.done():
                it.future.set_exception(InferenceFailed(f"inference failed: {exc}"))

    def _run_now(self, batch: list[Item]) -> None:
        """A small batch computed on the loop (its futures are done on return): at submit, or
        by the worker when the rest of the queue left it alone."""
        run = self._hand_over(batch)
        try:
            self._compute(run, self._infer_alone, batch)
        except Expired:
            self._expired(batch)
            return
        except Exception as exc:  # noqa: BLE001 - answered as the worker's batches are
            self._failed(batch, exc)
            return
        finally:
            self._running.discard(run)
        self._settle(batch, run)

    def _infer_alone(self, batch: Batch) -> Sequence[Any] | np.ndarray:
        """A run marked alone (engine/alone.py), on whichever thread calls it (run_in_executor
        does not carry the context): inline, lone, calibration's and their spin-ups."""
        with alone():
            return self._infer(batch)

    async def _run(
        self, loop: asyncio.AbstractEventLoop, batch: list[Item], run: Run, lone: bool
    ) -> None:
        infer = self._infer_alone if lone else self._infer
        try:  # under load the loop keeps answering (health, refusals) while this runs
            await loop.run_in_executor(self._executor, self._compute, run, infer, batch)
        except Expired:
            self._expired(batch)
            return
        except Exception as exc:  # noqa: BLE001 - one failed batch must not kill the worker
            self._failed(batch, exc)
            return
        finally:
            self._running.discard(run)
        self._settle(batch, run)

    def _settle(self, batch: list[Item], run: Run) -> None:
        """The answers handed over, then the bookkeeping: the cost's refinement, the metrics."""
        padded, seconds = run.padded, run.seconds
        self.batches += 1
        for it, row in zip(batch, run.out, strict=True):
            it.started = run.started
            it.inference_s = seconds
            it.batch_size, it.batch_tokens = len(batch), int(padded.input_ids.size)
            if not it.future.done():
                it.future.set_result(row)
        # The answers first: the waiting handlers run before the bookkeeping below (a refit
        # is scheduled after them on the loop, not run on their path). Beside another batch
        # its time is not its own: only a batch that ran alone refines the fit.
        rows, n = padded.input_ids.shape
        if run.alone and self.cost.observe(rows, n, seconds, defer=True):
            asyncio.get_running_loop().call_soon(self._refit)
        if self._observer:
            real = sum(it.length for it in batch)
            self._observer.batch(len(batch), padded.input_ids.size, real, seconds)
            if run.predicted > 0:
                self._observer.predicted(run.predicted, seconds, self.device.pace)

    def _refit(self) -> None:
        self.cost.refit()
        if self._observer:
            self._observer.capacity(self.cost, self.policy)
