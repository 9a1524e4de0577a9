"""POST /attention: the maps are the model's own softmax probabilities, selected and bounded."""

from __future__ import annotations

import asyncio
import struct

import httpx
import numpy as np
import pytest
import torch

from service.http.app import create_app
from service.pipelines.attention import analysis
from service.settings import Settings
from tests.conftest import REAL_TEXTS
from tests.service.conftest import client_for

TEXT = "The quick brown fox jumps over the lazy dog."


def reference_maps(loaded, ids: list[int]) -> np.ndarray:
    """Our PyTorch encoder's explicit attention path: (L, h, n, n)."""
    t = torch.tensor([ids])
    with torch.no_grad():
        _, attn = loaded.model(t, torch.ones_like(t), need_weights=True)
    return torch.stack(attn)[:, 0].numpy()


def test_maps_equal_the_pytorch_reference_and_rows_sum_to_one(client, tiny_model):
    body = client.post("/attention", json={"input": TEXT}).json()
    maps = np.array(body["attentions"])
    n = len(body["tokens"])
    assert maps.shape == (2, 4, n, n)
    np.testing.assert_allclose(maps, reference_maps(tiny_model, body["token_ids"]), atol=1e-5)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    assert body["tokens"][0] == "[CLS]" and body["tokens"][-1] == "[SEP]"
    assert [TEXT[s:e] for s, e in body["offsets"][1:3]] == ["The", "quick"]


def test_selection_returns_exactly_the_asked_layers_and_heads(client):
    full = np.array(client.post("/attention", json={"input": TEXT}).json()["attentions"])
    part = client.post("/attention", json={"input": TEXT, "layers": [1], "heads": [3, 0]}).json()
    assert part["layers"] == [1] and part["heads"] == [3, 0]
    np.testing.assert_allclose(np.array(part["attentions"]), full[[1]][:, [3, 0]], atol=1e-6)
    assert [(s["layer"], s["head"]) for s in part["stats"]] == [(1, 3), (1, 0)]


@pytest.mark.parametrize(
    "body,needle",
    [({"layers": [2]}, "0..1"), ({"heads": [-1]}, "0..3"), ({"heads": []}, "must not be empty")],
)
def test_out_of_range_selection_names_the_valid_range(client, body, needle):
    r = client.post("/attention", json={"input": TEXT, **body})
    assert r.status_code == 422 and needle in r.json()["error"]["message"]


def test_the_embedding_equals_what_encode_returns(client):
    att = np.array(client.post("/attention", json={"input": TEXT}).json()["embedding"])
    enc = np.array(client.post("/encode", json={"inputs": TEXT}).json()["embeddings"][0])
    np.testing.assert_allclose(att, enc, atol=1e-5)


def test_stats_and_importance_are_consistent_with_the_maps(client):
    body = client.post("/attention", json={"input": TEXT}).json()
    maps = np.array(body["attentions"])
    row = next(s for s in body["stats"] if s["layer"] == 1 and s["head"] == 2)
    m = maps[1, 2]
    assert row["cls_mass"] == pytest.approx(m[:, 0].mean(), abs=1e-6)
    assert row["sep_mass"] == pytest.approx(m[:, -1].mean(), abs=1e-6)
    assert row["diagonal_mass"] == pytest.approx(np.diag(m).mean(), abs=1e-6)
    assert 0 <= row["entropy"] <= np.log(len(m)) + 1e-6
    cls = np.array(body["importance"]["cls_last_layer"])
    np.testing.assert_allclose(cls, maps[-1, :, 0, :].mean(0), atol=1e-6)
    assert sum(body["importance"]["rollout"]) == pytest.approx(1.0, abs=1e-6)


def test_concurrent_calls_run_one_at_a_time_and_give_the_maps_of_each_alone(tiny_bundle):
    """Calls of different lengths at once: each runs alone (the pacer), never padded by another."""
    short, long_ = "short", "a much longer input with many more tokens than the other one"

    async def main():
        app = create_app(Settings(bundle=tiny_bundle, attention_cpu_share=1.0))
        async with app.router.lifespan_context(app):
            await app.state.registry.wait_ready()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                alone = (await c.post("/attention", json={"input": short})).json()
                together = await asyncio.gather(
                    *(c.post("/attention", json={"input": t}) for t in (long_, short, long_, short))
                )
            batcher = app.state.registry.models["tiny-random"].attention.batcher
            return alone, [r.json() for r in together], batcher.batches

    alone, together, batches = asyncio.run(main())
    assert batches == 5  # one batch a call
    for body in together[1::2]:
        np.testing.assert_allclose(
            np.array(body["attentions"]), np.array(alone["attentions"]), atol=1e-6
        )


def test_too_many_tokens_is_413_or_truncated_on_request(tiny_bundle):
    with client_for(tiny_bundle, attention_max_tokens=16) as c:
        long_text = "word " * 40
        r = c.post("/attention", json={"input": long_text})
        assert r.status_code == 413 and "16" in r.json()["error"]["message"]
        body = c.post("/attention", json={"input": long_text, "truncate": True}).json()
        assert body["truncated"] is True and len(body["tokens"]) == 16
        assert body["tokens"][-1] == "[SEP]" and np.array(body["attentions"]).shape[-1] == 16


def test_numbers_cap_names_the_limit(tiny_bundle):
    with client_for(tiny_bundle, attention_max_numbers=500) as c:
        r = c.post("/attention", json={"input": TEXT})
        assert r.status_code == 413 and "500" in r.json()["error"]["message"]
        assert (
            c.post("/attention", json={"input": "hi", "layers": [0], "heads": [0]}).status_code
            == 200
        )


def test_disabled_in_production_is_404(tiny_bundle):
    with client_for(tiny_bundle, attention_enabled=False) as c:
        assert c.post("/attention", json={"input": TEXT}).status_code == 404
        assert c.get("/attention/view").status_code == 404
        assert c.post("/encode", json={"inputs": TEXT}).status_code == 200


