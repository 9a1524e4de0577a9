"""Qwen3 decoders served: an embedder with its prompts and a request's free instruction (/encode,
TEI's /embed), a Qwen3ForCausalLM reranker through its model card's template on every rerank
route (with the request's instruction), a sequence-classification decoder as reranker and
classifier. Each answer equals its reference within 1e-4 (sentence-transformers one text at a
time; the card's P(yes) pair by pair, unpadded; transformers' logits), with requests batched
together.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from export.templates import QWEN3_RERANKER
from service.http.app import create_app
from service.settings import Settings
from tests.export.decoders import (
    MAX_LENGTH,
    NO_CACHE,
    card_scores,
    save,
    save_embedder,
    sentence_transformers_reference,
)
from tests.export.test_new_families import export
from tests.service.conftest import client_for

TOLERANCE = 1e-4
TEXTS = ["the cat sat on a warm mat", "le chat dort sur le canapé", ""]
QUERY = "what is the capital of China?"
DOCS = [
    "the cat sat on a warm mat",
    "rain fell over quiet city streets tonight " * 20,  # cut to fit, its end first
    "",
    "кошка спит на диване",
]
INSTRUCTION = "Given a question about cats, find the passage that answers it"
PAIRS = [("кошка спит", "the cat sleeps"), ("猫 在 沙发", "le chat dort " * 30)]
LABELS = {0: "contradiction", 1: "entailment", 2: "neutral"}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_bundle):
    root = tmp_path_factory.mktemp("decoders")
    save_embedder(root / "emb")
    export(root / "emb", root / "emb-bundle")
    rr = save(root / "rr", "Qwen3ForCausalLM", "reranker")
    export(root / "rr", root / "rr-bundle", "--task", "rerank")
    cls = save(root / "cls", "Qwen3ForSequenceClassification", "reranker", num_labels=1)
    export(root / "cls", root / "cls-bundle")
    nli = save(
        root / "nli", "Qwen3ForSequenceClassification", "reranker",
        num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()},
    )  # fmt: skip
    export(root / "nli", root / "nli-bundle")
    specs = [f"{n}={root / n}-bundle" for n in ("emb", "rr", "cls", "nli")] + [str(tiny_bundle)]
    return {"root": root, "rr": rr, "cls": cls, "nli": nli, "specs": specs}


@pytest.fixture(scope="module")
def client(models):
    with client_for(models["specs"]) as c:
        yield c


def card(models, documents, instruction=None, query=QUERY):
    return card_scores(
        models["rr"], models["root"] / "rr", [(query, d) for d in documents], instruction
    )


def hf_logits(models, name, pairs):
    tok = Tokenizer.from_file(str(models["root"] / f"{name}-bundle" / "tokenizer.json"))
    rows = [tok.encode(*p).ids for p in pairs]
    out = []
    for ids in rows:  # one pair at a time: no padding
        with torch.no_grad():
            out.append(models[name](input_ids=torch.tensor([ids]), **NO_CACHE).logits[0].numpy())
    return np.stack(out)


# --- the embedder: prompts and instructions ---------------------------------------------------


def test_encode_with_the_query_prompt_equals_sentence_transformers(client, models):
    r = client.post("/encode", json={"inputs": TEXTS, "model": "emb", "prompt_name": "query"})
    assert r.status_code == 200, r.text
    want = sentence_transformers_reference(models["root"] / "emb", TEXTS, prompt_name="query")
    np.testing.assert_allclose(np.array(r.json()["embeddings"]), want, atol=TOLERANCE)


def test_an_instruction_is_formatted_as_the_cards_query(client, models):
    prompt = f"Instruct: {INSTRUCTION}\nQuery:"
    want = sentence_transformers_reference(models["root"] / "emb", TEXTS, prompt=prompt)
    r = client.post("/encode", json={"inputs": TEXTS, "model": "emb", "instruction": INSTRUCTION})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["embeddings"]), want, atol=TOLERANCE)
    tei = client.post("/embed", json={"inputs": TEXTS, "instruction": INSTRUCTION})
    assert tei.status_code == 200, tei.text
    np.testing.assert_allclose(np.array(tei.json()), want, atol=TOLERANCE)


def test_an_instruction_that_pushes_a_query_past_the_limit_is_cut_or_413(client, models):
    """Cut at its end, the tokenizer's appended end token kept (as sentence-transformers cuts
    it), or refused with truncate false."""
    query = "rain fell over quiet city streets tonight " * 6
    alone = client.post("/encode", json={"inputs": query, "model": "emb"}).json()
    assert alone["tokens"][0] < MAX_LENGTH
    body = {"inputs": query, "model": "emb", "instruction": INSTRUCTION * 2}
    cut = client.post("/encode", json=body)
    assert cut.status_code == 200 and cut.json()["tokens"] == [MAX_LENGTH]
    want = sentence_transformers_reference(
        models["root"] / "emb", [query], prompt=f"Instruct: {INSTRUCTION * 2}\nQuery:"
    )
    np.testing.assert_allclose(np.array(cut.json()["embeddings"]), want, atol=TOLERANCE)
    refused = client.post("/encode", json={**body, "truncate": False})
    assert refused.status_code == 413 and f"limit is {MAX_LENGTH}" in refused.text
    tei = client.post(
        "/embed", json={"inputs": query, "instruction": INSTRUCTION * 2, "truncate": False}
    )
    assert tei.status_code == 413


def test_an_instruction_is_refused_by_a_model_without_its_format_and_beside_a_prompt(client):
    r = client.post("/encode", json={"inputs": "x", "model": "tiny-random", "instruction": "y"})
    assert r.status_code == 422 and "takes no instruction" in r.text
    r = client.post(
        "/encode", json={"inputs": "x", "model": "emb", "instruction": "y", "prompt_name": "query"}
    )
    assert r.status_code == 422 and "not both" in r.text


def test_a_decoder_chunks_separately_and_refuses_late_chunking(client, models):
    """A causal model's token states each see only the text before them, and it was trained to
    pool the last one: averaging a chunk's states is no embedding of it."""
    doc = "the cat sat on a warm mat. " * 6
    body = {"inputs": doc, "model": "emb", "chunking": {"size": 8}}
    r = client.post("/encode", json=body)
    assert r.status_code == 400 and "separate" in r.text and "last token" in r.text
    body["chunking"]["strategy"] = "separate"
    r = client.post("/encode", json=body)
    assert r.status_code == 200, r.text
    chunks = r.json()["chunks"][0]
    assert len(chunks) > 1
    first = chunks[0]
    alone = client.post("/encode", json={"inputs": doc[first["start"] : first["stop"]], "model": "emb"})
    np.testing.assert_allclose(first["embedding"], alone.json()["embeddings"][0], atol=TOLERANCE)


