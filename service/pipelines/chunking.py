"""Long documents as chunks: each chunk's own vector, with the context of the whole document.

`late` (late chunking): the document runs once (in windows of the model's maximum when it is
longer), and each chunk's vector is the mean of its own tokens' last-layer states, so every
chunk's vector has seen the text around it; special tokens (and a prompt) belong to no chunk.
`separate`: each chunk's text is embedded on its own, as any input is. Chunks are `size`
tokens with `overlap`, or the character spans a client gives, snapped to token boundaries; their
character spans cover the whole text. `pool` adds one vector for the whole document: the
token-weighted mean of its chunks' vectors.

A document longer than the model runs as windows of the maximum that overlap by a chunk, so that
each chunk lies whole in some window; it is pooled from the window where it is most central.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from tokenizers import Encoding

from service.errors import InvalidInput, WrongTask
from service.pipelines.base import Prepared, postprocess
from service.pipelines.call import Call, Timings
from service.pipelines.embed import EmbedPipeline, Input, Tokenizing
from service.tensors import l2_normalize

Strategy = Literal["late", "separate"]


@dataclass(frozen=True)
class Chunking:
    strategy: Strategy = "late"
    size: int | None = None  # tokens a chunk (with overlap); None: the spans say
    overlap: int = 0
    spans: Sequence[Sequence[tuple[int, int]]] | None = None  # per input: character spans
    pool: bool = False


@dataclass
class Chunk:
    start: int  # character span of the text, [start, stop)
    stop: int
    first: int  # content-token span, [first, last)
    last: int

    @property
    def tokens(self) -> int:
        return self.last - self.first


@dataclass
class Chunked:
    chunks: list[list[tuple[Chunk, np.ndarray]]]  # per input
    pooled: np.ndarray | None  # (n, d) document vectors, with pool
    tokens: list[int]  # tokens computed per input
    timings: Timings = field(default_factory=Timings)


def content(enc: Encoding) -> list[int]:
    """Indices of the encoding's non-special tokens."""
    return [i for i, special in enumerate(enc.special_tokens_mask) if not special]


def plan(
    text: str,
    enc: Encoding,
    size: int | None,
    overlap: int,
    spans: Sequence[tuple[int, int]] | None,
) -> list[Chunk]:
    """The chunks of one text, in order, over its content tokens (indices into `content`)."""
    idx = content(enc)
    every = enc.offsets  # a property that builds the whole list: read it once, not per token
    offsets = [every[i] for i in idx]
    n = len(idx)
    if spans is None:
        assert size is not None
        step = size - overlap
        starts = list(range(0, max(1, n - overlap), step)) if n else []
        bounds = [(a, min(a + size, n)) for a in starts]
    else:
        bounds = []
        for k, (s, e) in enumerate(spans):
            if not 0 <= s < e <= len(text):
                raise InvalidInput(
                    f"chunks[{k}] = [{s}, {e}] is not a span of the text (0..{len(text)})",
                    param="chunks",
                )
            inside = [j for j, (a, b) in enumerate(offsets) if a < e and b > s]
            if not inside:
                raise InvalidInput(f"chunks[{k}] = [{s}, {e}] holds no token", param="chunks")
            bounds.append((inside[0], inside[-1] + 1))
    chunks = [Chunk(offsets[a][0], offsets[b - 1][1], a, b) for a, b in bounds]
    if spans is None and chunks:  # size-based: every character in a chunk, spaces between too
        chunks[0].start, chunks[-1].stop = 0, len(text)
        for c, nxt in zip(chunks, chunks[1:], strict=False):
            c.stop = max(c.stop, nxt.start)
    return chunks


def windows(n: int, width: int, widest: int) -> list[tuple[int, int]]:
    """Windows of at most `width` content tokens over n, overlapping so that any span of at
    most `widest` tokens lies whole in one of them."""
    if n <= width:
        return [(0, n)]
    step = max(1, width - widest)
    out = [(a, min(a + width, n)) for a in range(0, n - width + step, step)]
    if out[-1][1] < n:
        out.append((n - width, n))
    return out


