"""TEI's gRPC API (`tei.v1` in TEI's proto/tei.proto): Info, Embed, Predict, Rerank and Tokenize
with all their streams, answered by the same functions as TEI's HTTP routes
(service/api/tei/handlers.py), so the pipelines, admission and deadlines are theirs.

As TEI serves them: one input a message; a stream's messages are each a request of their own,
computed together and answered in order (service/rpc/calls.py); `Metadata` carries the stage
times in nanoseconds. proto3 cannot tell an unset `truncate` from false: false means the
server's default, which cuts (TEI's `auto_truncate`, true here, as `/info` says).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from pydantic import BaseModel, ValidationError

from service.api.context import Context
from service.api.tei import handlers, schemas
from service.api.tei.info import tei_info
from service.errors import InvalidInput
from service.pipelines.call import Timings
from service.registry import Capability
from service.rpc.calls import Rpcs
from service.rpc.generated import tei_pb2 as pb
from service.rpc.generated import tei_pb2_grpc as pb_grpc

B = TypeVar("B", bound=BaseModel)
R = TypeVar("R")
PACKAGE = "tei.v1"
MODEL_TYPES = {
    "embed": pb.MODEL_TYPE_EMBEDDING,
    "classify": pb.MODEL_TYPE_CLASSIFIER,
    "rerank": pb.MODEL_TYPE_RERANKER,
}


def _body(kind: type[B], **fields: Any) -> B:
    """The HTTP route's own body, so that its validation is the same (422 -> INVALID_ARGUMENT)."""
    try:
        return kind.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"{where}: {first['msg']}" if where else first["msg"]) from None


def _truncation(message: Any) -> dict[str, Any]:
    side = "Left" if message.truncation_direction == pb.TRUNCATION_DIRECTION_LEFT else "Right"
    return {"truncate": True if message.truncate else None, "truncation_direction": side}


def _optional(message: Any, *names: str) -> dict[str, Any]:
    return {n: getattr(message, n) for n in names if message.HasField(n)}


def _message(kind: Callable[..., R], **fields: Any) -> R:
    """A message with the fields that have a value (None: an optional field left unset)."""
    return kind(**{k: v for k, v in fields.items() if v is not None})


def metadata(chars: int, timings: Timings, started: float) -> pb.Metadata:
    return pb.Metadata(
        compute_chars=chars,
        compute_tokens=timings.tokens,
        total_time_ns=int((time.monotonic() - started) * 1e9),
        tokenization_time_ns=int(timings.tokenization_s * 1e9),
        queue_time_ns=int(timings.queue_s * 1e9),
        inference_time_ns=int(timings.inference_s * 1e9),
    )


# --- the answers, one message each ----------------------------------------------------------


async def _embed(ctx: Context, r: Any) -> pb.EmbedResponse:
    started = time.monotonic()
    body = _body(
        schemas.EmbedRequest,
        inputs=[r.inputs],
        **_truncation(r),
        **_optional(r, "normalize", "prompt_name", "dimensions"),
    )
    vectors, timings = await handlers.embedded(ctx, body)
    ctx.timed(timings)
    return pb.EmbedResponse(
        embeddings=vectors[0].tolist(), metadata=metadata(len(r.inputs), timings, started)
    )


async def _embed_sparse(ctx: Context, r: Any) -> pb.EmbedSparseResponse:
    started = time.monotonic()
    body = _body(
        schemas.EmbedSparseRequest, inputs=[r.inputs], **_truncation(r), **_optional(r, "prompt_name")
    )
    entries, timings = await handlers.sparse_embedded(ctx, body)
    ctx.timed(timings)
    return pb.EmbedSparseResponse(
        sparse_embeddings=[pb.SparseValue(index=e["index"], value=e["value"]) for e in entries[0]],
        metadata=metadata(len(r.inputs), timings, started),
    )


async def _embed_all(ctx: Context, r: Any) -> pb.EmbedAllResponse:
    started = time.monotonic()
    body = _body(
        schemas.EmbedAllRequest, inputs=[r.inputs], **_truncation(r), **_optional(r, "prompt_name")
    )
    (rows,) = await handlers.all_embedded(ctx, body)
    return pb.EmbedAllResponse(
        token_embeddings=[pb.TokenEmbedding(embeddings=row.tolist()) for row in rows],
        metadata=metadata(len(r.inputs), Timings(tokens=len(rows)), started),
    )


async def _predicted(ctx: Context, inputs: Any, r: Any, chars: int) -> pb.PredictResponse:
    started = time.monotonic()
    body = _body(schemas.PredictRequest, inputs=inputs, raw_scores=r.raw_scores, **_truncation(r))
    answers, _, timings = await handlers.predicted(ctx, body)
    ctx.timed(timings)
    return pb.PredictResponse(
        predictions=[pb.Prediction(score=a["score"], label=a["label"]) for a in answers[0]],
        metadata=metadata(chars, timings, started),
    )


async def _predict(ctx: Context, r: Any) -> pb.PredictResponse:
    return await _predicted(ctx, r.inputs, r, len(r.inputs))


async def _predict_pair(ctx: Context, r: Any) -> pb.PredictResponse:
    if len(r.inputs) != 2:
        raise InvalidInput(f"`inputs` must be a pair of texts, not {len(r.inputs)}")
    return await _predicted(ctx, [list(r.inputs)], r, sum(map(len, r.inputs)))


async def _reranked(ctx: Context, query: str, texts: list[str], first: Any) -> pb.RerankResponse:
    started = time.monotonic()
    body = _body(
        schemas.RerankRequest,
        query=query,
        texts=texts,
        raw_scores=first.raw_scores,
        return_text=first.return_text,
        **_truncation(first),
    )
    results, timings = await handlers.reranked(ctx, body)
    ctx.timed(timings)
    return pb.RerankResponse(
        ranks=[_message(pb.Rank, **x) for x in results],
        metadata=metadata(len(query) + sum(map(len, texts)), timings, started),
    )


