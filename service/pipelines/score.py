"""Cross-encoders: (query, document) pairs or single texts in, scores out.

A reranker (one logit) scores a pair with sigmoid(logit); a classifier (several labels) gives
every label a probability: softmax over labels, or a sigmoid each when the model was trained
multi-label. Pairs are tokenised as the model was trained (the bundle's tokenizer: [CLS] a
[SEP] b [SEP] with token types, or <s> a </s></s> b </s>), truncated longest-first, and go
through the dynamic batcher one sequence each, mixed with other requests' pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.batcher import DynamicBatcher
from service.errors import PayloadTooLarge
from service.metrics import Metrics
from service.pipelines.common import Disconnect, Timings, check_texts, tokenized, wait_all
from service.runtime import Backend
from service.settings import Settings

Item = str | tuple[str, str]


@dataclass
class Scored:
    logits: np.ndarray  # (n, labels), float64
    tokens: list[int]
    timings: Timings


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class ScorePipeline:
    def __init__(
        self, name: str, backend: Backend, batcher: DynamicBatcher, settings: Settings, metrics: Metrics
    ) -> None:
        self.name = name
        self.backend = backend
        self.batcher = batcher
        self.settings = settings
        self.manifest = backend.manifest
        self.types = "token_type_ids" in self.manifest.inputs
        path = self.manifest.task
        self._tokenization = metrics.tokenization_duration.labels(path, name)
        self._queue = metrics.queue_duration.labels(path, name)
        self._truncated = metrics.truncated.labels(path, name)

    @property
    def labels(self) -> list[str]:
        return self.manifest.labels or [f"LABEL_{i}" for i in range(self.manifest.dimensions)]

    def check(self, items: list[Item], param: str, limit: int | None = None) -> None:
        limit = limit or self.settings.max_inputs
        if len(items) > limit:
            raise PayloadTooLarge(
                f"{param} has {len(items)} items; the limit is {limit} per request", param=param
            )
        texts = [t for it in items for t in ((it,) if isinstance(it, str) else it)]
        check_texts(texts, self.settings, param)

    async def cut_documents(self, documents: list[str], max_tokens: int) -> list[str]:
        """Each document cut to its first `max_tokens` tokens (Cohere's max_tokens_per_doc)."""
        encodings, _ = await tokenized(
            self.backend.tokenize, documents, sum(map(len, documents)), False
        )
        return [
            doc[: enc.offsets[max_tokens - 1][1]] if len(enc.ids) > max_tokens else doc
            for doc, enc in zip(documents, encodings, strict=True)
        ]

    async def score(
        self,
        items: list[Item],
        truncate: bool = True,
        disconnect: Disconnect | None = None,
    ) -> Scored:
        """Raw logits per item (a text or a pair), in order."""
        singles = [i for i, it in enumerate(items) if isinstance(it, str)]
        pairs = [i for i, it in enumerate(items) if not isinstance(it, str)]
        chars = sum(len(t) for it in items for t in ((it,) if isinstance(it, str) else it))
        self.batcher.arriving += 1
        try:
            encodings: list = [None] * len(items)
            seconds = 0.0
            if singles:
                found, s = await tokenized(self.backend.tokenize, [items[i] for i in singles], chars)
                seconds += s
                for i, e in zip(singles, found, strict=True):
                    encodings[i] = e
            if pairs:
                found, s = await tokenized(
                    self.backend.tokenize_pairs, [items[i] for i in pairs], chars
                )
                seconds += s
                for i, e in zip(pairs, found, strict=True):
                    encodings[i] = e
            cut = [i for i, e in enumerate(encodings) if e.overflowing]
            if cut and not truncate:
                raise PayloadTooLarge(
                    f"input {cut[0]} has more than {self.manifest.max_length} tokens, the model's "
                    "limit (send truncate: true to cut the longest text of each pair first)",
                    param="truncate",
                )
            sequences = [e.ids for e in encodings]
            types = [e.type_ids for e in encodings] if self.types else None
            queued = self.batcher.submit(sequences, self.settings.request_timeout_s, types)
        finally:
            self.batcher.arriving -= 1
        self._tokenization.observe(seconds)
        if cut:
            self._truncated.inc(len(cut))
        rows = await wait_all(
            [it.future for it in queued], self.settings.request_timeout_s, disconnect
        )
        timings = Timings(
            seconds, max(it.queue_s for it in queued), max(it.inference_s for it in queued)
        )
        self._queue.observe(timings.queue_s)
        logits = np.stack(rows).astype(np.float64)
        return Scored(logits, [len(s) for s in sequences], timings)

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
