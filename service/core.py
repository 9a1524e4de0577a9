"""The served models and their pipelines: one typed container, built in the lifespan.

Each bundle becomes a `Model`: its backend (ONNX Runtime sessions, tokenizer) and a pipeline
per task it serves, each pipeline with its own batcher and worker thread. `Core.pick` is the
one place that turns a request's model name (or none) into a model that can answer the route.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from service.batch_policy import BatchPolicy
from service.batcher import DynamicBatcher
from service.errors import ModelNotFound, Unavailable, WrongTask
from service.memory import LARGE_REQUESTS, memory_budget, rss_bytes
from service.metrics import Metrics
from service.pipelines.attention import AttentionPipeline
from service.pipelines.embed import EmbedPipeline
from service.pipelines.score import ScorePipeline
from service.runtime import Backend, DeviceUnavailable
from service.settings import Settings

log = logging.getLogger(__name__)

# What a route needs of a model. "tokenize" any model can do.
Capability = Literal["embed", "rerank", "classify", "attention", "tokenize"]
ROUTES: dict[Capability, str] = {
    "embed": "/encode, /v1/embeddings",
    "rerank": "/rerank, /v1/rerank, /v2/rerank",
    "classify": "/predict",
    "attention": "/attention",
    "tokenize": "/tokenize/details",
}
WANTED: dict[Capability, str] = {
    "embed": "an embedding model",
    "rerank": "a reranker",
    "classify": "a classifier",
    "attention": "a model with its attention graph (HEADWISE_ATTENTION_ENABLED)",
    "tokenize": "any model",
}


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
        max_batch_size=s.max_batch_size,
        max_wait_s=s.max_wait_ms / 1e3,
        max_padding_ratio=s.max_padding_ratio,
        max_queue=s.max_queue_texts,
        padding_slack=s.padding_slack_tokens,
        assumed_tokens_per_s=s.capacity_tokens_per_s,
        inline_max_tokens=s.inline_max_tokens if inline else 0,
    )


@dataclass
class Model:
    name: str
    backend: Backend
    created: int  # unix seconds, for OpenAI's model list
    embed: EmbedPipeline | None = None
    score: ScorePipeline | None = None  # rerank or classify
    attention: AttentionPipeline | None = None
    batchers: list[DynamicBatcher] = field(default_factory=list)

    @property
    def task(self) -> str:
        return self.backend.manifest.task

    @property
    def capabilities(self) -> set[Capability]:
        caps: set[Capability] = {"tokenize"}
        if self.embed is not None:
            caps.add("embed")
        if self.score is not None:
            caps.add("rerank" if self.task == "rerank" else "classify")
        if self.attention is not None:
            caps.add("attention")
        return caps

    @property
    def serving_batchers(self) -> list[DynamicBatcher]:
        """Those that run the serving graph (each may hold its largest batch at once)."""
        attention = self.attention.batcher if self.attention else None
        return [b for b in self.batchers if b is not attention]

    def routes(self) -> str:
        return ", ".join(ROUTES[c] for c in sorted(self.capabilities) if c != "tokenize")


def build_model(name: str, backend: Backend, settings: Settings, metrics: Metrics) -> Model:
    manifest = backend.manifest
    model = Model(name, backend, manifest.created or int(time.time()))

    def batcher(infer, path: str) -> DynamicBatcher:
        b = DynamicBatcher(
            infer,
            batch_policy(settings, backend.inline),
            metrics.observer(path, name),
            f"{path}-{name}",
            manifest.special_tokens.pad,
        )
        model.batchers.append(b)
        return b

    if manifest.task == "embed":
        tokens = None
        if backend.token_output:
            tokens = batcher(lambda batch: list(backend.run_tokens(batch)), "embed_all")
        encode = batcher(backend.run, "encode")
        model.embed = EmbedPipeline(name, backend, encode, settings, metrics, tokens)
    else:  # rerank, classify: the same batching, one sequence (a pair) each
        pairs = batcher(backend.run, manifest.task)
        model.score = ScorePipeline(name, backend, pairs, settings, metrics)
    if settings.attention_enabled and "attention" in manifest.graphs:
        model.attention = AttentionPipeline(name, backend, settings, metrics)
        model.batchers.append(model.attention.batcher)
    return model


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


class Core:
    def __init__(self, models: list[Model], settings: Settings, metrics: Metrics) -> None:
        if not models:
            raise ValueError("no model to serve: give at least one bundle")
        self.models = {m.name: m for m in models}
        self.settings = settings
        self.metrics = metrics
        self.ready = False
        self.load_error: str | None = None
        self.warm_rss = 0  # resident bytes once loaded and warm: the memory bound's base
        self._ready_event = asyncio.Event()

    @classmethod
    def load(
        cls, specs: Sequence[ModelSpec], loader: Loader, settings: Settings, metrics: Metrics
    ) -> Core:
        backends = load_backends(specs, loader, settings)
        names = unique_names(specs, [b.manifest.name for b in backends])
        return cls(
            [build_model(n, b, settings, metrics) for n, b in zip(names, backends, strict=True)],
            settings,
            metrics,
        )

    def __iter__(self):
        return iter(self.models.values())

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
                    f"model {name!r} is {'an' if model.task[0] in 'aeiou' else 'a'} {model.task} "
                    f"model: it serves {model.routes()}; "
                    f"{ROUTES[capability]} needs {WANTED[capability]}",
                    param="model",
                )
            return model
        candidates = [m for m in self if capability in m.capabilities]
        if not candidates:
            served = ", ".join(f"{m.name} ({m.task})" for m in self)
            raise ModelNotFound(
                f"no served model answers {ROUTES[capability]}; served: {served}", param="model"
            )
        if name is None or len(candidates) == 1:
            return candidates[0]
        listed = ", ".join(m.name for m in candidates)
        raise ModelNotFound(
            f"model {name!r} is not served here; {ROUTES[capability]} is served by: {listed}",
            param="model",
        )

    def memory(self) -> dict[str, int]:
        """The documented peak for these settings and models (README: Memory)."""
        s = self.settings
        graphs = [
            (
                len(m.serving_batchers),
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
        )

    def activity(self) -> int:
        """Changes whenever a text is queued, a batch taken or a request answered (the heap
        trimmer's idle test)."""
        work = sum(b.batches + b.submitted for m in self for b in m.batchers)
        return work + self.metrics.finished

    def require_ready(self) -> None:
        if not self.ready:
            raise Unavailable("models are loading", retry_after=2)

    async def wait_ready(self) -> None:
        await self._ready_event.wait()

    def start(self) -> None:
        for model in self:
            for batcher in model.batchers:
                batcher.start()

    async def warm(self, enabled: bool) -> None:
        """Run every graph once (off the loop), then say ready; a failure stays not ready."""
        loop = asyncio.get_running_loop()
        try:
            if enabled:
                for model in self:
                    await loop.run_in_executor(None, model.backend.warmup)
            self.warm_rss = rss_bytes()
            self.metrics.memory_bound.set(self.memory()["bound_bytes"])
            self.ready = True
            self.metrics.ready.set(1)
            log.info("ready: %s", ", ".join(self.models))
        except Exception as exc:
            self.load_error = str(exc)
            log.exception("warmup failed")
        finally:
            self._ready_event.set()

    async def stop(self) -> None:
        """Drain: everything accepted is answered before the threads go."""
        self.ready = False
        self.metrics.ready.set(0)
        for model in self:
            for batcher in model.batchers:
                await batcher.stop()
