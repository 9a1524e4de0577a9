"""The served models and their pipelines: one typed container, built in the lifespan.

Each bundle becomes a `Model`: its backend (ONNX Runtime sessions, tokenizer) and a pipeline
per task it serves, each pipeline with its own batcher and worker thread, and one admission
that counts the work of all its serving batchers. `Registry.pick` is the one place that turns a
request's model name (or none) into a model that can answer the route.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from service.bundle import MANIFEST, BundleError, read_manifest
from service.engine.admission import Admission
from service.engine.batch_policy import BatchPolicy
from service.engine.batcher import DynamicBatcher, Infer
from service.engine.cost import CostModel
from service.engine.cpu import auto_streams, cores, detect, threads_for
from service.engine.memory import (
    LARGE_REQUESTS,
    MemoryBoundError,
    ModelCost,
    attention_bytes,
    check_fit,
    encode_batch_bytes,
    gib,
    memory_budget,
    memory_limit,
    request_bytes,
    rss_bytes,
)
from service.engine.preparing import PrepareCost, sample_texts
from service.engine.preparing import calibrate as calibrate_tokenizer
from service.engine.runtime import Backend, DeviceUnavailable
from service.errors import HeadwiseError, ModelNotFound, Unavailable, WrongTask
from service.manifest import GraphKey, Manifest
from service.metrics import Metrics
from service.pipelines.attention.images import ImageAttention
from service.pipelines.attention.pipeline import AttentionPipeline
from service.pipelines.base import Intake
from service.pipelines.call import Drain
from service.pipelines.embed import EmbedPipeline
from service.pipelines.explain.images import PatchOcclusion
from service.pipelines.explain.pipeline import ExplainPipeline, Traffic
from service.pipelines.images import ImagePipeline
from service.pipelines.outputs import OutputsPipeline, expansion_pad, outputs_infer
from service.pipelines.score import ScorePipeline
from service.pipelines.template import templated
from service.settings import Settings
from service.tensors import Batch

log = logging.getLogger(__name__)

# Warm-up's pace probe: the seconds every serving session computes full batches at once.
PROBE_S = 0.4
# A SPLADE batch's float32 (tokens, vocabulary) logits (max pooling holds only those: the
# mask is inside the GEMM), and room for a second such tensor (sum pooling's elementwise pass).
VOCABULARY_BYTES_PER_TOKEN = 8
# A token vector's number in flight: the graph's output (4), its copy (4), its JSON (~12, and
# again while joined): 32 bytes a number is the bound used.
MULTI_VECTOR_BYTES_PER_NUMBER = 32

# What a route needs of a model. Any model can "tokenize". "embed" is a dense vector; an
# embedding model may have sparse or token-vector outputs besides, or instead ("encode": any).
Capability = Literal[
    "embed",
    "rerank",
    "classify",
    "attention",
    "explain",
    "tokenize",
    "encode",
    "sparse",
    "multi_vector",
    "images",
]
# What the serving batchers compute, admitted by the models' one admission (tokenising runs no
# model; /attention is admitted and paced apart, on its own budget).
BATCHED: frozenset[Capability] = frozenset(
    {"embed", "rerank", "classify", "explain", "encode", "sparse", "multi_vector", "images"}
)
WANTED: dict[Capability, str] = {
    "embed": "an embedding model",
    "rerank": "a reranker",
    "classify": "a classifier",
    "attention": "a model with its attention graph (HEADWISE_ATTENTION_ENABLED)",
    "explain": "an embedding model with a dense vector, a reranker or a classifier",
    "tokenize": "any model",
    "encode": "an embedding model (dense, sparse or multi-vector)",
    "sparse": "a model with a sparse output (SPLADE, bge-m3)",
    "multi_vector": "a model with a multi-vector output (ColBERT, bge-m3)",
    "images": "an image-text model (CLIP, SigLIP)",
}
# The capabilities that are a model's outputs: a request for one names what the model has.
OUTPUT_CAPABILITIES: dict[Capability, str] = {
    "embed": "dense",
    "sparse": "sparse",
    "multi_vector": "multi_vector",
}
# Which routes serve a capability: derived from the route declaration by the app.
RoutesOf = Callable[[Capability], list[str]]


# True inside the requests a server sends itself before ready (service/http/rehearsal.py):
# they are answered though not ready, and neither counted nor traced.
REHEARSING: ContextVar[bool] = ContextVar("headwise_rehearsing", default=False)


@dataclass(frozen=True)
class ModelSpec:
    """`DIR` or `NAME=DIR`, as given to --bundle / HEADWISE_BUNDLES."""

    path: Path
    name: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        name, sep, path = text.partition("=")
        if not sep:
            return cls(Path(text.strip()))
        if not name.strip() or not path.strip():
            raise ValueError(f"bundle {text!r}: expected DIR or NAME=DIR")
        return cls(Path(path.strip()), name.strip())


Loader = Callable[[ModelSpec, Settings], Backend]


def batch_policy(s: Settings, inline: bool = False) -> BatchPolicy:
    """inline: the backend's runs may run on the event loop (Backend.inline)."""
    return BatchPolicy(
        max_batch_tokens=s.max_batch_tokens,
        max_batch_s=s.max_batch_s,
        max_batch_size=s.max_batch_size,
        max_wait_s=s.max_wait_ms / 1e3,
        max_padding_ratio=s.max_padding_ratio,
        max_queue=s.max_queue_texts,
        padding_slack=s.padding_slack_tokens,
        inline_max_tokens=s.inline_max_tokens if inline else 0,
    )


