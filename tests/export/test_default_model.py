"""The real default model (all-MiniLM-L6-v2) exported end to end."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from export import verify
from tests.conftest import REAL_TEXTS

pytestmark = pytest.mark.slow


def test_default_bundle_is_fused_per_layer(default_bundle):
    op_types = [n.op_type for n in onnx.load(str(default_bundle / "encoder.onnx")).graph.node]
    assert op_types.count("Attention") == 6
    assert "Softmax" not in op_types
    manifest = json.loads((default_bundle / "manifest.json").read_text())
    assert manifest["name"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert (manifest["num_layers"], manifest["num_heads"], manifest["d_model"]) == (6, 12, 384)
    assert manifest["max_length"] == 256 and manifest["pooling"] == "mean"


def test_default_bundle_matches_sentence_transformers(default_bundle, sentence_transformer):
    tok = Tokenizer.from_file(str(default_bundle / "tokenizer.json"))
    ids, mask = verify.tokenize(tok, REAL_TEXTS)
    s = ort.InferenceSession(
        str(default_bundle / "encoder.onnx"), providers=["CPUExecutionProvider"]
    )
    emb = s.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    assert ids.shape[1] == 256  # the long text was truncated at 256, not the tokenizer's 128
    emb = emb / np.linalg.norm(emb, axis=-1, keepdims=True)
    ref = sentence_transformer.encode(REAL_TEXTS, convert_to_numpy=True)
    cos = (emb * ref).sum(-1)
    assert cos.min() >= 0.9999, cos
