"""What users feel of a quantised graph: retrieval and similarity ranking against fp32.

Users judge embeddings by what they retrieve, not by their cosine to another graph: quantising
every MatMul of all-MiniLM-L6-v2 costs ~0.02 of min cosine to fp32 and nothing measurable of
recall. So the int8 graph is gated on retrieval (recall@1, recall@10 and MRR of query ->
document pairs of real text) and on the ranking of pair similarities (Spearman vs fp32); the
cosines are reported as information.

The pairs are real English from the documentation strings of CPython's own standard library,
read from source with `ast` (nothing imported, nothing downloaded): the summary line of a
module, class or function is the query, the paragraphs under it are its document, and every
other pair's document is a distractor (~2,000 pairs on CPython 3.11). A fixed hash of the query puts each pair in the "gate"
split (what export decides on) or the "holdout" split (what the benchmark reports), so the
benchmark's figures come from text the export never looked at.

No torch here: the benchmark imports this module as well.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import logging
import os
import sys
import sysconfig
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
from tokenizers import Tokenizer

from service.bundle import sha256_file
from service.engine.openvino_session import OpenVinoSession
from service.engine.sessions import build_session
from service.manifest import RetrievalQuality
from service.tensors import cosines, l2_normalize, pad_batch

log = logging.getLogger(__name__)

Split = Literal["gate", "holdout", "all"]
CORPUS = "CPython stdlib docstrings: summary line -> body"
GATE_SHARE = 2  # one pair in GATE_SHARE goes to the gate split, the rest are held out
SKIPPED_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo"}

# Default tolerance: int8 may lose at most this many points (of 100) of recall@10 and of MRR
# against fp32 on the same pairs, and its pair similarities must rank like fp32's (recall@1 is
# reported: on 1,000 pairs one query's top hit is 0.1 point of it).
MAX_DROP_POINTS = 0.5
MIN_SPEARMAN = 0.99


@dataclass(frozen=True)
class Pairs:
    queries: list[str]
    documents: list[str]

    def __len__(self) -> int:
        return len(self.queries)

    @property
    def fingerprint(self) -> str:
        text = "\n".join(q + "\t" + d for q, d in zip(self.queries, self.documents, strict=True))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# What can hold a statement (a def among them): statements' bodies, except and case clauses.
BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)
PAIRS_VERSION = 1  # of the extraction below: a cached file of another version is not read


def _statements(tree: ast.AST) -> Iterator[ast.AST]:
    """ast.walk's nodes in its order (breadth first), but only the module and the statements
    (and the clauses holding statements): expressions hold no def, and are most of a tree."""
    todo: deque[ast.AST] = deque([tree])
    while todo:
        node = todo.popleft()
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                todo.extend(v for v in value if isinstance(v, BLOCKS))
            elif isinstance(value, BLOCKS):
                todo.append(value)
        yield node


def _parsed_pairs(stdlib: Path) -> dict[str, str]:
    pairs: dict[str, str] = {}
    kinds = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    for path in sorted(stdlib.rglob("*.py")):
        if SKIPPED_DIRS & set(path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in _statements(tree):
            doc = ast.get_docstring(node) if isinstance(node, kinds) else None
            if not doc or "\n\n" not in doc:
                continue
            head, body = (" ".join(part.split()) for part in doc.split("\n\n", 1))
            if (
                3 <= len(head.split()) <= 40
                and 10 <= len(body.split()) <= 150
                and ">>>" not in body
            ):
                pairs.setdefault(head, body)  # a repeated summary keeps its first body
    return pairs


def _cache_file(stdlib: Path) -> Path | None:
    """Where this Python's pairs are kept between runs (the user's cache folder); None where
    there is none (no XDG_CACHE_HOME and no home folder: an arbitrary uid in a container)."""
    try:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except RuntimeError:
        return None
    key = hashlib.sha256(f"{PAIRS_VERSION}|{sys.version}|{stdlib}".encode()).hexdigest()[:16]
    return root / "headwise" / f"docstring-pairs-{key}.json"


@functools.cache
def _docstring_pairs(stdlib: Path) -> dict[str, str]:
    """The pairs of this standard library: parsing it took 2.5 s of every start that judges a
    precision (2 EPYC cores), so they are kept in the process and in the user's cache folder,
    keyed by the Python build and the extraction's version; a cache that cannot be read or
    written is parsed around."""
    cache = _cache_file(stdlib)
    if cache is not None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            return {str(q): str(d) for q, d in json.loads(cache.read_text(encoding="utf-8"))}
    pairs = _parsed_pairs(stdlib)
    if cache is None:
        return pairs
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(list(pairs.items())), encoding="utf-8")
        partial.replace(cache)  # whole or absent, whoever else writes it at once (workers)
    except OSError as exc:
        log.debug("docstring pairs not cached at %s: %s", cache, exc)
    return pairs


def docstring_pairs(split: Split = "gate", limit: int | None = None) -> Pairs:
    """Query -> document pairs of real text (see the module docstring), in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    items = sorted(
        _docstring_pairs(stdlib).items(),
        key=lambda qd: hashlib.sha256(qd[0].encode()).hexdigest(),
    )
    if split != "all":
        gate = split == "gate"
        items = [
            qd
            for qd in items
            if (int(hashlib.sha256(qd[0].encode()).hexdigest()[-4:], 16) % GATE_SHARE == 0) == gate
        ]
    items = items[:limit] if limit is not None else items
    if not items and limit != 0:
        raise ValueError(
            f"no query -> document pairs for the int8 gate: CPython's standard-library sources "
            f"are not at {stdlib} (an install without .py files?); --int8-pairs 0 exports "
            "without the retrieval gate"
        )
    return Pairs([q for q, _ in items], [d for _, d in items])


