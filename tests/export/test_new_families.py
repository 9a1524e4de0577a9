"""The newer families (ModernBERT, NomicBERT, EmbeddingGemma, DeBERTa-v3), saved by transformers'
own classes, export through `headwise export --model <folder>` with ONNX Runtime's fused
attention written into the serving graph (export/fused.py), and their bundles reproduce
transformers within 1e-4: embeddings, every layer's and head's attention map, the classifiers'
logits, at a short length and past the local window. The service serves them.

Checkpoints are the tiny random-weight ones of tests/models (std 0.1), with a word-level
tokenizer.json that adds [CLS] … [SEP] as the families' own tokenizers do.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from torch import nn

from export import verify
from export.bundle import build_bundle
from export.cli import main as export_cli
from models.weights import load_pretrained
from service.engine.sessions import build_session
from service.manifest import Manifest
from tests.models import nomic_remote, test_deberta, test_gemma, test_modernbert, test_nomic
from tests.models.checkpoints import batch, real_rows, save_checkpoint, write_st_modules

TOLERANCE = 1e-4
VOCAB = 100
CLS, SEP = 2, 3
# Words per text (the tokenizer adds [CLS] and [SEP]): the long ones reach past every tiny
# model's local window (4 keys either side) and DeBERTa's exact buckets (4).
WORDS = {"short": [4, 2, 0], "long": [22, 15, 7]}
# EmbeddingGemma's prompts (config_sentence_transformers.json), a few of them.
GEMMA_PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "Clustering": "task: clustering | query: ",
}
NO_CACHE = {"use_cache": False}


def write_tokenizer(folder: Path) -> None:
    """Word-level, w4 … w99 are ids 4 … 99; "[CLS] $A [SEP]" and "[CLS] $A [SEP] $B [SEP]"."""
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": CLS, "[SEP]": SEP}
    vocab |= {f"w{i}": i for i in range(4, VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)],
    )
    tok.save(str(folder / "tokenizer.json"))


def texts(words: list[int], seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [
        " ".join(f"w{int(i)}" for i in torch.randint(4, VOCAB, (n,), generator=g)) for n in words
    ]


def dense_folder(folder: Path, sizes: list[tuple[int, int]]) -> None:
    """EmbeddingGemma's pipeline on a checkpoint: mean pooling, linear Dense modules of `sizes`,
    Normalize, and its prompts."""
    from sentence_transformers.models import Dense

    torch.manual_seed(1)
    paths = []
    for i, (n_in, n_out) in enumerate(sizes):
        path = f"{i + 2}_Dense"
        dense = Dense(n_in, n_out, bias=False, activation_function=nn.Identity())
        nn.init.normal_(dense.linear.weight, std=0.1)
        (folder / path).mkdir()
        dense.save(str(folder / path))
        paths.append(("Dense", path))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling/config.json").write_text(
        json.dumps({"word_embedding_dimension": sizes[0][0], "pooling_mode_mean_tokens": True})
    )
    normalize = ("Normalize", f"{len(sizes) + 2}_Normalize")
    write_st_modules(folder, [("Transformer", ""), ("Pooling", "1_Pooling"), *paths, normalize])
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": GEMMA_PROMPTS, "default_prompt_name": None})
    )


# --- the families: checkpoint, transformers' reference ------------------------------------


@dataclass
class Family:
    name: str  # the manifest's architecture
    model_class: str
    config_class: str
    config: dict
    transformers_kw: dict
    dense: list[tuple[int, int]] | None = None  # EmbeddingGemma's Dense modules

    def save(self, folder: Path, model_class: str | None = None, **extra) -> nn.Module:
        hf = save_checkpoint(
            folder, model_class or self.model_class, self.config_class, **self.config, **extra
        )
        write_tokenizer(folder)
        if self.dense:
            dense_folder(folder, self.dense)
        return hf

    def reference(self, hf: nn.Module, folder: Path, x: dict[str, np.ndarray]):
        """transformers' sentence embedding (mean-pooled, then the Dense modules) and every
        layer's attention probabilities (L, B, h, N, N)."""
        ids, mask = torch.from_numpy(x["input_ids"]), torch.from_numpy(x["attention_mask"])
        with torch.no_grad():
            out = hf(
                input_ids=ids, attention_mask=mask, output_attentions=True, **self.transformers_kw
            )
            m = mask[:, :, None].float()
            pooled = (out.last_hidden_state * m).sum(1) / m.sum(1)
            if self.dense:
                from sentence_transformers.models import Dense

                for i in range(len(self.dense)):
                    dense = Dense.load(str(folder / f"{i + 2}_Dense"))
                    pooled = dense({"sentence_embedding": pooled})["sentence_embedding"]
        return pooled.numpy(), torch.stack(out.attentions).numpy()