def session_cost(s: Settings, backend: Backend) -> CostModel:
    """A serving session's cost: measured, or the operator's stated rate (a token of an n-long
    sequence counting 1 + n / (6 d_model): where attention's n x d products equal the 24 d² of
    the projections and FFN)."""
    d_model = backend.manifest.d_model
    return CostModel(s.capacity_tokens_per_s, 6 * d_model, learns=backend.measurable)


def any_word(model: Model) -> int:
    """The id warm-up and calibration run: any word (a run's cost is not its ids')."""
    return model.backend.manifest.vocab_size // 2


@dataclass(frozen=True)
class Calibration:
    """A batcher whose session warm-up times, up to the longest input it runs (from the
    shortest: a vision tower's inputs all have one length)."""

    batcher: DynamicBatcher
    longest: int
    shortest: int = 8


@dataclass
class Model:
    name: str
    backend: Backend
    created: int  # unix seconds, for OpenAI's model list
    admission: Admission
    embed: EmbedPipeline | None = None
    score: ScorePipeline | None = None  # rerank or classify
    attention: AttentionPipeline | None = None
    explain: ExplainPipeline | None = None
    batchers: list[DynamicBatcher] = field(default_factory=list)
    outputs: OutputsPipeline | None = None  # sparse and token vectors (and dense) at once
    images: ImagePipeline | None = None  # an image-text model's vision tower
    patches: PatchOcclusion | None = None  # /explain on an image: its patches left out
    calibrations: list[Calibration] = field(default_factory=list)  # one per session
    prepare_cost: PrepareCost = field(default_factory=PrepareCost)  # its tokenizer's

    @property
    def task(self) -> str:
        return self.backend.manifest.task

    @property
    def capabilities(self) -> set[Capability]:
        caps: set[Capability] = {"tokenize"}
        if self.embed is not None:
            caps.add("encode")
            caps |= {c for c, out in OUTPUT_CAPABILITIES.items() if out in self.served_outputs}
        if self.score is not None:
            caps.add("rerank" if self.task == "rerank" else "classify")
        if self.attention is not None:
            caps.add("attention")
        if self.explain is not None:
            caps.add("explain")
        if self.images is not None:
            caps.add("images")
        return caps

    @property
    def served_outputs(self) -> list[str]:
        """An embedding model's outputs (dense, sparse, multi_vector); none for a scorer."""
        return list(self.backend.manifest.outputs) if self.embed is not None else []

    @property
    def serving_batchers(self) -> list[DynamicBatcher]:
        """Those that run the serving graph (each may hold its largest batch at once)."""
        attention = self.attention.batchers if self.attention else []
        return [b for b in self.batchers if b not in attention]

    @property
    def batches_at_once(self) -> int:
        """The serving graph's batches that may be held at once: its batchers' streams."""
        return sum(b.concurrency for b in self.serving_batchers)


