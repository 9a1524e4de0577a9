"""bench.device.pack: a bundle's encoder packed small (int8-rounded rows) and rebuilt as a bundle."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.device.pack import pack, unpack


def make_bundle(root: Path) -> np.ndarray:
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.1, (64, 128)).astype(np.float32)
    b = rng.normal(0, 0.1, (128,)).astype(np.float32)  # small: travels as it is
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 128])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["t"]),
        helper.make_node("Add", ["t", "b"], ["y"]),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=inits)
    root.mkdir()
    onnx.save(helper.make_model(graph), str(root / "encoder.onnx"))
    (root / "tokenizer.json").write_text("{}")
    entry = {"file": "encoder.onnx", "sha256": "0", "bytes": 1}
    manifest = {
        "tokenizer": {"file": "tokenizer.json", "sha256": "0"},
        "graphs": {"encoder": entry, "attention": {**entry, "file": "attention.onnx"}},
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    return w


def test_packed_weights_come_back_rounded_per_row_and_the_manifest_matches(tmp_path: Path) -> None:
    w = make_bundle(tmp_path / "bundle")
    assert pack(tmp_path / "bundle", tmp_path / "packed") == 1
    skeleton = onnx.load(str(tmp_path / "packed" / "skeleton.onnx"))
    assert {i.name: len(i.raw_data) for i in skeleton.graph.initializer}["w"] == 0
    unpack(tmp_path / "packed", tmp_path / "out")
    model = onnx.load(str(tmp_path / "out" / "encoder.onnx"))
    got = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    step = np.abs(w).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(got["w"] - w) <= step / 2 + 1e-7)  # each row on its own int8 grid
    assert not np.array_equal(got["w"], w)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert list(manifest["graphs"]) == ["encoder"]
    data = (tmp_path / "out" / "encoder.onnx").read_bytes()
    assert manifest["graphs"]["encoder"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["graphs"]["encoder"]["bytes"] == len(data)
