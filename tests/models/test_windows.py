"""The local-window band: |i - j| <= window, exact zeros outside, finite empty rows."""

from __future__ import annotations

import torch

from models.attention import MultiHeadAttention
from models.windows import window_mask


def test_band_allows_window_keys_on_either_side():
    band = window_mask(7, 2, torch.device("cpu"), torch.float32)[0, 0]
    allowed = band == 0
    assert allowed[3].nonzero().flatten().tolist() == [1, 2, 3, 4, 5]
    assert allowed[0].nonzero().flatten().tolist() == [0, 1, 2]


def test_probabilities_outside_the_window_are_exactly_zero_with_padding():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2).eval()
    x = torch.randn(2, 12, 16) * 10  # large scores: the band must still win
    keep = torch.ones(2, 12)
    keep[1, 8:] = 0
    band = window_mask(12, 3, x.device, x.dtype)
    _, w = mha(x, key_padding_mask=keep, need_weights=True, window=band)
    outside = band[0, 0] != 0
    assert torch.all(w[:, :, outside] == 0)  # every row, padding queries' included
    assert torch.all(w[1, :, :8, 8:] == 0)  # real queries never see padding keys
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 12))
