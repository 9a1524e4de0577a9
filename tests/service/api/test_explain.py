"""POST /explain on real exported bundles (an embedder, a BERT reranker, an XLM-R classifier):
each importance equals the bundle's own graph fed the same masks with onnxruntime, the graph
honours a 0 inside the mask as transformers and our PyTorch model do, words are the tokenizer's
own with right offsets, attention is /attention's rollout, and bad input is a 4xx naming it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from tokenizers import Encoding, Tokenizer

from service.engine.sessions import build_session
from service.manifest import Manifest
from tests.export.test_architectures import export, save_checkpoint, transformers_model
from tests.service.conftest import client_for

NLI = {0: "contradiction", 1: "entailment", 2: "neutral"}
TEXT = "The cat sat on the warm mat, purring."
QUERY, DOC = "where does the cat sleep?", "the cat sleeps on a warm mat"
WORDY = [
    "Hello, world! Isn't it great?",
    "Café crème, déjà vu — naïve résumé.",
    "東京は日本の首都です。北京也很大！",
    "e-mail me at cat@mat.org (20% off)...",
]


@pytest.fixture(scope="module")
def bundles(family_tokenizers, tiny_bundle, ranker_bundle, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("explain")
    nli = save_checkpoint(
        tmp / "xlmr-nli", "xlm-roberta", family_tokenizers["unigram"],
        "ForSequenceClassification", id2label=NLI, label2id={v: k for k, v in NLI.items()},
    )  # fmt: skip
    export(nli, tmp / "nli-bundle")
    return {
        "embedder": tiny_bundle,
        "ranker": ranker_bundle,
        "ranker_checkpoint": ranker_bundle.parent / "bert-ranker",
        "nli": tmp / "nli-bundle",
        "nli_checkpoint": nli,
    }


@pytest.fixture(scope="module")
def client(bundles):
    specs = [str(bundles["embedder"]), f"ranker={bundles['ranker']}", f"nli={bundles['nli']}"]
    with client_for(specs) as c:
        yield c


# --- the direct computation: the bundle's graph, onnxruntime, the same masks ---------------


class Graph:
    """A bundle's serving graph and tokenizer, called directly."""

    def __init__(self, bundle: Path) -> None:
        self.manifest = Manifest.model_validate_json((bundle / "manifest.json").read_text())
        self.session = build_session(bundle / "encoder.onnx")
        self.tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.manifest.max_length)

    def encode(self, *texts: str) -> Encoding:
        return self.tokenizer.encode(*texts)

    def run(self, enc: Encoding, masks: np.ndarray) -> np.ndarray:
        ids = np.array([enc.ids] * len(masks), dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": masks.astype(np.int64)}
        if "token_type_ids" in self.manifest.inputs:
            feeds["token_type_ids"] = np.array([enc.type_ids] * len(masks), dtype=np.int64)
        return self.session.run(None, feeds)[0].astype(np.float64)


def groups(enc: Encoding, word: bool = False) -> list[list[int]]:
    """Positions left out together: each ordinary token, or each (sequence, word)."""
    out: dict[object, list[int]] = {}
    for i, (special, seq, w) in enumerate(
        zip(enc.special_tokens_mask, enc.sequence_ids, enc.word_ids, strict=True)
    ):
        if not special:
            out.setdefault((seq, w) if word else i, []).append(i)
    return list(out.values())


def masks_for(enc: Encoding, parts: list[list[int]]) -> np.ndarray:
    masks = np.ones((1 + len(parts), len(enc.ids)), dtype=np.int64)
    for k, positions in enumerate(parts):
        masks[k + 1, positions] = 0
    return masks


def cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def importances(body: dict, text: int = 0) -> np.ndarray:
    return np.array([p["importance"] for p in body["parts"][text]])


# --- the graph leaves a token out as the reference models do --------------------------------


def test_the_fused_graph_honours_a_zero_inside_the_mask_as_our_pytorch_model(bundles, tiny_model):
    g = Graph(bundles["embedder"])
    enc = g.encode(TEXT)
    masks = masks_for(enc, [[2], [3, 4], [len(enc.ids) - 2]])
    served = g.run(enc, masks)
    ids = torch.tensor([enc.ids] * len(masks))
    with torch.no_grad():
        want, _ = tiny_model.model(ids, torch.from_numpy(masks))
    np.testing.assert_allclose(served, want.numpy(), atol=1e-5)
    assert not np.allclose(served[0], served[1], atol=1e-3)  # leaving a token out changes it


@pytest.mark.parametrize("which", ["ranker", "nli"])
def test_the_fused_graph_honours_a_zero_inside_the_mask_as_transformers(bundles, which):
    g = Graph(bundles[which])
    enc = g.encode(QUERY, DOC)
    masks = masks_for(enc, [[1], [2, 3], [len(enc.ids) - 2]])
    served = g.run(enc, masks)
    model = transformers_model(bundles[f"{which}_checkpoint"], "AutoModelForSequenceClassification")
    feeds = {"input_ids": torch.tensor([enc.ids] * len(masks)), "attention_mask": torch.from_numpy(masks)}
    if "token_type_ids" in g.manifest.inputs:
        feeds["token_type_ids"] = torch.tensor([enc.type_ids] * len(masks))
    with torch.no_grad():
        want = model(**feeds).logits.numpy()
    np.testing.assert_allclose(served, want, atol=1e-4)


# --- importances equal the direct computation ------------------------------------------------


@pytest.mark.parametrize("granularity", ["token", "word"])
def test_an_embedders_importance_is_one_minus_the_cosine_without_the_part(client, bundles, granularity):
    body = client.post("/explain", json={"input": TEXT, "granularity": granularity}).json()
    g = Graph(bundles["embedder"])
    enc = g.encode(TEXT)
    parts = groups(enc, word=granularity == "word")
    rows = g.run(enc, masks_for(enc, parts))
    want = 1 - cos(rows[:1], rows[1:])
    assert body["model"] == "tiny-random" and body["granularity"] == granularity
    assert "score" not in body and len(body["parts"]) == 1
    np.testing.assert_allclose(importances(body), want, atol=1e-4)
    assert [(p["start"], p["stop"]) for p in body["parts"][0]] == [
        (enc.offsets[ps[0]][0], enc.offsets[ps[-1]][1]) for ps in parts
    ]


def test_similarity_importance_is_the_cosine_lost_on_each_side(client, bundles):
    a, b = "a cat sleeps on the mat", "the dog is sleeping outside"
    body = client.post("/explain", json={"similarity": [a, b]}).json()
    g = Graph(bundles["embedder"])
    ea, eb = g.encode(a), g.encode(b)
    ra, rb = g.run(ea, masks_for(ea, groups(ea))), g.run(eb, masks_for(eb, groups(eb)))
    whole = cos(ra[0], rb[0])
    assert body["score"] == pytest.approx(whole, abs=1e-5)
    np.testing.assert_allclose(importances(body, 0), whole - cos(ra[1:], rb[:1]), atol=1e-4)
    np.testing.assert_allclose(importances(body, 1), whole - cos(ra[:1], rb[1:]), atol=1e-4)
    assert [p["text"] for p in body["parts"][1]] == ["the", "dog", "is", "sleeping", "outside"]
    encode = client.post("/encode", json={"inputs": [a, b]}).json()["embeddings"]
    assert body["score"] == pytest.approx(float(np.dot(*np.array(encode))), abs=1e-5)


def test_a_rerankers_importance_is_the_relevance_lost_and_its_score_is_reranks(client, bundles):
    body = client.post("/explain", json={"pair": [QUERY, DOC], "model": "ranker"}).json()
    g = Graph(bundles["ranker"])
    enc = g.encode(QUERY, DOC)
    parts = groups(enc)
    relevance = sigmoid(g.run(enc, masks_for(enc, parts))[:, 0])
    rerank = client.post("/rerank", json={"query": QUERY, "texts": [DOC], "model": "ranker"})
    assert body["score"] == pytest.approx(rerank.json()[0]["score"], abs=1e-5)
    assert body["score"] == pytest.approx(relevance[0], abs=1e-5)
    flat = np.concatenate([importances(body, 0), importances(body, 1)])
    np.testing.assert_allclose(flat, relevance[0] - relevance[1:], atol=1e-4)
    for text, parts in zip((QUERY, DOC), body["parts"], strict=True):  # a token a part
        assert "".join(p["text"] for p in parts) == text.replace(" ", "")
        assert all(p["text"] == text[p["start"] : p["stop"]] for p in parts)


@pytest.mark.parametrize("target", [None, "neutral"])
def test_a_classifiers_importance_is_the_targets_probability_lost(client, bundles, target):
    g = Graph(bundles["nli"])
    enc = g.encode(QUERY, DOC)
    parts = groups(enc, word=True)
    probabilities = softmax(g.run(enc, masks_for(enc, parts)))
    label = target or NLI[int(np.argmax(probabilities[0]))]
    column = probabilities[:, [k for k, v in NLI.items() if v == label][0]]
    body = {"pair": [QUERY, DOC], "model": "nli", "granularity": "word"}
    if target:
        body["target"] = target
    got = client.post("/explain", json=body).json()
    assert got["target"] == label and got["score"] == pytest.approx(column[0], abs=1e-5)
    flat = np.concatenate([importances(got, 0), importances(got, 1)])
    np.testing.assert_allclose(flat, column[0] - column[1:], atol=1e-4)


def test_a_classifier_explains_one_text_too(client, bundles):
    g = Graph(bundles["nli"])
    enc = g.encode(TEXT)
    probabilities = softmax(g.run(enc, masks_for(enc, groups(enc))))
    top = int(np.argmax(probabilities[0]))
    got = client.post("/explain", json={"input": TEXT, "model": "nli"}).json()
    assert got["target"] == NLI[top] and len(got["parts"]) == 1
    np.testing.assert_allclose(
        importances(got), probabilities[0, top] - probabilities[1:, top], atol=1e-4
    )


# --- words and offsets -------------------------------------------------------------------


def assert_words_cover(text: str, parts: list[dict], enc: Encoding, sequence: int = 0) -> None:
    """The parts are the tokenizer's words of this text, in order, each once, offsets right
    (the spaces at a word's ends left out), and every character that is not a space lies in
    exactly one of them."""
    words: dict[int, list[tuple[int, int]]] = {}
    for special, seq, w, span in zip(
        enc.special_tokens_mask, enc.sequence_ids, enc.word_ids, enc.offsets, strict=True
    ):
        if not special and seq == sequence:
            words.setdefault(w, []).append(span)
    want = []
    for spans in words.values():
        word = text[spans[0][0] : spans[-1][1]]
        start = spans[0][0] + len(word) - len(word.lstrip())
        want.append((start, start + len(word.strip())))
    assert [(p["start"], p["stop"]) for p in parts] == want
    assert all(p["text"] == text[p["start"] : p["stop"]] for p in parts)
    covered = [0] * len(text)
    for p in parts:
        for i in range(p["start"], p["stop"]):
            covered[i] += 1
    assert all(c == (0 if ch.isspace() else 1) for ch, c in zip(text, covered, strict=True)), (
        text,
        [(ch, c) for ch, c in zip(text, covered, strict=True) if c != (0 if ch.isspace() else 1)],
    )


@pytest.mark.parametrize("text", WORDY)
def test_words_cover_every_word_of_the_text_once_with_its_offsets(client, bundles, text):
    body = client.post("/explain", json={"input": text, "granularity": "word"}).json()
    assert_words_cover(text, body["parts"][0], Graph(bundles["embedder"]).encode(text))
    assert [p["text"] for p in body["parts"][0]][:2] == {
        WORDY[0]: ["Hello", ","],
        WORDY[1]: ["Café", "crème"],
        WORDY[2]: ["東", "京"],
        WORDY[3]: ["e", "-"],
    }[text]


def test_words_of_a_pair_are_each_texts_own_with_offsets_into_it(client, bundles):
    query, doc = WORDY[1], WORDY[2]
    body = client.post(
        "/explain", json={"pair": [query, doc], "model": "nli", "granularity": "word"}
    ).json()
    enc = Graph(bundles["nli"]).encode(query, doc)
    assert_words_cover(query, body["parts"][0], enc, 0)
    assert_words_cover(doc, body["parts"][1], enc, 1)
    assert body["parts"][0][0]["text"] == "Café"  # a SentencePiece word keeps its punctuation


# --- attention beside it -----------------------------------------------------------------


def test_attention_is_the_attention_rollout_summed_over_each_parts_tokens(client):
    body = client.post("/explain", json={"input": TEXT, "granularity": "word"}).json()
    rollout = client.post("/attention", json={"input": TEXT}).json()
    tokens = np.array(rollout["importance"]["rollout"])
    enc_words = [p for p in body["parts"][0]]
    offsets = rollout["offsets"]
    for part in enc_words:
        inside = [
            i
            for i, (a, b) in enumerate(offsets)
            if 0 < i < len(offsets) - 1 and part["start"] <= a and b <= part["stop"]
        ]
        assert part["attention"] == pytest.approx(tokens[inside].sum(), abs=1e-6)
    want = spearmanr([p["importance"] for p in enc_words], [p["attention"] for p in enc_words])
    assert body["spearman"][0] == pytest.approx(want.statistic, abs=1e-9)
    assert body["attention_note"] is None


def test_a_pairs_attention_is_over_the_joined_pair(client):
    body = client.post("/explain", json={"pair": [QUERY, DOC], "model": "ranker"}).json()
    maps = client.post("/attention", json={"input": QUERY, "pair": DOC, "model": "ranker"}).json()
    rollout = maps["importance"]["rollout"]
    ordinary = [i for i, s in enumerate(maps["sequence_ids"]) if s is not None]
    ordinary = [i for i in ordinary if maps["tokens"][i] not in ("[CLS]", "[SEP]")]
    got = [p["attention"] for text in body["parts"] for p in text]
    np.testing.assert_allclose(got, [rollout[i] for i in ordinary], atol=1e-6)
    assert len(body["spearman"]) == 2 and all(isinstance(s, float) for s in body["spearman"])


def test_without_attention_maps_it_still_explains_and_says_why(bundles):
    with client_for(bundles["embedder"], attention_enabled=False) as c:
        body = c.post("/explain", json={"input": TEXT}).json()
    assert all(p["attention"] is None for p in body["parts"][0]) and body["spearman"] == [None]
    assert "HEADWISE_ATTENTION_ENABLED" in body["attention_note"]
    assert len(body["parts"][0]) == 11 and all(np.isfinite(importances(body)))


# --- bounds and bad input ----------------------------------------------------------------


def test_over_the_work_budget_is_413_naming_the_setting(bundles):
    with client_for(bundles["embedder"], explain_max_work=100) as c:
        r = c.post("/explain", json={"input": TEXT})
        assert r.status_code == 413
        assert "HEADWISE_EXPLAIN_MAX_WORK" in r.json()["error"]["message"]
        assert "13 tokens x 12 passes = 156" in r.json()["error"]["message"]
        assert c.post("/explain", json={"input": "the cat sat"}).status_code == 200


def test_an_unknown_label_is_422_listing_the_labels(client):
    r = client.post("/explain", json={"input": TEXT, "model": "nli", "target": "happy"})
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    assert "'happy'" in message and "contradiction, entailment, neutral" in message


def test_a_pair_to_an_embedder_is_400_saying_which_forms_it_takes(client):
    r = client.post("/explain", json={"pair": [QUERY, DOC], "model": "tiny-random"})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "`input`" in message and "`similarity`" in message and "send similarity" in message
    r = client.post("/explain", json={"similarity": [QUERY, DOC], "model": "ranker"})
    assert r.status_code == 400 and "`pair`" in r.json()["error"]["message"]


def test_without_a_model_the_first_that_takes_the_form_answers(client):
    assert client.post("/explain", json={"input": TEXT}).json()["model"] == "tiny-random"
    assert client.post("/explain", json={"pair": [QUERY, DOC]}).json()["model"] == "ranker"


def test_too_long_without_truncation_is_413_naming_the_models_limit(client):
    r = client.post("/explain", json={"input": "word " * 100, "truncate": False})
    assert r.status_code == 413 and "48 tokens, the model's limit" in r.json()["error"]["message"]
    cut = client.post("/explain", json={"input": "word " * 100}).json()
    assert cut["truncated"] and len(cut["parts"][0]) == 46


@pytest.mark.parametrize(
    "body,status,needle",
    [
        ({}, 422, "exactly one of input"),
        ({"input": "a", "similarity": ["a", "b"]}, 422, "got input and similarity"),
        ({"pair": ["a"]}, 422, "pair"),
        ({"similarity": ["a", "b", "c"]}, 422, "similarity"),
        ({"input": "a", "granularity": "sentence"}, 422, "granularity"),
        ({"input": "a", "target": "x"}, 422, "classifier's label"),
        ({"input": "a", "model": "ranker"}, 400, "`pair`"),
        ({"input": "x" * 200_000}, 413, "limit is 100000"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_problem(client, body, status, needle):
    r = client.post("/explain", json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
