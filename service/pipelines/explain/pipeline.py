"""Which parts of a text drove an embedding, a similarity or a score: occlusion, next to attention.

The text is run whole and once with each part (a token, or a word) left out, its mask entries 0,
on the served graph, through the model's own serving batcher with other traffic: one intake
call whose variants are queued a batch at a time (same length, no padding). Between batches a
pacer gives the cores back to other requests (`HEADWISE_EXPLAIN_CPU_SHARE`, only while others
queue work). The attention importance beside it is /attention's rollout of the whole text,
summed over each part's tokens, from the unfused graph under /attention's own bounds.

importance of a part:
  embedder, one text:   1 - cos(e(text), e(text without the part))
  embedder, two texts:  cos(a, b) - cos(a without the part, b)   (and so for b's parts)
  reranker, classifier: score(text) - score(text without the part); a reranker's score is its
                        relevance (sigmoid of the logit), a classifier's the target's probability

granularity "head" leaves out heads instead of parts, on /attention's graph (explain/heads.py).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable, Iterable

import numpy as np
from tokenizers import Encoding

from service.engine.batcher import DynamicBatcher
from service.engine.runtime import Backend
from service.errors import Overloaded, PayloadTooLarge, Unsupported
from service.pipelines.attention.limits import Pacer
from service.pipelines.attention.pipeline import AttentionPipeline
from service.pipelines.base import Intake, Prepared, Ran, check_texts
from service.pipelines.call import Call
from service.pipelines.embed import EmbedPipeline
from service.pipelines.explain import importance
from service.pipelines.explain.ablation import HeadAblation
from service.pipelines.explain.answer import Explained, Subject
from service.pipelines.explain.parts import Granularity, Part, occluded, parts_of, spearman
from service.pipelines.explain.question import FORMS, Form, Question, check_form, check_target
from service.pipelines.score import ScorePipeline
from service.settings import Settings


class Traffic:
    """The device's serving batchers as the explanations' pacer sees them: the work others
    queue there, explanations' own variants left out."""

    def __init__(self, batchers: Callable[[], Iterable[DynamicBatcher]]) -> None:
        self._batchers = batchers
        self.own = 0  # variants explanations queued

    def queued(self) -> int:
        return sum(b.submitted for b in self._batchers()) - self.own

    def waiting(self) -> bool:
        """Others' work is queued or running: a pacer asks between two pieces of ours."""
        return any(b.busy for b in self._batchers())