FAMILIES = {
    "modernbert": Family(
        "modernbert", "ModernBertModel", "ModernBertConfig", test_modernbert.CONFIG, {}
    ),
    "nomic-bert": Family("nomic-bert", "NomicBertModel", "NomicBertConfig", test_nomic.CONFIG, {}),
    # The last Dense module leaves 32 of d_model's 48: the embedding is not d_model wide.
    "gemma3": Family(
        "gemma3",
        "Gemma3TextModel",
        "Gemma3TextConfig",
        test_gemma.CONFIG,
        NO_CACHE,
        dense=[(48, 96), (96, 32)],
    ),
    "deberta-v2": Family(
        "deberta-v2", "DebertaV2Model", "DebertaV2Config", test_deberta.CONFIG, {}
    ),
}
ROTARY = ("modernbert", "nomic-bert", "gemma3")


def export(folder: Path, out: Path, *flags: str) -> Manifest:
    assert export_cli(["--model", str(folder), "--out", str(out), *flags]) == 0
    return Manifest.model_validate_json((out / "manifest.json").read_text())


def feeds(bundle: Path, manifest: Manifest, items) -> dict[str, np.ndarray]:
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    return verify.encode(tok, items, manifest.inputs, manifest.special_tokens.pad)


@dataclass
class Exported:
    family: Family
    folder: Path
    hf: nn.Module
    bundle: Path
    manifest: Manifest


@pytest.fixture(scope="module", params=list(FAMILIES))
def exported(request, tmp_path_factory) -> Exported:
    family = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    hf = family.save(root / "model")
    return Exported(
        family, root / "model", hf, root / "bundle", export(root / "model", root / "bundle")
    )


def ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


# --- fused, and equal to transformers -------------------------------------------------------


def test_serving_graph_has_ort_fused_attention_per_layer_and_no_softmax(exported):
    layers = exported.manifest.num_layers
    graph = ops(exported.bundle / "encoder.onnx")
    assert graph.count("MultiHeadAttention") == layers and "Softmax" not in graph
    rotary = 2 * layers if exported.family.name in ROTARY else 0
    assert graph.count("RotaryEmbedding") == rotary  # q and k of every layer
    entry = exported.manifest.graphs["encoder"]
    assert entry.fused and entry.unfused_reason is None
    assert entry.op_counts["MultiHeadAttention"] == layers
    assert "Softmax" in ops(exported.bundle / "attention.onnx")  # the maps' graph stays plain


@pytest.mark.parametrize("length", list(WORDS))
def test_embeddings_and_every_attention_map_equal_transformers(exported, length):
    bundle, manifest = exported.bundle, exported.manifest
    x = feeds(bundle, manifest, texts(WORDS[length]))
    served = build_session(bundle / "encoder.onnx").run(["sentence_embedding"], x)[0]
    emb, attn = build_session(bundle / "attention.onnx").run(None, x)
    want, want_attn = exported.family.reference(exported.hf, exported.folder, x)

    assert np.abs(served - want).max() < TOLERANCE
    assert np.abs(emb - want).max() < TOLERANCE
    assert attn.shape == want_attn.shape  # (L, B, h, N, N): every layer and query head
    mask = torch.from_numpy(x["attention_mask"])
    for ours, theirs in zip(attn, want_attn, strict=True):  # padding queries' rows excepted
        diff = real_rows(torch.from_numpy(ours), mask) - real_rows(torch.from_numpy(theirs), mask)
        assert diff.abs().max() < TOLERANCE


def test_a_left_padded_batch_equals_pytorch_on_it(exported):
    """The raw mask goes into MultiHeadAttention as is: padding on the left is masked as on the
    right. (Rotary positions count from the first column, as in transformers: a left-padded
    text is not at the positions it would have alone.)"""
    ids, mask = batch(WORDS["long"], "left")
    session = build_session(exported.bundle / "encoder.onnx")
    x = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    served = session.run(["sentence_embedding"], x)[0]
    with torch.no_grad():
        want, _ = load_pretrained(exported.folder).model(ids, mask)
    assert np.abs(served - want.numpy()).max() < TOLERANCE


