"""Qwen3 decoders export through `headwise export` with ONNX Runtime's fused attention and equal
their references within 1e-4: an embedder (sentence-transformers' own pipeline, its prompt and
its truncation), a Qwen3ForCausalLM reranker (its model card's P(yes)), a sequence classifier
(transformers' logits). The manifest carries the instruction format and the rerank template.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from tokenizers import Tokenizer

from export import verify
from export.templates import QWEN3_RERANKER, instruction_format
from service.engine.sessions import build_session
from service.pipelines.template import PairTemplate, with_tokenizer
from service.tensors import pad_batch
from tests.export.decoders import (
    MAX_LENGTH,
    NO_CACHE,
    QUERY_PROMPT,
    RERANK_MAX_LENGTH,
    card_scores,
    save,
    save_embedder,
    sentence_transformers_reference,
)
from tests.export.test_new_families import export

TOLERANCE = 1e-4
TEXTS = ["the cat sat on a warm mat", "", "le chat dort sur le canapé", "rain fell " * 60]
PAIRS = [
    ("what is the capital of China?", "the cat sat on a warm mat"),
    ("кошка спит", "rain fell over quiet city streets tonight " * 20),  # cut to fit
    ("", "le chat dort"),
    ("yes or no?", ""),
]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-embedder")
    save_embedder(root / "model")
    return root / "model", root / "bundle", export(root / "model", root / "bundle")


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-reranker")
    hf = save(root / "model", "Qwen3ForCausalLM", "reranker")
    return (
        hf,
        root / "model",
        root / "bundle",
        export(root / "model", root / "bundle", "--task", "rerank"),
    )


def ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def serve(bundle, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return build_session(bundle / "encoder.onnx").run(None, feeds)[0]


# --- the embedder --------------------------------------------------------------------------


def test_embedder_serving_graph_is_fused_causal_and_pools_the_last_token(embedder):
    _, bundle, manifest = embedder
    assert (manifest.architecture, manifest.task, manifest.pooling) == (
        "qwen3",
        "embed",
        "lasttoken",
    )
    graph = ops(bundle / "encoder.onnx")
    assert graph.count("MultiHeadAttention") == 2 and graph.count("RotaryEmbedding") == 4
    assert "Softmax" not in graph and manifest.graphs["encoder"].fused


def test_embedder_equals_sentence_transformers_with_its_prompt_and_truncation(embedder):
    """Prompted, cut at the tokenizer's 96 (the appended end token kept), last token, normed."""
    folder, bundle, manifest = embedder
    assert manifest.max_length == MAX_LENGTH  # the least of 256 positions and the tokenizer's
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    texts = [QUERY_PROMPT + t for t in TEXTS]
    encodings = tok.encode_batch(texts)
    assert len(encodings[-1].ids) == MAX_LENGTH and encodings[-1].tokens[-1] == "<|endoftext|>"
    ids, mask = pad_batch([e.ids for e in encodings], manifest.special_tokens.pad)
    got = serve(bundle, {"input_ids": ids, "attention_mask": mask})
    got = got / np.linalg.norm(got, axis=-1, keepdims=True)
    want = sentence_transformers_reference(folder, TEXTS, prompt_name="query")
    assert np.abs(got - want).max() < TOLERANCE


def test_embedder_attention_maps_are_causal_and_equal_transformers(embedder):
    from transformers import Qwen3Model

    folder, bundle, manifest = embedder
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    x = verify.encode(tok, TEXTS[:3], manifest.inputs, manifest.special_tokens.pad)
    _, attn = build_session(bundle / "attention.onnx").run(None, x)
    hf = Qwen3Model.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(
            **{k: torch.from_numpy(v) for k, v in x.items()}, output_attentions=True, **NO_CACHE
        )
    want = torch.stack(out.attentions).numpy()
    real = x["attention_mask"].astype(bool)[None, :, None, :, None]
    assert np.abs(np.where(real, attn - want, 0)).max() < TOLERANCE
    above = np.triu(np.ones(attn.shape[-2:], dtype=bool), 1)
    assert (attn[..., above] == 0).all()


