"""Where a token sits: absolute position ids, sinusoidal tables, and MPNet's relative bias."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)  ->  (n_positions, d)."""
    # On the CPU even while a model is built on the meta device (the loader's): it is computed,
    # never read from a checkpoint.
    cpu = torch.device("cpu")
    position = torch.arange(n_positions, dtype=torch.float32, device=cpu)[:, None]  # (P, 1)
    div = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=cpu)
        * (-math.log(10000.0) / d_model)
    )
    table = torch.zeros(n_positions, d_model, device=cpu)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div[: d_model // 2])
    return table


def position_ids(input_ids: Tensor, offset: int, pad_token_id: int) -> Tensor:
    """(B, N) position of each token.

    offset 0: 0, 1, …, N-1 for every row (BERT).
    offset > 0 (RoBERTa): real tokens count offset, offset+1, …; padding gets pad_token_id.
    """
    n = input_ids.shape[1]
    if offset == 0:
        return torch.arange(n, device=input_ids.device)[None, :]  # (1, N)
    real = (input_ids != pad_token_id).long()  # (B, N)
    return (torch.cumsum(real, dim=1) + (offset - 1)) * real + pad_token_id * (1 - real)


def relative_bucket(relative: Tensor, n_buckets: int, max_distance: int) -> Tensor:
    """T5/MPNet bidirectional buckets of key - query distances (N_q, N_k) -> bucket ids.

    Half the buckets for keys before the query, half for after; within a half, distances below
    n/4 get one bucket each, longer ones share log-spaced buckets up to max_distance.
    """
    half = n_buckets // 2
    n = -relative  # query - key
    bucket = (n < 0).long() * half
    n = n.abs()
    exact = half // 2
    scale = (half - exact) / math.log(max_distance / exact)
    far = exact + (torch.log(n.clamp(min=1).float() / exact) * scale).long()
    far = far.clamp(max=half - 1)
    return bucket + torch.where(n < exact, n, far)


class RelativePositionBias(nn.Module):
    """b[h, i, j] = table[bucket(j - i), h]: one learned scalar per head and distance bucket."""

    def __init__(self, n_buckets: int, n_heads: int, max_distance: int) -> None:
        super().__init__()
        self.table = nn.Embedding(n_buckets, n_heads)
        self.n_buckets = n_buckets
        self.max_distance = max_distance

    def forward(self, n: int, device: torch.device) -> Tensor:
        pos = torch.arange(n, device=device)
        relative = pos[None, :] - pos[:, None]  # (N_q, N_k): key - query
        buckets = relative_bucket(relative, self.n_buckets, self.max_distance)
        table: Tensor = self.table(buckets)  # (N_q, N_k, h)
        return table.permute(2, 0, 1)[None]  # (1, h, N_q, N_k)