def build_model(
    name: str,
    backend: Backend,
    settings: Settings,
    metrics: Metrics,
    admission: Admission | None = None,
) -> Model:
    """admission: shared by the models on one device (default: this model's own)."""
    manifest = backend.manifest
    admission = admission or Admission(settings.request_timeout_s, settings.admission_headroom)
    model = Model(name, backend, manifest.created or int(time.time()), admission)
    model.prepare_cost = PrepareCost(
        backend.measurable and settings.capacity_tokens_per_s is None, cores().usable
    )
    # One cost per session: the batchers that run the main session share one, the long lane's
    # its own (one thread, lowest priority).
    main, long_lane = session_cost(settings, backend), session_cost(settings, backend)

    def batcher(
        infer: Infer, path: str, lane: bool = False, pad: int | None = None, streams: int = 1
    ) -> DynamicBatcher:
        """pad: the id batches are padded with (default the tokenizer's); streams: batches its
        session computes at once."""
        policy = batch_policy(settings, backend.inline and not lane)
        vocabulary = vocabulary_batch_tokens(manifest, settings)  # SPLADE's logits are wide
        policy.max_batch_tokens = min(policy.max_batch_tokens, vocabulary)
        if lane:  # one long sequence at a time: it is seconds of work
            policy.max_batch_size = 1
        b = DynamicBatcher(
            infer,
            policy,
            metrics.observer(path, name),
            f"{path}-{name}",
            manifest.special_tokens.pad if pad is None else pad,
            nice=19 if lane else 0,
            cost=long_lane if lane else main,
            device=admission.device,
            concurrency=streams,
            lone=streams > 1 and backend.lone,
        )
        model.batchers.append(b)
        admission.batchers.append(b)
        return b

    def intake(
        infer: Infer,
        path: str,
        long_infer: Infer | None = None,
        pad: int | None = None,
        streams: int = backend.streams,  # the serving session's (the vision tower's: 1)
    ) -> Intake:
        long = None
        if backend.long_tokens and long_infer is not None:
            long = batcher(long_infer, f"{path}_long", lane=True, pad=pad)
        main_lane = batcher(infer, path, pad=pad, streams=streams)
        return Intake(
            main_lane, admission, metrics, path, name, long, backend.long_tokens,
            model.prepare_cost,
        )  # fmt: skip

    if manifest.task == "embed":
        tokens = None
        if backend.token_output:

            def run_tokens(batch: Batch) -> np.ndarray:
                out = backend.run_tokens(batch)
                assert out is not None  # token_output says the graph has it
                return out

            tokens = intake(run_tokens, "embed_all")
        outputs = None
        if manifest.sparse is not None or manifest.multi_vector is not None:
            outputs = intake(
                outputs_infer(backend),
                "encode_outputs",
                outputs_infer(backend, long=True),
                pad=expansion_pad(manifest),
            )
        if "dense" in manifest.outputs or outputs is None:
            encode = intake(backend.run, "encode", backend.run_long)
        else:  # no dense vector: the outputs' intake is the model's only one
            encode = outputs
        model.embed = EmbedPipeline(backend, encode, settings, tokens)
        if outputs is not None:
            model.outputs = OutputsPipeline(model.embed, outputs, settings)
    else:  # rerank, classify: the same batching, one sequence (a pair) each
        pairs = intake(backend.run, manifest.task, backend.run_long)
        model.score = ScorePipeline(backend, pairs, settings)
    if settings.attention_enabled and "attention" in manifest.graphs:
        # Its own admission: its batcher is paced and bounded by its own budget, apart (but
        # on the same cores: a batch beside it is not measured as its own).
        own = Admission(settings.request_timeout_s, 1.0, admission.device)
        # A causal LM reranker's pairs are shown as its template builds them.
        model.attention = AttentionPipeline(
            name, templated(backend), settings, metrics, own, session_cost(settings, backend)
        )
        model.batchers += model.attention.batchers
    if manifest.vision is not None:
        # The vision tower: a batcher of its own (its cost is its own session's), its images
        # all one length (the tower's tokens), calibrated at that length.
        images = intake(backend.run_images, "encode_images", streams=1)
        model.images = ImagePipeline(backend, images, settings)
        length = manifest.vision.tokens
        model.calibrations.append(Calibration(images.batcher, length, length))
        vision_maps = "attention" in manifest.vision.graphs
        if model.attention is not None and vision_maps:
            a = model.attention
            a.images = ImageAttention(
                name, backend, settings, metrics, a.admission, a.budget, a.pacer,
                model.images.pixels, session_cost(settings, backend),
            )  # fmt: skip
            model.batchers.append(a.images.batcher)
            model.calibrations.append(Calibration(a.images.batcher, length, length))
    serving = model.embed or model.score
    assert serving is not None
    # Warm-up times each session through its primary batcher: the main lane up to the longest
    # input it takes, the long lane up to the model's maximum, the attention graph up to its.
    lanes = serving.intake
    longest = backend.long_tokens or manifest.max_length
    model.calibrations.append(Calibration(lanes.batcher, longest))
    if lanes.long is not None:
        model.calibrations.append(Calibration(lanes.long, manifest.max_length))
    if model.attention is not None:
        shown = min(settings.attention_max_tokens, manifest.max_length)
        model.calibrations.append(Calibration(model.attention.batcher, shown))
    if model.score is None and "dense" not in manifest.outputs:
        return model  # explanations compare dense vectors (or scores)
    # Explanations run on the serving batchers (and lanes), with their traffic; their pacer
    # yields to the work others queue on any serving batcher of the device (the admission's).
    model.explain = ExplainPipeline(
        name,
        templated(backend, own_words=True),  # a causal LM reranker's words, not its template's
        Intake(lanes.batcher, admission, metrics, "explain", name, lanes.long, lanes.long_tokens),
        settings,
        Traffic(lambda: (b for b in admission.batchers if isinstance(b, DynamicBatcher))),
        embed=model.embed,
        score=model.score,
        attention=model.attention,
    )
    if model.images is not None and model.embed is not None:
        image_maps = model.attention.images if model.attention is not None else None
        model.patches = PatchOcclusion(
            model.images, model.embed, model.explain, settings, image_maps
        )
    return model


