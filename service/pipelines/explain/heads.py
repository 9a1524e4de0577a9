"""/explain's head granularity: which heads an answer needs, by ablation (Michel, Levy & Neubig
2019, one head at a time).

The request's sequence (one text, a pair, or both texts of a similarity) is run on /attention's
graph whole, then once with each head's output gated to 0 (its `head_gates` input: layer l's
head i left out of every text of the request at once). The importance of head (l, i):
  embedder, one text:   1 - cos(e(text), e'(text))            e': the model without the head
  embedder, two texts:  cos(a, b) - cos(a', b')
  reranker, classifier: score - score'  (relevance, or the target label's probability)
Beside it, each head's attention statistics over the whole text (/attention's; a similarity's
two texts averaged) and the Spearman correlation of importance with each statistic over all
heads: whether what a head looks at tells how much it matters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.pipelines.explain.parts import spearman
from service.tensors import cosines


def gates(n_layers: int, n_heads: int) -> list[np.ndarray | None]:
    """None (the whole model), then per head, layer by layer, (L, h) ones with its gate 0."""
    out: list[np.ndarray | None] = [None]
    for layer in range(n_layers):
        for head in range(n_heads):
            g = np.ones((n_layers, n_heads), dtype=np.float32)
            g[layer, head] = 0.0
            out.append(g)
    return out


def of_similarity(a: np.ndarray, b: np.ndarray) -> tuple[float, np.ndarray]:
    """a, b: each text's rows, whole then without each head -> cos(a, b) and the cosine lost."""
    whole = float(cosines(a[:1], b[:1])[0])
    return whole, whole - cosines(a[1:], b[1:])


@dataclass
class HeadsExplained:
    importance: np.ndarray  # (L, h)
    stats: dict[str, np.ndarray]  # each (L, h): /attention's statistics of the whole text
    spearman: dict[str, float | None]  # per statistic: its rank correlation with importance

    @classmethod
    def of(cls, importance: np.ndarray, stats: dict[str, np.ndarray]) -> HeadsExplained:
        flat = importance.ravel().tolist()
        return cls(
            importance,
            stats,
            {name: spearman(flat, values.ravel().tolist()) for name, values in stats.items()},
        )


def mean_stats(per_text: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each statistic averaged over the texts (one, or a similarity's two)."""
    return {k: np.mean([s[k] for s in per_text], axis=0) for k in per_text[0]}
