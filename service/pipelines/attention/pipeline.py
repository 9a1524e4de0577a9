"""One text in, what every head looks at out: maps, head statistics, token importance.

It has its own small queue and thread, so that debugging never starves /encode, and everything
heavy after inference (slicing, statistics, serialisation: tens to hundreds of ms for a long
text) runs on a worker thread, never on the event loop.

The same graph, exported with head gates (GraphEntry.gated_parity), also runs a text with heads
left out (`gated`, /explain's head importance): its primary output alone, many rows a batch, on
a batcher of its own held to the same budget and CPU share.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
from tokenizers import Encoding

from service.engine.admission import Admission
from service.engine.batch_policy import BatchPolicy
from service.engine.batcher import DynamicBatcher
from service.engine.cost import CostModel
from service.engine.runtime import Backend
from service.errors import InvalidInput, PayloadTooLarge
from service.metrics import Metrics
from service.pipelines.attention import analysis
from service.pipelines.attention.encoding import MapEncoding, encode_maps, with_maps
from service.pipelines.attention.heatmap import encode_png, grid_image
from service.pipelines.attention.images import ImageAttention
from service.pipelines.attention.limits import Budget, Pacer, one_call_at_a_time
from service.pipelines.base import Intake, Prepared, Ran
from service.pipelines.call import Call, Timings
from service.settings import Settings
from service.tensors import Batch, l2_normalize


@dataclass
class Rendered:
    body: list[bytes]  # pieces of at most about a MB, to be sent one after another
    media_type: str
    timings: Timings


def select(name: str, chosen: list[int] | None, count: int) -> list[int]:
    if chosen is None:
        return list(range(count))
    if not chosen:
        raise InvalidInput(f"{name} must not be empty (null selects all)", param=name)
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise InvalidInput(f"{name} {bad} out of range: valid are 0..{count - 1}", param=name)
    return list(dict.fromkeys(chosen))


def _index_of(ids: list[int], token_id: int | None, last: bool = False) -> int | None:
    if token_id is None or token_id not in ids:
        return None
    return len(ids) - 1 - ids[::-1].index(token_id) if last else ids.index(token_id)


@dataclass(frozen=True)
class Query:
    text: str
    layers: list[int]
    heads: list[int]
    truncate: bool
    format: Literal["json", "png"]
    pair: str | None = None
    encoding: MapEncoding = "float"


class AttentionPipeline:
    def __init__(
        self,
        name: str,
        backend: Backend,
        settings: Settings,
        metrics: Metrics,
        admission: Admission,
        cost: CostModel | None = None,
    ) -> None:
        """cost: its graph's (timed at warm-up); admission: its own, on the serving device."""
        self.name = name
        self.admission = admission
        # An image-text model's vision tower's maps (service/pipelines/attention/images.py),
        # under this budget and pacer: set by the registry once the images pipeline exists.
        self.images: ImageAttention | None = None
        self.backend = backend
        self.settings = settings
        self.manifest = backend.manifest
        gauge = metrics.attention_inflight.labels(name)
        gauge.set(0)
        self.budget = Budget(settings.attention_budget_numbers, gauge.set)
        self.pacer = Pacer(settings.attention_cpu_share)
        policy = one_call_at_a_time(settings.attention_max_tokens, settings.attention_queue)
        self.batcher = DynamicBatcher(
            self._infer,
            policy,
            metrics.observer("attention", name),
            f"attention-{name}",
            self.manifest.special_tokens.pad,
            cost=cost,
            device=admission.device,
        )
        admission.batchers.append(self.batcher)
        self.intake = Intake(self.batcher, admission, metrics, "attention", name)
        self.gated: Intake | None = None
        if self.manifest.graphs["attention"].gated_parity is not None:
            gated = DynamicBatcher(
                backend.gated,
                BatchPolicy(
                    max_batch_tokens=settings.explain_batch_tokens,
                    max_wait_s=0.0,
                    max_padding_ratio=1.0,
                    # Each explanation queues one piece at a time, a batch at most.
                    max_queue=settings.explain_queue * BatchPolicy.max_batch_size,
                ),
                metrics.observer("heads", name),
                f"heads-{name}",
                self.manifest.special_tokens.pad,
                cost=cost,
                device=admission.device,
            )
            admission.batchers.append(gated)
            self.gated = Intake(gated, admission, metrics, "heads", name)

    @property
    def batchers(self) -> list[DynamicBatcher]:
        """Its graphs': the maps', the gated runs' when the graph takes gates, the images'."""
        gated = [self.gated.batcher] if self.gated is not None else []
        return [self.batcher, *gated, *([self.images.batcher] if self.images else [])]

    @property
    def heads(self) -> int:
        """Layers x heads: the gates of one run."""
        return self.manifest.num_layers * self.manifest.num_heads

    def gated_rows(self, n: int) -> int:
        """Rows of n tokens run with gates at once: the explanation's batch tokens, the gated
        batcher's size, and the budget (each row computes every layer's maps inside)."""
        assert self.gated is not None
        per_row = self.heads * n * n
        policy = self.gated.batcher.policy
        fits = min(self.settings.explain_batch_tokens // n, self.budget.limit // per_row)
        return max(1, min(policy.max_batch_size, fits))

    def _infer(self, batch: Batch) -> list[tuple[np.ndarray, np.ndarray]]:
        primary, attn = self.backend.attend(batch)  # (B, d), (L, B, h, N, N)
        return [(primary[i], attn[:, i]) for i in range(len(batch))]

    def query(
        self,
        text: str,
        layers: list[int] | None,
        heads: list[int] | None,
        truncate: bool,
        format: Literal["json", "png"],
        pair: str | None = None,
        encoding: MapEncoding = "float",
    ) -> Query:
        """Validate what needs no tokenizer."""
        for name, t in (("input", text), ("pair", pair or "")):
            if len(t) > self.settings.max_input_chars:
                raise PayloadTooLarge(
                    f"{name} has {len(t)} characters; the limit is {self.settings.max_input_chars}"
                )
        return Query(
            text,
            select("layers", layers, self.manifest.num_layers),
            select("heads", heads, self.manifest.num_heads),
            truncate,
            format,
            pair,
            encoding,
        )

    async def _prepare(self, call: Call, q: Query) -> Prepared:
        """The text (or pair) as token ids, within /attention's own bounds."""
        s = self.settings
        limit = self.limit()
        if q.pair is None:
            (enc,), _ = await call.tokenize(self.backend.tokenize, [q.text])
        else:
            (enc,), _ = await call.tokenize(self.backend.tokenize_pairs, [(q.text, q.pair)])
            if len(enc.ids) > limit:  # cutting a pair's end would lose its structure
                raise PayloadTooLarge(
                    f"the pair has {len(enc.ids)} tokens; /attention's limit is {limit}: "
                    "shorten the texts",
                    param="pair",
                )
        ids = enc.ids
        truncated = bool(enc.overflowing) or len(ids) > limit
        if truncated and not q.truncate:
            raise PayloadTooLarge(
                f"input has more than {limit} tokens, the limit for /attention "
                "(send truncate: true to look at the first ones)",
                param="truncate",
            )
        if len(ids) > limit:  # keep the closing special token so the maps look like the input
            ids = ids[: limit - 1] + ids[-1:]
        n = len(ids)
        numbers = len(q.layers) * len(q.heads) * n * n
        if numbers > s.attention_max_numbers:
            raise PayloadTooLarge(
                f"{len(q.layers)} layers x {len(q.heads)} heads x {n}² tokens = {numbers} numbers; "
                f"the limit is {s.attention_max_numbers}: select fewer layers or heads, or a "
                "shorter input"
            )
        types = [enc.type_ids] if "token_type_ids" in self.manifest.inputs else None
        return Prepared([ids], types, truncated=int(truncated), extra=enc)

    @contextlib.asynccontextmanager
    async def _hold(self, prepared: Prepared) -> AsyncIterator[None]:
        """What the graph computes for this text, whatever is selected (all layers and heads),
        held against the shared budget; then the call's turn (the CPU share)."""
        computed = sum(self.heads * len(s) ** 2 for s in prepared.sequences)
        async with (
            self.budget.hold(computed, retry_after=self.pacer.wait_s + 1),
            self.pacer.turn(),
        ):
            yield

    async def run(self, call: Call, q: Query) -> Rendered:
        async def render(ran: Ran[tuple[np.ndarray, np.ndarray]]) -> Rendered:
            ((primary, maps),) = ran.rows
            prepared = ran.prepared
            body, media_type = await call.offload(
                self._render,
                q,
                prepared.extra,
                prepared.sequences[0],
                bool(prepared.truncated),
                primary,
                maps,
            )
            return Rendered(body, media_type, ran.timings)

        result: Rendered = await self.intake.run(
            call, lambda: self._prepare(call, q), hold=self._hold, then=render
        )
        return result

    def limit(self) -> int:
        """Tokens an input may have here."""
        return min(self.settings.attention_max_tokens, self.manifest.max_length)

    def unavailable(self, n: int) -> str | None:
        """Why an already tokenised input of n tokens cannot be looked at here (None: it can)."""
        computed = self.heads * n * n
        if n > self.limit():
            return (
                f"{n} tokens: more than the {self.limit()} /attention looks at "
                "(HEADWISE_ATTENTION_MAX_TOKENS)"
            )
        if computed > self.budget.limit:
            return (
                f"{computed} attention numbers: more than all /attention calls may hold "
                "(HEADWISE_ATTENTION_BUDGET_NUMBERS)"
            )
        return None

    async def stats(
        self, call: Call, ids: list[int], types: list[int] | None
    ) -> dict[str, np.ndarray]:
        """Every head's statistics over an already tokenised input, as /attention gives them,
        under /attention's own budget and CPU share -> each (L, h)."""
        prepared = Prepared([ids], [types] if types is not None else None)

        async def ready() -> Prepared:
            return prepared

        async def statistics(ran: Ran[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
            ((_, maps),) = ran.rows
            n, special = len(ids), self.manifest.special_tokens
            cls_index = _index_of(ids, special.cls)
            sep_index = _index_of(ids, special.sep, last=True)
            out: dict[str, np.ndarray] = await call.offload(
                analysis.head_stats, maps[:, :, :n, :n], cls_index, sep_index
            )
            return out

        result: dict[str, np.ndarray] = await self.intake.run(
            call, ready, hold=self._hold, then=statistics
        )
        return result

    async def rollout(self, call: Call, ids: list[int], types: list[int] | None) -> np.ndarray:
        """Attention rollout over an already tokenised input, as /attention's importance
        computes it (anchored on [CLS]), under /attention's own budget and CPU share -> (n,)."""
        prepared = Prepared([ids], [types] if types is not None else None)

        async def ready() -> Prepared:
            return prepared

        async def importance(ran: Ran[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
            ((_, maps),) = ran.rows
            anchor = _index_of(ids, self.manifest.special_tokens.cls)
            n = len(ids)
            out: np.ndarray = await call.offload(
                analysis.rollout, maps[:, :, :n, :n], anchor if anchor is not None else 0
            )
            return out

        result: np.ndarray = await self.intake.run(call, ready, hold=self._hold, then=importance)
        return result

    def _render(
        self,
        q: Query,
        enc: Encoding,
        ids: list[int],
        truncated: bool,
        primary: np.ndarray,
        maps: np.ndarray,
    ) -> tuple[list[bytes], str]:
        n = len(ids)
        maps = maps[:, :, :n, :n]  # (L, h, n, n): drop padding rows/cols of a shared batch
        selected = maps[np.ix_(q.layers, q.heads)]
        if q.format == "png":
            return [encode_png(grid_image(selected))], "image/png"
        special = self.manifest.special_tokens
        cls_index = _index_of(ids, special.cls)
        sep_index = _index_of(ids, special.sep, last=True)
        stats = analysis.head_stats(selected, cls_index, sep_index)
        stats_rows = [
            {"layer": layer, "head": head, **{k: float(v[li, hi]) for k, v in stats.items()}}
            for li, layer in enumerate(q.layers)
            for hi, head in enumerate(q.heads)
        ]
        anchor = cls_index if cls_index is not None else 0
        kept = n - 1 if n < len(enc.ids) else n  # truncated: the last one is the closing token
        tail = slice(-1, None) if kept < n else slice(0, 0)
        payload = {
            "model": self.name,
            "tokens": enc.tokens[:kept] + enc.tokens[tail],
            "token_ids": ids,
            "offsets": [list(o) for o in enc.offsets[:kept] + enc.offsets[tail]],
            "truncated": truncated,
            "layers": q.layers,
            "heads": q.heads,
            "stats": stats_rows,
            "importance": {
                "cls_last_layer": analysis.cls_importance(maps, anchor),
                "rollout": analysis.rollout(maps, anchor),
            },
        }
        if q.pair is not None:
            sequence_ids = enc.sequence_ids
            payload["sequence_ids"] = sequence_ids
            payload["boundary"] = sequence_ids.index(1) if 1 in sequence_ids else n
        if self.manifest.task == "embed" and "dense" in self.manifest.outputs:
            payload["embedding"] = l2_normalize(primary[None, :].astype(np.float32))[0]
        return with_maps(
            payload, "attentions", encode_maps(selected, q.encoding)
        ), "application/json"
