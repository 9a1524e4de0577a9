"""Attention maps as a PNG grid (layers x heads), with no imaging library: numpy + zlib."""

from __future__ import annotations

import struct
import zlib

import numpy as np

# A perceptually ordered ramp (viridis, 5 stops), interpolated.
_STOPS = np.array(
    [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64
)


def colorize(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] -> uint8 RGB, same shape plus a channel axis."""
    x = np.clip(values, 0.0, 1.0) * (len(_STOPS) - 1)
    lo = np.floor(x).astype(int).clip(0, len(_STOPS) - 2)
    frac = (x - lo)[..., None]
    return np.asarray((_STOPS[lo] * (1 - frac) + _STOPS[lo + 1] * frac).round(), dtype=np.uint8)


def grid_image(
    maps: np.ndarray, gap: int = 4, max_cell_px: int = 8, max_side: int = 256
) -> np.ndarray:
    """maps (L, h, n, n) -> RGB image with one square per map; each map scaled to its row max."""
    n_layers, n_heads, n, _ = maps.shape
    scale = max(1, min(max_cell_px, max_side // max(n, 1)))
    side = n * scale
    img = np.full((n_layers * (side + gap) + gap, n_heads * (side + gap) + gap, 3), 255, np.uint8)
    for li in range(n_layers):
        for hi in range(n_heads):
            m = maps[li, hi]
            peak = m.max(axis=-1, keepdims=True)
            tile = colorize(m / np.where(peak > 0, peak, 1.0))
            tile = tile.repeat(scale, axis=0).repeat(scale, axis=1)
            y, x = gap + li * (side + gap), gap + hi * (side + gap)
            img[y : y + side, x : x + side] = tile
    return img


def encode_png(rgb: np.ndarray) -> bytes:
    height, width, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[row].tobytes() for row in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )
