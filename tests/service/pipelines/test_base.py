"""The intake's pieces: a request may ask for its sequences to be queued a piece at a time, each
admitted, held and queued in turn, so that other requests' work is batched in between."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from service.engine.admission import Admission
from service.engine.batch_policy import BatchPolicy
from service.engine.batcher import DynamicBatcher
from service.engine.cost import CostModel
from service.engine.preparing import PrepareCost
from service.errors import Overloaded
from service.metrics import Metrics
from service.pipelines.base import Intake, Prepared
from service.pipelines.call import Call
from service.tensors import Batch
from tests.service.pipelines.test_call import burn


class Gate:
    """Records each batch's rows (the ids each mask keeps); holds a batch while `open` is clear."""

    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()

    def __call__(self, batch: Batch) -> list[int]:
        self.entered.set()
        assert self.open.wait(10)
        kept = [row[m == 1].tolist() for row, m in zip(batch.input_ids, batch.attention_mask, strict=True)]
        self.batches.append(kept)
        return [sum(k) for k in kept]


def intake(gate: Gate) -> Intake:
    policy = BatchPolicy(max_wait_s=0.0, max_padding_ratio=1.0)
    batcher = DynamicBatcher(gate, policy)
    admission = Admission(30.0)
    admission.batchers.append(batcher)
    batcher.start()
    return Intake(batcher, admission, Metrics(), "test", "m")


def test_split_slices_sequences_types_and_masks_alike():
    p = Prepared([[1], [2], [3]], [[0], [1], [0]], masks=[[1], [0], [1]], pieces=[2, 1])
    first, second = p.split()
    assert first.sequences == [[1], [2]] and first.types == [[0], [1]] and first.masks == [[1], [0]]
    assert second.sequences == [[3]] and second.masks == [[1]]
    assert Prepared([[1]]).split()[0].sequences == [[1]]
    with pytest.raises(ValueError, match="do not split"):
        Prepared([[1], [2]], pieces=[1]).split()


def test_pieces_are_queued_one_after_another_and_the_rows_come_back_in_order():
    gate = Gate()
    held: list[int] = []

    @contextlib.asynccontextmanager
    async def hold(piece: Prepared):
        held.append(len(piece.sequences))
        yield

    async def main():
        it = intake(gate)
        masks = [[1, 1, 1], [0, 1, 1], [1, 0, 1], [1, 1, 0], [1, 1]]
        prepared = Prepared([[2, 3, 4]] * 4 + [[7, 7]], masks=masks, pieces=[2, 2, 1])

        async def ready() -> Prepared:
            return prepared

        ran = await it.run(Call.within(10), ready, hold=hold)
        await it.batcher.stop()
        return ran

    ran = asyncio.run(main())
    assert [int(r) for r in ran.rows] == [9, 7, 6, 5, 14]
    assert held == [2, 2, 1]
    assert gate.batches == [[[2, 3, 4], [3, 4]], [[2, 4], [2, 3]], [[7, 7]]]
    assert ran.prepared.sequences[4] == [7, 7]


def test_another_requests_work_runs_between_two_pieces():
    gate = Gate()

    async def main():
        it = intake(gate)
        gate.open.clear()  # the first piece is held in the backend
        prepared = Prepared([[5, 5]] * 4, pieces=[2, 2])

        async def ready() -> Prepared:
            return prepared

        explained = asyncio.ensure_future(it.run(Call.within(10), ready))
        assert await asyncio.to_thread(gate.entered.wait, 10)

        async def other() -> Prepared:
            return Prepared([[1, 2, 3]])

        encoded = asyncio.ensure_future(it.run(Call.within(10), other))
        while it.batcher.depth == 0:  # the other request is queued behind the first piece
            await asyncio.sleep(0)
        gate.open.set()
        await asyncio.gather(explained, encoded)
        await it.batcher.stop()

    asyncio.run(main())
    assert gate.batches == [[[5, 5], [5, 5]], [[1, 2, 3]], [[5, 5], [5, 5]]]


def test_a_tokenised_request_is_admitted_again_behind_only_what_was_promised_before_it():
    """Its tokenising is priced when it is admitted (1 s for 10,000 characters here); once its
    sequences exist it is admitted again at its place: the 8 s promised after it (requests
    still tokenising) do not turn it away, though 8 s + its own 3 s exceed its deadline."""
    gate = Gate()
    tokenising = PrepareCost()
    tokenising.calibrated(1e-4)

    def tokenize(texts: list[str]) -> list[str]:
        burn(0.01)
        return texts

    async def main():
        policy = BatchPolicy(max_wait_s=0.0, max_padding_ratio=1.0)
        batcher = DynamicBatcher(gate, policy, cost=CostModel(fixed_tokens_per_s=100))
        admission = Admission(10.0)
        admission.batchers.append(batcher)
        batcher.start()
        it = Intake(batcher, admission, Metrics(), "test", "m", prepare_cost=tokenising)
        go = asyncio.Event()
        promised: list[float] = []

        call = Call.within(10)

        async def prepare() -> Prepared:
            promised.append(admission.ahead_s())  # its 1 s of batches and 1 s of tokenising
            await go.wait()
            await call.tokenize(tokenize, ["x" * 1000] * 10)  # 10,000 characters in ~10 ms
            return Prepared([[5] * 300])  # 3 s of batches, not 1

        task = asyncio.ensure_future(it.run(call, prepare, at_least=[100], chars=10_000))
        await asyncio.sleep(0.01)
        later = admission.admit(batcher, [800], 10.0)  # admitted after it: 8 s
        go.set()
        ran = await task
        after = admission.ahead_s()
        admission.release(later)
        await batcher.stop()
        return ran, promised, after

    ran, promised, after = asyncio.run(main())
    assert [int(r) for r in ran.rows] == [1500]
    assert promised == [pytest.approx(2.0)]
    assert after == pytest.approx(8.0)  # its own promise released once queued, kept by the batcher
    assert tokenising.source == "measured" and tokenising.per_char_s < 1e-4  # it took ~10 ms


def test_a_request_whose_turn_to_be_tokenised_comes_too_late_is_refused_untokenised():
    """Admitted at the rate measured then; by its turn the rate measured under the load says
    its tokenising and batches would end past its deadline: 429, its thread given to the next,
    its promise withdrawn."""
    tokenising = PrepareCost()
    tokenising.calibrated(1e-4)  # 1 s for its 10,000 characters: admitted (2 s of 10)
    called: list[int] = []

    async def main():
        policy = BatchPolicy(max_wait_s=0.0, max_padding_ratio=1.0)
        batcher = DynamicBatcher(Gate(), policy, cost=CostModel(fixed_tokens_per_s=100))
        admission = Admission(10.0)
        admission.batchers.append(batcher)
        batcher.start()
        it = Intake(batcher, admission, Metrics(), "test", "m", prepare_cost=tokenising)
        call = Call.within(10)

        async def prepare() -> Prepared:
            tokenising.per_char_s = 1e-3  # measured meanwhile: 10 s for its characters
            await call.tokenize(lambda texts: called.append(len(texts)) or texts, ["x" * 1000] * 10)
            return Prepared([[5] * 100])

        try:
            with pytest.raises(Overloaded, match="for its turn to be tokenised"):
                await it.run(call, prepare, at_least=[100], chars=10_000)
            return admission.ahead_s()
        finally:
            await batcher.stop()

    assert asyncio.run(main()) == 0.0
    assert called == []