async def _tokenize(ctx: Context, r: Any) -> pb.EncodeResponse:
    body = _body(
        schemas.TokenizeRequest,
        inputs=r.inputs,
        add_special_tokens=r.add_special_tokens,
        **_optional(r, "prompt_name"),
    )
    (tokens,) = await handlers.tokens(ctx, body)
    return pb.EncodeResponse(tokens=[_message(pb.SimpleToken, **t) for t in tokens])


async def _decode(ctx: Context, r: Any) -> pb.DecodeResponse:
    body = _body(schemas.DecodeRequest, ids=list(r.ids), skip_special_tokens=r.skip_special_tokens)
    (text,) = await handlers.decoded(ctx, body)
    return pb.DecodeResponse(text=text)


# --- the services, derived from one declaration ---------------------------------------------


async def _info(ctx: Context, _: Any) -> pb.InfoResponse:
    model = ctx.registry.first
    ctx.state.model = model.name
    known = pb.InfoResponse.DESCRIPTOR.fields_by_name
    fields = {k: v for k, v in tei_info(model, ctx.settings).items() if k in known}
    return _message(pb.InfoResponse, **(fields | {"model_type": MODEL_TYPES[model.task]}))


async def _rerank(ctx: Context, r: Any) -> pb.RerankResponse:
    return await _reranked(ctx, r.query, list(r.texts), r)


async def _rerank_stream(ctx: Context, messages: list[Any]) -> pb.RerankResponse:
    """(query, text) pairs streamed in, one ranking out once the stream ends; the first
    message's raw_scores and return_text hold for all, as TEI reads them."""
    if not messages:
        return await _reranked(ctx, "", [], pb.RerankStreamRequest())
    if len({m.query for m in messages}) > 1:
        raise InvalidInput("every message of a RerankStream must carry the same query")
    return await _reranked(ctx, messages[0].query, [m.text for m in messages], messages[0])


Answer = Callable[[Context, Any], Awaitable[Any]]


@dataclass(frozen=True)
class Method:
    name: str
    answer: Answer
    kind: str = "unary"  # unary; stream (one answer a message); gather (the messages, one answer)
    ready: bool = True


@dataclass(frozen=True)
class Service:
    name: str  # in tei.v1
    capability: Capability | None  # what a served model must do for it to serve (health)
    base: type
    adder: Callable[[Any, grpc.aio.Server], None]
    methods: tuple[Method, ...]


SERVICES = (
    Service("Info", None, pb_grpc.InfoServicer, pb_grpc.add_InfoServicer_to_server, (
        Method("Info", _info, ready=False),
    )),
    Service("Embed", "embed", pb_grpc.EmbedServicer, pb_grpc.add_EmbedServicer_to_server, (
        Method("Embed", _embed),
        Method("EmbedStream", _embed, "stream"),
        Method("EmbedSparse", _embed_sparse),
        Method("EmbedSparseStream", _embed_sparse, "stream"),
        Method("EmbedAll", _embed_all),
        Method("EmbedAllStream", _embed_all, "stream"),
    )),
    Service("Predict", "classify", pb_grpc.PredictServicer, pb_grpc.add_PredictServicer_to_server, (
        Method("Predict", _predict),
        Method("PredictPair", _predict_pair),
        Method("PredictStream", _predict, "stream"),
        Method("PredictPairStream", _predict_pair, "stream"),
    )),
    Service("Rerank", "rerank", pb_grpc.RerankServicer, pb_grpc.add_RerankServicer_to_server, (
        Method("Rerank", _rerank),
        Method("RerankStream", _rerank_stream, "gather"),
    )),
    Service("Tokenize", None, pb_grpc.TokenizeServicer, pb_grpc.add_TokenizeServicer_to_server, (
        Method("Tokenize", _tokenize),
        Method("TokenizeStream", _tokenize, "stream"),
        Method("Decode", _decode),
        Method("DecodeStream", _decode, "stream"),
    )),
)  # fmt: skip
# Capabilities the handlers pick their model by (Embed's sparse methods need a sparse output).
PICKS: dict[str, Capability] = {
    "EmbedSparse": "sparse", "EmbedSparseStream": "sparse", "Tokenize": "tokenize",
    "TokenizeStream": "tokenize", "Decode": "tokenize", "DecodeStream": "tokenize",
}  # fmt: skip


def _handler(rpcs: Rpcs, service: Service, m: Method) -> Callable[..., Any]:
    path = f"/{PACKAGE}.{service.name}/{m.name}"
    pick = PICKS.get(m.name, service.capability)
    answer = m.answer
    if m.kind == "stream":

        async def stream(self: Any, requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async for out in rpcs.stream(requests, context, path, answer, pick):
                yield out

        return stream
    if m.kind == "gather":

        async def gather(self: Any, requests: Any, context: grpc.aio.ServicerContext) -> Any:
            messages = [r async for r in requests]
            return await rpcs.unary(context, path, lambda ctx: answer(ctx, messages), pick)

        return gather

    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await rpcs.unary(context, path, lambda ctx: answer(ctx, request), pick, m.ready)

    return unary


def add(server: grpc.aio.Server, rpcs: Rpcs) -> dict[str, Capability | None]:
    """Each declared service on the server, its methods the generated servicer's; each name and
    the capability it needs (for health)."""
    for service in SERVICES:
        methods = {m.name: _handler(rpcs, service, m) for m in service.methods}
        servicer = type(f"{service.name}Service", (service.base,), methods)
        service.adder(servicer(), server)
    return {f"{PACKAGE}.{s.name}": s.capability for s in SERVICES}
