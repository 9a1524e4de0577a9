"""Long documents as chunks on /encode: late chunking equals transformers' token states of one
pass restricted to each chunk; every character is in a chunk; windows past the model's length;
separate chunks equal /encode of their text; bad chunking is a 422."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from service.pipelines.chunking import Chunk, plan, windows
from tests.conftest import REAL_TEXTS
from tests.service.conftest import client_for

DOC = (
    "The cat sat on a warm mat while rain fell over quiet city streets tonight. "
    "Le chat dort sur le canapé depuis ce matin près de la fenêtre ouverte. "
    "Die Katze schläft auf dem Sofa, während draußen der Regen fällt."
)


@pytest.fixture(scope="module")
def bert(family_tokenizers, tmp_path_factory):
    """A random-weight BertModel saved by transformers, and its bundle (max length 64)."""
    from tests.export.test_architectures import export, save_checkpoint

    tmp = tmp_path_factory.mktemp("chunking")
    folder = save_checkpoint(tmp / "bert", "bert", family_tokenizers["wordpiece"])
    export(folder, tmp / "bundle")
    return folder, tmp / "bundle"


def transformers_states(folder, text: str) -> tuple[np.ndarray, list]:
    """One forward pass of transformers' BertModel over the whole text: (N, d), encoding."""
    from tests.export.test_architectures import transformers_model

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    enc = tok.encode(text)
    model = transformers_model(folder, "AutoModel")
    with torch.no_grad():
        out = model(input_ids=torch.tensor([enc.ids]), attention_mask=torch.ones(1, len(enc.ids), dtype=torch.long))
    return out.last_hidden_state[0].numpy(), enc


def test_late_chunks_equal_one_transformers_pass_restricted_to_each_chunk(bert):
    folder, bundle = bert
    states, enc = transformers_states(folder, DOC)
    with client_for(bundle) as c:
        r = c.post("/encode", json={"inputs": DOC, "chunking": {"strategy": "late", "size": 14}})
    assert r.status_code == 200, r.text
    chunks = r.json()["chunks"][0]
    assert len(chunks) >= 3
    content = [i for i, s in enumerate(enc.special_tokens_mask) if not s]
    for k, chunk in enumerate(chunks):
        rows = content[14 * k : 14 * (k + 1)]
        want = states[rows].mean(0)
        want = want / np.linalg.norm(want)
        np.testing.assert_allclose(chunk["embedding"], want, atol=1e-4)


def test_separate_chunks_equal_encode_of_their_text(bert):
    _, bundle = bert
    with client_for(bundle) as c:
        r = c.post("/encode", json={"inputs": DOC, "chunking": {"strategy": "separate", "size": 10, "overlap": 3}})
        chunks = r.json()["chunks"][0]
        texts = [DOC[ch["start"] : ch["stop"]] for ch in chunks]
        want = c.post("/encode", json={"inputs": texts, "normalize": True}).json()["embeddings"]
    np.testing.assert_allclose([ch["embedding"] for ch in chunks], want, atol=1e-5)


def test_a_20000_character_document_on_a_48_token_model_is_covered_whole(tiny_bundle):
    doc = " ".join(REAL_TEXTS[:6]) * 40
    doc = doc[:20_000]
    with client_for(tiny_bundle) as c:
        r = c.post("/encode", json={"inputs": doc, "chunking": {"size": 20, "overlap": 4, "pool": True}})
        assert r.status_code == 200, r.text
        body = r.json()
        tok = Tokenizer.from_file(str(tiny_bundle / "tokenizer.json"))
    tok.no_truncation()
    enc = tok.encode(doc)
    boundaries = {0, len(doc)} | {a for a, _ in enc.offsets} | {b for _, b in enc.offsets}
    chunks = body["chunks"][0]
    covered = np.zeros(len(doc), dtype=bool)
    for ch in chunks:
        assert ch["start"] in boundaries and ch["stop"] in boundaries  # on token boundaries
        covered[ch["start"] : ch["stop"]] = True
    assert covered.all()
    assert [ch["start"] for ch in chunks] == sorted(ch["start"] for ch in chunks)
    assert len(body["embeddings"]) == 1 and abs(np.linalg.norm(body["embeddings"][0]) - 1) < 1e-5
    assert body["tokens"][0] > 48  # it ran as several windows


def test_given_character_spans_are_snapped_to_tokens(bert):
    _, bundle = bert
    start = DOC.index("Le chat")
    with client_for(bundle) as c:
        r = c.post("/encode", json={"inputs": DOC, "chunks": [[0, 10], [start + 2, start + 12]]})
    assert r.status_code == 200, r.text
    a, b = r.json()["chunks"][0]
    assert (a["start"], a["stop"]) == (0, DOC.index("sat") + 3)
    # " chat dort" from the space before chat: the tokens it holds are "chat" and "dort".
    assert (b["start"], b["stop"]) == (start + 3, start + 12)


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"chunking": {"size": 500}}, 422, "chunking.size"),
        ({"chunking": {"size": 8, "overlap": 8}}, 422, "overlap"),
        ({"chunking": {"size": 8}, "chunks": [[0, 3]]}, 422, "not both"),
        ({"chunks": [[5, 3]]}, 422, "not a span"),
        ({"chunking": {"strategy": "late"}}, 422, "size"),
    ],
)
def test_bad_chunking_is_a_422_naming_it(tiny_bundle, body, status, needle):
    with client_for(tiny_bundle) as c:
        r = c.post("/encode", json={"inputs": DOC, **body})
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text


def test_windows_hold_every_chunk_whole():
    spans = windows(1000, 510, 100)
    assert spans[0][0] == 0 and spans[-1][1] == 1000 and all(b - a <= 510 for a, b in spans)
    for first in range(0, 900, 7):
        assert any(a <= first and first + 100 <= b for a, b in spans)


def test_plan_covers_the_text_on_token_boundaries(family_tokenizers):
    tok = Tokenizer.from_file(str(family_tokenizers["wordpiece"]))
    text = "  the cat sat   on a warm mat  "
    chunks = plan(text, tok.encode(text), 2, 0, None)
    assert chunks[0].start == 0 and chunks[-1].stop == len(text)
    assert all(isinstance(c, Chunk) and c.tokens <= 2 for c in chunks)
    assert all(a.stop >= b.start for a, b in zip(chunks, chunks[1:], strict=False))
