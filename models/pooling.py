"""Token vectors -> one vector per text, as sentence-transformers' Pooling module does it,
then its Dense modules if the pipeline has any (EmbeddingGemma: 768 -> 3072 -> 768, linear)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Average of the real tokens' vectors: (B, N, d), (B, N) -> (B, d)."""
    m = attention_mask[:, :, None].to(hidden.dtype)  # (B, N, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


def cls_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """The first token's vector ([CLS] or <s>): (B, N, d) -> (B, d)."""
    return hidden[:, 0]


def last_token_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """The last real token's vector, found through the mask (left or right padding)."""
    n = attention_mask.shape[1]
    index = torch.arange(n, device=hidden.device)[None, :] * attention_mask  # (B, N)
    last = index.argmax(dim=1)  # (B,): the highest position whose mask is 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, d)


POOLERS = {"mean": mean_pool, "cls": cls_pool, "lasttoken": last_token_pool}


class Pooling(nn.Module):
    """(B, N, d), (B, N) -> (B, d_out): pool, then each Dense module (no activation)."""

    def __init__(self, mode: str, dense: tuple[tuple[int, int, bool], ...] = ()) -> None:
        super().__init__()
        self.mode = mode
        self.pool = POOLERS[mode]
        self.dense = nn.ModuleList(nn.Linear(i, o, bias=b) for i, o, b in dense)

    def forward(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.pool(hidden, attention_mask)  # (B, d)
        for linear in self.dense:
            x = linear(x)  # (B, d_out)
        return x
