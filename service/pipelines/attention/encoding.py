"""Attention maps on the wire: JSON arrays (the default) or compact base64 with shape metadata.

A full map set is tens of MB. It is written as a list of pieces of at most about a MB, never
joined: one large copy or join holds the GIL for tens of ms, and the event loop with it (the
route streams the pieces). The compact form is little-endian float16 or float32 bytes in
base64, as /v1/embeddings' base64: `{"encoding": "base64", "dtype": "<f2",
"shape": [L, h, n, n], "data": "..."}`, row-major.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
import orjson

MapEncoding = Literal["float", "base64_f16", "base64_f32"]
DTYPES = {"base64_f16": "<f2", "base64_f32": "<f4"}
STEP = 3 * 2**18  # bytes per base64 piece: whole quanta, so the pieces form one valid string


def json_arrays(maps: np.ndarray) -> list[bytes]:
    """(L, h, n, n) -> the nested JSON arrays, one (layer, head) a piece."""
    out = [b"["]
    for li, layer in enumerate(maps):
        out.append(b",[" if li else b"[")
        for hi, head in enumerate(layer):
            if hi:
                out.append(b",")
            out.append(orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY))
        out.append(b"]")
    out.append(b"]")
    return out


def compact(maps: np.ndarray, encoding: MapEncoding) -> list[bytes]:
    dtype = DTYPES[encoding]
    buf = np.empty(maps.shape, dtype=dtype)
    for i, layer in enumerate(maps):  # converted a layer at a time (short GIL holds)
        buf[i] = layer
    data = memoryview(buf.data).cast("B")
    head = orjson.dumps({"encoding": "base64", "dtype": dtype, "shape": list(maps.shape)})
    pieces = [base64.b64encode(data[i : i + STEP]) for i in range(0, len(data), STEP)]
    return [head[:-1] + b',"data":"', *pieces, b'"}']


def encode_maps(maps: np.ndarray, encoding: MapEncoding) -> list[bytes]:
    return json_arrays(maps) if encoding == "float" else compact(maps, encoding)


def with_maps(payload: dict[str, Any], key: str, pieces: list[bytes]) -> list[bytes]:
    """The payload's JSON with `key` set to the pre-written pieces, as pieces."""
    head = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    return [head[:-1], b',"' + key.encode() + b'":', *pieces, b"}"]


def decode_maps(value: dict[str, Any]) -> np.ndarray:
    """The compact form back to an array (for clients and tests)."""
    raw = base64.b64decode(value["data"])
    return np.frombuffer(raw, dtype=value["dtype"]).reshape(value["shape"])
