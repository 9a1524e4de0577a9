"""The vendors' own SDKs (current PyPI releases), unmodified, against a real server with an
embedder and a reranker: Cohere (embed v1/v2, rerank v1/v2), Infinity (infinity_client),
Mixedbread, Voyage. Each gets the vectors /encode gives and the order /rerank gives."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from service.pipelines import quantize
from service.tensors import cosines
from tests.live import serve
from tests.service.api.test_rerank import DOCS, QUERY

pytestmark = pytest.mark.slow
TEXTS = ["the cat sat on a warm mat", "rain fell over quiet city streets", "Le chat dort.", ""]


@pytest.fixture(scope="module")
def live(tiny_bundle, ranker_bundle, tmp_path_factory):
    specs = [str(tiny_bundle), f"ranker={ranker_bundle}"]
    with serve(specs, tmp_path_factory.mktemp("sdks")) as server:
        yield server


@pytest.fixture(scope="module")
def encoded(live) -> np.ndarray:
    r = httpx.post(f"{live.url}/encode", json={"inputs": TEXTS, "normalize": True}, timeout=60)
    return np.array(r.json()["embeddings"])


@pytest.fixture(scope="module")
def ranked(live) -> list[tuple[int, float]]:
    r = httpx.post(f"{live.url}/rerank", json={"query": QUERY, "texts": DOCS}, timeout=60)
    return [(x["index"], x["score"]) for x in r.json()]


def same_vectors(got, want: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    assert cosines(got, want).min() >= 0.9999


def same_order(got: list[tuple[int, float]], want: list[tuple[int, float]], top: int | None = None):
    want = want[:top] if top else want
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)


def test_cohere_v1_embed_floats_and_by_type(live, encoded):
    import cohere

    co = cohere.Client(api_key="unused", base_url=live.url, max_retries=0)
    res = co.embed(texts=TEXTS, model="embed-english-v3.0", input_type="search_document")
    assert res.response_type == "embeddings_floats"
    same_vectors(res.embeddings, encoded)
    typed = co.embed(texts=TEXTS, model="x", input_type="search_query", embedding_types=["float", "int8", "ubinary"])
    same_vectors(typed.embeddings.float_, encoded)
    assert np.array_equal(np.array(typed.embeddings.int8), quantize.int8(encoded.astype(np.float32)))
    assert np.array_equal(np.array(typed.embeddings.ubinary), np.packbits(encoded > 0, axis=-1))


def test_cohere_v2_embed_by_type_with_output_dimension(live, encoded):
    import cohere

    co = cohere.ClientV2(api_key="unused", base_url=live.url, max_retries=0)
    res = co.embed(texts=TEXTS, model="embed-v4.0", input_type="search_document", embedding_types=["float", "base64"])
    same_vectors(res.embeddings.float_, encoded)
    decoded = [np.frombuffer(base64.b64decode(s), "<f4") for s in res.embeddings.base64]
    same_vectors(decoded, encoded)
    short = co.embed(texts=TEXTS, model="x", input_type="search_query", embedding_types=["float"], output_dimension=16)
    want = encoded[:, :16] / np.linalg.norm(encoded[:, :16], axis=1, keepdims=True)
    same_vectors(short.embeddings.float_, want)


def test_cohere_rerank_v1_and_v2(live, ranked):
    import cohere

    v2 = cohere.ClientV2(api_key="unused", base_url=live.url, max_retries=0)
    res = v2.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS, top_n=3)
    same_order([(r.index, r.relevance_score) for r in res.results], ranked, top=3)
    v1 = cohere.Client(api_key="unused", base_url=live.url, max_retries=0)
    res = v1.rerank(query=QUERY, documents=DOCS, return_documents=True)
    same_order([(r.index, r.relevance_score) for r in res.results], ranked)
    assert all(r.document.text == DOCS[r.index] for r in res.results)


def test_cohere_sees_cohere_shaped_errors(live):
    import cohere

    co = cohere.ClientV2(api_key="unused", base_url=live.url, max_retries=0)
    with pytest.raises(cohere.errors.BadRequestError) as err:  # a reranker asked to embed
        co.embed(texts=["x"], model="ranker", input_type="search_query", embedding_types=["float"])
    assert "ranker" in err.value.body["message"] and err.value.body["id"]


def test_infinity_client_embeddings_rerank_and_models(live, encoded, ranked):
    from infinity_client import Client
    from infinity_client.api.default import embeddings, models, rerank
    from infinity_client.models import OpenAIEmbeddingInputText, RerankInput

    c = Client(base_url=live.url, raise_on_unexpected_status=True)
    e = embeddings.sync(client=c, body=OpenAIEmbeddingInputText(input_=TEXTS))
    same_vectors([d.embedding for d in e.data], encoded)
    assert e.usage.prompt_tokens == e.usage.total_tokens > 0
    r = rerank.sync(client=c, body=RerankInput(query=QUERY, documents=DOCS, return_documents=True))
    same_order([(x.index, x.relevance_score) for x in r.results], ranked)
    assert all(x.document == DOCS[x.index] for x in r.results)
    listed = models.sync(client=c)
    assert {m.id for m in listed.data} == {"tiny-random", "ranker"}


def test_mixedbread_rerank(live, ranked):
    from mixedbread import Mixedbread

    mxb = Mixedbread(api_key="unused", base_url=live.url, max_retries=0)
    res = mxb.rerank(model="mxbai-rerank-large-v2", query=QUERY, input=DOCS, top_k=2, return_input=True)
    same_order([(d.index, d.score) for d in res.data], ranked, top=2)
    assert all(d.input == DOCS[d.index] for d in res.data)
    objects = [{"title": f"doc {i}", "text": d} for i, d in enumerate(DOCS)]
    res = mxb.rerank(query=QUERY, input=objects, rank_fields=["text"])
    same_order([(d.index, d.score) for d in res.data], ranked)


def test_voyage_rerank_and_embed(live, encoded, ranked):
    import voyageai

    vo = voyageai.Client(api_key="unused", base_url=f"{live.url}/v1")
    rr = vo.rerank(QUERY, DOCS, model="rerank-2", top_k=3)
    same_order([(r.index, r.relevance_score) for r in rr.results], ranked, top=3)
    assert rr.total_tokens > 0 and rr.results[0].document == DOCS[rr.results[0].index]
    em = vo.embed(TEXTS, model="voyage-3")
    same_vectors(em.embeddings, encoded)
    ints = vo.embed(TEXTS, model="voyage-3", output_dtype="int8")
    assert np.array_equal(np.array(ints.embeddings), quantize.int8(encoded.astype(np.float32)))


def test_voyage_reads_its_errors_detail(live):
    import voyageai
    import voyageai.error

    vo = voyageai.Client(api_key="unused", base_url=f"{live.url}/v1")
    with pytest.raises(voyageai.error.InvalidRequestError) as err:
        vo.rerank(QUERY, DOCS, model="tiny-random")
    assert "tiny-random" in str(err.value)
