"""The output heads (models/outputs.py) and how a folder's files say which it has
(models/st_modules.py, models/output_weights.py)."""

from __future__ import annotations

import json

import pytest
import torch

from models.outputs import OutputSpec, Splade
from models.st_modules import read_config


@pytest.mark.parametrize("pooling", ["max", "sum"])
@pytest.mark.parametrize("activation", ["relu", "log1p_relu"])
def test_splade_pooling_equals_sentence_transformers(pooling, activation):
    """Max pooling takes the max first (log1p and relu are monotone), with the mask inside
    the GEMM: the same numbers."""
    from sentence_transformers.sparse_encoder.modules.splade_pooling import SpladePooling

    from models.config import EncoderConfig
    from models.outputs import MaskedLMHead

    torch.manual_seed(0)
    head = MaskedLMHead(EncoderConfig(d_model=16, n_heads=2, n_layers=1, d_ff=16, vocab_size=50))
    torch.nn.init.normal_(head.decoder.bias, std=2.0)
    hidden = torch.randn(3, 7, 16) * 3
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 1:] = 0
    reference = SpladePooling(pooling, activation).eval()
    with torch.no_grad():
        want = reference({"token_embeddings": head(hidden), "attention_mask": mask})
        got = Splade(pooling, activation)(head, hidden, mask)
    torch.testing.assert_close(got, want["sentence_embedding"], atol=1e-5, rtol=1e-5)


def test_the_graph_outputs_put_the_primary_first():
    assert OutputSpec(sparse="token_weights", vectors_dim=8).graph_outputs == [
        "sentence_embedding", "token_embeddings", "sparse_weights", "colbert_vectors"
    ]  # fmt: skip
    assert OutputSpec(dense=False, sparse="vocabulary").graph_outputs == ["sparse_embedding"]
    assert OutputSpec(dense=False, vectors_dim=8).graph_outputs == ["colbert_vectors"]
    with pytest.raises(ValueError, match="at least one output"):
        OutputSpec(dense=False)


def _modules(folder, entries):
    folder.mkdir(exist_ok=True)
    modules = [{"idx": i, "name": str(i), "path": p, "type": t} for i, (t, p) in enumerate(entries)]
    (folder / "modules.json").write_text(json.dumps(modules))


def test_a_sparse_encoders_splade_pooling_is_read(tmp_path):
    _modules(
        tmp_path,
        [
            ("sentence_transformers.sparse_encoder.models.MLMTransformer", ""),
            ("sentence_transformers.sparse_encoder.models.SpladePooling", "1_SpladePooling"),
        ],
    )
    (tmp_path / "1_SpladePooling").mkdir()
    (tmp_path / "1_SpladePooling" / "config.json").write_text(
        json.dumps({"pooling_strategy": "sum", "activation_function": "log1p_relu"})
    )
    st = read_config(tmp_path)
    assert st.splade is not None and (st.splade.pooling, st.splade.activation) == ("sum", "log1p_relu")
    (tmp_path / "1_SpladePooling" / "config.json").write_text(json.dumps({"pooling_strategy": "mean"}))
    with pytest.raises(ValueError, match="unsupported SpladePooling"):
        read_config(tmp_path)


def test_pylates_token_dense_is_read_and_a_pooled_models_dense_still_needs_pooling(tmp_path):
    _modules(tmp_path, [("sentence_transformers.models.Transformer", ""), ("pylate.models.Dense.Dense", "1_Dense")])
    (tmp_path / "1_Dense").mkdir()
    (tmp_path / "1_Dense" / "config.json").write_text(
        json.dumps({"in_features": 32, "out_features": 8, "bias": False,
                    "activation_function": "torch.nn.modules.linear.Identity"})
    )  # fmt: skip
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"query_length": 20}))
    st = read_config(tmp_path)
    assert st.colbert is not None and st.colbert.dense.shape == (32, 8, False)
    assert st.colbert.settings == {"query_length": 20} and st.dense == ()
    _modules(tmp_path, [("sentence_transformers.models.Transformer", ""), ("sentence_transformers.models.Dense", "1_Dense")])
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({}))
    with pytest.raises(ValueError, match="between Pooling and Normalize"):
        read_config(tmp_path)


def test_a_family_without_a_masked_lm_head_is_refused_by_name(tmp_path):
    from models.families import family_of

    assert family_of({"model_type": "modernbert"}).mlm_head == {}
    from models.config import EncoderConfig
    from models.output_weights import _mlm_head
    from models.outputs import MultiOutputEncoder

    model = MultiOutputEncoder(EncoderConfig(d_model=8, n_heads=2, n_layers=1, d_ff=8, vocab_size=20), OutputSpec(dense=False, sparse="vocabulary"))
    with pytest.raises(ValueError, match="modernbert: no masked-LM head layout"):
        _mlm_head(model, tmp_path, {"model_type": "modernbert"})
