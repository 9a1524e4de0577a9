"""Cross-encoders: (query, document) pairs or single texts in, scores out.

A reranker (one logit) scores a pair with sigmoid(logit); a classifier (several labels) gives
every label a probability: softmax over labels, or a sigmoid each when the model was trained
multi-label. Pairs are tokenised as the model was trained (the bundle's tokenizer: [CLS] a
[SEP] b [SEP] with token types, or <s> a </s></s> b </s>), truncated longest-first, and go
through the intake one sequence each (admitted by capacity, batched with other requests').

A causal LM reranker (its manifest has a `rerank_template`) reads each pair through its model
card's template instead (service/pipelines/template.py), with the request's instruction or the
template's own; its one logit is z_yes - z_no, so sigmoid(logit) is its P(yes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.engine.batcher import DynamicBatcher
from service.engine.runtime import Backend
from service.errors import InvalidInput, PayloadTooLarge
from service.pipelines.base import Intake, Prepared, chars_of, check_texts
from service.pipelines.call import Call, Timings
from service.pipelines.template import PairTemplate
from service.settings import Settings

ScoreInput = str | tuple[str, str]  # a text, or a (query, document) pair


@dataclass
class Scored:
    logits: np.ndarray  # (n, labels), float64
    tokens: list[int]
    timings: Timings


def sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return np.asarray(e / e.sum(axis=-1, keepdims=True))


def ranked(scores: Sequence[float] | np.ndarray, top_n: int | None = None) -> list[int]:
    """Indices, best score first (stable for ties), at most top_n."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order[:top_n] if top_n else order


@dataclass(frozen=True)
class Read:
    """What a pipeline keeps of an encoding."""

    ids: list[int]
    types: list[int] | None
    cut: bool


def _texts(items: Sequence[ScoreInput]) -> list[str]:
    return [t for it in items for t in ((it,) if isinstance(it, str) else it)]