def test_a_templated_rerankers_importance_is_the_p_yes_lost_over_its_own_words(client, models):
    """/explain occludes the query's and the document's words, never the template around them;
    each importance is the card's P(yes) lost, as transformers' causal LM computes it with the
    same positions left out of the mask."""
    from service.manifest import Manifest
    from service.pipelines.template import PairTemplate, with_tokenizer
    from tests.service.api.test_explain import groups, masks_for

    query, document = "where does the cat sleep", "the cat sleeps on a warm mat by the door"
    body = {"model": "rr", "pair": [query, document], "granularity": "word"}
    r = client.post("/explain", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    bundle = models["root"] / "rr-bundle"
    manifest = Manifest.model_validate_json((bundle / "manifest.json").read_text())
    template = manifest.rerank_template
    assert template is not None
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    pairs = PairTemplate(template, with_tokenizer(tok), manifest.max_length)
    (enc,) = pairs.encodings([(query, document)], own_words=True)
    assert enc.ids == pairs.sequences([(query, document)])[0].ids  # the ids /rerank scores
    parts = groups(enc, word=True)
    masks = masks_for(enc, parts)
    with torch.no_grad():
        logits = models["rr"](
            input_ids=torch.tensor([enc.ids] * len(masks)),
            attention_mask=torch.from_numpy(masks),
            **NO_CACHE,
        ).logits[:, -1].numpy()
    p_yes = 1 / (1 + np.exp(-(logits[:, template.yes_id] - logits[:, template.no_id])))
    assert got["score"] == pytest.approx(card(models, [document], query=query)[0], abs=1e-4)
    assert got["score"] == pytest.approx(p_yes[0], abs=1e-4)
    flat = [p["importance"] for text in got["parts"] for p in text]
    np.testing.assert_allclose(flat, p_yes[0] - p_yes[1:], atol=1e-4)
    assert np.abs(flat).max() > 1e-2, (got["score"], flat)  # the words do move the score
    for text, words in zip((query, document), got["parts"], strict=True):
        assert [p["text"] for p in words] == text.split()  # every word once, nothing else
        assert all(p["text"] == text[p["start"] : p["stop"]] for p in words)


def test_info_names_the_instruction_format_and_the_graphs_files(client):
    info = client.get("/info").json()
    emb = next(m for m in info["models"] if m["name"] == "emb")
    assert emb["instruction_format"] == "Instruct: {instruction}\nQuery:{text}"
    assert set(emb["graph_files"]["encoder"]) == {"encoder.onnx"}
    assert emb["graph_files"]["encoder"]["encoder.onnx"] == emb["graph_bytes"]["encoder"]


# --- the causal LM reranker on every rerank route ----------------------------------------------


def by_index(results, key="score", index="index"):
    return [s for _, s in sorted((x[index], x[key]) for x in results)]


def test_tei_rerank_is_the_cards_p_yes(client, models):
    r = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "model": "rr"})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(by_index(r.json()), card(models, DOCS), atol=TOLERANCE)
    raw = client.post(
        "/rerank", json={"query": QUERY, "texts": DOCS, "model": "rr", "raw_scores": True}
    )
    p = card(models, DOCS)
    np.testing.assert_allclose(by_index(raw.json()), np.log(p / (1 - p)), atol=1e-3)


