"""The Open Inference Protocol's handlers: what each model takes and gives as tensors, by task,
run through the same pipelines (batchers, admission, deadlines) as every other route.

| task | inputs | outputs |
| --- | --- | --- |
| embed | `text` BYTES [n] (or [n, 1]) | `embedding` FP32 [n, d]: /encode's vectors |
| rerank | `query` BYTES [1], `document` BYTES [m] | `score` FP32 [m]: /rerank's scores |
| classify | `text` BYTES [n], optional `text_pair` BYTES [n] | `scores` FP32 [n, labels]: /predict's, by label index |

Request parameters, as headwise's own routes take them: embed `normalize`, `dimensions`,
`truncate`, `prompt_name`; rerank and classify `raw_scores`, `truncate`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from starlette.responses import Response

from service import __version__
from service.api.context import Context
from service.api.oip import tensors
from service.api.oip.tensors import BadTensor, Tensor
from service.api.ops import readiness
from service.errors import InvalidInput, ModelNotFound, PayloadTooLarge, Unavailable, WrongTask
from service.pipelines.embed import Tokenizing
from service.registry import Model

EXTENSIONS = ["binary_tensor_data"]
VERSION = "1"  # every model has one version


def find(ctx: Context, name: str, version: str | None) -> Model:
    """The model by its name (and version, when given), as HTTP and gRPC name it."""
    model = ctx.registry.models.get(name)
    if model is None:
        served = ", ".join(ctx.registry.models)
        raise ModelNotFound(f"model {name!r} is not served here; served: {served}")
    if version and version != VERSION:
        raise ModelNotFound(f"model {name!r} has version {VERSION} only, not {version!r}")
    ctx.state.model = model.name
    return model


def _model(ctx: Context) -> Model:
    params = ctx.http.path_params
    return find(ctx, params["name"], params.get("version"))


def signature(model: Model) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The model's inputs and outputs as the protocol's metadata names them (-1: any size)."""
    m = model.backend.manifest
    if model.task == "embed":
        return (
            [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            [{"name": "embedding", "datatype": "FP32", "shape": [-1, m.dimensions]}],
        )
    if model.task == "rerank":
        return (
            [
                {"name": "query", "datatype": "BYTES", "shape": [1]},
                {"name": "document", "datatype": "BYTES", "shape": [-1]},
            ],
            [{"name": "score", "datatype": "FP32", "shape": [-1]}],
        )
    labels = model.score.labels if model.score is not None else []
    return (
        [
            {"name": "text", "datatype": "BYTES", "shape": [-1]},
            {"name": "text_pair", "datatype": "BYTES", "shape": [-1], "optional": True},
        ],
        [{"name": "scores", "datatype": "FP32", "shape": [-1, len(labels)]}],
    )


async def server_live(ctx: Context, body: None = None) -> Response:
    return ctx.respond({"live": True, "status": "ok"})


async def server_ready(ctx: Context, body: None = None) -> Response:
    """The protocol's body ({"ready": ...}, what KServe's SDK reads), 503 with Retry-After until
    every model is warm, as /ready."""
    status = readiness(ctx.registry)
    if status == "ready":
        return ctx.respond({"ready": True, "status": status})
    response = ctx.respond({"ready": False, "status": status}, status=503)
    response.headers["retry-after"] = "2"
    return response


async def server_metadata(ctx: Context, body: None = None) -> Response:
    return ctx.respond({"name": "headwise", "version": __version__, "extensions": EXTENSIONS})


def metadata(model: Model) -> dict[str, Any]:
    inputs, outputs = signature(model)
    return {
        "name": model.name,
        "versions": [VERSION],
        "platform": f"{model.backend.info.runtime}_onnx",
        "inputs": inputs,
        "outputs": outputs,
    }


async def model_metadata(ctx: Context, body: None = None) -> Response:
    return ctx.respond(metadata(_model(ctx)))


async def model_ready(ctx: Context, body: None = None) -> Response:
    model = _model(ctx)
    if not ctx.registry.probed_ready:
        raise Unavailable(f"model {model.name!r} is not ready: the server is loading or draining")
    return ctx.respond({"name": model.name, "ready": True})


def _flag(parameters: dict[str, Any], name: str, default: bool | None) -> bool | None:
    value = parameters.get(name, default)
    if value is not None and not isinstance(value, bool):
        raise BadTensor(f"parameter {name!r} must be a boolean")
    return value


def _needs(request: tensors.Request, names: list[str], optional: tuple[str, ...] = ()) -> None:
    unknown = [n for n in request.inputs if n not in names]
    if unknown:
        raise BadTensor(f"unexpected input {unknown[0]!r}: this model takes {', '.join(names)}")
    missing = [n for n in names if n not in request.inputs and n not in optional]
    if missing:
        raise BadTensor(f"input {missing[0]!r} is missing: this model takes {', '.join(names)}")


async def _embed(
    ctx: Context, model: Model, request: tensors.Request
) -> list[tuple[str, np.ndarray]]:
    _needs(request, ["text"])
    pipe = model.embed
    assert pipe is not None
    p = request.parameters
    dimensions = p.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)):
        raise BadTensor("parameter 'dimensions' must be an integer")
    prompt = p.get("prompt_name")
    if prompt is not None and not isinstance(prompt, str):
        raise BadTensor("parameter 'prompt_name' must be a string")
    texts = pipe.validate(tensors.texts(request.inputs["text"]), "text", dimensions)
    how = Tokenizing(truncate=_flag(p, "truncate", True) is not False, prompt_name=prompt)
    out = await pipe.embed(ctx.call, texts, how, _flag(p, "normalize", None), dimensions)
    return [("embedding", out.vectors)]


