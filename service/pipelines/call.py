"""One request as the pipelines see it: the time it must be answered by, and its client.

The deadline counts from the moment the request's body arrived (the middleware stamps it), so
tokenising, queueing, inference and serialising all spend the same budget; a server that is
draining for shutdown pulls every deadline in to the end of its grace. The client is watched
for the rest of the request once any stage has to wait (a thread, the queue): a client that
went away stops its request at the next stage, and its queued work is dropped.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from service.engine.preparing import workers
from service.errors import Disconnected, Unavailable

T = TypeVar("T")
Messages = Callable[[], Awaitable[MutableMapping[str, Any]]]

# Requests this small are tokenised on the event loop (tens of µs); larger ones on the worker
# threads (the loop's executor: one a core, each tokenizer call on one thread), in pieces of
# about this size, all queued at once (a large request takes every worker), so that a request
# that waits for a worker notices that its client left or its deadline passed.
INLINE_TEXTS = 8
INLINE_CHARS = 2048
CHUNK_TEXTS = 256
CHUNK_CHARS = 64 * 1024
# A request of at least this many characters is cut into as many pieces as there are workers
# (or a multiple): one client's 512 documents in 3 pieces on 2 workers took two rounds, 10-15 %
# longer than the tokenizer's own threads had taken on one call.
SPLIT_CHARS = 8 * 1024


class Drain:
    """The server's shutdown, shared by every request: a deadline all of them must meet.

    `begun` is a future that completes when the drain begins, so that requests already waiting
    (with a later deadline) wake up and wait again under the drain's.
    """

    def __init__(self) -> None:
        self.deadline = math.inf
        self._begun: asyncio.Future[None] | None = None

    @property
    def draining(self) -> bool:
        return self.deadline < math.inf

    @property
    def begun(self) -> asyncio.Future[None]:
        if self._begun is None:
            self._begun = asyncio.get_running_loop().create_future()
        return self._begun

    def begin(self, grace_s: float) -> None:
        self.deadline = min(self.deadline, time.monotonic() + grace_s)
        if not self.begun.done():
            self.begun.set_result(None)


@dataclass
class Timings:
    tokenization_s: float = 0.0
    queue_s: float = 0.0
    inference_s: float = 0.0
    # For traces: the request's own tokens, and the batches that ran them (the largest).
    tokens: int = 0
    batches: int = 0
    batch_size: int = 0
    batch_tokens: int = 0  # padded

    def headers(self) -> dict[str, str]:
        return {
            "x-tokenization-time": f"{self.tokenization_s * 1e3:.3f}",
            "x-queue-time": f"{self.queue_s * 1e3:.3f}",
            "x-inference-time": f"{self.inference_s * 1e3:.3f}",
        }


async def _until_disconnect(receive: Messages) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Call:
    def __init__(
        self,
        receive: Messages | None,
        deadline: float,
        drain: Drain | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self._receive = receive
        self._deadline = deadline
        self.timeout_s = timeout_s  # what the deadline was set from (for the message)
        self._drain = drain
        self._watch: asyncio.Future[None] | None = None
        # What its tokenising took: characters and the CPU seconds of the threads that did it.
        self.tokenised_chars = 0
        self.tokenising_cpu_s = 0.0
        # Run on the worker thread before each piece is tokenised: raises to refuse the request
        # (set by the intake: a request whose turn comes too late to finish is not tokenised).
        self.before_tokenising: Callable[[], None] | None = None

    @classmethod
    def within(cls, timeout_s: float) -> Call:
        """A call with no client to watch (tests, internal work)."""
        return cls(None, time.monotonic() + timeout_s, timeout_s=timeout_s)

    @property
    def deadline(self) -> float:
        return self._deadline if self._drain is None else min(self._deadline, self._drain.deadline)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _watching(self) -> asyncio.Future[None] | None:
        """The disconnect watch, started on first use and kept until the call closes."""
        if self._watch is None and self._receive is not None:
            self._watch = asyncio.ensure_future(_until_disconnect(self._receive))
        return self._watch

    @property
    def gone(self) -> bool:
        w = self._watch
        return w is not None and w.done() and not w.cancelled()

    def check(self) -> None:
        """Raise when the request cannot usefully go on: its client left, or its time is up."""
        if self.gone:
            raise Disconnected()
        if self.remaining() <= 0:
            raise self.expired()

    @property
    def draining(self) -> bool:
        """The server's shutdown, not the request's own deadline, decides when it must end."""
        return self._drain is not None and self._drain.deadline <= self._deadline

    def expired(self) -> Unavailable:
        if self.draining:
            return Unavailable("the server is shutting down: retry on another replica", retry_after=1)
        within = f"{self.timeout_s:g} s" if self.timeout_s is not None else "its deadline"
        return Unavailable(
            f"request did not finish within {within} (HEADWISE_REQUEST_TIMEOUT_S)", retry_after=1
        )

    async def wait(self, futures: Sequence[asyncio.Future[T]]) -> list[T]:
        """Every result, or: the first error; Disconnected; Unavailable at the deadline.

        Whatever is not needed any more is cancelled, so the batcher drops it unrun.
        """
        self.check()
        if all(f.done() for f in futures):  # computed at submit (a lone short text): no wait
            return [f.result() for f in futures]
        gathered = asyncio.gather(*futures)
        waiters: set[asyncio.Future[Any]] = {gathered}
        watch = self._watching()
        if watch is not None:
            waiters.add(watch)
        drain = self._drain
        if drain is not None and not drain.draining:
            waiters.add(drain.begun)  # a shutdown pulls the deadline in: wait again under it
        while True:
            done, _ = await asyncio.wait(
                waiters, timeout=max(0.0, self.remaining()), return_when=asyncio.FIRST_COMPLETED
            )
            if drain is not None and drain.begun in done and gathered not in done:
                waiters.discard(drain.begun)
                if self.remaining() > 0 and not (watch is not None and watch in done):
                    continue
            break
        if gathered in done:
            return gathered.result()
        gathered.cancel()
        for f in futures:
            f.cancel()
        # Retrieve the gather's outcome so asyncio does not log it as "never retrieved".
        gathered.add_done_callback(lambda f: f.cancelled() or f.exception())
        if watch is not None and watch in done:
            raise Disconnected()
        raise self.expired()

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a worker thread, unless the client leaves or the deadline passes first
        (then the thread's result is thrown away)."""
        self.check()
        future = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        return (await self.wait([future]))[0]

    async def tokenize(
        self, fn: Callable[..., list[T]], items: Sequence[Any], *args: Any
    ) -> tuple[list[T], float]:
        """fn(items, *args) (a tokenizer's batch call), and the seconds it took: on the loop
        when small, else on the worker threads in pieces (each checked by `before_tokenising`
        when its turn comes). Its characters and CPU seconds add to the call's."""
        t0 = time.monotonic()
        chars = sum(len(t) if isinstance(t, str) else sum(map(len, t)) for t in items)
        if len(items) <= INLINE_TEXTS and chars <= INLINE_CHARS:
            c0 = time.thread_time()
            out = fn(list(items), *args)
            self._tokenised(chars, time.thread_time() - c0)
            return out, time.monotonic() - t0
        self.check()
        loop = asyncio.get_running_loop()
        parts = pieces(items, CHUNK_TEXTS, CHUNK_CHARS)
        n = workers()
        if chars >= SPLIT_CHARS and len(parts) % n:  # as many pieces as workers, or a multiple
            count = -(-len(parts) // n) * n
            parts = pieces(items, -(-len(items) // count), -(-chars // count))
        check = self.before_tokenising  # as it is now: the intake clears it once prepared
        futures = [
            loop.run_in_executor(None, self._timed, check, fn, part, *args) for part in parts
        ]
        try:
            done = await self.wait(futures)
        except BaseException:
            for f in futures:  # a piece refused or failed: the others are not tokenised for it
                f.cancel()
            raise
        self._tokenised(chars, sum(cpu for _, cpu in done))
        return [x for got, _ in done for x in got], time.monotonic() - t0

    @staticmethod
    def _timed(
        check: Callable[[], None] | None, fn: Callable[..., list[T]], *args: Any
    ) -> tuple[list[T], float]:
        """On a worker: check(), then fn(*args) and the CPU seconds it took this thread (a
        tokenizer call runs on the thread that makes it: TOKENIZERS_PARALLELISM is off in the
        server)."""
        if check is not None:
            check()
        c0 = time.thread_time()
        out = fn(*args)
        return out, time.thread_time() - c0

    def _tokenised(self, chars: int, cpu_s: float) -> None:
        self.tokenised_chars += chars
        self.tokenising_cpu_s += cpu_s

    def close(self) -> None:
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()


def pieces(items: Sequence[Any], max_items: int, max_chars: int) -> list[list[Any]]:
    """Consecutive runs of items, each at most max_items long and about max_chars large."""
    out: list[list[Any]] = [[]]
    size = 0
    for item in items:
        n = len(item) if isinstance(item, str) else sum(map(len, item))
        if out[-1] and (len(out[-1]) >= max_items or size + n > max_chars):
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out
