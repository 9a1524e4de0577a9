"""The Open Inference Protocol over gRPC: `inference.GRPCInferenceService`, as Triton and KServe
serve it (tritonclient.grpc, KServe's InferenceGRPCClient).

The same tensors, parameters and pipelines as the HTTP protocol (service/api/oip/handlers.py):
inputs come as `raw_input_contents` (what the clients send by default; BYTES elements each
after its 4-byte length) or as typed `contents`; outputs go out in `raw_output_contents` only,
little-endian FP32, which is where the clients read them.
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np

from service import __version__
from service.api.context import Context
from service.api.oip import handlers, tensors
from service.api.oip.tensors import BadTensor
from service.rpc.calls import Rpcs
from service.rpc.generated import grpc_predict_v2_pb2 as pb
from service.rpc.generated import grpc_predict_v2_pb2_grpc as pb_grpc

SERVICE = "inference.GRPCInferenceService"
# The typed contents field of each datatype (when the client does not send raw contents).
CONTENTS = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP16": "fp32_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _parameter(p: pb.InferParameter) -> Any:
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which is not None else None


def _parameters(params: Any) -> dict[str, Any]:
    return {k: _parameter(v) for k, v in params.items()}


def _input(t: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> tensors.Tensor:
    spec = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
    if raw is None:
        field = CONTENTS.get(t.datatype)
        if field is None:
            raise BadTensor(f"input {t.name!r}: unknown datatype {t.datatype!r}")
        values = list(getattr(t.contents, field))
        if t.datatype == "BYTES":
            raw = tensors.bytes_raw(values)
        else:
            dtype = np.dtype(tensors.NUMERIC[t.datatype])
            raw = np.asarray(values).astype(dtype).tobytes()
    return tensors.tensor(spec, raw)


def request_of(message: pb.ModelInferRequest) -> tensors.Request:
    raws = list(message.raw_input_contents)
    if raws and len(raws) != len(message.inputs):
        raise BadTensor(
            f"{len(raws)} raw_input_contents for {len(message.inputs)} inputs: send one per input"
        )
    inputs: dict[str, tensors.Tensor] = {}
    for i, spec in enumerate(message.inputs):
        one = _input(spec, raws[i] if raws else None)
        if one.name in inputs:
            raise BadTensor(f"input {one.name!r} is given twice")
        inputs[one.name] = one
    outputs = [o.name for o in message.outputs] or None
    return tensors.Request(message.id or None, inputs, outputs, True, _parameters(message.parameters))


def response_of(
    model: str, rid: str | None, outputs: list[tuple[str, np.ndarray]]
) -> pb.ModelInferResponse:
    out = pb.ModelInferResponse(model_name=model, model_version=handlers.VERSION, id=rid or "")
    for name, values in outputs:
        array = np.ascontiguousarray(values, dtype="<f4")
        out.outputs.add(name=name, datatype="FP32", shape=list(array.shape))
        out.raw_output_contents.append(array.tobytes())
    return out


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, rpcs: Rpcs) -> None:
        self.rpcs = rpcs

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def live(ctx: Context) -> pb.ServerLiveResponse:
            return pb.ServerLiveResponse(live=True)

        return await self.rpcs.unary(context, f"/{SERVICE}/ServerLive", live, ready=False)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def ready(ctx: Context) -> pb.ServerReadyResponse:
            return pb.ServerReadyResponse(ready=ctx.registry.probed_ready)

        return await self.rpcs.unary(context, f"/{SERVICE}/ServerReady", ready, ready=False)

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def ready(ctx: Context) -> pb.ModelReadyResponse:
            handlers.find(ctx, request.name, request.version)
            return pb.ModelReadyResponse(ready=ctx.registry.probed_ready)

        return await self.rpcs.unary(context, f"/{SERVICE}/ModelReady", ready, ready=False)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def metadata(ctx: Context) -> pb.ServerMetadataResponse:
            return pb.ServerMetadataResponse(
                name="headwise", version=__version__, extensions=handlers.EXTENSIONS
            )

        return await self.rpcs.unary(context, f"/{SERVICE}/ServerMetadata", metadata, ready=False)

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def metadata(ctx: Context) -> pb.ModelMetadataResponse:
            m = handlers.metadata(handlers.find(ctx, request.name, request.version))
            out = pb.ModelMetadataResponse(
                name=m["name"], versions=m["versions"], platform=m["platform"]
            )
            for kind in ("inputs", "outputs"):
                for t in m[kind]:
                    getattr(out, kind).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
            return out

        return await self.rpcs.unary(context, f"/{SERVICE}/ModelMetadata", metadata, ready=False)

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def infer(ctx: Context) -> pb.ModelInferResponse:
            model = handlers.find(ctx, request.model_name, request.model_version)
            parsed = request_of(request)
            outputs = await handlers.inferred(ctx, model, parsed)
            return response_of(model.name, parsed.id, outputs)

        return await self.rpcs.unary(context, f"/{SERVICE}/ModelInfer", infer)


def add(server: grpc.aio.Server, rpcs: Rpcs) -> list[str]:
    """The service on the server; the names it serves (for health and reflection)."""
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(rpcs), server)  # type: ignore[no-untyped-call]
    return [SERVICE]
