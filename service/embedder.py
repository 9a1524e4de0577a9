"""Texts in, vectors out: validate, tokenise off the loop, queue, wait (bounded), post-process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from service.batcher import DynamicBatcher
from service.errors import InvalidInput, PayloadTooLarge, Unavailable
from service.metrics import Metrics
from service.runtime import Backend
from service.settings import Settings

# Requests this small are tokenised on the event loop (tens of µs); larger ones on a thread.
INLINE_TEXTS = 8
INLINE_CHARS = 2048


class ClientGone(Exception):
    """The caller disconnected; its texts were dropped from the queue."""


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


@dataclass
class Encoded:
    vectors: np.ndarray  # (n, d) float32, pooled, not normalised
    tokens: list[int]
    timings: Timings = field(default_factory=Timings)


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
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(vectors, dtype=np.float32)


async def wait_for_disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    """Returns when the ASGI server reports that the client went away."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def wait_all(
    futures: list[asyncio.Future], timeout_s: float, disconnected: asyncio.Future | None
) -> list:
    """All results, or: the first error; ClientGone; Unavailable when the deadline passes.

    Whatever is not needed any more is cancelled, so the batcher skips it.
    """
    gathered = asyncio.gather(*futures)
    waiters: set[asyncio.Future] = {gathered}
    if disconnected is not None:
        waiters.add(disconnected)
    done, _ = await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if gathered in done:
        return gathered.result()
    gathered.cancel()
    for f in futures:
        f.cancel()
    # Retrieve the gather's outcome so asyncio does not log it as "never retrieved".
    gathered.add_done_callback(lambda f: f.cancelled() or f.exception())
    if disconnected is not None and disconnected in done:
        raise ClientGone()
    raise Unavailable(f"request did not finish within {timeout_s:g} s", retry_after=1)


class Embedder:
    def __init__(
        self,
        backend: Backend,
        batcher: DynamicBatcher,
        settings: Settings,
        metrics: Metrics,
        max_length: int,
    ) -> None:
        self.backend = backend
        self.batcher = batcher
        self.settings = settings
        self.max_length = max_length
        self._tokenization = metrics.tokenization_duration.labels("encode")
        self._queue = metrics.queue_duration.labels("encode")
        self._truncated = metrics.truncated.labels("encode")
        self._length = metrics.input_length.labels("encode")

    async def encode(
        self, texts: list[str], truncate: bool, disconnected: asyncio.Future | None = None
    ) -> Encoded:
        loop = asyncio.get_running_loop()
        timings = Timings()
        self.batcher.arriving += 1
        try:
            t0 = time.monotonic()
            if len(texts) <= INLINE_TEXTS and sum(map(len, texts)) <= INLINE_CHARS:
                encodings = self.backend.tokenize(texts)  # cheaper than a thread hop
            else:
                encodings = await loop.run_in_executor(None, self.backend.tokenize, texts)
            timings.tokenization_s = time.monotonic() - t0
            truncated = [i for i, e in enumerate(encodings) if e.overflowing]
            if truncated and not truncate:
                i = truncated[0]
                n = await loop.run_in_executor(None, self.backend.count_tokens, texts[i])
                raise PayloadTooLarge(
                    f"input {i} has {n} tokens; the model's limit is {self.max_length} "
                    "(send truncate: true to cut it)",
                    param="truncate",
                )
            sequences = [e.ids for e in encodings]
            items = self.batcher.submit(sequences, self.settings.request_timeout_s)
        finally:
            self.batcher.arriving -= 1
        self._tokenization.observe(timings.tokenization_s)
        if truncated:
            self._truncated.inc(len(truncated))
        futures = [it.future for it in items]
        rows = await wait_all(futures, self.settings.request_timeout_s, disconnected)
        timings.queue_s = max(it.queue_s for it in items)
        timings.inference_s = max(it.inference_s for it in items)
        self._queue.observe(timings.queue_s)
        tokens = [len(s) for s in sequences]
        for n in tokens:
            self._length.observe(n)
        return Encoded(np.stack(rows), tokens, timings)
