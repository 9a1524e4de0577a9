"""Arrays on the wire, compact: little-endian bytes in base64, with their dtype and shape.

`{"encoding": "base64", "dtype": "<f4", "shape": [n, d], "data": "..."}`, row-major, as
/v1/embeddings' base64 is for one vector. /attention writes its maps so, and /encode its token
vectors. A large array is written as pieces of at most about a MB, never joined: one large copy
or join holds the GIL for tens of ms, and the event loop with it (a route may stream them).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson

STEP = 3 * 2**18  # bytes per base64 piece: whole quanta, so the pieces form one valid string


def compact(array: np.ndarray, dtype: str) -> list[bytes]:
    """The array as a compact object's JSON, in pieces (converted a row at a time)."""
    buf = np.empty(array.shape, dtype=dtype)
    for i, row in enumerate(array):  # short GIL holds
        buf[i] = row
    data = memoryview(buf.data).cast("B") if buf.size else memoryview(b"")
    head = orjson.dumps({"encoding": "base64", "dtype": dtype, "shape": list(array.shape)})
    pieces = [base64.b64encode(data[i : i + STEP]) for i in range(0, len(data), STEP)]
    return [head[:-1] + b',"data":"', *pieces, b'"}']


def with_pieces(payload: dict[str, Any], key: str, pieces: list[bytes]) -> list[bytes]:
    """The payload's JSON with `key` set to the pre-written pieces, as pieces."""
    head = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    return [head[:-1], b',"' + key.encode() + b'":', *pieces, b"}"]


def decode(value: dict[str, Any]) -> np.ndarray:
    """The compact form back to an array (for clients and tests)."""
    raw = base64.b64decode(value["data"])
    return np.frombuffer(raw, dtype=value["dtype"]).reshape(value["shape"])
