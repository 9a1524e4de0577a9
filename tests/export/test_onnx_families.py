"""Today's encoders export as plain ONNX graphs (TorchScript exporter, opset 17, dynamic batch
and sequence axes) that ONNX Runtime runs to the same embeddings and attention maps as PyTorch,
at sequence lengths and a batch size other than the sample input's (2 × 9 tokens): the graph
recomputes rotary tables, local bands, NTK bases and relative buckets for every input.
"""

from __future__ import annotations

import shutil

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export.onnx import AttentionGraph, export_attention
from models.weights import load_pretrained
from tests.models import nomic_remote, test_deberta, test_gemma, test_modernbert, test_nomic
from tests.models.checkpoints import TOLERANCE, batch, save_checkpoint

LENGTHS = [[5, 3, 1], [23, 16, 4]]  # 23: past every tiny model's local window


def modernbert(folder):
    save_checkpoint(folder, "ModernBertModel", "ModernBertConfig", **test_modernbert.CONFIG)


def nomic(folder):
    cfg = nomic_remote.remote_config(**test_nomic.REMOTE_FEATURES)  # partial, NTK past 16
    nomic_remote.save_remote(folder, cfg, nomic_remote.random_state(cfg))


def embeddinggemma(folder):
    save_checkpoint(folder, "Gemma3TextModel", "Gemma3TextConfig", **test_gemma.CONFIG)
    test_gemma.embeddinggemma_folder(folder)  # + Dense, Dense, Normalize


def deberta(folder):
    save_checkpoint(folder, "DebertaV2Model", "DebertaV2Config", **test_deberta.CONFIG)


@pytest.mark.parametrize("build", [modernbert, nomic, embeddinggemma, deberta])
def test_plain_graph_runs_in_onnxruntime_and_equals_pytorch_at_other_lengths(build, tmp_path):
    build(tmp_path / "model")
    model = load_pretrained(tmp_path / "model").model
    path = tmp_path / "attention.onnx"
    export_attention(model, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    graph = AttentionGraph(model).eval()
    for side, lengths in zip(("right", "left"), LENGTHS, strict=True):
        ids, mask = batch(lengths, side)
        with torch.no_grad():
            want_out, want_attn = graph(ids, mask)
        out, attn = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        assert attn.shape == tuple(want_attn.shape)  # (L, B, h, N, N)
        np.testing.assert_allclose(out, want_out.numpy(), atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(attn, want_attn.numpy(), atol=TOLERANCE, rtol=0)
    shutil.rmtree(tmp_path / "model")
