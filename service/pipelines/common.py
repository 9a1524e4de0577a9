"""What every pipeline shares: timings, bounded waiting on queued work, input checks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from tokenizers import Encoding

from service.errors import ClientGone, InvalidInput, PayloadTooLarge, Unavailable
from service.settings import Settings
from service.tensors import l2_normalize

# Requests this small are tokenised on the event loop (tens of µs); larger ones on a thread.
INLINE_TEXTS = 8
INLINE_CHARS = 2048

T = TypeVar("T")


@dataclass
class Timings:
    tokenization_s: float = 0.0
    queue_s: float = 0.0
    inference_s: float = 0.0

    def headers(self) -> dict[str, str]:
        return {
            "x-tokenization-time": f"{self.tokenization_s * 1e3:.3f}",
            "x-queue-time": f"{self.queue_s * 1e3:.3f}",
            "x-inference-time": f"{self.inference_s * 1e3:.3f}",
        }


def as_list(inputs: str | list[str], name: str) -> list[str]:
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not texts:
        raise InvalidInput(f"{name} must not be an empty list", param=name)
    return texts


def check_texts(texts: list[str], settings: Settings, name: str) -> None:
    if len(texts) > settings.max_inputs:
        raise InvalidInput(
            f"{name} has {len(texts)} items; the limit is {settings.max_inputs} per request",
            param=name,
        )
    for i, text in enumerate(texts):
        if len(text) > settings.max_input_chars:
            raise PayloadTooLarge(
                f"{name}[{i}] has {len(text)} characters; the limit is {settings.max_input_chars}",
                param=name,
            )


def postprocess(vectors: np.ndarray, normalize: bool, dimensions: int | None) -> np.ndarray:
    """Keep the first `dimensions` components (Matryoshka), then L2-normalise if asked."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if normalize:
        vectors = l2_normalize(vectors)
    return np.ascontiguousarray(vectors, dtype=np.float32)


async def tokenized(
    fn: Callable[..., list[Encoding]], items: list, chars: int, *args: object
) -> tuple[list[Encoding], float]:
    """Tokenise on the loop when small (cheaper than a thread hop), else on a thread."""
    t0 = time.monotonic()
    if len(items) <= INLINE_TEXTS and chars <= INLINE_CHARS:
        out = fn(items, *args)
    else:
        out = await asyncio.get_running_loop().run_in_executor(None, fn, items, *args)
    return out, time.monotonic() - t0


async def wait_for_disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    """Returns when the ASGI server reports that the client went away."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class Disconnect:
    """A request's client going away, watched only while the request waits for queued work.

    The watch is a task reading the ASGI receive channel; it starts when the wait does and is
    cancelled when the wait ends (a task for the request's whole life, as a generator
    dependency, cost ~45 µs a request in FastAPI's exit-stack machinery).
    """

    def __init__(self, receive: Callable[[], Awaitable[dict]]) -> None:
        self._receive = receive

    def watch(self) -> asyncio.Future:
        return asyncio.ensure_future(wait_for_disconnect(self._receive))


async def wait_all(
    futures: list[asyncio.Future[T]], timeout_s: float, disconnect: Disconnect | None
) -> list[T]:
    """All results, or: the first error; ClientGone; Unavailable when the deadline passes.

    Whatever is not needed any more is cancelled, so the batcher skips it.
    """
    gathered = asyncio.gather(*futures)
    waiters: set[asyncio.Future] = {gathered}
    gone = disconnect.watch() if disconnect is not None else None
    if gone is not None:
        waiters.add(gone)
    try:
        done, _ = await asyncio.wait(
            waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        if gone is not None:
            gone.cancel()
    if gathered in done:
        return gathered.result()
    gathered.cancel()
    for f in futures:
        f.cancel()
    # Retrieve the gather's outcome so asyncio does not log it as "never retrieved".
    gathered.add_done_callback(lambda f: f.cancelled() or f.exception())
    if gone is not None and gone in done:
        raise ClientGone()
    raise Unavailable(f"request did not finish within {timeout_s:g} s", retry_after=1)


def check_ids(arrays: list[list[int]], vocab_size: int, param: str) -> None:
    """Token ids given by a client must be in the model's vocabulary (422 naming them)."""
    for i, ids in enumerate(arrays):
        bad = sorted({t for t in ids if not 0 <= t < vocab_size})
        if bad:
            raise InvalidInput(
                f"{param}[{i}] has token ids outside the model's vocabulary (0..{vocab_size - 1}): "
                f"{bad[:10]}",
                param=param,
            )
