"""Attention maps on the wire: JSON arrays (the default) or compact base64 with shape metadata.

A full map set is tens of MB. It is written as a list of pieces of at most about a MB, never
joined: one large copy or join holds the GIL for tens of ms, and the event loop with it (the
route streams the pieces). The compact form (service/pipelines/compact.py) is little-endian
float16 or float32 bytes in base64, as /v1/embeddings' base64: `{"encoding": "base64",
"dtype": "<f2", "shape": [L, h, n, n], "data": "..."}`, row-major.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import orjson

from service.pipelines import compact as wire

MapEncoding = Literal["float", "base64_f16", "base64_f32"]
DTYPES = {"base64_f16": "<f2", "base64_f32": "<f4"}


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
    return wire.compact(maps, DTYPES[encoding])  # converted a layer at a time


def encode_maps(maps: np.ndarray, encoding: MapEncoding) -> list[bytes]:
    return json_arrays(maps) if encoding == "float" else compact(maps, encoding)


def with_maps(payload: dict[str, Any], key: str, pieces: list[bytes]) -> list[bytes]:
    """The payload's JSON with `key` set to the pre-written pieces, as pieces."""
    return wire.with_pieces(payload, key, pieces)


def decode_maps(value: dict[str, Any]) -> np.ndarray:
    """The compact form back to an array (for clients and tests)."""
    return wire.decode(value)
