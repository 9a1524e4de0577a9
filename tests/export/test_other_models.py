"""Any BERT-family folder exports the same way: a differently sized checkpoint saved by
transformers (with a task head and "bert." prefixes), through the real CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from export import verify

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, model_dir):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(3)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=8,
        intermediate_size=96,
        max_position_embeddings=128,
    )
    folder = tmp_path_factory.mktemp("hf") / "mini-bert"
    BertForMaskedLM(config).eval().save_pretrained(folder, safe_serialization=True)
    shutil.copy(model_dir / "tokenizer.json", folder / "tokenizer.json")
    return folder


def test_cli_exports_a_transformers_checkpoint_with_mean_pooling_by_default(hf_folder, tmp_path):
    from transformers import BertModel

    out = tmp_path / "bundle"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "export",
            "--model",
            str(hf_folder),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["num_layers"], manifest["num_heads"], manifest["d_model"]) == (3, 8, 64)
    assert manifest["name"] == "mini-bert"
    # No sentence-transformers files: mean pooling, as sentence-transformers loads such a model.
    assert manifest["pooling"] == "mean" and manifest["max_length"] == 128
    assert manifest["graphs"]["encoder"]["op_counts"]["Attention"] == 3

    texts = ["a first sentence", "and a second, longer sentence than the first one"]
    ids, mask = verify.tokenize(Tokenizer.from_file(str(out / "tokenizer.json")), texts)
    session = ort.InferenceSession(str(out / "encoder.onnx"), providers=["CPUExecutionProvider"])
    ours = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    hf = BertModel.from_pretrained(hf_folder).eval()
    with torch.no_grad():
        hidden = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
    m = torch.from_numpy(mask)[:, :, None].float()
    theirs = (hidden * m).sum(1) / m.sum(1)
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-4)
