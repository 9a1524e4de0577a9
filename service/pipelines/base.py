"""The one way into a batcher, used by every pipeline: tokenise -> check limits -> admit by
capacity -> submit -> wait (honouring the client's disconnect and the deadline).

A pipeline says how its inputs become token sequences (`prepare`, which may refuse them: too
long, too many); the intake does the rest in the same order for every route, so no pipeline can
forget a step. Admission happens twice: on a lower bound before tokenising (so a request that
cannot fit is refused in microseconds) and on the exact counts after it, always before anything
is queued. The first also prices the tokenising itself (service/engine/preparing.py: CPU
seconds a character, measured on every request), and a request whose turn to be tokenised comes
too late is refused before it is. `hold` wraps the queueing and what follows it (the /attention
budget and pacer).

A request may ask for its sequences to be queued in pieces (`Prepared.pieces`: an explanation's
hundreds of variants of one text), one after another: each piece is admitted, held and queued
as a request of its own, so that other traffic is batched between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from service.engine.admission import Admission
from service.engine.batch_policy import Item
from service.engine.batcher import DynamicBatcher
from service.engine.preparing import PrepareCost
from service.errors import InvalidInput, Overloaded, PayloadTooLarge
from service.metrics import Metrics
from service.pipelines.call import Call, Timings
from service.settings import Settings
from service.tensors import l2_normalize

R = TypeVar("R")


@dataclass
class Prepared:
    """A request's work as the batcher takes it: token ids (and types) per sequence."""

    sequences: list[list[int]]
    types: list[list[int]] | None = None
    truncated: int = 0  # how many were cut at the model's length
    extra: Any = None  # what the pipeline wants back (its encodings)
    masks: list[list[int]] | None = None  # each sequence's own attention mask (default ones)
    pieces: list[int] | None = None  # queue this many sequences at a time, in turn (sum: all)
    gates: list[Any] | None = None  # each sequence's head gates (L, h) (default all ones)
    pixels: list[Any] | None = None  # an image's pixel values (C, H, W) (a vision tower's)

    def split(self) -> list[Prepared]:
        """The pieces to queue one after another (one: the whole)."""
        if not self.pieces:
            return [self]
        if sum(self.pieces) != len(self.sequences) or min(self.pieces) < 1:
            raise ValueError(f"pieces {self.pieces} do not split {len(self.sequences)} sequences")
        out, start = [], 0
        for size in self.pieces:
            part = slice(start, start + size)
            types = self.types[part] if self.types is not None else None
            masks = self.masks[part] if self.masks is not None else None
            gates = self.gates[part] if self.gates is not None else None
            pixels = self.pixels[part] if self.pixels is not None else None
            out.append(
                Prepared(self.sequences[part], types, masks=masks, gates=gates, pixels=pixels)
            )
            start += size
        return out


@dataclass
class Ran(Generic[R]):
    rows: list[R]  # one output per sequence, in order
    prepared: Prepared
    timings: Timings = field(default_factory=Timings)

    @property
    def lengths(self) -> list[int]:
        return [len(s) for s in self.prepared.sequences]


Hold = Callable[[Prepared], AbstractAsyncContextManager[None]]