def test_embedder_manifest_has_the_instruction_format_of_its_query_prompt(embedder):
    manifest = embedder[2]
    assert manifest.instruction_format == "Instruct: {instruction}\nQuery:{text}"
    assert manifest.rerank_template is None
    assert manifest.special_tokens.cls is None  # nothing before a text; <|endoftext|> after it
    assert manifest.special_tokens.sep == manifest.special_tokens.pad


def test_instruction_format_is_derived_or_given_or_none():
    assert instruction_format({"query": "Instruct: find it\nQuery: "}) == (
        "Instruct: {instruction}\nQuery: {text}"
    )
    assert instruction_format({"query": "query: "}) is None
    assert instruction_format({}, "Task: {instruction} | {text}") == "Task: {instruction} | {text}"
    with pytest.raises(ValueError, match="must hold"):
        instruction_format({}, "Task: {instruction}")


def test_an_instruction_format_flag_is_written_and_a_bad_one_refused(tmp_path, caplog):
    save_embedder(tmp_path / "model")
    m = export(
        tmp_path / "model", tmp_path / "b", "--instruction-format", "Do {instruction}\\n{text}"
    )
    assert m.instruction_format == "Do {instruction}\n{text}"
    from export.cli import main

    assert main(["--model", str(tmp_path / "model"), "--out", str(tmp_path / "c"),
                 "--instruction-format", "{text}"]) == 1  # fmt: skip
    assert "{instruction}" in caplog.text and not (tmp_path / "c").exists()


# --- the causal LM reranker ----------------------------------------------------------------


def template_feeds(bundle, manifest, pairs, instruction=None):
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    template = PairTemplate(manifest.rerank_template, with_tokenizer(tok), manifest.max_length)
    sequences = template.sequences(pairs, instruction)
    ids, mask = pad_batch([s.ids for s in sequences], manifest.special_tokens.pad)
    return {"input_ids": ids, "attention_mask": mask}, sequences


def test_reranker_manifest_has_the_cards_template_and_answer_tokens(reranker):
    _, folder, bundle, manifest = reranker
    t = manifest.rerank_template
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert (manifest.task, manifest.labels, manifest.output_dim) == ("rerank", ["yes"], 1)
    assert (t.prefix, t.suffix, t.format, t.instruction) == (
        QWEN3_RERANKER.prefix,
        QWEN3_RERANKER.suffix,
        QWEN3_RERANKER.format,
        QWEN3_RERANKER.instruction,
    )
    assert (t.yes_id, t.no_id) == (tok.token_to_id("yes"), tok.token_to_id("no"))
    assert "Softmax" not in ops(bundle / "encoder.onnx")


@pytest.mark.parametrize("instruction", [None, "Judge the French"])
def test_reranker_sigmoid_is_the_cards_p_yes_pair_by_pair_in_one_batch(reranker, instruction):
    """One right-padded batch of pairs (the service's), each scored as the card scores it
    alone: causal attention never looks at the padding after a pair's last token."""
    hf, folder, bundle, manifest = reranker
    feeds, sequences = template_feeds(bundle, manifest, PAIRS, instruction)
    assert [s.truncated for s in sequences] == [False, True, False, False]
    assert max(len(s.ids) for s in sequences) == manifest.max_length == RERANK_MAX_LENGTH
    logits = serve(bundle, feeds)[:, 0]
    want = card_scores(hf, folder, PAIRS, instruction)
    np.testing.assert_allclose(1 / (1 + np.exp(-logits)), want, atol=TOLERANCE)
    _, attn = build_session(bundle / "attention.onnx").run(None, feeds)
    above = np.triu(np.ones(attn.shape[-2:], dtype=bool), 1)
    assert (attn[..., above] == 0).all()


def test_a_template_file_overrides_the_card(tmp_path):
    save(tmp_path / "model", "Qwen3ForCausalLM", "reranker")
    spec = {
        "prefix": "<|im_start|>",
        "suffix": "<|im_end|>",
        "format": "{query} | {document} | {instruction}",
        "instruction": "match?",
        "yes": "no",
        "no": "yes",
    }
    (tmp_path / "t.json").write_text(json.dumps(spec))
    m = export(
        tmp_path / "model",
        tmp_path / "b",
        "--task",
        "rerank",
        "--rerank-template",
        str(tmp_path / "t.json"),
    )
    t = m.rerank_template
    assert (t.prefix, t.format, t.instruction, t.yes, t.no) == (
        "<|im_start|>",
        spec["format"],
        "match?",
        "no",
        "yes",
    )
    tok = Tokenizer.from_file(str(tmp_path / "model" / "tokenizer.json"))
    assert (t.yes_id, t.no_id) == (tok.token_to_id("no"), tok.token_to_id("yes"))


