"""ONNX files of any size: one protobuf while the weights fit in one, else the graph and one
external data file beside it.

One ONNX file is one protobuf message, which cannot pass 2 GiB. Past that, ONNX's external data
keeps each initializer's bytes in a second file, `<graph>.data`, that the graph names by offset;
ONNX Runtime reads it from the graph's folder. Every graph export writes (serving, attention,
fp16) goes through `save`, so each decides for itself: the float32 graph of a 0.6B model
(2.4 GB) gets a data file, its float16 graph (1.2 GB) stays one file.

A large graph is optimised and re-saved "lean": loaded without its weights, which stay on disk
and are streamed into the new data file a tensor at a time; only what a fusion reads (q, k, v to
pack) comes into memory.

Memory: the exporter traces memoryless stand-ins of the weights (export/stream.py), but its
whole-graph shape inference serialises the graph with them (two copies of the float32 weights,
materialised) and, past 2 GiB, fails and is skipped anyway; `lean_tracing` skips it up front for
a model that large.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import onnx
import torch
from onnx import numpy_helper
from onnx.external_data_helper import load_external_data_for_model, uses_external_data
from torch import nn

log = logging.getLogger(__name__)

PROTOBUF_LIMIT = 2**31 - 1
# Weights past this go to a data file: the rest of the graph (nodes, names, shapes) must fit too.
INLINE_LIMIT = PROTOBUF_LIMIT - 256 * 2**20
DATA_SUFFIX = ".data"
SMALL = 1024  # initializers under this stay in the graph
ALIGN = 4096
CHUNK = 64 * 2**20
TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _nbytes(tensor: onnx.TensorProto) -> int:
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    nbytes: int = itemsize * math.prod(tensor.dims)
    return nbytes


def initializer_bytes(model: onnx.ModelProto) -> int:
    """The weights' bytes, whether held in the proto or in external data (counted from their
    shapes: a tensor past 2 GiB cannot be serialised to be measured)."""
    return sum(_nbytes(t) for t in model.graph.initializer)


def too_large(model: onnx.ModelProto) -> bool:
    return initializer_bytes(model) > INLINE_LIMIT


def load_lean(path: Path) -> onnx.ModelProto:
    """A graph with its external weights left on disk (`numpy_helper.to_array` reads them from
    the working directory: optimise it in the graph's folder)."""
    return onnx.load(str(path), load_external_data=False)


def load(path: Path) -> onnx.ModelProto:
    """A graph with its weights in memory, wherever they are (inline, one data file, or
    torch's one file per tensor)."""
    return onnx.load(str(path), load_external_data=True)


def data_files(path: Path) -> list[Path]:
    """The external data files a graph file names, in its folder."""
    model = load_lean(path)
    names = {
        e.value
        for t in model.graph.initializer
        if uses_external_data(t)
        for e in t.external_data
        if e.key == "location"
    }
    return [path.parent / n for n in sorted(names)]


def _copy_range(source: Path, offset: int, length: int, out: BinaryIO) -> None:
    with source.open("rb") as f:
        f.seek(offset)
        while length > 0:
            chunk = f.read(min(length, CHUNK))
            if not chunk:
                raise ValueError(f"{source} ends before the tensor it holds")
            out.write(chunk)
            length -= len(chunk)


def aligned(out: BinaryIO) -> int:
    """Pad `out` to the next page and return that offset: where the next tensor's bytes go (page
    aligned, so that ONNX Runtime may map them)."""
    out.write(b"\0" * (-out.tell() % ALIGN))
    return out.tell()


def point_at(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Make `tensor` name its bytes in the data file `location`, at `offset`."""
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    tensor.data_location = onnx.TensorProto.EXTERNAL


def to_data_file(model: onnx.ModelProto, data: Path, base_dir: Path) -> None:
    """Every initializer of 1 KiB or more into `data`, one after another (page-aligned, so that
    ONNX Runtime may map them): from memory, or copied from the external file it is in now."""
    with data.open("wb") as out:
        for tensor in model.graph.initializer:
            external = uses_external_data(tensor)
            if not external and _nbytes(tensor) < SMALL:
                continue
            offset = aligned(out)
            if external:
                info = {e.key: e.value for e in tensor.external_data}
                start = int(info.get("offset", 0))
                length = int(info.get("length", 0)) or _nbytes(tensor)
                _copy_range(base_dir / info["location"], start, length, out)
            elif tensor.HasField("raw_data"):
                out.write(tensor.raw_data)
            else:  # typed fields (float_data, ...): their little-endian bytes
                out.write(numpy_helper.to_array(tensor).tobytes())
                for field in TYPED_FIELDS:
                    tensor.ClearField(field)
            point_at(tensor, data.name, offset, out.tell() - offset)


def save(model: onnx.ModelProto, path: Path, base_dir: Path | None = None) -> list[Path]:
    """Write `model` to `path`: one file, or with its weights in `path.data` when they pass
    what one protobuf holds. Weights still on disk (a lean load) are read from `base_dir` (their
    graph's folder), a tensor at a time. Returns the data files written ([] or [path.data])."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    base_dir = base_dir or path.parent
    data = path.with_name(path.name + DATA_SUFFIX)
    data.unlink(missing_ok=True)
    if not too_large(model):
        load_external_data_for_model(model, str(base_dir))
        OnnxModel.save(model, str(path))
        return []
    to_data_file(model, data, base_dir)
    OnnxModel.save(model, str(path))  # the graph alone now: its weights point into `data`
    log.info("%s: weights in %s (%.2f GB)", path.name, data.name, data.stat().st_size / 1e9)
    return [data]


def rewrite(source: Path, path: Path) -> list[Path]:
    """`source` re-saved as `path` by `save`'s rule, its weights streamed from where they are
    (never all in memory); the source's files are removed. Returns the data files written."""
    model = load_lean(source)
    old = [source, *data_files(source)]
    written = save(model, path, source.parent)
    for f in old:
        if f not in (path, *written):
            f.unlink(missing_ok=True)
    return written


@contextmanager
def lean_tracing(model: nn.Module) -> Iterator[None]:
    """For a model past one protobuf (counted as traced: float32 stand-ins), skip the
    TorchScript exporter's whole-graph shape inference (it copies every weight twice, then
    fails at 2 GiB and is skipped by the exporter itself: the graph is the same without it)."""
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