def vocabulary_batch_tokens(manifest: Manifest, settings: Settings) -> int:
    """A SPLADE graph holds (tokens x vocabulary) logits twice over a batch: the tokens that
    fit in HEADWISE_SPARSE_BATCH_BYTES, but one input always; unbounded for other graphs."""
    sparse = manifest.sparse
    if sparse is None or sparse.kind != "vocabulary":
        return settings.max_batch_tokens
    fits = settings.sparse_batch_bytes // (VOCABULARY_BYTES_PER_TOKEN * manifest.vocab_size)
    return max(manifest.max_length, fits)


def outputs_bytes(manifest: Manifest, settings: Settings, batchers: int) -> int:
    """What a model's sparse and multi-vector outputs may hold beyond its batches' working
    memory: SPLADE's vocabulary-wide logits in each batcher's largest batch, and the token
    vectors of the answers in flight (their budget)."""
    total = 0
    sparse = manifest.sparse
    if sparse is not None and sparse.kind == "vocabulary":
        tokens = vocabulary_batch_tokens(manifest, settings)
        total += batchers * tokens * VOCABULARY_BYTES_PER_TOKEN * manifest.vocab_size
    if manifest.multi_vector is not None:
        total += settings.multi_vector_budget_numbers * MULTI_VECTOR_BYTES_PER_NUMBER
    return total


def unique_names(specs: Sequence[ModelSpec], manifest_names: Sequence[str]) -> list[str]:
    """Each model's name (given, else its manifest's); duplicates are an error naming them."""
    names = [spec.name or found for spec, found in zip(specs, manifest_names, strict=True)]
    seen: dict[str, Path] = {}
    for spec, name in zip(specs, names, strict=True):
        if name in seen:
            raise ValueError(
                f"two bundles are named {name!r} ({seen[name]} and {spec.path}): "
                "name one with --bundle NAME=DIR"
            )
        seen[name] = spec.path
    return names


def load_backends(specs: Sequence[ModelSpec], loader: Loader, settings: Settings) -> list[Backend]:
    """One backend per bundle; a bundle that cannot be loaded stops it all, naming the folder.

    Only one session in a process may spin its threads: several spinning at once fight for the
    cores (measured ~5x slower). The first model's serving session is that one.
    """
    quiet = settings.model_copy(update={"spinning": False})
    backends = []
    for i, spec in enumerate(specs):
        try:
            backends.append(loader(spec, settings if i == 0 else quiet))
        except DeviceUnavailable:
            raise
        except Exception as exc:
            raise RuntimeError(f"cannot load bundle {spec.path}: {exc}") from exc
    return backends


