"""Tensors as the protocol carries them: JSON (`data`, row-major, flattened or nested) or raw
bytes after the JSON header (Triton's binary tensor extension: the header's length in
`Inference-Header-Content-Length`, each binary input's bytes in `parameters.binary_data_size`,
in the order of `inputs`). A BYTES element in binary is a 4-byte little-endian length and its
bytes; in JSON, a string.

An answer is JSON unless an output asks for binary (`parameters.binary_data: true`) or the
request does for all of them (`parameters.binary_data_output: true`, what tritonclient sends
when it names no outputs): then the binary outputs' bytes follow the JSON header, in order.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from service.errors import HeadwiseError

HEADER = "inference-header-content-length"
# The protocol's numeric types and their little-endian numpy types.
NUMERIC = {
    "BOOL": "?",
    "UINT8": "u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}


class BadTensor(HeadwiseError):
    """A request the protocol refuses: 400 with `{"error": ...}`, as Triton and KServe answer."""

    status, kind = 400, "invalid_request_error"


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    values: np.ndarray | list[bytes]  # numeric: flat array; BYTES: the elements

    @property
    def count(self) -> int:
        return math.prod(self.shape)


@dataclass
class Request:
    id: str | None
    inputs: dict[str, Tensor]
    outputs: list[str] | None  # asked by name, or None: every output
    binary: set[str] | bool  # which outputs go binary (True: all)
    parameters: dict[str, Any]


def bytes_raw(elements: list[bytes]) -> bytes:
    """BYTES elements as the binary extension (and gRPC's raw contents) carry them: each one
    after its length, 4 bytes little-endian."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def _bytes_elements(raw: bytes, name: str) -> list[bytes]:
    out, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise BadTensor(f"input {name!r}: a BYTES element's length is cut short")
        (size,) = struct.unpack_from("<I", raw, at)
        at += 4
        if at + size > len(raw):
            raise BadTensor(f"input {name!r}: a BYTES element runs past its binary data")
        out.append(raw[at : at + size])
        at += size
    return out


def _flatten(data: Any) -> list[Any]:
    if isinstance(data, list):
        return [x for item in data for x in _flatten(item)]
    return [data]


def tensor(spec: Any, binary: bytes | None) -> Tensor:
    """One input from its JSON spec, its elements read from `binary` when given."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise BadTensor("every input needs a name, a datatype and a shape")
    name = spec["name"]
    datatype, shape = spec.get("datatype"), spec.get("shape")
    if datatype != "BYTES" and datatype not in NUMERIC:
        raise BadTensor(f"input {name!r}: unknown datatype {datatype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise BadTensor(f"input {name!r}: shape must be a list of non-negative integers")
    count = math.prod(shape)
    values: np.ndarray | list[bytes]
    if binary is not None:
        if datatype == "BYTES":
            values = _bytes_elements(binary, name)
        else:
            dtype = np.dtype(NUMERIC[datatype])
            if len(binary) != count * dtype.itemsize:
                raise BadTensor(
                    f"input {name!r}: {len(binary)} bytes of binary data for shape {shape} "
                    f"of {datatype} ({count * dtype.itemsize} expected)"
                )
            values = np.frombuffer(binary, dtype=dtype)
    else:
        if "data" not in spec:
            raise BadTensor(f"input {name!r} has neither data nor binary_data_size")
        flat = _flatten(spec["data"])
        if datatype == "BYTES":
            if not all(isinstance(x, str) for x in flat):
                raise BadTensor(f"input {name!r}: BYTES data in JSON must be strings")
            values = [x.encode() for x in flat]
        else:
            try:
                values = np.asarray(flat, dtype=np.dtype(NUMERIC[datatype]))
            except (TypeError, ValueError):
                raise BadTensor(f"input {name!r}: its data are not {datatype}") from None
    if len(values) != count:
        raise BadTensor(
            f"input {name!r}: shape {shape} holds {count} elements, data has {len(values)}"
        )
    return Tensor(name, datatype, shape, values)


def parse(body: bytes, header_length: int | None) -> Request:
    """The request's JSON header and its tensors (400 naming what is wrong)."""
    if header_length is not None and not 0 < header_length <= len(body):
        raise BadTensor(
            f"Inference-Header-Content-Length {header_length} does not fit a body of {len(body)} bytes"
        )
    head, rest = (
        (body, b"") if header_length is None else (body[:header_length], body[header_length:])
    )
    try:
        header = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise BadTensor(f"the inference header is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise BadTensor("an inference request needs a list of inputs")
    inputs: dict[str, Tensor] = {}
    at = 0
    for spec in header["inputs"]:
        params = (spec.get("parameters") or {}) if isinstance(spec, dict) else {}
        size = params.get("binary_data_size")
        raw = None
        if size is not None:
            if not isinstance(size, int) or size < 0 or at + size > len(rest):
                raise BadTensor(f"binary_data_size {size!r} runs past the request's binary data")
            raw, at = rest[at : at + size], at + size
        one = tensor(spec, raw)
        if one.name in inputs:
            raise BadTensor(f"input {one.name!r} is given twice")
        inputs[one.name] = one
    parameters = header.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadTensor("parameters must be an object")
    outputs, binary_outputs = None, set()
    if header.get("outputs") is not None:
        if not isinstance(header["outputs"], list):
            raise BadTensor("outputs must be a list")
        outputs = []
        for spec in header["outputs"]:
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise BadTensor("every requested output needs a name")
            outputs.append(spec["name"])
            if (spec.get("parameters") or {}).get("binary_data"):
                binary_outputs.add(spec["name"])
    binary: set[str] | bool = binary_outputs
    if parameters.get("binary_data_output") and outputs is None:
        binary = True
    rid = header.get("id")
    return Request(str(rid) if rid is not None else None, inputs, outputs, binary, parameters)


def texts(tensor: Tensor) -> list[str]:
    """A BYTES tensor's elements as text (400 when one is not UTF-8)."""
    if tensor.datatype != "BYTES":
        raise BadTensor(f"input {tensor.name!r} must be BYTES (text), not {tensor.datatype}")
    assert isinstance(tensor.values, list)
    try:
        return [v.decode("utf-8") for v in tensor.values]
    except UnicodeDecodeError:
        raise BadTensor(f"input {tensor.name!r} has an element that is not UTF-8") from None


def answer(
    model: str, rid: str | None, outputs: list[tuple[str, np.ndarray]], binary: set[str] | bool
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary outputs follow it."""
    specs, tails = [], []
    for name, values in outputs:
        values = np.ascontiguousarray(values, dtype="<f4")
        spec: dict[str, Any] = {"name": name, "datatype": "FP32", "shape": list(values.shape)}
        if binary is True or (isinstance(binary, set) and name in binary):
            raw = values.tobytes()
            spec["parameters"] = {"binary_data_size": len(raw)}
            tails.append(raw)
        else:
            spec["data"] = values.ravel()
        specs.append(spec)
    head: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": specs}
    if rid is not None:
        head["id"] = rid
    header = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    if not tails:
        return header, None
    return header + b"".join(tails), len(header)
