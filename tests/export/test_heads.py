"""Corpus head importance (Michel et al. 2019) on a random-weight BERT: the gradient score is the
loss's own derivative (finite differences), a head made useless by construction scores lowest,
scores are normalised as the paper does, ablation equals transformers with the head cut out,
and `headwise heads` writes what it says."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from export import heads
from models.weights import load_pretrained
from service.cli import main as headwise
from tests.models.checkpoints import save_checkpoint
from tests.models.test_head_gates import BERT

USELESS = (1, 2)  # layer, head


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(f"w{rng.randrange(2, 100)}" for _ in range(words))


def pairs(count: int, seed: int = 0) -> heads.Corpus:
    """Each query's positive repeats half its words: a task the in-batch loss can tell apart."""
    rng = random.Random(seed)
    queries, documents = [], []
    for _ in range(count):
        q = sentence(rng, rng.randrange(3, 8))
        queries.append(q)
        documents.append(" ".join(q.split()[::2]) + " " + sentence(rng, rng.randrange(2, 9)))
    return heads.Corpus(queries, documents)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("heads") / "bert"
    hf = save_checkpoint(folder, "BertModel", "BertConfig", **BERT)
    return folder, hf


def without_head(loaded, layer: int, head: int):
    """The useless head: its d_k columns of W_O zeroed, so its output never reaches anything."""
    attn = loaded.model.encoder.layers[layer].attn
    with torch.no_grad():
        attn.out_proj.weight[:, head * attn.d_k : (head + 1) * attn.d_k] = 0.0
    return loaded


def test_the_gradient_score_is_the_losss_derivative_by_finite_differences(checkpoint):
    loaded = load_pretrained(checkpoint[0])
    corpus = pairs(12)
    encode = heads.Encoder(loaded)
    raw = heads.gradient_importance(encode, corpus, batch_size=len(corpus))  # one batch

    def loss(layer: int, head: int, gate: float) -> float:
        g = torch.ones(encode.layers, encode.heads)
        g[layer, head] = gate
        with torch.no_grad():
            return float(
                heads.contrastive_loss(encode(corpus.texts, g), encode(corpus.documents, g))
            )

    eps = 1e-2
    for layer, head in ((0, 0), (1, 3), (0, 2)):
        fd = abs(loss(layer, head, 1 + eps) - loss(layer, head, 1 - eps)) / (2 * eps)
        assert raw[layer, head] == pytest.approx(fd, rel=2e-2, abs=1e-5)
    assert raw.min() > 0


def test_a_head_made_useless_scores_lowest_and_scores_are_normalised_per_layer(checkpoint):
    loaded = without_head(load_pretrained(checkpoint[0]), *USELESS)
    scores = heads.head_importance(loaded, pairs(40), batch_size=8)
    raw, importance = np.asarray(scores.raw), np.asarray(scores.importance)
    assert raw[USELESS] == 0.0 and np.delete(raw.ravel(), 1 * 4 + 2).min() > 0
    assert scores.ranked()[0] == USELESS and importance[USELESS] == 0.0
    per_layer = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    want = (per_layer - per_layer.min()) / (per_layer.max() - per_layer.min())
    np.testing.assert_allclose(importance, want, atol=1e-12)
    assert importance.max() == 1.0 and scores.method == "gradient" and scores.examples == 40


def test_normalise_divides_each_layer_by_its_l2_norm_then_spans_zero_to_one():
    raw = np.array([[3.0, 4.0], [1.0, 0.0]])  # layer norms 5 and 1
    np.testing.assert_allclose(heads.normalise(raw), [[0.6, 0.8], [1.0, 0.0]])


def test_ablation_over_texts_equals_transformers_with_the_head_cut_out(checkpoint):
    folder, hf = checkpoint
    corpus = heads.Corpus([c for c in pairs(6).texts])
    scores = heads.head_importance(load_pretrained(folder), corpus, batch_size=4)
    assert scores.method == "ablation"
    encoder = heads.Encoder(load_pretrained(folder))
    enc = encoder.tokenizer.encode_batch(corpus.texts)
    n = max(len(e.ids) for e in enc)
    ids = torch.tensor([e.ids + [0] * (n - len(e.ids)) for e in enc])
    mask = torch.tensor([[1] * len(e.ids) + [0] * (n - len(e.ids)) for e in enc])

    def embed(model) -> torch.Tensor:
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return torch.nn.functional.normalize(pooled, dim=-1)

    whole = embed(hf)
    d_k = BERT["hidden_size"] // BERT["num_attention_heads"]
    for layer, head in ((0, 1), (1, 3)):
        cut = type(hf)(hf.config).eval()
        cut.load_state_dict(hf.state_dict())
        dense = cut.encoder.layer[layer].attention.output.dense
        with torch.no_grad():
            dense.weight[:, head * d_k : (head + 1) * d_k] = 0.0
        want = float((1 - (embed(cut) * whole).sum(-1)).mean())
        assert scores.raw[layer][head] == pytest.approx(want, abs=1e-5)
        assert want > 1e-4


def test_the_command_writes_json_and_a_png_grid(checkpoint, tmp_path, caplog):
    corpus = pairs(16)
    path = tmp_path / "pairs.jsonl"
    lines = [
        json.dumps({"query": q, "positive": d})
        for q, d in zip(corpus.texts, corpus.documents or [], strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert (
        headwise(["heads", "--model", str(checkpoint[0]), "--pairs", str(path), "--out", str(out)])
        == 0
    )
    scores = json.loads((out / "heads.json").read_text())
    assert (scores["layers"], scores["heads"], scores["examples"]) == (2, 4, 16)
    assert np.asarray(scores["importance"]).shape == (2, 4)
    png = (out / "heads.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (4 * 26 + 2, 2 * 26 + 2)  # a cell per head, a row per layer


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"query": "a"}\n', "expected a pair"),
        ('{"query": "a", "positive": "b"}\n"a text"\n', "mixes pairs and plain texts"),
        ("not json\n", "not JSON"),
        ("\n", "no examples"),
    ],
)
def test_a_bad_corpus_is_refused_naming_the_line(tmp_path, content, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=needle):
        heads.read_corpus(path)


def test_a_reranker_is_refused_with_what_it_is(tmp_path):
    folder = tmp_path / "ranker"
    save_checkpoint(folder, "BertForSequenceClassification", "BertConfig", num_labels=1, **BERT)
    with pytest.raises(ValueError, match="rerank model: corpus head importance is for embedding"):
        heads.Encoder(load_pretrained(folder))