def test_a_causal_lm_without_the_answer_tokens_is_refused_at_export_naming_them(tmp_path, caplog):
    from export.cli import main

    save(tmp_path / "model", "Qwen3ForCausalLM", "reranker")
    spec = {"prefix": "", "suffix": "", "format": "{instruction}{query}{document}",
            "instruction": "", "yes": "ja", "no": "nein"}  # fmt: skip
    (tmp_path / "t.json").write_text(json.dumps(spec))
    args = ["--model", str(tmp_path / "model"), "--out", str(tmp_path / "b"), "--task", "rerank"]
    assert main([*args, "--rerank-template", str(tmp_path / "t.json")]) == 1
    assert "no 'ja' nor 'nein' token" in caplog.text
    assert not (tmp_path / "b").exists()


def test_a_template_for_a_model_that_is_no_causal_lm_reranker_is_refused(tmp_path, caplog):
    from export.cli import main

    save(tmp_path / "model", "Qwen3Model", "reranker")
    (tmp_path / "t.json").write_text(json.dumps({"prefix": "", "suffix": "", "instruction": "",
                                                 "format": "{instruction}{query}{document}"}))  # fmt: skip
    args = ["--model", str(tmp_path / "model"), "--out", str(tmp_path / "b")]
    assert main([*args, "--rerank-template", str(tmp_path / "t.json")]) == 1
    assert "applies to a *ForCausalLM" in caplog.text


# --- the sequence classifier ----------------------------------------------------------------


@pytest.mark.parametrize("labels", [1, 3])
def test_sequence_classifier_logits_equal_transformers_on_tokenizer_pairs(tmp_path, labels):
    hf = save(tmp_path / "model", "Qwen3ForSequenceClassification", "reranker", num_labels=labels)
    manifest = export(tmp_path / "model", tmp_path / "bundle", "--fp16")
    assert manifest.task == ("rerank" if labels == 1 else "classify")
    assert manifest.rerank_template is None and manifest.pooling == "lasttoken"
    tok = Tokenizer.from_file(str(tmp_path / "bundle" / "tokenizer.json"))
    x = verify.encode(tok, PAIRS, manifest.inputs, manifest.special_tokens.pad)
    with torch.no_grad():
        want = hf(**{k: torch.from_numpy(v) for k, v in x.items()}, **NO_CACHE).logits.numpy()
    assert np.abs(serve(tmp_path / "bundle", x) - want).max() < TOLERANCE
    fp16 = build_session(tmp_path / "bundle" / "encoder.fp16.onnx").run(None, x)[0]
    assert np.abs(fp16 - want).max() < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_checkpoint_exports_the_graph_of_its_float32_weights(tmp_path, dtype):
    """The CLI holds a half-precision checkpoint as stored (export/stream.py); its bundle
    computes what the same weights saved in float32 export to."""
    from safetensors.torch import save_file

    from models.weights import read_state_dict

    save_embedder(tmp_path / "half")
    state = {k: v.to(dtype) for k, v in read_state_dict(tmp_path / "half").items()}
    save_file(state, str(tmp_path / "half" / "model.safetensors"))
    shutil.copytree(tmp_path / "half", tmp_path / "wide")
    wide = {k: v.float() for k, v in state.items()}
    save_file(wide, str(tmp_path / "wide" / "model.safetensors"))
    half = export(tmp_path / "half", tmp_path / "half-bundle")
    export(tmp_path / "wide", tmp_path / "wide-bundle")
    x = verify.encode(
        Tokenizer.from_file(str(tmp_path / "half-bundle" / "tokenizer.json")),
        TEXTS,
        half.inputs,
        half.special_tokens.pad,
    )
    got, want = serve(tmp_path / "half-bundle", x), serve(tmp_path / "wide-bundle", x)
    assert np.abs(got - want).max() < 1e-6
    assert half.graphs["encoder"].parity.min_cosine >= verify.FP32_MIN_COSINE