def expected_graph(manifest: Manifest, settings: Settings) -> GraphKey:
    """The serving graph a backend will load for these settings (before it is loaded)."""
    keys: dict[str, GraphKey] = {"fp16": "encoder_fp16", "int8": "encoder_int8"}
    if settings.runtime == "openvino" and settings.precision == "int8":
        keys = {"int8": "encoder_int8_openvino"}
    if settings.precision in keys and keys[settings.precision] in manifest.graphs:
        return keys[settings.precision]
    if settings.precision == "auto" and settings.device == "cuda":
        return "encoder_fp16" if "encoder_fp16" in manifest.graphs else "encoder"
    return "encoder"


def model_cost(
    name: str, manifest: Manifest, graph: GraphKey, batchers: int, attention: bool, s: Settings
) -> ModelCost:
    """A model's share of the memory bound: its graphs (serving, and attention when it serves
    /attention: a second copy of the weights), its batchers' largest batches, its /attention
    budget."""
    graphs = manifest.graphs[graph].total_bytes
    working = batchers * encode_batch_bytes(
        s.max_batch_tokens, manifest.max_length, manifest.d_model, manifest.num_heads
    )
    if attention:
        graphs += manifest.graphs["attention"].total_bytes
        working += attention_bytes(s.attention_budget_numbers)
    return ModelCost(name, graphs, working)


def costs_on_disk(
    specs: Sequence[ModelSpec], settings: Settings, streams: int = 1
) -> list[ModelCost] | None:
    """Each bundle's cost, from its manifest, before anything is loaded; None when a bundle
    has no readable manifest (its loader says why). streams: OpenVINO's, each one more batch
    at once, and past one the lone compile (engine/alone.py): a copy of the serving graph."""
    costs = []
    for spec in specs:
        try:
            manifest = read_manifest(spec.path / MANIFEST)
        except (BundleError, OSError):
            return None
        attention = settings.attention_enabled and "attention" in manifest.graphs
        batchers = 2 if manifest.task == "embed" else 1  # /embed_all's token output: its own
        graph = expected_graph(manifest, settings)
        batchers += streams - 1
        cost = model_cost(spec.name or manifest.name, manifest, graph, batchers, attention, settings)
        if streams > 1:
            lone = manifest.graphs[graph].total_bytes
            cost = ModelCost(cost.name, cost.graph_bytes + lone, cost.working_bytes)
        costs.append(cost)
    return costs


def stream_room(
    specs: Sequence[ModelSpec], settings: Settings, base: int, requests: int, limit: int
) -> bool:
    """Whether the models may each take a second OpenVINO stream within the memory limit
    (always without one; never when a bundle's manifest cannot be read)."""
    if not limit:
        return True
    wider = costs_on_disk(specs, settings, streams=2)
    if wider is None:
        return False
    try:
        check_fit(wider, base, requests, limit, "")
    except MemoryBoundError:
        return False
    return True


def streams_for_memory(specs: Sequence[ModelSpec], settings: Settings) -> Settings:
    """The settings with HEADWISE_OPENVINO_STREAMS decided where left to the machine (0): by
    the CPUs (engine/cpu.py, auto_streams), but one where a second stream would not fit the
    memory limit (said in the log). Before any backend loads (`headwise serve` loads them
    before the app's registry: decided once, there)."""
    if settings.openvino_streams:
        return settings
    streams = auto_streams(threads_for(settings.threads) or cores().usable, detect().flags)
    limit, source = memory_limit(settings.memory_limit_bytes)
    requests = LARGE_REQUESTS * request_bytes(settings.max_body_bytes)
    if streams > 1 and not stream_room(specs, settings, rss_bytes(), requests, limit):
        log.info(
            "OpenVINO, where it serves: one stream, not %d: a second (a batch more at once, a "
            "copy of the graph) would pass the memory limit of %s (%s)",
            streams,
            gib(limit),
            source,
        )
        streams = 1
    return settings.model_copy(update={"openvino_streams": streams})


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _outputs(model: Model, lead: str = " with outputs ") -> str:
    """", with outputs dense, sparse" for an embedding model; nothing for a scorer."""
    outs = model.served_outputs
    return f"{lead}{', '.join(outs)}" if outs else ""