async def _rerank(
    ctx: Context, model: Model, request: tensors.Request
) -> list[tuple[str, np.ndarray]]:
    _needs(request, ["query", "document"])
    pipe = model.score
    assert pipe is not None
    (query, *more) = tensors.texts(request.inputs["query"]) or [""]
    if more:
        raise BadTensor("input 'query' must hold one text (shape [1])")
    documents = tensors.texts(request.inputs["document"])
    pipe.check(documents, "document", ctx.settings.rerank_max_documents)
    p = request.parameters
    out = await pipe.score(
        ctx.call, [(query, d) for d in documents], _flag(p, "truncate", True) is not False
    )
    return [("score", pipe.relevance(out.logits, bool(_flag(p, "raw_scores", False))))]


async def _classify(
    ctx: Context, model: Model, request: tensors.Request
) -> list[tuple[str, np.ndarray]]:
    _needs(request, ["text", "text_pair"], optional=("text_pair",))
    pipe = model.score
    assert pipe is not None
    first = tensors.texts(request.inputs["text"])
    items: list[str | tuple[str, str]] = list(first)
    if "text_pair" in request.inputs:
        second = tensors.texts(request.inputs["text_pair"])
        if len(second) != len(first):
            raise BadTensor(f"text_pair has {len(second)} elements for {len(first)} texts")
        items = list(zip(first, second, strict=True))
    pipe.check(items, "text")
    p = request.parameters
    out = await pipe.score(ctx.call, items, _flag(p, "truncate", True) is not False)
    return [("scores", pipe.probabilities(out.logits, bool(_flag(p, "raw_scores", False))))]


RUNS = {"embed": _embed, "rerank": _rerank, "classify": _classify}


async def inferred(
    ctx: Context, model: Model, request: tensors.Request
) -> list[tuple[str, np.ndarray]]:
    """The outputs asked for (all when none was named), over HTTP or gRPC."""
    _, declared = signature(model)
    names = [o["name"] for o in declared]
    for name in request.outputs or []:
        if name not in names:
            raise BadTensor(f"unknown output {name!r}: this model gives {', '.join(names)}")
    for tensor in request.inputs.values():
        _shape(tensor)
    outputs = await RUNS[model.task](ctx, model, request)
    if request.outputs is not None:
        outputs = [(n, v) for n, v in outputs if n in request.outputs]
    return outputs


async def infer(ctx: Context, body: None = None) -> Response:
    model = _model(ctx)  # readiness: its route is declared ready=True, dispatch checks it
    raw = await ctx.http.body()
    length = ctx.http.headers.get(tensors.HEADER)
    if length is not None and not length.isdigit():
        raise BadTensor(f"Inference-Header-Content-Length must be a byte count, not {length!r}")
    request = tensors.parse(raw, int(length) if length is not None else None)
    try:
        outputs = await inferred(ctx, model, request)
    except (InvalidInput, PayloadTooLarge, WrongTask) as exc:  # the protocol's 400, same words
        raise BadTensor(exc.message) from None
    data, header = tensors.answer(model.name, request.id, outputs, request.binary)
    if header is None:
        return Response(data, media_type="application/json")
    return Response(
        data,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(header)},
    )


def _shape(tensor: Tensor) -> None:
    """Texts come as [n] or [n, 1]."""
    shape = tensor.shape
    if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
        raise BadTensor(f"input {tensor.name!r} has shape {shape}: texts come as [n] or [n, 1]")