def home(chunk: Chunk, spans: list[tuple[int, int]]) -> int:
    """The window that holds the chunk whole, with the most context either side of it."""
    best, margin = 0, -1
    for w, (a, b) in enumerate(spans):
        if a <= chunk.first and chunk.last <= b:
            m = min(chunk.first - a, b - chunk.last)
            if m > margin:
                best, margin = w, m
    return best


def specials(enc: Encoding) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a text ([CLS] … [SEP], <s> … </s>)."""
    idx = content(enc)
    if not idx:
        return list(enc.ids), []
    ids = enc.ids
    return list(ids[: idx[0]]), list(ids[idx[-1] + 1 :])


class Chunker:
    def __init__(self, pipe: EmbedPipeline) -> None:
        self.pipe = pipe
        self.manifest = pipe.manifest

    def check(self, chunking: Chunking, inputs: int) -> None:
        """422 for chunking the model cannot do; 400 for a model that cannot do late chunking."""
        room = self.manifest.max_length - 2
        if chunking.spans is not None:
            if chunking.size is not None:
                raise InvalidInput("give chunking.size or chunks, not both", param="chunks")
            if len(chunking.spans) != inputs:
                raise InvalidInput(
                    f"chunks has {len(chunking.spans)} lists of spans for {inputs} inputs",
                    param="chunks",
                )
        elif chunking.size is None:
            raise InvalidInput("chunking needs size (tokens a chunk) or chunks", param="chunking")
        elif not 1 <= chunking.size <= room:
            raise InvalidInput(
                f"chunking.size must be between 1 and {room}, the model's limit of "
                f"{self.manifest.max_length} tokens less its special tokens; got {chunking.size}",
                param="chunking.size",
            )
        elif not 0 <= chunking.overlap < chunking.size:
            raise InvalidInput(
                f"chunking.overlap must be at least 0 and less than size ({chunking.size}); "
                f"got {chunking.overlap}",
                param="chunking.overlap",
            )
        if chunking.strategy == "late" and self.pipe.tokens is None:
            raise WrongTask(
                "late chunking needs the bundle's token output: re-export it with this headwise",
                param="chunking.strategy",
            )
        if chunking.strategy == "late" and self.manifest.pooling == "lasttoken":
            raise WrongTask(
                "late chunking averages a chunk's token states; this model pools its last token "
                "(a decoder: each state sees only the text before it): use strategy separate",
                param="chunking.strategy",
            )
        if chunking.strategy == "late" and self.manifest.dimensions != self.manifest.d_model:
            raise WrongTask(
                "late chunking pools the last layer's token states; this model's embedding "
                "goes on through its own Dense modules: use strategy separate",
                param="chunking.strategy",
            )

    def at_least(self, texts: list[str], chunking: Chunking) -> list[int]:
        """A lower bound of the sequences the request will run, from its words (each is a token
        at least), before its documents are tokenised: late, the windows of each document;
        separate, its chunks."""
        room = self.manifest.max_length - 2
        out: list[int] = []
        for i, text in enumerate(texts):
            n = len(text.split())
            if chunking.strategy == "late":
                spans = windows(n, room, chunking.size or 0) if n else []
                out += [b - a + 2 for a, b in spans]
            elif chunking.spans is not None:
                out += [3] * len(chunking.spans[i])
            else:
                size = chunking.size or room
                out += [size + 2] * (n // size)
        return out

    async def run(
        self,
        call: Call,
        texts: list[str],
        chunking: Chunking,
        how: Tokenizing,
        normalize: bool,
        dimensions: int | None,
    ) -> Chunked:
        """The chunks' vectors. Checked (`check`) and priced (`at_least`) by the request's plan
        (service/pipelines/plan.py) before: here the documents are tokenised and run."""
        encodings, _ = await call.tokenize(self.pipe.backend.tokenize_whole, texts)
        widest = chunking.size or 0
        plans = []
        for i, (text, enc) in enumerate(zip(texts, encodings, strict=True)):
            spans = chunking.spans[i] if chunking.spans is not None else None
            plans.append(plan(text, enc, chunking.size, chunking.overlap, spans))
            widest = max([widest, *(c.tokens for c in plans[-1])])
        room = self.manifest.max_length - 2
        if widest > room:
            raise InvalidInput(
                f"a chunk of {widest} tokens does not fit the model's {self.manifest.max_length}",
                param="chunks",
            )
        if any(not p for p in plans):
            raise InvalidInput(
                "an input has no token to chunk (empty, or only spaces): send it without chunking",
                param="inputs",
            )
        if chunking.strategy == "separate":
            out = await self._separate(call, texts, plans, how, normalize, dimensions)
        else:
            out = await self._late(call, texts, encodings, plans, how, normalize, dimensions, widest)
        if chunking.pool:
            out.pooled = self._pool(out.chunks, normalize)
        return out

    async def _separate(
        self,
        call: Call,
        texts: list[str],
        plans: list[list[Chunk]],
        how: Tokenizing,
        normalize: bool,
        dimensions: int | None,
    ) -> Chunked:
        pieces = [text[c.start : c.stop] for text, chunks in zip(texts, plans, strict=True) for c in chunks]
        if not pieces:
            return Chunked([[] for _ in texts], None, [0] * len(texts))
        enc = await self.pipe.embed(call, list[Input](pieces), how, normalize, dimensions)
        vectors = iter(enc.vectors)
        tokens = iter(enc.tokens)
        chunks: list[list[tuple[Chunk, np.ndarray]]] = []
        counts: list[int] = []
        for c_list in plans:
            chunks.append([(c, next(vectors)) for c in c_list])
            counts.append(sum(next(tokens) for _ in c_list))
        return Chunked(chunks, None, counts, enc.timings)

    async def _late(
        self,
        call: Call,
        texts: list[str],
        encodings: list[Encoding],
        plans: list[list[Chunk]],
        how: Tokenizing,
        normalize: bool,
        dimensions: int | None,
        widest: int,
    ) -> Chunked:
        prompt = self.pipe.prompt(how.prompt_name)
        prompt_ids: list[int] = []
        if prompt:
            (penc,), _ = await call.tokenize(self.pipe.backend.tokenize_whole, [prompt])
            prompt_all = penc.ids
            prompt_ids = [prompt_all[i] for i in content(penc)]
        width = self.manifest.max_length - 2 - len(prompt_ids)
        if width < widest:
            raise InvalidInput(
                f"with its prompt, the model holds {width} tokens a window; a chunk has {widest}",
                param="chunks",
            )
        sequences: list[list[int]] = []
        where: list[tuple[int, list[tuple[int, int]]]] = []  # per input: first sequence, windows
        for enc in encodings:
            head, tail = specials(enc)
            every = enc.ids  # once: each read of the property copies the whole list
            ids = [every[i] for i in content(enc)]
            spans = windows(len(ids), width, widest)
            where.append((len(sequences), spans))
            for a, b in spans:
                sequences.append(head + prompt_ids + ids[a:b] + tail)
        offset = [len(specials(enc)[0]) + len(prompt_ids) for enc in encodings]

        async def prepare() -> Prepared:
            return Prepared(sequences)

        assert self.pipe.tokens is not None
        lengths = [len(s) for s in sequences]
        ran = await self.pipe.tokens.run(call, prepare, at_least=lengths, unit="windows")
        chunks: list[list[tuple[Chunk, np.ndarray]]] = []
        for i, c_list in enumerate(plans):
            first, spans = where[i]
            out: list[tuple[Chunk, np.ndarray]] = []
            for c in c_list:
                w = home(c, spans)
                states = ran.rows[first + w]
                a = offset[i] + c.first - spans[w][0]
                mean = np.asarray(states[a : a + c.tokens], dtype=np.float32).mean(axis=0)
                out.append((c, postprocess(mean[None, :], normalize, dimensions)[0]))
            chunks.append(out)
        counts = [
            sum(len(sequences[first + w]) for w in range(len(spans))) for first, spans in where
        ]
        return Chunked(chunks, None, counts, ran.timings)

    def _pool(self, chunks: list[list[tuple[Chunk, np.ndarray]]], normalize: bool) -> np.ndarray:
        """Per document, the token-weighted mean of its chunks' vectors."""
        out = []
        for c_list in chunks:
            weights = np.array([c.tokens for c, _ in c_list], dtype=np.float64)
            vectors = np.stack([v for _, v in c_list]).astype(np.float64)
            out.append((weights[:, None] * vectors).sum(0) / weights.sum())
        stacked = np.stack(out).astype(np.float32)
        return l2_normalize(stacked) if normalize else stacked
