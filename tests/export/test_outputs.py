"""Models with sparse and multi-vector outputs export through the CLI and serve, through
/encode and TEI's /embed_sparse, what their own libraries compute: within 1e-4 of

- FlagEmbedding's bge-m3 (dense, lexical weights, ColBERT vectors), its formulas written out
  below from FlagEmbedding 1.4's M3 inference code over transformers' XLMRobertaModel;
- sentence-transformers' SparseEncoder (SPLADE), itself, and SpladePooling's formula over
  transformers' BertForMaskedLM for a bare masked-LM checkpoint (--task sparse);
- PyLate's ColBERT, its tokenisation and encode() written out below from PyLate 1.6's source
  over transformers' BertModel: markers, lengths, query expansion with [MASK], the skiplist.

Checkpoints: tests/export/output_checkpoints.py (random weights, tiny).
"""

from __future__ import annotations

import json
import string
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForMaskedLM, PreTrainedTokenizerFast

from service.manifest import Manifest
from tests.export.output_checkpoints import (
    COLBERT_DIM,
    colbert_checkpoint,
    m3_checkpoint,
    splade_checkpoint,
)
from tests.export.test_architectures import TEXTS, export
from tests.service.conftest import client_for

TOLERANCE = 1e-4
DOCUMENTS = [t for t in TEXTS if t.strip()] + ["Hello, world! (a test); yes?", "?!"]
QUERIES = ["the cat", "where does the cat sleep?", "кошка спит", "a " * 40, "!"]


def served(bundle: Path, **body) -> dict:
    with client_for(bundle) as c:
        r = c.post("/encode", json=body)
        assert r.status_code == 200, r.text
        return r.json()


# --- bge-m3 -----------------------------------------------------------------------------


def flagembedding_m3(folder: Path, texts: list[str], max_length: int):
    """FlagEmbedding's BGEM3FlagModel.encode(return_dense, return_sparse, return_colbert_vecs):
    EncoderOnlyEmbedderM3ModelForInference with cls pooling and normalize_embeddings=True."""
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        cls_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
    )  # fmt: skip
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    sparse_linear = torch.nn.Linear(32, 1)
    sparse_linear.load_state_dict(torch.load(folder / "sparse_linear.pt", weights_only=True))
    colbert_state = torch.load(folder / "colbert_linear.pt", weights_only=True)
    colbert_linear = torch.nn.Linear(32, colbert_state["weight"].shape[0])
    colbert_linear.load_state_dict(colbert_state)
    inputs = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        last_hidden_state = model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
        ).last_hidden_state
        dense_vecs = F.normalize(last_hidden_state[:, 0], dim=-1)  # _dense_embedding, "cls"
        token_weights = torch.relu(sparse_linear(last_hidden_state))  # _sparse_embedding
        colbert_vecs = colbert_linear(last_hidden_state[:, 1:])  # _colbert_embedding
        colbert_vecs = colbert_vecs * inputs["attention_mask"][:, 1:][:, :, None].float()
        colbert_vecs = F.normalize(colbert_vecs, dim=-1)

    def _process_token_weights(token_weights: np.ndarray, input_ids: list):
        result: dict[str, float] = defaultdict(int)
        unused_tokens = set()
        for _token in ["cls_token", "eos_token", "pad_token", "unk_token"]:
            if _token in tok.special_tokens_map:
                unused_tokens.add(tok.convert_tokens_to_ids(tok.special_tokens_map[_token]))
        for w, idx in zip(token_weights, input_ids, strict=True):
            if idx not in unused_tokens and w > 0:
                idx = str(idx)
                if w > result[idx]:
                    result[idx] = w
        return result

    def _process_colbert_vecs(colbert_vecs: np.ndarray, attention_mask: list):
        tokens_num = np.sum(attention_mask)
        return colbert_vecs[: tokens_num - 1]

    lexical = [
        _process_token_weights(w, ids)
        for w, ids in zip(token_weights.squeeze(-1).numpy(), inputs["input_ids"].tolist(), strict=True)
    ]
    colbert = [
        _process_colbert_vecs(v, m)
        for v, m in zip(colbert_vecs.numpy(), inputs["attention_mask"].numpy(), strict=True)
    ]
    return dense_vecs.numpy(), lexical, colbert


