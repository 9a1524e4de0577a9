"""Texts in, vectors out: prompt, tokenise, queue (batched with other requests), post-process.

A prompt is sentence-transformers' text prepended to the input. An instruction is a request's
own task description, formatted as the model card formats a query (the manifest's
`instruction_format`, Qwen3-Embedding's "Instruct: {instruction}\nQuery:{text}"); it replaces
the query prompt, and is refused by a model that has no format for it. Either is part of the
text: truncation counts its tokens, and cuts the text's end (or its start, side "left").
"""

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
    chars_of,
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
    instruction: str | None = None


Role = Literal["query", "document", "classification", "clustering"]
# The prompt names models give each role (sentence-transformers' `prompts`), most usual first.
ROLE_PROMPTS: dict[Role, tuple[str, ...]] = {
    "query": ("query", "search_query", "Query"),
    "document": ("document", "passage", "search_document", "doc", "Document"),
    "classification": ("classification", "Classification"),
    "clustering": ("clustering", "Clustering"),
}


def shorten(ids: list[int], limit: int, side: Side, special: Sequence[int] = ()) -> list[int]:
    """A tokenised text cut to `limit` tokens, the special tokens at its ends kept (the ones the
    tokenizer added: BERT's [CLS] and [SEP], a decoder's end token; `special` is the encoding's
    special_tokens_mask: without it, the first and the last token are kept)."""
    if not special:
        special = [1] + [0] * (len(ids) - 2) + [1] if len(ids) >= 2 else [0] * len(ids)
    lead = next((i for i, s in enumerate(special) if not s), len(ids))
    trail = next((i for i, s in enumerate(reversed(special)) if not s), 0)
    body = limit - lead - trail
    if body < 1:
        return ids[:limit]
    text = ids[lead : len(ids) - trail]
    kept = text[:body] if side == "right" else text[len(text) - body :]
    return ids[:lead] + kept + ids[len(ids) - trail :]


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

    def instructed(self, inputs: list[Input], instruction: str) -> list[Input]:
        """Texts in the model's instruction format; token ids as given."""
        fmt = self.manifest.instruction_format
        if fmt is None:
            raise InvalidInput(
                f"model {self.manifest.name!r} takes no instruction: its bundle has no "
                "instruction format (export one whose query prompt reads 'Instruct: ...\n"
                "Query:', or give --instruction-format)",
                param="instruction",
            )
        check_texts([instruction], self.settings, "instruction")
        return [
            fmt.format(instruction=instruction, text=t) if isinstance(t, str) else t
            for t in inputs
        ]

    def prompted(
        self, inputs: list[Input], prompt_name: str | None, instruction: str | None = None
    ) -> list[Input]:
        """Texts with the prompt prepended (sentence-transformers' way), or in the instruction
        format when the request gives one; token ids as given."""
        if instruction is not None:
            if prompt_name is not None:
                raise InvalidInput(
                    "send instruction or prompt_name, not both: the instruction takes the "
                    "query prompt's place",
                    param="instruction",
                )
            return self.instructed(inputs, instruction)
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
        limit = min(self.manifest.max_length, how.max_tokens or self.manifest.max_length)
        read, _ = await call.tokenize(self._read, texts, how.side, limit)
        out: list[list[int]] = []
        truncated = 0
        encoded = iter(read)
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                ids, cut = next(encoded)
            else:
                cut = len(item) > limit
                ids = (item[:limit] if how.side == "right" else item[-limit:]) if cut else item
            if cut and not how.truncate:
                await self._too_long(call, item, i, limit)
            truncated += cut
            out.append(ids)
        return Prepared(out, truncated=truncated)

    def _read(self, texts: list[str], side: Side, limit: int) -> list[tuple[list[int], bool]]:
        """Each text's ids (at most `limit`) and whether it was cut: on the tokenising worker,
        which reads the encodings and lets them go (on 128 documents reading whether one was cut
        copies its overflow, and freeing them costs a third of their making: ~2 ms that were the
        event loop's)."""
        out = []
        for e in self.backend.tokenize(texts, True, side):
            ids, cut = e.ids, bool(e.overflowing)
            if len(ids) > limit:  # max_tokens: cut as the tokenizer would, specials kept
                ids, cut = shorten(ids, limit, side, e.special_tokens_mask), True
            out.append((ids, cut))
        return out

    def _at_least(self, inputs: list[Input]) -> list[int]:
        """A lower bound on each input's tokens, without the tokenizer (every word is one)."""
        limit = self.manifest.max_length
        return [min(limit, len(t.split()) if isinstance(t, str) else len(t)) for t in inputs]

    def price(self, inputs: list[Input], how: Tokenizing = Tokenizing()) -> list[int]:
        """What admission prices `embed` of these inputs at before tokenising: a lower bound of
        each one's tokens, its prompt or instruction included."""
        return self._at_least(self.prompted(inputs, how.prompt_name, how.instruction))

    async def embed(
        self,
        call: Call,
        inputs: list[Input],
        how: Tokenizing = Tokenizing(),
        normalize: bool | None = None,
        dimensions: int | None = None,
        at_least: list[int] | None = None,
    ) -> Encoded:
        """normalize None: the model's own default (its sentence-transformers Normalize).
        at_least: the price a plan already made (`price`), else made here."""
        inputs = self.prompted(inputs, how.prompt_name, how.instruction)
        if at_least is None:
            at_least = self._at_least(inputs)
        ran = await self.intake.run(
            call, lambda: self._sequences(call, inputs, how), at_least=at_least,
            chars=chars_of(inputs),
        )  # fmt: skip
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
        inputs = self.prompted(inputs, how.prompt_name, how.instruction)
        ran = await self.tokens.run(
            call, lambda: self._sequences(call, inputs, how), at_least=self._at_least(inputs),
            chars=chars_of(inputs),
        )  # fmt: skip
        return [row[:n] for row, n in zip(ran.rows, ran.lengths, strict=True)]

    async def _too_long(self, call: Call, item: Input, i: int, limit: int) -> None:
        n = (
            await call.offload(self.backend.count_tokens, item)
            if isinstance(item, str)
            else len(item)
        )
        whose = "the model's limit" if limit == self.manifest.max_length else "the request's limit"
        raise PayloadTooLarge(
            f"input {i} has {n} tokens; {whose} is {limit} (send truncate: true to cut it)",
            param="truncate",
        )
