"""DeBERTa's relative positions: log buckets equal transformers', terms by their formula."""

from __future__ import annotations

import math

import torch
from torch import nn

from models.disentangled import DisentangledScores, log_bucket, relative_positions


def test_log_buckets_equal_deberta_v2():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    pos = torch.arange(600)
    relative = pos[:, None] - pos[None, :]
    for buckets, max_distance in ((256, 512), (8, 32)):
        want = make_log_bucket_position(relative, buckets, max_distance).long()
        assert torch.equal(log_bucket(relative, buckets, max_distance), want)


def test_c2p_and_p2c_terms_follow_their_formula_per_entry():
    torch.manual_seed(0)
    d, h, d_k, span = 8, 2, 4, 3
    scores = DisentangledScores(d, h, d_k, ("c2p", "p2c"), shared=True)
    q_proj, k_proj = nn.Linear(d, h * d_k), nn.Linear(d, h * d_k)
    q, k = torch.randn(1, h, 5, d_k), torch.randn(1, h, 5, d_k)
    rel = torch.randn(2 * span, d)
    delta = relative_positions(5, 0, 2, torch.device("cpu"))  # plain i - j
    got = scores(q, k, rel, delta, q_proj, k_proj)
    pk = k_proj(rel).view(2 * span, h, d_k)
    pq = q_proj(rel).view(2 * span, h, d_k)
    for i, j, head in ((0, 4, 0), (4, 0, 1), (2, 3, 1)):
        c2p = q[0, head, i] @ pk[min(max(i - j + span, 0), 2 * span - 1), head]
        p2c = k[0, head, j] @ pq[min(max(-(j - i) + span, 0), 2 * span - 1), head]
        assert math.isclose(got[0, head, i, j].item(), (c2p + p2c).item(), abs_tol=1e-5)