@pytest.fixture(scope="module")
def m3(family_tokenizers, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("m3")
    folder = m3_checkpoint(tmp / "bge-m3-tiny", family_tokenizers["unigram"])
    return folder, tmp / "bundle", export(folder, tmp / "bundle")


def test_bge_m3_exports_three_outputs_from_its_flagembedding_files(m3):
    folder, bundle, manifest = m3
    assert manifest.outputs == ["dense", "sparse", "multi_vector"]
    assert manifest.pooling == "cls" and manifest.normalize
    assert manifest.sparse is not None and manifest.sparse.kind == "token_weights"
    assert manifest.sparse.dropped_ids == [0, 1, 2, 3]  # <s> <pad> </s> <unk>
    mv = manifest.multi_vector
    assert mv is not None and mv.dim == COLBERT_DIM and mv.skip_first
    graph = manifest.graphs["encoder"]
    assert graph.fused and set(graph.output_parity) == {"sparse_weights", "colbert_vectors"}
    assert all(p.max_abs_diff < TOLERANCE for p in graph.output_parity.values())


def test_bge_m3_serves_flagembeddings_dense_lexical_and_colbert_outputs(m3):
    folder, bundle, manifest = m3
    dense, lexical, colbert = flagembedding_m3(folder, DOCUMENTS, manifest.max_length)
    body = served(bundle, inputs=DOCUMENTS, outputs=["dense", "sparse", "multi_vector"])
    np.testing.assert_allclose(body["embeddings"], dense, atol=TOLERANCE)
    worst = 0.0
    for got, want in zip(body["sparse"], lexical, strict=True):
        assert [e["index"] for e in got] == sorted(int(k) for k in want)
        for e in got:
            worst = max(worst, abs(e["value"] - want[str(e["index"])]))
    for got, want in zip(body["multi_vector"], colbert, strict=True):
        assert np.shape(got) == want.shape
        worst = max(worst, float(np.abs(np.array(got) - want).max()))
    print(f"bge-m3 vs FlagEmbedding: max |diff| {worst:.2e} (lexical weights, colbert vectors)")
    assert worst <= TOLERANCE


def test_bge_m3_on_teis_embed_sparse_answers_its_lexical_weights(m3):
    folder, bundle, manifest = m3
    _, lexical, _ = flagembedding_m3(folder, DOCUMENTS[:3], manifest.max_length)
    with client_for(bundle) as c:
        r = c.post("/embed_sparse", json={"inputs": DOCUMENTS[:3]})
    assert r.status_code == 200
    for got, want in zip(r.json(), lexical, strict=True):
        assert {str(e["index"]): e["value"] for e in got} == pytest.approx(dict(want), abs=TOLERANCE)
        assert all(set(e) == {"index", "value"} for e in got)


def test_bge_m3_without_sentence_transformers_files_pools_as_flagembedding(family_tokenizers, tmp_path):
    folder = m3_checkpoint(tmp_path / "bare", family_tokenizers["unigram"])
    (folder / "modules.json").unlink()  # FlagEmbedding reads none of these: cls, normalised
    manifest = export(folder, tmp_path / "bundle")
    assert manifest.pooling == "cls" and manifest.normalize and len(manifest.outputs) == 3


def test_one_m3_head_without_the_other_is_refused_by_name(family_tokenizers, tmp_path):
    from export.cli import main

    folder = m3_checkpoint(tmp_path / "half", family_tokenizers["unigram"])
    (folder / "colbert_linear.pt").unlink()
    assert main(["--model", str(folder), "--out", str(tmp_path / "b")]) == 1
    assert not (tmp_path / "b").exists()


# --- SPLADE -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def splade(family_tokenizers, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("splade")
    folder = splade_checkpoint(tmp / "splade-tiny", family_tokenizers["wordpiece"])
    return folder, tmp / "bundle", export(folder, tmp / "bundle")


def test_splade_exports_from_its_sparse_encoder_modules(splade):
    folder, bundle, manifest = splade
    assert manifest.outputs == ["sparse"] and manifest.multi_vector is None
    assert manifest.sparse is not None and manifest.sparse.kind == "vocabulary"
    ops = manifest.graphs["encoder"].op_counts
    assert ops.get("Attention") == 2  # fused, the MLM head and pooling beside it


def test_splade_serves_what_sentence_transformers_sparse_encoder_computes(splade):
    from sentence_transformers import SparseEncoder

    folder, bundle, manifest = splade
    reference = SparseEncoder(str(folder), device="cpu")
    want = reference.encode(DOCUMENTS, convert_to_tensor=True).to_dense().numpy()
    body = served(bundle, inputs=DOCUMENTS)  # its one output by default
    assert body["outputs"] == ["sparse"] and "embeddings" not in body
    got = np.zeros_like(want)
    for row, entries in zip(got, body["sparse"], strict=True):
        row[[e["index"] for e in entries]] = [e["value"] for e in entries]
    diff = float(np.abs(got - want).max())
    print(f"SPLADE vs SparseEncoder: max |diff| {diff:.2e} over {want.shape}")
    assert diff <= TOLERANCE * max(1.0, float(np.abs(want).max()))
    assert ((got > 0) == (want > 0)).all()  # the same nonzero entries


def test_a_bare_masked_lm_exports_as_splade_with_task_sparse(family_tokenizers, tmp_path):
    folder = splade_checkpoint(tmp_path / "mlm", family_tokenizers["wordpiece"], modules=False)
    manifest = export(folder, tmp_path / "bundle", "--task", "sparse")
    assert manifest.outputs == ["sparse"]
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), pad_token="[PAD]")
    mlm = AutoModelForMaskedLM.from_pretrained(folder, attn_implementation="eager").eval()
    inputs = tok(DOCUMENTS, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        logits = mlm(**inputs).logits  # SpladePooling: max_t log(1 + relu(m_t * logits_t))
    want = torch.log1p(torch.relu(logits * inputs["attention_mask"][:, :, None])).amax(1).numpy()
    with client_for(tmp_path / "bundle") as c:
        rows = c.post("/embed_sparse", json={"inputs": DOCUMENTS}).json()
    got = np.zeros_like(want)
    for row, entries in zip(got, rows, strict=True):
        row[[e["index"] for e in entries]] = [e["value"] for e in entries]
    assert float(np.abs(got - want).max()) <= TOLERANCE * max(1.0, float(want.max()))


def test_a_dense_model_still_exports_dense_only_and_refuses_task_sparse_without_a_head(
    family_tokenizers, tmp_path
):
    from tests.export.test_architectures import save_checkpoint

    folder = save_checkpoint(tmp_path / "modernish", "bert", family_tokenizers["wordpiece"])
    manifest = export(folder, tmp_path / "dense")
    assert manifest.outputs == ["dense"] and manifest.sparse is None
    from export.cli import main

    assert main(["--model", str(folder), "--out", str(tmp_path / "s"), "--task", "sparse"]) == 1


# --- ColBERT (PyLate) --------------------------------------------------------------------


def pylate_encode(folder: Path, texts: list[str], is_query: bool) -> list[np.ndarray]:
    """PyLate's ColBERT.encode(texts, is_query) as its source does it: tokenize() (prefix id
    inserted after the first token, max_length - 1 before it, queries padded to query_length
    with [MASK] as the pad token), the Transformer and Dense modules, then the masks (a
    query's every position with expansion, a document's tokens not in the skiplist) and
    normalize_embeddings."""
    config = json.loads((folder / "config_sentence_transformers.json").read_text())
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    )  # fmt: skip
    tok.pad_token_id = tok.mask_token_id  # "If it is a MLM model, use the MASK token"
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    weight = load_file(str(folder / "1_Dense" / "model.safetensors"))["linear.weight"]
    prefix = config["query_prefix"] if is_query else config["document_prefix"]
    prefix_id = tok.convert_tokens_to_ids(prefix)
    max_length = config["query_length"] if is_query else config["document_length"]
    expansion = config.get("do_query_expansion", True)
    padding = "max_length" if is_query and expansion else True
    out = tok(texts, padding=padding, truncation=True, max_length=max_length - 1, return_tensors="pt")
    ids, mask = out["input_ids"], out["attention_mask"]
    ids = torch.cat([ids[:, :1], torch.full((len(ids), 1), prefix_id), ids[:, 1:]], dim=1)
    mask = torch.cat([mask[:, :1], torch.ones(len(ids), 1, dtype=mask.dtype), mask[:, 1:]], dim=1)
    if is_query and config.get("attend_to_expansion_tokens", False):
        mask.fill_(1)
    with torch.no_grad():
        token_embeddings = model(input_ids=ids, attention_mask=mask).last_hidden_state @ weight.T
    if not is_query:
        skiplist = [tok.convert_tokens_to_ids(w) for w in config.get("skiplist_words", string.punctuation)]
        keep = mask.bool() & ~torch.isin(ids, torch.tensor(skiplist))
    elif expansion:
        keep = torch.ones_like(ids, dtype=torch.bool)
    else:
        keep = mask.bool()
    return [F.normalize(e[k], p=2, dim=1).numpy() for e, k in zip(token_embeddings, keep, strict=True)]