@pytest.mark.parametrize(
    "path,body,key,index",
    [
        ("/rerank", {"texts": DOCS}, "score", "index"),
        ("/v1/rerank", {"documents": DOCS}, "relevance_score", "index"),
        ("/v2/rerank", {"documents": DOCS}, "relevance_score", "index"),
    ],
)
def test_every_rerank_route_takes_the_instruction(client, models, path, body, key, index):
    r = client.post(path, json={"query": QUERY, "model": "rr", "instruction": INSTRUCTION, **body})
    assert r.status_code == 200, r.text
    results = (
        r.json() if isinstance(r.json(), list) else r.json().get("results") or r.json()["data"]
    )
    np.testing.assert_allclose(
        by_index(results, key, index), card(models, DOCS, INSTRUCTION), atol=TOLERANCE
    )


def test_voyage_infinity_and_mixedbread_shapes_take_it_too(client, models):
    want = card(models, DOCS, INSTRUCTION)
    common = {"query": QUERY, "model": "rr", "instruction": INSTRUCTION}
    voyage = client.post("/v1/rerank", json={**common, "documents": DOCS, "top_k": 4}).json()
    np.testing.assert_allclose(by_index(voyage["data"], "relevance_score"), want, atol=TOLERANCE)
    infinity = client.post("/rerank", json={**common, "documents": DOCS}).json()
    np.testing.assert_allclose(
        by_index(infinity["results"], "relevance_score"), want, atol=TOLERANCE
    )
    mixedbread = client.post("/v1/reranking", json={**common, "input": DOCS}).json()
    np.testing.assert_allclose(by_index(mixedbread["data"]), want, atol=TOLERANCE)