class Registry:
    def __init__(
        self,
        models: list[Model],
        settings: Settings,
        metrics: Metrics,
        routes_of: RoutesOf | None = None,
    ) -> None:
        if not models:
            raise ValueError("no model to serve: give at least one bundle")
        self.models = {m.name: m for m in models}
        self.settings = settings
        self.metrics = metrics
        self.routes_of: RoutesOf = routes_of or (lambda capability: [capability])
        self.drain = Drain()
        self.ready = False
        self.load_error: str | None = None
        # HEADWISE_WORKERS: this worker says it came up (ready once), and whether every worker
        # on the port has; readiness probes answer ready only then (service/http/workers.py).
        self.came_up: Callable[[], None] = lambda: None
        self.peers_up: Callable[[], bool] = lambda: True
        self.warm_rss = 0  # resident bytes once loaded and warm: the memory bound's base
        self._ready_event = asyncio.Event()

    @classmethod
    def load(
        cls,
        specs: Sequence[ModelSpec],
        loader: Loader,
        settings: Settings,
        metrics: Metrics,
        routes_of: RoutesOf | None = None,
    ) -> Registry:
        # The models must fit the memory the server may use: checked from the manifests before
        # any graph is loaded (a model too large would be killed, not refused, while loading).
        limit, source = memory_limit(settings.memory_limit_bytes)
        base = rss_bytes()
        requests = LARGE_REQUESTS * request_bytes(settings.max_body_bytes)
        planned = costs_on_disk(specs, settings) if limit else None
        if planned is not None:
            check_fit(planned, base, requests, limit, source)
        settings = streams_for_memory(specs, settings)
        backends = load_backends(specs, loader, settings)
        names = unique_names(specs, [b.manifest.name for b in backends])
        # One admission for all serving batchers: the models share the cores (or the GPU).
        shared = Admission(settings.request_timeout_s, settings.admission_headroom)
        models = [
            build_model(n, b, settings, metrics, shared)
            for n, b in zip(names, backends, strict=True)
        ]
        registry = cls(models, settings, metrics, routes_of)
        if limit and planned is None:  # bundles without manifests on disk (a custom loader)
            check_fit(registry.costs(), base, requests, limit, source)
        return registry

    def __iter__(self) -> Iterator[Model]:
        return iter(self.models.values())

    def saturated(self) -> HeadwiseError | None:
        """The refusal a new request for the serving batchers would get whatever it holds (the
        models share one admission: engine/admission.py), or None."""
        return self.first.admission.saturated() if self.models else None

    @property
    def first(self) -> Model:
        return next(iter(self.models.values()))

    def routes(self, capability: Capability) -> str:
        return ", ".join(self.routes_of(capability))

    def routes_of_model(self, model: Model) -> str:
        return ", ".join(
            r for c in sorted(model.capabilities) if c != "tokenize" for r in self.routes_of(c)
        )

    def pick(self, name: str | None, capability: Capability) -> Model:
        """The model a request names, or the first that can answer the route.

        Clients hard-code names ("text-embedding-3-small"): when exactly one served model can
        answer, any name is accepted. With several candidates an unknown name is a 404 that
        lists them; a known name of the wrong task is a 400 naming what it serves.
        """
        if name is not None and name in self.models:
            model = self.models[name]
            if capability not in model.capabilities:
                raise WrongTask(
                    f"model {name!r} is {_article(model.task)} {model.task} model"
                    f"{_outputs(model)}: it serves {self.routes_of_model(model)}; "
                    f"{self.routes(capability)} needs {WANTED[capability]}",
                    param="model",
                )
            return model
        candidates = [m for m in self if capability in m.capabilities]
        if not candidates and capability in ("sparse", "multi_vector"):
            served = ", ".join(f"{m.name} ({m.task}{_outputs(m, ': ')})" for m in self)
            raise WrongTask(
                f"no served model has a {OUTPUT_CAPABILITIES[capability]} output, which "
                f"{self.routes(capability)} needs; served: {served}",
                param="model",
            )
        if not candidates:
            served = ", ".join(f"{m.name} ({m.task})" for m in self)
            raise ModelNotFound(
                f"no served model answers {self.routes(capability)}; served: {served}",
                param="model",
            )
        if name is None or len(candidates) == 1:
            return candidates[0]
        listed = ", ".join(m.name for m in candidates)
        raise ModelNotFound(
            f"model {name!r} is not served here; {self.routes(capability)} is served by: "
            f"{listed}",
            param="model",
        )

    def costs(self) -> list[ModelCost]:
        """Each served model's share of the memory bound, as loaded."""
        return [
            model_cost(
                m.name,
                m.backend.manifest,
                m.backend.info.graph,
                m.batches_at_once,
                m.attention is not None,
                self.settings,
            )
            for m in self
        ]

    def memory(self) -> dict[str, int]:
        """The documented peak for these settings and models (README: Memory), the models'
        graphs' bytes (in warm) and the limit it must fit (0: none known)."""
        s = self.settings
        extra = sum(
            outputs_bytes(m.backend.manifest, s, m.batches_at_once) for m in self
        )
        graphs = [
            (
                m.batches_at_once,
                m.backend.manifest.max_length,
                m.backend.manifest.d_model,
                m.backend.manifest.num_heads,
            )
            for m in self
        ]
        return memory_budget(
            self.warm_rss or rss_bytes(),
            graphs,
            s.max_batch_tokens,
            s.attention_budget_numbers,
            sum(m.attention is not None for m in self),
            s.max_body_bytes,
            LARGE_REQUESTS,
            outputs_bytes=extra,
            models_bytes=sum(c.graph_bytes for c in self.costs()),
        ) | {"limit_bytes": memory_limit(s.memory_limit_bytes)[0]}

    def activity(self) -> int:
        """Changes whenever a text is queued, a batch taken or a request answered (the heap
        trimmer's idle test)."""
        work = sum(b.batches + b.submitted for m in self for b in m.batchers)
        return work + self.metrics.finished

    @property
    def probed_ready(self) -> bool:
        """What readiness probes answer: this server ready, and every worker on its port up
        (one ready beside one still warming had the other's share of connections answered 503
        not ready while the port said ready)."""
        return self.ready and self.peers_up()

    def require_ready(self) -> None:
        if self.drain.draining:
            raise Unavailable("the server is shutting down: retry on another replica", retry_after=1)
        if not self.ready and not REHEARSING.get():
            raise Unavailable("models are loading", retry_after=2)

    async def wait_ready(self) -> None:
        await self._ready_event.wait()

    def start(self) -> None:
        for model in self:
            for batcher in model.batchers:
                batcher.start()

    async def warm(
        self, enabled: bool, rehearse: Callable[[Model], Awaitable[None]] | None = None
    ) -> None:
        """Run every graph once (off the loop), time it, let each model answer its rehearsal
        (`rehearse`: requests through the whole app), then say ready; a failure stays not
        ready."""
        loop = asyncio.get_running_loop()
        try:
            if enabled:
                for model in self:
                    await loop.run_in_executor(None, model.backend.warmup)
                    await self.calibrate(model)
                    await self.calibrate_tokenizer(model)
                    await self.spin_up(model)
                    if rehearse is not None and model.backend.measurable:  # not a test's fake
                        await rehearse(model)
                await self.probe_pace()
            self.warm_rss = rss_bytes()
            self.metrics.memory_bound.set(self.memory()["bound_bytes"])
            self.ready = True
            self.came_up()
            self.metrics.ready.set(1)
            log.info("ready: %s", ", ".join(self.models))
        except Exception as exc:
            self.load_error = str(exc)
            log.exception("warmup failed")
        finally:
            self._ready_event.set()

    async def probe_pace(self) -> None:
        """Every model's serving session computes full batches on all its streams at once, for
        PROBE_S: how fast the device works off predicted seconds when every model is busy (its
        pace, engine/cost.py: Device), measured before the first flood rather than learnt from
        it. A fresh server's first flood of 128-document requests on the default model and its
        cross-encoder (2 AMX cores) answered 22-23 of its 31-32 admitted requests in time at
        the predictions' rate (the rehearsal's small runs had measured 1.0); with the probe
        (0.80-0.81), 26 of 26 and 27 of 27. Not where a rate is stated or calibration is off."""
        s = self.settings
        if s.capacity_tokens_per_s is not None or s.calibration_s <= 0:
            return
        serving = [
            (pipeline.intake.batcher, model)
            for model in self
            if model.backend.measurable and (pipeline := model.embed or model.score) is not None
        ]
        serving = [(b, m) for b, m in serving if b.paces]  # all probe together: none waits alone
        if not serving:
            return
        devices = {id(b.device): b.device for b, _ in serving}.values()
        for device in devices:
            device.forget()
        gate = threading.Barrier(sum(b.concurrency for b, _ in serving))
        await asyncio.gather(*(b.probe(any_word(m), PROBE_S, gate) for b, m in serving))
        for device in devices:
            log.info("device pace under load: %.2f predicted seconds a second", device.pace)

    async def calibrate_tokenizer(self, model: Model) -> None:
        """What tokenising a character costs with the model's tokenizer, timed off the loop
        (admission prices a request's tokenising with it until served requests refine it)."""
        if not model.prepare_cost.learns or self.settings.calibration_s <= 0:
            return
        backend = model.backend
        loop = asyncio.get_running_loop()
        # The tokenizer's own vocabulary: a model's embedding table may be larger (padded, or a
        # checkpoint past 2 GiB made of unused rows), and ids past the tokenizer decode to "".
        tokenizer = getattr(backend, "tokenizer", None)
        size = backend.manifest.vocab_size
        if tokenizer is not None:
            size = min(size, tokenizer.get_vocab_size())
        texts = sample_texts(backend.decode, size)
        try:
            per_char_s = await loop.run_in_executor(
                None, calibrate_tokenizer, backend.tokenize, texts
            )
        except ValueError as exc:  # nothing to time: priced from its first requests instead
            log.warning("%s: tokenising not calibrated (%s)", model.name, exc)
            return
        model.prepare_cost.calibrated(per_char_s)
        log.info(
            "%s: tokenising costs %.3f µs of CPU a character (%.1f ms for 100 texts of 500)",
            model.name, per_char_s * 1e6, per_char_s * 5e4 * 1e3,
        )  # fmt: skip

    async def calibrate(self, model: Model) -> None:
        """Each of the model's sessions timed at a few shapes, its cost fitted (unless the
        operator states a rate, or the backend's runs are not the machine's: a test's fake)."""
        s = self.settings
        if not model.backend.measurable or s.capacity_tokens_per_s is not None:
            return
        if s.calibration_s <= 0:
            return
        token = any_word(model)
        for c in model.calibrations:
            await c.batcher.calibrate(c.longest, token, s.calibration_s, c.shortest)
            cost = c.batcher.cost
            f = cost.current
            assert f is not None
            log.info(
                "%s: calibrated in %.1f s up to %d tokens (longest measured %d): a batch costs "
                "%.2f ms + %.3f µs a token + %.3g µs a token per token of its length",
                c.batcher.name, cost.calibration_s, c.longest, cost.longest_measured,
                f.batch_s * 1e3, f.token_s * 1e6, f.pair_s * 1e6,
            )  # fmt: skip

    async def spin_up(self, model: Model) -> None:
        """Every thread of every batcher of the model runs its session before ready (those
        calibration ran on have), at the shortest shape its calibration runs: whether or not
        calibration runs, and for the batchers it does not time (token states, several
        outputs, the long lane's when a rate is stated); not a test's fake, whose runs are
        not the machine's."""
        if not model.backend.measurable:
            return
        token = any_word(model)
        short = {id(c.batcher): (1, c.shortest) for c in model.calibrations}
        default = (1, min(8, model.backend.manifest.max_length))
        for batcher in model.batchers:
            await batcher.spin_up(short.get(id(batcher), default), token)

    def begin_drain(self, grace_s: float) -> None:
        """Shutdown has begun: new requests are refused (503, `require_ready`), and every
        request already accepted must be answered within grace_s: each call's deadline is
        pulled in to the drain's, and one whose work cannot make it is answered 503 then."""
        self.drain.begin(grace_s)
        self.ready = False
        self.metrics.ready.set(0)

    async def stop(self) -> None:
        """Drain: everything accepted is answered before the threads go."""
        self.ready = False
        self.metrics.ready.set(0)
        for model in self:
            for batcher in model.batchers:
                await batcher.stop()