Run = Callable[[dict[str, np.ndarray]], np.ndarray]


def embed(
    run: Run, tokenizer: Tokenizer, texts: list[str], inputs: list[str], batch_size: int = 32
) -> np.ndarray:
    """Embeddings of `texts` by `run` (feeds -> (B, d)), on length-sorted padded batches."""
    encodings = tokenizer.encode_batch(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
    out: np.ndarray | None = None
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        ids, mask = pad_batch([encodings[i].ids for i in chunk])
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        got = run(feeds)
        if out is None:
            out = np.zeros((len(texts), got.shape[1]), np.float32)
        out[chunk] = got
    assert out is not None, "no texts"
    return out


def retrieval(queries: np.ndarray, documents: np.ndarray) -> tuple[float, float, float]:
    """(recall@1, recall@10, MRR) in points (0-100): query i's right answer is document i."""
    sims = l2_normalize(queries) @ l2_normalize(documents).T
    right = np.diag(sims)[:, None]
    rank = (sims > right).sum(axis=1)  # 0 = first; a tie does not count against the answer
    return (
        float((rank < 1).mean() * 100),
        float((rank < 10).mean() * 100),
        float((1.0 / (rank + 1)).mean() * 100),
    )


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation of two score lists (float scores: ties are negligible)."""
    ra = np.empty(a.size)
    rb = np.empty(b.size)
    ra[np.argsort(a, kind="stable")] = np.arange(a.size)
    rb[np.argsort(b, kind="stable")] = np.arange(b.size)
    return float(np.corrcoef(ra, rb)[0, 1])


def pair_similarities(queries: np.ndarray, documents: np.ndarray, others: int = 4) -> np.ndarray:
    """Cosine of each query with its document and with `others` fixed other documents: the
    scores a similarity search or a deduplication threshold reads."""
    q, d = l2_normalize(queries), l2_normalize(documents)
    n = len(q)
    cols = [np.arange(n)] + [(np.arange(n) + 1 + k) % n for k in range(others)]
    return np.concatenate([(q * d[c]).sum(axis=1) for c in cols])


def measure(
    fp32: tuple[np.ndarray, np.ndarray],
    candidate: tuple[np.ndarray, np.ndarray],
    corpus: str = CORPUS,
) -> RetrievalQuality:
    """`candidate` (query, document embeddings) against `fp32` on the same pairs."""
    want_r1, want_r10, want_mrr = retrieval(*fp32)
    r1, r10, mrr = retrieval(*candidate)
    cos = cosines(np.concatenate(candidate), np.concatenate(fp32))
    return RetrievalQuality(
        corpus=corpus,
        pairs=len(fp32[0]),
        recall_at_1=r1,
        recall_at_10=r10,
        mrr=mrr,
        fp32_recall_at_1=want_r1,
        fp32_recall_at_10=want_r10,
        fp32_mrr=want_mrr,
        spearman=spearman(pair_similarities(*candidate), pair_similarities(*fp32)),
        min_cosine=float(cos.min()),
        mean_cosine=float(cos.mean()),
    )


def summary(q: RetrievalQuality) -> str:
    """One line of the figures, int8 against fp32, for the export log."""
    return (
        f"recall@1 {q.recall_at_1:.1f} (fp32 {q.fp32_recall_at_1:.1f}), recall@10 "
        f"{q.recall_at_10:.1f} ({q.fp32_recall_at_10:.1f}), MRR {q.mrr:.1f} ({q.fp32_mrr:.1f}), "
        f"Spearman {q.spearman:.4f}, min cosine {q.min_cosine:.4f}, on {q.pairs} pairs"
    )


def within(q: RetrievalQuality, max_drop: float, min_spearman: float) -> bool:
    """Recall@10 and MRR lost at most `max_drop` points each, and similarities rank alike."""
    return q.max_drop <= max_drop and q.spearman >= min_spearman


class RetrievalGate:
    """Export's int8 gate: a candidate graph's retrieval and similarity ranking against the
    fp32 graph's on `pairs` (fp32 embedded once)."""

    def __init__(
        self, fp32_graph: Path, tok: Tokenizer, pairs: Pairs, max_drop: float, min_spearman: float
    ) -> None:
        self.tok, self.pairs = tok, pairs
        self.max_drop, self.min_spearman = max_drop, min_spearman
        self.fp32 = self.embed(fp32_graph)
        self._measured: dict[str, RetrievalQuality] = {}  # by file hash: the last graph is kept

    def embed(self, graph: Path, session: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """The pairs' queries and documents embedded by `graph` (OpenVINO's IR: an .xml), or by
        `session`, the caller's of that graph, where it has one."""
        s: Any = session
        if s is None:
            s = OpenVinoSession(graph) if graph.suffix == ".xml" else build_session(graph)
        inputs = [i.name for i in s.get_inputs()]
        primary = [s.get_outputs()[0].name]

        def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
            return cast(np.ndarray, s.run(primary, feeds)[0])

        return (
            embed(run, self.tok, self.pairs.queries, inputs),
            embed(run, self.tok, self.pairs.documents, inputs),
        )

    def measure(self, graph: Path, session: Any = None) -> RetrievalQuality:
        key = sha256_file(graph)
        if key not in self._measured:
            self._measured[key] = measure(self.fp32, self.embed(graph, session)).model_copy(
                update={
                    "max_drop_allowed": self.max_drop,
                    "min_spearman_allowed": self.min_spearman,
                }
            )
        return self._measured[key]

    def passes(self, graph: Path) -> bool:
        q = self.measure(graph)
        ok = within(q, self.max_drop, self.min_spearman)
        log.info("int8 gate %s: %s", "passed" if ok else "failed", summary(q))
        return ok


def judge(
    reference: Run, candidate: Run, tok: Tokenizer, inputs: list[str], pairs: Pairs
) -> RetrievalQuality:
    """`candidate`'s retrieval and similarity ranking against `reference`'s on `pairs`, both run
    here (a served precision judged against the fp32 graph on the machine that serves it), held
    to the default gate: at most MAX_DROP_POINTS of recall@10 and MRR, Spearman >= MIN_SPEARMAN."""

    def both(run: Run) -> tuple[np.ndarray, np.ndarray]:
        return embed(run, tok, pairs.queries, inputs), embed(run, tok, pairs.documents, inputs)

    return measure(both(reference), both(candidate)).model_copy(
        update={"max_drop_allowed": MAX_DROP_POINTS, "min_spearman_allowed": MIN_SPEARMAN}
    )