def colbert_bundle(family_tokenizers, tmp: Path, **settings) -> tuple[Path, Path, Manifest]:
    folder = colbert_checkpoint(tmp / "colbert-tiny", family_tokenizers["wordpiece"], settings)
    return folder, tmp / "bundle", export(folder, tmp / "bundle")


@pytest.fixture(scope="module")
def colbert(family_tokenizers, tmp_path_factory):
    return colbert_bundle(family_tokenizers, tmp_path_factory.mktemp("colbert"))


def test_colbert_exports_from_pylates_module_files(colbert):
    folder, bundle, manifest = colbert
    mv = manifest.multi_vector
    assert manifest.outputs == ["multi_vector"] and mv is not None and mv.dim == COLBERT_DIM
    assert (mv.query_length, mv.document_length, mv.query_expansion) == (16, 24, True)
    assert mv.query_marker is not None and mv.document_marker == mv.query_marker + 1
    assert manifest.max_length == 24  # the document length
    assert mv.expansion_id == 4 and mv.skip_ids  # [MASK]; punctuation (and [UNK] for the rest)


def compare(got: list, want: list[np.ndarray]) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        assert np.shape(g) == w.shape
        worst = max(worst, float(np.abs(np.array(g) - w).max()) if w.size else 0.0)
    return worst