def test_a_pair_past_the_limit_is_cut_at_the_documents_end_or_413(client, models):
    r = client.post(
        "/rerank", json={"query": QUERY, "texts": DOCS[1:2], "model": "rr", "truncate": False}
    )
    assert r.status_code == 413 and "template" in r.text
    ok = client.post("/rerank", json={"query": QUERY, "texts": DOCS[1:2], "model": "rr"})
    assert ok.json()[0]["score"] == pytest.approx(card(models, DOCS[1:2])[0], abs=TOLERANCE)


def test_concurrent_rerank_requests_are_batched_together_each_as_the_card(models):
    instructions = [None, INSTRUCTION, "Find French text", None, "Anything about rain"]

    async def main():
        app = create_app(Settings(bundles=models["specs"]))
        async with app.router.lifespan_context(app):
            await app.state.registry.wait_ready()
            batcher = app.state.registry.models["rr"].score.batcher
            rehearsed = batcher.batches, batcher.submitted  # before ready (http/rehearsal.py)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                jobs = [
                    c.post(
                        "/rerank",
                        json={
                            "query": QUERY,
                            "texts": DOCS,
                            "model": "rr",
                            **({"instruction": i} if i else {}),
                        },
                    )  # fmt: skip
                    for i in instructions
                ]
                jobs += [c.post("/encode", json={"inputs": t, "model": "emb"}) for t in TEXTS]
                rs = await asyncio.gather(*jobs)
            return rs, batcher.batches - rehearsed[0], batcher.submitted - rehearsed[1]

    rs, batches, submitted = asyncio.run(main())
    assert all(r.status_code == 200 for r in rs), [(r.status_code, r.text[:400]) for r in rs if r.status_code != 200]
    for r, instruction in zip(rs, instructions, strict=False):
        np.testing.assert_allclose(
            by_index(r.json()), card(models, DOCS, instruction), atol=TOLERANCE
        )
    assert submitted == len(instructions) * len(DOCS)
    assert batches < len(instructions)  # pairs of several requests shared batches


def test_attention_on_a_pair_shows_the_template_with_the_document_marked(client, models):
    r = client.post("/attention", json={"input": "the cat", "pair": "le chat", "model": "rr"})
    assert r.status_code == 200, r.text
    body = r.json()
    tok = Tokenizer.from_file(str(models["root"] / "rr-bundle" / "tokenizer.json"))
    boundary, ids = body["boundary"], body["token_ids"]
    assert tok.decode(ids, skip_special_tokens=False) == QWEN3_RERANKER.prefix + (
        QWEN3_RERANKER.format.format(
            instruction=QWEN3_RERANKER.instruction, query="the cat", document="le chat"
        )
        + QWEN3_RERANKER.suffix
    )
    assert tok.decode(ids[boundary:], skip_special_tokens=False).startswith(" le chat<|im_end|>")
    assert body["sequence_ids"] == [0] * boundary + [1] * (len(ids) - boundary)
    maps = np.array(body["attentions"])
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    assert (maps[..., np.triu(np.ones(maps.shape[-2:], dtype=bool), 1)] == 0).all()


# --- the sequence-classification decoder ------------------------------------------------------


def test_a_decoder_classifier_reranks_its_tokenizers_pairs(client, models):
    want = 1 / (1 + np.exp(-hf_logits(models, "cls", [(QUERY, d) for d in DOCS])[:, 0]))
    r = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "model": "cls"})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(by_index(r.json()), want, atol=TOLERANCE)
    refused = client.post(
        "/rerank", json={"query": QUERY, "texts": DOCS, "model": "cls", "instruction": "x"}
    )
    assert refused.status_code == 422 and "takes no instruction" in refused.text


def test_a_decoder_classifier_predicts_every_label(client, models):
    logits = hf_logits(models, "nli", PAIRS)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    answers = client.post(
        "/predict", json={"inputs": [list(p) for p in PAIRS], "model": "nli"}
    ).json()
    for row, want in zip(answers, probs, strict=True):
        assert {p["label"]: p["score"] for p in row} == pytest.approx(
            {LABELS[i]: want[i] for i in range(3)}, abs=TOLERANCE
        )
