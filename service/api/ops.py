"""What operators and orchestrators call: liveness, readiness, Prometheus metrics, and /info
(the served models, where they run, the limits; with TEI's Info fields for the model that
answers the route a TEI client is about to call)."""

from __future__ import annotations

import os
from typing import Any, get_args

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from starlette.responses import Response

from service import __version__
from service.api.context import Context
from service.api.tei.info import Info, tei_info
from service.engine.cpu import cores, detect
from service.errors import InvalidInput
from service.manifest import GraphKey, Pruning
from service.registry import Capability, Model, Registry
from service.settings import Settings

CAPABILITIES: tuple[Capability, ...] = get_args(Capability)


class Status(BaseModel):
    status: str


async def health(ctx: Context, body: None = None) -> Response:
    return ctx.respond({"status": "ok"})


def readiness(registry: Registry) -> str:
    """ready, or why not: draining, failed (to load), loading (or a sibling worker is)."""
    if registry.probed_ready:
        return "ready"
    if registry.drain.draining:
        return "draining"
    return "failed" if registry.load_error else "loading"


async def ready(ctx: Context, body: None = None) -> Response:
    status = readiness(ctx.registry)
    if status != "ready":
        response = ctx.respond({"status": status}, status=503)
        response.headers["retry-after"] = "2"
        return response
    return ctx.respond({"status": "ready"})


async def metrics(ctx: Context, body: None = None) -> Response:
    return Response(generate_latest(ctx.registry.metrics.exposed), media_type=CONTENT_TYPE_LATEST)


def describe(model: Model, routes: str, settings: Settings) -> dict[str, Any]:
    m, runtime = model.backend.manifest, model.backend.info
    return {
        "name": model.name,
        "task": m.task,
        "architecture": m.architecture,
        "source": m.source.model_dump(exclude_none=True),
        "dimensions": m.dimensions,
        "num_layers": m.num_layers,
        "num_heads": m.num_heads,
        "max_length": m.max_length,
        "pooling": m.pooling,
        "normalize_default": m.normalize,
        "prompts": sorted(m.prompts),
        "labels": m.labels,
        "outputs": model.served_outputs,
        "routes": routes,
        "runtime": runtime.runtime,
        "runtime_reason": runtime.reason,
        # A precision below fp32 on OpenVINO: its retrieval against fp32, judged at start.
        "runtime_quality": q.model_dump() if (q := getattr(model.backend, "quality", None)) else None,
        "providers": runtime.providers,
        "device": runtime.device,
        "graph": runtime.graph,
        "precision": runtime.precision,
        # OpenVINO: the lengths batches run at, as start-up measured them (engine/tiles.py)
        "padding": runtime.padding,
        "streams": model.backend.streams,  # batches computed at once (OpenVINO's streams)
        # ... and a batch alone with every thread, on a second compile (engine/alone.py)
        "lone_compile": model.backend.lone,
        "fused": m.graphs[runtime.graph].fused,
        "unfused_reason": m.graphs[runtime.graph].unfused_reason,
        "fused_ops": m.graphs[runtime.graph].op_counts,
        "graph_bytes": {key: g.total_bytes for key, g in m.graphs.items()},
        # Each graph's files (the graph, then its external data, if any) and their sizes.
        "graph_files": {
            key: {g.file: g.bytes, **{d.file: d.bytes for d in g.data}}
            for key, g in m.graphs.items()
        },
        "instruction_format": m.instruction_format,
        "rerank_template": m.rerank_template is not None,
        # A pruned model: the heads and FFN neurons removed, and its retrieval gate's figures.
        "pruning": m.pruning.model_dump() if m.pruning is not None else None,
        # An image-text model: its vision tower (on ONNX Runtime; its maps fp32) and zero-shot.
        "vision": _vision(model),
        "zero_shot": m.zero_shot.model_dump() if m.zero_shot is not None else None,
        "tei": tei_info(model, settings),
    }


def _vision(model: Model) -> dict[str, Any] | None:
    v = model.backend.manifest.vision
    if v is None:
        return None
    graph: GraphKey = getattr(model.backend, "vision_graph", None) or "encoder"
    return {
        "architecture": v.architecture,
        "num_layers": v.num_layers,
        "num_heads": v.num_heads,
        "image_size": v.image_size,
        "patch_size": v.patch_size,
        "tokens": v.tokens,
        "pooling": v.pooling,
        "graph": graph,
        "precision": v.graphs[graph].precision,
        "runtime": "onnxruntime",
        "fused": v.graphs[graph].fused,
        "preprocessing": v.preprocessing.model_dump(),
        "text_padding": model.backend.manifest.text_padding,
    }


def limits(s: Settings) -> dict[str, Any]:
    return {
        "max_inputs": s.max_inputs,
        "max_input_chars": s.max_input_chars,
        "max_body_bytes": s.max_body_bytes,
        "max_batch_tokens": s.max_batch_tokens,
        "max_batch_size": s.max_batch_size,
        "max_wait_ms": s.max_wait_ms,
        "max_queue_texts": s.max_queue_texts,
        "request_timeout_s": s.request_timeout_s,
        "attention_max_tokens": s.attention_max_tokens,
        "attention_max_numbers": s.attention_max_numbers,
        "attention_budget_numbers": s.attention_budget_numbers,
        "attention_cpu_share": s.attention_cpu_share,
        "explain_max_work": s.explain_max_work,
        "explain_cpu_share": s.explain_cpu_share,
        "explain_batch_tokens": s.explain_batch_tokens,
        "explain_queue": s.explain_queue,
        "calibration_s": s.calibration_s,
        # A stated rate only when the operator set one (unset: measured, see `capacity`).
        **({"capacity_tokens_per_s": s.capacity_tokens_per_s} if s.capacity_tokens_per_s else {}),
        "multi_vector_max_numbers": s.multi_vector_max_numbers,
        "multi_vector_budget_numbers": s.multi_vector_budget_numbers,
        "sparse_batch_bytes": s.sparse_batch_bytes,
    }


