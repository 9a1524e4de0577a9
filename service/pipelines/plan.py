"""/encode's request as one plan, decided before any work runs (../shared/STYLE.md 22).

A request to /encode asks for one of three things: a model's dense vectors (the plain answer),
its outputs (dense, sparse, token vectors from one forward pass, or a dense-only model's one
output in a role), or its inputs cut into chunks (late: windows of the whole document; separate:
each chunk on its own). `plan` decides which from the request alone, checks everything that needs
no tokenizer, and prices the work (`priced`: a lower bound of the tokens of each sequence that
will run, as `unit`: inputs, windows or chunks). `run` executes the plan, and admission sees the
plan's price first: the pipeline is handed it rather than working out its own, so the figure
admission prices and the sequences the pipeline queues come from the same plan. After
tokenising, the intake admits the exact sequences again (service/pipelines/base.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from service.errors import InvalidInput
from service.manifest import Output
from service.pipelines.base import Intake
from service.pipelines.call import Call, Timings
from service.pipelines.chunking import Chunk, Chunker, Chunking
from service.pipelines.embed import EmbedPipeline, Input, Tokenizing
from service.pipelines.outputs import InputType, OutputsPipeline, Sparse

Kind = Literal["dense", "outputs", "chunks"]


@dataclass
class Encoded:
    """What a plan's run gives: per input, what its kind answers (None: not asked)."""

    tokens: list[int]  # per input: the tokens run for it (every window or chunk, with chunking)
    timings: Timings = field(default_factory=Timings)
    dense: np.ndarray | None = None  # (n, d); with chunking and pool, the documents' vectors
    sparse: list[Sparse] | None = None
    multi_vector: list[np.ndarray] | None = None
    chunks: list[list[tuple[Chunk, np.ndarray]]] | None = None


@dataclass(frozen=True)
class EncodePlan:
    kind: Kind
    embed: EmbedPipeline
    inputs: list[Input]  # validated
    how: Tokenizing
    normalize: bool | None
    dimensions: int | None
    outputs: list[Output]  # what the answer holds ("dense" for kinds dense and chunks)
    priced: list[int]  # a lower bound of each sequence's tokens, known before tokenising
    unit: str  # what a sequence is, as a refusal names it: inputs, windows, chunks
    input_type: InputType | None = None
    multi: OutputsPipeline | None = None  # the model's outputs pipeline (kind outputs)
    chunking: Chunking | None = None

    @property
    def intake(self) -> Intake:
        """The intake the plan's sequences go through (its lanes, its admission)."""
        if self.kind == "outputs" and self.multi is not None:
            return self.multi.intake
        if self.kind == "chunks" and self.chunking is not None and self.chunking.strategy == "late":
            assert self.embed.tokens is not None  # Chunker.check refused it otherwise
            return self.embed.tokens
        return self.embed.intake

    async def run(self, call: Call) -> Encoded:
        if self.kind == "chunks":
            assert self.chunking is not None
            normalize = True if self.normalize is None else self.normalize  # chunk vectors
            if self.priced:  # refused before the documents are tokenised
                self.intake.precheck(self.priced, call, self.unit)
            texts = [str(t) for t in self.inputs]
            c = await Chunker(self.embed).run(
                call, texts, self.chunking, self.how, normalize, self.dimensions
            )
            return Encoded(c.tokens, c.timings, dense=c.pooled, chunks=c.chunks)
        if self.kind == "outputs" and self.multi is not None:
            o = await self.multi.encode(
                call,
                self.inputs,
                self.outputs,
                self.how,
                self.input_type,
                self.normalize,
                self.dimensions,
                at_least=self.priced,
            )
            return Encoded(o.tokens, o.timings, o.dense, o.sparse, o.multi_vector)
        e = await self.embed.embed(
            call, self.inputs, self.how, self.normalize, self.dimensions, at_least=self.priced
        )
        return Encoded(e.tokens, e.timings, dense=e.vectors)


CHUNKING_ALONE = (
    "chunking answers a model's dense vectors: it takes neither outputs nor input_type, "
    "nor a model without a dense output"
)


def plan(
    embed: EmbedPipeline,
    multi: OutputsPipeline | None,
    inputs: str | Sequence[Input],
    how: Tokenizing,
    normalize: bool | None = None,
    dimensions: int | None = None,
    outputs: Sequence[Output] | None = None,
    input_type: InputType | None = None,
    chunking: Chunking | None = None,
) -> EncodePlan:
    """The plan of one /encode request on a model (its embed pipeline, and its outputs pipeline
    if it has one): every check that needs no tokenizer made, the work priced."""
    first_dense = embed.manifest.outputs[:1] == ["dense"]
    if chunking is not None:
        if outputs is not None or input_type is not None or not first_dense:
            raise InvalidInput(CHUNKING_ALONE, param="chunking")
        texts = embed.validate(inputs, "inputs", dimensions)
        chunker = Chunker(embed)
        chunker.check(chunking, len(texts))
        strings = [str(t) for t in texts]
        unit = "windows" if chunking.strategy == "late" else "chunks"
        return EncodePlan(
            "chunks",
            embed,
            texts,
            how,
            normalize,
            dimensions,
            ["dense"],
            chunker.at_least(strings, chunking),
            unit,
            chunking=chunking,
        )
    if outputs is None and input_type is None and first_dense:
        texts = embed.validate(inputs, "inputs", dimensions)
        priced = embed.price(texts, how)
        return EncodePlan(
            "dense", embed, texts, how, normalize, dimensions, ["dense"], priced, "inputs"
        )
    if multi is None:  # a dense-only model: its one output, in the role asked for
        texts = embed.validate(inputs, "inputs", dimensions)
        if input_type is not None and how.prompt_name is None and how.instruction is None:
            how = replace(how, prompt_name=embed.prompt_for(input_type))
        priced = embed.price(texts, how)
        return EncodePlan(
            "outputs", embed, texts, how, normalize, dimensions, ["dense"], priced, "inputs"
        )
    wanted = multi.check(outputs)
    dims = dimensions if "dense" in wanted else None
    texts = embed.validate(inputs, "inputs", dims)
    return EncodePlan(
        "outputs",
        embed,
        texts,
        how,
        normalize,
        dims,
        wanted,
        multi.price(texts, how, input_type),
        "inputs",
        input_type=input_type,
        multi=multi,
    )