class Intake:
    """long: a second batcher (the long lane) for sequences longer than `long_tokens`; a
    request's sequences go each to its lane and come back in order."""

    def __init__(
        self,
        batcher: DynamicBatcher,
        admission: Admission,
        metrics: Metrics,
        path: str,
        model: str,
        long: DynamicBatcher | None = None,
        long_tokens: int = 0,
        prepare_cost: PrepareCost | None = None,
    ) -> None:
        """prepare_cost: what tokenising a character costs (the model's tokenizer's), None where
        a request's preparation tokenises nothing worth pricing."""
        self.batcher = batcher
        self.prepare_cost = prepare_cost
        self.long = long if long_tokens else None
        self.long_tokens = long_tokens
        self.admission = admission
        labels = (path, model)
        self._tokenization = metrics.tokenization_duration.labels(*labels)
        self._queue = metrics.queue_duration.labels(*labels)
        self._truncated = metrics.truncated.labels(*labels)
        self._length = metrics.input_length.labels(*labels)

    def lanes(self, lengths: Sequence[int]) -> list[tuple[DynamicBatcher, list[int]]]:
        """Which batcher takes which sequences (by index): long ones to the long lane."""
        if self.long is None:
            return [(self.batcher, list(range(len(lengths))))]
        short = [i for i, n in enumerate(lengths) if n <= self.long_tokens]
        long = [i for i, n in enumerate(lengths) if n > self.long_tokens]
        return [(b, idx) for b, idx in ((self.batcher, short), (self.long, long)) if idx]

    def admit(
        self,
        lengths: Sequence[int],
        call: Call,
        unit: str = "inputs",
        tokenising: tuple[PrepareCost, int] | None = None,
        place: int | None = None,
    ) -> int:
        """The place of the promise (release it once queued), or a refusal (naming the
        sequences as `unit`: inputs, or what a request's inputs became: windows, chunks), which
        withdraws it. tokenising: the characters still to tokenise before them (and their
        model's rate), promised with the first lane's. place: the request's own, kept from its
        admission before tokenising (default: a new one, behind every promise made so far)."""
        if place is None:
            place = self.admission.place()
        try:
            for batcher, idx in self.lanes(lengths):
                part = [lengths[i] for i in idx]
                self.admission.admit(
                    batcher, part, call.remaining(), unit, call.timeout_s, tokenising, place
                )
                tokenising = None
            return place
        except Overloaded:
            self.admission.release(place)
            if call.draining:  # it is the shutdown, not the load, that leaves too little time
                raise call.expired() from None
            raise
        except BaseException:
            self.admission.release(place)
            raise

    def _in_time(
        self, call: Call, cost: PrepareCost, chars: int, batches_s: float, admitted: float
    ) -> Callable[[], None]:
        """The check a worker thread makes when a request's tokenising gets its turn: refused
        (429) if its tokenising and batches (at the rate measured by then) would end past its
        deadline, before any of it is done. Admitted at a rate measured alone, a flood's
        requests wait their turn behind more work than was predicted; those whose turn comes
        too late give their thread to the next instead of tokenising for a 503."""

        span = self.admission.timeout_s
        if call.timeout_s is not None:
            span = min(span, call.timeout_s)
        keep = span * (1 - self.admission.headroom)  # the share of a deadline kept free

        def check() -> None:
            need = cost.seconds(chars) + batches_s
            left = call.remaining()
            if need > left - keep:
                if call.draining:  # the shutdown, not the load, leaves too little time
                    raise call.expired()
                self.batcher.rejected("queue_too_long")
                raise Overloaded(
                    f"this request waited {time.monotonic() - admitted:.1f} s for its turn to "
                    f"be tokenised; its tokenising and batches need about {need:.1f} s and "
                    f"{max(0.0, left):.1f} s are left of its deadline: retry later or send "
                    "fewer inputs",
                    retry_after=max(1.0, need),
                )

        return check

    def precheck(self, lengths: Sequence[int], call: Call, unit: str = "inputs") -> None:
        """Refused now (413, 429) when sequences of these lengths, a lower bound of what the
        request will queue, could not finish by its deadline: before a large request is
        tokenised. Nothing is promised: `run` admits the request again on its exact sequences."""
        self.admission.release(self.admit(lengths, call, unit))

    async def _submit(self, prepared: Prepared, deadline: float) -> list[Item]:
        """Every sequence queued in its lane (or none: 429), its item at its own index."""
        seqs, types, masks, gates = prepared.sequences, prepared.types, prepared.masks, prepared.gates
        pixels = prepared.pixels
        lanes = self.lanes([len(x) for x in seqs])
        if len(lanes) == 1:  # a small request alone is computed at once, after one turn
            batcher = lanes[0][0]
            await batcher.yield_if_alone(seqs)
            return batcher.submit(seqs, deadline, types, masks, gates, pixels, at_once=True)
        items: list[Item | None] = [None] * len(seqs)
        queued: list[Item] = []
        try:
            for batcher, idx in lanes:
                got = batcher.submit(
                    _pick(seqs, idx) or [],
                    deadline,
                    _pick(types, idx),
                    _pick(masks, idx),
                    _pick(gates, idx),
                    _pick(pixels, idx),
                )
                queued += got
                for i, it in zip(idx, got, strict=True):
                    items[i] = it
        except BaseException:
            for it in queued:  # all or none: what the first lane took leaves it
                it.future.cancel()
            raise
        return [it for it in items if it is not None]

    async def run(
        self,
        call: Call,
        prepare: Callable[[], Awaitable[Prepared]],
        at_least: Sequence[int] | None = None,
        hold: Hold | None = None,
        then: Callable[[Ran[Any]], Awaitable[R]] | None = None,
        unit: str = "inputs",
        chars: int = 0,
    ) -> Any:
        """The batcher's outputs for the prepared sequences (or `then` of them, still inside
        `hold`). at_least: a lower bound of each input's tokens, known without a tokenizer;
        chars: the characters `prepare` tokenises (what its time is priced and measured by)."""
        call.check()
        cost = self.prepare_cost if chars else None
        tokenising = (cost, chars) if cost is not None else None
        place = self.admit(at_least, call, unit, tokenising) if at_least else None
        self.batcher.arriving += 1
        try:
            started = time.monotonic()
            before = call.tokenised_chars, call.tokenising_cpu_s
            if cost is not None and place is not None:
                batches_s = self.admission.promised_at(place)
                call.before_tokenising = self._in_time(call, cost, chars, batches_s, started)
            try:
                prepared = await prepare()
            finally:
                call.before_tokenising = None
            tokenization_s = time.monotonic() - started
            if cost is not None:
                cost.observe(call.tokenised_chars - before[0], call.tokenising_cpu_s - before[1])
            if place is not None:  # its estimate, replaced by its exact sequences at its place
                self.admission.clear(place)
            pieces = prepared.split()
            place = self.admit([len(s) for s in pieces[0].sequences], call, unit, place=place)
        except BaseException:
            if place is not None:
                self.admission.release(place)
            raise
        finally:
            self.batcher.arriving -= 1
        self._tokenization.observe(tokenization_s)
        if prepared.truncated:
            self._truncated.inc(prepared.truncated)
        rows: list[Any] = []
        timings = Timings(tokenization_s)
        try:
            for k, piece in enumerate(pieces):
                if k:  # each later piece is admitted as it is queued, like any other work
                    place = self.admit([len(s) for s in piece.sequences], call, unit)
                async with contextlib.AsyncExitStack() as held:
                    if hold is not None:
                        await _enter(held, hold(piece), call)
                    items = await self._submit(piece, call.deadline)
                    if place is not None:  # queued: the batchers count it now
                        self.admission.release(place)
                    place = None
                    rows += await call.wait([it.future for it in items])
                    _add(timings, items)
                    if k == len(pieces) - 1:  # `then` runs inside the last piece's hold
                        ran = Ran(rows, prepared, timings)
                        self._queue.observe(ran.timings.queue_s)
                        for n in ran.lengths:
                            self._length.observe(n)
                        return await then(ran) if then is not None else ran
            raise AssertionError("a request has at least one piece")
        finally:
            if place is not None:  # refused by the queue or the hold: withdrawn
                self.admission.release(place)


