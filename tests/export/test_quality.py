"""The int8 gate's measures: retrieval, similarity ranking, and the real-text pairs."""

from __future__ import annotations

import numpy as np
import pytest

from service.engine import quality


def unit(rows) -> np.ndarray:
    return np.asarray(rows, dtype=np.float32)


def test_pairs_are_real_fixed_and_split_without_overlap():
    gate, holdout = quality.docstring_pairs("gate"), quality.docstring_pairs("holdout")
    assert len(gate) > 500 and len(holdout) > 500
    assert not set(gate.queries) & set(holdout.queries)
    assert quality.docstring_pairs("gate", limit=50).queries == gate.queries[:50]
    assert quality.docstring_pairs("gate").fingerprint == gate.fingerprint
    assert all(len(d.split()) >= 10 for d in gate.documents)


def test_retrieval_counts_the_rank_of_each_querys_own_document():
    docs = unit([[1, 0], [0, 1], [1, 1]])
    # query 0 finds doc 0 first; query 1 finds doc 2 first and its own second; query 2 its own.
    queries = unit([[1, 0.1], [0.5, 1], [1, 1]])
    r1, r10, mrr = quality.retrieval(queries, docs)
    assert r1 == pytest.approx(200 / 3) and r10 == 100
    assert mrr == pytest.approx((1 + 0.5 + 1) / 3 * 100)


def test_spearman_is_one_for_the_same_order_and_minus_one_reversed():
    a = np.array([0.1, 0.5, 0.3, 0.9])
    assert quality.spearman(a, a * 2 + 1) == pytest.approx(1.0)
    assert quality.spearman(a, -a) == pytest.approx(-1.0)


def test_measure_and_gate_hold_recall_at_10_and_mrr_to_the_tolerance():
    rng = np.random.default_rng(0)
    q, d = rng.standard_normal((40, 16)), rng.standard_normal((40, 16))
    same = quality.measure((q, d), (q.copy(), d.copy()))
    assert same.max_drop == 0 and same.spearman == pytest.approx(1.0)
    assert same.min_cosine == pytest.approx(1.0) and quality.within(same, 0.5, 0.99)
    noisy = quality.measure((q, d), (q + rng.standard_normal(q.shape), d))
    assert noisy.max_drop > 0.5 and not quality.within(noisy, 0.5, 0.99)
    assert quality.within(noisy, 100, -1)


def test_embed_runs_length_sorted_batches_and_returns_rows_in_input_order(model_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    texts = ["a much longer text than the others, with many words", "short", "mid length"]
    shapes = []

    def run(feeds):
        shapes.append(feeds["input_ids"].shape)
        return feeds["attention_mask"].sum(axis=1, keepdims=True).astype(np.float32)

    out = quality.embed(run, tok, texts, ["input_ids", "attention_mask"], batch_size=2)
    assert [int(x) for x in out[:, 0]] == [len(tok.encode(t).ids) for t in texts]
    assert shapes[0][1] <= shapes[1][1]  # shortest first


def test_missing_stdlib_sources_fail_the_export_with_a_reason(monkeypatch):
    monkeypatch.setattr(quality, "_docstring_pairs", lambda stdlib: {})
    with pytest.raises(ValueError, match="--int8-pairs 0"):
        quality.docstring_pairs("gate")


def test_pairs_come_from_the_cache_folder_after_the_first_parse(tmp_path, monkeypatch):
    """Parsed once (what the statements-only walk finds is what ast.walk found, in its order),
    written to the user's cache folder, then read from it without parsing; a damaged or
    unwritable cache is parsed around."""
    import ast
    import sysconfig
    from pathlib import Path

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    some = stdlib / "json"  # a small part of the library, the same code path
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    parsed = quality._docstring_pairs.__wrapped__(some)
    cache = quality._cache_file(some)
    assert cache.is_relative_to(tmp_path) and cache.exists() and len(parsed) > 3

    walked = {}  # ast.walk's order: a repeated summary keeps the first body it met
    for path in sorted(some.rglob("*.py")):
        if quality.SKIPPED_DIRS & set(path.relative_to(some).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            doc = ast.get_docstring(node) if isinstance(node, kinds) else None
            if doc and "\n\n" in doc:
                head, body = (" ".join(p.split()) for p in doc.split("\n\n", 1))
                words, length = len(head.split()), len(body.split())
                if 3 <= words <= 40 and 10 <= length <= 150 and ">>>" not in body:
                    walked.setdefault(head, body)
    assert list(parsed.items()) == list(walked.items())

    def no_parse(*args, **kwargs):
        raise AssertionError("parsed again")

    monkeypatch.setattr(quality.ast, "parse", no_parse)
    assert quality._docstring_pairs.__wrapped__(some) == parsed  # read back, not parsed
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache.write_text("{not json", encoding="utf-8")
    assert quality._docstring_pairs.__wrapped__(some) == parsed  # parsed around, rewritten
    assert quality._docstring_pairs.__wrapped__(some) == parsed
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # a file where the folder would be
    assert quality._docstring_pairs.__wrapped__(some) == parsed
    monkeypatch.delenv("XDG_CACHE_HOME")

    def homeless() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(quality.Path, "home", staticmethod(homeless))  # no HOME, no passwd entry
    assert quality._docstring_pairs.__wrapped__(some) == parsed