def test_png_is_a_grid_of_the_selected_maps(client):
    r = client.post(
        "/attention", json={"input": TEXT, "layers": [0, 1], "heads": [0, 1, 2], "format": "png"}
    )
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert r.content[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", r.content[16:24])
    assert width > height  # 3 heads across, 2 layers down


def test_attention_metrics_are_separate_from_encode(client):
    client.post("/attention", json={"input": TEXT})
    text = client.get("/metrics").text
    assert 'headwise_batch_size_count{model="tiny-random",path="attention"}' in text
    assert 'headwise_requests_total{endpoint="/attention",model="tiny-random",status="200"}' in text


def test_head_stats_on_a_known_map():
    n = 4
    eye = np.eye(n)[None, None]  # every query attends to itself
    stats = analysis.head_stats(eye, cls_index=0, sep_index=n - 1)
    assert stats["diagonal_mass"][0, 0] == pytest.approx(1.0)
    assert stats["entropy"][0, 0] == pytest.approx(0.0, abs=1e-9)
    assert stats["mean_distance"][0, 0] == pytest.approx(0.0)
    assert stats["cls_mass"][0, 0] == pytest.approx(1 / n)
    uniform = np.full((1, 1, n, n), 1 / n)
    assert analysis.head_stats(uniform, 0, 3)["entropy"][0, 0] == pytest.approx(np.log(n))
    assert analysis.rollout(uniform).sum() == pytest.approx(1.0)


@pytest.mark.slow
def test_real_model_maps_equal_eager_references(default_bundle, default_loaded, tmp_path):
    """Against our PyTorch encoder and, independently, transformers' eager BertModel."""
    from transformers import BertModel

    hf = BertModel.from_pretrained(str(default_loaded.source), attn_implementation="eager").eval()
    with client_for(default_bundle) as c:
        for text in REAL_TEXTS[:6]:
            body = c.post("/attention", json={"input": text}).json()
            maps = np.array(body["attentions"])
            ours = reference_maps(default_loaded, body["token_ids"])
            np.testing.assert_allclose(maps, ours, atol=1e-4)
            with torch.no_grad():
                out = hf(torch.tensor([body["token_ids"]]), output_attentions=True)
            theirs = torch.stack(out.attentions)[:, 0].numpy()
            np.testing.assert_allclose(maps, theirs, atol=1e-4)


@pytest.mark.parametrize("encoding, atol", [("base64_f32", 0.0), ("base64_f16", 1e-3)])
def test_compact_maps_carry_the_json_arrays_with_their_shape(client, encoding, atol):
    from service.pipelines.attention.encoding import decode_maps

    body = {"input": TEXT, "layers": [0, 1], "heads": [1]}
    arrays = np.array(client.post("/attention", json=body).json()["attentions"])
    compact = client.post("/attention", json={**body, "encoding_format": encoding}).json()
    maps = compact["attentions"]
    assert maps["encoding"] == "base64" and maps["shape"] == list(arrays.shape)
    np.testing.assert_allclose(decode_maps(maps).astype(np.float32), arrays, atol=atol)
    assert compact["stats"] == client.post("/attention", json=body).json()["stats"]


def test_the_sum_of_calls_in_flight_is_bounded_429_with_retry_after():
    """A call that would take the budget past its limit is refused at once (429), one that
    could never fit is 413; the budget returns to zero when calls finish."""
    from service.errors import Overloaded, PayloadTooLarge
    from service.pipelines.attention.limits import Budget

    async def main():
        budget = Budget(10)
        async with budget.hold(6, retry_after=1):
            with pytest.raises(Overloaded) as err:
                async with budget.hold(6, retry_after=3):
                    pass
            assert err.value.retry_after == 3
            assert "HEADWISE_ATTENTION_BUDGET_NUMBERS" in err.value.message
        with pytest.raises(PayloadTooLarge):
            async with budget.hold(11, retry_after=1):
                pass
        return budget.used

    assert asyncio.run(main()) == 0


def test_a_call_over_the_whole_budget_is_413_and_a_normal_one_leaves_it_empty(tiny_bundle):
    with client_for(tiny_bundle, attention_budget_numbers=10) as c:
        r = c.post("/attention", json={"input": TEXT})
        assert r.status_code == 413
        assert "HEADWISE_ATTENTION_BUDGET_NUMBERS" in r.json()["error"]["message"]
    with client_for(tiny_bundle, attention_cpu_share=1.0) as c:
        assert c.post("/attention", json={"input": TEXT}).status_code == 200
        assert c.app.state.registry.models["tiny-random"].attention.budget.used == 0
        assert "headwise_attention_inflight_numbers{" in c.get("/metrics").text


def test_head_stats_layer_by_layer_equal_the_whole_array_at_once():
    rng = np.random.default_rng(0)
    maps = rng.random((3, 2, 5, 5))
    maps /= maps.sum(-1, keepdims=True)
    stats = analysis.head_stats(maps, 0, 4)
    p = maps.astype(np.float64)
    np.testing.assert_allclose(stats["entropy"], -(p * np.log(p)).sum(-1).mean(-1))
    np.testing.assert_allclose(stats["cls_mass"], p[..., 0].mean(-1))
    assert all(v.shape == (3, 2) for v in stats.values())


def test_a_pacer_given_the_serving_traffic_pauses_only_when_others_wanted_the_cores(monkeypatch):
    from service.pipelines.attention import limits

    class Clock:  # each call "computes" one second; the pauses are a hundredth of that
        t = 0.0

        def monotonic(self) -> float:
            return self.t

    class Others:
        count, busy = 0, False

        def queued(self) -> int:
            return self.count

        def waiting(self) -> bool:
            return self.busy

    clock, others = Clock(), Others()
    monkeypatch.setattr(limits, "time", clock)
    pause = 1 / 0.99 - 1

    async def call(pacer: limits.Pacer, queue_meanwhile: bool = False) -> float:
        before = pacer.paused_s
        async with pacer.turn():
            clock.t += 1.0
            others.count += queue_meanwhile
        return pacer.paused_s - before

    async def main():
        pacer = limits.Pacer(0.99, others)
        alone = [await call(pacer) for _ in range(3)]  # nobody else: no pause
        await call(pacer, queue_meanwhile=True)  # an /encode arrived during this call
        after_one_came = await call(pacer)
        others.busy = True  # one was queued or running as the next call began
        await call(pacer)
        others.busy = False
        after_one_waited = await call(pacer)
        after_nobody = await call(pacer)
        strict = limits.Pacer(0.99)  # /attention's: always
        always = [await call(strict) for _ in range(2)]
        return alone, after_one_came, after_one_waited, after_nobody, always

    alone, came, waited, nobody, always = asyncio.run(main())
    assert alone == [0, 0, 0] and nobody == 0
    assert came == pytest.approx(pause) and waited == pytest.approx(pause)
    assert always == [0, pytest.approx(pause)]
