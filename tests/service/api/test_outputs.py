"""/encode's outputs (dense, sparse, multi_vector) and TEI's /embed_sparse, on fake backends:
which tokens answer, how they are pooled and written, what is refused and bounded.

(Parity of real exported models with FlagEmbedding, sentence-transformers and PyLate:
tests/export/test_outputs.py.)"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from service.manifest import MultiVectorOutput, SparseOutput
from service.pipelines.compact import decode
from service.tensors import Batch
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest

DROPPED = [0, 1, 2, 3]  # [PAD] [UNK] [CLS] [SEP]: FlagEmbedding's cls, eos, pad, unk
MARKERS = (20, 21)  # "two", "three": the fake vocabulary's stand-ins for [Q], [D]
PUNCT = 5  # "a": a document's skiplisted token
EXPANSION = 1  # [UNK]: the fake's stand-in for [MASK]
QUERY_LENGTH = 8


def m3() -> FakeBackend:
    return FakeBackend(
        fake_manifest(
            "m3",
            outputs=["dense", "sparse", "multi_vector"],
            sparse=SparseOutput(kind="token_weights", graph_output="w", dropped_ids=DROPPED),
            multi_vector=MultiVectorOutput(graph_output="v", dim=4, skip_first=True),
        )
    )


def splade() -> FakeBackend:
    return FakeBackend(
        fake_manifest(
            "splade", outputs=["sparse"], sparse=SparseOutput(kind="vocabulary", graph_output="s")
        )
    )


def colbert(attend: bool = False) -> FakeBackend:
    return FakeBackend(
        fake_manifest(
            "colbert",
            outputs=["multi_vector"],
            multi_vector=MultiVectorOutput(
                graph_output="v",
                dim=4,
                skip_ids=[PUNCT],
                query_marker=MARKERS[0],
                document_marker=MARKERS[1],
                query_length=QUERY_LENGTH,
                document_length=12,
                query_expansion=True,
                attend_to_expansion=attend,
                expansion_id=EXPANSION,
            ),
        )
    )


@pytest.fixture(scope="module")
def fakes():
    return {"dense": FakeBackend(fake_manifest("dense")), "m3": m3(), "splade": splade(), "colbert": colbert()}


@pytest.fixture(scope="module")
def client(fakes):
    specs = list(fakes)
    with client_for(specs, loader=fake_loader(*fakes.values())) as c:
        yield c


def ids_of(backend: FakeBackend, text: str) -> list[int]:
    return backend.tokenize([text])[0].ids


def test_info_lists_each_models_outputs_and_routes(client):
    models = {m["name"]: m for m in client.get("/info").json()["models"]}
    assert models["dense"]["outputs"] == ["dense"]
    assert models["m3"]["outputs"] == ["dense", "sparse", "multi_vector"]
    assert models["splade"]["outputs"] == ["sparse"] and "/embed_sparse" in models["splade"]["routes"]
    assert models["colbert"]["outputs"] == ["multi_vector"]
    assert "/encode" in models["colbert"]["routes"] and "/embeddings" not in models["colbert"]["routes"]
    served = client.get("/info").json()["served_by"]
    assert served["/embed_sparse"] == "m3" and served["/v1/embeddings"] == "dense"


def test_a_dense_model_answers_encode_as_before(client):
    body = client.post("/encode", json={"inputs": ["the cat"], "model": "dense"}).json()
    assert len(body["embeddings"][0]) == 8 and "sparse" not in body and "outputs" not in body


@pytest.mark.parametrize(
    "model,outputs,has",
    [
        ("dense", ["sparse"], "dense"),
        ("dense", ["multi_vector"], "dense"),
        ("splade", ["multi_vector"], "sparse"),
        ("colbert", ["dense"], "multi_vector"),
        ("splade", ["sparse", "dense"], "sparse"),
    ],
)
def test_an_output_the_model_lacks_is_a_400_naming_the_models_outputs(client, model, outputs, has):
    r = client.post("/encode", json={"inputs": "the cat", "model": model, "outputs": outputs})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert f"outputs {has}" in message or f"outputs are {has}" in message, message


def test_embed_sparse_without_a_sparse_model_is_a_400_naming_the_served_outputs():
    backend = FakeBackend(fake_manifest("only-dense"))
    with client_for(Path("d"), loader=fake_loader(backend)) as c:
        r = c.post("/embed_sparse", json={"inputs": "the cat"})
        assert r.status_code == 400
        assert "sparse" in r.json()["error"] and "only-dense (embed: dense)" in r.json()["error"]
        r = c.post("/encode", json={"inputs": "the cat", "outputs": ["multi_vector"]})
        assert r.status_code == 400 and "has a multi_vector output" in r.json()["error"]["message"]


def test_all_three_outputs_come_from_one_forward_pass(client, fakes):
    backend = fakes["m3"]
    before = len(backend.seen)
    r = client.post(
        "/encode",
        json={"inputs": ["the cat", "a dog"], "model": "m3", "outputs": ["dense", "sparse", "multi_vector"]},
    )
    body = r.json()
    assert r.status_code == 200 and body["outputs"] == ["dense", "sparse", "multi_vector"]
    assert len(backend.seen) - before == 2  # each text computed once
    assert len(body["embeddings"]) == len(body["sparse"]) == len(body["multi_vector"]) == 2
    assert body["dimensions"] == 8 and body["tokens"] == [4, 4]


def test_lexical_weights_are_the_max_per_id_without_specials_or_zeros_sorted(client, fakes):
    text = "the cat the fox one"
    ids = ids_of(fakes["m3"], text)
    want: dict[int, float] = {}
    for i in ids:
        w = (i % 5) / 4
        if i not in DROPPED and w > 0:
            want[i] = max(want.get(i, 0.0), w)
    body = client.post("/encode", json={"inputs": text, "model": "m3", "outputs": ["sparse"]}).json()
    (entries,) = body["sparse"]
    assert [e["index"] for e in entries] == sorted(want)
    assert all(abs(e["value"] - want[e["index"]]) < 1e-6 for e in entries)
    assert "embeddings" not in body and "token" not in entries[0]


def test_sparse_tokens_carry_each_entrys_text(client):
    body = client.post(
        "/encode", json={"inputs": "the fox", "model": "m3", "outputs": ["sparse"], "sparse_tokens": True}
    ).json()
    assert {e["token"] for e in body["sparse"][0]} <= {"the", "fox"} and body["sparse"][0]


def test_embed_sparse_answers_teis_shape_from_the_splade_vector(client, fakes):
    r = client.post("/embed_sparse", json={"inputs": ["the cat cat", "zebra"]})
    assert r.status_code == 200
    # m3 answers first (it is the first sparse model); ask the SPLADE model by /encode too
    assert all(set(e) == {"index", "value"} for row in r.json() for e in row)
    body = client.post("/encode", json={"inputs": "the cat cat", "model": "splade"}).json()
    ids = ids_of(fakes["splade"], "the cat cat")
    counts = np.bincount(ids)
    want = [{"index": i, "value": float(c)} for i, c in enumerate(counts) if c]
    assert body["outputs"] == ["sparse"] and body["sparse"][0] == want  # its default output


def test_token_vectors_skip_the_first_token_and_base64_is_the_same_numbers(client, fakes):
    text = "the quick fox"
    body = client.post("/encode", json={"inputs": text, "model": "m3", "outputs": ["multi_vector"]}).json()
    ids = ids_of(fakes["m3"], text)
    vectors = np.array(body["multi_vector"][0])
    assert vectors.shape == (len(ids) - 1, 4)
    want = fakes["m3"].run_outputs(Batch.of([ids]))["v"][0][1:]
    np.testing.assert_allclose(vectors, want, atol=1e-6)
    compact = client.post(
        "/encode",
        json={"inputs": [text, "a"], "model": "m3", "outputs": ["multi_vector"], "encoding_format": "base64"},
    ).json()["multi_vector"]
    assert compact[0]["dtype"] == "<f4" and compact[0]["shape"] == [len(ids) - 1, 4]
    np.testing.assert_array_equal(decode(compact[0]), vectors.astype(np.float32))
    assert compact[1]["shape"] == [2, 4]  # [CLS] a [SEP]: two vectors


def test_a_colbert_query_gets_its_marker_and_is_expanded_to_its_length(client, fakes):
    backend = fakes["colbert"]
    before = len(backend.seen)
    body = client.post("/encode", json={"inputs": "the cat", "input_type": "query", "model": "colbert"}).json()
    (vectors,) = body["multi_vector"]
    cls, the, cat, sep = ids_of(backend, "the cat")
    assert backend.seen[before] == [cls, MARKERS[0], the, cat, sep]  # what the model attended to
    assert np.array(vectors).shape == (QUERY_LENGTH, 4)  # the [MASK] positions answer too
    padded = [cls, MARKERS[0], the, cat, sep] + [EXPANSION] * (QUERY_LENGTH - 5)
    want = backend.run_outputs(Batch.of([padded]))["v"][0]
    np.testing.assert_allclose(vectors, want, atol=1e-6)
    assert body["tokens"] == [5]


def test_a_colbert_document_gets_its_marker_and_loses_its_skiplist_tokens(client, fakes):
    backend = fakes["colbert"]
    body = client.post("/encode", json={"inputs": "a cat a dog", "model": "colbert"}).json()
    ids = ids_of(backend, "a cat a dog")
    seq = ids[:1] + [MARKERS[1]] + ids[1:]
    (vectors,) = body["multi_vector"]
    keep = [i for i, t in enumerate(seq) if t != PUNCT]
    want = backend.run_outputs(Batch.of([seq]))["v"][0][keep]
    np.testing.assert_allclose(vectors, want, atol=1e-6)


def test_colbert_texts_are_cut_to_their_kinds_length_marker_included(client, fakes):
    long = " ".join(["cat"] * 30)
    doc = client.post("/encode", json={"inputs": long, "model": "colbert"}).json()
    query = client.post("/encode", json={"inputs": long, "model": "colbert", "input_type": "query"}).json()
    assert doc["tokens"] == [12] and query["tokens"] == [QUERY_LENGTH]
    r = client.post("/encode", json={"inputs": long, "model": "colbert", "truncate": False})
    assert r.status_code == 413


def test_attended_expansion_tokens_are_part_of_the_query():
    backend = colbert(attend=True)
    with client_for(Path("c"), loader=fake_loader(backend)) as c:
        body = c.post("/encode", json={"inputs": "the cat", "input_type": "query"}).json()
        assert body["tokens"] == [QUERY_LENGTH] and len(body["multi_vector"][0]) == QUERY_LENGTH
        assert backend.seen[-1][5:] == [EXPANSION] * (QUERY_LENGTH - 5)


def test_input_type_picks_a_dense_models_role_prompt():
    backend = FakeBackend(fake_manifest("e5", prompts={"query": "the ", "passage": "a "}))
    with client_for(Path("e"), loader=fake_loader(backend)) as c:
        query = c.post("/encode", json={"inputs": "cat", "input_type": "query"}).json()
        plain = c.post("/encode", json={"inputs": "the cat"}).json()
        np.testing.assert_allclose(query["embeddings"], plain["embeddings"], atol=1e-6)
        assert query["outputs"] == ["dense"]


def test_one_answers_token_vectors_are_bounded_413_naming_the_setting(fakes):
    with client_for(Path("m"), loader=fake_loader(m3()), multi_vector_max_numbers=20) as c:
        r = c.post("/encode", json={"inputs": ["the cat sat"] * 3, "outputs": ["multi_vector"]})
        assert r.status_code == 413 and "HEADWISE_MULTI_VECTOR_MAX_NUMBERS" in r.json()["error"]["message"]
        assert c.post("/encode", json={"inputs": "the", "outputs": ["sparse"]}).status_code == 200


def test_answers_in_flight_share_a_budget_429_naming_it():
    backend = m3()
    with client_for(Path("m"), loader=fake_loader(backend), multi_vector_budget_numbers=16) as c:
        backend.release.clear()
        body = {"inputs": "the cat fox", "outputs": ["multi_vector"]}  # 4 vectors x 4
        first = threading.Thread(target=lambda: c.post("/encode", json=body))
        first.start()
        assert backend.entered.wait(10)
        r = c.post("/encode", json={"inputs": "the", "outputs": ["multi_vector"]})
        assert r.status_code == 429 and "HEADWISE_MULTI_VECTOR_BUDGET_NUMBERS" in r.json()["error"]["message"]
        backend.release.set()
        first.join(10)
        assert c.post("/encode", json=body).status_code == 200


def test_memory_bound_counts_the_token_vectors_in_flight(client):
    memory = client.get("/info").json()["memory"]
    assert memory["outputs_bytes"] > 0
    parts = ("warm_bytes", "encode_batches_bytes", "attention_bytes", "requests_bytes", "outputs_bytes")
    assert memory["bound_bytes"] == sum(memory[k] for k in parts)


def test_chunking_answers_dense_vectors_only(client):
    for body in (
        {"inputs": "the cat", "model": "m3", "outputs": ["sparse"], "chunking": {"size": 2}},
        {"inputs": "the cat", "model": "splade", "chunking": {"size": 2}},
    ):
        r = client.post("/encode", json=body)
        assert r.status_code == 422 and "chunking answers" in r.json()["error"]["message"], r.text
