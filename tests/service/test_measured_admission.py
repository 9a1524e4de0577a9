"""Admission that knows its machine, as users meet it: on a fresh server, a request whose
alone-time is T (measured here, by the client) is answered with a deadline of 1.5 T and refused
at once, before any batch runs, with a deadline of 0.5 T; for the default model, a ModernBERT
(its inputs in the long lane), a Qwen3-shaped decoder, a cross-encoder reranker and bge-m3.

The random-weight checkpoints are wider and longer than the other tests' (d_model 128, 4
layers, hundreds of tokens), so that a request's time is its batches' (compute), not the HTTP
and tokenising around them, as with real models.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings
from tests.service.conftest import client_for

pytestmark = pytest.mark.slow

WIDE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
}
WORDS = ["the", "cat", "sat", "on", "a", "warm", "mat", "while", "rain", "fell", "over", "quiet", "city", "streets", "tonight"]


def words(n: int, offset: int = 0, vocab: list[str] = WORDS) -> str:
    return " ".join(vocab[(offset + i) % len(vocab)] for i in range(n))


@dataclass
class Case:
    bundle: Path
    path: str
    body: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)


def _default(default_bundle: Path, **_: Any) -> Case:
    texts = [words(300, i) for i in range(40)]  # cut at 256 tokens
    return Case(default_bundle, "/encode", {"inputs": texts})


def _modernbert(tmp: Path, **_: Any) -> Case:
    from tests.export.test_new_families import FAMILIES, export, write_tokenizer
    from tests.models.checkpoints import save_checkpoint

    family = FAMILIES["modernbert"]
    config = family.config | WIDE | {"max_position_embeddings": 512, "local_attention": 64}
    save_checkpoint(tmp / "ckpt", family.model_class, family.config_class, **config)
    write_tokenizer(tmp / "ckpt")
    export(tmp / "ckpt", tmp / "bundle")
    vocab = [f"w{i}" for i in range(4, 100)]
    texts = [words(500, i, vocab) for i in range(24)]
    # Inputs past 128 tokens run in the long lane: one at a time, its own session, calibrated.
    return Case(tmp / "bundle", "/encode", {"inputs": texts}, {"long_tokens": 128})


def _qwen3(tmp: Path, **_: Any) -> Case:
    from tests.export.decoders import save_embedder
    from tests.export.test_architectures import export

    sizes = WIDE | {"num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512}
    save_embedder(tmp / "ckpt", max_length=384, **sizes)
    export(tmp / "ckpt", tmp / "bundle")
    return Case(tmp / "bundle", "/encode", {"inputs": [words(400, i) for i in range(40)]})


def _reranker(tmp: Path, family_tokenizers: dict[str, Path], **_: Any) -> Case:
    from tests.export.test_architectures import export, save_checkpoint

    save_checkpoint(
        tmp / "ckpt", "bert", family_tokenizers["wordpiece"], "ForSequenceClassification",
        num_labels=1, max_position_embeddings=512, **WIDE,
    )  # fmt: skip
    export(tmp / "ckpt", tmp / "bundle")
    documents = [words(400, i) for i in range(120)]
    return Case(tmp / "bundle", "/rerank", {"query": "the cat", "texts": documents})


def _m3(tmp: Path, family_tokenizers: dict[str, Path], **_: Any) -> Case:
    from tests.export.output_checkpoints import m3_checkpoint
    from tests.export.test_architectures import export

    m3_checkpoint(tmp / "ckpt", family_tokenizers["unigram"], max_position_embeddings=514, **WIDE)
    export(tmp / "ckpt", tmp / "bundle")
    body = {
        "inputs": [words(600, i) for i in range(40)],
        "outputs": ["dense", "sparse", "multi_vector"],
    }
    return Case(tmp / "bundle", "/encode", body)


CASES: dict[str, Callable[..., Case]] = {
    "default": _default,
    "modernbert": _modernbert,
    "qwen3": _qwen3,
    "reranker": _reranker,
    "bge-m3": _m3,
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory, family_tokenizers) -> Case:
    tmp = tmp_path_factory.mktemp(request.param)
    make = CASES[request.param]
    if request.param == "default":
        return make(request.getfixturevalue("default_bundle"))
    return make(tmp, family_tokenizers=family_tokenizers)


def fresh(case: Case, timeout_s: float):
    """A new server (calibrated at its start) with this deadline; attention off: one fewer
    session to time."""
    return client_for(
        case.bundle,
        request_timeout_s=timeout_s,
        attention_enabled=False,
        calibration_s=Settings.model_fields["calibration_s"].default,  # as users start it
        **case.settings,
    )


def batches_run(client) -> int:
    return sum(b.batches for m in client.app.state.registry for b in m.batchers)


# A fresh server's costs are what its warm-up measured. On a shared VM a start whose calibration
# falls in a burst of the neighbours' load predicts a quarter or more high (CI saw 0.7 s
# predicted for a request answered in 0.56 s); a start that measured in a quiet moment predicts
# low. Each claim is held on up to STARTS fresh starts, and every start's answer is reported.
STARTS = 3


def _answered(case: Case, alone: float) -> tuple[bool, list[str]]:
    seen = []
    for _ in range(STARTS):
        with fresh(case, 1.5 * alone) as c:
            r = c.post(case.path, json=case.body)
        if r.status_code == 200:
            return True, seen
        seen.append(f"{r.status_code}: {r.text[:300]}")
    return False, seen


def _refused(case: Case, alone: float) -> tuple[bool, list[str]]:
    seen = []
    for _ in range(STARTS):
        with fresh(case, 0.5 * alone) as c:
            rehearsed = batches_run(c)  # before ready (service/http/rehearsal.py)
            started = time.monotonic()
            r = c.post(case.path, json=case.body)
            refused_s = time.monotonic() - started
            ran = batches_run(c) - rehearsed
        if r.status_code == 413:
            assert "HEADWISE_REQUEST_TIMEOUT_S" in r.text
            assert ran == 0  # refused before any of its batches ran
            assert refused_s < 0.2, refused_s
            return True, seen
        seen.append(f"{r.status_code} after {refused_s:.2f} s, {ran} batches: {r.text[:200]}")
    return False, seen


def test_admission_answers_what_fits_and_refuses_what_cannot_at_once(case):
    with fresh(case, 600) as c:
        times = []
        for _ in range(2):
            started = time.monotonic()
            r = c.post(case.path, json=case.body)
            times.append(time.monotonic() - started)
            assert r.status_code == 200, r.text
        alone = min(times)  # T: the request alone on this machine, as the client sees it
    answered, seen = _answered(case, alone)
    assert answered, f"T = {alone:.2f} s, deadline 1.5 T, {STARTS} fresh starts: {seen}"
    refused, seen = _refused(case, alone)
    assert refused, f"T = {alone:.2f} s, deadline 0.5 T, {STARTS} fresh starts: {seen}"


# --- Every path holds its deadline under a saturating load ----------------------------------

DEADLINE_S = 4.0
LOAD = {
    "late": ("/encode", {"inputs": [words(2500, i) for i in range(3)], "chunking": {"size": 64}}),
    "separate": (
        "/encode",
        {"inputs": [words(1500, i) for i in range(3)], "chunking": {"strategy": "separate", "size": 64}},
    ),
    "explain": ("/explain", {"input": words(60), "granularity": "word"}),
    "attention": ("/attention", {"input": words(200)}),
    "encode": ("/encode", {"inputs": [words(200, i) for i in range(64)]}),
}


async def _client(url: str, routes: list[str], log: list[tuple[str, int, float]]) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for name in routes:
            path, body = LOAD[name]
            sent = time.monotonic()
            r = await http.post(path, json=body)
            log.append((name, r.status_code, time.monotonic() - sent))


def _gauges(url: str, name: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name == name:
                out[s.labels.get("path", "")] = s.value
    return out


def test_every_path_answers_by_its_deadline_under_a_saturating_load(default_bundle, tmp_path):
    """Eight clients at once, each sending late and separate chunking, explanations, attention
    maps and big encodes in turn, several times what the cores do in a deadline: every answer
    (200, 413, 429 or 503) comes by the deadline plus 2 s, and once the last is answered
    nothing is left queued and no new batch starts."""
    import asyncio

    from tests.live import serve

    default = Settings.model_fields["calibration_s"].default
    env = {"HEADWISE_REQUEST_TIMEOUT_S": str(DEADLINE_S), "HEADWISE_CALIBRATION_S": str(default)}
    names = list(LOAD)
    log: list[tuple[str, int, float]] = []
    with serve(default_bundle, tmp_path, env) as live:

        async def main() -> None:
            rounds = [[names[(c + k) % len(names)] for k in range(4)] for c in range(8)]
            await asyncio.gather(*(_client(live.url, r, log) for r in rounds))

        asyncio.run(main())
        after = _gauges(live.url, "headwise_batch_size_count")
        depth = _gauges(live.url, "headwise_queue_depth")
        # A batch already running when its request was answered (at most one per batcher,
        # HEADWISE_MAX_BATCH_S long) finishes; none starts after it. (Not a wait for an event:
        # a window in which nothing may happen.)
        time.sleep(1.5)
        later = _gauges(live.url, "headwise_batch_size_count")
    assert len(log) == 32
    late = [(n, s, round(t, 2)) for n, s, t in log if t > DEADLINE_S + 2]
    assert not late, late
    assert {s for _, s, _ in log} <= {200, 413, 429, 503}, log
    assert any(s == 200 for _, s, _ in log) and any(s in (429, 503) for _, s, _ in log), log
    assert all(v == 0 for v in depth.values()), depth
    assert sum(later.values()) - sum(after.values()) <= len(after), (after, later)
