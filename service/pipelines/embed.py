"""Texts in, vectors out: prompt, tokenise, queue (batched with other requests), post-process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from service.engine.batcher import DynamicBatcher
from service.engine.runtime import Backend, Side
from service.errors import InvalidInput, PayloadTooLarge, WrongTask
from service.pipelines.base import (
    Intake,
    Prepared,
    as_list,
    check_ids,
    check_texts,
    postprocess,
)
from service.pipelines.call import Call, Timings
from service.settings import Settings

Input = str | list[int]  # a text, or the model's own token ids (TEI allows them)


@dataclass
class Encoded:
    vectors: np.ndarray  # (n, d) float32, post-processed as the request asked
    tokens: list[int]  # per input, after truncation (prompt tokens included)
    timings: Timings = field(default_factory=Timings)


@dataclass(frozen=True)
class Tokenizing:
    """How inputs become token ids: cut at the model's length (or at max_tokens, when fewer;
    false: refused instead), from which side, after which prompt."""

    truncate: bool = True
    side: Side = "right"
    prompt_name: str | None = None
    max_tokens: int | None = None


Role = Literal["query", "document", "classification", "clustering"]
# The prompt names models give each role (sentence-transformers' `prompts`), most usual first.
ROLE_PROMPTS: dict[Role, tuple[str, ...]] = {
    "query": ("query", "search_query", "Query"),
    "document": ("document", "passage", "search_document", "doc", "Document"),
    "classification": ("classification", "Classification"),
    "clustering": ("clustering", "Clustering"),
}


def shorten(ids: list[int], limit: int, side: Side) -> list[int]:
    """A tokenised text cut to `limit` tokens, its first and last (special) tokens kept."""
    if limit < 2:
        return ids[:limit]
    if side == "right":
        return ids[: limit - 1] + ids[-1:]
    return ids[:1] + ids[len(ids) - limit + 1 :]


class EmbedPipeline:
    def __init__(
        self,
        backend: Backend,
        intake: Intake,
        settings: Settings,
        tokens: Intake | None = None,
    ) -> None:
        self.backend = backend
        self.intake = intake
        self.tokens = tokens  # TEI's /embed_all: unpooled last-layer vectors
        self.settings = settings
        self.manifest = backend.manifest

    @property
    def batcher(self) -> DynamicBatcher:
        """The serving batcher (tests, /info)."""
        return self.intake.batcher

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

    def prompt_for(self, role: Role | None) -> str | None:
        """The model's prompt for a role (a query, a document, ...), or None: its default."""
        if role is None:
            return None
        return next((n for n in ROLE_PROMPTS[role] if n in self.manifest.prompts), None)

    def prompted(self, inputs: list[Input], prompt_name: str | None) -> list[Input]:
        """Texts with the prompt prepended (sentence-transformers' way); token ids as given."""
        prefix = self.prompt(prompt_name)
        if not prefix:
            return inputs
        return [prefix + t if isinstance(t, str) else t for t in inputs]

    def validate(
        self, inputs: str | Sequence[Input], param: str, dimensions: int | None = None
    ) -> list[Input]:
        """Every check that needs no tokenizer, before anything is queued."""
        texts: list[Input] = as_list(inputs, param)
        check_texts([t for t in texts if isinstance(t, str)], self.settings, param)
        ids = [t for t in texts if not isinstance(t, str)]
        check_ids(ids, self.manifest.vocab_size, param)
        self.check_dimensions(dimensions)
        return texts

    async def _sequences(self, call: Call, inputs: list[Input], how: Tokenizing) -> Prepared:
        """Token ids per input (texts tokenised, id arrays as given), truncated or refused."""
        texts = [t for t in inputs if isinstance(t, str)]
        encodings, _ = await call.tokenize(self.backend.tokenize, texts, True, how.side)
        limit = min(self.manifest.max_length, how.max_tokens or self.manifest.max_length)
        out: list[list[int]] = []
        truncated = 0
        encoded = iter(encodings)
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                e = next(encoded)
                cut, ids = bool(e.overflowing), e.ids
                if len(ids) > limit:  # max_tokens: cut as the tokenizer would, specials kept
                    cut, ids = True, shorten(ids, limit, how.side)
            else:
                cut = len(item) > limit
                ids = (item[:limit] if how.side == "right" else item[-limit:]) if cut else item
            if cut and not how.truncate:
                await self._too_long(call, item, i, limit)
            truncated += cut
            out.append(ids)
        return Prepared(out, truncated=truncated)

    def _at_least(self, inputs: list[Input]) -> list[int]:
        """A lower bound on each input's tokens, without the tokenizer (every word is one)."""
        limit = self.manifest.max_length
        return [min(limit, len(t.split()) if isinstance(t, str) else len(t)) for t in inputs]

    async def embed(
        self,
        call: Call,
        inputs: list[Input],
        how: Tokenizing = Tokenizing(),
        normalize: bool | None = None,
        dimensions: int | None = None,
    ) -> Encoded:
        """normalize None: the model's own default (its sentence-transformers Normalize)."""
        inputs = self.prompted(inputs, how.prompt_name)
        ran = await self.intake.run(
            call, lambda: self._sequences(call, inputs, how), at_least=self._at_least(inputs)
        )
        if normalize is None:
            normalize = self.manifest.normalize
        vectors = postprocess(np.stack(ran.rows), normalize, dimensions)
        return Encoded(vectors, ran.lengths, ran.timings)

    async def token_embeddings(
        self, call: Call, inputs: list[Input], how: Tokenizing = Tokenizing()
    ) -> list[np.ndarray]:
        """Per input, its tokens' last-layer vectors (n_i, d), padding removed."""
        if self.tokens is None:
            raise WrongTask(
                f"{self.manifest.name}'s bundle has no token-embedding output: re-export it with "
                "this headwise to serve TEI's embed_all",
            )
        inputs = self.prompted(inputs, how.prompt_name)
        ran = await self.tokens.run(
            call, lambda: self._sequences(call, inputs, how), at_least=self._at_least(inputs)
        )
        return [row[:n] for row, n in zip(ran.rows, ran.lengths, strict=True)]

    async def _too_long(self, call: Call, item: Input, i: int, limit: int) -> None:
        n = await call.offload(self.backend.count_tokens, item) if isinstance(item, str) else len(item)
        whose = "the model's limit" if limit == self.manifest.max_length else "the request's limit"
        raise PayloadTooLarge(
            f"input {i} has {n} tokens; {whose} is {limit} (send truncate: true to cut it)",
            param="truncate",
        )
