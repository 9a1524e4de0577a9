"""Attention maps on the wire: JSON arrays (the default) or compact base64 with shape metadata.

JSON of a full map set is tens of MB; it is written one (layer, head) at a time so that the
thread doing it lets go of the GIL between pieces and the event loop keeps answering. The
compact form is little-endian float16 or float32 bytes in base64, as /v1/embeddings' base64:
`{"encoding": "base64", "dtype": "<f2", "shape": [L, h, n, n], "data": "..."}`, row-major.
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
import orjson

Encoding = Literal["float", "base64_f16", "base64_f32"]
DTYPES = {"base64_f16": "<f2", "base64_f32": "<f4"}


def json_arrays(maps: np.ndarray) -> orjson.Fragment:
    """(L, h, n, n) -> the nested JSON arrays, as an orjson fragment built piece by piece."""
    layers = []
    for layer in maps:
        heads = [orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY) for head in layer]
        layers.append(b"[" + b",".join(heads) + b"]")
    return orjson.Fragment(b"[" + b",".join(layers) + b"]")


def compact(maps: np.ndarray, encoding: Encoding) -> orjson.Fragment:
    """The compact form, written as a JSON fragment (orjson copies it, never re-scans it)."""
    dtype = DTYPES[encoding]
    data = memoryview(np.ascontiguousarray(maps, dtype=dtype).tobytes())
    step = 3 * 2**18  # whole base64 quanta: the pieces join into one valid string
    pieces = [base64.b64encode(data[i : i + step]) for i in range(0, len(data), step)]
    head = orjson.dumps({"encoding": "base64", "dtype": dtype, "shape": list(maps.shape)})
    return orjson.Fragment(head[:-1] + b',"data":"' + b"".join(pieces) + b'"}')


def encode_maps(maps: np.ndarray, encoding: Encoding) -> orjson.Fragment:
    return json_arrays(maps) if encoding == "float" else compact(maps, encoding)


def decode_maps(value: dict) -> np.ndarray:
    """The compact form back to an array (for clients and tests)."""
    raw = base64.b64decode(value["data"])
    return np.frombuffer(raw, dtype=value["dtype"]).reshape(value["shape"])
