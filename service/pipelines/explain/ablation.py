"""/explain's head granularity run: the request's sequences on /attention's graph, whole and
without each head (explain/heads.py says what is computed), through the attention graph's gated
batcher, held to /attention's budget and paced as every explanation is."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import numpy as np
from tokenizers import Encoding

from service.engine.batcher import DynamicBatcher
from service.errors import PayloadTooLarge
from service.manifest import Manifest
from service.pipelines.attention.limits import Pacer
from service.pipelines.attention.pipeline import AttentionPipeline
from service.pipelines.base import Prepared, Ran
from service.pipelines.call import Call
from service.pipelines.explain import heads, importance
from service.pipelines.explain.answer import Explained, Subject
from service.pipelines.explain.heads import HeadsExplained
from service.pipelines.explain.question import Question


class Explainer(Protocol):
    """What a head ablation uses of the explanation pipeline (explain/pipeline.py)."""

    attention: AttentionPipeline | None
    manifest: Manifest
    pacer: Pacer
    types: bool

    def admitted(self) -> AbstractAsyncContextManager[None]: ...
    async def tokenized(self, call: Call, q: Question) -> tuple[list[Encoding], str]: ...
    def too_long(self, q: Question, encodings: list[Encoding]) -> None: ...
    def scored(
        self, q: Question, block: np.ndarray
    ) -> tuple[list[np.ndarray], float | None, str | None]: ...
    def bound(
        self,
        shapes: list[tuple[int, int]],
        batcher: DynamicBatcher,
        per_piece: Callable[[int], int],
        advice: str,
        why: str = "",
    ) -> None: ...


class HeadAblation:
    def __init__(self, explainer: Explainer) -> None:
        self.explainer = explainer

    async def explain(self, call: Call, q: Question) -> Explained:
        pipe = self.explainer.attention
        assert pipe is not None and pipe.gated is not None  # question() checked
        async with self.explainer.admitted():
            ran: Ran[np.ndarray] = await pipe.gated.run(
                call, lambda: self._prepare(call, q), hold=self._turn
            )
            subjects: list[Subject] = ran.prepared.extra
            stats = [await pipe.stats(call, s.ids, s.types) for s in subjects]
        values, score, target = self._importance(q, subjects, np.stack(ran.rows))
        m = self.explainer.manifest
        shaped = values.reshape(m.num_layers, m.num_heads)
        return Explained(
            texts=q.texts,
            parts=[[] for _ in q.texts],
            importance=[[] for _ in q.texts],
            attention=[None for _ in q.texts],
            spearman=[],
            score=score,
            target=target,
            truncated=bool(ran.prepared.truncated),
            attention_note=None,
            timings=ran.timings,
            heads=HeadsExplained.of(shaped, heads.mean_stats(stats)),
        )

    async def _prepare(self, call: Call, q: Question) -> Prepared:
        """The request's sequences, each whole and then without each head, in pieces of the
        rows the attention graph's budget lets run at once."""
        pipe = self.explainer.attention
        assert pipe is not None and pipe.gated is not None
        encodings, prompt = await self.explainer.tokenized(call, q)
        self.explainer.too_long(q, encodings)
        for enc in encodings:
            if (reason := pipe.unavailable(len(enc.ids))) is not None:
                raise PayloadTooLarge(
                    f"granularity head runs /attention's graph: {reason}: send a shorter text",
                    param="granularity",
                )
        types = [enc.type_ids if self.explainer.types else None for enc in encodings]
        subjects = [Subject(enc.ids, t, []) for enc, t in zip(encodings, types, strict=True)]
        m = self.explainer.manifest
        variants = heads.gates(m.num_layers, m.num_heads)
        self.explainer.bound(
            [(len(s.ids), len(variants)) for s in subjects],
            pipe.gated.batcher,
            pipe.gated_rows,
            "send a shorter text",
            f" (the text whole, then without each of its {len(variants) - 1} heads)",
        )
        sequences, kinds, gates, pieces = [], [], [], []
        for s in subjects:
            sequences += [s.ids] * len(variants)
            kinds += [s.types or []] * len(variants)
            gates += variants
            per = pipe.gated_rows(len(s.ids))
            pieces += [min(per, len(variants) - k) for k in range(0, len(variants), per)]
        prepared = Prepared(
            sequences, kinds if self.explainer.types else None, gates=gates, pieces=pieces
        )
        prepared.truncated = sum(bool(e.overflowing) for e in encodings)
        prepared.extra = subjects
        return prepared

    @contextlib.asynccontextmanager
    async def _turn(self, piece: Prepared) -> AsyncIterator[None]:
        """A gated piece's turn: the attention budget its maps take inside the graph, and the
        explanations' pacer (which yields to others' queued work)."""
        pipe = self.explainer.attention
        assert pipe is not None
        numbers = sum(pipe.heads * len(s) ** 2 for s in piece.sequences)
        async with (
            pipe.budget.hold(numbers, retry_after=self.explainer.pacer.wait_s + 1),
            self.explainer.pacer.turn(),
        ):
            yield

    def _importance(
        self, q: Question, subjects: list[Subject], rows: np.ndarray
    ) -> tuple[np.ndarray, float | None, str | None]:
        """Per head (layer by layer), what the answer loses without it; the unperturbed score;
        the target label."""
        count = len(rows) // len(subjects)
        blocks = [
            rows[i * count : (i + 1) * count].astype(np.float64) for i in range(len(subjects))
        ]
        if self.explainer.manifest.task == "embed":
            if q.form == "input":
                return importance.of_embedding(blocks[0]), None, None
            cosine, lost = heads.of_similarity(*blocks)
            return lost, cosine, None
        (lost,), score, target = self.explainer.scored(q, blocks[0])
        return lost, score, target