def test_encode_serves_the_bundle_graphs_embeddings(exported):
    from tests.service.conftest import client_for

    inputs = texts(WORDS["long"] + WORDS["short"], seed=3)
    x = feeds(exported.bundle, exported.manifest, inputs)
    want = build_session(exported.bundle / "encoder.onnx").run(["sentence_embedding"], x)[0]
    if exported.manifest.normalize:
        want = want / np.linalg.norm(want, axis=-1, keepdims=True)
    with client_for(exported.bundle) as c:
        r = c.post("/encode", json={"inputs": inputs})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["dimensions"] == exported.manifest.dimensions == want.shape[1]
    np.testing.assert_allclose(np.array(body["embeddings"]), want, atol=1e-5)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_fp16_and_int8_graphs_keep_the_fused_attention(name, tmp_path):
    """int8 quantises the projections around MultiHeadAttention; fp16 keeps Gemm in float32
    (ORT's CPU session crashes on DeBERTa's float16 Gemm of constants)."""
    FAMILIES[name].save(tmp_path / "model")
    manifest = export(
        tmp_path / "model", tmp_path / "bundle", "--fp16", "--int8", "--int8-pairs", "0"
    )
    layers = manifest.num_layers
    for key in ("encoder_fp16", "encoder_int8"):
        entry = manifest.graphs[key]
        assert entry.fused and entry.op_counts["MultiHeadAttention"] == layers
        assert "Softmax" not in entry.op_counts
    assert manifest.graphs["encoder_fp16"].parity.min_cosine >= verify.FP16_MIN_COSINE
    assert manifest.graphs["encoder_int8"].op_counts.get("MatMulInteger", 0) > 0


# --- the manifest --------------------------------------------------------------------------


def test_manifest_names_the_family_its_heads_and_its_embedding_size(exported):
    m, cfg = exported.manifest, load_pretrained(exported.folder).config
    assert (m.architecture, m.task) == (exported.family.name, "embed")
    assert (m.num_layers, m.num_heads, m.d_model, m.head_dim) == (
        cfg.n_layers,
        cfg.n_heads,
        cfg.d_model,
        cfg.d_k,
    )
    assert m.dimensions == cfg.embedding_dim
    assert m.max_length == cfg.max_length  # no tokenizer or sentence-transformers limit here


def test_embeddinggemma_manifest_has_its_heads_dense_size_pooling_and_prompts(tmp_path):
    family = FAMILIES["gemma3"]
    family.save(tmp_path / "model")
    m = export(tmp_path / "model", tmp_path / "bundle")
    assert (m.num_heads, m.head_dim, m.d_model) == (4, 16, 48)  # 4 × 16 != 48
    assert (m.output_dim, m.dimensions) == (32, 32)  # the last Dense module's out_features
    assert (m.pooling, m.normalize) == ("mean", True)
    assert m.prompts == GEMMA_PROMPTS and m.default_prompt_name is None


def test_max_length_is_the_least_of_positions_tokenizer_and_sentence_transformers(tmp_path):
    folder = tmp_path / "model"
    FAMILIES["modernbert"].save(folder)  # 128 positions
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 40}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}))
    assert export(folder, tmp_path / "a").max_length == 40
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 30}))
    assert export(folder, tmp_path / "b").max_length == 30
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 10**30}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8192}))
    assert export(folder, tmp_path / "c").max_length == 128
    assert export(folder, tmp_path / "d", "--max-length", "50").max_length == 50


def test_nomic_prompts_come_from_its_checkpoint_and_are_never_invented(tmp_path):
    folder = tmp_path / "model"
    FAMILIES["nomic-bert"].save(folder)
    assert export(folder, tmp_path / "plain").prompts == {}
    prompts = {"search_query": "search_query: ", "search_document": "search_document: "}
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    assert export(folder, tmp_path / "prompted").prompts == prompts


# --- the remote NomicBERT dialect and the classifiers ----------------------------------------


def test_nomic_remote_dialect_exports_fused_and_equals_the_remote_codes_math(tmp_path):
    """Partial rotary (half of d_k, RotaryEmbedding's rotary_embedding_dim), biases, and NTK
    scaling past the 16 trained positions, recomputed by the graph for every length."""
    cfg = nomic_remote.remote_config(**test_nomic.REMOTE_FEATURES)
    state = nomic_remote.random_state(cfg)
    folder = nomic_remote.save_remote(tmp_path / "model", cfg, state)
    write_tokenizer(folder)
    manifest = export(folder, tmp_path / "bundle")
    assert ops(tmp_path / "bundle" / "encoder.onnx").count("RotaryEmbedding") == 6
    session = build_session(tmp_path / "bundle" / "encoder.onnx")
    for length in WORDS.values():
        x = feeds(tmp_path / "bundle", manifest, texts(length))
        served = session.run(["sentence_embedding"], x)[0]
        ids, mask = torch.from_numpy(x["input_ids"]), torch.from_numpy(x["attention_mask"])
        hidden, _ = nomic_remote.reference(cfg, state, ids, mask)
        m = mask[:, :, None].float()
        want = ((hidden * m).sum(1) / m.sum(1)).numpy()
        assert np.abs(served - want).max() < TOLERANCE