class ScorePipeline:
    def __init__(self, backend: Backend, intake: Intake, settings: Settings) -> None:
        self.backend = backend
        self.intake = intake
        self.settings = settings
        self.manifest = backend.manifest
        self.types = "token_type_ids" in self.manifest.inputs
        template = self.manifest.rerank_template
        self.template = (
            PairTemplate(template, backend.tokenize, self.manifest.max_length)
            if template is not None
            else None
        )

    @property
    def batcher(self) -> DynamicBatcher:
        """The serving batcher (tests, /info)."""
        return self.intake.batcher

    @property
    def labels(self) -> list[str]:
        return self.manifest.labels or [f"LABEL_{i}" for i in range(self.manifest.dimensions)]

    def check(self, items: Sequence[ScoreInput], param: str, limit: int | None = None) -> None:
        limit = limit or self.settings.max_inputs
        if len(items) > limit:
            raise PayloadTooLarge(
                f"{param} has {len(items)} items; the limit is {limit} per request", param=param
            )
        check_texts(_texts(items), self.settings, param, limit=len(_texts(items)))

    async def cut_documents(self, call: Call, documents: list[str], max_tokens: int) -> list[str]:
        """Each document cut to its first `max_tokens` tokens (Cohere's max_tokens_per_doc)."""
        encodings, _ = await call.tokenize(self.backend.tokenize, documents, False)
        return [
            doc[: enc.offsets[max_tokens - 1][1]] if len(enc.ids) > max_tokens else doc
            for doc, enc in zip(documents, encodings, strict=True)
        ]

    def check_instruction(self, instruction: str | None, param: str = "instruction") -> None:
        """A request's instruction: for a model whose template takes one, within the limits."""
        if instruction is None:
            return
        if self.template is None:
            raise InvalidInput(
                f"model {self.manifest.name!r} takes no instruction: it is a cross-encoder whose "
                "pairs are tokenised as its tokenizer pairs them (instructions are for causal "
                "LM rerankers, exported with --task rerank and a template)",
                param=param,
            )
        check_texts([instruction], self.settings, param)

    async def _templated(
        self, call: Call, items: Sequence[ScoreInput], truncate: bool, instruction: str | None
    ) -> Prepared:
        """Pairs through the model card's template: the middle cut at its end to fit."""
        assert self.template is not None
        pairs = [(it, "") if isinstance(it, str) else it for it in items]
        middles = self.template.middles(pairs, instruction)
        encodings, _ = await call.tokenize(self.backend.tokenize, middles)
        sequences = [self.template.cut(e) for e in encodings]
        cut = [i for i, s in enumerate(sequences) if s.truncated]
        if cut and not truncate:
            raise PayloadTooLarge(
                f"input {cut[0]} has more than {self.manifest.max_length} tokens with the "
                "model's template around it, the model's limit (send truncate: true to cut the "
                "document's end, then the query's)",
                param="truncate",
            )
        return Prepared([s.ids for s in sequences], None, truncated=len(cut))

    async def _sequences(
        self, call: Call, items: Sequence[ScoreInput], truncate: bool, instruction: str | None = None
    ) -> Prepared:
        if self.template is not None:
            return await self._templated(call, items, truncate, instruction)
        singles = [i for i, it in enumerate(items) if isinstance(it, str)]
        pairs = [i for i, it in enumerate(items) if not isinstance(it, str)]
        read: list[Read | None] = [None] * len(items)
        for chosen, fn in ((singles, self._read), (pairs, self._read_pairs)):
            if chosen:
                found, _ = await call.tokenize(fn, [items[i] for i in chosen])
                for i, r in zip(chosen, found, strict=True):
                    read[i] = r
        done = [r for r in read if r is not None]
        cut = [i for i, r in enumerate(done) if r.cut]
        if cut and not truncate:
            raise PayloadTooLarge(
                f"input {cut[0]} has more than {self.manifest.max_length} tokens, the model's "
                "limit (send truncate: true to cut the longest text of each pair first)",
                param="truncate",
            )
        types = [r.types or [] for r in done] if self.types else None
        return Prepared([r.ids for r in done], types, truncated=len(cut))

    def _read(self, texts: list[str]) -> list[Read]:
        """Each text's ids, types and whether it was cut: on the tokenising worker, which reads
        the encodings and lets them go (on 128 texts reading whether one was cut copies its
        overflow, and freeing them costs a third of their making: ~2 ms that were the event
        loop's)."""
        types = self.types
        return [
            Read(e.ids, e.type_ids if types else None, bool(e.overflowing))
            for e in self.backend.tokenize(texts)
        ]

    def _read_pairs(self, pairs: list[tuple[str, str]]) -> list[Read]:
        """Each pair's, on the worker too (cut as the tokenizer cuts it, without its overflow:
        engine/pairs.py)."""
        types = self.types
        return [
            Read(ids, kinds if types else None, cut) for ids, kinds, cut in self.backend.pair_ids(pairs)
        ]

    def _at_least(self, items: Sequence[ScoreInput]) -> list[int]:
        limit = self.manifest.max_length
        return [min(limit, sum(len(t.split()) for t in _texts([it]))) for it in items]

    async def score(
        self,
        call: Call,
        items: Sequence[ScoreInput],
        truncate: bool = True,
        instruction: str | None = None,
        max_document_tokens: int | None = None,
    ) -> Scored:
        """Raw logits per item (a text or a pair), in order. instruction: a causal LM
        reranker's, in its template (None: the template's own); max_document_tokens: each
        pair's document cut to its first tokens first (Cohere's max_tokens_per_doc), once the
        request is admitted on its words."""

        async def prepare() -> Prepared:
            pairs = items
            if max_document_tokens is not None:
                documents = [it[1] for it in items if not isinstance(it, str)]
                cut = iter(await self.cut_documents(call, documents, max_document_tokens))
                pairs = [it if isinstance(it, str) else (it[0], next(cut)) for it in items]
            return await self._sequences(call, pairs, truncate, instruction)

        self.check_instruction(instruction)
        ran = await self.intake.run(
            call, prepare, at_least=self._at_least(items), chars=chars_of(items)
        )
        logits = np.stack(ran.rows).astype(np.float64)
        return Scored(logits, ran.lengths, ran.timings)

    def relevance(self, logits: np.ndarray, raw: bool = False) -> np.ndarray:
        """A reranker's score per pair: sigmoid(logit), or the logit itself."""
        first = logits[:, 0]
        return first if raw else sigmoid(first)

    def probabilities(self, logits: np.ndarray, raw: bool = False) -> np.ndarray:
        """Every label's score: softmax over labels, or sigmoid each when multi-label."""
        if raw or self.manifest.problem_type == "regression":
            return logits
        if self.manifest.problem_type == "multi_label" or logits.shape[1] == 1:
            return sigmoid(logits)
        return softmax(logits)
