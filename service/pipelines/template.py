"""A causal LM reranker's pairs, built as its model card builds them (Qwen3-Reranker):

    ids = tokens(prefix) + tokens(format(instruction, query, document))[cut] + tokens(suffix)

prefix and suffix are tokenised on their own, without special tokens, and never cut. The middle
is tokenised as the card's `tokenizer(pairs, truncation=..., max_length=...)` call does (with
the tokenizer's own special tokens, if its post-processor adds any) and, when prefix + middle +
suffix pass the max length, cut at its end, the document's tokens first and then the query's,
the tokens the post-processor appends kept (Hugging Face truncation). The graph reads the last
token's logits (models/decoder.py), so the pair is scored exactly as the card scores it alone.

Export (its parity probes), the score pipeline and /attention (through `TemplatedBackend`) all
tokenise through this one module.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from service.engine.runtime import Backend, Side
from service.manifest import RerankTemplate
from service.tensors import Batch

# texts, add_special_tokens -> encodings, truncated (right) at the model's max length
Tokenize = Callable[[list[str], bool], list[Encoding]]


def _parts(encoding: Encoding) -> dict[str, list[Any]]:
    """What an Encoding's tokens carry, as lists (to build one from pieces)."""
    return {
        "ids": encoding.ids,
        "tokens": encoding.tokens,
        "offsets": [list(o) for o in encoding.offsets],
        "special_tokens_mask": encoding.special_tokens_mask,
    }


def _encoding(parts: dict[str, Any], overflowing: list[Encoding] | None = None) -> Encoding:
    """An Encoding of these tokens (tokenizers builds Encodings only by tokenising: this is its
    own serialised form, which pickling uses)."""
    n = len(parts["ids"])
    state = {
        "type_ids": [0] * n,
        "words": [None] * n,
        "attention_mask": [1] * n,
        "sequence_ranges": {},
        **parts,
        "overflowing": [json.loads(o.__getstate__()) for o in overflowing or []],
    }
    encoding = Encoding()
    encoding.__setstate__(json.dumps(state).encode())
    return encoding


@dataclass(frozen=True)
class Tokens:
    ids: list[int]
    truncated: bool


def with_tokenizer(tokenizer: Tokenizer) -> Tokenize:
    """A Tokenize of a tokenizers.Tokenizer (export's and the benchmark's; the service's is its
    backend's `tokenize`)."""

    def tokenize(texts: list[str], add_special_tokens: bool) -> list[Encoding]:
        return tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)

    return tokenize


def added_around(tokenize: Tokenize) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor adds before a text and after it ([CLS] and [SEP],
    <s> and </s>; nothing and <|endoftext|> for Qwen3-Embedding's; nothing at all for Qwen3's)."""
    full, bare = tokenize(["x"], True)[0].ids, tokenize(["x"], False)[0].ids
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    raise ValueError("the tokenizer's post-processor does not keep a text's own tokens")


class PairTemplate:
    def __init__(self, template: RerankTemplate, tokenize: Tokenize, max_length: int) -> None:
        self.template = template
        self.tokenize = tokenize
        self.prefix, self.suffix = tokenize([template.prefix, template.suffix], False)
        before, after = added_around(tokenize)
        self.leading, self.trailing = len(before), len(after)
        # The middle's budget: what prefix and suffix leave of the max length.
        self.limit = max_length - len(self.prefix.ids) - len(self.suffix.ids)
        if self.limit < self.leading + self.trailing + 1:
            raise ValueError(
                f"the rerank template's prefix and suffix take {max_length - self.limit} of the "
                f"{max_length} tokens: no room is left for a query and a document"
            )

    def middles(self, pairs: Sequence[tuple[str, str]], instruction: str | None) -> list[str]:
        """Each pair as the template's middle text (the card's format_instruction)."""
        t = self.template
        given = t.instruction if instruction is None else instruction
        return [t.format.format(instruction=given, query=q, document=d) for q, d in pairs]

    def cut(self, encoding: Encoding) -> Tokens:
        """The whole sequence of one tokenised middle (`self.tokenize(middles, True)`)."""
        ids = encoding.ids
        cut = bool(encoding.overflowing) or len(ids) > self.limit
        if len(ids) > self.limit:
            keep = self.limit - self.trailing
            ids = ids[:keep] + ids[len(ids) - self.trailing :]
        return Tokens(self.prefix.ids + ids + self.suffix.ids, cut)

    def sequences(
        self, pairs: Sequence[tuple[str, str]], instruction: str | None = None
    ) -> list[Tokens]:
        """Token ids of each pair, tokenised here (export's probes; the service tokenises off
        the event loop and calls `cut`)."""
        return [self.cut(e) for e in self.tokenize(self.middles(pairs, instruction), True)]

    def encodings(
        self,
        pairs: Sequence[tuple[str, str]],
        instruction: str | None = None,
        own_words: bool = False,
    ) -> list[Encoding]:
        """Each pair as one Encoding (tokens, offsets: /attention) of the ids `cut` gives:
        sequence 0 up to the document's first token, 1 from there on, as a pair's encoding says
        where its second text starts; `overflowing` holds what was cut, if anything. Offsets
        are within the prefix, the middle or the suffix, each.

        own_words (/explain): only the query's and the document's own tokens are ordinary,
        with their offsets in their own text and their word indices; everything the template
        adds around them (prefix, instruction, labels, suffix) is marked special."""
        t = self.template
        prefix, suffix = (_parts(e) for e in self.tokenize([t.prefix, t.suffix], False))
        middles = self.tokenize(self.middles(pairs, instruction), True)
        out = []
        for (query, document), whole in zip(pairs, middles, strict=True):
            n = len(whole.ids)
            kept = list(range(n))
            if n > self.limit or whole.overflowing:
                kept = kept[: self.limit - self.trailing] + kept[n - self.trailing :]
            cut = sorted(set(range(n)) - set(kept))
            # The document's first token: the first that reaches into it (byte-level BPE gives
            # it the space before the document; special tokens span no characters).
            start = self._document_start(instruction, query)
            offsets = whole.offsets  # a property that copies the whole list: read once
            spans = [offsets[k] for k in kept]
            split = next((i for i, (a, b) in enumerate(spans) if b > start and b > a), len(kept))
            parts = _parts(whole)
            if own_words:
                parts |= self._own_words(whole, instruction, query, start, len(document))
                for edge in (prefix, suffix):
                    edge["special_tokens_mask"] = [1] * len(edge["ids"])
                    edge["words"] = [None] * len(edge["ids"])
            middle = {key: [parts[key][k] for k in kept] for key in parts}
            state: dict[str, Any] = {k: prefix[k] + middle[k] + suffix[k] for k in parts}
            first = len(prefix["ids"]) + split
            state["sequence_ranges"] = {
                "0": {"start": 0, "end": first},
                "1": {"start": first, "end": len(state["ids"])},
            }
            dropped = {key: [parts[key][k] for k in cut] for key in parts}
            out.append(_encoding(state, [_encoding(dropped)] if cut else []))
        return out

    def _document_start(self, instruction: str | None, query: str) -> int:
        """Where the document starts in the middle text, in characters."""
        return self._field_start(instruction, query, "document")

    def _field_start(self, instruction: str | None, query: str, name: str) -> int:
        """Where a field of the format (query, document) starts in the middle text."""
        t = self.template
        values = {"instruction": t.instruction if instruction is None else instruction}
        values["query"] = query
        at = 0
        for literal, field, _, _ in string.Formatter().parse(t.format):
            at += len(literal)
            if field == name:
                return at
            if field is not None:
                at += len(values[field])
        return at

    def _own_words(
        self, whole: Encoding, instruction: str | None, query: str, doc_start: int, doc_len: int
    ) -> dict[str, list[Any]]:
        """The middle's tokens as /explain sees them: a token reaching into the query or the
        document is one of its words (offsets in that text, clipped to it); any other is the
        template's, special."""
        q_start = self._field_start(instruction, query, "query")
        spans = ((q_start, q_start + len(query)), (doc_start, doc_start + doc_len))
        special, offsets = [], []
        for (a, b), mask in zip(whole.offsets, whole.special_tokens_mask, strict=True):
            inside = next(
                (s for s in spans if not mask and b > a and b > s[0] and a < s[1]), None
            )
            special.append(0 if inside else 1)
            if inside is None:
                offsets.append([a, b])
            else:
                lo, hi = inside
                offsets.append([max(a, lo) - lo, min(b, hi) - lo])
        return {"special_tokens_mask": special, "offsets": offsets, "words": list(whole.word_ids)}