PAIRS = [("w5 w6 w7", "w8 w9"), ("w10", "w11 w12 w13 w14 " * 6), ("", "w15"), ("w4 " * 20, "w20")]
HEADS = {
    "modernbert": ("ModernBertForSequenceClassification", {"classifier_pooling": "mean"}),
    "deberta-v2": ("DebertaV2ForSequenceClassification", {}),
}


@pytest.mark.parametrize("labels", [1, 3])
@pytest.mark.parametrize("name", list(HEADS))
def test_classifier_bundle_logits_equal_transformers(name, labels, tmp_path):
    model_class, extra = HEADS[name]
    hf = FAMILIES[name].save(tmp_path / "model", model_class, num_labels=labels, **extra)
    manifest = export(tmp_path / "model", tmp_path / "bundle")
    assert manifest.task == ("rerank" if labels == 1 else "classify")
    assert manifest.output_dim == labels and manifest.graphs["encoder"].fused
    x = feeds(tmp_path / "bundle", manifest, PAIRS)
    (logits,) = build_session(tmp_path / "bundle" / "encoder.onnx").run(None, x)
    with torch.no_grad():
        want = hf(
            input_ids=torch.from_numpy(x["input_ids"]),
            attention_mask=torch.from_numpy(x["attention_mask"]),
        ).logits.numpy()
    assert np.abs(logits - want).max() < TOLERANCE
    attn_logits, _ = build_session(tmp_path / "bundle" / "attention.onnx").run(None, x)
    assert np.abs(attn_logits - want).max() < TOLERANCE


# --- what cannot fuse, and what is refused ---------------------------------------------------


def test_attention_ort_cannot_fuse_ships_unfused_with_the_reason_and_no_flag(tmp_path):
    """Soft-capped scores (cap · tanh(s / cap)) have no ORT kernel: the bundle is written with
    the unfused serving graph, marked fused=false with the missing op and why."""
    folder = tmp_path / "model"
    FAMILIES["gemma3"].save(folder)
    loaded = load_pretrained(folder)
    cfg = loaded.config.replace(attn_softcap=5.0)
    capped = type(loaded.model)(cfg).eval()
    capped.load_state_dict(loaded.model.state_dict())
    loaded.model, loaded.config = capped, cfg

    manifest = build_bundle(loaded, tmp_path / "bundle")
    entry = manifest.graphs["encoder"]
    assert entry.fused is False
    assert "soft-capping" in entry.unfused_reason and "MultiHeadAttention" in entry.unfused_reason
    assert "Softmax" in entry.op_counts and "MultiHeadAttention" not in entry.op_counts
    assert entry.parity.min_cosine >= verify.FP32_MIN_COSINE


def test_an_unsupported_family_is_refused_naming_it_and_the_supported_ones(tmp_path, caplog):
    folder = tmp_path / "model"
    FAMILIES["modernbert"].save(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
    assert export_cli(["--model", str(folder), "--out", str(tmp_path / "b")]) == 1
    assert "unsupported model_type 'qwen2'" in caplog.text
    for supported in ("modernbert", "nomic_bert", "gemma3_text", "deberta-v2", "bert"):
        assert f"'{supported}'" in caplog.text
    assert not (tmp_path / "b").exists()
    shutil.rmtree(folder)


def test_attention_on_modernbert_draws_the_band_of_its_local_layers(tmp_path):
    """/attention on a ModernBERT bundle: a local layer's probabilities outside its window are
    exactly 0, a global layer's are not."""
    from tests.service.conftest import client_for

    family = FAMILIES["modernbert"]
    family.save(tmp_path / "model")
    export(tmp_path / "model", tmp_path / "bundle")
    every = test_modernbert.CONFIG["global_attn_every_n_layers"]
    half = test_modernbert.CONFIG["local_attention"] // 2
    (text,) = texts([22], seed=5)
    with client_for(tmp_path / "bundle") as c:
        r = c.post("/attention", json={"input": text, "encoding_format": "base64_f32"})
    assert r.status_code == 200, r.text
    from service.pipelines.attention.encoding import decode_maps

    maps = decode_maps(r.json()["attentions"])  # (L, h, n, n)
    n = maps.shape[-1]
    far = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) > half
    for layer, head_maps in enumerate(maps):
        outside = head_maps[:, far]
        if layer % every == 0:
            assert outside.max() > 0, layer  # global: every key is seen
        else:
            assert (outside == 0).all(), layer  # local: exactly 0 outside the band