@pytest.mark.parametrize("kind", ["query", "document"])
def test_colbert_serves_pylates_token_vectors(colbert, kind):
    folder, bundle, manifest = colbert
    texts = QUERIES if kind == "query" else DOCUMENTS
    want = pylate_encode(folder, texts, is_query=kind == "query")
    body = served(bundle, inputs=texts, input_type=kind)
    worst = compare(body["multi_vector"], want)
    print(f"ColBERT {kind} vs PyLate: max |diff| {worst:.2e}")
    assert worst <= TOLERANCE
    default = served(bundle, inputs=texts[:2])  # document, unless asked
    if kind == "document":
        assert compare(default["multi_vector"], want[:2]) <= TOLERANCE


@pytest.mark.parametrize(
    "settings",
    [{"attend_to_expansion_tokens": True}, {"do_query_expansion": False}],
    ids=["attended-expansion", "no-expansion"],
)
def test_colbert_query_expansion_settings_match_pylate(family_tokenizers, tmp_path, settings):
    folder, bundle, _ = colbert_bundle(family_tokenizers, tmp_path, **settings)
    want = pylate_encode(folder, QUERIES, is_query=True)
    body = served(bundle, inputs=QUERIES, input_type="query", encoding_format="base64")
    from service.pipelines.compact import decode

    assert compare([decode(v) for v in body["multi_vector"]], want) <= TOLERANCE


def test_attention_maps_of_a_model_without_a_dense_vector(colbert):
    folder, bundle, _ = colbert
    with client_for(bundle) as c:
        r = c.post("/attention", json={"input": "the cat sat", "layers": [0]})
    assert r.status_code == 200, r.text
    assert "embedding" not in r.json() and len(r.json()["attentions"]) == 1
