"""Rotary positions: transformers' rotation, relative by construction, partial, NTK-scaled."""

from __future__ import annotations

import torch

from models.rotary import apply_rotary, inverse_frequencies, rotary_dim, rotary_tables


def test_rotation_equals_transformers_apply_rotary_pos_emb():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k = torch.randn(2, 3, 10, 16), torch.randn(2, 3, 10, 16)
    cos, sin = rotary_tables(10, 16, 500.0, torch.device("cpu"))
    want_q, want_k = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    torch.testing.assert_close(apply_rotary(q, cos, sin), want_q)
    torch.testing.assert_close(apply_rotary(k, cos, sin), want_k)


def test_scores_depend_only_on_the_distance():
    q, k = torch.randn(1, 1, 1, 8).expand(1, 1, 12, 8), torch.randn(1, 1, 1, 8).expand(1, 1, 12, 8)
    cos, sin = rotary_tables(12, 8, 10_000.0, torch.device("cpu"))
    scores = apply_rotary(q, cos, sin) @ apply_rotary(k, cos, sin).transpose(-1, -2)  # (…, N, N)
    torch.testing.assert_close(scores[0, 0].diagonal(3)[:-1], scores[0, 0].diagonal(3)[1:])


def test_partial_rotary_leaves_the_other_channels_alone():
    x = torch.randn(2, 2, 5, 16)
    r = rotary_dim(16, 0.5)
    cos, sin = rotary_tables(5, r, 1000.0, torch.device("cpu"))
    out = apply_rotary(x, cos, sin)
    assert r == 8 and torch.equal(out[..., 8:], x[..., 8:])
    torch.testing.assert_close(out[..., :8], apply_rotary(x[..., :8], cos, sin))


def test_dynamic_ntk_matches_transformers_past_the_trained_length_only():
    from transformers import NomicBertConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = NomicBertConfig(
        hidden_size=32,
        num_attention_heads=2,
        max_position_embeddings=16,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1000.0},
    )
    for n in (9, 16, 40):
        cos, _ = rotary_tables(n, 16, 1000.0, torch.device("cpu"), 2.0, 16)
        inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](cfg, None, seq_len=n)
        torch.testing.assert_close(cos[1, :8], torch.cos(inv_freq))
    plain, _ = rotary_tables(16, 16, 1000.0, torch.device("cpu"))
    torch.testing.assert_close(plain[1, :8], torch.cos(inverse_frequencies(1000.0, 16)))
