"""export/fused.py: which families get ORT's kernels written in, the kernels' PyTorch math, and
the gate on the nodes export emitted."""

from __future__ import annotations

import onnx
import pytest
import torch

from export.fused import ort_kernels, plan
from export.onnx import export_serving
from export.optimize import FusionError, check_emitted
from models.attention import MultiHeadAttention
from models.config import EncoderConfig
from models.encoder import SentenceEncoder
from models.families import encoder_config
from tests.models import test_deberta, test_gemma, test_modernbert, test_nomic
from tests.models.checkpoints import batch, reinit

CONFIGS = {
    "modernbert": {**test_modernbert.CONFIG, "model_type": "modernbert"},
    "nomic-bert": {**test_nomic.CONFIG, "model_type": "nomic_bert"},
    "gemma3": {**test_gemma.CONFIG, "model_type": "gemma3_text"},
    "deberta-v2": {**test_deberta.CONFIG, "model_type": "deberta-v2"},
}


def encoder(name: str, **changes) -> SentenceEncoder:
    cfg = encoder_config(CONFIGS[name], dropout=0.0, attn_dropout=0.0, **changes)
    return reinit(SentenceEncoder(cfg))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_ort_kernels_compute_what_the_explicit_path_does(name):
    model = encoder(name)
    ids, mask = batch([24, 17, 9], "left")  # past every window, padded on the left
    with torch.no_grad():
        explicit, _ = model(ids, mask)
        with ort_kernels(model) as switched:
            fused, _ = model(ids, mask)
            with_maps, maps = model(ids, mask, need_weights=True)  # maps: always explicit
    assert switched == model.cfg.n_layers
    assert (fused - explicit).abs().max() < 1e-5
    assert maps is not None and torch.equal(with_maps, explicit)
    assert all(m.kernels is None for m in model.modules() if isinstance(m, MultiHeadAttention))


def test_bert_families_are_matched_by_ort_and_the_newer_ones_emitted():
    for architecture in ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet"):
        assert plan(EncoderConfig(architecture=architecture)).kind == "match"
    for name in CONFIGS:
        assert plan(encoder(name).cfg).kind == "emit"


def test_soft_capped_attention_has_no_kernel_and_the_plan_says_why():
    chosen = plan(encoder("gemma3", attn_softcap=30.0).cfg)
    assert chosen.kind == "none"
    assert chosen.reason.startswith("gemma3: attention soft-capping")
    assert "MultiHeadAttention has no softcap" in chosen.reason
    capped = encoder("gemma3", attn_softcap=30.0)
    with pytest.raises(ValueError, match="soft-capping"), ort_kernels(capped):
        pass


def test_the_gate_names_an_emitted_op_the_graph_lost(tmp_path):
    model = encoder("modernbert")
    export_serving(model, tmp_path / "raw.onnx", emit_fused=True)
    graph = onnx.load(str(tmp_path / "raw.onnx"))
    assert check_emitted(graph, model.cfg).attention_nodes == 4
    rotary = [n for n in graph.graph.node if n.op_type == "RotaryEmbedding"]
    graph.graph.node.remove(rotary[0])
    with pytest.raises(FusionError, match="7 RotaryEmbedding node\\(s\\), export emitted 8"):
        check_emitted(graph, model.cfg)
