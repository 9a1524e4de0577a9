"""Rerankers and classifiers served next to an embedder: TEI's /rerank and /predict, Cohere's
/v1/rerank and /v2/rerank, scores equal to transformers' logits after the same activation.

Real bundles: random-weight BertForSequenceClassification (1 label) and
XLMRobertaForSequenceClassification (3 named labels) saved by transformers, exported by the CLI.
"""

from __future__ import annotations

import asyncio
from itertools import pairwise

import httpx
import numpy as np
import pytest
import torch

from service.http.app import create_app
from service.settings import Settings
from tests.export.test_architectures import export, save_checkpoint, transformers_model
from tests.service.conftest import client_for, httpx_client

QUERY = "how do I reset my password?"
DOCS = [
    "Open settings, then choose reset.",
    "القطة تنام على الأريكة",
    "the cat sat on a warm mat",
    "rain fell over quiet city streets " * 20,  # truncated with the query, longest first
    "",
]
NLI = {0: "contradiction", 1: "entailment", 2: "neutral"}
PAIRS = [("кошка спит", "the cat sleeps"), ("猫在沙发上睡觉", "le chat dort " * 30)]


@pytest.fixture(scope="module")
def bundles(family_tokenizers, tiny_bundle, ranker_bundle, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rerank")
    ranker = ranker_bundle.parent / "bert-ranker"  # its checkpoint, beside it
    nli = save_checkpoint(
        tmp / "xlmr-nli", "xlm-roberta", family_tokenizers["unigram"],
        "ForSequenceClassification", id2label=NLI, label2id={v: k for k, v in NLI.items()},
    )  # fmt: skip
    export(nli, tmp / "nli-bundle")
    specs = [str(tiny_bundle), f"ranker={ranker_bundle}", f"nli={tmp / 'nli-bundle'}"]
    return {"ranker": ranker, "nli": nli, "specs": specs}


@pytest.fixture(scope="module")
def client(bundles):
    with client_for(bundles["specs"]) as c:
        yield c


def hf_logits(folder, pairs) -> np.ndarray:
    """transformers' own tokenizer-free reference: the checkpoint's logits on the same ids."""
    from tokenizers import Tokenizer

    from export import verify

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(64)
    model = transformers_model(folder, "AutoModelForSequenceClassification")
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if "bert" in folder.name else [])
    x = verify.encode(tok, pairs, names, tok.token_to_id("[PAD]") or tok.token_to_id("<pad>") or 0)
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in x.items()}).logits.numpy()


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def assert_ranked(
    indices: list[int], scores: list[float], want: np.ndarray, top: int | None = None
):
    """Best first, each score transformers' to 1e-4, and the order theirs wherever their scores
    differ by more than that (closer ones may tie-break either way across runtimes)."""
    assert scores == sorted(scores, reverse=True)
    for i, score in zip(indices, scores, strict=True):
        assert score == pytest.approx(want[i], abs=1e-4)
    assert len(set(indices)) == len(indices) == (top or len(want))
    for a, b in pairwise(indices):
        assert want[a] >= want[b] - 1e-4


def test_tei_rerank_scores_are_sigmoid_of_transformers_logits_best_first(client, bundles):
    want = sigmoid(hf_logits(bundles["ranker"], [(QUERY, d) for d in DOCS])[:, 0])
    r = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
    assert r.status_code == 200
    results = r.json()
    assert_ranked([x["index"] for x in results], [x["score"] for x in results], want)
    assert all(x["text"] == DOCS[x["index"]] for x in results)
    raw = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}).json()
    logits = hf_logits(bundles["ranker"], [(QUERY, d) for d in DOCS])[:, 0]
    assert {x["index"]: x["score"] for x in raw} == pytest.approx(dict(enumerate(logits)), abs=1e-4)


def test_cohere_v1_and_jina_shape_with_top_n_and_documents(client, bundles):
    want = sigmoid(hf_logits(bundles["ranker"], [(QUERY, d) for d in DOCS])[:, 0])
    body = {
        "model": "ranker",
        "query": QUERY,
        "documents": [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]],
        "top_n": 2,
        "return_documents": True,
    }
    r = client.post("/v1/rerank", json=body).json()
    assert set(r) >= {"id", "results", "model", "usage"}
    got = r["results"]
    assert len(got) == 2
    assert_ranked([x["index"] for x in got], [x["relevance_score"] for x in got], want, top=2)
    assert max(x["relevance_score"] for x in got) == pytest.approx(want.max(), abs=1e-4)
    assert all(x["document"] == {"text": DOCS[x["index"]]} for x in got)
    assert r["usage"]["total_tokens"] > 0


