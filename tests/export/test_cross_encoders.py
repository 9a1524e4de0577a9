"""A *ForSequenceClassification checkpoint becomes a rerank (one label) or classify bundle
whose graph outputs the head's logits, equal to transformers' on pairs, truncated or not."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from tokenizers import Tokenizer

from export.cli import main as export_cli
from service.engine.sessions import build_session
from tests.export.test_architectures import export, feeds, save_checkpoint, transformers_model

PAIRS = [
    ("how do I reset my password?", "Open settings, then choose reset."),
    ("кошка спит", "القطة تنام على الأريكة"),
    ("猫在沙发上睡觉", "the cat sat on a warm mat"),
    ("", "an empty query"),
    ("the cat sat on a warm mat " * 20, "a short document"),  # the query is truncated
    ("a short query", "rain fell over quiet city streets " * 20),  # the document is
    ("the cat sat " * 30, "le chat dort " * 30),  # both sides are
]
NLI = {0: "contradiction", 1: "entailment", 2: "neutral"}


@pytest.fixture(scope="module")
def bert_reranker(family_tokenizers, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ce") / "tiny-bert-reranker"
    save_checkpoint(
        folder, "bert", family_tokenizers["wordpiece"], "ForSequenceClassification", num_labels=1
    )
    return folder


@pytest.fixture(scope="module")
def xlmr_classifier(family_tokenizers, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ce") / "tiny-xlmr-nli"
    save_checkpoint(
        folder,
        "xlm-roberta",
        family_tokenizers["unigram"],
        "ForSequenceClassification",
        id2label=NLI,
        label2id={v: k for k, v in NLI.items()},
    )
    return folder


def transformers_logits(folder, x: dict[str, np.ndarray]) -> np.ndarray:
    model = transformers_model(folder, "AutoModelForSequenceClassification")
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in x.items()}).logits.numpy()


def test_one_label_bert_checkpoint_is_a_reranker_with_token_types(bert_reranker, tmp_path):
    bundle = tmp_path / "bundle"
    manifest = export(bert_reranker, bundle)
    assert (manifest.task, manifest.labels, manifest.output_dim) == ("rerank", ["LABEL_0"], 1)
    assert manifest.inputs == ["input_ids", "attention_mask", "token_type_ids"]
    ops = [n.op_type for n in onnx.load(str(bundle / "encoder.onnx")).graph.node]
    assert ops.count("Attention") == 2 and "Softmax" not in ops

    x = feeds(bundle, manifest, PAIRS)
    assert x["input_ids"].shape[1] == manifest.max_length == 64
    (logits,) = build_session(bundle / "encoder.onnx").run(None, x)
    assert build_session(bundle / "encoder.onnx").get_outputs()[0].name == "logits"
    assert logits.shape == (len(PAIRS), 1)
    np.testing.assert_allclose(logits, transformers_logits(bert_reranker, x), atol=1e-4)


def test_bert_pairs_are_cls_a_sep_b_sep_with_segment_types(bert_reranker, tmp_path):
    export(bert_reranker, tmp_path / "bundle")
    tok = Tokenizer.from_file(str(tmp_path / "bundle" / "tokenizer.json"))
    enc = tok.encode("the cat", "le chat")
    assert enc.tokens == ["[CLS]", "the", "cat", "[SEP]", "le", "chat", "[SEP]"]
    assert enc.type_ids == [0, 0, 0, 0, 1, 1, 1]


def test_several_labels_are_a_classifier_with_named_labels(xlmr_classifier, tmp_path):
    bundle = tmp_path / "bundle"
    manifest = export(xlmr_classifier, bundle)
    assert manifest.task == "classify" and manifest.architecture == "xlm-roberta"
    assert manifest.labels == ["contradiction", "entailment", "neutral"]
    assert manifest.problem_type == "single_label"
    assert manifest.inputs == ["input_ids", "attention_mask"]  # RoBERTa has no token types

    x = feeds(bundle, manifest, PAIRS)
    (logits,) = build_session(bundle / "encoder.onnx").run(None, x)
    np.testing.assert_allclose(logits, transformers_logits(xlmr_classifier, x), atol=1e-4)
    attn_logits, _ = build_session(bundle / "attention.onnx").run(None, x)
    np.testing.assert_allclose(attn_logits, logits, atol=1e-4)


def test_roberta_pairs_are_s_a_double_sep_b_and_truncate_longest_first(xlmr_classifier, tmp_path):
    export(xlmr_classifier, tmp_path / "bundle")
    tok = Tokenizer.from_file(str(tmp_path / "bundle" / "tokenizer.json"))
    enc = tok.encode("cat", "chat")
    specials = [t for t, s in zip(enc.tokens, enc.special_tokens_mask, strict=True) if s]
    assert specials == ["<s>", "</s>", "</s>", "</s>"] and enc.tokens[0] == "<s>"
    a, b = "the cat sat " * 30, "short"
    long_first = tok.encode(a, b)
    assert len(long_first.ids) == 64
    assert tok.decode(long_first.ids).endswith("short")  # the longer side lost the tokens


def test_task_flag_overrides_and_is_checked(xlmr_classifier, tmp_path):
    manifest = export(xlmr_classifier, tmp_path / "embed", "--task", "embed")
    assert manifest.task == "embed" and manifest.labels == []
    assert (
        export_cli(
            ["--model", str(xlmr_classifier), "--out", str(tmp_path / "r"), "--task", "rerank"]
        )
        == 1
    )


def test_reranker_fp16_and_int8_graphs_keep_the_scores_ranking(bert_reranker, tmp_path):
    manifest = export(bert_reranker, tmp_path / "bundle", "--fp16", "--int8")
    # Logits are compared per label across the probe pairs: the ranking a reranker produces.
    assert manifest.graphs["encoder_fp16"].parity.texts == 1
    assert manifest.graphs["encoder_fp16"].parity.min_cosine >= 0.999
    assert manifest.graphs["encoder_int8"].parity.min_cosine >= 0.95
    assert "token_type_ids" in [
        i.name for i in onnx.load(str(tmp_path / "bundle" / "encoder.int8.onnx")).graph.input
    ]


@pytest.mark.parametrize(
    ("family", "kind"), [("roberta", "bpe"), ("distilbert", "wordpiece"), ("mpnet", "wordpiece-s")]
)
def test_every_family_head_matches_transformers_logits(family, kind, family_tokenizers, tmp_path):
    folder = save_checkpoint(
        tmp_path / f"tiny-{family}-cls",
        family,
        family_tokenizers[kind],
        "ForSequenceClassification",
    )
    bundle = tmp_path / "bundle"
    manifest = export(folder, bundle)
    assert manifest.task == "classify" and manifest.labels == ["LABEL_0", "LABEL_1"]
    x = feeds(bundle, manifest, PAIRS)
    (logits,) = build_session(bundle / "encoder.onnx").run(None, x)
    np.testing.assert_allclose(logits, transformers_logits(folder, x), atol=1e-4)