class TemplatedBackend:
    """A causal LM reranker's backend as /attention sees it: its pairs go through the template
    (the default instruction), everything else is the backend's own."""

    def __init__(self, backend: Backend, template: PairTemplate, own_words: bool = False) -> None:
        """own_words: pairs as /explain needs them (PairTemplate.encodings)."""
        self.backend = backend
        self.template = template
        self.own_words = own_words
        self.manifest = backend.manifest
        self.info = backend.info
        self.token_output = backend.token_output
        self.inline = backend.inline
        self.measurable = backend.measurable
        self.streams = backend.streams
        self.lone = backend.lone
        self.long_tokens = backend.long_tokens

    def tokenize(
        self, texts: list[str], add_special_tokens: bool = True, direction: Side = "right"
    ) -> list[Encoding]:
        return self.backend.tokenize(texts, add_special_tokens, direction)

    def tokenize_pairs(self, pairs: list[tuple[str, str]]) -> list[Encoding]:
        return self.template.encodings(pairs, own_words=self.own_words)

    def pair_ids(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int], bool]]:
        return [(e.ids, e.type_ids, bool(e.overflowing)) for e in self.tokenize_pairs(pairs)]

    def count_tokens(self, text: str) -> int:
        return self.backend.count_tokens(text)

    def tokenize_whole(self, texts: list[str]) -> list[Encoding]:
        return self.backend.tokenize_whole(texts)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens)

    def run(self, batch: Batch) -> np.ndarray:
        return self.backend.run(batch)

    def run_tokens(self, batch: Batch) -> np.ndarray | None:
        return self.backend.run_tokens(batch)

    def attend(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        return self.backend.attend(batch)

    def gated(self, batch: Batch) -> np.ndarray:
        return self.backend.gated(batch)

    def run_long(self, batch: Batch) -> np.ndarray:
        return self.backend.run_long(batch)

    def run_outputs(self, batch: Batch, long: bool = False) -> dict[str, np.ndarray]:
        return self.backend.run_outputs(batch, long)

    def run_images(self, batch: Batch) -> np.ndarray:
        return self.backend.run_images(batch)

    def attend_images(self, batch: Batch) -> list[np.ndarray]:
        return self.backend.attend_images(batch)

    def warmup(self) -> None:
        self.backend.warmup()


def templated(backend: Backend, own_words: bool = False) -> Backend:
    """The backend, its pairs through its manifest's rerank template when it has one
    (own_words: as /explain needs them)."""
    template = backend.manifest.rerank_template
    if template is None:
        return backend
    return TemplatedBackend(
        backend, PairTemplate(template, backend.tokenize, backend.manifest.max_length), own_words
    )