def test_the_cohere_v2_sdk_parses_our_answer(client, bundles):
    import cohere

    co = cohere.ClientV2(
        api_key="unused",
        base_url=str(client.base_url),
        httpx_client=httpx_client(client),
    )
    res = co.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS, top_n=3)
    want = sigmoid(hf_logits(bundles["ranker"], [(QUERY, d) for d in DOCS])[:, 0])
    assert len(res.results) == 3
    indices = [x.index for x in res.results]
    assert_ranked(indices, [x.relevance_score for x in res.results], want, top=3)
    assert res.results[0].relevance_score == pytest.approx(want.max(), abs=1e-4)
    assert res.meta.api_version.version == "2"


def test_the_cohere_v1_sdk_parses_our_answer(client):
    import cohere

    co = cohere.Client(
        api_key="unused",
        base_url=str(client.base_url),
        httpx_client=httpx_client(client),
    )
    res = co.rerank(model="ranker", query=QUERY, documents=DOCS, return_documents=True)
    assert len(res.results) == len(DOCS) and res.results[0].document.text in DOCS


def test_v2_max_tokens_per_doc_cuts_each_document_first(client):
    long_doc = "rain fell over quiet city streets " * 20
    cut = client.post(
        "/v2/rerank",
        json={"model": "x", "query": QUERY, "documents": [long_doc], "max_tokens_per_doc": 4},
    ).json()
    short = client.post(
        "/v2/rerank", json={"model": "x", "query": QUERY, "documents": ["rain fell over quiet"]}
    ).json()
    assert cut["results"][0]["relevance_score"] == pytest.approx(
        short["results"][0]["relevance_score"], abs=1e-6
    )


def test_predict_gives_every_label_softmaxed_and_sorted(client, bundles):
    logits = hf_logits(bundles["nli"], PAIRS)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    r = client.post("/predict", json={"inputs": [list(p) for p in PAIRS], "model": "nli"})
    answers = r.json()
    assert len(answers) == 2
    for row, want in zip(answers, probs, strict=True):
        assert [p["score"] for p in row] == sorted((p["score"] for p in row), reverse=True)
        assert {p["label"]: p["score"] for p in row} == pytest.approx(
            {NLI[i]: want[i] for i in range(3)}, abs=1e-4
        )
    single = client.post("/predict", json={"inputs": list(PAIRS[0]), "model": "nli"}).json()
    assert [p["label"] for p in single] == [p["label"] for p in answers[0]]  # a flat list


def test_a_model_of_the_wrong_task_is_a_4xx_naming_it(client):
    r = client.post("/rerank", json={"query": "q", "texts": ["a"], "model": "tiny-random"})
    assert r.status_code == 400 and "embed model" in r.json()["error"]
    r = client.post("/encode", json={"inputs": "x", "model": "ranker"})
    assert r.status_code == 400 and "/rerank" in r.json()["error"]["message"]


def test_limits_on_documents_and_pair_length_are_413_naming_them(bundles):
    with client_for(bundles["specs"], rerank_max_documents=3) as c:
        r = c.post("/rerank", json={"query": "q", "texts": ["a"] * 4, "model": "ranker"})
        assert r.status_code == 413 and "limit is 3" in r.json()["error"]
        r = c.post(
            "/rerank",
            json={"query": "q", "texts": ["word " * 200], "model": "ranker", "truncate": False},
        )
        assert r.status_code == 413 and "64 tokens" in r.json()["error"]


def test_a_hundred_documents_are_batched_with_encode_traffic_and_come_back_in_order(bundles):
    docs = [f"document number {i} " * (1 + i % 5) for i in range(100)]
    want = sigmoid(hf_logits(bundles["ranker"], [(QUERY, d) for d in docs])[:, 0])

    async def main():
        app = create_app(Settings(bundles=bundles["specs"]))
        async with app.router.lifespan_context(app):
            await app.state.registry.wait_ready()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                jobs = [c.post("/rerank", json={"query": QUERY, "texts": docs})]
                jobs += [c.post("/encode", json={"inputs": f"text {i}"}) for i in range(20)]
                rs = await asyncio.gather(*jobs)
            batches = app.state.registry.models["ranker"].score.batcher.batches
            return rs, batches

    rs, batches = asyncio.run(main())
    assert all(r.status_code == 200 for r in rs)
    scores = {x["index"]: x["score"] for x in rs[0].json()}
    np.testing.assert_allclose([scores[i] for i in range(100)], want, atol=1e-4)
    assert 1 < batches < 100  # split into batches, not one per pair


def test_attention_on_a_pair_marks_where_the_document_starts(client):
    body = client.post(
        "/attention", json={"input": "the cat", "pair": "le chat", "model": "ranker"}
    ).json()
    assert body["tokens"] == ["[CLS]", "the", "cat", "[SEP]", "le", "chat", "[SEP]"]
    assert body["sequence_ids"] == [None, 0, 0, None, 1, 1, None]
    assert body["boundary"] == 4
    maps = np.array(body["attentions"])
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