async def _enter(
    stack: contextlib.AsyncExitStack, hold: AbstractAsyncContextManager[None], call: Call
) -> None:
    """A piece's hold entered by the request's deadline: a turn behind another request's (the
    attention and explanation pacers) never answers after it (503 then, as any wait)."""
    try:
        async with asyncio.timeout(max(0.0, call.remaining())):
            await stack.enter_async_context(hold)
    except TimeoutError:
        raise call.expired() from None


def _pick(values: Sequence[Any] | None, idx: list[int]) -> list[Any] | None:
    return None if values is None else [values[i] for i in idx]


def _add(timings: Timings, items: Sequence[Item]) -> None:
    """A piece's wait and run, added to the request's (its items wait and run together)."""
    timings.queue_s += max(it.queue_s for it in items)
    timings.inference_s += max(it.inference_s for it in items)
    timings.tokens += sum(it.length for it in items)
    timings.batches += len({it.started for it in items})  # a batch's items start together
    timings.batch_size = max(timings.batch_size, *(it.batch_size for it in items))
    timings.batch_tokens = max(timings.batch_tokens, *(it.batch_tokens for it in items))


# --- Checks every pipeline makes on what a client sends ------------------------------------


def as_list(inputs: str | Sequence[Any], name: str) -> list[Any]:
    texts = [inputs] if isinstance(inputs, str) else list(inputs)
    if not texts:
        raise InvalidInput(f"{name} must not be an empty list", param=name)
    return texts


def chars_of(inputs: Sequence[Any]) -> int:
    """The characters a tokenizer reads of these inputs (texts, or pairs of them; token id
    arrays are not tokenised)."""
    n = 0
    for it in inputs:
        if isinstance(it, str):
            n += len(it)
        elif isinstance(it, (tuple, list)):
            n += sum(len(t) for t in it if isinstance(t, str))
    return n


def check_texts(texts: Sequence[str], settings: Settings, name: str, limit: int = 0) -> None:
    """At most `limit` (default: HEADWISE_MAX_INPUTS) items, each within the character limit."""
    limit = limit or settings.max_inputs
    if len(texts) > limit:
        raise InvalidInput(
            f"{name} has {len(texts)} items; the limit is {limit} per request", param=name
        )
    for i, text in enumerate(texts):
        if len(text) > settings.max_input_chars:
            raise PayloadTooLarge(
                f"{name}[{i}] has {len(text)} characters; the limit is {settings.max_input_chars}",
                param=name,
            )


def check_ids(arrays: Sequence[Sequence[int]], vocab_size: int, param: str) -> None:
    """Token ids given by a client must be in the model's vocabulary (422 naming them)."""
    for i, ids in enumerate(arrays):
        bad = sorted({t for t in ids if not 0 <= t < vocab_size})
        if bad:
            raise InvalidInput(
                f"{param}[{i}] has token ids outside the model's vocabulary (0..{vocab_size - 1}): "
                f"{bad[:10]}",
                param=param,
            )


def postprocess(vectors: np.ndarray, normalize: bool, dimensions: int | None) -> np.ndarray:
    """Keep the first `dimensions` components (Matryoshka), then L2-normalise if asked."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if normalize:
        vectors = l2_normalize(vectors)
    return np.ascontiguousarray(vectors, dtype=np.float32)