class ServedModel(BaseModel):
    name: str
    task: str
    architecture: str
    dimensions: int
    num_layers: int
    num_heads: int
    max_length: int
    outputs: list[str] = Field(
        default_factory=list, description="an embedding model's: dense, sparse, multi_vector"
    )
    routes: str
    runtime: str = Field(description="onnxruntime or openvino: what runs the serving graph")
    runtime_reason: str = Field(description="why this runtime and precision, on this CPU")
    precision: str = Field(description="what computes: fp32, fp16, bf16, int8")
    streams: int = Field(
        1, description="batches the serving graph computes at once (HEADWISE_OPENVINO_STREAMS)"
    )
    pruning: Pruning | None = Field(
        None, description="a pruned bundle: what `headwise export --prune-*` removed, its gate"
    )
    tei: Info


class SessionCost(BaseModel):
    """A batcher's cost per batch of r texts of n tokens, a + b r n + c r n² seconds
    (service/engine/cost.py), and how it was obtained."""

    source: str
    batch_s: float | None
    token_s: float | None
    token_length_s: float | None
    calibration: list[list[float]] = Field(description="[rows, n, seconds] timed at warm-up")
    calibration_s: float
    longest_measured: int
    batches_served: int


class InfoResponse(Info):
    """TEI's Info (for the model that answers the asked route, else the first), then headwise's:
    every model, which model answers each route, the limits, memory and capacity."""

    model: str
    models: list[ServedModel]
    served_by: dict[str, str]
    attention_enabled: bool
    cpu: dict[str, Any] = Field(
        description="this CPU's model and the flags that choose a runtime (amx_*, avx512_bf16, "
        "*vnni, avx512f, avx2)"
    )
    limits: dict[str, float | int]
    capacity: dict[str, dict[str, SessionCost]] = Field(
        description="per model, per batcher: what admission prices a batch at"
    )
    pace: dict[str, float] = Field(
        description="how fast the models' cores work off the batches' predicted seconds while "
        "computing (pace, at most 1: admission divides the work ahead by it), from the recent "
        "busy seconds (busy_s) and the predicted seconds finished in them (done_s)"
    )
    version: str


def _chosen(ctx: Context) -> Model:
    """`?model=NAME`, or `?route=PATH` (the model that answers it), else the first model."""
    params = ctx.http.query_params
    registry = ctx.registry
    if (name := params.get("model")) is not None:
        if name not in registry.models:
            raise InvalidInput(
                f"model {name!r} is not served here; served: {', '.join(registry.models)}",
                param="model",
            )
        return registry.models[name]
    if (path := params.get("route")) is not None:
        for capability in CAPABILITIES:
            if path in registry.routes_of(capability):
                return registry.pick(None, capability)
        raise InvalidInput(f"route {path!r} does not run a model", param="route")
    return registry.first


async def info(ctx: Context, body: None = None) -> Response:
    registry, s = ctx.registry, ctx.settings
    chosen = _chosen(ctx)
    models = [describe(m, registry.routes_of_model(m), s) for m in registry]
    served_by: dict[str, str] = {}
    for capability in CAPABILITIES:
        candidates = [m for m in registry if capability in m.capabilities]
        for path in registry.routes_of(capability) if candidates else ():
            served_by.setdefault(path, candidates[0].name)
    first = next(m for m in models if m["name"] == chosen.name)
    cpu = detect()
    payload = {
        **tei_info(chosen, s),  # TEI's Info fields: TEI clients read them
        "model": chosen.name,
        **{k: v for k, v in first.items() if k not in ("name", "tei")},
        "models": models,
        "served_by": served_by,
        "attention_enabled": s.attention_enabled,
        # What chose each model's runtime and precision (models[].runtime_reason says how).
        # and the threads its runtimes run: the CPUs this process may use (affinity, quota).
        "cpu": {
            "model": cpu.model,
            "flags": cpu.shown,
            "bf16": cpu.bf16,
            "cores": cores().describe(),
        },
        # This process among HEADWISE_WORKERS (each answers for itself; /metrics for all).
        "workers": {"count": s.workers, "pid": os.getpid()},
        "limits": limits(s),
        "memory": {"config": s.memory, **registry.memory()},
        # Each batcher's cost per batch (the batchers of one session share it): what
        # admission prices requests by, and how it was obtained (service/engine/cost.py).
        "capacity": {m.name: {b.name: b.cost.describe() for b in m.batchers} for m in registry},
        # What tokenising a request's characters costs, per model (its tokenizer): admission
        # prices it with the batches (service/engine/preparing.py).
        "tokenising": {m.name: m.prepare_cost.describe() for m in registry},
        # The models share one device: its pace under load (engine/cost.py, Device).
        "pace": registry.first.admission.device.describe(),
        "version": __version__,
    }
    return ctx.respond(payload)