class ExplainPipeline:
    def __init__(
        self,
        name: str,
        backend: Backend,
        intake: Intake,
        settings: Settings,
        traffic: Traffic,
        embed: EmbedPipeline | None = None,
        score: ScorePipeline | None = None,
        attention: AttentionPipeline | None = None,
    ) -> None:
        self.name = name
        self.backend = backend
        self.intake = intake
        self.settings = settings
        self.manifest = backend.manifest
        self.embed = embed
        self.score = score
        self.attention = attention
        self.forms = FORMS[self.manifest.task]
        self.types = "token_type_ids" in self.manifest.inputs
        self.traffic = traffic
        self.pacer = Pacer(settings.explain_cpu_share, traffic)
        self.inflight = 0

    # --- what needs no tokenizer -----------------------------------------------------------

    def question(
        self,
        form: Form,
        texts: tuple[str, ...],
        granularity: Granularity,
        target: str | None,
        truncate: bool,
    ) -> Question:
        task = self.manifest.task
        check_form(self.name, task, form)
        check_texts(list(texts), self.settings, form)
        check_target(self.name, task, target, self.score.labels if self.score else [])
        if granularity == "head" and (why := self.heads_unavailable()) is not None:
            raise Unsupported(f"granularity head: {why}", param="granularity")
        return Question(form, texts, granularity, target, truncate)

    def heads_unavailable(self) -> str | None:
        """Why this model cannot leave heads out here (None: it can)."""
        if self.attention is None:
            if not self.settings.attention_enabled:
                return "it runs on the attention graph, switched off (HEADWISE_ATTENTION_ENABLED)"
            return f"model {self.name!r}'s bundle has no attention graph"
        if self.attention.gated is None:
            return (
                f"model {self.name!r}'s attention graph takes no head gates: its bundle predates "
                "them; export it again with this version"
            )
        return None

    # --- tokenise, bound, and the variants -------------------------------------------------

    async def tokenized(self, call: Call, q: Question) -> tuple[list[Encoding], str]:
        """The encodings (one per sequence) and the prompt before each text (an embedder's
        default, as /encode gives it)."""
        if q.form == "pair":
            pairs = [(q.texts[0], q.texts[1])]
            encodings, _ = await call.tokenize(self.backend.tokenize_pairs, pairs)
            return encodings, ""
        prompt = self.embed.prompt(None) if self.embed is not None else ""
        encodings, _ = await call.tokenize(self.backend.tokenize, [prompt + t for t in q.texts])
        return encodings, prompt

    def too_long(self, q: Question, encodings: list[Encoding]) -> None:
        limit = self.manifest.max_length
        for i, enc in enumerate(encodings):
            if enc.overflowing and not q.truncate:
                what = {"pair": "the pair", "input": "the input"}.get(
                    q.form, f"similarity text {i}"
                )
                raise PayloadTooLarge(
                    f"{what} has more than {limit} tokens, the model's limit "
                    "(send truncate: true to cut it)",
                    param="truncate",
                )

    def _subjects(self, q: Question, encodings: list[Encoding], prompt: str) -> list[Subject]:
        out = []
        g = q.granularity
        for i, enc in enumerate(encodings):
            types = enc.type_ids if self.types else None
            if q.form == "pair":
                parts = parts_of(enc, 0, q.texts[0], 0, g) + parts_of(enc, 1, q.texts[1], 1, g)
            else:
                parts = parts_of(enc, 0, prompt + q.texts[i], i, g, len(prompt))
            out.append(Subject(enc.ids, types, parts))
        return out

    def _bound(self, subjects: list[Subject]) -> None:
        """HEADWISE_EXPLAIN_MAX_WORK, and the deadline at the measured cost: 413."""
        shapes = [(len(s.ids), 1 + len(s.parts)) for s in subjects]
        advice = "send a shorter text, or granularity: word"
        self.bound(shapes, self.intake.batcher, self._per_piece, advice, " (one pass per word)")

    def bound(
        self,
        shapes: list[tuple[int, int]],
        batcher: DynamicBatcher,
        per_piece: Callable[[int], int],
        advice: str,
        why: str = "",
    ) -> None:
        """413 for passes of n-token sequences, (n, passes) each, queued `per_piece(n)` at a time
        on `batcher`: past HEADWISE_EXPLAIN_MAX_WORK, or past the deadline at its measured cost.
        advice: what to send instead; why: what the work limit's advice adds."""
        work = sum(n * passes for n, passes in shapes)
        limit = self.settings.explain_max_work
        shape = " + ".join(f"{n} tokens x {passes} passes" for n, passes in shapes)
        if work > limit:
            raise PayloadTooLarge(
                f"this explanation computes {shape} = {work} tokens x passes; the limit is "
                f"{limit} (HEADWISE_EXPLAIN_MAX_WORK): {advice}{why}",
                param="granularity",
            )
        seconds = 0.0
        for n, passes in shapes:  # in the pieces they are queued in
            per = per_piece(n)
            full, rest = divmod(passes, per)
            seconds += full * batcher.batch_s(per, n) + (batcher.batch_s(rest, n) if rest else 0.0)
        budget = self.settings.request_timeout_s * self.settings.admission_headroom
        if seconds > budget:
            raise PayloadTooLarge(
                f"this explanation computes {work} tokens x passes: about {seconds:.1f} s on "
                f"this server (its cost per batch {batcher.cost.source}), past "
                f"{100 * self.settings.admission_headroom:.0f} % of the request deadline of "
                f"{self.settings.request_timeout_s:g} s (HEADWISE_REQUEST_TIMEOUT_S, "
                f"HEADWISE_ADMISSION_HEADROOM): {advice}",
                param="granularity",
            )

    def _per_piece(self, n: int) -> int:
        """Variants of an n-token text queued at once (one batch, no padding)."""
        policy = self.intake.batcher.policy
        return max(1, min(policy.max_batch_size, self.settings.explain_batch_tokens // n))

    def _variants(self, subjects: list[Subject]) -> Prepared:
        """Every subject whole, then with each part left out; queued a batch at a time."""
        sequences, types, masks, pieces = [], [], [], []
        for s in subjects:
            n = len(s.ids)
            own = occluded(n, s.parts)
            sequences += [s.ids] * len(own)
            types += [s.types or []] * len(own)
            masks += own
            per = self._per_piece(n)
            pieces += [min(per, len(own) - k) for k in range(0, len(own), per)]
        return Prepared(sequences, types if self.types else None, masks=masks, pieces=pieces)

    async def _prepare(self, call: Call, q: Question) -> Prepared:
        encodings, prompt = await self.tokenized(call, q)
        self.too_long(q, encodings)
        subjects = self._subjects(q, encodings, prompt)
        self._bound(subjects)
        prepared = self._variants(subjects)
        prepared.truncated = sum(bool(e.overflowing) for e in encodings)
        prepared.extra = subjects
        return prepared

    @contextlib.asynccontextmanager
    async def turn(self, piece: Prepared) -> AsyncIterator[None]:
        """A piece's turn: after the last one's pause, if others queued work meanwhile."""
        async with self.pacer.turn():
            self.traffic.own += len(piece.sequences)
            yield

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        limit = self.settings.explain_queue
        if self.inflight >= limit:
            raise Overloaded(
                f"{self.inflight} explanations are in flight, the limit "
                "(HEADWISE_EXPLAIN_QUEUE): retry later",
                retry_after=max(1.0, self.pacer.wait_s),
            )
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1

    # --- the answer ------------------------------------------------------------------------

    async def explain(self, call: Call, q: Question) -> Explained:
        if q.granularity == "head":
            return await HeadAblation(self).explain(call, q)
        async with self.admitted():
            ran: Ran[np.ndarray] = await self.intake.run(
                call, lambda: self._prepare(call, q), hold=self.turn
            )
            subjects: list[Subject] = ran.prepared.extra
            values, score, target = self._importance(q, subjects, np.stack(ran.rows))
            attention, note = await self._attention(call, q, subjects)
        parts: list[list[Part]] = [[] for _ in q.texts]
        per_text: list[list[float]] = [[] for _ in q.texts]
        for s, v in zip(subjects, values, strict=True):
            for p, x in zip(s.parts, v, strict=True):
                parts[p.text].append(p)
                per_text[p.text].append(float(x))
        return Explained(
            texts=q.texts,
            parts=parts,
            importance=per_text,
            attention=attention,
            spearman=[spearman(i, a) for i, a in zip(per_text, attention, strict=True)],
            score=score,
            target=target,
            truncated=bool(ran.prepared.truncated),
            attention_note=note,
            timings=ran.timings,
        )

    def _importance(
        self, q: Question, subjects: list[Subject], rows: np.ndarray
    ) -> tuple[list[np.ndarray], float | None, str | None]:
        """Per subject, each part's importance; the unperturbed score; the target label."""
        blocks, start = [], 0
        for s in subjects:  # each subject's rows: whole first, then a part left out each
            blocks.append(rows[start : start + 1 + len(s.parts)].astype(np.float64))
            start += 1 + len(s.parts)
        if self.manifest.task == "embed":
            if q.form == "input":
                return [importance.of_embedding(blocks[0])], None, None
            whole, a, b = importance.of_similarity(*blocks)
            return [a, b], whole, None
        (block,) = blocks
        return self.scored(q, block)

    def scored(
        self, q: Question, block: np.ndarray
    ) -> tuple[list[np.ndarray], float | None, str | None]:
        """A scorer's rows (whole, then each variant): the score lost per variant, the whole
        score, and the target label (a classifier's)."""
        assert self.score is not None
        target = None
        if self.manifest.task == "rerank":
            scores = self.score.relevance(block)
        else:
            probabilities = self.score.probabilities(block)
            labels = self.score.labels
            target = q.target or labels[int(np.argmax(probabilities[0]))]
            scores = probabilities[:, labels.index(target)]
        whole, lost = importance.of_score(scores)
        return [lost], whole, target

    async def _attention(
        self, call: Call, q: Question, subjects: list[Subject]
    ) -> tuple[list[list[float] | None], str | None]:
        """Per text, each part's attention rollout (its tokens' sum); None, and why, when
        there is none to compare with."""
        none: list[list[float] | None] = [None for _ in q.texts]
        pipe = self.attention
        if pipe is None:
            why = (
                "attention maps are switched off (HEADWISE_ATTENTION_ENABLED)"
                if not self.settings.attention_enabled
                else f"model {self.name!r}'s bundle has no attention graph"
            )
            return none, why
        for s in subjects:
            if (reason := pipe.unavailable(len(s.ids))) is not None:
                return none, reason
        out: list[list[float]] = [[] for _ in q.texts]
        for s in subjects:
            rollout = await pipe.rollout(call, s.ids, s.types)
            for p in s.parts:
                value = float(rollout[list(p.positions)].sum())
                out[p.text].append(value if math.isfinite(value) else 0.0)
        return list(out), None
