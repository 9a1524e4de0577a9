"""Compact forms of embeddings, as Cohere's `embedding_types` and Voyage's `output_dtype` ask.

Neither vendor publishes its int8 scale (their models are trained to produce it), so headwise
states its own, per vector, which keeps every vector's direction (cosine) as well as 8 bits can:

- int8:    round(v * 127 / max|v|), in [-127, 127]
- uint8:   int8 + 128, in [1, 255]
- ubinary: the signs packed 8 dimensions a byte, most significant bit first, bit = v > 0
           (numpy's packbits; Cohere's documented unpacking is np.unpackbits)
- binary:  ubinary - 128, as signed bytes (sentence-transformers' convention)
- base64:  the float32 little-endian bytes of the vector, base64 (Cohere's "base64")
The binary forms need a width divisible by 8 (every model's is); otherwise the last byte is
padded with zeros, as packbits does.
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np

Kind = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
KINDS: tuple[Kind, ...] = ("float", "int8", "uint8", "binary", "ubinary", "base64")


def int8(vectors: np.ndarray) -> np.ndarray:
    peak = np.abs(vectors).max(axis=-1, keepdims=True)
    scaled = vectors * (127.0 / np.where(peak > 0, peak, 1.0))
    return np.clip(np.rint(scaled), -127, 127).astype(np.int8)


def ubinary(vectors: np.ndarray) -> np.ndarray:
    return np.packbits(vectors > 0, axis=-1)


def encode(vectors: np.ndarray, kind: Kind) -> np.ndarray | list[str]:
    """(n, d) float32 -> one row per vector (an array orjson writes as lists), or one base64
    string per vector."""
    if kind == "float":
        return vectors
    if kind == "int8":
        return int8(vectors)
    if kind == "uint8":
        return (int8(vectors).astype(np.int16) + 128).astype(np.uint8)
    if kind == "ubinary":
        return ubinary(vectors)
    if kind == "binary":
        return (ubinary(vectors).astype(np.int16) - 128).astype(np.int8)
    return [
        base64.b64encode(v.astype("<f4", copy=False).tobytes()).decode("ascii") for v in vectors
    ]
