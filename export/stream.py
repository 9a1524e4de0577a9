"""Trace a graph without its weights, then write them into it a tensor at a time.

torch.onnx.export serialises a graph with the weights it traced: it needs the model in float32
(a bfloat16 checkpoint's weights twice over), and its constant folding makes one more float32
copy of most of them (each Linear's Wᵀ) before it writes either. A 0.6B decoder's export held
4x its bfloat16 checkpoint. Here:

1. `shadow_weights`: every parameter, and every half-precision buffer, is swapped for a float32
   tensor of its shape that holds no memory (a stride-0 view of one zero). The exporter traces
   with them (`export_params=False`, `keep_initializers_as_inputs=True`,
   `do_constant_folding=False`): the weights become graph inputs named as the module's state,
   and nothing is copied, folded, or deduplicated (every shadow is equal to every other).
2. `materialize`: each of those inputs becomes an initializer whose float32 bytes are written to
   the graph's data file from the real tensor, upcast a chunk at a time; and the folding the
   exporter skipped is done here, node by node: a node whose inputs are all constant (weights,
   Constant nodes, earlier folds) is evaluated by onnx's reference evaluator and replaced by
   its output, which is written as soon as it is computed and kept only while a later fold
   still reads it. The graph that results is the one the exporter's own folding makes (Wᵀ as
   MatMul's initializer, constant subgraphs gone), which ONNX Runtime's fusions match.

Memory: the model as stored, plus a few of its largest tensors in float32.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from torch import Tensor, nn

from export.external import CHUNK, DATA_SUFFIX, SMALL, aligned, point_at
from models.precision import HALF

log = logging.getLogger(__name__)

# Ops never folded: their output is not a function of their inputs.
RANDOM = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
}
STANDARD = ("", "ai.onnx")


@contextmanager
def shadow_weights(module: nn.Module) -> Iterator[dict[str, Tensor]]:
    """Inside the block `module`'s parameters and half-precision buffers are memoryless float32
    stand-ins of their shapes (tied tensors stay tied); yields every real tensor of its state by
    every name it has, which `materialize` reads."""
    real = dict(
        chain(
            module.named_parameters(remove_duplicate=False),
            module.named_buffers(remove_duplicate=False),
        )
    )
    shadows: dict[int, Tensor] = {}
    swapped: list[tuple[dict[str, Any], str, Tensor]] = []
    for owner in module.modules():
        tables: tuple[tuple[dict[str, Any], bool], ...] = (
            (owner._parameters, True),
            (owner._buffers, False),
        )
        for table, is_parameter in tables:
            for attr, tensor in list(table.items()):
                if tensor is None or (not is_parameter and tensor.dtype not in HALF):
                    continue
                shadow = shadows.get(id(tensor))
                if shadow is None:
                    zeros = torch.zeros((), dtype=torch.float32).expand(tensor.shape)
                    shadow = nn.Parameter(zeros, requires_grad=False) if is_parameter else zeros
                    shadows[id(tensor)] = shadow
                table[attr] = shadow
                swapped.append((table, attr, tensor))
    try:
        yield real
    finally:
        for table, attr, tensor in reversed(swapped):
            table[attr] = tensor


def _foldable(node: onnx.NodeProto) -> bool:
    return (
        node.domain in STANDARD
        and node.op_type not in RANDOM
        and node.op_type != "Constant"
        and not any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.attribute
        )
        and any(node.input)
    )


class _DataWriter:
    """Initializers: under SMALL bytes in the graph, else page-aligned in one data file."""

    def __init__(self, out: BinaryIO, location: str) -> None:
        self.out = out
        self.location = location
        self.bytes = 0

    def _external(
        self, name: str, dtype: np.dtype, shape: tuple[int, ...], offset: int
    ) -> onnx.TensorProto:
        tensor = onnx.TensorProto()
        tensor.name = name
        tensor.data_type = onnx.helper.np_dtype_to_tensor_dtype(dtype)
        tensor.dims.extend(shape)
        length = self.out.tell() - offset
        point_at(tensor, self.location, offset, length)
        self.bytes += length
        return tensor

    def array(self, name: str, value: np.ndarray) -> onnx.TensorProto:
        if value.nbytes < SMALL:
            return numpy_helper.from_array(value, name)
        offset = aligned(self.out)
        self.out.write(np.ascontiguousarray(value).tobytes())
        return self._external(name, value.dtype, value.shape, offset)

    def weight(self, name: str, tensor: Tensor) -> onnx.TensorProto:
        """A model tensor in float32 (half precision upcast) or its own dtype, written a chunk
        of rows at a time: no whole float32 copy of it is ever made."""
        tensor = tensor.detach()
        if tensor.dim() == 0 or tensor.numel() * 4 < SMALL:
            return self.array(name, _numpy(tensor))
        rows = max(1, CHUNK // max(1, tensor[0].numel() * 4))
        offset = aligned(self.out)
        dtype: np.dtype = np.dtype(np.float32)
        for start in range(0, tensor.shape[0], rows):
            part = _numpy(tensor[start : start + rows])
            dtype = part.dtype
            self.out.write(np.ascontiguousarray(part).tobytes())
        return self._external(name, dtype, tuple(tensor.shape), offset)


def _numpy(tensor: Tensor) -> np.ndarray:
    tensor = tensor.detach()
    return (tensor.float() if tensor.dtype in HALF else tensor).contiguous().numpy()


def materialize(path: Path, state: Mapping[str, Tensor]) -> None:
    """The graph at `path`, traced under `shadow_weights`, gets its weights and its constant
    folding (module docstring); its data file is `path.data`, beside it."""
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    opset = {o.domain or "": o.version for o in model.opset_import}
    weights = {i.name for i in graph.input if i.name in state}
    constants: dict[str, onnx.TensorProto] = {}  # Constant nodes' outputs
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in STANDARD:
            (attr,) = node.attribute
            if attr.name == "value":
                constants[node.output[0]] = attr.t
    known = set(weights) | set(constants)
    folded: list[onnx.NodeProto] = []
    for node in graph.node:
        if _foldable(node) and all(i == "" or i in known for i in node.input):
            folded.append(node)
            known.update(node.output)
    folded_ids = {id(n) for n in folded}
    kept = [n for n in graph.node if id(n) not in folded_ids]
    needed = {i for n in kept for i in n.input} | {o.name for o in graph.output}
    reads = Counter(i for n in folded for i in n.input if i)

    data = path.with_name(path.name + DATA_SUFFIX)
    initializers: list[onnx.TensorProto] = []
    cache: dict[str, np.ndarray] = {}
    with data.open("wb") as out:
        writer = _DataWriter(out, data.name)

        def value(name: str, shape_only: bool) -> np.ndarray:
            if name in cache:
                return cache[name]
            if name in constants:
                return numpy_helper.to_array(constants[name])
            tensor = state[name]
            if shape_only:  # Shape reads no element: a stride-0 stand-in of the weight's shape
                return np.broadcast_to(_numpy(tensor[(0,) * tensor.dim()]), tuple(tensor.shape))
            return _numpy(tensor)

        for node in folded:
            shape_only = node.op_type == "Shape"
            inputs = [value(i, shape_only) if i else None for i in node.input]
            evaluator = ReferenceEvaluator(node, opsets=opset)
            feeds = {i: x for i, x in zip(node.input, inputs, strict=True) if i}
            results = evaluator.run(None, feeds)
            del inputs, feeds
            for name in node.input:
                if name:
                    reads[name] -= 1
                    if reads[name] == 0:
                        cache.pop(name, None)
            for name, result in zip(node.output, results, strict=True):
                result = np.asarray(result)
                if name in needed:
                    initializers.append(writer.array(name, result))
                if reads[name] > 0:
                    cache[name] = result
        for name in sorted(weights & needed):
            initializers.append(writer.weight(name, state[name]))
    if cache:
        raise RuntimeError(f"{path.name}: folded values never read: {sorted(cache)}")
    nodes = [
        n for n in kept if not (n.op_type == "Constant" and not any(o in needed for o in n.output))
    ]
    inputs = [i for i in graph.input if i.name not in weights]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.input[:]
    graph.input.extend(inputs)
    graph.initializer.extend(initializers)
    onnx.save(model, str(path))
    if writer.bytes == 0:
        data.unlink()
    log.info(
        "%s: %d weights, %d nodes folded, %.2f GB written",
        path.name,
        len(weights & needed),
        len(folded),
        writer.bytes / 1e9,
    )
