"""Texts in, every output a model has out, from one forward pass: the dense vector, a sparse
{vocabulary id: weight}, one vector per token (service/manifest.py: SparseOutput,
MultiVectorOutput say how the graph's outputs become these).

The graph is padding-agnostic; which tokens answer is decided here, per text:

- sparse, token_weights (bge-m3): the max weight per id over the text's tokens, ids FlagEmbedding
  drops left out, zero weights left out;  vocabulary (SPLADE): the pooled vector's nonzeros.
  Either way sorted by index.
- multi_vector: bge-m3 every token but the first; PyLate's ColBERT a document's tokens but its
  skiplist's, a query's `query_length` positions when it is expanded (the [MASK] positions the
  batch pads it with: the batch is widened to query_length when needed), else its tokens.

A ColBERT text gets its kind's marker after its first token and is cut to its kind's length,
marker included, as PyLate tokenises. Token vectors are the biggest answers headwise gives
(n x d' numbers a text): one request's are bounded (413), and all requests' in flight (429).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from service.engine.batcher import Infer
from service.engine.runtime import Backend
from service.errors import PayloadTooLarge, WrongTask
from service.manifest import Manifest, Output
from service.pipelines.attention.limits import Budget
from service.pipelines.base import Intake, Prepared, Ran, chars_of, postprocess
from service.pipelines.call import Call, Timings
from service.pipelines.embed import EmbedPipeline, Input, Tokenizing
from service.settings import Settings
from service.tensors import Batch

InputType = Literal["query", "document"]
Row = dict[str, np.ndarray]  # one text's slice of each graph output
PLAIN = Tokenizing()


@dataclass
class Sparse:
    indices: np.ndarray  # (k,) int64, ascending
    values: np.ndarray  # (k,) float32, > 0


@dataclass
class Encoded:
    """Per input, what was asked for (None: not asked)."""

    dense: np.ndarray | None  # (n, d) float32, post-processed as asked
    sparse: list[Sparse] | None
    multi_vector: list[np.ndarray] | None  # (k_i, d') float32 each, unit rows
    tokens: list[int]  # per input, as run (markers and expansion included)
    timings: Timings = field(default_factory=Timings)


def expansion_pad(manifest: Manifest) -> int | None:
    """The id a ColBERT model's batches are padded with: its expansion token ([MASK]), so that
    a query's unattended expansion positions are the batch's padding. None: the usual pad."""
    mv = manifest.multi_vector
    return mv.expansion_id if mv is not None and mv.query_expansion else None


def widened(batch: Batch, width: int, pad_id: int) -> Batch:
    """The batch padded on the right to at least `width` positions (mask 0 there)."""
    b, n = batch.input_ids.shape
    if n >= width:
        return batch
    ids = np.full((b, width), pad_id, dtype=np.int64)
    mask = np.zeros((b, width), dtype=np.int64)
    ids[:, :n], mask[:, :n] = batch.input_ids, batch.attention_mask
    types = None
    if batch.token_type_ids is not None:
        types = np.zeros((b, width), dtype=np.int64)
        types[:, :n] = batch.token_type_ids
    return Batch(ids, mask, types)


def outputs_infer(backend: Backend, long: bool = False) -> Infer:
    """The batcher's inference for the outputs: every output in one run, a row dict a text."""
    manifest = backend.manifest
    mv = manifest.multi_vector
    width = 0
    if mv is not None and mv.query_expansion and not mv.attend_to_expansion:
        width = mv.query_length or 0
    pad = expansion_pad(manifest) or manifest.special_tokens.pad

    def infer(batch: Batch) -> list[Row]:
        out = backend.run_outputs(widened(batch, width, pad), long)
        return [{name: values[i] for name, values in out.items()} for i in range(len(batch))]

    return infer


