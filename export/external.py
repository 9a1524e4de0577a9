"""ONNX files of any size: one protobuf while the weights fit in one, else the graph and one
external data file beside it.

One ONNX file is one protobuf message, which cannot pass 2 GiB. Past that, ONNX's external data
keeps each initializer's bytes in a second file, `<graph>.data`, that the graph names by offset;
ONNX Runtime reads it from the graph's folder. Every graph export writes (serving, attention,
fp16, int8) goes through `save`, so each decides for itself: the float32 graph of a 0.6B model
(2.4 GB) gets a data file, its float16 graph (1.2 GB) stays one file.

Memory: the TorchScript exporter's whole-graph shape inference serialises the graph with its
weights (two more copies) and, past 2 GiB, fails and is skipped anyway; `lean_tracing` skips it
up front for a model that large, so its export holds the weights about once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import torch
from onnx.external_data_helper import uses_external_data
from torch import nn

log = logging.getLogger(__name__)

PROTOBUF_LIMIT = 2**31 - 1
# Weights past this go to a data file: the rest of the graph (nodes, names, shapes) must fit too.
INLINE_LIMIT = PROTOBUF_LIMIT - 256 * 2**20
DATA_SUFFIX = ".data"


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def initializer_bytes(model: onnx.ModelProto) -> int:
    """The weights' bytes, whether held in the proto or in external data."""
    total = 0
    for tensor in model.graph.initializer:
        if uses_external_data(tensor):
            info = {e.key: e.value for e in tensor.external_data}
            total += int(info.get("length", 0))
        else:
            total += tensor.ByteSize()
    return total


def too_large(model: onnx.ModelProto) -> bool:
    return initializer_bytes(model) > INLINE_LIMIT


def save(model: onnx.ModelProto, path: Path) -> list[Path]:
    """Write `model` to `path`: one file, or with its weights in `path.data` when they pass
    what one protobuf holds. Returns the data files written ([] or [path.data])."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    external = too_large(model)
    data = path.with_name(path.name + DATA_SUFFIX)
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    OnnxModel.save(model, str(path), save_as_external_data=external)
    if external:
        log.info("%s: weights in %s (%.2f GB)", path.name, data.name, data.stat().st_size / 1e9)
    return [data] if external else []


def data_files(path: Path) -> list[Path]:
    """The external data files a graph file names, in its folder."""
    model = onnx.load(str(path), load_external_data=False)
    names = {
        e.value
        for t in model.graph.initializer
        if uses_external_data(t)
        for e in t.external_data
        if e.key == "location"
    }
    return [path.parent / n for n in sorted(names)]


def load(path: Path) -> onnx.ModelProto:
    """A graph with its weights, wherever they are (inline, one data file, or torch's one file
    per tensor)."""
    return onnx.load(str(path), load_external_data=True)


def rewrite(source: Path, path: Path) -> list[Path]:
    """`source` (with whatever data files it has) re-saved as `path` by `save`'s rule; the
    source's files are removed. Returns the data files written."""
    model = load(source)
    old = [source, *data_files(source)]
    for f in old:
        if f != path:
            f.unlink(missing_ok=True)
    written = save(model, path)
    del model
    return written


@contextmanager
def lean_tracing(model: nn.Module) -> Iterator[None]:
    """For a model past one protobuf, skip the TorchScript exporter's whole-graph shape
    inference (it copies every weight twice, then fails at 2 GiB and is skipped by the exporter
    itself: the graph is the same without it)."""
    if parameter_bytes(model) <= INLINE_LIMIT:
        yield
        return

    def skip(*args: object, **kwargs: object) -> None:
        raise RuntimeError("skipped: the graph passes 2 GiB")  # the exporter catches this

    original = torch._C._jit_pass_onnx_graph_shape_type_inference
    torch._C._jit_pass_onnx_graph_shape_type_inference = skip
    try:
        yield
    finally:
        torch._C._jit_pass_onnx_graph_shape_type_inference = original
