"""The explanation pipeline on fake backends: parts, ranks, batching, pacing and bounds.

(Importances against the real graphs: tests/service/api/test_explain.py.)
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from scipy.stats import spearmanr

from service.http.app import create_app
from service.pipelines.explain.parts import ranks, spearman
from service.settings import Settings
from service.tensors import Batch
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest


class Recording(FakeBackend):
    """A fake embedder that records the shape and masks of every serving batch."""

    def __init__(self, manifest) -> None:
        super().__init__(manifest)
        self.shapes: list[tuple[int, int]] = []
        self.masks: list[list[list[int]]] = []

    def run(self, batch: Batch) -> np.ndarray:
        self.shapes.append(batch.input_ids.shape)
        self.masks.append(batch.attention_mask.tolist())
        return super().run(batch)


def served(*backends: FakeBackend, **settings):
    return client_for(
        [f"m{i}" for i in range(len(backends))], loader=fake_loader(*backends), **settings
    )


@pytest.mark.parametrize(
    "a,b",
    [
        ([0.1, 0.5, 0.3, 0.9], [1, 3, 2, 4]),
        ([1, 2, 2, 3, 3, 3], [6, 5, 5, 1, 2, 2]),
        ([0.2, -0.1, 0.4], [0.0, 0.0, 1.0]),
    ],
)
def test_spearman_equals_scipys_with_ties_averaged(a, b):
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)


def test_ranks_average_the_ties_and_undefined_correlations_are_none():
    assert ranks(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert spearman([0.4], [0.1]) is None  # one part
    assert spearman([0.1, 0.2, 0.3], [0.5, 0.5, 0.5]) is None  # constant
    assert spearman([0.1, 0.2], None) is None  # no attention


def test_each_texts_variants_are_batched_together_without_padding():
    backend = Recording(fake_manifest("e"))
    with served(backend) as c:
        body = c.post("/explain", json={"similarity": ["the cat", "a dog is one"]}).json()
    assert [len(p) for p in body["parts"]] == [2, 4]
    # [CLS] the cat [SEP]: whole and two parts left out; then the five of the second text.
    assert backend.shapes == [(3, 4), (5, 6)]
    assert backend.masks[0] == [[1, 1, 1, 1], [1, 0, 1, 1], [1, 1, 0, 1]]


def test_the_variants_are_queued_a_batch_of_explain_batch_tokens_at_a_time():
    backend = Recording(fake_manifest("e"))
    with served(backend, explain_batch_tokens=16) as c:  # 16 // 6 tokens: two variants
        body = c.post("/explain", json={"input": "the cat is one"}).json()
    assert len(body["parts"][0]) == 4
    assert backend.shapes == [(2, 6), (2, 6), (1, 6)]


def test_a_default_prompt_is_given_as_encode_gives_it_and_is_no_part():
    manifest = fake_manifest("e", prompts={"query": "hello world "}, default_prompt_name="query")
    backend = Recording(manifest)
    with served(backend) as c:
        body = c.post("/explain", json={"input": "the cat", "granularity": "word"}).json()
    assert [(p["text"], p["start"], p["stop"]) for p in body["parts"][0]] == [
        ("the", 0, 3),
        ("cat", 4, 7),
    ]
    assert backend.shapes == [(3, 6)]  # [CLS] hello world the cat [SEP]: the prompt stays
    assert backend.masks[0][1] == [1, 1, 1, 0, 1, 1]


def test_explanations_in_flight_are_bounded_429_naming_the_setting():
    backend = FakeBackend(fake_manifest("e"))

    async def main():
        app = create_app(Settings(bundle="m", explain_queue=1), loader=fake_loader(backend))
        async with app.router.lifespan_context(app):
            await app.state.registry.wait_ready()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                backend.release.clear()
                first = asyncio.ensure_future(c.post("/explain", json={"input": "the cat"}))
                assert await asyncio.to_thread(backend.entered.wait, 10)
                second = await c.post("/explain", json={"input": "the dog"})
                backend.release.set()
                return (await first).status_code, second

    first, second = asyncio.run(main())
    assert first == 200 and second.status_code == 429
    assert "HEADWISE_EXPLAIN_QUEUE" in second.json()["error"]["message"]
    assert second.headers["retry-after"]


def test_work_that_cannot_finish_by_the_deadline_is_413_at_once():
    backend = Recording(fake_manifest("e"))
    with served(backend, capacity_tokens_per_s=1, request_timeout_s=5) as c:
        r = c.post("/explain", json={"input": "the cat is one"})
    assert r.status_code == 413 and "HEADWISE_REQUEST_TIMEOUT_S" in r.json()["error"]["message"]
    assert backend.shapes == []  # refused before anything ran


def test_explanations_pause_for_encode_traffic_and_not_when_alone():
    backend = FakeBackend(fake_manifest("e"))

    async def main():
        settings = Settings(bundle="m", explain_batch_tokens=6, explain_cpu_share=0.5)
        app = create_app(settings, loader=fake_loader(backend))
        async with app.router.lifespan_context(app):
            await app.state.registry.wait_ready()
            pacer = app.state.registry.models["e"].explain.pacer
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                alone = await c.post("/explain", json={"input": "the cat is one"})
                paused_alone = pacer.paused_s
                explain = asyncio.ensure_future(
                    c.post("/explain", json={"input": "the dog is two"})
                )
                encodes = 0
                while not explain.done():  # a client that keeps /encode busy meanwhile
                    assert (await c.post("/encode", json={"inputs": "a fox"})).status_code == 200
                    encodes += 1
                return alone.status_code, (await explain).status_code, paused_alone, pacer.paused_s

    alone, busy, paused_alone, paused = asyncio.run(main())
    assert alone == busy == 200
    assert paused_alone == 0 and paused > 0


def test_a_model_without_a_dense_vector_does_not_explain_and_says_what_does():
    from service.manifest import SparseOutput

    splade = FakeBackend(
        fake_manifest("splade", outputs=["sparse"], sparse=SparseOutput(kind="vocabulary", graph_output="s"))
    )
    with served(splade, FakeBackend(fake_manifest("e"))) as c:
        r = c.post("/explain", json={"input": "the cat", "model": "splade"})
        assert r.status_code == 400
        assert "an embedding model with a dense vector" in r.json()["error"]["message"]
        assert c.post("/explain", json={"input": "the cat"}).json()["model"] == "e"
