"""Texts in, vectors out: prompt, tokenise, queue (batched with other requests), post-process."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from service.batcher import DynamicBatcher
from service.errors import InvalidInput, PayloadTooLarge
from service.metrics import Metrics
from service.pipelines.common import (
    Timings,
    as_list,
    check_texts,
    postprocess,
    tokenized,
    wait_all,
)
from service.runtime import Backend
from service.settings import Settings


@dataclass
class Encoded:
    vectors: np.ndarray  # (n, d) float32, post-processed as the request asked
    tokens: list[int]  # per input, after truncation (prompt tokens included)
    timings: Timings = field(default_factory=Timings)


class EmbedPipeline:
    def __init__(
        self, name: str, backend: Backend, batcher: DynamicBatcher, settings: Settings, metrics: Metrics
    ) -> None:
        self.backend = backend
        self.batcher = batcher
        self.settings = settings
        self.manifest = backend.manifest
        self._tokenization = metrics.tokenization_duration.labels("encode", name)
        self._queue = metrics.queue_duration.labels("encode", name)
        self._truncated = metrics.truncated.labels("encode", name)
        self._length = metrics.input_length.labels("encode", name)

    @property
    def dimensions(self) -> int:
        return self.manifest.dimensions

    def check_dimensions(self, dimensions: int | None, param: str = "dimensions") -> None:
        if dimensions is not None and not 1 <= dimensions <= self.dimensions:
            raise InvalidInput(
                f"{param} must be between 1 and {self.dimensions}, got {dimensions}", param=param
            )

    def prompt(self, prompt_name: str | None) -> str:
        """The text sentence-transformers would prepend: the named prompt, else the default."""
        prompts = self.manifest.prompts
        if prompt_name is None:
            return prompts.get(self.manifest.default_prompt_name or "", "")
        if prompt_name not in prompts:
            known = ", ".join(sorted(prompts)) or "none"
            raise InvalidInput(
                f"prompt_name {prompt_name!r} is not one of this model's prompts ({known})",
                param="prompt_name",
            )
        return prompts[prompt_name]

    def validate(
        self, inputs: str | list[str], param: str, dimensions: int | None = None
    ) -> list[str]:
        """Every check that needs no tokenizer, before anything is queued."""
        texts = as_list(inputs, param)
        check_texts(texts, self.settings, param)
        self.check_dimensions(dimensions)
        return texts

    async def embed(
        self,
        texts: list[str],
        *,
        truncate: bool = True,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        disconnected: asyncio.Future | None = None,
    ) -> Encoded:
        """normalize None: the model's own default (its sentence-transformers Normalize)."""
        prefix = self.prompt(prompt_name)
        if prefix:
            texts = [prefix + t for t in texts]
        self.batcher.arriving += 1
        try:
            chars = sum(map(len, texts))
            encodings, tokenization_s = await tokenized(self.backend.tokenize, texts, chars)
            truncated = [i for i, e in enumerate(encodings) if e.overflowing]
            if truncated and not truncate:
                await self._too_long(texts, truncated[0])
            sequences = [e.ids for e in encodings]
            items = self.batcher.submit(sequences, self.settings.request_timeout_s)
        finally:
            self.batcher.arriving -= 1
        self._tokenization.observe(tokenization_s)
        if truncated:
            self._truncated.inc(len(truncated))
        rows = await wait_all(
            [it.future for it in items], self.settings.request_timeout_s, disconnected
        )
        timings = Timings(
            tokenization_s,
            max(it.queue_s for it in items),
            max(it.inference_s for it in items),
        )
        self._queue.observe(timings.queue_s)
        tokens = [len(s) for s in sequences]
        for n in tokens:
            self._length.observe(n)
        if normalize is None:
            normalize = self.manifest.normalize
        return Encoded(postprocess(np.stack(rows), normalize, dimensions), tokens, timings)

    async def _too_long(self, texts: list[str], i: int) -> None:
        loop = asyncio.get_running_loop()
        n = await loop.run_in_executor(None, self.backend.count_tokens, texts[i])
        raise PayloadTooLarge(
            f"input {i} has {n} tokens; the model's limit is {self.manifest.max_length} "
            "(send truncate: true to cut it)",
            param="truncate",
        )