class OutputsPipeline:
    def __init__(self, embed: EmbedPipeline, intake: Intake, settings: Settings) -> None:
        self.embed = embed  # prompts, tokenising, the checks every text gets
        self.intake = intake
        self.settings = settings
        self.manifest = m = embed.manifest
        self.names: list[Output] = list(m.outputs)
        self.budget = Budget(
            settings.multi_vector_budget_numbers,
            what="multi-vector answer",
            setting="HEADWISE_MULTI_VECTOR_BUDGET_NUMBERS",
            advice="send fewer or shorter inputs",
        )
        self._dropped = np.asarray(m.sparse.dropped_ids if m.sparse else [], dtype=np.int64)
        self._skip = np.asarray(m.multi_vector.skip_ids if m.multi_vector else [], dtype=np.int64)

    @property
    def colbert(self) -> bool:
        """A query and a document are encoded differently (PyLate's markers, expansion)."""
        mv = self.manifest.multi_vector
        return mv is not None and (mv.query_length is not None or mv.query_marker is not None)

    def check(self, outputs: Sequence[Output] | None) -> list[Output]:
        """The outputs asked for (default: the model's first), each one the model has."""
        wanted = list(dict.fromkeys(outputs)) if outputs else self.names[:1]
        missing = [o for o in wanted if o not in self.names]
        if missing:
            raise WrongTask(
                f"model {self.manifest.name!r} has no {' nor '.join(missing)} output: its outputs "
                f"are {', '.join(self.names)}",
                param="outputs",
            )
        return wanted

    # --- tokens ---------------------------------------------------------------------------

    def _limit(self, kind: InputType) -> int | None:
        mv = self.manifest.multi_vector
        if mv is None or not self.colbert:
            return None
        length = mv.query_length if kind == "query" else mv.document_length
        marker = mv.query_marker if kind == "query" else mv.document_marker
        return None if length is None else length - (marker is not None)

    async def _sequences(
        self, call: Call, inputs: list[Input], how: Tokenizing, kind: InputType
    ) -> Prepared:
        limit = self._limit(kind)
        if limit is not None:
            how = replace(how, max_tokens=min(limit, how.max_tokens or limit))
        prepared = await self.embed._sequences(call, inputs, how)
        if not self.colbert:
            return prepared
        mv = self.manifest.multi_vector
        assert mv is not None
        marker = mv.query_marker if kind == "query" else mv.document_marker
        seqs = prepared.sequences
        if marker is not None:  # PyLate inserts it after the first token
            seqs = [s[:1] + [marker] + s[1:] for s in seqs]
        if kind == "query" and mv.query_expansion and mv.attend_to_expansion:
            pad, length = mv.expansion_id, mv.query_length
            assert pad is not None and length is not None
            seqs = [s + [pad] * (length - len(s)) for s in seqs]
        return replace(prepared, sequences=seqs)

    def vectors_of(self, ids: Sequence[int], kind: InputType) -> np.ndarray | slice:
        """Which of a text's positions answer a token vector: a slice or a boolean mask."""
        mv = self.manifest.multi_vector
        assert mv is not None
        n = len(ids)
        if mv.skip_first:
            return slice(min(1, n), n)
        if kind == "query" and mv.query_expansion and mv.query_length is not None:
            return slice(0, mv.query_length)
        if kind == "document" and self._skip.size:
            return ~np.isin(np.asarray(ids, dtype=np.int64), self._skip)
        return slice(0, n)

    def _numbers(self, prepared: Prepared, kind: InputType) -> int:
        """The numbers the answer's token vectors hold."""
        mv = self.manifest.multi_vector
        assert mv is not None
        count = 0
        for ids in prepared.sequences:
            which = self.vectors_of(ids, kind)
            count += which.stop - which.start if isinstance(which, slice) else int(which.sum())
        return count * mv.dim

    # --- post-processing --------------------------------------------------------------------

    def sparse_of(self, ids: Sequence[int], row: Row) -> Sparse:
        sparse = self.manifest.sparse
        assert sparse is not None
        values = row[sparse.graph_output]
        if sparse.kind == "vocabulary":  # SPLADE: the pooled vector itself
            idx = np.flatnonzero(values)
            return Sparse(idx.astype(np.int64), values[idx].astype(np.float32))
        tokens = np.asarray(ids, dtype=np.int64)
        weights = values[: len(tokens)]
        keep = (weights > 0) & ~np.isin(tokens, self._dropped)
        idx, where = np.unique(tokens[keep], return_inverse=True)
        best = np.zeros(len(idx), dtype=np.float32)
        np.maximum.at(best, where, weights[keep])  # an id's weight: its tokens' largest
        return Sparse(idx, best)

    def vectors(self, ids: Sequence[int], row: Row, kind: InputType) -> np.ndarray:
        mv = self.manifest.multi_vector
        assert mv is not None
        values = row[mv.graph_output]  # (N, d'): the batch's width, padding included
        which = self.vectors_of(ids, kind)
        if not isinstance(which, slice):
            values = values[: len(ids)]
        return np.ascontiguousarray(values[which], dtype=np.float32)

    def _role(self, how: Tokenizing, input_type: InputType | None) -> Tokenizing:
        """A model's prompt for the role asked (a ColBERT model marks it instead)."""
        if self.colbert or input_type is None or how.prompt_name is not None or how.instruction:
            return how
        return replace(how, prompt_name=self.embed.prompt_for(input_type))

    def price(
        self, inputs: list[Input], how: Tokenizing = PLAIN, input_type: InputType | None = None
    ) -> list[int]:
        """What admission prices `encode` of these inputs at before tokenising (as `encode`
        works it out): a lower bound of each one's tokens, its prompt included."""
        how = self._role(how, input_type)
        return self.embed._at_least(self.embed.prompted(inputs, how.prompt_name, how.instruction))

    async def encode(
        self,
        call: Call,
        inputs: list[Input],
        outputs: list[Output],
        how: Tokenizing = PLAIN,
        input_type: InputType | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        at_least: list[int] | None = None,
    ) -> Encoded:
        """outputs: checked by `check`. input_type: a ColBERT model's query or document
        (default document); for others it picks the model's prompt for that role. at_least:
        the price a plan already made (`price`), else made here."""
        kind: InputType = input_type or "document"
        how = self._role(how, input_type)
        texts = self.embed.prompted(inputs, how.prompt_name, how.instruction)
        if at_least is None:
            at_least = self.embed._at_least(texts)
        multi = "multi_vector" in outputs

        async def prepare() -> Prepared:
            prepared = await self._sequences(call, texts, how, kind)
            numbers = self._numbers(prepared, kind) if multi else 0
            limit = self.settings.multi_vector_max_numbers
            if numbers > limit:
                raise PayloadTooLarge(
                    f"the token vectors of these inputs are {numbers} numbers; one answer may "
                    f"hold {limit} (HEADWISE_MULTI_VECTOR_MAX_NUMBERS): send fewer or shorter "
                    "inputs",
                    param="inputs",
                )
            prepared.extra = numbers
            return prepared

        @contextlib.asynccontextmanager
        async def hold(prepared: Prepared) -> AsyncIterator[None]:
            async with self.budget.hold(int(prepared.extra or 0), retry_after=1):
                yield

        ran: Ran[Row] = await self.intake.run(
            call, prepare, at_least=at_least, hold=hold if multi else None, chars=chars_of(texts)
        )
        seqs = ran.prepared.sequences
        dense = None
        if "dense" in outputs:
            rows = np.stack([row["sentence_embedding"] for row in ran.rows])
            norm = self.manifest.normalize if normalize is None else normalize
            dense = postprocess(rows, norm, dimensions)
        sparse = None
        if "sparse" in outputs:
            sparse = [self.sparse_of(ids, row) for ids, row in zip(seqs, ran.rows, strict=True)]
        vectors = None
        if multi:
            vectors = [self.vectors(ids, row, kind) for ids, row in zip(seqs, ran.rows, strict=True)]
        return Encoded(dense, sparse, vectors, ran.lengths, ran.timings)


def sparse_entries(
    sparse: Sparse, tokens: list[str] | None = None
) -> list[dict[str, Any]]:
    """[{"index", "value"(, "token")}], sorted by index."""
    indices, values = sparse.indices.tolist(), sparse.values.tolist()
    if tokens is None:
        return [{"index": i, "value": v} for i, v in zip(indices, values, strict=True)]
    return [
        {"index": i, "value": v, "token": t}
        for i, v, t in zip(indices, values, tokens, strict=True)
    ]
