"""What an explanation runs and returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.pipelines.call import Timings
from service.pipelines.explain.heads import HeadsExplained
from service.pipelines.explain.parts import Part


@dataclass
class Subject:
    """One sequence the graph runs, whole and with each of its parts left out."""

    ids: list[int]
    types: list[int] | None
    parts: list[Part]


@dataclass
class Explained:
    texts: tuple[str, ...]
    parts: list[list[Part]]  # per text
    importance: list[list[float]]  # per text, per part
    attention: list[list[float] | None]  # per text, per part (None: no attention to compare)
    spearman: list[float | None]
    score: float | None  # the unperturbed score (none for an embedder's one text)
    target: str | None  # the label a classifier's score is the probability of
    truncated: bool
    attention_note: str | None  # why attention is missing, when it is
    timings: Timings = field(default_factory=Timings)
    heads: HeadsExplained | None = None  # granularity "head": per head, instead of parts
