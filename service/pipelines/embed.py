"""Texts in, vectors out: prompt, tokenise, queue (batched with other requests), post-process."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from service.batcher import DynamicBatcher
from service.errors import InvalidInput, PayloadTooLarge, WrongTask
from service.metrics import Metrics
from service.pipelines.common import (
    Disconnect,
    Timings,
    as_list,
    check_ids,
    check_texts,
    postprocess,
    tokenized,
    wait_all,
)
from service.runtime import Backend, Direction
from service.settings import Settings


@dataclass
class Encoded:
    vectors: np.ndarray  # (n, d) float32, post-processed as the request asked
    tokens: list[int]  # per input, after truncation (prompt tokens included)
    timings: Timings = field(default_factory=Timings)


class EmbedPipeline:
    def __init__(
        self,
        name: str,
        backend: Backend,
        batcher: DynamicBatcher,
        settings: Settings,
        metrics: Metrics,
        token_batcher: DynamicBatcher | None = None,
    ) -> None:
        self.backend = backend
        self.batcher = batcher
        self.token_batcher = token_batcher  # TEI's /embed_all: unpooled last-layer vectors
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

    def prompted(self, inputs: list, prompt_name: str | None) -> list:
        """Texts with the prompt prepended (sentence-transformers' way); token ids as given."""
        prefix = self.prompt(prompt_name)
        if not prefix:
            return inputs
        return [prefix + t if isinstance(t, str) else t for t in inputs]

    def validate(
        self, inputs: str | list[str] | list[str | list[int]], param: str, dimensions: int | None = None
    ) -> list[str | list[int]]:
        """Every check that needs no tokenizer, before anything is queued."""
        texts = as_list(inputs, param)
        check_texts([t for t in texts if isinstance(t, str)], self.settings, param)
        ids = [t for t in texts if not isinstance(t, str)]
        check_ids(ids, self.manifest.vocab_size, param)
        self.check_dimensions(dimensions)
        return texts

    async def sequences(
        self, inputs: list[str | list[int]], truncate: bool, direction: Direction
    ) -> tuple[list[list[int]], int, float]:
        """Token ids per input (texts tokenised, id arrays as given), truncated or refused;
        also how many were truncated and the tokenisation time."""
        texts = [t for t in inputs if isinstance(t, str)]
        encodings, seconds = await tokenized(
            self.backend.tokenize, texts, sum(map(len, texts)), True, direction
        )
        limit = self.manifest.max_length
        out: list[list[int]] = []
        truncated = 0
        encoded = iter(encodings)
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                e = next(encoded)
                cut, ids = bool(e.overflowing), e.ids
            else:
                cut = len(item) > limit
                ids = (item[:limit] if direction == "right" else item[-limit:]) if cut else item
            if cut and not truncate:
                await self._too_long(item, i)
            truncated += cut
            out.append(ids)
        return out, truncated, seconds

    async def embed(
        self,
        inputs: list[str | list[int]],
        *,
        truncate: bool = True,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        direction: Direction = "right",
        disconnect: Disconnect | None = None,
    ) -> Encoded:
        """normalize None: the model's own default (its sentence-transformers Normalize)."""
        inputs = self.prompted(inputs, prompt_name)
        timeout_s = self.settings.request_timeout_s
        # Before tokenising (which takes a second for 2,048 long texts): every word is a token
        # at least, so a request refused on that bound is refused at once.
        self.batcher.admit(self._at_least(inputs), timeout_s)
        self.batcher.arriving += 1
        try:
            sequences, truncated, tokenization_s = await self.sequences(
                inputs, truncate, direction
            )
            self.batcher.admit([len(s) for s in sequences], timeout_s)
            items = self.batcher.submit(sequences, self.settings.request_timeout_s)
        finally:
            self.batcher.arriving -= 1
        self._tokenization.observe(tokenization_s)
        if truncated:
            self._truncated.inc(truncated)
        rows = await wait_all(
            [it.future for it in items], self.settings.request_timeout_s, disconnect
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

    def _at_least(self, inputs: list[str | list[int]]) -> list[int]:
        """A lower bound on each input's tokens, without the tokenizer."""
        limit = self.manifest.max_length
        return [min(limit, len(t.split()) if isinstance(t, str) else len(t)) for t in inputs]

    async def _too_long(self, item: str | list[int], i: int) -> None:
        if isinstance(item, str):
            loop = asyncio.get_running_loop()
            n = await loop.run_in_executor(None, self.backend.count_tokens, item)
        else:
            n = len(item)
        raise PayloadTooLarge(
            f"input {i} has {n} tokens; the model's limit is {self.manifest.max_length} "
            "(send truncate: true to cut it)",
            param="truncate",
        )

    async def token_embeddings(
        self,
        inputs: list[str | list[int]],
        *,
        truncate: bool = True,
        prompt_name: str | None = None,
        direction: Direction = "right",
        disconnect: Disconnect | None = None,
    ) -> list[np.ndarray]:
        """Per input, its tokens' last-layer vectors (n_i, d), padding removed."""
        if self.token_batcher is None:
            raise WrongTask(
                f"{self.manifest.name}'s bundle has no token-embedding output: re-export it with "
                "this headwise to serve /embed_all",
            )
        inputs = self.prompted(inputs, prompt_name)
        sequences, _, _ = await self.sequences(inputs, truncate, direction)
        self.token_batcher.admit([len(s) for s in sequences], self.settings.request_timeout_s)
        items = self.token_batcher.submit(sequences, self.settings.request_timeout_s)
        rows = await wait_all(
            [it.future for it in items], self.settings.request_timeout_s, disconnect
        )
        return [row[: len(seq)] for row, seq in zip(rows, sequences, strict=True)]
