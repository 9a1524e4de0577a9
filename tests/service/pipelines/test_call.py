"""A request's tokenising: small on the loop, large in pieces on the worker threads, all queued
at once; what it took in CPU counted on the call; each piece checked when its turn comes."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from service.errors import Overloaded
from service.pipelines.call import CHUNK_TEXTS, INLINE_TEXTS, Call


def burn(seconds: float) -> None:
    """Spend this much of the calling thread's CPU."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class Tokenizer:
    """Records the threads it ran on; each call spends 5 ms of CPU."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def __call__(self, texts: list[str]) -> list[str]:
        self.threads.append(threading.get_ident())
        burn(0.005)
        return [t.upper() for t in texts]


def test_a_large_request_is_tokenised_in_pieces_on_the_workers_and_its_cpu_counted():
    texts = [f"text {i}" for i in range(3 * CHUNK_TEXTS)]
    tok = Tokenizer()

    async def main():
        call = Call.within(10)
        out, _ = await call.tokenize(tok, texts)
        return call, out, threading.get_ident()

    call, out, loop_thread = asyncio.run(main())
    assert out == [t.upper() for t in texts]  # the pieces' results in order
    assert len(tok.threads) == 3 and loop_thread not in tok.threads
    assert call.tokenised_chars == sum(map(len, texts))
    assert 0.015 <= call.tokenising_cpu_s < 0.1  # the workers' CPU, not the wall time


def test_a_small_request_is_tokenised_on_the_loop_and_counted_too():
    tok = Tokenizer()

    async def main():
        call = Call.within(10)
        await call.tokenize(tok, ["a cat"] * INLINE_TEXTS)
        return call, threading.get_ident()

    call, loop_thread = asyncio.run(main())
    assert tok.threads == [loop_thread]
    assert call.tokenised_chars == 5 * INLINE_TEXTS and call.tokenising_cpu_s >= 0.004


def test_a_piece_whose_turn_comes_too_late_is_refused_untokenised():
    tok = Tokenizer()

    def too_late() -> None:
        raise Overloaded("its turn came too late", retry_after=1)

    async def main():
        call = Call.within(10)
        call.before_tokenising = too_late
        await call.tokenize(tok, ["a cat"] * (2 * INLINE_TEXTS))

    with pytest.raises(Overloaded, match="too late"):
        asyncio.run(main())
    assert tok.threads == []


def test_a_request_of_a_few_pieces_is_cut_into_as_many_as_there_are_workers():
    """10 KB of text, one piece by size, is tokenised in one piece a worker (each tokenizer call
    runs on one thread: one piece would leave the other cores idle)."""
    from service.engine.preparing import workers

    tok = Tokenizer()
    texts = [f"{i} " + "x" * 1000 for i in range(10)]

    async def main():
        call = Call.within(10)
        out, _ = await call.tokenize(tok, texts)
        return out

    assert asyncio.run(main()) == [t.upper() for t in texts]
    assert len(tok.threads) == workers() >= 2
