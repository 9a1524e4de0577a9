"""DeBERTa's disentangled attention (He et al. 2021, section 3.1): content and relative position
are separate vectors, and a score adds their cross terms to the content one.

    A_ij = ( q_i·k_j  +  q_i·k^r[S + b(i-j)]  +  k_j·q^r[S - b(j-i)] ) / √(3 d_k)
                          content->position      position->content
                          ("c2p")                ("p2c")

b(·) is the bucketed signed distance; S ± b, clamped to [0, 2S), picks one row of a shared
table of 2S relative embeddings P (deberta-v3: LayerNorm'd once, `norm_rel_ebd: layer_norm`), projected
per layer by that layer's own W_K and W_Q (`share_att_key`) or by separate W_K^r, W_Q^r.
Distances up to S/2 keep their own bucket; longer ones share log-spaced buckets up to
`max_relative_positions`. The √(3 d_k) is the attention's scale (config), not applied here.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

TERMS = ("c2p", "p2c")


def log_bucket(relative: Tensor, buckets: int, max_distance: int) -> Tensor:
    """Signed distance -> signed bucket: |r| <= buckets/2 as is, longer ones log-spaced."""
    mid = buckets // 2
    sign = torch.sign(relative)
    # Near distances take mid - 1 here only to keep log() finite; they are not used below.
    far = torch.where(relative.abs() < mid, torch.full_like(relative, mid - 1), relative.abs())
    log_scale = torch.log(torch.tensor((max_distance - 1) / mid))
    log_pos = torch.ceil(torch.log(far / mid) / log_scale * (mid - 1)) + mid
    return torch.where(far <= mid, relative.to(log_pos.dtype), log_pos * sign).long()


def relative_positions(n: int, buckets: int, max_distance: int, device: torch.device) -> Tensor:
    """(N_q, N_k) bucketed i - j (plain i - j when the config has no buckets)."""
    position = torch.arange(n, device=device)
    relative = position[:, None] - position[None, :]  # (N_q, N_k): query - key
    return log_bucket(relative, buckets, max_distance) if buckets > 0 else relative


class RelativeEmbeddings(nn.Module):
    """The 2S relative-position vectors every layer shares, LayerNorm'd when the config says."""

    def __init__(self, span: int, d_model: int, eps: float, norm: bool) -> None:
        super().__init__()
        self.table = nn.Embedding(2 * span, d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps) if norm else None
        self.span = span

    def forward(self) -> Tensor:
        p = self.table.weight  # (2S, d)
        return self.norm(p) if self.norm is not None else p


class DisentangledScores(nn.Module):
    """The c2p and p2c score terms of one layer, before the attention's scale: (B, h, N, N)."""

    def __init__(
        self, d_model: int, n_heads: int, d_k: int, terms: tuple[str, ...], shared: bool
    ) -> None:
        super().__init__()
        if not set(terms) <= set(TERMS):
            raise ValueError(f"unknown disentangled terms {terms}: supported are {TERMS}")
        self.terms = terms
        self.n_heads = n_heads
        self.d_k = d_k
        self.shared = shared
        # Without share_att_key, position gets its own projections (with bias, as DeBERTa).
        if not shared and "c2p" in terms:
            self.pos_key_proj = nn.Linear(d_model, n_heads * d_k)
        if not shared and "p2c" in terms:
            self.pos_query_proj = nn.Linear(d_model, n_heads * d_k)

    def _heads(self, p: Tensor) -> Tensor:
        # (2S, h·d_k) -> (2S, h, d_k) -> (h, 2S, d_k)
        return p.view(p.shape[0], self.n_heads, self.d_k).permute(1, 0, 2)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        rel_embeddings: Tensor,
        relative: Tensor,
        q_proj: nn.Module,
        k_proj: nn.Module,
    ) -> Tensor:
        """q, k (B, h, N, d_k) content; rel_embeddings (2S, d); relative (N, N) bucketed i - j."""
        span = rel_embeddings.shape[0] // 2
        score = torch.zeros((), dtype=q.dtype, device=q.device)
        if "c2p" in self.terms:
            proj = k_proj if self.shared else self.pos_key_proj
            pos_key = self._heads(proj(rel_embeddings))  # (h, 2S, d_k)
            c2p = torch.matmul(q, pos_key.transpose(-1, -2))  # (B, h, N_q, 2S)
            index = (relative + span).clamp(0, 2 * span - 1)  # (N_q, N_k): S + b(i-j)
            index = index.expand(c2p.shape[0], c2p.shape[1], -1, -1)  # (B, h, N_q, N_k)
            score = score + torch.gather(c2p, -1, index)  # q_i · k^r[S + b(i-j)]
        if "p2c" in self.terms:
            proj = q_proj if self.shared else self.pos_query_proj
            pos_query = self._heads(proj(rel_embeddings))  # (h, 2S, d_k)
            p2c = torch.matmul(k, pos_query.transpose(-1, -2))  # (B, h, N_k, 2S)
            index = (-relative + span).clamp(0, 2 * span - 1)  # (N_k, N_q): S - b(j-i)
            index = index.expand(p2c.shape[0], p2c.shape[1], -1, -1)  # (B, h, N_k, N_q)
            p2c = torch.gather(p2c, -1, index)  # (B, h, N_k, N_q): k_j · q^r[S - b(j-i)]
            score = score + p2c.transpose(-1, -2)  # (B, h, N_q, N_k)
        return score  # (B, h, N_q, N_k)
