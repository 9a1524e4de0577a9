"""The exporter traces weights that hold no memory, and export/stream.py writes the real ones
into the graph a tensor at a time, folding what the exporter's constant folding would have:
the graph computes what torch's own export of the float32 model computes, with nothing
constant left unfolded, whatever dtype the checkpoint's weights are held in."""

from __future__ import annotations

import warnings
from contextlib import nullcontext

import numpy as np
import onnx
import pytest
import torch
from safetensors.torch import save_file

from export import fused, stream
from export.onnx import OPSET, ServingGraph, export_serving, graph_inputs
from models.encoder import config_of
from models.precision import HALF
from models.weights import load_pretrained, read_state_dict
from service.engine.sessions import build_session
from tests.models import test_deberta, test_qwen3
from tests.models.checkpoints import batch, save_checkpoint

BERT = {
    "vocab_size": 100,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
}


def qwen3(folder):
    test_qwen3.save(folder)


def deberta(folder):
    save_checkpoint(folder, "DebertaV2Model", "DebertaV2Config", **test_deberta.CONFIG)


def bert(folder):
    save_checkpoint(folder, "BertModel", "BertConfig", **BERT)


FAMILIES = {"qwen3": qwen3, "deberta-v2": deberta, "bert": bert}


def torch_export(model, path) -> None:
    """torch.onnx.export of the float32 model as export did before: its weights traced, its
    constant folding on."""
    emit = fused.plan(config_of(model)).kind == "emit"
    inputs = graph_inputs(model)
    ids, mask = batch([7, 5])
    with (
        torch.no_grad(),
        warnings.catch_warnings(),
        fused.ort_kernels(model) if emit else nullcontext(),
    ):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            ServingGraph(model),
            (ids, mask),
            str(path),
            input_names=inputs,
            output_names=["out", "tokens"],
            dynamic_axes={n: {0: "b", 1: "n"} for n in inputs},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


def constant_nodes(model: onnx.ModelProto) -> list[str]:
    """Nodes whose every input is an initializer or a Constant's output: what folding removes."""
    known = {t.name for t in model.graph.initializer}
    known |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return [
        n.name
        for n in model.graph.node
        if n.op_type != "Constant"
        and n.domain in ("", "ai.onnx")
        and any(n.input)
        and all(i in known for i in n.input if i)
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_streamed_graph_computes_what_torchs_own_export_does(tmp_path, family):
    FAMILIES[family](tmp_path / "model")
    model = load_pretrained(tmp_path / "model").model
    emit = fused.plan(config_of(model)).kind == "emit"
    ours, theirs = tmp_path / "ours" / "encoder.onnx", tmp_path / "theirs.onnx"
    ours.parent.mkdir()
    export_serving(model, ours, emit_fused=emit)
    torch_export(model, theirs)
    graph = onnx.load(str(ours), load_external_data=False)
    assert not constant_nodes(graph)
    assert {i.name for i in graph.graph.input} == set(graph_inputs(model))
    ids, mask = batch([9, 6, 1])
    x = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    got = build_session(ours).run(None, x)
    want = build_session(theirs).run(None, x)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32 and np.abs(g - w).max() < 1e-5


@pytest.mark.parametrize("dtype", HALF)
def test_half_weights_are_written_in_float32_from_the_weights_as_stored(tmp_path, dtype):
    qwen3(tmp_path / "model")
    wide = load_pretrained(tmp_path / "model").model
    state = {k: v.to(dtype) for k, v in read_state_dict(tmp_path / "model").items()}
    save_file(state, str(tmp_path / "model" / "model.safetensors"))
    narrow = load_pretrained(tmp_path / "model", keep_half=True).model
    with torch.no_grad():  # the float32 model on the same rounded weights
        for p in wide.parameters():
            p.copy_(p.to(dtype).float())
    ours, theirs = tmp_path / "ours" / "encoder.onnx", tmp_path / "theirs.onnx"
    ours.parent.mkdir()
    export_serving(narrow, ours, emit_fused=True)
    torch_export(wide, theirs)
    graph = onnx.load(str(ours), load_external_data=False)
    assert {t.data_type for t in graph.graph.initializer} <= {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.INT64,
    }
    assert all(p.dtype == dtype for p in narrow.parameters())  # never converted in place
    ids, mask = batch([9, 6, 1])
    x = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    got, want = build_session(ours).run(None, x)[0], build_session(theirs).run(None, x)[0]
    assert np.abs(got - want).max() < 1e-5


def test_the_exporter_sees_weights_without_memory_and_the_real_ones_come_back(tmp_path):
    qwen3(tmp_path / "model")
    module = ServingGraph(load_pretrained(tmp_path / "model").model)
    before = dict(module.named_parameters())
    with stream.shadow_weights(module) as real:
        inside = dict(module.named_parameters())
        assert inside.keys() == before.keys()
        for name, p in inside.items():
            assert p is not before[name] and p.shape == before[name].shape
            assert p.dtype == torch.float32 and p.untyped_storage().nbytes() <= 4
        assert all(real[name] is before[name] for name in before)
    assert all(p is before[n] for n, p in module.named_parameters())
